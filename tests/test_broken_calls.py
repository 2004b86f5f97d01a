"""Every broken call has one fate (issue 22), through real stacks: the installed
MCP SDK major's clients (mcp 2.x ``Client(url)`` in its default mode, which
speaks 2026-07-28 without sessions or event ids, and in ``mode="legacy"``;
mcp 1.x's ``ClientSession``) against the same major's streamable-HTTP server,
with and without an event store, behind the demo's loopback router, which
cuts the first ``tools/call`` stream right after its progress notification
(before the answer) and records every exchange.

Each case first proves from the router's record (tests/wire.py) what
happened to the call: cut or not, answered later, re-issued under a new id, or
neither; and only then compares the plugin's counts with it: the fate on
``mcp.client.resumption.broken_requests``, the attempt's outcome, and the
``orphaned_request`` gap that a lost call is.  In observe mode and in enforce
mode (``OTEL_PYTHON_MCP_RESUMPTION_MODE``): enforce must not change a fate, nor
fail a call that was answered.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from wire import (
    BROKEN,
    CLIENTS,
    FATE,
    LEGACY,
    MCP1,
    MODERN,
    MODES,
    RESUMABLE_CLIENTS,
    AppClient,
    IntegerEventStore,
    Truth,
    assert_reissued,
    fates,
    first_call_fails,
    instrument_env,
    orphan_logs,
    sdk_app,
    sdk_stack,
    wait_until,
)

CONFIRM = 1.0  # the confirmation window, which is also the reissue window (s)
DEADLINE = CONFIRM + 6  # for a fate decided by the window, on a loaded machine


def attempts(telemetry) -> dict[str, int]:
    return telemetry.outcomes()


def fate_points(telemetry) -> list:
    return [point for point in telemetry.points(BROKEN) if point.value]


def assert_series(telemetry, router) -> None:
    """Every fate counted is the router's server, on streamable HTTP."""
    for point in fate_points(telemetry):
        assert point.attributes["server.address"] == "127.0.0.1"
        assert point.attributes["server.port"] == router.port
        assert point.attributes["mcp.transport"] == "streamable-http"
        assert point.attributes[FATE] in ("answered", "reissued", "lost")


def assert_zero_series(telemetry, router) -> None:
    """No false fate, and not because the counter is missing: every fate and
    the new outcomes are series of this server that start at 0 and stay there."""
    port = router.port
    fate_series = {
        point.attributes[FATE]: point.value for point in telemetry.points(BROKEN)
        if point.attributes.get("server.port") == port
        and point.attributes.get("mcp.transport") == "streamable-http"
    }
    assert fate_series == {"answered": 0, "reissued": 0, "lost": 0}, fate_series
    outcome_series = {
        point.attributes["mcp.resumption.outcome"]: point.value
        for point in telemetry.points("mcp.client.resumption.attempts")
        if point.attributes.get("server.port") == port
        and point.attributes.get("mcp.transport") == "streamable-http"
    }
    assert outcome_series.get("not_resumable") == 0 and outcome_series.get("failed") == 0, (
        outcome_series
    )


# A cut stream with nothing to resume it with: no event store behind a
# 2025-11-25 session (no event id on the stream), and the 2026-07-28 protocol,
# which has no resumption whatever the server keeps.
NOT_RESUMABLE = [
    pytest.param(MODERN, False, marks=pytest.mark.mcp2, id="mcp2-default-no-store"),
    pytest.param(MODERN, True, marks=pytest.mark.mcp2, id="mcp2-default-store"),
    pytest.param(LEGACY, False, marks=pytest.mark.mcp2, id="mcp2-legacy-no-store"),
    pytest.param(MCP1, False, marks=pytest.mark.mcp1, id="mcp1-no-store"),
]


def assert_cut_without_ids(truth: Truth):
    [call] = truth.cut
    assert truth.event_ids_on(call) == [], "the cut stream carried no event id"
    assert truth.resumes == [] and truth.refused == [], "nothing was resumed"
    return call


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("kind", "with_store"), NOT_RESUMABLE)
def test_a_cut_call_the_application_reissues_is_reissued(telemetry, monkeypatch, kind,
                                                         with_store, mode):
    instrument_env(monkeypatch, mode, CONFIRM)

    async def scenario():
        store = IntegerEventStore() if with_store else None
        async with sdk_stack(sdk_app(store)) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    await first_call_fails(client)
                    assert await client.call("x") == "done x"
                    await wait_until(lambda: fates(telemetry), DEADLINE)
                    fates_open = fates(telemetry)
            return router, fates_open

    router, fates_open = asyncio.run(scenario())
    truth = Truth(router)
    call = assert_cut_without_ids(truth)
    assert_reissued(truth, call, CONFIRM)

    assert fates_open == {"reissued": 1}
    assert fates(telemetry) == {"reissued": 1}, "counted once, also after the exit"
    assert attempts(telemetry) == {"not_resumable": 1}
    assert telemetry.gap_kinds() == {}
    assert telemetry.resume_spans() == [], "nothing was resumed: no mcp.resume span"
    assert_series(telemetry, router)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("kind", "with_store"), NOT_RESUMABLE)
def test_a_cut_call_the_application_gives_up_on_is_lost(telemetry, monkeypatch, kind,
                                                        with_store, mode):
    """The application gives up on the cut call and goes on with another one
    (other params: not a re-issue); the client stays open, so the fate is the
    reissue window's, not the session's end."""
    instrument_env(monkeypatch, mode, CONFIRM)

    async def scenario():
        store = IntegerEventStore() if with_store else None
        async with sdk_stack(sdk_app(store)) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    await first_call_fails(client)
                    assert await client.call("other") == "done other"
                    await wait_until(lambda: fates(telemetry), DEADLINE)
                    open_counts = fates(telemetry), telemetry.gap_kinds(), attempts(telemetry)
            return router, open_counts

    router, (fates_open, gaps_open, attempts_open) = asyncio.run(scenario())
    truth = Truth(router)
    call = assert_cut_without_ids(truth)
    assert truth.fate(call) == "lost"
    assert len(truth.calls) == 2 and truth.calls[1].answered_on, "the other call was answered"

    assert fates_open == {"lost": 1}, "decided while the client still runs"
    assert gaps_open == {"orphaned_request": 1}
    assert attempts_open == {"not_resumable": 1}
    assert fates(telemetry) == {"lost": 1}, "counted once, also after the exit"
    assert telemetry.gap_kinds() == {"orphaned_request": 1}
    assert attempts(telemetry) == {"not_resumable": 1}
    [log] = orphan_logs(telemetry)
    assert log.log_record.attributes["jsonrpc.request.id"] == str(call.id)
    assert log.log_record.attributes["mcp.method.name"] == "tools/call"
    assert telemetry.resume_spans() == []
    assert_series(telemetry, router)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_faithful_resume_is_answered(telemetry, monkeypatch, kind, mode):
    instrument_env(monkeypatch, mode, CONFIRM)

    async def scenario():
        async with sdk_stack(sdk_app(IntegerEventStore())) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    assert await client.call("x") == "done x"
                    await wait_until(lambda: fates(telemetry), DEADLINE)
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    [call] = truth.cut
    ids = truth.event_ids_on(call)
    assert ids, "the cut stream carried event ids"
    [resume] = truth.resumes
    assert resume.request.header("last-event-id") == ids[-1] and resume.status == 200
    assert call.answered_on == [resume.index], "the answer came on the resumed stream"
    assert truth.fate(call) == "answered"

    assert fates(telemetry) == {"answered": 1}
    assert telemetry.gap_kinds() == {}
    outcomes = attempts(telemetry)
    assert set(outcomes) <= {"resumed", "caught_up"} and outcomes, outcomes
    assert_series(telemetry, router)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_an_answer_after_a_counter_reset_is_answered_not_orphaned(telemetry, monkeypatch, kind):
    """A stateful SDK server whose store numbers the replay from 1 again: the
    reset is a gap (``id_regression``), but the call's answer does arrive on the
    resumed stream, so it is ``answered``: observed, never predicted."""
    instrument_env(monkeypatch, "observe", CONFIRM)

    async def scenario():
        store = IntegerEventStore(reset_on_replay=True)
        async with sdk_stack(sdk_app(store)) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    with contextlib.suppress(Exception):  # what the SDK makes of the reset
                        await client.call("x", timeout=3)
                    await wait_until(lambda: fates(telemetry), DEADLINE)
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    [call] = truth.cut
    [resume, *_] = truth.resumes
    assert resume.index in call.answered_on, "the wire shows the answer on the resumed stream"
    replayed = [int(event.id) for event in resume.events if event.id]
    assert replayed and replayed[0] < int(truth.event_ids_on(call)[-1]), "the counter reset"
    assert truth.fate(call) == "answered"

    assert fates(telemetry) == {"answered": 1}
    kinds = telemetry.gap_kinds()
    assert "orphaned_request" not in kinds, kinds
    assert kinds.get("id_regression", 0) >= 1
    assert orphan_logs(telemetry) == []


# ------------------------------------------------------------ no false fate


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_store", [False, True], ids=["no-store", "store"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_clean_run_has_no_broken_request(telemetry, monkeypatch, kind, with_store, mode):
    instrument_env(monkeypatch, mode, CONFIRM)

    async def scenario():
        store = IntegerEventStore() if with_store else None
        async with sdk_stack(sdk_app(store), cut=False) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    assert await client.call("x") == "done x"
                    assert await client.call("x") == "done x"
                    assert await client.call("y") == "done y"
            # the instrumentor is gone: whatever was still undecided is decided now
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    assert not truth.any_severed() and truth.cut == []
    assert all(call.answered_on == [call.exchange.index] for call in truth.calls)
    assert len(truth.calls) == 3

    assert fates(telemetry) == {}
    assert telemetry.gap_kinds() == {}
    assert attempts(telemetry) == {}
    assert_zero_series(telemetry, router)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_sse_polling_has_no_broken_request(telemetry, monkeypatch, kind, mode):
    """The tool closes its stream on purpose after a priming event (2025-11-25
    polling); the client resumes and gets the answer: a poll, not a break."""
    instrument_env(monkeypatch, mode, CONFIRM)

    async def scenario():
        store = IntegerEventStore()
        async with sdk_stack(sdk_app(store, polling=True), cut=False) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    assert await client.call("x") == "done x"
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    assert not truth.any_severed()
    [call] = truth.calls
    assert call.exchange.events[0].retry is not None, "primed with retry:"
    [poll, *_] = truth.resumes
    assert poll.index in call.answered_on, "the answer came on the poll"

    assert fates(telemetry) == {}
    assert telemetry.gap_kinds() == {}
    assert set(attempts(telemetry)) <= {"resumed", "caught_up"}
    assert_zero_series(telemetry, router)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_post_answered_with_json_has_no_broken_request(telemetry, monkeypatch, kind, mode):
    instrument_env(monkeypatch, mode, CONFIRM)

    async def scenario():
        # The router would cut a stream after the progress event; a JSON
        # answer has none.
        async with sdk_stack(sdk_app(json_response=True)) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    assert await client.call("x") == "done x"
                    assert await client.call("y", progress=False) == "done y"
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    assert not truth.any_severed()
    for call in truth.calls:
        assert call.exchange.status == 200
        assert call.exchange.response_header("content-type").startswith("application/json")

    assert fates(telemetry) == {}
    assert telemetry.gap_kinds() == {}
    assert attempts(telemetry) == {}
    assert_zero_series(telemetry, router)


# ------------------------------------------------------------ when "lost" is decided
# With a window far longer than the test, a fate present right after the
# client's end was decided by that end, not by the window.
LONG_WINDOW = 30.0


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_session_closed_with_a_cut_call_pending_loses_it_at_once(telemetry, monkeypatch,
                                                                   kind):
    instrument_env(monkeypatch, "observe", LONG_WINDOW)

    async def scenario():
        async with sdk_stack(sdk_app()) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    await first_call_fails(client)
                    assert fates(telemetry) == {}, "the window has not passed"
                # the client closed its session (DELETE)
                at_close = fates(telemetry), telemetry.gap_kinds()
            return router, at_close

    router, (fates_at_close, gaps_at_close) = asyncio.run(scenario())
    truth = Truth(router)
    call = assert_cut_without_ids(truth)
    assert truth.fate(call) == "lost"
    assert [e.request.method for e in truth.exchanges][-1] == "DELETE"
    assert fates_at_close == {"lost": 1}, "decided by the session's end"
    assert gaps_at_close == {"orphaned_request": 1}
    assert fates(telemetry) == {"lost": 1}


@pytest.mark.mcp2
def test_a_cut_call_pending_at_exit_is_lost_before_the_providers_flush(telemetry, monkeypatch):
    """The 2026-07-28 client has no session to close: the process ends (the
    instrumentor is removed) with the call's fate undecided."""
    instrument_env(monkeypatch, "observe", LONG_WINDOW)

    async def scenario():
        async with sdk_stack(sdk_app()) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(MODERN, router.url + "/mcp") as client:
                    await first_call_fails(client)
                assert fates(telemetry) == {}, "no session end, and the window has not passed"
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    call = assert_cut_without_ids(truth)
    assert truth.fate(call) == "lost"
    assert "DELETE" not in [e.request.method for e in truth.exchanges]
    assert fates(telemetry) == {"lost": 1}, "counted at exit"
    assert telemetry.gap_kinds() == {"orphaned_request": 1}
    assert telemetry.outcomes() == {"not_resumable": 1}
