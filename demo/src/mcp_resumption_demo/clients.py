# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""The client side of the demo, on the real library APIs the plugin hooks.

This module is the one place that knows which MCP SDK major is installed:

* mcp 1.x brings httpx + httpx-sse: raw clients iterate
  ``httpx_sse.EventSource(response).aiter_sse()``; SDK clients are
  ``mcp.client.streamable_http.streamable_http_client`` / ``mcp.client.sse.sse_client``
  under ``mcp.ClientSession``.
* mcp 2.x brings httpx2 and its own ``httpx2.EventSource`` (``async for``); SDK
  clients are the same transport functions under ``mcp.Client(..., mode="legacy")``,
  which forces the initialize handshake (the 2.x default, 2026-07-28, has no
  sessions and so nothing to resume).

Every raw request is a real POST of a JSON-RPC body or a real GET that carries
``Last-Event-ID`` / ``Mcp-Session-Id``, so an instrumentation that patches the
transports and the EventSource iteration sees exactly what a production client
would send.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import itertools
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, Protocol

__all__ = [
    "LEGACY_PROTOCOL_VERSION",
    "MCP_MAJOR",
    "SDK_MAX_RECONNECTION_ATTEMPTS",
    "SESSION_PROTOCOL_VERSION",
    "TRANSPORT_ERRORS",
    "LegacyRawClient",
    "RawSse",
    "SdkSession",
    "SseEvent",
    "ToolOutcome",
    "WireEvent",
    "mcp_major",
    "new_http_client",
    "open_sse",
    "post_jsonrpc",
    "response_id",
    "sdk_legacy_session",
    "sdk_stateless_session",
    "sdk_streamable_session",
]

LEGACY_PROTOCOL_VERSION: Final = "2024-11-05"
# The newest handshake-era revision both SDKs speak; 2025-11-25 is the first with
# priming events and ``retry:``.
SESSION_PROTOCOL_VERSION: Final = "2025-11-25"
_HTTP_TIMEOUT_S: Final = 5.0


def mcp_major() -> int:
    """The major version of the installed ``mcp`` distribution."""
    return int(importlib.metadata.version("mcp").split(".", 1)[0])


MCP_MAJOR: Final[int] = mcp_major()

if MCP_MAJOR >= 2:
    _http: Any = importlib.import_module("httpx2")
    _McpError: type[Exception] = importlib.import_module("mcp.shared.exceptions").MCPError
else:
    _http = importlib.import_module("httpx")
    _httpx_sse: Any = importlib.import_module("httpx_sse")
    _McpError = importlib.import_module("mcp.shared.exceptions").McpError

# How often the SDK's streamable-HTTP transport reconnects before giving up (2 in both majors).
SDK_MAX_RECONNECTION_ATTEMPTS: Final[int] = importlib.import_module(
    "mcp.client.streamable_http"
).MAX_RECONNECTION_ATTEMPTS

# A severed stream surfaces as one of these (an incomplete chunked body is a
# RemoteProtocolError in both httpx and httpx2).
TRANSPORT_ERRORS: Final[tuple[type[Exception], ...]] = (_http.TransportError,)


def new_http_client(timeout: float = _HTTP_TIMEOUT_S) -> Any:
    """An ``httpx.AsyncClient`` (mcp 1.x) or ``httpx2.AsyncClient`` (mcp 2.x)."""
    return _http.AsyncClient(timeout=timeout)


@dataclass(frozen=True)
class SseEvent:
    """An SSE event as the EventSource parsed it (``id`` None when the server sent none)."""

    event: str
    data: str
    id: str | None
    retry: int | None = None


@dataclass
class WireEvent:
    """An event the client received, and whether the application applied it."""

    id: str | None
    event: str
    data: str
    consumed: bool = False

    @property
    def is_priming(self) -> bool:
        """A 2025-11-25 priming event: an id and empty data, nothing to apply."""
        return self.event == "message" and not self.data


class RawSse:
    """One streamed HTTP response read through the library's EventSource."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self._events: AsyncIterator[Any] | None = None

    @property
    def status(self) -> int:
        return int(self.response.status_code)

    def header(self, name: str) -> str | None:
        value = self.response.headers.get(name)
        return str(value) if value is not None else None

    @property
    def is_event_stream(self) -> bool:
        content_type = (self.header("content-type") or "").partition(";")[0]
        return content_type.strip().lower() == "text/event-stream"

    async def next_event(self) -> SseEvent | None:
        """The next event, or None when the stream ended cleanly.

        Raises one of :data:`TRANSPORT_ERRORS` when the connection dies mid-body.
        """
        if self._events is None:
            if MCP_MAJOR >= 2:
                # httpx2.EventSource.__aiter__ is what mcp 2.x iterates, and what the plugin wraps.
                self._events = _http.EventSource(self.response).__aiter__()
            else:
                # httpx_sse.EventSource.aiter_sse is what mcp 1.x iterates.
                self._events = _httpx_sse.EventSource(self.response).aiter_sse()
        try:
            sse = await self._events.__anext__()
        except StopAsyncIteration:
            return None
        return SseEvent(event=sse.event, data=sse.data, id=sse.id or None, retry=sse.retry)

    async def aclose(self) -> None:
        """Close the iterator (without asking it for another event) and the response."""
        if self._events is not None:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(*TRANSPORT_ERRORS):
                    await aclose()
        await self.response.aclose()


@contextlib.asynccontextmanager
async def open_sse(
    client: Any,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    json: object = None,
) -> AsyncIterator[RawSse]:
    """Send a request and expose its (possibly SSE) response; always closes it."""
    request_headers = {"accept": "application/json, text/event-stream", **(headers or {})}
    async with client.stream(method, url, headers=request_headers, json=json) as response:
        stream = RawSse(response)
        try:
            yield stream
        finally:
            await stream.aclose()


async def post_jsonrpc(
    client: Any, url: str, message: Mapping[str, object], headers: Mapping[str, str] | None = None
) -> Any:
    """POST one JSON-RPC message; return the response (its body read)."""
    request_headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        **(headers or {}),
    }
    return await client.post(url, json=dict(message), headers=request_headers)


class LegacyRawClient:
    """A hand-written 2024-11-05 HTTP+SSE client that, unlike the SDK's, keeps a cursor.

    It opens ``GET /sse``, learns its session and POST URL from the ``endpoint``
    event, POSTs JSON-RPC messages (answered ``202``) and reads the responses
    from the stream. The cursor is the id of the last event the transport
    *received*, which is what an SSE client sends as ``Last-Event-ID``, whether
    or not the application got to apply that event.
    """

    def __init__(self, client: Any, base_url: str) -> None:
        self._client = client
        self._base_url = base_url.rstrip("/")
        self._stack = contextlib.AsyncExitStack()
        self._ids = itertools.count(1)
        self.stream: RawSse | None = None
        self.status: int | None = None
        self.session_id: str | None = None
        self.messages_url: str | None = None
        self.received: list[WireEvent] = []
        self.requests: dict[int, str] = {}

    async def __aenter__(self) -> LegacyRawClient:
        self.stream = await self._stack.enter_async_context(
            open_sse(self._client, "GET", f"{self._base_url}/sse")
        )
        self.status = self.stream.status
        endpoint = await self.next_event()
        if endpoint is None or endpoint.event != "endpoint":
            raise RuntimeError("legacy server sent no endpoint event")
        endpoint.consumed = True
        self.messages_url = f"{self._base_url}{endpoint.data}"
        query = endpoint.data.partition("?")[2]
        params = dict(part.partition("=")[::2] for part in query.split("&") if part)
        self.session_id = params.get("session_id") or params.get("sessionId")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    @property
    def cursor(self) -> str | None:
        """The id of the last event received (the Last-Event-ID of a reconnect)."""
        return next((e.id for e in reversed(self.received) if e.id is not None), None)

    async def close_stream(self) -> None:
        """Stop reading: close the EventSource iterator and the response."""
        await self._stack.aclose()

    async def next_event(self) -> WireEvent | None:
        assert self.stream is not None
        sse = await self.stream.next_event()
        if sse is None:
            return None
        event = WireEvent(id=sse.id, event=sse.event, data=sse.data)
        self.received.append(event)
        return event

    async def request(self, method: str, params: Mapping[str, object] | None = None) -> int:
        """POST a JSON-RPC request; its response will arrive on the stream."""
        request_id = next(self._ids)
        self.requests[request_id] = method
        await self._post({"jsonrpc": "2.0", "id": request_id, "method": method, **_params(params)})
        return request_id

    async def notify(self, method: str, params: Mapping[str, object] | None = None) -> None:
        await self._post({"jsonrpc": "2.0", "method": method, **_params(params)})

    async def _post(self, message: Mapping[str, object]) -> None:
        assert self.messages_url is not None
        response = await post_jsonrpc(self._client, self.messages_url, message)
        if response.status_code != 202:
            raise RuntimeError(f"legacy POST answered {response.status_code}, expected 202")

    async def read_response(self, request_id: int) -> WireEvent:
        """Read and apply events up to the response to *request_id*."""
        while True:
            event = await self.next_event()
            if event is None:
                raise RuntimeError(f"stream ended before the response to request {request_id}")
            event.consumed = True
            if response_id(event) == request_id:
                return event

    async def handshake(self) -> None:
        """initialize, notifications/initialized and tools/list, as any MCP client starts."""
        init = await self.request(
            "initialize",
            {
                "protocolVersion": LEGACY_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "demo-raw-legacy-client", "version": "0"},
            },
        )
        await self.read_response(init)
        await self.notify("notifications/initialized")
        await self.read_response(await self.request("tools/list"))


def _params(params: Mapping[str, object] | None) -> dict[str, object]:
    return {"params": dict(params)} if params is not None else {}


def response_id(event: WireEvent) -> object:
    """The JSON-RPC id if *event* carries a response (result or error), else None."""
    if not event.data:
        return None
    try:
        message = json.loads(event.data)
    except ValueError:
        return None
    if isinstance(message, dict) and ("result" in message or "error" in message):
        return message.get("id")
    return None


@dataclass(frozen=True)
class ToolOutcome:
    """How a tools/call ended for the application: a result text, or an error."""

    text: str | None = None
    error: str | None = None

    @property
    def arrived(self) -> bool:
        return self.text is not None


class SdkSession(Protocol):
    """The two calls the scenarios make through an SDK client session."""

    async def call_tool(
        self, name: str, arguments: Mapping[str, object], *, read_timeout: float | None = None
    ) -> ToolOutcome: ...

    async def list_tools(self) -> list[str]: ...


@dataclass
class _SdkSession:
    session: Any
    progress: list[float] = field(default_factory=list)

    async def _on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append(progress)

    async def call_tool(
        self, name: str, arguments: Mapping[str, object], *, read_timeout: float | None = None
    ) -> ToolOutcome:
        timeout: Any = read_timeout
        if read_timeout is not None and MCP_MAJOR < 2:
            timeout = timedelta(seconds=read_timeout)
        try:
            result = await self.session.call_tool(
                name,
                dict(arguments),
                read_timeout_seconds=timeout,
                # A progress callback makes the SDK send a progressToken, without
                # which servers send no notifications/progress at all.
                progress_callback=self._on_progress,
            )
        except _McpError as exc:
            return ToolOutcome(error=str(exc))
        texts = [getattr(c, "text", "") for c in result.content]
        is_error = getattr(result, "is_error", None) or getattr(result, "isError", False)
        if is_error:
            return ToolOutcome(error=" ".join(texts))
        return ToolOutcome(text=" ".join(texts))

    async def list_tools(self) -> list[str]:
        result = await self.session.list_tools()
        return [tool.name for tool in result.tools]


@contextlib.asynccontextmanager
async def sdk_streamable_session(url: str) -> AsyncIterator[SdkSession]:
    """An initialised SDK session over streamable HTTP (with Mcp-Session-Id)."""
    transport = importlib.import_module("mcp.client.streamable_http")
    async with new_http_client() as http:
        if MCP_MAJOR >= 2:
            client_cls = importlib.import_module("mcp").Client
            connect = transport.streamable_http_client(url, http_client=http)
            async with client_cls(connect, mode="legacy") as client:
                yield _SdkSession(client)
        else:
            session_cls = importlib.import_module("mcp").ClientSession
            async with (
                transport.streamable_http_client(url, http_client=http) as (read, write, _),
                session_cls(read, write) as session,
            ):
                await session.initialize()
                yield _SdkSession(session)


@contextlib.asynccontextmanager
async def sdk_stateless_session(url: str) -> AsyncIterator[SdkSession]:
    """The SDK client as a new user writes it, against a stateless server.

    mcp 2.x: ``mcp.Client(url)``, whose default mode ("auto") sends
    ``server/discover`` and speaks 2026-07-28: no session, no event ids, so
    nothing to resume a broken stream with. mcp 1.x predates 2026-07-28: its
    streamable-HTTP session (initialize, 2025-11-25), which against a server
    without an event store receives no event ids either.
    """
    if MCP_MAJOR >= 2:
        async with importlib.import_module("mcp").Client(url) as client:
            yield _SdkSession(client)
    else:
        async with sdk_streamable_session(url) as session:
            yield session


@contextlib.asynccontextmanager
async def sdk_legacy_session(url: str) -> AsyncIterator[SdkSession]:
    """An initialised SDK session over the legacy HTTP+SSE transport (``GET /sse``)."""
    transport = importlib.import_module("mcp.client.sse")
    if MCP_MAJOR >= 2:
        client_cls = importlib.import_module("mcp").Client
        async with client_cls(transport.sse_client(url), mode="legacy") as client:
            yield _SdkSession(client)
    else:
        session_cls = importlib.import_module("mcp").ClientSession
        async with transport.sse_client(url) as (read, write), session_cls(read, write) as session:
            await session.initialize()
            yield _SdkSession(session)
