# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The tracker's share of the shared state: what it hands the store and
what it takes back from it.

Pure: standard library only, and not thread-safe on its own (the tracker
calls it under its lock; the store's own calls queue or are bounded, and
the one read, ``lookup``, is made outside the lock).  A stream's end hands
its record (``shared_state.SharedRecord``) to the store unless nothing can
resume it (``ended``, ``hand_over``); a stream's opening puts the requests
it carries into the shared in-flight ledger (the requests each process
awaits answers to) and, for the first stream of a server, asks the store
to look for a dead process's requests there (``opened``); a cursor this
process never saw is looked up (``lookup``) and the stream that issued it
rebuilt from its record (``restore``), so that its resume is judged by the
same rules as a stream read here.  With the memory store (the default) the
tracker calls none of it but ``store.shared``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..rules.fates import Broken
from ..shared.shared_state import UNKNOWN_SESSION, SharedRecord, Store
from .breaks import Breaks
from .cursors import CursorIndex
from .records import Stream

__all__ = ["MAX_SWEPT_SERVERS", "Sharing"]

# Servers remembered as swept for a dead process's requests (then forgotten,
# and swept again: a sweep is idempotent); resumes holding restored breaks.
MAX_SWEPT_SERVERS = 1024


class Sharing:
    """Ended streams shared through a store, and streams rebuilt from it."""

    def __init__(self, store: Store, index: CursorIndex, breaks: Breaks) -> None:
        self.store = store
        self.index = index
        self.breaks = breaks
        self.swept: set[str] = set()  # servers whose in-flight ledger was swept
        # New stream key -> the breaks recorded when the stream its cursor
        # names was restored from another process's record (see
        # ``Tracker.response``).
        self.restored_breaks: dict[int, tuple[Broken, ...]] = {}

    def lookup(self, server: str, cursor: str, claimed: str | None) -> SharedRecord | None:
        """The record of the stream that issued ``cursor``, if the store has
        it (bounded; called outside the tracker's lock)."""
        return self.store.lookup(server, cursor, self.store.session_hash(claimed))

    def hold_breaks(self, stream: Stream, breaks: tuple[Broken, ...]) -> None:
        """``stream`` resumes a restored stream that broke with ``breaks``:
        reported with the resume's first step."""
        if len(self.restored_breaks) >= MAX_SWEPT_SERVERS:  # never answered: bounded
            self.restored_breaks.clear()
        self.restored_breaks[stream.key] = breaks

    def take_breaks(self, stream: Stream) -> tuple[Broken, ...] | None:
        return self.restored_breaks.pop(stream.key, None)

    def ended(
        self, stream: Stream, closed_by_client: bool
    ) -> tuple[SharedRecord | None, list[str]]:
        """What the end of ``stream`` hands the store: its record, unless
        nothing can resume it, and the requests it answered."""
        pending = stream.session.pending or {}
        answered = [key for key in stream.carries if key not in pending]
        lineage = stream.lineage
        awaited = any(owner in (None, lineage) for _, owner in pending.values())
        # A request's stream the client closed after its answers, with
        # nothing of its lineage awaited (how the SDKs finish a call), is
        # never resumed: its record would cost a write for nothing.
        finished = closed_by_client and bool(stream.carries) and not awaited
        record = None
        if stream.last_received is not None and not finished:
            record = self.record(stream)
        return record, answered

    def hand_over(self, stream: Stream, record: SharedRecord | None, answered: list[str]) -> None:
        """Queue what ``ended`` found for the store's writer: no I/O here."""
        if record is not None:
            self.store.save(record)
        if answered:
            self.store.settled(stream.server, self.session_hash(stream.session), answered)

    def fated(self, fates: Iterable[Any]) -> None:
        """Fates decided here: out of the shared in-flight ledger."""
        for decided in fates:
            broken = decided.broken
            self.store.settled(broken.server, self.session_hash(broken.session), [broken.key])

    def session_hash(self, session: Any) -> str | None:
        session_id = session.session_id
        if session_id is not None and session_id.startswith(UNKNOWN_SESSION):
            # Restored from a record whose session this process never knew.
            return session_id[len(UNKNOWN_SESSION) :]
        return self.store.session_hash(session_id)

    def opened(self, stream: Stream) -> None:
        """A stream opened (under the lock): the first of its server makes
        the store look for a dead process's requests there; the requests it
        carries go into the shared in-flight ledger.  Both queued."""
        server = stream.server
        if server not in self.swept:
            if len(self.swept) >= MAX_SWEPT_SERVERS:
                self.swept.clear()
            self.swept.add(server)
            self.store.sweep(server)
        pending = stream.session.pending
        if stream.carries and pending:
            carried = [(key, pending[key][0]) for key in stream.carries if key in pending]
            if carried:
                self.store.in_flight(
                    server, self.session_hash(stream.session), carried, stream.transport
                )

    def record(self, stream: Stream) -> SharedRecord:
        """What a resume of ``stream``'s cursor in another process needs of
        it (under the lock): its ids, its session's seen window, the
        requests of its lineage still in flight."""
        session = stream.session
        session_id = session.session_id
        session_hash = self.session_hash(session)
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

    def seen_here(self, server: str, cursor: str) -> bool:
        """Whether a stream of ``server`` tracked here issued ``cursor`` (under
        the lock, index flushed)."""
        owners = self.index.cursors.get(cursor)
        if owners is None:
            return False
        streams = (owners,) if isinstance(owners, Stream) else tuple(owners.values())
        return any(stream.server == server for stream in streams)

    def restore(
        self, record: SharedRecord, cursor: str, claimed: str | None, path: str | None, key: int
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
        stream = Stream(key, record.server, record.transport, session, record.path)
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
            # And out of the writer's hands: it counts none of them lost.
            self.store.took_over(record.server, record.session_hash, list(restored.pending))
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
