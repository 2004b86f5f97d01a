# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""The MCP servers of the demo: the fleet of the seeds, on real sockets.

Two families:

* :class:`FleetInstance`, hand-written on Starlette: the legacy HTTP+SSE
  listener (``GET /sse`` + ``POST /messages/?session_id=...``, 2024-11-05) with
  event ids from one process-wide :class:`EventIdAllocator`, plus the
  streamable-HTTP resume listener (``GET /mcp`` with ``Last-Event-ID``) in each
  of the ways the seeds saw real instances answer: bridge the legacy session and
  replay strictly after the cursor (seed 004), renumber with an off-by-one
  per-session counter (seed 000, duplicate ids), answer an empty stream,
  open a fresh session with ids restarting at 1 (seed 000), or 404.
* :func:`sdk_streamable_app`: the installed MCP SDK's own streamable-HTTP
  server (mcp 1.x ``FastMCP``, mcp 2.x ``MCPServer``) with one of the event
  stores below, so priming events, ``retry:`` and replay happen on the SDK's
  own terms.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .clients import LEGACY_PROTOCOL_VERSION, MCP_MAJOR

if MCP_MAJOR >= 2:
    from mcp.server.mcpserver import Context as _Context
    from mcp.server.mcpserver import MCPServer as _SdkServer
else:
    from mcp.server.fastmcp import Context as _Context  # type: ignore[no-redef]
    from mcp.server.fastmcp import FastMCP as _SdkServer  # type: ignore[no-redef]
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore

__all__ = [
    "EventIdAllocator",
    "FleetInstance",
    "IntEventStore",
    "KnownSession",
    "PrefixedEventStore",
    "ResetEventStore",
    "UnknownSession",
    "UuidEventStore",
    "sdk_streamable_app",
]

KnownSession = Literal["bridge", "reuse_cursor_id", "empty"]
UnknownSession = Literal["fresh", "reject"]

_SSE_HEADERS: Final = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_FRESH_EVENTS: Final = 3
# How long ``slow`` waits for a row's ``answer_when`` (a bound on a broken
# row, never what a passing one waits for).
_ANSWER_WHEN_TIMEOUT_S: Final = 10.0
TOOLS: Final[tuple[dict[str, object], ...]] = (
    {
        "name": "search_index",
        "description": "Search the document index.",
        "inputSchema": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
    {
        "name": "echo",
        "description": "Return the text unchanged.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
)


# How long the polling tool waits after each close of its stream.
POLL_AWAY_S: Final = 0.3


def search_hits(query: str) -> str:
    """The (fixed) result of ``search_index``: what the client must not lose."""
    return f"3 hits for {query!r}: doc-17, doc-42, doc-99"


class EventIdAllocator:
    """One event-id counter for a whole process, shared by every stream and listener.

    The legacy fleet of seed 000 numbered all events of all sessions from one
    global counter (``4817``...); the dual listener of seed 004 shared one
    between its legacy and streamable listeners (``e-100``...). Thread-safe,
    because the instances of one fleet may run in different server threads.
    """

    def __init__(self, start: int = 1, prefix: str = "") -> None:
        self.prefix = prefix
        self._counter = itertools.count(start)
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            return f"{self.prefix}{next(self._counter)}"

    def number(self, event_id: str) -> int | None:
        """The counter value inside *event_id*, if it carries this allocator's prefix."""
        digits = event_id.removeprefix(self.prefix) if event_id.startswith(self.prefix) else ""
        return int(digits) if digits.isdigit() else None


def _frame(event_id: str | None, event: str, data: str) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {data}\n\n"


def _notification(method: str, params: Mapping[str, object]) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": dict(params)})


def _log(message: str) -> str:
    return _notification("notifications/message", {"level": "info", "data": message})


@dataclass
class _LoggedEvent:
    id: str
    event: str
    data: str


@dataclass
class _LegacySession:
    """A legacy session: its live queue and every event it was ever sent (for bridging)."""

    id: str
    queue: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    log: list[_LoggedEvent] = field(default_factory=list)


class FleetInstance:
    """One hand-written fleet instance: a legacy listener plus a streamable resume listener.

    ``on_known`` says what ``GET /mcp`` with ``Last-Event-ID`` does for a session
    this instance knows (the legacy listener's sessions are bridged);
    ``on_unknown`` what it does for any other session id.
    """

    def __init__(
        self,
        name: str,
        *,
        allocator: EventIdAllocator,
        session_ids: Callable[[], str] = lambda: uuid.uuid4().hex,
        on_known: KnownSession = "bridge",
        on_unknown: UnknownSession = "fresh",
    ) -> None:
        self.name = name
        self.allocator = allocator
        self._session_ids = session_ids
        self.on_known = on_known
        self.on_unknown = on_unknown
        self.sessions: dict[str, _LegacySession] = {}
        self.app = Starlette(
            routes=[
                Route("/sse", self._legacy_stream, methods=["GET"]),
                Route("/messages/", self._legacy_message, methods=["POST"]),
                Route("/mcp", self._resume, methods=["GET"]),
            ]
        )

    # -- legacy HTTP+SSE listener (2024-11-05) -------------------------------------

    def _send(self, session: _LegacySession, event: str, data: str) -> None:
        # Allocation, logging and queueing happen together, so a stream's ids are
        # in log order and a bridged replay sees exactly what was sent.
        logged = _LoggedEvent(self.allocator.allocate(), event, data)
        session.log.append(logged)
        session.queue.put_nowait(_frame(logged.id, logged.event, logged.data))

    async def _legacy_stream(self, request: Request) -> Response:
        session = _LegacySession(self._session_ids())
        self.sessions[session.id] = session
        self._send(session, "endpoint", f"/messages/?session_id={session.id}")

        async def frames() -> AsyncIterator[str]:
            while True:
                yield await session.queue.get()

        return StreamingResponse(frames(), media_type="text/event-stream", headers=_SSE_HEADERS)

    async def _legacy_message(self, request: Request) -> Response:
        session_id = request.query_params.get("session_id")
        if not session_id:
            return Response("session_id is required", status_code=400)
        session = self.sessions.get(session_id)
        if session is None:
            return Response("Could not find session", status_code=404)
        try:
            message = json.loads(await request.body())
        except ValueError:
            return Response("Could not parse message", status_code=400)
        for data in _answer(message):
            self._send(session, "message", data)
        return Response("Accepted", status_code=202)

    # -- streamable-HTTP resume listener ------------------------------------------

    async def _resume(self, request: Request) -> Response:
        session_id = request.headers.get("mcp-session-id")
        cursor = request.headers.get("last-event-id")
        session = self.sessions.get(session_id) if session_id else None
        if session is None:
            if self.on_unknown == "reject":
                return _session_not_found()
            return self._fresh_session()
        if self.on_known == "empty" or cursor is None:
            # Knows the session, not the cursor: 200 and a stream that just ends.
            frames: list[str] = []
        elif self.on_known == "bridge":
            frames = [_frame(e.id, e.event, e.data) for e in _after(session.log, cursor)]
        else:
            frames = self._renumbered(session, cursor)
        return _finite_stream(frames, session.id)

    def _renumbered(self, session: _LegacySession, cursor: str) -> list[str]:
        # The migrated listener honours the cursor but numbers with its own
        # per-session counter, seeded off by one: it starts AT the cursor, so the
        # first new event carries an id the client already has, with other content.
        start = self.allocator.number(cursor)
        if start is None:
            return []
        pending = _after(session.log, cursor)
        return [
            _frame(f"{self.allocator.prefix}{start + i}", e.event, e.data)
            for i, e in enumerate(pending)
        ]

    def _fresh_session(self) -> Response:
        # Seed 000: the instance does not know the session, treats the reconnect
        # as a new one, and streams only new events from a local counter at 1.
        fresh_id = uuid.uuid4().hex
        frames = [
            _frame(str(n), "message", _log(f"{self.name}: session {fresh_id[:8]} event {n}"))
            for n in range(1, _FRESH_EVENTS + 1)
        ]
        return _finite_stream(frames, fresh_id)


def _after(log: list[_LoggedEvent], cursor: str) -> list[_LoggedEvent]:
    """The events strictly after *cursor* (nothing when the cursor is unknown)."""
    ids = [e.id for e in log]
    return log[ids.index(cursor) + 1 :] if cursor in ids else []


def _finite_stream(frames: list[str], session_id: str) -> Response:
    async def body() -> AsyncIterator[str]:
        for frame in frames:
            yield frame

    headers = {**_SSE_HEADERS, "mcp-session-id": session_id}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


def _session_not_found() -> Response:
    error = {"code": -32600, "message": "Session not found"}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=404)


def _answer(message: object) -> list[str]:
    """Enough MCP for the SDK clients: what the legacy server sends back, in order."""
    if not isinstance(message, dict) or "id" not in message or "method" not in message:
        return []  # a notification or a client response: nothing to send
    request_id, method = message["id"], message["method"]
    params = message.get("params") or {}

    def result(value: object) -> str:
        return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": value})

    if method == "initialize":
        info = {"name": "legacy-instance", "version": "0.1"}
        capabilities = {"tools": {"listChanged": False}, "logging": {}}
        version = {"protocolVersion": LEGACY_PROTOCOL_VERSION}
        return [result({**version, "capabilities": capabilities, "serverInfo": info})]
    if method == "ping":
        return [result({})]
    if method == "tools/list":
        return [result({"tools": list(TOOLS)})]
    if method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments") or {}
        if name == "echo":
            return [result(_text(str(arguments.get("text", ""))))]
        if name == "search_index":
            query = str(arguments.get("query", ""))
            # A log line before the result and two after it: the ones after are
            # what a bridged resume replays (they were sent while the client was cut off).
            return [
                _log(f"search_index: searching {query!r}"),
                result(_text(search_hits(query))),
                _notification("notifications/resources/updated", {"uri": "index://documents"}),
                _log(f"search_index: cached {query!r}"),
            ]
    error = {"code": -32601, "message": f"Method not found: {method}"}
    return [json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})]


def _text(text: str) -> dict[str, object]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


# -- event stores for the SDK servers -------------------------------------------------


@dataclass
class _Stored:
    event_id: str
    stream_id: str
    message: Any


class _OrderedEventStore(EventStore):
    """An in-memory EventStore that keeps arrival order; subclasses only mint ids.

    ``replay_events_after`` follows the SDK contract: the events of the
    cursor's stream strictly after the cursor, then the stream id; None when
    the cursor is unknown (the SDK then answers 200 with an empty stream).
    """

    def __init__(self) -> None:
        self.events: list[_Stored] = []
        self._index: dict[str, int] = {}

    def _mint(self, stream_id: str) -> str:
        raise NotImplementedError

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = self._mint(str(stream_id))
        self._index[event_id] = len(self.events)
        self.events.append(_Stored(event_id, str(stream_id), message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> Any:
        position = self._index.get(last_event_id)
        if position is None:
            return None
        stream_id = self.events[position].stream_id
        for stored in self.events[position + 1 :]:
            # Priming rows (message None) only mark a position; they are never resent.
            if stored.stream_id == stream_id and stored.message is not None:
                await send_callback(EventMessage(stored.message, stored.event_id))
        return stream_id


class IntEventStore(_OrderedEventStore):
    """Integer ids from one counter: ``1``, ``2``, ... (ordering evidence)."""

    def __init__(self, start: int = 1) -> None:
        super().__init__()
        self._counter = itertools.count(start)

    def _mint(self, stream_id: str) -> str:
        return str(next(self._counter))


class ResetEventStore(IntEventStore):
    """An integer-id store that lost everything while the client was away:
    it is emptied when the first resume asks it for a replay, as a store that
    restarted or evicted its contents would be, and it goes on storing (with
    the same counter) what the server sends afterwards.

    Every cursor it was asked about is unknown to it from then on; the SDK
    server answers those resumes 200 with an empty stream that it ends at once.
    """

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> Any:
        if not self.resets:
            self.resets += 1
            self.events.clear()
            self._index.clear()
        return await super().replay_events_after(last_event_id, send_callback)


class PrefixedEventStore(_OrderedEventStore):
    """``<stream>_<n>`` ids, one counter per stream (ordering within a prefix)."""

    def __init__(self) -> None:
        super().__init__()
        self._counters: dict[str, itertools.count[int]] = {}

    def _mint(self, stream_id: str) -> str:
        counter = self._counters.setdefault(stream_id, itertools.count(1))
        return f"{stream_id}_{next(counter)}"


class UuidEventStore(_OrderedEventStore):
    """Random UUID ids: opaque, no ordering evidence at all."""

    def _mint(self, stream_id: str) -> str:
        return str(uuid.uuid4())


# -- the installed SDK's streamable-HTTP server ------------------------------------------


def _register_tools(server: Any, answer_when: Any = None) -> None:
    @server.tool()
    async def search_index(query: str) -> str:
        """Search the document index."""
        return search_hits(query)

    @server.tool()
    async def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    async def slow(ctx: _Context, steps: int = 3) -> str:  # type: ignore[type-arg]
        """Report progress per step, then answer: a stream to sever mid-call.

        Progress rather than log lines: mcp 2.x deprecates server logging, and a
        progress notification goes out whenever the client sent a progressToken.
        """
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step}/{steps}")
            if step == 1 and answer_when is not None:
                # A row that needs the answer to come only after a cut it
                # makes: the server waits for the row (in a thread of its own).
                await asyncio.to_thread(answer_when.wait, _ANSWER_WHEN_TIMEOUT_S)
        return f"slow finished {steps} steps"

    @server.tool()
    async def poll(ctx: _Context, cuts: int = 2) -> str:  # type: ignore[type-arg]
        """Poll (2025-11-25): report progress and close the SSE stream, *cuts*
        times, then answer; the client reconnects after each close."""
        for cut in range(1, cuts + 1):
            await ctx.report_progress(cut, cuts, f"cut {cut}/{cuts}")
            await ctx.close_sse_stream()
            # The client is away for the retry interval; what is sent meanwhile
            # is stored and replayed, so the outcome does not hang on this wait.
            await asyncio.sleep(POLL_AWAY_S)
        return f"poll finished after {cuts} cuts"


class _NoReplayWithoutStore:
    """Answer a resume (``GET`` with ``Last-Event-ID``) that the SDK's transport
    cannot serve, as the SDK's own 2026-07-28 path answers any GET: 405, ``Allow: POST``.

    Without an event store (every stateless instance), both SDK majors'
    ``_replay_events`` return without starting a response; uvicorn then sends a
    500 of its own and logs "ASGI callable returned without starting
    response.". 405 is what the protocol asks of a server that offers no SSE
    stream at GET, and the SDK clients treat it as they treat that 500 (a failed
    reconnect, retried up to their limit), so the verdicts do not change.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "GET"
            and any(name == b"last-event-id" for name, _ in scope["headers"])
        ):
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _SessionEndRace(logging.Filter):
    """Drop mcp 1.x's "Error in standalone SSE writer" when it is only the
    session's own end.

    When the client ends its session (``DELETE``), the mcp 1.x server closes
    the standalone GET stream's channel while that stream's writer still reads
    from it; the writer then logs ``anyio.ClosedResourceError`` with a
    traceback. Nothing is lost (the session is over) and the client sees
    nothing, so this record alone is dropped; any other error of the writer
    still shows.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        import anyio

        error = record.exc_info[1] if record.exc_info else None
        return not (
            record.getMessage() == "Error in standalone SSE writer"
            and isinstance(error, anyio.ClosedResourceError)
        )


def _quiet_session_end() -> None:
    sdk_logger = logging.getLogger("mcp.server.streamable_http")
    if not any(isinstance(f, _SessionEndRace) for f in sdk_logger.filters):
        sdk_logger.addFilter(_SessionEndRace())


def sdk_streamable_app(
    *,
    event_store: EventStore | None = None,
    retry_interval_ms: int | None = 50,
    stateless: bool = False,
    name: str = "demo-sdk",
    answer_when: Any = None,
) -> Starlette:
    """The SDK's streamable-HTTP app at ``/mcp``, tools ``search_index``, ``echo``, ``slow``.

    ``answer_when`` (a ``threading.Event``): ``slow`` answers only once it is
    set, after its first progress.

    ``stateless=True`` is the 2026-07-28 instance of the seeds. On mcp 2.x the
    manager serves 2026-07-28 requests statelessly in any case and
    ``stateless_http=True`` makes the handshake-era path stateless too (no
    ``Mcp-Session-Id``, no event store). mcp 1.x predates 2026-07-28 (it
    rejects that ``MCP-Protocol-Version`` with 400); ``stateless_http=True`` is
    the closest: no sessions and no event store, but still the initialize era.
    """
    store = None if stateless else event_store
    if MCP_MAJOR >= 2:
        server = _SdkServer(name, log_level="WARNING")
        _register_tools(server, answer_when)
        app: Starlette = server.streamable_http_app(
            event_store=store, retry_interval=retry_interval_ms, stateless_http=stateless
        )
    else:
        _quiet_session_end()
        server = _SdkServer(
            name,
            event_store=store,
            retry_interval=retry_interval_ms,
            stateless_http=stateless,
            log_level="WARNING",
        )
        _register_tools(server, answer_when)
        app = server.streamable_http_app()
    if store is None:
        app.add_middleware(_NoReplayWithoutStore)
    return app
