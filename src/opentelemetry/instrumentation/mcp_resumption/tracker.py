# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Bounded per-stream state for the continuity rules.

Pure: standard library only.  The tracker remembers, per stream and session,
what the rules need at a resume: the session each cursor was issued in, the
last received and last consumed event ids, a window of seen ids with a digest
of each event's data, and the ledger of JSON-RPC requests still in flight.

Memory is bounded: at most ``max_streams`` streams and as many sessions (the
least recently used is dropped and the drop counted), a fixed window of ids
and a fixed ledger per session.  Every public method but ``event_consumed``
(a flag) takes one lock, does a few dictionary operations and returns; no
I/O is done under the lock, so the tracker is safe to call from many threads
and from asyncio.  Per event it only records the raw id: ids are parsed, and
the index of cursors is brought up to date, when a stream opens, which is
when a client can present a cursor.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .continuity import (
    Cursor,
    EventId,
    Gap,
    ObservedEvent,
    ReplayContract,
    ResumeCheck,
    Verdict,
    corroborated,
    parse_declared,
    parse_event_id,
)
from .jsonrpc import canonical_digest, is_message, responses_in

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


class Session:
    """What the rules need of one session, shared by its streams."""

    __slots__ = (
        "history_lost",
        "ledger_unknown",
        "pending",
        "seen",
        "sent",
        "server",
        "session_id",
    )

    def __init__(self, server: str, session_id: str | None, history_lost: bool = False) -> None:
        self.server = server
        self.session_id = session_id
        # event id -> digest of its data (None: a marker, no data), oldest
        # first (a plain dict is insertion-ordered and a third the size of an
        # OrderedDict)
        self.seen: dict[str, int | None] = {}
        # request key -> (method, lineage of the stream its response must come
        # on; None where any stream of the session may carry it, as in legacy
        # SSE); None until the first request, as most sessions hold few
        self.pending: dict[str, tuple[str, int | None]] | None = None
        # request keys sent, oldest first; a list because it is appended to
        # per request and searched only at a resume
        self.sent: list[str] | None = None
        # Requests were sent that the ledger does not know: it forgot the
        # oldest, or a body was not read (too large, streamed, not JSON).
        self.ledger_unknown = False
        # A stream of this session was dropped (or the session is a new record
        # for a key whose older one may have been): its cursors can be gone.
        self.history_lost = history_lost

    def remember(self, event_id: str, digest: int | None) -> None:
        seen = self.seen
        if event_id in seen:
            del seen[event_id]  # to the newest end
        seen[event_id] = digest
        if len(seen) > SEEN_WINDOW:
            seen.pop(next(iter(seen)), None)

    def sent_here(self, request_key: str) -> bool:
        # A ledger that does not know every id sent cannot prove a response foreign.
        return self.ledger_unknown or (self.sent is not None and request_key in self.sent)

    def answered(self, request_keys: Iterable[str]) -> None:
        pending = self.pending
        if pending:
            for key in request_keys:
                pending.pop(key, None)
            if not pending:
                self.pending = None  # an emptied dict keeps its table

    def forget_pending(self, lineage: int) -> None:
        """An event of ``lineage`` may have answered any of its requests, but
        could not be read: none of them can be proven orphaned."""
        pending = self.pending
        if pending:
            for key, (_, owner) in list(pending.items()):
                if owner is None or owner == lineage:
                    del pending[key]
            if not pending:
                self.pending = None


class Stream:
    """One SSE response body; a resumed one continues its cursor's lineage.

    Event ids are kept as the raw strings the server sent and parsed only
    at a resume: the per-event path does no parsing.  ``taken`` says the
    application asked for the event after ``last_received``; the tracker
    folds it into ``last_consumed`` under its lock (see ``Tracker._settle``),
    so that marking it costs the reader no lock.
    """

    __slots__ = (
        "carries",
        "check",
        "consumed_data",
        "dirty",
        "ended",
        "indexed",
        "key",
        "last_consumed",
        "last_data",
        "last_received",
        "lineage",
        "meanings",
        "path",
        "server",
        "session",
        "taken",
        "transport",
        "unconsumed_responses",
    )

    def __init__(
        self, key: int, server: str, transport: str, session: Session, path: str | None = None
    ) -> None:
        self.key = key
        self.server = server
        self.path = path  # the URL path: the scope of a sessionless stream's ids
        self.transport = transport
        self.session = session
        self.lineage = key
        self.last_received: str | None = None
        self.last_consumed: str | None = None
        self.taken = False
        # The data of the last received and last consumed events while the
        # stream is read (references, not copies); once it ended, under the
        # inclusive contract, the digests of their JSON meaning by id: what
        # a server may send again in other bytes.
        self.last_data: str | None = None
        self.consumed_data: str | None = None
        self.meanings: dict[str, int | None] | None = None
        self.unconsumed_responses: tuple[str, ...] = ()
        self.check: ResumeCheck | None = None
        self.carries: tuple[str, ...] = ()
        self.ended = False
        # Waiting in Tracker._dirty to have its cursors indexed; the ids it
        # is indexed under now.
        self.dirty = False
        self.indexed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """What one observation produced: gaps newly found, and the verdict if
    this observation decided it."""

    gaps: tuple[Gap, ...] = ()
    verdict: Verdict | None = None


NOTHING = Step()  # what most observations produce; compared by identity

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
        event_id_pattern: object | None = None,
    ) -> None:
        self.max_streams = max(1, max_streams)
        self.contract = contract
        # A declared scheme (a compiled regex with a ``counter`` group)
        # replaces the inference from the ids' shape.
        self._parse: Callable[[str | None], EventId | None] = (
            parse_event_id
            if event_id_pattern is None
            else (lambda raw, pattern=event_id_pattern: parse_declared(raw, pattern))
        )
        self.evicted_streams = 0
        self.evicted_sessions = 0
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self._streams: OrderedDict[int, Stream] = OrderedDict()
        self._sessions: OrderedDict[tuple[str, str | None, str | None], Session] = OrderedDict()
        # (server, event id) -> the stream, or {key: stream} for several, whose
        # last received or consumed event it is, most recent last: the cursors
        # a client may present on reconnect.  Several when sessions count their
        # ids separately.  Brought up to date only where it is read (a new
        # stream, an eviction): per event, a stream is just marked dirty.
        self._cursors: dict[tuple[str, str], Stream | dict[int, Stream]] = {}
        self._dirty: list[Stream] = []
        _trackers.add(self)

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._streams)

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    # ---------------------------------------------------------- requests

    def request_sent(
        self,
        server: str,
        session_id: str | None,
        requests: Iterable[tuple[str, str]] | None,
        path: str | None = None,
    ) -> None:
        """JSON-RPC requests POSTed in a session (or sessionless, to ``path``);
        ``None``: a body that was not read, so the ledger no longer knows
        every request of the session."""
        with self._lock:
            session = self._session(server, session_id, path)
            if requests is None:
                session.ledger_unknown = True
                return
            for key, method in requests:
                if session.pending is None:
                    session.pending = {}
                if len(session.pending) < MAX_REQUESTS:
                    session.pending[key] = (method, None)
                if session.sent is None:
                    session.sent = []
                session.sent.append(key)
                if len(session.sent) > SENT_WINDOW:
                    del session.sent[0]
                    session.ledger_unknown = True

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
        path: str | None = None,
    ) -> Stream:
        """An SSE response is about to be read.  ``last_event_id`` makes it a
        resume; ``carries`` are request keys whose responses it will carry.
        ``session_id`` is the stream's session (the response's, else the
        request's); ``request_session_id``, the session the request named,
        is the one the client says its cursor belongs to (default: the
        stream's), and the cursor is looked up there.  ``path`` scopes the
        ids of a stream without a session: never a whole origin."""
        cursor = _bounded(last_event_id) or None
        claimed = request_session_id if request_session_id is not None else session_id
        with self._lock:
            self._flush()
            previous = self._cursor_owner(server, cursor, claimed, path) if cursor else None
            if previous is not None and previous.session.session_id is not None:
                session = previous.session
            else:
                session = self._session(server, session_id, path)
            stream = Stream(next(self._keys), server, transport, session, path)
            self._admit(stream)
            stream.carries = tuple(carries)
            pending = session.pending
            if pending:
                for key in stream.carries:
                    if key in pending:
                        pending[key] = (pending[key][0], stream.lineage)
            if cursor is not None:
                stream.check = self._begin_resume(stream, cursor, previous, claimed)
            return stream

    def _begin_resume(
        self,
        stream: Stream,
        cursor_raw: str,
        previous: Stream | None,
        request_session_id: str | None,
    ) -> ResumeCheck:
        cursor_id = self._parse(cursor_raw)
        if previous is None:
            # Evicted or never seen: the request's own session header is the
            # only binding left, and nothing else can be proven (not even the
            # id's order: no history shows its scheme counting).
            cursor = Cursor(EventId(cursor_raw), session_id=request_session_id)
            return ResumeCheck(cursor, self.contract)
        self._settle(previous)
        self._ended(previous)
        stream.lineage = previous.lineage
        session = previous.session
        unconsumed = previous.last_received == cursor_raw and previous.last_consumed != cursor_raw
        cursor = Cursor(
            corroborated(cursor_id, session.seen),
            session_id=session.session_id,
            known=True,
            consumed=not unconsumed,
            digest=session.seen.get(cursor_raw),
            meaning=previous.meanings.get(cursor_raw) if previous.meanings else None,
            transport=previous.transport,
        )
        pending: dict[str, str] = {}
        if session.pending:
            for key, (method, lineage) in session.pending.items():
                if lineage is None or lineage == previous.lineage:
                    pending[key] = method
            session.answered(pending)  # they are the resume's to settle now
        carrier = self._parse(previous.last_received)
        unconsumed_responses = {
            key: (pending.pop(key, ""), carrier) for key in previous.unconsumed_responses
        }
        return ResumeCheck(
            cursor,
            self.contract,
            seen=session.seen,
            pending=pending,
            unconsumed_responses=unconsumed_responses,
            sent_by_session=session.sent_here,
        )

    def cursor_session(self, server: str, last_event_id: str | None) -> str | None:
        """The session of the stream a cursor would resume, if it is tracked."""
        cursor = _bounded(last_event_id) or None
        if cursor is None:
            return None
        with self._lock:
            self._flush()
            owner = self._cursor_owner(server, cursor, None)
            return owner.session.session_id if owner is not None else None

    def bind_session(self, stream: Stream, session_id: str) -> None:
        """The legacy transport names its session in the ``endpoint`` event."""
        with self._lock:
            if stream.session.session_id == session_id:
                return
            old = stream.session
            stream.session = new = self._session(stream.server, session_id)
            if old.pending:
                if new.pending is None:
                    new.pending = {}
                new.pending.update(old.pending)
            for event_id, digest in old.seen.items():
                new.remember(event_id, digest)

    def response(self, stream: Stream, status: int, session_id: str | None) -> Step:
        """The reconnect was answered (for a resume) with ``status``."""
        with self._lock:
            if stream.check is None:
                return NOTHING
            check = stream.check
            return self._run(check, lambda: check.on_response(status, session_id))

    def event_received(
        self, stream: Stream, event_id: str | None, data: str, digest: int | None = None
    ) -> Step:
        """An event is handed to the application, which has thereby taken the
        one before it (it asked for this one) but not yet this one.

        The hot path of the plugin: a few attribute and dict operations under
        the lock, no parsing unless the stream is a resume under check."""
        if not event_id:
            event_id = None
        elif len(event_id) > MAX_KEPT_ID_LENGTH:
            event_id = _bounded(event_id)
        if digest is None:
            digest = hash(data)
        # Most events on a busy stream are notifications: skip the call.
        responses = responses_in(data) if '"result"' in data or '"error"' in data else ()
        unreadable = responses is None
        if unreadable:
            responses = ()
        with self._lock:
            self._take(stream)  # asking for this event took the one before
            step = NOTHING
            check = stream.check
            session = stream.session
            if check is not None and event_id is not None and data:
                previous = session.seen.get(event_id)
                if previous is not None and previous != digest:
                    # The one case that reads the data: on a resumed stream,
                    # an id seen before with other bytes, which would be
                    # reported as a reuse.
                    if not is_message(data):
                        data = ""  # a keep-alive repeating the id: a marker
                    elif self._same_meaning(check, event_id, data):
                        digest = previous
            if unreadable:
                session.forget_pending(stream.lineage)
            if check is not None and check.event_matters(
                event_id, digest, bool(responses) or unreadable
            ):
                event = ObservedEvent(
                    self._parse(event_id), digest, not data, responses, unreadable
                )
                step = self._run(check, lambda: check.on_event(event))
            if event_id is not None:
                # Markers carry no content to compare, but their ids show
                # whether the scheme counts.
                if data:
                    session.remember(event_id, digest)
                elif event_id not in session.seen:
                    session.remember(event_id, None)
                stream.last_received = event_id
                stream.last_data = data
            stream.unconsumed_responses = responses
            if not stream.dirty:
                stream.dirty = True
                self._dirty.append(stream)
            return step

    def event_consumed(self, stream: Stream) -> None:
        """The application asked for the next event: it took the last one.

        Takes no lock: a flag the tracker settles under its lock before it
        reads the stream's cursors (a list append is atomic)."""
        stream.taken = True
        if not stream.dirty:
            stream.dirty = True
            self._dirty.append(stream)

    def stream_ended(self, stream: Stream, reason: str, *, closed_by_client: bool = False) -> Step:
        with self._lock:
            self._settle(stream)
            if stream.ended and stream.check is None:
                return NOTHING
            self._ended(stream)
            if closed_by_client and set(stream.carries).intersection(stream.unconsumed_responses):
                # A POST stream closed right after the answer to its own
                # request: the client took it (that is how the MCP SDKs finish
                # a request), unlike a long-lived stream dropped mid-read.
                stream.taken = True
                self._settle(stream)
            if stream.check is None:
                return NOTHING
            check = stream.check
            return self._run(check, lambda: check.on_end(reason, closed_by_client=closed_by_client))

    def timeout(self, stream: Stream, seconds: float) -> Step:
        with self._lock:
            if stream.check is None:
                return NOTHING
            check = stream.check
            return self._run(check, lambda: check.on_timeout(seconds))

    # ---------------------------------------------------------- internals

    def _ended(self, stream: Stream) -> None:
        """The stream will deliver no more events: keep of its last event's
        data only what a resume may compare."""
        stream.ended = True
        received, consumed = stream.last_data, stream.consumed_data
        stream.last_data = stream.consumed_data = None
        if self.contract is ReplayContract.INCLUSIVE and (received or consumed):
            # Only an inclusive server sends the cursor event again.
            meanings: dict[str, int | None] = {}
            if consumed and stream.last_consumed is not None:
                meanings[stream.last_consumed] = canonical_digest(consumed)
            if received and stream.last_received is not None:
                meanings[stream.last_received] = canonical_digest(received)
            stream.meanings = meanings

    @staticmethod
    def _same_meaning(check: ResumeCheck | None, event_id: str, data: str) -> bool:
        """The cursor event sent again with the same JSON meaning in other
        bytes (a store that keeps JSON as JSONB)."""
        if check is None or check.cursor.meaning is None or event_id != check.cursor.event_id.raw:
            return False
        return canonical_digest(data) == check.cursor.meaning

    @staticmethod
    def _run(check: ResumeCheck, observe: Callable[[], list[Gap]]) -> Step:
        undecided = check.verdict is None
        gaps = observe()
        decided = check.verdict if undecided else None
        if not gaps and decided is None:
            return NOTHING
        return Step(tuple(gaps), decided)

    def _settle(self, stream: Stream) -> None:
        """Fold a ``taken`` mark into the stream's consumed state."""
        if stream.taken:
            self._take(stream)

    @staticmethod
    def _take(stream: Stream) -> None:
        """The application took the stream's last received event."""
        stream.taken = False
        if stream.unconsumed_responses:
            stream.session.answered(stream.unconsumed_responses)
            stream.unconsumed_responses = ()
        if stream.last_received is not None:
            stream.last_consumed = stream.last_received
            stream.consumed_data = stream.last_data

    def _flush(self) -> None:
        """Bring the cursor index and the LRU order up to date with the
        streams that received or consumed events since the last flush."""
        dirty = self._dirty
        streams = self._streams
        while dirty:
            stream = dirty.pop()
            stream.dirty = False
            self._settle(stream)
            if streams.get(stream.key) is not stream:
                continue  # evicted: its cursors are gone with it
            streams.move_to_end(stream.key)
            received, consumed = stream.last_received, stream.last_consumed
            if received is None:
                wanted: tuple[str, ...] = ()
            elif consumed is None or consumed == received:
                wanted = (received,)
            else:
                wanted = (consumed, received)
            if wanted == stream.indexed:
                continue
            for event_id in stream.indexed:
                if event_id not in wanted:
                    self._unindex(stream, event_id)
            for event_id in wanted:
                self._index(stream, event_id)
            stream.indexed = wanted

    def _index(self, stream: Stream, event_id: str) -> None:
        key = (stream.server, event_id)
        owners = self._cursors.get(key)
        if owners is None:
            self._cursors[key] = stream
        elif isinstance(owners, Stream):
            if owners is not stream:
                self._cursors[key] = {owners.key: owners, stream.key: stream}
        else:
            owners.pop(stream.key, None)
            owners[stream.key] = stream

    def _unindex(self, stream: Stream, event_id: str) -> None:
        key = (stream.server, event_id)
        owners = self._cursors.get(key)
        if owners is stream:
            del self._cursors[key]
        elif isinstance(owners, dict):
            owners.pop(stream.key, None)
            if len(owners) == 1:  # back to the common case: one owner, no dict
                self._cursors[key] = next(iter(owners.values()))

    def _cursor_owner(
        self, server: str, cursor: str, session_id: str | None, path: str | None = None
    ) -> Stream | None:
        owners = self._cursors.get((server, cursor))
        if owners is None:
            return None
        candidates = [owners] if isinstance(owners, Stream) else list(owners.values())
        # A stream without a session issued its ids for its URL path only.
        candidates = [
            stream
            for stream in candidates
            if stream.session.session_id is not None or stream.path == path
        ]
        if not candidates:
            return None
        if session_id is not None:
            for stream in reversed(candidates):
                if stream.session.session_id == session_id:
                    return stream
            # Another session's stream holds an equal id.  That binds the
            # cursor to the other session only if the named one could not
            # have issued it: per-session counters repeat ids across sessions.
            named = self._sessions.get((server, session_id, None))
            if named is None:
                if self.evicted_sessions:
                    return None  # it may have been dropped with its streams
            elif named.history_lost or cursor in named.seen:
                return None
        return candidates[-1]

    def _session(self, server: str, session_id: str | None, path: str | None = None) -> Session:
        # Sessionless streams share ids per URL path, not per origin.
        key = (server, session_id, None if session_id is not None else path)
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
            for event_id in dropped.indexed:
                self._unindex(dropped, event_id)
            dropped.indexed = ()
