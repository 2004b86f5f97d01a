"""The usual retry: a client's stream breaks and it re-issues the call at
once, while the abandoned first run is still working.  Both runs do the
work; the server half counts it once on ``mcp.server.resumption.second_runs``
(and writes one WARNING line), whether the re-issue arrives before or after
the first run returns, on both SDK majors, in SSE and JSON mode, for async
and sync tools; never when the first run was cancelled before the work.

The truth is the handler's own log (each run's start and end, in order) and
the server's own ASGI view of each POST (its connection reported gone, its
call ended), never the plugin.  Each run waits on a gate the test opens, so
the overlap is an order of events, not of times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time

import anyio
import httpx
import pytest

from server_harness import server_instrumented
from wire import LEGACY, MCP1, MCP_MAJOR, MODERN, CutRoute, WireRouter, is_progress

SECOND = "mcp.server.resumption.second_runs"
WASTED = "mcp.server.resumption.work_for_nobody"
GATE = 20.0  # a bound on a failing test, never what a passing one waits for
LOGGER = "opentelemetry.instrumentation.mcp_resumption.server"

if MCP_MAJOR == 1:
    from mcp.server.fastmcp import Context, FastMCP
else:
    from mcp.server.mcpserver import Context, MCPServer

from mcp.types import ToolAnnotations  # noqa: E402


class Truth:
    """The handlers' log ((what, run) in order, with when), the gates the
    test opens, and the server's own view of each tools/call POST."""

    def __init__(self, json_response: bool) -> None:
        self.json = json_response
        self.lock = threading.Lock()
        self.log: list[tuple[str, int]] = []
        self.at: dict[tuple[str, int], float] = {}
        self.gates: dict[int, threading.Event] = {}
        self.raw: list = []  # each tools/call POST's own ASGI receive, in order
        self.posts: list[str] = []  # ("disconnect", k) and ("ended", k) as seen

    def note(self, what: str, run: int) -> None:
        with self.lock:
            self.log.append((what, run))
            self.at[(what, run)] = time.monotonic()

    def saw(self, what: str, run: int) -> bool:
        with self.lock:
            return (what, run) in self.log

    def start(self) -> int:
        with self.lock:
            run = sum(1 for what, _ in self.log if what == "started")
        self.note("started", run)
        return run

    def gate(self, run: int) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(run, threading.Event())

    async def connection_gone(self, run: int) -> bool:
        """The server's own connection of run ``run``'s POST (JSON mode:
        nothing else asks it), asked without waiting as Starlette does,
        below the plugin."""
        receive = self.raw[run]
        with anyio.CancelScope() as scope:
            scope.cancel()
            return (await receive()).get("type") == "http.disconnect"
        return False

    def wrap(self, app):
        truth = self

        async def asgi(scope, receive, send):
            if scope.get("type") != "http" or scope.get("method") != "POST":
                return await app(scope, receive, send)
            index: list[int] = []
            body = bytearray()

            async def peek():
                received = await receive()
                if received.get("type") == "http.request":
                    body.extend(received.get("body", b""))
                    if not received.get("more_body") and b'"tools/call"' in body and (
                        b'"x"' in body
                    ):
                        with truth.lock:
                            index.append(len(truth.raw))
                            truth.raw.append(receive)
                elif received.get("type") == "http.disconnect" and index:
                    truth.note("disconnect", index[0])
                return received

            try:
                await app(scope, peek, send)
            finally:
                if index:
                    truth.note("ended", index[0])

        return asgi


def build(truth: Truth, json_response: bool):
    if MCP_MAJOR == 1:
        server = FastMCP("second-runs", json_response=json_response)
    else:
        server = MCPServer("second-runs")

    @server.tool()
    async def work(text: str, ctx: Context) -> str:
        run = truth.start()
        await ctx.report_progress(1, 2)
        try:
            gate = truth.gate(run)
            gone = False
            while not gate.is_set():
                if truth.json and not gone and await truth.connection_gone(run):
                    gone = True
                    truth.note("gone", run)
                await anyio.sleep(0.01)
        except BaseException:
            truth.note("cancelled", run)
            raise
        truth.note("finished", run)
        return f"done {text}"

    @server.tool(annotations=ToolAnnotations(**{"idempotentHint": True}))
    async def lookup(text: str, ctx: Context) -> str:
        return await work(text, ctx)

    @server.tool()
    async def shielded(text: str, ctx: Context) -> str:
        """Waits for its gate whatever happens, then yields to a pending
        cancellation before it does the work."""
        run = truth.start()
        await ctx.report_progress(1, 2)
        try:
            with anyio.CancelScope(shield=True):
                while not truth.gate(run).is_set():
                    await anyio.sleep(0.01)
            await anyio.sleep(0)
        except BaseException:
            truth.note("cancelled", run)
            raise
        truth.note("finished", run)
        return f"done {text}"

    if MCP_MAJOR == 2:

        @server.tool()
        def work_sync(text: str, ctx: Context) -> str:
            """mcp 2.x runs a sync tool on a worker thread: closing its
            stream cannot cancel it."""
            run = truth.start()
            anyio.from_thread.run(ctx.report_progress, 1, 2)
            gate = truth.gate(run)
            gone = False
            deadline = time.monotonic() + GATE
            while not gate.wait(0.01) and time.monotonic() < deadline:
                if truth.json and not gone and anyio.from_thread.run(
                    truth.connection_gone, run
                ):
                    gone = True
                    truth.note("gone", run)
            truth.note("finished", run)
            return f"done {text}"

    if MCP_MAJOR == 1:
        app = server.streamable_http_app()
    else:
        app = server.streamable_http_app(json_response=json_response)
    return truth.wrap(app)


class Stack:
    """A real SDK server behind a loopback router that cuts the first
    tools/call's stream after its progress notification."""

    def __init__(self, telemetry, json_response: bool = False) -> None:
        self.telemetry = telemetry
        self.truth = Truth(json_response)
        self.json = json_response
        self.cut = True

    async def __aenter__(self):
        from mcp_resumption_demo.loopback import LoopbackServer
        from mcp_resumption_demo.router import Backend, Route

        self.instrumented = server_instrumented(self.telemetry)
        self.instrumented.__enter__()
        self.backend = await LoopbackServer(
            build(self.truth, self.json), name="second-runs"
        ).astart()
        backend = Backend("second-runs", self.backend.port)

        def policy(request):
            if request.jsonrpc_method == "tools/call" and self.cut and b'"x"' in request.body:
                self.cut = False
                return CutRoute(backend, cut_after=is_progress)
            return Route(backend)

        self.router = await WireRouter(policy).start()
        self.url = f"http://127.0.0.1:{self.router.port}/mcp"
        return self

    async def __aexit__(self, *exc):
        for gate in list(self.truth.gates.values()):
            gate.set()  # a failing test leaves no handler waiting
        await self.router.close()
        await asyncio.to_thread(self.backend.close)
        self.instrumented.__exit__(None, None, None)


class Client:
    """The installed major's SDK client of ``kind``."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind, self.url = kind, url
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self):
        if self.kind == MCP1:
            from mcp import ClientSession
            from mcp.client.streamable_http import streamablehttp_client

            read, write, *_ = await self._stack.enter_async_context(streamablehttp_client(self.url))
            self.session = await self._stack.enter_async_context(ClientSession(read, write))
            await self.session.initialize()
        else:
            from mcp import Client as SdkClient

            mode = "legacy" if self.kind == LEGACY else "auto"
            self.session = await self._stack.enter_async_context(SdkClient(self.url, mode=mode))
        return self

    async def __aexit__(self, *exc):
        await self._stack.aclose()

    async def call(self, tool: str, progress: bool = True) -> str:
        async def on_progress(*_args) -> None:
            return None

        kwargs = {"progress_callback": on_progress} if progress else {}
        result = await self.session.call_tool(tool, {"text": "x"}, **kwargs)
        return result.content[0].text


def wait(predicate, what: str = "the handlers' log never showed it") -> None:
    event = threading.Event()
    deadline = time.monotonic() + GATE
    while time.monotonic() < deadline:
        if predicate():
            return
        event.wait(0.01)
    raise AssertionError(what)


async def until(predicate, what: str = "the handlers' log never showed it") -> None:
    await asyncio.to_thread(wait, predicate, what)


async def cut_first_run(stack: Stack, client: Client, tool: str) -> asyncio.Future:
    """Run 0 of ``tool``, its stream cut by the router (SSE) or its
    connection closed by its client once it started (JSON: the SDK client
    does not close it), until the server itself saw its client gone."""
    truth = stack.truth
    if stack.json:
        truth.gate(0).set()
        assert await client.call(tool, progress=False) == "done x"  # warm: its headers
        await until(lambda: truth.saw("ended", 0))
        truth.log.clear()
        truth.gates.clear()
        truth.raw.clear()
        [warm] = [e for e in stack.router.exchanges if e.request.jsonrpc_method == "tools/call"]
        body = warm.request.body
        headers = {
            k: v for k, v in warm.request.headers
            if k.lower() not in ("host", "content-length", "connection")
        }
        raw = httpx.AsyncClient()
        first = asyncio.ensure_future(raw.post(
            f"http://127.0.0.1:{stack.backend.port}/mcp", content=body, headers=headers,
            timeout=GATE,
        ))
        await until(lambda: truth.saw("started", 0))
        first.cancel()  # the client closes its connection
        await until(lambda: truth.saw("gone", 0), "the server never saw the client gone")
        await raw.aclose()
        return first
    first = asyncio.ensure_future(client.call(tool))
    await until(lambda: truth.saw("started", 0))
    if client.kind == MODERN:
        # 2026-07-28: the SDK watches the stream and saw it go.
        await until(lambda: truth.saw("disconnect", 0), "the server never saw the cut")
    else:
        # Before 2026-07-28 the SDK drops the request's stream as the POST's
        # ASGI call ends.
        await until(lambda: truth.saw("ended", 0), "the server never ended the cut POST")
    return first


async def settle(first: asyncio.Future) -> None:
    """The cut first call's client side (mcp 2.x raised; mcp 1.x waits on a
    stream with no event ids: the application gives up on it)."""
    first.cancel()
    with contextlib.suppress(BaseException):  # what the SDK raises for a cut is its business
        await first


OVERLAP = [
    pytest.param(MCP1, False, "work", marks=pytest.mark.mcp1, id="mcp1-sse-async"),
    pytest.param(LEGACY, False, "work", marks=pytest.mark.mcp2, id="mcp2-legacy-sse-async"),
    pytest.param(LEGACY, False, "work_sync", marks=pytest.mark.mcp2, id="mcp2-legacy-sse-sync"),
    pytest.param(MODERN, False, "work_sync", marks=pytest.mark.mcp2, id="mcp2-2026-sse-sync"),
    pytest.param(MODERN, True, "work", marks=pytest.mark.mcp2, id="mcp2-2026-json-async"),
    pytest.param(MODERN, True, "work_sync", marks=pytest.mark.mcp2, id="mcp2-2026-json-sync"),
]


ORDERS = ["first-ends-first", "reissue-ends-first", "reissue-after-first-returned"]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kind,json_response,tool", OVERLAP)
def test_a_reissue_is_one_second_run_whenever_it_starts(
    telemetry, caplog, kind, json_response, tool, order
):
    async def scenario():
        async with Stack(telemetry, json_response) as stack:
            truth = stack.truth
            async with Client(kind, stack.url) as client:
                first = await cut_first_run(stack, client, tool)
                if order == "reissue-after-first-returned":
                    truth.gate(0).set()
                    await until(lambda: truth.saw("finished", 0))
                # The re-issue, at once (or once run 0 returned).
                second = asyncio.ensure_future(client.call(tool, progress=not json_response))
                await until(lambda: truth.saw("started", 1))
                if order == "first-ends-first":
                    assert not truth.saw("finished", 0)
                    truth.gate(0).set()
                    await until(lambda: truth.saw("finished", 0))
                    truth.gate(1).set()
                    assert await second == "done x"
                elif order == "reissue-ends-first":
                    assert not truth.saw("finished", 0)
                    truth.gate(1).set()
                    assert await second == "done x"
                    truth.gate(0).set()
                    await until(lambda: truth.saw("finished", 0))
                else:
                    truth.gate(1).set()
                    assert await second == "done x"
                await until(
                    lambda: telemetry.counts(SECOND, "gen_ai.tool.name"),
                    "no second run was counted",
                )
                await settle(first)
            return stack

    with caplog.at_level(logging.INFO, LOGGER):
        stack = asyncio.run(scenario())
    log = stack.truth.log
    assert ("cancelled", 0) not in log and ("cancelled", 1) not in log
    assert [e for e in log if e[0] in ("started", "finished")].count(("started", 0)) == 1
    assert {("started", 0), ("started", 1), ("finished", 0), ("finished", 1)} <= set(log)
    assert len([e for e in log if e[0] == "started"]) == 2  # it ran twice, no more
    assert telemetry.counts(SECOND, "gen_ai.tool.name") == {tool: 1}
    lines = [r for r in caplog.records if "ran twice" in r.getMessage()]
    assert len(lines) == 1
    [line] = lines
    assert line.levelno == logging.WARNING
    text = line.getMessage()
    when = "after its first run had answered nobody" if order.endswith("returned") else (
        "while its first run was still working"
    )
    assert f"{tool!r}" in text and when in text, text
    assert "neither idempotentHint nor readOnlyHint" in text


@pytest.mark.mcp2
def test_a_sync_tools_warning_says_when_its_stream_closed(telemetry, caplog):
    """mcp 2.x, 2026-07-28, SSE: a sync tool's thread runs on after its
    stream closed; its work-for-nobody line says how long before it
    answered the stream had closed."""

    async def scenario():
        async with Stack(telemetry) as stack:
            truth = stack.truth
            async with Client(MODERN, stack.url) as client:
                first = await cut_first_run(stack, client, "work_sync")
                second = asyncio.ensure_future(client.call("work_sync"))
                await until(lambda: truth.saw("started", 1))
                truth.gate(1).set()
                assert await second == "done x"
                # The tool's own work outlasts its stream by a second (what
                # is measured, not a synchronisation).
                cut = truth.at[("disconnect", 0)]
                await until(lambda: time.monotonic() >= cut + 1.0)
                truth.gate(0).set()
                await until(lambda: telemetry.counts(WASTED, "gen_ai.tool.name"))
                seen = time.monotonic()
                await settle(first)
            return stack, seen

    with caplog.at_level(logging.INFO, LOGGER):
        stack, seen = asyncio.run(scenario())
    truth = stack.truth
    [line] = [r for r in caplog.records if "ran to completion" in r.getMessage()]
    found = re.search(r"the stream closed (\d+\.\d) s before it answered", line.getMessage())
    assert found, line.getMessage()
    said = float(found.group(1))
    # Between the server's own sight of the cut and the handler's return,
    # and the moment the test saw the count.
    at_least = truth.at[("finished", 0)] - truth.at[("disconnect", 0)]
    at_most = seen - truth.at[("disconnect", 0)]
    assert at_least - 0.05 <= said <= at_most + 0.05, (said, at_least, at_most)
    assert at_least >= 1.0 and said >= 1.0, (said, at_least)


@pytest.mark.mcp2
def test_a_reissue_whose_first_run_is_cancelled_before_the_work_is_no_second_run(
    telemetry, caplog
):
    """2026-07-28, SSE: closing the stream cancels the handler.  The first
    run is still inside its shield when the re-issue starts, then is
    cancelled before it does the work: one run did it, not two."""

    async def scenario():
        async with Stack(telemetry) as stack:
            truth = stack.truth
            async with Client(MODERN, stack.url) as client:
                first = await cut_first_run(stack, client, "shielded")
                second = asyncio.ensure_future(client.call("shielded"))
                await until(lambda: truth.saw("started", 1))
                truth.gate(1).set()
                assert await second == "done x"
                truth.gate(0).set()
                await until(lambda: truth.saw("cancelled", 0))
                await settle(first)
            return stack

    with caplog.at_level(logging.INFO, LOGGER):
        stack = asyncio.run(scenario())
    log = stack.truth.log
    assert ("cancelled", 0) in log and ("finished", 0) not in log
    assert ("finished", 1) in log
    assert telemetry.counts(SECOND, "gen_ai.tool.name") == {}
    assert not [r for r in caplog.records if "ran twice" in r.getMessage()]


HINTED = [
    pytest.param(LEGACY, marks=pytest.mark.mcp2, id=LEGACY),
    pytest.param(MCP1, marks=pytest.mark.mcp1, id=MCP1),
]


@pytest.mark.parametrize("kind", HINTED)
def test_the_second_runs_line_names_the_hints_the_tool_declared(telemetry, caplog, kind):
    async def scenario():
        async with Stack(telemetry) as stack:
            truth = stack.truth
            async with Client(kind, stack.url) as client:
                tools = await client.session.list_tools()
                [declared] = [t for t in tools.tools if t.name == "lookup"]
                assert declared.annotations.model_dump(by_alias=True)["idempotentHint"] is True
                first = await cut_first_run(stack, client, "lookup")
                second = asyncio.ensure_future(client.call("lookup"))
                await until(lambda: truth.saw("started", 1))
                truth.gate(0).set()
                truth.gate(1).set()
                assert await second == "done x"
                await until(lambda: truth.saw("finished", 0))
                await until(lambda: telemetry.counts(SECOND, "gen_ai.tool.name"))
                await settle(first)
            return stack

    with caplog.at_level(logging.INFO, LOGGER):
        stack = asyncio.run(scenario())
    assert len([e for e in stack.truth.log if e[0] == "finished"]) == 2
    assert telemetry.counts(SECOND, "gen_ai.tool.name") == {"lookup": 1}
    [line] = [r for r in caplog.records if "ran twice" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert "'lookup'" in line.getMessage() and "it declares idempotentHint" in line.getMessage()
