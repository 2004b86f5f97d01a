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
* the ``--resumable`` buffers (``resumable.SharedRelays``).

Both go through the client half's store (``redis_state.RedisStore``): one
connection pool, one writer thread, one breaker, its timeouts and its
fallback counter.  With the memory store (the default) nothing here runs.
"""

from __future__ import annotations

from typing import Any

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
