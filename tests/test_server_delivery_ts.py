"""The server half's delivery fates (issue 39) for a client that cannot be
instrumented: the TypeScript SDK client (node, SDK 1.x, protocol
2025-11-25, through tests/programs/ts_call.mjs) against the installed mcp
SDK's Python server without an event store, seen from the server alone.

The truth is the router's record (which stream it cut, what crossed the
wire) and the handler's own log (started, finished), as in
tests/test_server_delivery.py, whose stack this reuses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
from pathlib import Path

import pytest

from proxy_harness import find_node
from test_server_delivery import DELIVERIES, SECOND, Stack, _wait, fates, wasted
from wire import message

TS_CALL = Path(__file__).parent / "programs" / "ts_call.mjs"
PROTOCOL = "2025-11-25"  # what SDK 1.x's client asks for, and these servers speak
FATE_UNDELIVERED = "undelivered"


@pytest.fixture(scope="module")
def node() -> str:
    return find_node()


def ts_call(node: str, url: str, text: str) -> subprocess.Popen:
    return subprocess.Popen(
        [node, str(TS_CALL), url, "work", json.dumps({"text": text}), "60000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def settle(predicate, bound: float = 5.0) -> None:
    """Until ``predicate()`` holds or ``bound`` s passed (no raise: the asserts say what failed)."""
    deadline = time.monotonic() + bound
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def report_of(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_a_clean_typescript_call_is_delivered_and_nothing_else(telemetry, node):
    async def scenario():
        async with Stack(telemetry) as stack:
            client = ts_call(node, stack.url, "clean")
            output, errors = await asyncio.to_thread(client.communicate, timeout=60)
            return stack, output, errors

    stack, output, errors = asyncio.run(scenario())
    assert report_of(output)[-1].get("result") == "done clean", (output, errors)
    assert stack.handlers.log == [("started", "clean"), ("finished", "clean")]
    assert not any(e.severed for e in stack.router.exchanges)
    answered = stack.requests_answered_on_the_wire()
    assert answered >= 2  # initialize, the call
    assert fates(telemetry) == {"delivered": answered}
    assert {p.attributes["mcp.protocol.version"] for p in telemetry.points(DELIVERIES)
            if p.attributes.get("mcp.protocol.version")} <= {PROTOCOL}
    assert wasted(telemetry) == {}


def test_a_typescript_call_cut_before_its_answer_is_undelivered_and_work_for_nobody(
    telemetry, node, caplog
):
    """No event store, so no priming event: the TypeScript client cannot
    resume the cut stream (it waits on, to its own timeout).  The handler
    runs to completion after the cut (a disconnect is no cancellation on
    2025-11-25) and answers a stream already gone."""

    async def scenario():
        async with Stack(telemetry, cut="x") as stack:
            client = ts_call(node, stack.url, "x")
            try:
                # The client's progress line: it read its stream up to the cut.
                seen = await asyncio.to_thread(client.stdout.readline)
                await asyncio.to_thread(_wait, lambda: stack.handlers.saw("finished", "x"))
                # The handler's answer is written just after its return: its
                # fate is counted then (a bound, not a pause; the asserts judge).
                await asyncio.to_thread(settle, lambda: FATE_UNDELIVERED in fates(telemetry))
            finally:
                client.kill()  # before its own timeout would cancel the call
                output, _ = await asyncio.to_thread(client.communicate, timeout=10)
            return stack, seen + output

    with caplog.at_level(logging.INFO, "opentelemetry.instrumentation.mcp_resumption.server"):
        stack, output = asyncio.run(scenario())
    # The wire: the call's POST stream cut after its progress, its answer
    # never crossed, no resume (nothing to resume with).
    [cut] = [e for e in stack.router.exchanges if e.severed]
    assert (cut.request.jsonrpc or {}).get("method") == "tools/call"
    assert (cut.request.jsonrpc or {}).get("params", {}).get("arguments") == {"text": "x"}
    request_id = (cut.request.jsonrpc or {}).get("id")
    assert not any(ev.id for ev in cut.events), "no event id: nothing to resume with"
    on_wire = [
        decoded for e in stack.router.exchanges for ev in e.events
        if (decoded := message(ev)) and decoded.get("id") == request_id and "method" not in decoded
    ]
    assert on_wire == []
    assert not any(e.request.header("last-event-id") for e in stack.router.exchanges)
    assert {"progress": 1} in report_of(output)
    assert not any("result" in r for r in report_of(output)), output
    # The handler's own log: it ran to its end, once, after the cut.
    assert stack.handlers.log == [("started", "x"), ("finished", "x")]
    counted = fates(telemetry)
    assert counted.pop(FATE_UNDELIVERED) == 1, counted
    assert set(counted) == {"delivered"}  # initialize, tools/list and the like
    assert wasted(telemetry) == {("work", PROTOCOL, "none"): 1}
    assert telemetry.counts(SECOND, "gen_ai.tool.name") == {}  # never called again
    [line] = [r for r in caplog.records if "ran to completion" in r.getMessage()]
    assert line.levelno == logging.WARNING and "'work'" in line.getMessage()
