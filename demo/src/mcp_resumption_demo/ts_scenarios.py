# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""Scenarios on the TypeScript MCP SDK's server, the server most MCP users run.

``StreamableHTTPServerTransport`` with the package's example
``InMemoryEventStore``; its ``poll`` tool closes its own SSE stream
(``closeSSEStream``, protocol 2025-11-25) and the installed Python SDK's
client re-polls with ``Last-Event-ID``, through the demo's router. The
server's own wire log (what it stored, sent and replayed) is the ground truth
of what was lost. Without node the rows are skipped, and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from .clients import MCP_MAJOR, sdk_streamable_session
from .router import Backend, Route
from .scenarios import (
    Scenario,
    ScenarioWire,
    _abandon,
    _record_call,
    _staged,
)
from .typescript_server import TsServer, prepare

__all__ = ["SCENARIOS", "TsScenarioWire"]

_RETRY_MS: Final = 100  # the priming event's retry: (the TS SDK has no default)
_AWAY_MS: Final = 400  # how long the tool goes on after each close
_KEEPALIVE_MS: Final = 100
_GUARD_TIMEOUT_S: Final = 10.0  # only against a demo bug: no row waits for it


@dataclass
class TsScenarioWire(ScenarioWire):
    """A TypeScript row's wire: the client's side, and the server's own log."""

    server_wire: list[dict[str, Any]] = field(default_factory=list)

    def stored(self, request_id: object) -> list[dict[str, Any]]:
        """What the store kept for the request's stream (not the priming rows)."""
        call = next(
            e
            for e in self.server_wire
            if e["kind"] == "request" and (e["body"] or {}).get("id") == request_id
        )
        first = next(
            e for e in self.server_wire if e["kind"] == "frame" and e["rid"] == call["rid"]
        )
        stream = first["id"].rsplit("_", 2)[0]  # <stream uuid>_<epoch ms>_<random>
        return [
            e
            for e in self.server_wire
            if e["kind"] == "store" and e["streamId"] == stream and e["message"]
        ]

    def sent_ids(self) -> set[str]:
        """The id of every SSE event the server wrote."""
        return {e["id"] for e in self.server_wire if e["kind"] == "frame" and e["id"]}

    def lost(self, request_id: object) -> list[dict[str, Any]]:
        """Stored messages of the request's stream that no response carried."""
        sent = self.sent_ids()
        return [e for e in self.stored(request_id) if e["eventId"] not in sent]


@contextlib.asynccontextmanager
async def _ts_server(**env: str) -> AsyncIterator[TsServer]:
    server = await asyncio.to_thread(TsServer, **env)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.close)


async def _until(predicate: Callable[[], bool], timeout: float = _GUARD_TIMEOUT_S) -> None:
    """Wait for the server's log to show something (it is a file, so: look often)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the TypeScript server's wire log never showed it")
        await asyncio.sleep(0.02)


async def _ts_poll(
    name: str,
    arguments: dict[str, object],
    *,
    give_up_when: Callable[[TsServer], bool] | None = None,
) -> TsScenarioWire:
    """The SDK client calls the TS server's ``poll`` tool through the router.

    ``give_up_when``: the application stops waiting for the call once the
    server's log shows this (the TS server keeps a resume of a cursor it lost
    open for ever, so the client would wait for ever).
    """
    env = {"RETRY_MS": str(_RETRY_MS), "KEEPALIVE_MS": str(_KEEPALIVE_MS)}
    async with _staged() as stage, _ts_server(**env) as server:
        router = await stage.route(lambda request: Route(Backend("ts-sdk", server.port)))
        wire = TsScenarioWire(name, MCP_MAJOR, transport_before="streamable-http")
        async with sdk_streamable_session(f"{router.url}/mcp") as session:
            call = asyncio.ensure_future(
                session.call_tool("poll", arguments, read_timeout=_GUARD_TIMEOUT_S)
            )
            if give_up_when is not None:
                await _until(lambda: give_up_when(server))
                await _abandon(call, router)
            with contextlib.suppress(asyncio.CancelledError):
                wire.tool_result = await asyncio.wait_for(call, _GUARD_TIMEOUT_S)
        # The session's DELETE has been answered: the log is complete.
        wire.server_wire = server.wire()
        _record_call(wire, router.exchanges)
        return wire


async def _ts_poll_cut_twice() -> TsScenarioWire:
    return await _ts_poll("ts_poll_cut_twice", {"cuts": 2, "away_ms": _AWAY_MS})


def _result_stored_and_resume_idle(server: TsServer) -> bool:
    """The tool's answer is in the store, after the store forgot the cursor,
    and the resume has been answered with a keepalive and no event."""
    entries = server.wire()
    stored_result = any(
        e["kind"] == "store" and isinstance(e["message"], dict) and "result" in e["message"]
        for e in entries
    )
    resumes = {e["rid"] for e in entries if e["kind"] == "request" and e["lastEventId"]}
    idle = any(e["kind"] == "keepalive" and e["rid"] in resumes for e in entries)
    return stored_result and idle


async def _ts_store_lost_cursor() -> TsScenarioWire:
    return await _ts_poll(
        "ts_store_lost_cursor",
        {"cuts": 1, "forget": True, "before_result_ms": 200},
        give_up_when=_result_stored_and_resume_idle,
    )


SCENARIOS: Final = (
    Scenario(
        name="ts_poll_cut_twice",
        happened=(
            "Control, on the TypeScript MCP SDK server (npm @modelcontextprotocol/sdk, "
            "StreamableHTTPServerTransport, example InMemoryEventStore). Its tool closes "
            f"its own stream twice (closeSSEStream, after a priming event with retry: "
            f"{_RETRY_MS}); the SDK client re-polls with Last-Event-ID each time and the "
            "result arrives on the second; the server's log shows every stored event sent. "
            "Its ids (<stream uuid>_<epoch ms>_<random>) prove no order: unverifiable, "
            "never resumed."
        ),
        expected_gaps=(),
        expected_outcome="unverifiable",
        run=_ts_poll_cut_twice,
        prepare=prepare,
    ),
    Scenario(
        name="ts_store_lost_cursor",
        happened=(
            "On the TypeScript MCP SDK server: its tool closes its stream for polling and "
            "its event store then loses every event (restarted, evicted). The re-poll with "
            "Last-Event-ID gets 200 and an event stream with keepalive comments only, for "
            "ever; the tool result, stored after the loss, is never sent (the server's "
            "log shows it), and the application gives up on the call."
        ),
        expected_gaps=("replay_unconfirmed", "orphaned_request"),
        expected_outcome="gap",
        run=_ts_store_lost_cursor,
        prepare=prepare,
    ),
)
