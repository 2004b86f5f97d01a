"""The server half's view of delivery: what became of each answer a real MCP
SDK server computed (``mcp.server.resumption.deliveries``), the tool calls it
ran for nobody (``mcp.server.resumption.work_for_nobody``) and their proven
second runs, seen from the server alone (the clients are not instrumented).

The truth comes first, from the router's record (what crossed the wire, which
stream it cut) and the handler's own log (started, finished, cancelled),
never from the plugin.  The handler of a cut call waits for the server to be
done with the cut stream (the POST's ASGI call ended, or the client's
connection reported gone) before it answers: an event, not a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading

import anyio
import httpx
import pytest

from server_harness import server_instrumented
from wire import (
    LEGACY,
    MCP1,
    MCP_MAJOR,
    MODERN,
    AppClient,
    CutRoute,
    WireRouter,
    is_progress,
    message,
)

DELIVERIES = "mcp.server.resumption.deliveries"
WASTED = "mcp.server.resumption.work_for_nobody"
SECOND = "mcp.server.resumption.second_runs"
FATE = "mcp.resumption.delivery.fate"
GATE = 20.0  # a bound on a failing test, never what a passing one waits for

if MCP_MAJOR == 1:
    from mcp.server.fastmcp import Context, FastMCP
else:
    from mcp.server.mcpserver import Context, MCPServer

from mcp.server.streamable_http import EventMessage, EventStore  # noqa: E402
from mcp.types import ToolAnnotations  # noqa: E402


class Store(EventStore):
    """Integer ids; replays a stream's events after the cursor."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, object]] = []
        self.n = 0

    async def store_event(self, stream_id, message):
        self.n += 1
        self.events.append((str(self.n), stream_id, message))
        return str(self.n)

    async def replay_events_after(self, last_event_id, send_callback):
        found = [e for e in self.events if e[0] == last_event_id]
        if not found:
            return None
        stream = found[0][1]
        for event_id, stream_id, stored in self.events:
            if stream_id == stream and int(event_id) > int(last_event_id) and stored is not None:
                await send_callback(EventMessage(stored, event_id))
        return stream


class Handlers:
    """The handlers' own log, and the POSTs the server finished (an ASGI
    wrapper around the app: the server's own end of each request)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.ended: set[str] = set()  # texts of tools/call POSTs whose ASGI call ended
        self.hold: set[str] = set()  # texts whose handler waits for its stream's end
        self.finished = threading.Event()

    def saw(self, what: str, text: str) -> bool:
        return (what, text) in self.log

    def wrap(self, app):
        async def asgi(scope, receive, send):
            text: list[str] = []
            body = bytearray()

            async def peek():
                received = await receive()
                if received.get("type") == "http.request":
                    body.extend(received.get("body", b""))
                    if not received.get("more_body"):
                        text.extend(_call_text(bytes(body)))
                return received

            async def watch():
                received = await receive()
                if received.get("type") == "http.disconnect":
                    self.ended.add(SSE_STREAM)  # the server saw its stream go
                return received

            if scope.get("method") == "GET" and scope.get("path", "").endswith("/sse"):
                peek = watch
            try:
                await app(scope, peek if scope.get("type") == "http" else receive, send)
            finally:
                self.ended.update(text)

        return asgi


def _call_text(body: bytes) -> list[str]:
    try:
        decoded = json.loads(body)
    except ValueError:
        return []
    if isinstance(decoded, dict) and decoded.get("method") == "tools/call":
        return [str((decoded.get("params") or {}).get("arguments", {}).get("text"))]
    return []


SSE_STREAM = "the legacy SSE stream"  # in Handlers.ended: a GET /sse the server ended


def build(handlers: Handlers, *, store=None, json_response: bool = False, sse: bool = False):
    if MCP_MAJOR == 1:
        server = FastMCP("delivery", event_store=store, retry_interval=100,
                         json_response=json_response)
    else:
        server = MCPServer("delivery")

    @server.tool()
    async def work(text: str, ctx: Context) -> str:
        return await run(text, ctx)

    @server.tool(annotations=ToolAnnotations(**{"readOnlyHint": True}))
    async def lookup(text: str, ctx: Context) -> str:
        return await run(text, ctx)

    async def run(text: str, ctx: Context) -> str:
        handlers.log.append(("started", text))
        await ctx.report_progress(1, 2)
        try:
            if text in handlers.hold:
                request = ctx.request_context.request
                # Until the server is done with the cut stream: its POST's
                # ASGI call ended (SSE), or the client's connection is gone
                # (JSON: nothing else watches it).
                # (a legacy SSE session: its one stream went; the POST was 202.)
                while (SSE_STREAM if sse else text) not in handlers.ended and not (
                    json_response and await request.is_disconnected()
                ):
                    await anyio.sleep(0.01)
                if sse:
                    # The SDK ends the session after it saw the stream go and
                    # cancels this handler then: wait for that cancellation,
                    # not a poll's luck (the bound only ends a failing test).
                    await anyio.sleep(GATE)
        except BaseException:
            handlers.log.append(("cancelled", text))
            raise
        handlers.log.append(("finished", text))
        handlers.finished.set()
        return "done " + text

    handlers.server = server
    if sse:
        app = server.sse_app()
    elif MCP_MAJOR == 1:
        app = server.streamable_http_app()
    else:
        app = server.streamable_http_app(
            event_store=store, retry_interval=100, json_response=json_response
        )
    return handlers.wrap(app)


class Stack:
    def __init__(self, telemetry, *, store=None, json_response=False, cut=None, sse=False) -> None:
        self.telemetry = telemetry
        self.sse = sse
        self.handlers = Handlers()
        self.store = store
        self.json_response = json_response
        self.cut = cut  # the text of the call whose stream the router cuts

    async def __aenter__(self):
        from mcp_resumption_demo.loopback import LoopbackServer
        from mcp_resumption_demo.router import Backend, Route

        self.instrumented = server_instrumented(self.telemetry)
        self.instrumented.__enter__()
        app = build(self.handlers, store=self.store, json_response=self.json_response, sse=self.sse)
        self.backend = await LoopbackServer(app, name="delivery").astart()
        backend = Backend("delivery", self.backend.port)
        handlers = self.handlers

        async def policy(request):
            if self.sse and request.method == "GET" and self.cut is not None:
                # The legacy session's one stream carries every answer.
                handlers.hold.add(self.cut)
                self.cut = None
                return CutRoute(backend, cut_after=is_progress)
            params = (request.jsonrpc or {}).get("params") or {}
            if request.jsonrpc_method == "tools/call" and (params.get("arguments") or {}).get(
                "text"
            ) == self.cut and self.cut is not None:
                self.cut = None
                handlers.hold.add(params["arguments"]["text"])
                return CutRoute(backend, cut_after=is_progress)
            if request.method == "GET" and request.header("last-event-id"):
                # The resume waits for the handler's answer: it is then in
                # the store before the replay reads it.
                await asyncio.to_thread(handlers.finished.wait, GATE)
            return Route(backend)

        self.router = await WireRouter(policy).start()
        self.url = f"http://127.0.0.1:{self.router.port}/mcp"
        return self

    async def __aexit__(self, *exc):
        await self.router.close()
        await asyncio.to_thread(self.backend.close)
        self.instrumented.__exit__(None, None, None)

    def requests_answered_on_the_wire(self) -> int:
        """Requests (POSTs with an id) whose answer crossed the wire, as a
        JSON body or an SSE event on any stream; a subscriptions/listen is
        counted apart (by how it ended), never as an answer."""
        answered = set()
        listens = {
            str((e.request.jsonrpc or {}).get("id")) for e in self.router.exchanges
            if e.request.jsonrpc_method == "subscriptions/listen"
        }
        for exchange in self.router.exchanges:
            for event in exchange.events:
                decoded = message(event)
                if decoded and "method" not in decoded and "id" in decoded:
                    answered.add(str(decoded["id"]))
        for exchange in self.router.exchanges:
            request = exchange.request.jsonrpc or {}
            if "id" in request and exchange.status == 200 and (
                exchange.response_header("content-type") or ""
            ).startswith("application/json"):
                answered.add(str(request["id"]))
        return len(answered - listens)


def fates(telemetry) -> dict[str, int]:
    return telemetry.counts(DELIVERIES, FATE)


def wasted(telemetry) -> dict[tuple, int]:
    totals: dict[tuple, int] = {}
    for point in telemetry.points(WASTED):
        key = (
            point.attributes["gen_ai.tool.name"],
            point.attributes["mcp.protocol.version"],
            point.attributes["mcp.resumption.tool.hint"],
        )
        totals[key] = totals.get(key, 0) + int(point.value)
    return {key: value for key, value in totals.items() if value}


CLEAN = [
    pytest.param(MODERN, None, marks=pytest.mark.mcp2, id="mcp2-2026-07-28"),
    pytest.param(LEGACY, None, marks=pytest.mark.mcp2, id="mcp2-legacy-no-store"),
    pytest.param(LEGACY, "store", marks=pytest.mark.mcp2, id="mcp2-legacy-store"),
    pytest.param(MCP1, None, marks=pytest.mark.mcp1, id="mcp1-no-store"),
    pytest.param(MCP1, "store", marks=pytest.mark.mcp1, id="mcp1-store"),
]


@pytest.mark.parametrize("kind,store", CLEAN)
def test_a_clean_call_is_delivered_and_nothing_else(telemetry, kind, store):
    async def scenario():
        async with Stack(telemetry, store=Store() if store else None) as stack:
            async with AppClient(kind, stack.url) as client:
                assert await client.call("clean") == "done clean"
            return stack

    stack = asyncio.run(scenario())
    assert stack.handlers.log == [("started", "clean"), ("finished", "clean")]
    answered = stack.requests_answered_on_the_wire()
    assert answered >= 1
    assert fates(telemetry) == {"delivered": answered}
    assert wasted(telemetry) == {}


@pytest.mark.mcp2
def test_a_clean_json_call_on_2026_07_28_is_delivered(telemetry):
    async def scenario():
        async with Stack(telemetry, json_response=True) as stack:
            async with AppClient(MODERN, stack.url) as client:
                assert await client.call("clean", progress=False) == "done clean"
            return stack

    stack = asyncio.run(scenario())
    answered = stack.requests_answered_on_the_wire()
    assert answered >= 1
    assert fates(telemetry) == {"delivered": answered}
    assert wasted(telemetry) == {}


@pytest.mark.mcp2
def test_a_cut_on_2026_07_28_cancels_the_handler_cancelled_not_lost(telemetry):
    async def scenario():
        async with Stack(telemetry, cut="x") as stack:
            async with AppClient(MODERN, stack.url) as client:
                with pytest.raises(Exception):  # noqa: B017 (the SDK's own error for a cut)
                    await client.call("x")
                await asyncio.to_thread(_wait, lambda: stack.handlers.saw("cancelled", "x"))
            return stack

    stack = asyncio.run(scenario())
    [cut] = [e for e in stack.router.exchanges if e.severed]
    assert (cut.request.jsonrpc or {}).get("method") == "tools/call"
    assert stack.handlers.saw("cancelled", "x") and not stack.handlers.saw("finished", "x")
    counted = fates(telemetry)
    assert counted.pop("cancelled") == 1
    assert set(counted) == {"delivered"}  # server/discover and the like
    assert wasted(telemetry) == {}


async def json_call_cut_by_its_client(stack, client, tool: str) -> None:
    """``tool`` called with ``x`` the way the SDK client calls it, sent
    straight to the server by a client that closes its connection once the
    handler started (the mcp 2.x client does not close a JSON request's
    connection when its call is cancelled); the handler runs on."""
    assert await client.session.call_tool(tool, {"text": "warm"})
    [warm] = [e for e in stack.router.exchanges if b'"warm"' in e.request.body]
    body = warm.request.body.replace(b'"warm"', b'"x"')
    headers = {
        k: v for k, v in warm.request.headers
        if k.lower() not in ("host", "content-length", "connection")
    }
    await post_x_and_leave_once_started(stack, headers, content=body)


async def post_x_and_leave_once_started(stack, headers: dict, **body) -> None:
    """POST the call of ``x`` (``content=`` or ``json=``) straight to the
    server, close the connection once its handler started, and wait for the
    handler to finish for nobody."""
    stack.handlers.hold.add("x")
    async with httpx.AsyncClient() as raw:
        call = asyncio.ensure_future(raw.post(
            f"http://127.0.0.1:{stack.backend.port}/mcp", headers=headers, timeout=GATE, **body,
        ))
        await asyncio.to_thread(_wait, lambda: stack.handlers.saw("started", "x"))
        call.cancel()  # the client closes its connection
        with pytest.raises(asyncio.CancelledError):
            await call
    await asyncio.to_thread(_wait, lambda: stack.handlers.saw("finished", "x"))
    stack.handlers.hold.discard("x")


@pytest.mark.mcp2
def test_a_json_answer_on_2026_07_28_written_for_a_client_gone_is_work_for_nobody(
    telemetry, caplog
):
    """mcp 2.x watches no connection in JSON mode: the client's close does
    not cancel the handler, which runs on and answers nobody.  The re-issued
    call with the same arguments is a proven second run."""

    async def scenario():
        async with Stack(telemetry, json_response=True) as stack:
            async with AppClient(MODERN, stack.url) as client:
                await json_call_cut_by_its_client(stack, client, "work")
                assert await client.call("x", progress=False) == "done x"  # the re-issue
            return stack

    with caplog.at_level(logging.INFO, "opentelemetry.instrumentation.mcp_resumption.server"):
        stack = asyncio.run(scenario())
    assert stack.handlers.log.count(("finished", "x")) == 2  # it ran twice
    counted = fates(telemetry)
    assert counted.pop("undelivered") == 1
    assert set(counted) == {"delivered"}
    assert wasted(telemetry) == {("work", "2026-07-28", "none"): 1}
    assert telemetry.counts(SECOND, "gen_ai.tool.name") == {"work": 1}
    [line] = [r for r in caplog.records if "ran to completion" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert "'work'" in line.getMessage() and "runs twice" in line.getMessage()


@pytest.mark.mcp2
def test_a_read_only_tool_run_for_nobody_is_counted_and_not_warned(telemetry, caplog):
    async def scenario():
        async with Stack(telemetry, json_response=True) as stack:
            async with AppClient(MODERN, stack.url) as client:
                tools = await client.session.list_tools()
                [declared] = [t for t in tools.tools if t.name == "lookup"]
                assert declared.annotations.model_dump(by_alias=True)["readOnlyHint"] is True
                await json_call_cut_by_its_client(stack, client, "lookup")
            return stack

    with caplog.at_level(logging.INFO, "opentelemetry.instrumentation.mcp_resumption.server"):
        stack = asyncio.run(scenario())
    assert stack.handlers.saw("finished", "x")
    assert wasted(telemetry) == {("lookup", "2026-07-28", "read_only"): 1}
    [line] = [r for r in caplog.records if "ran to completion" in r.getMessage()]
    assert line.levelno == logging.INFO and "readOnlyHint" in line.getMessage()


LEGACY_CUT = [
    pytest.param(LEGACY, marks=pytest.mark.mcp2, id=LEGACY),
    pytest.param(MCP1, marks=pytest.mark.mcp1, id=MCP1),
]


@pytest.mark.parametrize("kind", LEGACY_CUT)
def test_a_cut_without_a_store_before_2026_07_28_is_undelivered_and_work_for_nobody(
    telemetry, kind, caplog
):
    async def scenario():
        async with Stack(telemetry, cut="x") as stack:
            async with AppClient(kind, stack.url) as client:
                with pytest.raises(Exception):  # noqa: B017 (mcp 1.x: the app's give-up)
                    await client.call("x", idle=0.3 if kind == MCP1 else None)
                await asyncio.to_thread(_wait, lambda: stack.handlers.saw("finished", "x"))
                assert await client.call("x") == "done x"  # the re-issue
            return stack

    with caplog.at_level(logging.INFO, "opentelemetry.instrumentation.mcp_resumption.server"):
        stack = asyncio.run(scenario())
    [cut] = [e for e in stack.router.exchanges if e.severed]
    request_id = (cut.request.jsonrpc or {}).get("id")
    on_wire = [
        decoded for e in stack.router.exchanges for ev in e.events
        if (decoded := message(ev)) and decoded.get("id") == request_id and "method" not in decoded
    ]
    assert on_wire == []  # its answer never crossed the wire
    assert stack.handlers.log.count(("finished", "x")) == 2
    counted = fates(telemetry)
    assert counted.pop("undelivered") == 1
    assert set(counted) == {"delivered"}
    assert wasted(telemetry) == {("work", "2025-11-25", "none"): 1}
    assert telemetry.counts(SECOND, "gen_ai.tool.name") == {"work": 1}
    assert any(
        r.levelno == logging.WARNING and "'work'" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize("kind", LEGACY_CUT)
def test_a_cut_with_a_store_is_stored_then_replayed_by_the_resume(telemetry, kind):
    async def scenario():
        async with Stack(telemetry, store=Store(), cut="x") as stack:
            async with AppClient(kind, stack.url) as client:
                assert await client.call("x") == "done x"  # resumed and answered
            return stack

    stack = asyncio.run(scenario())
    [cut] = [e for e in stack.router.exchanges if e.severed]
    request_id = (cut.request.jsonrpc or {}).get("id")
    resumes = [e for e in stack.router.exchanges if e.request.header("last-event-id")]
    assert any(
        (decoded := message(ev)) and decoded.get("id") == request_id
        for e in resumes for ev in e.events
    ), "the answer crossed the wire on the resume"
    assert stack.handlers.log == [("started", "x"), ("finished", "x")]
    counted = fates(telemetry)
    assert counted.pop("stored") == 1
    assert counted.pop("replayed") == 1
    assert set(counted) == {"delivered"}
    assert "undelivered" not in counted


def _wait(predicate) -> None:
    event = threading.Event()
    for _ in range(int(GATE / 0.01)):
        if predicate():
            return
        event.wait(0.01)
    raise AssertionError("the handler's log never showed it")


class SseClient:
    """The installed major's legacy HTTP+SSE client (2024-11-05)."""

    def __init__(self, url: str) -> None:
        self.url = url.removesuffix("/mcp") + "/sse"
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self):
        from mcp import ClientSession
        from mcp.client.sse import sse_client

        read, write, *_ = await self._stack.enter_async_context(sse_client(self.url))
        self.session = await self._stack.enter_async_context(ClientSession(read, write))
        await self.session.initialize()
        return self

    async def __aexit__(self, *exc):
        with contextlib.suppress(Exception):  # a cut session's teardown
            await self._stack.aclose()

    async def call(self, text: str) -> str:
        async def on_progress(*_args) -> None:
            return None

        result = await self.session.call_tool(
            "work", {"text": text}, progress_callback=on_progress
        )
        return result.content[0].text


def test_a_clean_call_on_the_legacy_sse_transport_is_delivered(telemetry):
    async def scenario():
        async with Stack(telemetry, sse=True) as stack:
            async with SseClient(stack.url) as client:
                assert await client.call("clean") == "done clean"
            return stack

    stack = asyncio.run(scenario())
    answered = stack.requests_answered_on_the_wire()
    assert answered >= 2  # initialize, the call
    assert fates(telemetry) == {"delivered": answered}
    assert {p.attributes["mcp.transport"] for p in telemetry.points(DELIVERIES)} == {"sse"}
    assert wasted(telemetry) == {}


def test_a_cut_legacy_sse_session_cancels_its_handler_no_false_fate(telemetry):
    async def scenario():
        async with Stack(telemetry, sse=True, cut="x") as stack:
            client = SseClient(stack.url)
            await client.__aenter__()
            call = asyncio.ensure_future(client.call("x"))
            await asyncio.to_thread(
                _wait, lambda: stack.handlers.saw("finished", "x")
                or stack.handlers.saw("cancelled", "x")
            )
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            await client.__aexit__(None, None, None)
            return stack

    stack = asyncio.run(scenario())
    [cut] = [e for e in stack.router.exchanges if e.severed]
    assert cut.request.method == "GET"
    # Both SDKs end a legacy SSE session with its stream and cancel its
    # handlers (the handler's own log): never work done for nobody.
    assert stack.handlers.saw("cancelled", "x") and not stack.handlers.saw("finished", "x")
    counted = fates(telemetry)
    if MCP_MAJOR == 2:  # it answers "Connection closed", on the closed stream
        assert counted.pop("cancelled") == 1
    # mcp 1.x writes nothing for the cancelled handler: no answer, no fate
    assert set(counted) == {"delivered"}
    assert wasted(telemetry) == {}
