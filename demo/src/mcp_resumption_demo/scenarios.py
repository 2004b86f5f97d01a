# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""The seed scenarios, reproduced on real sockets, each with its ground truth.

Every scenario starts its own servers (loopback threads) and router, drives a
client through the failure and returns a :class:`ScenarioWire`: what the
client saw on the wire. The ground truth (``expected_gaps``,
``expected_outcome``) is what a correct detector must report for it; the
names are the gap kinds and outcomes of the README. Nothing here detects anything.

Raw clients go through ``httpx_sse.EventSource.aiter_sse`` (mcp 1.x) or
``httpx2.EventSource`` (mcp 2.x); SDK clients through the installed SDK's
streamable-HTTP transport and its own automatic reconnection.

To add a family of rows: a module with a ``SCENARIOS`` tuple of
:class:`Scenario` (``ts_scenarios`` is one), named in ``SCENARIO_MODULES``.
A row that needs something the machine may lack gives ``prepare``, which
says why it cannot run (the demo then shows it as skipped, never as a pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import itertools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .clients import (
    MCP_MAJOR,
    SDK_MAX_RECONNECTION_ATTEMPTS,
    SESSION_PROTOCOL_VERSION,
    TRANSPORT_ERRORS,
    LegacyRawClient,
    ToolOutcome,
    WireEvent,
    new_http_client,
    open_sse,
    post_jsonrpc,
    response_id,
    sdk_streamable_session,
)
from .fates import broken_request_fates, wire_counts
from .loopback import LoopbackServer, close_all
from .router import Backend, Exchange, Policy, RequestHead, Route, Router
from .servers import (
    EventIdAllocator,
    FleetInstance,
    IntEventStore,
    PrefixedEventStore,
    ResetEventStore,
    UuidEventStore,
    sdk_streamable_app,
)

__all__ = [
    "GAP_KINDS",
    "OUTCOMES",
    "SUBSCRIPTION_LOST",
    "ResumeAttempt",
    "Scenario",
    "ScenarioWire",
    "all_scenarios",
    "get_scenario",
    "run_scenario",
]

# The README (the values of mcp.resumption.gap.kind / mcp.resumption.outcome).
GAP_KINDS: Final = (
    "session_changed",
    "id_regression",
    "replay_unconfirmed",
    "id_reused",
    "drain_race",
    "replay_contract_violation",
    "orphaned_request",
    "foreign_replay",
)
# The kind of the resumption.gap event of a lost subscription: an event, but
# never counted on the gaps counter (it has a counter of its own).
SUBSCRIPTION_LOST: Final = "subscription_lost"
OUTCOMES: Final = (
    "resumed",
    "caught_up",
    "gap",
    "reinitialized",
    "rejected",
    "unverifiable",
    "failed",
    "not_resumable",
)

# The legacy session of every fleet scenario: endpoint, initialize result,
# tools/list result, a log line, then the tools/call result is the 5th event.
_EVENTS_UP_TO_RESULT: Final = 5
_QUERY: Final = "quarterly revenue"
_EMPTY_RETRIES: Final = 3
# Priming event + the first notification of `slow`: the cut falls mid-call.
_SDK_EVENTS_BEFORE_CUT: Final = 2
_SLOW_STEPS: Final = 3
# Only a guard against a demo bug: no scenario waits for it to expire.
_GUARD_TIMEOUT_S: Final = 10.0
# poll_store_reset: the server's retry:, and the empty answers after which the
# application stops waiting (fewer than the 3 bad resumes that page).
_POLL_RETRY_MS: Final = 300
_POLL_EMPTY_ANSWERS: Final = 2


@dataclass
class ResumeAttempt:
    """One reconnect as it crossed the wire."""

    status: int
    last_event_id_sent: str | None
    session_id_sent: str | None
    session_id_received: str | None
    events: list[WireEvent] = field(default_factory=list)
    read: bool = True

    @property
    def first_event_id(self) -> str | None:
        return self.events[0].id if self.events else None

    @property
    def event_ids(self) -> list[str | None]:
        return [e.id for e in self.events]


@dataclass
class ScenarioWire:
    """What the client saw on the wire, before and after the break.

    ``received_before``: the events of the stream that broke (``consumed``:
    the application applied it). ``in_flight``: JSON-RPC requests (id ->
    method) whose response the application had not consumed when it broke.
    ``exchanges``: the router's log of every request, the wire as the load
    balancer saw it. ``fates``, where a row gives them: the fate of each
    broken request (``answered``, ``reissued``, ``lost``: how many), read
    from that log; the demo checks the plugin's count against it.
    ``counts``, where a row gives them: the re-issues by risk and by what
    the server declared, the calls that ran twice and the lost
    subscriptions, read from the same log (:func:`.fates.wire_counts`) and
    checked the same way.
    """

    name: str
    mcp_major: int
    transport_before: str
    session_id_before: str | None = None
    received_before: list[WireEvent] = field(default_factory=list)
    severed: bool = False
    in_flight: dict[int | str, str] = field(default_factory=dict)
    resumes: list[ResumeAttempt] = field(default_factory=list)
    session_id_after: str | None = None
    reinitialized: bool = False
    tool_result: ToolOutcome | None = None
    exchanges: list[Exchange] = field(default_factory=list)
    fates: dict[str, int] | None = None
    counts: dict[str, dict[str, int]] | None = None
    # How the application saw a subscription end (the exception it caught).
    application_saw: str | None = None
    # The rows through mcp-resumption-proxy: the upstream router's log (proxy
    # to server), what the proxy counted by leg (``leg|metric|value``) and
    # what the two routers' logs say it must count.
    upstream_exchanges: list[Exchange] = field(default_factory=list)
    legs: dict[str, int] | None = None
    legs_on_the_wire: dict[str, int] | None = None
    # The rows seen from the server alone: what the server half counted
    # (fates other than delivered, calls run for nobody) and what the wire
    # and the handler's own log say it must count.
    server_verdicts: dict[str, int] | None = None
    server_verdicts_on_the_wire: dict[str, int] | None = None

    @property
    def cursor(self) -> str | None:
        """The Last-Event-ID of the first reconnect."""
        return self.resumes[0].last_event_id_sent if self.resumes else None

    @property
    def resume(self) -> ResumeAttempt:
        return self.resumes[0]

    def record_before(self, client: Any) -> None:
        """What the client held when its stream broke."""
        self.session_id_before = client.session_id
        self.received_before = list(client.received)

    def resumed_once(self, attempt: ResumeAttempt, exchanges: list[Exchange]) -> ScenarioWire:
        """Close the record of a scenario with a single reconnect."""
        self.resumes.append(attempt)
        self.session_id_after = attempt.session_id_received
        self.exchanges = exchanges
        return self


@dataclass(frozen=True)
class Scenario:
    """A seed scenario and its ground truth.

    ``expected_gaps``: the kinds of the ``resumption.gap`` events a correct
    detector writes (a gap kind of the README, or ``subscription_lost``);
    ``expected_outcome``: the resume outcome among those the row's attempts
    get, or None where no attempt may be counted at all (a subscription is
    no call, and its loss no resume).

    ``prepare``, if given, runs before the scenario (installing what it needs)
    and returns None when it can run, or why it cannot here ("node not
    found"): the demo then shows the row as skipped with that reason.

    The rows of the Events extension (``events_scenarios``) expect the kinds
    of ``mcp.events.gap.kind`` their breaks are counted by (a loss among
    them is also a ``resumption.gap`` event), and name in ``event_series``
    the (delivery, event type) their client subscribes to: the runner
    starts those series at 0 before a scrape, as it does each server's.
    """

    name: str
    happened: str
    expected_gaps: tuple[str, ...]
    expected_outcome: str | None
    run: Callable[[], Awaitable[ScenarioWire]]
    prepare: Callable[[], str | None] | None = None
    event_series: tuple[tuple[str, str], ...] = ()


# -- staging: servers, router, teardown -------------------------------------------------

# Sockets, bound and held, that the next scenarios' routers listen on, in
# order (the runner reserves their ports to announce the servers before a
# scrape: held, so that no other program takes a port meanwhile); empty: any
# free port.  The router is what the client connects to, so its port is the
# server.port.
router_sockets: list[socket.socket] = []
last_router_port = 0


class _Stage:
    """The servers and the router of one scenario; everything stops on exit."""

    def __init__(self) -> None:
        self._servers: list[LoopbackServer] = []
        self.router: Router | None = None

    async def serve(self, name: str, app: Any) -> Backend:
        server = LoopbackServer(app, name=name)
        self._servers.append(server)
        await server.astart()
        return Backend(name=name, port=server.port)

    async def route(self, policy: Policy) -> Router:
        global last_router_port
        sock = router_sockets.pop(0) if router_sockets else None
        self.router = await Router(policy).start(sock)
        last_router_port = self.router.port
        return self.router

    async def close(self) -> None:
        # The router first: cutting its connections ends every stream a backend
        # still serves, so the servers then stop without a graceful-shutdown wait.
        if self.router is not None:
            await self.router.close()
        await asyncio.to_thread(close_all, self._servers)


@contextlib.asynccontextmanager
async def _staged() -> AsyncIterator[_Stage]:
    stage = _Stage()
    try:
        yield stage
    finally:
        await stage.close()


def _legacy_policy(legacy: Backend, streamable: Backend) -> Policy:
    """The migrating balancer: legacy paths to the legacy listener, ``/mcp`` to *streamable*.

    The legacy stream is cut by the idle timeout right after the tools/call result.
    """

    def policy(request: RequestHead) -> Route:
        if request.path == "/sse":
            return Route(legacy, sever_after_events=_EVENTS_UP_TO_RESULT)
        if request.path.startswith("/messages"):
            return Route(legacy)
        return Route(streamable)

    return policy


# -- raw client steps -------------------------------------------------------------------


async def _legacy_call(client: LegacyRawClient, *, apply_result: bool) -> int:
    """Handshake, POST tools/call search_index, read up to its result (the 5th event)."""
    await client.handshake()
    request_id = await client.request(
        "tools/call", {"name": "search_index", "arguments": {"query": _QUERY}}
    )
    while True:
        event = await client.next_event()
        if event is None:
            raise RuntimeError("legacy stream ended before the tools/call result")
        if response_id(event) == request_id:
            event.consumed = apply_result
            return request_id
        event.consumed = True


async def _read_until_cut(client: LegacyRawClient) -> bool:
    """Ask for the next event after the result: the idle timeout has cut the stream."""
    try:
        event = await client.next_event()
    except TRANSPORT_ERRORS:
        return True
    raise RuntimeError(f"expected the router to sever the stream, got {event!r}")


async def _resume(
    http: Any,
    url: str,
    *,
    last_event_id: str | None,
    session_id: str | None,
    apply: Callable[[WireEvent], bool] = lambda event: True,
    read: bool = True,
    stop: Callable[[WireEvent], bool] = lambda event: False,
    protocol_version: str | None = None,
) -> ResumeAttempt:
    """GET *url* with Last-Event-ID (+ Mcp-Session-Id) and read what it answers."""
    headers = {"accept": "text/event-stream"}
    if last_event_id is not None:
        headers["last-event-id"] = last_event_id
    if session_id is not None:
        headers["mcp-session-id"] = session_id
    if protocol_version is not None:
        headers["mcp-protocol-version"] = protocol_version
    async with open_sse(http, "GET", url, headers=headers) as stream:
        attempt = ResumeAttempt(
            status=stream.status,
            last_event_id_sent=last_event_id,
            session_id_sent=session_id,
            session_id_received=stream.header("mcp-session-id"),
            read=read,
        )
        if not read or stream.status != 200 or not stream.is_event_stream:
            return attempt  # closed without asking the EventSource for any event
        while (sse := await stream.next_event()) is not None:
            event = WireEvent(id=sse.id, event=sse.event, data=sse.data)
            attempt.events.append(event)
            event.consumed = not event.is_priming and apply(event)
            if stop(event):
                break
    return attempt


@dataclass
class _RawStreamable:
    """A raw streamable-HTTP session: POSTs whose answers are read through EventSource."""

    http: Any
    url: str
    session_id: str | None = None
    next_id: int = 1
    received: list[WireEvent] = field(default_factory=list)

    def _headers(self) -> dict[str, str]:
        headers = {"mcp-protocol-version": SESSION_PROTOCOL_VERSION}
        if self.session_id is not None:
            headers["mcp-session-id"] = self.session_id
        return headers

    async def request(self, method: str, params: Mapping[str, object]) -> list[WireEvent]:
        """POST a request and read (and apply) its SSE answer up to the response."""
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": dict(params)}
        self.next_id += 1
        headers = self._headers() if method != "initialize" else {}
        async with open_sse(self.http, "POST", self.url, headers=headers, json=message) as stream:
            if stream.status != 200 or not stream.is_event_stream:
                raise RuntimeError(f"{method} answered {stream.status}")
            self.session_id = stream.header("mcp-session-id") or self.session_id
            events = []
            while (sse := await stream.next_event()) is not None:
                event = WireEvent(id=sse.id, event=sse.event, data=sse.data)
                event.consumed = not event.is_priming
                events.append(event)
                if response_id(event) == message["id"]:
                    break
        self.received.extend(events)
        return events

    async def handshake(self) -> None:
        await self.request(
            "initialize",
            {
                "protocolVersion": SESSION_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "demo-raw-streamable-client", "version": "0"},
            },
        )
        notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        response = await post_jsonrpc(self.http, self.url, notification, self._headers())
        if response.status_code != 202:
            raise RuntimeError(f"notifications/initialized answered {response.status_code}")

    @property
    def cursor(self) -> str | None:
        return next((e.id for e in reversed(self.received) if e.id is not None), None)


# -- wire records from the router's log (for the SDK-driven scenarios) ----------------


def _events_of(exchange: Exchange, request_id: object = None) -> list[WireEvent]:
    """The events the SDK read from *exchange*: all forwarded ones, up to the response.

    The SDK hands every data event to its session (a priming event has nothing
    to apply) and stops reading at the response to *request_id*; bytes the
    router forwarded after it were never read.
    """
    events = []
    for forwarded in exchange.events:
        event = WireEvent(forwarded.id, forwarded.event, forwarded.data, bool(forwarded.data))
        events.append(event)
        if request_id is not None and response_id(event) == request_id:
            break
    return events


def _attempt_of(exchange: Exchange, request_id: object) -> ResumeAttempt:
    return ResumeAttempt(
        status=exchange.status or 0,
        last_event_id_sent=exchange.last_event_id_sent,
        session_id_sent=exchange.session_id_sent,
        session_id_received=exchange.session_id_received,
        events=_events_of(exchange, request_id),
    )


def _initialize_session(exchanges: list[Exchange], after: int = 0) -> str | None:
    """The Mcp-Session-Id the server gave the first initialize at or after index *after*."""
    return next(
        (
            x.session_id_received
            for x in exchanges[after:]
            if x.request.jsonrpc_method == "initialize"
        ),
        None,
    )


def _resumes(exchanges: list[Exchange]) -> list[Exchange]:
    return [x for x in exchanges if x.last_event_id_sent is not None]


async def _abandon(call: asyncio.Future[Any], router: Router) -> None:
    """The application stops waiting for *call*.

    mcp 2.x then POSTs a courtesy ``notifications/cancelled``; the session's
    DELETE must not race it, or the SDK server logs "Error handling POST
    request" for a session it is closing. So wait until it has been answered.
    """
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    if MCP_MAJOR >= 2:
        await router.wait_for(
            lambda xs: any(
                x.request.jsonrpc_method == "notifications/cancelled" and x.finished.is_set()
                for x in xs
            )
        )


def _cut_call(exchanges: list[Exchange]) -> Exchange:
    return next(x for x in exchanges if x.severed)


# -- the scenarios ----------------------------------------------------------------------


async def _migration_reset() -> ScenarioWire:
    async with _staged() as stage:
        legacy = await stage.serve(
            "legacy-a", FleetInstance("legacy-a", allocator=EventIdAllocator(4817)).app
        )
        fresh = await stage.serve(
            "streamable-b",
            FleetInstance("streamable-b", allocator=EventIdAllocator(1), on_unknown="fresh").app,
        )
        router = await stage.route(_legacy_policy(legacy, fresh))
        wire = ScenarioWire("migration_reset", MCP_MAJOR, transport_before="sse")
        async with new_http_client() as http, LegacyRawClient(http, router.url) as client:
            await _legacy_call(client, apply_result=True)
            wire.severed = await _read_until_cut(client)
            wire.record_before(client)
            # The client migrated: it resumes on the streamable endpoint with its
            # legacy cursor and session, and applies whatever the stream carries.
            attempt = await _resume(
                http,
                f"{router.url}/mcp",
                last_event_id=client.cursor,
                session_id=client.session_id,
            )
        return wire.resumed_once(attempt, router.exchanges)


async def _shared_allocator_reuse() -> ScenarioWire:
    async with _staged() as stage:
        dual = FleetInstance("dual-a", allocator=EventIdAllocator(4817), on_known="reuse_cursor_id")
        backend = await stage.serve("dual-a", dual.app)
        router = await stage.route(_legacy_policy(backend, backend))
        wire = ScenarioWire("shared_allocator_reuse", MCP_MAJOR, transport_before="sse")
        async with new_http_client() as http, LegacyRawClient(http, router.url) as client:
            await _legacy_call(client, apply_result=True)
            wire.severed = await _read_until_cut(client)
            wire.record_before(client)
            seen = {e.id for e in client.received}

            def apply_once(event: WireEvent) -> bool:
                # The seed's clients deduplicated by event id: a reused id is dropped.
                fresh = event.id not in seen
                seen.add(event.id)
                return fresh

            attempt = await _resume(
                http,
                f"{router.url}/mcp",
                last_event_id=client.cursor,
                session_id=client.session_id,
                apply=apply_once,
            )
        return wire.resumed_once(attempt, router.exchanges)


async def _drain_race() -> ScenarioWire:
    async with _staged() as stage:
        dual = FleetInstance(
            "dual-d",
            allocator=EventIdAllocator(100, prefix="e-"),
            session_ids=lambda: "s-77",
            on_known="bridge",
        )
        backend = await stage.serve("dual-d", dual.app)
        router = await stage.route(_legacy_policy(backend, backend))
        wire = ScenarioWire("drain_race", MCP_MAJOR, transport_before="sse")
        async with new_http_client() as http, LegacyRawClient(http, router.url) as client:
            request_id = await _legacy_call(client, apply_result=False)
            result_event = client.received[-1]
            # The application starts applying e-104, its handler waits on something
            # downstream; meanwhile the idle timeout cuts the stream and the
            # handler is cancelled. The read loop never asks for another event.
            downstream_ready = asyncio.Event()

            async def apply_result() -> None:
                await downstream_ready.wait()
                result_event.consumed = True

            handler = asyncio.ensure_future(apply_result())
            sse_call = next(x for x in router.exchanges if x.request.path == "/sse")
            await router.wait_for(lambda _: sse_call.severed)
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await handler
            await client.close_stream()
            wire.severed = sse_call.severed
            wire.record_before(client)
            wire.in_flight = {request_id: "tools/call"}
            attempt = await _resume(
                http,
                f"{router.url}/mcp",
                last_event_id=client.cursor,
                session_id=client.session_id,
            )
        return wire.resumed_once(attempt, router.exchanges)


async def _empty_replay() -> ScenarioWire:
    async with _staged() as stage:
        dual = FleetInstance("dual-e", allocator=EventIdAllocator(4817), on_known="empty")
        backend = await stage.serve("dual-e", dual.app)
        router = await stage.route(_legacy_policy(backend, backend))
        wire = ScenarioWire("empty_replay", MCP_MAJOR, transport_before="sse")
        async with new_http_client() as http, LegacyRawClient(http, router.url) as client:
            await _legacy_call(client, apply_result=True)
            wire.severed = await _read_until_cut(client)
            wire.record_before(client)
            # A bounded reconnect loop: each 200 ends with no event, so it tries again.
            for _ in range(_EMPTY_RETRIES):
                attempt = await _resume(
                    http,
                    f"{router.url}/mcp",
                    last_event_id=client.cursor,
                    session_id=client.session_id,
                )
                wire.resumes.append(attempt)
                if attempt.events:
                    break
        wire.session_id_after = wire.resumes[-1].session_id_received
        wire.exchanges = router.exchanges
        return wire


def _sdk_cut_policy(
    router_ref: list[Router], stateful: Backend, resume_to: Backend, *, hold_resume: bool
) -> Policy:
    """Cut the SDK's tools/call POST stream mid-call; send its reconnects to *resume_to*.

    With *hold_resume* the balancer holds a reconnect until the cut stream's
    upstream leg has drained, so the backend has finished the call before the
    replay is read: the replay deterministically contains the result.
    """

    async def policy(request: RequestHead) -> Route:
        if request.method == "POST" and request.jsonrpc_method == "tools/call":
            return Route(stateful, sever_after_events=_SDK_EVENTS_BEFORE_CUT, drain_upstream=True)
        if request.header("last-event-id") is not None:
            if hold_resume:
                await router_ref[0].wait_for(
                    lambda xs: any(x.severed and x.upstream_finished.is_set() for x in xs)
                )
            return Route(resume_to)
        return Route(stateful)

    return policy


async def _sdk_cut_call(name: str, store: Any, *, stateless_resume: bool) -> ScenarioWire:
    async with _staged() as stage:
        stateful = await stage.serve("sdk-stateful", sdk_streamable_app(event_store=store))
        resume_to = stateful
        if stateless_resume:
            resume_to = await stage.serve("sdk-stateless", sdk_streamable_app(stateless=True))
        router_ref: list[Router] = []
        router = await stage.route(
            _sdk_cut_policy(router_ref, stateful, resume_to, hold_resume=not stateless_resume)
        )
        router_ref.append(router)
        wire = ScenarioWire(name, MCP_MAJOR, transport_before="streamable-http")
        async with sdk_streamable_session(f"{router.url}/mcp") as session:
            call = asyncio.ensure_future(
                session.call_tool("slow", {"steps": _SLOW_STEPS}, read_timeout=_GUARD_TIMEOUT_S)
            )
            if stateless_resume:
                # The SDK gives up after its reconnection attempts; mcp 2.x then
                # fails the call, mcp 1.x leaves it pending (it would wait for the
                # read timeout), so the application stops waiting at that point.
                await router.wait_for(
                    lambda xs: (
                        len([x for x in _resumes(xs) if x.finished.is_set()])
                        >= SDK_MAX_RECONNECTION_ATTEMPTS
                    )
                )
                if MCP_MAJOR < 2:
                    call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                wire.tool_result = await asyncio.wait_for(call, _GUARD_TIMEOUT_S)
        exchanges = router.exchanges
        cut = _cut_call(exchanges)
        cut_message = cut.request.jsonrpc or {}
        wire.severed = cut.severed
        wire.session_id_before = _initialize_session(exchanges)
        wire.received_before = _events_of(cut)
        request_id = _request_id(cut_message)
        wire.in_flight = {request_id: "tools/call"}
        wire.resumes = [_attempt_of(x, request_id) for x in _resumes(exchanges)]
        if wire.resumes:
            wire.session_id_after = wire.resumes[-1].session_id_received
        wire.fates = broken_request_fates(exchanges)
        wire.counts = wire_counts(exchanges)
        wire.exchanges = exchanges
        return wire


def _request_id(message: Mapping[str, object]) -> int | str:
    value = message.get("id")
    return value if isinstance(value, int | str) else -1


async def _stateless_migration() -> ScenarioWire:
    return await _sdk_cut_call("stateless_migration", IntEventStore(), stateless_resume=True)


async def _faithful_resume_int() -> ScenarioWire:
    return await _sdk_cut_call("faithful_resume_int", IntEventStore(), stateless_resume=False)


async def _faithful_resume_prefixed() -> ScenarioWire:
    return await _sdk_cut_call(
        "faithful_resume_prefixed", PrefixedEventStore(), stateless_resume=False
    )


async def _faithful_resume_uuid() -> ScenarioWire:
    return await _sdk_cut_call("faithful_resume_uuid", UuidEventStore(), stateless_resume=False)


async def _caught_up_priming() -> ScenarioWire:
    async with _staged() as stage:
        backend = await stage.serve("sdk-stateful", sdk_streamable_app(event_store=IntEventStore()))
        router = await stage.route(lambda request: Route(backend))
        wire = ScenarioWire("caught_up_priming", MCP_MAJOR, transport_before="streamable-http")
        async with new_http_client() as http:
            client = _RawStreamable(http, f"{router.url}/mcp")
            await client.handshake()
            await client.request("tools/call", {"name": "echo", "arguments": {"text": "ping"}})
            wire.record_before(client)
            # Everything was applied; the reconnect finds nothing pending and the
            # SDK answers with a priming event only, which ends the wait.
            attempt = await _resume(
                http,
                client.url,
                last_event_id=client.cursor,
                session_id=client.session_id,
                protocol_version=SESSION_PROTOCOL_VERSION,
                stop=lambda event: event.is_priming,
            )
        return wire.resumed_once(attempt, router.exchanges)


async def _sdk_poll(
    name: str,
    store: IntEventStore,
    *,
    cuts: int,
    give_up_after: int | None = None,
    retry_interval_ms: int = 50,
) -> ScenarioWire:
    """The SDK client calls the SDK server's ``poll`` tool, which closes its
    own stream *cuts* times; no router cut, the client re-polls by itself.

    ``give_up_after``: the application stops waiting for the call once that
    many re-polls have ended (the SDK would poll an empty answer for ever),
    on the router's log rather than a timer, so the count is the same each run.
    """
    async with _staged() as stage:
        backend = await stage.serve(
            "sdk-stateful",
            sdk_streamable_app(event_store=store, retry_interval_ms=retry_interval_ms),
        )
        router = await stage.route(lambda request: Route(backend))
        wire = ScenarioWire(name, MCP_MAJOR, transport_before="streamable-http")
        async with sdk_streamable_session(f"{router.url}/mcp") as session:
            call = asyncio.ensure_future(
                session.call_tool("poll", {"cuts": cuts}, read_timeout=_GUARD_TIMEOUT_S)
            )
            if give_up_after is not None:
                await router.wait_for(
                    lambda xs: len([x for x in _resumes(xs) if x.finished.is_set()])
                    >= give_up_after
                )
                await _abandon(call, router)
            with contextlib.suppress(asyncio.CancelledError):
                wire.tool_result = await call
        _record_call(wire, router.exchanges)
        return wire


def _record_call(wire: ScenarioWire, exchanges: list[Exchange]) -> None:
    """What crossed the wire for a session's one ``tools/call``: the call's
    stream and each resume of it (a re-poll, a reconnect)."""
    call = next(x for x in exchanges if x.request.jsonrpc_method == "tools/call")
    request_id = _request_id(call.request.jsonrpc or {})
    wire.session_id_before = _initialize_session(exchanges)
    wire.received_before = _events_of(call)
    wire.in_flight = {request_id: "tools/call"}
    wire.resumes = [_attempt_of(x, request_id) for x in _resumes(exchanges)]
    if wire.resumes:
        wire.session_id_after = wire.resumes[-1].session_id_received
    wire.exchanges = exchanges


async def _poll_cut_twice() -> ScenarioWire:
    return await _sdk_poll("poll_cut_twice", IntEventStore(), cuts=2)


async def _poll_store_reset() -> ScenarioWire:
    return await _sdk_poll(
        "poll_store_reset",
        ResetEventStore(),
        cuts=1,
        give_up_after=_POLL_EMPTY_ANSWERS,
        retry_interval_ms=_POLL_RETRY_MS,
    )


async def _reinitialize() -> ScenarioWire:
    async with _staged() as stage:
        legacy = await stage.serve(
            "legacy-a", FleetInstance("legacy-a", allocator=EventIdAllocator(4817)).app
        )
        fresh = await stage.serve(
            "streamable-b",
            FleetInstance("streamable-b", allocator=EventIdAllocator(1), on_unknown="fresh").app,
        )
        sdk = await stage.serve("sdk-stateful", sdk_streamable_app(event_store=IntEventStore()))
        migrate = _legacy_policy(legacy, fresh)

        def policy(request: RequestHead) -> Route:
            if request.path == "/mcp" and request.header("last-event-id") is None:
                return Route(sdk)  # the clean session lands on a healthy instance
            return migrate(request)

        router = await stage.route(policy)
        wire = ScenarioWire("reinitialize", MCP_MAJOR, transport_before="sse")
        async with new_http_client() as http, LegacyRawClient(http, router.url) as client:
            await _legacy_call(client, apply_result=True)
            wire.severed = await _read_until_cut(client)
            wire.record_before(client)
            # A different Mcp-Session-Id: the session was re-established, not
            # resumed, so the client closes the response without reading it.
            attempt = await _resume(
                http,
                f"{router.url}/mcp",
                last_event_id=client.cursor,
                session_id=client.session_id,
                read=False,
            )
        reinitialize = attempt.session_id_received != wire.session_id_before
        return await _resumed_or_reinitialized(router, wire, attempt, reinitialize=reinitialize)


async def _resumed_or_reinitialized(
    router: Router, wire: ScenarioWire, attempt: ResumeAttempt, *, reinitialize: bool
) -> ScenarioWire:
    """The row's one resume; then, where the client saw it must, a clean
    session with initialize (the SDK client), as the seeds prescribe."""
    wire.resumes.append(attempt)
    if reinitialize:
        start = len(router.exchanges)
        async with sdk_streamable_session(f"{router.url}/mcp") as session:
            await session.list_tools()
        wire.reinitialized = True
        wire.session_id_after = _initialize_session(router.exchanges, after=start)
    wire.exchanges = router.exchanges
    return wire


async def _expired_session_404() -> ScenarioWire:
    async with _staged() as stage:
        first = await stage.serve("sdk-1", sdk_streamable_app(event_store=IntEventStore()))
        restarted = await stage.serve("sdk-2", sdk_streamable_app(event_store=IntEventStore()))
        pool = [first]

        def policy(request: RequestHead) -> Route:
            if request.header("last-event-id") is not None:
                pool[0] = restarted  # sdk-1 left the pool; its sessions went with it
            return Route(pool[0])

        router = await stage.route(policy)
        wire = ScenarioWire("expired_session_404", MCP_MAJOR, transport_before="streamable-http")
        async with new_http_client() as http:
            client = _RawStreamable(http, f"{router.url}/mcp")
            await client.handshake()
            await client.request("tools/call", {"name": "echo", "arguments": {"text": "ping"}})
            wire.record_before(client)
            attempt = await _resume(
                http,
                client.url,
                last_event_id=client.cursor,
                session_id=client.session_id,
                protocol_version=SESSION_PROTOCOL_VERSION,
            )
        return await _resumed_or_reinitialized(
            router, wire, attempt, reinitialize=attempt.status == 404
        )


_SCENARIOS: Final = (
    Scenario(
        name="migration_reset",
        happened=(
            "A migration from legacy HTTP+SSE to streamable HTTP behind one load balancer. "
            "A client on the legacy instance (global ids 4817..4821, session from "
            "the endpoint event) is cut by the idle timeout after the tools/call result, "
            "reconnects on the streamable endpoint with Last-Event-ID: 4821 and its legacy "
            "session id, reaches an instance that does not know the session: 200, a fresh "
            "Mcp-Session-Id, ids restarting at 1, and the client applies those events."
        ),
        expected_gaps=("session_changed", "id_regression"),
        expected_outcome="gap",
        run=_migration_reset,
    ),
    Scenario(
        name="shared_allocator_reuse",
        happened=(
            "The same migration, failing another way. The migrated listener honours session "
            "and cursor "
            "but numbers with a per-session counter seeded off by one: the first event after "
            "Last-Event-ID: 4821 is id 4821 again with new content, and the client, which "
            "deduplicates by id, drops it."
        ),
        expected_gaps=("id_reused",),
        expected_outcome="gap",
        run=_shared_allocator_reuse,
    ),
    Scenario(
        name="drain_race",
        happened=(
            "A server that bridges legacy sessions onto streamable HTTP, and cuts idle "
            "streams. Legacy session s-77 receives e-100..e-104, e-104 being the search_index "
            "result; the idle timeout cuts the stream right after e-104 while the handler for "
            "it is still running, and cancels it. The client resumes on the streamable "
            "endpoint with Mcp-Session-Id: s-77 and Last-Event-ID: e-104; the bridging "
            "instance replays strictly after it (e-105...): the result is lost exactly once."
        ),
        expected_gaps=("drain_race", "orphaned_request"),
        expected_outcome="gap",
        run=_drain_race,
    ),
    Scenario(
        name="empty_replay",
        happened=(
            "The same migration, where a 200 proves nothing. The instance knows the session "
            "but not the cursor "
            "and answers 200 with a stream that ends without any event or marker; the "
            f"client's reconnect loop tries {_EMPTY_RETRIES} times, empty each time."
        ),
        expected_gaps=("replay_unconfirmed",),
        expected_outcome="gap",
        run=_empty_replay,
    ),
    Scenario(
        name="stateless_migration",
        happened=(
            "2026-07-28 migration. The SDK client has tools/call slow in flight on its POST "
            "stream of a stateful instance (priming event, ids); the stream is cut mid-call "
            "and the SDK's reconnects with Last-Event-ID land on a stateless instance, which "
            "cannot resume; the tool result never arrives."
        ),
        expected_gaps=("orphaned_request",),
        expected_outcome="rejected",
        run=_stateless_migration,
    ),
    Scenario(
        name="faithful_resume_int",
        happened=(
            "Control. The SDK's POST stream for tools/call slow is cut mid-call; the SDK "
            "reconnects with Last-Event-ID to the same instance, whose integer-id store "
            "replays strictly after the cursor, and the result arrives."
        ),
        expected_gaps=(),
        expected_outcome="resumed",
        run=_faithful_resume_int,
    ),
    Scenario(
        name="faithful_resume_prefixed",
        happened=(
            "Control. As faithful_resume_int, with <stream>_<n> event ids (ordered within "
            "their prefix)."
        ),
        expected_gaps=(),
        expected_outcome="resumed",
        run=_faithful_resume_prefixed,
    ),
    Scenario(
        name="faithful_resume_uuid",
        happened=(
            "Control. As faithful_resume_int, with UUID event ids: the replay is faithful but "
            "opaque ids give no ordering evidence."
        ),
        expected_gaps=(),
        expected_outcome="unverifiable",
        run=_faithful_resume_uuid,
    ),
    Scenario(
        name="caught_up_priming",
        happened=(
            "Control. Everything was applied; the client resumes with its cursor and the SDK "
            "server answers with only a priming event (an explicit end-of-replay marker)."
        ),
        expected_gaps=(),
        expected_outcome="caught_up",
        run=_caught_up_priming,
    ),
    Scenario(
        name="reinitialize",
        happened=(
            "Control. As migration_reset up to the reconnect; the client sees a different "
            "Mcp-Session-Id, closes the response without reading an event and starts a clean "
            "session with initialize (the fail-closed path)."
        ),
        expected_gaps=(),
        expected_outcome="reinitialized",
        run=_reinitialize,
    ),
    Scenario(
        name="expired_session_404",
        happened=(
            "Control. The resume GET reaches an instance that no longer knows the session and "
            "gets 404; the client re-initialises. No request was in flight."
        ),
        expected_gaps=(),
        expected_outcome="rejected",
        run=_expired_session_404,
    ),
    Scenario(
        name="poll_cut_twice",
        happened=(
            "Control. Polling (2025-11-25): the SDK server's tool closes its own SSE stream "
            "twice (close_sse_stream, after a priming event with retry:), each time after a "
            "progress notification; the SDK client reconnects with Last-Event-ID each time "
            "and the result arrives on the second reconnect. Nothing is lost."
        ),
        expected_gaps=(),
        expected_outcome="resumed",
        run=_poll_cut_twice,
    ),
    Scenario(
        name="poll_store_reset",
        happened=(
            "Polling with a loss. The SDK server's tool closes its own stream once "
            f"(close_sse_stream, after a priming event with retry: {_POLL_RETRY_MS}); "
            "while the client waits, the instance's event store is reset (restarted, "
            "evicted) and forgets every event. Each re-poll with Last-Event-ID gets 200 "
            "and an empty stream that the server ends at once; the client polls again, and "
            f"the application stops waiting after {_POLL_EMPTY_ANSWERS} empty answers. The "
            "tool result, stored after the reset, is never replayed: it is lost."
        ),
        expected_gaps=("replay_unconfirmed", "orphaned_request"),
        expected_outcome="gap",
        run=_poll_store_reset,
    ),
)


# Modules that add rows of their own, each with a ``SCENARIOS`` tuple; their
# rows follow the ones above, in this order. A new family of rows is a new
# module and one line here.
SCENARIO_MODULES: Final = (
    "mcp_resumption_demo.ts_scenarios",
    "mcp_resumption_demo.server_scenarios",
    "mcp_resumption_demo.stateless_scenarios",
    "mcp_resumption_demo.reissue_scenarios",
    "mcp_resumption_demo.bridge_scenarios",
    "mcp_resumption_demo.subscription_scenarios",
    "mcp_resumption_demo.events_scenarios",
    "mcp_resumption_demo.proxy_scenarios",
    "mcp_resumption_demo.task_scenarios",
)


@functools.cache
def all_scenarios() -> tuple[Scenario, ...]:
    """Every scenario: the seeds' (their controls last), then each module's."""
    more = (importlib.import_module(module).SCENARIOS for module in SCENARIO_MODULES)
    found = _SCENARIOS + tuple(itertools.chain.from_iterable(more))
    names = [scenario.name for scenario in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two scenarios share a name: {sorted(names)}")
    return found


def get_scenario(name: str) -> Scenario:
    for scenario in all_scenarios():
        if scenario.name == name:
            return scenario
    known = ", ".join(s.name for s in all_scenarios())
    raise KeyError(f"unknown scenario {name!r}; known: {known}")


async def run_scenario(name: str) -> ScenarioWire:
    """Run one scenario on loopback sockets and return what its client saw."""
    return await get_scenario(name).run()
