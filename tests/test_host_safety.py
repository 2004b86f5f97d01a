"""Never harm the host: no lock on a finalizer's path, the SDK's recursion
budget kept, any number of instrument cycles, setup in any order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from fuzz_sse import Reply, block, head

PROGRAMS = Path(__file__).parent / "programs"
SRC = Path(__file__).resolve().parents[1] / "src"


def note(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n}})


@pytest.fixture(scope="module", autouse=True)
def routes(raw_server):
    """The replies the programs of this module read."""
    server = raw_server
    events = tuple(block(str(i), note(i)) for i in (1, 2, 3))
    server.reply("/cycle/stream", Reply(head(200, [(b"content-type", b"text/event-stream")]),
                                        events, False))
    # The reset stream's "1" is a new event (other data): the same data again
    # would be at-least-once redelivery, not a reset.
    for path, ids, base in (("/late/first", ("1", "2", "3"), 0), ("/late/reset", ("1",), 100)):
        session = [(b"content-type", b"text/event-stream"), (b"mcp-session-id", b"late-session-1")]
        events = tuple(block(i, note(base + int(i))) for i in ids)
        server.reply(path, Reply(head(200, session), events))


def _env(server_url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(Path(__file__).parent)])
    env["HARDENING_SERVER_URL"] = server_url
    return env


@pytest.mark.parametrize(
    ("threshold", "threads", "iterations"),
    [("default", 1, 2500), ("1", 1, 300), ("1", 3, 150)],
    ids=["default-threshold", "threshold-1", "threshold-1-threads"],
)
def test_iterators_abandoned_in_a_cycle_never_hang_the_host(raw_server, threshold, threads,
                                                            iterations):
    """The cyclic GC finalises an abandoned iterator at any allocation, also one
    made while the instrumentation holds a lock: the report of that stream's
    end must never block on it (it hung at iteration 212 in one run)."""
    try:
        result = subprocess.run(
            [sys.executable, str(PROGRAMS / "abandon_in_cycle.py"), threshold, str(threads),
             str(iterations)],
            env=_env(raw_server.url), capture_output=True, text=True, timeout=90, check=False,
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the host hung: {expired.stderr!r}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    total = threads * iterations
    # every stream's end reported (its one event counted), none lost in a finalizer
    assert json.loads(result.stdout) == {"done": total, "threads": threads, "events": total}


# ------------------------------------------------ the SDK's recursion budget


class EndlessPolls:
    """A minimal MCP server that ends every stream after one event with
    ``retry: 0`` and never answers the tool call: the SDK client reconnects,
    recursively, until its stack runs out.  Counts the reconnects."""

    def __init__(self) -> None:
        self.reconnects = 0

    def __call__(self, request) -> Reply:
        if request.method == "GET":
            if request.header("last-event-id") is None:
                return Reply(head(405, ()))  # no standalone stream
            self.reconnects += 1
            return self._events(self.reconnects)
        if request.method != "POST":
            return Reply(head(200, ()))
        message = json.loads(request.body)
        if "id" not in message:
            return Reply(head(202, ()))
        if message["method"] == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "endless-polls", "version": "1"},
            }
            body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
            headers = [(b"content-type", b"application/json"), (b"mcp-session-id", b"polls-1"),
                       (b"content-length", str(len(body)).encode())]
            return Reply(head(200, headers) + body)
        return self._events(0)

    @staticmethod
    def _events(n: int) -> Reply:
        headers = [(b"content-type", b"text/event-stream"), (b"mcp-session-id", b"polls-1")]
        log = {"jsonrpc": "2.0", "method": "notifications/message",
               "params": {"level": "info", "data": n}}
        return Reply(head(200, headers), (block(str(n + 1), json.dumps(log), retry="0"),))


def _reconnects_until_the_sdk_gives_up(server, script: EndlessPolls) -> int:
    import anyio
    from mcp import ClientSession

    from mcp_resumption_demo.clients import MCP_MAJOR

    script.reconnects = 0

    async def call() -> None:
        with contextlib.suppress(Exception):
            if MCP_MAJOR == 1:
                from mcp.client.streamable_http import streamablehttp_client

                async with streamablehttp_client(server.url + "/mcp") as (read, write, _), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    with anyio.move_on_after(60):
                        await session.call_tool("t", {}, read_timeout_seconds=timedelta(seconds=60))
            else:
                from mcp import Client
                from mcp.client.streamable_http import streamable_http_client

                async with Client(streamable_http_client(server.url + "/mcp"),
                                  mode="legacy") as client:
                    with anyio.move_on_after(60):
                        await client.call_tool("t", {})

    asyncio.run(call())
    return script.reconnects


def test_the_sdk_gives_up_after_as_many_reconnects_instrumented(raw_server, telemetry):
    """The SDK's reconnection recurses, once per reconnect: the plugin's wrapper
    must not add to each level's depth (it halved the budget, 960 to 479)."""
    script = EndlessPolls()
    raw_server.on("/mcp", script)
    bare = _reconnects_until_the_sdk_gives_up(raw_server, script)
    with telemetry.instrumented():
        instrumented = _reconnects_until_the_sdk_gives_up(raw_server, script)
    print(f"reconnects before the SDK gave up: bare {bare}, instrumented {instrumented}")
    assert bare > 100, f"the SDK gave up after {bare} reconnects: not the recursion"
    assert abs(instrumented - bare) <= 0.05 * bare, (bare, instrumented)
    assert telemetry.outcomes(), "the reconnects were observed"


# ------------------------------------------------ any order of set-up


def test_providers_set_after_instrument(raw_server):
    result = subprocess.run(
        [sys.executable, str(PROGRAMS / "late_providers.py")],
        env=_env(raw_server.url), capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["client_spans"] == 2 and report["with_session"] == 2, report
    assert report["resume_spans"] == 1, report
    assert report["gaps"] == {"id_regression": 1} and report["gap_logs"] == 1, report
    assert report["events"] == 4, report


# ------------------------------------------------ bounded log volume


def test_gap_logs_are_rate_limited_and_every_gap_is_counted(telemetry):
    """20,000 answers to ids the session never sent: 20,000 foreign_replay gaps
    counted, a handful of log records (each used to copy the server's id)."""
    from opentelemetry.instrumentation.mcp_resumption import ContinuityProcessor
    from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import requests_in
    from opentelemetry.instrumentation.mcp_resumption.telemetry.facts import RequestFacts

    processor = ContinuityProcessor(**telemetry.providers())
    server, host, session = "127.0.0.1:9", "127.0.0.1", "flood-session-1"
    # A tools/call whose answer is still to come keeps the resumed attempt
    # looking at every event (with nothing pending it stops after a window).
    call = '{"jsonrpc": "2.0", "id": 1, "method": "tools/call"}'
    facts = RequestFacts("POST", server, host, session_id=session, requests=requests_in(call))
    context = processor.end_request(facts, processor.begin_request(facts), 200, session, True)
    for k in (1, 2, 3):
        processor.event(context, "message", str(k), note(k))
    processor.asked_next(context)  # the application took event 3
    processor.ended(context, "a read error (RemoteProtocolError)")
    resume = RequestFacts("GET", server, host, session_id=session, last_event_id="3")
    context = processor.end_request(resume, processor.begin_request(resume), 200, session, True)
    processor.event(context, "message", "4", note(4))
    for k in range(20_000):
        answer = json.dumps({"jsonrpc": "2.0", "id": f"unknown-{k}-" + "z" * 64, "result": {}})
        processor.event(context, "message", str(5 + k), answer)
    processor.ended(context, "the stream ended")
    processor.shutdown()
    assert telemetry.gap_kinds().get("foreign_replay") == 20_000
    assert 1 <= len(telemetry.gap_logs()) <= 12


# ------------------------------------------------ no start-up tax

LAZY_PROGRAM = """
import sys
before = sorted(m for m in ("mcp", "httpx2", "httpx_sse") if m in sys.modules)
import httpx_sse
print(before, hasattr(httpx_sse.EventSource.aiter_sse, "__wrapped__"))
"""


def test_libraries_are_patched_when_imported_not_at_startup():
    """``opentelemetry-instrument`` loads the plugin in every program: it must
    not import mcp, httpx2 or httpx-sse itself (it did, for 1 s a start; the
    control is the same start with the plugin disabled), and must still patch
    each as the program imports it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none",
               OTEL_LOGS_EXPORTER="none", PYTHONPATH=str(SRC))
    instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    reports = []
    for disabled in ("", "mcp_resumption"):
        result = subprocess.run(
            [str(instrument), sys.executable, "-c", LAZY_PROGRAM],
            env={**env, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": disabled},
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert result.returncode == 0, result.stderr
        reports.append(result.stdout.split("\n")[0])
    enabled, control = reports
    assert enabled == control.replace("False", "True"), reports
