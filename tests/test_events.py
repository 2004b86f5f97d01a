"""The Events extension's cursors, proven across every disconnect: a client
of the tests' own (``events_wire``: httpx and httpx-sse, or httpx2, as the
installed MCP SDK uses) polls, streams and subscribes through the plugin to
a server that follows the specification to the letter (``events_server``).

The wire's truth is read first, from the server's own log (what it
published, delivered, truncated, and every cursor it handed out and got),
never from the plugin; then the plugin's counts are compared with it.  A
push stream cut below the application is never a lost call, an
``orphaned_request`` or a ``not_resumable`` break (``loss_accounting``
checks every test for lost calls; each test here also checks the broken
requests and resume attempts are none).
"""

from __future__ import annotations

import asyncio
import functools
import logging

from helpers import Telemetry
from mcp_resumption_demo.events_server import NO_REPLAY, REPLAYABLE, Dialect, EventsServer
from mcp_resumption_demo.events_wire import EventsRpcError, EventsWire, WebhookReceiver, new_secret
from wire import wait_until

GAPS = "mcp.client.resumption.event_gaps"
KIND = "mcp.events.gap.kind"
STREAMS = "mcp.client.resumption.event_streams"
STATE = "mcp.events.stream.state"
DUPLICATES = "mcp.client.resumption.event_duplicates"
CONFIRM = 1.0  # the confirmation window: a cut push stream's reopen window (s)


def in_asyncio(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def gaps(telemetry: Telemetry) -> dict[str, int]:
    return telemetry.counts(GAPS, KIND)


def no_lost_call(telemetry: Telemetry) -> None:
    """Nothing of the events was a call: no broken request, no resume."""
    assert telemetry.fates() == {}
    assert telemetry.outcomes() == {}
    assert telemetry.gap_kinds() == {}


def lines(caplog, kind: str) -> list[str]:
    said = (record.getMessage() for record in caplog.records)
    return [line for line in said if f"mcp-resumption event {kind}:" in line]


@in_asyncio
async def test_a_poll_the_server_truncates_is_counted_and_said(caplog):
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    with EventsServer(retention=5) as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire:
            first = await wire.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, 12)  # 7 fall out of retention
            answer = await wire.poll(REPLAYABLE, first["cursor"])
        truncations = server.log.truncations()
        assert answer["truncated"] is True and len(truncations) == 1  # the wire
        found = await wait_until(lambda: gaps(telemetry), 5)
    assert found == {"truncated": 1}
    (line,) = lines(caplog, "truncated")
    assert f"event={REPLAYABLE}" in line and "delivery=poll" in line
    assert len(telemetry.gap_logs()) == 1
    no_lost_call(telemetry)


@in_asyncio
async def test_an_app_that_lost_its_cursor_is_said_although_the_server_truncated_nothing(caplog):
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    with EventsServer() as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire:
            first = await wire.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, 3)
            await wire.poll(REPLAYABLE, first["cursor"])  # the loop follows its cursor
            server.publish(REPLAYABLE, 2)
            restarted = await wire.poll(REPLAYABLE, None)  # a restart forgot it
        assert restarted["truncated"] is False and restarted["events"] == []  # the wire
        assert len(server.log.skipped_event_ids()) == 0
        found = await wait_until(lambda: gaps(telemetry), 5)
    assert found == {"cursor_lost": 1}
    assert len(lines(caplog, "cursor_lost")) == 1
    no_lost_call(telemetry)


@in_asyncio
async def test_a_push_stream_cut_and_reopened_with_its_cursor_lost_nothing():
    telemetry = Telemetry()
    with EventsServer(heartbeat_s=5) as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire:
            async with wire.stream(REPLAYABLE, None) as stream:
                server.publish(REPLAYABLE, 2)
                await stream.next_event()
                await stream.next_event()
                server.cut(stream.request_id)
                await stream.wait_ended()
                assert stream.broken is not None or stream.result is None  # cut, no terminated
                cursor = stream.cursor
            server.publish(REPLAYABLE, 1)
            async with wire.stream(REPLAYABLE, cursor) as again:
                event = await again.next_event()
                active = again.messages[0]["params"]
        assert active["truncated"] is False  # the wire: nothing skipped
        assert event["eventId"] == server.log.published_events(REPLAYABLE)[2].event_id
        states = await wait_until(
            lambda: telemetry.counts(STREAMS, STATE).get("reopened"), 5
        )
    assert states == 1
    assert gaps(telemetry) == {}
    no_lost_call(telemetry)


@in_asyncio
async def test_a_cut_push_stream_not_reopened_is_said_once_its_window_passed(caplog):
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    with EventsServer(heartbeat_s=5) as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire, wire.stream(REPLAYABLE, None) as stream:
            server.cut(stream.request_id)
            await stream.wait_ended()
        found = await wait_until(lambda: gaps(telemetry), 10)
    assert found == {"not_reopened": 1}
    assert len(lines(caplog, "not_reopened")) == 1
    no_lost_call(telemetry)


@in_asyncio
async def test_the_applications_own_close_ends_a_stream_cleanly():
    telemetry = Telemetry()
    with EventsServer(heartbeat_s=0.2) as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire:
            async with wire.stream(REPLAYABLE, None) as stream:
                await stream.next("notifications/events/heartbeat")
            await server.await_streams(0)
            ended = await wait_until(lambda: telemetry.counts(STREAMS, STATE).get("ended"), 5)
        # Past the reopen window, nothing was said.
        quiet = await wait_until(lambda: gaps(telemetry), 2 * CONFIRM + 1)
    assert ended == 1
    assert quiet == {}
    no_lost_call(telemetry)


@in_asyncio
async def test_a_silent_push_stream_is_said_while_it_is_open(caplog):
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    with EventsServer(heartbeat_s=0.2) as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire, wire.stream(REPLAYABLE, None) as stream:
            for _ in range(3):
                await stream.next("notifications/events/heartbeat")
            server.silence(stream.request_id)
            found = await wait_until(lambda: gaps(telemetry), 10)
            assert not stream.ended.is_set()  # still open on the wire
            assert server.open_streams() == [stream.request_id]
    assert found == {"stream_silent": 1}
    # a state of the stream too (the dashboard's push streams by state)
    assert telemetry.counts(STREAMS, STATE).get("silent") == 1
    assert len(lines(caplog, "stream_silent")) == 1
    no_lost_call(telemetry)


@in_asyncio
async def test_a_silence_is_said_close_to_the_moment_it_is_due(caplog):
    """Due when the stream has been silent for twice its heartbeat interval
    after the last notification the server sent (its log's clock): said
    within half a second and one interval of that, not a tick or more later."""
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    heartbeat = 0.25
    with EventsServer(heartbeat_s=heartbeat) as server, telemetry.instrumented(
        confirm_timeout=CONFIRM
    ):
        async with EventsWire(server.url) as wire, wire.stream(REPLAYABLE, None) as stream:
            for _ in range(8):  # the interval seen, its first coarse gap aged out
                await stream.next("notifications/events/heartbeat")
            server.silence(stream.request_id)
            found = await wait_until(lambda: gaps(telemetry), 15)
            assert not stream.ended.is_set()
        last_sent = server.log.exchange(stream.request_id, "events/stream").last_sent_at
    assert found == {"stream_silent": 1}
    (said,) = [
        record.created
        for record in caplog.records
        if "mcp-resumption event stream_silent:" in record.getMessage()
    ]
    due = last_sent + 2 * heartbeat
    assert said > last_sent + heartbeat  # never before an interval passed
    assert said - due <= 0.5 + heartbeat, f"said {said - due:.2f} s after it was due"
    no_lost_call(telemetry)


@in_asyncio
async def test_a_terminated_subscription_names_its_error(caplog):
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    with EventsServer(heartbeat_s=5) as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire, wire.stream(REPLAYABLE, None) as stream:
            server.terminate(stream.request_id)
            await stream.wait_ended()
            assert any(
                m.get("method") == "notifications/events/terminated" for m in stream.messages
            )
        found = await wait_until(lambda: gaps(telemetry), 5)
        # A terminated stream is not waited on for a reopen.
        later = await wait_until(lambda: gaps(telemetry).get("not_reopened"), 2 * CONFIRM + 1)
    assert found == {"terminated": 1}
    assert later is None
    (line,) = lines(caplog, "terminated")
    assert "error=-32024" in line
    no_lost_call(telemetry)


@in_asyncio
async def test_a_push_stream_reopened_from_an_older_cursor_counts_what_came_again():
    """A push stream's events are read for their ids and cursors (not parsed,
    but the last): an older cursor of them is known as one, and every
    event delivered again is counted as a duplicate."""
    telemetry = Telemetry()
    with EventsServer(heartbeat_s=5) as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire:
            async with wire.stream(REPLAYABLE, None) as stream:
                server.publish(REPLAYABLE, 10)
                events = [await stream.next_event() for _ in range(10)]
            first = stream.request_id
            async with wire.stream(REPLAYABLE, events[2]["cursor"]) as again:  # rewound
                for _ in range(7):
                    await again.next_event()
            second = again.request_id
            # The server logs a delivery after its write: its streams' ends come after both.
            await server.await_streams(0)
        # The wire: the ids the second stream delivered that the first had.
        twice = set(server.log.delivered_ids(first)) & set(server.log.delivered_ids(second))
        assert len(twice) == 7
        duplicates = await wait_until(
            lambda: telemetry.counts(DUPLICATES).get(None) == 7 or None, 5
        )
    assert duplicates
    assert gaps(telemetry) == {"cursor_rewound": 1}
    no_lost_call(telemetry)


@in_asyncio
async def test_a_type_without_replay_reports_the_window_it_was_cut():
    telemetry = Telemetry()
    with EventsServer(heartbeat_s=5) as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire:
            async with wire.stream(NO_REPLAY, None) as stream:
                assert stream.messages[0]["params"]["cursor"] is None  # the wire: no replay
                server.cut(stream.request_id)
                await stream.wait_ended()
            server.publish(NO_REPLAY, 2)  # published while cut: lost by design
            async with wire.stream(NO_REPLAY, None):
                pass
        found = await wait_until(lambda: gaps(telemetry), 5)
    assert found == {"unreplayable_window": 1}
    no_lost_call(telemetry)


@in_asyncio
async def test_an_older_cursor_is_rewound_and_its_duplicates_counted():
    telemetry = Telemetry()
    with EventsServer() as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url) as wire:
            start = await wire.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, 3)
            page = await wire.poll(REPLAYABLE, start["cursor"])
            await wire.poll(REPLAYABLE, page["cursor"])
            again = await wire.poll(REPLAYABLE, start["cursor"])  # rewound
        assert len(again["events"]) == 3  # the wire: delivered again
        found = await wait_until(lambda: gaps(telemetry), 5)
        duplicates = await wait_until(lambda: telemetry.counts(DUPLICATES).get(None), 5)
    assert found == {"cursor_rewound": 1}
    assert duplicates == 3
    no_lost_call(telemetry)


@in_asyncio
async def test_the_dialects_say_truncated_too():
    telemetry = Telemetry()
    dialect = Dialect(gap_field="cursorGap", poll_interval="nextPollSeconds")
    with EventsServer(retention=2, dialect=dialect) as server, telemetry.instrumented():
        async with EventsWire(server.url) as wire:
            first = await wire.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, 5)
            answer = await wire.poll(REPLAYABLE, first["cursor"])
        assert answer.get("cursorGap") is True
        found = await wait_until(lambda: gaps(telemetry), 5)
    assert found == {"truncated": 1}

    telemetry = Telemetry()
    with EventsServer(retention=2, dialect=Dialect(expired_error=True)) as server, (
        telemetry.instrumented()
    ):
        async with EventsWire(server.url) as wire:
            first = await wire.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, 5)
            try:
                await wire.poll(REPLAYABLE, first["cursor"])
            except EventsRpcError as error:
                refused = error
        assert "expired" in refused.message.lower()  # the wire
        found = await wait_until(lambda: gaps(telemetry), 5)
    assert found == {"truncated": 1}


@in_asyncio
async def test_a_webhook_subscription_left_to_lapse_is_said_when_it_lapses(caplog):
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    with EventsServer() as server, WebhookReceiver() as receiver, telemetry.instrumented():
        async with EventsWire(server.url, token="alice") as wire:
            answer = await wire.subscribe(REPLAYABLE, receiver.url, new_secret(), ttl_ms=500)
        assert answer["refreshBefore"]
        found = await wait_until(lambda: gaps(telemetry), 10)
    assert found == {"lapsed": 1}
    assert len(lines(caplog, "lapsed")) == 1


@in_asyncio
async def test_a_refreshed_webhook_subscription_does_not_lapse():
    telemetry = Telemetry()
    with EventsServer() as server, WebhookReceiver() as receiver, telemetry.instrumented():
        secret = new_secret()
        async with EventsWire(server.url, token="alice") as wire:
            await wire.subscribe(REPLAYABLE, receiver.url, secret, ttl_ms=60_000)
            await wire.subscribe(REPLAYABLE, receiver.url, secret, ttl_ms=60_000)
            await wire.unsubscribe(REPLAYABLE, receiver.url)
        assert gaps(telemetry) == {}


@in_asyncio
async def test_each_principal_is_a_subscription_of_its_own(caplog):
    """One process subscribes for two principals (a gateway, a proxy's
    upstream): the specification keys a subscription by its principal, so
    bob's "from now" after alice's cursor is no loss, and alice's own
    restart from now still is."""
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    with EventsServer() as server, telemetry.instrumented(confirm_timeout=CONFIRM):
        async with EventsWire(server.url, token="alice") as alice, EventsWire(
            server.url, token="bob"
        ) as bob:
            first = await alice.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, 2)
            await alice.poll(REPLAYABLE, first["cursor"])
            await bob.poll(REPLAYABLE, None)  # bob's first poll: from now, no loss
            server.publish(REPLAYABLE, 1)
            restarted = await alice.poll(REPLAYABLE, None)  # alice forgot hers
        assert restarted["events"] == [] and restarted["truncated"] is False  # the wire
        found = await wait_until(lambda: gaps(telemetry), 5)
    assert found == {"cursor_lost": 1}
    (line,) = lines(caplog, "cursor_lost")
    assert "alice" not in line and "bob" not in line  # no principal in a line
    no_lost_call(telemetry)
