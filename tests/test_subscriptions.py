"""A subscription is not a call (2026-07-28's ``subscriptions/listen``),
through the real mcp 2.x ``Client.listen`` against the real mcp 2.x server,
behind the demo's loopback router, which records what crossed the wire.

Each subscription ends one way: *graceful* (the server's result), *local*
(the client left its ``listen`` block) or *lost* (cut by the router, or the
server's process killed).  Only a lost one is reported, once, on
``mcp.client.resumption.lost_subscriptions`` with the filter it held and
whether the client re-listened, with a ``subscription_lost`` gap event and a
line that says to re-listen and refetch; never as a broken call, a lost
call or a resume attempt.  The wire's truth is read first, from the router's
record, never from the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys

import pytest

from helpers import Telemetry, stop_process
from wire import WireRouter, message, wait_until

pytestmark = pytest.mark.mcp2


def in_asyncio(test):
    """Run an async test in its own event loop (the suite's tests use asyncio.run)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run

LOST = "mcp.client.resumption.lost_subscriptions"
RELISTENED = "mcp.resumption.subscription.relistened"
NOTIFICATIONS = "mcp.resumption.subscription.notifications"
CONFIRM = 1.0  # the confirmation window, which is also the re-listen window (s)


def listen_server():
    """mcp 2.x's server with its own listen handler (kept, to close it gracefully)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.subscriptions import ListenHandler

    server = MCPServer("subscriptions")

    @server.tool()
    async def work(text: str) -> str:
        return "done " + text

    entry = server._lowlevel_server._request_handlers["subscriptions/listen"]
    handler = entry.handler
    assert isinstance(handler, ListenHandler)
    return server.streamable_http_app(), handler


def is_ack(event) -> bool:
    decoded = message(event)
    return bool(decoded) and decoded.get("method") == "notifications/subscriptions/acknowledged"


class Wire:
    """What the router's record says of each listen request."""

    def __init__(self, router) -> None:
        self.listens = [
            exchange for exchange in router.exchanges
            if (exchange.request.jsonrpc or {}).get("method") == "subscriptions/listen"
        ]

    @staticmethod
    def graceful(exchange) -> bool:
        """The server's result for the listen request crossed the wire."""
        request_id = exchange.request.jsonrpc.get("id")
        return any(
            (decoded := message(event)) and decoded.get("id") == request_id
            and "result" in decoded
            for event in exchange.events
        )


@contextlib.asynccontextmanager
async def stack(cut_first_listen: bool = False):
    from mcp_resumption_demo.loopback import LoopbackServer
    from mcp_resumption_demo.router import Backend, Route
    from wire import CutRoute

    app, handler = listen_server()
    backend = await LoopbackServer(app, name="listen").astart()
    state = {"cut": cut_first_listen}

    def policy(request):
        if request.jsonrpc_method == "subscriptions/listen" and state["cut"]:
            state["cut"] = False
            return CutRoute(Backend("listen", backend.port), cut_after=is_ack)
        return Route(Backend("listen", backend.port))

    router = await WireRouter(policy).start()
    try:
        yield router, handler
    finally:
        await router.close()
        await asyncio.to_thread(backend.close)


def url(router) -> str:
    return f"http://127.0.0.1:{router.port}/mcp"


@pytest.fixture
def telemetry(monkeypatch):
    monkeypatch.setenv("OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT", str(CONFIRM))
    telemetry = Telemetry()
    with telemetry.instrumented():
        yield telemetry
    telemetry.shutdown()


def assert_no_call_reported(telemetry) -> None:
    """A subscription is never a broken call, a lost call or a resume."""
    assert telemetry.fates() == {}
    assert "orphaned_request" not in telemetry.gap_kinds()
    assert telemetry.outcomes() == {}


def subscription_gaps(telemetry) -> list:
    return [
        record for record in telemetry.gap_logs()
        if record.log_record.attributes.get("mcp.resumption.gap.kind") == "subscription_lost"
    ]


@in_asyncio
async def test_a_graceful_close_is_no_loss(telemetry):
    from mcp import Client

    async with stack() as (router, handler), Client(url(router)) as client:
        async with client.listen(tools_list_changed=True) as subscription:
            handler.close()
            async for _ in subscription:  # ends at the server's result
                pass
        assert await client.call_tool("work", {"text": "after"})
    [listen] = Wire(router).listens
    assert Wire.graceful(listen), "the server's result crossed the wire"
    await asyncio.sleep(CONFIRM + 0.2)  # past the window a loss would be counted in
    assert telemetry.counts(LOST) == {}
    assert subscription_gaps(telemetry) == []
    assert_no_call_reported(telemetry)


@in_asyncio
async def test_leaving_the_listen_block_is_no_loss(telemetry):
    from mcp import Client

    async with stack() as (router, _), Client(url(router)) as client:
        async with client.listen(tools_list_changed=True):
            pass
        assert await client.call_tool("work", {"text": "after"})
    [listen] = Wire(router).listens
    assert not Wire.graceful(listen) and not listen.severed, "the client ended it"
    await asyncio.sleep(CONFIRM + 0.2)
    assert telemetry.counts(LOST) == {}
    # The series a loss would count started at 0 when the server was first
    # seen, every filter's: Prometheus' increase() cannot see one born at 1.
    started = {
        (point.attributes[NOTIFICATIONS], point.attributes[RELISTENED]): point.value
        for point in telemetry.points(LOST)
    }
    assert len(started) == 32 and set(started.values()) == {0}
    assert started[("tools", "false")] == started[("prompts,resources,tools", "true")] == 0
    assert subscription_gaps(telemetry) == []
    assert_no_call_reported(telemetry)


@pytest.mark.parametrize("relisten", [False, True], ids=["no-relisten", "relisten"])
@in_asyncio
async def test_a_cut_subscription_is_lost_once_and_says_whether_it_was_relistened(
    telemetry, relisten, caplog
):
    from mcp import Client
    from mcp.client.subscriptions import SubscriptionLost

    caplog.set_level(logging.WARNING, "opentelemetry.instrumentation.mcp_resumption.verdicts")
    async with stack(cut_first_listen=True) as (router, _), Client(url(router)) as client:
        with pytest.raises(SubscriptionLost):
            async with client.listen(tools_list_changed=True, prompts_list_changed=True) as sub:
                async for _ in sub:
                    pass
        if relisten:
            async with client.listen(tools_list_changed=True):
                pass
    wire = Wire(router)
    assert wire.listens[0].severed and not Wire.graceful(wire.listens[0]), "cut, no result"
    assert len(wire.listens) == (2 if relisten else 1)
    counted = await wait_until(lambda: telemetry.counts(LOST, RELISTENED), CONFIRM + 6)
    assert counted == {"true" if relisten else "false": 1}
    assert telemetry.counts(LOST, NOTIFICATIONS) == {"prompts,tools": 1}
    [gap] = subscription_gaps(telemetry)
    assert "re-listen and refetch" in gap.log_record.body
    assert gap.log_record.attributes["jsonrpc.request.id"] == wire.listens[0].request.jsonrpc["id"]
    lines = [r.getMessage() for r in caplog.records if "subscription lost" in r.getMessage()]
    assert len(lines) == 1 and "notifications=prompts,tools" in lines[0], lines
    assert_no_call_reported(telemetry)
    # Never a gap of a resume: the lost-call alert's counter does not move.
    assert "subscription_lost" not in telemetry.gap_kinds()


SERVER = r"""
import socket, sys, uvicorn
sys.path.insert(0, sys.argv[1])
from test_subscriptions import listen_server
app, _ = listen_server()
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(16)  # queued until served
print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning", log_config=None)).run(sockets=[sock])
"""


@in_asyncio
async def test_a_killed_server_loses_the_subscription(telemetry):
    from mcp import Client
    from mcp.client.subscriptions import SubscriptionLost

    tests = os.path.dirname(__file__)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, tests], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(await asyncio.to_thread(server.stdout.readline))
        server_url = f"http://127.0.0.1:{port}/mcp"
        async with Client(server_url) as client:
            with pytest.raises(SubscriptionLost):
                async with client.listen(tools_list_changed=True) as sub:
                    server.send_signal(signal.SIGKILL)  # mid-subscription
                    async for _ in sub:
                        pass
    finally:
        stop_process(server)
    counted = await wait_until(lambda: telemetry.counts(LOST, RELISTENED), CONFIRM + 6)
    assert counted == {"false": 1}
    assert telemetry.counts(LOST, NOTIFICATIONS) == {"tools": 1}
    assert len(subscription_gaps(telemetry)) == 1
    assert_no_call_reported(telemetry)
