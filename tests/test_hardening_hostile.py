"""Hostile input through the real patched paths (issue 7, part 1).

A raw socket server writes exact bytes; the host is a plain httpx-sse or
httpx2 consumer, sync and async.  With the instrumentation in observe mode the
host must get exactly what it gets without it (same events, same exception),
no patch may fail inside, and a faithful resume must never be called a gap.
The fuzz target itself lives in ``fuzz_sse.py`` (``--cases N`` for long runs).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import httpx2
import httpx_sse
import pytest

from fuzz_sse import (
    EXTRA_HEADER_LINES,
    FLAVOURS,
    FRAMINGS,
    SSE_TYPE,
    STATUS_LINES,
    Case,
    Harness,
    RawServer,
    Reply,
    block,
    consume,
    head,
    package_log,
    run_faithful,
    run_fuzz,
    sse_reply,
)
from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor
from opentelemetry.instrumentation.mcp_resumption import patches as patches_module

ACCEPT = (b"accept", b"text/event-stream")


def note(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n}})


def result(request_id: object, n: int = 0) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"n": n}})


def tools_call(request_id: object) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "t"}}
    ).encode()


# ---------------------------------------------------------------- the corpus

HOSTILE_IDS = (
    "", "0", "-5", "-0", "+7", "007", "0000", "1e3", "9" * 41, "9" * 45, "9" * 4400,
    "x" * 10240, "é-5", "ストリーム_5", " 5", "5 ", "\t", "a b", "\u00a07", "e-5, e-6",
    "0f5b1c1e-6b7a-4c9e-9d47-3e2f7c1a2b3c", "\x00", "5\x00", "s-77:e-104", "-",
)


def _session(n: int) -> bytes:
    return f"hostile-{n}".encode()


def _resume_of(event_id: str) -> bytes:
    """What a host puts in Last-Event-ID: the id's UTF-8 bytes (httpx takes
    str header values as ASCII only)."""
    return event_id.encode("utf-8", "surrogatepass")


def corpus(flavour: str) -> list[tuple[str, Case]]:
    """Named hostile exchanges, in order (later resumes refer to earlier
    streams' ids, so the continuity rules run on hostile ids too)."""
    cases: list[tuple[str, Case]] = []

    def add(name: str, **fields) -> None:
        cases.append((name, Case(flavour, **fields)))

    # event ids: a stream that issues each hostile id, then a resume with it
    for n, event_id in enumerate(HOSTILE_IDS):
        session = _session(n)
        served = ((b"content-type", b"text/event-stream"), (b"mcp-session-id", session))
        add(f"issue id {event_id[:12]!r}", response_headers=served,
            request_headers=(ACCEPT, (b"mcp-session-id", session)),
            body=block("1", note(1)) + block(event_id, note(2)))
        add(f"resume id {event_id[:12]!r}", response_headers=served,
            request_headers=(ACCEPT, (b"mcp-session-id", session),
                             (b"last-event-id", _resume_of(event_id))),
            body=block(event_id + "1", note(3)) + block(event_id, note(4)) + block("", note(5)))
    # request side: Last-Event-ID and Mcp-Session-Id values, duplicates
    for value in (b"", b"x" * 10240, "é".encode(), b"\xff\xfe", b"9" * 4400, b"-1", b"007",
                  b" 5", b"5\x00", b"a\r\nb"):
        for name in (b"last-event-id", b"mcp-session-id"):
            add(f"request {name.decode()} {value[:8]!r}",
                request_headers=(ACCEPT, (name, value)), body=block("1", note(1)))
    add("duplicate request headers",
        request_headers=(ACCEPT, (b"last-event-id", b"5"), (b"last-event-id", b"6"),
                         (b"mcp-session-id", b"a"), (b"mcp-session-id", b"b")),
        body=block("7", note(7)))
    # response heads: malformed, oversized, duplicate, non-ASCII
    for value in (b"a" * 10240, b"", b"   ", b"\xff\xfe", "séssion".encode(), b"a, b"):
        add(f"response session {value[:8]!r}",
            response_headers=(SSE_TYPE, (b"mcp-session-id", value)), body=block("1", note(1)))
    add("duplicate response sessions",
        response_headers=(SSE_TYPE, (b"mcp-session-id", b"one"), (b"mcp-session-id", b"two")),
        body=block("1", note(1)))
    add("duplicate content types",
        response_headers=(SSE_TYPE, SSE_TYPE), body=block("1", note(1)))
    for extra in (*EXTRA_HEADER_LINES, b"x-long: " + b"y" * 12000, b"x-huge: " + b"h" * 70000):
        add(f"head line {extra[:16]!r}", extra=extra, body=block("1", note(1)))
    for status_line in STATUS_LINES:
        add(f"status line {status_line!r}", status_line=status_line, body=block("1", note(1)))
    for status in (204, 404, 500):
        add(f"status {status}", status=status, body=block("1", note(1)))
    # framing
    for framing in FRAMINGS:
        add(f"framing {framing}", framing=framing,
            body=block("1", note(1)) + block("2", note(2)))
    # SSE syntax
    events = [("1", note(1)), ("2", note(2)), ("3", note(3))]
    for end in ("\r", "\n", "\r\n"):
        body = b"".join(block(i, d, end=end) for i, d in events)
        add(f"line ends {end!r}", body=body)
        add(f"line ends {end!r} every byte", body=body, split_every_byte=True)
        add(f"line ends {end!r} no final blank line", body=body.rstrip(b"\r\n"))
    add("no line ends at all", body=b"id: 1data: x" * 50)
    add("mixed line ends", body=b"id: 1\rdata: a\r\n\nid: 2\ndata: b\r\r")
    for retry in ("abc", "-1", "", "1e3", "99999999999999999999999", "٣"):
        add(f"retry {retry!r}", body=block("1", note(1), retry=retry))
    add("retry only", body=b"retry: 10\n\nretry: x\n\n")
    add("comment flood", body=b":\n" * 20000 + block("1", note(1)) + b": c\r" * 5000)
    add("BOM", body=b"\xef\xbb\xbf" + block("1", note(1)))
    add("invalid UTF-8", body=b"id: \xff\xfe\ndata: \xc3\n\n" + block("2", note(2)))
    add("huge event", body=block("1", "d" * (1100 * 1024)), cuts=(4096, 65536, 700000))
    # JSON-RPC bodies: in events and in POSTs
    for data in ('{"jsonrpc": "2.0", "id": 1, "res', "not json", "[" * 6000, "{}" * 3,
                 '{"jsonrpc":"2.0","id":' + "1" * 5000 + ',"result":1}',
                 '{"jsonrpc":"2.0","id":1e400,"result":1}', '[{"id":1,"result":1}, 5, null]',
                 result("x" * 100000), result(True), result(None), result([1])):
        add(f"event data {data[:16]!r}", body=block("1", data) + block("2", note(2)))
    for body in (tools_call(1)[:-3], b"not json", b"[" * 6000, b"\xff\xfe",
                 tools_call("x" * 70000), b"[" + b",".join([tools_call(k) for k in range(3)])):
        add(f"POST {body[:16]!r}", method="POST", request_body=body,
            request_headers=(ACCEPT, (b"mcp-session-id", b"posting")),
            response_headers=(SSE_TYPE, (b"mcp-session-id", b"posting")),
            body=block("1", result(1)) + block("2", "{trunc"))
        add(f"legacy POST {body[:16]!r}", method="POST", request_body=body,
            query="session_id=legacy-hostile", response_headers=(), status=202)
    for query in ("session_id=" + "q" * 10240, "sessionId=%ff%fe", "sessionId=a&sessionId=b",
                  "session_id=", "ession=1"):
        add(f"query {query[:16]!r}", query=query,
            body=block(None, "/messages/?session_id=" + query[-8:], event="endpoint")
            + block("1", note(1)))
    add("endpoint events", body=block(None, "::not a url::", event="endpoint")
        + block(None, "/m?session_id=" + "e" * 5000, event="endpoint")
        + block(None, "http://[::1", event="endpoint"))
    # the host walks away early
    for stop in (0, 1):
        add(f"stop after {stop}", stop_after=stop, body=block("1", result(1)) * 3)
    return cases


def _run_corpus(server: RawServer, flavour: str) -> list[tuple[str, object]]:
    seen = []
    for index, (name, case) in enumerate(corpus(flavour)):
        path = f"/corpus/{flavour}/{index}"
        server.reply(path, case.reply())
        url = server.url + path + ("?" + case.query if case.query else "")
        seen.append((name, consume(flavour, url, method=case.method, headers=case.request_headers,
                                   body=case.request_body, stop_after=case.stop_after)))
    return seen


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_hostile_corpus_reaches_the_host_unchanged(raw_server, flavour):
    """Every hostile exchange, first with no instrumentation installed at all,
    then instrumented: the host sees the same events and the same exception."""
    instrumentor = McpResumptionInstrumentor()
    assert not instrumentor.is_instrumented_by_opentelemetry
    assert not hasattr(httpx.Client.send, "__wrapped__")
    bare = _run_corpus(raw_server, flavour)

    telemetry = Telemetry()
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=60)
    patches_module._reported.clear()
    try:
        with package_log() as records:
            observed = _run_corpus(raw_server, flavour)
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
    assert not raw_server.errors
    for (name, expected), (_, got) in zip(bare, observed, strict=True):
        assert got == expected, f"{name}: the host saw something else instrumented"
    assert not records, [r.getMessage() for r in records]
    # the corpus did reach the rules: resumes were judged, events counted
    assert sum(telemetry.outcomes().values()) >= len(HOSTILE_IDS) // 2
    assert sum(telemetry.counts("mcp.client.stream.events").values()) > 100
    # and the host did meet the errors an uninstrumented host meets
    errors = {seen.error.split(":")[0] for _, seen in bare if seen.error}
    assert len(errors) >= 3, errors


# ------------------------------------------------------------ fuzz slices


@pytest.fixture
def harness(raw_server):
    running = Harness(raw_server, confirm_timeout=60)
    yield running
    running.close()


def test_fuzz_hostile_direct(harness):
    """A few thousand generated cases straight into the patched Client.send
    and SSE iterators (MockTransport, chunks cut exactly, every byte too)."""
    stats = run_fuzz(harness, 2000, through_socket=False)
    assert stats.cases >= 1500
    assert stats.events > 1000
    assert len(stats.errors) >= 3  # the hosts met errors, the same ones either way
    assert harness.recheck_uninstrumented() > 10


def test_fuzz_hostile_socket(harness):
    """A few hundred through the real socket: malformed heads, framings."""
    before = harness.stats.cases
    stats = run_fuzz(harness, 300, through_socket=True)
    assert stats.cases - before >= 250
    assert any("RemoteProtocolError" in name for name in stats.errors)
    assert any("LocalProtocolError" in name for name in stats.errors)


def test_faithful_streams_never_gap_direct(harness):
    """Same session, increasing ids (integer, zero-padded, prefixed, unicode
    prefix, UUID, 200 chars, 46 digits), replayed strictly after the cursor,
    in any chunking and line ends, with comments, retries and heartbeats."""
    gaps = harness.telemetry.gap_kinds()
    harness.stats.outcomes.clear()
    run_faithful(harness, 600, through_socket=False)  # each case asserts its own verdict
    assert set(harness.stats.outcomes) == {"resumed", "caught_up", "unverifiable"}
    assert harness.telemetry.gap_kinds() == gaps, "the gap counters moved"


def test_faithful_streams_never_gap_socket(harness):
    gaps = harness.telemetry.gap_kinds()
    harness.stats.outcomes.clear()
    run_faithful(harness, 100, through_socket=True)
    assert set(harness.stats.outcomes) == {"resumed", "caught_up", "unverifiable"}
    assert harness.telemetry.gap_kinds() == gaps, "the gap counters moved"


# ------------------------------------------- the bugs these tests found


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("mode", ["observe", "enforce"])
def test_last_event_flushed_after_the_body_ends_is_not_a_walk_away(raw_server, flavour, mode):
    """CR-only line ends: the parser dispatches the last event only when the
    body has ended, after httpx closed the response itself.  That close is not
    the application walking away: the one-event faithful replay is resumed,
    and enforce mode does not fail the host."""
    telemetry = Telemetry()
    session = f"cr-{flavour}-{mode}".encode()
    served = (SSE_TYPE, (b"mcp-session-id", session))
    raw_server.reply(f"/cr/{flavour}/{mode}", Reply(
        head(200, served), (block("1", note(1), end="\r") + block("2", note(2), end="\r"),)))
    raw_server.on(f"/cr/{flavour}/{mode}/resume", lambda request: Reply(
        head(200, served), (block("3", note(3), end="\r"),)))
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), mode=mode, confirm_timeout=60)
    try:
        first = consume(flavour, f"{raw_server.url}/cr/{flavour}/{mode}",
                        headers=[ACCEPT, (b"mcp-session-id", session)])
        assert [e[2] for e in first.events] == ["1", "2"]
        resumed = consume(flavour, f"{raw_server.url}/cr/{flavour}/{mode}/resume",
                          headers=[ACCEPT, (b"mcp-session-id", session),
                                   (b"last-event-id", b"2")])
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
    assert resumed.error is None, resumed.error
    assert [e[2] for e in resumed.events] == ["3"]
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"resumed": 1}


def test_application_closing_before_reading_is_still_seen(raw_server):
    """The counterpart: a host that reads the headers of a resume under a new
    session and closes without iterating is the fail-closed re-initialise."""
    telemetry = Telemetry()
    raw_server.reply("/walk", Reply(head(200, (SSE_TYPE, (b"mcp-session-id", b"w-1"))),
                                    (block("1", note(1)),)))
    raw_server.reply("/walk/resume", sse_reply([block("1", note(1))], hold=True,
                                               headers=(SSE_TYPE, (b"mcp-session-id", b"w-2"))))
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=60)
    try:
        consume("httpx-sse", raw_server.url + "/walk", headers=[ACCEPT])
        with httpx.Client(trust_env=False) as http:
            headers = {"accept": "text/event-stream", "last-event-id": "1",
                       "mcp-session-id": "w-1"}
            with http.stream("GET", raw_server.url + "/walk/resume", headers=headers) as response:
                assert response.headers["mcp-session-id"] == "w-2"
        with httpx2.Client(trust_env=False) as http:
            headers = {"accept": "text/event-stream", "last-event-id": "1",
                       "mcp-session-id": "w-1"}
            with http.stream("GET", raw_server.url + "/walk/resume", headers=headers) as response:
                assert response.headers["mcp-session-id"] == "w-2"
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
        raw_server.release()
    assert telemetry.outcomes() == {"reinitialized": 2}
    assert telemetry.gap_kinds() == {}


@pytest.mark.parametrize("flavour", ["httpx-sse-async", "httpx2-async"])
def test_a_close_from_another_task_is_still_the_application(raw_server, flavour):
    """The other counterpart: while a reader task waits on a resume answered
    under a new session, another task closes the response.  That close is the
    application's (re-initialised), not the end of the body."""
    telemetry = Telemetry()
    served = (SSE_TYPE, (b"mcp-session-id", b"t-2"))
    raw_server.reply(f"/task/{flavour}", Reply(head(200, (SSE_TYPE, (b"mcp-session-id", b"t-1"))),
                                               (block("1", note(1)),)))
    raw_server.reply(f"/task/{flavour}/resume", Reply(head(200, served), (), hold=True))
    lib = httpx if flavour == "httpx-sse-async" else httpx2

    async def main() -> str:
        async with lib.AsyncClient(trust_env=False) as http:
            headers = {"accept": "text/event-stream", "mcp-session-id": "t-1",
                       "last-event-id": "1"}
            async with http.stream("GET", f"{raw_server.url}/task/{flavour}/resume",
                                   headers=headers) as response:
                reading = asyncio.Event()

                async def reader() -> str:
                    events = (httpx_sse.EventSource(response).aiter_sse()
                              if lib is httpx else aiter(httpx2.EventSource(response)))
                    reading.set()  # the loop below suspends in the read before we run again
                    try:
                        async for _ in events:
                            pass
                    except lib.TransportError as error:
                        return type(error).__name__
                    return "ended"

                task = asyncio.create_task(reader())
                await reading.wait()
                await response.aclose()
                return await task

    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=60)
    try:
        consume(flavour, f"{raw_server.url}/task/{flavour}", headers=[ACCEPT])
        assert asyncio.run(main()) == "ReadError"
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
        raw_server.release()
    assert telemetry.outcomes() == {"reinitialized": 1}
    assert telemetry.gap_kinds() == {}


@pytest.mark.parametrize("flavour", ["httpx-sse", "httpx2"])
def test_a_close_from_another_thread_is_still_the_application(raw_server, flavour):
    """The same with threads: while a reader thread is inside a read of a
    resume answered under a new session, the main thread closes the
    response.  The reader's frame is running, but on another thread's stack:
    the close is the application's (re-initialised), not the end of the
    body."""
    telemetry = Telemetry()
    served = (SSE_TYPE, (b"mcp-session-id", b"th-2"))
    raw_server.reply(f"/thread/{flavour}", Reply(
        head(200, (SSE_TYPE, (b"mcp-session-id", b"th-1"))), (block("1", note(1)),)))
    raw_server.reply(f"/thread/{flavour}/resume", Reply(head(200, served), (), hold=True))
    lib = httpx if flavour == "httpx-sse" else httpx2
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=60)
    outcome: list[str] = []
    try:
        consume(flavour, f"{raw_server.url}/thread/{flavour}", headers=[ACCEPT])
        with lib.Client(trust_env=False) as http:
            headers = {"accept": "text/event-stream", "mcp-session-id": "th-1",
                       "last-event-id": "1"}
            with http.stream("GET", f"{raw_server.url}/thread/{flavour}/resume",
                             headers=headers) as response:
                events = (httpx_sse.EventSource(response).iter_sse()
                          if lib is httpx else iter(httpx2.EventSource(response)))

                def read() -> None:
                    try:
                        for _ in events:
                            pass
                        outcome.append("ended")
                    except Exception as error:  # the close cuts the read
                        outcome.append(type(error).__name__)

                reader = threading.Thread(target=read)
                reader.start()
                # Inside the read: the generator runs until the socket answers.
                deadline = time.monotonic() + 10
                while not events.gi_running and time.monotonic() < deadline:
                    time.sleep(0.001)
                assert events.gi_running
                response.close()
                reader.join(10)
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
        raw_server.release()
    assert outcome and outcome != ["ended"], outcome
    assert telemetry.outcomes() == {"reinitialized": 1}
    assert telemetry.gap_kinds() == {}


def test_every_byte_split_of_a_faithful_resume_httpx_sse_async(raw_server):
    """The same faithful resume, the body written one byte per TCP write."""
    telemetry = Telemetry()
    served = (SSE_TYPE, (b"mcp-session-id", b"bytes-1"))
    first = block("e-1", note(1), end="\r\n") + block("e-2", note(2), end="\r")
    replay = block("e-3", note(3), end="\r") + b": tail\r" + block("e-4", note(4), end="\n")
    raw_server.reply("/bytes", Reply(head(200, served),
                                     tuple(first[i:i + 1] for i in range(len(first)))))
    raw_server.reply("/bytes/resume", Reply(head(200, served),
                                            tuple(replay[i:i + 1] for i in range(len(replay)))))
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=60)
    try:
        seen = consume("httpx-sse-async", raw_server.url + "/bytes",
                       headers=[ACCEPT, (b"mcp-session-id", b"bytes-1")])
        resumed = consume("httpx-sse-async", raw_server.url + "/bytes/resume",
                          headers=[ACCEPT, (b"mcp-session-id", b"bytes-1"),
                                   (b"last-event-id", seen.last_id.encode())])
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
    assert [e[2] for e in resumed.events] == ["e-3", "e-4"]
    assert telemetry.outcomes() == {"resumed": 1}
    assert telemetry.gap_kinds() == {}

