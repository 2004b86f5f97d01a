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
import logging
from collections.abc import Callable
from typing import Any

import httpx
from opentelemetry.instrumentation.utils import suppress_instrumentation

from opentelemetry.instrumentation.mcp_resumption import ResumptionGapError
from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc

from . import enforce, resumable
from .client_leg import NOT_FORWARDED, UNCARRIED_CURSOR, ClientLeg, Watch
from .downstream import UNCARRIED, DownstreamView
from .forwarding import (
    TIMEOUT,
    UPSTREAM_ERROR,
    ClientGone,
    Receive,
    RequestBody,
    Scope,
    Send,
    answer_events,
    client_gone,
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
        client_leg: ClientLeg | None = None,
        reachability: Any = None,
    ) -> None:
        url = httpx.URL(upstream)
        self.upstream = url
        self.upstream_origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
        self.downstream = downstream
        # The client leg's broken requests: reported where the resumes are.
        self.client_leg = client_leg if client_leg is not None or downstream is None else (
            ClientLeg.for_leg())
        # What the requests tell of the upstream's reachability
        # (admin.UpstreamProbe's request_failed and request_answered).
        self.reachability = reachability
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
                _quiet_deliberate_breaks()
                if self.client_leg is not None:
                    self.client_leg.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def stop_waiting(self) -> None:
        """The proxy stops: every answer not delivered to its client is lost,
        counted on its leg now (before the exit's summary and last export),
        and those of streams cut from here on as they end."""
        if self.client_leg is not None:
            self.client_leg.stop_waiting()

    async def aclose(self) -> None:
        self.stop_waiting()
        if self._own_client:
            await self.client.aclose()

    # ------------------------------------------------------------ one request

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        held: list[Watch] = []  # what the response is to answer (client_leg.py)
        how = "done"
        try:
            await self._request(scope, receive, send, held)
        except BaseException:
            how = "cut"  # cancelled (shutdown), or the forwarding failed
            raise
        finally:
            if held and self.client_leg is not None:
                watch = held[0]
                self.client_leg.ended(watch, watch.how or how,
                                      watch.progress() if watch.progress is not None else None)
            if self.downstream is not None:
                # The ids this response forwarded, for the rest of the fleet
                # (queued: nothing waits for Redis here).
                self.downstream.save()

    async def _request(
        self, scope: Scope, receive: Receive, send: Send, held: list[Watch]
    ) -> None:
        judged: tuple[Any, ...] | None = None  # a resume's replayed, once forwarded
        outcome = None
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
        if method == "DELETE" and session_id is not None and self.relays is not None:
            self.relays.session_ended(session_id)
        leg = self.client_leg
        watch = None
        if leg is not None:
            if method == "POST":
                watch = leg.watch_post(body, leg.server_of(scope), session_id, decoded_text(
                    header_of(headers, b"mcp-protocol-version")),
                    decoded_text(header_of(headers, b"authorization")))
            elif resume:
                watch = leg.watch_resume(leg.server_of(scope), session_id)
                if watch is None and leg.fleet is not None:
                    # Answers another instance of the fleet stopped without
                    # delivering: this resume's to settle (a bounded read).
                    taken = await asyncio.to_thread(leg.fleet.take, session_id)
                    if taken:
                        watch = leg.take_over(taken, leg.server_of(scope), session_id)
            if watch is not None:
                held.append(watch)
        if resume and self.downstream is not None:
            if self.downstream.shared is not None:
                # A cursor another instance of the fleet forwarded: one
                # bounded read, off the event loop.
                await asyncio.to_thread(self.downstream.prefetch, cursor)
            server = scope.get("server") or ("", None)
            address, port = str(server[0]), server[1]
            outcome = self.downstream.judge_resume(cursor, session_id, address, port)
            if outcome == UNCARRIED and self.client_leg is not None:
                self.client_leg.resume_apart(UNCARRIED_CURSOR, self.client_leg.server_of(scope))
            elif outcome == sc.SERVER_REPLAYED:
                judged = (cursor, session_id, address, port)
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
                        self._replayed(judged)
                        await self._follow(receive, send, remote, after, [], watch=watch)
                        return
                    frames = await asyncio.to_thread(remote.read_all, after)
                    if frames is not None:
                        found = (self.relays.adopt(remote, frames), after)
            if found is not None:
                relay, after = found
                if not (relay.ended and relay.failed and relay.upstream_last_id):
                    self._replayed(judged)
                    await self._follow(receive, send, relay, after, [], watch=watch)
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
            if outcome == UNCARRIED:
                # Not a resume of anything this proxy carried: forwarded as
                # it is, and not judged on the upstream leg either (a made-up
                # cursor is no loss between proxy and server).
                with suppress_instrumentation():
                    response = await self.client.send(request, stream=True,
                                                      follow_redirects=True)
            else:
                response = await self.client.send(request, stream=True, follow_redirects=True)
        except (httpx.HTTPError, ResumptionGapError) as error:
            if self.reachability is not None and isinstance(
                error, (httpx.ConnectError, httpx.ConnectTimeout)
            ):
                self.reachability.request_failed(error)
            self._not_forwarded(judged, scope)
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
        reachability = self.reachability
        if reachability is not None and reachability.reachable is not True:
            reachability.request_answered()
        if response.status_code >= 400:
            self._not_forwarded(judged, scope)
        else:
            self._replayed(judged)
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
                resumable.start(relay, response, self._forwarded(session_id),
                                self._poller(target, upstream_headers))
                response = None  # the relay's now
                await self._follow(receive, send, relay, after, [], watch=watch)
                return
            if self.relays is not None and is_sse(response):
                session = decoded_text(header_of(list(response.headers.raw), b"mcp-session-id"))
                relay = self.relays.new(session or session_id)
                start_headers = end_to_end(list(response.headers.raw), b"content-length")
                status = response.status_code
                if method == "GET" and cursor is None and status == 200 and (session or session_id):
                    self.relays.hold_standalone(relay, session or session_id, headers, status,
                                                start_headers)
                if method == "POST":
                    relay.pending = enforce.Pending(enforce.request_ids(body))
                resumable.start(relay, response, self._forwarded(session or session_id),
                                self._poller(target, upstream_headers, session))
                response = None
                await self._follow(receive, send, relay, 0, start_headers, status, watch=watch)
                return
            await self._relay(scope, receive, send, method, headers, session_id, response,
                              pending, watch)
        finally:
            if response is not None:
                await response.aclose()

    def _poller(
        self, target: bytes, headers: list[tuple[bytes, bytes]], session: str | None = None
    ) -> resumable.Poll:
        """How a relay resumes its upstream stream itself, as the client
        would (a GET with the upstream's own last id, the client's
        credentials and session): for a server that closed it on purpose.
        ``session``: the session the answer named, for a request that had
        none yet (an ``initialize``: a client resumes it in the session it
        was given)."""
        url = self.upstream_origin + target.decode("latin-1")
        kept = [(k, v) for k, v in headers
                if k.lower() not in (b"last-event-id", b"accept", b"content-type")]
        if session and not any(k.lower() == b"mcp-session-id" for k, _ in kept):
            kept.append((b"mcp-session-id", session.encode("latin-1")))

        async def poll(last_id: str) -> httpx.Response | None:
            request = httpx.Request("GET", url, headers=[
                *kept, (b"accept", b"text/event-stream"),
                (b"last-event-id", last_id.encode("latin-1"))])
            response = await self.client.send(request, stream=True, follow_redirects=True)
            if response.status_code == 200 and is_sse(response):
                return response
            await response.aclose()
            return None

        return poll

    def _replayed(self, judged: tuple[Any, ...] | None) -> None:
        """A resume from a carried cursor was handed on: ``replayed`` on the
        client leg (the upstream leg judges what the server replays)."""
        if judged is not None and self.downstream is not None:
            self.downstream.record(sc.SERVER_REPLAYED, *judged)

    def _not_forwarded(self, judged: tuple[Any, ...] | None, scope: Scope) -> None:
        """A resume the proxy could not forward, or the server refused: not
        ``replayed`` (the upstream leg gives its verdict: rejected, failed)."""
        if judged is not None and self.client_leg is not None:
            self.client_leg.resume_apart(NOT_FORWARDED, self.client_leg.server_of(scope))

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
        *,
        watch: Watch | None = None,
    ) -> None:
        """Serve one client from ``relay``, from its cursor on; its leaving
        leaves the relay reading.  ``watch``: the answers it may carry."""
        if not headers:
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        out = RequestBody(send, None)

        async def forward() -> None:
            async for frame in relay.follow(after):
                await out.write(frame)
                if watch is not None and not gone():
                    watch.seen_frames(frame)

        forwarding = asyncio.ensure_future(forward())
        watching = asyncio.ensure_future(client_left(receive))
        gone = client_gone(receive, watching)
        if watch is not None:
            watch.gone = gone
        try:
            await asyncio.wait({forwarding, watching}, return_when=asyncio.FIRST_COMPLETED)
            if not forwarding.done():
                forwarding.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await forwarding
                if watch is not None:
                    watch.how = "left"
                    _ended_by_client(relay, watch)
                return
            if forwarding.exception() is not None or relay.failed:
                if watch is not None:
                    watch.how = "left" if isinstance(forwarding.exception(), ClientGone) else (
                        "upstream")
                    if watch.how == "left":
                        _ended_by_client(relay, watch)
                return  # broken as the upstream broke: the client resumes here
            if watch is not None and gone():
                watch.how = "left"
            with contextlib.suppress(ClientGone):
                await out.finish()
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching


def _ended_by_client(relay: resumable.Relay | Any, watch: Watch) -> None:
    """The client closed a listen's stream: its end of the subscription
    (2026-07-28 cancels by closing, and has no resume), passed on to the
    server at once rather than read on for a resume that never comes, which
    would leave it open until the proxy stops: a subscription lost there."""
    task = getattr(relay, "task", None)
    if watch.subscription and task is not None:
        task.cancel()


class _DeliberateBreaks(logging.Filter):
    """uvicorn's line for a response the app left unfinished: the proxy does
    so on purpose, so that a client whose upstream stream broke sees its own
    stream break (ASGI has no other way to break a response without a
    traceback).  Only that line; the rest of uvicorn's log stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "ASGI callable returned without completing response."


def _quiet_deliberate_breaks() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DeliberateBreaks) for f in logger.filters):
        logger.addFilter(_DeliberateBreaks())
