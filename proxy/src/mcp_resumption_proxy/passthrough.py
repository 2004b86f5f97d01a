# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""One upstream response passed to its client as it is read: ``Passthrough``,
a base of ``app.ProxyApp``, read alone.

Its bytes reach the client as the upstream sent them, chunk by chunk: they
are handed on from inside httpx's read (``forwarding.Tee``), once the SSE
parse (httpx-sse's, which the client half observes) has taken in the events
a chunk completes and before the next chunk is awaited.  So what a client
receives is the upstream's body byte for byte (comments, line ends and
malformed SSE included), never waits for a whole body or for the upstream's
next bytes, and carries no event the proxy has not recorded.  A JSON answer
is read through ``aread()``, so that the client half sees the answer to its
request, as it would in an SDK.

Only one thing is ever rewritten: the legacy transport's ``endpoint`` event,
when it names the upstream by an absolute URL (the SDKs send a path, which
resolves against the proxy as it is).

In enforce mode (``enforce.py``) an event is forwarded only once the client
half let it through, written anew from the parse; a stream the client half
refused, or that broke with no id to resume from, answers its pending
requests with JSON-RPC errors (fails closed).  Each id forwarded is
remembered for the downstream leg (``downstream.DownstreamView``).
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

from . import enforce
from .client_leg import Watch
from .downstream import DownstreamView
from .forwarding import (
    MAX_EVENT_BYTES,
    ClientGone,
    Receive,
    RequestBody,
    Scope,
    Send,
    Tee,
    client_gone,
    client_left,
    decoded_text,
    drain,
    end_to_end,
    endpoint_rewriter,
    header_of,
    ignore,
    is_small,
    rest_of,
)

# The app's logger: what it logs is the forwarding's.
_logger = logging.getLogger(f"{__package__}.app")


async def _json_answers(response: httpx.Response, watch: Watch, tee: Tee) -> None:
    """A JSON answer read whole, its answers noted as of its last chunk."""
    await response.aread()
    watch.seen(response.text, tee.read)


def _ended(watch: Watch | None, how: str) -> None:
    if watch is not None:
        watch.how = how


class Passthrough:
    """One upstream response to its client (a base of ``ProxyApp``, whose
    attributes it reads through ``self``)."""

    upstream_origin: str
    downstream: DownstreamView | None
    ledger: Any
    stream_error: Callable[[httpx.Response], BaseException | None] | None
    poll: float
    enforced_errors: Any

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
        watch: Watch | None = None,
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
        watching = asyncio.ensure_future(client_left(receive))
        gone = client_gone(receive, watching)
        there = not gone()
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": end_to_end(raw_headers),
                }
            )
        except BaseException:
            watching.cancel()
            raise
        if watch is not None and there:
            # Its status is an answer a client still there was given.
            watch.status_sent(response.status_code)
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
        if watch is not None:
            watch.progress = tee.written
        if enforced:
            pump = self._enforced_events(response, session, out, pending, ids, watch, tee)
        elif sse:
            pump = self._events(response, session, ids, watch, tee)
        elif content_type == b"application/json" and is_small(raw_headers):
            pump = response.aread() if watch is None else _json_answers(response, watch, tee)
        else:
            pump = drain(response)
        pumping = asyncio.ensure_future(pump)
        if watch is not None:
            tee.gone = watch.gone = gone
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
                if watching.done():
                    _ended(watch, "left")
                if enforced and not watching.done() and pending is not None:
                    error = self.stream_error(response) if self.stream_error else None
                    await self._fail(out, pending, f"mcp-resumption-proxy: {error}")
                return
            try:
                pumping.result()
            except ClientGone:
                _ended(watch, "left")
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
                    # unfinished, so that it breaks as it would have directly
                    # (a loss between proxy and server: the client half's).
                    _ended(watch, "upstream")
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
                    _ended(watch, "upstream")
                    return
            if tee.gone is not None and tee.gone():
                _ended(watch, "left")  # read to its end, written to no one
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
        watch: Watch | None = None,
        tee: Tee | None = None,
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
            if watch is not None and not (tee is not None and tee.gone is not None
                                          and tee.gone()):
                watch.seen(event.data)  # written already, to a client still there
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
        self,
        response: httpx.Response,
        session: str | None,
        ids: Any = None,
        watch: Watch | None = None,
        tee: Tee | None = None,
    ) -> None:
        """Drive the SSE parse the client half observes, and remember each id
        forwarded for the downstream leg.  With ``watch`` (a response that may
        answer a request of its client's: a POST's, a resume's), each answer is
        noted with the tee's chunk count, so that one parsed but never written
        to the client is told apart from one that was."""
        downstream = self.downstream
        last = None
        async for event in EventSource(response).aiter_sse():
            event_id = event.id
            if event_id and event_id != last and downstream is not None:
                downstream.forwarded(event_id, session, ids)
                if ids is not None:
                    ids.last = event_id
            last = event_id
            if watch is not None:
                watch.seen(event.data, tee.read)

