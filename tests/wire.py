"""Ground truth for the broken-call tests (tests/test_broken_calls.py,
tests/test_bridges.py): the demo's loopback router in front of a real server,
cutting the stream of one ``tools/call`` right after a chosen event, and its
record of every exchange read back as what happened to each request.

The truth comes from the router's record only (what crossed the wire to the
client), never from the plugin: which calls were cut before their answer
(broken), which answers arrived later on another stream, which calls were sent
again under a new id, and what each resume got (a status, or no answer at all).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.metadata
import inspect
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from mcp_resumption_demo.router import Backend, Exchange, ForwardedEvent, RequestHead, Route, Router

# How long a gated tool (``sdk_app(answer_when=...)``) waits for its test: a
# bound on a failing test, never what a passing one waits for.
GATE_TIMEOUT_S = 30.0
BROKEN = "mcp.client.resumption.broken_requests"
FATE = "mcp.resumption.request.fate"


@dataclass(frozen=True)
class CutRoute(Route):
    """A route that severs the client leg right after the first event ``cut_after`` accepts."""

    cut_after: Callable[[ForwardedEvent], bool] | None = None


class WireRouter(Router):
    """The demo's router, severing on an event predicate instead of an event count,
    and able to refuse a request with no HTTP answer at all (the connection closes
    before a status line: a stopped server behind an L4 balancer, as the client sees it).
    Refused requests are recorded in :attr:`refused`."""

    def __init__(self, policy, **kwargs) -> None:
        super().__init__(self._recording(policy), **kwargs)
        self.refused: list[RequestHead] = []
        # When the router read each request (in order: exchanges, then the
        # refused ones, share this sequence) and when it cut each stream.
        self.received_at: dict[int, float] = {}
        self.cut_at: dict[int, float] = {}

    def _recording(self, policy):
        async def decide(request: RequestHead):
            self.received_at[id(request)] = time.monotonic()
            route = policy(request)
            if inspect.isawaitable(route):
                route = await route
            if route is None:  # no answer: close the client's connection
                self.refused.append(request)
                raise ConnectionResetError("refused by the test's policy")
            return route

        return decide

    async def _sever(self, client, route, exchange, payload) -> None:
        self.cut_at[exchange.index] = time.monotonic()
        await super()._sever(client, route, exchange, payload)

    @staticmethod
    def _scan(scanner, piece: bytes, route: Route, exchange: Exchange) -> int | None:
        cut_after = getattr(route, "cut_after", None)
        for offset, event in scanner.feed(piece):
            exchange.events.append(event)
            if cut_after is not None and cut_after(event):
                return offset
        return None


def message(event: ForwardedEvent) -> dict | None:
    if not event.data:
        return None
    try:
        decoded = json.loads(event.data)
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


def is_progress(event: ForwardedEvent) -> bool:
    decoded = message(event)
    return bool(decoded) and decoded.get("method") == "notifications/progress"


def without_meta(params: object) -> object:
    if isinstance(params, dict):
        return {key: value for key, value in params.items() if key != "_meta"}
    return params


@dataclass
class Call:
    """One tools/call as the wire showed it."""

    id: object
    params: object
    exchange: Exchange
    answered_on: list[int] = dataclasses.field(default_factory=list)  # exchange indexes

    @property
    def cut(self) -> bool:
        """Its POST stream was severed before its answer crossed it."""
        return self.exchange.severed and self.exchange.index not in self.answered_on


class Truth:
    """What the router's record says about every tools/call of a run."""

    def __init__(self, router: WireRouter) -> None:
        self.exchanges = list(router.exchanges)
        self.refused = list(router.refused)
        self._received_at = router.received_at
        self._cut_at = router.cut_at
        self.calls: list[Call] = []
        for exchange in self.exchanges:
            body = exchange.request.jsonrpc
            if exchange.request.method == "POST" and body and body.get("method") == "tools/call":
                self.calls.append(Call(body.get("id"), body.get("params"), exchange))
        by_id = {json.dumps(call.id): call for call in self.calls}
        for exchange in self.exchanges:
            for event in exchange.events:
                decoded = message(event)
                answer = decoded and "method" not in decoded
                if answer and ("result" in decoded or "error" in decoded):
                    call = by_id.get(json.dumps(decoded.get("id")))
                    if call is not None:
                        call.answered_on.append(exchange.index)
        self.resumes = [
            exchange for exchange in self.exchanges
            if exchange.request.method == "GET" and exchange.request.header("last-event-id")
        ]
        self.refused_resumes = [r for r in self.refused if r.header("last-event-id")]

    @property
    def cut(self) -> list[Call]:
        return [call for call in self.calls if call.cut]

    def reissues_of(self, call: Call) -> list[Call]:
        return [
            other for other in self.calls
            if other.exchange.index > call.exchange.index and other.id != call.id
            and json.dumps(without_meta(other.params), sort_keys=True)
            == json.dumps(without_meta(call.params), sort_keys=True)
        ]

    def fate(self, call: Call) -> str | None:
        """The fate the wire proves for a cut call: ``answered`` (its answer came
        on another stream), ``reissued`` (same params, new id), else ``lost``.
        None for a call that was not cut."""
        if not call.cut:
            return None
        if any(index != call.exchange.index for index in call.answered_on):
            return "answered"
        if self.reissues_of(call):
            return "reissued"
        return "lost"

    def reissued_after(self, call: Call) -> float:
        """Seconds from the cut of ``call``'s stream to the router reading its
        first re-issue: the reissue window must hold it."""
        [reissue, *_] = self.reissues_of(call)
        return (self._received_at[id(reissue.exchange.request)]
                - self._cut_at[call.exchange.index])

    def fates(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for call in self.calls:
            fate = self.fate(call)
            if fate is not None:
                totals[fate] = totals.get(fate, 0) + 1
        return totals

    def event_ids_on(self, call: Call) -> list[str]:
        return [event.id for event in call.exchange.events if event.id]

    def any_severed(self) -> bool:
        return any(exchange.severed for exchange in self.exchanges)


def route_cutting_first_call(backend: Backend, cut_after=is_progress):
    """A policy: every request to ``backend``; the first tools/call's stream is
    cut right after its first progress notification (its answer not yet sent)."""
    state = {"cut": False}

    def policy(request: RequestHead) -> Route:
        if request.jsonrpc_method == "tools/call" and not state["cut"]:
            state["cut"] = True
            return CutRoute(backend, cut_after=cut_after)
        return Route(backend)

    return policy


async def wait_until(predicate: Callable[[], object], timeout: float):
    """Poll ``predicate`` (an in-memory metric reader) until it is truthy or
    ``timeout`` passes, and return its last value: the test then compares it
    with the wire's truth, so that a count that never came shows as what it was."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)


def fates(telemetry) -> dict[str, int]:
    return telemetry.fates()


def assert_reissued(truth: Truth, call: Call, window: float, why: str = "") -> None:
    """The wire shows ``call`` re-issued once, answered, inside ``window``."""
    assert truth.fate(call) == "reissued"
    [reissue] = truth.reissues_of(call)
    assert reissue.answered_on == [reissue.exchange.index], why or "the re-issue was answered"
    after = truth.reissued_after(call)
    assert after < window, f"re-issued {after:.2f} s after the cut: inside the window"


def orphan_logs(telemetry) -> list:
    return [
        record for record in telemetry.gap_logs()
        if record.log_record.attributes.get("mcp.resumption.gap.kind") == "orphaned_request"
    ]


# ================================================================ the clients

MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
# The clients of each major: mcp 2.x's Client(url) in its default mode (it
# probes server/discover and speaks 2026-07-28: no session, no event ids) and in
# mode="legacy" (2025-11-25, resumable); mcp 1.x's ClientSession (2025-11-25).
MODERN, LEGACY, MCP1 = "mcp2-default", "mcp2-legacy", "mcp1"
CLIENTS = [
    pytest.param(MODERN, marks=pytest.mark.mcp2, id=MODERN),
    pytest.param(LEGACY, marks=pytest.mark.mcp2, id=LEGACY),
    pytest.param(MCP1, marks=pytest.mark.mcp1, id=MCP1),
]
RESUMABLE_CLIENTS = CLIENTS[1:]
MODES = ["observe", "enforce"]


class AppClient:
    """One client of ``kind`` on ``url``, as an application uses it: it calls the
    tool ``work`` (with a progress callback, so that the answer comes as a
    stream), and gives up on a call after ``timeout`` seconds."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> AppClient:
        if self.kind == MCP1:
            from mcp import ClientSession
            from mcp.client.streamable_http import streamablehttp_client

            read, write, *_ = await self._stack.enter_async_context(streamablehttp_client(self.url))
            self.session = await self._stack.enter_async_context(ClientSession(read, write))
            await self.session.initialize()
        else:
            from mcp import Client

            mode = "legacy" if self.kind == LEGACY else "auto"
            self.session = await self._stack.enter_async_context(Client(self.url, mode=mode))
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._stack.aclose()

    async def call(self, text: str, timeout: float = 10.0, progress: bool = True,
                   idle: float | None = None):
        """The tool's answer text; raises what the SDK raises, or TimeoutError
        when the application gives up: after ``timeout``, or ``idle`` seconds
        after the progress notification with no answer (an application's
        idle timeout: the cut, which follows the progress, starts it)."""
        progressed = asyncio.Event()

        async def on_progress(*_args) -> None:
            progressed.set()

        async def idle_timeout() -> None:
            await progressed.wait()
            await asyncio.sleep(idle)

        kwargs = {"progress_callback": on_progress} if progress else {}
        call = asyncio.ensure_future(self.session.call_tool("work", {"text": text}, **kwargs))
        never = asyncio.Event()
        watch = asyncio.ensure_future(idle_timeout() if idle is not None else never.wait())
        try:
            done, _ = await asyncio.wait({call, watch}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if call not in done:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await call
            raise TimeoutError("the application gave up on the call")
        return call.result().content[0].text


# How long an application waits for a cut call before it gives up on it:
# mcp 1.x waits on a cut stream without event ids until then (mcp 2.x raises
# at once), and it re-issues well inside a reissue window of 1 s.
GIVE_UP = 0.3


async def first_call_fails(client: AppClient) -> None:
    """The cut call does not return an answer: mcp 2.x raises at once, mcp 1.x
    waits until the application gives up (enforce may fail it sooner)."""
    try:
        answer = await client.call("x", idle=GIVE_UP if client.kind == MCP1 else None)
    except Exception:  # what the SDK raises is its business
        return
    raise AssertionError(f"the cut call returned {answer!r}")


# ================================================================ the SDK servers

if MCP_MAJOR == 1:
    from mcp.server.fastmcp import Context, FastMCP
else:
    from mcp.server.mcpserver import Context, MCPServer

from mcp.server.streamable_http import EventMessage, EventStore  # noqa: E402


class IntegerEventStore(EventStore):
    """Integer ids from one counter, replayed strictly after the cursor (the
    SDK's contract). ``lost``: an instance that lost every cursor (it answers
    ``None``, seed 000). ``reset_on_replay``: the counter starts over at the
    replay, as an instance that lost its state would number the same events."""

    def __init__(self, *, lost: bool = False, reset_on_replay: bool = False) -> None:
        self.events: list[tuple[str, str, object]] = []
        self.counter = iter(range(100, 10**9))
        self.lost = lost
        self.reset_on_replay = reset_on_replay
        self.replays = 0

    async def store_event(self, stream_id, message):
        event_id = str(next(self.counter))
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id, send_callback):
        self.replays += 1
        ids = [event_id for event_id, _, _ in self.events]
        if self.lost or last_event_id not in ids:
            return None
        if self.reset_on_replay:
            self.counter = iter(range(1, 10**9))
        index = ids.index(last_event_id)
        stream_id = self.events[index][1]
        for event_id, stream, message in self.events[index + 1 :]:
            if stream == stream_id and message is not None:
                if self.reset_on_replay:
                    event_id = str(next(self.counter))
                await send_callback(EventMessage(message, event_id))
        return stream_id


def sdk_app(store: EventStore | None = None, *, json_response: bool = False,
            polling: bool = False, retry_ms: int = 200, idempotent: bool = False,
            answer_when: threading.Event | None = None):
    """The installed major's streamable-HTTP server with one tool, ``work``: it
    reports progress, then (``polling``) closes its SSE stream on purpose, and
    answers a moment later (after the cut that follows the progress event).
    ``answer_when``: it answers when the test sets that event (the server runs
    in a thread of its own), not after a pause.
    ``idempotent``: ``tools/list`` declares it so (``idempotentHint``)."""
    if MCP_MAJOR == 1:
        from mcp.types import ToolAnnotations

        server = FastMCP("broken-calls", event_store=store, retry_interval=retry_ms,
                         json_response=json_response)
    else:
        from mcp_types import ToolAnnotations

        server = MCPServer("broken-calls")

    annotations = ToolAnnotations(idempotentHint=True) if idempotent else None

    @server.tool(annotations=annotations)
    async def work(text: str, ctx: Context) -> str:
        await ctx.report_progress(1, 2)
        if polling:
            await ctx.close_sse_stream()
        if answer_when is None:
            await asyncio.sleep(0.05)
        elif not await asyncio.to_thread(answer_when.wait, GATE_TIMEOUT_S):
            raise RuntimeError("the test never let the tool answer")
        return "done " + text

    if MCP_MAJOR == 1:
        return server.streamable_http_app()
    return server.streamable_http_app(event_store=store, retry_interval=retry_ms,
                                      json_response=json_response)


class Fleet:
    """The router's policy for one SDK server: every request goes to the current
    backend; the first tools/call is cut after its progress event (``cut``);
    ``at_resume`` (async, optional) runs once at the first resume, before it is
    routed (stop or replace the server there), and may return what to do with
    resumes from then on: a Backend to route them to, or None for no answer."""

    def __init__(self, backend: Backend, *, cut: bool = True, at_resume=None) -> None:
        self.backend = backend
        self.cut = cut
        self.at_resume = at_resume
        self.resume_target: Backend | None = backend
        self._resumed = False

    async def __call__(self, request: RequestHead) -> Route | None:
        if request.jsonrpc_method == "tools/call" and self.cut:
            self.cut = False
            return CutRoute(self.backend, cut_after=is_progress)
        if request.header("last-event-id") and self.at_resume is not None:
            if not self._resumed:
                self._resumed = True
                self.resume_target = await self.at_resume()
            return None if self.resume_target is None else Route(self.resume_target)
        return Route(self.backend)


@contextlib.asynccontextmanager
async def sdk_stack(app, **fleet):
    """The SDK server on loopback behind a WireRouter: (router, fleet, backend)."""
    from mcp_resumption_demo.loopback import LoopbackServer

    backend = await LoopbackServer(app, name="sdk").astart()
    policy = Fleet(Backend("sdk", backend.port), **fleet)
    router = await WireRouter(policy).start()
    try:
        yield router, policy, backend
    finally:
        await router.close()
        await asyncio.to_thread(backend.close)


def instrument_env(monkeypatch, mode: str, confirm: float) -> None:
    """The plugin's settings as a deployment sets them: environment variables."""
    monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_MODE", mode)
    monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT", str(confirm))
