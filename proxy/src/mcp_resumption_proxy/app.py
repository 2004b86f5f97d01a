# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The forwarding: a raw ASGI app whose upstream leg is one httpx client.

Every request goes to the same path and query at the upstream's origin.  The
response's bytes reach the client as the upstream sent them, chunk by chunk:
they are handed on from inside httpx's read (``forwarding.Tee``), once the SSE parse
(httpx-sse's, which the client half observes) has taken in the events a
chunk completes and before the next chunk is awaited.  So what a client
receives is the upstream's body byte for byte (comments, line ends and
malformed SSE included), never waits for a whole body or for the upstream's
next bytes, and carries no event the proxy has not recorded.  A JSON answer
is read through ``aread()``, so that the client half sees the answer to its
request, as it would in an SDK.

Only one thing is ever rewritten: the legacy transport's ``endpoint`` event,
when it names the upstream by an absolute URL (the SDKs send a path, which
resolves against the proxy as it is).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import httpx
from httpx_sse import EventSource

from opentelemetry.instrumentation.mcp_resumption import ResumptionGapError

from . import enforce, resumable
from .downstream import DownstreamView
from .forwarding import (
    MAX_EVENT_BYTES,
    TIMEOUT,
    UPSTREAM_ERROR,
    ClientGone,
    Receive,
    RequestBody,
    Scope,
    Send,
    Tee,
    answer_events,
    client_left,
    decoded_text,
    drain,
    end_to_end,
    endpoint_rewriter,
    header_of,
    ignore,
    is_small,
    is_sse,
    jsonrpc_error,
    new_ledger,
    new_relays,
    read_body,
    request_id_of,
    respond,
    rest_of,
)

_logger = logging.getLogger(__name__)


class ProxyApp:
    """The ASGI app: forwards every HTTP request to ``upstream``'s origin.

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
        upstream_headers = end_to_end(headers, b"host", b"content-length")
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

    async def _relay(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        method: str,
        request_headers: list[tuple[bytes, bytes]],
        session_id: str | None,
        response: httpx.Response,
        pending: enforce.Pending | None = None,
    ) -> None:
        raw_headers = list(response.headers.raw)
        content_type = (header_of(raw_headers, b"content-type") or b"").split(b";", 1)[0]
        # httpx-sse's own test (case-sensitive, a substring): the streams an
        # SDK client would parse are the ones the client half sees parsed.
        sse = b"text/event-stream" in content_type
        content_type = content_type.strip().lower()
        rewrite = None
        if (
            sse
            and method == "GET"
            and session_id is None
            and header_of(raw_headers, b"content-length") is None
        ):
            host = decoded_text(header_of(request_headers, b"host")) or "127.0.0.1"
            rewrite = endpoint_rewriter(self.upstream_origin, f"{scope.get('scheme', 'http')}://{host}")
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": end_to_end(raw_headers),
            }
        )
        out = RequestBody(send, rewrite)
        session = decoded_text(header_of(raw_headers, b"mcp-session-id")) or session_id
        enforced = sse and pending is not None
        # Enforce mode forwards an event only once the client half let it
        # through: written anew from the parse, not teed.
        tee = response.stream = Tee(
            response.stream, ignore if enforced else out.write,
            MAX_EVENT_BYTES if sse else None,
        )
        ids = self.downstream.response(session) if self.downstream is not None else None
        if enforced:
            pump = self._enforced_events(response, session, out, pending, ids)
        elif sse:
            pump = self._events(response, session, ids)
        elif content_type == b"application/json" and is_small(raw_headers):
            pump = response.aread()
        else:
            pump = drain(response)
        pumping = asyncio.ensure_future(pump)
        watching = asyncio.ensure_future(client_left(receive))
        waits = {pumping, watching}
        if enforced and self.stream_error is not None:
            judged = asyncio.ensure_future(self._judged(response))
            waits.add(judged)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not pumping.done():  # the client left, or the client half refused the stream
                pumping.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pumping
                if enforced and not watching.done() and pending is not None:
                    error = self.stream_error(response) if self.stream_error else None
                    await self._fail(out, pending, f"mcp-resumption-proxy: {error}")
                return
            try:
                pumping.result()
            except ClientGone:
                return
            except ResumptionGapError as error:
                if pending is not None:
                    await self._fail(out, pending, f"mcp-resumption-proxy: {error}")
                return
            except Exception:
                if enforced and tee.failed and pending is not None and pending.ids and (
                    not pending.resumable
                ):
                    # No event id to resume from: nothing will bring the answers.
                    await self._fail(out, pending, "mcp-resumption-proxy: the server's stream "
                                     "broke before answering, and cannot be resumed")
                    return
                if tee.failed:
                    # The upstream broke mid-body: leave the client's response
                    # unfinished, so that it breaks as it would have directly.
                    return
                if enforced and pending is not None:
                    # What was not parsed was not let through: fail closed.
                    await self._fail(out, pending, "mcp-resumption-proxy: the server's "
                                     "stream could not be checked (an event too large)")
                    return
                # Only the parse failed: the bytes still pass, unobserved.
                _logger.warning("mcp-resumption-proxy: a response could not be observed",
                                exc_info=False)
                if not await rest_of(tee):
                    return
            with contextlib.suppress(ClientGone):
                await out.finish()
        finally:
            for task in waits:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            if ids is not None and self.downstream is not None:
                self.downstream.save(ids)  # queued for the fleet

    async def _fail(self, out: RequestBody, pending: enforce.Pending, message: str) -> None:
        with contextlib.suppress(ClientGone):
            if pending.ids:
                await out.write(enforce.error_events(pending, message))
            await out.finish()

    async def _judged(self, response: httpx.Response) -> None:
        """Returns once the client half decided an error for the stream (its
        confirmation window ends on the timer's thread, not in a read)."""
        assert self.stream_error is not None
        while self.stream_error(response) is None:
            await asyncio.sleep(self.poll)

    async def _enforced_events(
        self, response: httpx.Response, session: str | None, out: RequestBody,
        pending: enforce.Pending,
        ids: Any = None,
    ) -> None:
        downstream, ledger = self.downstream, self.ledger
        decided: list[BaseException] = []
        if self.enforced_errors is not None:
            self.enforced_errors.set(decided)  # this task's own context
        last = None
        async for event in EventSource(response).aiter_sse():
            event_id = event.id
            await out.write(enforce.serialize(event, last))
            pending.answered(event.data)
            if event_id and event_id != last:
                if downstream is not None:
                    downstream.forwarded(event_id, session, ids)
                if ids is not None:
                    ids.last = event_id
                if ledger is not None:
                    ledger.forwarded(event_id, pending)
            last = event_id
        error = decided[0] if decided else (
            self.stream_error(response) if self.stream_error is not None else None)
        if error is not None:
            # Decided at the stream's end (an empty replay): no read left to
            # raise it into, so it is raised here, for the pending requests.
            raise error if isinstance(error, ResumptionGapError) else ResumptionGapError(
                str(error))

    async def _events(
        self, response: httpx.Response, session: str | None, ids: Any = None
    ) -> None:
        """Drive the SSE parse the client half observes, and remember each id
        forwarded for the downstream leg."""
        downstream = self.downstream
        last = None
        async for event in EventSource(response).aiter_sse():
            event_id = event.id
            if event_id and event_id != last and downstream is not None:
                downstream.forwarded(event_id, session, ids)
                if ids is not None:
                    ids.last = event_id
            last = event_id

