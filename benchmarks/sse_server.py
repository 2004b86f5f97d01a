"""A raw asyncio HTTP/1.1 server on 127.0.0.1 that streams small SSE events fast.

Run as a subprocess (``python sse_server.py``); it prints its port and serves
until stdin closes.  Every SSE event is its own HTTP chunk (as a real server
writes them) but the chunks are written in one go, so the client, not the
server, is the bottleneck.  Keep-alive and chunked responses throughout.

Routes (any path; ``/json`` in the path makes every JSON-RPC answer plain JSON):

* ``GET ?n=N``  : N events ``id: k`` / ``event: message`` / a progress
  notification, then the end of the body; ``?n=N&bulk`` frames them in
  chunks of ~16 KiB (as a buffered writer sends a burst) instead of one
  chunk per event;
* ``GET``       : an MCP GET stream: headers, then held open until the client leaves;
* ``POST``      : MCP streamable HTTP: ``initialize`` (new ``Mcp-Session-Id``),
  notifications (202), ``tools/call`` with ``{"n": N}`` (N progress events then
  the result, on one SSE stream; ``"bulk": true`` frames them as above),
  ``tools/list``, anything else (empty result);
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


def _text(event_id: int, message: dict[str, Any]) -> bytes:
    return f"id: {event_id}\nevent: message\ndata: {json.dumps(message)}\n\n".encode()


def _chunk(text: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(text), text)


def _event(event_id: int, message: dict[str, Any]) -> bytes:
    return _chunk(_text(event_id, message))


def _progress(k: int, n: int, token: object = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, "progress": k + 1, "total": n},
    }


def progress_events(n: int, token: object = 1, first_id: int = 1) -> list[bytes]:
    return [_event(first_id + k, _progress(k, n, token)) for k in range(n)]


def bulk_events(n: int, chunk_bytes: int = 16 * 1024, token: object = 1) -> bytes:
    """N events framed as a server writing a burst through a buffered writer
    (chunks of about ``chunk_bytes``): the client's SSE parser, not its HTTP
    chunk parser, is what each event costs."""
    texts = [_text(k + 1, _progress(k, n, token)) for k in range(n)]
    chunks, pending, size = [], [], 0
    for text in texts:
        pending.append(text)
        size += len(text)
        if size >= chunk_bytes:
            chunks.append(_chunk(b"".join(pending)))
            pending, size = [], 0
    if pending:
        chunks.append(_chunk(b"".join(pending)))
    return b"".join(chunks)


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
        # (n, bulk) -> the framed events of a GET ?n=N stream
        self.streams: dict[tuple[int, bool], bytes] = {}

    def stream_body(self, n: int, bulk: bool) -> bytes:
        if (n, bulk) not in self.streams:
            body = bulk_events(n) if bulk else b"".join(progress_events(n))
            self.streams[n, bulk] = body + b"0\r\n\r\n"
        return self.streams[n, bulk]

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
                    count, _, framing = query[2:].partition("&")
                    writer.write(self.stream_body(int(count), framing == "bulk"))
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
        bulk = b""  # or the progress events as one burst (bulk_events)
        first_id = 1
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
            schema = {
                "type": "object",
                "properties": {"n": {"type": "integer"}, "bulk": {"type": "boolean"}},
            }
            result = {"tools": [{"name": "stream", "inputSchema": schema}]}
        elif method == "tools/call":
            arguments = params.get("arguments") or _EMPTY
            n = int(arguments.get("n", 0))
            token = (params.get("_meta") or _EMPTY).get("progressToken")
            if n and token is not None:
                if arguments.get("bulk"):
                    bulk = bulk_events(n, token=token)
                    first_id = n + 1
                else:
                    events = progress_events(n, token)
            result = {"content": [{"type": "text", "text": "done"}], "isError": False}
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        if plain:
            payload = json.dumps(answer).encode()
            writer.write(_head("200 OK", "application/json", session, len(payload)) + payload)
            return
        events.append(_event(first_id + len(events), answer))
        writer.write(_head("200 OK", "text/event-stream", session, None))
        writer.write(bulk + b"".join(events) + b"0\r\n\r\n")


async def main() -> None:
    server = Server()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, limit=1 << 20)
    print(listener.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # the parent closes stdin to stop us
    listener.close()


if __name__ == "__main__":
    asyncio.run(main())
