"""One test per continuity rule, driven through the Tracker as the
instrumentation drives it, on the seeds' own numbers; the controls that must
report no gap; bounded memory and thread safety.

The scenarios and their drivers live in tracker_scenarios, which
test_rules_are_load_bearing shares.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from opentelemetry.instrumentation.mcp_resumption.rules.continuity import Outcome
from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import requests_in
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import NOTHING as NOTHING_STEP
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import (
    SENT_TRIM,
    SENT_WINDOW,
    Tracker,
)
from tracker_scenarios import (
    INCLUSIVE,
    MARKER,
    SERVER,
    break_stream,
    notification,
    result,
    resume,
    scenario_confirmation_timeout,
    scenario_drain_race,
    scenario_empty_replay,
    scenario_exclusive_server_declared_inclusive,
    scenario_foreign_response,
    scenario_ids_reused,
    scenario_inclusive_server_declared_exclusive,
    scenario_rejected,
    scenario_session_reestablished,
    seed_000_ids,
    seed_004_stream,
    tools_call,
)

# ------------------------------------------------------------ rule tests


@pytest.mark.parametrize("header_session", ["sess-legacy-1", None])
def test_seed_000_fresh_session_is_session_changed_and_id_regression(header_session):
    run = scenario_session_reestablished(header_session)
    assert run.kinds == {"session_changed", "id_regression"}
    assert run.outcome == "gap"
    assert len(run.verdicts) == 1
    regression = next(g for g in run.gaps if g.kind.value == "id_regression")
    assert regression.observed == "1" and "4821" in regression.expected


def test_seed_000_duplicate_ids_after_migration_are_id_reused():
    run = scenario_ids_reused()
    assert run.kinds == {"id_reused"}
    assert run.outcome == "gap"


def test_id_reused_later_in_the_replay():
    t = Tracker()
    break_stream(t, seed_000_ids())
    replay = [("4822", notification(9)), ("4818", notification(10, "different data"))]
    run = resume(t, "4821", replay)
    assert run.outcome == "resumed"  # decided at the first event
    assert run.kinds == {"id_reused"}
    assert run.final_outcome == "gap"  # the attempt had a gap: never counted resumed


def test_seed_004_drain_race_loses_the_tools_call_result():
    run = scenario_drain_race()
    assert run.kinds == {"drain_race", "orphaned_request"}
    assert run.outcome == "gap"
    orphan = next(g for g in run.gaps if g.kind.value == "orphaned_request")
    assert orphan.request_id == "42"
    assert "tools/call" in orphan.expected


def test_seed_004_inclusive_replay_redelivers_the_result():
    t = Tracker(contract=INCLUSIVE)
    seed_004_stream(t)
    replay = [("e-104", result(42, 104)), ("e-105", notification(105))]
    run = resume(t, "e-104", replay, session="s-77", answered_session="s-77")
    assert run.kinds == set()
    assert run.outcome == "resumed"


def test_seed_004_cursor_on_the_last_consumed_event_is_safe():
    t = Tracker()
    seed_004_stream(t)
    replay = [("e-104", result(42, 104)), ("e-105", notification(105))]
    run = resume(t, "e-103", replay, session="s-77", answered_session="s-77")
    assert run.kinds == set()
    assert run.outcome == "resumed"


def test_seed_004_drained_before_the_break_is_safe():
    t = Tracker()
    seed_004_stream(t, consume_last=True)
    run = resume(t, "e-104", [("e-105", notification(105))], session="s-77",
                 answered_session="s-77")
    assert run.kinds == set()
    assert run.outcome == "resumed"


def test_empty_replay_that_ends_is_replay_unconfirmed():
    run = scenario_empty_replay()
    assert run.kinds == {"replay_unconfirmed"}
    assert run.outcome == "gap"


def test_confirmation_timeout_with_nothing_is_replay_unconfirmed():
    run = scenario_confirmation_timeout()
    assert run.kinds == {"replay_unconfirmed"}
    assert run.outcome == "gap"


def test_rejected_without_pending_request_is_no_gap():
    run = scenario_rejected(pending=False)
    assert run.kinds == set()
    assert run.outcome == "rejected"


def test_rejected_with_pending_request_orphans_it():
    run = scenario_rejected(pending=True)
    assert run.kinds == {"orphaned_request"}
    # Refused is the outcome, whatever the refusal then loses.
    assert run.outcome == "rejected"
    assert run.final_outcome == "rejected"
    assert [g.request_id for g in run.gaps] == ["7"]


def test_response_to_a_request_never_sent_is_foreign_replay():
    run = scenario_foreign_response()
    assert run.kinds == {"foreign_replay"}
    assert next(iter(run.gaps)).request_id == "9001"


def test_exclusive_server_under_declared_inclusive_contract():
    run = scenario_exclusive_server_declared_inclusive()
    assert run.kinds == {"replay_contract_violation"}
    assert run.outcome == "gap"


def test_inclusive_server_under_declared_exclusive_contract():
    run = scenario_inclusive_server_declared_exclusive()
    assert run.kinds == {"replay_contract_violation"}
    assert run.outcome == "gap"


def test_pending_request_answered_by_the_replay_is_no_gap():
    t = Tracker()
    break_stream(t, seed_000_ids(), posted=[tools_call(7)])
    run = resume(t, "4821", [("4822", notification(5)), ("4823", result(7, 6))])
    assert run.kinds == set()
    assert run.outcome == "resumed"


def test_pending_request_the_replay_never_answers_is_orphaned():
    t = Tracker()
    break_stream(t, seed_000_ids(), posted=[tools_call(7)])
    run = resume(t, "4821", [("4822", notification(5))])
    assert run.outcome == "resumed"  # decided at the first event, before the end
    assert run.final_outcome == "gap"  # the attempt had a gap: never counted resumed
    assert run.kinds == {"orphaned_request"}



def test_response_in_an_event_without_id_is_answered_when_consumed():
    """The answer to tools/call 7 comes in an event with no id of its own,
    after the client consumed 4819; the client consumes it too.  It is not
    pending any more, so a faithful resume that does not repeat it is no
    gap (it was once reported as orphaned)."""
    t = Tracker()
    stream = t.open_stream(SERVER, "streamable-http", session_id="s-1")
    t.request_sent(SERVER, "s-1", requests_in(tools_call(7)))
    for event_id, data in (("4819", notification(1)), (None, result(7, 2)),
                           ("4820", notification(3))):
        t.event_consumed(stream)
        t.event_received(stream, event_id, data)
    t.event_consumed(stream)
    t.stream_ended(stream, "idle proxy timeout")
    run = resume(t, "4820", [("4821", notification(4))])
    assert run.kinds == set()
    assert run.outcome == "resumed"


# -------------------------------------------------------------- controls


def test_faithful_replay_is_resumed():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, "4821", [("4822", notification(5)), ("4823", notification(6))])
    assert run.kinds == set()
    assert run.outcome == "resumed"
    assert run.verdict.first_event_id == "4822"


def test_faithful_inclusive_replay_under_inclusive_contract_is_resumed():
    t = Tracker(contract=INCLUSIVE)
    break_stream(t, seed_000_ids())
    run = resume(t, "4821", [("4821", notification(4)), ("4822", notification(5))])
    assert run.kinds == set()
    assert run.outcome == "resumed"


def test_priming_marker_is_caught_up():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, "4821", [("4822", MARKER)])
    assert run.kinds == set()
    assert run.outcome == "caught_up"


def test_client_closing_on_a_changed_session_is_reinitialized():
    t = Tracker()
    break_stream(t, seed_000_ids(), session="sess-legacy-1", legacy=True)
    run = resume(
        t,
        "4821",
        [],
        session="sess-legacy-1",
        answered_session="mcp-9f2c-fresh",
        end="client saw a new session id",
        closed_by_client=True,
    )
    assert run.kinds == set()
    assert run.outcome == "reinitialized"


def test_uuid_ids_faithful_replay_is_unverifiable_without_gap():
    ids = [str(uuid.UUID(int=n, version=4)) for n in range(1, 8)]
    t = Tracker()
    break_stream(t, ids[:5])
    run = resume(t, ids[4], [(ids[5], notification(5)), (ids[6], notification(6))])
    assert run.kinds == set()
    assert run.outcome == "unverifiable"


@pytest.mark.parametrize(
    "replay",
    [[("e-6", notification(6)), ("e-7", notification(7))], [("e-6", MARKER)]],
    ids=["events", "marker"],
)
def test_evicted_cursor_is_unverifiable_never_a_gap(replay):
    t = Tracker(max_streams=4)
    break_stream(t, [f"e-{n}" for n in range(1, 6)], posted=[tools_call(3)],
                 data={"e-5": result(3, 5)})
    for n in range(10):
        break_stream(t, [f"c{n}:e-{m}" for m in range(3)], session=f"churn-{n}")
    assert t.evicted_streams >= 7
    run = resume(t, "e-5", replay)
    assert run.kinds == set()
    assert run.outcome == "unverifiable"


def test_a_second_break_resumes_again():
    t = Tracker()
    break_stream(t, seed_000_ids(), posted=[tools_call(7)])
    first = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="4821")
    assert t.response(first, 200, "s-1").verdict is None
    t.event_consumed(first)
    t.event_received(first, "4822", notification(5))
    t.event_consumed(first)
    t.stream_ended(first, "reset again")
    run = resume(t, "4822", [("4823", result(7, 6))])
    assert run.kinds == set()
    assert run.outcome == "resumed"


def test_per_session_counters_on_one_server_do_not_cross():
    """Two sessions on one server, each with its own counter 1, 2, 3...
    (seed 000's "new per-session counter").  Session A resumes faithfully
    with Last-Event-ID 5; session B happens to have seen an event 5 too."""
    t = Tracker()
    a = t.open_stream(SERVER, "streamable-http", session_id="s-A")
    b = t.open_stream(SERVER, "streamable-http", session_id="s-B")
    for n in range(1, 6):
        for stream, name in ((a, "a"), (b, "b")):
            t.event_consumed(stream)
            t.event_received(stream, str(n), notification(n, name))
    t.event_consumed(a)
    t.event_consumed(b)
    t.stream_ended(a, "reset")
    run = resume(t, "5", [("6", notification(6, "a"))], session="s-A", answered_session="s-A")
    assert run.kinds == set()
    assert run.outcome == "resumed"


# --------------------------------------------------- bounded, thread-safe


def test_memory_is_bounded_under_churn():
    t = Tracker(max_streams=1000)
    opened = 0
    for n in range(100_000):
        session = f"s-{n}"
        stream = t.open_stream(SERVER, "streamable-http", session_id=session)
        opened += 1
        t.request_sent(SERVER, session, requests_in(tools_call(n)))
        # Two ids: one alone does not show that the scheme counts.
        t.event_received(stream, f"{session}:e-1", notification(n))
        t.event_received(stream, f"{session}:e-2", notification(n))
        t.event_consumed(stream)
        t.stream_ended(stream, "done")
        if n % 100 == 0:
            again = t.open_stream(
                SERVER, "streamable-http", session_id=session, last_event_id=f"{session}:e-2"
            )
            opened += 1
            t.response(again, 200, session)
            step = t.event_received(again, f"{session}:e-3", result(n, 2))
            assert step.verdict is not None and step.verdict.outcome is Outcome.RESUMED
            t.stream_ended(again, "done")
        assert len(t) <= 1000
        assert t.session_count <= 1000
    assert len(t) == 1000
    assert t.evicted_streams == opened - len(t)
    # The cursor index must not outlive the streams it points into.
    assert len(t.index.cursors) <= 2 * t.max_streams


@pytest.mark.parametrize("max_streams", [100_000, 64])
def test_threads_share_one_tracker(max_streams):
    t = Tracker(max_streams=max_streams)
    threads, rounds = 8, 300
    errors: list[BaseException] = []
    outcomes: list[str] = []
    kinds: list[frozenset[str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def client(worker: int) -> None:
        try:
            barrier.wait()
            for n in range(rounds):
                session = f"w{worker}-s{n}"
                ids = [f"{session}:e-{m}" for m in range(1, 4)]
                break_stream(t, ids, session=session, posted=[tools_call(n)],
                             data={ids[1]: result(n, 2)})
                run = resume(t, ids[-1], [(f"{session}:e-4", notification(4))],
                             session=session, answered_session=session)
                with lock:
                    outcomes.append(run.outcome)
                    kinds.append(run.kinds)
        except BaseException as error:
            with lock:
                errors.append(error)

    workers = [threading.Thread(target=client, args=(w,)) for w in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert errors == []
    assert len(outcomes) == threads * rounds
    assert all(k == set() for k in kinds)
    if max_streams >= 2 * threads * rounds:
        assert set(outcomes) == {"resumed"}
        assert t.evicted_streams == 0
    else:
        assert set(outcomes) <= {"resumed", "unverifiable"}
        assert t.evicted_streams > 0
    assert len(t) <= max_streams
    assert t.session_count <= max_streams
    assert t.evicted_streams == 2 * threads * rounds - len(t)


# ------------------------------------------------------------ polling
# Protocol 2025-11-25: the server primes its stream (an id, no data, retry:)
# and may close it on purpose; the client resumes.  A resume after such a
# close is a poll.


def polled_stream(t: Tracker, *, posted: list[str] = (), clean: bool = True):
    """A POST stream that primes, sends two events and is closed by the
    server (``clean``) or breaks (a read error)."""
    stream = t.open_stream(SERVER, "streamable-http", session_id="s-1")
    for body in posted:
        t.request_sent(SERVER, "s-1", requests_in(body))
    t.retry_seen(stream, 100)
    for event_id, data in (("p_1", MARKER), ("p_2", notification(1)), ("p_3", notification(2))):
        t.event_consumed(stream)
        t.event_received(stream, event_id, data)
    t.event_consumed(stream)
    t.stream_ended(stream, "the stream ended" if clean else "a read error", clean=clean)
    return stream


def test_quiet_poll_is_not_judged_by_the_confirmation_window():
    t = Tracker()
    polled_stream(t, posted=[tools_call(7)])
    poll = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="p_3")
    assert poll.check.poll
    t.response(poll, 200, "s-1")
    assert t.timeout(poll, 5) is NOTHING_STEP, "silence on a poll is not evidence"
    step = t.event_received(poll, "p_4", result(7, 4))
    assert step.verdict.outcome.value == "resumed" and not step.gaps


def test_resume_after_a_broken_connection_keeps_the_window():
    t = Tracker()
    polled_stream(t, posted=[tools_call(7)], clean=False)
    resumed = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="p_3")
    assert not resumed.check.poll
    t.response(resumed, 200, "s-1")
    assert {g.kind.value for g in t.timeout(resumed, 5).gaps} == {"replay_unconfirmed"}


def test_unprimed_clean_end_is_not_a_poll():
    """Seed 000's empty replay on a stream that never primed: still caught."""
    t = Tracker()
    break_stream(t, seed_000_ids(), legacy=True)
    run = resume(t, "4821", [], end="the stream ended")
    assert run.kinds == {"replay_unconfirmed"}


def test_empty_poll_closed_by_the_server_is_no_gap_and_keeps_the_request():
    t = Tracker()
    polled_stream(t, posted=[tools_call(7)])
    first = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="p_3")
    t.response(first, 200, "s-1")
    ended = t.stream_ended(first, "the stream ended", clean=True, held_open=True)
    assert ended.held and not ended.gaps and ended.verdict.outcome.value == "unverifiable"
    second = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="p_3")
    assert second.check.poll
    t.response(second, 200, "s-1")
    t.event_received(second, "p_4", notification(4))
    t.event_consumed(second)
    assert t.stream_ended(second, "the stream ended", clean=True).held
    # The first poll's deadline comes late: the request went on with the second.
    assert t.lineage_ended(first, "late deadline") is NOTHING_STEP
    assert t.lineage_ended(second, "gave up").window
    # Nothing re-sent it within the reissue window: lost.
    assert [d.gap.request_id for d in t.fates_due(0.0).fates] == ["7"]


def test_request_cut_twice_is_orphaned_only_when_its_lineage_ends():
    t = Tracker()
    polled_stream(t, posted=[tools_call(7)])
    first = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="p_3")
    t.response(first, 200, "s-1")
    t.event_received(first, "p_4", notification(3))
    t.event_consumed(first)
    ended = t.stream_ended(first, "the stream ended", clean=True)
    assert not ended.gaps, "a resumed stream that ends is not the end of its lineage"
    second = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="p_4")
    assert second.check.poll and second.lineage == first.lineage
    t.response(second, 200, "s-1")
    t.event_received(second, "p_5", notification(4))
    t.event_consumed(second)
    assert not t.stream_ended(second, "the stream ended", clean=True).gaps
    # The client resumes no more: now the request is orphaned, once.
    assert t.lineage_ended(second, "the client did not resume it").window
    orphaned = [d.gap for d in t.fates_due(0.0).fates]
    assert [(g.kind.value, g.request_id) for g in orphaned] == [("orphaned_request", "7")]
    assert t.lineage_ended(second, "again") is NOTHING_STEP


def test_streams_closed_after_the_client_deleted_the_session_are_not_polls():
    t = Tracker()
    polled_stream(t, posted=[tools_call(7)])
    poll = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="p_3")
    t.response(poll, 200, "s-1")
    t.session_terminated(SERVER, "s-1")
    ended = t.stream_ended(poll, "the stream ended", clean=True)
    assert {g.kind.value for g in ended.gaps} == {"replay_unconfirmed"}


def test_empty_poll_the_server_ends_at_once_is_replay_unconfirmed():
    """Seed 000 on a polling server: the SDK servers answer a cursor they
    lost with 200 and a stream that ends with nothing, before any window."""
    t = Tracker()
    polled_stream(t, posted=[tools_call(7)])
    poll = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="p_3")
    t.response(poll, 200, "s-1")
    ended = t.stream_ended(poll, "the stream ended", clean=True, held_open=False)
    assert {g.kind.value for g in ended.gaps} == {"replay_unconfirmed"}


def test_a_long_resumed_stream_closes_its_attempt_after_the_seen_window():
    """Nothing pending and the verdict given: the attempt is counted once the
    seen window has passed (no earlier id is left to reuse), not only when a
    long-lived stream ends hours later."""
    from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import SEEN_WINDOW

    t = Tracker()
    break_stream(t, seed_000_ids())
    resumed = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="4821")
    t.response(resumed, 200, "s-1")
    finals = []
    for n in range(4822, 4822 + SEEN_WINDOW + 1):
        t.event_consumed(resumed)
        step = t.event_received(resumed, str(n), notification(n))
        if step.final is not None:
            finals.append((n, step.final.outcome.value))
    assert finals == [(4822 + SEEN_WINDOW, "resumed")]
    assert t.stream_ended(resumed, "eof").final is None  # closed once, not again
# ------------------------------------------- what the ledger cannot read (issue 12)


def test_sessionless_cursors_are_scoped_to_their_path():
    t = Tracker()
    a = t.open_stream(SERVER, "streamable-http", path="/a")
    b = t.open_stream(SERVER, "streamable-http", path="/b")
    for n in (1, 2, 3):
        t.event_received(a, str(n), notification(n, "a"))
        t.event_received(b, str(n), notification(n, "b"))
    t.event_consumed(a)
    t.event_consumed(b)
    t.stream_ended(a, "reset")
    t.stream_ended(b, "reset")
    resumed = t.open_stream(SERVER, "streamable-http", path="/a", last_event_id="3")
    assert resumed.session is a.session and resumed.lineage == a.lineage
    elsewhere = t.open_stream(SERVER, "streamable-http", path="/c", last_event_id="3")
    assert elsewhere.check.cursor.known is False  # no stream of /c issued it


def test_an_unread_request_body_makes_the_ledger_unknown():
    t = Tracker()
    stream = t.open_stream(SERVER, "streamable-http", session_id="s-u")
    t.request_sent(SERVER, "s-u", None)  # a body that was not read
    for n in (1, 2):
        t.event_received(stream, str(n), notification(n))
    t.event_consumed(stream)
    t.stream_ended(stream, "reset")
    resumed = t.open_stream(SERVER, "streamable-http", session_id="s-u", last_event_id="2")
    t.response(resumed, 200, "s-u")
    step = t.event_received(resumed, "3", result(77, 3))
    assert step.gaps == () and step.verdict.outcome is Outcome.RESUMED


@pytest.mark.parametrize(
    ("requests_sent", "foreign"),
    [(SENT_WINDOW, True), (SENT_WINDOW + SENT_TRIM, True), (SENT_WINDOW + SENT_TRIM + 1, False)],
)
def test_the_ledger_proves_a_response_foreign_while_it_keeps_every_request(
    requests_sent, foreign
):
    """A session remembers at least SENT_WINDOW request ids and forgets the
    oldest in batches; once it forgot one, no response is provably foreign."""
    t = Tracker()
    stream = t.open_stream(SERVER, "streamable-http", session_id="s-w")
    for n in range(1, requests_sent + 1):
        t.request_sent(SERVER, "s-w", [(str(n), "ping")])
    for n in (1, 2):
        t.event_received(stream, str(n), notification(n))
    t.event_consumed(stream)
    t.stream_ended(stream, "reset")
    resumed = t.open_stream(SERVER, "streamable-http", session_id="s-w", last_event_id="2")
    t.response(resumed, 200, "s-w")
    kinds = {gap.kind.value for gap in t.event_received(resumed, "3", result(10**6, 3)).gaps}
    assert kinds == ({"foreign_replay"} if foreign else set())
    # the oldest request is still known as long as the ledger is exact
    step = t.event_received(resumed, "4", result(1, 4))
    assert "foreign_replay" not in {gap.kind.value for gap in step.gaps}


def test_an_unread_response_leaves_no_request_provably_orphaned():
    t = Tracker()
    stream = t.open_stream(SERVER, "streamable-http", session_id="s-v", carries=["5"])
    t.request_sent(SERVER, "s-v", requests_in(tools_call(5)))
    t.event_received(stream, "1", notification(1))
    t.event_received(stream, "2", result(5, 2)[:-1] + ', "pad": "' + "x" * 70_000 + '"}')
    t.event_consumed(stream)
    t.stream_ended(stream, "the stream ended")
    later = t.open_stream(SERVER, "streamable-http", session_id="s-v", last_event_id="2")
    t.response(later, 200, "s-v")
    steps = [t.event_received(later, "3", notification(3)), t.stream_ended(later, "eof")]
    assert [gap.kind.value for step in steps for gap in step.gaps] == []
