"""The proxy (``mcp-resumption-proxy``) in a child process, as a user runs
it, and what the proxy tests read back: its first line (the client URL), its
telemetry (the console exporters' output at exit), its stderr.

A child rather than the test's own process: the proxy instruments httpx and
httpx2 process-wide, and the tests' own clients (SDK clients, raw httpx)
must stay outside what it judges.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from helpers import clean_env, console_metrics, stop_process
from loss_accounting import LOSS_READERS
from mcp_resumption_demo.loopback import LoopbackServer
from mcp_resumption_demo.router import Backend
from wire import CutRoute, Fleet, WireRouter, is_progress

SCOPE = "opentelemetry.instrumentation.mcp_resumption"
LEG = "mcp.resumption.leg"
START_TIMEOUT = 10.0


def _source_paths() -> str:
    """Where the child finds the proxy and the plugin this test imports (an
    editable install finds the same ones; a checkout run on PYTHONPATH needs them)."""
    import mcp_resumption_proxy
    import opentelemetry.instrumentation.mcp_resumption as plugin

    paths = [
        str(Path(mcp_resumption_proxy.__file__).resolve().parents[1]),
        str(Path(plugin.__file__).resolve().parents[3]),
    ]
    return os.pathsep.join(dict.fromkeys(paths))


class Proxy:
    """``python -m mcp_resumption_proxy --upstream URL ...`` until :meth:`close`."""

    def __init__(self, upstream: str, *args: str, otel_instrument: bool = False,
                 script: bool = False, **env: str) -> None:
        # ``script``: the venv's console script, as a supervisor runs it.
        program = ([str(Path(sys.executable).parent / "mcp-resumption-proxy")] if script
                   else [sys.executable, "-m", "mcp_resumption_proxy"])
        if "--drain" not in args:
            # A test's streams get what uvicorn's graceful shutdown gave them
            # before --drain existed, not the 10 s default: stop_process kills
            # a child still running after 10 s.
            args = (*args, "--drain", "2")
        command = [*program, "--upstream", upstream, *args]
        if otel_instrument:
            command = [str(Path(sys.executable).parent / "opentelemetry-instrument"), *command]
        settings = {
            "PYTHONPATH": _source_paths(),
            "OTEL_METRICS_EXPORTER": "console",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "console",
            # One export, at exit: the tests read the totals then.
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
            **env,
        }
        started = time.monotonic()
        self.process = subprocess.Popen(
            command, env=clean_env(**settings), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        self._stderr: list[str] = []
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()
        self.url = self.process.stdout.readline().strip()
        self.started_in = time.monotonic() - started
        assert self.url.startswith("http://"), (self.url, self.stderr)
        self.origin = "/".join(self.url.split("/", 3)[:3])
        # Read as it comes: the console exporters write more at exit than a
        # pipe holds, and would block the proxy's exit on a full one.
        self._stdout: list[str] = []
        self._stdout_reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._stdout_reader.start()
        self.stdout = ""

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            self._stderr.append(line)

    def _read_stdout(self) -> None:
        for line in self.process.stdout:
            self._stdout.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def close(self) -> str:
        """Stop the proxy (SIGTERM: its providers flush) and return its stdout."""
        if self.process.poll() is None:
            stop_process(self.process)
        self._stdout_reader.join(timeout=10)
        self._stderr_reader.join(timeout=10)
        self.stdout = "".join(self._stdout)
        if self not in LOSS_READERS:
            LOSS_READERS.append(self)  # its lost calls and gaps checked after the test
        return self.stdout

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ telemetry

    def points(self, metric: str) -> list[dict]:
        """The data points of ``metric`` in the proxy's last export (cumulative)."""
        exports = console_metrics(self.stdout)
        found: list[dict] = []
        for resource in exports[-1]["resource_metrics"] if exports else ():
            for scope in resource["scope_metrics"]:
                if scope["scope"]["name"] != SCOPE:
                    continue
                for item in scope["metrics"]:
                    if item["name"] == metric:
                        found.extend(item["data"]["data_points"])
        return found

    def counts(self, metric: str, *attributes: str) -> dict[tuple, int]:
        """Non-zero totals of ``metric`` by the values of ``attributes``."""
        totals: dict[tuple, int] = {}
        for point in self.points(metric):
            key = tuple(point["attributes"].get(name) for name in attributes)
            value = point.get("value", point.get("count", 0))
            totals[key] = totals.get(key, 0) + int(value)
        return {key: value for key, value in totals.items() if value}

    def logs(self) -> list[dict]:
        """The log records the console log exporter wrote (gap events)."""
        decoder, found, position = json.JSONDecoder(), [], 0
        text = self.stdout
        while (start := text.find("{", position)) != -1:
            try:
                document, position = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                position = start + 1
                continue
            if isinstance(document, dict) and "body" in document and "attributes" in document:
                found.append(document)
        return found


@contextlib.contextmanager
def proxy(upstream: str, *args: str, **kwargs) -> Iterator[Proxy]:
    running = Proxy(upstream, *args, **kwargs)
    try:
        yield running
    finally:
        running.close()


# ================================================================ SDK stacks

TS_DIR = Path(__file__).parents[1] / "demo" / "src" / "mcp_resumption_demo" / "ts_server"


@dataclass
class Stack:
    client_router: WireRouter
    upstream_router: WireRouter
    proxy: Proxy
    url: str  # what the client uses: the client router, in front of the proxy


class CuttingFleet(Fleet):
    """wire.Fleet, cutting the first tools/call after the first event
    ``cut_after`` accepts (a client without a progress callback, such as the
    TypeScript client of client.mjs, gets no progress event to cut after);
    ``drain``: after its progress, reading the backend's answer to its end."""

    def __init__(self, backend: Backend, *, cut_after=None, drain: bool = False,
                 **kwargs) -> None:
        super().__init__(backend, **kwargs)
        self.cut_after = cut_after
        self.drain = drain

    async def __call__(self, request):
        if (self.cut_after is not None or self.drain) and self.cut and (
            request.jsonrpc_method == "tools/call"
        ):
            self.cut = False
            return CutRoute(self.backend, cut_after=self.cut_after or is_progress,
                            drain_upstream=self.drain)
        return await super().__call__(request)


class RawRouter(WireRouter):
    """A WireRouter that also keeps each exchange's response body bytes as
    they crossed (``exchange.raw``): both legs' bytes can be compared."""

    def _scan(self, scanner, piece: bytes, route, exchange):
        exchange.raw = getattr(exchange, "raw", b"") + piece
        return WireRouter._scan(scanner, piece, route, exchange)


def is_priming(event) -> bool:
    """The event a resumable server opens a stream with: an id, no data."""
    return event.id is not None and not event.data


@contextlib.asynccontextmanager
async def stack(app, *, cut_upstream: bool = False, cut_client: bool = False,
                path: str = "/mcp", proxy_args: tuple[str, ...] = (), at_resume=None,
                cut_after=None, drain_client: bool = False, **proxy_kwargs):
    """``app`` on a loopback server, or (an int) a server already on that port.
    ``drain_client``: the client's router, having cut the client's leg, reads
    the proxy's answer to its end (the proxy forwards past the client's cursor)."""
    backend = None if isinstance(app, int) else await LoopbackServer(app, name="sdk").astart()
    port = app if backend is None else backend.port
    upstream = await RawRouter(
        CuttingFleet(Backend("sdk", port), cut=cut_upstream, at_resume=at_resume,
                     cut_after=cut_after)
    ).start()
    running = await asyncio.to_thread(Proxy, upstream.url + path, *proxy_args, **proxy_kwargs)
    proxy_port = int(running.origin.rsplit(":", 1)[1])
    client_router = await RawRouter(
        CuttingFleet(Backend("proxy", proxy_port), cut=cut_client, cut_after=cut_after,
                     drain=drain_client)
    ).start()
    try:
        yield Stack(client_router, upstream, running, client_router.url + path)
    finally:
        await client_router.close()
        await asyncio.to_thread(running.close)
        await upstream.close()
        if backend is not None:
            await asyncio.to_thread(backend.close)


def ts_client(node: str, url: str, tool: str = "work", timeout_ms: int = 8000) -> dict:
    done = subprocess.run([node, str(TS_DIR / "client.mjs"), url, tool, str(timeout_ms)],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))
    return json.loads(done.stdout.strip().splitlines()[-1])




def find_node() -> str:
    """node, with the TypeScript SDK installed where the demo keeps it
    (scripts/test runs ``npm ci``; a run of these files alone does it here)."""
    found = shutil.which("node")
    assert found, "node is needed for the TypeScript SDK client"
    if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        subprocess.run([shutil.which("npm") or "npm", "ci", "--no-audit", "--no-fund"],
                       cwd=TS_DIR, check=True)
    return found
