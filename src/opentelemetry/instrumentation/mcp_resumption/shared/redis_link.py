# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The link to one Redis: the connection, bounded operations, the breaker and
the writer thread, whatever is written or read through it.

``RedisLink`` is a base of ``redis_state.RedisStore``, read alone; it knows
no record and no ledger.  It holds:

* the client (one connection pool): every operation bounded by ``TIMEOUT``
  (the connect and each reply), redis-py's own retries off;
* the breaker (``shared_state.Breaker``): after a failure Redis is skipped
  for ``COOLDOWN``; each operation that fell back is counted through
  ``on_fallback(operation, reason)`` (``OPERATIONS``, ``REASONS``), the
  first of an episode is logged, and its end;
* the writer thread: one daemon thread that drains a bounded queue
  (``QUEUE``; past it the oldest item is dropped, counted) ``BATCH`` items
  per round trip, so no write ever blocks the caller; the store says what a
  batch writes (``_write``) and when the thread must wake with nothing
  queued (``_due``);
* the generic hooks the proxy (``mcp-resumption-proxy``) uses for its own
  keys on the same pool, thread and breaker: ``key``, ``key_hash``,
  ``submit`` (queued writes) and ``call`` (a bounded read or write now).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from .shared_state import Breaker, SharedRecord, keyed_hash

__all__ = [
    "BATCH", "COOLDOWN", "KEY_PREFIX", "OPERATIONS", "PASSWORD_VARIABLES", "QUEUE", "REASONS",
    "TIMEOUT", "RedisLink",
]

# The store's logger: its faults are logged under the store's name.
# The logger the docs name (the store's, before the modules had folders).
_logger = logging.getLogger("opentelemetry.instrumentation.mcp_resumption.redis_state")

# Every key of the shared state (the records', the ledger's, the proxy's) is
# under it.
KEY_PREFIX = "mcpres:v1"

TIMEOUT = 0.05  # s, each Redis operation (connect, reply)
COOLDOWN = 1.0  # s the breaker skips Redis after a failure
QUEUE = 1024  # items waiting to be written; past it the oldest is dropped (counted)
BATCH = 64  # items per round trip
# The standard places for a password when the URL has none: redis-cli's, then
# the common container images'.
PASSWORD_VARIABLES = ("REDISCLI_AUTH", "REDIS_PASSWORD")

# What each fallback is counted by (a bounded set: the metric's attribute).
OPERATIONS = ("read", "write")
REASONS = ("timeout", "connection", "full", "breaker_open", "queue_full", "error")


def _reason(error: BaseException) -> str:
    import redis.exceptions as errors

    if isinstance(error, errors.TimeoutError):
        return "timeout"
    if isinstance(error, errors.ConnectionError):
        return "connection"
    if type(error).__name__ == "OutOfMemoryError" or (
        isinstance(error, errors.ResponseError) and "maxmemory" in str(error)
    ):
        return "full"
    return "error"


class RedisLink:
    """One Redis, its breaker and its writer thread (a base of ``RedisStore``)."""

    def __init__(
        self,
        url: str,
        key: bytes,
        on_fallback: Callable[[str, str], None] = lambda operation, reason: None,
        *,
        timeout: float = TIMEOUT,
        cooldown: float = COOLDOWN,
    ) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        password = None
        if not urlsplit(url).password:
            password = next(
                (os.environ[name] for name in PASSWORD_VARIABLES if os.environ.get(name)), None
            )
        options = {"password": password} if password else {}
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # One try: the breaker, not redis-py, decides when to try again.
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
            **options,
        )
        self._key = key
        self._on_fallback = on_fallback
        self._breaker = Breaker(cooldown)
        self._breaker_lock = threading.Lock()
        # What the writer thread writes: records, the in-flight ledger's
        # operations, the proxy's own writes ("call", write); see the store.
        self._queue: collections.deque[SharedRecord | tuple] = collections.deque()
        self._wake = threading.Condition()
        self._closed = False
        self._writing = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        # Counted, for the tests and the docs' cost table: round trips made.
        self.reads = 0
        self.writes = 0

    # ------------------------------------------------------------ the store's

    def _write(self, batch: list[SharedRecord | tuple]) -> None:
        """Write one batch from the queue, in one round trip (the writer thread)."""
        raise NotImplementedError

    def _due(self) -> float | None:
        """Seconds until the writer must wake with nothing queued; None: never."""
        return None

    def _forked(self) -> None:
        """A forked child drops what its parent held (the queue is dropped here)."""

    def _closing(self) -> None:
        """The last items to queue before the writer thread stops."""

    # ------------------------------------------------------------ faults

    def _allowed(self, operation: str) -> bool:
        with self._breaker_lock:
            allowed = self._breaker.allows()
        if not allowed:
            self._on_fallback(operation, "breaker_open")
        return allowed

    def _failed(self, operation: str, error: BaseException) -> None:
        reason = _reason(error)
        with self._breaker_lock:
            started = self._breaker.failed()
        self._on_fallback(operation, reason)
        if started:
            _logger.warning(
                "mcp-resumption: the shared state in Redis failed (%s: %s); resumes are judged "
                "from this process's memory until it answers again",
                reason,
                type(error).__name__,
            )

    def _succeeded(self) -> None:
        with self._breaker_lock:
            ended = self._breaker.succeeded()
        if ended:
            _logger.warning("mcp-resumption: the shared state in Redis answers again")

    @property
    def episodes(self) -> int:
        return self._breaker.episodes

    # ------------------------------------------------------------ the proxy's

    def key_hash(self, text: str) -> str:
        """``text`` under the shared key, as keys name it."""
        return keyed_hash(self._key, text)

    def key(self, kind: str, *parts: str) -> str:
        """A key of the proxy's (``mcp-resumption-proxy``: its downstream
        cursors, its resumable buffers), every part the keyed hash: no raw
        session id, cursor or server is ever part of a key."""
        return ":".join([KEY_PREFIX, kind, *(keyed_hash(self._key, part) for part in parts)])

    def submit(self, write: Callable[[Any], None]) -> None:
        """Queue ``write(pipeline)`` for the writer thread, in the round trip
        of whatever else is queued; never blocks, never raises."""
        self._enqueue(("call", write))

    def call(self, operation: Callable[[Any], Any], kind: str = "read") -> Any:
        """``operation(client)`` now, on the caller's thread: bounded by the
        timeout and behind the breaker; ``None`` when it fell back (counted
        as ``kind``)."""
        if not self._allowed(kind):
            return None
        try:
            if kind == "read":
                self.reads += 1
            else:
                self.writes += 1
            result = operation(self._client)
        except Exception as error:  # any fault of the store: memory goes on
            self._failed(kind, error)
            return None
        self._succeeded()
        return result

    # ------------------------------------------------------------ the writer thread

    def _enqueue(self, item: SharedRecord | tuple) -> None:
        if self._closed:
            return
        with self._wake:
            if len(self._queue) >= QUEUE:
                self._queue.popleft()
                self._on_fallback("write", "queue_full")
            self._queue.append(item)
            self._start()
            self._wake.notify()

    def _start(self) -> None:
        if os.getpid() != self._pid:  # a forked child: its own thread, no inherited queue
            self._pid = os.getpid()
            self._thread = None
            self._queue.clear()
            self._forked()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="mcp-resumption-state-writer", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    due = self._due()
                    if due == 0.0:
                        break
                    self._wake.wait(due)
                if self._closed and not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                self._writing = True
            try:
                self._write(batch)
            finally:
                with self._wake:
                    self._writing = False
                    self._wake.notify_all()

    def flush(self, timeout: float = 1.0) -> bool:
        """Wait until every queued item is written (or dropped), at most
        ``timeout`` s: the tests, and the exit, wait for an event this way."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while self._queue or self._writing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        return True

    def close(self) -> None:
        """Write what is queued (bounded, with what ``_closing`` adds), then
        stop the thread and close the connections."""
        if self._closed:
            return
        if self._thread is not None:
            self._closing()
        self.flush(timeout=4 * TIMEOUT * max(1, len(self._queue) // BATCH))
        with self._wake:
            self._closed = True
            self._queue.clear()
            self._wake.notify_all()
        with contextlib.suppress(Exception):  # closing a broken connection: nothing to do
            self._client.close()
