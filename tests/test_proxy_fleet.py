"""A fleet of two ``mcp-resumption-proxy`` instances behind a real HAProxy in
round robin, sharing one real redis-server (issue 32): a real SDK client's
tools/call stream is cut, and its resume lands on the *other* instance (the
first is drained at the resume: tests/fleet_stack.py).  The resume must be
judged as if it had landed on the first one, on both legs:

* the downstream leg (the client's resume to the proxy, the server half's
  view): ``replayed``, never a cursor counted apart as uncarried;
* the upstream leg (the proxy's own client half): ``resumed`` for a faithful
  server, ``id_regression`` when the server's counter started over at the
  resume; never ``unverifiable`` for want of state.

Each case runs twice: with Redis it passes; with the state in memory (no
setting) it is a strict xfail, which is what the shared state is for.
The verdicts are checked against the wire truth of the routers: which
instance carried the call, which the resume, and what the server replayed.
"""

from __future__ import annotations

import asyncio

import pytest

from fleet_stack import FleetStack, fleet, instance
from mcp_resumption_proxy.shared import BUFFER_TTL
from proxy_harness import LEG
from redis_stack import RedisServer
from test_proxy_resumable import PROXY_ID, assert_once_in_order
from wire import RESUMABLE_CLIENTS, AppClient, IntegerEventStore, sdk_app

ATTEMPTS = "mcp.client.resumption.attempts"
GAPS = "mcp.client.resumption.gaps"
BROKEN = "mcp.client.resumption.broken_requests"
SERVER_REQUESTS = "mcp.server.resumption.requests"
OUTCOME = "mcp.resumption.outcome"
GAP_KIND = "mcp.resumption.gap.kind"
FATE = "mcp.resumption.request.fate"


MEMORY_FAILS = pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="state in memory: the other instance never saw the cursor "
    "(an uncarried cursor downstream, counted apart, and not judged upstream)",
)
STATES = [pytest.param("redis"), pytest.param("memory", marks=MEMORY_FAILS)]


def run(kind: str, redis: RedisServer | None, store: IntegerEventStore, **cuts) -> FleetStack:
    async def scenario() -> FleetStack:
        async with (
            fleet(sdk_app(store), redis, **cuts) as running,
            AppClient(kind, running.url) as client,
        ):
            assert await client.call("x") == "done x"
        return running

    return asyncio.run(scenario())


def wire_truth(running: FleetStack) -> tuple[str, str, list[str], list[str]]:
    """Which instance carried the call and which the client's resume (by the
    upstream routers), the cursor the client resumed with, and the ids of
    the events the server sent on the upstream resume."""
    first = running.carried_call()
    assert running.drained == [first], running.drained
    [client_resume] = [
        e for e in running.client_router.exchanges if e.request.header("last-event-id")
    ]
    cursor = client_resume.request.header("last-event-id")
    [upstream_resume] = [
        e for e in running.upstream_router.exchanges if e.request.header("last-event-id") == cursor
    ]
    resumed_on = [instance(upstream_resume)]
    assert resumed_on == [running.other(first)], (resumed_on, first)
    replayed = [event.id for event in upstream_resume.events if event.id and event.data]
    return first, resumed_on[0], [cursor], replayed


def verdicts(running: FleetStack, name: str) -> dict[str, dict]:
    proxy = running.proxies[name]
    return {
        "downstream": proxy.counts(SERVER_REQUESTS, LEG, OUTCOME),
        "attempts": proxy.counts(ATTEMPTS, LEG, OUTCOME),
        "gaps": proxy.counts(GAPS, LEG, GAP_KIND),
        "broken": proxy.counts(BROKEN, LEG, FATE),
    }


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_resume_on_the_other_instance_is_judged_as_on_the_first(
    redis_server, kind, state
) -> None:
    """The client's leg to the balancer is cut after the call's progress; the
    proxy that carried it let its upstream stream go; the client resumes on
    the other instance, which resumes the server with the same cursor."""
    redis_server.client().flushall()
    redis = redis_server if state == "redis" else None
    running = run(kind, redis, IntegerEventStore(), cut_client=True)
    assert any(e.severed for e in running.client_router.exchanges)
    first, other, [cursor], replayed = wire_truth(running)
    # The wire: the server replayed strictly after the cursor (faithful).
    assert replayed and all(int(event_id) > int(cursor) for event_id in replayed), replayed
    found = verdicts(running, other)
    assert found["downstream"] == {("client_proxy", "replayed"): 1}, found
    assert found["attempts"] == {("proxy_server", "resumed"): 1}, found
    assert found["gaps"] == {}, found
    assert verdicts(running, first)["downstream"] == {}, verdicts(running, first)


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_server_that_started_over_is_caught_on_the_other_instance(
    redis_server, kind, state
) -> None:
    """The first instance's leg to the server is cut after the progress; the
    client resumes on the other instance, whose resume of the server gets
    ids that start over (the server lost its counter): ``id_regression``."""
    redis_server.client().flushall()
    redis = redis_server if state == "redis" else None
    running = run(kind, redis, IntegerEventStore(reset_on_replay=True), cut_upstream=True)
    assert any(e.severed for e in running.upstream_router.exchanges)
    _first, other, [cursor], replayed = wire_truth(running)
    # The wire: the replay's ids are below the cursor: the counter started over.
    assert replayed and int(replayed[0]) < int(cursor), (replayed, cursor)
    found = verdicts(running, other)
    assert found["downstream"] == {("client_proxy", "replayed"): 1}, found
    assert found["gaps"] == {("proxy_server", "id_regression"): 1}, found


# ================================================================ --resumable


def run_resumable(
    kind: str, redis: RedisServer | None, store, cut: str = "client"
) -> tuple[FleetStack, object]:
    """The call through a ``--resumable`` fleet; its answer, or what the
    client raised (the memory run's resume finds no relay on the other
    instance: the server gets a cursor of the proxy's and the call is lost)."""

    async def scenario() -> tuple[FleetStack, object]:
        async with (
            fleet(
                sdk_app(store), redis, proxy_args=("--resumable",), **{f"cut_{cut}": True}
            ) as running,
            AppClient(kind, running.url) as client,
        ):
            try:
                answer = await client.call("x", timeout=6)
            except Exception as error:  # what the SDK raises is its business
                answer = error
        return running, answer

    return asyncio.run(scenario())


RESUMABLE_STATES = [
    pytest.param("redis"),
    pytest.param(
        "memory",
        marks=pytest.mark.xfail(
            strict=True,
            raises=AssertionError,
            reason="state in memory: the other instance has no relay of that id; the call is lost",
        ),
    ),
]


@pytest.mark.parametrize("state", RESUMABLE_STATES)
@pytest.mark.parametrize("upstream", ["event-store", "no-store"])
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_resumable_fleet_serves_the_missed_events_from_any_instance(
    redis_server, kind, upstream, state
) -> None:
    """The client's leg is cut after the progress; the instance that carried
    the call reads on into its relay (and Redis); the client's resume, with
    the proxy's id, lands on the other instance, which serves every missed
    event once, in order, from the shared buffer: the server never sees a
    resume."""
    redis_server.client().flushall()
    redis = redis_server if state == "redis" else None
    store = IntegerEventStore() if upstream == "event-store" else None
    running, answer = run_resumable(kind, redis, store)
    first = running.carried_call()
    assert running.drained == [first], running.drained
    assert answer == "done x", answer
    assert any(e.severed for e in running.client_router.exchanges)
    [resume] = [e for e in running.client_router.exchanges if e.request.header("last-event-id")]
    assert PROXY_ID.match(resume.request.header("last-event-id"))
    assert not any(e.request.header("last-event-id") for e in running.upstream_router.exchanges), (
        "the fleet served the resume"
    )
    assert_once_in_order(running)
    other = verdicts(running, running.other(first))
    assert other["downstream"] == {("client_proxy", "replayed"): 1}, other
    if redis is not None:
        # Payloads in Redis only under hashed keys, with the buffer's TTL.
        client = redis_server.client()
        keys = [key.decode() for key in client.keys("mcpres:v1:r*")]
        assert keys and all(0 < client.ttl(key) <= BUFFER_TTL for key in keys), keys
        session = resume.request.header("mcp-session-id")
        assert not any(session and session in key for key in keys)


@pytest.mark.parametrize("state", RESUMABLE_STATES)
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_resumable_fleet_takes_over_a_relay_whose_upstream_broke(
    redis_server, kind, state
) -> None:
    """The first instance's leg to the server is cut after the progress: its
    relay ends broken, with the server's last id in Redis; the client's
    resume lands on the other instance, which takes the relay over, resumes
    the server with the server's own id, and serves every event once."""
    redis_server.client().flushall()
    redis = redis_server if state == "redis" else None
    running, answer = run_resumable(kind, redis, IntegerEventStore(), cut="upstream")
    first = running.carried_call()
    assert running.drained == [first], running.drained
    assert answer == "done x", answer
    [client_resume] = [
        e for e in running.client_router.exchanges if e.request.header("last-event-id")
    ]
    assert PROXY_ID.match(client_resume.request.header("last-event-id"))
    [upstream_resume] = [
        e for e in running.upstream_router.exchanges if e.request.header("last-event-id")
    ]
    assert upstream_resume.request.header("last-event-id").isdigit()  # the server's own id
    assert instance(upstream_resume) == running.other(first)
    assert_once_in_order(running)


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_request_cut_on_one_instance_is_counted_once_by_the_fleet(
    redis_server, kind, state
) -> None:
    """The first instance's leg to the server is cut after the progress; the
    other instance's resume brings the answer (the wire: the replay carries
    the result).  The fleet counts that request once: answered by the other
    instance, which took it over from the first's record, and never lost by
    the first when its window passes or it exits (it cannot claim it)."""
    redis_server.client().flushall()
    redis = redis_server if state == "redis" else None
    running = run(kind, redis, IntegerEventStore(), cut_upstream=True)
    _first, other, [cursor], replayed = wire_truth(running)
    assert replayed and all(int(event_id) > int(cursor) for event_id in replayed), replayed
    fates: dict[str, int] = {}
    for name in running.proxies:
        for (_leg, fate), count in verdicts(running, name)["broken"].items():
            fates[fate] = fates.get(fate, 0) + count
    assert verdicts(running, other)["broken"] == {("proxy_server", "answered"): 1}
    assert fates == {"answered": 1}, fates


FALLBACKS = "mcp.client.resumption.state.fallbacks"


@pytest.mark.parametrize("fault", ["killed", "paused"])
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_the_fleet_keeps_forwarding_on_memory_when_redis_fails(tmp_path, kind, fault) -> None:
    """Redis is killed, or stops answering (SIGSTOP), once both instances
    run: the call is still forwarded, cut and resumed on the other instance,
    and answered; the other instance judges the resume as memory alone can
    (``unverifiable``, never a gap it cannot prove), and the instances count
    the fallback instead of failing.  Each operation is bounded, so a
    paused Redis costs timeouts, not a hung call."""
    redis = RedisServer(tmp_path)
    try:

        async def scenario() -> FleetStack:
            async with fleet(sdk_app(IntegerEventStore()), redis, cut_client=True) as running:
                if fault == "killed":
                    redis.kill()
                else:
                    redis.pause()
                async with AppClient(kind, running.url) as client:
                    assert await client.call("x") == "done x"
            return running

        running = asyncio.run(scenario())
        first, other, [cursor], replayed = wire_truth(running)
        assert replayed and all(int(event_id) > int(cursor) for event_id in replayed), replayed
        found = verdicts(running, other)
        assert found["attempts"] == {("proxy_server", "unverifiable"): 1}, found
        assert found["gaps"] == {}, found
        fallbacks = {name: running.proxies[name].counts(FALLBACKS) for name in (first, other)}
        assert all(sum(counted.values()) >= 1 for counted in fallbacks.values()), fallbacks
    finally:
        redis.close()
