"""The Events extension's thread of cursors (``events.EventLedger``), rule by
rule: each break of a thread gets its one finding, and what is no break
(a clean continuation, the application's own close, an unsubscribe, a
webhook refresh without a cursor, at-least-once duplicates) gets none."""

from __future__ import annotations

import pytest

from opentelemetry.instrumentation.mcp_resumption.rules.events import (
    LOSSES,
    PAGES,
    EventLedger,
    Kind,
    ThreadKey,
    arguments_digest,
    declares_events,
)

SERVER = "127.0.0.1:9"
WINDOW = 5.0


def poll(ledger, rid, cursor, name="ticket.created", arguments=None, now=0.0):
    params = {"name": name, "arguments": arguments or {"project": "x"}}
    if cursor is not ...:
        params["cursor"] = cursor
    return ledger.requested(SERVER, rid, "events/poll", params, now)


def page(ledger, rid, cursor, events=(), truncated=False, now=0.0, **extra):
    result = {"events": list(events), "cursor": cursor, "truncated": truncated, "hasMore": False}
    result.update(extra)
    return ledger.answered(SERVER, rid, {"jsonrpc": "2.0", "id": rid, "result": result}, now, 0.0)


def stream(ledger, rid, cursor, name="ticket.created", now=0.0):
    params = {"name": name, "arguments": {"project": "x"}, "cursor": cursor}
    return ledger.requested(SERVER, rid, "events/stream", params, now)


def note(ledger, rid, method, now=0.0, **params):
    # The ids of these tests are keys already (request_key of an integer id).
    subscription = int(rid[1:]) if rid[1:].isdigit() else rid
    params["_meta"] = {"io.modelcontextprotocol/subscriptionId": subscription}
    return ledger.notified(SERVER, f"notifications/events/{method}", params, now)


def kinds(outcome):
    return [finding.kind for finding in outcome.findings]


def test_a_poll_loop_that_follows_its_cursor_finds_nothing():
    ledger = EventLedger()
    assert not poll(ledger, "1", None).findings
    assert not page(ledger, "1", "c1", [{"eventId": "e1", "data": {"n": 1}}]).findings
    assert not poll(ledger, "2", "c1").findings
    assert not page(ledger, "2", "c2", [{"eventId": "e2", "data": {"n": 2}}])


def test_truncated_is_the_servers_word():
    ledger = EventLedger()
    poll(ledger, "1", None)
    page(ledger, "1", "c1")
    poll(ledger, "2", "c1")
    outcome = page(ledger, "2", "c9", truncated=True)
    assert kinds(outcome) == [Kind.TRUNCATED]
    assert outcome.findings[0].loss
    assert outcome.findings[0].key.name == "ticket.created"


def test_the_cursor_gap_dialect_is_truncated():
    ledger = EventLedger()
    poll(ledger, "1", "c1")
    outcome = ledger.answered(
        SERVER, "1", {"id": "1", "result": {"events": [], "cursor": "c2", "cursorGap": True}}, 0, 0
    )
    assert kinds(outcome) == [Kind.TRUNCATED]


def test_a_cursor_expired_error_is_truncated():
    ledger = EventLedger()
    poll(ledger, "1", "c1")
    error = {"code": -32011, "message": "CursorExpired: cursor is too old", "data": {}}
    outcome = ledger.answered(SERVER, "1", {"id": "1", "error": error}, 0, 0)
    assert kinds(outcome) == [Kind.TRUNCATED]


def test_other_errors_are_no_finding_before_a_subscription_held():
    ledger = EventLedger()
    poll(ledger, "1", None)
    error = {"code": -32602, "message": "unknown event type"}
    assert not ledger.answered(SERVER, "1", {"id": "1", "error": error}, 0, 0)


def test_a_poll_error_ends_a_subscription_the_thread_held():
    ledger = EventLedger()
    poll(ledger, "1", None)
    page(ledger, "1", "c1")
    poll(ledger, "2", "c1")
    error = {"code": -32024, "message": "Forbidden", "data": {"reason": "Access revoked"}}
    outcome = ledger.answered(SERVER, "2", {"id": "2", "error": error}, 0, 0)
    assert kinds(outcome) == [Kind.TERMINATED]
    assert outcome.findings[0].error == "-32024"
    # Starting again from now after the server ended it loses nothing more.
    assert not poll(ledger, "3", None).findings


def test_truncated_from_now_is_no_loss():
    """A request that supplied no cursor asked for nothing in the past."""
    ledger = EventLedger()
    poll(ledger, "1", None)
    assert not page(ledger, "1", "c1", truncated=True).findings


def test_a_null_cursor_after_a_held_one_loses_everything_between():
    ledger = EventLedger()
    poll(ledger, "1", None)
    page(ledger, "1", "c1")
    outcome = poll(ledger, "2", None)
    assert kinds(outcome) == [Kind.CURSOR_LOST]
    assert Kind.CURSOR_LOST in PAGES
    # An absent cursor is null too.
    assert kinds(poll(ledger, "3", ...)) == [Kind.CURSOR_LOST]


def test_an_older_cursor_of_the_thread_is_rewound_not_lost():
    ledger = EventLedger()
    for n in range(1, 4):
        poll(ledger, str(n), f"c{n - 1}" if n > 1 else None)
        page(ledger, str(n), f"c{n}", [{"eventId": f"e{n}", "data": n}])
    outcome = poll(ledger, "9", "c1")
    assert kinds(outcome) == [Kind.CURSOR_REWOUND]
    assert Kind.CURSOR_REWOUND not in LOSSES
    again = page(ledger, "9", "c3", [{"eventId": "e2", "data": 2}, {"eventId": "e3", "data": 3}])
    assert again.duplicates == 2 and not again.findings


def test_a_cursor_never_carried_is_unknown():
    ledger = EventLedger()
    poll(ledger, "1", None)
    page(ledger, "1", "c1")
    assert kinds(poll(ledger, "2", "forged")) == [Kind.CURSOR_UNKNOWN]
    # A fresh process resuming a persisted cursor proves nothing either.
    assert kinds(poll(EventLedger(), "1", "persisted")) == [Kind.CURSOR_UNKNOWN]


def test_threads_are_keyed_by_name_and_arguments_not_by_request():
    ledger = EventLedger()
    poll(ledger, "1", None, arguments={"project": "a"})
    page(ledger, "1", "ca")
    # Another subscription (other arguments) starting from now is no loss.
    assert not poll(ledger, "2", None, arguments={"project": "b"}).findings
    # Argument order does not matter.
    assert arguments_digest({"a": 1, "b": 2}) == arguments_digest({"b": 2, "a": 1})
    assert arguments_digest({"token": "secret"}) != "secret"


def test_an_event_id_again_with_another_payload_is_reused():
    ledger = EventLedger()
    poll(ledger, "1", None)
    page(ledger, "1", "c1", [{"eventId": "e1", "data": {"n": 1}}])
    poll(ledger, "2", "c1")
    outcome = page(ledger, "2", "c2", [{"eventId": "e1", "data": {"n": 2}}])
    assert kinds(outcome) == [Kind.EVENT_ID_REUSED]


def test_a_push_stream_cut_and_reopened_with_its_cursor_is_proven():
    ledger = EventLedger()
    assert stream(ledger, "1", None).stream == "opened"
    assert not note(ledger, "x1", "active", cursor="c0", truncated=False)
    assert not note(ledger, "x1", "event", eventId="e1", name="t", data={}, cursor="c1")
    ledger.stream_ended(SERVER, "1", cut=True, now=1.0)
    assert not stream(ledger, "2", "c1", now=1.5).findings
    outcome = note(ledger, "x2", "active", now=1.6, cursor="c1", truncated=False)
    assert outcome.reopened is not None and outcome.reopened.proven
    assert not ledger.due(100.0, 0.0, WINDOW)


def test_a_reopen_the_server_truncates_is_not_proven():
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", cursor="c1", truncated=False)
    ledger.stream_ended(SERVER, "1", cut=True, now=1.0)
    stream(ledger, "2", "c1", now=2.0)
    outcome = note(ledger, "x2", "active", now=2.0, cursor="c5", truncated=True)
    assert kinds(outcome) == [Kind.TRUNCATED]
    assert outcome.reopened is not None and not outcome.reopened.proven


def test_a_cut_stream_not_reopened_within_the_window():
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", cursor="c1", truncated=False)
    ledger.stream_ended(SERVER, "1", cut=True, now=1.0)
    assert not ledger.due(1.0 + WINDOW - 0.1, 0.0, WINDOW)
    assert ledger.next_due(1.0, 0.0, WINDOW) == pytest.approx(WINDOW)
    assert kinds(ledger.due(1.0 + WINDOW, 0.0, WINDOW)) == [Kind.NOT_REOPENED]
    assert not ledger.due(1.0 + 3 * WINDOW, 0.0, WINDOW)  # once


def test_the_applications_own_close_is_clean():
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", cursor="c1", truncated=False)
    ended = ledger.stream_ended(SERVER, "1", cut=False, now=1.0)
    assert ended.stream == "ended" and not ended.findings
    assert not ledger.due(100.0, 0.0, WINDOW)


def test_a_type_without_replay_reports_its_window():
    ledger = EventLedger()
    stream(ledger, "1", None, name="presence")
    note(ledger, "x1", "active", cursor=None, truncated=False)
    ledger.stream_ended(SERVER, "1", cut=True, now=10.0)
    stream(ledger, "2", None, name="presence", now=12.5)
    outcome = note(ledger, "x2", "active", now=12.6, cursor=None, truncated=False)
    assert kinds(outcome) == [Kind.UNREPLAYABLE_WINDOW]
    assert outcome.findings[0].window == pytest.approx(2.5)
    assert outcome.reopened is None


def test_a_silent_stream_is_said_once_while_open():
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", now=0.0, cursor="c1", truncated=False)
    note(ledger, "x1", "heartbeat", now=1.0, cursor="c1")
    note(ledger, "x1", "heartbeat", now=2.0, cursor="c1")
    assert not ledger.due(3.9, 0.0, WINDOW)
    found = ledger.due(4.1, 0.0, WINDOW)
    assert kinds(found) == [Kind.STREAM_SILENT]
    assert not ledger.due(9.0, 0.0, WINDOW)
    # Heard again: it may fall silent again.
    note(ledger, "x1", "heartbeat", now=10.0, cursor="c1")
    assert kinds(ledger.due(12.1, 0.0, WINDOW)) == [Kind.STREAM_SILENT]


def test_no_interval_seen_no_silence_claimed():
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", now=0.0, cursor="c1", truncated=False)
    assert not ledger.due(1000.0, 0.0, WINDOW)


def test_terminated_names_the_error_and_needs_no_reopen():
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", cursor="c1", truncated=False)
    outcome = note(ledger, "x1", "terminated", error={"code": -32024, "message": "forbidden"})
    assert kinds(outcome) == [Kind.TERMINATED]
    assert outcome.findings[0].error == "-32024"
    ledger.stream_ended(SERVER, "1", cut=True, now=1.0)  # its close after terminated
    assert not ledger.due(100.0, 0.0, WINDOW)


def test_notifications_of_an_unknown_stream_are_ignored():
    ledger = EventLedger()
    assert not note(ledger, "nobody", "event", eventId="e", data={}, cursor="c")
    assert not ledger.notified(SERVER, "notifications/events/event", {"cursor": "c"}, 0)
    assert not ledger.notified(SERVER, "notifications/events/event", "junk", 0)


def subscribe(ledger, rid, cursor=None, now=0.0):
    params = {
        "name": "push",
        "arguments": {},
        "delivery": {"mode": "webhook", "url": "http://127.0.0.1/hook", "secret": "s"},
        "cursor": cursor,
    }
    return ledger.requested(SERVER, rid, "events/subscribe", params, now)


def subscribed(ledger, rid, refresh_before, **extra):
    result = {"id": "sub-1", "refreshBefore": refresh_before, "cursor": None, "truncated": False}
    result.update(extra)
    return ledger.answered(SERVER, rid, {"id": rid, "result": result}, 0.0, 0.0)


def test_a_webhook_not_refreshed_lapses_when_its_moment_passes():
    ledger = EventLedger()
    subscribe(ledger, "1")
    subscribed(ledger, "1", "2026-12-07T10:00:00Z")
    moment = 1796637600.0  # 2026-12-07T10:00:00Z
    assert not ledger.due(0.0, moment - 1, WINDOW)
    assert kinds(ledger.due(0.0, moment, WINDOW)) == [Kind.LAPSED]
    assert not ledger.due(0.0, moment + 100, WINDOW)


def test_a_refreshed_or_unsubscribed_webhook_does_not_lapse():
    ledger = EventLedger()
    subscribe(ledger, "1")
    subscribed(ledger, "1", 1_000_000)  # ms since the epoch: 1000 s
    assert not subscribe(ledger, "2").findings  # a refresh: no cursor judged
    subscribed(ledger, "2", 2_000_000)
    assert not ledger.due(0.0, 1500.0, WINDOW)
    ledger.requested(SERVER, "3", "events/unsubscribe", {"id": "sub-1"}, 0.0)
    assert not ledger.due(0.0, 5000.0, WINDOW)


def test_an_unsubscribe_by_name_ends_the_webhook():
    ledger = EventLedger()
    subscribe(ledger, "1")
    subscribed(ledger, "1", 1_000_000)
    unsubscribe = {"name": "push", "arguments": {}, "delivery": {"url": "http://127.0.0.1/hook"}}
    ledger.requested(SERVER, "2", "events/unsubscribe", unsubscribe, 0.0)
    assert not ledger.due(0.0, 5000.0, WINDOW)


def test_a_failing_delivery_status_is_named_once():
    ledger = EventLedger()
    subscribe(ledger, "1")
    status = {"active": False, "lastError": {"code": "http_500"}}
    outcome = subscribed(ledger, "1", None, deliveryStatus=status)
    assert kinds(outcome) == [Kind.DELIVERY_FAILING]
    assert outcome.findings[0].error == "http_500"
    subscribe(ledger, "2")
    assert not subscribed(ledger, "2", None, deliveryStatus=status).findings


def test_discovery_reads_both_declarations():
    assert declares_events({"capabilities": {"extensions": {"io.modelcontextprotocol/events": {}}}})
    assert declares_events({"capabilities": {"events": {}}})
    assert not declares_events({"capabilities": {"tools": {}}})
    assert not declares_events("junk")


def test_bounded_under_a_flood_of_distinct_arguments_and_huge_cursors():
    ledger = EventLedger(max_threads=64)
    big = "x" * 1_000_000
    for n in range(500):
        poll(ledger, str(n), big if n % 2 else None, arguments={"n": n})
        page(ledger, str(n), big)
    assert ledger.threads() == 64
    assert ledger.dropped == 500 - 64


def test_malformed_facts_are_no_exception():
    ledger = EventLedger()
    for params in (
        None,
        [],
        {"name": 5},
        {"name": "t", "cursor": 7},
        {"name": "t", "arguments": object()},
    ):
        ledger.requested(SERVER, "1", "events/poll", params, 0.0)
    ledger.answered(SERVER, "1", "junk", 0.0, 0.0)
    ledger.answered(SERVER, "1", {"result": {"cursor": ["x"], "events": "no"}}, 0.0, 0.0)
    ledger.notified(
        SERVER,
        "notifications/events/active",
        {"_meta": {"io.modelcontextprotocol/subscriptionId": True}},
        0,
    )
    ThreadKey("s", "n", "d")


def test_a_skimmed_event_keeps_its_id_and_cursor_not_its_payload():
    """A push stream's events read for id and cursor alone (the tick's
    skim): a repeat of the id is a duplicate, never a reuse (the payloads
    were not both read), and its cursor is one the thread carried."""
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", now=0.0, cursor="c0", truncated=False)
    assert not ledger.skimmed(SERVER, "1", "e1", "c1", 1.0)
    assert not ledger.skimmed(SERVER, "1", "e2", "c2", 1.0)
    outcome = note(ledger, "x1", "event", now=1.0, eventId="e3", data={"n": 3}, cursor="c3")
    assert not outcome
    again = ledger.skimmed(SERVER, "1", "e1", "c1", 2.0)
    assert again.duplicates == 1 and not again.findings
    read = note(ledger, "x1", "event", now=2.0, eventId="e2", data={"n": 999}, cursor="c2")
    assert read.duplicates == 1 and not read.findings
    # Read both times, with another payload: a reuse.
    reused = note(ledger, "x1", "event", now=2.0, eventId="e3", data={"n": 4}, cursor="c3")
    assert kinds(reused) == [Kind.EVENT_ID_REUSED]
    ledger.stream_ended(SERVER, "1", cut=False, now=3.0)
    assert kinds(stream(ledger, "2", "c1", now=4.0)) == [Kind.CURSOR_REWOUND]


def test_a_stream_read_more_finely_measures_its_interval_again():
    """``retime``: the interval timed by coarse reads holds until the next
    gap between two heartbeats replaces it."""
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", now=0.0, cursor="c1", truncated=False)
    assert ledger.heartbeat_interval(SERVER, "1") is None
    note(ledger, "x1", "heartbeat", now=1.0, cursor="c1")  # read a second late
    assert ledger.heartbeat_interval(SERVER, "1") == pytest.approx(1.0)
    ledger.retime(SERVER, "1")
    assert ledger.heartbeat_interval(SERVER, "1") == pytest.approx(1.0)  # holds meanwhile
    note(ledger, "x1", "heartbeat", now=1.05, cursor="c1")
    note(ledger, "x1", "heartbeat", now=1.3, cursor="c1")
    assert ledger.heartbeat_interval(SERVER, "1") == pytest.approx(0.25)
    assert not ledger.due(1.79, 0.0, WINDOW)
    assert kinds(ledger.due(1.81, 0.0, WINDOW)) == [Kind.STREAM_SILENT]


def test_a_cut_beside_a_live_stream_of_its_thread_waits_for_nothing_yet():
    """A push stream cut while another stream of its subscription is still
    open: nothing is due until that one ends (else the owner's tick, asked
    when to look again, is told "now" for as long as it lives)."""
    ledger = EventLedger()
    stream(ledger, "1", None)
    note(ledger, "x1", "active", cursor="c0", truncated=False)
    stream(ledger, "2", "c0")
    note(ledger, "x2", "active", cursor="c0", truncated=False)
    ledger.stream_ended(SERVER, "1", cut=True, now=1.0)
    assert ledger.next_due(100.0, 100.0, WINDOW) is None
    assert not ledger.due(100.0, 100.0, WINDOW).findings
    ledger.stream_ended(SERVER, "2", cut=True, now=101.0)
    assert ledger.next_due(102.0, 102.0, WINDOW) == WINDOW - 1.0
    assert kinds(ledger.due(106.0, 106.0, WINDOW)) == [Kind.NOT_REOPENED]
