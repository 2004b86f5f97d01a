"""Lifecycle (issue 7, part 5): instrument, uninstrument, instrument again;
fork of an instrumented process; exit with streams open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import httpx2
import httpx_sse
import pytest

from fuzz_sse import RawRequest, Reply, block, consume, head
from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

PROGRAMS = Path(__file__).parent / "programs"
SRC = Path(__file__).resolve().parents[1] / "src"
ACCEPT = (b"accept", b"text/event-stream")


def note(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n}})


def restarted(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": {"n": n, "restarted": True}})


def echo(ids: list[str], *, hold: bool = False, data=note):
    """A script answering under the request's own session with ``ids``."""

    def answer(request: RawRequest) -> Reply:
        session = request.header("mcp-session-id") or b"none"
        headers = [(b"content-type", b"text/event-stream"), (b"mcp-session-id", session)]
        return Reply(head(200, headers), tuple(block(i, data(int(i))) for i in ids), hold)

    return answer


@pytest.fixture(scope="module", autouse=True)
def routes(raw_server):
    """The replies every test of this module and its programs read."""
    server = raw_server
    server.on("/first", echo(["1", "2", "3"]))
    # A reset counter numbers new events from 1 again: new data under an old
    # id (the same data again would be a duplicate, not a reset).
    server.on("/reset", echo(["1"], data=restarted))
    server.on("/fork/first", echo(["1", "2", "3"]))
    server.on("/fork/reset", echo(["1"], data=restarted))
    server.on("/fork/silent", echo([], hold=True))
    server.on("/shutdown/first", echo(["1", "2"]))
    server.on("/shutdown/silent", echo([], hold=True))
    server.on("/shutdown/ongoing", echo(["3", "4"], hold=True))


# ------------------------------------------------ instrument / uninstrument

PATCHED = [
    (httpx.Client, "send"), (httpx.AsyncClient, "send"),
    (httpx.Response, "close"), (httpx.Response, "aclose"),
    (httpx2.Client, "send"), (httpx2.AsyncClient, "send"),
    (httpx2.Response, "close"), (httpx2.Response, "aclose"),
    (httpx_sse.EventSource, "iter_sse"), (httpx_sse.EventSource, "aiter_sse"),
    (httpx2.EventSource, "__iter__"), (httpx2.EventSource, "__aiter__"),
]


def _sdk_targets() -> list:
    from mcp.client.streamable_http import StreamableHTTPTransport

    return [(StreamableHTTPTransport, name)
            for name in ("_handle_reconnection", "_handle_resumption_request")
            if name in vars(StreamableHTTPTransport)]


def _originals() -> dict:
    return {(owner, name): vars(owner)[name] for owner, name in PATCHED + _sdk_targets()}


def _break_and_reset(session: bytes, flavour: str = "httpx-sse") -> None:
    headers = [ACCEPT, (b"mcp-session-id", session)]
    first = consume(flavour, raw_server_url + "/first", headers=headers)
    assert [e[2] for e in first.events] == ["1", "2", "3"]
    consume(flavour, raw_server_url + "/reset", headers=[*headers, (b"last-event-id", b"3")])


raw_server_url = ""


@pytest.fixture
def url(raw_server):
    global raw_server_url
    raw_server_url = raw_server.url
    return raw_server.url


def test_uninstrument_restores_every_original_and_reinstrument_counts_once(url):
    originals = _originals()
    instrumentor = McpResumptionInstrumentor()
    first, second = Telemetry(), Telemetry()

    instrumentor.instrument(**first.providers())
    for (owner, name), original in originals.items():
        wrapper = vars(owner)[name]
        assert wrapper is not original and wrapper.__wrapped__ is original, (owner, name)
    instrumentor.instrument(**second.providers())  # a second call is refused, not stacked
    assert vars(httpx.Client)["send"].__wrapped__ is originals[(httpx.Client, "send")]
    _break_and_reset(b"life-1")
    assert first.gap_kinds() == {"id_regression": 1} and second.gap_kinds() == {}

    instrumentor.uninstrument()
    for (owner, name), original in originals.items():
        assert vars(owner)[name] is original, f"{owner.__name__}.{name} still patched"
    assert instrumentor.processor is None
    _break_and_reset(b"life-2")  # uninstrumented: nobody counts
    assert first.gap_kinds() == {"id_regression": 1}

    instrumentor.instrument(**second.providers())
    try:
        for (owner, name), original in originals.items():
            assert vars(owner)[name].__wrapped__ is original, "patched twice"
        for flavour in ("httpx-sse", "httpx2-async"):
            _break_and_reset(f"life-3-{flavour}".encode(), flavour)
    finally:
        instrumentor.uninstrument()
    assert second.gap_kinds() == {"id_regression": 2}, "counted once per resume"
    assert second.outcomes() == {"gap": 2}
    assert sum(second.counts("mcp.client.stream.events").values()) == 8
    assert first.gap_kinds() == {"id_regression": 1}, "the old processor stayed off"
    assert first.outcomes() == {"gap": 1}
    for (owner, name), original in originals.items():
        assert vars(owner)[name] is original


def test_uninstrument_in_the_middle_of_a_stream(url):
    """A stream opened instrumented and read after uninstrument: the host is
    not disturbed, and nothing is counted any more."""
    telemetry = Telemetry()
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers())
    try:
        with httpx.Client(trust_env=False) as http, http.stream("GET", url + "/first",
                         headers={"accept": "text/event-stream"}) as response:
            events = httpx_sse.EventSource(response).iter_sse()
            ids = [next(events).id]
            instrumentor.uninstrument()
            ids += [event.id for event in events]
    finally:
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
    assert ids == ["1", "2", "3"]
    assert sum(telemetry.counts("mcp.client.stream.events").values()) == 1


# ---------------------------------------------------------- subprocesses


def _env(server_url: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(Path(__file__).parent)])
    env["HARDENING_SERVER_URL"] = server_url
    env.update(extra)
    return env


@pytest.mark.parametrize("held", ["tracker", "deadlines"])
def test_fork_of_an_instrumented_process(raw_server, held):
    """The fork happens while another thread holds one of our locks and the
    confirmation-window thread runs: the child neither deadlocks nor goes
    blind; it observes a counter reset and a timeout, and exports them."""
    result = subprocess.run(
        [sys.executable, str(PROGRAMS / "hardening_fork.py"), held],
        env=_env(raw_server.url), capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    reports = {line["who"]: line for line in map(json.loads, result.stdout.splitlines())}
    assert set(reports) == {"parent-before", "child", "parent-after"}
    assert reports["child"]["pid"] != reports["parent-after"]["pid"]
    for who, report in reports.items():
        assert report["gaps"] == {"id_regression": 1, "replay_unconfirmed": 1}, who
        assert report["outcomes"] == {"gap": 2}, who
        assert report["timer_decided"], f"{who}: the confirmation window never closed"
        assert report["spans"] >= 2, who


# every mode under both instrumentations, each library twice (a run imports mcp: ~2 s)
SHUTDOWN_RUNS = [
    ("thread", "httpx-sse", "manual"),
    ("asyncio", "httpx2", "manual"),
    ("exit", "httpx2", "manual"),
    ("thread", "httpx2", "auto"),
    ("asyncio", "httpx-sse", "auto"),
    ("exit", "httpx-sse", "auto"),
]


def test_exit_with_streams_open(raw_server):
    """Every way a client exits mid-read, with manual and auto
    instrumentation: exit code 0 and no traceback (nor 'Exception ignored')."""
    instrument = Path(sys.executable).with_name("opentelemetry-instrument")
    running = []
    for mode, flavour, how in SHUTDOWN_RUNS:
        command = [sys.executable, str(PROGRAMS / "hardening_shutdown.py"), mode, flavour, how]
        env = _env(raw_server.url)
        if how == "auto":
            command = [str(instrument), *command]
            env.update(
                OTEL_SERVICE_NAME="shutdown-client",
                OTEL_TRACES_EXPORTER="console",
                OTEL_METRICS_EXPORTER="console",
                OTEL_LOGS_EXPORTER="console",
                OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT="30",
            )
        running.append(((mode, flavour, how), subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    try:
        for name, process in running:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, (name, out, err)
            assert "ready" in out, (name, out, err)
            for bad in ("Traceback", "Exception ignored", "Error"):
                assert bad not in err, (name, err)
            if name[0] == "thread":
                # the daemon reader dies undecided: its resume span is never ended
                assert '"name": "mcp.resume"' not in out, name
            if name[0] == "exit":
                # decided before the exit, and flushed by the SDK's own shutdown
                assert '"mcp.resumption.outcome": "resumed"' in out, name
    finally:
        for _, process in running:
            if process.poll() is None:
                process.kill()
        raw_server.release()


def test_any_number_of_cycles_on_the_same_providers(url):
    """Every cycle counts, in every metric (the observable event counter the SDK
    hands back is the first cycle's), and one hook alone sits on the provider,
    whatever the number of cycles (it was one processor per cycle)."""
    import threading

    telemetry = Telemetry()
    instrumentor = McpResumptionInstrumentor()
    processors = list(telemetry.tracer_provider._active_span_processor._span_processors)
    cycles = 12
    for cycle in range(cycles):
        instrumentor.instrument(**telemetry.providers())
        try:
            _break_and_reset(f"cycles-{cycle}".encode())
        finally:
            instrumentor.uninstrument()
        assert sum(telemetry.counts("mcp.client.stream.events").values()) == 4 * (cycle + 1)
    assert telemetry.gap_kinds() == {"id_regression": cycles}
    assert telemetry.outcomes() == {"gap": cycles}
    added = telemetry.tracer_provider._active_span_processor._span_processors[len(processors):]
    assert len(added) == 1, added
    workers = [t.name for t in threading.enumerate() if t.name.startswith("mcp-resumption")]
    assert len(workers) <= 2, f"threads of earlier cycles still run: {workers}"
