# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The shutdown's drain: ``Drain``, an ASGI wrapper that knows every HTTP
exchange still open, and ends them itself when the drain period is over.

On SIGTERM the server stops accepting connections (``cli``) and calls
:meth:`Drain.begin`: from then on the proxy is not ready, and a request that
still reaches it (one already on its way on a kept-alive connection) is
refused with ``503``.  The streams already open go on, so that a call in
flight can still get its answer, until :meth:`Drain.cut` at the period's end,
or sooner, once the only streams left answer no request (:meth:`Drain.quiet`):
a streamable-HTTP session's standalone GET stream (a GET with a session id
and no ``Last-Event-ID``), on which the specification lets a server send
requests and notifications, never a response.  A legacy ``GET /sse`` (no
session id) and a resume carry answers: they are waited for.

The cut goes through the app's own path for a client that left: each open
exchange's ``receive`` answers ``http.disconnect`` at once, so the app closes
its upstream stream and returns, as when the client's connection breaks.
First the app is told to stop waiting (``before_cut``: the app's
``stop_waiting``, where it has one), so that every answer it has not
delivered, on the streams cut here too, is counted lost on its leg rather
than read as a client that gave up; and each cut exchange's scope is marked
(:data:`CUT`, :func:`was_cut`).  The client's
response is then ended cleanly (an SSE stream's last chunk: the client sees
the stream end, as when a server closes it, and may resume elsewhere with its
last event id), rather than by uvicorn's cancellation of the task, which
printed a ``CancelledError`` traceback for each stream.  An exchange that
does not return by itself soon after (one still waiting for its upstream's
headers) is cancelled here, quietly.

Costs: one small task per ``receive`` (a few per request, none per event),
and a flag test per ``send``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from .forwarding import Receive, Scope, Send

_logger = logging.getLogger(__name__)

# The scope's mark of an exchange the proxy itself cut at the drain's end.
CUT = "mcp_resumption_proxy.cut"
# How long the exchanges get, after the cut, to return through their own
# path before they are cancelled.
GRACE_S = 0.25
DISCONNECT = {"type": "http.disconnect"}
SHUTTING_DOWN = json.dumps({
    "jsonrpc": "2.0", "id": None,
    "error": {"code": -32000, "message": "mcp-resumption-proxy: shutting down"},
}).encode()


def answers_requests(scope: Scope) -> bool:
    """Whether the exchange may carry a response to a request: all but a
    session's standalone GET stream."""
    if scope.get("method") != "GET":
        return True
    session = resume = False
    for key, _ in scope.get("headers") or ():
        key = key.lower()
        session = session or key == b"mcp-session-id"
        resume = resume or key == b"last-event-id"
    return resume or not session


def was_cut(scope: Scope) -> bool:
    """Whether the proxy cut this exchange at the drain's end (its client
    did not leave of its own accord)."""
    return bool(scope.get(CUT))


class _Exchange:
    """One HTTP exchange: its task, and how far its response got."""

    __slots__ = ("answering", "cancelled", "complete", "event_stream", "scope", "started", "task")

    def __init__(self, scope: Scope, task: asyncio.Task[Any] | None) -> None:
        self.scope = scope
        self.task = task
        self.answering = answers_requests(scope)
        self.started = False
        self.complete = False
        self.event_stream = False
        self.cancelled = False  # by the drain, after the grace


class Drain:
    """``app`` with a drain: :meth:`begin` at SIGTERM, :meth:`cut` at the
    period's end or once :meth:`quiet`."""

    def __init__(self, app: Any, before_cut: Callable[[], None] | None = None) -> None:
        self.app = app
        self.before_cut = before_cut
        self.draining = False
        self._open: set[_Exchange] = set()
        self._cut: asyncio.Future[None] | None = None
        # (condition on the open exchanges, its future): checked as each ends.
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining:
            await _refuse(send)
            return
        if self._cut is None:
            self._cut = asyncio.get_running_loop().create_future()
        exchange = _Exchange(scope, asyncio.current_task())
        self._open.add(exchange)
        try:
            await self.app(scope, self._receive(exchange, receive), self._send(exchange, send))
        except asyncio.CancelledError:
            if not exchange.cancelled:
                raise
            task = exchange.task
            if task is not None and hasattr(task, "uncancel"):  # Python 3.11+
                task.uncancel()  # the drain's own cancel, taken back
        finally:
            self._open.discard(exchange)
            if self._waiters:
                self._wake()
        if scope.get(CUT):
            await self._end(exchange, send)

    def _receive(self, exchange: _Exchange, receive: Receive) -> Receive:
        async def cut_or_received() -> dict[str, Any]:
            cut = self._cut
            assert cut is not None
            if cut.done():
                return DISCONNECT
            message = asyncio.ensure_future(receive())
            try:
                await asyncio.wait((message, cut), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not message.done():
                    message.cancel()
            if message.done() and not message.cancelled():
                return message.result()
            return DISCONNECT

        return cut_or_received

    @staticmethod
    def _send(exchange: _Exchange, send: Send) -> Send:
        async def tracked(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                exchange.started = True
                for key, value in message.get("headers") or ():
                    if key.lower() == b"content-type":
                        exchange.event_stream = b"text/event-stream" in value
            elif not message.get("more_body", False):
                exchange.complete = True
            await send(message)

        return tracked

    @staticmethod
    async def _end(exchange: _Exchange, send: Send) -> None:
        """The cut exchange's response ended: an event stream's last chunk
        (the client sees the server close the stream), an unstarted one
        ``503``.  Anything else (a JSON body half sent) is left to the
        server, which closes the connection."""
        if exchange.complete:
            return
        with contextlib.suppress(Exception, asyncio.CancelledError):
            if not exchange.started:
                await _refuse(send)
            elif exchange.event_stream:
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    # ------------------------------------------------------------ the drain

    def begin(self) -> int:
        """From now on not ready, and new requests refused; returns the
        number of exchanges still open."""
        self.draining = True
        return len(self._open)

    def _wake(self) -> None:
        waiting, self._waiters = self._waiters, []
        for condition, future in waiting:
            if future.done():
                continue
            if condition():
                future.set_result(None)
            else:
                self._waiters.append((condition, future))

    async def _until(self, condition: Callable[[], bool]) -> None:
        if condition():
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((condition, future))
        await future

    async def quiet(self) -> None:
        """Returns once no open exchange may still carry an answer."""
        await self._until(lambda: not any(e.answering for e in self._open))

    async def idle(self) -> None:
        """Returns once no exchange is open."""
        await self._until(lambda: not self._open)

    async def cut(self) -> int:
        """End every exchange still open: each is marked (:data:`CUT`) and
        sees its client leave; those still running after ``GRACE_S`` are
        cancelled.  Returns how many of them could still carry an answer."""
        if self.before_cut is not None:
            try:
                self.before_cut()
            except Exception:  # the count's fault must not keep the process from stopping
                _logger.warning("mcp-resumption-proxy: counting the streams cut at "
                                "shutdown failed", exc_info=True)
        cutting = list(self._open)
        for exchange in cutting:
            exchange.scope[CUT] = True
        if self._cut is not None and not self._cut.done():
            self._cut.set_result(None)
        if cutting:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.idle(), GRACE_S)
        for exchange in list(self._open):
            if exchange.task is not None and not exchange.task.done():
                exchange.cancelled = True
                exchange.task.cancel()
        return sum(exchange.answering for exchange in cutting)


async def _refuse(send: Send) -> None:
    await send({
        "type": "http.response.start",
        "status": 503,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(SHUTTING_DOWN)).encode()),
            (b"connection", b"close"),
            (b"retry-after", b"1"),
        ],
    })
    await send({"type": "http.response.body", "body": SHUTTING_DOWN})
