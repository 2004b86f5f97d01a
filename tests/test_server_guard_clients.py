"""What real MCP clients make of the server guard's answer.

The server is the installed SDK major's, with a store that lost every cursor
(seed 000: the instance answering the resume is not the one that issued the
cursor).  The ``slow`` tool closes its POST stream (polling, 2025-11-25), so
the client resumes with a cursor the store does not know.  Guard off: the SDK
answers 200 and an empty stream, and every client resumes again and again
until its own timeout.  Guard on: 410, and the client stops after its two
retries; the mcp 2.x client fails the call at once, mcp 1.x and the
TypeScript client stop reconnecting and leave the call to its own timeout.
The clients treat every 4xx of a resume alike (measured for 400, 404, 409 and
410: the same retries and the same end), so the status is chosen for what it
says (docs/server.md, "The server guard").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession

from server_harness import (
    MCP_MAJOR,
    UuidStore,
    build_app,
    running,
    server_instrumented,
    server_outcomes,
)

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

if MCP_MAJOR == 1:
    from mcp.client.streamable_http import streamablehttp_client as connect
else:
    from mcp.client.streamable_http import streamable_http_client as connect

TS_DIR = Path(__file__).parents[1] / "demo" / "src" / "mcp_resumption_demo" / "ts_server"
CALL_TIMEOUT = 6.0


def lost_store() -> UuidStore:
    store = UuidStore()
    store.lost = True
    return store


def leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def _call(url: str) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        async with connect(url) as streams, ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            with anyio.fail_after(CALL_TIMEOUT):
                await session.call_tool("slow", {})
    except BaseException as error:
        return time.monotonic() - started, leaf(error)
    return time.monotonic() - started, None


def resumes(telemetry) -> int:
    return sum(server_outcomes(telemetry).values())


def test_guard_off_the_python_client_resumes_until_its_own_timeout(telemetry):
    with server_instrumented(telemetry), running(build_app(lost_store())) as server:
        elapsed, error = asyncio.run(_call(server.url))
    assert isinstance(error, TimeoutError), error  # the caller's own deadline ended it
    assert elapsed >= CALL_TIMEOUT
    # 200 and nothing, resumed every retry interval (200 ms): the loop of seed 000
    assert server_outcomes(telemetry).get("unknown_cursor", 0) >= 10


def test_guard_on_the_python_client_stops_after_two_retries(telemetry):
    with (
        server_instrumented(telemetry, guard="reject"),
        telemetry.instrumented(confirm_timeout=1),
        running(build_app(lost_store())) as server,
    ):
        elapsed, error = asyncio.run(_call(server.url))
    assert server_outcomes(telemetry) == {"rejected_by_guard": 2}
    if MCP_MAJOR >= 2:
        # the SDK gives up after its retries and fails the call: prompt, clean
        assert type(error).__name__ in ("McpError", "MCPError"), error
        assert "reconnection attempts were exhausted" in str(error)
        assert elapsed < 3
    else:
        # mcp 1.x stops reconnecting after its retries too, but never answers
        # the pending call (as for any refused reconnect): it waits for the
        # caller's own timeout.  No loop: two resumes in all that time.
        assert isinstance(error, TimeoutError), error
    # The client side sees the refusal for what it is: the resume was refused
    # (410, outcome rejected) and the call in flight lost its answer, an
    # orphaned_request; not the replay_unconfirmed of an empty 200, again and again.
    assert telemetry.gap_kinds() == {"orphaned_request": 1}
    assert telemetry.outcomes() == {"rejected": 1}
    spans = telemetry.resume_spans()
    statuses = {span.attributes.get("http.response.status_code") for span in spans}
    assert statuses == {410}


@pytest.fixture(scope="module")
def ts_client() -> list[str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed for the TypeScript client"
    if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=TS_DIR, check=True)
    return [node, str(TS_DIR / "client.mjs")]


def run_ts(ts_client: list[str], url: str) -> dict:
    done = subprocess.run(
        [*ts_client, url, "slow", str(int(CALL_TIMEOUT * 1000))],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("guard", ["off", "reject"])
def test_the_typescript_client(telemetry, ts_client, guard):
    with (
        server_instrumented(telemetry, guard=guard),
        running(build_app(lost_store())) as server,
    ):
        report = run_ts(ts_client, server.url)
    assert "timed out" in report["error"], report  # the request's own timeout, both ways
    if guard == "off":
        # 200 with nothing: the client resumes, and is then refused its
        # GET stream (409, one per session) until its retries run out
        assert server_outcomes(telemetry).get("unknown_cursor", 0) >= 1
        return
    assert server_outcomes(telemetry) == {"rejected_by_guard": 2}
    errors = report["transportErrors"]
    assert sum("Gone" in error for error in errors) >= 2, errors
    assert any("Maximum reconnection attempts" in error for error in errors), errors


def test_the_guard_leaves_a_faithful_resume_alone(telemetry, ts_client):
    with contextlib.ExitStack() as stack:
        stack.enter_context(server_instrumented(telemetry, guard="reject"))
        server = stack.enter_context(running(build_app(UuidStore())))
        report = run_ts(ts_client, server.url)
        elapsed, error = asyncio.run(_call(server.url))
    assert report.get("result") == "done", report
    assert error is None and elapsed < CALL_TIMEOUT
    assert server_outcomes(telemetry) == {"replayed": 2}


def test_enforce_the_repeated_empty_replay_fails_the_call_at_its_first_gap(telemetry):
    """Seed 000's loop (200 and nothing, again and again) in enforce mode:
    the first replay_unconfirmed fails the pending call; the SDK does not go
    on resuming until the caller's own timeout."""
    with (
        server_instrumented(telemetry),
        telemetry.instrumented(confirm_timeout=1, mode="enforce"),
        running(build_app(lost_store())) as server,
    ):
        elapsed, error = asyncio.run(_call(server.url))
    assert type(error).__name__ in ("McpError", "MCPError"), error
    assert "ResumptionGapError" in str(error) and "replay" in str(error)
    assert elapsed < CALL_TIMEOUT
    assert telemetry.gap_kinds().get("replay_unconfirmed") == 1
    assert server_outcomes(telemetry).get("unknown_cursor", 0) <= 2


def test_enforce_a_refused_resume_fails_the_call_on_both_majors(telemetry):
    """The guard refuses the resume: mcp 1.x, which gives up without
    answering the call, now fails it with the verdict too."""
    with (
        server_instrumented(telemetry, guard="reject"),
        telemetry.instrumented(confirm_timeout=1, mode="enforce"),
        running(build_app(lost_store())) as server,
    ):
        elapsed, error = asyncio.run(_call(server.url))
    assert type(error).__name__ in ("McpError", "MCPError"), error
    assert elapsed < CALL_TIMEOUT
    if MCP_MAJOR == 1:
        assert "ResumptionGapError: the resume was rejected" in str(error)
    assert telemetry.outcomes() == {"rejected": 1}
