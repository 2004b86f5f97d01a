"""The Events extension on the client leg of ``mcp-resumption-proxy``: a push
stream cut between the client and the proxy (issue 43).

    client (EventsWire) -> client router -> proxy (a child) -> events server

The router cuts the client's ``events/stream`` after the bytes of its second
event (closing both its sides, as an idle timeout does); the upstream leg is
never cut.  The wire's truth is the router's record (the cut, what the
client was sent) and the events server's log (the streams opened, their
cursors in, ``truncated``, how each ended); the verdicts are read from the
proxy's telemetry and its lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from urllib.parse import urlsplit

import pytest

from events_server import NO_REPLAY, REPLAYABLE, EventsServer
from events_wire import EventsWire
from mcp_resumption_demo.router import Backend, Route
from proxy_harness import Proxy, proxy
from wire import CutRoute, WireRouter, message

GAPS = "mcp.client.resumption.event_gaps"
KIND = "mcp.events.gap.kind"
LEG = "mcp.resumption.leg"
STREAMS = "mcp.client.resumption.event_streams"
STATE = "mcp.events.stream.state"
BROKEN = "mcp.client.resumption.broken_requests"
CALL_GAPS = "mcp.client.resumption.gaps"
CANCELLED = "mcp.proxy.cancelled_requests"
WINDOW = "1"  # the confirmation window, s

MODES = [pytest.param((), id="observe"), pytest.param(("--resumable",), id="resumable")]


def in_asyncio(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def is_second_event(event) -> bool:
    """The router's cut point: after the bytes of the stream's second event."""
    decoded = message(event)
    return bool(decoded) and decoded.get("method") == "notifications/events/event" and (
        decoded["params"]["data"]["n"] == 2)


def cutting_router(running: Proxy) -> WireRouter:
    """Cuts the first ``events/stream`` after its second event; every other
    request passes."""
    port = urlsplit(running.url).port
    backend = Backend("proxy", port)
    state = {"cut": False}

    def policy(request):
        if request.jsonrpc_method == "events/stream" and not state["cut"]:
            state["cut"] = True
            return CutRoute(backend, cut_after=is_second_event)
        return Route(backend)

    return WireRouter(policy, name="client")


async def wait_for_text(running: Proxy, text: str, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while text not in running.stderr and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return text in running.stderr


def gaps_but_the_read_ahead(running: Proxy) -> dict[tuple, int]:
    """The event gaps by leg and kind, but for what the upstream leg may say
    of a reopen's cursor when the proxy read further than its client got
    (``cursor_rewound``: the server delivers those events to the proxy
    again) or had not yet taken in the cut stream's last events when the
    client's reopen came (``cursor_unknown``): neither is a loss, and which
    one (or none) depends on when the proxy saw its client go."""
    return {key: count for key, count in running.counts(GAPS, LEG, KIND).items()
            if key not in (("proxy_server", "cursor_rewound"), ("proxy_server", "cursor_unknown"))}


def no_lost_call(running: Proxy) -> None:
    """Never a lost call, an orphaned request or a not_resumable break, on
    either leg, for a push stream."""
    assert running.counts(BROKEN, LEG, "mcp.resumption.request.fate") == {}
    assert running.counts(CALL_GAPS, LEG, "mcp.resumption.gap.kind") == {}
    assert "lost call" not in running.stderr


async def cut_stream(wire: EventsWire, server: EventsServer, name: str = REPLAYABLE):
    """Open a push stream, let two events through, and have the router cut
    it: the cursor the client holds, and the stream."""
    async with wire.stream(name, None) as stream:
        server.publish(name, 2)
        await stream.wait_ended()
    assert stream.broken is not None, "the router cut the client's stream"
    assert len(stream.events) == 2
    return stream


@contextlib.asynccontextmanager
async def through_cutting_proxy(server: EventsServer, mode: tuple[str, ...], *args: str,
                                token: str | None = None):
    """client -> cutting router -> proxy -> ``server``: the proxy, the
    router and the client."""
    with proxy(server.url, *mode, *args,
               OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT=WINDOW) as running:
        async with cutting_router(running) as router, EventsWire(router.url + "/mcp",
                                                                 token=token) as wire:
            yield running, router, wire


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("close", ["unsubscribe", "cut"])
@in_asyncio
async def test_a_push_stream_cut_below_the_proxy_and_not_reopened(mode, close):
    with EventsServer(heartbeat_s=5) as server:
        async with through_cutting_proxy(server, mode, "--events-client-close", close) as (
            running, router, wire
        ):
            stream = await cut_stream(wire, server)
            # The proxy closes the server's stream as its client's ended
            # (with --resumable too: no resume of a push stream comes).
            await server.await_streams(0, timeout=10)
            server.publish(REPLAYABLE, 3)  # published while the client has no stream
            said = await wait_for_text(running, "mcp-resumption event not_reopened:",
                                       15 if close == "cut" else 2.5)
        severed = [x for x in router.exchanges if x.severed]
    # The wire: the client's stream cut by the router after two events, the
    # server's stream never cut, and no second events/stream anywhere.
    assert len(severed) == 1
    assert [m["method"] for m in stream.messages] == [
        "notifications/events/active", "notifications/events/event",
        "notifications/events/event"]
    streams = server.log.exchanges("events/stream")
    assert len(streams) == 1 and streams[0].ended == "client_closed"
    if close == "cut":
        assert said
        assert running.counts(GAPS, LEG, KIND) == {("client_proxy", "not_reopened"): 1}
        line = next(x for x in running.stderr.splitlines() if "event not_reopened" in x)
        assert "leg=client_proxy (between client and proxy)" in line
        assert running.counts(CANCELLED, LEG) == {}
    else:
        # The proxy cannot tell this cut from the client's own close (its
        # unsubscribe): by default, the client's end of the subscription.
        assert not said
        assert running.counts(GAPS, LEG, KIND) == {}
        assert running.counts(CANCELLED, LEG) == {("client_proxy",): 1}
    no_lost_call(running)


@pytest.mark.parametrize("mode", MODES)
@in_asyncio
async def test_a_push_stream_cut_below_the_proxy_and_reopened_with_its_cursor(mode):
    with EventsServer(heartbeat_s=5) as server:
        async with through_cutting_proxy(server, mode) as (running, router, wire):
            stream = await cut_stream(wire, server)
            missed = server.publish(REPLAYABLE, 2)
            async with wire.stream(REPLAYABLE, stream.cursor) as again:
                replayed = [(await again.next_event())["eventId"] for _ in missed]
                active = again.messages[0]["params"]
        severed = [x for x in router.exchanges if x.severed]
    assert len(severed) == 1
    assert active["truncated"] is False and replayed == missed  # the wire: nothing lost
    reopen = server.log.exchanges("events/stream")[1]
    assert reopen.cursor_in == stream.cursor
    assert gaps_but_the_read_ahead(running) == {}
    assert running.counts(STREAMS, LEG, STATE).get(("client_proxy", "reopened")) == 1
    no_lost_call(running)


@pytest.mark.parametrize("mode", MODES)
@in_asyncio
async def test_a_client_that_reopens_from_now_after_a_cut_lost_its_cursor(mode):
    with EventsServer(heartbeat_s=5) as server:
        async with through_cutting_proxy(server, mode) as (running, _, wire):
            await cut_stream(wire, server)
            missed = server.publish(REPLAYABLE, 2)
            async with wire.stream(REPLAYABLE, None) as again:
                fresh = server.publish(REPLAYABLE, 1)
                got = (await again.next_event())["eventId"]
    reopen = server.log.exchanges("events/stream")[1]
    assert reopen.cursor_in is None and got == fresh[0]  # the wire: `missed` never delivered
    assert not set(missed) & set(server.log.delivered_ids(reopen.request_id))
    assert running.counts(GAPS, LEG, KIND) == {("proxy_server", "cursor_lost"): 1}
    no_lost_call(running)


@pytest.mark.parametrize("mode", MODES)
@in_asyncio
async def test_a_reopen_below_the_proxy_the_server_truncated(mode):
    with EventsServer(heartbeat_s=5, retention=3) as server:
        async with through_cutting_proxy(server, mode) as (running, _, wire):
            stream = await cut_stream(wire, server)
            server.publish(REPLAYABLE, 6)  # more than the server keeps
            async with wire.stream(REPLAYABLE, stream.cursor) as again:
                active = again.messages[0]["params"]
    # The wire: the reopen's cursor was older than the server keeps.
    reopen = server.log.exchanges("events/stream")[1]
    assert active["truncated"] is True and reopen.truncated is True
    assert reopen.cursor_in == stream.cursor
    assert gaps_but_the_read_ahead(running) == {("proxy_server", "truncated"): 1}
    assert not running.counts(STREAMS, LEG, STATE).get(("client_proxy", "reopened"))
    no_lost_call(running)


@pytest.mark.parametrize("mode", MODES)
@in_asyncio
async def test_a_no_replay_stream_cut_below_the_proxy_and_reopened(mode):
    with EventsServer(heartbeat_s=5) as server:
        async with through_cutting_proxy(server, mode) as (running, _, wire):
            await cut_stream(wire, server, NO_REPLAY)
            missed = server.publish(NO_REPLAY, 2)
            async with wire.stream(NO_REPLAY, None) as again:
                active = again.messages[0]["params"]
    assert active["cursor"] is None and missed  # the wire: a type without replay
    assert running.counts(GAPS, LEG, KIND) == {("client_proxy", "unreplayable_window"): 1}
    no_lost_call(running)


@pytest.mark.parametrize("mode", MODES)
@in_asyncio
async def test_one_client_cut_while_another_holds_the_same_subscription(mode):
    """Two clients (two principals) of one proxy follow the same event type
    and arguments: each its own thread on the client leg, so the one cut is
    not hidden by the other's stream still open."""
    with EventsServer(heartbeat_s=5) as server:
        async with through_cutting_proxy(
            server, mode, "--events-client-close", "cut", token="alice"
        ) as (running, _, alice), EventsWire(running.url, token="bob") as bob, alice.stream(
            REPLAYABLE, None
        ) as cut, bob.stream(REPLAYABLE, None) as held:
            server.publish(REPLAYABLE, 2)
            await cut.wait_ended()
            said = await wait_for_text(running, "mcp-resumption event not_reopened:")
            await held.next_event()
            await held.next_event()
            still_open = not held.ended.is_set()
    # The wire: alice's stream cut after two events, bob's open throughout.
    assert cut.broken is not None and len(cut.events) == 2
    assert still_open and len(held.events) == 2
    assert said
    # Each leg keys a subscription by its principal (a digest of the
    # Authorization): bob's "from now" after alice's cursor is no
    # cursor_lost on the upstream leg.
    gaps = running.counts(GAPS, LEG, KIND)
    assert gaps == {("client_proxy", "not_reopened"): 1}
    no_lost_call(running)
