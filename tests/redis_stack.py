"""A real redis-server (Debian's package) on a loopback port of its own, for
the shared-state tests: started, stopped, killed, restarted on the same port,
paused (SIGSTOP) and resumed, and filled up, as the fault cases need; or
speaking TLS only (``tls=True``: a CA and a server certificate for
127.0.0.1 made with Debian's openssl), for ``rediss://``.

Waits are for events (the server answering PING, the process exiting),
never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_certificates(directory: Path) -> Path:
    """A CA and a server certificate for 127.0.0.1 it signed, in
    ``directory``; the CA's path."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    # The extensions Python 3.13's strict verification (VERIFY_X509_STRICT) wants.
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=mcp-resumption test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nauthorityKeyIdentifier=keyid,issuer\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2",
            "-extfile", "san.ext")  # fmt: skip
    return directory / "ca.crt"


# The key every process of a test fleet shares (OTEL_PYTHON_MCP_RESUMPTION_STATE_KEY).
FLEET_KEY = "the fleet's key"


class RedisServer:
    """One redis-server child on 127.0.0.1:``port``, no persistence."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        password: str | None = None,
        tls: bool = False,
    ) -> None:
        if not os.path.exists(REDIS_SERVER):
            pytest.skip("redis-server is not installed (Debian's 'redis-server' package)")
        self.directory = directory
        self.port = port or free_port()
        self.password = password
        self.ca = make_certificates(directory) if tls else None
        self.process: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        if self.ca is not None:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self):
        import redis

        tls = {"ssl": True, "ssl_ca_certs": str(self.ca)} if self.ca is not None else {}
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=2, password=self.password, **tls
        )

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                REDIS_SERVER, *self._ports(), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--dir", str(self.directory), "--loglevel", "warning",
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.wait_ready()

    def _ports(self) -> list[str]:
        if self.ca is None:
            return ["--port", str(self.port)]
        directory = self.directory
        return ["--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(directory / "server.crt"),
                "--tls-key-file", str(directory / "server.key"),
                "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no"]  # fmt: skip

    def wait_ready(self, timeout: float = 10.0) -> None:
        import redis

        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.client().ping():
                    return
            except redis.exceptions.ConnectionError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """SIGTERM, and wait until it is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """The server stops answering (its sockets stay open): a slow Redis."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def total_calls(self) -> int:
        """Commands the server ran so far (INFO commandstats), less those of
        the counting itself (INFO, and a new connection's handshake)."""
        stats = self.client().info("commandstats")
        own = {"cmdstat_info", "cmdstat_client|setinfo", "cmdstat_hello", "cmdstat_ping"}
        return sum(value["calls"] for name, value in stats.items() if name not in own)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)  # a paused one cannot exit
            self.kill()


def process_env(state: str | None, confirm: float) -> dict[str, str]:
    """The environment of a client process of this tree's plugin: its state
    in ``state`` (a Redis URL, with the fleet's key) or in memory (None)."""
    from helpers import clean_env

    root = Path(__file__).resolve().parents[1]
    extra = {
        "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root / "demo" / "src")]),
        "OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT": str(confirm),
    }
    if state is not None:
        extra["OTEL_PYTHON_MCP_RESUMPTION_STATE"] = state
        extra["OTEL_PYTHON_MCP_RESUMPTION_STATE_KEY"] = FLEET_KEY
    return clean_env(**extra)
