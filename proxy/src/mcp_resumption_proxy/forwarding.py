# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The pieces of the forwarding that know HTTP, not MCP: which headers go
end to end and the ``X-Forwarded-*`` the proxy adds, the tee that hands the
upstream's bytes on as httpx reads them (``Tee``), the request's body, the
legacy ``endpoint`` event's rewrite, and the ASGI answers the proxy makes
itself.  ``app.ProxyApp`` composes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from . import enforce, resumable

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# RFC 9110 7.6.1, and the framing headers each leg derives on its own.
HOP_BY_HOP = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
        b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    }
)  # fmt: skip
# A JSON-RPC request body is small; a larger one is refused before it costs
# the proxy more than this.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
# A JSON answer up to this size is read whole so that the client half sees
# it (as an SDK would read it); a larger one streams through unobserved.
MAX_OBSERVED_JSON = 4 * 1024 * 1024
# The largest SSE event the upstream leg parses (and so holds whole); the
# bytes of a larger one still pass, unobserved.
MAX_EVENT_BYTES = 16 * 1024 * 1024
# The legacy stream's first block is held until it ends (to rewrite an
# absolute endpoint URL); a first block longer than this is no endpoint.
MAX_HELD = 64 * 1024
# A stream may idle for as long as the server likes (a GET stream between
# notifications); connecting and writing may not.
TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=30.0)
# JSON-RPC's implementation-defined server error range.
UPSTREAM_ERROR = -32000

BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


def jsonrpc_error(request_id: Any, code: int, message: str) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    ).encode()


def request_id_of(body: bytes) -> Any:
    """The id of the JSON-RPC request in ``body``, else None (a notification,
    a batch, not JSON)."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if isinstance(message, dict) and "method" in message:
        request_id = message.get("id")
        if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
            return request_id
    return None


def connection_tokens(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The headers a Connection header names: hop-by-hop too (RFC 9110 7.6.1)."""
    named = set()
    for key, value in headers:
        if key.lower() == b"connection":
            named.update(token.strip().lower() for token in value.split(b","))
    return frozenset(named)


def end_to_end(headers: list[tuple[bytes, bytes]], *also: bytes) -> list[tuple[bytes, bytes]]:
    drop = HOP_BY_HOP | connection_tokens(headers) | frozenset(also)
    return [(key, value) for key, value in headers if key.lower() not in drop]


def with_forwarded(headers: list[tuple[bytes, bytes]], scope: Scope) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``X-Forwarded-For``, ``-Proto`` and ``-Host`` for the
    upstream: the client's ``X-Forwarded-For`` list kept and the proxy's
    peer appended (so a server trusting the proxy finds the client's
    address where it looks, the nearest untrusted hop); the client's own
    ``-Proto`` and ``-Host`` kept (a TLS terminator in front of the proxy
    names the scheme and host the user typed), else the proxy's scheme and
    the ``Host`` the client asked the proxy for."""
    drop = (b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host")
    kept = [(key, value) for key, value in headers if key.lower() not in drop]
    chain = [value.strip() for key, value in headers
             if key.lower() == b"x-forwarded-for" and value.strip()]
    client = scope.get("client")
    chain.append(str(client[0]).encode("latin-1") if client else b"unknown")
    kept.append((b"x-forwarded-for", b", ".join(chain)))
    scheme = str(scope.get("scheme") or "http").encode("latin-1")
    kept.append((b"x-forwarded-proto", header_of(headers, b"x-forwarded-proto") or scheme))
    # ``headers`` come without Host (the upstream's is set by httpx): the
    # client's is in the request as it arrived.
    host = header_of(headers, b"x-forwarded-host") or header_of(
        list(scope.get("headers") or ()), b"host")
    if host is None and scope.get("server"):
        name, port = scope["server"][0], scope["server"][1]
        shown = f"[{name}]" if ":" in str(name) else str(name)
        host = (shown if port is None else f"{shown}:{port}").encode("latin-1")
    if host:
        kept.append((b"x-forwarded-host", host))
    return kept


def header_of(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


class Tee(httpx.AsyncByteStream):
    """The upstream's raw body, each chunk handed to ``out`` as soon as the
    parser has taken in the events it completes: when httpx asks for the
    next chunk, before that chunk is awaited.  So an event's bytes reach the
    client only once the proxy recorded it (its id, the client half's
    verdicts), and never wait on the upstream's next bytes."""

    def __init__(
        self, inner: Any, out: Callable[[bytes], Awaitable[None]], limit: int | None = None
    ) -> None:
        self._inner = inner
        self._out = out
        # An SSE parser holds one event whole: a stream whose event grows past
        # ``limit`` bytes is no longer handed to it (``EventTooLarge``).
        self.limit = limit
        self._open = 0  # bytes since the last blank line seen
        self._unsent: bytes | None = None
        # Chunks handed to the parser, and of them written to the client: an
        # answer parsed in chunk ``read`` reached the client once ``sent`` is
        # there (client_leg.Watch).
        self.read = 0
        self.sent = 0

    failed = False  # the upstream's read failed (not a parser's, not the client's)
    # Whether the client's connection is gone (``client_gone``): a server's
    # send to a closed connection returns as if it wrote.  None: not asked.
    gone: Callable[[], bool] | None = None

    def written(self) -> int:
        return self.sent

    async def flush(self) -> None:
        unsent, self._unsent = self._unsent, None
        if unsent:
            await self._out(unsent)
            if self.gone is None or not self.gone():
                self.sent = self.read

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        while True:
            await self.flush()
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except Exception:
                self.failed = True
                raise
            self._unsent = chunk
            self.read += 1
            if self.limit is not None:
                end = max(chunk.rfind(b"\n\n"), chunk.rfind(b"\r\r"), chunk.rfind(b"\n\r\n"))
                self._open = len(chunk) - end if end >= 0 else self._open + len(chunk)
                if self._open > self.limit:
                    self.limit = None  # what is left passes unparsed
                    raise EventTooLarge(self._open)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class EventTooLarge(Exception):
    """An SSE event outgrew MAX_EVENT_BYTES: the stream passes unobserved."""


class ClientGone(Exception):
    """The client's connection to the proxy closed."""


class RequestBody:
    """The response body toward the client: chunks as they come, except a
    legacy stream's first block, held until it ends."""

    def __init__(self, send: Send, rewrite: Callable[[bytes], bytes] | None) -> None:
        self._send = send
        self._rewrite = rewrite
        self._held = bytearray() if rewrite is not None else None

    async def write(self, chunk: bytes) -> None:
        if self._held is not None:
            self._held += chunk
            end = first_block_end(self._held)
            if end is None and len(self._held) <= MAX_HELD:
                return
            held, self._held = bytes(self._held), None
            if end is not None and self._rewrite is not None:
                held = self._rewrite(held[:end]) + held[end:]
            chunk = held
        if chunk:
            await self._out(chunk, True)

    async def finish(self) -> None:
        if self._held:
            held, self._held = bytes(self._held), None
            await self._out(held, True)
        await self._out(b"", False)

    async def _out(self, body: bytes, more: bool) -> None:
        try:
            await self._send({"type": "http.response.body", "body": body, "more_body": more})
        except OSError as error:  # uvicorn's ClientDisconnected, a reset
            raise ClientGone from error


def first_block_end(buffer: bytearray) -> int | None:
    match = BLANK_LINE.search(buffer)
    if match is None:
        return None
    end = match.end()
    if buffer[end - 1 : end] == b"\r" and end == len(buffer):
        return None  # an LF may follow in the next chunk, and belongs to this block
    return end


def endpoint_rewriter(upstream_origin: str, public_origin: str) -> Callable[[bytes], bytes]:
    """Rewrites an ``endpoint`` event naming the upstream's origin to name the
    proxy's; any other block passes as it is."""
    old, new = upstream_origin.encode(), public_origin.encode()
    data_line = re.compile(rb"^(data: ?)" + re.escape(old), re.MULTILINE)

    def rewrite(block: bytes) -> bytes:
        if not re.search(rb"^event: ?endpoint\r?$", block, re.MULTILINE):
            return block
        return data_line.sub(lambda m: m.group(1) + new, block, count=1)

    return rewrite


async def ignore(chunk: bytes) -> None:
    pass


def new_ledger() -> enforce.Ledger:
    return enforce.Ledger()


def new_relays() -> resumable.Relays:
    return resumable.Relays()


def is_sse(response: httpx.Response) -> bool:
    content_type = header_of(list(response.headers.raw), b"content-type") or b""
    return b"text/event-stream" in content_type.split(b";", 1)[0]


async def answer_events(send: Send, events: bytes) -> None:
    """A 200 SSE answer carrying ``events``, complete."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"),
                            (b"cache-control", b"no-cache")]})
    await send({"type": "http.response.body", "body": events})


async def rest_of(tee: Tee) -> bool:
    """Forward what is left of a body whose parse failed; False if it broke."""
    try:
        await tee.flush()
        async for _ in tee:
            pass
    except Exception:
        return False
    return True


async def drain(response: httpx.Response) -> None:
    async for _ in response.aiter_raw():
        pass


def is_small(headers: list[tuple[bytes, bytes]]) -> bool:
    length = header_of(headers, b"content-length")
    try:
        return length is not None and int(length) <= MAX_OBSERVED_JSON
    except ValueError:
        return False


def decoded_text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


async def read_body(receive: Receive) -> bytes | bool | None:
    """The request body; None when it is larger than MAX_REQUEST_BYTES,
    False when the client disconnected first."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def client_gone(receive: Receive, watching: Any) -> Callable[[], bool]:
    """Whether the client's connection is closed, as of now: uvicorn's own
    flag (its send to a closed connection returns as if it wrote; its
    ``http.disconnect`` reaches a reader one turn later), else the task
    that reads ``http.disconnect``."""
    cycle = getattr(receive, "__self__", None)
    if isinstance(getattr(cycle, "disconnected", None), bool):
        return lambda: cycle.disconnected
    return watching.done


async def client_left(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def respond(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
