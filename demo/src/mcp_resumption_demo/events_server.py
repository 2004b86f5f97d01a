# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""A server of the MCP Events extension (``io.modelcontextprotocol/events``,
SEP-3415) on the 2026-07-28 streamable HTTP transport, for the demo's
events rows (:mod:`.events_scenarios`) and the tests.

No SDK ships a poll or push events server, so this one follows the
specification to the letter, as a bare ASGI app under uvicorn: it runs in
both test environments and needs no MCP SDK.  Stateless: no ``initialize``,
no session; ``server/discover`` declares the extension; every request passes
the 2026-07-28 ladder (``_meta`` envelope, ``MCP-Protocol-Version`` and
``Mcp-Method`` headers) as the mcp 2.x server runs it.

Start: ``with EventsServer(retention=5, heartbeat_s=0.1) as server:`` (or
``.start()`` / ``.close()``); ``server.url`` is the MCP endpoint on a free
127.0.0.1 port (``EventsServer(sock=...)``: on that bound socket instead).
Two event types: :data:`REPLAYABLE` (poll, push, webhook; the last
``retention`` events can be replayed) and :data:`NO_REPLAY` (push, webhook;
cursor always null).  Both take ``arguments: {"project": str}``.
Cursors are opaque (base64 of epoch, type and offset).

Controls, safe from any thread; ``request_id`` = None means every open stream:

- ``publish(type, count=1, project="alpha", data=None) -> [eventId]``
- ``set_heartbeat(seconds)``; ``stop_heartbeats(request_id)`` (events still
  flow); ``silence(request_id)`` (nothing at all, the stream stays open);
  ``resume(request_id)``
- ``send_error(request_id, code, message, data)``: a transient error
- ``terminate(request_id, code=-32024, message, data)``: ``terminated`` then
  the final result; with None (or a webhook id) also a ``terminated``
  envelope to webhook subscriptions
- ``fail_next_poll(code, message, data)``: poll's termination signal
- ``cut(request_id)``: the connection closed, nothing said
- ``close_streams(request_id)``: the final empty result, nothing else
- ``restart(lose_retention=False)``: streams cut, webhook subscriptions
  forgotten; with ``lose_retention`` a new epoch, so old cursors truncate
- ``open_streams()``, ``wait_streams(n)`` / ``await await_streams(n)``,
  ``webhook_ids()``, ``cursor(type, offset)``

Dialects: ``EventsServer(dialect=Dialect(capability="top-level",
gap_field="cursorGap", poll_interval="nextPollSeconds", expired_error=True))``.

Ground truth: ``server.log`` (:class:`events_log.EventsLog`): published
events with their offsets, one :class:`~events_log.Exchange` per request
(``exchange(request_id, method)``: cursor in, start offset, truncated,
eventIds delivered, cursors out, how it ended), ``truncations()`` with the
skipped offsets and eventIds, ``delivered_ids(request_id)``.

As a subprocess: ``python -m mcp_resumption_demo.events_server [--retention N]
[--heartbeat S]``
prints ``{"url", "admin"}``; ``POST admin/<control>`` with the keyword
arguments as JSON, ``GET admin/log``; stdin closed or SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import http.client
import json
import logging
import secrets
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone

import uvicorn

from .events_log import EventsLog, Exchange, Published, Truncation

PROTOCOL_VERSION = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/events"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"

INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_PROTOCOL_VERSION = -32022
NOT_FOUND = -32023
FORBIDDEN = -32024
UNSUPPORTED = -32026
CURSOR_EXPIRED = -32011  # the dialect some servers use instead of ``truncated``

# As the mcp 2.x server maps JSON-RPC errors to HTTP statuses; others are 200.
_HTTP_STATUS = {-32700: 400, -32600: 400, INVALID_PARAMS: 400, HEADER_MISMATCH: 400,
                UNSUPPORTED_PROTOCOL_VERSION: 400, METHOD_NOT_FOUND: 404}

ADMIN_CONTROLS = frozenset({
    "publish", "set_heartbeat", "stop_heartbeats", "silence", "resume", "send_error",
    "terminate", "fail_next_poll", "cut", "close_streams", "restart", "open_streams",
    "webhook_ids"})

REPLAYABLE = "ticket.created"
NO_REPLAY = "presence.changed"

_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"project": {"type": "string", "description": "only this project's events"}},
}
_PAYLOAD_SCHEMA = {
    "type": "object",
    "properties": {"project": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["project", "n"],
}


@dataclass(frozen=True)
class EventTypeSpec:
    name: str
    description: str
    delivery: tuple[str, ...]
    replay: bool


DEFAULT_TYPES = (
    EventTypeSpec(REPLAYABLE, "A ticket was created (replayable, bounded retention)",
                  ("poll", "push", "webhook"), True),
    EventTypeSpec(NO_REPLAY, "Someone's presence changed (live only: cursor always null)",
                  ("push", "webhook"), False),
)


@dataclass
class Dialect:
    """How this server words the same facts; the defaults are the specification's."""

    capability: str = "extension"  # or "top-level": capabilities.events
    gap_field: str = "truncated"  # or "cursorGap"
    poll_interval: str = "nextPollMs"  # or "nextPollSeconds"
    expired_error: bool = False  # a CursorExpired JSON-RPC error instead of truncated: true


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def body(self) -> dict:
        error = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


@dataclass
class _Stored:
    offset: int
    event_id: str
    timestamp: str
    at_ms: float
    data: dict


@dataclass
class _Start:
    offset: int  # the first offset to deliver
    truncated: bool
    cursor_offset: int | None


@dataclass
class _Stream:
    exchange: Exchange
    request_id: object
    type: EventTypeSpec
    project: str | None
    next_offset: int
    wake: asyncio.Event
    heartbeats: bool = True
    silent: bool = False
    actions: list[tuple[str, object]] = field(default_factory=list)


@dataclass
class _Webhook:
    key: tuple
    id: str
    exchange: Exchange
    type: EventTypeSpec
    project: str | None
    url: str
    secret: str
    refresh_before: float | None  # epoch seconds; None = no expiry
    next_offset: int
    epoch: str
    wake: asyncio.Event
    watermark: int
    active: bool = True
    last_delivery_at: str | None = None
    last_error: str | None = None
    ended: bool = False
    task: asyncio.Task | None = None
    actions: list[tuple[str, RpcError]] = field(default_factory=list)


def _now_iso(at: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if at is None else at, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _DropDeliberateCuts(logging.Filter):
    """uvicorn logs an error when a handler ends a response unfinished, which
    is how a cut is made; drop exactly as many of those lines as cuts were made."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != "ASGI callable returned without completing response.":
            return True
        with self._lock:
            if self.pending:
                self.pending -= 1
                return False
        return True


class EventsServer:
    """The events server on a free 127.0.0.1 port, in a thread of its own.

    ``with EventsServer() as server: ...`` or ``server = EventsServer().start()``
    then ``server.close()``.  ``server.url`` is the MCP endpoint.
    """

    def __init__(
        self,
        *,
        types: tuple[EventTypeSpec, ...] = DEFAULT_TYPES,
        retention: int = 20,
        heartbeat_s: float = 1.0,
        next_poll_ms: int = 1000,
        max_events: int = 100,
        dialect: Dialect | None = None,
        webhook_attempts: int = 3,
        webhook_backoff_s: float = 0.05,
        webhook_ttl_ms: tuple[int, int, int] = (500, 60_000, 3_600_000),
        allow_http_callbacks: bool = True,
        sock: socket.socket | None = None,
    ) -> None:
        self.types = {t.name: t for t in types}
        self.retention = retention
        self.heartbeat_s = heartbeat_s
        self.next_poll_ms = next_poll_ms
        self.max_events = max_events
        self.dialect = dialect or Dialect()
        self.webhook_attempts = webhook_attempts
        self.webhook_backoff_s = webhook_backoff_s
        # (minimum, default, maximum) grant in ms
        self.webhook_ttl_ms = webhook_ttl_ms
        # The one deliberate deviation: tests receive webhooks on loopback http.
        self.allow_http_callbacks = allow_http_callbacks
        # A socket bound for it (the demo's reserved port, announced before a scrape).
        self._sock = sock
        self.log = EventsLog()
        self._lock = threading.RLock()
        self._epoch = secrets.token_hex(4)
        self._events: dict[str, list[_Stored]] = {name: [] for name in self.types}
        self._head: dict[str, int] = {name: 0 for name in self.types}
        self._streams: list[_Stream] = []
        self._webhooks: dict[tuple, _Webhook] = {}
        self._poll_errors: list[RpcError] = []
        self._cut_filter = _DropDeliberateCuts()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.url = ""

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> EventsServer:
        sock = self._sock
        if sock is None:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        config = uvicorn.Config(self._app, log_level="warning", lifespan="off", interface="asgi3",
                                timeout_graceful_shutdown=2)
        self._uvicorn = uvicorn.Server(config)
        logging.getLogger("uvicorn.error").addFilter(self._cut_filter)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(sock,), daemon=True,
                                        name=f"events-server-{self.port}")
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._uvicorn.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("events server did not start")
            time.sleep(0.01)
        return self

    def _run(self, sock: socket.socket) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._uvicorn.serve(sockets=[sock]))
            pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
        finally:
            self._loop.close()

    def close(self) -> None:
        if self._thread is None:
            return
        self.close_streams()
        with self._lock:
            hooks = list(self._webhooks.values())
            self._webhooks.clear()
        for hook in hooks:
            hook.ended = True
            self._wake(hook.wake)
        self._uvicorn.should_exit = True
        self._thread.join(15)
        logging.getLogger("uvicorn.error").removeFilter(self._cut_filter)
        self._thread = None

    def __enter__(self) -> EventsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- controls (any thread) ------------------------------------------------
    def publish(self, type: str = REPLAYABLE, count: int = 1, *, project: str = "alpha",
                data: dict | None = None) -> list[str]:
        """Publish ``count`` events of ``type``; return their event ids in order."""
        spec = self.types[type]
        ids = []
        with self._lock:
            for _ in range(count):
                self._head[type] += 1
                offset = self._head[type]
                event_id = f"evt_{secrets.token_hex(6)}"  # no sequence: gaps cannot be read off ids
                at = time.time()
                payload = dict(data) if data is not None else {"project": project, "n": offset}
                stored = _Stored(offset, event_id, _now_iso(at), at * 1000, payload)
                retained = self._events[type]
                retained.append(stored)
                if spec.replay:
                    del retained[: max(0, len(retained) - self.retention)]
                else:  # nothing to replay from: only live streams see it
                    retained[:] = retained[-self.retention:]
                self.log.published(Published(event_id, type, offset, self._epoch, stored.timestamp))
                ids.append(event_id)
            wakes = [s.wake for s in self._streams] + [h.wake for h in self._webhooks.values()]
        for wake in wakes:
            self._wake(wake)
        return ids

    def set_heartbeat(self, seconds: float) -> None:
        """The heartbeat interval of every stream, open or to come."""
        self.heartbeat_s = seconds
        self._act(None, None)

    def stop_heartbeats(self, request_id: object = None) -> None:
        """Open streams stay open and deliver events but send no more heartbeats."""
        for stream in self._select(request_id):
            stream.heartbeats = False

    def silence(self, request_id: object = None) -> None:
        """Open streams stay open and send nothing at all (a stalled upstream)."""
        for stream in self._select(request_id):
            stream.silent = True

    def resume(self, request_id: object = None) -> None:
        """Silenced streams speak again, from where they stopped: a stream that
        fell more than the retention behind gets a fresh ``active`` with
        ``truncated: true`` first."""
        for stream in self._select(request_id):
            stream.silent = False
            self._wake(stream.wake)

    def send_error(self, request_id: object = None, *, code: int = INTERNAL_ERROR,
                   message: str = "UpstreamError", data: dict | None = None) -> None:
        """A transient ``notifications/events/error`` on open streams."""
        error = RpcError(code, message, data or {"reason": "upstream 503"})
        self._act(request_id, ("error", error))

    def terminate(self, request_id: object = None, *, code: int = FORBIDDEN,
                  message: str = "Forbidden", data: dict | None = None) -> None:
        """``notifications/events/terminated`` then the final result, on open
        streams; a signed ``terminated`` envelope to webhook subscriptions."""
        error = RpcError(code, message, data or {"reason": "Access revoked"})
        self._act(request_id, ("terminated", error))
        with self._lock:
            hooks = [h for h in self._webhooks.values() if request_id in (None, h.id)]
        for hook in hooks:
            hook.actions.append(("terminated", error))
            self._wake(hook.wake)

    def fail_next_poll(self, *, code: int = FORBIDDEN, message: str = "Forbidden",
                       data: dict | None = None) -> None:
        """Poll's termination signal: the next ``events/poll`` answers this error."""
        with self._lock:
            self._poll_errors.append(RpcError(code, message, data or {"reason": "Access revoked"}))

    def cut(self, request_id: object = None) -> None:
        """Close open streams' connections without ``terminated`` or a result."""
        self._act(request_id, ("cut", None))

    def close_streams(self, request_id: object = None) -> None:
        """End open streams gracefully: the final empty result, nothing else."""
        self._act(request_id, ("complete", None))

    def restart(self, *, lose_retention: bool = False) -> None:
        """Forget every stream (cut) and webhook subscription; with
        ``lose_retention`` also every retained event and the epoch, so old
        cursors name a past the server no longer knows."""
        self.cut()
        with self._lock:
            hooks = list(self._webhooks.values())
            self._webhooks.clear()
            if lose_retention:
                self._epoch = secrets.token_hex(4)
                for name in self.types:
                    self._events[name] = []
                    self._head[name] = 0
        for hook in hooks:
            hook.ended = True
            self.log.update(hook.exchange, ended="forgotten")
            self._wake(hook.wake)

    def open_streams(self) -> list[object]:
        """The JSON-RPC ids of the streams open now (``active`` sent)."""
        with self._lock:
            return [s.request_id for s in self._streams]

    def webhook_ids(self) -> list[str]:
        with self._lock:
            return [h.id for h in self._webhooks.values()]

    def wait_streams(self, count: int, timeout: float = 15) -> None:
        _wait(lambda: len(self.open_streams()) == count, timeout, f"{count} open streams")

    async def await_streams(self, count: int, timeout: float = 15) -> None:
        await _await(lambda: len(self.open_streams()) == count, timeout, f"{count} open streams")

    def _select(self, request_id: object) -> list[_Stream]:
        with self._lock:
            return [s for s in self._streams if request_id is None or s.request_id == request_id]

    def _act(self, request_id: object, action: tuple[str, object] | None) -> None:
        for stream in self._select(request_id):
            if action is not None:
                with self._lock:
                    stream.actions.append(action)
            self._wake(stream.wake)

    def _wake(self, event: asyncio.Event) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(event.set)

    # -- cursors --------------------------------------------------------------
    def cursor(self, type: str, offset: int) -> str | None:
        """The opaque cursor for "everything up to ``offset`` seen"."""
        if not self.types[type].replay:
            return None
        raw = json.dumps([self._epoch, type, offset], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def _decode(self, type: str, cursor: object) -> tuple[str, int]:
        try:
            if not isinstance(cursor, str):
                raise ValueError
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            epoch, name, offset = json.loads(raw)
            if name != type or not isinstance(offset, int) or not isinstance(epoch, str):
                raise ValueError
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
            raise RpcError(INVALID_PARAMS, "Invalid cursor", {"field": "cursor"}) from None
        return epoch, offset

    def _resolve(self, exchange: Exchange, spec: EventTypeSpec, cursor: object,
                 max_age_ms: object) -> _Start:
        """Where delivery starts for ``cursor``; logs and returns the truncation."""
        with self._lock:
            head = self._head[spec.name]
            retained = self._events[spec.name]
            if not spec.replay or cursor is None:
                self.log.update(exchange, start_offset=head + 1)
                return _Start(head + 1, False, None)
            epoch, offset = self._decode(spec.name, cursor)
            oldest = retained[0].offset if retained else head + 1
            lost_before: tuple[str, ...] = ()
            if epoch != self._epoch:
                start, cursor_offset, reason = oldest, None, "epoch"
                # What the old life published after the cursor is gone with it.
                lost_before = tuple(p.event_id for p in self.log.published_events(spec.name)
                                    if p.epoch == epoch and p.offset > offset)
            else:
                start, cursor_offset, reason = max(offset + 1, oldest), offset, "retention"
            if isinstance(max_age_ms, (int, float)) and not isinstance(max_age_ms, bool):
                floor = time.time() * 1000 - max_age_ms
                later = next((e.offset for e in retained if e.offset >= start and e.at_ms >= floor),
                             head + 1)
                if later > start:
                    start, reason = later, ("max_age" if reason != "epoch" else reason)
            truncated = cursor_offset is None or start > cursor_offset + 1
            if truncated:
                low = 1 if cursor_offset is None else cursor_offset + 1
                span = (low, start - 1) if start - 1 >= low else None
                skipped = lost_before + tuple(
                    p.event_id for p in self.log.published_events(spec.name)
                    if p.epoch == self._epoch and span and span[0] <= p.offset <= span[1])
                self.log.truncation(Truncation(exchange.seq, exchange.request_id, spec.name,
                                               cursor_offset, start, span, skipped, reason))
            self.log.update(exchange, cursor_in_offset=cursor_offset, start_offset=start,
                            truncated=truncated)
            if truncated and self.dialect.expired_error:
                raise RpcError(CURSOR_EXPIRED, "CursorExpired",
                               {"cursor": self.cursor(spec.name, start - 1)})
            return _Start(start, truncated, cursor_offset)

    def _pending(self, spec: EventTypeSpec, project: str | None, start: int) -> list[_Stored]:
        with self._lock:
            return [e for e in self._events[spec.name] if e.offset >= start
                    and (project is None or e.data.get("project") == project)]

    def _oldest(self, spec: EventTypeSpec) -> int:
        with self._lock:
            retained = self._events[spec.name]
            return retained[0].offset if retained else self._head[spec.name] + 1

    def _occurrence(self, spec: EventTypeSpec, event: _Stored) -> dict:
        return {"eventId": event.event_id, "name": spec.name, "timestamp": event.timestamp,
                "data": event.data}

    # -- the MCP endpoint -----------------------------------------------------
    async def _app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].startswith("/admin/"):
            await self._admin(scope, receive, send)
            return
        if scope["path"] != "/mcp":
            await _respond(send, 404, None)
            return
        if scope["method"] != "POST":  # 2026-07-28 has no GET stream and no DELETE
            await _respond(send, 405, None)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        origin = headers.get("origin")
        if origin and urllib.parse.urlsplit(origin).hostname not in ("127.0.0.1", "localhost"):
            await _respond(send, 403, {"jsonrpc": "2.0", "error": {
                "code": -32600, "message": "Forbidden origin"}})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            request = json.loads(body)
            if not isinstance(request, dict) or request.get("jsonrpc") != "2.0":
                raise ValueError
        except ValueError:
            await _respond(send, 400, {"jsonrpc": "2.0", "id": None,
                                       "error": {"code": -32700, "message": "Parse error"}})
            return
        if "id" not in request:  # a notification: this extension defines none from the client
            await _respond(send, 202, None)
            return
        request_id = request["id"]
        try:
            self._check_envelope(request, headers)
            method = request.get("method")
            params = request.get("params") or {}
            if method == "events/stream":
                await self._stream(request_id, params, headers, receive, send)
                return
            handler = {
                "server/discover": self._discover,
                "events/list": self._list,
                "events/poll": self._poll,
                "events/subscribe": self._subscribe,
                "events/unsubscribe": self._unsubscribe,
            }.get(method)
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, "Method not found")
            result = handler(request_id, params, headers)
            if asyncio.iscoroutine(result):
                result = await result
        except RpcError as error:
            await _respond(send, _HTTP_STATUS.get(error.code, 200),
                           {"jsonrpc": "2.0", "id": request_id, "error": error.body()})
            return
        await _respond(send, 200, {"jsonrpc": "2.0", "id": request_id, "result": result})

    async def _admin(self, scope, receive, send) -> None:
        """``POST /admin/<control>`` with the keyword arguments as a JSON object,
        ``GET /admin/log``: the controls for a server run as a subprocess."""
        name = scope["path"][len("/admin/"):]
        if name == "log":
            await _respond(send, 200, self.log.snapshot())
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if name not in ADMIN_CONTROLS:
            await _respond(send, 404, {"error": f"no control {name!r}"})
            return
        try:
            value = getattr(self, name)(**(json.loads(body) if body else {}))
        except (TypeError, ValueError, KeyError) as error:
            await _respond(send, 400, {"error": repr(error)})
            return
        await _respond(send, 200, {"result": value})

    def _check_envelope(self, request: dict, headers: dict[str, str]) -> None:
        """The 2026-07-28 per-request ladder, in the mcp 2.x server's order."""
        params = request.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if not isinstance(meta, dict) or PROTOCOL_VERSION_META not in meta \
                or CLIENT_CAPABILITIES_META not in meta:
            raise RpcError(INVALID_PARAMS, "params._meta must carry the protocol version and "
                           "client capabilities")
        version = meta[PROTOCOL_VERSION_META]
        if headers.get("mcp-protocol-version") != version:
            raise RpcError(HEADER_MISMATCH, "MCP-Protocol-Version header does not match")
        if headers.get("mcp-method") != request.get("method"):
            raise RpcError(HEADER_MISMATCH, "Mcp-Method header does not match")
        if version != PROTOCOL_VERSION:
            raise RpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version",
                           {"supported": [PROTOCOL_VERSION], "requested": version})

    def _discover(self, request_id: object, params: dict, headers: dict) -> dict:
        settings = {"listChanged": False}
        capabilities = ({"events": settings} if self.dialect.capability == "top-level"
                        else {"extensions": {EXTENSION: settings}})
        return {"resultType": "complete", "supportedVersions": [PROTOCOL_VERSION],
                "capabilities": capabilities,
                "_meta": {"io.modelcontextprotocol/serverInfo": {
                    "name": "tests-events-server", "version": "1.0.0"}}}

    def _list(self, request_id: object, params: dict, headers: dict) -> dict:
        return {"resultType": "complete", "events": [
            {"name": t.name, "description": t.description, "delivery": list(t.delivery),
             "inputSchema": _INPUT_SCHEMA, "payloadSchema": _PAYLOAD_SCHEMA}
            for t in self.types.values()]}

    def _type(self, params: dict, mode: str) -> tuple[EventTypeSpec, str | None]:
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "name is required")
        spec = self.types.get(name)
        if spec is None:
            raise RpcError(NOT_FOUND, "NotFound", {"kind": "event"})
        if mode not in spec.delivery:
            raise RpcError(UNSUPPORTED, "Unsupported", {"feature": "deliveryMode", "value": mode})
        arguments = params.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict) or not isinstance(arguments.get("project", ""), str):
            raise RpcError(INVALID_PARAMS, "arguments do not match the inputSchema")
        return spec, arguments.get("project")

    def _poll(self, request_id: object, params: dict, headers: dict) -> dict:
        spec, project = self._type(params, "poll")
        cursor = params.get("cursor")
        exchange = self.log.open("events/poll", request_id, type=spec.name, cursor_in=cursor)
        with self._lock:
            failure = self._poll_errors.pop(0) if self._poll_errors else None
        if failure is not None:
            self.log.update(exchange, ended="terminated", error_code=failure.code)
            raise failure
        try:
            start = self._resolve(exchange, spec, cursor, params.get("maxAgeMs"))
        except RpcError as error:
            self.log.update(exchange, ended="error", error_code=error.code)
            raise
        limit = params.get("maxEvents")
        limit = limit if isinstance(limit, int) and limit > 0 else self.max_events
        with self._lock:
            head = self._head[spec.name]
            pending = self._pending(spec, project, start.offset) if cursor is not None else []
        batch, more = pending[:limit], len(pending) > limit
        position = batch[-1].offset if more else head
        for event in batch:
            self.log.delivered(exchange, event.event_id)
        out = self.cursor(spec.name, position)
        self.log.cursor_out(exchange, "poll", out)
        self.log.update(exchange, ended="answered")
        interval = ({"nextPollSeconds": self.next_poll_ms / 1000}
                    if self.dialect.poll_interval == "nextPollSeconds"
                    else {"nextPollMs": self.next_poll_ms})
        return {"resultType": "complete", "events": [self._occurrence(spec, e) for e in batch],
                "cursor": out, self.dialect.gap_field: start.truncated, "hasMore": more,
                **interval}

    # -- push -----------------------------------------------------------------
    async def _stream(self, request_id: object, params: dict, headers: dict, receive,
                      send) -> None:
        spec, project = self._type(params, "push")
        cursor = params.get("cursor")
        exchange = self.log.open("events/stream", request_id, type=spec.name, cursor_in=cursor)
        try:
            start = self._resolve(exchange, spec, cursor, params.get("maxAgeMs"))
        except RpcError as error:
            self.log.update(exchange, ended="error", error_code=error.code)
            raise
        stream = _Stream(exchange, request_id, spec, project, start.offset, asyncio.Event())
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
            (b"x-accel-buffering", b"no")]})
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            stream.wake.set()

        watcher = asyncio.ensure_future(watch())
        meta = {SUBSCRIPTION_ID: request_id}

        async def notify(method: str, params: dict) -> None:
            frame = {"jsonrpc": "2.0", "method": method, "params": {**params, "_meta": meta}}
            await send({"type": "http.response.body", "more_body": True,
                        "body": f"event: message\ndata: {json.dumps(frame)}\n\n".encode()})
            self.log.sent(exchange, time.time())

        # Registered before ``active`` goes out: a client that saw it can act on the stream.
        with self._lock:
            self._streams.append(stream)
        ending = "client_closed"
        try:
            head_cursor = self.cursor(spec.name, start.offset - 1)
            await notify("notifications/events/active",
                         {"cursor": head_cursor, self.dialect.gap_field: start.truncated})
            self.log.cursor_out(exchange, "active", head_cursor)
            last_beat = time.monotonic()
            while not gone.is_set():
                stream.wake.clear()
                with self._lock:  # a control appends from another thread
                    actions, stream.actions = stream.actions, []
                finish = None
                for kind, error in actions:
                    if kind == "error" and not stream.silent:
                        await notify("notifications/events/error", {"error": error.body()})
                    elif kind in ("terminated", "cut", "complete"):
                        finish = (kind, error)
                        break
                if finish is not None:
                    ending = await self._finish(finish, notify, send, exchange, request_id)
                    break
                if not stream.silent:
                    await self._deliver_stream(stream, notify)
                now = time.monotonic()
                if stream.heartbeats and not stream.silent and now - last_beat >= self.heartbeat_s:
                    beat = self.cursor(spec.name, stream.next_offset - 1)
                    await notify("notifications/events/heartbeat", {"cursor": beat})
                    self.log.cursor_out(exchange, "heartbeat", beat)
                    last_beat = now
                    continue
                timeout = max(0.0, self.heartbeat_s - (now - last_beat))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stream.wake.wait(), timeout)
        finally:
            # Logged before the stream leaves ``open_streams``: await_streams waits on that.
            self.log.update(exchange, ended=ending)
            with self._lock:
                if stream in self._streams:
                    self._streams.remove(stream)
            watcher.cancel()

    async def _deliver_stream(self, stream: _Stream, notify) -> None:
        spec = stream.type
        oldest = self._oldest(spec)
        if spec.replay and stream.next_offset < oldest:  # the stream fell behind retention
            span = (stream.next_offset, oldest - 1)
            skipped = tuple(p.event_id for p in self.log.published_events(spec.name)
                            if span[0] <= p.offset <= span[1])
            self.log.truncation(Truncation(stream.exchange.seq, stream.request_id, spec.name,
                                           stream.next_offset - 1, oldest, span, skipped,
                                           "stream_behind"))
            stream.next_offset = oldest
            fresh = self.cursor(spec.name, oldest - 1)
            await notify("notifications/events/active", {"cursor": fresh,
                                                         self.dialect.gap_field: True})
            self.log.cursor_out(stream.exchange, "active", fresh)
        with self._lock:
            head = self._head[spec.name]
        for event in self._pending(spec, stream.project, stream.next_offset):
            out = self.cursor(spec.name, event.offset)
            await notify("notifications/events/event",
                         {**self._occurrence(spec, event), "cursor": out})
            self.log.delivered(stream.exchange, event.event_id)
            self.log.cursor_out(stream.exchange, "event", out)
            stream.next_offset = event.offset + 1
        stream.next_offset = max(stream.next_offset, head + 1)

    async def _finish(self, finish: tuple[str, object], notify, send, exchange, request_id) -> str:
        kind, error = finish
        if kind == "cut":
            with self._cut_filter._lock:
                self._cut_filter.pending += 1
            return "cut"  # return unfinished: uvicorn closes the connection
        if kind == "terminated":
            await notify("notifications/events/terminated", {"error": error.body()})  # type: ignore[union-attr]
        final = {"jsonrpc": "2.0", "id": request_id,
                 "result": {"resultType": "complete", "_meta": {SUBSCRIPTION_ID: request_id}}}
        ending = "terminated" if kind == "terminated" else "completed"
        # Logged before the result goes out: a client that read it may look at the log at once.
        self.log.update(exchange, ended=ending)
        await send({"type": "http.response.body", "more_body": False,
                    "body": f"event: message\ndata: {json.dumps(final)}\n\n".encode()})
        return ending

    # -- webhook --------------------------------------------------------------
    def _webhook_params(self, params: dict, headers: dict, mode: str) -> tuple:
        auth = headers.get("authorization", "")
        principal = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not principal:
            raise RpcError(FORBIDDEN, "Forbidden", {"reason": "no authenticated principal"})
        spec, project = self._type(params, "webhook")
        delivery = params.get("delivery")
        if not isinstance(delivery, dict) or not isinstance(delivery.get("url"), str):
            raise RpcError(INVALID_PARAMS, "delivery.url is required")
        url = delivery["url"]
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme != "https" and not (self.allow_http_callbacks and scheme == "http"):
            raise RpcError(INVALID_PARAMS, "delivery.url must be https")
        arguments = json.dumps(params.get("arguments") or {}, sort_keys=True, separators=(",", ":"))
        key = (principal, url, spec.name, arguments)
        return key, spec, project, delivery

    async def _subscribe(self, request_id: object, params: dict, headers: dict) -> dict:
        key, spec, project, delivery = self._webhook_params(params, headers, "webhook")
        if delivery.get("mode", "webhook") != "webhook":
            raise RpcError(UNSUPPORTED, "Unsupported", {"feature": "deliveryMode",
                                                        "value": delivery.get("mode")})
        secret = delivery.get("secret")
        if not _valid_secret(secret):
            raise RpcError(INVALID_PARAMS, "delivery.secret must be whsec_ + base64 of 24-64 bytes")
        cursor = params.get("cursor")
        exchange = self.log.open("events/subscribe", request_id, type=spec.name, cursor_in=cursor)
        refresh_before = self._grant(params)
        with self._lock:
            hook = self._webhooks.get(key)
            if hook is not None and hook.refresh_before is not None \
                    and hook.refresh_before < time.time():
                hook = None  # lapsed: a fresh subscription from the supplied cursor
        status = None
        if hook is not None:
            hook.secret, hook.refresh_before, hook.active = secret, refresh_before, True
            truncated = False
            status = {"active": True, "lastDeliveryAt": hook.last_delivery_at,
                      "lastError": hook.last_error}
            self.log.update(exchange, start_offset=hook.next_offset)
        else:
            try:
                start = self._resolve(exchange, spec, cursor, params.get("maxAgeMs"))
            except RpcError as error:
                self.log.update(exchange, ended="error", error_code=error.code)
                raise
            truncated = start.truncated
            hook_id = "sub_" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
            hook = _Webhook(key, hook_id, self.log.open("webhook", hook_id, type=spec.name),
                            spec, project, key[1], secret, refresh_before, start.offset,
                            self._epoch, asyncio.Event(), start.offset - 1)
            with self._lock:
                self._webhooks[key] = hook
            hook.task = asyncio.ensure_future(self._run_webhook(hook))
        out = self.cursor(spec.name, hook.watermark)
        self.log.cursor_out(exchange, "subscribe", out)
        self.log.update(exchange, ended="answered")
        result = {"resultType": "complete", "id": hook.id,
                  "refreshBefore": None if refresh_before is None else _now_iso(refresh_before),
                  "cursor": out, self.dialect.gap_field: truncated}
        if status is not None:
            result["deliveryStatus"] = status
        hook.wake.set()
        return result

    def _grant(self, params: dict) -> float | None:
        low, default, high = self.webhook_ttl_ms
        ttl = params.get("ttlMs", default)
        if ttl is None:  # no expiry asked for; this server grants its maximum instead
            ttl = high
        ttl = min(max(int(ttl), low), high)
        return time.time() + ttl / 1000

    def _unsubscribe(self, request_id: object, params: dict, headers: dict) -> dict:
        key, spec, _, _ = self._webhook_params(params, headers, "webhook")
        with self._lock:
            hook = self._webhooks.pop(key, None)
        if hook is None:
            raise RpcError(NOT_FOUND, "NotFound", {"kind": "subscription"})
        hook.ended = True
        self.log.update(hook.exchange, ended="unsubscribed")
        self.log.open("events/unsubscribe", request_id, type=spec.name).ended = "answered"
        self._wake(hook.wake)
        return {"resultType": "complete"}

    async def _run_webhook(self, hook: _Webhook) -> None:
        spec = hook.type
        while not hook.ended:
            hook.wake.clear()
            if hook.refresh_before is not None and time.time() > hook.refresh_before:
                with self._lock:
                    if self._webhooks.get(hook.key) is hook:
                        del self._webhooks[hook.key]
                self.log.update(hook.exchange, ended="expired")
                return
            if hook.actions:
                _, error = hook.actions[0]
                await self._post(hook, {"type": "terminated", "error": error.body()},
                                 f"msg_terminated_{secrets.token_hex(6)}")
                with self._lock:
                    if self._webhooks.get(hook.key) is hook:
                        del self._webhooks[hook.key]
                self.log.update(hook.exchange, ended="terminated")
                return
            if spec.replay and hook.next_offset < self._oldest(spec):
                oldest = self._oldest(spec)
                span = (hook.next_offset, oldest - 1)
                skipped = tuple(p.event_id for p in self.log.published_events(spec.name)
                                if span[0] <= p.offset <= span[1])
                self.log.truncation(Truncation(hook.exchange.seq, hook.id, spec.name,
                                               hook.next_offset - 1, oldest, span, skipped,
                                               "stream_behind"))
                hook.next_offset = hook.watermark = oldest
                gap = {"type": "gap", "cursor": self.cursor(spec.name, oldest - 1)}
                await self._post(hook, gap, f"msg_gap_{secrets.token_hex(6)}")
            with self._lock:
                head = self._head[spec.name]
            for event in self._pending(spec, hook.project, hook.next_offset):
                if hook.ended:
                    return
                body = {**self._occurrence(spec, event),
                        "cursor": self.cursor(spec.name, event.offset)}
                if await self._post(hook, body, event.event_id):
                    self.log.delivered(hook.exchange, event.event_id)
                    self.log.cursor_out(hook.exchange, "webhook", body["cursor"])
                hook.next_offset = hook.watermark = event.offset + 1
            hook.next_offset = max(hook.next_offset, head + 1)
            hook.watermark = hook.next_offset - 1
            timeout = (None if hook.refresh_before is None
                       else max(0.0, hook.refresh_before - time.time()) + 0.01)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(hook.wake.wait(), timeout)

    async def _post(self, hook: _Webhook, body: dict, webhook_id: str) -> bool:
        raw = json.dumps(body).encode()
        key = base64.b64decode(hook.secret[len("whsec_"):])
        for attempt in range(1, self.webhook_attempts + 1):
            stamp = str(int(time.time()))
            signed = f"{webhook_id}.{stamp}.".encode() + raw
            signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            headers = {"content-type": "application/json", "webhook-id": webhook_id,
                       "webhook-timestamp": stamp, "webhook-signature": f"v1,{signature}",
                       "X-MCP-Subscription-Id": hook.id}
            status, error = await asyncio.get_running_loop().run_in_executor(
                None, _http_post, hook.url, headers, raw)
            self.log.webhook_post({"subscription": hook.id, "webhook_id": webhook_id,
                                   "kind": body.get("type", "event"), "attempt": attempt,
                                   "status": status, "error": error})
            if status is not None and 200 <= status < 300:
                hook.last_delivery_at, hook.last_error = _now_iso(), None
                return True
            hook.last_error = error
            if status in (410, 413) or hook.ended:
                return False
            await asyncio.sleep(self.webhook_backoff_s * 2 ** (attempt - 1))
        return False


def _valid_secret(secret: object) -> bool:
    if not isinstance(secret, str) or not secret.startswith("whsec_"):
        return False
    try:
        return 24 <= len(base64.b64decode(secret[6:], validate=True)) <= 64
    except (binascii.Error, ValueError):
        return False


def _http_post(url: str, headers: dict, body: bytes) -> tuple[int | None, str | None]:
    """One delivery with the standard library: a webhook the product's HTTP
    client patches never see, and no redirects followed."""
    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=5)
    try:
        path = parts.path or "/"
        connection.request("POST", path + (f"?{parts.query}" if parts.query else ""), body, headers)
        status = connection.getresponse().status
    except ConnectionRefusedError:
        return None, "connection_refused"
    except TimeoutError:
        return None, "timeout"
    except OSError:
        return None, "connection_refused"
    finally:
        connection.close()
    return status, (None if status < 300 else "http_4xx" if status < 500 else "http_5xx")


async def _respond(send, status: int, body: dict | None) -> None:
    raw = b"" if body is None else json.dumps(body).encode()
    headers = [(b"content-type", b"application/json")] if body is not None else []
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout}s for {what}")
        time.sleep(0.01)


async def _await(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout}s for {what}")
        await asyncio.sleep(0.01)


def main() -> None:
    """Run as a subprocess: print ``{"url": ..., "admin": ...}`` on one line,
    serve until stdin closes or SIGTERM."""
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retention", type=int, default=20)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--capability", default="extension")
    parser.add_argument("--gap-field", default="truncated")
    parser.add_argument("--poll-interval", default="nextPollMs")
    parser.add_argument("--expired-error", action="store_true")
    args = parser.parse_args()
    dialect = Dialect(args.capability, args.gap_field, args.poll_interval, args.expired_error)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EventsServer(retention=args.retention, heartbeat_s=args.heartbeat,
                      dialect=dialect) as server:
        print(json.dumps({"url": server.url, "admin": server.url[:-len("/mcp")] + "/admin"}),
              flush=True)
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        stop.wait()


if __name__ == "__main__":
    main()
