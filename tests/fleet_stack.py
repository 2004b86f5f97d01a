"""A fleet of two proxies behind a real HAProxy (Debian's), round robin, on
loopback ports, its config written here:

    client -> client router -> HAProxy -> proxy a -> upstream router -> SDK server
                                       -> proxy b -/

Both proxies forward to one upstream URL, as a fleet does (the client half
keys what it shares by the server's address).  HAProxy names the instance
it picked in each request (``http-send-name-header X-Fleet-Instance``),
which the proxies forward: the upstream router's record says which instance
forwarded what.  HAProxy's runtime API (its admin socket) puts an
instance in maintenance: the tests drain the instance that carried the cut
stream at the client's resume, so that the resume lands on the other one,
as it does when a balancer moves a client (a drained or restarted instance,
or a round robin that simply picked the other).

Waits are for events (HAProxy's port open, a proxy's first line), never a
fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mcp_resumption_demo.loopback import LoopbackServer
from mcp_resumption_demo.router import Backend
from proxy_harness import CuttingFleet, Proxy, RawRouter
from redis_stack import FLEET_KEY, RedisServer, free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
NAMES = ("a", "b")

CONFIG = """\
global
    maxconn 512
    stats socket {socket} level admin
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend fleet
    bind 127.0.0.1:{port}
    default_backend proxies
backend proxies
    balance roundrobin
    http-send-name-header X-Fleet-Instance
{servers}
"""


class HaProxy:
    """``haproxy -db -f <config>`` in the foreground until :meth:`close`."""

    def __init__(self, directory: Path, servers: dict[str, int]) -> None:
        if not os.path.exists(HAPROXY):
            pytest.skip("haproxy is not installed (Debian's 'haproxy' package)")
        self.port = free_port()
        self.socket = str(directory / "haproxy.sock")
        config = directory / "haproxy.cfg"
        config.write_text(
            CONFIG.format(
                socket=self.socket,
                port=self.port,
                servers="\n".join(
                    f"    server {name} 127.0.0.1:{port}" for name, port in servers.items()
                ),
            )
        )
        check = subprocess.run(
            [HAPROXY, "-c", "-q", "-f", str(config)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stderr
        self.process = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                if os.path.exists(self.socket):
                    break
            assert self.process.poll() is None, self.process.stderr.read().decode()
            assert time.monotonic() < deadline, "haproxy did not listen"
            time.sleep(0.01)

    def command(self, line: str) -> str:
        """One command of HAProxy's runtime API, its answer."""
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(self.socket)
            client.sendall(line.encode() + b"\n")
            answer = b""
            while chunk := client.recv(4096):
                answer += chunk
        return answer.decode()

    def maintenance(self, name: str) -> None:
        """The balancer sends no new request to ``name`` (a drained instance)."""
        assert self.command(f"set server proxies/{name} state maint").strip() == ""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@dataclass
class FleetStack:
    client_router: RawRouter
    upstream_router: RawRouter
    proxies: dict[str, Proxy]
    haproxy: HaProxy
    url: str
    drained: list[str] = field(default_factory=list)

    def carried_call(self) -> str:
        """The instance that forwarded the tools/call."""
        [name] = [
            instance(e)
            for e in self.upstream_router.exchanges
            if e.request.jsonrpc_method == "tools/call"
        ]
        return name

    def other(self, name: str) -> str:
        return next(other for other in NAMES if other != name)


def instance(exchange) -> str | None:
    """The proxy instance HAProxy sent a request to, as the upstream saw it."""
    return exchange.request.header("x-fleet-instance")


def state_env(redis: RedisServer | None) -> dict[str, str]:
    """A proxy's shared-state settings: Redis with the fleet's key, or none."""
    if redis is None:
        return {}
    return {
        "OTEL_PYTHON_MCP_RESUMPTION_STATE": redis.url,
        "OTEL_PYTHON_MCP_RESUMPTION_STATE_KEY": FLEET_KEY,
    }


@contextlib.asynccontextmanager
async def fleet(
    app,
    redis: RedisServer | None,
    *,
    cut_upstream: bool = False,
    cut_client: bool = False,
    path: str = "/mcp",
    proxy_args: tuple[str, ...] = (),
    proxy_env: dict[str, str] | None = None,
    refuse_resumes: bool = False,
) -> AsyncIterator[FleetStack]:
    """``app`` on loopback behind the fleet; the first resume through the
    client router drains the instance that carried the tools/call first
    (``refuse_resumes``: and no resume reaches the fleet: the client
    router refuses every one)."""
    backend = await LoopbackServer(app, name="sdk").astart()
    upstream_router = await RawRouter(
        CuttingFleet(Backend("sdk", backend.port), cut=cut_upstream)
    ).start()
    proxies: dict[str, Proxy] = {}
    directory = Path(tempfile.mkdtemp(prefix="fleet-"))
    haproxy = None
    client_router = None
    try:
        for name in NAMES:
            proxies[name] = await asyncio.to_thread(
                Proxy, upstream_router.url + path, *proxy_args,
                **{**state_env(redis), **(proxy_env or {})}
            )
        haproxy = HaProxy(
            directory,
            {name: int(running.origin.rsplit(":", 1)[1]) for name, running in proxies.items()},
        )
        running = None

        async def drain_the_first() -> Backend:
            first = running.carried_call()
            await asyncio.to_thread(haproxy.maintenance, first)
            running.drained.append(first)
            return None if refuse_resumes else Backend("haproxy", haproxy.port)

        client_router = await RawRouter(
            CuttingFleet(
                Backend("haproxy", haproxy.port),
                cut=cut_client,
                at_resume=drain_the_first,
            )
        ).start()
        running = FleetStack(
            client_router, upstream_router, proxies, haproxy, client_router.url + path
        )
        yield running
    finally:
        if client_router is not None:
            await client_router.close()
        for proxy in proxies.values():
            await asyncio.to_thread(proxy.close)
        if haproxy is not None:
            haproxy.close()
        await upstream_router.close()
        await asyncio.to_thread(backend.close)
        shutil.rmtree(directory, ignore_errors=True)
