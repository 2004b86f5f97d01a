# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Reports that must not be made where they arise: inside a garbage collection.

The cyclic garbage collector finalises an abandoned SSE iterator at whatever
allocation triggers it, also one made while this thread holds a lock of the
tracker, of the event totals or of the OpenTelemetry SDK.  The iterator's
finalizer reports the stream's end, and that report takes those locks: done
there, it would wait for ever on a lock its own thread holds.  So a report
made during a collection is only queued (an append, which takes no lock), and
is made later by a worker thread, or by the next request, which must see it
before it opens a stream.
"""

from __future__ import annotations

import collections
import gc
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

_logger = logging.getLogger(__name__)

# Threads inside a collection right now (tested for emptiness before
# ``collecting()`` is called: a report pays no call).  A set of ints: the GC callback
# runs on every collection, so it must be cheap and allocate little.
collecting_threads: set[int] = set()


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        collecting_threads.add(threading.get_ident())
    else:
        collecting_threads.discard(threading.get_ident())


def collecting() -> bool:
    """Whether this thread is inside a garbage collection (so in a finalizer)."""
    return bool(collecting_threads) and threading.get_ident() in collecting_threads


if _on_collection not in gc.callbacks:
    gc.callbacks.append(_on_collection)


class Deferred:
    """Calls queued where nothing may block, made where something may."""

    def __init__(self) -> None:
        # The queue and the worker are tested by the owner before it calls
        # ``run()`` or ``start()``: a request pays no call when there is
        # nothing to run and the worker runs.
        self.calls: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            collections.deque()
        )
        # SimpleQueue.put is documented as safe in finalizers and signal handlers.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.worker: threading.Thread | None = None
        self._closed = False

    def put(self, call: Callable[..., Any], *args: Any) -> None:
        """Queue ``call(*args)``.  Takes no lock and starts no thread."""
        self.calls.append((call, args))
        self._wake.put(None)

    def run(self) -> None:
        """Make every queued call, in order.  Only where blocking is safe."""
        if not self.calls:
            return
        with self._lock:  # so that a caller returns only once every call was made
            while self.calls:
                call, args = self.calls.popleft()
                try:
                    call(*args)
                except Exception:  # a deferred report must not kill the worker
                    _logger.debug("a deferred report failed", exc_info=True)

    def start(self) -> None:
        """Start the worker, if it is not running (a forked child has none)."""
        if self._closed or self.worker is not None:
            return
        self.worker = threading.Thread(
            target=self._work, name="mcp-resumption-deferred", daemon=True
        )
        self.worker.start()

    def close(self) -> None:
        self._closed = True
        self.run()
        self._wake.put(None)
        join_worker(self.worker)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self.worker = None

    def _work(self) -> None:
        while not self._closed:
            self._wake.get()
            self.run()


def join_worker(worker: threading.Thread | None) -> None:
    """Wait for a woken worker to end, so that an uninstrument leaves no thread
    behind it; bounded, as a report it is making may wait on the SDK."""
    if worker is not None and worker is not threading.current_thread():
        worker.join(JOIN_SECONDS)


JOIN_SECONDS = 2.0
