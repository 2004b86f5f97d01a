"""MCP SDK clients of the installed major (1.x on httpx + httpx-sse, 2.x on
httpx2) against the same SDK's streamable-HTTP server: the SDK's own
automatic reconnection is a resume attempt, checked like any other."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import sys
import time

import pytest

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

from mcp.server.streamable_http import EventStore

from server_harness import Running, call_slow
from wire import IntegerEventStore

MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])

if MCP_MAJOR == 1:
    from mcp.server.fastmcp import Context, FastMCP
else:
    from mcp.server.mcpserver import Context, MCPServer


def build_app(store: EventStore):
    if MCP_MAJOR == 1:
        server = FastMCP("resume-test", event_store=store, retry_interval=200)
    else:
        server = MCPServer("resume-test")

    @server.tool()
    async def slow(ctx: Context) -> str:
        await ctx.info("working")
        # The client must reconnect with Last-Event-ID; the result is stored
        # long before it does (retry 200 ms), so the replay carries it.  (The
        # SDK servers have a replay-to-live window that can lose a result
        # produced during the reconnect; that is not what this test is about.)
        await ctx.close_sse_stream()
        return "done"

    if MCP_MAJOR == 1:
        return server.streamable_http_app()
    return server.streamable_http_app(event_store=store, retry_interval=200)


def is_error(result) -> bool:
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", False))


def run_slow_call(telemetry, store, timeout: float = 10, **settings):
    running = Running(build_app(store))
    try:
        with telemetry.instrumented(**settings):
            return asyncio.run(call_slow(running.url, timeout))
    finally:
        running.close()


def test_sdk_reconnection_with_faithful_replay_is_resumed(telemetry):
    result = run_slow_call(telemetry, IntegerEventStore())
    assert not is_error(result)
    assert result.content[0].text == "done"
    assert telemetry.gap_kinds() == {}
    # The tool closes its stream on purpose and the client resumes: a poll,
    # not a break.
    assert telemetry.fates() == {}
    outcomes = telemetry.outcomes()
    assert set(outcomes) <= {"resumed", "caught_up"} and sum(outcomes.values()) >= 1
    [span, *_] = telemetry.resume_spans()
    assert span.attributes["mcp.transport"] == "streamable-http"


def test_sdk_reconnection_to_a_reset_counter_is_a_gap(telemetry):
    # What the SDK makes of the reset is its business; ours is to report it.
    result = None
    with contextlib.suppress(Exception):
        result = run_slow_call(telemetry, IntegerEventStore(reset_on_replay=True))
    assert telemetry.gap_kinds().get("id_regression", 0) >= 1
    assert "gap" in telemetry.outcomes()
    # The reset stream still carries the tool's result, which the client got:
    # observed, so never orphaned.
    assert result is not None and result.content[0].text == "done", result
    assert "orphaned_request" not in telemetry.gap_kinds()
    assert telemetry.fates() == {}  # a poll's request, answered: never broken


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def test_sdk_enforce_mode_fails_the_pending_call(telemetry):
    started = time.monotonic()
    with pytest.raises(BaseException) as raised:
        result = run_slow_call(
            telemetry, IntegerEventStore(reset_on_replay=True), mode="enforce", confirm_timeout=2
        )
        raise AssertionError(f"the call returned {result!r}")
    assert time.monotonic() - started < 5, "the caller is not left waiting"
    [error] = leaves(raised.value)
    assert type(error).__name__ in ("McpError", "MCPError")
    assert "ResumptionGapError: " in str(error)
    assert "event id regression" in str(error)
    assert telemetry.gap_kinds().get("id_regression") == 1



def test_polling_server_that_lost_the_cursor_is_replay_unconfirmed(telemetry):
    """Seed 000 on a 2025-11-25 server that polls: the tool closes its stream
    (after a priming event with retry:), the client resumes, and the store
    knows no cursor; the SDK server answers 200 with a stream that ends with
    nothing, and the client resumes again and again.  Each of those polls is
    the empty replay: not a quiet poll the server held open."""
    store = IntegerEventStore(lost=True)
    with contextlib.suppress(Exception):
        run_slow_call(telemetry, store, timeout=2, confirm_timeout=1)
    assert store.replays >= 1, "the client resumed and the store had no cursor"
    kinds = telemetry.gap_kinds()
    assert kinds.get("replay_unconfirmed", 0) >= 1
    assert set(kinds) <= {"replay_unconfirmed", "orphaned_request"}
    assert set(telemetry.outcomes()) == {"gap"}
