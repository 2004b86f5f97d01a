"""Every task followed to its end (issue 37): a real fastmcp-tasks server
(memory backend) and FastMCP's own ``Client`` (importing fastmcp_tasks makes
it poll), behind the loopback router, whose record of every request and
answer is the wire truth; the plugin instrumented on in-memory providers.
Each fate gets its real fault; the controls report no loss."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from helpers import console_metrics, scope_counts
from opentelemetry.instrumentation.mcp_resumption.telemetry.verdict_log import verdicts

# fastmcp-tasks needs mcp >= 2.3 and is installed in the tasks environment
# of scripts/test only: imported by the tests, never at collection.
pytestmark = [pytest.mark.mcp2, pytest.mark.fastmcp_tasks]

TASKS = "mcp.client.resumption.tasks"
FATE = "mcp.resumption.task.fate"
DURATION = "mcp.client.resumption.task.duration"
POLLS = "mcp.client.resumption.task.polls"
UNROUTABLE = "mcp.client.resumption.task.unroutable"
PROGRAMS = Path(__file__).parent / "programs"
LOGGER = "opentelemetry.instrumentation.mcp_resumption.verdicts"


class Stack:
    """The server (restartable), the router in front of it, and the truth."""

    def __init__(self, cut=lambda request: False, **server) -> None:
        from tasks_stack import TaskRouter, TaskServer, switchable

        self.server = TaskServer(**server)
        self.servers = [self.server]
        self.router = TaskRouter(switchable(lambda: self.server, cut))

    @property
    def url(self) -> str:
        return self.router.url + "/mcp"

    def restart(self) -> None:
        """The server restarts: a new instance takes the route (with the same
        Redis store, or a new memory backend), the old one stops."""
        old = self.server
        self.server = type(old)("restarted", store=old.store)
        self.servers.append(self.server)
        old.close()

    def close(self) -> None:
        for server in self.servers:
            server.close()


@pytest.fixture
def stack_of():
    stacks = []

    async def make(**kwargs) -> Stack:
        stack = Stack(**kwargs)
        await stack.router.start()
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


def run(coro):
    return asyncio.run(coro)


def Client(url):
    from fastmcp import Client as FastMcpClient

    return FastMcpClient(url)


async def call_tool_task(client, name, arguments):
    from fastmcp_tasks import call_tool_task as call

    return await call(client, name, arguments)


def fates(telemetry) -> dict[str, int]:
    return telemetry.counts(TASKS, FATE)


def task_lines(caplog) -> list[str]:
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    return [message for message in messages if " task " in message]


def lost_calls(telemetry) -> int:
    return telemetry.fates().get("lost", 0)


@pytest.fixture(autouse=True)
def verdict_lines(caplog):
    verdicts.reset()
    caplog.set_level(logging.INFO, logger=LOGGER)
    yield
    verdicts.reset()


def test_a_task_that_completes_is_completed_with_its_polls_and_life(telemetry, stack_of):
    async def scenario():
        stack = await stack_of()
        async with Client(stack.url) as client:
            result = await client.call_tool("crunch", {"n": 1})
        await stack.router.close()
        return stack, result

    with telemetry.instrumented():
        stack, result = run(scenario())
    assert result.data == "crunched 1"
    router = stack.router
    # The truth: one handle, then tasks/get polls to a completed status.
    (call,) = router.of("tools/call")
    assert router.answer(call)["result"]["resultType"] == "task"
    polls = router.of("tasks/get")
    assert polls and router.answer(polls[-1])["result"]["status"] == "completed"
    assert fates(telemetry) == {"completed": 1}
    (point,) = [p for p in telemetry.points(TASKS) if p.value]
    assert point.attributes["gen_ai.tool.name"] == "crunch"
    assert point.attributes["mcp.transport"] == "streamable-http"
    assert point.attributes["server.address"] == "127.0.0.1"
    assert "mcp.resumption.task.cancel_ignored" not in point.attributes
    # Every fate's series of the server starts at 0 once it is seen.
    zero = {p.attributes[FATE] for p in telemetry.points(TASKS) if p.value == 0}
    assert zero == {"completed", "failed", "cancelled", "lost", "expired", "abandoned",
                    "handle_lost"}
    (life,) = [p for p in telemetry.points(DURATION) if p.count]
    assert life.count == 1 and life.attributes[FATE] == "completed"
    (polled,) = [p for p in telemetry.points(POLLS) if p.count]
    assert polled.sum == len(polls)
    # FastMCP's client sends tasks/get without Mcp-Name: each is unroutable.
    unnamed = [e for e in polls if e.request.header("mcp-name") is None]
    assert unnamed, "the truth changed: FastMCP now names the task"
    assert telemetry.counts(UNROUTABLE) == {None: len(unnamed)}
    assert lost_calls(telemetry) == 0


def test_an_inline_answer_and_a_tool_error_are_no_loss(telemetry, stack_of, caplog):
    """A tools/call the server answers inline is no task; a task whose tool
    raised ends completed with isError (an answer, not a loss)."""

    async def scenario():
        stack = await stack_of()
        async with Client(stack.url) as client:
            inline = await client.call_tool("inline", {"n": 2})
            failed = await client.call_tool("broken", {"n": 3}, raise_on_error=False)
        await stack.router.close()
        return stack, inline, failed

    with telemetry.instrumented():
        stack, inline, failed = run(scenario())
    router = stack.router
    answers = [router.answer(e)["result"] for e in router.of("tools/call")]
    assert answers[0].get("resultType") == "complete"  # inline: no handle
    assert answers[1]["resultType"] == "task"
    assert inline.data == "inline 2" and failed.is_error
    assert router.answer(router.of("tasks/get")[-1])["result"]["status"] == "completed"
    assert fates(telemetry) == {"completed": 1}
    assert task_lines(caplog) == []
    assert lost_calls(telemetry) == 0


def test_a_restarted_server_loses_the_task(telemetry, stack_of, caplog):
    """The server restarts mid-task (memory backend): the next tasks/get is
    answered -32602 "not found", long before the TTL: lost, one WARNING."""

    async def scenario():
        stack = await stack_of()
        async with Client(stack.url) as client:
            call = asyncio.ensure_future(client.call_tool("gated", {"n": 1}))
            await stack.router.wait_for(lambda exchanges: any(
                e.request.jsonrpc_method == "tasks/get" and e.finished.is_set()
                for e in exchanges), 30)
            await asyncio.to_thread(stack.restart)
            with pytest.raises(Exception, match="not found"):
                await call
        await stack.router.close()
        return stack

    with telemetry.instrumented():
        stack = run(scenario())
    router = stack.router
    last = router.answer(router.of("tasks/get")[-1])
    assert last["error"]["code"] == -32602 and "not found" in last["error"]["message"]
    (handle,) = [router.answer(e)["result"] for e in router.of("tools/call")]
    assert handle["ttlMs"] >= 60_000  # far from run out: not an expiry
    assert fates(telemetry) == {"lost": 1}
    (line,) = task_lines(caplog)
    assert "task lost" in line and "tool=gated" in line
    assert handle["taskId"] not in line  # hashed
    assert "idempotent" in line
    assert lost_calls(telemetry) == 0


def test_a_task_read_after_its_ttl_is_expired(telemetry, stack_of, caplog):
    """The TTL (1 s, from the task's end on fastmcp-tasks) runs out before the
    client reads the result: the same "not found", now expired."""

    async def scenario():
        stack = await stack_of(execution_ttl=timedelta(seconds=1))
        async with Client(stack.url) as client:
            task = await call_tool_task(client, "crunch", {"n": 1})
            # The server's own answer (not the client's): it forgot the task.
            while await asyncio.to_thread(stack.server.knows, task.task_id):
                await asyncio.sleep(0.1)
            with pytest.raises(Exception, match="not found"):
                await task.result()
        await stack.router.close()
        return stack

    with telemetry.instrumented():
        stack = run(scenario())
    router = stack.router
    (handle,) = [router.answer(e)["result"] for e in router.of("tools/call")]
    assert handle["ttlMs"] == 1000
    assert router.answer(router.of("tasks/get")[-1])["error"]["code"] == -32602
    assert fates(telemetry) == {"expired": 1}
    (line,) = task_lines(caplog)
    assert "task expired" in line and "tool=crunch" in line


def test_a_handle_cut_on_its_way_is_handle_lost_not_a_lost_call(telemetry, stack_of, caplog):
    """The router cuts the creating tools/call's answer half way: the task
    runs on the server (its truth), nobody has its handle."""

    async def scenario():
        stack = await stack_of(cut=lambda r: r.jsonrpc_method == "tools/call")
        with pytest.raises(Exception, match="complete message body"):
            async with Client(stack.url) as client:
                await client.call_tool("crunch", {"n": 1})
        await stack.router.close()
        return stack

    with telemetry.instrumented():
        stack = run(scenario())
    router = stack.router
    (call,) = router.of("tools/call")
    assert call.severed and router.answer(call) is None
    # The half that crossed names the task, which the server still knows.
    task_id = re.search(rb'"taskId":"([^"]+)"', bytes(router.bodies[call.index])).group(1)
    assert stack.server.knows(task_id.decode())
    assert router.of("tasks/get") == []
    assert fates(telemetry) == {"handle_lost": 1}
    (line,) = task_lines(caplog)
    assert "task handle_lost" in line and "may still run unseen" in line
    assert lost_calls(telemetry) == 0


def test_a_cancelled_task_is_clean_and_a_late_cancel_is_ignored(telemetry, stack_of, caplog):
    """A cancel the server honours ends cancelled (no loss); a cancel
    acknowledged after the work ended, then read completed, is a cancel not
    honoured: counted with cancel_ignored=true, one WARNING."""

    async def scenario():
        stack = await stack_of()
        async with Client(stack.url) as client:
            honoured = await call_tool_task(client, "gated", {"n": 1})
            await honoured.cancel()
            cancelled = await honoured.status()
            late = await call_tool_task(client, "gated", {"n": 2})
            stack.server.release.set()
            # The server's own truth: the work ended, its task is completed.
            while await asyncio.to_thread(stack.server.status, late.task_id) != "completed":
                await asyncio.sleep(0.05)
            await late.cancel()
            done = await late.result()
        await stack.router.close()
        return stack, cancelled, done

    with telemetry.instrumented():
        stack, cancelled, done = run(scenario())
    router = stack.router
    assert cancelled.status == "cancelled"
    assert done.data == "gated 2"
    acks = [router.answer(e) for e in router.of("tasks/cancel")]
    assert len(acks) == 2 and all("result" in a for a in acks)
    assert fates(telemetry) == {"cancelled": 1, "completed": 1}
    ignored = [p for p in telemetry.points(TASKS) if p.value and
               p.attributes.get("mcp.resumption.task.cancel_ignored") == "true"]
    assert len(ignored) == 1 and ignored[0].attributes[FATE] == "completed"
    (line,) = task_lines(caplog)
    assert "cancel ignored" in line and "tool=gated" in line


def test_a_client_that_exits_while_waiting_abandons_its_task(stack_of):
    """Under the real ``opentelemetry-instrument``: a client gives up waiting
    (no tasks/cancel) and exits while the task still works (the server's
    truth: its tool has not returned); its exit reports it abandoned."""

    async def scenario():
        stack = await stack_of()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
        env.update(
            OTEL_SERVICE_NAME="task-client",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="console",
            OTEL_LOGS_EXPORTER="none",
        )
        instrument = Path(sys.executable).with_name("opentelemetry-instrument")
        process = await asyncio.create_subprocess_exec(
            str(instrument), sys.executable, str(PROGRAMS / "task_abandon_client.py"), stack.url,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 120)
        await stack.router.close()
        return stack, process.returncode, out.decode(), err.decode()

    stack, code, out, err = run(scenario())
    assert code == 0, err
    assert "gave up:" in out
    router = stack.router
    assert router.of("tasks/get") and not router.of("tasks/cancel")
    assert not stack.server.ended.is_set()  # the work was still running
    lines = [line for line in err.splitlines() if "mcp-resumption task abandoned" in line]
    assert len(lines) == 1 and "tool=gated" in lines[0], err
    summary = [line for line in err.splitlines() if "mcp-resumption summary" in line]
    assert summary and "tasks=abandoned:1" in summary[-1], err
    totals: dict[str, int] = {}
    for export in console_metrics(out):
        for fate, n in scope_counts(export, TASKS, FATE).items():
            totals[fate] = max(totals.get(fate, 0), n)
    assert totals == {"abandoned": 1}


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "redis"])
def test_a_restart_between_the_end_and_the_read(telemetry, stack_of, caplog, durable, request):
    """The task ends, the server restarts, then the client reads: with the
    memory backend the result died with the server (lost); with a Redis task
    store the restarted server still has it (completed: no false fate)."""
    store = None
    if durable:
        redis = request.getfixturevalue("redis_server")
        redis.client().flushall()
        store = redis.url

    async def scenario():
        stack = await stack_of(store=store)
        async with Client(stack.url) as client:
            task = await call_tool_task(client, "crunch", {"n": 1})
            while await asyncio.to_thread(stack.server.status, task.task_id) != "completed":
                await asyncio.sleep(0.05)
            await asyncio.to_thread(stack.restart)
            if durable:
                result = await task.result()
                assert result.data == "crunched 1"
            else:
                with pytest.raises(Exception, match="not found"):
                    await task.result()
        await stack.router.close()
        return stack

    with telemetry.instrumented():
        stack = run(scenario())
    router = stack.router
    last = router.answer(router.of("tasks/get")[-1])
    if durable:
        assert last["result"]["status"] == "completed"
        assert fates(telemetry) == {"completed": 1}
        assert task_lines(caplog) == []
    else:
        assert last["error"]["code"] == -32602
        assert fates(telemetry) == {"lost": 1}
        (line,) = task_lines(caplog)
        assert "task lost" in line
