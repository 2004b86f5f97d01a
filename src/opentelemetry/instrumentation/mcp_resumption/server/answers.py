# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Where each answer of an MCP SDK server went: its delivery fate.

Two paths, as the SDKs serve them:

* 2026-07-28 (mcp 2.x, ``StreamableHTTPSessionManager._handle_request``
  hands a request with a modern ``MCP-Protocol-Version`` to its single-exchange
  handler).  The request's ``receive`` and ``send`` are observed, and the
  handler's run (``ServerRunner._on_request``).  In SSE mode the SDK cancels
  the handler when the client's stream closes: ``cancelled``.  In JSON mode
  nothing watches the connection: when the answer is written the client's
  connection is asked, without waiting, whether it is gone (Starlette's
  ``Request.is_disconnected`` way); gone, the answer is ``undelivered`` and a
  ``tools/call`` was work done for nobody.
* Before 2026-07-28 (mcp 1.x and 2.x, ``StreamableHTTPServerTransport``): the
  server's answers go through the transport's write stream to the request's
  stream, which the SDK drops as soon as the client's connection closes.  An
  answer whose stream is still there is ``delivered``; one whose stream is
  gone is ``stored`` with an event store (a resume may replay it: then
  ``replayed``; its session ending first: ``undelivered``) and
  ``undelivered`` without one.  The handler ran on after the cut (a
  disconnect is not a cancellation on these revisions): a ``tools/call`` was
  work done for nobody.

A ``subscriptions/listen`` (2026-07-28) is not an answer awaited: it is
counted by how it ended (``mcp.server.resumption.listens``).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import OrderedDict
from typing import Any

from wrapt import ObjectProxy

from ..patches import fault, guarded
from ..telemetry import semconv as sc
from . import active
from .delivery import Deliveries, deliveries
from .observer import header

LISTEN = "subscriptions/listen"
TOOLS_CALL = "tools/call"
TOOLS_LIST = "tools/list"
REQUEST_CANCELLED = -32800  # the SDK's answer to a request cancelled before 2026-07-28
# mcp 2.x's answer for a handler it cancelled because the connection closed
# (a legacy SSE session cut): cancelled, not an answer computed.
CONNECTION_CLOSED = -32000
MAX_PENDING = 10_000  # requests in flight remembered per session


def _server(scope: Any, transport: str) -> tuple[str, str, int | None]:
    server = scope.get("server") if isinstance(scope, dict) else None
    if isinstance(server, (tuple, list)) and server:
        port = server[1] if len(server) > 1 and isinstance(server[1], int) else None
        return transport, str(server[0]), port
    return transport, "", None


# ---------------------------------------------------------------- 2026-07-28


class _Exchange:
    """One 2026-07-28 request, as its handler and its connection saw it."""

    __slots__ = (
        "_receive", "_send", "answered_at", "cancelled", "disconnected", "disconnected_at",
        "failed", "json", "method", "params", "ran", "run", "scope", "version", "written",
    )

    def __init__(self, scope: Any, receive: Any, send: Any, json_response: bool) -> None:
        self.scope, self._receive, self._send, self.json = scope, receive, send, json_response
        self.method: str | None = None
        self.params: Any = None
        self.version: str | None = None
        self.ran = self.failed = self.cancelled = False
        self.disconnected = False  # the client's connection is known gone
        self.disconnected_at: float | None = None  # since when (monotonic)
        self.answered_at: float | None = None  # its handler returned
        self.written = False  # the answer's last byte was handed to the server
        self.run: Any = None  # a tools/call's run (reruns.py)

    async def receive(self) -> Any:
        message = await self._receive()
        if message.get("type") == "http.disconnect":
            self._gone()
        return message

    def _gone(self) -> None:
        self.disconnected = True
        if self.disconnected_at is None:
            self.disconnected_at = time.monotonic()

    def gone_at(self) -> float | None:
        return self.disconnected_at

    async def send(self, message: Any) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            if self.json and self.ran and not self.disconnected and self.method != LISTEN:
                # JSON mode: nobody watched the connection while the handler ran.
                await self._probe()
        elif kind == "http.response.body" and not message.get("more_body"):
            self.written = not self.disconnected
        await self._send(message)

    async def _probe(self) -> None:
        """Whether the client is gone, without waiting (Starlette's
        ``Request.is_disconnected``): the body was read, so the only message
        left to receive is the disconnect.  Also asked from a re-issue's
        task: nothing else receives on a JSON exchange."""
        message: Any = {}
        with _cancelled_scope():
            message = await self._receive()
        if isinstance(message, dict) and message.get("type") == "http.disconnect":
            self._gone()


@contextlib.contextmanager
def _cancelled_scope() -> Any:
    import anyio

    with anyio.CancelScope() as scope:
        scope.cancel()
        yield


_exchange: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar(
    "mcp_resumption_server_exchange", default=None
)


def _modern_version(scope: Any) -> str | None:
    version = header(scope, b"mcp-protocol-version")
    if version is None:
        return None
    try:  # mcp 2.x: the revisions that still have a handshake
        from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
    except ImportError:  # mcp 1.x serves no 2026-07-28
        return None

    return None if version in HANDSHAKE_PROTOCOL_VERSIONS else version


def _manager_request(wrapped, instance, args, kwargs):
    """``StreamableHTTPSessionManager._handle_request``: a 2026-07-28 request
    is observed; every other request goes on as it is."""
    observer = active.observer
    if observer is None or not observer.enabled or kwargs or len(args) != 3:
        return wrapped(*args, **kwargs)
    scope, receive, send = args
    if not isinstance(scope, dict) or scope.get("type") != "http":
        return wrapped(*args, **kwargs)
    version = guarded("reading a request's protocol version", _modern_version, scope)
    if version is None:
        return wrapped(*args, **kwargs)
    exchange = _Exchange(scope, receive, send, bool(getattr(instance, "json_response", False)))
    exchange.version = version
    return _observed_exchange(observer, exchange, wrapped)


async def _observed_exchange(observer: Any, exchange: _Exchange, wrapped: Any) -> None:
    token = _exchange.set(exchange)
    try:
        await wrapped(exchange.scope, exchange.receive, exchange.send)
    finally:
        _exchange.reset(token)
        guarded("judging an answer's delivery", _judge, observer, exchange)
        if exchange.run is not None:
            guarded(
                "ending a run", deliveries(observer).closed, exchange.run,
                _server(exchange.scope, sc.TRANSPORT_STREAMABLE_HTTP),
            )


def _judge(observer: Any, exchange: _Exchange) -> None:
    if exchange.method is None:  # refused before any handler ran
        return
    tallies = deliveries(observer)
    server = _server(exchange.scope, sc.TRANSPORT_STREAMABLE_HTTP)
    if exchange.method == LISTEN:
        _listen_ended(tallies, exchange)
        return
    if exchange.cancelled:
        if exchange.disconnected:
            tallies.fate(sc.DELIVERY_CANCELLED, server)
        else:  # the server itself stopped it (shutdown): nobody got an answer
            tallies.fate(sc.UNDELIVERED, server)
        return
    if not exchange.ran:
        return
    if exchange.written:
        tallies.fate(sc.DELIVERED, server)
        return
    tallies.fate(sc.UNDELIVERED, server)
    if exchange.method == TOOLS_CALL and not exchange.failed:
        reason = (
            "JSON answers are not watched: nothing cancelled it" if exchange.json
            else _closed_before(exchange)
        )
        tallies.work_for_nobody(
            exchange.params, exchange.version, reason, server, exchange.run
        )


def _closed_before(exchange: _Exchange) -> str:
    """When the stream closed, against the handler's answer: a sync tool's
    thread is not cancelled, and runs on long after its stream went."""
    gone, answered = exchange.disconnected_at, exchange.answered_at
    if gone is None or answered is None or answered < gone:
        return "the stream closed as it answered"
    return f"the stream closed {answered - gone:.1f} s before it answered"


def _begin(tallies: Deliveries, exchange: _Exchange, method: Any, params: Any) -> None:
    server = _server(exchange.scope, sc.TRANSPORT_STREAMABLE_HTTP)
    tallies.seen(server)
    if method == TOOLS_CALL:
        exchange.run = tallies.called(
            params, server, exchange.version, exchange.gone_at, exchange
        )
    elif method == LISTEN:
        notifications = params.get("notifications") if isinstance(params, dict) else None
        tallies.listen_started(notifications, sc.TRANSPORT_STREAMABLE_HTTP)


def _listed(tallies: Deliveries, exchange: _Exchange, result: Any) -> None:
    server = _server(exchange.scope, sc.TRANSPORT_STREAMABLE_HTTP)
    tallies.tools_listed(result, server, exchange.version)


def _listen_ended(tallies: Deliveries, exchange: _Exchange) -> None:
    if exchange.cancelled and exchange.disconnected:
        end = sc.LISTEN_CLOSED_BY_CLIENT
    elif exchange.ran and not exchange.failed:
        # Its result is the graceful close; a client gone as it was written
        # had left on its own.
        end = sc.LISTEN_CLOSED_BY_SERVER if exchange.written else sc.LISTEN_CLOSED_BY_CLIENT
    elif exchange.disconnected and not exchange.failed:
        end = sc.LISTEN_CLOSED_BY_CLIENT
    else:  # an error in the handler, a cap, a shutdown: ended without its result
        end = sc.LISTEN_LOST
    notifications = exchange.params.get("notifications") if isinstance(
        exchange.params, dict
    ) else None
    tallies.listen_ended(end, notifications, sc.TRANSPORT_STREAMABLE_HTTP)


def _on_request(wrapped, instance, args, kwargs):
    """``ServerRunner._on_request``: the handler's run, for the 2026-07-28
    request being observed (nothing for any other)."""
    exchange = _exchange.get()
    if exchange is None:
        return wrapped(*args, **kwargs)
    return _run(exchange, instance, wrapped, args, kwargs)


def _bind_request(dctx: Any, method: Any, params: Any, *_: Any, **__: Any) -> tuple:
    return method, params


async def _run(exchange: _Exchange, runner: Any, wrapped: Any, args: Any, kwargs: Any) -> Any:
    import anyio

    method, params = _bind_request(*args, **kwargs)
    # The SDK may list the tools first (to check Mcp-Param headers): the
    # request's own run is the last one.
    exchange.method, exchange.params = method, params
    exchange.ran = exchange.failed = exchange.cancelled = False
    observer = active.observer
    tallies = deliveries(observer) if observer is not None and observer.enabled else None
    if tallies is not None:
        if method == TOOLS_CALL:
            await _probe_kept(tallies, exchange, params)
        guarded("watching a request", _begin, tallies, exchange, method, params)
    try:
        result = await wrapped(*args, **kwargs)
    except anyio.get_cancelled_exc_class():
        exchange.cancelled = True
        _finished(tallies, exchange, False)
        raise
    except Exception:
        exchange.ran = exchange.failed = True
        _finished(tallies, exchange, False)
        raise
    exchange.ran = True
    exchange.answered_at = time.monotonic()
    _finished(tallies, exchange, True)
    if tallies is not None and method == TOOLS_LIST:
        guarded("reading tool hints", _listed, tallies, exchange, result)
    return result


def _finished(tallies: Deliveries | None, exchange: _Exchange, completed: bool) -> None:
    if tallies is not None and exchange.run is not None:
        guarded(
            "ending a run", tallies.finished, exchange.run, completed,
            _server(exchange.scope, sc.TRANSPORT_STREAMABLE_HTTP),
        )


async def _probe_kept(tallies: Deliveries, exchange: _Exchange, params: Any) -> None:
    """A tools/call arrives: the JSON exchanges of the same tool still kept
    are asked whether their client is gone (nothing else watches them), so
    that a re-issue arriving while its first run works is known as one."""
    try:
        tool = params.get("name") if isinstance(params, dict) else None
        server = _server(exchange.scope, sc.TRANSPORT_STREAMABLE_HTTP)
        for run in tallies.kept(tool, server):
            other = run.source
            if isinstance(other, _Exchange) and other.json and not other.disconnected and (
                not other.written
            ):
                await other._probe()
    except Exception:
        fault("probing the streams of a re-issued call")


# ---------------------------------------------------------------- before 2026-07-28


def _fields(message: Any) -> dict[str, Any]:
    """A JSON-RPC message's fields (the SDKs' pydantic models keep them in
    ``__dict__``; mcp 1.x wraps each in a root model), read without asking
    the model for a field it lacks: pydantic's miss raises, which costs more
    than a metric record."""
    fields = getattr(message, "__dict__", None)
    if not isinstance(fields, dict):
        return {}
    root = fields.get("root")
    if root is not None:
        fields = getattr(root, "__dict__", None)
        return fields if isinstance(fields, dict) else {}
    return fields


class _Pending:
    """The requests of one session's transport awaiting their answers, and
    its stored answers awaiting a resume."""

    name = sc.TRANSPORT_STREAMABLE_HTTP

    def __init__(self, observer: Any, transport: Any) -> None:
        self.observer = observer
        self.tallies = deliveries(observer)
        self.transport = transport
        # request id -> (method, params, version, server, a tools/call's run)
        self.calls: OrderedDict[str, tuple[str, Any, str | None, Any, Any]] = OrderedDict()
        self.stored: dict[str, Any] = {}  # request id -> server
        self.version: Any = None

    def request(self, item: Any) -> None:
        if not getattr(self.observer, "enabled", True):  # uninstrumented since
            return
        message = _fields(getattr(item, "message", None))
        method = message.get("method")
        request_id = message.get("id")
        if method is None or request_id is None:
            return
        context = getattr(getattr(item, "metadata", None), "request_context", None)
        scope = getattr(context, "scope", None)
        params = message.get("params")
        if method == "initialize" and isinstance(params, dict):
            # A legacy SSE client sends no version header: the session's is
            # the one it asked for.
            self.version = params.get("protocolVersion")
        server = _server(scope, self.name)
        version = None
        run = None
        # A tool's run for nobody names its version, and so does the listing
        # that starts its series at 0.
        if method in (TOOLS_CALL, TOOLS_LIST):
            if isinstance(scope, dict):
                version = header(scope, b"mcp-protocol-version")
            version = version or self.version
        if method == TOOLS_CALL:
            run = self.tallies.called(params, server, version, self._probe(str(request_id)))
        self.calls[str(request_id)] = (method, params, version, server, run)
        if len(self.calls) > MAX_PENDING:
            self.calls.popitem(last=False)
        self.tallies.seen(server)

    def _probe(self, request_id: str) -> Any:
        """When the request's stream was known gone: the SDK drops it as soon
        as the client's connection closes (known when asked, so no later)."""
        streams = getattr(self.transport, "_request_streams", None)
        if streams is None:
            return None

        def gone() -> float | None:
            return None if request_id in streams else time.monotonic()

        return gone

    def answer(self, item: Any) -> None:
        """An answer handed to the transport: where its request's stream is."""
        found = self._call(item)
        if found is None:
            return
        call, error, request_id = found
        if str(request_id) in getattr(self.transport, "_request_streams", {}):
            self.tallies.fate(sc.DELIVERED, call[3])
            self._ran(call, error)
        else:
            self.lost(call, error, request_id)

    def _call(self, item: Any) -> tuple[Any, Any, Any] | None:
        """(the call, its error, its id) of an answer; None for anything
        else, or a cancelled request (counted here)."""
        message = _fields(getattr(item, "message", None))
        if message.get("method") is not None:
            return None
        request_id = message.get("id")
        if request_id is None:
            return None
        call = self.calls.pop(str(request_id), None)
        if call is None:
            return None
        error = message.get("error")
        if error is not None and (
            getattr(error, "code", None) == REQUEST_CANCELLED
            or (
                getattr(error, "code", None) == CONNECTION_CLOSED
                and getattr(error, "message", None) == "Connection closed"
            )
        ):
            self.tallies.fate(sc.DELIVERY_CANCELLED, call[3])
            self.tallies.finished(call[4], False, call[3])
            self.tallies.closed(call[4], call[3])
            return None
        if call[0] == TOOLS_LIST and error is None:
            self.tallies.tools_listed(message.get("result"), call[3], call[2])
        return call, error, request_id

    def lost(self, call: Any, error: Any, request_id: Any) -> None:
        """An answer whose stream was gone: stored for a resume, or lost."""
        method, params, version, server, run = call
        if getattr(self.transport, "_event_store", None):
            self.tallies.fate(sc.STORED, server)
            self.stored[str(request_id)] = server
        else:
            self.tallies.fate(sc.UNDELIVERED, server)
        self.tallies.finished(run, error is None, server)
        if method == TOOLS_CALL and error is None:
            self.tallies.work_for_nobody(
                params, version, "a disconnect is not a cancellation before 2026-07-28", server,
                run,
            )
        self.tallies.closed(run, server)

    def _ran(self, call: Any, error: Any) -> None:
        """A tools/call's run ended with its answer (an error: no work done)."""
        self.tallies.finished(call[4], error is None, call[3])
        self.tallies.closed(call[4], call[3])

    def replayed(self, event: Any) -> None:
        """An event a resume of this session sent: an answer stored for it
        is delivered now."""
        if not self.stored:
            return
        message = _fields(getattr(event, "message", None))
        request_id = message.get("id")
        if request_id is None or message.get("method") is not None:
            return
        server = self.stored.pop(str(request_id), None)
        if server is not None:
            self.tallies.fate(sc.DELIVERY_REPLAYED, server)

    def ended(self) -> None:
        """The session ended: its stored answers that no resume replayed
        reached nobody; its runs that never answered were cancelled with it."""
        for server in self.stored.values():
            self.tallies.fate(sc.UNDELIVERED, server)
        self.stored.clear()
        for call in list(self.calls.values()):
            if call[4] is not None:
                self.tallies.finished(call[4], False, call[3])
                self.tallies.closed(call[4], call[3])


class _Watched(ObjectProxy):  # type: ignore[misc]
    """A memory send stream of the transport, every item seen by ``see``."""

    def __init__(self, stream: Any, see: Any) -> None:
        super().__init__(stream)
        self._self_see = see

    async def send(self, item: Any) -> None:
        guarded("observing a message", self._self_see, item)
        await self.__wrapped__.send(item)

    async def __aenter__(self) -> Any:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self.__wrapped__.__aexit__(*exc)


def _connect(wrapped, instance, args, kwargs):
    """``StreamableHTTPServerTransport.connect``: the session's streams."""
    observer = active.observer
    if observer is None or not observer.enabled:
        return wrapped(*args, **kwargs)
    return _connected(observer, instance, wrapped(*args, **kwargs))


@contextlib.asynccontextmanager
async def _connected(observer: Any, transport: Any, inner: Any) -> Any:
    async with inner as streams:
        pending = guarded("observing a session's answers", _watch, observer, transport)
        if pending is None:
            yield streams
            return
        try:
            yield streams[0], transport._write_stream
        finally:
            guarded("ending a session's answers", pending.ended)


def _watch(observer: Any, transport: Any) -> _Pending:
    pending = _Pending(observer, transport)
    transport._read_stream_writer = _Watched(transport._read_stream_writer, pending.request)
    transport._write_stream = _Watched(transport._write_stream, pending.answer)
    transport._mcp_resumption_pending = pending
    return pending


def replayed(transport: Any, event: Any) -> None:
    """An event the transport's resume sent (streamable.py's replay)."""
    pending = getattr(transport, "_mcp_resumption_pending", None)
    if pending is not None:
        pending.replayed(event)


# ---------------------------------------------------------------- legacy HTTP+SSE


class _SsePending(_Pending):
    """A legacy SSE session: its answers go out on its one GET stream, and a
    send after that stream closed fails."""

    name = sc.TRANSPORT_SSE

    def answer(self, item: Any) -> None:
        return None  # decided by the send (sent)

    def sent(self, item: Any, delivered: bool) -> None:
        found = self._call(item)
        if found is None:
            return
        call, error, request_id = found
        if delivered:
            self.tallies.fate(sc.DELIVERED, call[3])
            self._ran(call, error)
        else:
            self.lost(call, error, request_id)


class _SseSending(ObjectProxy):  # type: ignore[misc]
    """A legacy SSE session's write stream: each answer's send, and whether
    its stream took it."""

    def __init__(self, stream: Any, pending: _SsePending) -> None:
        super().__init__(stream)
        self._self_pending = pending

    async def send(self, item: Any) -> None:
        import anyio

        try:
            await self.__wrapped__.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            guarded("observing an answer", self._self_pending.sent, item, False)
            raise
        guarded("observing an answer", self._self_pending.sent, item, True)

    async def __aenter__(self) -> Any:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self.__wrapped__.__aexit__(*exc)


@contextlib.asynccontextmanager
async def sse_session(observer: Any, transport: Any, inner: Any) -> Any:
    """``SseServerTransport.connect_sse``'s session (legacy.py): its answers."""
    async with inner as streams:
        read_stream, write_stream = streams
        pending = guarded(
            "observing a legacy session's answers", _watch_sse, observer, transport, read_stream
        )
        if pending is None:
            yield streams
            return
        yield read_stream, _SseSending(write_stream, pending)


def _state(stream: Any) -> Any:
    return getattr(getattr(stream, "_inner", stream), "_state", None)


def _watch_sse(observer: Any, transport: Any, read_stream: Any) -> _SsePending | None:
    """The session's inbound writer (the transport keeps it by session id)
    is the one sharing the read stream's state."""
    writers = getattr(transport, "_read_stream_writers", {})
    state = _state(read_stream)
    for session_id, writer in list(writers.items()):
        if state is not None and _state(writer) is state:
            pending = _SsePending(observer, None)
            writers[session_id] = _Watched(writer, pending.request)
            return pending
    return None
