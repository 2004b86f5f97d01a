# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""A row of a dropped subscription: 2026-07-28's ``subscriptions/listen``
stream, cut by the balancer right after the server acknowledged it.

A subscription is not a call: nothing the application awaits is lost, but
every change notification from the drop until the next listen is, and
there is no replay. A correct client-side count is one lost subscription,
and no broken request, no lost call, no resume attempt. The truth is read
from the router's log (:func:`.fates.wire_counts`).

mcp 2.x: ``Client(url).listen(tools_list_changed=True)`` against the SDK's
own server. mcp 1.x predates 2026-07-28 (neither its client nor its server
knows ``subscriptions/listen``): the same request goes out as the
specification writes it, from a raw client on the library mcp 1.x brings
(httpx, read through httpx-sse), to a small server that acknowledges it as
the specification writes it; the router cuts it in the same place.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as HttpRoute

from .clients import MCP_MAJOR, TRANSPORT_ERRORS, new_http_client, open_sse
from .fates import LISTEN, broken_request_fates, wire_counts
from .router import ForwardedEvent, RequestHead, Route, Router
from .scenarios import Scenario, ScenarioWire, _events_of, _staged
from .servers import sdk_streamable_app

__all__ = ["SCENARIOS"]

MODERN_PROTOCOL_VERSION: Final = "2026-07-28"
ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
_LISTEN_ID: Final = "listen-1"
# What the application asks to hear about: the tools list changing.
_FILTER: Final = {"toolsListChanged": True}


def is_acknowledgment(event: ForwardedEvent) -> bool:
    """The server's first event on a listen stream: it acknowledged the subscription."""
    try:
        message = json.loads(event.data) if event.data else None
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("method") == ACKNOWLEDGED


def cut_first_listen(backend: Any) -> Any:
    """The balancer's idle timeout cuts the first listen stream right after
    its acknowledgment (a quiet stream: no change comes before the timeout);
    everything else goes through."""
    cut: list[RequestHead] = []

    def policy(request: RequestHead) -> Route:
        if request.method == "POST" and request.jsonrpc_method == LISTEN and not cut:
            cut.append(request)
            return Route(backend, sever_after=is_acknowledgment)
        return Route(backend)

    return policy


async def _sdk_listen_until_lost(url: str) -> str:
    """mcp 2.x, as a new user writes it: ``Client(url)`` (2026-07-28) and
    ``listen``; the drop raises ``SubscriptionLost`` out of the loop."""
    mcp = importlib.import_module("mcp")
    lost = importlib.import_module("mcp.client.subscriptions").SubscriptionLost
    async with mcp.Client(url) as client:
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    pass
        except lost as exc:
            return f"{type(exc).__name__}: {exc}"
    raise RuntimeError("the listen stream ended without SubscriptionLost")


async def _raw_listen_until_lost(url: str) -> str:
    """mcp 1.x: the listen request as the specification writes it, its
    stream read through httpx-sse until the connection dies."""
    message = {"jsonrpc": "2.0", "id": _LISTEN_ID, "method": LISTEN,
               "params": {"notifications": _FILTER}}  # fmt: skip
    headers = {"mcp-protocol-version": MODERN_PROTOCOL_VERSION}
    async with (
        new_http_client() as http,
        open_sse(http, "POST", url, headers=headers, json=message) as stream,
    ):
        if stream.status != 200 or not stream.is_event_stream:
            raise RuntimeError(f"subscriptions/listen answered {stream.status}")
        try:
            while await stream.next_event() is not None:
                pass
        except TRANSPORT_ERRORS as exc:
            return f"{type(exc).__name__}: the listen stream broke"
    raise RuntimeError("the listen stream ended without breaking")


def _listen_app() -> Starlette:
    """A 2026-07-28 server of one method, for mcp 1.x (whose server answers
    that protocol version 400): ``subscriptions/listen`` is acknowledged with
    the filter it honours, then the stream stays open until the client goes."""

    async def mcp(request: Request) -> Response:
        message = await request.json()
        if not isinstance(message, dict) or message.get("method") != LISTEN:
            error = {"code": -32601, "message": "only subscriptions/listen here"}
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=400)
        honoured = message.get("params", {}).get("notifications", {})
        ack = {"jsonrpc": "2.0", "method": ACKNOWLEDGED, "params": {"notifications": honoured}}

        async def events() -> Any:
            yield f"event: message\ndata: {json.dumps(ack)}\n\n".encode()
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})  # fmt: skip

    return Starlette(routes=[HttpRoute("/mcp", mcp, methods=["POST"])])


async def _subscription_dropped() -> ScenarioWire:
    async with _staged() as stage:
        if MCP_MAJOR >= 2:
            backend = await stage.serve("sdk-stateless", sdk_streamable_app(stateless=True))
        else:
            backend = await stage.serve("listen-2026-07-28", _listen_app())
        router: Router = await stage.route(cut_first_listen(backend))
        wire = ScenarioWire("subscription_dropped", MCP_MAJOR, transport_before="streamable-http")
        listen = _sdk_listen_until_lost if MCP_MAJOR >= 2 else _raw_listen_until_lost
        wire.application_saw = await listen(f"{router.url}/mcp")
        exchanges = router.exchanges
        cut = next(x for x in exchanges if x.request.jsonrpc_method == LISTEN)
        wire.severed = cut.severed
        wire.received_before = _events_of(cut)
        # A subscription has no fate: the wire gives none (and the plugin must count none).
        wire.fates = broken_request_fates(exchanges)
        wire.counts = wire_counts(exchanges)
        wire.exchanges = exchanges
        return wire


_CLIENT: Final = (
    "The SDK client as a new user writes it (mcp 2.x: Client(url), protocol 2026-07-28) "
    "listens for tools/list changes (client.listen(tools_list_changed=True))"
    if MCP_MAJOR >= 2
    else "A client sends subscriptions/listen for tools/list changes, as the specification "
    "writes it (mcp 1.x knows no 2026-07-28: a raw client on httpx and httpx-sse, to a "
    "server that acknowledges it as the specification writes it)"
)

SCENARIOS = (
    Scenario(
        name="subscription_dropped",
        happened=(
            f"2026-07-28, a subscription. {_CLIENT}; the server acknowledges it "
            "(notifications/subscriptions/acknowledged), and the balancer's idle timeout cuts "
            "the quiet stream right after that. The client sees the subscription lost "
            "(no graceful result, and it did not close it itself) and does not listen "
            "again: every tools/list change from then on is missed until it re-listens and "
            "refetches. A subscription is not a call: one lost subscription (not re-listened), "
            "no broken request, no lost call, no resume attempt."
        ),
        expected_gaps=("subscription_lost",),
        expected_outcome=None,
        run=_subscription_dropped,
    ),
)
