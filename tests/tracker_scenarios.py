"""The seed scenarios driven through the Tracker as the instrumentation
drives it, on the seeds' own numbers: the drivers (``break_stream``,
``resume``) and one ``scenario_*`` per rule, each a plain function that
returns a :class:`Run` (the kinds found and the outcome).  test_tracker
checks each scenario's verdict; test_rules_are_load_bearing disables each
rule in turn and checks that some scenario's verdict changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from opentelemetry.instrumentation.mcp_resumption.rules.continuity import (
    Gap,
    ReplayContract,
    Verdict,
)
from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import requests_in
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import Step, Tracker

SERVER = "https://mcp.example.com/mcp"
EXCLUSIVE = ReplayContract.EXCLUSIVE
INCLUSIVE = ReplayContract.INCLUSIVE
MARKER = ""  # a priming event or heartbeat: an id and no data


# ----------------------------------------------------------------- helpers


def notification(n: int, text: str = "progress") -> str:
    return json.dumps(
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n, "t": text}}
    )


def result(request_id: int | str, n: int) -> str:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "n": n}]}}
    )


def tools_call(request_id: int | str, name: str = "search_index") -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": name, "arguments": {}},
        }
    )


@dataclass
class Run:
    """Every step of one resume attempt."""

    steps: list[Step] = field(default_factory=list)

    def add(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    @property
    def gaps(self) -> list[Gap]:
        found = [gap for step in self.steps for gap in step.gaps]
        # A lost request's orphaned_request gap, once its fate is decided.
        found += [d.gap for step in self.steps for d in step.fates if d.gap is not None]
        # A lost subscription's gap, at its stream's end.
        found += [gap for step in self.steps for _, gap in step.lost_subscriptions if gap]
        if self.verdict is not None:
            found.extend(g for g in self.verdict.gaps if g not in found)
        return found

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(gap.kind.value for gap in self.gaps)

    @property
    def verdicts(self) -> list[Verdict]:
        return [step.verdict for step in self.steps if step.verdict is not None]

    @property
    def verdict(self) -> Verdict | None:
        return self.verdicts[0] if self.verdicts else None

    @property
    def outcome(self) -> str | None:
        return self.verdict.outcome.value if self.verdict else None

    @property
    def final_outcome(self) -> str | None:
        """The attempt's one outcome, given when it closed (at most once)."""
        finals = [step.final for step in self.steps if step.final is not None]
        finals += [final for step in self.steps for _, final in step.closed]
        assert len(finals) <= 1, finals
        return finals[0].outcome.value if finals else None


def break_stream(
    t: Tracker,
    ids: list[str],
    *,
    session: str = "s-1",
    legacy: bool = False,
    data: dict[str, str] | None = None,
    posted: list[str] = (),
    consume_last: bool = True,
    server: str = SERVER,
):
    """A stream that delivers ``ids`` and breaks.  The app consumes each event
    before asking for the next; the last one only if ``consume_last``."""
    data = data or {}
    if legacy:
        stream = t.open_stream(server, "sse")
        t.bind_session(stream, session)  # the legacy `endpoint` event
    else:
        stream = t.open_stream(server, "streamable-http", session_id=session)
    for body in posted:
        t.request_sent(server, session, requests_in(body))
    for n, event_id in enumerate(ids):
        t.event_consumed(stream)
        t.event_received(stream, event_id, data.get(event_id, notification(n)))
    if consume_last:
        t.event_consumed(stream)
    t.stream_ended(stream, "idle proxy timeout")
    return stream


def resume(
    t: Tracker,
    cursor: str,
    replay: list[tuple[str, str]],
    *,
    session: str | None = "s-1",
    answered_session: str | None = "s-1",
    status: int = 200,
    end: str | None = "eof",
    timeout: float | None = None,
    closed_by_client: bool = False,
    server: str = SERVER,
    last: bool = True,
) -> Run:
    """Reconnect with ``Last-Event-ID: cursor``; the server answers
    ``status`` under ``answered_session`` and sends ``replay``.  With
    ``last`` the client then stops resuming: the lineage ends."""
    run = Run()
    stream = t.open_stream(server, "streamable-http", session_id=session, last_event_id=cursor)
    run.add(t.response(stream, status, answered_session))
    if status < 400:
        for event_id, data in replay:
            t.event_consumed(stream)
            run.add(t.event_received(stream, event_id, data))
        if timeout is not None:
            run.add(t.timeout(stream, timeout))
    if end is not None:
        t.event_consumed(stream)
        run.add(t.stream_ended(stream, end, closed_by_client=closed_by_client))
        if last:
            run.add(t.lineage_ended(stream, "the client stopped resuming"))
    if last:
        # The reissue window passes with nothing re-sent: the requests the
        # attempt could not bring answers to are lost.
        run.add(t.fates_due(0.0))
    return run


def seed_000_ids() -> list[str]:
    return [str(n) for n in range(4817, 4822)]


def seed_004_stream(t: Tracker, *, consume_last: bool = False) -> None:
    """Seed 004: e-100..e-104 on a legacy stream in session s-77, e-104 the
    result of the tools/call POSTed first; severed before e-104 was drained."""
    ids = [f"e-{n}" for n in range(100, 105)]
    break_stream(
        t,
        ids,
        session="s-77",
        legacy=True,
        posted=[tools_call(42)],
        data={"e-104": result(42, 104)},
        consume_last=consume_last,
    )


# ---------------------------------------------------- the seed scenarios


def scenario_session_reestablished(header_session: str | None = "sess-legacy-1") -> Run:
    """Seed 000: reconnect with Last-Event-ID 4821 to a streamable-HTTP
    instance that opens a fresh session and counts from 1."""
    t = Tracker()
    break_stream(t, seed_000_ids(), session="sess-legacy-1", legacy=True)
    replay = [(str(n), notification(n, "fresh")) for n in range(1, 4)]
    return resume(
        t, "4821", replay, session=header_session, answered_session="mcp-9f2c-fresh"
    )


def scenario_ids_reused() -> Run:
    """Seed 000: the server honoured Last-Event-ID across the migration, but
    its new per-session counter hands out an id already seen."""
    t = Tracker()
    break_stream(t, seed_000_ids(), session="sess-legacy-1", legacy=True)
    replay = [("4821", notification(1, "new per-session counter")), ("4822", notification(2))]
    return resume(t, "4821", replay, session="sess-legacy-1", answered_session="sess-legacy-1")


def scenario_drain_race(contract: ReplayContract = EXCLUSIVE) -> Run:
    """Seed 004: Last-Event-ID e-104 names the unconsumed tools/call result;
    the server replays strictly after it."""
    t = Tracker(contract=contract)
    seed_004_stream(t)
    replay = [("e-105", notification(105)), ("e-106", notification(106))]
    return resume(t, "e-104", replay, session="s-77", answered_session="s-77")


def scenario_empty_replay() -> Run:
    t = Tracker()
    break_stream(t, seed_000_ids())
    return resume(t, "4821", [])


def scenario_confirmation_timeout() -> Run:
    t = Tracker()
    break_stream(t, seed_000_ids())
    return resume(t, "4821", [], timeout=5.0, end=None)


def scenario_rejected(pending: bool = False) -> Run:
    t = Tracker()
    posted = [tools_call(7)] if pending else []
    break_stream(t, seed_000_ids(), posted=posted)
    return resume(t, "4821", [], status=404, answered_session=None)


def scenario_foreign_response() -> Run:
    t = Tracker()
    break_stream(t, seed_000_ids(), posted=[tools_call(7)], data={"4821": result(7, 1)})
    replay = [("4822", notification(2)), ("4823", result(9001, 3))]
    return resume(t, "4821", replay)


def scenario_exclusive_server_declared_inclusive() -> Run:
    t = Tracker(contract=INCLUSIVE)
    break_stream(t, seed_000_ids())
    return resume(t, "4821", [("4822", notification(5)), ("4823", notification(6))])


def scenario_inclusive_server_declared_exclusive() -> Run:
    t = Tracker(contract=EXCLUSIVE)
    break_stream(t, seed_000_ids())
    # break_stream numbered the events 0..4: 4821 carried notification(4)
    return resume(t, "4821", [("4821", notification(4)), ("4822", notification(5))])


def scenario_subscription_dropped() -> Run:
    """A 2026-07-28 subscription (no session, no event ids) whose stream
    breaks before the server's result: lost, and no call of it is."""
    t, run = Tracker(), Run()
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": "listen-1",
            "method": "subscriptions/listen",
            "params": {"notifications": {"toolsListChanged": True}},
        }
    ).encode()
    stream = t.open_stream(
        SERVER, "streamable-http", carries=['"listen-1"'], path="/mcp", body=body,
        sent=requests_in(body),
    )
    t.event_received(stream, None, notification(1, "acknowledged"))
    run.add(t.stream_ended(stream, "a read error (RemoteProtocolError)"))
    return run


SCENARIOS = {
    "session_reestablished": scenario_session_reestablished,
    "ids_reused": scenario_ids_reused,
    "drain_race": scenario_drain_race,
    "empty_replay": scenario_empty_replay,
    "confirmation_timeout": scenario_confirmation_timeout,
    "rejected_with_pending": lambda: scenario_rejected(pending=True),
    "foreign_response": scenario_foreign_response,
    "exclusive_server_declared_inclusive": scenario_exclusive_server_declared_inclusive,
    "inclusive_server_declared_exclusive": scenario_inclusive_server_declared_exclusive,
    "subscription_dropped": scenario_subscription_dropped,
}
