"""mcp-resumption-proxy stopped by SIGTERM while a call is in flight.

The proxy runs as a supervisor runs it (the venv's ``mcp-resumption-proxy``
console script, a child), with ``--drain`` and ``--admin``, between a real SDK
client and a real SDK server whose tool answers only when the test lets it:

    client -> client router -> proxy -> upstream router -> SDK server

SIGTERM arrives once the call's progress event reached the client (the client
router's record).  The routers' records are the wire truth of each leg: what
the client got before its stream ended, that the proxy left the upstream's
stream, and when.  What the proxy must do: stop accepting connections and
report not ready at once, let the open streams run for the drain period (a
call answered within it reaches its client), then end what is left, exit 0
within the period plus 1 s with no traceback, and still make its last export
and the plugin's summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import threading
import time

import httpx
import pytest

from helpers import console_metrics
from proxy_harness import LEG, Proxy, stack
from wire import CLIENTS, MCP1, MODERN, AppClient, is_progress, message, sdk_app

DRAIN = 1.5
BROKEN = "mcp.client.resumption.broken_requests"
GAPS = "mcp.client.resumption.gaps"
FATE = "mcp.resumption.request.fate"
GAP_KIND = "mcp.resumption.gap.kind"
ADMIN = ("--admin", "127.0.0.1:0", "--upstream-probe", "0.1")
TRACEBACK = re.compile(r"Traceback|CancelledError|Exception in ASGI|ASGI callable returned")


def admin_of(proxy: Proxy, timeout: float = 10.0) -> str:
    """The admin address the proxy printed (stderr, right after its URL)."""
    deadline = time.monotonic() + timeout
    while (found := re.search(r"admin on (http://\S+)", proxy.stderr)) is None:
        assert time.monotonic() < deadline and proxy.process.poll() is None, proxy.stderr
        time.sleep(0.01)
    return found.group(1)


def status_of(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2.0).status_code
    except httpx.HTTPError:
        return None


async def until_status(url: str, wanted: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (status := await asyncio.to_thread(status_of, url)) != wanted:
        assert time.monotonic() < deadline, (url, status)
        await asyncio.sleep(0.02)


def a_new_post(proxy: Proxy) -> str:
    """What a new client connecting to the proxy gets."""
    try:
        answer = httpx.post(proxy.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                            headers={"accept": "application/json, text/event-stream"},
                            timeout=2.0)
    except httpx.ConnectError:
        return "refused"
    return f"HTTP {answer.status_code}"


def the_call(exchanges) -> object:
    calls = [e for e in exchanges if b'"tools/call"' in e.request.body]
    return calls[0] if calls else None


def answered(exchange) -> bool:
    """The call's exchange carried its JSON-RPC response."""
    return any("result" in (message(event) or {}) for event in exchange.events)


class Stopped:
    """What one SIGTERM mid-call left: the stack's records and the times."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.readiness_during: int | None = None
        self.health_during: int | None = None
        self.new_post: str | None = None
        self.code: int | None = None


async def stop_mid_call(kind: str, *, drain: float, release_after: float | None,
                        json_response: bool = False) -> Stopped:
    """One call through the stack; SIGTERM once its progress reached the
    client (``json_response``: once the call reached the server, which
    answers with JSON, its headers only with its answer); the tool answers
    ``release_after`` seconds after the SIGTERM (None: never, until the
    proxy is gone)."""
    gate = threading.Event()
    seen = Stopped()
    async with stack(sdk_app(answer_when=gate, json_response=json_response), script=True,
                     proxy_args=("--drain", str(drain), *ADMIN)) as running:
        seen.stack = running
        proxy = running.proxy
        admin = await asyncio.to_thread(admin_of, proxy)
        await until_status(admin + "/readyz", 200)
        done = asyncio.Event()
        # A task of its own: mcp 1.x's transport cancels the task it was
        # entered in when its stream fails, and the test's task must go on.
        calling = asyncio.ensure_future(call_until(kind, running.url, drain + 20, done))
        try:
            if json_response:
                await running.upstream_router.wait_for(lambda log: the_call(log) is not None)
            else:
                await running.client_router.wait_for(
                    lambda log: (e := the_call(log)) is not None
                    and any(map(is_progress, e.events)))
            client_leg = the_call(running.client_router.exchanges)

            async def ended() -> None:
                await client_leg.finished.wait()
                seen.times["client stream ended"] = time.monotonic()

            watching = asyncio.ensure_future(ended())
            seen.times["sigterm"] = signalled = time.monotonic()
            proxy.process.send_signal(signal.SIGTERM)
            await until_status(admin + "/readyz", 503)
            seen.times["not ready"] = time.monotonic()
            seen.health_during = await asyncio.to_thread(status_of, admin + "/healthz")
            seen.new_post = await asyncio.to_thread(a_new_post, proxy)
            seen.times["refused"] = time.monotonic()
            if release_after is not None:
                # The tool's own running time, past the 2 s that uvicorn's
                # graceful shutdown gave the proxy's streams before the drain.
                await asyncio.sleep(max(0.0, signalled + release_after - time.monotonic()))
                seen.times["released"] = time.monotonic()
                gate.set()
            seen.code = await asyncio.to_thread(proxy.process.wait, drain + 10)
            seen.times["exited"] = time.monotonic()
            seen.upstream_status = the_call(running.upstream_router.exchanges).status
            await asyncio.wait_for(watching, 10)
            if not json_response:  # (the router waits for the server's headers first)
                await running.upstream_router.wait_for(
                    lambda log: the_call(log) is not None and the_call(log).finished.is_set())
        finally:
            gate.set()  # the server's thread ends either way
            done.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(calling, 15)
    return seen


async def call_until(kind: str, url: str, timeout: float, done: asyncio.Event) -> None:
    """The client calls ``work`` and stays until ``done``."""
    async with AppClient(kind, url) as client:
        call = asyncio.ensure_future(client.call("x", timeout=timeout))
        await done.wait()
        call.cancel()
        with contextlib.suppress(BaseException):
            await call


def since_sigterm(seen: Stopped, what: str) -> float:
    return seen.times[what] - seen.times["sigterm"]


# ================================================================ cut at the drain's end


@pytest.fixture(scope="module", params=CLIENTS)
def cut(request) -> Stopped:
    """A call the tool never answers: the drain ends, the proxy cuts it."""
    return asyncio.run(stop_mid_call(request.param, drain=DRAIN, release_after=None))


def test_sigterm_mid_call_refuses_new_clients_drains_cuts_and_exits_0_quietly(cut) -> None:
    seen = cut
    running = seen.stack
    proxy = running.proxy
    # At once: not ready (while still alive), and a new connection refused.
    assert since_sigterm(seen, "not ready") < DRAIN, seen.times
    assert seen.health_during == 200
    assert seen.new_post == "refused", seen.new_post
    assert since_sigterm(seen, "refused") < DRAIN, seen.times
    # The wire: the client got the progress, then its stream ended, with no
    # answer, no sooner than the drain period; the proxy left the upstream's
    # stream (the tool had not answered).
    client_leg = the_call(running.client_router.exchanges)
    upstream_leg = the_call(running.upstream_router.exchanges)
    assert any(map(is_progress, client_leg.events)) and not answered(client_leg)
    assert not client_leg.severed
    assert upstream_leg.client_closed and not answered(upstream_leg)
    assert DRAIN - 0.1 <= since_sigterm(seen, "client stream ended") <= DRAIN + 1.0, seen.times
    # The exit: status 0, within the drain period plus 1 s, without a traceback.
    assert seen.code == 0, proxy.stderr
    assert since_sigterm(seen, "exited") <= DRAIN + 1.0, seen.times
    assert not TRACEBACK.search(proxy.stderr), proxy.stderr
    assert "were cut" in proxy.stderr, proxy.stderr
    # The last export and the plugin's summary were still made.
    assert console_metrics(proxy.stdout), proxy.stdout[-2000:]
    assert "mcp-resumption summary:" in proxy.stderr, proxy.stderr


def test_the_call_the_drain_cut_is_counted_lost_on_the_client_leg(cut) -> None:
    seen = cut
    proxy = seen.stack.proxy
    broken = proxy.counts(BROKEN, LEG, FATE)
    assert broken == {("client_proxy", "lost"): 1}, (broken, proxy.stderr[-2000:])
    gaps = proxy.counts(GAPS, LEG, GAP_KIND)
    assert gaps.get(("client_proxy", "orphaned_request")) == 1, gaps
    assert not any(leg == "proxy_server" for leg, _ in gaps), gaps


# ================================================================ answered within the drain

ANSWERING = [
    pytest.param(MODERN, marks=pytest.mark.mcp2, id=MODERN),
    pytest.param(MCP1, marks=pytest.mark.mcp1, id=MCP1),
]


@pytest.mark.parametrize("kind", ANSWERING)
def test_a_call_answered_within_the_drain_reaches_its_client(kind) -> None:
    """The tool answers 2.5 s after SIGTERM, with --drain 6: the answer
    reaches the client, and the proxy exits as soon as its streams are done,
    not at the drain's end."""
    seen = asyncio.run(stop_mid_call(kind, drain=6.0, release_after=2.5))
    running = seen.stack
    assert seen.new_post == "refused"
    client_leg = the_call(running.client_router.exchanges)
    assert answered(client_leg), client_leg.events
    # What the client got on its leg (mcp 2.x then asks tools/list for the
    # tool's output schema, which the stopped proxy no longer takes).
    result = [message(e)["result"] for e in client_leg.events if "result" in (message(e) or {})]
    assert result[0]["content"][0]["text"] == "done x", result
    assert seen.code == 0, running.proxy.stderr
    assert seen.times["exited"] - seen.times["released"] < 1.5, seen.times
    assert not TRACEBACK.search(running.proxy.stderr), running.proxy.stderr
    assert "were cut" not in running.proxy.stderr


# ================================================================ cut before the upstream answered


@pytest.mark.parametrize("kind", ANSWERING)
def test_a_call_whose_upstream_never_answered_gets_503_at_the_drains_end(kind) -> None:
    """A server that answers with JSON sends its headers only with the
    answer: at the drain's end the proxy is still waiting for them.  That
    exchange is ended too: the client gets 503, the proxy exits 0 in time,
    without a traceback."""
    seen = asyncio.run(stop_mid_call(kind, drain=DRAIN, release_after=None, json_response=True))
    running = seen.stack
    client_leg = the_call(running.client_router.exchanges)
    assert client_leg.status == 503, client_leg
    # The drain's own 503 (mcp 1.x may close on its status before the body).
    assert client_leg.response_header("retry-after") == "1", client_leg
    assert seen.upstream_status is None  # the server had not answered when the proxy exited
    assert "1 stream(s) still open were cut" in running.proxy.stderr, running.proxy.stderr
    assert seen.code == 0, running.proxy.stderr
    assert DRAIN - 0.1 <= since_sigterm(seen, "client stream ended") <= DRAIN + 1.0, seen.times
    assert since_sigterm(seen, "exited") <= DRAIN + 1.0, seen.times
    assert not TRACEBACK.search(running.proxy.stderr), running.proxy.stderr
