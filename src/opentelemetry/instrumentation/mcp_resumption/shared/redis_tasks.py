# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The tasks handed to the fleet, in Redis: a process that exits while it
follows tasks leaves each for the next process that polls it (a restarted
client that kept its task ids), and one task nobody followed in time is
counted ``abandoned`` once, by one process of the fleet.

``TaskHandover`` is a base of ``redis_state.RedisStore``, read alone, on the
client, queue, breaker and writer thread of its other base
(``redis_link.RedisLink``).  The callers' side only queues (``hold_task``,
``release_task``, ``hand_over``, ``adopt``, ``sweep_tasks``); the writer
thread makes every round trip.

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

from ..rules.task_handover import HandedTask, abandon_due
from .redis_link import KEY_PREFIX, TIMEOUT
from .shared_state import SharedRecord, keyed_hash

__all__ = ["HAND_OVER_WAIT", "HELD_LIFE", "MAX_SWEPT_TASKS", "HandOver", "TaskHandover"]

MAX_SWEPT_TASKS = 1000  # index entries one sweep reads
# How long the exit waits for its hand-over to be written before it counts
# the tasks abandoned itself (as without shared state).
HAND_OVER_WAIT = 4 * TIMEOUT
# A held task's record (and the index) lives this many TTLs (a day): a task
# followed longer has no record left, and its process's crash is not counted.
HELD_LIFE = 24
# An index entry of a held task: this prefix, then its process (the writer,
# whose lease key is ``mcpres:v1:w:<writer>``); a handed task's is its
# abandon time.
HELD = "w:"
# Holds and releases a failed round trip keeps for the next (a release lost
# would leave a counted task for the fleet to count abandoned again).
MAX_HELD_RETRIED = 1024

# KEYS: the task's record, the index.  ARGV: the index field, "now" (epoch
# s) for a sweep ("" for a follower: taken whenever it is there), the lease
# keys' prefix.  A sweep takes only a handed task whose abandon time has
# passed; a held task only a follower takes, once its process's lease
# lapsed (the process is gone), never one whose process follows it still.
_TAKE = """
local raw = redis.call('GET', KEYS[1])
local due = redis.call('HGET', KEYS[2], ARGV[1])
if due and string.sub(due, 1, 2) == 'w:' then
  if ARGV[2] ~= '' or redis.call('EXISTS', ARGV[3] .. string.sub(due, 3)) == 1 then
    return false
  end
elseif ARGV[2] ~= '' and raw and due and tonumber(due) and tonumber(due) > tonumber(ARGV[2]) then
  return false
end
redis.call('HDEL', KEYS[2], ARGV[1])
if not raw then
  return false
end
redis.call('DEL', KEYS[1])
return raw
"""

# A held task's fate was counted by its process.  KEYS: the record, the
# index.  ARGV: the index field, the entry.  Out, unless another process
# holds it now (it adopted it: then it is that one's to release).
_RELEASE = """
local entry = redis.call('HGET', KEYS[2], ARGV[1])
if entry and entry ~= ARGV[2] and string.sub(entry, 1, 2) == 'w:' then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1])
return 1
"""

# A held task whose process's lease lapsed becomes a handed one (once: only
# while the entry still names that process).  KEYS: the record, the index.
# ARGV: the index field, the entry, the record as handed, its life, its
# abandon time.
_LAPSED = """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3], 'EX', tonumber(ARGV[4]))
redis.call('HSET', KEYS[2], ARGV[1], ARGV[5])
return 1
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
    _held_tasks: set[str]
    _leased_at: float
    _mine: dict[str, set[str]]
    writer: str

    def _init_tasks(self, on_abandoned: Callable[[str, HandedTask], None]) -> None:
        client = self._client
        self._take_script = client.register_script(_TAKE)
        self._release_script = client.register_script(_RELEASE)
        self._lapsed_script = client.register_script(_LAPSED)
        self._task_sweep_at = None
        # The index fields of the tasks held here (the writer thread's): while
        # there are any, the process's lease is renewed.
        self._held_tasks = set()
        self._held_retry: list[tuple] = []
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

    def _lease_key(self, writer: str) -> str:
        return f"{KEY_PREFIX}:w:{writer}"

    def _held_life(self) -> int:
        return HELD_LIFE * self._ttl

    # ------------------------------------------------------------ the callers'

    def hand_over(self, tasks: list[tuple[str, str, HandedTask]]) -> HandOver:
        """Leave these open tasks (server, task id, facts) to the fleet
        (queued); the outcome says whether they were written."""
        outcome = HandOver()
        self._enqueue(("tasks", tasks, outcome))
        return outcome

    def hold_task(self, server: str, task_id: str, facts: HandedTask) -> None:
        """A task's handle came (or it was adopted): its record, under this
        process's lease, so that the fleet counts it if the process dies
        before its fate (queued: a SET, an HSET and an EXPIRE)."""
        self._enqueue(("hold", server, task_id, facts))

    def release_task(self, server: str, task_id: str) -> None:
        """A held task's fate was counted here: its record out (queued: one
        script call)."""
        self._enqueue(("release", server, task_id))

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
        pipe.expire(index, self._held_life())
        self._held_tasks.clear()  # handed: no lease needed for them any more
        return True

    def _held_ops(self, pipe: Any, item: tuple) -> None:
        """A task held or released, into ``pipe``."""
        record, field = self._task_keys(item[1], item[2])
        entry = HELD + self.writer
        if item[0] == "hold":
            # Plain commands, no script: no script to load in the round trip
            # of a handle.  Every writer sets the index's life to the same
            # span, so an EXPIRE only ever lengthens it.
            self._held_tasks.add(field)
            life = self._held_life()
            pipe.set(record, item[3].encode(), ex=life)
            pipe.hset(self._index(), field, entry)
            pipe.expire(self._index(), life)
        else:
            self._held_tasks.discard(field)
            self._release_script(keys=[record, self._index()], args=[field, entry], client=pipe)

    def _held_again(self, batch: list) -> list:
        """The holds and releases a failed round trip kept, before ``batch``."""
        if not self._held_retry:
            return batch
        again, self._held_retry = self._held_retry, []
        return [*again, *batch]

    def _held_unwritten(self, batch: list) -> None:
        """The round trip failed: its holds and releases go with the next."""
        kept = [op for op in batch if isinstance(op, tuple) and op[0] in ("hold", "release")]
        if kept:
            self._held_retry = kept[-MAX_HELD_RETRIED:]

    def _lease_tasks(self, pipe: Any, batch: list) -> None:
        """The lease, first in the round trip, while tasks are held here or
        one is about to be (never a record without its lease), unless the
        in-flight ledger renews it at the end of this one."""
        if self._mine:
            return
        if self._held_tasks or any(isinstance(op, tuple) and op[0] == "hold" for op in batch):
            pipe.set(self._lease_key(self.writer), 1, px=max(1, int(self._lease * 1000)))
            self._leased_at = time.monotonic()

    def _takes(self, takes: list[tuple]) -> None:
        """Each follower's take, one script call each (after the batch)."""
        index = self._index()
        while takes:
            _, server, task_id, taken = takes[0]
            record, field = self._task_keys(server, task_id)
            found = self._take_script(
                keys=[record, index], args=[field, "", self._lease_key("")]
            )
            takes.pop(0)
            taken(HandedTask.decode(found))

    def _sweep_tasks(self) -> None:
        """Take, once for the fleet, each handed task whose abandon time
        passed, and count it abandoned; make each held task of a process
        whose lease lapsed a handed one; come back at the next abandon time,
        or after a lease while other processes hold tasks."""
        self._task_sweep_at = None
        client = self._client
        index = self._index()
        _, found = client.hscan(index, 0, count=MAX_SWEPT_TASKS)
        now = time.time()
        later: list[float] = []
        held: dict[str, str] = {}
        script = self._take_script
        for raw_field, raw_due in list(found.items())[:MAX_SWEPT_TASKS]:
            field = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
            entry = raw_due.decode() if isinstance(raw_due, bytes) else str(raw_due)
            if entry.startswith(HELD):
                if entry != HELD + self.writer:
                    held[field] = entry
                continue
            try:
                due = float(entry)
            except (TypeError, ValueError):
                due = now
            if due > now:
                later.append(due)
                continue
            facts = HandedTask.decode(
                script(
                    keys=[f"{KEY_PREFIX}:t:{field}", index],
                    args=[field, repr(now), self._lease_key("")],
                )
            )
            if facts is not None:
                self._on_abandoned(field.partition(":")[2], facts)
        if held:
            later += self._lapsed(held, now)
        if later:
            self._task_sweep_at = time.monotonic() + max(0.0, min(later) - now)

    def _lapsed(self, held: dict[str, str], now: float) -> list[float]:
        """Of the tasks other processes hold (index field -> entry), those
        whose process's lease lapsed handed over, as its exit would have
        (abandoned at their abandon time, counted from now); the times to
        come back at."""
        client = self._client
        writers = sorted(set(held.values()))
        pipe = client.pipeline(transaction=False)
        for entry in writers:
            pipe.exists(self._lease_key(entry[len(HELD):]))
        alive = {entry for entry, live in zip(writers, pipe.execute()) if live}
        later = [now + self._lease] if alive else []
        lapsed = [(field, entry) for field, entry in held.items() if entry not in alive]
        if not lapsed:
            return later
        index = self._index()
        pipe = client.pipeline(transaction=False)
        for field, _ in lapsed:
            pipe.get(f"{KEY_PREFIX}:t:{field}")
        records = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for (field, entry), raw in zip(lapsed, records):
            record = f"{KEY_PREFIX}:t:{field}"
            facts = HandedTask.decode(raw)
            if facts is None:  # expired, or not ours to read: nothing to count
                self._release_script(keys=[record, index], args=[field, entry], client=pipe)
                continue
            facts.handed_at = now
            due = abandon_due(facts, self._lease, self._ttl)
            life = max(1, math.ceil(due - now) + self._ttl)
            self._lapsed_script(
                keys=[record, index], args=[field, entry, facts.encode(), life, repr(due)],
                client=pipe,
            )
            later.append(due)
        pipe.execute()
        return later
