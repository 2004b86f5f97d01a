"""The clients under test: each reads one stream (or makes a batch of POSTs)
against the benchmark server and returns a :class:`Sample`: wall and process
CPU seconds per event (or per request).

Every request looks like MCP: ``Accept`` includes ``text/event-stream`` and
an ``Mcp-Session-Id`` header is sent, so the plugin's patches track it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

ACCEPT = "application/json, text/event-stream"
_sessions = itertools.count(1)
# How the server frames a raw stream's events (sse_server.py): "bulk" (chunks
# of ~16 KiB, the client's SSE parser is the bottleneck) or "event" (one HTTP
# chunk per event, its HTTP parser is).
FRAMING = {"framing": "bulk"}


def _stream_url(url: str, n: int) -> str:
    return f"{url}?n={n}" + ("&bulk" if FRAMING["framing"] == "bulk" else "")


class Sample(NamedTuple):
    wall: float  # seconds per event (or request)
    cpu: float  # this process's CPU seconds per event (or request)


class _Clock:
    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def per(self, count: int) -> Sample:
        wall = time.perf_counter() - self.wall
        return Sample(wall / count, (time.process_time() - self.cpu) / count)


def _session() -> str:
    return f"bench-{next(_sessions):08d}-0000-4000-8000-000000000000"


def _sse_headers() -> dict[str, str]:
    return {"Mcp-Session-Id": _session(), "Mcp-Protocol-Version": "2025-11-25"}


def _post_headers() -> dict[str, str]:
    """One client session: the same Mcp-Session-Id on every POST of a batch."""
    return {"Accept": ACCEPT, "Content-Type": "application/json", **_sse_headers()}


def _body(request_id: int) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{}}}'
        % request_id
    )


def _tool_arguments(n: int) -> dict[str, object]:
    return {"n": n, "bulk": FRAMING["framing"] == "bulk"}


def _check(count: int, expected: int, what: str) -> None:
    if count != expected:
        raise RuntimeError(f"{what}: got {count} events, expected {expected}")


# ---------------------------------------------------------------- throughput


async def httpx_sse_stream(url: str, n: int) -> Sample:
    import httpx
    import httpx_sse

    async with httpx.AsyncClient(timeout=60) as client:
        count = 0
        clock = _Clock()
        async with httpx_sse.aconnect_sse(
            client, "GET", _stream_url(url, n), headers=_sse_headers()
        ) as source:
            async for _ in source.aiter_sse():
                count += 1
        sample = clock.per(n)
    _check(count, n, "httpx-sse")
    return sample


async def httpx2_stream(url: str, n: int) -> Sample:
    import httpx2

    async with httpx2.AsyncClient(timeout=60) as client:
        count = 0
        clock = _Clock()
        headers = {"Accept": "text/event-stream", **_sse_headers()}
        async with client.stream("GET", _stream_url(url, n), headers=headers) as response:
            async for _ in httpx2.EventSource(response):
                count += 1
        sample = clock.per(n)
    _check(count, n, "httpx2")
    return sample


async def mcp_stream(url: str, n: int) -> Sample:
    """An MCP SDK streamable-HTTP session: ``tools/call`` whose POST stream
    carries ``n`` progress notifications before the result."""
    count = 0

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        nonlocal count
        count += 1

    async with mcp_session(url) as call_tool:
        clock = _Clock()
        await call_tool("stream", _tool_arguments(n), progress_callback=on_progress)
        sample = clock.per(n)
    _check(count, n, "mcp")
    return sample


@contextlib.asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """One session of the installed MCP SDK's client, as every benchmark opens
    it (mcp 2.x: ``Client`` in legacy mode over httpx2; mcp 1.x:
    ``ClientSession`` over httpx, initialized): yields its ``call_tool``."""
    transport = importlib.import_module("mcp.client.streamable_http")
    if int(importlib.metadata.version("mcp").split(".", 1)[0]) >= 2:
        import httpx2
        from mcp import Client

        async with (
            httpx2.AsyncClient(timeout=60) as http,
            Client(transport.streamable_http_client(url, http_client=http), mode="legacy") as mcp,
        ):
            yield mcp.call_tool
    else:
        import httpx
        from mcp import ClientSession

        async with (
            httpx.AsyncClient(timeout=60) as http,
            transport.streamable_http_client(url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session.call_tool


def _has(*modules: str) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in modules)


Stream = Callable[[str, int], Awaitable[Sample]]
STREAMS: dict[str, Stream] = {}
if _has("httpx", "httpx_sse"):
    STREAMS["httpx-sse"] = httpx_sse_stream
if _has("httpx2"):
    STREAMS["httpx2 EventSource"] = httpx2_stream
if _has("mcp"):
    STREAMS["mcp SDK"] = mcp_stream


# ------------------------------------------------------------------ requests


async def _httpx_posts(url: str, count: int, sse: bool) -> Sample:
    import httpx
    import httpx_sse

    async with httpx.AsyncClient(timeout=60) as client:
        headers = _post_headers()
        clock = _Clock()
        for request_id in range(count):
            if sse:
                async with httpx_sse.aconnect_sse(
                    client, "POST", url, content=_body(request_id), headers=dict(headers)
                ) as source:
                    events = [event async for event in source.aiter_sse()]
                _check(len(events), 1, "httpx-sse POST")
            else:
                response = await client.post(url, content=_body(request_id), headers=headers)
                response.json()
        return clock.per(count)


async def _httpx2_posts(url: str, count: int, sse: bool) -> Sample:
    import httpx2

    async with httpx2.AsyncClient(timeout=60) as client:
        headers = _post_headers()
        clock = _Clock()
        for request_id in range(count):
            if sse:
                async with client.stream(
                    "POST", url, content=_body(request_id), headers=headers
                ) as response:
                    events = [event async for event in httpx2.EventSource(response)]
                _check(len(events), 1, "httpx2 POST")
            else:
                response = await client.post(url, content=_body(request_id), headers=headers)
                response.json()
        return clock.per(count)


Posts = Callable[[str, int], Awaitable[Sample]]
POSTS: dict[str, tuple[Posts, bool]] = {}  # name -> (posts, wants the /json route)
if _has("httpx", "httpx_sse"):
    POSTS["httpx POST→json"] = (lambda url, n: _httpx_posts(url, n, False), True)
    POSTS["httpx-sse POST→sse"] = (lambda url, n: _httpx_posts(url, n, True), False)
if _has("httpx2"):
    POSTS["httpx2 POST→json"] = (lambda url, n: _httpx2_posts(url, n, False), True)
    POSTS["httpx2 POST→sse"] = (lambda url, n: _httpx2_posts(url, n, True), False)
