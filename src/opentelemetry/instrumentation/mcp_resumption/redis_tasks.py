# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The tasks handed to the fleet, in Redis: a process that exits while it
follows tasks leaves each for the next process that polls it (a restarted
client that kept its task ids), and one task nobody followed in time is
counted ``abandoned`` once, by one process of the fleet.

``TaskHandover`` is a base of ``redis_state.RedisStore``, read alone, on the
client, queue, breaker and writer thread of its other base
(``redis_link.RedisLink``).  The callers' side only queues (``hand_over``,
``adopt``, ``sweep_tasks``); the writer thread makes every round trip.

One process holds a handed task at a time: it is *taken* by one script (the
record read and deleted, its index entry removed), by the process that polls
it (which follows it to its fate and counts that) or by the sweep that finds
it due (which counts it ``abandoned``).  A second taker finds nothing: the
fate is counted once for the fleet, as the ``SET NX`` claim of a dead
process's request is.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .redis_link import KEY_PREFIX, TIMEOUT
from .shared_state import SharedRecord, keyed_hash
from .task_handover import HandedTask, abandon_due

__all__ = ["HAND_OVER_WAIT", "MAX_SWEPT_TASKS", "HandOver", "TaskHandover"]

MAX_SWEPT_TASKS = 1000  # index entries one sweep reads
# How long the exit waits for its hand-over to be written before it counts
# the tasks abandoned itself (as without shared state).
HAND_OVER_WAIT = 4 * TIMEOUT

# KEYS: the task's record, the index.  ARGV: the index field, and "now"
# (epoch s) for a sweep ("" for a follower: taken whenever it is there).  A
# sweep takes only a task whose abandon time has passed.
_TAKE = """
local raw = redis.call('GET', KEYS[1])
if ARGV[2] ~= '' and raw then
  local due = redis.call('HGET', KEYS[2], ARGV[1])
  if due and tonumber(due) > tonumber(ARGV[2]) then
    return false
  end
end
redis.call('HDEL', KEYS[2], ARGV[1])
if not raw then
  return false
end
redis.call('DEL', KEYS[1])
return raw
"""


class HandOver:
    """The outcome of an exit's hand-over: written, failed, or withdrawn by
    the exit that stopped waiting for it (then it is never written)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.state = "queued"  # writing, written, failed, withdrawn

    def begin(self) -> bool:
        with self._lock:
            if self.state != "queued":
                return False
            self.state = "writing"
            return True

    def settle(self, written: bool) -> None:
        with self._lock:
            if self.state in ("queued", "writing"):
                self.state = "written" if written else "failed"
        self._done.set()

    def written(self, timeout: float) -> bool:
        """Whether the tasks reached Redis within ``timeout`` s; if not, they
        are withdrawn (unless a round trip is carrying them: then its bounded
        end is awaited), and the caller counts them itself."""
        self._done.wait(timeout)
        with self._lock:
            if self.state == "queued":
                self.state = "withdrawn"
                return False
            writing = self.state == "writing"
        if writing:
            self._done.wait(2 * TIMEOUT)
        return self.state == "written"


class TaskHandover:
    """The handed tasks' part of the Redis store (a base of ``RedisStore``)."""

    _client: Any
    _key: bytes
    _ttl: int
    _lease: float
    _task_sweep_at: float | None
    _take_script: Any
    _on_abandoned: Callable[[str, HandedTask], None]

    def _init_tasks(self, on_abandoned: Callable[[str, HandedTask], None]) -> None:
        self._take_script = self._client.register_script(_TAKE)
        self._task_sweep_at = None
        # (task hash, facts): a handed task this process counts abandoned.
        self._on_abandoned = on_abandoned

    # The store's own, reached through ``self``.
    def _enqueue(self, item: SharedRecord | tuple) -> None:
        raise NotImplementedError

    def _task_keys(self, server: str, task_id: str) -> tuple[str, str]:
        field = f"{keyed_hash(self._key, server)}:{keyed_hash(self._key, task_id)}"
        return f"{KEY_PREFIX}:t:{field}", field

    @staticmethod
    def _index() -> str:
        return f"{KEY_PREFIX}:th"

    # ------------------------------------------------------------ the callers'

    def hand_over(self, tasks: list[tuple[str, str, HandedTask]]) -> HandOver:
        """Leave these open tasks (server, task id, facts) to the fleet
        (queued); the outcome says whether they were written."""
        outcome = HandOver()
        self._enqueue(("tasks", tasks, outcome))
        return outcome

    def adopt(self, server: str, task_id: str, taken: Callable[[HandedTask | None], None]) -> None:
        """Take the task if another process handed it over (queued): then
        ``taken(facts)`` on the writer thread, else ``taken(None)``."""
        self._enqueue(("take", server, task_id, taken))

    def sweep_tasks(self) -> None:
        """Look for handed tasks nobody followed in time (queued)."""
        self._enqueue(("tasks_sweep",))

    # ------------------------------------------------------------ the writer thread's

    def _hand_over_ops(self, pipe: Any, item: tuple) -> bool:
        """The records and index entries of one hand-over, into ``pipe``;
        False if the exit withdrew it."""
        tasks, outcome = item[1], item[2]
        if not outcome.begin():
            return False
        index = self._index()
        for server, task_id, facts in tasks:
            due = abandon_due(facts, self._lease, self._ttl)
            record, field = self._task_keys(server, task_id)
            # Kept an hour past its abandon time: a sweep then still finds it.
            life = max(1, math.ceil(due - time.time()) + self._ttl)
            pipe.set(record, facts.encode(), ex=life)
            pipe.hset(index, field, repr(due))
        pipe.expire(index, 3 * self._ttl)
        return True

    def _takes(self, takes: list[tuple]) -> None:
        """Each follower's take, one script call each (after the batch)."""
        index = self._index()
        while takes:
            _, server, task_id, taken = takes[0]
            record, field = self._task_keys(server, task_id)
            found = self._take_script(keys=[record, index], args=[field, ""])
            takes.pop(0)
            taken(HandedTask.decode(found))

    def _sweep_tasks(self) -> None:
        """Take, once for the fleet, each handed task whose abandon time
        passed, and count it abandoned; come back at the next one's."""
        self._task_sweep_at = None
        client = self._client
        index = self._index()
        _, found = client.hscan(index, 0, count=MAX_SWEPT_TASKS)
        now = time.time()
        later: list[float] = []
        script = self._take_script
        for raw_field, raw_due in list(found.items())[:MAX_SWEPT_TASKS]:
            field = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
            try:
                due = float(raw_due)
            except (TypeError, ValueError):
                due = now
            if due > now:
                later.append(due)
                continue
            facts = HandedTask.decode(
                script(keys=[f"{KEY_PREFIX}:t:{field}", index], args=[field, repr(now)])
            )
            if facts is not None:
                self._on_abandoned(field.partition(":")[2], facts)
        if later:
            self._task_sweep_at = time.monotonic() + (min(later) - now)
