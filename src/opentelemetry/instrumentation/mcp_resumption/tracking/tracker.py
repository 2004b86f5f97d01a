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
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ..forks import renew_after_fork
from ..rules.continuity import ReplayContract
from ..rules.event_ids import EventId, parse_declared, parse_event_id
from ..rules.fates import Broken
from ..rules.subscriptions import SubscriptionLedger
from ..shared.shared_state import MEMORY, Store
from .breaks import Breaks
from .cursors import CursorIndex
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
from .request_side import RequestSide
from .requests import SENT_TRIM, SENT_WINDOW, Reissues, Requests
from .resumes import Resumes
from .seen_window import SEEN_WINDOW
from .sharing import Sharing
from .streams import StreamLife

# Re-exported: the names the other modules, the tests, the benchmarks and
# the demo import from here, the tracker's API (its arguments and results).
__all__ = [
    "MAX_KEPT_ID_BYTES", "NOTHING", "SEEN_WINDOW", "SENT_TRIM", "SENT_WINDOW", "SSE",
    "STREAMABLE_HTTP", "Event", "Step", "Stream", "Tracker", "bounded_id",
]


class Tracker(RequestSide):
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
        # A declared scheme (a compiled regex with a ``counter`` group)
        # replaces the inference from the ids' shape.
        self._parse: Callable[[str | None], EventId | None] = (
            parse_event_id
            if event_id_pattern is None
            else (lambda raw, pattern=event_id_pattern: parse_declared(raw, pattern))
        )
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self.index = CursorIndex(max_streams, self._parse)
        # Lost subscriptions awaiting a re-listen (see ``subscriptions``).
        self.subscriptions = SubscriptionLedger()
        self.requests = Requests(self.subscriptions)
        self.reissues = Reissues()
        self.operations_done = self.requests.operations_done
        self.ran_twice_found = self.reissues.ran_twice
        self.breaks = Breaks(self.requests, self.subscriptions)
        # Broken requests awaiting their fate (see ``fates``).
        self.broken = self.breaks.broken
        self.resumes = Resumes(contract, self._parse, self.index.streams, self.breaks)
        self.life = StreamLife(
            contract, self._parse, self.index, self.requests, self.reissues, self.breaks,
            self.resumes,
        )
        # Where ended streams are shared with other processes (see
        # ``shared_state``); the memory store shares nothing.
        self.sharing = Sharing(store if store is not None else MEMORY, self.index, self.breaks)
        self.store: Store = self.sharing.store
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
        cursor = (bounded_id(last_event_id) or None) if last_event_id else None
        claimed = request_session_id if request_session_id is not None else session_id
        index = self.index
        sharing = self.sharing
        shared = None
        if cursor is not None and sharing.store.shared:
            with self._lock:
                self._flush(fold=True)
                known = sharing.seen_here(server, cursor)
            if not known:
                # A cursor this process never saw (a restarted client, another
                # instance's stream): the one read of the shared state,
                # bounded, outside the lock.  (An owner found under the lock
                # below still wins over the record.)  One it saw and could
                # not bind stays as memory judges it.
                shared = sharing.lookup(server, cursor, claimed)
        with self._lock:
            session = None
            if sent != ():
                session = index.session(server, session_id, path)
                self.requests.sent(session, sent, operation)
            if cursor is not None:
                self._flush(fold=True)
            elif index.dirty:
                index.flush()  # (``_flush``: nothing fed to fold)
            previous = index.owner(server, cursor, claimed, path) if cursor else None
            restored_breaks: tuple[Broken, ...] = ()
            if previous is None and shared is not None:
                previous, restored_breaks = sharing.restore(
                    shared, cursor, claimed, path, next(self._keys)
                )
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
                    sharing.hold_breaks(stream, restored_breaks)
            if sharing.store.shared:
                sharing.opened(stream)
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
            restored = self.sharing.restored_breaks and self.sharing.take_breaks(stream)
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
            feed = stream.feed
            if feed is not None and feed.ring:
                # (An empty ring leaves the fold nothing but the take of the
                # event before, which ``received`` makes: the iterator that
                # reports this one is running, so it holds none.)
                self.life.fold(stream)
            event = normalise(raw)
            if event.retry is not None:
                stream.retry(event.retry)
            return self.life.received(stream, event.id, event.data)

    def fold(self, stream: Stream) -> None:
        """Bring a fed stream's state up to date with its feed now (the
        events' room reads an open push stream so, through the feed's tap)."""
        with self._lock:
            self.life.fold(stream)

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
        with self._lock:
            step = self.life.end(stream, reason, closed_by_client, clean, held_open)
            if not self.sharing.store.shared:
                return step
            shared = self.sharing.ended(stream, closed_by_client)
        self.sharing.hand_over(stream, *shared)  # queued for the store's writer
        return step

    def share_fates(self, fates: Iterable[Any]) -> None:
        """Fates decided here (``Step.fates``): out of the shared in-flight
        ledger, so no other process counts them when this one is gone."""
        if self.sharing.store.shared:
            self.sharing.fated(fates)

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

    def _flush(self, fold: bool = False) -> None:
        """Bring the cursor index and the LRU order up to date with the
        streams that received or consumed events since the last flush;
        ``fold``: also with the streams being read through a feed (a cursor
        is about to be looked up; they are never evicted while read)."""
        if fold:
            for fed in list(self.index.fed.values()):
                self.life.fold(fed)
        self.index.flush()
