# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The request side: what the client sent, and what its answers end.

Pure: standard library only, and not thread-safe on its own (the tracker
calls it under its lock).

* ``Requests``: the JSON-RPC requests POSTed in a session, as its record
  (``records.Session``) keeps them: the ids sent (for ``foreign_replay``),
  the requests in flight (``pending``) and their operations, which an
  answer or a fate ends, for the caller to time (``operations_done``).
* ``Reissues``: what a re-issue is judged with and watched for: the
  ``tools/list`` hints of each server (which tools it declared safe to run
  twice), and each re-issued call watched for both answers, its first
  attempt's and its re-issue's (both answered: it ran twice).

Which broken request a re-issue repeats, and its fate, is ``fates``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from ..rules.fates import Broken, Decided, Fate
from ..rules.jsonrpc import (
    EVENTS_POLL,
    EVENTS_STREAM,
    LISTEN,
    TOOL_FAILED,
    TOOLS_CALL,
    answer_errors,
    tool_hints_in,
)
from ..rules.subscriptions import SubscriptionLedger
from .records import Session

__all__ = [
    "CANCELS_ON_DISCONNECT", "FATE_ERRORS", "MAX_HINTED_SERVERS", "MAX_REQUESTS",
    "MAX_WATCHED_REISSUES", "SENT_TRIM", "SENT_WINDOW", "Reissues", "Requests",
]

MAX_REQUESTS = 256  # in-flight JSON-RPC requests remembered per session
SENT_WINDOW = 512  # request ids remembered per session (at least), for foreign_replay
# A session that sent more keeps them in a list, trimmed by this many at a
# time: one copy per SENT_TRIM requests, not a copy of the window per request.
SENT_TRIM = 64
_SENT_AS_TUPLE = 16
# Servers whose tools/list hints are kept, and re-issues watched for a second
# answer of the first attempt (the oldest dropped first).
MAX_HINTED_SERVERS = 256
MAX_WATCHED_REISSUES = 1024
# The first revision whose servers MUST take a closed response stream for
# cancellation; before it a disconnect SHOULD NOT be (2025-11-25), so the
# first attempt of a re-issued call may run on.  Dates order as strings.
CANCELS_ON_DISCONNECT = "2026-07-28"
# error.type of an operation ended by its fate rather than by an answer
# (values of ours: the conventions have none for a call that broke).
FATE_ERRORS = {Fate.REISSUED: "reissued", Fate.LOST: "orphaned_request"}

Operation = tuple[str, str, Any, "str | None"]


class Requests:
    """The requests sent in each session, in flight and timed."""

    def __init__(self, subscriptions: SubscriptionLedger) -> None:
        # A listen request re-listens a lost subscription of its server.
        self.subscriptions = subscriptions
        # Operations ended by an answer or a fate, until the caller takes them
        # (``take_operations``); a list its readers test without the lock.
        self.operations_done: list[Operation] = []

    def sent(
        self,
        session: Session,
        requests: Iterable[tuple[str, str]] | None,
        operation: Any = None,
    ) -> None:
        """Requests POSTed in ``session``; ``None``: a body that was not
        read, so the ledger no longer knows every request of the session."""
        if requests is None:
            session.ledger_unknown = True
            return
        for key, method in requests:
            if method == LISTEN:
                if self.subscriptions:
                    self.subscriptions.listened(session.server)
            elif method == EVENTS_STREAM:
                pass  # a push stream: no operation to time, nor an answer awaited
            elif operation is not None:  # a subscription is no operation to time
                if session.ops is None:
                    session.ops = {}
                if len(session.ops) < MAX_REQUESTS:
                    session.ops[key] = (method, operation)
            if method in (EVENTS_POLL, EVENTS_STREAM):
                # Resumed with its cursor, which the events' room judges: never
                # a lost call, a not_resumable break or an orphaned_request.
                pass
            elif session.pending is None:
                session.pending = {key: (method, None)}
            elif len(session.pending) < MAX_REQUESTS:
                session.pending[key] = (method, None)
            if session.fated is not None:  # an id used again: a request of its own
                session.fated.pop(key, None)
            sent = session.sent
            if sent is None:
                session.sent = (key,)
            elif type(sent) is tuple and len(sent) < _SENT_AS_TUPLE:
                session.sent = (*sent, key)
            else:
                if type(sent) is tuple:
                    sent = session.sent = list(sent)
                sent.append(key)
                if len(sent) > SENT_WINDOW + SENT_TRIM:
                    del sent[:SENT_TRIM]
                    session.ledger_unknown = True

    def answered_ops(self, session: Session, keys: Iterable[str], data: str) -> None:
        """The operations these answers end, with each one's error.type, for
        the caller to take (a list, not a Step: one answer per request, and
        a Step is the dearer record)."""
        ops = session.ops
        failed = None
        for key in keys:
            op = ops.pop(key, None)
            if op is not None:
                if failed is None:
                    # (``answer_errors``' own test first, written out: most
                    # answers hold no error, and pay no call)
                    if '"error"' in data or TOOL_FAILED.search(data):
                        failed = answer_errors(data)
                    else:
                        failed = {}
                self.operations_done.append((op[0], key, op[1], failed.get(key)))
        if not ops:
            session.ops = None

    def fated(self, decided: Decided) -> None:
        """A broken request's fate ends its operation, unless an answer read
        ended it already."""
        broken = decided.broken
        ops = broken.session.ops
        op = ops.pop(broken.key, None) if ops else None
        if op is not None and decided.fate is not Fate.ELSEWHERE:  # its operation is theirs
            error = None if decided.fate is Fate.ANSWERED else FATE_ERRORS[decided.fate]
            self.operations_done.append((op[0], broken.key, op[1], error))

    def take_operations(self) -> list[Operation]:
        # Emptied in place: the tracker hands this very list to the monitor,
        # which tests it after each report without a call.
        done = self.operations_done[:]
        self.operations_done.clear()
        return done


class _Reissue:
    """A re-issued call watched for both answers: its first attempt's (which
    a resumed stream may still bring) and the re-issue's."""

    __slots__ = ("answered", "broken", "indexes")

    def __init__(self, broken: Broken, indexes: tuple[tuple[int, str], tuple[int, str]]) -> None:
        self.broken = broken
        self.indexes = indexes  # (first attempt, re-issue) as Reissues.watched keys them
        self.answered = [False, False]


class Reissues:
    """The tools/list hints a re-issue is judged by, and the re-issues
    watched for a second answer."""

    def __init__(self) -> None:
        # server -> tool name -> declared safe to run twice, from the last
        # tools/list answers read from it.
        self.tool_hints: dict[str, dict[str, bool]] = {}
        # (id(session), request key) -> the re-issue it takes part in (the
        # first attempt's or the re-issue's key): both answered, it ran twice.
        self.watched: dict[tuple[int, str], _Reissue] = {}
        # Re-issued calls proven to have run twice, until the caller takes them.
        self.ran_twice: list[Broken] = []

    def judge(self, decided: Decided, session: Session, protocol_version: str | None) -> Decided:
        """Whether the server declared the re-issued tool safe to run twice,
        and whether its first attempt may have run anyway; the pair is then
        watched for both answers."""
        broken = decided.broken
        if broken.method != TOOLS_CALL:
            idempotent = "true"  # every other request of a client only reads or sets
        else:
            hints = self.tool_hints.get(broken.server)
            declared = hints.get(broken.tool) if hints and broken.tool is not None else None
            idempotent = "unknown" if declared is None else "true" if declared else "false"
        cancels = protocol_version is not None and protocol_version >= CANCELS_ON_DISCONNECT
        may_run_twice = idempotent != "true" and not cancels
        if decided.by is not None:
            first, again = (id(broken.session), broken.key), (id(session), decided.by)
            watch = _Reissue(broken, (first, again))
            self.watched[first] = self.watched[again] = watch
            while len(self.watched) > 2 * MAX_WATCHED_REISSUES:
                del self.watched[next(iter(self.watched))]
        return replace(decided, idempotent=idempotent, may_run_twice=may_run_twice)

    def answers_seen(self, session: Session, keys: Iterable[str]) -> None:
        """Answers to these requests of ``session`` arrived: a re-issued call
        whose first attempt and re-issue are both answered ran twice."""
        for key in keys:
            watch = self.watched.get((id(session), key))
            if watch is None:
                continue
            watch.answered[watch.indexes.index((id(session), key))] = True
            if all(watch.answered):
                self.ran_twice.append(watch.broken)
                for index in watch.indexes:
                    self.watched.pop(index, None)

    def remember_hints(self, server: str, answer: str | bytes) -> None:
        """The tools/list hints of an answer from ``server`` (pages add up)."""
        hints = tool_hints_in(answer)
        if hints is None:
            return
        known = self.tool_hints.pop(server, None)  # to the newest end
        if known is None:
            known = {}
            while len(self.tool_hints) >= MAX_HINTED_SERVERS:
                del self.tool_hints[next(iter(self.tool_hints))]
        known.update(hints)  # pages of one list add up
        self.tool_hints[server] = known

    def take_ran_twice(self) -> list[Broken]:
        found = self.ran_twice[:]
        self.ran_twice.clear()  # in place: the tracker hands out this list
        return found
