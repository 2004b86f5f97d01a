"""Tasks across a fleet with shared state (issue 37): a process that exits
while a task is open hands it to the fleet instead of counting it
``abandoned``.  A later process that polls the same task id (a restarted
client that kept it, as the specification asks) follows it to its end and
counts the fate there, once for the fleet; a task nobody follows is
``abandoned`` once, by one of the processes racing to sweep it.  Without
shared state the exit counts it abandoned, as before.

Real processes (tests/programs/task_fleet_client.py: FastMCP's ``Client``
with fastmcp-tasks, under the plugin), a real fastmcp-tasks server (memory
backend) behind the loopback router, whose record is the wire truth, and a
real redis-server.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from opentelemetry.instrumentation.mcp_resumption.shared.shared_state import keyed_hash
from redis_stack import FLEET_KEY, process_env

pytest.importorskip("redis")

# fastmcp-tasks needs mcp >= 2.3: the tasks environment of scripts/test.
pytestmark = [pytest.mark.mcp2, pytest.mark.fastmcp_tasks]

PROGRAM = Path(__file__).resolve().parent / "programs" / "task_fleet_client.py"
CONFIRM = 1.0  # the reissue window, s: the least a handed task waits for a follower
SEE_S = CONFIRM + 10  # how long each sweeping process waits for a count
TASKS = "mcp.client.resumption.tasks"
FATE = "mcp.resumption.task.fate"
FALLBACKS = "mcp.client.resumption.state.fallbacks"
ABANDONED_LINE = "mcp-resumption task abandoned"
# Bounds a failing run, never what a passing one waits for.
PROCESS_TIMEOUT_S = 180.0


async def run_client(state: str | None, *args: str) -> dict:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(PROGRAM), *args, env=process_env(state, CONFIRM),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), PROCESS_TIMEOUT_S)
    assert process.returncode == 0, err.decode()[-3000:]
    return {**json.loads(out.decode().strip().splitlines()[-1]), "stderr": err.decode()}


def task_keys(redis_server) -> tuple[list, int]:
    client = redis_server.client()
    return list(client.scan_iter("mcpres:v1:t:*")), client.hlen("mcpres:v1:th")


class Fleet:
    """The task server (in this process: its gate is the test's), the router
    in front of it, and the processes' findings."""

    def __init__(self, **server) -> None:
        from tasks_stack import TaskRouter, TaskServer, switchable

        self.server = TaskServer(**server)
        self.router = TaskRouter(switchable(lambda: self.server, lambda request: False))

    @property
    def url(self) -> str:
        return self.router.url + "/mcp"

    def gets(self, task_id: str) -> list:
        return [
            e for e in self.router.of("tasks/get")
            if (e.request.jsonrpc.get("params") or {}).get("taskId") == task_id
        ]  # fmt: skip

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def fleet_of():
    made: list[Fleet] = []

    def make(**server) -> Fleet:
        made.append(Fleet(**server))
        return made[-1]

    yield make
    for fleet in made:
        fleet.close()


def state_of(mode: str, redis_server) -> str | None:
    redis_server.client().flushall()
    return redis_server.url if mode == "redis" else None


def polled_working(fleet, task_id: str) -> bool:
    """The router holds the whole answer of the first poll of ``task_id``."""
    gets = fleet.gets(task_id)
    return bool(gets) and fleet.router.answered(gets[0]) is not None


@pytest.mark.parametrize("mode", [
    "redis",
    pytest.param("memory", marks=pytest.mark.xfail(
        strict=True, raises=AssertionError,
        reason="state in memory: the first process abandons the task at its exit, and the "
        "next one cannot know the task it polls",
    )),
])  # fmt: skip
def test_a_task_handed_out_in_one_process_is_followed_to_its_end_in_the_next(
    fleet_of, redis_server, mode
):
    state = state_of(mode, redis_server)
    fleet = fleet_of()

    async def scenario():
        await fleet.router.start()
        try:
            first = await run_client(state, "handle", fleet.url, "gated")
            task_id = first["task_id"]
            # Two restarted clients kept the id (two replicas of the client).
            followers = asyncio.gather(*(
                run_client(state, "follow", fleet.url, task_id) for _ in range(2)
            ))  # fmt: skip
            # The work ends once a poll was answered working (not merely
            # asked: released as it was asked, its answer may be completed).
            while not polled_working(fleet, task_id) and not followers.done():
                await asyncio.sleep(0.02)
            fleet.server.release.set()
            return first, await followers
        finally:
            await fleet.router.close()

    first, followers = asyncio.run(scenario())
    task_id = first["task_id"]
    router = fleet.router
    # The wire: the handle, then the other process's polls of the same id to completed.
    (call,) = router.of("tools/call")
    assert router.answer(call)["result"]["status"] == "working"
    gets = fleet.gets(task_id)
    assert [router.answer(g)["result"]["status"] for g in gets][-1] == "completed"
    assert router.answer(gets[0])["result"]["status"] == "working"
    assert [f["status"] for f in followers] == ["completed", "completed"]
    # The first process handed it over: nothing counted there, no line.
    assert first["fates"] == {}, first
    assert ABANDONED_LINE not in first["stderr"], first["stderr"]
    # One follower took it and counted its fate, once for the fleet; the other nothing.
    assert sorted(f["fates"].get("completed", 0) for f in followers) == [0, 1], followers
    assert all(set(f["fates"]) <= {"completed"} for f in followers), followers
    (counted,) = [f for f in followers if f["fates"]]
    assert "tasks=completed:1" in counted["stderr"], counted["stderr"]
    assert task_keys(redis_server) == ([], 0), "taken: nothing left for a sweep"


@pytest.mark.parametrize("mode", ["redis", "memory"])
def test_a_task_nobody_follows_is_abandoned_once_for_the_fleet(fleet_of, redis_server, mode):
    """The task's TTL is 1 s (fastmcp-tasks' execution TTL), so it is due a
    reissue window after the exit; two processes that see the server race
    to count it.  With Redis one of them counts it, not the exiting process;
    in memory the exiting process counts it, as before."""
    state = state_of(mode, redis_server)
    fleet = fleet_of(execution_ttl=timedelta(seconds=1))

    async def scenario():
        await fleet.router.start()
        try:
            first = await run_client(state, "handle", fleet.url, "gated")
            seers = await asyncio.gather(*(
                run_client(state, "see", fleet.url, str(SEE_S)) for _ in range(2)
            ))  # fmt: skip
            status = await asyncio.to_thread(fleet.server.status, first["task_id"])
            return first, seers, status
        finally:
            await fleet.router.close()

    first, seers, status = asyncio.run(scenario())
    task_id = first["task_id"]
    router = fleet.router
    # The wire: a handle, never polled by anyone; the server still runs it.
    (call,) = router.of("tools/call")
    assert router.answer(call)["result"]["status"] == "working"
    assert router.answer(call)["result"]["ttlMs"] == 1000
    assert fleet.gets(task_id) == [] and router.of("tasks/cancel") == []
    assert status == "working" and not fleet.server.ended.is_set()
    everyone = [first, *seers]
    assert sum(p["fates"].get("abandoned", 0) for p in everyone) == 1, everyone
    assert all(set(p["fates"]) <= {"abandoned"} for p in everyone), everyone
    lines = [line for p in everyone for line in p["stderr"].splitlines() if ABANDONED_LINE in line]
    assert len(lines) == 1 and "tool=gated" in lines[0], lines
    if mode == "redis":
        # Not the exiting process: one of the two that saw the server.
        assert first["fates"] == {}, first
        assert sorted(sum(s["fates"].values()) for s in seers) == [0, 1], seers
        # Named as every process of the fleet names it: the keyed hash.
        assert f"task={keyed_hash(FLEET_KEY.encode(), task_id)}" in lines[0], lines
        assert task_keys(redis_server) == ([], 0), "taken once, nothing left"
    else:
        assert first["fates"] == {"abandoned": 1}, first


def test_redis_down_at_the_exit_counts_the_task_abandoned_there(fleet_of, redis_server, telemetry):
    """The hand-over cannot reach Redis (stopped before the exit): within its
    bound, the exiting process counts the task abandoned itself, as without
    shared state, and the fallback is counted."""
    redis_server.client().flushall()
    fleet = fleet_of()

    async def scenario():
        from fastmcp import Client
        from fastmcp_tasks import call_tool_task

        await fleet.router.start()
        try:
            async with Client(fleet.url) as client:
                task = await call_tool_task(client, "gated", {"n": 1})
            return task.task_id
        finally:
            await fleet.router.close()

    try:
        with telemetry.instrumented(
            state=redis_server.url, state_key=FLEET_KEY, confirm_timeout=CONFIRM
        ):
            task_id = asyncio.run(scenario())
            redis_server.stop()
            started = time.monotonic()
        exit_took = time.monotonic() - started
    finally:
        redis_server.start()
    (call,) = fleet.router.of("tools/call")
    assert fleet.router.answer(call)["result"]["taskId"] == task_id
    assert telemetry.counts(TASKS, FATE).get("abandoned") == 1
    fallbacks = telemetry.counts(FALLBACKS, "mcp.resumption.state.operation")
    assert fallbacks.get("write", 0) >= 1, fallbacks
    assert exit_took < 2.0, exit_took
    assert task_keys(redis_server) == ([], 0)


def redis_commands(client) -> list[tuple[str, str]]:
    """Every command a client sent Redis since the slow log was reset (its
    threshold 0: all are logged; those a script ran, logged from ``?:0``,
    are left out), oldest first: (name, the key it names first)."""
    found = []
    for entry in reversed(client.slowlog_get(100_000)):
        if entry.get("client_address") == b"?:0":
            continue
        parts = [*entry["command"].decode(errors="replace").split(" "), "", "", ""]
        name = parts[0].upper()
        found.append((name, parts[3] if name in ("EVALSHA", "EVAL") else parts[1]))
    return found


def test_a_task_followed_where_it_was_handed_out_costs_redis_two_writes_and_none_per_poll(
    fleet_of, redis_server, telemetry
):
    """The common case: the process that got the handle follows the task to
    its end.  Redis sees one look at the fleet's index (the first answer)
    and two writes of the task: its record held under the process's lease
    when the handle came (one round trip), released at its fate (one
    script call); nothing per poll.  Besides, only the lease (renewed every third of it
    while the task is held: per time, not per poll or task)."""
    client = redis_server.client()
    client.flushall()
    client.config_set("slowlog-max-len", 100_000)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    fleet = fleet_of()

    def working_polls() -> int:
        # Answered, not only sent: a poll in flight at the release may find the task done.
        answers = [fleet.router.answered(get) for get in fleet.router.of("tasks/get")]
        return sum(1 for a in answers if a and a.get("result", {}).get("status") == "working")

    async def scenario():
        from fastmcp import Client

        await fleet.router.start()
        try:
            async with Client(fleet.url) as session:
                call = asyncio.ensure_future(session.call_tool("gated", {"n": 1}))
                # Several polls of the working task, then the work ends.
                while working_polls() < 3 and not call.done():
                    await asyncio.sleep(0.02)
                fleet.server.release.set()
                return await call
        finally:
            await fleet.router.close()

    try:
        with telemetry.instrumented(
            state=redis_server.url, state_key=FLEET_KEY, confirm_timeout=CONFIRM
        ):
            result = asyncio.run(scenario())
        commands = redis_commands(client)
    finally:
        client.config_set("slowlog-log-slower-than", 10_000)
        client.config_set("slowlog-max-len", 128)
    assert result.data == "gated 1"
    gets = fleet.router.of("tasks/get")
    assert [fleet.router.answer(g)["result"]["status"] for g in gets][-1] == "completed"
    assert len(gets) >= 4, len(gets)  # three working, the completed one
    assert telemetry.counts(TASKS, FATE).get("completed") == 1
    of_tasks = [(name, key) for name, key in commands if key.startswith("mcpres:v1:t")]
    index = "mcpres:v1:th"
    on_index = [name for name, key in of_tasks if key == index]
    on_record = [(name, key) for name, key in of_tasks if key != index]
    # The look at the index; the handle's write (the record, its index entry
    # and the index's life, one round trip); the release at the fate (one
    # script): two writes of the task, none per poll.
    assert on_index == ["HSCAN", "HSET", "EXPIRE"], of_tasks
    assert [name for name, _ in on_record] == ["SET", "EVALSHA"], of_tasks
    assert on_record[0][1] == on_record[1][1], of_tasks
    assert gets[0].request.jsonrpc["params"]["taskId"] not in on_record[0][1]  # its keyed hash
    ledger = ("mcpres:v1:w:", "mcpres:v1:f:")  # the lease; requests slow to answer
    plugin = [c for c in commands if c[1].startswith("mcpres:") and c not in of_tasks]
    assert all(key.startswith(ledger) for _, key in plugin), plugin
    assert task_keys(redis_server) == ([], 0)
