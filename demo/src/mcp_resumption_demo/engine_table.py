# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The seeds' scenarios played straight into the continuity engine.

No network: each scenario feeds the tracker what a client would observe, so
the rules can be seen at work on the seeds' own numbers in milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.instrumentation.mcp_resumption.rules.continuity import Outcome, ReplayContract
from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import requests_in
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import Stream, Tracker

SERVER = "mcp.example:443"


def _note(n: int | str) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n}})


def _result(request_id: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": []}})


def _read(tracker: Tracker, stream: Stream, events: list[tuple[str, str]], kinds, outcomes):
    for event_id, data in events:
        tracker.event_consumed(stream)
        _collect(tracker.event_received(stream, event_id, data), kinds, outcomes)


def _collect(step, kinds: set[str], outcomes: list[str]) -> None:
    kinds.update(gap.kind.value for gap in step.gaps)
    # A lost request: its orphaned_request gap comes with its fate.
    kinds.update(d.gap.kind.value for d in step.fates if d.gap is not None)
    if step.verdict is not None:
        outcomes.append(step.verdict.outcome.value)


@dataclass(frozen=True)
class EngineScenario:
    name: str
    happened: str
    expected: tuple[str, ...]
    expected_outcome: str
    play: Callable[[Tracker, set[str], list[str]], None]


def _legacy(tracker: Tracker, session: str, ids: list[str]) -> Stream:
    stream = tracker.open_stream(SERVER, "sse")
    tracker.bind_session(stream, session)
    _read(tracker, stream, [(i, _note(i)) for i in ids], set(), [])
    return stream


def _resumed(tracker, session, ids, answered, kinds, outcomes) -> Stream:
    """A legacy stream of ``ids`` in ``session``, all of it consumed, then its
    resume on streamable HTTP from the last id, answered 200 in ``answered``."""
    old = _legacy(tracker, session, ids)
    tracker.event_consumed(old)
    resumed = tracker.open_stream(
        SERVER, "streamable-http", session_id=session, last_event_id=ids[-1]
    )
    _collect(tracker.response(resumed, 200, answered), kinds, outcomes)
    return resumed


def _migration_reset(tracker, kinds, outcomes):
    old = _legacy(tracker, "legacy-7f3a", [str(n) for n in range(4817, 4822)])
    tracker.event_consumed(old)
    tracker.stream_ended(old, "network blip")
    resumed = tracker.open_stream(SERVER, "streamable-http", last_event_id="4821")
    _collect(tracker.response(resumed, 200, "fresh-91c2"), kinds, outcomes)
    _read(tracker, resumed, [("1", _note("new-1")), ("2", _note("new-2"))], kinds, outcomes)


def _shared_allocator_reuse(tracker, kinds, outcomes):
    ids = [str(n) for n in range(1, 10)]
    resumed = _resumed(tracker, "s-12", ids, "s-12", kinds, outcomes)
    _read(tracker, resumed, [("9", _note("per-session 9")), ("10", _note(10))], kinds, outcomes)


def _drain_race(tracker, kinds, outcomes):
    stream = tracker.open_stream(SERVER, "sse")
    tracker.bind_session(stream, "s-77")
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search_index"}}
    tracker.request_sent(SERVER, "s-77", requests_in(json.dumps(body)))
    events = [(f"e-{n}", _note(n)) for n in range(100, 104)] + [("e-104", _result(7))]
    _read(tracker, stream, events, set(), [])
    # severed by the idle proxy before the read loop drained e-104
    tracker.stream_ended(stream, "idle timeout", closed_by_client=True)
    resumed = tracker.open_stream(
        SERVER, "streamable-http", session_id="s-77", last_event_id="e-104"
    )
    _collect(tracker.response(resumed, 200, "s-77"), kinds, outcomes)
    _read(tracker, resumed, [("e-105", _note(105))], kinds, outcomes)
    # The reissue window passes and nothing re-sent tools/call 7: lost.
    _collect(tracker.fates_due(0.0), kinds, outcomes)


def _empty_replay(tracker, kinds, outcomes):
    resumed = _resumed(tracker, "s-5", ["e-1", "e-2"], "s-5", kinds, outcomes)
    _collect(tracker.stream_ended(resumed, "the stream ended"), kinds, outcomes)


def _faithful(tracker, kinds, outcomes):
    resumed = _resumed(tracker, "s-9", ["e-1", "e-2"], "s-9", kinds, outcomes)
    _read(tracker, resumed, [("e-3", _note(3))], kinds, outcomes)


def _caught_up(tracker, kinds, outcomes):
    resumed = _resumed(tracker, "s-3", ["e-1", "e-2"], "s-3", kinds, outcomes)
    _read(tracker, resumed, [("e-3", "")], kinds, outcomes)  # priming event


def _reinitialize(tracker, kinds, outcomes):
    resumed = _resumed(tracker, "s-4", ["e-1", "e-2"], "other", kinds, outcomes)
    _collect(tracker.stream_ended(resumed, "closed", closed_by_client=True), kinds, outcomes)


SCENARIOS = (
    EngineScenario(
        "migration_reset",
        "Last-Event-ID 4821 answered 200 by a fresh session counting from 1",
        ("id_regression", "session_changed"),
        Outcome.GAP.value,
        _migration_reset,
    ),
    EngineScenario(
        "shared_allocator_reuse",
        "cursor honoured, but the per-session counter reuses id 9 for new data",
        ("id_reused",),
        Outcome.GAP.value,
        _shared_allocator_reuse,
    ),
    EngineScenario(
        "drain_race",
        "e-104 (tools/call result) received, not consumed; replay strictly after e-104",
        ("drain_race", "orphaned_request"),
        Outcome.GAP.value,
        _drain_race,
    ),
    EngineScenario(
        "empty_replay",
        "200 with an empty stream: caught up or replay unsupported?",
        ("replay_unconfirmed",),
        Outcome.GAP.value,
        _empty_replay,
    ),
    EngineScenario("faithful_resume", "replay from e-3", (), Outcome.RESUMED.value, _faithful),
    EngineScenario(
        "caught_up_priming", "only a priming event", (), Outcome.CAUGHT_UP.value, _caught_up
    ),
    EngineScenario(
        "reinitialize",
        "new session id seen; the client closed before reading",
        (),
        Outcome.REINITIALIZED.value,
        _reinitialize,
    ),
)


def run(contract: ReplayContract = ReplayContract.EXCLUSIVE) -> list[dict]:
    rows = []
    for scenario in SCENARIOS:
        kinds: set[str] = set()
        outcomes: list[str] = []
        scenario.play(Tracker(contract=contract), kinds, outcomes)
        detected = sorted(kinds)
        outcome = ",".join(outcomes) or "-"
        rows.append(
            {
                "scenario": scenario.name,
                "happened": scenario.happened,
                "expected": sorted(scenario.expected),
                "detected": detected,
                "outcome": outcome,
                "pass": detected == sorted(scenario.expected)
                and outcomes == [scenario.expected_outcome],
            }
        )
    return rows
