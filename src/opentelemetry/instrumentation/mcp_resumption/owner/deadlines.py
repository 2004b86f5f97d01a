# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The confirmation-window timer: one daemon thread for every deadline.

A timer thread per resume would not survive hundreds of concurrent streams.
A deadline is a heap entry ``[when, order, callback]``; cancelling one
clears its callback, so a cancel takes no lock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from ..forks import renew_after_fork
from .deferral import join_worker

_logger = logging.getLogger(__name__)


class Deadlines:
    """One daemon thread that fires confirmation-window timeouts."""

    def __init__(self) -> None:
        self._heap: list[list] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._order = itertools.count()
        self._closed = False
        renew_after_fork(self)

    def _after_fork(self) -> None:
        # The child has none of the parent's threads: a condition another
        # thread held at the fork would never be released, and the parent's
        # deadlines are the parent's to decide.
        self._cv = threading.Condition()
        self._heap = []
        self._thread = None

    def add(self, delay: float, callback: Callable[[], None]) -> list:
        entry = [time.monotonic() + delay, next(self._order), callback]
        with self._cv:
            if self._closed:
                return entry
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="mcp-resumption-deadlines", daemon=True
                )
                self._thread.start()
            self._cv.notify()
        return entry

    @staticmethod
    def cancel(entry: list | None) -> None:
        if entry is not None:
            entry[2] = None

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify()
            thread = self._thread
        join_worker(thread)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(timeout)
                if self._closed:
                    return
                _, _, callback = heapq.heappop(self._heap)
            if callback is not None:
                try:
                    callback()
                except Exception:  # never let the timer thread die
                    _logger.debug("confirmation timeout callback failed", exc_info=True)
