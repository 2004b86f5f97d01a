"""The Events extension's threads of cursors across processes, with shared
state (``OTEL_PYTHON_MCP_RESUMPTION_STATE``) on a real redis-server: a
restarted client (a new instrumentation, as a new process has) that starts
again from ``cursor: null`` is judged against its predecessor's last cursor
(``cursor_lost``), and one that resumes its persisted cursor is not an
unknown cursor.  Nothing is written per event: a thread's last cursor (its
digest, under keyed hashes) at most every few seconds and at the exit.
Redis down: the same verdicts as without shared state, never an exception.

The wire's truth comes from the events server's log.
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from events_server import REPLAYABLE, EventsServer
from events_wire import EventsWire
from helpers import Telemetry
from redis_stack import FLEET_KEY
from wire import wait_until

pytest.importorskip("redis")

GAPS = "mcp.client.resumption.event_gaps"
KIND = "mcp.events.gap.kind"


def in_asyncio(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def event_keys(redis_server) -> list[bytes]:
    return list(redis_server.client().scan_iter("mcpres:v1:event:*"))


async def first_life(server: EventsServer, state: str) -> str:
    """A process that polls twice and exits: its last cursor, as the
    application would persist it."""
    telemetry = Telemetry()
    with telemetry.instrumented(state=state, state_key=FLEET_KEY if state else None):
        async with EventsWire(server.url) as wire:
            start = await wire.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, 3)
            page = await wire.poll(REPLAYABLE, start["cursor"])
    assert telemetry.counts(GAPS, KIND) == {}
    return page["cursor"]


@in_asyncio
async def test_a_restart_that_starts_from_now_lost_its_predecessors_cursor(redis_server):
    redis_server.client().flushall()
    with EventsServer() as server:
        await first_life(server, redis_server.url)
        keys = event_keys(redis_server)
        assert len(keys) == 1  # one thread, its key hashed
        assert REPLAYABLE.encode() not in keys[0]
        telemetry = Telemetry()
        with telemetry.instrumented(state=redis_server.url, state_key=FLEET_KEY):
            async with EventsWire(server.url) as wire:
                server.publish(REPLAYABLE, 2)
                restarted = await wire.poll(REPLAYABLE, None)
            assert restarted["truncated"] is False  # the wire says nothing was skipped
            found = await wait_until(lambda: telemetry.counts(GAPS, KIND), 5)
    assert found == {"cursor_lost": 1}


@in_asyncio
async def test_a_restart_that_resumes_its_persisted_cursor_is_judged_continuous(redis_server):
    redis_server.client().flushall()
    with EventsServer() as server:
        persisted = await first_life(server, redis_server.url)
        telemetry = Telemetry()
        with telemetry.instrumented(state=redis_server.url, state_key=FLEET_KEY):
            async with EventsWire(server.url) as wire:
                server.publish(REPLAYABLE, 2)
                page = await wire.poll(REPLAYABLE, persisted)
        assert len(page["events"]) == 2 and page["truncated"] is False
    assert telemetry.counts(GAPS, KIND) == {}


@in_asyncio
async def test_without_shared_state_a_persisted_cursor_proves_nothing(redis_server):
    """What the shared state adds: the same restart in memory."""
    with EventsServer() as server:
        persisted = await first_life(server, None)
        telemetry = Telemetry()
        with telemetry.instrumented():
            async with EventsWire(server.url) as wire:
                await wire.poll(REPLAYABLE, persisted)
        found = await wait_until(lambda: telemetry.counts(GAPS, KIND), 5)
    assert found == {"cursor_unknown": 1}  # nothing held here before: unverifiable


@in_asyncio
async def test_nothing_is_written_per_event(redis_server):
    redis_server.client().flushall()
    with EventsServer(heartbeat_s=0.05, retention=100) as server:
        telemetry = Telemetry()
        with telemetry.instrumented(state=redis_server.url, state_key=FLEET_KEY):
            async with EventsWire(server.url) as wire, wire.stream(REPLAYABLE, None) as stream:
                before = redis_server.client().info("commandstats").get("cmdstat_set", {})
                server.publish(REPLAYABLE, 60)
                for _ in range(60):
                    await stream.next_event()
                for _ in range(10):
                    await stream.next("notifications/events/heartbeat")
                after = redis_server.client().info("commandstats").get("cmdstat_set", {})
        sets = after.get("calls", 0) - before.get("calls", 0)
    # 60 events and 10 heartbeats moved the cursor 70 times: at most one
    # write per SAVE_EVERY (5 s) while it streamed.
    assert sets <= 2
    assert len(event_keys(redis_server)) == 1


@in_asyncio
async def test_redis_down_gives_the_memory_verdicts_and_no_exception(redis_server):
    with EventsServer() as server:
        telemetry = Telemetry()
        nowhere = "redis://127.0.0.1:9/0"  # nothing listens there
        with telemetry.instrumented(state=nowhere, state_key=FLEET_KEY):
            async with EventsWire(server.url) as wire:
                start = await wire.poll(REPLAYABLE, None)
                await wire.poll(REPLAYABLE, start["cursor"])
                await wire.poll(REPLAYABLE, None)
        found = await wait_until(lambda: telemetry.counts(GAPS, KIND), 5)
    assert found == {"cursor_lost": 1}
