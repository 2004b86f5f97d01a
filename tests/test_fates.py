"""The fate of every broken request, through the tracker as the owner drives
it: one fate each (answered, reissued, lost), the break outcomes, and the
requests that never broke."""

from __future__ import annotations

import json

from opentelemetry.instrumentation.mcp_resumption.rules.fates import Fate
from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import requests_in
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import Step, Tracker
from tracker_scenarios import SERVER, notification, result


def call(request_id: int | str, query: str = "weather", meta: object = None) -> bytes:
    params: dict = {"name": "search", "arguments": {"q": query}}
    if meta is not None:
        params["_meta"] = meta
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return json.dumps(body).encode()


def cancel(request_id: int) -> bytes:
    body = {"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "user"}}
    return json.dumps(body).encode()


def post_stream(t: Tracker, body: bytes, events=(), session: str | None = None):
    """A POST of ``body`` answered with an SSE stream that delivers ``events``."""
    requests = requests_in(body)
    t.request_sent(SERVER, session, requests, "/mcp")
    stream = t.open_stream(SERVER, "streamable-http", session_id=session, path="/mcp",
                           carries=[key for key, _ in requests], body=body)
    for event_id, data in events:
        t.event_consumed(stream)
        t.event_received(stream, event_id, data)
    t.event_consumed(stream)
    return stream


def fates(*steps: Step) -> list[tuple[str, str]]:
    return [(d.broken.key, d.fate.value) for step in steps for d in step.fates]


def test_a_cut_without_event_ids_is_not_resumable_and_lost_after_the_window():
    t = Tracker()
    stream = post_stream(t, call(1), [(None, notification(1))])
    ended = t.stream_ended(stream, "a read error (RemoteProtocolError)")
    assert ended.not_resumable and ended.window and [b.key for b in ended.broke] == ["1"]
    assert t.fates_due(60.0).fates == ()  # the window has not passed
    lost = t.fates_due(0.0)
    assert fates(lost) == [("1", "lost")]
    (decided,) = lost.fates
    assert decided.gap.kind.value == "orphaned_request" and decided.gap.method == "tools/call"
    assert fates(t.fates_due(0.0), t.all_lost("exit")) == []  # one fate, once


def test_the_same_call_under_a_new_id_is_reissued_whatever_its_meta():
    t = Tracker()
    stream = post_stream(t, call(1, meta={"progressToken": 1}))
    t.stream_ended(stream, "a read error (ReadError)")
    assert t.broken.awaits(SERVER)
    other = t.reissued(SERVER, None, "/mcp", call(2, query="other"))
    assert fates(other) == []  # another call
    again = t.reissued(SERVER, None, "/mcp", call(2, meta={"progressToken": 2}))
    assert fates(again) == [("1", "reissued")]
    assert fates(t.fates_due(0.0)) == [] and not t.broken.awaits(SERVER)


def test_a_resumable_cut_waits_for_the_resume_whose_answer_makes_it_answered():
    t = Tracker()
    stream = post_stream(t, call(1), [("e-1", "")], session="s-1")  # a priming event
    ended = t.stream_ended(stream, "a read error (RemoteProtocolError)")
    assert ended.held and not ended.not_resumable and not ended.window
    resumed = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="e-1")
    t.response(resumed, 200, "s-1")
    t.event_consumed(resumed)
    answered = t.event_received(resumed, "e-2", result(1, 2))
    assert fates(answered) == [("1", "answered")]
    assert answered.verdict.outcome.value == "resumed" and not answered.gaps
    # The lineage's grace, late: nothing left to orphan.
    assert t.lineage_ended(stream, "late").fates == ()


def test_a_resumable_cut_nothing_resumes_is_not_resumable_when_its_lineage_ends():
    t = Tracker()
    stream = post_stream(t, call(1), [("e-1", "")], session="s-1")
    t.stream_ended(stream, "a read error (RemoteProtocolError)")
    over = t.lineage_ended(stream, "the client did not resume the stream within 6 s")
    assert over.not_resumable and over.window
    assert fates(t.fates_due(0.0)) == [("1", "lost")]


def test_a_request_the_client_cancels_first_never_breaks():
    t = Tracker()
    stream = post_stream(t, call(5), session="s-1")
    t.cancelling(SERVER, "s-1", "/mcp", cancel(5))
    # The server ends the cancelled request's stream without an answer.
    assert t.stream_ended(stream, "the stream ended", clean=True).broke == ()
    assert fates(t.all_lost("exit")) == []


def test_a_cancel_after_the_break_is_the_sdks_courtesy_and_the_loss_stands():
    t = Tracker()
    stream = post_stream(t, call(5), session="s-1")
    t.stream_ended(stream, "a read error (ReadError)")
    t.cancelling(SERVER, "s-1", "/mcp", cancel(5))
    assert fates(t.fates_due(0.0)) == [("5", "lost")]


def test_streams_the_client_ends_with_its_session_break_nothing():
    t = Tracker()
    stream = post_stream(t, call(1), session="s-1")
    t.session_terminated(SERVER, "s-1")
    assert t.stream_ended(stream, "a read error (ReadError)").broke == ()


def test_closing_the_session_loses_what_broke_before():
    t = Tracker()
    stream = post_stream(t, call(1), [("e-1", "")], session="s-1")
    t.stream_ended(stream, "a read error (ReadError)")
    closed = t.session_terminated(SERVER, "s-1")
    assert fates(closed) == [("1", "lost")]
    assert "the session was closed" in closed.fates[0].gap.observed


def test_no_false_fate_on_a_clean_stream_or_a_client_close():
    t = Tracker()
    clean = post_stream(t, call(1), [("e-1", result(1, 1))], session="s-1")
    assert t.stream_ended(clean, "the stream ended", clean=True).broke == ()
    closed = post_stream(t, call(2), [("e-2", result(2, 2))], session="s-1")
    assert t.stream_ended(closed, "closed by the application", closed_by_client=True).broke == ()
    walked_away = post_stream(t, call(3), session="s-1")
    assert t.stream_ended(walked_away, "closed", closed_by_client=True).broke == ()
    assert fates(t.all_lost("exit")) == []


def test_an_unreadable_answer_settles_what_it_may_answer():
    t = Tracker()
    stream = post_stream(t, call(1), [("e-1", "")], session="s-1")
    t.stream_ended(stream, "a read error (ReadError)")
    resumed = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="e-1")
    t.response(resumed, 200, "s-1")
    t.event_consumed(resumed)
    # Not JSON where a result may be: which request it answers is unknown.
    step = t.event_received(resumed, "e-2", '{"result": ' + "[" * 100_000)
    assert [d.fate for d in step.fates] == [Fate.ANSWERED]


def test_a_cancel_after_a_poll_ended_leaves_the_lineage_its_request():
    """mcp 2.x in its legacy mode posts a courtesy cancel once it has failed
    a call: after a poll's stream ended, the request is still the lineage's."""
    t = Tracker()
    stream = post_stream(t, call(5), [("e-1", "")], session="s-1")
    t.retry_seen(stream, 100)
    assert t.stream_ended(stream, "the stream ended", clean=True).held  # the server polls
    t.cancelling(SERVER, "s-1", "/mcp", cancel(5))
    assert t.lineage_ended(stream, "the client did not resume it").window
    assert fates(t.fates_due(0.0)) == [("5", "lost")]


def test_a_resume_open_when_the_session_closes_does_not_lose_the_call_again():
    """The client gives up and ends its session while a resume still holds
    the broken call: the close decides it lost, once; the resume's end (the
    server's 404 or an empty replay) does not break it anew (a CI run counted
    it lost twice)."""
    t = Tracker()
    stream = post_stream(t, call(1), [("e-1", "")], session="s-1")
    t.stream_ended(stream, "a read error (RemoteProtocolError)")
    resumed = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="e-1")
    closed = t.session_terminated(SERVER, "s-1")
    assert fates(closed) == [("1", "lost")]
    t.response(resumed, 404, None)
    ended = t.stream_ended(resumed, "a read error (RemoteProtocolError)")
    assert ended.broke == ()
    assert fates(ended, t.lineage_ended(resumed, "late"), t.fates_due(0.0),
                 t.all_lost("exit")) == []


def test_a_resume_open_when_the_window_decides_does_not_lose_the_call_again():
    """The call's reissue window ends (lost) while a later resume of its
    lineage is open and ends empty: one fate."""
    t = Tracker()
    stream = post_stream(t, call(1), [("e-1", "")], session="s-1")
    t.stream_ended(stream, "a read error (RemoteProtocolError)")
    first = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="e-1")
    t.response(first, 200, "s-1")
    t.stream_ended(first, "the stream ended", clean=True)
    t.lineage_ended(first, "the client did not resume the stream")
    second = t.open_stream(SERVER, "streamable-http", session_id="s-1", last_event_id="e-1")
    t.response(second, 200, "s-1")
    decided = fates(t.fates_due(0.0))
    ended = t.stream_ended(second, "the stream ended", clean=True)
    later = fates(ended, t.lineage_ended(second, "late"), t.fates_due(0.0), t.all_lost("exit"))
    assert decided + later == [("1", "lost")], (decided, later)


def test_an_id_sent_again_after_its_fate_can_break_again():
    """A client that reuses a request id after its fate sends a request of its
    own: its break is a fate of its own."""
    t = Tracker()
    stream = post_stream(t, call(1), session="s-1")
    t.stream_ended(stream, "a read error (ReadError)")
    assert fates(t.fates_due(0.0)) == [("1", "lost")]
    again = post_stream(t, call(1, query="other"), session="s-1")
    t.stream_ended(again, "a read error (ReadError)")
    assert fates(t.fates_due(0.0)) == [("1", "lost")]
