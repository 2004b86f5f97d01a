# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The MCP semantic conventions' server metrics: ``mcp.server.operation.duration``
and, where the protocol has sessions (2025-11-25 and before),
``mcp.server.session.duration``.  Neither SDK records them (mcp 2.x makes
spans only).

One point per request or notification the server handled, from when its
handling began to when its answer was handed to the transport:

* mcp 1.x: ``Server._handle_request`` (every request but ``initialize``,
  which ``ServerSession._received_request`` answers itself) and
  ``Server._handle_notification``; the answer is seen where the session
  sends it (``ServerSession._send_response``);
* mcp 2.x: ``ServerRunner._on_request`` / ``_on_notify``, which every
  transport and both protocol eras go through (``serve_one`` for 2026-07-28).

``error.type`` is what the conventions say: the JSON-RPC error's code as
text when the answer is an error, ``tool_error`` for a tool result with
``isError`` true.  A request that was never answered because its client
cancelled it (``notifications/cancelled``, or on 2026-07-28 the closed
stream) gets no point: no result was sent, and a caller's cancellation is
not the operation failing.  Neither is a 2026-07-28 request the SDK
refuses before dispatch (version or envelope checks), which never reaches a
handler.

A session is one handshake connection that accepted an ``initialize``, from
then to its end: mcp 1.x ``Server.run`` (not stateless); mcp 2.x a
connection with a session id (stateful streamable HTTP) or served by
``_serve_legacy_stream`` (legacy SSE, stdio), ended in ``aclose_shielded``.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
import weakref
from typing import Any

from opentelemetry import metrics

from ..patches import guarded
from ..rules.jsonrpc import MAX_TOOL_NAME, TOOL_ERROR
from ..telemetry import semconv as sc
from ..version import __version__
from . import active

# The boundaries the conventions recommend for both durations.
BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
INVALID_PARAMS = "-32602"  # JSON-RPC; what mcp 2.x answers a ValidationError with


class ServerOperations:
    """The two histograms, made once per ``instrument()`` with the observer."""

    def __init__(self, meter_provider: Any = None) -> None:
        meter = metrics.get_meter(
            sc.INSTRUMENTATION_NAME, __version__, meter_provider, schema_url=sc.SCHEMA_URL
        )
        self._operation = meter.create_histogram(
            *sc.SERVER_OPERATION_DURATION, explicit_bucket_boundaries_advisory=BUCKETS
        )
        self._session = meter.create_histogram(
            *sc.SERVER_SESSION_DURATION, explicit_bucket_boundaries_advisory=BUCKETS
        )

    def operation(self, handled: _Handled, error: str | None, version: str | None) -> None:
        method = handled.method
        attributes: dict[str, Any] = {
            sc.MCP_METHOD_NAME: method if method in sc.SERVER_METHODS else sc.OTHER
        }
        if handled.tool:
            attributes[sc.GEN_AI_TOOL_NAME] = handled.tool[:MAX_TOOL_NAME]
        if error is not None:
            attributes[sc.ERROR_TYPE] = error
        if version:
            attributes[sc.MCP_PROTOCOL_VERSION] = version[:32]
        if handled.transport:
            attributes[sc.NETWORK_TRANSPORT] = handled.transport
        self._operation.record(max(0.0, time.monotonic() - handled.started), attributes)

    def session(self, session: _Session, error: str | None) -> None:
        attributes: dict[str, Any] = {}
        if error is not None:
            attributes[sc.ERROR_TYPE] = error
        if session.version:
            attributes[sc.MCP_PROTOCOL_VERSION] = session.version[:32]
        if session.transport:
            attributes[sc.NETWORK_TRANSPORT] = session.transport
        self._session.record(max(0.0, time.monotonic() - session.started), attributes)


class _Handled:
    """One request or notification being handled."""

    __slots__ = ("answer", "method", "request_id", "started", "tool", "transport")

    def __init__(self, method: str, tool: str | None, request_id: Any, transport: str | None):
        self.method = method
        self.tool = tool
        self.request_id = request_id
        self.transport = transport
        self.started = time.monotonic()
        self.answer: Any = None  # mcp 1.x: the response the session sent for it


class _Session:
    __slots__ = ("initialized", "started", "transport", "version")

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.version: str | None = None
        self.transport: str | None = None
        self.initialized = False


_handled: contextvars.ContextVar[_Handled | None] = contextvars.ContextVar(
    "mcp_resumption_server_operation", default=None
)
# mcp 2.x: the sessions (connections that accepted an initialize) open now.
_opened: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()
_in_legacy_stream: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mcp_resumption_server_legacy_stream", default=False
)
# mcp 1.x: set for a session's whole run; the tasks that handle its requests
# inherit it.
_session: contextvars.ContextVar[_Session | None] = contextvars.ContextVar(
    "mcp_resumption_server_session", default=None
)


def _operations() -> ServerOperations | None:
    observer = active.observer
    if observer is None or not observer.enabled:
        return None
    return getattr(observer, "operations", None)


def _transport(metadata: Any) -> str | None:
    """``tcp`` for a request that came over HTTP on a TCP socket (the
    conventions' value for HTTP); None where it is not known."""
    request = getattr(metadata, "request_context", None)
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict) or scope.get("type") != "http":
        return None
    server = scope.get("server")
    if isinstance(server, (tuple, list)) and len(server) > 1 and isinstance(server[1], int):
        return "tcp"
    return None


def _tool(method: str, params: Any) -> str | None:
    if method != "tools/call":
        return None
    name = params.get("name") if isinstance(params, dict) else getattr(params, "name", None)
    return name if isinstance(name, str) else None


def _began(method: Any, params: Any, request_id: Any, metadata: Any) -> _Handled:
    handled = _Handled(str(method), _tool(str(method), params), request_id, _transport(metadata))
    session = _session.get()
    if session is not None:  # mcp 1.x: a notification carries no request of its own
        if handled.transport and not session.transport:
            session.transport = handled.transport
        elif not handled.transport:
            handled.transport = session.transport
    return handled


def _note_initialized(version: str | None) -> None:
    session = _session.get()
    if session is not None:
        session.initialized = True
        session.version = version or session.version


# ------------------------------------------------------------------ mcp 1.x


def _answer_error(answer: Any) -> str | None:
    """error.type of an mcp 1.x response (ServerResult or ErrorData)."""
    code = getattr(answer, "code", None)
    if isinstance(code, int) and not isinstance(code, bool) and hasattr(answer, "message"):
        return str(code)
    result = getattr(answer, "root", answer)
    if getattr(result, "isError", False) is True:
        return TOOL_ERROR
    return None


def _v1_version(session: Any) -> str | None:
    params = getattr(session, "client_params", None)
    version = getattr(params, "protocolVersion", None)
    if not isinstance(version, str):
        return None
    try:
        from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS
        from mcp.types import LATEST_PROTOCOL_VERSION
    except ImportError:
        return version
    # What the server answered: the client's version if it speaks it, else its latest.
    return version if version in SUPPORTED_PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION


def _v1_begin(message: Any, req: Any) -> _Handled:
    return _began(
        getattr(req, "method", "?"), getattr(req, "params", None),
        getattr(message, "request_id", None), getattr(message, "message_metadata", None),
    )


async def _v1_timed(wrapped: Any, args: Any, kwargs: Any, handled: _Handled | None,
                    session: Any, initialize: bool) -> Any:
    if handled is None:
        return await wrapped(*args, **kwargs)
    token = _handled.set(handled)
    try:
        return await wrapped(*args, **kwargs)
    finally:
        _handled.reset(token)
        if handled.answer is not None:
            guarded("recording an operation", _v1_record, handled, session, initialize)


def _v1_record(handled: _Handled, session: Any, initialize: bool) -> None:
    operations = _operations()
    if operations is None:
        return
    version = _v1_version(session)
    if initialize:
        _note_initialized(version)
    operations.operation(handled, _answer_error(handled.answer), version)


def _handle_request(wrapped, instance, args, kwargs):
    if _operations() is None:
        return wrapped(*args, **kwargs)
    message, req, session = _bind_request(*args, **kwargs)
    handled = guarded("timing a request", _v1_begin, message, req)
    return _v1_timed(wrapped, args, kwargs, handled, session, False)


def _bind_request(message: Any, req: Any, session: Any, *_: Any, **__: Any) -> tuple:
    return message, req, session


def _received_request(wrapped, instance, args, kwargs):
    """mcp 1.x answers ``initialize`` in the session itself."""
    responder = args[0] if args else kwargs.get("responder")
    req = getattr(getattr(responder, "request", None), "root", None)
    if getattr(req, "method", None) != "initialize" or _operations() is None:
        return wrapped(*args, **kwargs)
    handled = guarded("timing a request", _v1_begin, responder, req)
    return _v1_timed(wrapped, args, kwargs, handled, instance, True)


def _send_response(wrapped, instance, args, kwargs):
    handled = _handled.get()
    if handled is not None:
        request_id, response = _bind_response(*args, **kwargs)
        if request_id == handled.request_id:
            return _sent(wrapped, args, kwargs, handled, response)
    return wrapped(*args, **kwargs)


def _bind_response(request_id: Any, response: Any, *_: Any, **__: Any) -> tuple:
    return request_id, response


async def _sent(wrapped: Any, args: Any, kwargs: Any, handled: _Handled, response: Any) -> Any:
    result = await wrapped(*args, **kwargs)
    handled.answer = response  # handed to the transport: the operation ends here
    return result


def _handle_notification(wrapped, instance, args, kwargs):
    operations = _operations()
    if operations is None:
        return wrapped(*args, **kwargs)
    notify = args[0] if args else kwargs.get("notify")
    handled = guarded(
        "timing a notification", _began, getattr(notify, "method", "?"), None, None, None
    )
    return _notified(wrapped, args, kwargs, handled)


async def _notified(wrapped: Any, args: Any, kwargs: Any, handled: _Handled | None) -> Any:
    result = await wrapped(*args, **kwargs)
    operations = _operations()
    if handled is not None and operations is not None:
        session = _session.get()
        guarded(
            "recording an operation", operations.operation, handled, None,
            session.version if session is not None else None,
        )
    return result


def _run(wrapped, instance, args, kwargs):
    """mcp 1.x ``Server.run``: one session, unless stateless."""
    stateless = kwargs.get("stateless", args[4] if len(args) > 4 else False)
    if stateless or _operations() is None:
        return wrapped(*args, **kwargs)
    return _session_run(wrapped, args, kwargs)


async def _session_run(wrapped: Any, args: Any, kwargs: Any) -> Any:
    session = _Session()
    token = _session.set(session)
    error: str | None = None
    try:
        return await wrapped(*args, **kwargs)
    except Exception as exc:
        error = type(exc).__qualname__
        raise
    finally:
        _session.reset(token)
        operations = _operations()
        if session.initialized and operations is not None:
            guarded("recording a session", operations.session, session, error)


# ------------------------------------------------------------------ mcp 2.x


def _on_request(wrapped, instance, args, kwargs):
    if _operations() is None:
        return wrapped(*args, **kwargs)
    dctx, method, params = _bind_dispatch(*args, **kwargs)
    handled = guarded(
        "timing a request", _began, method, params, getattr(dctx, "request_id", None),
        getattr(dctx, "message_metadata", None),
    )
    if handled is None:
        return wrapped(*args, **kwargs)
    return _v2_timed(wrapped, instance, args, kwargs, handled)


def _bind_dispatch(dctx: Any, method: Any, params: Any = None, *_: Any, **__: Any) -> tuple:
    return dctx, method, params


async def _v2_timed(wrapped: Any, instance: Any, args: Any, kwargs: Any, handled: _Handled) -> Any:
    try:
        result = await wrapped(*args, **kwargs)
    except Exception as exc:
        guarded("recording an operation", _v2_record, instance, handled, _v2_error(instance, exc))
        raise
    failed = isinstance(result, dict) and result.get("isError") is True
    error = TOOL_ERROR if failed and handled.method == "tools/call" else None
    guarded("recording an operation", _v2_record, instance, handled, error)
    return result


def _v2_error(instance: Any, exc: BaseException) -> str:
    """The code the SDK answers ``exc`` with, as text."""
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    if isinstance(code, int) and not isinstance(code, bool):
        return str(code)
    if type(exc).__name__ == "ValidationError":  # pydantic's: the SDK answers INVALID_PARAMS
        return INVALID_PARAMS
    version = getattr(getattr(instance, "connection", None), "protocol_version", None)
    if isinstance(version, str) and version >= "2026":
        # The 2026-07-28 entry maps any other exception itself.
        from mcp.server.runner import modern_error_data

        return str(modern_error_data(exc).code)
    return "0"  # the handshake era's dispatcher answers code 0, as mcp 1.x does


def _v2_record(instance: Any, handled: _Handled, error: str | None) -> None:
    operations = _operations()
    if operations is None:
        return
    version = getattr(getattr(instance, "connection", None), "protocol_version", None)
    version = version if isinstance(version, str) else None
    if handled.method == "initialize" and error is None:
        # mcp 2.x hands a request the context of whoever sent it, not the
        # connection's: the session is found by its connection at its end.
        connection = getattr(instance, "connection", None)
        session = _Session(handled.started)
        session.version, session.transport = version, handled.transport
        with contextlib.suppress(TypeError):
            _opened[connection] = session
    operations.operation(handled, error, version)


def _on_notify(wrapped, instance, args, kwargs):
    if _operations() is None:
        return wrapped(*args, **kwargs)
    dctx, method, _params = _bind_dispatch(*args, **kwargs)
    handled = guarded(
        "timing a notification", _began, method, None, None,
        getattr(dctx, "message_metadata", None),
    )
    if handled is None:
        return wrapped(*args, **kwargs)
    return _v2_notified(wrapped, instance, args, kwargs, handled)


async def _v2_notified(wrapped: Any, instance: Any, args: Any, kwargs: Any,
                       handled: _Handled) -> Any:
    result = await wrapped(*args, **kwargs)  # the SDK logs a handler's fault itself
    guarded("recording an operation", _v2_record, instance, handled, None)
    return result


def _aclose(wrapped, instance, args, kwargs):
    """mcp 2.x ``aclose_shielded(connection)``: every driver's end of a
    connection; a session's when an ``initialize`` was accepted on it."""
    connection = args[0] if args else kwargs.get("connection")
    session = _opened.pop(connection, None) if connection is not None else None
    if session is not None and (
        getattr(connection, "session_id", None) is not None or _in_legacy_stream.get()
    ):
        operations = _operations()
        if operations is not None:
            guarded("recording a session", operations.session, session, None)
    return wrapped(*args, **kwargs)


def _legacy_stream(wrapped, instance, args, kwargs):
    """mcp 2.x ``Server.run`` on a handshake connection (legacy SSE, stdio):
    a session without an id; the stateless streamable-HTTP connections
    (no id either) are not sessions."""
    return _marked(wrapped, args, kwargs)


async def _marked(wrapped: Any, args: Any, kwargs: Any) -> Any:
    token = _in_legacy_stream.set(True)
    try:
        return await wrapped(*args, **kwargs)
    finally:
        _in_legacy_stream.reset(token)
