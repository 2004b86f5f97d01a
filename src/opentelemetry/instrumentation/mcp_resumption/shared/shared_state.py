# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What a resume needs of the stream that issued its cursor, as a record
another process can read: the shared state's pure half.

Pure: standard library only, no OpenTelemetry and no Redis client, so the
record, its bounds and its encoding can be read and tested alone.  The
tracker writes a ``SharedRecord`` when a stream ends and reads one only
where its own index misses a cursor (``Tracker.open_stream``); where it is
kept is a *store*'s business:

* ``MemoryStore``: the default, no store at all (every lookup misses,
  every save is dropped): the tracker's memory is all there is, as before.
* ``redis_state.RedisStore``: Redis 6+ or Valkey, shared by every process
  configured with the same URL and key.

Nothing here holds a raw session id.  A record names its session by the
keyed hash (``keyed_hash``, the telemetry's hash under the shared key), and
the event ids it keeps (which may embed the session id, ``s-77:e-104``) have
that id replaced by a placeholder; a reader that presents the session id
whose hash matches gets the ids back as they were (``SharedRecord.ids_for``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "MAX_PENDING",
    "MEMORY",
    "UNKNOWN_SESSION",
    "Breaker",
    "MemoryStore",
    "SharedRecord",
    "Store",
    "keyed_hash",
]

# Requests in flight kept per record: a stream answers a few; a bound keeps
# a hostile or broken peer from making a record large.
MAX_PENDING = 64
# Event ids in the seen window kept per record (records.SEEN_WINDOW's size).
MAX_SEEN = 16
# Where a session id was inside a kept event id: a control character an SSE
# id never holds in practice (the parser keeps it, so it cannot be forged
# into a match of a different session: the hash must match first).
_PLACEHOLDER = "\x01session\x01"
# Session ids shorter than this are replaced only as a whole token (the
# redaction's rule): "7" must not be cut out of "e-107".
_MIN_ANYWHERE = 8
# The stand-in session id of a restored stream whose session this process
# never saw (only its hash is known): printable, and never a real one.
UNKNOWN_SESSION = "unknown-session:"
# Record format; a reader skips records of another version (a fleet that
# runs two versions of the plugin during a deploy degrades to unverifiable,
# never to a wrong verdict).
VERSION = 1


def keyed_hash(key: bytes, text: str) -> str:
    """The telemetry's session hash (``redaction.Redaction``) under ``key``:
    HMAC-SHA256, 16 hex digits.  The same function names sessions, servers
    and cursors in the store's keys, so no raw id is ever a key."""
    digest = hmac.new(key, text.encode("utf-8", "replace"), hashlib.sha256)
    return digest.hexdigest()[:16]


def _hide(event_id: str, session_id: str | None) -> str:
    if not session_id or session_id not in event_id:
        return event_id
    if len(session_id) >= _MIN_ANYWHERE:
        return event_id.replace(session_id, _PLACEHOLDER)
    token = rf"(?<![A-Za-z0-9]){re.escape(session_id)}(?![A-Za-z0-9])"
    return re.sub(token, _PLACEHOLDER, event_id)


def _show(event_id: str, session_id: str | None) -> str | None:
    if _PLACEHOLDER not in event_id:
        return event_id
    # Without the session id the id cannot be restored: the reader did not
    # present the session the record was written in.
    return event_id.replace(_PLACEHOLDER, session_id) if session_id else None


@dataclass
class SharedRecord:
    """One ended stream, as a resume of its cursor in another process needs
    it: its session (hashed), its last received and consumed ids, its
    lineage's polling state, the session's seen window (ids and digests),
    and the requests it was to answer (key -> method), still in flight."""

    server: str
    session_hash: str | None  # None: a stream without a session (its path scopes it)
    path: str | None
    transport: str
    last_received: str | None
    last_consumed: str | None
    seen: list[tuple[str, int | None]] = field(default_factory=list)
    meanings: dict[str, int | None] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    unconsumed_responses: tuple[str, ...] = ()
    primed: bool = False
    retry_ms: int | None = None
    server_closed: bool = False
    # Which process wrote it, and when (wall clock: another host reads it).
    writer: str = ""
    at: float = 0.0
    # The cursors as the server sent them, to key the record by (hashed by
    # the store); never encoded: a reader knows the cursor it looks up.
    raw_cursors: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        *,
        server: str,
        session_id: str | None,
        session_hash: str | None,
        path: str | None,
        transport: str,
        last_received: str | None,
        last_consumed: str | None,
        seen: Iterable[tuple[str, int | None]],
        meanings: dict[str, int | None] | None,
        pending: Iterable[tuple[str, str]],
        unconsumed_responses: Iterable[str],
        primed: bool,
        retry_ms: int | None,
        server_closed: bool,
        writer: str,
    ) -> SharedRecord:
        """A record with every id the session names hidden, and bounded."""

        def hide(event_id: str | None) -> str | None:
            return None if event_id is None else _hide(event_id, session_id)

        # The ids only: a digest is the writer's hash() of the event's data,
        # salted per process (PYTHONHASHSEED), so another process could only
        # misread it as other data (an id_reused that never was).  Kept as
        # markers, the ids still show whether the scheme counts.
        seen = [(event_id, None) for event_id, _ in list(seen)[-MAX_SEEN:]]
        pending = list(pending)[:MAX_PENDING]
        return cls(
            server=server,
            session_hash=session_hash,
            path=path,
            transport=transport,
            last_received=hide(last_received),
            last_consumed=hide(last_consumed),
            seen=[(_hide(event_id, session_id), digest) for event_id, digest in seen],
            # The meanings are hash()es too (see the seen window above).
            meanings={},
            pending=dict(pending),
            unconsumed_responses=tuple(unconsumed_responses)[:MAX_PENDING],
            primed=primed,
            retry_ms=retry_ms,
            server_closed=server_closed,
            writer=writer,
            at=time.time(),
            raw_cursors=tuple(sorted({last_received, last_consumed} - {None})),  # type: ignore[arg-type]
        )

    def cursors(self) -> tuple[str, ...]:
        """The ids (as hidden) a client may present to resume this stream."""
        ids = {self.last_received, self.last_consumed} - {None}
        return tuple(sorted(ids))  # type: ignore[arg-type]

    def session_in(self, cursor: str, hash_of: Callable[[str], str | None]) -> str | None:
        """The session id embedded in ``cursor``, where the record's kept id
        holds it (``s-77:e-104``) and its hash is the record's: a client
        presents its session in the cursor even when it names no session."""
        for kept in self.cursors():
            if _PLACEHOLDER not in kept:
                continue
            head, _, tail = kept.partition(_PLACEHOLDER)
            if _PLACEHOLDER in tail or not (cursor.startswith(head) and cursor.endswith(tail)):
                continue
            candidate = cursor[len(head) : len(cursor) - len(tail)]
            if candidate and hash_of(candidate) == self.session_hash:
                return candidate
        return None

    def ids_for(self, session_id: str | None) -> SharedRecord | None:
        """This record with its ids as the server sent them, for a reader
        that knows the session id (its hash matched); ``None`` for one that
        does not while an id needs it."""
        restored_seen = []
        for event_id, digest in self.seen:
            shown = _show(event_id, session_id)
            if shown is None:
                return None
            restored_seen.append((shown, digest))
        received = None if self.last_received is None else _show(self.last_received, session_id)
        consumed = None if self.last_consumed is None else _show(self.last_consumed, session_id)
        if (self.last_received is not None and received is None) or (
            self.last_consumed is not None and consumed is None
        ):
            return None
        meanings = {}
        for key, value in self.meanings.items():
            shown = _show(key, session_id)
            if shown is not None:
                meanings[shown] = value
        copy = SharedRecord(**{**self.__dict__})
        copy.seen, copy.last_received, copy.last_consumed = restored_seen, received, consumed
        copy.meanings = meanings
        return copy

    def as_of(self, cursor: str) -> SharedRecord:
        """This stream as a client that got it up to ``cursor`` saw it (a
        proxy read it further than its client got): ``cursor`` its last
        received and consumed id, the seen window cut after it, and nothing
        of what came after it (the requests it answered later are not known
        to be in flight: the restored session counts its ledger unknown)."""
        copy = SharedRecord(**{**self.__dict__})
        copy.last_received = copy.last_consumed = cursor
        ids = [event_id for event_id, _ in self.seen]
        if cursor in ids:
            copy.seen = self.seen[: ids.index(cursor) + 1]
        copy.pending = {}
        copy.unconsumed_responses = ()
        copy.server_closed = False
        return copy

    def encode(self) -> bytes:
        document = {
            "v": VERSION,
            "server": self.server,
            "session": self.session_hash,
            "path": self.path,
            "transport": self.transport,
            "received": self.last_received,
            "consumed": self.last_consumed,
            "seen": self.seen,
            "meanings": self.meanings,
            "pending": self.pending,
            "unconsumed": list(self.unconsumed_responses),
            "primed": self.primed,
            "retry": self.retry_ms,
            "server_closed": self.server_closed,
            "writer": self.writer,
            "at": self.at,
        }
        return json.dumps(document, separators=(",", ":")).encode("utf-8", "surrogatepass")

    @classmethod
    def decode(cls, raw: bytes | str | None) -> SharedRecord | None:
        """The record in ``raw``; ``None`` for nothing, another version, or
        anything that is not a record (a store is shared: never trusted)."""
        if not raw:
            return None
        try:
            document = json.loads(raw)
            if not isinstance(document, dict) or document.get("v") != VERSION:
                return None
            seen = [
                (str(event_id), None if digest is None else int(digest))
                for event_id, digest in document.get("seen") or []
            ][-MAX_SEEN:]
            pending = {
                str(key): str(method)
                for key, method in list((document.get("pending") or {}).items())[:MAX_PENDING]
            }
            retry = document.get("retry")
            return cls(
                server=str(document["server"]),
                session_hash=_optional(document.get("session")),
                path=_optional(document.get("path")),
                transport=str(document["transport"]),
                last_received=_optional(document.get("received")),
                last_consumed=_optional(document.get("consumed")),
                seen=seen,
                meanings={
                    str(k): None if v is None else int(v)
                    for k, v in (document.get("meanings") or {}).items()
                },
                pending=pending,
                unconsumed_responses=tuple(
                    str(key) for key in (document.get("unconsumed") or [])[:MAX_PENDING]
                ),
                primed=bool(document.get("primed")),
                retry_ms=None if retry is None else int(retry),
                server_closed=bool(document.get("server_closed")),
                writer=str(document.get("writer") or ""),
                at=float(document.get("at") or 0.0),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def _optional(value: Any) -> str | None:
    return None if value is None else str(value)


class Store(Protocol):
    """Where records are shared.  ``shared``: False for the memory store, so
    the tracker skips building records that nobody would read."""

    shared: bool

    def session_hash(self, session_id: str | None) -> str | None: ...

    def lookup(
        self, server: str, cursor: str, session_hash: str | None = None
    ) -> SharedRecord | None: ...

    def save(self, record: SharedRecord) -> None: ...

    def in_flight(
        self, server: str, session_hash: str | None, requests: list[tuple[str, str]],
        transport: str,
    ) -> None: ...

    def settled(
        self, server: str, session_hash: str | None, keys: list[str], writer: str | None = None
    ) -> None: ...

    def sweep(self, server: str) -> None: ...

    def took_over(self, server: str, session_hash: str | None, keys: list[str]) -> None: ...

    def fates_elsewhere(self, requests: list[tuple[str, str | None, str]]) -> Iterable[int]: ...

    def hand_over(self, tasks: list[tuple[str, str, Any]]) -> Any: ...

    def adopt(self, server: str, task_id: str, taken: Callable[[Any], None]) -> None: ...

    def sweep_tasks(self) -> None: ...

    def hold_task(self, server: str, task_id: str, facts: Any) -> None: ...

    def release_task(self, server: str, task_id: str) -> None: ...

    def close(self) -> None: ...


class MemoryStore:
    """No store: the tracker's memory is all there is (the default)."""

    shared = False
    writer = ""

    def session_hash(self, session_id: str | None) -> str | None:
        return None

    def lookup(
        self, server: str, cursor: str, session_hash: str | None = None
    ) -> SharedRecord | None:
        return None

    def save(self, record: SharedRecord) -> None:
        return None

    def in_flight(
        self, server: str, session_hash: str | None, requests: list[tuple[str, str]],
        transport: str,
    ) -> None:
        return None

    def settled(
        self, server: str, session_hash: str | None, keys: list[str], writer: str | None = None
    ) -> None:
        return None

    def sweep(self, server: str) -> None:
        return None

    def took_over(self, server: str, session_hash: str | None, keys: list[str]) -> None:
        return None

    def fates_elsewhere(self, requests: list[tuple[str, str | None, str]]) -> Iterable[int]:
        return ()

    # Tasks are handed to no one here: the exit counts them abandoned itself.
    def hand_over(self, tasks: list[tuple[str, str, Any]]) -> Any:
        return None

    def adopt(self, server: str, task_id: str, taken: Callable[[Any], None]) -> None:
        taken(None)

    def sweep_tasks(self) -> None:
        return None

    def hold_task(self, server: str, task_id: str, facts: Any) -> None:
        return None

    def release_task(self, server: str, task_id: str) -> None:
        return None

    def close(self) -> None:
        return None


MEMORY = MemoryStore()


class Breaker:
    """After a failed operation the store is skipped for ``cooldown``
    seconds (then one operation tries again): a Redis that is down or slow
    costs each caller at most one bounded timeout per cooldown.  An
    *episode* runs from the first failure to the next success: the caller
    logs once per episode (``failed`` says when one starts)."""

    def __init__(self, cooldown: float = 1.0) -> None:
        self.cooldown = cooldown
        self.open_until = 0.0
        self.in_episode = False
        self.episodes = 0

    def allows(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.open_until

    def failed(self, now: float | None = None) -> bool:
        """A failure: the breaker opens; True if it starts an episode."""
        self.open_until = (time.monotonic() if now is None else now) + self.cooldown
        if self.in_episode:
            return False
        self.in_episode = True
        self.episodes += 1
        return True

    def succeeded(self) -> bool:
        """A success: True if it ends an episode."""
        self.open_until = 0.0
        ended, self.in_episode = self.in_episode, False
        return ended
