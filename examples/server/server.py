"""A streamable-HTTP MCP server whose resumes a client can prove.

Two things make a resume provable, and this server has both:

* an event store, so that a client that reconnects with ``Last-Event-ID``
  gets the events it missed (neither MCP Python SDK major ships one you can
  import: ``InMemoryEventStore`` below is written here, as it would be in
  your server);
* event ids that count, so that the client can check that the replay starts
  right after its cursor: ``ProvableEventStore`` wraps the store and mints
  ``<stream>:<counter>`` ids.  With ``--opaque`` the store's own UUIDs go out
  instead, and the client's plugin says ``unverifiable`` (with a hint).

Its one tool, ``countdown``, closes its own SSE stream after each progress
step (SSE polling, protocol 2025-11-25), so every call makes the client
resume ``n`` times.  Works with mcp 1.x (>= 1.30) and 2.x.

    python server.py --port 8000          # prints: serving http://127.0.0.1:8000/mcp
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import uuid
from dataclasses import dataclass
from typing import Any

import uvicorn
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId

from opentelemetry.instrumentation.mcp_resumption.server import ProvableEventStore

try:  # mcp 2.x
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver import MCPServer as Server

    MCP_2 = True
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import Context  # type: ignore[no-redef]
    from mcp.server.fastmcp import FastMCP as Server  # type: ignore[no-redef]

    MCP_2 = False

RETRY_MS = 100  # how long the client waits before it resumes a closed stream


@dataclass
class _Stored:
    event_id: EventId
    stream_id: StreamId
    message: Any


class InMemoryEventStore(EventStore):
    """Every event in memory, in order, under a random UUID: the SDKs' own
    example store, written out.  ``replay_events_after`` sends the events of
    the cursor's stream that came after it, and returns the stream id (None
    for a cursor it does not know)."""

    def __init__(self) -> None:
        self.events: list[_Stored] = []
        self.position: dict[EventId, int] = {}

    async def store_event(self, stream_id: StreamId, message: Any) -> EventId:
        event_id = str(uuid.uuid4())
        self.position[event_id] = len(self.events)
        self.events.append(_Stored(event_id, stream_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        start = self.position.get(last_event_id)
        if start is None:
            return None
        stream_id = self.events[start].stream_id
        for stored in self.events[start + 1 :]:
            if stored.stream_id == stream_id and stored.message is not None:
                await send_callback(EventMessage(stored.message, stored.event_id))
        return stream_id


def build_app(opaque: bool = False) -> Any:
    store: EventStore = InMemoryEventStore()
    if not opaque:
        store = ProvableEventStore(store)
    if MCP_2:
        server = Server("countdown")
    else:
        server = Server("countdown", event_store=store, retry_interval=RETRY_MS)

    @server.tool()
    async def countdown(ctx: Context, n: int = 3) -> str:  # type: ignore[type-arg]
        """Count down from n, closing the SSE stream after each step."""
        for step in range(n, 0, -1):
            await ctx.report_progress(n - step + 1, n, f"{step}...")
            await ctx.close_sse_stream()  # the client resumes with Last-Event-ID
            await asyncio.sleep(RETRY_MS / 1000 * 2)
        return "liftoff"

    if MCP_2:
        return server.streamable_http_app(event_store=store, retry_interval=RETRY_MS)
    return server.streamable_http_app()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    parser.add_argument("--opaque", action="store_true", help="UUID event ids: unprovable")
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    print(f"serving http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    config = uvicorn.Config(build_app(args.opaque), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
