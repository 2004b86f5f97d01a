"""A crash (issue 32, case 3): a client process with a ``tools/call`` in
flight is killed with SIGKILL, so its exit accounting never runs.  Two new
processes then see the same server at once (two instances of a fleet, or
two restarts racing).  With the state in Redis the request is counted
``lost`` exactly once among them (the claim is a ``SET NX``), and no sooner
than the reissue window after the kill (the dead process's lease on its
entries must lapse first).  In memory nobody counts it (strict xfail).

The truth is the router's record: the call was sent, never answered and
never sent again.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import signal
import sys
import time
from pathlib import Path

import pytest

from mcp_resumption_demo.loopback import LoopbackServer
from mcp_resumption_demo.router import Backend, Route
from redis_stack import RedisServer, process_env
from wire import Truth, WireRouter

pytest.importorskip("redis")

PROGRAM = Path(__file__).resolve().parent / "programs" / "crash_client.py"
ROOT = Path(__file__).resolve().parents[1]
CONFIRM = 1.0  # the reissue window, s; the dead process's lease
WAIT = CONFIRM + 4  # how long each new process waits for a count
MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])


def hanging_app():
    """The installed major's server with a tool ``work`` that never answers."""
    if MCP_MAJOR == 1:
        from mcp.server.fastmcp import FastMCP

        server = FastMCP("crash")
    else:
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("crash")

    @server.tool()
    async def work(text: str) -> str:
        await asyncio.Event().wait()
        return text

    return server.streamable_http_app()


def env(state: str | None) -> dict[str, str]:
    return process_env(state, CONFIRM)


async def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def in_flight_entries(client) -> int:
    return sum(client.hlen(key) for key in client.scan_iter("mcpres:v1:f:*"))


def run(state: str | None, redis_server: RedisServer):
    async def scenario():
        backend = await LoopbackServer(hanging_app(), name="sdk").astart()
        router = await WireRouter(lambda request: Route(Backend("sdk", backend.port))).start()
        url = router.url + "/mcp"
        try:
            first = await asyncio.create_subprocess_exec(
                sys.executable, str(PROGRAM), "call", url, env=env(state),
            )
            try:
                # The call is on the wire, and (with Redis) in the ledger.
                await wait_for(lambda: any(
                    e.request.jsonrpc_method == "tools/call" for e in router.exchanges
                ))
                if state is not None:
                    client = redis_server.client()
                    await wait_for(lambda: in_flight_entries(client) == 1)
            finally:
                first.send_signal(signal.SIGKILL)
                await first.wait()
            killed_at = time.time()
            seers = [
                await asyncio.create_subprocess_exec(
                    sys.executable, str(PROGRAM), "see", url, str(WAIT), env=env(state),
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )
                for _ in range(2)
            ]
            outputs = await asyncio.gather(*(seer.communicate() for seer in seers))
            found = [
                {**json.loads(out.decode().strip().splitlines()[-1]), "stderr": err.decode()}
                for out, err in outputs
            ]
            return Truth(router), killed_at, found
        finally:
            await router.close()
            await asyncio.to_thread(backend.close)

    return asyncio.run(scenario())


@pytest.mark.parametrize("state", [
    "redis",
    pytest.param("memory", marks=pytest.mark.xfail(
        strict=True, raises=AssertionError,
        reason="state in memory: the killed process took its requests with it",
    )),
])
def test_a_killed_process_s_call_is_lost_once_for_the_fleet(redis_server, state):
    redis_server.client().flushall()
    truth, killed_at, found = run(redis_server.url if state == "redis" else None,
                                  redis_server)
    [call] = truth.calls
    assert call.answered_on == [] and truth.reissues_of(call) == [], "the wire: lost"
    lost = [seen for seen in found if seen["fates"].get("lost")]
    assert sum(seen["fates"].get("lost", 0) for seen in found) == 1, found
    assert all(set(seen["fates"]) <= {"lost"} for seen in found), found
    [counted] = lost
    assert counted["at"] - killed_at >= CONFIRM, "not before the reissue window"
    # What a user reads first: the lost call's line, once, by the process
    # that counted it, and its exit summary's lost_calls.
    lines = [seen["stderr"].count("mcp-resumption lost call: server=") for seen in found]
    assert sorted(lines) == [0, 1], [seen["stderr"] for seen in found]
    assert "lost_calls=1" in counted["stderr"], counted["stderr"]
    # The lost call is its orphaned_request gap, once, where it was counted.
    assert [seen["gaps"] for seen in found if seen is not counted] == [{}], found
    assert counted["gaps"] == {"orphaned_request": 1}, counted
    if state == "redis":
        assert in_flight_entries(redis_server.client()) == 0, "claimed and removed"
