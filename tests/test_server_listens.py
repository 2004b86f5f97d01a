"""``subscriptions/listen`` seen from the server (mcp 2.x, 2026-07-28), the
server half alone instrumented, the real ``Client.listen`` behind the
demo's loopback router.

The server cannot tell a client's own close from a cut below it (both are an
``http.disconnect`` with no message), so both are ``closed_by_client``,
never ``lost``; ``lost`` is a listen the server itself ended without its
result (here: its subscription cap, an error before the acknowledgment).
The truth is the router's record: whether the server's result crossed the
wire, whether the router cut the stream.
"""

from __future__ import annotations

import contextlib

import pytest

from server_harness import server_instrumented
from test_subscriptions import Wire, in_asyncio, url
from test_subscriptions import stack as client_stack
from wire import wait_until

pytestmark = pytest.mark.mcp2

LISTENS = "mcp.server.resumption.listens"
END = "mcp.resumption.listen.end"
FILTER = "mcp.resumption.listen.filter"
DELIVERIES = "mcp.server.resumption.deliveries"
BOUND = 10.0  # a bound on a failing test, never what a passing one waits for


@contextlib.asynccontextmanager
async def stack(telemetry, cut_first_listen: bool = False):
    """test_subscriptions' stack, its server observed by the server half."""
    with server_instrumented(telemetry):
        async with client_stack(cut_first_listen) as running:
            yield running


def ends(telemetry) -> dict[tuple[str, str], int]:
    return {
        (point.attributes[END], point.attributes[FILTER]): int(point.value)
        for point in telemetry.points(LISTENS) if point.value
    }


def no_answer_lost(telemetry) -> None:
    fates = telemetry.counts(DELIVERIES, "mcp.resumption.delivery.fate")
    assert set(fates) <= {"delivered"}, fates


@in_asyncio
async def test_the_servers_result_is_a_close_by_the_server(telemetry):
    from mcp import Client

    async with stack(telemetry) as (router, handler), Client(url(router)) as client:
        async with client.listen(tools_list_changed=True) as subscription:
            handler.close()
            async for _ in subscription:
                pass
        [listen] = Wire(router).listens
        assert Wire.graceful(listen), "the server's result crossed the wire"
        counted = await wait_until(lambda: ends(telemetry), BOUND)
    assert counted == {("closed_by_server", "tools"): 1}
    no_answer_lost(telemetry)


@in_asyncio
async def test_the_client_leaving_is_a_close_by_the_client(telemetry):
    from mcp import Client

    async with stack(telemetry) as (router, _), Client(url(router)) as client:
        async with client.listen(tools_list_changed=True, prompts_list_changed=True):
            pass
        [listen] = Wire(router).listens
        assert not Wire.graceful(listen) and not listen.severed, "the client ended it"
        counted = await wait_until(lambda: ends(telemetry), BOUND)
    assert counted == {("closed_by_client", "prompts,tools"): 1}
    no_answer_lost(telemetry)


@in_asyncio
async def test_a_cut_below_the_server_is_a_close_by_the_client_never_lost(telemetry):
    from mcp import Client
    from mcp.client.subscriptions import SubscriptionLost

    async with stack(telemetry, cut_first_listen=True) as (router, _), Client(
        url(router)
    ) as client:
        with pytest.raises(SubscriptionLost):
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    pass
        [listen] = Wire(router).listens
        assert listen.severed and not Wire.graceful(listen), "cut, no result"
        counted = await wait_until(lambda: ends(telemetry), BOUND)
    assert counted == {("closed_by_client", "tools"): 1}
    no_answer_lost(telemetry)


@in_asyncio
async def test_a_listen_the_server_ends_without_its_result_is_lost(telemetry):
    """The subscription cap: the server answers the listen with an error, and
    the client's subscription is gone without the graceful close."""
    from mcp import Client

    async with stack(telemetry) as (router, handler), Client(url(router)) as client:
        handler._max_subscriptions = 0
        with pytest.raises(Exception, match="Subscription limit"):
            async with client.listen(resources_list_changed=True) as subscription:
                async for _ in subscription:
                    pass
        [listen] = Wire(router).listens
        assert not Wire.graceful(listen) and not listen.severed
        counted = await wait_until(lambda: ends(telemetry), BOUND)
    assert counted == {("lost", "resources"): 1}
    no_answer_lost(telemetry)
