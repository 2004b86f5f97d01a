# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The shared state in Redis 6+ or Valkey (``OTEL_PYTHON_MCP_RESUMPTION_STATE``):
``RedisStore``, the streams' records (saved, looked up by cursor, or as of
an earlier cursor a proxy named), and ``state_store``/``open_store``, which
open it from the settings.

The store has two bases, each in its own module: ``redis_link.RedisLink``
(the connection, bounded operations, the breaker, the writer thread, and
the proxy's own keys, writes and reads on them) and
``redis_ledger.InFlightLedger`` (the requests each process awaits answers
to).  Their names are importable from here too.

No OpenTelemetry here: the owner (``monitor``) hands in ``on_fallback``, which
counts a fallback in its metric.  redis-py is an optional extra
(``state``); ``open_store`` says why it cannot open a store instead of
raising, and the plugin then runs in memory.

Costs and bounds, the reasons for each:

* No call on the per-event path.  Writes go through one daemon thread: a
  stream's end (``save``) appends its record to a bounded queue and returns;
  the thread writes what has queued, many records per round trip.  So no
  write ever blocks the host's event loop.
* One read, only where the tracker's memory misses a cursor (a resume of a
  stream this process never saw): one ``GET``, bounded by the socket
  timeout.
* Every operation is bounded (``TIMEOUT``, 50 ms, for the connect and each
  reply; redis-py's own retries are off), then the breaker (``Breaker``)
  skips Redis for ``COOLDOWN``: a Redis that is down, stopped or full costs
  at most one timeout per cooldown per thread, and the tracker goes on in
  memory.  Each operation that fell back is counted; the first of an
  episode is logged, and its end.
* One stream's update is one Lua script: every key of the record (one per
  cursor it can be resumed with) is set together, so two instances never
  split one stream's history, and an older record never overwrites a newer
  one (the script compares the writers' clocks).
* Every key has a TTL (``TTL``, one hour: a client that resumes later has
  lost its stream on any server that keeps replay buffers less long).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from .. import config
from ..rules.task_handover import HandedTask
from .redis_ledger import InFlightLedger
from .redis_link import (
    BATCH,
    COOLDOWN,
    KEY_PREFIX,
    OPERATIONS,
    PASSWORD_VARIABLES,
    QUEUE,
    REASONS,
    TIMEOUT,
    RedisLink,
)
from .redis_tasks import TaskHandover
from .shared_state import MEMORY, SharedRecord, Store, keyed_hash

__all__ = [
    "BATCH", "COOLDOWN", "IN_FLIGHT_DELAY", "KEY_PREFIX", "LEASE", "OPERATIONS",
    "PASSWORD_VARIABLES", "QUEUE", "REASONS", "TIMEOUT", "TTL", "RedisStore", "open_store",
    "state_store",
]

TTL = 3600  # s, every key
# A process's lease on its in-flight entries: renewed by its writer every
# third of it while it has any; once it lapses the process is gone (killed:
# a clean exit removes its entries) and another may claim them lost.
LEASE = 5.0  # s; the owner sets it to the reissue window (at least 1 s)
# An in-flight entry is written only if its request is still unanswered this
# long after it was sent: most are answered sooner, and cost Redis nothing.
# A process killed sooner than this after sending leaves that request
# uncounted.
IN_FLIGHT_DELAY = 0.25  # s
SESSION_HASH_CACHE = 1024

# KEYS: the record's keys (one per cursor).  ARGV: the record, its TTL, its
# clock.  A key whose record is newer (another instance resumed the stream
# since) keeps it: the newest end of a stream wins, as a whole.
_SAVE = """
local newest = tonumber(ARGV[3])
for i, key in ipairs(KEYS) do
  local at = redis.call('HGET', key, 'at')
  if at and tonumber(at) > newest then
    return 0
  end
end
for i, key in ipairs(KEYS) do
  redis.call('HSET', key, 'record', ARGV[1], 'at', ARGV[3])
  redis.call('EXPIRE', key, tonumber(ARGV[2]))
end
return 1
"""

def state_store(
    settings: config.Settings,
    on_fallback: Callable[[str, str], None],
    on_lost: Callable[[str, str, str], None] | None = None,
    on_abandoned: Callable[[str, HandedTask], None] | None = None,
) -> Store:
    """The store the settings ask for: memory unless a usable Redis URL and
    a shared key are given (one warning, then memory, if not).
    ``on_fallback(operation, reason)``: an operation fell back to memory;
    ``on_lost(server, transport, method)``: a dead process's request was
    claimed here, lost; ``on_abandoned(task hash, facts)``: a task handed to
    the fleet that nobody followed was taken here, abandoned."""
    url = settings.state
    if url is None:
        return MEMORY
    if settings.state_key is None:
        # A random key per process: no other process could find a record.
        config.warn_state(url, f"{config.STATE_KEY} is not set, so no other process could read it")
        return MEMORY
    # A dead process's requests are lost once the reissue window (the
    # confirmation window) has passed: its lease lapses no sooner.
    options: dict[str, Any] = {"lease": max(1.0, settings.confirm_timeout)}
    if on_lost is not None:
        options["on_lost"] = on_lost
    if on_abandoned is not None:
        options["on_abandoned"] = on_abandoned
    store, why = open_store(url, settings.state_key, on_fallback, **options)
    if store is None:
        config.warn_state(url, why or "unknown")
        return MEMORY
    return store


def open_store(
    url: str, key: bytes, on_fallback: Callable[[str, str], None], **options: Any
) -> tuple[RedisStore | None, str | None]:
    """A store on ``url``, or None and why not (the caller warns once)."""
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        return None, f"{url!r} is not a redis://, rediss:// or unix:// URL"
    try:
        import redis  # noqa: F401
    except ImportError:
        return None, (
            "the Redis client is not installed (pip install "
            "'opentelemetry-instrumentation-mcp-resumption[state]')"
        )
    return RedisStore(url, key, on_fallback, **options), None


class RedisStore(RedisLink, InFlightLedger, TaskHandover):
    """Records shared through one Redis; see the module docstring (its
    connection, breaker and writer thread: ``RedisLink``; its in-flight
    ledger: ``InFlightLedger``; the tasks handed to the fleet:
    ``TaskHandover``)."""

    shared = True

    def __init__(
        self,
        url: str,
        key: bytes,
        on_fallback: Callable[[str, str], None] = lambda operation, reason: None,
        *,
        timeout: float = TIMEOUT,
        cooldown: float = COOLDOWN,
        ttl: int = TTL,
        lease: float = LEASE,
        in_flight_delay: float = IN_FLIGHT_DELAY,
        on_lost: Callable[[str, str, str], None] = lambda server, transport, method: None,
        on_abandoned: Callable[[str, HandedTask], None] = lambda task, facts: None,
    ) -> None:
        super().__init__(url, key, on_fallback, timeout=timeout, cooldown=cooldown)
        self._init_tasks(on_abandoned)
        self._save_script = self._client.register_script(_SAVE)
        self._session_hashes: dict[str, str] = {}
        # Cursor -> the hash of the id a proxy's record is under (``alias``).
        self._aliases: dict[str, str] = {}
        self._ttl = ttl
        self._on_lost = on_lost
        # The in-flight ledger: this process's entries (server -> fields),
        # its lease, and the servers to sweep for a dead process's entries
        # (server -> when).
        self._lease = lease
        self._mine: dict[str, set[str]] = {}
        # (server, field) -> (when it is due, (method, transport, time)):
        # entries not written yet; shared with the callers, under ``_wake``.
        self._held: dict[tuple[str, str], tuple[float, tuple[str, str, float]]] = {}
        self._delay = in_flight_delay
        self._leased_at = 0.0
        self._sweeps: dict[str, float] = {}
        self.lost_claimed = 0
        # This process, as records name their writer.
        self.writer = uuid.uuid4().hex[:16]

    # ------------------------------------------------------------ keys

    def session_hash(self, session_id: str | None) -> str | None:
        if session_id is None:
            return None
        # Cached as the redaction caches its hash: a session sends many requests.
        hashed = self._session_hashes.get(session_id)
        if hashed is None:
            if len(self._session_hashes) >= SESSION_HASH_CACHE:
                self._session_hashes.clear()
            hashed = self._session_hashes[session_id] = keyed_hash(self._key, session_id)
        return hashed

    def record_key(self, server: str, cursor: str, session_hash: str | None = None) -> str:
        """Where a record is kept: per server, session and cursor, all hashed
        (an event id may embed the session id); ``-`` for the key of any
        session, which a client that names no session is looked up under.
        Both are written: servers that count ids per session repeat them
        across sessions, and a client that names its session must find its
        own session's record, whichever session wrote the other key last."""
        return (
            f"{KEY_PREFIX}:c:{keyed_hash(self._key, server)}:{session_hash or '-'}:"
            f"{keyed_hash(self._key, cursor)}"
        )

    # ------------------------------------------------------------ reads

    def lookup(
        self, server: str, cursor: str, session_hash: str | None = None
    ) -> SharedRecord | None:
        """The record of the stream that issued ``cursor`` on ``server``, if
        another process (or this one, earlier) wrote it: the named
        session's record first, else any session's; one bounded round trip."""
        if not self._allowed("read"):
            return None
        try:
            self.reads += 1
            keys = [self.record_key(server, cursor)]
            if session_hash is not None:
                keys.insert(0, self.record_key(server, cursor, session_hash))
            direct = len(keys)
            target = self._aliases.get(cursor)
            if target is not None:
                prefix = f"{KEY_PREFIX}:c:{keyed_hash(self._key, server)}:"
                if session_hash is not None:
                    keys.append(f"{prefix}{session_hash}:{target}")
                keys.append(f"{prefix}-:{target}")
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.hget(key, "record")
            found = pipe.execute()
        except Exception as error:  # any fault of the store: memory goes on
            self._failed("read", error)
            return None
        self._succeeded()
        for position, raw in enumerate(found):
            record = SharedRecord.decode(raw)
            if record is not None and record.server == server:
                return record if position < direct else record.as_of(cursor)
        return None

    # ------------------------------------------------------------ the proxy's record

    def alias(self, cursor: str, target_hash: str) -> None:
        """A proxy of the fleet forwarded ``cursor`` from an upstream stream
        its instance read further, to the id whose hash is ``target_hash``:
        the record of that stream, under that id, is the stream as of
        ``cursor`` (``lookup``).  In this process's memory, bounded."""
        aliases = self._aliases
        if len(aliases) >= SESSION_HASH_CACHE:
            aliases.clear()
        aliases[cursor] = target_hash

    # ------------------------------------------------------------ writes

    def save(self, record: SharedRecord) -> None:
        """Queue ``record`` for the writer thread; never blocks, never
        raises.  Past ``QUEUE`` items waiting, the oldest is dropped."""
        if not record.cursors():
            return
        self._enqueue(record)

    def _due(self) -> float | None:
        """Seconds until the writer must wake with nothing queued: to write
        held entries, renew its lease, or sweep a server again; None: never."""
        now = time.monotonic()
        times = list(self._sweeps.values())
        if self._task_sweep_at is not None:
            times.append(self._task_sweep_at)
        if self._held:
            times.append(min(when for when, _ in self._held.values()))
        if self._mine or self._held_tasks:
            times.append(self._leased_at + self._lease / 3)
        return max(0.0, min(times) - now) if times else None

    def _write(self, batch: list[SharedRecord | tuple]) -> None:
        now = time.monotonic()
        batch = self._held_again(batch)
        sweeps = [op[1] for op in batch if isinstance(op, tuple) and op[0] == "sweep"]
        for server, when in list(self._sweeps.items()):
            if when <= now:
                del self._sweeps[server]
                sweeps.append(server)
        tasks_sweep = any(isinstance(op, tuple) and op[0] == "tasks_sweep" for op in batch)
        if self._task_sweep_at is not None and self._task_sweep_at <= now:
            tasks_sweep = True
        if tasks_sweep:
            # Taken off the schedule now: a sweep Redis cannot make is tried
            # again after the breaker's cooldown, never in a busy loop.
            self._task_sweep_at = None
        takes = [op for op in batch if isinstance(op, tuple) and op[0] == "take"]
        handed = [op[2] for op in batch if isinstance(op, tuple) and op[0] == "tasks"]
        if not self._allowed("write"):
            self._held_unwritten(batch)
            self._tasks_failed(takes, handed)
            if tasks_sweep:
                self._task_sweep_at = now + self._breaker.cooldown
            return  # dropped: this process's memory still holds them
        try:
            pipe = self._client.pipeline(transaction=False)
            self._lease_tasks(pipe, batch)
            for item in batch:
                if isinstance(item, SharedRecord):
                    cursors = item.raw_cursors or item.cursors()
                    keys = [self.record_key(item.server, cursor) for cursor in cursors]
                    if item.session_hash is not None:
                        keys += [
                            self.record_key(item.server, cursor, item.session_hash)
                            for cursor in cursors
                        ]
                    self._save_script(
                        keys=keys, args=[item.encode(), self._ttl, item.at], client=pipe
                    )
                elif item[0] == "forget":
                    self._forget_ops(pipe)
                elif item[0] == "now":
                    self._write_held(pipe, everything=True)
                elif item[0] == "call":
                    item[1](pipe)  # the proxy's own writes (``submit``)
                elif item[0] == "tasks":
                    self._hand_over_ops(pipe, item)
                elif item[0] in ("hold", "release"):
                    self._held_ops(pipe, item)
                elif item[0] not in ("sweep", "take", "tasks_sweep"):
                    self._ledger_ops(pipe, item)
            self._write_held(pipe)
            self._renew_lease(pipe)
            self.writes += 1
            pipe.execute()
            for outcome in handed:
                outcome.settle(True)
            self._takes(takes)
            for server in dict.fromkeys(sweeps):
                self._sweep(server)
            if tasks_sweep:
                self._sweep_tasks()
        except Exception as error:  # any fault of the store: memory goes on
            self._held_unwritten(batch)
            self._tasks_failed(takes, handed)
            if tasks_sweep:
                self._task_sweep_at = now + self._breaker.cooldown
            self._failed("write", error)
            return
        self._succeeded()

    @staticmethod
    def _tasks_failed(takes: list[tuple], handed: list[Any]) -> None:
        """Redis failed: the exit counts its tasks itself, and a follower
        does not follow a task it could not take."""
        for outcome in handed:
            outcome.settle(False)
        for take in takes:
            take[3](None)
        takes.clear()

    def flush(self, timeout: float = 1.0, held: bool = False) -> bool:
        """Wait until every queued record is written (or dropped), at most
        ``timeout`` s: the tests, and the exit, wait for an event this way.
        ``held``: the in-flight entries still held are written too."""
        if held:
            self._enqueue(("now", ""))
        return super().flush(timeout)

    def _forked(self) -> None:
        self._held.clear()
        self._mine.clear()
        self._held_tasks.clear()
        self._task_sweep_at = None

    def _closing(self) -> None:
        # This process's entries out of the in-flight ledgers (a clean exit
        # counts its own: the monitor's exit accounting).  The writer thread
        # owns ``_mine``: it builds the deletions itself.
        self._enqueue(("forget", ""))
