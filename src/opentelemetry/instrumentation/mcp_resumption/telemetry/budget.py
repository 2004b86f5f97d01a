# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""How many log lines a key (a gap kind or an outcome, and a server) may
still write: a server answering thousands of unknown ids, or a client
resuming every second, would otherwise write a line each time.  A burst,
then one per interval; the metrics count everything.  Unlocked: a race lets
one more through."""

from __future__ import annotations

import time


class LogBudget:
    BURST = 10
    INTERVAL = 6.0  # seconds per line after the burst

    def __init__(self, max_keys: int = 1024) -> None:
        self._max_keys = max_keys
        self._left: dict[tuple[str, str], tuple[float, float]] = {}

    def take(self, key: tuple[str, str]) -> bool:
        now = time.monotonic()
        tokens, at = self._left.get(key, (self.BURST, now))
        tokens = min(self.BURST, tokens + (now - at) / self.INTERVAL)
        if len(self._left) >= self._max_keys and key not in self._left:
            self._left.clear()
        if tokens < 1:
            self._left[key] = (tokens, now)
            return False
        self._left[key] = (tokens - 1, now)
        return True
