"""The Events extension through ``mcp-resumption-proxy``: the same verdicts
for a client in any language, on the leg where the thread broke, and never a
lost call for a push stream or a poll on either leg.

The upstream leg (``proxy_server``) is the client half observing the proxy's
own httpx client; the client leg (``client_proxy``) is the proxy's own
accounting of what it forwards.  The wire's truth is the events server's
log.
"""

from __future__ import annotations

import asyncio
import functools
import json

import pytest

from events_server import REPLAYABLE, EventsServer
from events_wire import EventsWire
from proxy_harness import proxy

GAPS = "mcp.client.resumption.event_gaps"
KIND = "mcp.events.gap.kind"
LEG = "mcp.resumption.leg"
STREAMS = "mcp.client.resumption.event_streams"
STATE = "mcp.events.stream.state"
BROKEN = "mcp.client.resumption.broken_requests"
LOST_CALLS = "mcp.proxy.lost_calls"

MODES = [pytest.param((), id="observe"), pytest.param(("--resumable",), id="resumable")]


def in_asyncio(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def no_lost_call(running) -> None:
    assert running.counts(BROKEN, LEG, "mcp.resumption.request.fate") == {}
    assert "lost call" not in running.stderr


@pytest.mark.parametrize("mode", MODES)
@in_asyncio
async def test_a_truncated_poll_through_the_proxy_is_said_on_the_upstream_leg(mode):
    with EventsServer(retention=3) as server:
        with proxy(server.url, *mode) as running:
            async with EventsWire(running.url) as wire:
                first = await wire.poll(REPLAYABLE, None)
                server.publish(REPLAYABLE, 8)
                answer = await wire.poll(REPLAYABLE, first["cursor"])
        assert answer["truncated"] is True and len(server.log.truncations()) == 1  # the wire
    assert running.counts(GAPS, LEG, KIND) == {("proxy_server", "truncated"): 1}
    assert "mcp-resumption event truncated:" in running.stderr
    no_lost_call(running)


@pytest.mark.parametrize("mode", MODES)
@in_asyncio
async def test_a_push_stream_cut_upstream_and_reopened_is_no_lost_call_on_either_leg(mode):
    with EventsServer(heartbeat_s=5) as server:
        with proxy(server.url, *mode, OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT="1") as running:
            async with EventsWire(running.url) as wire:
                async with wire.stream(REPLAYABLE, None) as stream:
                    server.publish(REPLAYABLE, 2)
                    await stream.next_event()
                    await stream.next_event()
                    server.cut(stream.request_id)
                    await stream.wait_ended()
                    cursor = stream.cursor
                async with wire.stream(REPLAYABLE, cursor) as again:
                    server.publish(REPLAYABLE, 1)
                    await again.next_event()
                    active = again.messages[0]["params"]
                # the client closes its stream itself: a clean end
        assert active["truncated"] is False  # the wire: nothing skipped
    no_lost_call(running)
    assert running.counts(GAPS, LEG, KIND) == {}
    assert running.counts(STREAMS, LEG, STATE).get(("proxy_server", "reopened")) == 1


@pytest.mark.parametrize("method", ["events/stream", "events/poll"])
def test_the_client_leg_watches_no_events_request_as_a_call(method):
    """A push stream or a poll cut between client and proxy is resumed with
    its cursor: the client leg's accounting of calls never takes it up (a
    reopen carries another cursor, so it could never be its re-issue)."""
    from mcp_resumption_proxy.client_leg import ClientLeg

    leg = ClientLeg()
    params = {"name": "ticket.created", "arguments": {}, "cursor": "c1"}
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).encode()
    watch = leg.watch_post(body, "127.0.0.1:9", None, "2026-07-28")
    assert watch is None or not watch.requests
    call = b'{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "x"}}'
    assert leg.watch_post(call, "127.0.0.1:9", None, "2026-07-28") is not None
