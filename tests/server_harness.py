"""Real MCP SDK servers (the installed major) for the server-side tests, and a
raw HTTP client that speaks just enough of streamable HTTP to present any
cursor in any session."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from uuid import uuid4

import anyio
import httpx
import uvicorn
from mcp import ClientSession
from mcp.server.streamable_http import EventMessage, EventStore

from opentelemetry.instrumentation.mcp_resumption.server import McpResumptionServerInstrumentor

MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
PROTOCOL = "2025-11-25"
REQUESTS = "mcp.server.resumption.requests"

if MCP_MAJOR == 1:
    from mcp.client.streamable_http import streamablehttp_client as connect
    from mcp.server.fastmcp import Context, FastMCP
else:
    from mcp.client.streamable_http import streamable_http_client as connect
    from mcp.server.mcpserver import Context, MCPServer


class UuidStore(EventStore):
    """As the SDK's example ``InMemoryEventStore`` (examples/servers/
    simple-streamablehttp, not in the wheel): uuid4 ids, the last N events per
    stream, ``None`` for a cursor it does not know."""

    def __init__(self, max_events_per_stream: int = 100) -> None:
        self.max_events_per_stream = max_events_per_stream
        self.streams: dict[str, deque] = {}
        self.event_index: dict[str, tuple[str, object]] = {}
        self.lost = False  # an instance that lost every cursor (seed 000)

    async def store_event(self, stream_id, message):
        event_id = str(uuid4())
        stream = self.streams.setdefault(stream_id, deque(maxlen=self.max_events_per_stream))
        if len(stream) == self.max_events_per_stream:
            self.event_index.pop(stream[0][0], None)
        stream.append((event_id, message))
        self.event_index[event_id] = (stream_id, message)
        return event_id

    async def replay_events_after(self, last_event_id, send_callback):
        if self.lost or last_event_id not in self.event_index:
            return None
        stream_id, _ = self.event_index[last_event_id]
        found = False
        for event_id, message in self.streams.get(stream_id, ()):
            if found and message is not None:
                await send_callback(EventMessage(message, event_id))
            elif event_id == last_event_id:
                found = True
        return stream_id


def build_app(store: EventStore | None, *, retry_ms: int = 200, sse: bool = False):
    """``slow`` closes its POST stream once (the client resumes), ``echo`` answers."""
    if MCP_MAJOR == 1:
        server = FastMCP("server-test", event_store=store, retry_interval=retry_ms)
    else:
        server = MCPServer("server-test")

    @server.tool()
    async def slow(ctx: Context) -> str:
        await ctx.info("working")
        await ctx.close_sse_stream()
        return "done"

    @server.tool()
    async def echo(text: str) -> str:
        return text

    if sse:
        return server.sse_app()
    if MCP_MAJOR == 1:
        return server.streamable_http_app()
    return server.streamable_http_app(event_store=store, retry_interval=retry_ms)


class Running:
    def __init__(self, app, path: str = "/mcp") -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + path
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


async def call_slow(url: str, timeout: float = 10):
    """The SDK client calls the ``slow`` tool (which polls) in a new session."""
    async with connect(url) as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        with anyio.fail_after(timeout):
            return await session.call_tool("slow", {})


@contextlib.contextmanager
def running(app, path: str = "/mcp") -> Iterator[Running]:
    server = Running(app, path)
    try:
        yield server
    finally:
        server.close()


def _events(body: str) -> list[dict]:
    events, current = [], {}
    for line in body.splitlines():
        if not line:
            if current:
                events.append(current)
            current = {}
        elif not line.startswith(":") and ":" in line:
            field, _, value = line.partition(":")
            current[field] = value[1:] if value.startswith(" ") else value
    if current:
        events.append(current)
    return events


class RawSession:
    """One stateful session over plain httpx (no plugin on it: the tests
    instrument the server only)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=10, follow_redirects=True)
        self.session_id: str | None = None
        self.ids: list[str] = []  # event ids seen, in order
        self.last_ids: list[str] = []  # those of the last POST's stream
        self._next = 0
        answer = self.post("initialize", {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        })
        assert "result" in answer, answer
        self.notify("notifications/initialized")

    def headers(self) -> dict[str, str]:
        headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": PROTOCOL,
        }
        if self.session_id:
            headers["mcp-session-id"] = self.session_id
        return headers

    def post(self, method: str, params: dict) -> dict:
        self._next += 1
        body = {"jsonrpc": "2.0", "id": self._next, "method": method, "params": params}
        response = self.http.post(self.url, json=body, headers=self.headers())
        response.raise_for_status()
        self.session_id = response.headers.get("mcp-session-id", self.session_id)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        answer: dict = {}
        self.last_ids = []
        for event in _events(response.text):
            if event.get("id"):
                self.ids.append(event["id"])
                self.last_ids.append(event["id"])
            if event.get("data"):
                answer = json.loads(event["data"])
        return answer

    def notify(self, method: str) -> None:
        self.http.post(self.url, json={"jsonrpc": "2.0", "method": method}, headers=self.headers())

    def echo(self, text: str) -> dict:
        return self.post("tools/call", {"name": "echo", "arguments": {"text": text}})

    def resume(self, last_event_id: str, session_id: str | None = None, timeout: float = 3):
        """GET with Last-Event-ID; the raw status, headers and body bytes (read
        until the server ends the stream or ``timeout`` passes)."""
        headers = self.headers()
        headers["accept"] = "text/event-stream"
        headers["last-event-id"] = last_event_id
        if session_id is not None:
            headers["mcp-session-id"] = session_id
        chunks = []
        with self.http.stream("GET", self.url, headers=headers, timeout=timeout) as response:
            with contextlib.suppress(httpx.ReadTimeout):
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
            return response.status_code, dict(response.headers), b"".join(chunks)

    def close(self) -> None:
        self.http.close()


@contextlib.contextmanager
def server_instrumented(telemetry, **settings):
    instrumentor = McpResumptionServerInstrumentor()
    instrumentor.instrument(
        meter_provider=telemetry.meter_provider,
        logger_provider=telemetry.logger_provider,
        **settings,
    )
    try:
        yield instrumentor
    finally:
        instrumentor.uninstrument()


def server_outcomes(telemetry) -> dict[str, int]:
    return telemetry.counts(REQUESTS, "mcp.resumption.outcome")
