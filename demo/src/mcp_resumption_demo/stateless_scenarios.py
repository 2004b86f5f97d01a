# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Rows of breaks that nothing can resume: a stateless server's cut tools/call,
which the application re-issues or gives up on.

A family of rows of its own (``SCENARIOS``), named in ``scenarios``'s list.
Each row's truth about its broken call (its *fate*) is read from the router's
log by :func:`.fates.broken_request_fates`, never from the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

from .clients import MCP_MAJOR, SdkSession, ToolOutcome, sdk_stateless_session
from .fates import broken_request_fates, wire_counts
from .router import RequestHead, Route, Router
from .scenarios import (
    _GUARD_TIMEOUT_S,
    Scenario,
    ScenarioWire,
    _attempt_of,
    _cut_call,
    _events_of,
    _request_id,
    _resumes,
    _staged,
)
from .servers import sdk_streamable_app

__all__ = ["SCENARIOS"]

_STEPS: Final = 3
# The cut falls after the first progress notification: mid-call, and (no
# event store, or protocol 2026-07-28) with no event id received.
_EVENTS_BEFORE_CUT: Final = 1


def cut_first_call(backend: Any, **cut: Any) -> Any:
    """The balancer's idle timeout cuts the first tools/call's stream mid-call
    (the server finishes the call: only the client's leg dies); everything
    else, the re-issued call too, goes through.  ``cut``: the ``Route``'s
    own cut instead (where, and whether the router reads the answer on)."""
    cut = cut or {"sever_after_events": _EVENTS_BEFORE_CUT, "drain_upstream": True}
    taken: list[RequestHead] = []

    def policy(request: RequestHead) -> Route:
        if request.method == "POST" and request.jsonrpc_method == "tools/call" and not taken:
            taken.append(request)
            return Route(backend, **cut)
        return Route(backend)

    return policy


async def call_until_cut(session: SdkSession, router: Router) -> ToolOutcome | None:
    """Call ``slow``; its stream is cut. mcp 2.x fails the call at once
    ("SSE stream ended without a response"); mcp 1.x has no id to reconnect
    with and would wait for its read timeout, so the application stops
    waiting once the cut stream has ended (on the router's log, not a timer)."""
    call = asyncio.ensure_future(
        session.call_tool("slow", {"steps": _STEPS}, read_timeout=_GUARD_TIMEOUT_S)
    )
    await router.wait_for(lambda xs: any(x.severed and x.finished.is_set() for x in xs))
    if MCP_MAJOR < 2:
        call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        return await asyncio.wait_for(call, _GUARD_TIMEOUT_S)
    return None


async def _stateless_cut(name: str, *, reissue: bool) -> ScenarioWire:
    async with _staged() as stage:
        backend = await stage.serve("sdk-stateless", sdk_streamable_app(stateless=True))
        router = await stage.route(cut_first_call(backend))
        wire = ScenarioWire(name, MCP_MAJOR, transport_before="streamable-http")
        async with sdk_stateless_session(f"{router.url}/mcp") as session:
            wire.tool_result = await call_until_cut(session, router)
            if reissue:
                # What 2026-07-28 asks of a client whose stream broke: the same
                # call again, under a new id.
                wire.tool_result = await session.call_tool(
                    "slow", {"steps": _STEPS}, read_timeout=_GUARD_TIMEOUT_S
                )
        return record_cut(wire, router)


def record_cut(wire: ScenarioWire, router: Router) -> ScenarioWire:
    """The cut call's truth, read from the router's log."""
    exchanges = router.exchanges
    cut = _cut_call(exchanges)
    request_id = _request_id(cut.request.jsonrpc or {})
    wire.severed = cut.severed
    wire.session_id_before = cut.session_id_received
    wire.received_before = _events_of(cut)
    wire.in_flight = {request_id: "tools/call"}
    wire.resumes = [_attempt_of(x, request_id) for x in _resumes(exchanges)]
    wire.fates = broken_request_fates(exchanges)
    wire.counts = wire_counts(exchanges)
    wire.exchanges = exchanges
    return wire


async def _stateless_cut_reissued() -> ScenarioWire:
    return await _stateless_cut("stateless_cut_reissued", reissue=True)


async def _stateless_cut_lost() -> ScenarioWire:
    return await _stateless_cut("stateless_cut_lost", reissue=False)


_CLIENT: Final = (
    "The SDK client as a new user writes it (mcp 2.x: Client(url), which speaks 2026-07-28: "
    "no session, no event ids, no resumption)"
    if MCP_MAJOR >= 2
    else "The SDK client (mcp 1.x, which predates 2026-07-28: a session of 2025-11-25 "
    "against a stateless instance without an event store, so no event ids)"
)

SCENARIOS = (
    Scenario(
        name="stateless_cut_reissued",
        happened=(
            f"2026-07-28, stateless. {_CLIENT} calls tools/call slow; the balancer cuts its "
            "stream after the first progress notification, which carried no event id: "
            "nothing to resume with, so no resume is tried. The application sees the call "
            "fail and sends it again (same method and params, new id); the answer arrives. "
            "Fate: reissued."
        ),
        expected_gaps=(),
        expected_outcome="not_resumable",
        run=_stateless_cut_reissued,
    ),
    Scenario(
        name="stateless_cut_lost",
        happened=(
            "2026-07-28, stateless. As stateless_cut_reissued, but the application gives up "
            "on the failed call instead of sending it again: the tool result, which the "
            "server computed, never reaches the client. Fate: lost."
        ),
        expected_gaps=("orphaned_request",),
        expected_outcome="not_resumable",
        run=_stateless_cut_lost,
    ),
)
