"""Tasks in 2025-11-25's experimental form (issue 37): mcp 1.30's own task
server (``server.experimental.enable_tasks``, a stateful streamable-HTTP
server whose tasks belong to the session) and client
(``session.experimental``), behind the loopback router (task_wire), whose
record is the wire truth; the plugin on in-memory providers."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from datetime import timedelta

import anyio
import pytest
import uvicorn

from opentelemetry.instrumentation.mcp_resumption.telemetry.verdict_log import verdicts
from task_wire import TaskRouter, switchable

# mcp 1.30 warns that its experimental tasks API will go: it is what is tested.
pytestmark = [pytest.mark.mcp1, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TASKS = "mcp.client.resumption.tasks"
FATE = "mcp.resumption.task.fate"
POLLS = "mcp.client.resumption.task.polls"
LOGGER = "opentelemetry.instrumentation.mcp_resumption.verdicts"
GATE_TIMEOUT_S = 30.0


class ExperimentalServer:
    """mcp 1.30's low-level server with its experimental tasks: ``slow`` runs
    as a task (``taskSupport: optional``) until ``release`` is set."""

    def __init__(self) -> None:
        from mcp import types
        from mcp.server.lowlevel import Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.shared.experimental.tasks.in_memory_task_store import InMemoryTaskStore
        from starlette.applications import Starlette
        from starlette.routing import Mount

        self.release = threading.Event()
        release = self.release
        server = Server("experimental-tasks")
        self.store = InMemoryTaskStore()
        server.experimental.enable_tasks(store=self.store)

        @server.list_tools()
        async def list_tools():
            execution = types.ToolExecution(taskSupport="optional")
            return [types.Tool(name="slow", inputSchema={"type": "object"}, execution=execution)]

        @server.call_tool()
        async def call_tool(name, arguments):
            async def work(task):
                while not release.is_set():
                    await anyio.sleep(0.02)
                return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

            return await server.request_context.experimental.run_task(work)

        manager = StreamableHTTPSessionManager(app=server)

        @contextlib.asynccontextmanager
        async def lifespan(app):
            async with manager.run():
                yield

        app = Starlette(routes=[Mount("/mcp", app=manager.handle_request)], lifespan=lifespan)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def forgot(self, task_id: str) -> bool:
        """The store's own truth: the task is past its TTL (the store deletes
        it at its next access), or gone."""
        stored = self.store._tasks.get(task_id)
        return stored is None or self.store._is_expired(stored)

    def close(self) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def servers():
    made: list[ExperimentalServer] = []

    def make() -> ExperimentalServer:
        made.append(ExperimentalServer())
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture(autouse=True)
def verdict_lines(caplog):
    verdicts.reset()
    caplog.set_level(logging.INFO, logger=LOGGER)
    yield
    verdicts.reset()


def task_lines(caplog) -> list[str]:
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    return [message for message in messages if " task " in message]


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    inner = getattr(error, "exceptions", None)
    if inner is None:
        return [error]
    return [leaf for each in inner for leaf in leaves(each)]


@contextlib.asynccontextmanager
async def session(url: str, read_timeout: float | None = None):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    timeout = timedelta(seconds=read_timeout) if read_timeout else None
    async with streamablehttp_client(url) as (reader, writer, _), ClientSession(
        reader, writer, read_timeout_seconds=timeout
    ) as opened:
        await opened.initialize()
        await opened.list_tools()  # the tool's taskSupport
        yield opened


def test_a_task_polled_then_read_with_tasks_result_is_completed(telemetry, servers, caplog):
    from mcp import types

    server = servers()

    async def scenario():
        router = TaskRouter(switchable(lambda: server, lambda request: False))
        await router.start()
        async with session(router.url + "/mcp/") as client:
            created = await client.experimental.call_tool_as_task("slow", {}, ttl=60_000)
            server.release.set()
            async for _ in client.experimental.poll_task(created.task.taskId):
                pass
            result = await client.experimental.get_task_result(
                created.task.taskId, types.CallToolResult
            )
        await router.close()
        return router, result

    with telemetry.instrumented():
        router, result = anyio.run(scenario)
    assert result.content[0].text == "done"
    handle = router.answer(router.of("tools/call")[0])["result"]["task"]
    assert handle["status"] == "working"
    polls = router.of("tasks/get")
    assert router.answer(polls[-1])["result"]["status"] == "completed"
    assert "result" in router.answer(router.of("tasks/result")[0])
    assert telemetry.counts(TASKS, FATE) == {"completed": 1}
    (polled,) = [p for p in telemetry.points(POLLS) if p.count]
    assert polled.sum == len(polls)
    assert task_lines(caplog) == []


def test_a_session_gone_with_its_server_loses_the_task(telemetry, servers, caplog):
    """A stateful server restarts mid-task: its tasks belonged to the session,
    and the next tasks/get is answered 404 for that session: lost."""
    first = servers()
    current = [first]

    async def scenario():
        router = TaskRouter(switchable(lambda: current[0], lambda request: False))
        await router.start()
        async with session(router.url + "/mcp/") as client:
            created = await client.experimental.call_tool_as_task("slow", {}, ttl=60_000)
            current[0] = servers()  # the restart: a new server takes the route
            first.close()
            from mcp.shared.exceptions import McpError

            with pytest.raises(McpError):
                await client.experimental.get_task(created.task.taskId)
        await router.close()
        return router

    with telemetry.instrumented():
        router = anyio.run(scenario)
    (get,) = router.of("tasks/get")
    assert get.status == 404
    assert telemetry.counts(TASKS, FATE) == {"lost": 1}
    (line,) = task_lines(caplog)
    assert "task lost" in line and "tool=slow" in line


def test_a_handle_cut_on_its_sse_stream_is_handle_lost_not_a_lost_call(
    telemetry, servers, caplog
):
    """The router cuts the tools/call's SSE answer half way: the stream broke
    before the handle; the request ledger would call it a lost call, the task
    room names it handle_lost instead (counted once)."""
    server = servers()

    async def scenario():
        router = TaskRouter(switchable(lambda: server, lambda r: r.jsonrpc_method == "tools/call"))
        await router.start()
        from mcp.shared.exceptions import McpError

        try:
            async with session(router.url + "/mcp/", read_timeout=2) as client:
                await client.experimental.call_tool_as_task("slow", {}, ttl=60_000)
        except Exception as error:  # the McpError, inside the transport's ExceptionGroup
            failed = leaves(error)
        else:
            failed = []
        assert any(isinstance(e, McpError) and "Timed out" in str(e) for e in failed), failed
        await router.close()
        return router

    with telemetry.instrumented(confirm_timeout=1):
        router = anyio.run(scenario)
    (call,) = router.of("tools/call")
    assert call.severed and router.answer(call) is None
    assert telemetry.counts(TASKS, FATE) == {"handle_lost": 1}
    assert telemetry.fates().get("lost", 0) == 0
    (line,) = task_lines(caplog)
    assert "task handle_lost" in line and "tasks/list may still find it" in line


def test_a_cancelled_task_ends_cancelled_without_a_loss(telemetry, servers, caplog):
    """mcp 1.30's default tasks/cancel relabels the task cancelled (its work
    runs on: docs/rules.md says what cancelled proves): clean here."""
    server = servers()

    async def scenario():
        router = TaskRouter(switchable(lambda: server, lambda request: False))
        await router.start()
        async with session(router.url + "/mcp/") as client:
            created = await client.experimental.call_tool_as_task("slow", {}, ttl=60_000)
            await client.experimental.cancel_task(created.task.taskId)
            status = await client.experimental.get_task(created.task.taskId)
        await router.close()
        return router, status

    with telemetry.instrumented():
        router, status = anyio.run(scenario)
    assert status.status == "cancelled"
    assert router.answer(router.of("tasks/cancel")[0])["result"]["status"] == "cancelled"
    assert telemetry.counts(TASKS, FATE) == {"cancelled": 1}
    assert task_lines(caplog) == []


def test_a_task_read_after_its_ttl_is_expired(telemetry, servers, caplog):
    """The task completes and its TTL (1 s from its end in mcp 1.30's store)
    runs out before the client reads it: the store forgets it, and the
    client's tasks/result is answered "not found": expired, not lost."""
    server = servers()

    async def scenario():
        from mcp import types
        from mcp.shared.exceptions import McpError

        router = TaskRouter(switchable(lambda: server, lambda request: False))
        await router.start()
        async with session(router.url + "/mcp/") as client:
            created = await client.experimental.call_tool_as_task("slow", {}, ttl=1000)
            server.release.set()
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not server.forgot(created.task.taskId) and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            with pytest.raises(McpError):
                await client.experimental.get_task_result(
                    created.task.taskId, types.CallToolResult
                )
        await router.close()
        return router

    with telemetry.instrumented():
        router = anyio.run(scenario)
    handle = router.answer(router.of("tools/call")[0])["result"]["task"]
    assert handle["ttl"] == 1000
    assert router.of("tasks/get") == []
    (read,) = router.of("tasks/result")
    assert "error" in router.answer(read), router.answer(read)
    assert telemetry.counts(TASKS, FATE) == {"expired": 1}
    (line,) = task_lines(caplog)
    assert "task expired" in line and "tool=slow" in line
