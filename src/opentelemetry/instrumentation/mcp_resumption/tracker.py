# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The tracker: the rooms below, composed under one lock.

Pure: standard library only.  The tracker remembers, per stream and session,
what the rules need at a resume, in rooms that are not thread-safe on their
own and are only ever called under its lock:

* ``records``: what is kept about one stream and one session (a finished
  stream's record is a ``records.Stream`` after ``finish``);
* ``seen_window``: the last event ids of a session, packed;
* ``cursors``: the tracked streams and sessions, bounded, and which stream
  a cursor resumes;
* ``requests``: what was sent, the requests in flight and their operations,
  the tools/list hints and the re-issues watched;
* ``resumes``: a resume's check, begun at its cursor, run, ended;
* ``breaks``: what a stream's end breaks, handed to ``fates`` and
  ``subscriptions``.

Memory is bounded: at most ``max_streams`` streams and as many sessions (the
least recently used is dropped and the drop counted), a fixed window of ids
and a fixed ledger per session.  Every public method but ``event_consumed``
(a flag) takes one lock, does a few dictionary operations and returns; no
I/O is done under the lock, so the tracker is safe to call from many threads
and from asyncio.  Most events never reach it one by one: a stream read
through a *feed* (``attach_feed``; the SSE patch keeps a ring of references
to its last events) is folded in, under the lock, whenever the tracker reads
that stream's state, so only the last events are ever looked at.  Ids are
parsed, and the index of cursors is brought up to date, when a stream opens,
which is when a client can present a cursor.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from .breaks import Breaks
from .continuity import ReplayContract
from .cursors import CursorIndex
from .event_ids import EventId, parse_declared, parse_event_id
from .fates import Broken
from .forks import renew_after_fork
from .jsonrpc import (
    calls_in,
    cancelled_in,
    responses_in,
)
from .records import (
    MAX_KEPT_ID_BYTES,
    NOTHING,
    SSE,
    STREAMABLE_HTTP,
    Event,
    Step,
    Stream,
    bounded_id,
)
from .requests import SENT_TRIM, SENT_WINDOW, Operation, Reissues, Requests
from .resumes import Resumes
from .seen_window import SEEN_WINDOW
from .shared_state import MEMORY, UNKNOWN_SESSION, SharedRecord, Store
from .streams import StreamLife
from .subscriptions import LostSubscription, SubscriptionLedger

# Servers remembered as swept for a dead process's requests (then forgotten,
# and swept again: a sweep is idempotent).
MAX_SWEPT_SERVERS = 1024

# Re-exported: the names the other modules, the tests, the benchmarks and
# the demo import from here, the tracker's API (its arguments and results).
__all__ = [
    "MAX_KEPT_ID_BYTES", "NOTHING", "SEEN_WINDOW", "SENT_TRIM", "SENT_WINDOW", "SSE",
    "STREAMABLE_HTTP", "Event", "Step", "Stream", "Tracker", "bounded_id",
]


class Tracker:
    """The API the monitor calls: each public method takes the one lock and
    composes the rooms (see the module docstring); none of them is called
    without it."""

    def __init__(
        self,
        max_streams: int = 10_000,
        contract: ReplayContract = ReplayContract.EXCLUSIVE,
        event_id_pattern: object | None = None,
        store: Store | None = None,
    ) -> None:
        self.contract = contract
        # Where ended streams are shared with other processes (see
        # ``shared_state``); the memory store shares nothing.
        self.store: Store = store if store is not None else MEMORY
        self._swept: set[str] = set()  # servers whose in-flight ledger was swept
        # New stream key -> the breaks recorded when the stream its cursor
        # names was restored from another process's record (see ``response``).
        self._restored_breaks: dict[int, tuple[Broken, ...]] = {}
        # A declared scheme (a compiled regex with a ``counter`` group)
        # replaces the inference from the ids' shape.
        self._parse: Callable[[str | None], EventId | None] = (
            parse_event_id
            if event_id_pattern is None
            else (lambda raw, pattern=event_id_pattern: parse_declared(raw, pattern))
        )
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self.index = CursorIndex(max_streams)
        # Lost subscriptions awaiting a re-listen (see ``subscriptions``).
        self.subscriptions = SubscriptionLedger()
        self.requests = Requests(self.subscriptions)
        self.reissues = Reissues()
        self.breaks = Breaks(self.requests, self.subscriptions)
        # Broken requests awaiting their fate (see ``fates``).
        self.broken = self.breaks.broken
        self.resumes = Resumes(contract, self._parse, self.index.streams, self.breaks)
        self.life = StreamLife(
            contract, self._parse, self.index, self.requests, self.reissues, self.breaks,
            self.resumes,
        )
        renew_after_fork(self)

    def _after_fork(self) -> None:
        # A fork copies the lock as it is: held, if another thread was inside
        # the tracker at that moment, and then held for ever in the child.
        self._lock = threading.Lock()

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self.index.streams)

    @property
    def session_count(self) -> int:
        return len(self.index.sessions)

    @property
    def max_streams(self) -> int:
        return self.index.max_streams

    @property
    def evicted_streams(self) -> int:
        return self.index.evicted_streams

    @property
    def evicted_sessions(self) -> int:
        return self.index.evicted_sessions

    @property
    def operations_done(self) -> list[Operation]:
        """Operations ended by an answer or a fate, not taken yet (read
        without the lock: a test whether to take them)."""
        return self.requests.operations_done

    # ---------------------------------------------------------- requests

    def request_sent(
        self,
        server: str,
        session_id: str | None,
        requests: Iterable[tuple[str, str]] | None,
        path: str | None = None,
        operation: Any = None,
    ) -> None:
        """JSON-RPC requests POSTed in a session (or sessionless, to ``path``);
        ``None``: a body that was not read, so the ledger no longer knows
        every request of the session.  ``operation``: the caller's record of
        the request, handed back when its answer or fate ends it."""
        with self._lock:
            self.requests.sent(self.index.session(server, session_id, path), requests, operation)

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
        body: bytes | None = None,
        sent: Iterable[tuple[str, str]] | None = (),
        operation: Any = None,
    ) -> Stream:
        """An SSE response is about to be read.  ``last_event_id`` makes it a
        resume; ``carries`` are request keys whose responses it will carry.
        ``session_id`` is the stream's session (the response's, else the
        request's); ``request_session_id``, the session the request named,
        is the one the client says its cursor belongs to (default: the
        stream's), and the cursor is looked up there.  ``path`` scopes the
        ids of a stream without a session: never a whole origin.  ``sent``:
        the requests POSTed with it, as ``request_sent`` takes them (one
        lock for both), with their ``operation``."""
        cursor = bounded_id(last_event_id) or None
        claimed = request_session_id if request_session_id is not None else session_id
        index = self.index
        shared = None
        if cursor is not None and self.store.shared:
            with self._lock:
                self._flush(fold=True)
                known = self._seen_here(server, cursor)
            if not known:
                # A cursor this process never saw (a restarted client, another
                # instance's stream): the one read of the shared state,
                # bounded, outside the lock.  (An owner found under the lock
                # below still wins over the record.)  One it saw and could
                # not bind stays as memory judges it.
                shared = self.store.lookup(server, cursor, self.store.session_hash(claimed))
        with self._lock:
            session = None
            if sent != ():
                session = index.session(server, session_id, path)
                self.requests.sent(session, sent, operation)
            self._flush(fold=cursor is not None)
            previous = index.owner(server, cursor, claimed, path) if cursor else None
            restored_breaks: tuple[Broken, ...] = ()
            if previous is None and shared is not None:
                previous, restored_breaks = self._restore(shared, cursor, claimed, path)
            if previous is not None and previous.session.session_id is not None:
                session = previous.session
            elif session is None:
                session = index.session(server, session_id, path)
            stream = Stream(next(self._keys), server, transport, session, path)
            index.admit(stream)
            stream.carries = tuple(carries)
            if stream.carries:
                stream.request_body = body
            pending = session.pending
            if pending:
                for key in stream.carries:
                    if key in pending:
                        pending[key] = (pending[key][0], stream.lineage)
            if cursor is not None:
                stream.check = self.resumes.begin(stream, cursor, previous, claimed)
                if restored_breaks:
                    if len(self._restored_breaks) >= MAX_SWEPT_SERVERS:  # never answered: bounded
                        self._restored_breaks.clear()
                    self._restored_breaks[stream.key] = restored_breaks
            if self.store.shared:
                self._share_open(stream)
            return stream

    def resuming(
        self, server: str, last_event_id: str, session_id: str | None, path: str | None = None
    ) -> None:
        """A resume of this cursor is on its way: the lineage goes on, so
        its grace may not end it while the answer (or the SDK's next try)
        is awaited."""
        with self._lock:
            owner = self._owner(server, last_event_id, session_id, path)
            if owner is not None:
                owner.resumed_again = True

    def cursor_session(self, server: str, last_event_id: str | None) -> str | None:
        """The session of the stream a cursor would resume, if it is tracked."""
        with self._lock:
            owner = self._owner(server, last_event_id, None)
            return owner.session.session_id if owner is not None else None

    def awaits_answers(
        self, server: str, last_event_id: str, session_id: str | None, path: str | None = None
    ) -> bool:
        """Whether resuming this cursor would settle requests still in flight
        (whose answers a rejected resume would orphan)."""
        with self._lock:
            owner = self._owner(server, last_event_id, session_id, path)
            if owner is None:
                return False
            if owner.unconsumed_responses:
                return True
            pending = owner.session.pending or {}
            return any(lineage in (None, owner.lineage) for _, lineage in pending.values())

    def _owner(
        self,
        server: str,
        last_event_id: str | None,
        session_id: str | None,
        path: str | None = None,
    ) -> Stream | None:
        """The stream a cursor would resume, if it is tracked (under the lock)."""
        cursor = bounded_id(last_event_id) or None
        if cursor is None:
            return None
        self._flush(fold=True)
        return self.index.owner(server, cursor, session_id, path)

    def bind_session(self, stream: Stream, session_id: str) -> None:
        """The legacy transport names its session in the ``endpoint`` event."""
        with self._lock:
            self.life.fold(stream)
            if stream.session.session_id != session_id:
                self.index.bind(stream, session_id)

    def response(
        self, stream: Stream, status: int, session_id: str | None, error: str | None = None
    ) -> Step:
        """The reconnect was answered (for a resume) with ``status``, or got
        no answer at all (``error``: what the client raised)."""
        with self._lock:
            self.life.fold(stream)
            if stream.check is None:
                return NOTHING
            check = stream.check
            if error is not None:
                step = self.resumes.run(stream, lambda: check.on_failure(error))
            else:
                step = self.resumes.run(stream, lambda: check.on_response(status, session_id))
            restored = self._restored_breaks and self._restored_breaks.pop(stream.key, None)
            if restored:
                # The breaks of another process's stream, recorded here at its
                # restore: reported with this resume's first step, so the
                # caller tags them (and their fates are counted) as if this
                # process had seen the stream break.
                step = replace(step, broke=(*restored, *step.broke))
            return step

    # ------------------------------------------------------------ events

    def event_received(
        self, stream: Stream, event_id: str | None, data: str, digest: int | None = None
    ) -> Step:
        """An event is handed to the application, which has thereby taken the
        one before it (it asked for this one) but not yet this one.  An empty
        ``event_id``: the event has no id of its own; empty ``data``: a marker."""
        with self._lock:
            self.life.fold(stream)
            return self.life.received(stream, event_id, data, digest)

    def attach_feed(self, stream: Stream, feed: Any) -> None:
        """``stream`` is read through ``feed``: ``feed.drain()`` gives the
        events recorded since it was last called (``Event`` records, oldest
        first) and whether the application holds the last one."""
        with self._lock:
            stream.feed = feed
            self.index.fed[stream.key] = stream

    def fed_event(self, stream: Stream, normalise: Callable[[Any], Event], raw: Any) -> Step:
        """An event of a fed stream that a rule must see as it comes: the
        feed's earlier events are folded in first, then this one
        (``normalise`` builds its record, in order)."""
        with self._lock:
            self.life.fold(stream)
            event = normalise(raw)
            if event.retry is not None:
                stream.retry(event.retry)
            return self.life.received(stream, event.id, event.data)

    def event_consumed(self, stream: Stream) -> None:
        """The application asked for the next event: it took the last one.

        Takes no lock: a flag the tracker settles under its lock before it
        reads the stream's cursors (a list append is atomic)."""
        stream.taken = True
        if not stream.dirty:
            stream.dirty = True
            self.index.dirty.append(stream)

    def retry_seen(self, stream: Stream, retry_ms: int) -> None:
        """The stream carried ``retry:``: the server polls (and how often)."""
        stream.retry(retry_ms)

    # ------------------------------------------------- requests' fates

    def session_terminated(self, server: str, session_id: str) -> Step:
        """The client asked the server to end the session (HTTP DELETE):
        its broken requests are lost."""
        with self._lock:
            session = self.index.find_session(server, session_id, None)
            return NOTHING if session is None else self.breaks.session_closed(session)

    def cancelling(self, server: str, session_id: str | None, path: str, body: bytes) -> None:
        """The client is about to send ``notifications/cancelled``: the
        requests it names and that have not broken yet are no longer
        awaited, so the stream the server then ends without their answers
        breaks nothing.  Told before the cancel is sent, which is before the
        server can end those streams.  (One whose stream ended before is the
        SDK's courtesy cancel after a failure: its fate runs on.)"""
        keys = cancelled_in(body)
        with self._lock:
            session = self.index.find_session(server, session_id, path)
            if session is not None and session.pending:
                self.breaks.cancelling(session, keys)

    def reissued(
        self,
        server: str,
        session_id: str | None,
        path: str,
        body: bytes,
        protocol_version: str | None = None,
    ) -> Step:
        """Requests in ``body`` were sent to ``server`` (speaking
        ``protocol_version``): those that repeat a broken request's call under
        a new id decide its fate, and say whether that was safe."""
        calls = calls_in(body)
        with self._lock:
            session = self.index.find_session(server, session_id, path)
            decided = self.broken.reissued(server, session, calls)
            if not decided:
                return NOTHING
            if session is None:  # its answer will be read in this session
                session = self.index.session(server, session_id, path)
            judge = self.reissues.judge
            return self.breaks.fated([judge(each, session, protocol_version) for each in decided])

    def json_answered(
        self, server: str, session_id: str | None, path: str, lists_tools: bool, answer: bytes
    ) -> None:
        """A POST's JSON answer was read: the tools/list hints it carries (if
        ``lists_tools``), and the answers a watched re-issue waits for."""
        with self._lock:
            if lists_tools:
                self.reissues.remember_hints(server, answer)
            if self.reissues.watched:
                session = self.index.find_session(server, session_id, path)
                keys = responses_in(answer.decode("utf-8", "replace")) if session else None
                if keys:
                    self.reissues.answers_seen(session, keys)

    def take_operations(self) -> list[Operation]:
        """The operations ended since the last call: (method, request key,
        the caller's record of the request, error.type or None)."""
        with self._lock:
            return self.requests.take_operations()

    @property
    def watches_reissues(self) -> bool:
        return bool(self.reissues.watched)

    @property
    def ran_twice_found(self) -> bool:
        return bool(self.reissues.ran_twice)

    def take_ran_twice(self) -> list[Broken]:
        """Re-issued calls proven to have run twice since the last call."""
        with self._lock:
            return self.reissues.take_ran_twice()

    def subscriptions_due(self, window: float) -> list[LostSubscription]:
        """Lost subscriptions whose re-listen window has passed: counted now."""
        with self._lock:
            return self.subscriptions.due(time.monotonic(), window)

    def fates_due(self, window: float) -> Step:
        """Broken requests whose reissue window has passed are lost."""
        with self._lock:
            return self.breaks.fated(self.broken.due(time.monotonic(), window))

    def all_lost(self, why: str) -> Step:
        """The client stops waiting for everything (the process exits): its
        broken requests are lost, and so are the subscriptions still open."""
        with self._lock:
            return self.breaks.all_lost(self.index.streams.values(), why)

    def all_subscriptions_due(self) -> list[LostSubscription]:
        """Every lost subscription still waiting: counted now (the exit)."""
        with self._lock:
            return self.subscriptions.all_due()

    def take_overflow(self) -> list[LostSubscription]:
        """Lost subscriptions counted early, the ledger being full."""
        with self._lock:
            return self.breaks.take_overflow()

    # -------------------------------------------------------------- ends

    def stream_ended(
        self,
        stream: Stream,
        reason: str,
        *,
        closed_by_client: bool = False,
        clean: bool = False,
        held_open: bool = False,
    ) -> Step:
        """The stream ended.  ``clean``: its body ended as HTTP ends a body
        (not a read error, not cut short); on a polling lineage that is the
        server closing it on purpose, and the next resume is a poll.
        ``held_open``: it was open at least the confirmation window, so an
        empty poll closed then is the server's "nothing new yet"."""
        record = None
        with self._lock:
            step = self.life.end(stream, reason, closed_by_client, clean, held_open)
            if self.store.shared:
                pending = stream.session.pending or {}
                answered = [key for key in stream.carries if key not in pending]
                lineage = stream.lineage
                awaited = any(owner in (None, lineage) for _, owner in pending.values())
                # A request's stream the client closed after its answers, with
                # nothing of its lineage awaited (how the SDKs finish a call),
                # is never resumed: its record would cost a write for nothing.
                finished = closed_by_client and bool(stream.carries) and not awaited
                if stream.last_received is not None and not finished:
                    record = self._record(stream)
        if self.store.shared:
            # Queued for the store's writer: no I/O here.
            if record is not None:
                self.store.save(record)
            if answered:
                self.store.settled(stream.server, self._session_hash(stream.session), answered)
        return step

    def share_fates(self, fates: Iterable[Any]) -> None:
        """Fates decided here (``Step.fates``): out of the shared in-flight
        ledger, so no other process counts them when this one is gone."""
        if not self.store.shared:
            return
        for decided in fates:
            broken = decided.broken
            session_hash = self._session_hash(broken.session)
            self.store.settled(broken.server, session_hash, [broken.key])

    def lineage_ended(self, stream: Stream, why: str) -> Step:
        """The client did not resume ``stream`` (a resumed stream that ended
        holding requests): they are orphaned now.  Nothing if a later stream
        resumed it, which then holds them."""
        with self._lock:
            return self.breaks.lineage_ended(stream, why)

    def timeout(self, stream: Stream, seconds: float) -> Step:
        with self._lock:
            if stream.check is None:
                return NOTHING
            check = stream.check
            return self.resumes.run(stream, lambda: check.on_timeout(seconds))

    # ---------------------------------------------------------- internals

    def _session_hash(self, session: Any) -> str | None:
        session_id = session.session_id
        if session_id is not None and session_id.startswith(UNKNOWN_SESSION):
            # Restored from a record whose session this process never knew.
            return session_id[len(UNKNOWN_SESSION) :]
        return self.store.session_hash(session_id)

    def _share_open(self, stream: Stream) -> None:
        """A stream opened (under the lock): the first of its server makes
        the store look for a dead process's requests there; the requests it
        carries go into the shared in-flight ledger.  Both queued."""
        server = stream.server
        if server not in self._swept:
            if len(self._swept) >= MAX_SWEPT_SERVERS:
                self._swept.clear()
            self._swept.add(server)
            self.store.sweep(server)
        pending = stream.session.pending
        if stream.carries and pending:
            carried = [(key, pending[key][0]) for key in stream.carries if key in pending]
            if carried:
                self.store.in_flight(
                    server, self._session_hash(stream.session), carried, stream.transport
                )

    def _record(self, stream: Stream) -> SharedRecord:
        """What a resume of ``stream``'s cursor in another process needs of
        it (under the lock): its ids, its session's seen window, the
        requests of its lineage still in flight."""
        session = stream.session
        session_id = session.session_id
        session_hash = self._session_hash(session)
        lineage = stream.lineage
        return SharedRecord.of(
            server=stream.server,
            session_id=session_id,
            session_hash=session_hash,
            path=stream.path,
            transport=stream.transport,
            last_received=stream.last_received,
            last_consumed=stream.last_consumed,
            seen=session.seen.items(),
            meanings=stream.meanings,
            pending=[
                (key, method)
                for key, (method, owner) in (session.pending or {}).items()
                if owner is None or owner == lineage
            ],
            unconsumed_responses=stream.unconsumed_responses,
            primed=stream.primed,
            retry_ms=stream.retry_ms,
            server_closed=stream.server_closed,
            writer=getattr(self.store, "writer", ""),
        )

    def _seen_here(self, server: str, cursor: str) -> bool:
        """Whether a stream of ``server`` tracked here issued ``cursor`` (under
        the lock, index flushed)."""
        owners = self.index.cursors.get(cursor)
        if owners is None:
            return False
        streams = (owners,) if isinstance(owners, Stream) else tuple(owners.values())
        return any(stream.server == server for stream in streams)

    def _restore(
        self, record: SharedRecord, cursor: str, claimed: str | None, path: str | None
    ) -> tuple[Stream | None, tuple[Broken, ...]]:
        """An ended stream rebuilt from another process's record of it
        (under the lock): tracked as if this process had read it, so the
        resume of ``cursor`` is judged by the same rules; and the requests
        it broke there with, recorded broken here."""
        if record.session_hash is None:
            if record.path != path:
                return None, ()  # a sessionless stream's ids are its path's only
            session_id = None
        elif claimed is not None and self.store.session_hash(claimed) == record.session_hash:
            session_id = claimed  # the session the client names is the cursor's
        elif (embedded := record.session_in(cursor, self.store.session_hash)) is not None:
            session_id = embedded  # the cursor itself names its session
        else:
            # Issued in another session, whose id this process never saw: a
            # stand-in for it, never equal to a real one, so the answer's
            # session id differs from it (``session_changed``).
            session_id = UNKNOWN_SESSION + record.session_hash
        restored = record.ids_for(session_id)
        if restored is None or cursor not in (restored.last_received, restored.last_consumed):
            return None, ()  # its ids need a session id this process cannot know
        index = self.index
        session = index.session(record.server, session_id, record.path)
        # The requests it sent before are not all known here.
        session.ledger_unknown = True
        session.seen.remember_all(restored.seen)
        stream = Stream(next(self._keys), record.server, record.transport, session, record.path)
        stream.last_received = restored.last_received
        stream.last_consumed = restored.last_consumed
        stream.meanings = restored.meanings or None
        stream.unconsumed_responses = restored.unconsumed_responses
        stream.primed = restored.primed
        stream.retry_ms = restored.retry_ms
        stream.server_closed = restored.server_closed
        stream.ended = True
        index.admit(stream)
        stream.dirty = True
        index.dirty.append(stream)
        index.flush()
        broke: list[Broken] = []
        if restored.pending:
            pending = session.pending if session.pending is not None else {}
            for key, method in restored.pending.items():
                pending.setdefault(key, (method, stream.lineage))
            session.pending = pending
            # Their fates are this process's to decide now: out of the
            # writer's in-flight entries, so its death does not count them.
            self.store.settled(
                record.server, record.session_hash, list(restored.pending), writer=record.writer
            )
            if not restored.server_closed:
                # The stream broke there with these in flight, as a stream
                # that breaks here records them (``Breaks.broken_stream``):
                # their fates (answered by the resume, or lost) are counted.
                for key, method in restored.pending.items():
                    self.breaks.record_break(stream, key, method, None, broke, [])
                holders = session.holders if session.holders is not None else {}
                holders.update((broken.key, stream.key) for broken in broke)
                session.holders = holders or None
        return stream, tuple(broke)

    def _flush(self, fold: bool = False) -> None:
        """Bring the cursor index and the LRU order up to date with the
        streams that received or consumed events since the last flush;
        ``fold``: also with the streams being read through a feed (a cursor
        is about to be looked up; they are never evicted while read)."""
        if fold:
            for fed in list(self.index.fed.values()):
                self.life.fold(fed)
        self.index.flush()
