"""Resumes that do not continue the stream (issue 22), through real stacks: the
resumable clients of the installed MCP SDK major (mcp 2.x ``mode="legacy"``,
mcp 1.x) against the same major's streamable-HTTP server with an event store,
behind the demo's loopback router, which cuts the first ``tools/call`` stream
right after its progress notification and records every exchange.

At the client's resume the server is stopped (no HTTP answer: ``failed``; or a
balancer's 502: ``rejected``), or restarted (a fresh instance that does not
know the session: 404, ``rejected``), or it refuses the cursor its store lost
(the server guard's 410: ``rejected``, not ``gap``), or it answers 200 with an
empty replay again and again (``gap``; enforce fails the call at the first).
In each, the router's record shows the call was never answered and never
re-issued: its fate is ``lost``, which is the ``orphaned_request`` gap.  The
SDKs retry a refused or failed resume: the tries with one cursor are one
attempt, so the attempts expected are the distinct cursors the wire shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from mcp_resumption_demo.loopback import LoopbackServer
from mcp_resumption_demo.router import Backend
from server_harness import server_instrumented
from wire import (
    MCP1,
    MODES,
    RESUMABLE_CLIENTS,
    AppClient,
    IntegerEventStore,
    Truth,
    fates,
    instrument_env,
    orphan_logs,
    sdk_app,
    sdk_stack,
    wait_until,
)

CONFIRM = 1.0  # the confirmation (and reissue) window of these tests, s
DEADLINE = CONFIRM + 6
# What the application waits for the cut call: mcp 2.x fails it itself once
# its reconnect loop gives up; mcp 1.x leaves it waiting, so this ends it.
GIVE_UP = {MCP1: 2.0}


async def call_never_answered(client: AppClient) -> tuple[BaseException, float]:
    started = time.monotonic()
    try:
        answer = await client.call("x", timeout=GIVE_UP.get(client.kind, 10.0))
    except Exception as error:  # what the SDK raises is its business
        return error, time.monotonic() - started
    raise AssertionError(f"the cut call returned {answer!r}")


def cursors(requests) -> set[str]:
    return {request.header("last-event-id") for request in requests}


def assert_lost(telemetry, truth: Truth) -> None:
    [call] = truth.cut
    assert truth.fate(call) == "lost", "the wire: never answered, never re-issued"
    assert fates(telemetry) == {"lost": 1}
    assert telemetry.gap_kinds().get("orphaned_request") == 1
    [log] = orphan_logs(telemetry)
    assert log.log_record.attributes["jsonrpc.request.id"] == str(call.id)
    assert log.log_record.attributes["mcp.method.name"] == "tools/call"


def run(telemetry, kind, app, at_resume=None, *, guard: str | None = None):
    """The scenario: one call, cut; ``at_resume`` acts at its resume.  Returns
    (router, the call's error, how long the call took)."""

    async def scenario():
        async with sdk_stack(app) as (router, fleet, backend):
            if at_resume is not None:
                fleet.at_resume = lambda: at_resume(fleet, backend)
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    error, took = await call_never_answered(client)
                    await wait_until(lambda: fates(telemetry), DEADLINE)
            return router, error, took

    with server_instrumented(telemetry, guard=guard) if guard else contextlib.nullcontext():
        return asyncio.run(scenario())


async def stop(backend: LoopbackServer) -> None:
    await asyncio.to_thread(backend.close)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_server_stopped_at_reconnect_is_failed_and_the_call_lost(telemetry, monkeypatch,
                                                                   kind):
    """The server is gone when the client resumes, and nothing answers in its
    place (the router closes the connection before any status line)."""
    instrument_env(monkeypatch, "observe", CONFIRM)

    async def at_resume(fleet, backend):
        await stop(backend)
        return None  # no HTTP answer

    router, _, _ = run(telemetry, kind, sdk_app(IntegerEventStore()), at_resume)
    truth = Truth(router)
    assert truth.resumes == [], "no resume got an HTTP answer"
    assert truth.refused_resumes, "the client tried to resume"
    assert fates(telemetry) == {"lost": 1}
    assert telemetry.outcomes() == {"failed": len(cursors(truth.refused_resumes))}
    assert_lost(telemetry, truth)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_server_stopped_behind_a_balancer_is_rejected(telemetry, monkeypatch, kind):
    """The server is gone when the client resumes and the balancer answers 502."""
    instrument_env(monkeypatch, "observe", CONFIRM)

    async def at_resume(fleet, backend):
        await stop(backend)
        return fleet.backend  # the router answers 502: upstream unavailable

    router, _, _ = run(telemetry, kind, sdk_app(IntegerEventStore()), at_resume)
    truth = Truth(router)
    assert truth.resumes and {resume.status for resume in truth.resumes} == {502}
    outcomes = telemetry.outcomes()
    assert outcomes == {"rejected": len(cursors(r.request for r in truth.resumes))}, outcomes
    assert_lost(telemetry, truth)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_server_restarted_at_reconnect_is_rejected(telemetry, monkeypatch, kind):
    """A fresh instance (new store, no sessions) answers the resume: 404."""
    instrument_env(monkeypatch, "observe", CONFIRM)
    restarted: list[LoopbackServer] = []

    async def at_resume(fleet, backend):
        await stop(backend)
        restarted.append(await LoopbackServer(sdk_app(IntegerEventStore()), name="new").astart())
        fleet.backend = Backend("new", restarted[0].port)
        return fleet.backend

    try:
        router, _, _ = run(telemetry, kind, sdk_app(IntegerEventStore()), at_resume)
    finally:
        for server in restarted:
            server.close()
    truth = Truth(router)
    assert truth.resumes and {resume.status for resume in truth.resumes} == {404}
    assert {resume.backend for resume in truth.resumes} == {"new"}
    outcomes = telemetry.outcomes()
    assert outcomes == {"rejected": len(cursors(r.request for r in truth.resumes))}, outcomes
    assert_lost(telemetry, truth)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_refused_resume_is_rejected_not_gap(telemetry, monkeypatch, kind, mode):
    """The store lost every cursor and the server guard refuses the resume
    (410) in a live session: ``rejected``, even though the call is then lost.
    In enforce mode, mcp 1.x's pending call ends with an error, not a wait."""
    instrument_env(monkeypatch, mode, CONFIRM)
    if mode == "enforce":
        monkeypatch.setitem(GIVE_UP, MCP1, 10.0)  # the caller's own timeout, far away
    router, error, took = run(telemetry, kind, sdk_app(IntegerEventStore(lost=True)),
                              guard="reject")
    truth = Truth(router)
    assert truth.resumes and {resume.status for resume in truth.resumes} == {410}
    outcomes = telemetry.outcomes()
    assert outcomes == {"rejected": len(cursors(r.request for r in truth.resumes))}, outcomes
    assert_lost(telemetry, truth)
    if mode == "enforce":
        assert not isinstance(error, TimeoutError), "the call ended, not the caller's patience"
        assert took < CONFIRM + 3, took


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_enforce_fails_the_call_at_the_first_empty_replay(telemetry, monkeypatch, kind):
    """The store lost every cursor and the SDK server answers each resume with
    200 and an empty stream that ends at once; the SDKs would resume about once
    a second until the caller's timeout.  Enforce fails the pending call with
    the gap's error at the first ``replay_unconfirmed``."""
    instrument_env(monkeypatch, "enforce", CONFIRM)
    monkeypatch.setitem(GIVE_UP, MCP1, 10.0)
    router, error, took = run(telemetry, kind, sdk_app(IntegerEventStore(lost=True)))
    truth = Truth(router)
    assert truth.resumes and {resume.status for resume in truth.resumes} == {200}
    assert all(not any(e.data for e in resume.events) for resume in truth.resumes), "empty"
    assert not isinstance(error, TimeoutError), "the call ended, not the caller's patience"
    assert "ResumptionGapError" in str(error), repr(error)
    assert took < CONFIRM + 3, took
    assert len(truth.resumes) <= 3, "the SDK did not go on resuming"
    assert telemetry.gap_kinds().get("replay_unconfirmed", 0) >= 1
    assert_lost(telemetry, truth)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_repeated_empty_replay_in_observe_mode_loses_the_call_once(telemetry, monkeypatch,
                                                                     kind):
    """The same server in observe mode: the client resumes until the caller
    gives up; each empty replay is a ``gap`` attempt, and the call is lost once."""
    instrument_env(monkeypatch, "observe", CONFIRM)
    monkeypatch.setitem(GIVE_UP, kind, 2.0)
    router, _, _ = run(telemetry, kind, sdk_app(IntegerEventStore(lost=True)))
    truth = Truth(router)
    statuses = [resume.status for resume in truth.resumes]
    # Each resume gets 200 and nothing; one still in flight when the
    # application gives up and ends the session meets its end: the server's
    # 404, or the router's 502 when the session's end (or the stack's) closed
    # its upstream connection before a status line, which the client may
    # have read (rejected), lost with its connection (failed) or left.
    assert statuses and set(statuses[:-1]) <= {200} and statuses[-1] in (200, 404, 502), statuses
    outcomes = telemetry.outcomes()
    if statuses[-1] == 502:
        assert "gap" in outcomes and set(outcomes) <= {"gap", "rejected", "failed"}, outcomes
        assert sum(outcomes.values()) - outcomes["gap"] <= 1, outcomes
    else:
        expected = {"gap"} | ({"rejected"} if statuses[-1] == 404 else set())
        assert set(outcomes) == expected, outcomes
    assert_lost(telemetry, truth)
