# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The proxy's part of the shared state (``OTEL_PYTHON_MCP_RESUMPTION_STATE``,
docs/shared-state.md): what a fleet of proxies behind a load balancer shares
so that a client's resume is judged, and served, wherever it lands.

The upstream leg needs nothing of this module: it is the client half, whose
tracker shares its stream records through the store already (a resume that
lands on another instance is an upstream cursor that instance's tracker never
saw: it looks the record up).  The downstream leg needs two things more:

* ``SharedCursors``: which session each event id the fleet forwarded was
  forwarded in, so that another instance tells ``replayed`` from
  ``other_session`` and ``unknown_cursor`` as the first would have.  Written
  at the end of each response (the ids forwarded since the last write,
  batched on the store's writer thread), never per event; read once per
  resume of a cursor this instance never forwarded.
* the ``--resumable`` buffers (``SharedRelays``).

Both go through the client half's store (``redis_state.RedisStore``): one
connection pool, one writer thread, one breaker, its timeouts and its
fallback counter.  With the memory store (the default) nothing here runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry.instrumentation.mcp_resumption.shared.shared_state import _hide, _show

from .relay_terms import LINGER, MAX_EVENTS, parse

# Seconds every key of the proxy's lives (renewed at each write): as the
# client half's records (redis_state.TTL).
TTL = 3600
# Ids written per write: a client resumes from an id it received, which is
# among the last its stream carried.
MAX_IDS_PER_WRITE = 512
_NO_SESSION = "-"


def store_of(processor: Any) -> Any | None:
    """The client half's shared store, if it is one (else None: memory)."""
    store = getattr(getattr(processor, "tracker", None), "store", None)
    return store if getattr(store, "shared", False) and hasattr(store, "submit") else None


class SharedCursors:
    """The downstream leg's forwarded ids, shared by the fleet: key
    ``mcpres:v1:d:<upstream>:<cursor>`` (both hashed), value the session's
    keyed hash (``-``: none)."""

    def __init__(self, store: Any, upstream: str) -> None:
        self.store = store
        self.upstream = upstream

    def session_hash(self, session_id: str | None) -> str:
        return self.store.session_hash(session_id) or _NO_SESSION

    def save(self, forwarded: list[tuple[str, str | None]], last: str | None = None) -> None:
        """Queue ``(event id, session id)`` pairs for the writer thread;
        ``last``: the last id read on their upstream stream (its record's
        key), kept hashed beside each."""
        tail = "" if last is None else "|" + self.store.key_hash(last)
        pairs = [
            (self.store.key("d", self.upstream, event_id), self.session_hash(session) + tail)
            for event_id, session in forwarded[-MAX_IDS_PER_WRITE:]
        ]

        def write(pipe: Any) -> None:
            for key, value in pairs:
                pipe.set(key, value, ex=TTL)

        self.store.submit(write)

    def session_of(self, cursor: str) -> tuple[str, str | None] | None:
        """The hashed session ``cursor`` was forwarded in (``-``: none) and
        the hash of the last id read on its upstream stream, if any instance
        forwarded it; None when not, or when Redis failed (one bounded GET)."""
        key = self.store.key("d", self.upstream, cursor)
        found = self.store.call(lambda client: client.get(key))
        if found is None:
            return None
        text = found.decode("ascii", "replace") if isinstance(found, bytes) else str(found)
        session_hash, _, last = text.partition("|")
        return session_hash, (last or None)


# ================================================================ --resumable

# Seconds a relay's events and state live in Redis after their last write:
# a client resumes within seconds of a break (its SDK's retry delay); the
# buffer holds payloads, so it is kept no longer than that needs.
BUFFER_TTL = 600
# How often a follower on another instance reads what the relay's own
# instance wrote since, while that one reads on; events per read.
POLL = 0.05
READ_BATCH = 256


class SharedRelays:
    """The ``--resumable`` buffers of the fleet: per relay (``<key>`` is the
    relay's id prefix, ``p<8 hex>-<n>``, random per process), a Redis stream
    ``mcpres:v1:r:<key>`` of its events (each ``XADD`` under the event's
    number, trimmed to ``relay_terms.MAX_EVENTS``) and a hash
    ``mcpres:v1:rs:<key>`` of its state, both hashed keys, ``BUFFER_TTL``."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def buffer(self, key: str, session: str | None) -> SharedBuffer:
        return SharedBuffer(self.store, key, session)

    def find(self, cursor: str, session_id: str | None) -> RemoteRelay | None:
        """The relay of another instance that issued ``cursor``, if its state
        is in Redis and it was read in ``session_id`` (a cursor never opens
        another session's events); one bounded read, on the caller's thread."""
        parsed = parse(cursor)
        if parsed is None:
            return None
        key = parsed[0]
        state_key = self.store.key("rs", key)
        raw = self.store.call(lambda client: client.hgetall(state_key))
        if not raw:
            return None
        state = _texts(raw)
        if state.get("s") != (self.store.session_hash(session_id) or _NO_SESSION):
            return None
        return RemoteRelay(self.store, key, state, session_id)


def _texts(raw: dict) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        )
        for k, v in raw.items()
    }


class SharedBuffer:
    """One relay's events on their way to Redis: queued on the event loop (a
    deque append), written by the store's writer thread, as many as queued
    since its last round trip."""

    def __init__(self, store: Any, key: str, session: str | None, written: int = 0) -> None:
        self.store = store
        self.events_key = store.key("r", key)
        self.state_key = store.key("rs", key)
        self.session = session
        self.session_hash = store.session_hash(session) or _NO_SESSION
        self._unsent: deque[tuple[int, bytes]] = deque()
        self._queued = False
        self._lock = threading.Lock()
        self.written = written  # the number of the last event written

    def added(self, relay: Any, number: int, frame: bytes) -> None:
        self._unsent.append((number, frame))
        if not self._queued:
            self._schedule(relay)

    def changed(self, relay: Any) -> None:
        self._schedule(relay)

    def _schedule(self, relay: Any) -> None:
        with self._lock:
            if self._queued:
                return
            self._queued = True
        self.store.submit(lambda pipe: self._write(pipe, relay))

    def _write(self, pipe: Any, relay: Any) -> None:
        """On the writer thread: what queued, and the relay's state as it was
        before (so an end is never written ahead of its last events)."""
        with self._lock:
            self._queued = False
        ended, failed, upstream_last = relay.ended, relay.failed, relay.upstream_last_id
        frames = []
        while self._unsent:
            frames.append(self._unsent.popleft())
        for number, frame in frames:
            pipe.xadd(self.events_key, {"f": frame}, id=f"{number}-0",
                      maxlen=MAX_EVENTS, approximate=True)
            self.written = number
        state = {"s": self.session_hash, "last": self.written,
                 "ended": int(ended), "failed": int(failed)}
        if upstream_last is not None:
            # As the client half keeps ids: the session id an id may embed
            # is replaced by a placeholder (shown again for that session only).
            state["up"] = _hide(upstream_last, self.session)
        pipe.hset(self.state_key, mapping=state)
        pipe.expire(self.events_key, BUFFER_TTL)
        pipe.expire(self.state_key, BUFFER_TTL)


class RemoteRelay:
    """A relay another instance reads (or read), followed from Redis: the
    face of ``resumable.Relay`` that ``ProxyApp._follow`` uses."""

    def __init__(self, store: Any, key: str, state: dict[str, str], session: str | None) -> None:
        self.store = store
        self.key = key
        self.session = session
        self.events_key = store.key("r", key)
        self.state_key = store.key("rs", key)
        self.state = state
        self.ended = False
        self.failed = False
        self.forwarded: Any = None  # called with each id served

    @property
    def last(self) -> int:
        return int(self.state.get("last") or 0)

    def upstream_broke(self) -> bool:
        """Its upstream stream broke and can be resumed: this instance
        resumes it (``adopt``) instead of following."""
        state = self.state
        return state.get("ended") == "1" and state.get("failed") == "1" and "up" in state

    def upstream_last_id(self) -> str | None:
        up = self.state.get("up")
        return None if up is None else _show(up, self.session)

    def read(self, after: int) -> tuple[list[tuple[int, bytes]], dict[str, str]] | None:
        """The events after number ``after`` (at most READ_BATCH) and the
        relay's state; None when Redis failed (bounded)."""

        def operation(client: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            pipe.xrange(self.events_key, min=f"{after + 1}-0", max="+", count=READ_BATCH)
            pipe.hgetall(self.state_key)
            return pipe.execute()

        found = self.store.call(operation)
        if found is None:
            return None
        entries, state = found
        events = []
        for entry_id, fields in entries:
            text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            frame = fields.get(b"f", fields.get("f", b""))
            events.append((int(text.split("-", 1)[0]), frame))
        return events, _texts(state) if state else self.state

    def read_all(self, after: int) -> list[tuple[int, bytes]] | None:
        events: list[tuple[int, bytes]] = []
        while True:
            found = self.read(after)
            if found is None:
                return None
            batch, self.state = found
            events += batch
            if len(batch) < READ_BATCH:
                return events
            after = batch[-1][0]

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """The frames after ``after``, then each new one the relay's instance
        writes, until its relay ends (or nothing comes for ``LINGER``)."""
        idle_since = time.monotonic()
        while True:
            found = await asyncio.to_thread(self.read, after)
            if found is None:
                self.failed = True  # Redis failed: the client resumes again
                return
            events, self.state = found
            if events:
                after = events[-1][0]
                if self.forwarded is not None:
                    for number, _ in events:
                        self.forwarded(f"{self.key}:{number}")
                yield b"".join(frame for _, frame in events)
                idle_since = time.monotonic()
                if len(events) == READ_BATCH:
                    continue
            if self.state.get("ended") == "1" and after >= self.last:
                self.failed = self.state.get("failed") == "1"
                return
            if time.monotonic() - idle_since > LINGER:
                self.failed = True
                return
            await asyncio.sleep(POLL)
