"""Bounded memory (issue 7, part 3): a million sessions through the Tracker,
evictions counted through the real instrumentor, and a resume whose cursor
was evicted is ``unverifiable``, never a gap."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from fuzz_sse import Reply, block, consume, framed, head
from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import Tracker

SERVER = "127.0.0.1:9"
ACCEPT = (b"accept", b"text/event-stream")


def note(n: int, text: str = "") -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                       "params": {"n": n, "text": text}})


def test_a_million_sessions_churn_through_the_tracker():
    bound = 1000
    t = Tracker(max_streams=bound)
    for n in range(1_000_000):
        session = f"s{n}"
        stream = t.open_stream(SERVER, "streamable-http", session_id=session)
        if n % 4 == 0:
            # the same small integer ids in every session, as per-session counters give
            t.event_received(stream, str(n % 7 + 1), "d")
            t.event_consumed(stream)
        if n % 9 == 0:
            t.request_sent(SERVER, f"posted-{n}", [(str(n), "tools/call")])  # no stream
        assert len(t) <= bound and t.session_count <= bound
    assert len(t) == bound
    assert t.evicted_streams == 1_000_000 - bound
    assert t.evicted_sessions > 0
    assert len(t.index.cursors) <= 2 * bound
    # still working: the most recent session resumes as before
    last = t.open_stream(SERVER, "streamable-http", session_id="s999996",
                         last_event_id=str(999996 % 7 + 1))
    assert last.check is not None and last.check.cursor.known


def _churn(t: Tracker, sessions: range, id_length: int) -> None:
    for n in sessions:
        stream = t.open_stream(SERVER, "streamable-http", session_id=f"long-{n}")
        for k in range(40):
            t.event_consumed(stream)
            t.event_received(stream, f"{k:04d}" + "i" * id_length, note(k))
        t.event_consumed(stream)
        t.stream_ended(stream, "done")


def test_hostile_id_lengths_do_not_grow_what_is_remembered():
    """64 KiB event ids: the tracker keeps a bounded form of each (a prefix
    and a digest), not 32 copies per session of whatever the server sent."""
    t = Tracker(max_streams=64)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _churn(t, range(128), id_length=64 * 1024)
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(t) == 64
    assert retained < 8 * 1024 * 1024, f"{retained / 2**20:.0f} MiB retained"
    # equal long ids are still equal: a repeat with other data is id_reused
    stream = t.open_stream(SERVER, "streamable-http", session_id="long-127",
                           last_event_id="0039" + "i" * 64 * 1024)
    assert stream.check is not None and stream.check.cursor.known
    step = t.event_received(stream, "0038" + "i" * 64 * 1024, note(999))
    assert [gap.kind.value for gap in step.gaps] == ["id_reused"]


# -------------------------------------------------- through the instrumentor


def stream_script(session: str, ids: list[str], *, broken: bool = False) -> Reply:
    headers = [(b"content-type", b"text/event-stream"), (b"mcp-session-id", session.encode())]
    framing_line, chunks = framed([block(i, note(len(i), session + i)) for i in ids],
                                  "broken" if broken else "close")
    return Reply(head(200, headers, extra=framing_line), chunks)


@pytest.mark.parametrize("how", ["keyword", "environment"])
def test_evictions_are_counted_in_the_metric(raw_server, monkeypatch, how):
    telemetry = Telemetry()
    instrumentor = McpResumptionInstrumentor()
    if how == "environment":
        monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_MAX_STREAMS", "8")
        instrumentor.instrument(**telemetry.providers())
    else:
        instrumentor.instrument(**telemetry.providers(), max_streams=8)
    try:
        tracker = instrumentor.processor.tracker
        assert tracker.max_streams == 8
        for n in range(30):
            raw_server.reply(f"/evict/{how}/{n}", stream_script(f"ev-{how}-{n}", ["1", "2", "3"]))
            seen = consume("httpx-sse", f"{raw_server.url}/evict/{how}/{n}", headers=[ACCEPT])
            assert [e[2] for e in seen.events] == ["1", "2", "3"]
            assert len(tracker) <= 8 and tracker.session_count <= 8
        assert tracker.evicted_streams == 30 - 8
        assert telemetry.counts("mcp.client.resumption.evicted_streams") == {None: 22}
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()


@pytest.mark.parametrize("session_kept", [False, True], ids=["session-dropped", "session-kept"])
@pytest.mark.parametrize("replay", ["events", "priming"])
def test_a_resume_whose_cursor_was_evicted_is_unverifiable(raw_server, session_kept, replay):
    """Session A's stream (ids 1..5, the same ids as every other session's)
    is evicted by 12 others; A resumes with Last-Event-ID 5 and the server
    replays faithfully.  Nothing ties the cursor to anything any more: the
    verdict is unverifiable, never a gap (and never another session's)."""
    telemetry = Telemetry()
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), max_streams=8, confirm_timeout=60)
    base = f"/evicted/{replay}/{session_kept}"
    ids = [str(n) for n in range(1, 6)]
    try:
        raw_server.reply(base + "/a", stream_script("A", ids, broken=True))
        seen = consume("httpx2", raw_server.url + base + "/a",
                       headers=[ACCEPT, (b"mcp-session-id", b"A")])
        assert seen.last_id == "5" and "RemoteProtocolError" in seen.error
        for n in range(12):
            raw_server.reply(f"{base}/c{n}", stream_script(f"other-{n}", ids, broken=True))
            consume("httpx2", f"{raw_server.url}{base}/c{n}",
                    headers=[ACCEPT, (b"mcp-session-id", f"other-{n}".encode())])
        if session_kept:  # a POST keeps session A itself among the tracked
            raw_server.reply(base + "/post", stream_script("A", ["p-1"]))
            consume("httpx2", raw_server.url + base + "/post", method="POST",
                    headers=[ACCEPT, (b"mcp-session-id", b"A")],
                    body=b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        tracker = instrumentor.processor.tracker
        assert tracker.evicted_streams > 0
        kept = (f"127.0.0.1:{raw_server.port}", "A", None) in tracker.index.sessions
        assert kept or not session_kept
        replayed = [block("6", "" if replay == "priming" else note(6)), block("7", note(7))]
        headers = [(b"content-type", b"text/event-stream"), (b"mcp-session-id", b"A")]
        raw_server.reply(base + "/resume", Reply(head(200, headers), tuple(replayed)))
        resumed = consume("httpx2", raw_server.url + base + "/resume",
                          headers=[ACCEPT, (b"mcp-session-id", b"A"), (b"last-event-id", b"5")])
        assert [e[2] for e in resumed.events] == ["6", "7"]
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"unverifiable": 1}
