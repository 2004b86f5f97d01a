# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""MCP SDK 1.x and 2.x streamable-HTTP server: resume requests and the guard.

Both majors answer a GET with ``Last-Event-ID`` in
``StreamableHTTPServerTransport._replay_events``: headers (200, event stream)
go out at once, then the store's ``replay_events_after(cursor, send)`` runs
and, if it returned a stream id, the stream stays open for that stream's live
tail.  What the store's answer can tell:

* a stream id and N >= 1 events: ``replayed``;
* a stream id and no event: ``nothing_to_replay`` (the cursor was the last);
* ``None`` and no event: ``unknown_cursor``; the SDK then ends the 200 stream
  empty, which the client cannot tell from "nothing yet" (seed 000).  The
  protocol has no other way to say "unknown": a store that answers ``None``
  for a known cursor with nothing after it is counted ``unknown_cursor`` too
  (and the SDK closes its live tail, so that store loses events anyway);
* the store has no notion of sessions (the session manager hands one store
  to every session), so ``other_session`` is told from the event ids this
  instrumentation saw the store mint, with the session of the transport that
  stored them: only for cursors issued in this process, by this store object,
  while instrumented, within the last ``MAX_ISSUED_PER_STORE`` ids;
* no store at all: ``no_store`` (1.x and 2.x then send no response; the ASGI
  server answers 500);
* an unknown or missing ``Mcp-Session-Id`` (the session manager answers 404 /
  400 before any transport): ``unknown_session``.

The store is observed through a proxy (``wrapt.ObjectProxy``: ``isinstance``
and every attribute are the store's) that the transport holds instead of the
store; it only counts and passes every call and event through unchanged.
"""

from __future__ import annotations

import contextvars
from http import HTTPStatus
from typing import Any

from wrapt import ObjectProxy

from ..patches import fault, guarded
from ..telemetry import semconv as sc
from . import active, answers
from .observer import ResumeRequest, from_scope, header

# The guard's answer (docs/server.md, "The server guard"): 410 Gone, the JSON-RPC
# error body the SDK writes for its own refusals.
GUARD_STATUS = HTTPStatus.GONE
GUARD_ERROR_CODE = -32000  # JSON-RPC implementation-defined server error
GUARD_MESSAGES = {
    sc.SERVER_UNKNOWN_CURSOR: "Gone: the server cannot resume from this Last-Event-ID "
    "(its event store does not know it); re-send the request or start a new session",
    sc.SERVER_OTHER_SESSION: "Gone: this Last-Event-ID was issued in another session; "
    "it cannot be resumed in this one: re-send the request or start a new session",
    sc.SERVER_NO_STORE: "Gone: this server keeps no events to resume from; "
    "re-send the request or start a new session",
}


class ObservedStore(ObjectProxy):  # type: ignore[misc]
    """The transport's event store, seen by the observer."""

    def __init__(self, store: Any, session_id: str | None, transport: Any = None) -> None:
        super().__init__(store)
        self._self_session_id = session_id
        self._self_transport = transport

    async def store_event(self, stream_id: Any, message: Any) -> Any:
        event_id = await self.__wrapped__.store_event(stream_id, message)
        observer = active.observer
        if observer is not None and observer.enabled:
            guarded(
                "observing store_event", observer.issued,
                self.__wrapped__, event_id, self._self_session_id,
            )
        return event_id

    async def replay_events_after(self, last_event_id: Any, send_callback: Any) -> Any:
        request = _current.get()
        observer = active.observer
        if request is None or observer is None or request.last_event_id != last_event_id:
            # Not the transport's resume (the application's own call): as is.
            return await self.__wrapped__.replay_events_after(last_event_id, send_callback)
        known, cursor_session = guarded(
            "looking up a cursor", observer.cursor_session, self.__wrapped__, last_event_id
        ) or (False, None)
        replayed = 0

        transport = self._self_transport

        async def counting(event: Any) -> None:
            nonlocal replayed
            await send_callback(event)
            replayed += 1
            if transport is not None:  # an answer stored for this session: delivered now
                guarded("counting a replayed answer", answers.replayed, transport, event)

        if request.prefetched is not None:  # the guard read the store already
            stream_id, events = request.prefetched
            for event in events:
                await counting(event)
        else:
            stream_id = await self.__wrapped__.replay_events_after(last_event_id, counting)
        guarded(
            "counting a replay", _record_replay, observer, request, stream_id, replayed,
            cursor_session if known else None,
        )
        return stream_id


def _record_replay(
    observer: Any, request: ResumeRequest, stream_id: Any, replayed: int, cursor_session: Any
) -> None:
    if cursor_session is not None and cursor_session != request.session_id:
        outcome = sc.SERVER_OTHER_SESSION
    elif stream_id is None and not replayed:
        outcome = sc.SERVER_UNKNOWN_CURSOR
    elif replayed:
        outcome = sc.SERVER_REPLAYED
    else:
        outcome = sc.SERVER_NOTHING_TO_REPLAY
    observer.record(request, outcome, replayed=replayed, cursor_session=cursor_session)


_current: contextvars.ContextVar[ResumeRequest | None] = contextvars.ContextVar(
    "mcp_resumption_server_resume", default=None
)


def _observe_store(transport: Any) -> Any:
    store = getattr(transport, "_event_store", None)
    if store is None or isinstance(store, ObservedStore):
        return store
    observed = ObservedStore(store, getattr(transport, "mcp_session_id", None), transport)
    transport._event_store = observed
    return observed


def _init(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    if active.observer is not None:
        guarded("observing an event store", _observe_store, instance)


def _replay(wrapped, instance, args, kwargs):
    observer = active.observer
    if observer is None or not observer.enabled:
        return wrapped(*args, **kwargs)
    return _replay_observed(observer, wrapped, instance, args, kwargs)


def _bind(last_event_id: Any, request: Any, send: Any, *_: Any, **__: Any) -> tuple:
    return last_event_id, request, send


async def _replay_observed(observer, wrapped, instance, args, kwargs):
    last_event_id, request, send = _bind(*args, **kwargs)
    resume = guarded(
        "reading a resume request", from_scope, request.scope, sc.TRANSPORT_STREAMABLE_HTTP,
        str(last_event_id), getattr(instance, "mcp_session_id", None),
    )
    if resume is None:
        return await wrapped(*args, **kwargs)
    store = guarded("observing an event store", _observe_store, instance)
    if not getattr(instance, "_event_store", None):
        answer = _refusal(instance, sc.SERVER_NO_STORE) if observer.rejecting else None
        if answer is not None:
            return await _reject(observer, answer, resume, sc.SERVER_NO_STORE, request, send)
        guarded("counting a resume", observer.record, resume, sc.SERVER_NO_STORE)
        return await wrapped(*args, **kwargs)
    if observer.rejecting and isinstance(store, ObservedStore):
        refused = await _check(observer, store, resume)
        answer = _refusal(instance, refused) if refused is not None else None
        if answer is not None:
            return await _reject(observer, answer, resume, refused, request, send)
    token = _current.set(resume)
    try:
        return await wrapped(*args, **kwargs)
    finally:
        _current.reset(token)


async def _check(observer: Any, store: ObservedStore, resume: ResumeRequest) -> str | None:
    """The guard: what it must refuse, before any byte of the answer goes out.
    The store is read here, into memory, and the transport then replays from
    that (the store is read once, as without the guard)."""
    known, session = guarded(
        "looking up a cursor", observer.cursor_session, store.__wrapped__, resume.last_event_id
    ) or (False, None)
    if known and session is not None and session != resume.session_id:
        resume.cursor_session = session
        return sc.SERVER_OTHER_SESSION
    events: list[Any] = []

    async def keep(event: Any) -> None:
        events.append(event)

    try:
        stream_id = await store.__wrapped__.replay_events_after(resume.last_event_id, keep)
    except Exception:
        fault("the server guard's read of the event store")
        return None  # the transport calls the store itself, as without us
    if stream_id is None and not events:
        return sc.SERVER_UNKNOWN_CURSOR
    resume.prefetched = (stream_id, events)
    return None


async def _reject(
    observer: Any, answer: Any, resume: ResumeRequest, refused: str, request: Any, send: Any
) -> None:
    guarded(
        "counting a rejected resume", observer.record, resume, sc.SERVER_REJECTED_BY_GUARD,
        refused=refused, cursor_session=resume.cursor_session,
    )
    await answer(request.scope, request.receive, send)


def _refusal(transport: Any, refused: str) -> Any:
    """The guard's answer, in the SDK's own format; None if this SDK cannot
    make it (the resume then goes on as without the guard)."""
    return guarded(
        "making the guard's answer", transport._create_error_response,
        GUARD_MESSAGES[refused], GUARD_STATUS, GUARD_ERROR_CODE,
    )


def _manager_request(wrapped, instance, args, kwargs):
    observer = active.observer
    if observer is not None and observer.enabled:
        guarded("observing a request", _unknown_session, observer, instance, *args, **kwargs)
    return wrapped(*args, **kwargs)


def _unknown_session(observer: Any, manager: Any, scope: Any, *_: Any, **__: Any) -> None:
    if not isinstance(scope, dict) or scope.get("type") != "http":
        return
    address = scope.get("server") or ("", None)
    observer.server_seen(sc.TRANSPORT_STREAMABLE_HTTP, str(address[0]), address[1])
    if scope.get("method") != "GET":
        return
    last_event_id = header(scope, b"last-event-id")
    if not last_event_id:
        return
    session_id = header(scope, b"mcp-session-id")
    if session_id is not None and session_id in getattr(manager, "_server_instances", {}):
        return  # the transport answers it (_replay_events)
    # A session the manager does not know answers 404; none at all, 400.
    resume = from_scope(scope, sc.TRANSPORT_STREAMABLE_HTTP, last_event_id, session_id)
    observer.record(resume, sc.SERVER_UNKNOWN_SESSION)
