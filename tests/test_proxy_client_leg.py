"""Losses between client and proxy (issue 38): the answers mcp-resumption-proxy
could not deliver, the resumes it answered with 5xx, cursors it never carried,
and the requests it cut at shutdown, each counted once on its leg and said in
words.

    client -> client router -> proxy (a child) -> upstream router -> SDK server

The truth is the routers' records (tests/wire.py's ``Truth``): which call was
cut on which leg, answered later, sent again, or never.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from proxy_harness import LEG, Proxy, Stack, stack
from wire import (
    CLIENTS,
    MODERN,
    RESUMABLE_CLIENTS,
    AppClient,
    IntegerEventStore,
    Truth,
    WireRouter,
    first_call_fails,
    sdk_app,
)

BROKEN = "mcp.client.resumption.broken_requests"
GAPS = "mcp.client.resumption.gaps"
ATTEMPTS = "mcp.client.resumption.attempts"
SERVER_REQUESTS = "mcp.server.resumption.requests"
CANCELLED = "mcp.proxy.cancelled_requests"
RESUMES_APART = "mcp.proxy.client_resumes"
FATE = "mcp.resumption.request.fate"
KIND = "mcp.resumption.gap.kind"
OUTCOME = "mcp.resumption.outcome"
RESULT = "mcp.proxy.resume.result"
CLIENT_WORDS = "leg=client_proxy (between client and proxy)"
SERVER_WORDS = "leg=proxy_server (between proxy and server)"
WINDOW = "1"  # the confirmation window, s: how long a broken call awaits its fate


def lost_line(proxy: Proxy) -> list[str]:
    return [line for line in proxy.stderr.splitlines() if "mcp-resumption lost call" in line]


async def wait_for_text(proxy: Proxy, text: str, timeout: float = 15.0) -> None:
    """The proxy wrote ``text`` to stderr (its verdict lines), or the bound passed."""
    deadline = time.monotonic() + timeout
    while text not in proxy.stderr and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def cut_call(router: WireRouter):
    [call] = [c for c in Truth(router).calls if c.cut]
    return call


async def gate_on_cut(running: Stack, gate: threading.Event) -> None:
    """Let the tool answer once the proxy has left the call's upstream stream
    (its client's was cut, and the proxy knows it): an answer written to the
    cut connection before the proxy heard of the cut would be one no log
    tells apart from a delivered one."""
    await running.upstream_router.wait_for(lambda xs: any(
        e.client_closed and e.request.jsonrpc_method == "tools/call" for e in xs))
    gate.set()


async def gate_on_resume(running: Stack, gate: threading.Event) -> None:
    """Let the tool answer once the client resumed at the proxy (--resumable
    reads on after its client left, so the proxy never leaves upstream)."""
    await running.client_router.wait_for(lambda xs: any(
        e.request.header("last-event-id") for e in xs))
    gate.set()


def proxy_mode(mode: str) -> tuple[str, ...]:
    return ("--mode", mode)


# ============================================================== lost, reissued


@pytest.mark.parametrize("mode", ["observe", "enforce"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_an_answer_the_proxy_could_not_deliver_is_lost_on_the_client_leg(kind, mode) -> None:
    """A server without an event store; the client's leg of the call is cut
    after its progress, and the tool answers only then: the answer reaches
    the proxy, whose client is gone, and nothing can resume it.  Before
    2026-07-28 that is a lost call on client_proxy, with its gap and its
    line, in words; a 2026-07-28 client's close is its cancel, never lost."""
    gate = threading.Event()

    async def scenario() -> Stack:
        async with stack(sdk_app(answer_when=gate), cut_client=True,
                         proxy_args=proxy_mode(mode),
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT=WINDOW) as running:
            cut = asyncio.ensure_future(gate_on_cut(running, gate))
            async with AppClient(kind, running.url) as client:
                await first_call_fails(client)
                await cut
                if kind != MODERN:
                    await wait_for_text(running.proxy, "mcp-resumption lost call")
            await running.upstream_router.wait_for(lambda xs: all(
                e.finished.is_set() for e in xs))
        return running

    running = asyncio.run(scenario())
    proxy = running.proxy
    # The wire: cut on the client's leg, never answered there, never sent
    # again; the server's leg was not cut, and the proxy left it.
    truth = Truth(running.client_router)
    call = cut_call(running.client_router)
    assert truth.fate(call) == "lost"
    [upstream_call] = Truth(running.upstream_router).calls
    assert not upstream_call.exchange.severed
    broken = proxy.counts(BROKEN, LEG, FATE)
    gaps = proxy.counts(GAPS, LEG, KIND)
    if kind == MODERN:
        assert broken == {} and gaps == {}, (broken, gaps)
        assert proxy.counts(CANCELLED, LEG) == {("client_proxy",): 1}, proxy.stderr
        assert not lost_line(proxy)
        return
    assert broken == {("client_proxy", "lost"): 1}, (broken, proxy.stderr[-2000:])
    assert gaps == {("client_proxy", "orphaned_request"): 1}, gaps
    [line] = lost_line(proxy)
    assert CLIENT_WORDS in line and "method=tools/call" in line, line
    summary = [line for line in proxy.stderr.splitlines() if CLIENT_WORDS in line
               and "mcp-resumption summary" in line]
    assert summary and "lost_calls=1" in summary[0], proxy.stderr[-2000:]
    records = [r for r in proxy.logs() if r["attributes"].get(KIND) == "orphaned_request"]
    assert [r["attributes"][LEG] for r in records] == ["client_proxy"], records
    assert "ASGI callable" not in proxy.stderr and "Traceback" not in proxy.stderr


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_call_cut_between_client_and_proxy_and_sent_again_is_reissued(kind) -> None:
    """The same cut, and the application calls again: reissued on
    client_proxy (a 2026-07-28 client's close then re-issue too), never lost."""
    gate = threading.Event()

    async def scenario() -> Stack:
        async with stack(sdk_app(answer_when=gate), cut_client=True,
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT="5") as running:
            cut = asyncio.ensure_future(gate_on_cut(running, gate))
            async with AppClient(kind, running.url) as client:
                await first_call_fails(client)
                await cut
                assert await client.call("x") == "done x"
        return running

    running = asyncio.run(scenario())
    truth = Truth(running.client_router)
    assert truth.fate(cut_call(running.client_router)) == "reissued"
    broken = running.proxy.counts(BROKEN, LEG, FATE)
    assert broken == {("client_proxy", "reissued"): 1}, (broken, running.proxy.stderr[-2000:])
    assert running.proxy.counts(GAPS, LEG, KIND) == {}
    assert running.proxy.counts(CANCELLED, LEG) == {}


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_with_resumable_an_answer_the_buffer_serves_is_answered(kind) -> None:
    """--resumable, no event store: the client's leg is cut, the client resumes
    from the proxy's buffer and gets the answer: answered on client_proxy."""
    gate = threading.Event()

    async def scenario() -> Stack:
        async with stack(sdk_app(answer_when=gate), cut_client=True,
                         proxy_args=("--resumable",)) as running:
            cut = asyncio.ensure_future(gate_on_resume(running, gate))
            async with AppClient(kind, running.url) as client:
                assert await client.call("x") == "done x"
            await cut
        return running

    running = asyncio.run(scenario())
    truth = Truth(running.client_router)
    assert truth.fate(cut_call(running.client_router)) == "answered"
    broken = running.proxy.counts(BROKEN, LEG, FATE)
    assert broken == {("client_proxy", "answered"): 1}, (broken, running.proxy.stderr[-2000:])


# ============================================================== resumes


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_resume_the_proxy_answered_with_502_is_not_replayed(kind) -> None:
    """The server's leg of the call is cut; the server is gone at the resume
    (the upstream router answers nothing): each of the client's resumes gets
    502 from the proxy.  None is ``replayed``: counted apart as
    ``not_forwarded``; the server's leg says why."""
    async def gone():
        return None

    async def scenario() -> Stack:
        async with stack(sdk_app(IntegerEventStore()), cut_upstream=True,
                         at_resume=gone) as running, AppClient(kind, running.url) as client:
            await first_call_fails(client)
        return running

    running = asyncio.run(scenario())
    resumes = Truth(running.client_router).resumes
    assert resumes and all(e.status == 502 for e in resumes), [e.status for e in resumes]
    assert running.upstream_router.refused, "the server's leg got every resume, unanswered"
    assert ("client_proxy", "replayed") not in running.proxy.counts(SERVER_REQUESTS, LEG, OUTCOME)
    apart = running.proxy.counts(RESUMES_APART, LEG, RESULT)
    assert apart == {("client_proxy", "not_forwarded"): len(resumes)}, apart


def test_a_cursor_the_proxy_never_carried_raises_no_alarm() -> None:
    """Two GETs with a made-up Last-Event-ID (anyone can send them): counted
    apart as ``uncarried_cursor``, forwarded as they are, and nothing else:
    no gap, no WARNING, no ``rejected`` on the server's leg."""
    async def scenario() -> Stack:
        async with stack(sdk_app(IntegerEventStore())) as running, httpx.AsyncClient() as client:
            for _ in range(2):
                await client.get(running.url, headers={
                    "accept": "text/event-stream", "last-event-id": "999",
                    "mcp-session-id": "not-a-session"})
        return running

    running = asyncio.run(scenario())
    proxy = running.proxy
    forwarded = [e for e in running.upstream_router.exchanges
                 if e.request.header("last-event-id") == "999"]
    assert len(forwarded) == 2 and all(e.status >= 400 for e in forwarded), "forwarded as is"
    assert proxy.counts(RESUMES_APART, LEG, RESULT) == {("client_proxy", "uncarried_cursor"): 2}
    assert proxy.counts(SERVER_REQUESTS, LEG, OUTCOME) == {}
    assert proxy.counts(ATTEMPTS, LEG, OUTCOME) == {}
    assert proxy.counts(GAPS, LEG, KIND) == {}
    assert "WARNING" not in proxy.stderr and "verdict:" not in proxy.stderr, proxy.stderr
    assert "rejected" not in proxy.stderr, proxy.stderr
    assert not [r for r in proxy.logs() if r["attributes"].get(KIND)], "no gap event"
    assert "not-a-session" not in proxy.stdout


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_every_line_names_its_leg_in_words(kind) -> None:
    """A cut between proxy and server: the verdict lines and the summary of the
    upstream leg say so in words."""
    async def scenario() -> Stack:
        async with stack(sdk_app(IntegerEventStore()), cut_upstream=True) as running, \
                AppClient(kind, running.url) as client:
            assert await client.call("x") == "done x"
        return running

    running = asyncio.run(scenario())
    lines = [line for line in running.proxy.stderr.splitlines() if "mcp-resumption" in line]
    verdicts = [line for line in lines if "mcp-resumption verdict" in line]
    summaries = [line for line in lines if "mcp-resumption summary" in line]
    assert verdicts and summaries, running.proxy.stderr
    assert all(SERVER_WORDS in line for line in verdicts + summaries), lines
    assert "ASGI callable" not in running.proxy.stderr


# ============================================================== shutdown


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_call_cut_by_the_proxy_s_shutdown_is_lost_on_the_client_leg(kind) -> None:
    """SIGTERM while a call is in flight (its tool never answers): the proxy
    cuts the client's stream; before the exit's summary, that call is lost on
    client_proxy, once (not again on the server's leg), with its line."""
    gate = threading.Event()

    async def scenario() -> tuple[Stack, asyncio.Task]:
        async with stack(sdk_app(IntegerEventStore(), answer_when=gate)) as running:
            async with AppClient(kind, running.url) as client:
                # mcp 1.x waits for its call until this timeout once the proxy
                # is gone: beyond the proxy's stop (its drain is 2 s), no more.
                call = asyncio.ensure_future(client.call("x", timeout=15))
                await running.upstream_router.wait_for(lambda xs: any(
                    e.request.jsonrpc_method == "tools/call" and e.events for e in xs))
                await asyncio.to_thread(running.proxy.close)
                with pytest.raises(Exception):  # noqa: B017 (the SDK's own error)
                    await call
            gate.set()
        return running

    running = asyncio.run(scenario())
    proxy = running.proxy
    [call] = Truth(running.client_router).calls
    assert call.answered_on == [], "the wire: never answered"
    assert proxy.process.returncode == 0
    broken = proxy.counts(BROKEN, LEG, FATE)
    assert broken == {("client_proxy", "lost"): 1}, (broken, proxy.stderr[-2000:])
    assert proxy.counts(GAPS, LEG, KIND) == {("client_proxy", "orphaned_request"): 1}
    [line] = lost_line(proxy)
    assert CLIENT_WORDS in line and "the proxy stopped" in line, line

