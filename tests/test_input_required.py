"""A non-final result is an answer (2026-07-28): an ``input_required`` result
answers its request, and the client's retry of the call carrying the input is
a new round under a new id, never a re-issue of a broken call and never what
makes the first request lost.  Through the real mcp 2.x ``Client`` (its own
input-required driver and elicitation callback) against the real mcp 2.x
server, behind the loopback router, whose record gives the truth.
"""


import asyncio  # no "from __future__ import annotations": the tool's are read at runtime

import pytest

from wire import WireRouter, message

pytestmark = pytest.mark.mcp2


def input_server():
    from mcp.server.mcpserver import Context, MCPServer
    from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult

    server = MCPServer("input-required")

    @server.tool()
    async def book(city: str, ctx: Context) -> str:
        responses = ctx.input_responses
        if not responses:
            await ctx.report_progress(1, 2)  # the answer comes as an SSE stream
            ask = ElicitRequest(
                params=ElicitRequestFormParams(
                    message="Which date?",
                    requested_schema={
                        "type": "object",
                        "properties": {"date": {"type": "string"}},
                        "required": ["date"],
                    },
                )
            )
            return InputRequiredResult(input_requests={"date": ask}, request_state="r1")
        return f"booked {city} on {responses['date'].content['date']}"

    return server.streamable_http_app()


@pytest.mark.parametrize("progress", [True, False], ids=["sse-answers", "json-answers"])
def test_an_input_required_round_trip_reports_no_loss(telemetry, monkeypatch, progress):
    from mcp import Client
    from mcp_types import ElicitResult

    from mcp_resumption_demo.loopback import LoopbackServer
    from mcp_resumption_demo.router import Backend, Route

    monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT", "0.5")

    async def answer_date(context, params):
        return ElicitResult(action="accept", content={"date": "2026-12-24"})

    async def scenario():
        backend = await LoopbackServer(input_server(), name="input").astart()
        router = await WireRouter(lambda request: Route(Backend("input", backend.port))).start()
        try:
            with telemetry.instrumented():
                async with Client(
                    router.url + "/mcp", elicitation_callback=answer_date
                ) as client:
                    kwargs = {"progress_callback": _ignore} if progress else {}
                    result = await client.call_tool("book", {"city": "Oslo"}, **kwargs)
                    assert result.content[0].text == "booked Oslo on 2026-12-24"
                    await asyncio.sleep(1.0)  # past the reissue window
        finally:
            await router.close()
            await asyncio.to_thread(backend.close)
        return router

    router = asyncio.run(scenario())
    calls = [
        exchange for exchange in router.exchanges
        if (exchange.request.jsonrpc or {}).get("method") == "tools/call"
    ]
    assert len(calls) == 2, "the wire shows the first round and its retry"
    first, retry = calls
    assert first.request.jsonrpc["id"] != retry.request.jsonrpc["id"]
    assert "inputResponses" in retry.request.jsonrpc["params"]
    assert not any(exchange.severed for exchange in router.exchanges)
    if progress:
        [answer] = [message(e) for e in first.events if (message(e) or {}).get("result")]
        assert answer["result"]["resultType"] == "input_required"

    assert telemetry.fates() == {}
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {}
    assert telemetry.counts("mcp.client.resumption.reissues") == {}


async def _ignore(*_args) -> None:
    return None


def test_a_task_handle_answers_its_call_and_a_broken_one_is_answered_by_it():
    """The tasks extension answers a tools/call with a task handle
    (``resultType: "task"``): an answer like any other, on the stream that
    carries it or on a resumed one, whatever becomes of the task."""
    import json

    from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import requests_in
    from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import Tracker

    server, session = "127.0.0.1:8000", "s-1"
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "book"}}
    ).encode()
    handle = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 7,
            "result": {"resultType": "task", "task": {"taskId": "t-1", "status": "working"}},
        }
    )
    tracker = Tracker()
    stream = tracker.open_stream(
        server, "streamable-http", session_id=session, carries=["7"], body=body,
        sent=requests_in(body), operation="the call",
    )
    tracker.event_received(stream, "1", json.dumps({"jsonrpc": "2.0", "method": "x"}))
    tracker.event_received(stream, "2", handle)
    assert tracker.take_operations() == [("tools/call", "7", "the call", None)], "no error"
    ended = tracker.stream_ended(stream, "a read error (RemoteProtocolError)")
    assert ended.broke == () and ended.fates == () and not ended.not_resumable
    assert tracker.all_lost("the process exited").fates == ()
