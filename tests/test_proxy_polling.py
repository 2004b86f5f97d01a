"""mcp-resumption-proxy in front of a server that closes a call's stream on
purpose (SSE polling, protocol 2025-11-25, SEP-1699): the server primes the
stream (an id, ``retry:``), closes it before the answer, and answers on the
resume that follows.

Bare and in observe mode the client makes that resume, through the proxy.
With ``--resumable`` the proxy makes it itself, with the server's own last
id and after the server's ``retry:``, into the relay its client reads: the
client's stream stays open and carries the answer.  Either way the answer
arrives and nothing is lost or broken on either leg: a resume after a
server-initiated close is a poll.

The wire truth is the routers' record of each leg (``client -> router ->
proxy -> router -> server``) and, for the TypeScript SDK server, its own
wire log.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from proxy_harness import LEG, Stack, stack
from test_proxy_resumable import PROXY_ID, assert_once_in_order
from wire import (
    RESUMABLE_CLIENTS,
    AppClient,
    IntegerEventStore,
    Truth,
    first_call_fails,
    sdk_app,
)

BROKEN = "mcp.client.resumption.broken_requests"
GAPS = "mcp.client.resumption.gaps"
ATTEMPTS = "mcp.client.resumption.attempts"
FATE = "mcp.resumption.request.fate"
KIND = "mcp.resumption.gap.kind"
OUTCOME = "mcp.resumption.outcome"
CONFIRM = "1"  # the confirmation window: a missed poll would be lost within the test
RETRY_MS = 200
AWAY_MS = 1500
# A bound for a failing test (the SDK clients poll a proxy that lost the
# answer until then), never what a passing one waits for.
CALL_TIMEOUT = 20.0
MODES = {"resumable": ("--resumable",), "observe": ()}


async def finished(running: Stack) -> None:
    """Every exchange of both legs ended (the proxy's polls included)."""
    def done(exchanges) -> bool:
        return all(exchange.finished.is_set() for exchange in exchanges)

    await running.client_router.wait_for(done)
    await running.upstream_router.wait_for(done)


def resumes_ended(exchanges) -> bool:
    resumes = [e for e in exchanges if e.request.header("last-event-id")]
    return bool(resumes) and all(e.finished.is_set() for e in resumes)


def assert_nothing_lost(running: Stack, polls: set[str] = frozenset({"resumed", "caught_up"})
                        ) -> None:
    """Neither leg broke, lost or orphaned a request; the server's leg saw
    polls (judged one of ``polls``), the client's leg no resume verdict."""
    proxy = running.proxy
    assert proxy.counts(BROKEN, LEG, FATE) == {}, proxy.stderr[-3000:]
    assert proxy.counts(GAPS, LEG, KIND) == {}, proxy.stderr[-3000:]
    attempts = proxy.counts(ATTEMPTS, LEG, OUTCOME)
    assert attempts, "the proxy's client half saw the resume"
    assert {leg for leg, _ in attempts} == {"proxy_server"}, attempts
    assert {outcome for _, outcome in attempts} <= polls, attempts
    assert "lost call" not in proxy.stderr, proxy.stderr[-3000:]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_server_that_closes_the_calls_stream_answers_through_the_proxy(kind, mode) -> None:
    """The SDK server (same major as the client) with an event store and a
    tool that calls the request context's ``close_sse_stream``, then answers."""
    async def scenario() -> Stack:
        app = sdk_app(IntegerEventStore(), polling=True, retry_ms=RETRY_MS)
        async with stack(app, proxy_args=MODES[mode],
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT=CONFIRM) as running:
            async with AppClient(kind, running.url) as client:
                assert await client.call("x") == "done x"
                # The SDK server holds a resumed stream open after the
                # answer; a client closes it at the answer, and so must
                # whoever polled (the session still open: no DELETE yet).
                await running.upstream_router.wait_for(resumes_ended)
            await finished(running)
        return running

    running = asyncio.run(scenario())
    upstream, downstream = Truth(running.upstream_router), Truth(running.client_router)
    assert not upstream.any_severed() and not downstream.any_severed()

    # The server's leg: the call's stream primed with retry:, closed cleanly
    # before the answer, then resumed with the server's own last id.
    [call] = upstream.calls
    assert call.exchange.events[0].retry == RETRY_MS, "primed with retry:"
    assert call.exchange.index not in call.answered_on, "closed before its answer"
    [poll] = upstream.resumes
    assert poll.request.header("last-event-id") == call.exchange.events[-1].id
    assert poll.request.header("last-event-id").isdigit(), "the server's own id"
    assert poll.status == 200 and poll.index in call.answered_on, "answered on the poll"

    [client_call] = downstream.calls
    if mode == "resumable":
        # The proxy polled: its client's stream stayed open and carried the
        # answer, every event once, in order, under the proxy's ids.
        assert downstream.resumes == [], "the client made no resume"
        assert client_call.answered_on == [client_call.exchange.index]
        assert all(PROXY_ID.match(e.id) for e in client_call.exchange.events)
        assert_once_in_order(running)
    else:
        # The client polled, through the proxy, with the server's id.
        [client_poll] = downstream.resumes
        assert client_poll.request.header("last-event-id") == poll.request.header(
            "last-event-id")
        assert client_call.answered_on == [client_poll.index]
    assert_nothing_lost(running)


def _requests(wire: list[dict], **match) -> list[dict]:
    return [e for e in wire if e.get("kind") == "request"
            and all(e.get(k) == v for k, v in match.items())]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_the_typescript_server_closing_a_call_twice_answers_through_the_proxy(
        kind, mode) -> None:
    """The TypeScript SDK server's ``poll`` tool closes the call's stream
    twice (``extra.closeSSEStream``), one notification before each close: two
    polls, each after the server's ``retry:``, and the answer on the last.
    The tool waits ``AWAY_MS`` after each close, far longer than the
    ``retry:``, so that its second close finds the first poll open."""
    from mcp_resumption_demo.typescript_server import TsServer

    server = TsServer(RETRY_MS=str(RETRY_MS))

    async def scenario() -> Stack:
        async with stack(server.port, proxy_args=MODES[mode],
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT=CONFIRM) as running:
            async with AppClient(kind, running.url) as client:
                result = await asyncio.wait_for(client.session.call_tool(
                    "poll", {"cuts": 2, "away_ms": AWAY_MS}), CALL_TIMEOUT)
                assert result.content[0].text == "done"
            await finished(running)
        return running

    try:
        running = asyncio.run(scenario())
        wire = server.wire()
    finally:
        server.close()

    # The server's own log: the call, then two resumes with the ids it gave.
    [call] = [e for e in _requests(wire, method="POST")
              if (e.get("body") or {}).get("method") == "tools/call"]
    resumes = [e for e in _requests(wire, method="GET") if e.get("lastEventId")]
    assert len(resumes) == 2, resumes
    stored = {e["eventId"] for e in wire if e.get("kind") == "store"}
    assert all(resume["lastEventId"] in stored for resume in resumes), "the server's own ids"
    cuts = [e for e in wire if e.get("kind") == "tool" and e.get("step") == "cut"]
    assert len(cuts) == 2
    for cut, resume in zip(cuts, resumes):
        # The retry the server gave was honoured (a lower bound only).
        assert resume["t"] - cut["t"] >= RETRY_MS, (cut, resume)
    answers = [e for e in wire if e.get("kind") == "frame" and e.get("data")
               and json.loads(e["data"]).get("id") == call["body"]["id"]
               and "result" in json.loads(e["data"])]
    assert [a["rid"] for a in answers] == [resumes[-1]["rid"]], "answered on the last poll"

    downstream = Truth(running.client_router)
    assert not downstream.any_severed()
    if mode == "resumable":
        assert downstream.resumes == [], "the proxy polled, not the client"
        assert_once_in_order(running)
    else:
        assert len(downstream.resumes) == 2, "the client polled, through the proxy"
    # The TypeScript store's ids are opaque: they prove no order.
    assert_nothing_lost(running, {"unverifiable"})


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_poll_the_server_does_not_answer_breaks_the_clients_stream(kind) -> None:
    """``--resumable``: the server's leg refuses every resume (the router
    closes the connection with no answer, as a server gone would).  The
    proxy's poll fails, so its client's stream breaks; the client's own
    resume is forwarded with the server's id, and refused too, as in observe
    mode.  Nothing is counted lost on the client's leg: the proxy wrote the
    client everything it got."""
    async def gone():
        return None  # every resume from here on: no answer

    async def scenario() -> Stack:
        app = sdk_app(IntegerEventStore(), polling=True, retry_ms=RETRY_MS)
        async with stack(app, proxy_args=("--resumable",), at_resume=gone,
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT=CONFIRM) as running:
            async with AppClient(kind, running.url) as client:
                await first_call_fails(client)
            await finished(running)
        return running

    running = asyncio.run(scenario())
    refused = [r for r in running.upstream_router.refused if r.header("last-event-id")]
    assert len(refused) >= 2, "the proxy's poll, then the client's resume"
    assert all(r.header("last-event-id").isdigit() for r in refused), "the server's own id"
    client_resumes = Truth(running.client_router).resumes
    assert client_resumes and all(PROXY_ID.match(r.request.header("last-event-id"))
                                  for r in client_resumes)
    assert all(r.status == 502 for r in client_resumes), [r.status for r in client_resumes]
    lost = running.proxy.counts(BROKEN, LEG, FATE)
    assert {leg for leg, fate in lost if fate == "lost"} <= {"proxy_server"}, lost
    assert ("client_proxy", "lost") not in lost, lost
