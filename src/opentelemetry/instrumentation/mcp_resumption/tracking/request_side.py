# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The tracker's API for the request side: requests sent, cancelled and
re-issued, JSON answers read, and the fates, operations and subscriptions
their answers or deadlines decide.

Pure: standard library only.  ``RequestSide`` is a base of
``tracker.Tracker``, read alone: each method takes the tracker's one lock
and composes the rooms the tracker made (``index``, ``requests``,
``reissues``, ``breaks``, ``broken``, ``subscriptions``); the stream side
(streams opened, their events, their ends) is the tracker's own.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from ..rules.jsonrpc import calls_in, cancelled_in, responses_in
from .records import NOTHING, Step

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ..rules.fates import Broken, BrokenLedger
    from ..rules.subscriptions import LostSubscription, SubscriptionLedger
    from .breaks import Breaks
    from .cursors import CursorIndex
    from .requests import Operation, Reissues, Requests
    from .sharing import Sharing

__all__ = ["RequestSide"]


class RequestSide:
    """The request side of the tracker's API (a base of ``Tracker``)."""

    _lock: threading.Lock
    index: CursorIndex
    requests: Requests
    reissues: Reissues
    breaks: Breaks
    broken: BrokenLedger
    subscriptions: SubscriptionLedger
    sharing: Sharing

    # Operations ended by an answer or a fate, not taken yet, and re-issued
    # calls proven to have run twice, not taken yet: the rooms' own lists
    # (emptied in place), read without the lock and without a call, as a
    # test whether to take them after each report.
    operations_done: list[Operation]
    ran_twice_found: list[Broken]

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
            done = self.operations_done[:]  # (``Requests.take_operations``)
            self.operations_done.clear()
            return done

    @property
    def watches_reissues(self) -> bool:
        return bool(self.reissues.watched)

    def take_ran_twice(self) -> list[Broken]:
        """Re-issued calls proven to have run twice since the last call."""
        with self._lock:
            return self.reissues.take_ran_twice()

    def subscriptions_due(self, window: float) -> list[LostSubscription]:
        """Lost subscriptions whose re-listen window has passed: counted now."""
        with self._lock:
            return self.subscriptions.due(time.monotonic(), window)

    def fates_due(self, window: float) -> Step:
        """Broken requests whose reissue window has passed are lost (but
        those another process took over, with shared state)."""
        now = time.monotonic()
        elsewhere = self._taken_elsewhere(lambda: self.broken.due_entries(now, window))
        with self._lock:
            return self.breaks.fated(self.broken.due(now, window, elsewhere))

    def all_lost(self, why: str) -> Step:
        """The client stops waiting for everything (the process exits): its
        broken requests are lost (but those another process took over), and
        so are the subscriptions still open."""
        elsewhere = self._taken_elsewhere(self.broken.entries, at_exit=True)
        with self._lock:
            return self.breaks.all_lost(self.index.streams.values(), why, elsewhere)

    def _taken_elsewhere(
        self, pick: Callable[[], list[Broken]], at_exit: bool = False
    ) -> frozenset[tuple[int, str]]:
        """Of the broken requests ``pick`` names (under the lock), those
        another process of the shared state took over, asked of the store
        outside the lock (one bounded round trip; none with the memory
        store); ``at_exit``: and those a proxy of a fleet leaves to it."""
        store = self.sharing.store
        if not store.shared:
            return frozenset()
        with self._lock:
            picked = pick()
            if not picked:
                return frozenset()
            asked = [(b.server, self.sharing.session_hash(b.session), b.key) for b in picked]
        kept = store.keep_at_exit(asked) if at_exit else []
        kept_set = frozenset(kept)
        left = [i for i in range(len(asked)) if i not in kept_set]
        taken = [left[i] for i in store.fates_elsewhere([asked[i] for i in left])] if left else []
        return frozenset((id(picked[i].session), picked[i].key) for i in (*kept, *taken))

    def all_subscriptions_due(self) -> list[LostSubscription]:
        """Every lost subscription still waiting: counted now (the exit)."""
        with self._lock:
            return self.subscriptions.all_due()

    def take_overflow(self) -> list[LostSubscription]:
        """Lost subscriptions counted early, the ledger being full."""
        with self._lock:
            return self.breaks.take_overflow()
