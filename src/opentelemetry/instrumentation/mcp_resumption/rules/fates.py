# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The fate of every broken JSON-RPC request.

Pure: standard library only; the tracker calls it under its lock and passes
the time in, so it can be read and tested alone.

A request is *broken* when the stream that was to carry its answer ends
without it, by a connection error or EOF (a server closing a polling stream
that the client then resumes has not broken it).  Each broken request gets
exactly one fate, whichever comes first:

* ``answered``: its answer arrives, on a resumed stream or any other of its
  session;
* ``reissued``: the client sends the same method with the same params (by
  JSON meaning, ``_meta`` ignored: the MCP SDKs put the request id there as
  ``progressToken``) under a new id to the same server;
* ``lost``: neither, by the end of the *reissue window* after the client
  stopped waiting for it (nothing could resume it, or its lineage ended),
  when its session is closed, or when the process exits.  A lost request is
  the ``orphaned_request`` gap.

With shared state, a fourth outcome that is no fate of this process's:
``elsewhere``, a request another process took over (it resumed the broken
stream from this one's record) and decides; never counted here, so that the
fleet counts each request once.

Nothing is predicted: a request whose answer arrives is answered, whatever
else went wrong on its stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from . import continuity
from .continuity import Gap
from .jsonrpc import Call

__all__ = ["Broken", "BrokenLedger", "Decided", "Fate"]

# Broken requests awaiting a fate, at most: a client that breaks more
# streams than this without ever deciding one is counted lost, oldest first.
MAX_BROKEN = 4096


class Fate(str, Enum):
    ANSWERED = "answered"
    REISSUED = "reissued"
    LOST = "lost"
    # Decided by another process of a shared state: not counted here.
    ELSEWHERE = "elsewhere"


@dataclass(eq=False)
class Broken:
    """One broken request awaiting its fate."""

    key: str  # the request id, as the ledger keys it
    method: str
    call: int | None  # digest of (method, params without _meta); None: unknown
    server: str
    session: Any  # the tracker's session record: answers are matched within it
    transport: str
    # The stream whose resume attempt closes once this is decided (None: no
    # attempt waits for it); ``tag``: the caller's own record of the break.
    holder: Any = None
    tag: Any = None
    # When the client stopped waiting (the reissue window runs from there);
    # None while a resume may still bring the answer.
    stopped_at: float | None = None
    why: str = "the client stopped waiting"
    # False: recorded when a resume could no longer answer it, its stream
    # having ended without a break (a poll): answered, it was never broken.
    broke: bool = True
    tool: str | None = None  # the tool a tools/call names


@dataclass(frozen=True)
class Decided:
    broken: Broken
    fate: Fate
    gap: Gap | None = None  # the orphaned_request gap of a lost request
    # Of a re-issue: the key of the request that re-issued it, whether the
    # server declared the tool safe to run twice ("true", "false",
    # "unknown"), and whether its first attempt may have run as well.
    by: str | None = None
    idempotent: str | None = None
    may_run_twice: bool = False

    @property
    def counted(self) -> bool:
        """Whether this is a broken request's fate: a request a poll's resume
        could not answer, which was answered after all, never broke."""
        if self.fate is Fate.ELSEWHERE:
            return False
        return self.broken.broke or self.fate is not Fate.ANSWERED


class BrokenLedger:
    """The broken requests still awaiting a fate; not thread-safe on its own."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, str], Broken] = {}
        # server -> entries there: what a request to that server may re-issue
        # (read as it is, without a call, as each request is sent; empty
        # exactly when the ledger is)
        self.awaited_servers: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._entries)

    def entries(self) -> list[Broken]:
        return list(self._entries.values())

    def awaits(self, server: str) -> bool:
        """Whether a request to ``server`` may re-issue a broken one."""
        return server in self.awaited_servers

    def entry(self, session: Any, key: str) -> Broken | None:
        return self._entries.get((id(session), key))

    def broke(self, broken: Broken) -> list[Decided]:
        """Record a break; an entry already there (the same request broken
        again on a resumed stream) keeps its place.  Returns the oldest
        entries decided lost if the ledger is full."""
        index = (id(broken.session), broken.key)
        if index in self._entries:
            return []
        decided = []
        while len(self._entries) >= MAX_BROKEN:
            oldest = next(iter(self._entries.values()))
            decided.append(self._decide(oldest, Fate.LOST, "the tracker's bound was reached"))
        self._entries[index] = broken
        self.awaited_servers[broken.server] = self.awaited_servers.get(broken.server, 0) + 1
        return decided

    def stop(self, session: Any, keys: Iterable[str], now: float, why: str, holder: Any) -> bool:
        """The client stopped waiting for these requests on their lineage;
        ``holder``, if given, is the attempt that closes with them.  Whether
        any window started."""
        started = False
        for key in keys:
            broken = self._entries.get((id(session), key))
            if broken is None:
                continue
            if holder is not None:
                broken.holder = holder
            if broken.stopped_at is None:
                broken.stopped_at = now
                broken.why = why
                started = True
        return started

    def answered(self, session: Any, keys: Iterable[str]) -> list[Decided]:
        found = []
        for key in keys:
            broken = self._entries.get((id(session), key))
            if broken is not None:
                found.append(self._decide(broken, Fate.ANSWERED))
        return found

    def reissued(self, server: str, session: Any, calls: Iterable[Call]) -> list[Decided]:
        """``calls``: requests just sent to ``server`` in ``session``.  Each
        re-issues the oldest broken request of that server with the same
        call under another id (or session)."""
        found = []
        for call in calls:
            if call.digest is None:
                continue
            for broken in self._entries.values():
                if (
                    broken.server == server
                    and broken.call == call.digest
                    and (broken.key != call.key or broken.session is not session)
                ):
                    found.append(self._decide(broken, Fate.REISSUED, by=call.key))
                    break
        return found

    def due_entries(self, now: float, window: float) -> list[Broken]:
        """Requests whose reissue window has passed, not yet decided."""
        return [
            broken
            for broken in self._entries.values()
            if broken.stopped_at is not None and now - broken.stopped_at >= window
        ]

    def due(
        self, now: float, window: float, elsewhere: frozenset[tuple[int, str]] = frozenset()
    ) -> list[Decided]:
        """Requests whose reissue window has passed: lost, but those
        ``elsewhere`` names (``(id(session), key)``: taken over by another
        process)."""
        return [
            self._lost_unless(broken, elsewhere, broken.why)
            for broken in self.due_entries(now, window)
        ]

    def session_closed(self, session: Any, why: str) -> list[Decided]:
        return [
            self._decide(broken, Fate.LOST, why)
            for broken in list(self._entries.values())
            if broken.session is session
        ]

    def unreadable(self, session: Any) -> list[Decided]:
        """An event of ``session`` that may carry answers could not be read
        (too large, not JSON): the broken requests still waited for there
        count as answered, as a loss that cannot be shown is not reported."""
        return [
            self._decide(broken, Fate.ANSWERED)
            for broken in list(self._entries.values())
            if broken.session is session and broken.stopped_at is None
        ]

    def all_lost(
        self, why: str, elsewhere: frozenset[tuple[int, str]] = frozenset()
    ) -> list[Decided]:
        return [self._lost_unless(broken, elsewhere, why) for broken in self.entries()]

    def _lost_unless(
        self, broken: Broken, elsewhere: frozenset[tuple[int, str]], why: str
    ) -> Decided:
        taken = (id(broken.session), broken.key) in elsewhere
        return self._decide(broken, Fate.ELSEWHERE if taken else Fate.LOST, why)

    def stop_held(self, holder: Any, now: float) -> bool:
        """The stream ``holder`` ended: the requests its attempt waited for
        on it wait no longer."""
        started = False
        for broken in self._entries.values():
            if broken.holder is holder and broken.stopped_at is None:
                broken.stopped_at = now
                started = True
        return started

    def holds(self, holder: Any) -> bool:
        """Whether the attempt ``holder`` still waits for a fate."""
        return any(broken.holder is holder for broken in self._entries.values())

    def _decide(
        self, broken: Broken, fate: Fate, why: str = "", by: str | None = None
    ) -> Decided:
        del self._entries[(id(broken.session), broken.key)]
        left = self.awaited_servers[broken.server] - 1
        if left:
            self.awaited_servers[broken.server] = left
        else:
            del self.awaited_servers[broken.server]
        # Through the module: the rules can be swapped there (the mutation tests).
        rule = continuity.orphaned_request_rule
        gap = rule(broken.key, broken.method, why) if fate is Fate.LOST else None
        return Decided(broken, fate, gap, by=by)
