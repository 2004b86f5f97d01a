# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The client leg's losses at shutdown, handed to the fleet (shared state):
``FleetClaims``.

A proxy that stops (SIGTERM, the drain's end) with answers it had not
delivered cannot know that they are lost: its client may resume on another
instance of the fleet, which serves them (``--resumable``: from the shared
buffer; else the server's replay).  So with shared state the stopping
process counts none of them: it hands each to the fleet, in a ledger of the
shared state's in-flight ledger (``redis_ledger``: one per upstream, the
fleet's one name for it), held for the confirmation window by the process's
lease.  Then exactly one process decides each, whichever it is:

* the instance that serves the session's resume takes them
  (``take``: claimed with ``SET NX``) and decides them as its own broken
  requests: ``answered`` when the resume delivers the answer, else ``lost``
  when its window passes (or handed on again if it stops too);
* else, once the lease has lapsed with no resume anywhere, the first
  instance whose sweep finds them claims each (the same ``SET NX``) and
  counts it ``lost``, with its gap and its line, on the client leg.

Every instance sweeps every half window (one ``HSCAN`` on the writer
thread: the stopping process is gone by then, so a survivor must look),
this ledger and the upstream leg's in-flight ledger, where an instance
leaves at its exit the requests whose upstream stream broke
(``hands_at_exit``): the instance that resumed one took it over, else the
sweep counts it lost on ``proxy_server``.
Without shared state nothing here runs, and a stop counts its undelivered
answers lost itself, as before.

Kept in Redis per entry: the method, the request id (a JSON-RPC id, not a
secret), the address the client reached, the protocol version; never
params or a raw session id (the field holds its keyed hash).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import httpx

from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc

from . import legs

# How often every instance sweeps, as a share of the window; and its floor.
SWEEP_SHARE = 0.5
MIN_SWEEP_S = 0.25


class FleetClaims:
    """The client leg's handed losses of one fleet (the proxies of one
    upstream) in the shared store."""

    def __init__(self, store: Any, upstream: str, window: float) -> None:
        self.store = store
        # Every instance of the fleet names the same ledger.
        self.ledger = f"{legs.CLIENT_PROXY}|{upstream}"
        # The upstream leg's in-flight ledger, as the client half names its
        # server: the requests an instance left to the fleet at its exit.
        url = httpx.URL(upstream)
        self.upstream_server = f"{url.host}:{url.port}" if url.port else url.host
        self.window = window
        self._timer: asyncio.TimerHandle | None = None

    def hand(self, lost: list[tuple[str | None, str, dict[str, Any]]]) -> bool:
        """``(session id, request key, facts)`` handed to the fleet, held for
        the window; False when Redis failed (the caller counts them)."""
        entries = [
            (self.store.session_hash(session), key,
             {**facts, "t": sc.TRANSPORT_STREAMABLE_HTTP, "r": key, "at": time.time()})
            for session, key, facts in lost
        ]
        return bool(self.store.hand_claims(self.ledger, entries, max(self.window, MIN_SWEEP_S)))

    def take(self, session: str | None) -> list[dict[str, Any]]:
        """The session's handed losses, taken by this instance (a bounded
        read and claim: call it off the event loop)."""
        return self.store.take_handed(self.ledger, self.store.session_hash(session)) or []

    def start(self, count: Callable[[dict[str, Any]], None]) -> None:
        """Sweep every half window from now (on the running loop); the
        entries a sweep claims here are counted by ``count``."""
        self.store.count_swept(self.ledger, count)
        if self._timer is None:
            self._tick()

    def _tick(self) -> None:
        with contextlib.suppress(Exception):  # no loop, or a closed one: no sweep
            self.store.sweep(self.ledger)
            self.store.sweep(self.upstream_server)
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(
                max(MIN_SWEEP_S, self.window * SWEEP_SHARE), self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
