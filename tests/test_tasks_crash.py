"""Tasks survive a crash (issue 45): a client killed with SIGKILL while it
follows a task (no exit runs, so nothing is handed over at the exit) still
leaves the task to the fleet with shared state.  Its record was held in Redis
under the process's lease when the handle came; once the lease lapses, the
next process that polls the task id adopts it and counts its fate there,
once; if nobody polls it, one process of the fleet counts it ``abandoned``,
once, with its WARNING line.

Real processes (tests/programs/task_fleet_client.py: FastMCP's ``Client``
with fastmcp-tasks, under the plugin), a real fastmcp-tasks server (memory
backend) behind the loopback router, whose record is the wire truth, and a
real redis-server, whose keys say when the lease lapsed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from datetime import timedelta

import pytest

from opentelemetry.instrumentation.mcp_resumption.shared.shared_state import keyed_hash
from redis_stack import FLEET_KEY, process_env
from test_tasks_handover import (
    ABANDONED_LINE,
    CONFIRM,
    PROCESS_TIMEOUT_S,
    PROGRAM,
    SEE_S,
    fleet_of,  # noqa: F401 (a fixture)
    run_client,
    task_keys,
)

pytest.importorskip("redis")

# fastmcp-tasks needs mcp >= 2.3: the tasks environment of scripts/test.
pytestmark = [pytest.mark.mcp2, pytest.mark.fastmcp_tasks]

# Bounds a failing wait, never what a passing one waits for.
WAIT_S = 30.0


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def held_entries(redis_server) -> list[str]:
    """The index entries of tasks held under a process's lease."""
    index = redis_server.client().hgetall("mcpres:v1:th")
    return [value.decode() for value in index.values() if value.startswith(b"w:")]


def leases(redis_server) -> list:
    return list(redis_server.client().scan_iter("mcpres:v1:w:*"))


async def killed_while_following(fleet, redis_server) -> str:
    """A client takes a task's handle and polls it (working); once Redis holds
    its record (or, where nothing is held, it polled three times), the
    client is killed (SIGKILL), and the test waits until Redis itself lets
    its lease lapse.  The task id."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(PROGRAM), "hold", fleet.url, "gated",
        env=process_env(redis_server.url, CONFIRM),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        line = await asyncio.wait_for(process.stdout.readline(), PROCESS_TIMEOUT_S)
        assert line, (await process.stderr.read()).decode()[-3000:]
        task_id = json.loads(line)["task_id"]
        await until(lambda: fleet.gets(task_id), "the client never polled its task")
        await until(
            lambda: held_entries(redis_server) or len(fleet.gets(task_id)) >= 3,
            "the client stopped polling its task",
        )
    finally:
        process.send_signal(signal.SIGKILL)
        await process.wait()
    assert process.returncode == -signal.SIGKILL
    await until(lambda: not leases(redis_server), "the killed process's lease never lapsed")
    return task_id


def test_a_killed_clients_task_nobody_polls_is_abandoned_once_for_the_fleet(
    fleet_of, redis_server  # noqa: F811
):
    redis_server.client().flushall()
    fleet = fleet_of(execution_ttl=timedelta(seconds=1))

    async def scenario():
        await fleet.router.start()
        try:
            task_id = await killed_while_following(fleet, redis_server)
            polled = len(fleet.gets(task_id))
            seers = await asyncio.gather(*(
                run_client(redis_server.url, "see", fleet.url, str(SEE_S)) for _ in range(2)
            ))  # fmt: skip
            status = await asyncio.to_thread(fleet.server.status, task_id)
            return task_id, polled, seers, status
        finally:
            await fleet.router.close()

    task_id, polled, seers, status = asyncio.run(scenario())
    router = fleet.router
    # The wire: the handle and the killed client's polls, all working; nobody
    # polled after it, nor cancelled; the server still runs the task.
    (call,) = router.of("tools/call")
    assert router.answer(call)["result"]["status"] == "working"
    gets = fleet.gets(task_id)
    assert len(gets) == polled >= 1
    assert {router.answer(g)["result"]["status"] for g in gets} == {"working"}
    assert router.of("tasks/cancel") == []
    assert status == "working" and not fleet.server.ended.is_set()
    # Counted once for the fleet, by one of the two processes, with its line.
    assert sorted(s["fates"].get("abandoned", 0) for s in seers) == [0, 1], seers
    assert all(set(s["fates"]) <= {"abandoned"} for s in seers), seers
    lines = [line for s in seers for line in s["stderr"].splitlines() if ABANDONED_LINE in line]
    assert len(lines) == 1 and "tool=gated" in lines[0], lines
    assert f"task={keyed_hash(FLEET_KEY.encode(), task_id)}" in lines[0], lines
    assert task_keys(redis_server) == ([], 0), "taken once, nothing left"


def test_a_killed_clients_task_is_adopted_by_the_process_that_polls_it_next(
    fleet_of, redis_server  # noqa: F811
):
    redis_server.client().flushall()
    fleet = fleet_of()

    async def scenario():
        await fleet.router.start()
        try:
            task_id = await killed_while_following(fleet, redis_server)
            polled = len(fleet.gets(task_id))
            follower = asyncio.ensure_future(
                run_client(redis_server.url, "follow", fleet.url, task_id)
            )
            # The work ends once the follower polled it (working).
            while len(fleet.gets(task_id)) == polled and not follower.done():
                await asyncio.sleep(0.02)
            fleet.server.release.set()
            return task_id, polled, await follower
        finally:
            await fleet.router.close()

    task_id, polled, follower = asyncio.run(scenario())
    router = fleet.router
    # The wire: the killed client's polls (working), then the follower's of
    # the same id, the first working, the last completed.
    gets = fleet.gets(task_id)
    statuses = [router.answer(g)["result"]["status"] for g in gets]
    assert set(statuses[:polled]) == {"working"}, statuses
    assert statuses[polled] == "working" and statuses[-1] == "completed", statuses
    assert follower["status"] == "completed"
    # Adopted: the fate counted there, once; never also abandoned.
    assert follower["fates"] == {"completed": 1}, follower
    assert "tasks=completed:1" in follower["stderr"], follower["stderr"]
    assert ABANDONED_LINE not in follower["stderr"], follower["stderr"]
    # Released at its fate: nothing left for any sweep to count.
    assert task_keys(redis_server) == ([], 0)
