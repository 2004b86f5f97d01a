"""Loopback servers for the wheel smoke test, run with the fresh venv's own
Python (nothing from the checkout): a plain SSE endpoint for the httpx-sse
client and an MCP SDK streamable-HTTP server that closes its stream mid-call.

Prints one JSON line with the two URLs, then serves until stdin closes.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import itertools
import json
import socket
import sys
import threading
import time

import uvicorn
from mcp.server.streamable_http import EventMessage, EventStore
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
if MCP_MAJOR == 1:
    from mcp.server.fastmcp import Context, FastMCP
else:
    from mcp.server.mcpserver import Context, MCPServer

SESSION = "smoke-1"


def event(event_id: int, generation: int = 0) -> bytes:
    params = {"n": event_id, "generation": generation}
    data = {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
    return f"id: {event_id}\ndata: {json.dumps(data)}\n\n".encode()


async def plain_sse(request: Request) -> StreamingResponse:
    """Events 1..3; after ``Last-Event-ID: 3``, 4 and 5 (a faithful resume);
    after ``Last-Event-ID: 5``, new events 1 and 2 (a counter that was reset;
    the same events again would be redelivery)."""
    last = request.headers.get("last-event-id")
    ids = {None: (1, 2, 3), "3": (4, 5), "5": (1, 2)}[last]

    async def body():
        for event_id in ids:
            yield event(event_id, generation=1 if last == "5" else 0)
            await asyncio.sleep(0)

    headers = {"mcp-session-id": SESSION}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


class IntegerEventStore(EventStore):
    """One integer counter, replaying strictly after the cursor (the SDK's contract)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, object]] = []
        self.counter = itertools.count(100)

    async def store_event(self, stream_id, message):
        event_id = str(next(self.counter))
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id, send_callback):
        ids = [event_id for event_id, _, _ in self.events]
        if last_event_id not in ids:
            return None
        index = ids.index(last_event_id)
        stream_id = self.events[index][1]
        for event_id, stream, message in self.events[index + 1 :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


def mcp_app():
    store = IntegerEventStore()
    if MCP_MAJOR == 1:
        server = FastMCP("smoke", event_store=store, retry_interval=200)
    else:
        server = MCPServer("smoke")

    @server.tool()
    async def slow(ctx: Context) -> str:
        await ctx.info("working")
        # The SDK client reconnects with Last-Event-ID; the replay carries the result.
        await ctx.close_sse_stream()
        return "done"

    if MCP_MAJOR == 1:
        return server.streamable_http_app()
    return server.streamable_http_app(event_store=store, retry_interval=200)


def serve(app) -> tuple[uvicorn.Server, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("a smoke server did not start")
        time.sleep(0.01)
    return server, sock.getsockname()[1]


def main() -> None:
    plain, plain_port = serve(Starlette(routes=[Route("/sse", plain_sse)]))
    sdk, sdk_port = serve(mcp_app())
    urls = {"sse": f"http://127.0.0.1:{plain_port}/sse", "mcp": f"http://127.0.0.1:{sdk_port}/mcp"}
    print(json.dumps(urls), flush=True)
    sys.stdin.read()
    for server in (plain, sdk):
        server.should_exit = True


if __name__ == "__main__":
    main()
