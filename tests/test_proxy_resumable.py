"""mcp-resumption-proxy --resumable: a break between client and proxy loses
nothing, whatever the upstream's event store.

The client router cuts the tools/call stream right after its progress event
(or, for the TypeScript client, which asks for no progress, its priming
event); the proxy reads on, and the client's resume is served by the proxy
from its own ids: every event once, in order, and the server never sees a
resume.  When the server's leg breaks instead, the proxy resumes the server
with the server's own last id.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from proxy_harness import LEG, Stack, find_node, is_priming, stack, ts_client
from wire import RESUMABLE_CLIENTS, AppClient, IntegerEventStore, sdk_app

PROXY_ID = re.compile(r"^p[0-9a-f]{8}-[0-9]+:[0-9]+$")


async def call_once(kind: str, url: str) -> None:
    async with AppClient(kind, url) as client:
        assert await client.call("x") == "done x"


def client_events(running: Stack) -> list:
    """Every event the client's leg carried, in the order the client got them."""
    return [event for exchange in running.client_router.exchanges for event in exchange.events]


def assert_once_in_order(running: Stack) -> None:
    events = client_events(running)
    by_stream: dict[str, list[int]] = {}
    for event in events:
        stream, _, number = event.id.rpartition(":")
        assert PROXY_ID.match(event.id), event.id
        by_stream.setdefault(stream, []).append(int(number))
    for numbers in by_stream.values():  # once each, in order, none skipped
        assert numbers == list(range(1, len(numbers) + 1)), by_stream
    sent = [e.data for x in running.upstream_router.exchanges for e in x.events
            if x.request.method == "POST" and e.data]
    got = [e.data for e in events if e.data]
    for data in sent:
        if '"result"' in data or "progress" in data:
            assert got.count(data) == 1, data


@pytest.mark.parametrize("store", ["event-store", "no-store"])
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_client_that_breaks_resumes_from_the_proxy(kind, store) -> None:
    """With no event store the server sends no ids: the proxy mints them, as
    a bridge without a store would need to."""
    async def scenario() -> Stack:
        app = sdk_app(IntegerEventStore() if store == "event-store" else None)
        async with stack(app, cut_client=True,
                         proxy_args=("--resumable",)) as running:
            await call_once(kind, running.url)
        return running

    running = asyncio.run(scenario())
    assert any(e.severed for e in running.client_router.exchanges)
    [resume] = [e for e in running.client_router.exchanges
                if e.request.header("last-event-id")]
    assert PROXY_ID.match(resume.request.header("last-event-id"))
    assert not any(e.request.header("last-event-id")
                   for e in running.upstream_router.exchanges), "the proxy served the resume"
    assert_once_in_order(running)
    downstream = running.proxy.counts("mcp.server.resumption.requests", LEG,
                                      "mcp.resumption.outcome")
    assert downstream == {("client_proxy", "replayed"): 1}, downstream


def test_the_typescript_client_resumes_from_the_proxy() -> None:
    node = find_node()

    async def scenario() -> tuple[Stack, dict]:
        async with stack(sdk_app(IntegerEventStore()), cut_client=True, cut_after=is_priming,
                         proxy_args=("--resumable",)) as running:
            report = await asyncio.to_thread(ts_client, node, running.url, "work", 8000)
        return running, report

    running, report = asyncio.run(scenario())
    assert "result" in report, report
    assert any(e.severed for e in running.client_router.exchanges)
    assert any(PROXY_ID.match(e.request.header("last-event-id") or "")
               for e in running.client_router.exchanges)
    assert not any(e.request.header("last-event-id") for e in running.upstream_router.exchanges)
    assert_once_in_order(running)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_break_on_the_servers_leg_is_resumed_with_the_servers_own_id(kind) -> None:
    async def scenario() -> Stack:
        async with stack(sdk_app(IntegerEventStore()), cut_upstream=True,
                         proxy_args=("--resumable",)) as running:
            await call_once(kind, running.url)
        return running

    running = asyncio.run(scenario())
    [upstream_resume] = [e for e in running.upstream_router.exchanges
                         if e.request.header("last-event-id")]
    assert upstream_resume.request.header("last-event-id").isdigit()  # the store's own id
    [client_resume] = [e for e in running.client_router.exchanges
                       if e.request.header("last-event-id")]
    assert PROXY_ID.match(client_resume.request.header("last-event-id"))
    assert_once_in_order(running)
