"""The Events server (the demo's ``events_server``) against the specification,
through a plain HTTP client (``events_wire``): the wire, each control, each
dialect, and its ground-truth log.  No product is involved."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from mcp_resumption_demo.events_server import (
    CURSOR_EXPIRED,
    EXTENSION,
    FORBIDDEN,
    INVALID_PARAMS,
    NO_REPLAY,
    NOT_FOUND,
    REPLAYABLE,
    SUBSCRIPTION_ID,
    UNSUPPORTED,
    Dialect,
    EventsServer,
)
from mcp_resumption_demo.events_wire import EventsRpcError, EventsWire, WebhookReceiver, new_secret

HEARTBEAT_S = 0.1


@pytest.fixture
def events():
    with EventsServer(heartbeat_s=HEARTBEAT_S, retention=5) as server:
        yield server


@contextlib.asynccontextmanager
async def one_stream(server: EventsServer, request_id: object):
    wire = EventsWire(server.url)
    async with wire, wire.stream(REPLAYABLE, None, request_id=request_id) as stream:
        yield stream


def run(coro):
    return asyncio.run(coro)


async def until(predicate, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# -- the transport -------------------------------------------------------------
def test_discover_declares_the_extension_and_list_describes_types(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            return await wire.discover(), await wire.list_types()

    discovered, types = run(scenario())
    assert discovered["resultType"] == "complete"
    assert discovered["supportedVersions"] == ["2026-07-28"]
    assert EXTENSION in discovered["capabilities"]["extensions"]
    by_name = {t["name"]: t for t in types}
    assert by_name[REPLAYABLE]["delivery"] == ["poll", "push", "webhook"]
    assert by_name[NO_REPLAY]["delivery"] == ["push", "webhook"]
    for described in types:
        assert {"name", "description", "delivery", "inputSchema", "payloadSchema"} <= set(described)


def test_top_level_capability_dialect():
    with EventsServer(dialect=Dialect(capability="top-level")) as server:
        async def scenario():
            async with EventsWire(server.url) as wire:
                return await wire.discover()

        capabilities = run(scenario())["capabilities"]
    assert "events" in capabilities and "extensions" not in capabilities


def test_the_2026_07_28_request_ladder(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            http = wire.http
            body, headers = wire.message("events/list")
            answers = {}
            bare = {**body, "params": {}}
            answers["no meta"] = await http.post(events.url, json=bare, headers=headers)
            answers["header"] = await http.post(
                events.url, json=body, headers={**headers, "mcp-method": "events/poll"})
            old = {**body, "params": {"_meta": {**body["params"]["_meta"],
                   "io.modelcontextprotocol/protocolVersion": "2025-11-25"}}}
            answers["version"] = await http.post(
                events.url, json=old, headers={**headers, "mcp-protocol-version": "2025-11-25"})
            unknown, unknown_headers = wire.message("events/nope")
            answers["method"] = await http.post(events.url, json=unknown, headers=unknown_headers)
            answers["get"] = await http.get(events.url)
            note = {k: v for k, v in body.items() if k != "id"}
            answers["notification"] = await http.post(events.url, json=note, headers=headers)
            answers["origin"] = await http.post(
                events.url, json=body, headers={**headers, "origin": "https://evil.example"})
            return answers

    answers = run(scenario())
    assert (answers["no meta"].status_code, answers["no meta"].json()["error"]["code"]) == (
        400, INVALID_PARAMS)
    assert (answers["header"].status_code, answers["header"].json()["error"]["code"]) == (
        400, -32020)
    version = answers["version"].json()["error"]
    assert (answers["version"].status_code, version["code"]) == (400, -32022)
    assert version["data"] == {"supported": ["2026-07-28"], "requested": "2025-11-25"}
    assert (answers["method"].status_code, answers["method"].json()["error"]["code"]) == (
        404, -32601)
    assert answers["get"].status_code == 405
    assert answers["notification"].status_code == 202
    assert answers["origin"].status_code == 403


# -- poll ----------------------------------------------------------------------
def test_poll_starts_from_now_then_returns_what_was_published_in_order(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            first = await wire.poll(REPLAYABLE, None, request_id="p-1")
            published = events.publish(REPLAYABLE, 3)
            second = await wire.poll(REPLAYABLE, first["cursor"], request_id="p-2")
            third = await wire.poll(REPLAYABLE, second["cursor"], request_id="p-3")
            return published, first, second, third

    published, first, second, third = run(scenario())
    assert first["events"] == [] and first["truncated"] is False and first["hasMore"] is False
    assert first["resultType"] == "complete" and first["nextPollMs"] == 1000
    assert [e["eventId"] for e in second["events"]] == published
    assert all("cursor" not in e for e in second["events"])  # poll cursors are per answer
    assert {"eventId", "name", "timestamp", "data"} <= set(second["events"][0])
    assert third["events"] == [] and third["cursor"] == second["cursor"]
    assert events.log.delivered_ids("p-2") == published
    assert events.log.exchange("p-2").cursor_in == first["cursor"]
    assert ("p-2", "poll", second["cursor"]) in events.log.cursors_handed_out()
    assert [p.event_id for p in events.log.published_events(REPLAYABLE)] == published


def test_poll_max_events_pages_with_has_more(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            start = await wire.poll(REPLAYABLE)
            published = events.publish(REPLAYABLE, 5)
            page = await wire.poll(REPLAYABLE, start["cursor"], max_events=2)
            rest = await wire.poll(REPLAYABLE, page["cursor"], max_events=10)
            return published, page, rest

    published, page, rest = run(scenario())
    assert page["hasMore"] is True and len(page["events"]) == 2
    assert rest["hasMore"] is False
    assert [e["eventId"] for e in page["events"] + rest["events"]] == published


def test_poll_arguments_filter_by_project(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            start = await wire.poll(REPLAYABLE, arguments={"project": "beta"})
            events.publish(REPLAYABLE, 2, project="alpha")
            wanted = events.publish(REPLAYABLE, 1, project="beta")
            answer = await wire.poll(REPLAYABLE, start["cursor"], arguments={"project": "beta"})
            return wanted, answer

    wanted, answer = run(scenario())
    assert [e["eventId"] for e in answer["events"]] == wanted


def test_a_cursor_older_than_retention_truncates_to_the_oldest_retained(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            start = await wire.poll(REPLAYABLE)
            published = events.publish(REPLAYABLE, 8)  # retention is 5
            return published, await wire.poll(REPLAYABLE, start["cursor"], request_id="late")

    published, answer = run(scenario())
    assert answer["truncated"] is True
    assert [e["eventId"] for e in answer["events"]] == published[3:]
    (truncation,) = events.log.truncations()
    assert truncation.request_id == "late" and truncation.reason == "retention"
    assert truncation.skipped_offsets == (1, 3)
    assert list(truncation.skipped_event_ids) == published[:3]
    assert events.log.skipped_event_ids() == published[:3]


def test_max_age_floor_truncates(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            start = await wire.poll(REPLAYABLE)
            published = events.publish(REPLAYABLE, 2)
            return published, await wire.poll(REPLAYABLE, start["cursor"], max_age_ms=0)

    published, answer = run(scenario())
    assert answer["truncated"] is True and answer["events"] == []
    assert events.log.truncations()[0].reason == "max_age"
    assert list(events.log.truncations()[0].skipped_event_ids) == published


def test_cursors_are_opaque_and_foreign_ones_are_invalid_params(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            cursors = []
            cursor = None
            for _ in range(3):
                events.publish(REPLAYABLE)
                cursor = (await wire.poll(REPLAYABLE, cursor))["cursor"]
                cursors.append(cursor)
            with pytest.raises(EventsRpcError) as error:
                await wire.poll(REPLAYABLE, "12")
            return cursors, error.value

    cursors, error = run(scenario())
    assert len(set(cursors)) == 3
    assert not any(c.isdigit() for c in cursors)
    assert error.code == INVALID_PARAMS


def test_errors_for_unknown_names_and_modes_a_type_does_not_offer(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            errors = []
            for name in ("no.such.type", NO_REPLAY):
                with pytest.raises(EventsRpcError) as error:
                    await wire.poll(name)
                errors.append(error.value)
            return errors

    unknown, unsupported = run(scenario())
    assert (unknown.code, unknown.data) == (NOT_FOUND, {"kind": "event"})
    assert (unsupported.code, unsupported.data) == (
        UNSUPPORTED, {"feature": "deliveryMode", "value": "poll"})


def test_fail_next_poll_is_polls_termination(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            start = await wire.poll(REPLAYABLE)
            events.fail_next_poll()
            with pytest.raises(EventsRpcError) as error:
                await wire.poll(REPLAYABLE, start["cursor"])
            return error.value, await wire.poll(REPLAYABLE, start["cursor"])

    error, after = run(scenario())
    assert error.code == FORBIDDEN and after["events"] == []


# -- push ----------------------------------------------------------------------
@pytest.mark.parametrize("library", ["httpx", "httpx2"])
@pytest.mark.parametrize("request_id", ["sub-1", 7])
def test_stream_active_first_then_events_and_heartbeats_all_tagged(events, library, request_id):
    async def scenario():
        async with EventsWire(events.url, library=library) as wire:
            start = await wire.poll(REPLAYABLE)
            replayed = events.publish(REPLAYABLE, 2)
            async with wire.stream(REPLAYABLE, start["cursor"], request_id=request_id) as stream:
                got = [(await stream.next_event())["eventId"] for _ in range(2)]
                live = events.publish(REPLAYABLE)
                got.append((await stream.next_event())["eventId"])
                beat = await stream.next("notifications/events/heartbeat")
                return start, replayed + live, got, beat, list(stream.messages)

    start, published, got, beat, messages = run(scenario())
    assert got == published
    active = messages[0]
    assert active["method"] == "notifications/events/active"
    assert active["params"]["cursor"] == start["cursor"] and active["params"]["truncated"] is False
    assert all(m["params"]["_meta"] == {SUBSCRIPTION_ID: request_id} for m in messages)
    last_event = [m for m in messages if m["method"] == "notifications/events/event"][-1]
    assert beat["params"]["cursor"] == last_event["params"]["cursor"]
    assert {"eventId", "name", "timestamp", "data", "cursor"} <= set(last_event["params"])
    assert events.log.delivered_ids(request_id) == published
    # The server logs how a stream ended, then lets it leave open_streams.
    run(until(lambda: events.open_streams() == []))
    assert events.log.exchange(request_id).ended == "client_closed"


def test_stream_truncated_active_for_a_cursor_beyond_retention(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            start = await wire.poll(REPLAYABLE)
            published = events.publish(REPLAYABLE, 7)
            async with wire.stream(REPLAYABLE, start["cursor"], request_id="s") as stream:
                got = [(await stream.next_event())["eventId"] for _ in range(5)]
                return published, got, stream.messages[0]

    published, got, active = run(scenario())
    assert active["params"]["truncated"] is True
    assert got == published[2:]
    assert events.log.truncations()[0].skipped_event_ids == tuple(published[:2])


def test_a_type_without_replay_has_null_cursors_and_loses_what_no_stream_saw(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            missed = events.publish(NO_REPLAY, 2)
            async with wire.stream(NO_REPLAY, None, request_id="live") as stream:
                live = events.publish(NO_REPLAY)
                event = await stream.next_event()
                beat = await stream.next("notifications/events/heartbeat")
                return missed, live, event, beat, stream.messages[0]

    missed, live, event, beat, active = run(scenario())
    assert active["params"]["cursor"] is None and active["params"]["truncated"] is False
    assert event["eventId"] == live[0] and event["cursor"] is None
    assert beat["params"]["cursor"] is None
    assert not set(missed) & set(events.log.delivered_ids())


def test_set_heartbeat_and_stop_heartbeats_keep_the_stream_open(events):
    async def scenario():
        async with one_stream(events, "hb") as stream:
            events.set_heartbeat(0.05)
            await stream.next("notifications/events/heartbeat")
            events.stop_heartbeats()
            await asyncio.sleep(0.1)  # a heartbeat already on its way may land
            before = len(stream.messages)
            await asyncio.sleep(0.5)  # ten intervals: the window in which none may come
            quiet = stream.messages[before:]
            published = events.publish(REPLAYABLE)
            event = await stream.next_event()
            return quiet, published, event, events.open_streams()

    quiet, published, event, open_streams = run(scenario())
    assert quiet == []
    assert event["eventId"] == published[0]
    assert open_streams == ["hb"]


def test_silence_keeps_the_stream_open_and_sends_nothing(events):
    async def scenario():
        async with one_stream(events, "mute") as stream:
            events.silence()
            await asyncio.sleep(0.1)
            before = len(stream.messages)
            published = events.publish(REPLAYABLE)
            await asyncio.sleep(0.5)
            return published, stream.messages[before:], events.open_streams()

    _, after, open_streams = run(scenario())
    assert after == [] and open_streams == ["mute"]
    assert events.log.delivered_ids("mute") == []
    run(until(lambda: events.log.exchange("mute").ended == "client_closed"))


def test_send_error_is_transient(events):
    async def scenario():
        async with one_stream(events, "e") as stream:
            events.send_error()
            error = await stream.next("notifications/events/error")
            published = events.publish(REPLAYABLE)
            return error, published, await stream.next_event()

    error, published, event = run(scenario())
    assert error["params"]["error"]["code"] == -32603
    assert error["params"]["_meta"] == {SUBSCRIPTION_ID: "e"}
    assert event["eventId"] == published[0]


def test_terminate_sends_terminated_then_the_final_result(events):
    async def scenario():
        async with one_stream(events, "t") as stream:
            events.terminate(code=NOT_FOUND, message="NotFound", data={"kind": "event"})
            terminated = await stream.next("notifications/events/terminated")
            await stream.wait_ended()
            return terminated, stream.result, stream.broken

    terminated, result, broken = run(scenario())
    assert terminated["params"]["error"] == {"code": NOT_FOUND, "message": "NotFound",
                                             "data": {"kind": "event"}}
    assert result == {"jsonrpc": "2.0", "id": "t", "result": {
        "resultType": "complete", "_meta": {SUBSCRIPTION_ID: "t"}}}
    assert broken is None
    assert events.log.exchange("t").ended == "terminated"


def test_cut_closes_the_connection_with_nothing_said(events):
    async def scenario():
        async with one_stream(events, "c") as stream:
            events.cut()
            await stream.wait_ended()
            return stream.broken, stream.result, [m["method"] for m in stream.messages]

    broken, result, methods = run(scenario())
    assert broken is not None and result is None
    assert methods == ["notifications/events/active"]
    assert events.log.exchange("c").ended == "cut"
    assert events.open_streams() == []


def test_close_streams_ends_them_with_the_result_only(events):
    async def scenario():
        async with one_stream(events, "g") as stream:
            events.close_streams()
            await stream.wait_ended()
            return stream.broken, stream.result, [m.get("method") for m in stream.messages]

    broken, result, methods = run(scenario())
    assert broken is None and result["result"]["resultType"] == "complete"
    assert "notifications/events/terminated" not in methods
    assert events.log.exchange("g").ended == "completed"


def test_restart_keeping_retention_cuts_streams_and_keeps_cursors(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            async with wire.stream(REPLAYABLE, None, request_id="r1") as stream:
                published = events.publish(REPLAYABLE)
                await stream.next_event()
                events.restart()
                await stream.wait_ended()
                cursor = stream.cursor
            later = events.publish(REPLAYABLE, 2)
            async with wire.stream(REPLAYABLE, cursor, request_id="r2") as again:
                got = [(await again.next_event())["eventId"] for _ in range(2)]
                return published, later, got, again.messages[0], stream.broken

    _, later, got, active, broken = run(scenario())
    assert broken is not None
    assert got == later and active["params"]["truncated"] is False
    assert events.log.exchange("r1").ended == "cut"


def test_restart_losing_retention_makes_old_cursors_truncate(events):
    async def scenario():
        async with EventsWire(events.url) as wire:
            start = await wire.poll(REPLAYABLE)
            lost = events.publish(REPLAYABLE, 2)
            events.restart(lose_retention=True)
            fresh = events.publish(REPLAYABLE, 1)
            answer = await wire.poll(REPLAYABLE, start["cursor"], request_id="after")
            return lost, fresh, answer

    lost, fresh, answer = run(scenario())
    assert answer["truncated"] is True
    assert [e["eventId"] for e in answer["events"]] == fresh
    (truncation,) = events.log.truncations()
    assert truncation.reason == "epoch" and truncation.cursor_offset is None
    assert list(truncation.skipped_event_ids) == lost


# -- dialects ------------------------------------------------------------------
def test_cursor_gap_and_next_poll_seconds_dialect():
    dialect = Dialect(gap_field="cursorGap", poll_interval="nextPollSeconds")
    with EventsServer(dialect=dialect, retention=1, heartbeat_s=HEARTBEAT_S) as server:
        async def scenario():
            async with EventsWire(server.url) as wire:
                start = await wire.poll(REPLAYABLE)
                server.publish(REPLAYABLE, 3)
                answer = await wire.poll(REPLAYABLE, start["cursor"])
                async with wire.stream(REPLAYABLE, start["cursor"]) as stream:
                    return answer, stream.messages[0]

        answer, active = run(scenario())
    assert answer["cursorGap"] is True and "truncated" not in answer
    assert answer["nextPollSeconds"] == 1.0 and "nextPollMs" not in answer
    assert active["params"]["cursorGap"] is True


def test_cursor_expired_error_dialect():
    with EventsServer(dialect=Dialect(expired_error=True), retention=1) as server:
        async def scenario():
            async with EventsWire(server.url) as wire:
                start = await wire.poll(REPLAYABLE)
                server.publish(REPLAYABLE, 3)
                errors = []
                with pytest.raises(EventsRpcError) as polled:
                    await wire.poll(REPLAYABLE, start["cursor"], request_id="x")
                errors.append(polled.value)
                with pytest.raises(EventsRpcError) as streamed:
                    async with wire.stream(REPLAYABLE, start["cursor"]):
                        pass
                errors.append(streamed.value)
                return errors

        errors = run(scenario())
        assert server.log.exchange("x").error_code == CURSOR_EXPIRED
    for error in errors:
        assert error.code == CURSOR_EXPIRED and error.message == "CursorExpired"
        assert isinstance(error.data["cursor"], str)


# -- webhook -------------------------------------------------------------------
def test_webhook_subscribe_signed_deliveries_refresh_and_unsubscribe(events):
    secret = new_secret()
    with WebhookReceiver() as receiver:
        async def scenario():
            async with EventsWire(events.url, token="tenant-a") as wire:
                subscribed = await wire.subscribe(REPLAYABLE, receiver.url, secret, ttl_ms=60_000)
                published = events.publish(REPLAYABLE, 2)
                await until(lambda: len(receiver.accepted()) == 2)
                # The server logs a delivery once the receiver's answer is read.
                await until(lambda: events.log.delivered_ids(subscribed["id"]) == published)
                refreshed = await wire.subscribe(REPLAYABLE, receiver.url, secret,
                                                 subscribed["cursor"], ttl_ms=60_000)
                await wire.unsubscribe(REPLAYABLE, receiver.url)
                events.publish(REPLAYABLE)
                with pytest.raises(EventsRpcError) as again:
                    await wire.unsubscribe(REPLAYABLE, receiver.url)
                return subscribed, refreshed, published, again.value

        subscribed, refreshed, published, again = run(scenario())
        posts = receiver.received()
    assert subscribed["id"].startswith("sub_") and subscribed["truncated"] is False
    assert subscribed["refreshBefore"].endswith("Z") and subscribed["resultType"] == "complete"
    assert [p["body"]["eventId"] for p in posts] == published
    for post in posts:
        assert WebhookReceiver.verify(post, secret)
        assert post["headers"]["webhook-id"] == post["body"]["eventId"]
        assert post["headers"]["x-mcp-subscription-id"] == subscribed["id"]
    assert refreshed["id"] == subscribed["id"] and refreshed["deliveryStatus"]["active"] is True
    assert refreshed["cursor"] == posts[-1]["body"]["cursor"]
    assert (again.code, again.data) == (NOT_FOUND, {"kind": "subscription"})
    assert events.log.delivered_ids(subscribed["id"]) == published
    assert events.log.exchange(subscribed["id"], "webhook").ended == "unsubscribed"


def test_webhook_rules_principal_secret_and_url(events):
    async def scenario():
        errors = []
        async with EventsWire(events.url) as anonymous:
            with pytest.raises(EventsRpcError) as error:
                await anonymous.subscribe(REPLAYABLE, "https://hooks.example/x", new_secret())
            errors.append(error.value.code)
        async with EventsWire(events.url, token="t") as wire:
            for url, secret in (("https://hooks.example/x", "whsec_short"),
                                ("ftp://hooks.example/x", new_secret())):
                with pytest.raises(EventsRpcError) as error:
                    await wire.subscribe(REPLAYABLE, url, secret)
                errors.append(error.value.code)
        return errors

    assert run(scenario()) == [FORBIDDEN, INVALID_PARAMS, INVALID_PARAMS]


def test_webhook_retries_then_expires_past_refresh_before(events):
    secret = new_secret()
    with WebhookReceiver() as receiver:
        receiver.statuses = [503]

        async def scenario():
            async with EventsWire(events.url, token="t") as wire:
                subscribed = await wire.subscribe(REPLAYABLE, receiver.url, secret, ttl_ms=500)
                published = events.publish(REPLAYABLE)
                await until(lambda: len(receiver.accepted()) == 1)
                hook = subscribed["id"]
                await until(lambda: events.log.exchange(hook, "webhook").ended == "expired")
                events.publish(REPLAYABLE)
                return subscribed, published

        _, published = run(scenario())
        posts = receiver.received()
    assert [p["status"] for p in posts] == [503, 200]
    assert [p["body"]["eventId"] for p in posts] == published * 2
    assert all(WebhookReceiver.verify(post, secret) for post in posts)  # each attempt signed
    assert events.webhook_ids() == []


def test_webhook_terminate_posts_a_signed_envelope(events):
    secret = new_secret()
    with WebhookReceiver() as receiver:
        async def scenario():
            async with EventsWire(events.url, token="t") as wire:
                subscribed = await wire.subscribe(REPLAYABLE, receiver.url, secret)
                events.terminate()
                await until(lambda: len(receiver.received()) == 1)
                # The server logs the ending once the receiver has answered its POST.
                await until(lambda: events.log.exchange(subscribed["id"], "webhook").ended
                            == "terminated")
                return subscribed

        subscribed = run(scenario())
        (post,) = receiver.received()
    assert post["body"]["type"] == "terminated" and post["body"]["error"]["code"] == FORBIDDEN
    assert post["headers"]["webhook-id"].startswith("msg_terminated_")
    assert WebhookReceiver.verify(post, secret)
    assert events.log.exchange(subscribed["id"], "webhook").ended == "terminated"


def test_a_stream_resumed_past_retention_gets_a_fresh_truncated_active(events):
    async def scenario():
        async with one_stream(events, "slow") as stream:
            events.silence()
            published = events.publish(REPLAYABLE, 7)  # retention is 5
            events.resume()
            got = [(await stream.next_event())["eventId"] for _ in range(5)]
            actives = [m for m in stream.messages if m["method"] == "notifications/events/active"]
            return published, got, actives

    published, got, actives = run(scenario())
    assert [a["params"]["truncated"] for a in actives] == [False, True]
    assert got == published[2:]
    (truncation,) = events.log.truncations()
    assert truncation.reason == "stream_behind"
    assert list(truncation.skipped_event_ids) == published[:2]


# -- other clients -------------------------------------------------------------
@pytest.mark.mcp2
def test_the_mcp2_client_polls_and_streams_with_raw_requests(events):
    from typing import Any

    import mcp_types
    from mcp import Client
    from mcp.client.extension import ClientExtension, NotificationBinding
    from pydantic import BaseModel, ConfigDict, TypeAdapter

    class Params(BaseModel):
        model_config = ConfigDict(extra="allow")

    seen: list[tuple[str, dict]] = []

    class Events(ClientExtension):
        identifier = EXTENSION

        def notifications(self):
            def binding(method):
                async def handler(params):
                    seen.append((method, params.model_dump(by_alias=True)))

                return NotificationBinding(method=method, params_type=Params, handler=handler)

            return [binding(f"notifications/events/{kind}")
                    for kind in ("active", "event", "heartbeat", "terminated")]

    def request(method: str, params: dict):
        return mcp_types.Request[dict[str, Any], str](method=method, params=params)

    answers = TypeAdapter(dict[str, Any])

    async def scenario():
        async with Client(events.url, extensions=[Events()]) as client:
            start = await client.session.send_request(
                request("events/poll", {"name": REPLAYABLE, "cursor": None}), answers)
            published = events.publish(REPLAYABLE, 2)
            polled = await client.session.send_request(
                request("events/poll", {"name": REPLAYABLE, "cursor": start["cursor"]}), answers)
            streaming = asyncio.ensure_future(client.session.send_request(
                request("events/stream", {"name": REPLAYABLE, "cursor": start["cursor"]}),
                answers))
            await until(lambda: sum(m.endswith("/event") for m, _ in seen) == 2)
            events.terminate()
            final = await asyncio.wait_for(streaming, 15)
            return published, polled, final

    published, polled, final = run(scenario())
    assert [e["eventId"] for e in polled["events"]] == published
    assert [p["eventId"] for m, p in seen if m.endswith("/event")] == published
    assert seen[0][0] == "notifications/events/active" and seen[-1][0].endswith("/terminated")
    assert final["resultType"] == "complete"


def test_as_a_subprocess_with_the_admin_endpoint(tmp_path):
    import json
    import subprocess
    import sys
    import urllib.request

    module = "mcp_resumption_demo.events_server"
    process = subprocess.Popen([sys.executable, "-m", module, "--retention", "3"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        where = json.loads(process.stdout.readline())

        def admin(name: str, **kwargs):
            data = json.dumps(kwargs).encode()
            with urllib.request.urlopen(f"{where['admin']}/{name}", data=data) as answer:
                return json.loads(answer.read())["result"]

        async def scenario():
            async with EventsWire(where["url"]) as wire:
                start = await wire.poll(REPLAYABLE, request_id="sp")
                published = admin("publish", type=REPLAYABLE, count=4)
                return published, await wire.poll(REPLAYABLE, start["cursor"], request_id="sp2")

        published, answer = run(scenario())
        with urllib.request.urlopen(f"{where['admin']}/log") as answer_log:
            log = json.loads(answer_log.read())
    finally:
        process.stdin.close()
        assert process.wait(20) == 0
    assert answer["truncated"] is True
    assert [e["eventId"] for e in answer["events"]] == published[1:]
    assert log["truncations"][0]["skipped_event_ids"] == published[:1]
    assert [p["event_id"] for p in log["published"]] == published
