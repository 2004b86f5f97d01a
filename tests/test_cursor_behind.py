"""A cursor behind its stream's end (issue 31): the client presents an id its
session saw that is not the stream's last, because something read on for it
after it stopped (a proxy whose client's leg was cut while the server's leg
went on).  The resume finds the stream through the session's seen window and
is judged by the rules as any other: the events after the cursor were
received once, so a replay that brings them back with the same ids and data
is faithful, and one that does not is the gap the rules name.  Before the
fix every such resume was ``unverifiable``: the index held only each
stream's last ids.
"""

from __future__ import annotations

import uuid

from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import Tracker
from tracker_scenarios import (
    SERVER,
    break_stream,
    notification,
    result,
    resume,
    seed_000_ids,
    tools_call,
)

# 4817..4821 read by the proxy; its client got only up to 4819.
CURSOR = "4819"


def test_a_faithful_replay_from_behind_the_end_is_resumed():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(
        t, CURSOR, [("4820", notification(3)), ("4821", notification(4)), ("4822", notification(5))]
    )
    assert run.kinds == set()
    assert run.outcome == "resumed"
    assert run.final_outcome == "resumed"
    assert run.verdict.first_event_id == "4820"


def test_an_answer_read_past_the_cursor_is_replayed_without_a_gap():
    """The proxy had the call's answer (4821); the client, behind, gets it again."""
    t = Tracker()
    break_stream(t, seed_000_ids(), posted=[tools_call(7)], data={"4821": result(7, 4)})
    run = resume(t, CURSOR, [("4820", notification(3)), ("4821", result(7, 4))])
    assert run.kinds == set()
    assert run.outcome == "resumed"


def test_a_request_still_pending_is_answered_by_the_replay():
    t = Tracker()
    break_stream(t, seed_000_ids(), posted=[tools_call(7)])
    run = resume(
        t, CURSOR, [("4820", notification(3)), ("4821", notification(4)), ("4822", result(7, 5))]
    )
    assert run.kinds == set()
    assert run.final_outcome == "resumed"


def test_other_data_under_an_id_read_past_the_cursor_is_id_reused():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, CURSOR, [("4820", notification(3, "not what was sent"))])
    assert run.kinds == {"id_reused"}
    assert run.outcome == "gap"


def test_a_later_event_read_past_the_cursor_with_other_data_is_id_reused():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, CURSOR, [("4820", notification(3)), ("4821", notification(4, "changed"))])
    assert run.kinds == {"id_reused"}
    assert run.final_outcome == "gap"


def test_a_counter_reset_behind_the_end_is_id_regression():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, CURSOR, [("1", notification(100))])
    assert "id_regression" in run.kinds
    assert run.outcome == "gap"


def test_the_cursor_event_sent_again_under_the_exclusive_contract_is_a_violation():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, CURSOR, [(CURSOR, notification(2)), ("4820", notification(3))])
    assert run.kinds == {"replay_contract_violation"}


def test_a_new_session_behind_the_end_is_session_changed():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, CURSOR, [("1", notification(100))], answered_session="s-other")
    assert "session_changed" in run.kinds
    assert run.outcome == "gap"


def test_an_empty_replay_behind_the_end_is_replay_unconfirmed():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, CURSOR, [])
    assert run.kinds == {"replay_unconfirmed"}


def test_a_cursor_two_streams_of_the_session_could_have_issued_stays_unverifiable():
    """Opaque ids on two streams of one session: which one issued the cursor
    is not provable, so nothing is bound by a guess."""
    ids = [str(uuid.UUID(int=n, version=4)) for n in range(1, 12)]
    t = Tracker()
    break_stream(t, ids[:5])
    break_stream(t, ids[5:8])
    run = resume(t, ids[2], [(ids[3], notification(3)), (ids[10], notification(10))])
    assert run.kinds == set()
    assert run.outcome == "unverifiable"


def test_a_counting_cursor_finds_the_one_stream_whose_end_is_past_it():
    """Two streams of one session on one counter (an event store's global
    ids): the initialize stream ended before the cursor, the call's stream
    after it; the cursor belongs to the call's."""
    t = Tracker()
    break_stream(t, ["1", "2"])
    break_stream(t, ["3", "4", "5", "6"], posted=[tools_call(7)], data={"6": result(7, 6)})
    run = resume(t, "4", [("5", notification(2)), ("6", result(7, 6))])
    assert run.kinds == set()
    assert run.outcome == "resumed"


def test_another_sessions_id_is_not_bound_to_the_named_session():
    t = Tracker()
    break_stream(t, seed_000_ids(), session="s-A")
    run = resume(t, CURSOR, [("4820", notification(3))], session="s-B", answered_session="s-B")
    assert run.outcome == "unverifiable"


def test_an_id_the_session_never_saw_stays_unverifiable():
    t = Tracker()
    break_stream(t, seed_000_ids())
    run = resume(t, "4700", [("4701", notification(1))])
    assert run.outcome == "unverifiable"
    assert run.kinds == set()


def test_a_resume_from_behind_the_end_would_settle_the_calls_in_flight():
    """What enforce mode asks before a resume: the call in flight on the
    stream is the resume's to answer, whichever of its ids the client holds."""
    t = Tracker()
    break_stream(t, seed_000_ids(), posted=[tools_call(7)])
    assert t.awaits_answers(SERVER, CURSOR, "s-1")


def test_a_second_resume_from_the_same_cursor_behind_the_end_is_judged_again():
    """The first resume from behind the end replayed what was read, then one
    new event, and broke; the client, still behind, resumes again from the
    same cursor: the stream and its resume are one lineage, and the resume
    is bound to its latest stream."""
    t = Tracker()
    break_stream(t, seed_000_ids())
    first = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id=CURSOR)
    t.response(first, 200, "s-1")
    for event_id, n in (("4820", 3), ("4821", 4), ("4822", 5)):
        t.event_consumed(first)
        t.event_received(first, event_id, notification(n))
    t.event_consumed(first)
    t.stream_ended(first, "reset again")
    run = resume(
        t,
        CURSOR,
        [
            ("4820", notification(3)),
            ("4821", notification(4)),
            ("4822", notification(5)),
            ("4823", notification(6)),
        ],
    )
    assert run.kinds == set()
    assert run.outcome == "resumed"
