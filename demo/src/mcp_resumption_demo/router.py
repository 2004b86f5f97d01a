# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""A loopback HTTP/1.1 reverse proxy: the load balancer of the seeds.

It forwards each request to the backend a policy chooses, streams response
bodies as they arrive (an SSE body is never buffered), and can *sever* a
proxied SSE response right after a chosen event, the way an idle-proxy timeout
cuts a stream: the client has received that event's bytes, then its
connection dies in the middle of the chunked body.

Only what a load balancer rewrites is rewritten: hop-by-hop headers and the
body framing (the upstream leg is one connection per request, the client leg
is re-chunked so that it can stay keep-alive). Method, path, query, Host and
every end-to-end header (Mcp-Session-Id, Last-Event-ID, ...) pass unchanged.

Every proxied request is recorded as an :class:`Exchange`, including the SSE
events that were forwarded to the client, so a scenario can state what crossed
the wire even when the client is an SDK that hides it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

__all__ = [
    "Backend",
    "Exchange",
    "ForwardedEvent",
    "Policy",
    "RequestHead",
    "Route",
    "Router",
    "SseScanner",
]

# RFC 9110 section 7.6.1 plus the framing headers this proxy re-derives itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
_MAX_HEAD_BYTES = 64 * 1024
_READ_SIZE = 64 * 1024
# Bounds a policy that awaits something which never happens (a demo bug, not a wire fact).
_POLICY_TIMEOUT_S = 10.0
_CLOSE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Backend:
    """One instance behind the router."""

    name: str
    port: int
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class RequestHead:
    """A client request as the router received it (the body is small JSON, so it is read whole)."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        """The first value of header *name* (case-insensitive), or None."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)

    @property
    def jsonrpc(self) -> dict[str, object] | None:
        """The JSON-RPC message in the body, if the body is one (an L7 balancer may look)."""
        if not self.body:
            return None
        try:
            decoded = json.loads(self.body)
        except ValueError:
            return None
        return decoded if isinstance(decoded, dict) else None

    @property
    def jsonrpc_method(self) -> str | None:
        message = self.jsonrpc
        method = message.get("method") if message else None
        return method if isinstance(method, str) else None


@dataclass(frozen=True)
class Route:
    """Where one request goes and what happens to its response.

    ``sever_after_events``: close the client connection right after the bytes of
    that many SSE events were forwarded. ``sever_after``: close it right after
    the bytes of the first event this accepts (an acknowledgment, a progress
    notification). ``drain_upstream``: after severing, keep
    reading the backend's response to its end (the backend sees a complete
    delivery, only the client leg died); otherwise the upstream is closed too,
    as an idle timeout closes both legs.
    """

    backend: Backend
    sever_after_events: int | None = None
    drain_upstream: bool = False
    sever_after: Callable[[ForwardedEvent], bool] | None = None


Policy = Callable[[RequestHead], "Route | Awaitable[Route]"]


@dataclass(frozen=True)
class ForwardedEvent:
    """One SSE event whose bytes the router forwarded to the client."""

    id: str | None
    event: str
    data: str
    retry: int | None = None


@dataclass
class Exchange:
    """The router's record of one proxied request."""

    index: int
    request: RequestHead
    backend: str
    status: int | None = None
    response_headers: tuple[tuple[str, str], ...] = ()
    events: list[ForwardedEvent] = field(default_factory=list)
    severed: bool = False
    client_closed: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    upstream_finished: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def response_header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((v for k, v in self.response_headers if k.lower() == lowered), None)

    @property
    def last_event_id_sent(self) -> str | None:
        return self.request.header("last-event-id")

    @property
    def session_id_sent(self) -> str | None:
        return self.request.header("mcp-session-id")

    @property
    def session_id_received(self) -> str | None:
        return self.response_header("mcp-session-id")


class SseScanner:
    """Finds where SSE events end in a byte stream, across arbitrary chunk splits.

    An event ends at a blank line; lines end with CRLF, LF or CR (sse-starlette
    writes CRLF, the hand-written servers LF). A block made only of comment lines
    (``: ping``) is not an event: clients do not dispatch it.
    """

    def __init__(self) -> None:
        self._line = bytearray()
        self._fields: list[tuple[str, str]] = []
        self._after_cr = False
        # An event that ended on the CR closing a chunk: whether an LF follows
        # (and belongs to that event) is only known from the next chunk.
        self._held: ForwardedEvent | None = None

    def feed(self, data: bytes) -> list[tuple[int, ForwardedEvent]]:
        """Consume *data*; return ``(offset just past the event, event)`` per completed event."""
        out: list[tuple[int, ForwardedEvent]] = []
        start = 0
        if self._held is not None and data:
            if data[:1] == b"\n":
                start = 1
                self._after_cr = False
            out.append((start, self._held))
            self._held = None
        for i in range(start, len(data)):
            byte = data[i]
            if self._after_cr:
                self._after_cr = False
                if byte == 0x0A:
                    continue
            if byte not in (0x0A, 0x0D):
                self._line.append(byte)
                continue
            self._after_cr = byte == 0x0D
            event = self._end_line()
            if event is None:
                continue
            if byte == 0x0A:
                out.append((i + 1, event))
            elif i + 1 == len(data):
                self._held = event
            elif data[i + 1] == 0x0A:
                out.append((i + 2, event))
            else:
                out.append((i + 1, event))
        return out

    def _end_line(self) -> ForwardedEvent | None:
        line = self._line.decode("utf-8", errors="replace")
        self._line.clear()
        if line:
            if not line.startswith(":"):
                name, _, value = line.partition(":")
                self._fields.append((name, value[1:] if value.startswith(" ") else value))
            return None
        if not self._fields:
            return None
        fields, self._fields = self._fields, []
        ids = [v for k, v in fields if k == "id"]
        names = [v for k, v in fields if k == "event"]
        retries = [v for k, v in fields if k == "retry" and v.isdigit()]
        return ForwardedEvent(
            id=ids[-1] if ids else None,
            event=names[-1] if names else "message",
            data="\n".join(v for k, v in fields if k == "data"),
            retry=int(retries[-1]) if retries else None,
        )


class _ClientLeg:
    """The client connection: buffered reads that never lose bytes to a cancelled watcher."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending = bytearray()
        self.eof = False

    async def _fill(self) -> bool:
        if self.eof:
            return False
        data = await self.reader.read(_READ_SIZE)
        if not data:
            self.eof = True
            return False
        self.pending += data
        return True

    async def readline(self) -> bytes | None:
        while True:
            index = self.pending.find(b"\n")
            if index >= 0:
                line = bytes(self.pending[: index + 1])
                del self.pending[: index + 1]
                return line
            if len(self.pending) > _MAX_HEAD_BYTES or not await self._fill():
                return None

    async def readexactly(self, size: int) -> bytes | None:
        while len(self.pending) < size:
            if not await self._fill():
                return None
        data = bytes(self.pending[:size])
        del self.pending[:size]
        return data

    async def wait_closed_by_peer(self) -> None:
        """Return once the client has closed its side (bytes read meanwhile are kept)."""
        while await self._fill():
            pass


async def _read_head(readline: Callable[[], Awaitable[bytes | None]]) -> list[str] | None:
    lines: list[str] = []
    while True:
        raw = await readline()
        # None: the client leg's end; b"": a StreamReader's (the upstream's),
        # which it returns at once and for ever: looping on it starved the
        # event loop when a server closed before its status line.
        if not raw:
            return None
        line = raw.decode("latin-1").rstrip("\r\n")
        if not line:
            if lines:
                return lines
            continue  # tolerate stray CRLF between keep-alive requests (RFC 9112 2.2)
        lines.append(line)


def _parse_headers(lines: list[str]) -> tuple[tuple[str, str], ...]:
    headers = []
    for line in lines:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return tuple(headers)


def _header(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)


def _is_chunked(headers: tuple[tuple[str, str], ...]) -> bool:
    value = _header(headers, "transfer-encoding") or ""
    return "chunked" in value.lower()


class Router:
    """A loopback reverse proxy whose routing and severing are decided by *policy*."""

    def __init__(self, policy: Policy, *, name: str = "router") -> None:
        self._policy = policy
        self.name = name
        self.exchanges: list[Exchange] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._changed = asyncio.Condition()
        self._closing = False
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, sock: socket.socket | None = None) -> Router:
        """Listen on ``sock`` (bound, not yet listening), else on any free port."""
        if sock is None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        else:
            self._server = await asyncio.start_server(self._accept, sock=sock)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aenter__(self) -> Router:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop listening and cut every connection, so that no backend keeps a stream open."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        # Closing the sockets ends every pending read with EOF, so the
        # connection tasks finish on their own; cancelling is only the fallback.
        for writer in list(self._writers):
            writer.close()
        tasks = list(self._tasks)
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT_S)
            for task in stuck:
                task.cancel()
            if stuck:
                await asyncio.wait(stuck)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def wait_for(
        self, predicate: Callable[[list[Exchange]], bool], timeout: float = _POLICY_TIMEOUT_S
    ) -> None:
        """Wait until *predicate* holds for the exchange log; it is re-checked on every change."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: predicate(self.exchanges)), timeout
            )

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _release(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        client = _ClientLeg(reader, writer)
        try:
            while await self._serve_one(client):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # either leg went away mid-message: nothing left to proxy
        except asyncio.CancelledError:
            # Only close() cancels a connection task; ending it quietly keeps
            # asyncio's stream callback from reporting the cancellation as an error.
            if not self._closing:
                raise
        finally:
            self._release(writer)
            if task is not None:
                self._tasks.discard(task)

    async def _serve_one(self, client: _ClientLeg) -> bool:
        """Proxy one request; return whether the client connection stays usable."""
        head = await _read_head(client.readline)
        if head is None:
            return False
        method, target = [*head[0].split(" ", 2), "", ""][:2]
        headers = _parse_headers(head[1:])
        body = await _read_request_body(client, headers)
        if body is None:
            return False
        request = RequestHead(method=method.upper(), target=target, headers=headers, body=body)
        route = await asyncio.wait_for(self._decide(request), _POLICY_TIMEOUT_S)
        exchange = Exchange(index=len(self.exchanges), request=request, backend=route.backend.name)
        self.exchanges.append(exchange)
        await self._notify()
        try:
            keep_alive = await self._forward(client, request, route, exchange)
        finally:
            exchange.finished.set()
            exchange.upstream_finished.set()
            await self._notify()
        return keep_alive and "close" not in (request.header("connection") or "").lower()

    async def _decide(self, request: RequestHead) -> Route:
        decided = self._policy(request)
        if inspect.isawaitable(decided):
            decided = await decided
        assert isinstance(decided, Route)
        return decided

    async def _forward(
        self, client: _ClientLeg, request: RequestHead, route: Route, exchange: Exchange
    ) -> bool:
        backend = route.backend
        try:
            up_reader, up_writer = await asyncio.open_connection(backend.host, backend.port)
        except OSError:
            exchange.status = 502
            await _write_bad_gateway(client.writer, b"upstream unavailable")
            return True
        self._writers.add(up_writer)
        try:
            up_writer.write(_upstream_request(request))
            await up_writer.drain()
            status_head = await _read_head(up_reader.readline)
            if status_head is None:
                exchange.status = 502
                await _write_bad_gateway(client.writer, b"upstream closed")
                return True
            parts = status_head[0].split(" ", 2)
            exchange.status = int(parts[1])
            exchange.response_headers = _parse_headers(status_head[1:])
            await self._notify()
            reason = parts[2] if len(parts) > 2 else ""
            return await self._relay(client, request, route, exchange, up_reader, reason)
        finally:
            self._release(up_writer)

    async def _relay(
        self,
        client: _ClientLeg,
        request: RequestHead,
        route: Route,
        exchange: Exchange,
        up_reader: asyncio.StreamReader,
        reason: str,
    ) -> bool:
        status = exchange.status or 502
        up_headers = exchange.response_headers
        no_body = request.method == "HEAD" or status in (204, 304) or 100 <= status < 200
        length_text = _header(up_headers, "content-length")
        fixed_length = None if _is_chunked(up_headers) or length_text is None else int(length_text)
        head = [f"HTTP/1.1 {status} {reason}".rstrip()]
        head += [f"{k}: {v}" for k, v in up_headers if k.lower() not in _HOP_BY_HOP]
        chunked = fixed_length is None
        if not no_body:
            head.append(
                "Transfer-Encoding: chunked" if chunked else f"Content-Length: {fixed_length}"
            )
        client.writer.write("\r\n".join([*head, "", ""]).encode("latin-1"))
        await client.writer.drain()
        if no_body:
            return True

        scanner = SseScanner()
        payload = _upstream_payload(up_reader, up_headers, fixed_length)
        # A client that closes a live-tail stream must be noticed even while the
        # backend is silent, or the backend would keep that stream open forever.
        closed_by_peer = asyncio.ensure_future(client.wait_closed_by_peer())
        try:
            while True:
                next_piece = asyncio.ensure_future(payload.__anext__())
                await asyncio.wait(
                    {next_piece, closed_by_peer}, return_when=asyncio.FIRST_COMPLETED
                )
                if not next_piece.done():
                    next_piece.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                        await next_piece  # the generator must be idle before aclose()
                    exchange.client_closed = True
                    return False
                try:
                    piece = next_piece.result()
                except StopAsyncIteration:
                    break
                cut_at = self._scan(scanner, piece, route, exchange)
                forward = piece if cut_at is None else piece[:cut_at]
                if forward:
                    client.writer.write(
                        b"%x\r\n%s\r\n" % (len(forward), forward) if chunked else forward
                    )
                    await client.writer.drain()
                await self._notify()
                if cut_at is not None:
                    await self._sever(client, route, exchange, payload)
                    return False
            if chunked:
                client.writer.write(b"0\r\n\r\n")
                await client.writer.drain()
            return not client.eof
        finally:
            closed_by_peer.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await closed_by_peer
            await payload.aclose()

    @staticmethod
    def _scan(scanner: SseScanner, piece: bytes, route: Route, exchange: Exchange) -> int | None:
        """Record the events in *piece*; return where to cut it if the sever point is inside."""
        for offset, event in scanner.feed(piece):
            exchange.events.append(event)
            if route.sever_after_events is not None and len(exchange.events) >= (
                route.sever_after_events
            ):
                return offset
            if route.sever_after is not None and route.sever_after(event):
                return offset
        return None

    async def _sever(
        self,
        client: _ClientLeg,
        route: Route,
        exchange: Exchange,
        payload: AsyncIterator[bytes],
    ) -> None:
        # The idle timeout fires: the client has the event's bytes, then its
        # connection closes without the chunked terminator.
        exchange.severed = True
        client.writer.close()
        exchange.finished.set()
        await self._notify()
        if route.drain_upstream:
            async for _ in payload:
                pass


async def _read_request_body(
    client: _ClientLeg, headers: tuple[tuple[str, str], ...]
) -> bytes | None:
    if _is_chunked(headers):
        body = bytearray()
        while True:
            size_line = await client.readline()
            if size_line is None:
                return None
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                await client.readline()  # the blank line after the last chunk (no trailers sent)
                return bytes(body)
            chunk = await client.readexactly(size + 2)
            if chunk is None:
                return None
            body += chunk[:-2]
    length = int(_header(headers, "content-length") or "0")
    return await client.readexactly(length) if length else b""


def _upstream_request(request: RequestHead) -> bytes:
    lines = [f"{request.method} {request.target} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in request.headers if k.lower() not in _HOP_BY_HOP]
    # One upstream connection per request keeps the proxy simple and lets a
    # backend see the disconnect of exactly the stream that was cut.
    lines += [f"Content-Length: {len(request.body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + request.body


async def _upstream_payload(
    reader: asyncio.StreamReader,
    headers: tuple[tuple[str, str], ...],
    fixed_length: int | None,
) -> AsyncIterator[bytes]:
    """Yield the response payload as it arrives, with the upstream framing removed."""
    if _is_chunked(headers):
        while size_line := await reader.readline():
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif fixed_length is not None:
        remaining = fixed_length
        while remaining > 0 and (data := await reader.read(min(remaining, _READ_SIZE))):
            remaining -= len(data)
            yield data
    else:
        while data := await reader.read(_READ_SIZE):
            yield data


async def _write_bad_gateway(writer: asyncio.StreamWriter, text: bytes) -> None:
    writer.write(
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
        % (len(text), text)
    )
    await writer.drain()
