"""A re-issued call says whether it was safe (issue: side effects run twice),
through real stacks: the installed SDK major's client and server behind the
demo's loopback router, which cuts the first ``tools/call`` after its
progress notification and records every exchange (tests/wire.py).

Every ``reissued`` fate is also counted on ``mcp.client.resumption.reissues``
with ``mcp.resumption.reissue.idempotent`` (what the server's last
``tools/list`` declared of the tool: ``idempotentHint`` or ``readOnlyHint``)
and ``mcp.resumption.reissue.risk``: ``may_run_twice`` where the tool is not
declared safe and the server's protocol (before 2026-07-28) does not take a
closed stream for cancellation, which is also one WARNING line; ``none``
otherwise.  A re-issue whose first attempt is answered as well ran twice:
``mcp.client.resumption.duplicate_runs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from wire import (
    GIVE_UP,
    LEGACY,
    MCP1,
    MODERN,
    RESUMABLE_CLIENTS,
    AppClient,
    IntegerEventStore,
    Truth,
    assert_reissued,
    fates,
    first_call_fails,
    instrument_env,
    sdk_app,
    sdk_stack,
    wait_until,
)

CONFIRM = 1.0
DEADLINE = CONFIRM + 6
REISSUES = "mcp.client.resumption.reissues"
DUPLICATES = "mcp.client.resumption.duplicate_runs"
VERDICTS = "opentelemetry.instrumentation.mcp_resumption.verdicts"

# Cut calls nothing can resume, which the application re-issues at once: the
# 2026-07-28 protocol (which cancels a call whose stream closes) and
# 2025-11-25 without an event store (which does not).
CASES = [
    pytest.param(MODERN, marks=pytest.mark.mcp2, id="mcp2-default"),
    pytest.param(LEGACY, marks=pytest.mark.mcp2, id="mcp2-legacy"),
    pytest.param(MCP1, marks=pytest.mark.mcp1, id="mcp1"),
]
# What the application knows of the tool: the server's tools/list declared it
# idempotent, listed it without a hint, or was never asked.
DECLARED = ["idempotent", "no-hint", "unlisted"]


def reissue_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "re-issue may run twice" in r.getMessage()]


@pytest.mark.parametrize("declared", DECLARED)
@pytest.mark.parametrize("kind", CASES)
def test_a_reissue_says_whether_the_call_may_run_twice(telemetry, monkeypatch, caplog, kind,
                                                        declared):
    instrument_env(monkeypatch, "observe", CONFIRM)
    caplog.set_level(logging.WARNING, VERDICTS)

    async def scenario():
        app = sdk_app(idempotent=declared == "idempotent")
        async with sdk_stack(app) as (router, _, _):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    if declared != "unlisted":
                        await client.session.list_tools()
                    await first_call_fails(client)
                    assert await client.call("x") == "done x"
                    await wait_until(lambda: fates(telemetry), DEADLINE)
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    [call] = truth.cut
    assert_reissued(truth, call, CONFIRM)
    assert call.answered_on == [], "the first attempt was never answered"

    idempotent = {"idempotent": "true", "no-hint": "false", "unlisted": "unknown"}[declared]
    cancels = kind == MODERN  # 2026-07-28 takes the closed stream for cancellation
    risky = idempotent != "true" and not cancels
    assert fates(telemetry) == {"reissued": 1}
    assert telemetry.counts(REISSUES, "mcp.resumption.reissue.idempotent") == {idempotent: 1}
    assert telemetry.counts(REISSUES, "mcp.resumption.reissue.risk") == {
        "may_run_twice" if risky else "none": 1
    }
    lines = reissue_lines(caplog)
    assert len(lines) == (1 if risky else 0), lines
    if risky:
        assert "tool=work" in lines[0] and f"idempotent={idempotent}" in lines[0]
    assert telemetry.counts(DUPLICATES) == {}, "the first attempt never ran to an answer"


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_reissue_whose_first_attempt_is_answered_too_ran_twice(telemetry, monkeypatch,
                                                                   caplog, kind):
    """2025-11-25 with an event store: the resume of the cut call is held back
    until the application, having given up on it, re-issued it and got its
    answer; the resume then replays the first attempt's answer too."""
    instrument_env(monkeypatch, "observe", CONFIRM)
    caplog.set_level(logging.WARNING, VERDICTS)
    reissue_answered = asyncio.Event

    async def scenario():
        answered = reissue_answered()

        async def after_the_reissue():
            await answered.wait()
            return fleet.backend

        async with sdk_stack(sdk_app(IntegerEventStore()), at_resume=after_the_reissue) as (
            router, fleet, _
        ):
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    await client.session.list_tools()
                    with contextlib.suppress(Exception):
                        await client.call("x", idle=GIVE_UP)
                    assert await client.call("x") == "done x"
                    answered.set()
                    await wait_until(lambda: telemetry.counts(DUPLICATES), DEADLINE)
            return router

    router = asyncio.run(scenario())
    truth = Truth(router)
    [call, reissue] = truth.calls
    assert call.cut and truth.reissues_of(call) == [reissue]
    assert reissue.answered_on and any(i != call.exchange.index for i in call.answered_on), (
        "the wire shows both attempts answered"
    )
    assert telemetry.counts(DUPLICATES) == {None: 1}
    assert [r for r in caplog.records if "ran twice" in r.getMessage()]
