# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Bounded per-stream state for the continuity rules.

Pure: standard library only.  The tracker remembers, per stream and session,
what the rules need at a resume: the session each cursor was issued in, the
last received and last consumed event ids, a window of seen ids with a digest
of each event's data, and the ledger of JSON-RPC requests still in flight.

Memory is bounded: at most ``max_streams`` streams and as many sessions (the
least recently used is dropped and the drop counted), a fixed window of ids
and a fixed ledger per session.  Every public method takes one lock, does a
few dictionary operations and returns; no I/O is done under the lock, so the
tracker is safe to call from many threads and from asyncio.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .continuity import (
    Cursor,
    EventId,
    Gap,
    ObservedEvent,
    ReplayContract,
    ResumeCheck,
    Verdict,
    parse_event_id,
)
from .jsonrpc import responses_in

SEEN_WINDOW = 32  # event ids remembered per session, for id_reused
MAX_REQUESTS = 256  # in-flight JSON-RPC requests remembered per session
SENT_WINDOW = 512  # request ids remembered per session, for foreign_replay

SSE = "sse"
STREAMABLE_HTTP = "streamable-http"
# Event ids longer than this are remembered as a prefix and a digest: equal
# ids stay equal (and opaque), and a server cannot make each of the ids kept
# per session megabytes long.
MAX_KEPT_ID_LENGTH = 256


def _bounded(event_id: str | None) -> str | None:
    if not isinstance(event_id, str) or len(event_id) <= MAX_KEPT_ID_LENGTH:
        return event_id
    digest = hashlib.sha256(event_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{event_id[:64]}...sha256:{digest}"


@dataclass
class Session:
    server: str
    session_id: str | None
    seen: OrderedDict[str, int] = field(default_factory=OrderedDict)
    # request key -> (method, lineage of the stream its response must come on;
    # None where any stream of the session may carry it, as in legacy SSE)
    pending: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    sent: OrderedDict[str, None] = field(default_factory=OrderedDict)
    sent_overflowed: bool = False
    # A stream of this session was dropped (or the session is a new record
    # for a key whose older one may have been): its cursors can be gone.
    history_lost: bool = False

    def remember(self, event_id: EventId, digest: int) -> None:
        self.seen[event_id.raw] = digest
        self.seen.move_to_end(event_id.raw)
        if len(self.seen) > SEEN_WINDOW:
            self.seen.popitem(last=False)

    def sent_here(self, request_key: str) -> bool:
        # A ledger that has forgotten ids cannot prove a response foreign.
        return self.sent_overflowed or request_key in self.sent


class Stream:
    """One SSE response body; a resumed one continues its cursor's lineage."""

    __slots__ = (
        "carries",
        "check",
        "ended",
        "key",
        "last_consumed",
        "last_received",
        "lineage",
        "server",
        "session",
        "transport",
        "unconsumed_responses",
    )

    def __init__(self, key: int, server: str, transport: str, session: Session) -> None:
        self.key = key
        self.server = server
        self.transport = transport
        self.session = session
        self.lineage = key
        self.last_received: EventId | None = None
        self.last_consumed: EventId | None = None
        self.unconsumed_responses: tuple[str, ...] = ()
        self.check: ResumeCheck | None = None
        self.carries: frozenset[str] = frozenset()
        self.ended = False


@dataclass(frozen=True)
class Step:
    """What one observation produced: gaps newly found, and the verdict if
    this observation decided it."""

    gaps: tuple[Gap, ...] = ()
    verdict: Verdict | None = None


_NOTHING = Step()

# A fork copies the lock as it is: held, if another thread was inside the
# tracker at that moment, and then held for ever in the child.
_trackers: weakref.WeakSet[Tracker] = weakref.WeakSet()


def _new_locks_in_child() -> None:
    for tracker in list(_trackers):
        tracker._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


class Tracker:
    def __init__(
        self,
        max_streams: int = 10_000,
        contract: ReplayContract = ReplayContract.EXCLUSIVE,
    ) -> None:
        self.max_streams = max(1, max_streams)
        self.contract = contract
        self.evicted_streams = 0
        self.evicted_sessions = 0
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self._streams: OrderedDict[int, Stream] = OrderedDict()
        self._sessions: OrderedDict[tuple[str, str | None], Session] = OrderedDict()
        # (server, event id) -> the streams whose last received or consumed
        # event it is, most recent last: the cursors a client may present on
        # reconnect.  Several when sessions count their ids separately.
        self._cursors: dict[tuple[str, str], dict[int, Stream]] = {}
        _trackers.add(self)

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._streams)

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    # ---------------------------------------------------------- requests

    def request_sent(
        self, server: str, session_id: str | None, requests: Iterable[tuple[str, str]]
    ) -> None:
        """JSON-RPC requests POSTed in a session (or sessionless)."""
        with self._lock:
            session = self._session(server, session_id)
            for key, method in requests:
                if len(session.pending) < MAX_REQUESTS:
                    session.pending[key] = (method, None)
                session.sent[key] = None
                if len(session.sent) > SENT_WINDOW:
                    session.sent.popitem(last=False)
                    session.sent_overflowed = True

    # ----------------------------------------------------------- streams

    def open_stream(
        self,
        server: str,
        transport: str,
        *,
        session_id: str | None = None,
        last_event_id: str | None = None,
        carries: Iterable[str] = (),
        request_session_id: str | None = None,
    ) -> Stream:
        """An SSE response is about to be read.  ``last_event_id`` makes it a
        resume; ``carries`` are request keys whose responses it will carry.
        ``session_id`` is the stream's session (the response's, else the
        request's); ``request_session_id``, the session the request named,
        is the one the client says its cursor belongs to (default: the
        stream's), and the cursor is looked up there."""
        cursor_id = parse_event_id(_bounded(last_event_id))
        claimed = request_session_id if request_session_id is not None else session_id
        with self._lock:
            previous = self._cursor_owner(server, cursor_id, claimed)
            if previous is not None and previous.session.session_id is not None:
                session = previous.session
            else:
                session = self._session(server, session_id)
            stream = Stream(next(self._keys), server, transport, session)
            self._admit(stream)
            stream.carries = frozenset(carries)
            for key in stream.carries:
                if key in session.pending:
                    session.pending[key] = (session.pending[key][0], stream.lineage)
            if cursor_id is not None:
                stream.check = self._begin_resume(stream, cursor_id, previous, claimed)
            return stream

    def _begin_resume(
        self,
        stream: Stream,
        cursor_id: EventId,
        previous: Stream | None,
        request_session_id: str | None,
    ) -> ResumeCheck:
        if previous is None:
            # Evicted or never seen: the request's own session header is the
            # only binding left, and nothing else can be proven.
            cursor = Cursor(cursor_id, session_id=request_session_id)
            return ResumeCheck(cursor, self.contract)
        previous.ended = True
        stream.lineage = previous.lineage
        session = previous.session
        unconsumed = (
            previous.last_received is not None
            and previous.last_received.raw == cursor_id.raw
            and (previous.last_consumed is None or previous.last_consumed.raw != cursor_id.raw)
        )
        cursor = Cursor(
            cursor_id,
            session_id=session.session_id,
            known=True,
            consumed=not unconsumed,
            digest=session.seen.get(cursor_id.raw),
            transport=previous.transport,
        )
        pending: dict[str, str] = {}
        for key, (method, lineage) in list(session.pending.items()):
            if lineage is None or lineage == previous.lineage:
                pending[key] = method
                del session.pending[key]
        unconsumed_responses = {
            key: (pending.pop(key, ""), previous.last_received)
            for key in previous.unconsumed_responses
        }
        return ResumeCheck(
            cursor,
            self.contract,
            seen=session.seen,
            pending=pending,
            unconsumed_responses=unconsumed_responses,
            sent_by_session=session.sent_here,
        )

    def bind_session(self, stream: Stream, session_id: str) -> None:
        """The legacy transport names its session in the ``endpoint`` event."""
        with self._lock:
            if stream.session.session_id == session_id:
                return
            old = stream.session
            stream.session = self._session(stream.server, session_id)
            stream.session.pending.update(old.pending)
            for event_id, digest in old.seen.items():
                stream.session.seen[event_id] = digest

    def response(self, stream: Stream, status: int, session_id: str | None) -> Step:
        """The reconnect was answered (for a resume) with ``status``."""
        with self._lock:
            if stream.check is None:
                return _NOTHING
            check = stream.check
            return self._run(check, lambda: check.on_response(status, session_id))

    def event_received(
        self, stream: Stream, event_id: str | None, data: str, digest: int | None = None
    ) -> Step:
        """An event is handed to the application (it has not consumed it yet)."""
        parsed = parse_event_id(_bounded(event_id))
        if digest is None:
            digest = hash(data)
        responses = responses_in(data)
        with self._lock:
            self._touch(stream)
            self._consume_locked(stream)
            check = stream.check
            step = _NOTHING
            if check is not None:
                event = ObservedEvent(parsed, digest, not data, responses)
                step = self._run(check, lambda: check.on_event(event))
            if parsed is not None:
                if data:  # markers carry no content to compare
                    stream.session.remember(parsed, digest)
                self._move_cursor(stream, "last_received", parsed)
            stream.unconsumed_responses = responses
            return step

    def event_consumed(self, stream: Stream) -> None:
        """The application asked for the next event: it took the last one."""
        with self._lock:
            self._consume_locked(stream)

    def stream_ended(self, stream: Stream, reason: str, *, closed_by_client: bool = False) -> Step:
        with self._lock:
            if stream.ended and stream.check is None:
                return _NOTHING
            stream.ended = True
            if closed_by_client and stream.carries.intersection(stream.unconsumed_responses):
                # A POST stream closed right after the answer to its own
                # request: the client took it (that is how the MCP SDKs finish
                # a request), unlike a long-lived stream dropped mid-read.
                self._consume_locked(stream)
            if stream.check is None:
                return _NOTHING
            check = stream.check
            return self._run(check, lambda: check.on_end(reason, closed_by_client=closed_by_client))

    def timeout(self, stream: Stream, seconds: float) -> Step:
        with self._lock:
            if stream.check is None:
                return _NOTHING
            check = stream.check
            return self._run(check, lambda: check.on_timeout(seconds))

    # ---------------------------------------------------------- internals

    @staticmethod
    def _run(check: ResumeCheck, observe: Callable[[], list[Gap]]) -> Step:
        undecided = check.verdict is None
        gaps = observe()
        decided = check.verdict if undecided else None
        if not gaps and decided is None:
            return _NOTHING
        return Step(tuple(gaps), decided)

    def _consume_locked(self, stream: Stream) -> None:
        received = stream.last_received
        if received is None or stream.last_consumed is received:
            stream.unconsumed_responses = ()
            return
        for key in stream.unconsumed_responses:
            stream.session.pending.pop(key, None)
        stream.unconsumed_responses = ()
        self._move_cursor(stream, "last_consumed", received)

    def _cursor_owner(
        self, server: str, cursor_id: EventId | None, session_id: str | None
    ) -> Stream | None:
        owners = self._cursors.get((server, cursor_id.raw)) if cursor_id else None
        if not owners:
            return None
        if session_id is not None:
            for stream in reversed(owners.values()):
                if stream.session.session_id == session_id:
                    return stream
            # Another session's stream holds an equal id.  That binds the
            # cursor to the other session only if the named one could not
            # have issued it: per-session counters repeat ids across sessions.
            named = self._sessions.get((server, session_id))
            if named is None:
                if self.evicted_sessions:
                    return None  # it may have been dropped with its streams
            elif named.history_lost or cursor_id.raw in named.seen:
                return None
        return next(reversed(owners.values()))

    def _move_cursor(self, stream: Stream, slot: str, event_id: EventId) -> None:
        old: EventId | None = getattr(stream, slot)
        setattr(stream, slot, event_id)
        if old is not None and old.raw != event_id.raw:
            other = stream.last_consumed if slot == "last_received" else stream.last_received
            if other is None or other.raw != old.raw:
                self._forget_cursor(stream, old)
        owners = self._cursors.setdefault((stream.server, event_id.raw), {})
        owners.pop(stream.key, None)
        owners[stream.key] = stream

    def _forget_cursor(self, stream: Stream, event_id: EventId) -> None:
        key = (stream.server, event_id.raw)
        owners = self._cursors.get(key)
        if owners is not None and owners.pop(stream.key, None) is not None and not owners:
            del self._cursors[key]

    def _session(self, server: str, session_id: str | None) -> Session:
        key = (server, session_id)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = Session(
                server, session_id, history_lost=self.evicted_sessions > 0
            )
            if len(self._sessions) > self.max_streams:
                self._sessions.popitem(last=False)
                self.evicted_sessions += 1
        else:
            self._sessions.move_to_end(key)
        return session

    def _admit(self, stream: Stream) -> None:
        self._streams[stream.key] = stream
        while len(self._streams) > self.max_streams:
            _, dropped = self._streams.popitem(last=False)
            self.evicted_streams += 1
            dropped.session.history_lost = True
            for event_id in (dropped.last_received, dropped.last_consumed):
                if event_id is not None:
                    self._forget_cursor(dropped, event_id)

    def _touch(self, stream: Stream) -> None:
        if stream.key in self._streams:
            self._streams.move_to_end(stream.key)
