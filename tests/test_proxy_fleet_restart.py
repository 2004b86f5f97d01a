"""A rolling restart of a ``--resumable`` fleet (issue 45): two real proxy
processes share one real redis-server behind a real HAProxy
(tests/fleet_stack.py); the instance carrying a call is stopped (SIGTERM)
while the call streams through it.  Its drain ends with the tool still
working, so it cuts the client's stream; the client resumes, and the
balancer (the instance in maintenance, as a health check puts it) sends the
resume to the other instance.

The wire truth is the routers': the client router's record of the call's
stream and of the resume (which carried the result), HAProxy's choice of
instance as the upstream router saw it, and the drained process's exit.

* resumed: the survivor serves every event and the result; the fleet counts
  the call once, ``answered``, by the survivor; the drained instance counts
  it neither lost nor answered, and writes no lost-call line;
* never resumed (the client router refuses every resume): the call is
  ``lost`` once for the fleet, with its ``orphaned_request`` gap and its
  line, decided by the survivor once the window has passed, the drained
  instance long gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time

import pytest

from fleet_stack import FleetStack, fleet, instance
from proxy_harness import LEG, Proxy
from redis_stack import RedisServer
from test_proxy_resumable import PROXY_ID
from wire import RESUMABLE_CLIENTS, AppClient, IntegerEventStore, is_progress, message, sdk_app

DRAIN = 1.5
CONFIRM = 2.0
BROKEN = "mcp.client.resumption.broken_requests"
GAPS = "mcp.client.resumption.gaps"
FATE = "mcp.resumption.request.fate"
GAP_KIND = "mcp.resumption.gap.kind"
LOST_LINE = "mcp-resumption lost call:"
LEGS = ("client_proxy", "proxy_server")


def the_call(exchanges):
    calls = [e for e in exchanges if b'"tools/call"' in e.request.body]
    return calls[0] if calls else None


def result_text(exchange) -> str | None:
    for event in exchange.events:
        found = message(event) or {}
        if "result" in found and "content" in found["result"]:
            return found["result"]["content"][0]["text"]
    return None


async def until(condition, timeout: float, what) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        await asyncio.sleep(0.02)


class Restart:
    """What one rolling restart left: the stack, the instances, the answer."""

    running: FleetStack
    drained: str
    survivor: str
    code: int | None
    answer: object


async def call_into(kind: str, url: str, answer: list, done: asyncio.Event) -> None:
    """The client calls ``work``; stays open until ``done`` (its transport
    must outlive the call's last resume)."""
    async with AppClient(kind, url) as client:
        try:
            answer.append(await client.call("x", timeout=20))
        except BaseException as error:  # what the SDK raises is its business
            answer.append(error)
        await done.wait()


def restart(kind: str, redis: RedisServer | None, *, resumed: bool) -> Restart:
    async def scenario() -> Restart:
        seen = Restart()
        gate = threading.Event()
        done = asyncio.Event()
        answer: list = []
        async with fleet(
            sdk_app(IntegerEventStore(), answer_when=gate),
            redis,
            proxy_args=("--resumable", "--drain", str(DRAIN)),
            proxy_env={"OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT": str(CONFIRM)},
            refuse_resumes=not resumed,
        ) as running:
            seen.running = running
            # A task of its own: mcp 1.x's transport cancels the task it was
            # entered in when its stream fails.
            calling = asyncio.ensure_future(call_into(kind, running.url, answer, done))
            try:
                await running.client_router.wait_for(
                    lambda log: (e := the_call(log)) is not None and any(map(is_progress, e.events))
                )
                seen.drained = running.carried_call()
                seen.survivor = running.other(seen.drained)
                stopped = running.proxies[seen.drained]
                stopped.process.send_signal(signal.SIGTERM)
                seen.code = await asyncio.to_thread(stopped.process.wait, DRAIN + 10)
                # The tool answers once the drained instance is gone: only the
                # survivor can carry the answer.
                gate.set()
                survivor = running.proxies[seen.survivor]
                if resumed:
                    await until(lambda: answer, 30, "the client never got its answer")
                else:
                    # The survivor decides once the window has passed.
                    await until(lambda: all(reported(survivor, leg)["lines"] for leg in LEGS),
                                30 + CONFIRM, lambda: (survivor.stderr, stopped.stderr))
                    await until(lambda: answer, 30, "the client never gave up")
            finally:
                gate.set()
                done.set()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(calling, 15)
        seen.answer = answer[0] if answer else None
        return seen

    return asyncio.run(scenario())


def reported(proxy: Proxy, leg: str = "client_proxy") -> dict:
    """What one proxy reported on ``leg``: fates, gaps, lost-call lines."""
    return {
        "fates": {f: n for (on, f), n in proxy.counts(BROKEN, LEG, FATE).items() if on == leg},
        "gaps": {k: n for (on, k), n in proxy.counts(GAPS, LEG, GAP_KIND).items() if on == leg},
        "lines": sum(LOST_LINE in line and f"leg={leg}" in line
                     for line in proxy.stderr.splitlines()),
    }


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_rolling_restart_of_the_fleet_loses_nothing_and_pages_nobody(
    redis_server, kind
) -> None:
    redis_server.client().flushall()
    seen = restart(kind, redis_server, resumed=True)
    running = seen.running
    # The wire: the call's stream reached the client through the drained
    # instance, carried its progress and no answer, and was ended by the
    # proxy (not severed by the router) ...
    call = the_call(running.client_router.exchanges)
    assert any(map(is_progress, call.events)) and result_text(call) is None
    assert not call.severed
    assert running.drained == [seen.drained]
    # ... the client resumed with the proxy's id, and the resume carried the
    # result, through the survivor (HAProxy's choice, as the server saw it).
    resumes = [e for e in running.client_router.exchanges if e.request.header("last-event-id")]
    assert resumes and all(PROXY_ID.match(e.request.header("last-event-id")) for e in resumes)
    assert [result_text(e) for e in resumes if result_text(e)] == ["done x"]
    upstream_resumes = [
        e for e in running.upstream_router.exchanges if e.request.header("last-event-id")
    ]
    assert {instance(e) for e in upstream_resumes} <= {seen.survivor}, upstream_resumes
    assert seen.answer == "done x", seen.answer
    assert seen.code == 0, running.proxies[seen.drained].stderr
    # What each process reported: the survivor settled it answered; the
    # drained one counted nothing lost and paged nobody.
    drained = reported(running.proxies[seen.drained])
    survivor = reported(running.proxies[seen.survivor])
    assert drained == {"fates": {}, "gaps": {}, "lines": 0}, drained
    assert survivor == {"fates": {"answered": 1}, "gaps": {}, "lines": 0}, survivor
    # The upstream leg too: the stopped instance's stream to the server broke
    # as it stopped; the survivor resumed it and took the request over.
    upstream = {name: reported(running.proxies[name], "proxy_server")
                for name in (seen.drained, seen.survivor)}
    assert upstream[seen.drained] == {"fates": {}, "gaps": {}, "lines": 0}, upstream
    assert upstream[seen.survivor]["fates"] == {"answered": 1}, upstream


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_call_cut_by_a_restart_and_never_resumed_is_lost_once_for_the_fleet(
    redis_server, kind
) -> None:
    redis_server.client().flushall()
    seen = restart(kind, redis_server, resumed=False)
    running = seen.running
    # The wire: the call's stream ended without its answer; every resume
    # the client tried was refused before the balancer: none reached the fleet.
    call = the_call(running.client_router.exchanges)
    assert any(map(is_progress, call.events)) and result_text(call) is None
    assert running.client_router.refused, "the client never tried to resume"
    assert all(r.header("last-event-id") for r in running.client_router.refused)
    assert not any(e.request.header("last-event-id") for e in running.client_router.exchanges)
    assert not any(e.request.header("last-event-id") for e in running.upstream_router.exchanges)
    assert isinstance(seen.answer, BaseException), seen.answer
    assert seen.code == 0, running.proxies[seen.drained].stderr
    # Lost once for the fleet, with its gap and its line, by the survivor.
    drained = reported(running.proxies[seen.drained])
    survivor = reported(running.proxies[seen.survivor])
    assert drained == {"fates": {}, "gaps": {}, "lines": 0}, drained
    assert survivor == {"fates": {"lost": 1}, "gaps": {"orphaned_request": 1}, "lines": 1}, (
        survivor
    )
    # The upstream leg too: the stopped instance's stream to the server broke
    # as it stopped and nobody resumed it: lost once, by the survivor's sweep.
    upstream = {name: reported(running.proxies[name], "proxy_server")
                for name in (seen.drained, seen.survivor)}
    assert upstream[seen.drained] == {"fates": {}, "gaps": {}, "lines": 0}, upstream
    assert upstream[seen.survivor] == {
        "fates": {"lost": 1}, "gaps": {"orphaned_request": 1}, "lines": 1}, upstream
