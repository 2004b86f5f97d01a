"""The MCP conventions' server metrics, ``mcp.server.operation.duration`` and
``mcp.server.session.duration``, recorded by the server half on the installed
SDK major's real server, with its real clients: streamable HTTP in both
protocol eras (2026-07-28, mcp 2.x's default; 2025-11-25) behind the demo's
loopback router, and the legacy HTTP+SSE transport.

The truth is the wire: the router's record of every JSON-RPC message the
client POSTed and the answer that came back for it (a tool's ``isError``, a
JSON-RPC error's code).  Each request and notification the server handled
is one point, with the conventions' attributes."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from server_harness import RawSession, build_app, running, server_instrumented
from wire import (
    CLIENTS,
    LEGACY,
    MCP1,
    MCP_MAJOR,
    MODERN,
    AppClient,
    Fleet,
    WireRouter,
    message,
    sdk_app,
    wait_until,
)

DURATION = "mcp.server.operation.duration"
SESSION = "mcp.server.session.duration"
BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


def points(telemetry, name: str = DURATION) -> list:
    return telemetry.recorded(name)


def by_method(telemetry) -> dict:
    return telemetry.by_method(DURATION)


class BodyRouter(WireRouter):
    """The wire router, keeping each answer's bytes too (a JSON answer has
    no events to record)."""

    def __init__(self, policy, **kwargs) -> None:
        super().__init__(policy, **kwargs)
        self.bodies: dict[int, bytearray] = {}

    def _scan(self, scanner, piece, route, exchange):
        self.bodies.setdefault(exchange.index, bytearray()).extend(piece)
        return WireRouter._scan(scanner, piece, route, exchange)

    def answers(self, exchange) -> list[dict]:
        found = [message(event) for event in exchange.events]
        if (exchange.response_header("content-type") or "").startswith("application/json"):
            body = json.loads(bytes(self.bodies.get(exchange.index, b"")) or b"null")
            found += body if isinstance(body, list) else [body]
        return [answer for answer in found if isinstance(answer, dict)]


@contextlib.asynccontextmanager
async def sdk_stack(app):
    """The SDK server on loopback behind a BodyRouter."""
    from mcp_resumption_demo.loopback import LoopbackServer
    from mcp_resumption_demo.router import Backend

    backend = await LoopbackServer(app, name="sdk").astart()
    router = await BodyRouter(Fleet(Backend("sdk", backend.port), cut=False)).start()
    try:
        yield router
    finally:
        await router.close()
        await asyncio.to_thread(backend.close)


def wire_messages(router) -> list[tuple[str, object | None]]:
    """(method, error.type its answer calls for) of every JSON-RPC request
    and notification the client POSTed and the server took (2xx), from the
    router's record: None for a notification and a clean answer."""
    found = []
    for exchange in router.exchanges:
        body = exchange.request.jsonrpc
        if exchange.request.method != "POST" or not body or "method" not in body:
            continue
        if exchange.status is None or exchange.status >= 300:
            continue
        error = None
        if "id" in body:
            [answer] = [a for a in router.answers(exchange) if a.get("id") == body["id"]]
            if "error" in answer:
                error = str(answer["error"]["code"])
            elif answer["result"].get("isError") is True:
                error = "tool_error"
        found.append((body["method"], error))
    return found


@pytest.mark.parametrize("kind", CLIENTS)
def test_every_message_the_server_handled_is_one_point(telemetry, kind):
    async def scenario():
        async with sdk_stack(sdk_app()) as router:
            with server_instrumented(telemetry):
                async with AppClient(kind, router.url + "/mcp") as client:
                    await client.session.list_tools()
                    assert await client.call("json", progress=False) == "done json"
                    assert await client.call("sse") == "done sse"
                    failed = await client.session.call_tool("no-such-tool", {})
                    assert failed.is_error if hasattr(failed, "is_error") else failed.isError
            return router

    router = asyncio.run(scenario())
    sent = wire_messages(router)
    assert [m for m, _ in sent].count("tools/call") == 3, sent
    expected: dict = {}
    for method, error in sent:
        expected[(method, error)] = expected.get((method, error), 0) + 1
    assert ("tools/call", "tool_error") in expected
    assert by_method(telemetry) == expected, "one point per message the server took"

    version = "2026-07-28" if kind == MODERN else "2025-11-25"
    for point in points(telemetry):
        attributes = point.attributes
        assert attributes["mcp.protocol.version"] == version, attributes
        assert attributes["network.transport"] == "tcp"
        assert point.explicit_bounds == BUCKETS
        if attributes["mcp.method.name"] == "tools/call":
            assert attributes["gen_ai.tool.name"] in ("work", "no-such-tool")
        else:
            assert "gen_ai.tool.name" not in attributes
        assert not {"mcp.session.id", "server.address", "jsonrpc.request.id"} & set(attributes)
    # The durations are the handlers' own: the tool sleeps 50 ms.
    work = [
        p for p in points(telemetry)
        if p.attributes.get("gen_ai.tool.name") == "work"
    ]
    assert sum(p.count for p in work) == 2
    assert all(p.sum / p.count >= 0.05 for p in work), [(p.sum, p.count) for p in work]
    assert all(p.sum < 10 for p in points(telemetry))


def test_a_protocol_error_is_its_json_rpc_code(telemetry):
    """A request the server answers with a JSON-RPC error (an unknown
    prompt; 2025-11-25, a raw client): the answer's code is the point's
    ``error.type``."""
    with server_instrumented(telemetry), running(build_app(None)) as server:
        session = RawSession(server.url)
        try:
            answer = session.post("prompts/get", {"name": "no-such-prompt"})
            listed = session.post("tools/list", {})
        finally:
            session.close()
    code = answer["error"]["code"]
    assert isinstance(code, int), answer
    assert "result" in listed
    totals = by_method(telemetry)
    assert totals[("prompts/get", str(code))] == 1, totals
    assert totals[("tools/list", None)] == 1
    assert totals[("initialize", None)] == 1


@pytest.mark.parametrize("kind", [k for k in CLIENTS if k.values[0] != MODERN])
def test_a_session_of_a_legacy_revision_is_one_session_point(telemetry, kind):
    """2025-11-25 has sessions: the client's DELETE at its exit ends it."""
    async def scenario():
        async with sdk_stack(sdk_app()) as router:
            with server_instrumented(telemetry):
                async with AppClient(kind, router.url + "/mcp") as client:
                    await client.session.list_tools()
                await wait_until(lambda: points(telemetry, SESSION), 10)
            return router

    router = asyncio.run(scenario())
    deletes = [e for e in router.exchanges if e.request.method == "DELETE"]
    assert len(deletes) == 1 and deletes[0].status < 300, "the client ended its session"
    [session] = points(telemetry, SESSION)
    assert session.count == 1
    assert session.attributes == {
        "mcp.protocol.version": "2025-11-25", "network.transport": "tcp"
    }
    assert session.explicit_bounds == BUCKETS


@pytest.mark.mcp2
def test_2026_07_28_has_no_session(telemetry):
    async def scenario():
        async with sdk_stack(sdk_app()) as router:
            with server_instrumented(telemetry):
                async with AppClient(MODERN, router.url + "/mcp") as client:
                    await client.session.list_tools()
            return router

    asyncio.run(scenario())
    assert by_method(telemetry).get(("tools/list", None)) == 1
    assert points(telemetry, SESSION) == []


def test_the_legacy_sse_transport(telemetry):
    """2024-11-05's HTTP+SSE: POSTs accepted (202), answers on the GET
    stream; the session ends when the client leaves."""
    from mcp import ClientSession
    from mcp.client.sse import sse_client

    from mcp_resumption_demo.loopback import LoopbackServer
    from mcp_resumption_demo.router import Backend, Route
    from wire import WireRouter

    async def scenario():
        backend = await LoopbackServer(build_app(None, sse=True), name="legacy").astart()
        router = await WireRouter(lambda request: Route(Backend("legacy", backend.port))).start()
        try:
            with server_instrumented(telemetry):
                async with sse_client(router.url + "/sse") as (read, write), ClientSession(
                    read, write
                ) as session:
                    await session.initialize()
                    await session.call_tool("echo", {"text": "x"})
                await wait_until(lambda: points(telemetry, SESSION), 10)
        finally:
            await router.close()
            await asyncio.to_thread(backend.close)
        return router

    router = asyncio.run(scenario())
    posted = [
        e.request.jsonrpc["method"] for e in router.exchanges
        if e.request.method == "POST" and e.request.jsonrpc
    ]
    assert posted[0] == "initialize" and posted.count("tools/call") == 1, posted
    [stream] = [e for e in router.exchanges if e.request.method == "GET"]
    answers = [message(event) for event in stream.events if message(event)]
    assert any(a.get("result", {}).get("content") for a in answers), "the echo's answer"
    assert by_method(telemetry) == {(m, None): posted.count(m) for m in posted}
    [call] = [p for p in points(telemetry) if p.attributes["mcp.method.name"] == "tools/call"]
    assert call.attributes["gen_ai.tool.name"] == "echo"
    assert call.attributes["network.transport"] == "tcp"
    [session] = points(telemetry, SESSION)
    assert session.count == 1 and session.attributes["network.transport"] == "tcp"


def test_the_durations_can_be_switched_off(telemetry, monkeypatch):
    """``OTEL_PYTHON_MCP_RESUMPTION_OPERATION_METRIC=false``, the client
    half's switch: no point, the resume counts as before."""
    monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_OPERATION_METRIC", "false")
    kind = MCP1 if MCP_MAJOR == 1 else LEGACY  # a session, for the resume counts' series

    async def scenario():
        async with sdk_stack(sdk_app()) as router:
            with server_instrumented(telemetry):
                async with AppClient(kind, router.url + "/mcp") as client:
                    assert await client.call("sse") == "done sse"
            return router

    router = asyncio.run(scenario())
    assert [m for m, _ in wire_messages(router)].count("tools/call") == 1
    assert points(telemetry) == [] and points(telemetry, SESSION) == []
    assert telemetry.points("mcp.server.resumption.requests"), "the server half ran"
