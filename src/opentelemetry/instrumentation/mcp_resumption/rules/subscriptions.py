# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Lost subscriptions (2026-07-28's ``subscriptions/listen``).

Pure: standard library only; the tracker calls it under its lock and passes
the time in.

A ``subscriptions/listen`` request is a subscription, never a call: its
stream stays open for change notifications, and nothing the client awaits
is lost when it ends.  It ends one of three ways:

* *graceful*: the server's result, its close on purpose;
* *local*: the client ended it (left its ``listen`` block, or cancelled the
  request by closing the stream, which is how 2026-07-28 cancels);
* *lost*: anything else: the stream broke, or the process ended with it
  open.  Every change notification from then until the next listen is gone,
  and the cure is to re-listen and refetch.

Only *lost* is recorded here.  Each lost subscription waits one window for
the client to re-listen to the same server, and is then counted once, with
whether it did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Lost subscriptions awaiting their window, at most: beyond it the oldest is
# counted at once (without waiting for a re-listen).
MAX_WAITING = 1024


@dataclass(eq=False)
class LostSubscription:
    key: str  # the listen request's id, as the tracker keys it
    server: str
    transport: str
    notifications: str  # the filter it held (jsonrpc.listen_filter)
    lost_at: float
    why: str
    relistened: bool = False
    tag: Any = None  # the caller's record of the stream that lost it


class SubscriptionLedger:
    """Lost subscriptions waiting to see whether the client re-listens;
    not thread-safe on its own."""

    def __init__(self) -> None:
        self._waiting: list[LostSubscription] = []

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def lost(self, subscription: LostSubscription) -> list[LostSubscription]:
        """Record a loss; returns the oldest ones counted at once if full."""
        self._waiting.append(subscription)
        overflow = len(self._waiting) - MAX_WAITING
        if overflow <= 0:
            return []
        counted, self._waiting = self._waiting[:overflow], self._waiting[overflow:]
        return counted

    def listened(self, server: str) -> None:
        """A listen request went to ``server``: it re-listens the oldest
        subscription lost there that no listen has answered yet."""
        for subscription in self._waiting:
            if subscription.server == server and not subscription.relistened:
                subscription.relistened = True
                return

    def due(self, now: float, window: float) -> list[LostSubscription]:
        """Subscriptions whose window has passed: counted now."""
        counted = [s for s in self._waiting if now - s.lost_at >= window]
        if counted:
            self._waiting = [s for s in self._waiting if now - s.lost_at < window]
        return counted

    def all_due(self) -> list[LostSubscription]:
        counted, self._waiting = self._waiting, []
        return counted
