"""A verdict line is written when its verdict is decided, and never
contradicted later (issue: what a user reads is what happened).

Through the real SDK clients that resume (mcp 2.x ``mode="legacy"``, mcp
1.x) against the same major's server with an event store, behind the
loopback router, which cuts the call's stream after its first progress
event.  The tool then sends a second progress event, which the resume
replays, and does not answer until the test has seen the ``resumed`` line:
a line written only when the call ends would never come, and the call would
time out.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from wire import (
    MCP_MAJOR,
    RESUMABLE_CLIENTS,
    AppClient,
    Context,
    IntegerEventStore,
    Truth,
    instrument_env,
    sdk_stack,
)

VERDICTS = "opentelemetry.instrumentation.mcp_resumption.verdicts"


def slow_app(store, line_seen: threading.Event):
    if MCP_MAJOR == 1:
        from mcp.server.fastmcp import FastMCP

        server = FastMCP("verdict-timing", event_store=store, retry_interval=200)
    else:
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("verdict-timing")

    @server.tool()
    async def work(text: str, ctx: Context) -> str:
        await ctx.report_progress(1, 3)
        await asyncio.sleep(0.2)  # the router cuts the stream here
        await ctx.report_progress(2, 3)  # what the resume replays first
        seen = await asyncio.to_thread(line_seen.wait, 20)
        return f"done {text} after the line: {seen}"

    if MCP_MAJOR == 1:
        return server.streamable_http_app()
    return server.streamable_http_app(event_store=store, retry_interval=200)


class Lines(logging.Handler):
    def __init__(self, seen: threading.Event) -> None:
        super().__init__()
        self.seen = seen
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        if line.startswith("mcp-resumption verdict: resumed "):
            self.seen.set()


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_resumed_is_written_at_the_replay_that_proves_it(telemetry, monkeypatch, kind):
    instrument_env(monkeypatch, "observe", 5.0)
    seen = threading.Event()
    lines = Lines(seen)
    logger = logging.getLogger(VERDICTS)
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)

    async def scenario():
        async with sdk_stack(slow_app(IntegerEventStore(), seen)) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    answer = await client.call("x", timeout=30)
            return router, answer

    try:
        router, answer = asyncio.run(scenario())
    finally:
        logger.removeHandler(lines)
        logger.setLevel(logging.NOTSET)
    assert answer == "done x after the line: True", "the line came before the call's answer"
    truth = Truth(router)
    [call] = truth.cut
    [resume] = truth.resumes
    assert resume.index in call.answered_on, "the wire shows the answer on the resumed stream"
    verdicts = [line for line in lines.lines if line.startswith("mcp-resumption verdict: ")]
    # Decided at the replay with the call still running: it awaits its answer,
    # which then came: no second line contradicts the first.
    assert len(verdicts) == 1, verdicts
    assert verdicts[0].endswith("gaps=- lost_calls=0 awaiting=1"), verdicts
    assert telemetry.outcomes() == {"resumed": 1}
