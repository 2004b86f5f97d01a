# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Rows of re-issued calls that may run, or did run, twice.

The specification has no idempotency key, and before 2026-07-28 a server
does not take a closed stream for cancellation: a call the application sends
again after its stream broke may already have run. Both rows speak
2025-11-25 through the installed SDK's client (mcp 2.x
``Client(url, mode="legacy")``, mcp 1.x ``ClientSession``), which lists the
tools first (``slow`` declares neither ``idempotentHint`` nor
``readOnlyHint``). Their truth, the fate, the re-issue's risk and whether
both attempts were answered, is read from the router's log
(:mod:`.fates`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from .clients import MCP_MAJOR, WireEvent, response_id, sdk_streamable_session
from .router import Exchange, RequestHead, Route, Router
from .scenarios import (
    _GUARD_TIMEOUT_S,
    Scenario,
    ScenarioWire,
    _abandon,
    _staged,
)
from .servers import IntEventStore, sdk_streamable_app
from .stateless_scenarios import call_until_cut, cut_first_call, record_cut

__all__ = ["SCENARIOS"]

_STEPS: Final = 3
# With an event store: the priming event and the first progress notification,
# both with ids, then the cut.
_EVENTS_BEFORE_CUT: Final = 2


async def _reissue_may_run_twice() -> ScenarioWire:
    """Without an event store the session has no event ids: nothing resumes
    the cut call, and the application sends it again."""
    async with _staged() as stage:
        backend = await stage.serve("sdk-no-store", sdk_streamable_app(event_store=None))
        router = await stage.route(cut_first_call(backend))
        wire = ScenarioWire("reissue_may_run_twice", MCP_MAJOR, transport_before="streamable-http")
        async with sdk_streamable_session(f"{router.url}/mcp") as session:
            await session.list_tools()
            wire.tool_result = await call_until_cut(session, router)
            wire.tool_result = await session.call_tool(
                "slow", {"steps": _STEPS}, read_timeout=_GUARD_TIMEOUT_S
            )
        return record_cut(wire, router)


def _resumed_with_answer(exchanges: list[Exchange], request_id: object) -> bool:
    """A reconnect with Last-Event-ID forwarded the answer to ``request_id``."""
    return any(
        response_id(WireEvent(e.id, e.event, e.data)) == request_id
        for x in exchanges
        if x.last_event_id_sent is not None
        for e in x.events
    )


async def _reissue_ran_twice() -> ScenarioWire:
    """With an event store: the SDK reconnects with Last-Event-ID, but the
    balancer holds the reconnect until the application, which gave up on the
    call, has sent it again and read its answer; the resume then replays the
    first attempt's answer too."""
    async with _staged() as stage:
        backend = await stage.serve("sdk-stateful", sdk_streamable_app(event_store=IntEventStore()))
        reissue_answered = asyncio.Event()
        cut: list[RequestHead] = []

        async def policy(request: RequestHead) -> Route:
            if request.method == "POST" and request.jsonrpc_method == "tools/call" and not cut:
                cut.append(request)
                # the server finishes the call and stores its answer: only the
                # client's leg dies
                return Route(backend, sever_after_events=_EVENTS_BEFORE_CUT, drain_upstream=True)
            if request.header("last-event-id") is not None:
                await reissue_answered.wait()  # a slow failover holds the reconnect
            return Route(backend)

        router: Router = await stage.route(policy)
        wire = ScenarioWire("reissue_ran_twice", MCP_MAJOR, transport_before="streamable-http")
        async with sdk_streamable_session(f"{router.url}/mcp") as session:
            await session.list_tools()
            call = asyncio.ensure_future(
                session.call_tool("slow", {"steps": _STEPS}, read_timeout=_GUARD_TIMEOUT_S)
            )
            # The server has finished the first attempt (its answer is stored)
            # when the application gives up on it; on the router's log.
            await router.wait_for(
                lambda xs: any(x.severed and x.upstream_finished.is_set() for x in xs)
            )
            await _abandon(call, router)
            wire.tool_result = await session.call_tool(
                "slow", {"steps": _STEPS}, read_timeout=_GUARD_TIMEOUT_S
            )
            reissue_answered.set()
            first = _first_call_id(router.exchanges)
            await router.wait_for(lambda xs: _resumed_with_answer(xs, first))
            # The client has read the replay (the SDK hands the first attempt's
            # answer to a session that no longer waits for it) before it
            # leaves: its stream ended, and one more round trip went through.
            await router.wait_for(
                lambda xs: all(x.finished.is_set() for x in xs if x.last_event_id_sent)
            )
            await session.list_tools()
        return record_cut(wire, router)


def _first_call_id(exchanges: list[Exchange]) -> Any:
    first = next(x for x in exchanges if x.request.jsonrpc_method == "tools/call")
    return (first.request.jsonrpc or {}).get("id")


_CLIENT: Final = (
    'the SDK client (mcp 2.x: Client(url, mode="legacy"); mcp 1.x: ClientSession) lists '
    "the tools (slow declares neither idempotentHint nor readOnlyHint) and calls tools/call "
    "slow"
)

SCENARIOS = (
    Scenario(
        name="reissue_may_run_twice",
        happened=(
            f"2025-11-25, a session without an event store: {_CLIENT}; the balancer cuts its "
            "stream after the first progress notification, which carried no event id: "
            "nothing to resume with. The application sends the call again (same method and "
            "params, new id) and gets its answer. On 2025-11-25 a server does not take a "
            "closed stream for cancellation, so the first attempt may have run to its end "
            "too: the tool may have run twice. Fate: reissued; one re-issue, risk "
            "may_run_twice, idempotent false."
        ),
        expected_gaps=(),
        expected_outcome="not_resumable",
        run=_reissue_may_run_twice,
    ),
    Scenario(
        name="reissue_ran_twice",
        happened=(
            f"2025-11-25 with an event store: {_CLIENT}; the balancer cuts its stream after "
            "the priming event and the first progress notification, and the server finishes "
            "the call. The SDK reconnects with Last-Event-ID, but a slow failover holds the "
            "reconnect; the application gives up on the call and sends it again, and the "
            "answer arrives. Then the held resume replays the first attempt's answer as "
            "well: the tool ran twice. Fate: reissued; one re-issue (may_run_twice, "
            "idempotent false) and one call proven to run twice; the resume itself is "
            "continuous."
        ),
        expected_gaps=(),
        expected_outcome="resumed",
        run=_reissue_ran_twice,
    ),
)
