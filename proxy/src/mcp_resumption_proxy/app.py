# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The forwarding: ``ProxyApp``, a raw ASGI app whose upstream leg is one
httpx client.

Every request goes to the same path and query at the upstream's origin.
This module decides, per request, where its answer comes from: the
downstream leg's check of a resume (and the guard's ``410``), enforce mode's
replaced session (``404``) and the requests a response must answer, an
unreachable upstream (``502``), and with ``--resumable`` the relay that
serves a client from its cursor (this process's, or another instance's
through the fleet's Redis).  An upstream response itself is passed to the
client by the app's base ``passthrough.Passthrough`` (byte for byte, the
legacy ``endpoint`` event rewritten where it names the upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import httpx

from opentelemetry.instrumentation.mcp_resumption import ResumptionGapError

from . import enforce, resumable
from .downstream import DownstreamView
from .forwarding import (
    TIMEOUT,
    UPSTREAM_ERROR,
    ClientGone,
    Receive,
    RequestBody,
    Scope,
    Send,
    answer_events,
    client_left,
    decoded_text,
    end_to_end,
    header_of,
    is_sse,
    jsonrpc_error,
    new_ledger,
    new_relays,
    read_body,
    request_id_of,
    respond,
    with_forwarded,
)
from .passthrough import Passthrough


class ProxyApp(Passthrough):
    """The ASGI app: forwards every HTTP request to ``upstream``'s origin
    (a response, through its base ``Passthrough``).

    ``downstream``: the client leg's view of resumes (None: not reported).
    ``client``: the upstream leg (made here unless given; closed at shutdown
    if made here).  ``resumable``: keep forwarded events (``resumable.py``).
    ``enforce``: fail closed (``enforce.py``); then
    ``stream_error`` tells the error the client half decided for an upstream
    response after its read (the confirmation window's verdict, made on the
    timer's thread), polled every ``poll`` seconds.
    """

    def __init__(
        self,
        upstream: str,
        *,
        downstream: DownstreamView | None = None,
        client: httpx.AsyncClient | None = None,
        enforce: bool = False,
        stream_error: Callable[[httpx.Response], BaseException | None] | None = None,
        poll: float = 0.05,
        resumable: bool = False,
        enforced_errors: Any = None,
        shared_relays: Any = None,
    ) -> None:
        url = httpx.URL(upstream)
        self.upstream = url
        self.upstream_origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
        self.downstream = downstream
        self.enforce = enforce
        self.ledger = new_ledger() if enforce else None
        self.stream_error = stream_error
        self.poll = poll
        self.relays = new_relays() if resumable else None
        if self.relays is not None:
            # The fleet's buffers (shared.SharedRelays), None: this process's.
            self.relays.shared = shared_relays
        # The client half's ContextVar of the errors it decided where no read
        # was left to raise them into (a stream that ended empty): set in the
        # task that reads, as the MCP SDK patch sets it around its reconnects.
        self.enforced_errors = enforced_errors
        self._own_client = client is None
        self.client = client or httpx.AsyncClient(
            timeout=TIMEOUT,
            # A proxy of streams holds one upstream connection per open stream.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._own_client:
                    await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def aclose(self) -> None:
        if self._own_client:
            await self.client.aclose()

    # ------------------------------------------------------------ one request

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._request(scope, receive, send)
        finally:
            if self.downstream is not None:
                # The ids this response forwarded, for the rest of the fleet
                # (queued: nothing waits for Redis here).
                self.downstream.save()

    async def _request(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if body is None:
            await respond(send, 413, jsonrpc_error(None, UPSTREAM_ERROR, "request too large"))
            return
        if body is False:
            return  # the client left before its request was whole
        headers = list(scope.get("headers") or ())
        method = scope["method"]
        session_id = decoded_text(header_of(headers, b"mcp-session-id"))
        cursor = decoded_text(header_of(headers, b"last-event-id"))
        resume = cursor is not None and method == "GET"
        if resume and self.downstream is not None:
            if self.downstream.shared is not None:
                # A cursor another instance of the fleet forwarded: one
                # bounded read, off the event loop.
                await asyncio.to_thread(self.downstream.prefetch, cursor)
            server = scope.get("server") or ("", None)
            outcome = self.downstream.resumed(cursor, session_id, str(server[0]), server[1])
            if outcome == "rejected_by_guard":
                await respond(send, 410, jsonrpc_error(
                    None, UPSTREAM_ERROR, "mcp-resumption-proxy: this proxy never forwarded "
                    "that event id in this session: the events after it cannot be vouched for"))
                return
        ledger = self.ledger
        pending = None
        if ledger is not None:
            if session_id is not None and ledger.is_changed(session_id):
                # The specification's answer to an unknown session: the
                # client starts a new one.
                await respond(send, 404, jsonrpc_error(
                    request_id_of(body), enforce.GAP_ERROR,
                    "mcp-resumption-proxy: the server replaced this session; re-initialize"))
                return
            if resume:
                pending = ledger.resumed(cursor)
            elif method == "POST":
                pending = enforce.Pending(enforce.request_ids(body))
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        upstream_headers = with_forwarded(end_to_end(headers, b"host", b"content-length"), scope)
        relay = None
        if resume and self.relays is not None:
            found = self.relays.find(cursor)
            if found is None and self.relays.shared is not None:
                # Another instance's relay: followed from Redis, or taken
                # over where its upstream broke.
                remote = await asyncio.to_thread(self.relays.shared.find, cursor, session_id)
                if remote is not None:
                    after = int(cursor.rsplit(":", 1)[1])
                    if not remote.upstream_broke():
                        remote.forwarded = self._forwarded(session_id)
                        await self._follow(receive, send, remote, after, [])
                        return
                    frames = await asyncio.to_thread(remote.read_all, after)
                    if frames is not None:
                        found = (self.relays.adopt(remote, frames), after)
            if found is not None:
                relay, after = found
                if not (relay.ended and relay.failed and relay.upstream_last_id):
                    await self._follow(receive, send, relay, after, [])
                    return
                # The upstream broke too: resume it from its own last id,
                # into the same relay, and serve the client from its cursor.
                upstream_headers = [
                    (k, relay.upstream_last_id.encode("latin-1") if k.lower() == b"last-event-id"
                     else v) for k, v in upstream_headers
                ]
        if self.relays is not None and method == "GET" and cursor is None:
            # The client re-opens a standalone GET stream the proxy still
            # holds: the server would refuse a second one (409).
            held = self.relays.standalone(session_id, headers)
            if held is not None:
                await self._follow(receive, send, held, held.written, held.headers, held.status)
                return
        request = httpx.Request(
            method,
            self.upstream_origin + target.decode("latin-1"),
            headers=upstream_headers,
            content=body,
        )
        try:
            response = await self.client.send(request, stream=True, follow_redirects=True)
        except (httpx.HTTPError, ResumptionGapError) as error:
            # The type only: an httpx message may quote a header value.
            message = f"mcp-resumption-proxy: upstream unreachable ({type(error).__name__})"
            if isinstance(error, ResumptionGapError):
                message = f"mcp-resumption-proxy: {error}"
            elif resume:
                message = (f"mcp-resumption-proxy: the server did not answer the resume "
                           f"({type(error).__name__}): the answers of the broken stream are lost")
            if pending is not None and pending.ids:
                await answer_events(send, enforce.error_events(pending, message))
                return
            await respond(send, 502, jsonrpc_error(request_id_of(body), UPSTREAM_ERROR, message))
            return
        try:
            if ledger is not None:
                answered_in = decoded_text(header_of(list(response.headers.raw), b"mcp-session-id"))
                if session_id is not None and answered_in not in (None, session_id):
                    ledger.session_changed(session_id)
                if resume and pending is not None and pending.ids and (
                    response.status_code >= 300
                ):
                    message = (f"mcp-resumption-proxy: the server refused the resume "
                               f"(HTTP {response.status_code}): the answers are lost")
                    await answer_events(send, enforce.error_events(pending, message))
                    return
            if relay is not None and response.status_code == 200 and is_sse(response):
                resumable.start(relay, response, self._forwarded(session_id))
                response = None  # the relay's now
                await self._follow(receive, send, relay, after, [])
                return
            if self.relays is not None and is_sse(response):
                session = decoded_text(header_of(list(response.headers.raw), b"mcp-session-id"))
                relay = self.relays.new(session or session_id)
                start_headers = end_to_end(list(response.headers.raw), b"content-length")
                status = response.status_code
                if method == "GET" and cursor is None and status == 200 and (session or session_id):
                    self.relays.hold_standalone(relay, session or session_id, headers, status,
                                                start_headers)
                resumable.start(relay, response, self._forwarded(session or session_id))
                response = None
                await self._follow(receive, send, relay, 0, start_headers, status)
                return
            await self._relay(scope, receive, send, method, headers, session_id, response,
                              pending)
        finally:
            if response is not None:
                await response.aclose()

    def _forwarded(self, session: str | None) -> Callable[[str], None] | None:
        downstream = self.downstream
        if downstream is None:
            return None
        return lambda event_id: downstream.forwarded(event_id, session)

    async def _follow(
        self,
        receive: Receive,
        send: Send,
        relay: resumable.Relay | Any,
        after: int,
        headers: list[tuple[bytes, bytes]],
        status: int = 200,
    ) -> None:
        """Serve one client from ``relay``, from its cursor on; its leaving
        leaves the relay reading."""
        if not headers:
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        out = RequestBody(send, None)

        async def forward() -> None:
            async for frame in relay.follow(after):
                await out.write(frame)

        forwarding = asyncio.ensure_future(forward())
        watching = asyncio.ensure_future(client_left(receive))
        try:
            await asyncio.wait({forwarding, watching}, return_when=asyncio.FIRST_COMPLETED)
            if not forwarding.done():
                forwarding.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await forwarding
                return
            if forwarding.exception() is not None or relay.failed:
                return  # broken as the upstream broke: the client resumes here
            with contextlib.suppress(ClientGone):
                await out.finish()
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
