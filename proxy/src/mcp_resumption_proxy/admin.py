# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What an operator asks the proxy, on an address of its own (``--admin``):
``GET /healthz`` (live: 200 while the process serves) and ``GET /readyz``
(ready: 200 when the upstream answers and the proxy is not draining, else
503); and ``UpstreamProbe``, which decides whether the upstream answers and
writes one line when it stops answering and one when it is back.

The probe opens a TCP connection to the upstream's host and port (the name
resolved each time) and closes it, every ``interval`` seconds, each attempt
bounded by ``PROBE_TIMEOUT_S``: what a load balancer's layer-4 check does.
The forwarding's own requests feed the same state between probes: one that
could not connect makes it unreachable at once, and the first answer after
that makes it reachable again (one line per change, whoever saw it).
It never sends an HTTP request, so it reaches no MCP path: an MCP server
creates a session (a transport, a task) for any request without a session
id, and a probe must not cost the server that, nor a line in its log, nor a
series in the plugin's telemetry.  What it cannot tell is a server that
accepts connections and then hangs; the calls' own telemetry tells that.

The admin address speaks just enough HTTP/1.1 for probes and scrapes (``GET``
and ``HEAD``, one request per connection, a bounded head): it takes no MCP
path, so a health check never goes upstream, and it stays up through the
drain, answering ``/readyz`` with 503 until the process exits.  With
``OTEL_METRICS_EXPORTER=prometheus`` it also serves ``/metrics``: what the
exporter serves on its own port, both legs' series with their
``mcp_resumption_leg`` label.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable

import httpx

_logger = logging.getLogger("mcp_resumption_proxy")

PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 2.0
MAX_HEAD = 8192  # an admin request's line and headers
READ_TIMEOUT_S = 5.0


def upstream_address(upstream: str) -> tuple[str, int]:
    url = httpx.URL(upstream)
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.host, port


def shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class UpstreamProbe:
    """Whether the upstream answers: ``reachable`` is None until the first
    probe (or request), then the last one's result."""

    def __init__(self, upstream: str, interval: float = PROBE_INTERVAL_S,
                 timeout: float = PROBE_TIMEOUT_S) -> None:
        self.host, self.port = upstream_address(upstream)
        self.interval = interval
        self.timeout = timeout
        self.reachable: bool | None = None
        self._since = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def probe(self) -> bool:
        """One attempt; its result is the new state (a line if it changed)."""
        error: BaseException | None = None
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self.timeout
            )
        except (OSError, asyncio.TimeoutError) as failure:
            error = failure
        else:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        self._record(error)
        return error is None

    def request_failed(self, error: BaseException) -> None:
        """A request could not connect to the upstream: the surest proof
        that it is unreachable, taken at once rather than at the next probe."""
        self._record(error)

    def request_answered(self) -> None:
        """The upstream answered a request: it is reachable (a line only
        if that is news)."""
        if self.reachable is not True:
            self._record(None)

    def _record(self, error: BaseException | None) -> None:
        now = time.monotonic()
        reachable = error is None
        if reachable == self.reachable:
            return
        where = shown(self.host, self.port)
        if not reachable:
            # The type only: an OS message may be long, and says no more.
            why = "timed out" if isinstance(error, asyncio.TimeoutError) else type(error).__name__
            _logger.warning(
                "mcp-resumption-proxy: the upstream %s is unreachable (%s); not ready, and "
                "requests get 502, until it answers again", where, why)
        elif self.reachable is False:
            _logger.warning(
                "mcp-resumption-proxy: the upstream %s answers again (unreachable for %.1f s)",
                where, now - self._since)
        self.reachable = reachable
        self._since = now

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        # The flag as well as the cancel: on Python 3.10, asyncio.wait_for
        # swallows a cancel that lands as the connect completes, and the
        # loop went on probing while the shutdown waited for it (a proxy
        # that never exited after SIGTERM, about 1 run in 10 under load).
        while not self._stopping:
            await self.probe()
            if self._stopping:
                break
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class AdminServer:
    """``/healthz`` and ``/readyz`` on ``sock`` (bound, not yet listening).
    ``ready`` answers the readiness question: None when ready, else why not.
    ``metrics``: the Prometheus exposition and its content type for a
    request's ``Accept``, served on ``/metrics`` (None: not served)."""

    def __init__(self, sock: socket.socket, ready: Callable[[], str | None],
                 metrics: Callable[[str], tuple[bytes, str]] | None = None) -> None:
        self.sock = sock
        self.not_ready = ready
        self.metrics = metrics
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self.sock, limit=MAX_HEAD)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{shown(host, port)}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def answer(self, method: str, path: str, accept: str = "") -> tuple[int, str, bytes]:
        """(status, content type, body) for a request's method, path and Accept."""
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n"
        path = path.split("?", 1)[0]
        if path == "/healthz":
            return 200, TEXT, b"ok\n"
        if path == "/readyz":
            why = self.not_ready()
            return (200, TEXT, b"ready\n") if why is None else (
                503, TEXT, f"not ready: {why}\n".encode())
        if path == "/metrics" and self.metrics is not None:
            # The exporter's collection runs the instruments' callbacks,
            # which take locks: off the event loop.
            body, content_type = await asyncio.to_thread(self.metrics, accept)
            return 200, content_type, body
        if path == "/metrics":
            return 404, TEXT, b"not found: /metrics needs OTEL_METRICS_EXPORTER=prometheus\n"
        return 404, TEXT, b"not found: /healthz, /readyz, /metrics\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                OSError):
            writer.close()
            return
        parts = head.split(b"\r\n", 1)[0].split()
        method = "GET"
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            status, content_type, body = 400, TEXT, b"bad request\n"
        else:
            method = parts[0].decode("latin-1")
            accept = ""
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"accept":
                    accept = value.strip().decode("latin-1")
            try:
                status, content_type, body = await self.answer(
                    method, parts[1].decode("latin-1"), accept)
            except Exception as error:  # an exporter's fault: said, never a traceback
                status, content_type, body = 500, TEXT, f"{type(error).__name__}\n".encode()
        writer.write(
            f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\ncache-control: no-store\r\n"
            f"connection: close\r\n\r\n".encode("latin-1")
            + (b"" if method == "HEAD" else body)
        )
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()


TEXT = "text/plain; charset=utf-8"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           500: "Internal Server Error", 503: "Service Unavailable"}


def prometheus_metrics() -> Callable[[str], tuple[bytes, str]] | None:
    """What the Prometheus exporter serves on its own port, for ``/metrics``
    on the admin address: where ``OTEL_METRICS_EXPORTER`` names it."""
    exporters = {name.strip() for name in os.environ.get("OTEL_METRICS_EXPORTER", "").split(",")}
    if "prometheus" not in exporters:
        return None
    try:
        from prometheus_client import REGISTRY
        from prometheus_client.exposition import choose_encoder
    except ImportError:
        return None

    def exposition(accept: str) -> tuple[bytes, str]:
        # The format the exporter's own server would choose for this Accept
        # (Prometheus asks for OpenMetrics first).
        encoder, content_type = choose_encoder(accept)
        return encoder(REGISTRY), content_type

    return exposition
