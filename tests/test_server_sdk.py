"""The server half, on the installed MCP SDK major's real server: the resume
requests it receives, counted by outcome; ProvableEventStore; the guard."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from opentelemetry.instrumentation.mcp_resumption.server import (
    ProvableEventStore,
)
from server_harness import (
    REQUESTS,
    RawSession,
    UuidStore,
    build_app,
    call_slow,
    running,
    server_instrumented,
    server_outcomes,
)


def slow_call(store, timeout: float = 10):
    with running(build_app(store)) as server:
        return asyncio.run(call_slow(server.url, timeout))


# -- ProvableEventStore -------------------------------------------------------------------


@pytest.mark.parametrize("provable", [False, True], ids=["uuid-store", "provable-uuid-store"])
def test_provable_store_turns_an_unverifiable_resume_into_resumed(telemetry, provable):
    inner = UuidStore()
    store = ProvableEventStore(inner) if provable else inner
    with telemetry.instrumented(confirm_timeout=2):
        result = slow_call(store)
    assert result.content[0].text == "done"
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"resumed" if provable else "unverifiable": 1}
    [span] = telemetry.resume_spans()
    first = span.attributes["mcp.resumption.first_event_id"]
    if provable:
        stream, _, counter = first.rpartition(":")
        assert stream and int(counter) >= 2, first
    else:
        assert first in inner.event_index  # the inner store's own uuid went out


def test_provable_store_keeps_the_inner_stores_answers():
    async def scenario():
        inner = UuidStore()
        store = ProvableEventStore(inner)
        ids = [await store.store_event("7", None)]
        ids += [await store.store_event("7", {"n": n}) for n in range(3)]
        ids.append(await store.store_event("8", {"n": 9}))
        assert ids == ["7:1", "7:2", "7:3", "7:4", "8:1"]
        assert len(inner.event_index) == 5  # every event is the inner store's too
        sent = []

        async def send(event):
            sent.append((event.event_id, event.message))

        assert await store.replay_events_after("7:2", send) == "7"
        assert sent == [("7:3", {"n": 1}), ("7:4", {"n": 2})]
        assert await store.replay_events_after("7:99", send) is None
        assert await store.replay_events_after(next(iter(inner.event_index)), send) is None

    asyncio.run(scenario())


def test_provable_store_forgets_the_oldest_ids_beyond_its_bound():
    async def scenario():
        store = ProvableEventStore(UuidStore(max_events_per_stream=10), max_events=3)
        for n in range(5):
            await store.store_event("1", {"n": n})
        sent = []

        async def send(event):
            sent.append(event.event_id)

        assert await store.replay_events_after("1:1", send) is None  # forgotten
        assert await store.replay_events_after("1:3", send) == "1"
        assert sent == ["1:4", "1:5"]

    asyncio.run(scenario())


# -- observe ------------------------------------------------------------------------------


def test_a_faithful_resume_is_counted_replayed(telemetry):
    with server_instrumented(telemetry):
        result = slow_call(ProvableEventStore(UuidStore()))
    assert result.content[0].text == "done"
    assert server_outcomes(telemetry) == {"replayed": 1}
    [point] = [p for p in telemetry.points("mcp.server.resumption.replayed_events") if p.count]
    assert point.sum >= 1 and point.attributes["mcp.resumption.outcome"] == "replayed"
    assert telemetry.gap_logs() == []


def test_an_unknown_cursor_is_counted_and_writes_a_gap_event(telemetry):
    store = UuidStore()
    with server_instrumented(telemetry), running(build_app(store)) as server:
        raw = RawSession(server.url)
        raw.echo("hello")
        status, _, _ = raw.resume("no-such-cursor", timeout=2)
        raw.close()
    assert status == 200  # the SDK's answer, unchanged in observe mode
    assert server_outcomes(telemetry) == {"unknown_cursor": 1}
    [log] = telemetry.gap_logs()
    attributes = log.log_record.attributes
    assert attributes["mcp.resumption.gap.kind"] == "unknown_cursor"
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == server.port
    assert attributes["mcp.transport"] == "streamable-http"
    session = attributes["mcp.session.id"]
    assert session != raw.session_id and len(session) == 16  # hashed, never raw
    assert raw.session_id not in json.dumps(dict(attributes)) + str(log.log_record.body)


def test_a_cursor_of_another_session_is_counted_other_session(telemetry):
    """The session manager hands one store to every session: a cursor of
    session A presented in session B is replayed into B (a foreign replay)."""
    store = UuidStore()
    with server_instrumented(telemetry), running(build_app(store)) as server:
        first, second = RawSession(server.url), RawSession(server.url)
        first.echo("a")
        status, _, body = second.resume(first.last_ids[0], timeout=1)
        first.close()
        second.close()
    assert status == 200 and b'"a"' in body, "the SDK replays session A's answer into B"
    assert server_outcomes(telemetry) == {"other_session": 1}
    [log] = telemetry.gap_logs()
    attributes = log.log_record.attributes
    assert attributes["mcp.resumption.gap.kind"] == "other_session"
    assert attributes["mcp.resumption.previous_session.id"] != attributes["mcp.session.id"]
    for raw_id in (first.session_id, second.session_id):
        assert raw_id not in json.dumps(dict(attributes)) + str(log.log_record.body)


def test_session_id_policy_raw_and_omit(telemetry):
    store = UuidStore()
    for policy in ("raw", "omit"):
        with server_instrumented(telemetry, session_id=policy), running(build_app(store)) as server:
            raw = RawSession(server.url)
            raw.resume("unknown", timeout=1)
            raw.close()
        attributes = telemetry.gap_logs()[-1].log_record.attributes
        if policy == "raw":
            assert attributes["mcp.session.id"] == raw.session_id
        else:
            assert "mcp.session.id" not in attributes


def test_an_unknown_session_is_counted(telemetry):
    with server_instrumented(telemetry), running(build_app(UuidStore())) as server:
        raw = RawSession(server.url)
        status, _, _ = raw.resume("1", session_id="not-a-session", timeout=1)
        raw.close()
    assert status == 404
    assert server_outcomes(telemetry) == {"unknown_session": 1}
    assert telemetry.gap_logs() == []


def test_a_server_without_a_store_is_counted_no_store(telemetry):
    with server_instrumented(telemetry), running(build_app(None)) as server:
        raw = RawSession(server.url)
        status, _, _ = raw.resume("1", timeout=1)
        raw.close()
    assert status == 500  # the SDK sends no response; uvicorn answers 500
    assert server_outcomes(telemetry) == {"no_store": 1}


def test_a_legacy_sse_resume_is_counted_no_store(telemetry):
    import httpx

    with server_instrumented(telemetry), running(build_app(None, sse=True), "/sse") as server:
        headers = {"last-event-id": "4821", "accept": "text/event-stream"}
        with httpx.stream("GET", server.url, headers=headers, timeout=5) as response:
            status = response.status_code
            for line in response.iter_lines():
                if line.startswith("data:"):
                    break  # the endpoint event of a fresh session
    assert status == 200
    counts = {}
    for point in telemetry.points(REQUESTS):
        if point.value:
            key = point.attributes["mcp.transport"], point.attributes["mcp.resumption.outcome"]
            counts[key] = point.value
    assert counts == {("sse", "no_store"): 1}


def test_every_outcome_of_a_server_starts_at_zero(telemetry):
    with server_instrumented(telemetry), running(build_app(UuidStore())) as server:
        RawSession(server.url).close()
    series = {
        (p.attributes["mcp.resumption.outcome"], p.attributes.get("mcp.resumption.gap.kind"))
        for p in telemetry.points(REQUESTS)
        if p.attributes.get("server.port") == server.port
    }
    assert {outcome for outcome, _ in series} == {
        "replayed", "nothing_to_replay", "unknown_cursor", "other_session",
        "unknown_session", "no_store", "rejected_by_guard",
    }
    assert {kind for outcome, kind in series if outcome == "rejected_by_guard"} == {
        "unknown_cursor", "other_session", "no_store",
    }


def _normalised(answer, session_ids):
    status, headers, body = answer
    headers = {k: v for k, v in headers.items() if k not in ("date", "mcp-session-id")}
    for session_id in session_ids:
        body = body.replace(session_id.encode(), b"<session>")
    return status, headers, body


@pytest.mark.parametrize("case", ["known", "unknown", "other_session"])
def test_observe_mode_leaves_the_wire_unchanged(telemetry, case):
    """Observe (guard off): the same resume answered byte for byte the same,
    uninstrumented and instrumented, on the same server."""
    store = UuidStore()
    answers = []
    for instrumented in (False, True):
        context = server_instrumented(telemetry) if instrumented else contextlib.nullcontext()
        with context, running(build_app(store)) as server:
            raw = RawSession(server.url)
            other = RawSession(server.url)
            raw.echo("same")
            cursor = "nope" if case == "unknown" else raw.last_ids[0]
            session = other.session_id if case == "other_session" else None
            answer = raw.resume(cursor, session_id=session, timeout=1)
            answers.append(_normalised(answer, [raw.session_id, other.session_id]))
            raw.close()
            other.close()
    bare, observed = answers
    # the replayed events carry the ids and bodies of each run's own events
    if case != "unknown":
        assert bare[2].count(b"id:") == observed[2].count(b"id:") >= 1
        bare = (bare[0], bare[1], len(bare[2]))
        observed = (observed[0], observed[1], len(observed[2]))
    assert bare == observed
    assert sum(server_outcomes(telemetry).values()) == 1


# -- the guard ----------------------------------------------------------------------------


def test_guard_rejects_an_unknown_cursor_with_410(telemetry):
    with server_instrumented(telemetry, guard="reject"), running(build_app(UuidStore())) as server:
        raw = RawSession(server.url)
        status, headers, body = raw.resume("no-such-cursor", timeout=2)
        raw.close()
    assert status == 410
    assert headers["content-type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert error["code"] == -32000 and error["message"].startswith("Gone:")
    assert server_outcomes(telemetry) == {"rejected_by_guard": 1}
    [point] = [p for p in telemetry.points(REQUESTS) if p.value]
    assert point.attributes["mcp.resumption.gap.kind"] == "unknown_cursor"
    [log] = telemetry.gap_logs()
    assert log.log_record.attributes["mcp.resumption.gap.kind"] == "unknown_cursor"


def test_guard_rejects_a_cursor_of_another_session(telemetry):
    store = UuidStore()
    with server_instrumented(telemetry, guard="reject"), running(build_app(store)) as server:
        first, second = RawSession(server.url), RawSession(server.url)
        first.echo("a")
        status, _, body = second.resume(first.last_ids[0], timeout=1)
        first.close()
        second.close()
    assert status == 410 and b'"a"' not in body
    [point] = [p for p in telemetry.points(REQUESTS) if p.value]
    assert point.attributes["mcp.resumption.outcome"] == "rejected_by_guard"
    assert point.attributes["mcp.resumption.gap.kind"] == "other_session"


def test_guard_lets_a_known_cursor_replay_as_before(telemetry):
    store = UuidStore()
    with server_instrumented(telemetry, guard="reject"), running(build_app(store)) as server:
        raw = RawSession(server.url)
        raw.echo("kept")
        status, _, body = raw.resume(raw.last_ids[0], timeout=1)
        raw.close()
    assert status == 200 and b'"kept"' in body
    assert server_outcomes(telemetry) == {"replayed": 1}


def test_guard_rejects_a_resume_on_a_server_without_a_store(telemetry):
    with server_instrumented(telemetry, guard="reject"), running(build_app(None)) as server:
        raw = RawSession(server.url)
        status, _, _ = raw.resume("1", timeout=1)
        raw.close()
    assert status == 410
    [point] = [p for p in telemetry.points(REQUESTS) if p.value]
    assert point.attributes["mcp.resumption.gap.kind"] == "no_store"


# -- host safety and lifecycle ------------------------------------------------------------


class BrokenStore(UuidStore):
    """A store whose replay fails: the SDK's own error path, whatever we do."""

    async def replay_events_after(self, last_event_id, send_callback):
        raise RuntimeError("the store is down")


@pytest.mark.parametrize("guard", ["off", "reject"])
def test_a_failing_store_fails_as_it_does_bare(telemetry, guard):
    answers = []
    for instrumented in (False, True):
        context = (
            server_instrumented(telemetry, guard=guard) if instrumented
            else contextlib.nullcontext()
        )
        with context, running(build_app(BrokenStore())) as server:
            raw = RawSession(server.url)
            raw.echo("x")
            status, _, body = raw.resume(raw.last_ids[0], timeout=1)
            raw.close()
        answers.append((status, body.count(b"data: {")))
    assert answers[0] == answers[1]


def test_uninstrument_removes_every_patch(telemetry):
    import mcp.server.sse as sse
    import mcp.server.streamable_http as transport
    import mcp.server.streamable_http_manager as manager

    targets = [
        (transport.StreamableHTTPServerTransport, "__init__"),
        (transport.StreamableHTTPServerTransport, "_replay_events"),
        (manager.StreamableHTTPSessionManager, "_handle_stateful_request"),
        (sse.SseServerTransport, "connect_sse"),
    ]
    from wrapt import FunctionWrapper

    def patched() -> list[bool]:
        return [isinstance(vars(owner)[name], FunctionWrapper) for owner, name in targets]

    for _ in range(2):
        with server_instrumented(telemetry):
            assert all(patched())
        assert not any(patched())
    # uninstrumented again: nothing is counted, the resume is the SDK's
    with running(build_app(UuidStore())) as server:
        raw = RawSession(server.url)
        raw.echo("bare")
        status, _, body = raw.resume(raw.last_ids[0], timeout=1)
        raw.close()
    assert status == 200 and b'"bare"' in body
    assert server_outcomes(telemetry) == {}


def test_the_guard_setting_is_validated(caplog):
    from opentelemetry.instrumentation.mcp_resumption import config

    assert config.load_server_guard(env={}) == "off"
    assert config.load_server_guard(env={config.SERVER_GUARD: "REJECT"}) == "reject"
    assert config.load_server_guard("off", env={config.SERVER_GUARD: "reject"}) == "off"
    with caplog.at_level("WARNING"):
        assert config.load_server_guard(env={config.SERVER_GUARD: "block"}) == "off"
    assert config.SERVER_GUARD in caplog.text and "reject" in caplog.text
