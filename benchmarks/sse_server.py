"""A raw asyncio HTTP/1.1 server on 127.0.0.1 that streams small SSE events fast.

Run as a subprocess (``python sse_server.py``); it prints its port and serves
until stdin closes.  Every SSE event is its own HTTP chunk (as a real server
writes them) but the chunks are written in one go, so the client, not the
server, is the bottleneck.  Keep-alive and chunked responses throughout.

Routes (any path; ``/json`` in the path makes every JSON-RPC answer plain JSON):

* ``GET ?n=N``  : N events ``id: k`` / ``event: message`` / a progress
  notification, then the end of the body;
* ``GET``       : an MCP GET stream: headers, then held open until the client leaves;
* ``POST``      : MCP streamable HTTP: ``initialize`` (new ``Mcp-Session-Id``),
  notifications (202), ``tools/call`` with ``{"n": N}`` (N progress events then
  the result, on one SSE stream), ``tools/list``, anything else (empty result);
* ``DELETE``    : 200.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

PROTOCOL_VERSION = "2025-11-25"
_EMPTY: dict[str, Any] = {}


def _event(event_id: int, message: dict[str, Any]) -> bytes:
    text = f"id: {event_id}\nevent: message\ndata: {json.dumps(message)}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(text), text)


def progress_events(n: int, token: object = 1, first_id: int = 1) -> list[bytes]:
    return [
        _event(
            first_id + k,
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": k + 1, "total": n},
            },
        )
        for k in range(n)
    ]


def _head(status: str, content_type: str | None, session: str | None, length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status}"]
    if content_type:
        lines.append(f"content-type: {content_type}")
    lines.append(
        f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    )
    if session:
        lines.append(f"mcp-session-id: {session}")
    if content_type == "text/event-stream":
        lines.append("cache-control: no-cache")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Server:
    def __init__(self) -> None:
        self.streams: dict[int, bytes] = {}  # n -> the framed events of a GET ?n=N stream

    def stream_body(self, n: int) -> bytes:
        if n not in self.streams:
            self.streams[n] = b"".join(progress_events(n)) + b"0\r\n\r\n"
        return self.streams[n]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                method, target, _ = request_line.split(" ", 2)
                headers = {}
                for line in header_lines:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                session = headers.get("mcp-session-id")
                if method == "GET":
                    _, _, query = target.partition("?")
                    if not query.startswith("n="):
                        writer.write(_head("200 OK", "text/event-stream", session, None))
                        await reader.read()  # an MCP GET stream: open until the client leaves
                        return
                    writer.write(_head("200 OK", "text/event-stream", session, None))
                    writer.write(self.stream_body(int(query[2:])))
                elif method == "POST":
                    self.post(writer, json.loads(body), session, "/json" in target)
                else:
                    writer.write(_head("200 OK", None, session, 0))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def post(
        self, writer: asyncio.StreamWriter, message: Any, session: str | None, plain: bool
    ) -> None:
        method = message.get("method")
        if "id" not in message:
            writer.write(_head("202 Accepted", None, session, 0))
            return
        params = message.get("params") or _EMPTY
        events: list[bytes] = []
        result: dict[str, Any] = {}
        if method == "initialize":
            session = uuid.uuid4().hex
            result = {
                "protocolVersion": params.get("protocolVersion", PROTOCOL_VERSION),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench", "version": "1"},
            }
            plain = True
        elif method == "tools/list":
            schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
            result = {"tools": [{"name": "stream", "inputSchema": schema}]}
        elif method == "tools/call":
            n = int((params.get("arguments") or _EMPTY).get("n", 0))
            token = (params.get("_meta") or _EMPTY).get("progressToken")
            if n and token is not None:
                events = progress_events(n, token)
            result = {"content": [{"type": "text", "text": "done"}], "isError": False}
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        if plain:
            payload = json.dumps(answer).encode()
            writer.write(_head("200 OK", "application/json", session, len(payload)) + payload)
            return
        events.append(_event(len(events) + 1, answer))
        writer.write(_head("200 OK", "text/event-stream", session, None))
        writer.write(b"".join(events) + b"0\r\n\r\n")


async def main() -> None:
    server = Server()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, limit=1 << 20)
    print(listener.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # the parent closes stdin to stop us
    listener.close()


if __name__ == "__main__":
    asyncio.run(main())
