"""``subscriptions/listen`` streams the client ends itself, through
mcp-resumption-proxy (observe and ``--resumable``), then the proxy stopped
by SIGTERM (issue 45, point 4).

    mcp 2.x Client.listen() -> client router -> proxy -> upstream router -> mcp 2.x server

The client (2026-07-28, mcp 2.x's default) opens three listens one after the
other and leaves each ``listen`` block once it is acknowledged: its own end of
the subscription, which 2026-07-28 spells as closing the stream.  The wire's
truth is the routers' record: no result crossed, the client closed each
stream, nothing was severed; and on the upstream leg, the proxy closed each
one as its client did.  What the proxy must say: each listen is the client's
cancel on ``client_proxy``, counted once and when it ended (read from the
admin address's ``/metrics`` before the SIGTERM, with a confirmation window
far longer than the test); never a lost subscription on either leg, at
shutdown or before; never a broken call (a listen after a listen is no
re-issue of it).
"""

from __future__ import annotations

import asyncio
import re
import signal

import httpx
import pytest

from proxy_harness import LEG, stack
from test_proxy_shutdown import admin_of
from test_subscriptions import Wire, listen_server

from prometheus_stack import free_port

pytestmark = pytest.mark.mcp2

LOST_SUBSCRIPTIONS = "mcp.client.resumption.lost_subscriptions"
CANCELLED = "mcp.proxy.cancelled_requests"
BROKEN = "mcp.client.resumption.broken_requests"
GAPS = "mcp.client.resumption.gaps"
LISTENS = 3
# The window a closed 2026-07-28 request waits in for its re-issue: far past
# the test, so that a count made at the window's end, or at exit, is not one
# made when the listen ended.
WINDOW = "60"
BOUND = 10.0  # a bound on a failing test, never what a passing one waits for


def series(text: str, name: str) -> dict[str, float]:
    """``name``'s values in a Prometheus exposition, by leg."""
    found: dict[str, float] = {}
    for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        leg = re.search(r'mcp_resumption_leg="([^"]*)"', labels)
        key = leg.group(1) if leg else ""
        found[key] = found.get(key, 0.0) + float(value)
    return {key: value for key, value in found.items() if value}


async def scrape(admin: str) -> str:
    return (await asyncio.to_thread(httpx.get, admin + "/metrics", timeout=5.0)).text


async def until_scraped(admin: str, name: str, wanted: dict[str, float]) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while (found := series(await scrape(admin), name)) != wanted and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return found


def listens(router) -> list:
    return Wire(router).listens


@pytest.mark.parametrize("mode", [(), ("--resumable",)], ids=["observe", "resumable"])
def test_listens_the_client_ended_are_its_cancels_once_never_lost(mode) -> None:
    async def scenario():
        from mcp import Client

        app, _ = listen_server()
        async with stack(
            app, proxy_args=(*mode, "--admin", "127.0.0.1:0"),
            OTEL_METRICS_EXPORTER="console,prometheus",
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
            OTEL_EXPORTER_PROMETHEUS_PORT=str(free_port()),
            OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT=WINDOW,
        ) as running:
            admin = await asyncio.to_thread(admin_of, running.proxy)
            async with Client(running.url) as client:
                for _ in range(LISTENS):
                    async with client.listen(tools_list_changed=True):
                        pass  # acknowledged; the client ends it
                # The wire: each listen closed by the client, no result.
                await running.client_router.wait_for(
                    lambda log: len(listens(running.client_router)) == LISTENS
                    and all(e.finished.is_set() for e in listens(running.client_router)))
                # Counted as each ended, not at the window's end nor at exit.
                cancelled = await until_scraped(admin, "mcp_proxy_cancelled_requests_total",
                                                {"client_proxy": LISTENS})
                live = await scrape(admin)
                # The proxy passed each close on to the server (a listen has
                # no resume to keep it for).
                upstream_closed = True
                try:
                    await running.upstream_router.wait_for(
                        lambda log: len(listens(running.upstream_router)) == LISTENS
                        and all(e.client_closed for e in listens(running.upstream_router)),
                        BOUND)
                except asyncio.TimeoutError:
                    upstream_closed = False
                running.proxy.process.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(running.proxy.process.wait, BOUND)
        return running, cancelled, live, upstream_closed, code

    running, cancelled, live, upstream_closed, code = asyncio.run(scenario())
    proxy = running.proxy
    for leg in (running.client_router, running.upstream_router):
        assert len(listens(leg)) == LISTENS
        assert not any(Wire.graceful(e) or e.severed for e in listens(leg)), "no result, no cut"
    assert all(e.client_closed for e in listens(running.client_router)), "the client ended each"
    assert cancelled == {"client_proxy": LISTENS}, (cancelled, proxy.stderr[-2000:])
    assert series(live, "mcp_client_resumption_lost_subscriptions_total") == {}
    assert upstream_closed, [(e.client_closed, e.finished.is_set())
                             for e in listens(running.upstream_router)]
    assert code == 0, proxy.stderr
    # The exit's export: once each, as the client's cancel, nothing else.
    assert proxy.counts(CANCELLED, LEG) == {("client_proxy",): LISTENS}
    assert proxy.counts(LOST_SUBSCRIPTIONS, LEG) == {}, proxy.stderr[-2000:]
    assert proxy.counts(BROKEN, LEG) == {}
    assert proxy.counts(GAPS, LEG) == {}
    assert "subscription lost" not in proxy.stderr, proxy.stderr
    assert "lost call" not in proxy.stderr, proxy.stderr
