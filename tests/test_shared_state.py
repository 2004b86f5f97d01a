"""Shared state (issue 32) through the tracker: two trackers with a store of
their own each, as two processes of a fleet or a client before and after a
restart, against a real redis-server.  A cursor the second never saw is
judged from the first's record, as if the first had judged it; with state in
memory the same resume is ``unverifiable``.  Also the setting, the security
rules (no raw session id in Redis, a TTL on every key) and the faults:
Redis stopped, killed, restarted, paused, full, evicting; the tracker goes
on in memory, each fallback counted and each episode logged once.  The SDK
clients and the subprocesses are tests/test_shared_state_restart.py's.
"""

from __future__ import annotations

import logging
import time

import pytest

from opentelemetry.instrumentation.mcp_resumption import config
from opentelemetry.instrumentation.mcp_resumption.shared.redis_state import (
    KEY_PREFIX,
    RedisStore,
    state_store,
)
from opentelemetry.instrumentation.mcp_resumption.shared.shared_state import MEMORY, SharedRecord
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import Tracker
from redis_stack import RedisServer
from tracker_scenarios import SERVER, notification, result, resume, tools_call

pytest.importorskip("redis")

KEY = b"a fleet's shared key"
SECRET = "sess-0f3a9c1e77b24d5a"  # a session id that must never reach Redis


@pytest.fixture
def fresh(redis_server):
    """The server emptied and running, whatever the test before did to it."""
    if redis_server.process.poll() is not None:
        redis_server.start()
    client = redis_server.client()
    client.config_set("maxmemory", 0)
    client.config_set("maxmemory-policy", "noeviction")
    client.flushall()
    return redis_server


class Fallbacks:
    """The fallback callback the monitor hands the store, as a list."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, operation: str, reason: str) -> None:
        self.seen.append((operation, reason))


OPENED: list[RedisStore] = []


@pytest.fixture(autouse=True)
def close_stores():
    """Each test's stores end with it: a writer thread left running would
    write (and log) into the next test, whose Redis may be down."""
    yield
    while OPENED:
        OPENED.pop().close()


def store(url: str, fallbacks: Fallbacks | None = None, **kwargs) -> RedisStore:
    opened = RedisStore(url, KEY, fallbacks or Fallbacks(), **kwargs)
    OPENED.append(opened)
    return opened


def tracker(shared) -> Tracker:
    return Tracker(store=shared)


def broken_call(t: Tracker, session: str = SECRET, ids=None):
    """A tools/call whose stream delivers progress events and breaks before
    its answer: the record a resume in another process needs."""
    ids = ids or [f"{session}:e-1", f"{session}:e-2", f"{session}:e-3"]
    stream = t.open_stream(
        SERVER, "streamable-http", session_id=session, carries=["7"],
        sent=[("7", "tools/call")], body=tools_call(7).encode(),
    )
    for n, event_id in enumerate(ids):
        t.event_consumed(stream)
        t.event_received(stream, event_id, notification(n))
    t.event_consumed(stream)
    t.stream_ended(stream, "read error")
    return stream


# ---------------------------------------------------------------- the setting


def test_unset_is_memory_and_needs_no_redis():
    settings = config.load(env={})
    assert settings.state is None
    assert state_store(settings, Fallbacks()) is MEMORY
    assert Tracker().store is MEMORY


def test_a_url_without_the_shared_key_warns_once_and_stays_in_memory(caplog):
    config._warned.clear()
    env = {config.STATE: "redis://:hunter2@127.0.0.1:1/0"}
    with caplog.at_level(logging.WARNING):
        assert state_store(config.load(env=env), Fallbacks()) is MEMORY
        assert state_store(config.load(env=env), Fallbacks()) is MEMORY
    [line] = [r.getMessage() for r in caplog.records if config.STATE in r.getMessage()]
    assert config.STATE_KEY in line and "hunter2" not in line, line


def test_the_extra_missing_warns_once_and_stays_in_memory(caplog, monkeypatch):
    config._warned.clear()
    monkeypatch.setitem(__import__("sys").modules, "redis", None)  # import redis fails
    env = {config.STATE: "redis://127.0.0.1:1/0", config.STATE_KEY: "k"}
    with caplog.at_level(logging.WARNING):
        assert state_store(config.load(env=env), Fallbacks()) is MEMORY
        assert state_store(config.load(env=env), Fallbacks()) is MEMORY
    [line] = [r.getMessage() for r in caplog.records if config.STATE in r.getMessage()]
    assert "[state]" in line, line


def test_a_url_and_a_key_open_the_redis_store(fresh):
    env = {config.STATE: fresh.url, config.STATE_KEY: "k"}
    shared = state_store(config.load(env=env), Fallbacks())
    try:
        assert isinstance(shared, RedisStore)
    finally:
        shared.close()


def assert_shared_or_refused(url: str, *, shared: bool) -> None:
    """A broken call's record through a store on ``url``: found again where
    ``shared``; else not written, and the write's fallback counted."""
    fallbacks = Fallbacks()
    a = store(url, fallbacks)
    broken_call(tracker(a), ids=["1", "2"])
    a.flush()
    found = a.lookup(SERVER, "2")
    if shared:
        assert found is not None and found.pending == {"7": "tools/call"}
        assert fallbacks.seen == []
    else:
        assert found is None and fallbacks.seen and fallbacks.seen[0][0] == "write"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis-auth"), password="s3cret-pw")
    yield server
    server.close()


@pytest.mark.parametrize("how", ["url", "REDISCLI_AUTH", "REDIS_PASSWORD", "wrong"])
def test_a_password_in_the_url_or_the_standard_environment(guarded, monkeypatch, how):
    for name in ("REDISCLI_AUTH", "REDIS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    url = guarded.url
    if how == "url":
        url = f"redis://:s3cret-pw@127.0.0.1:{guarded.port}/0"
    elif how == "wrong":
        url = f"redis://:nope@127.0.0.1:{guarded.port}/0"
    else:
        monkeypatch.setenv(how, "s3cret-pw")
    assert_shared_or_refused(url, shared=how != "wrong")


@pytest.fixture(scope="module")
def tls_only(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis-tls"), tls=True)
    yield server
    server.close()


@pytest.mark.parametrize("how", ["rediss", "untrusted", "plain"])
def test_rediss_verifies_the_server_and_shares_through_tls(tls_only, how):
    """A Redis that speaks TLS only: ``rediss://`` with the CA named in the
    URL shares records; ``rediss://`` without it (the system's CAs, which do
    not know the test CA) is refused by the certificate check, and a plain
    ``redis://`` gets no answer: both fall back to memory, counted."""
    port = tls_only.port
    url = {
        "rediss": tls_only.url,
        "untrusted": f"rediss://127.0.0.1:{port}/0",
        "plain": f"redis://127.0.0.1:{port}/0",
    }[how]
    assert_shared_or_refused(url, shared=how == "rediss")
    if how == "rediss":
        assert tls_only.client().dbsize() > 0  # written, through TLS


# ---------------------------------------------------------------- the verdicts


def test_a_cursor_of_another_process_is_resumed_when_the_replay_is_faithful(fresh):
    """Process A's stream breaks; process B resumes its cursor in the same
    session and gets the rest: ``resumed``, and the call answered.  With
    state in memory B cannot tell: ``unverifiable``."""
    a = store(fresh.url)
    broken_call(tracker(a))
    assert a.flush()
    b = store(fresh.url)
    run = resume(tracker(b), f"{SECRET}:e-3", [(f"{SECRET}:e-4", result(7, 4))],
                 session=SECRET, answered_session=SECRET)
    assert run.outcome == "resumed", run.verdicts
    assert run.kinds == frozenset()
    memory = resume(Tracker(), f"{SECRET}:e-3", [(f"{SECRET}:e-4", result(7, 4))],
                    session=SECRET, answered_session=SECRET)
    assert memory.outcome == "unverifiable"


def test_a_reset_counter_behind_the_url_is_an_id_regression(fresh):
    a = store(fresh.url)
    broken_call(tracker(a), ids=["101", "102", "103"])
    assert a.flush()
    run = resume(tracker(store(fresh.url)), "103", [("1", notification(9))],
                 session=SECRET, answered_session=SECRET)
    assert run.outcome == "gap" and "id_regression" in run.kinds, run.verdicts
    # The request the broken stream was to answer is lost, once, here.
    assert "orphaned_request" in run.kinds


def test_a_fresh_session_behind_the_url_is_session_changed(fresh):
    a = store(fresh.url)
    broken_call(tracker(a), ids=["101", "102", "103"])
    assert a.flush()
    run = resume(tracker(store(fresh.url)), "103", [("1", notification(9))],
                 session=SECRET, answered_session="a-fresh-session")
    assert "session_changed" in run.kinds, run.verdicts


def test_per_session_counters_find_the_named_session_s_record(fresh):
    """A server that counts ids per session repeats them across sessions:
    two sessions' streams end at "3".  A resume of "3" that names one of
    them is judged by that session's record, whichever was written last."""
    a = store(fresh.url)
    t = tracker(a)
    broken_call(t, session="session-one-0001", ids=["1", "2", "3"])
    broken_call(t, session="session-two-0002", ids=["1", "2", "3"])
    assert a.flush()
    for session in ("session-one-0001", "session-two-0002"):
        run = resume(tracker(store(fresh.url)), "3", [("4", result(7, 4))],
                     session=session, answered_session=session)
        assert run.outcome == "resumed", (session, run.verdicts)


def test_a_cursor_that_names_its_own_session_is_bound_to_it(fresh):
    """The client names no session (a restarted client that kept only its
    token): the session embedded in the cursor is the cursor's, by its hash."""
    a = store(fresh.url)
    broken_call(tracker(a))
    assert a.flush()
    run = resume(tracker(store(fresh.url)), f"{SECRET}:e-3",
                 [(f"{SECRET}:e-4", result(7, 4))], session=None, answered_session="other")
    assert "session_changed" in run.kinds, run.verdicts


# ---------------------------------------------------------------- security, bounds


def test_no_raw_session_id_is_written_and_every_key_expires(fresh):
    a = store(fresh.url)
    broken_call(tracker(a))
    assert a.flush()
    client = fresh.client()
    keys = client.keys("*")
    assert keys and all(key.decode().startswith(KEY_PREFIX) for key in keys)
    for key in keys:
        assert 0 < client.pttl(key) <= 3600 * 1000
        if client.type(key) == b"hash":
            dumped = b"".join(b"".join(item) for item in client.hgetall(key).items()) + key
        else:
            dumped = client.get(key) + key
        assert SECRET.encode() not in dumped, dumped
    records = [client.hget(key, "record") for key in client.keys(f"{KEY_PREFIX}:c:*")]
    assert records and all(b"e-3" in record for record in records), "ids kept, sessions hidden"


def test_a_stream_s_update_is_atomic_and_the_newest_wins(fresh):
    """Two instances write one stream's record: every key of it is the one
    record, and an older record never overwrites a newer one."""
    a = store(fresh.url)
    newer = SharedRecord.of(
        server=SERVER, session_id=None, session_hash=None, path="/mcp",
        transport="streamable-http", last_received="5", last_consumed="4", seen=[],
        meanings=None, pending=[], unconsumed_responses=(), primed=False, retry_ms=None,
        server_closed=False, writer="new",
    )
    older = SharedRecord(**{**newer.__dict__, "writer": "old", "at": newer.at - 10})
    a.save(newer)
    a.save(older)
    assert a.flush()
    for cursor in ("4", "5"):
        assert a.lookup(SERVER, cursor).writer == "new"


@pytest.mark.parametrize("stored", [
    b"not json", b"[]", b'{"v": 99}', b'{"v": 1, "server": "x"}', b'{"v": 1}' + b" " * 10,
])
def test_a_record_that_is_not_one_is_a_miss(fresh, stored):
    """Redis is shared: what it holds is never trusted to be a record."""
    shared = store(fresh.url)
    for session_hash in (None, shared.session_hash(SECRET)):
        fresh.client().hset(shared.record_key(SERVER, "5", session_hash),
                            mapping={"record": stored, "at": 0})
    assert shared.lookup(SERVER, "5") is None
    run = resume(tracker(shared), "5", [("6", notification(6))], session=SECRET,
                 answered_session=SECRET)
    assert run.outcome == "unverifiable"


def test_the_per_event_path_makes_no_redis_call(fresh):
    """Events are read with the store configured: Redis sees nothing until
    the stream ends (one batched write), and nothing from a resume whose
    cursor this process knows."""
    shared = store(fresh.url)
    t = tracker(shared)
    stream = t.open_stream(SERVER, "streamable-http", session_id=SECRET)
    assert shared.flush()  # a server's first stream sweeps its in-flight ledger
    before, writes = fresh.total_calls(), shared.writes
    for n in range(500):
        t.event_consumed(stream)
        t.event_received(stream, str(n), notification(n))
    assert fresh.total_calls() == before
    assert shared.reads == 0 and shared.writes == writes
    t.stream_ended(stream, "read error")
    assert shared.flush()
    assert shared.writes == writes + 1
    resume(t, "499", [("500", notification(500))], session=SECRET, answered_session=SECRET)
    assert shared.reads == 0, "a cursor this process knows is never looked up"


def test_a_clean_exit_takes_its_requests_out_of_the_in_flight_ledger(fresh):
    """Only a killed process leaves entries for others to count: a clean one
    counts its own (the exit accounting) and removes them."""
    shared = store(fresh.url)
    broken_call(tracker(shared))
    assert shared.flush(held=True)
    client = fresh.client()
    [ledger] = client.keys(f"{KEY_PREFIX}:f:*")
    assert client.hlen(ledger) == 1 and client.exists(f"{KEY_PREFIX}:w:{shared.writer}")
    shared.close()
    assert client.hlen(ledger) == 0


def test_the_instrumentor_takes_the_state_settings(fresh, telemetry):
    with telemetry.instrumented(state=fresh.url, state_key="k") as instrumentor:
        assert isinstance(instrumentor.processor.tracker.store, RedisStore)
    with telemetry.instrumented() as instrumentor:
        assert instrumentor.processor.tracker.store is MEMORY


def test_a_request_answered_in_time_costs_redis_nothing(fresh):
    """The common POST: answered on its own stream, which the client then
    closes.  Its in-flight entry never leaves memory and no record is
    written (nothing would resume that stream)."""
    shared = store(fresh.url)
    t = tracker(shared)
    warm = t.open_stream(SERVER, "streamable-http", session_id=SECRET)
    t.stream_ended(warm, "closed", closed_by_client=True)
    assert shared.flush()  # the server's first stream: its sweep
    before = fresh.total_calls()
    for n in range(1, 51):
        stream = t.open_stream(
            SERVER, "streamable-http", session_id=SECRET, carries=[str(n)],
            sent=[(str(n), "tools/call")], body=tools_call(n).encode(),
        )
        t.event_consumed(stream)
        t.event_received(stream, f"{n}", result(n, n))
        t.event_consumed(stream)
        t.stream_ended(stream, "closed after its answer", closed_by_client=True)
    assert shared.flush(held=True)
    assert fresh.total_calls() == before


# ---------------------------------------------------------------- faults


def timed_lookup(shared: RedisStore) -> float:
    started = time.monotonic()
    assert shared.lookup(SERVER, "never-written") is None
    return time.monotonic() - started


def episodes_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "shared state in Redis" in r.getMessage()]


@pytest.mark.parametrize("fault", ["stopped", "killed"])
def test_redis_down_falls_back_to_memory_counted_and_logged_once(fresh, fault, caplog):
    fallbacks = Fallbacks()
    shared = store(fresh.url, fallbacks, cooldown=0.2)
    t = tracker(shared)
    broken_call(t, ids=["1", "2"])
    assert shared.flush()
    fresh.stop() if fault == "stopped" else fresh.kill()
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            assert timed_lookup(shared) < 0.5
        # This process still judges its own cursors, from memory.
        run = resume(t, "2", [("3", result(7, 3))], session=SECRET, answered_session=SECRET)
        assert run.outcome == "resumed"
        broken_call(t, ids=["10", "11"])  # a write that cannot reach Redis
        shared.flush()
    assert ("read", "connection") in fallbacks.seen
    assert ("read", "breaker_open") in fallbacks.seen
    assert set(reason for _, reason in fallbacks.seen) <= {"connection", "breaker_open"}
    assert len(episodes_logged(caplog)) == 1, episodes_logged(caplog)
    assert shared.episodes == 1


def test_redis_restarted_is_used_again_and_the_episode_ends(fresh, caplog):
    fallbacks = Fallbacks()
    shared = store(fresh.url, fallbacks, cooldown=0.05)
    with caplog.at_level(logging.WARNING):
        fresh.stop()
        timed_lookup(shared)
        fresh.start()
        # Past the cooldown the breaker lets one operation try again.
        deadline = time.monotonic() + 5
        while shared.episodes and shared._breaker.in_episode and time.monotonic() < deadline:
            shared.lookup(SERVER, "x")
        broken_call(tracker(shared), ids=["1", "2"])
        assert shared.flush()
    assert not shared._breaker.in_episode
    assert shared.lookup(SERVER, "2") is not None, "written after the restart"
    logged = episodes_logged(caplog)
    assert len(logged) == 2 and "answers again" in logged[1], logged


def test_a_paused_redis_costs_one_bounded_timeout_then_the_breaker(fresh, caplog):
    """SIGSTOP: the server holds its connections and answers nothing (a slow
    Redis).  The first operation waits its 50 ms timeout, the next ones are
    skipped by the breaker: the host's thread is never held longer."""
    fallbacks = Fallbacks()
    shared = store(fresh.url, fallbacks, cooldown=5.0)
    shared.lookup(SERVER, "warm")  # a connection in the pool
    fresh.pause()
    try:
        with caplog.at_level(logging.WARNING):
            first = timed_lookup(shared)
            rest = [timed_lookup(shared) for _ in range(20)]
    finally:
        fresh.resume()
    assert first < 0.3, first  # 50 ms socket timeout, some scheduling slack
    assert max(rest) < 0.01, max(rest)
    assert fallbacks.seen[0] == ("read", "timeout")
    assert fallbacks.seen[1:] == [("read", "breaker_open")] * 20
    assert len(episodes_logged(caplog)) == 1


def test_a_full_redis_with_noeviction_refuses_writes_counted_as_full(fresh, caplog):
    client = fresh.client()
    client.config_set("maxmemory", 1)  # every write refused: OOM
    fallbacks = Fallbacks()
    shared = store(fresh.url, fallbacks)
    t = tracker(shared)
    with caplog.at_level(logging.WARNING):
        broken_call(t, ids=["1", "2"])
        shared.flush()
        run = resume(t, "2", [("3", result(7, 3))], session=SECRET, answered_session=SECRET)
    assert run.outcome == "resumed", "judged from memory"
    assert ("write", "full") in fallbacks.seen, fallbacks.seen
    assert len(episodes_logged(caplog)) == 1


def test_an_evicting_redis_loses_records_and_the_resume_is_unverifiable_not_wrong(fresh):
    """allkeys-lru: Redis makes room by dropping keys, ours among them.  A
    resume whose record was evicted is judged as if nothing were shared
    (``unverifiable``), never from a half record, and the misses are not
    faults; the writes themselves still succeed."""
    client = fresh.client()
    a = store(fresh.url)
    broken_call(tracker(a), ids=["1", "2"])
    assert a.flush()
    ours = client.keys(f"{KEY_PREFIX}:c:*")  # the session's key and the any-session key
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 256 * 1024)
    junk = 0
    while client.exists(*ours) and junk < 2000:
        client.set(f"junk:{junk}", b"x" * 8192)
        junk += 1
    assert not client.exists(*ours), "evicted"
    fallbacks = Fallbacks()
    b = store(fresh.url, fallbacks)
    run = resume(tracker(b), "2", [("3", result(7, 3))],
                 session=SECRET, answered_session=SECRET)
    assert run.outcome == "unverifiable"
    assert b.flush()
    assert fallbacks.seen == [], "a miss is not a fault, and an evicting Redis takes writes"


# ---------------------------------------------------------------- the host


def test_the_fallbacks_are_a_metric_of_bounded_attributes(fresh):
    """Through the owner: a store that cannot answer counts each fallback in
    ``mcp.client.resumption.state.fallbacks``, by operation and reason."""
    from helpers import Telemetry
    from opentelemetry.instrumentation.mcp_resumption.owner.monitor import ResumptionMonitor

    telemetry = Telemetry()
    fresh.stop()
    monitor = ResumptionMonitor(meter_provider=telemetry.meter_provider,
                                state=fresh.url, state_key="k")
    try:
        for _ in range(3):
            monitor.tracker.open_stream(SERVER, "streamable-http", session_id="s",
                                        last_event_id="never-seen")
    finally:
        monitor.close()
    points = telemetry.points("mcp.client.resumption.state.fallbacks")
    operation, reason = "mcp.resumption.state.operation", "mcp.resumption.state.reason"
    counted = {(p.attributes[operation], p.attributes[reason]): p.value for p in points}
    reads = {key: value for key, value in counted.items() if key[0] == "read"}
    assert reads == {("read", "connection"): 1, ("read", "breaker_open"): 2}, counted
    # The sweep of the server's in-flight ledger, queued at its first stream.
    assert set(counted) - set(reads) <= {("write", "breaker_open"), ("write", "connection")}
    assert all(set(p.attributes) == {operation, reason} for p in points)


@pytest.mark.parametrize("fault", ["stopped", "paused"])
def test_an_sdk_client_keeps_working_with_redis_down(fresh, telemetry, monkeypatch, fault):
    """A real SDK client and server (the installed major's) whose tool
    closes its stream and answers on the resume: with Redis stopped or
    paused the call is answered, the resume judged ``resumed`` from memory,
    and the writes that could not reach Redis counted."""
    import asyncio

    from mcp_resumption_demo.loopback import LoopbackServer
    from wire import LEGACY, MCP1, MCP_MAJOR, AppClient, IntegerEventStore, sdk_app

    monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_STATE", fresh.url)
    monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_STATE_KEY", "k")
    if fault == "stopped":
        fresh.stop()
    else:
        fresh.pause()

    async def scenario():
        server = await LoopbackServer(sdk_app(IntegerEventStore(), polling=True)).astart()
        try:
            with telemetry.instrumented():
                async with AppClient(MCP1 if MCP_MAJOR == 1 else LEGACY,
                                     server.url + "/mcp") as client:
                    started = asyncio.get_running_loop().time()
                    answer = await client.call("x")
                    return answer, asyncio.get_running_loop().time() - started
        finally:
            await asyncio.to_thread(server.close)

    try:
        answer, took = asyncio.run(scenario())
    finally:
        if fault == "paused":
            fresh.resume()
    assert answer == "done x"
    assert took < 5, took
    assert set(telemetry.outcomes()) <= {"resumed", "caught_up"} and telemetry.outcomes()
    counted = telemetry.counts("mcp.client.resumption.state.fallbacks",
                               "mcp.resumption.state.operation")
    assert counted.get("write", 0) >= 1, counted
