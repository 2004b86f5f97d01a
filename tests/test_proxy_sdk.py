"""mcp-resumption-proxy between real SDK clients and servers, a loopback
router (tests/wire.py's WireRouter) on each leg:

    client -> client router -> proxy (a child) -> upstream router -> SDK server

The routers' records are the wire truth of each leg.  Transparency: every
exchange the client's leg carried, the server's leg carried too, with the
same request, status, session and events (ids, types, data).  Legs: a router
cuts one leg, and the proxy's telemetry (read from its console exporters at
exit) places each finding on that leg with ``mcp.resumption.leg``.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from bridge_stack import bridges_fixture
from mcp_resumption_demo.router import Exchange
from proxy_harness import LEG, Proxy, Stack, find_node, stack, ts_client
from wire import (
    CLIENTS,
    MCP_MAJOR,
    RESUMABLE_CLIENTS,
    AppClient,
    IntegerEventStore,
    WireRouter,
    sdk_app,
)

BROKEN = "mcp.client.resumption.broken_requests"
ATTEMPTS = "mcp.client.resumption.attempts"
SERVER_REQUESTS = "mcp.server.resumption.requests"
FATE = "mcp.resumption.request.fate"
OUTCOME = "mcp.resumption.outcome"


def row(exchange: Exchange, body: bool = True) -> tuple:
    request = exchange.request
    return (
        request.method, request.target, request.body,
        request.header("last-event-id"), request.header("mcp-session-id"),
        exchange.status, exchange.session_id_received,
        tuple((event.id, event.event, event.data, event.retry) for event in exchange.events),
        # the body's bytes as they crossed the leg
        getattr(exchange, "raw", b"") if body else "the client left before the body's end",
    )


async def settled(one: WireRouter, other: WireRouter) -> None:
    """Both legs carried the same number of exchanges, each finished."""
    def done(exchanges) -> bool:
        return all(exchange.finished.is_set() for exchange in exchanges)

    await one.wait_for(done)
    await other.wait_for(lambda exchanges: len(exchanges) == len(one.exchanges) and done(exchanges))


def same_wire(running: Stack) -> None:
    """Each exchange crossed both legs alike, byte for byte.  Where the client
    left before its answer's end (an SDK cancels its writer once it has what
    it waited for: the legacy transport's ``202 Accepted`` can still be on its
    way when the answer arrived on the GET stream), what it got is a prefix
    of what the proxy got, and the rest of the row is the same."""
    left = {row(e, body=False) for e in running.client_router.exchanges if e.client_closed}
    server_raw = {
        row(e, body=False): getattr(e, "raw", b"") for e in running.upstream_router.exchanges
    }
    for exchange in running.client_router.exchanges:
        if exchange.client_closed:
            got = getattr(exchange, "raw", b"")
            assert server_raw.get(row(exchange, body=False), b"").startswith(got), exchange

    def legs(exchanges) -> list[tuple]:
        rows = [row(e, body=row(e, body=False) not in left) for e in exchanges]
        return sorted(rows, key=repr)

    client_leg = legs(running.client_router.exchanges)
    server_leg = legs(running.upstream_router.exchanges)
    only_client = [r for r in client_leg if r not in server_leg]
    only_server = [r for r in server_leg if r not in client_leg]
    assert client_leg == server_leg, (
        f"client leg only: {repr(only_client)[:1500]}\n"
        f"server leg only: {repr(only_server)[:1500]}\nproxy stderr: "
        f"{running.proxy.stderr[-1500:]}"
    )
    assert any(r[-2] for r in client_leg), "some exchange carried SSE events"


# ================================================================ transparency


@pytest.mark.parametrize("kind", CLIENTS)
def test_an_sdk_client_sees_through_the_proxy_what_the_server_sent(kind) -> None:
    async def scenario() -> Stack:
        async with stack(sdk_app(IntegerEventStore())) as running:
            async with AppClient(kind, running.url) as client:
                assert await client.call("x") == "done x"
            await settled(running.client_router, running.upstream_router)
        return running

    running = asyncio.run(scenario())
    same_wire(running)
    assert "Traceback" not in running.proxy.stderr, running.proxy.stderr


def test_the_legacy_sse_transport_passes_through() -> None:
    """2024-11-05: GET /sse, its endpoint event, POST /messages answered on the stream."""
    from mcp import ClientSession
    from mcp.client.sse import sse_client

    if MCP_MAJOR == 1:
        from mcp.server.fastmcp import FastMCP as Server
    else:
        from mcp.server.mcpserver import MCPServer as Server
    server = Server("legacy")

    @server.tool()
    async def work(text: str) -> str:
        return "done " + text

    async def scenario() -> Stack:
        async with stack(server.sse_app(), path="/sse") as running:
            async with sse_client(running.url) as (read, write), ClientSession(
                read, write
            ) as session:
                await session.initialize()
                result = await session.call_tool("work", {"text": "x"})
                assert result.content[0].text == "done x"
            await settled(running.client_router, running.upstream_router)
        return running

    running = asyncio.run(scenario())
    same_wire(running)
    posts = [e for e in running.upstream_router.exchanges if e.request.method == "POST"]
    assert posts and all(e.request.path.startswith("/messages") for e in posts)


@pytest.fixture(scope="module")
def node() -> str:
    return find_node()


def test_the_typescript_client_sees_through_the_proxy_what_the_server_sent(node) -> None:
    async def scenario() -> tuple[Stack, dict]:
        async with stack(sdk_app(IntegerEventStore())) as running:
            report = await asyncio.to_thread(ts_client, node, running.url)
            await settled(running.client_router, running.upstream_router)
        return running, report

    running, report = asyncio.run(scenario())
    # client.mjs calls without arguments: the server's answer is its
    # validation error, carried as a tool result.
    assert "result" in report, report
    client_leg = sorted(map(row, running.client_router.exchanges), key=repr)
    assert client_leg == sorted(map(row, running.upstream_router.exchanges), key=repr)


# ================================================================ the legs


def legs_of(proxy: Proxy, metric: str, attribute: str) -> dict[tuple, int]:
    return proxy.counts(metric, LEG, attribute)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
@pytest.mark.parametrize("launch", ["alone", "opentelemetry-instrument"])
def test_a_cut_between_proxy_and_server_is_placed_on_that_leg(kind, launch) -> None:
    """The upstream router cuts the tools/call stream after its progress: the
    proxy's client half sees the break, and says proxy_server; alone or under
    opentelemetry-instrument (which instruments the client half first, on
    providers that do not say which leg)."""
    async def scenario() -> Stack:
        async with stack(sdk_app(IntegerEventStore()), cut_upstream=True,
                         otel_instrument=launch != "alone") as running:
            async with AppClient(kind, running.url) as client:
                assert await client.call("x") == "done x"
            await settled(running.client_router, running.upstream_router)
        return running

    running = asyncio.run(scenario())
    assert running.upstream_router.exchanges and any(
        e.severed for e in running.upstream_router.exchanges)
    assert not any(e.severed for e in running.client_router.exchanges)
    broken = legs_of(running.proxy, BROKEN, FATE)
    assert broken == {("proxy_server", "answered"): 1}, (broken, running.proxy.stdout[-3000:])
    attempts = legs_of(running.proxy, ATTEMPTS, OUTCOME)
    assert attempts and all(leg == "proxy_server" for leg, _ in attempts), attempts
    # The client resumed from the proxy with a cursor the proxy forwarded.
    downstream = legs_of(running.proxy, SERVER_REQUESTS, OUTCOME)
    assert downstream == {("client_proxy", "replayed"): 1}, downstream


async def gate_on(router: WireRouter, gate: threading.Event, predicate) -> None:
    """Open the server tool's gate once ``predicate`` holds for the router's log."""
    await router.wait_for(predicate)
    gate.set()


def call_exchange(exchanges, predicate) -> bool:
    return any(e.request.jsonrpc_method == "tools/call" and predicate(e) for e in exchanges)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_cut_between_client_and_proxy_is_placed_on_that_leg(kind) -> None:
    """The client router cuts the tools/call stream: the client resumes at the
    proxy, whose downstream view says client_proxy; the upstream leg broke
    nothing.  The tool answers only once the proxy has left the call's
    upstream stream (the upstream router saw it close): the proxy read no
    further than its client, and resumes from the client's own cursor."""
    gate = threading.Event()

    async def scenario() -> Stack:
        async with stack(sdk_app(IntegerEventStore(), answer_when=gate),
                         cut_client=True) as running:
            left = asyncio.ensure_future(gate_on(running.upstream_router, gate, lambda xs: (
                call_exchange(xs, lambda e: e.client_closed))))
            async with AppClient(kind, running.url) as client:
                assert await client.call("x") == "done x"
            await left
            await settled(running.client_router, running.upstream_router)
        return running

    running = asyncio.run(scenario())
    assert any(e.severed for e in running.client_router.exchanges)
    assert not any(e.severed for e in running.upstream_router.exchanges)
    downstream = legs_of(running.proxy, SERVER_REQUESTS, OUTCOME)
    assert downstream == {("client_proxy", "replayed"): 1}, downstream
    # The proxy closed its upstream stream when its client left, and resumed
    # it for the client: no request broke on the server's leg; on the
    # client's, the cut call was answered by the client's resume.
    assert legs_of(running.proxy, BROKEN, FATE) == {("client_proxy", "answered"): 1}
    assert legs_of(running.proxy, ATTEMPTS, OUTCOME) == {("proxy_server", "resumed"): 1}


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_resume_from_behind_what_the_proxy_read_is_judged_resumed(kind) -> None:
    """The client router cuts the client's leg after the progress event and
    reads the proxy's answer on to its end: the proxy read (and forwarded)
    the call's answer, its client did not.  The client resumes with the
    progress event's id, behind the proxy's stream's end; the server replays
    the answer, the same id and data the proxy read: resumed on
    proxy_server, not unverifiable.  The tool answers once the client's leg
    is cut."""
    gate = threading.Event()

    async def scenario() -> Stack:
        async with stack(sdk_app(IntegerEventStore(), answer_when=gate),
                         cut_client=True, drain_client=True) as running:
            cut = asyncio.ensure_future(gate_on(running.client_router, gate, lambda xs: (
                call_exchange(xs, lambda e: e.severed))))
            async with AppClient(kind, running.url) as client:
                assert await client.call("x") == "done x"
            await cut
            await settled(running.client_router, running.upstream_router)
        return running

    running = asyncio.run(scenario())
    [call] = [e for e in running.upstream_router.exchanges
              if e.request.jsonrpc_method == "tools/call"]
    [cut] = [e for e in running.client_router.exchanges if e.severed]
    got = [event.id for event in cut.events if event.id]
    read = [event.id for event in call.events if event.id]
    assert len(read) > len(got) and read[: len(got)] == got, (got, read)
    [resume] = [e for e in running.upstream_router.exchanges
                if e.request.header("last-event-id")]
    assert resume.request.header("last-event-id") == got[-1] != read[-1]
    assert not any(e.severed for e in running.upstream_router.exchanges)
    downstream = legs_of(running.proxy, SERVER_REQUESTS, OUTCOME)
    assert downstream == {("client_proxy", "replayed"): 1}, downstream
    assert legs_of(running.proxy, BROKEN, FATE) == {}
    attempts = legs_of(running.proxy, ATTEMPTS, OUTCOME)
    assert attempts == {("proxy_server", "resumed"): 1}, (attempts, running.proxy.stderr[-2000:])


def test_the_guard_refuses_a_cursor_the_proxy_cannot_vouch_for() -> None:
    """OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD=reject, the server half's
    guard, on the proxy's own resumes: 410 Gone instead of a resume that
    could lose events unseen."""
    import httpx

    async def scenario() -> tuple[Stack, int]:
        async with stack(sdk_app(IntegerEventStore()),
                         OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD="reject") as running, \
                httpx.AsyncClient() as client:
            answer = await client.get(running.url, headers={
                "accept": "text/event-stream", "last-event-id": "999",
                "mcp-session-id": "not-a-session"})
        return running, answer.status_code

    running, status = asyncio.run(scenario())
    assert status == 410
    assert not running.upstream_router.exchanges, "refused by the proxy"
    refused = running.proxy.counts(SERVER_REQUESTS, LEG, OUTCOME, "mcp.resumption.gap.kind")
    assert refused == {("client_proxy", "rejected_by_guard", "unknown_cursor"): 1}, refused


# ================================================================ other upstreams


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_the_typescript_server_resumes_through_the_proxy(kind) -> None:
    """The TypeScript SDK server's ``poll`` tool closes its own stream; the
    client resumes through the proxy with the server's ids, and both legs
    carry the same bytes."""
    from mcp_resumption_demo.typescript_server import TsServer

    server = TsServer()

    async def scenario() -> Stack:
        async with stack(server.port) as running:
            async with AppClient(kind, running.url) as client:
                result = await client.session.call_tool("poll", {})
                assert result.content[0].text == "done"
            await settled(running.client_router, running.upstream_router)
        return running

    try:
        running = asyncio.run(scenario())
    finally:
        server.close()
    same_wire(running)
    resumes = [e for e in running.client_router.exchanges if e.request.header("last-event-id")]
    assert resumes, "the client resumed through the proxy"
    attempts = running.proxy.counts(ATTEMPTS, LEG, OUTCOME)
    assert attempts and all(leg == "proxy_server" for leg, _ in attempts), attempts


bridges = bridges_fixture()  # each bridge started once for the module


@pytest.mark.parametrize("name", ["supergateway", "supergateway-stateful"])
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)  # a stdio server per session: seconds each
def test_supergateway_passes_through(kind, name, bridges) -> None:
    bridge = bridges(name)

    async def scenario() -> Stack:
        async with stack(bridge.port) as running:
            async with AppClient(kind, running.url) as client:
                assert await client.call("x") == "done x"
            await settled(running.client_router, running.upstream_router)
        return running

    same_wire(asyncio.run(scenario()))
