"""Two fastmcp-tasks replicas behind a round-robin router (one request at a
time, as a balancer without affinity that ignores ``Mcp-Name``), followed by
FastMCP's own ``Client`` (importing fastmcp_tasks makes it poll tasks), in
this process under the plugin. The router's record is the wire truth.

- Without a shared task store (each replica on ``memory://``): the task is
  created on one replica, a ``tasks/get`` lands on the other, which answers
  ``-32602`` "not found"; the client fails. The fate is ``lost``.
- With one (both replicas on the same real redis-server): every poll, on
  either replica, answers the task's status, up to ``completed``; the client
  gets the result. No loss.

FastMCP 4.1.4's client sends ``tasks/get`` without ``Mcp-Name``: the wire
shows it, and the plugin counts each such request as unroutable (the
counter's one series per server: no attribute beyond the server's own).
"""

from __future__ import annotations

import asyncio

import pytest

from helpers import Telemetry
from proxy_harness import RawRouter
from task_stack import RoundRobin, TaskServer, handles, is_not_found, polls, task_wire

# fastmcp-tasks needs mcp >= 2.3: the tasks environment of scripts/test only
pytestmark = [pytest.mark.mcp2, pytest.mark.fastmcp_tasks]

TASKS = "mcp.client.resumption.tasks"
TASK_FATE = "mcp.resumption.task.fate"
UNROUTABLE = "mcp.client.resumption.task.unroutable"


def _fleet_run(backend: str) -> tuple[dict, list, Telemetry]:
    """One task tool call through the router in front of two replicas on
    ``backend``: (what the client got, the wire, the plugin's telemetry)."""
    import fastmcp_tasks  # noqa: F401 (turns on the Client's task polling)
    from fastmcp import Client

    replicas = [TaskServer(backend, "a"), TaskServer(backend, "b")]
    telemetry = Telemetry()

    async def scenario() -> tuple[dict, list]:
        router = await RawRouter(RoundRobin(*(r.backend_of for r in replicas))).start()
        try:
            try:
                async with Client(router.url + "/mcp") as client:
                    result = await client.call_tool("work", {"seconds": 0.5})
                report = {"ok": True, "text": result.data}
            except Exception as error:  # the client's failure is the observation
                report = {"ok": False, "error": str(error)}
            return report, task_wire(router)
        finally:
            await router.close()

    try:
        with telemetry.instrumented(confirm_timeout=2):
            report, calls = asyncio.run(scenario())
    finally:
        for replica in replicas:
            replica.close()
    return report, calls, telemetry


@pytest.fixture(scope="module")
def without_shared_store():
    return _fleet_run("memory://")


@pytest.fixture(scope="module")
def with_shared_store(redis_server):
    redis_server.client().flushall()
    return _fleet_run(redis_server.url)


def test_without_a_shared_store_a_poll_on_the_other_replica_finds_nothing(without_shared_store):
    report, calls, _ = without_shared_store
    [handle] = handles(calls)
    gets = polls(calls, handle.task_id)
    elsewhere = [g for g in gets if g.backend != handle.backend]
    at_home = [g for g in gets if g.backend == handle.backend]
    assert elsewhere and all(is_not_found(g) for g in elsewhere), [(g.backend, g.answer)
                                                                   for g in gets]  # fmt: skip
    assert all(g.status == "working" for g in at_home), [g.answer for g in at_home]
    assert report["ok"] is False and "not found" in report["error"], report


def test_with_a_shared_store_every_replica_answers_the_task(with_shared_store):
    report, calls, _ = with_shared_store
    [handle] = handles(calls)
    gets = polls(calls, handle.task_id)
    assert {g.backend for g in gets} == {"a", "b"}, [g.backend for g in gets]
    assert not any(g.error for g in gets), [g.error for g in gets]
    statuses = [g.status for g in gets]
    assert statuses[-1] == "completed" and set(statuses[:-1]) <= {"working"}, statuses
    assert report["ok"] is True and report["text"] in ("done by a", "done by b"), report


@pytest.mark.parametrize("fleet", ["without_shared_store", "with_shared_store"])
def test_fastmcp_polls_without_mcp_name(fleet, request):
    _, calls, _ = request.getfixturevalue(fleet)
    tasks = [c for c in calls if c.method.startswith("tasks/")]
    assert tasks and all(c.mcp_name is None for c in tasks), [c.mcp_name for c in tasks]


def test_without_a_shared_store_the_task_is_lost(without_shared_store):
    _, _, telemetry = without_shared_store
    assert telemetry.counts(TASKS, TASK_FATE) == {"lost": 1}


def test_with_a_shared_store_the_task_completes_and_nothing_is_lost(with_shared_store):
    _, _, telemetry = with_shared_store
    assert telemetry.counts(TASKS, TASK_FATE) == {"completed": 1}


@pytest.mark.parametrize("fleet", ["without_shared_store", "with_shared_store"])
def test_each_task_request_without_mcp_name_is_counted_unroutable(fleet, request):
    _, calls, telemetry = request.getfixturevalue(fleet)
    unnamed = sum(1 for c in calls if c.method.startswith("tasks/") and c.mcp_name is None)
    assert unnamed and telemetry.counts(UNROUTABLE) == {None: unnamed}
