# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""``ProvableEventStore``: event ids a client can prove continuity with.

A store that mints UUIDs (the MCP Python SDK's example ``InMemoryEventStore``,
the TypeScript SDK's ``<uuid>_<ms>_<rand>``) gives a resuming client no
ordering evidence: every faithful resume is ``unverifiable``.  Wrapped, the
same store's events go out as ``<stream>:<counter>``, one counter per stream
id, so a client can check that the first replayed id follows its cursor
(``resumed``) and see a reset counter (``id_regression``).

The wrapper keeps, beside the inner store's own ids, the map between the two
and the counters, in memory.  They survive a restart of the process only if
you persist them yourself (subclass and override ``_remember`` / ``_inner_id`` /
``_next``); a restarted wrapper knows none of the old cursors, which the SDK
then answers as it answers any unknown cursor (and the server guard rejects),
and it counts every stream from 1 again, which a client holding an old cursor
of that stream sees as a counter reset.  Either way the loss is visible, not
silent.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mcp.server.streamable_http import EventCallback, EventMessage, EventStore

# Ids remembered (ours <-> the inner store's): beyond, the oldest cursors are
# forgotten and answered as unknown, as a bounded inner store does.
DEFAULT_MAX_EVENTS = 100_000


class ProvableEventStore(EventStore):
    """Wraps any MCP SDK ``EventStore`` (mcp 1.x and 2.x: the protocol is
    ``store_event(stream_id, message) -> event id`` and
    ``replay_events_after(last_event_id, send_callback) -> stream id | None``)
    and mints ``<stream>:<counter>`` event ids::

        server.streamable_http_app(event_store=ProvableEventStore(InMemoryEventStore()))
    """

    def __init__(self, inner: EventStore, *, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        self.inner = inner
        self.max_events = max_events
        self._counters: dict[str, int] = {}
        self._to_inner: OrderedDict[str, str] = OrderedDict()
        self._from_inner: dict[str, str] = {}

    # -- what a persistent subclass overrides

    def _next(self, stream_id: str) -> int:
        number = self._counters.get(stream_id, 0) + 1
        self._counters[stream_id] = number
        return number

    def _remember(self, event_id: str, inner_id: str) -> None:
        self._to_inner[event_id] = inner_id
        self._from_inner[inner_id] = event_id
        while len(self._to_inner) > self.max_events:
            _, forgotten = self._to_inner.popitem(last=False)
            self._from_inner.pop(forgotten, None)

    def _inner_id(self, event_id: str) -> str | None:
        """The inner id of ``event_id``, or None if it is not (or no longer) known."""
        return self._to_inner.get(event_id)

    # -- the EventStore protocol

    async def store_event(self, stream_id: Any, message: Any) -> str:
        inner_id = await self.inner.store_event(stream_id, message)
        # The stream id is the SDK's (a JSON-RPC request id, or the GET
        # stream's key): ``:`` then digits, so the client orders by the counter.
        event_id = f"{stream_id}:{self._next(str(stream_id))}"
        self._remember(event_id, str(inner_id))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> Any:
        inner_cursor = self._inner_id(last_event_id)
        if inner_cursor is None:
            return None  # what the SDK's stores answer for a cursor they do not know

        async def send(event: EventMessage) -> None:
            inner_id = event.event_id
            ours = self._from_inner.get(inner_id) if inner_id is not None else None
            # An event stored before the wrapper (no id of ours) goes out as the
            # inner store sent it: opaque, never a made-up number.
            await send_callback(event if ours is None else EventMessage(event.message, ours))

        return await self.inner.replay_events_after(inner_cursor, send)
