"""The standard MCP client metric, ``mcp.client.operation.duration``
(semantic-conventions-genai, Development), through real stacks: the installed
SDK major's client against its own server, behind the demo's loopback
router, in every transport generation (2026-07-28, 2025-11-25 streamable
HTTP, and the legacy HTTP+SSE transport on mcp 1.x), with answers as JSON and
as SSE.

The truth is the router's record: every JSON-RPC request the client sent and
whether its answer crossed the wire, and how.  Each request that got an
answer or a fate is one point, with the conventions' attributes; a call cut
before its answer is ``orphaned_request`` when lost and ``reissued`` when the
application sent it again (values of ours, documented).
"""

from __future__ import annotations

import asyncio

import pytest

from wire import (
    CLIENTS,
    LEGACY,
    MCP1,
    MCP_MAJOR,
    MODERN,
    AppClient,
    Truth,
    fates,
    first_call_fails,
    instrument_env,
    message,
    sdk_app,
    sdk_stack,
    wait_until,
)

DURATION = "mcp.client.operation.duration"
CONFIRM = 1.0


def points(telemetry) -> list:
    return telemetry.recorded(DURATION)


def by_method(telemetry) -> dict:
    return telemetry.by_method(DURATION)


def wire_requests(router) -> list[tuple[object, str, object]]:
    """(id, method, the exchange) of every request the client POSTed."""
    found = []
    for exchange in router.exchanges:
        body = exchange.request.jsonrpc
        if exchange.request.method == "POST" and body and "id" in body and "method" in body:
            found.append((body["id"], body["method"], exchange))
    return found


@pytest.mark.parametrize("kind", CLIENTS)
def test_every_answered_request_is_one_point_with_the_conventions_attributes(
    telemetry, monkeypatch, kind
):
    instrument_env(monkeypatch, "observe", CONFIRM)

    async def scenario():
        async with sdk_stack(sdk_app(), cut=False) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    await client.session.list_tools()
                    assert await client.call("json", progress=False) == "done json"
                    assert await client.call("sse") == "done sse"
            return router

    router = asyncio.run(scenario())
    sent = wire_requests(router)
    methods = [method for _, method, _ in sent]
    assert methods.count("tools/call") == 2 and "tools/list" in methods
    expected: dict = {}
    for _, method, _ in sent:
        expected[(method, None)] = expected.get((method, None), 0) + 1
    assert by_method(telemetry) == expected, "one point per request on the wire, no error"

    protocol = "2026-07-28" if kind == MODERN else None
    for point in points(telemetry):
        attributes = point.attributes
        assert attributes["server.address"] == "127.0.0.1"
        assert attributes["server.port"] == router.port
        if attributes["mcp.method.name"] == "tools/call":
            assert attributes["gen_ai.tool.name"] == "work"
        else:
            assert "gen_ai.tool.name" not in attributes
        if protocol is not None:
            assert attributes["mcp.protocol.version"] == protocol
        assert "mcp.session.id" not in attributes
    # The durations are the requests' own: the tool sleeps 50 ms.
    calls = [p for p in points(telemetry) if p.attributes["mcp.method.name"] == "tools/call"]
    assert all(p.sum / p.count >= 0.05 for p in calls), [(p.sum, p.count) for p in calls]
    assert all(p.sum < 10 for p in points(telemetry))


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_tool_error_is_tool_error(telemetry, monkeypatch, kind):
    instrument_env(monkeypatch, "observe", CONFIRM)

    async def scenario():
        async with sdk_stack(sdk_app(), cut=False) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    result = await client.session.call_tool("no-such-tool", {})
                    assert result.is_error if hasattr(result, "is_error") else result.isError
            return router

    router = asyncio.run(scenario())
    assert [m for _, m, _ in wire_requests(router)].count("tools/call") == 1
    errors = {key: n for key, n in by_method(telemetry).items() if key[0] == "tools/call"}
    assert errors == {("tools/call", "tool_error"): 1}


NOT_RESUMABLE = [
    pytest.param(MODERN, marks=pytest.mark.mcp2, id="mcp2-default"),
    pytest.param(LEGACY, marks=pytest.mark.mcp2, id="mcp2-legacy"),
    pytest.param(MCP1, marks=pytest.mark.mcp1, id="mcp1"),
]


@pytest.mark.parametrize("reissue", [True, False], ids=["reissued", "lost"])
@pytest.mark.parametrize("kind", NOT_RESUMABLE)
def test_a_cut_call_is_one_point_with_its_fate_as_error_type(telemetry, monkeypatch, kind,
                                                              reissue):
    instrument_env(monkeypatch, "observe", CONFIRM)

    async def scenario():
        async with sdk_stack(sdk_app()) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    await first_call_fails(client)
                    if reissue:
                        assert await client.call("x") == "done x"
                    await wait_until(lambda: fates(telemetry), CONFIRM + 6)
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    [call] = truth.cut
    assert truth.fate(call) == ("reissued" if reissue else "lost")
    calls = {key: n for key, n in by_method(telemetry).items() if key[0] == "tools/call"}
    expected = {("tools/call", "reissued"): 1, ("tools/call", None): 1} if reissue else {
        ("tools/call", "orphaned_request"): 1
    }
    assert calls == expected


def test_the_legacy_sse_transport_times_its_answers_on_the_get_stream(telemetry, monkeypatch):
    """2024-11-05: the POST is accepted (202) and its answer comes on the
    session's GET stream; the installed major's SSE server and client."""
    from mcp import ClientSession
    from mcp.client.sse import sse_client

    from mcp_resumption_demo.loopback import LoopbackServer
    from mcp_resumption_demo.router import Backend, Route
    from wire import WireRouter

    instrument_env(monkeypatch, "observe", CONFIRM)
    if MCP_MAJOR == 1:
        from mcp.server.fastmcp import FastMCP as Server
    else:
        from mcp.server.mcpserver import MCPServer as Server
    server = Server("legacy")

    @server.tool()
    async def work(text: str) -> str:
        await asyncio.sleep(0.05)
        return "done " + text

    async def scenario():
        backend = await LoopbackServer(server.sse_app(), name="legacy").astart()
        router = await WireRouter(lambda request: Route(Backend("legacy", backend.port))).start()
        try:
            with telemetry.instrumented():
                async with sse_client(router.url + "/sse") as (read, write), ClientSession(
                    read, write
                ) as session:
                    await session.initialize()
                    await session.call_tool("work", {"text": "x"})
        finally:
            await router.close()
            await asyncio.to_thread(backend.close)
        return router

    router = asyncio.run(scenario())
    sent = wire_requests(router)
    methods = [method for _, method, _ in sent]
    assert methods[0] == "initialize" and methods.count("tools/call") == 1, methods
    assert all(exchange.status == 202 for _, _, exchange in sent), "answered on the GET stream"
    [stream] = [e for e in router.exchanges if e.request.method == "GET"]
    answered = {message(event).get("id") for event in stream.events if message(event)}
    assert {request_id for request_id, _, _ in sent} <= answered
    assert by_method(telemetry) == {(method, None): methods.count(method) for method in methods}
    [call] = [p for p in points(telemetry) if p.attributes["mcp.method.name"] == "tools/call"]
    assert call.attributes["gen_ai.tool.name"] == "work"
    assert 0.05 <= call.sum < 10


HOW = ["streamed", "read-by-send", "redirected"]


@pytest.mark.parametrize("how", HOW)
def test_a_json_answer_is_timed_however_the_client_reads_it(telemetry, how):
    """A raw httpx client: ``client.stream`` leaves the body to the client,
    ``client.post`` reads it inside ``send`` (nothing closes it afterwards),
    and a redirect (Starlette's ``/mcp/`` to ``/mcp``) sends the body again
    as a stream the plugin does not read."""
    import httpx

    body = {"jsonrpc": "2.0", "id": 41, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}  # fmt: skip
    headers = {"accept": "application/json, text/event-stream"}

    async def raw():
        async with sdk_stack(sdk_app(json_response=True), cut=False) as (router, _, _):
            with telemetry.instrumented():
                async with httpx.AsyncClient(follow_redirects=True) as http:
                    url = router.url + ("/mcp/" if how == "redirected" else "/mcp")
                    if how == "read-by-send":
                        response = await http.post(url, json=body, headers=headers)
                    else:
                        async with http.stream("POST", url, json=body, headers=headers) as response:
                            await response.aread()
                    assert response.status_code == 200
                    assert response.headers["content-type"].startswith("application/json")
                    assert [r.status_code for r in response.history] == (
                        [307] if how == "redirected" else []
                    )
            return router

    router = asyncio.run(raw())
    [point] = points(telemetry)
    assert point.attributes["mcp.method.name"] == "initialize" and point.count == 1
    assert point.attributes["server.port"] == router.port


def test_the_operation_metric_can_be_switched_off(telemetry, monkeypatch):
    """``OTEL_PYTHON_MCP_RESUMPTION_OPERATION_METRIC=false``: no point, the
    other metrics as before."""
    monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_OPERATION_METRIC", "false")
    kind = MCP1 if MCP_MAJOR == 1 else MODERN

    async def scenario():
        async with sdk_stack(sdk_app(), cut=False) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    await client.session.list_tools()
                    assert await client.call("sse") == "done sse"
                    assert await client.call("json", progress=False) == "done json"
            return router

    router = asyncio.run(scenario())
    assert [m for _, m, _ in wire_requests(router)].count("tools/call") == 2
    assert points(telemetry) == []
    assert telemetry.points("mcp.client.resumption.broken_requests"), "the plugin ran"
