"""A real HTTP server on 127.0.0.1 that answers from scripts the test sets.

Each script is a callable ``(request) -> (status, headers, events)``; events
are raw SSE text blocks sent one by one, so a test controls ids, sessions
and where the stream ends, the way a misbehaving server would.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

Script = Callable[[Request, bytes], tuple[int, dict[str, str], list[str]]]


def sse(event_id: str | None = None, data: str = "", event: str | None = None) -> str:
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.extend(f"data: {line}" for line in (data.split("\n") if data else [""]))
    return "\n".join(lines) + "\n\n"


class ScriptedServer:
    def __init__(self) -> None:
        self.scripts: dict[tuple[str, str], Script] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted server did not start")
            time.sleep(0.01)

    def on(self, method: str, path: str, script: Script) -> None:
        self.scripts[(method, path)] = script

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        path = "/" + request.path_params["path"]
        self.requests.append((request.method, path, dict(request.headers)))
        script = self.scripts.get((request.method, path))
        if script is None:
            return Response(status_code=404)
        status, headers, events = script(request, body)
        if "content-type" not in {k.lower() for k in headers}:
            headers = {**headers, "content-type": "text/event-stream"}

        async def body_iterator():
            for block in events:
                yield block.encode()
                await asyncio.sleep(0)

        return StreamingResponse(body_iterator(), status_code=status, headers=headers)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


# ------------------------------------------------ seed 000, as scripts


def notification(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n}})


def legacy_stream(request, body):
    """A 2024-11-05 SSE stream: the session in the endpoint event, ids 4817..4821."""
    events = [sse(event="endpoint", data="/messages/?session_id=legacy-abc")]
    events += [sse(str(n), notification(n)) for n in range(4817, 4822)]
    return 200, {}, events


def fresh_session(request, body):
    """Seed 000's migrated server: a fresh session counting from 1."""
    return 200, {"mcp-session-id": "fresh-1"}, [sse(str(n), notification(n)) for n in (1, 2)]
