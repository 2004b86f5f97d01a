# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Where streams and sessions are kept, and which stream a cursor resumes.

Pure: standard library only, and not thread-safe on its own (the tracker
calls it under its lock).  ``CursorIndex`` holds the tracked streams and
sessions, each table bounded and in least-recently-used order (the oldest
dropped, and the drop counted), and the index of cursors: each event id a
client may present as ``Last-Event-ID`` (a stream's last received or
consumed id) to the streams it names.  ``owner`` binds a cursor to the
stream, and so the session, it was issued in; a cursor behind a stream's
end (an id the named session saw, not a stream's last: a proxy that read
past its client's cursor) finds its stream through the session (``behind``).
The index is brought up to date only where it is read (``flush``): per
event, a stream is only marked dirty.
"""

from __future__ import annotations

from collections.abc import Callable

from ..rules.event_ids import EventId, compare_event_ids, corroborated, parse_event_id
from .records import Session, Stream

__all__ = ["CursorIndex"]

SessionKey = tuple[str, "str | None", "str | None"]


def session_key(server: str, session_id: str | None, path: str | None) -> SessionKey:
    """Where a session is kept: sessionless streams share ids per URL path,
    not per origin."""
    return (server, session_id, None if session_id is not None else path)


def _ids(indexed: str | tuple[str, ...]) -> tuple[str, ...]:
    return (indexed,) if isinstance(indexed, str) else indexed


class CursorIndex:
    """The tracked streams and sessions, and the cursors that name them."""

    def __init__(
        self,
        max_streams: int,
        parse: Callable[[str | None], EventId | None] = parse_event_id,
    ) -> None:
        self.max_streams = max(1, max_streams)
        self.parse = parse  # the tracker's: a declared id scheme, if any
        self.evicted_streams = 0
        self.evicted_sessions = 0
        # Plain dicts in LRU order, oldest first (an OrderedDict costs ~60
        # bytes more per entry): a use moves an entry to the end by deleting
        # and re-inserting it.  Dropping the oldest skips the holes deleted
        # entries leave at the front, fewer than a resize of the dict leaves.
        self.streams: dict[int, Stream] = {}
        self.sessions: dict[SessionKey, Session] = {}
        # event id -> the stream (of any server), or {key: stream} for several, whose
        # last received or consumed event it is, most recent last: the cursors
        # a client may present on reconnect.  Several when sessions count their
        # ids separately.  Brought up to date only where it is read (a new
        # stream, an eviction): per event, a stream is just marked dirty.
        self.cursors: dict[str, Stream | dict[int, Stream]] = {}
        self.dirty: list[Stream] = []
        # Streams being read through a feed: folded in (by the tracker)
        # before a cursor lookup, and never evicted while read.
        self.fed: dict[int, Stream] = {}

    def session(self, server: str, session_id: str | None, path: str | None = None) -> Session:
        """The session's record, made if new; to the newest end."""
        key = (server, session_id, None if session_id is not None else path)  # (session_key)
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = Session(
                server, session_id, history_lost=self.evicted_sessions > 0
            )
            if len(self.sessions) > self.max_streams:
                del self.sessions[next(iter(self.sessions))]
                self.evicted_sessions += 1
        else:
            self.sessions[key] = self.sessions.pop(key)
        return session

    def find_session(
        self, server: str, session_id: str | None, path: str | None = None
    ) -> Session | None:
        """The session's record if it is kept; its LRU place unchanged."""
        return self.sessions.get(session_key(server, session_id, path))

    def bind(self, stream: Stream, session_id: str) -> None:
        """``stream`` turns out to belong to ``session_id`` (the legacy
        transport names it in its ``endpoint`` event): what its session
        record held so far goes to that session's."""
        old = stream.session
        stream.session = new = self.session(stream.server, session_id)
        if old.pending:
            if new.pending is None:
                new.pending = {}
            new.pending.update(old.pending)
        if old.ops:
            if new.ops is None:
                new.ops = {}
            new.ops.update(old.ops)
        new.seen.merge(old.seen)

    def admit(self, stream: Stream) -> None:
        """A new stream is tracked; past ``max_streams``, the least recently
        used is dropped (never one being read, while others can go)."""
        streams = self.streams
        streams[stream.key] = stream
        skipped = 0
        while len(streams) > self.max_streams:
            key = next(iter(streams))
            if streams[key].feed is not None and skipped < len(self.fed):
                # Being read, whatever its place from the last fold says.
                streams[key] = streams.pop(key)
                skipped += 1
                continue
            dropped = streams.pop(key)
            self.evicted_streams += 1
            dropped.session.history_lost = True
            if dropped.feed is not None:
                dropped.feed = None
                self.fed.pop(dropped.key, None)
            for event_id in _ids(dropped.indexed):
                self.unindex(dropped, event_id)
            dropped.indexed = ()

    def flush(self) -> None:
        """Bring the cursor index and the LRU order up to date with the
        streams that received or consumed events since the last flush."""
        dirty = self.dirty
        streams = self.streams
        while dirty:
            stream = dirty.pop()
            stream.dirty = False
            if stream.taken:  # (Stream.settle, written out: once per stream a flush)
                stream.take()
            if streams.get(stream.key) is not stream:
                continue  # evicted: its cursors are gone with it
            streams[stream.key] = streams.pop(stream.key)  # to the newest end
            received, consumed = stream.last_received, stream.last_consumed
            wanted: str | tuple[str, ...]
            if received is None:
                wanted = ()
            elif consumed is None or consumed == received:
                wanted = received  # one id, the common case: no tuple for it
            else:
                wanted = (consumed, received)
            if wanted == stream.indexed:
                continue
            kept = (wanted,) if isinstance(wanted, str) else wanted
            indexed = stream.indexed
            for event_id in (indexed,) if isinstance(indexed, str) else indexed:
                if event_id not in kept:
                    self.unindex(stream, event_id)
            cursors = self.cursors
            for event_id in kept:
                if event_id not in cursors:  # (``index``'s first case, written out)
                    cursors[event_id] = stream
                else:
                    self.index(stream, event_id)
            stream.indexed = wanted

    # The index is keyed by the event id alone (a tuple with the server cost
    # 56 bytes per stream); its owners are filtered by server on lookup.

    def index(self, stream: Stream, event_id: str) -> None:
        key = event_id
        owners = self.cursors.get(key)
        if owners is None:
            self.cursors[key] = stream
        elif isinstance(owners, Stream):
            if owners is not stream:
                self.cursors[key] = {owners.key: owners, stream.key: stream}
        else:
            owners.pop(stream.key, None)
            owners[stream.key] = stream

    def unindex(self, stream: Stream, event_id: str) -> None:
        key = event_id
        owners = self.cursors.get(key)
        if owners is stream:
            del self.cursors[key]
        elif isinstance(owners, dict):
            owners.pop(stream.key, None)
            if len(owners) == 1:  # back to the common case: one owner, no dict
                self.cursors[key] = next(iter(owners.values()))

    def owner(
        self, server: str, cursor: str, session_id: str | None, path: str | None = None
    ) -> Stream | None:
        """The stream whose cursor this is, bound to the session it was
        issued in; None where it is not tracked or not provably that one."""
        owners = self.cursors.get(cursor)
        if owners is None:
            return self.behind(server, cursor, session_id)
        candidates = [owners] if isinstance(owners, Stream) else list(owners.values())
        # A stream without a session issued its ids for its URL path only.
        candidates = [
            stream
            for stream in candidates
            if stream.server == server
            and (stream.session.session_id is not None or stream.path == path)
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
            named = self.sessions.get(session_key(server, session_id, None))
            if named is None:
                if self.evicted_sessions:
                    return None  # it may have been dropped with its streams
            elif named.history_lost or cursor in named.seen:
                return None
        return candidates[-1]

    def behind(self, server: str, cursor: str, session_id: str | None) -> Stream | None:
        """The stream of the named session whose end is past ``cursor``, an
        id the session provably saw (in its seen window) that is no stream's
        last: a client behind what was read for it (a proxy reads on after
        its client's leg is cut).  Bound only where one lineage could have
        issued it: the session's streams that received events, less those
        whose last id orders before the cursor under the session's counting
        scheme, all of one lineage (a stream and its resumes); its most
        recent stream, as for a cursor that is a stream's last.  Else None:
        the resume stays unverifiable rather than bound by a guess."""
        if session_id is None:
            return None  # a sessionless id binds to no session's history
        session = self.sessions.get(session_key(server, session_id, None))
        if session is None or session.history_lost or cursor not in session.seen:
            return None
        parse = self.parse
        parsed = parse(cursor)
        at = corroborated(parsed, session.seen) if parsed is not None else None
        found: Stream | None = None
        for stream in self.streams.values():  # least recently used first
            last = stream.last_received
            if stream.session is not session or last is None or last == cursor:
                continue
            if at is not None:
                end = parse(last)
                if end is not None and compare_event_ids(at, end) == 1:
                    continue  # ended before the cursor: not where it was issued
            if found is not None and found.lineage != stream.lineage:
                return None  # two streams could have issued it
            found = stream
        return found
