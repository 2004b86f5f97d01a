"""A server that lies about the Events extension, on the wire: malformed
notifications and answers, cursors of a megabyte or of the wrong type, an
``eventId`` sent again with another payload, an error of no known shape.
The application reads every frame exactly as the server sent it (the plugin
changes nothing and raises nothing into it); each lie that matters gets its
named finding, the others are read past; nothing is a call lost.

The liar is a small ASGI app of this file's own (the tests' events server
follows the specification, so it cannot lie); its frames are the truth.
"""

from __future__ import annotations

import asyncio
import json
import logging

from helpers import Telemetry
from mcp_resumption_demo.events_wire import EventsWire
from mcp_resumption_demo.loopback import LoopbackServer
from wire import wait_until

GAPS = "mcp.client.resumption.event_gaps"
KIND = "mcp.events.gap.kind"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
HUGE = "c" * 1_000_000


def stream_frames(request_id: object) -> list[dict]:
    meta = {SUBSCRIPTION_ID: request_id}

    def note(method: str, params: object) -> dict:
        if isinstance(params, dict):
            params = {**params, "_meta": meta}
        return {"jsonrpc": "2.0", "method": f"notifications/events/{method}", "params": params}

    return [
        note("active", {"cursor": 7, "truncated": "no"}),  # a cursor of the wrong type
        note("event", []),  # params not an object
        note("event", {"eventId": "e1", "name": "t", "data": {"n": 1}, "cursor": "c1"}),
        note("event", {"eventId": {"id": "e"}, "name": "t", "data": None, "cursor": None}),
        # (an id sent again on a push stream is judged only where both of
        # its notifications were parsed, which depends on the reads' timing:
        # the reused id is the polls' below)
        note("event", {"eventId": "e2", "name": "t", "data": {"n": 2}, "cursor": "c2"}),
        note("heartbeat", {"cursor": HUGE}),
        note("unheard-of", {"cursor": "c3"}),
        {"jsonrpc": "2.0", "id": request_id, "result": {"resultType": "complete", "_meta": meta}},
    ]


POLL_ANSWERS = [
    {"result": {"cursor": HUGE, "events": "no", "truncated": "yes", "hasMore": None}},
    {"result": "junk"},
    {"result": {"cursor": ["x"], "events": [None, 5, {"eventId": 9}], "truncated": False}},
    {"result": {"cursor": "p1", "events": [{"eventId": "r1", "data": {"n": 1}}]}},
    {"result": {"cursor": "p2", "events": [{"eventId": "r1", "data": {"n": 2}}]}},
    {"error": {"code": "not a number", "message": None, "data": [1]}},
]


# What the lies come to, each a named finding: the poll's error ends the
# subscription the poll held (``terminated``, the error's code in its line
# only); the id a poll sent again with another payload (``event_id_reused``); the
# stream the server ended without ``terminated``, not reopened
# (``not_reopened``, after the confirmation window).  Nothing else: a cursor
# of the wrong type, params that are no object, an unknown notification are
# read past.
EXPECTED = {"terminated": 1, "event_id_reused": 1, "not_reopened": 1}


class Liar:
    def __init__(self) -> None:
        self.polls = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        if request["method"] == "events/stream":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for frame in stream_frames(request["id"]):
                await send({"type": "http.response.body", "more_body": True,
                            "body": f"event: message\ndata: {json.dumps(frame)}\n\n".encode()})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        answer = {"jsonrpc": "2.0", "id": request["id"],
                  **POLL_ANSWERS[self.polls % len(POLL_ANSWERS)]}
        self.polls += 1
        payload = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


def test_a_lying_events_server_breaks_nothing_and_its_reused_id_is_named(caplog):
    caplog.set_level(logging.WARNING)
    telemetry = Telemetry()
    server = LoopbackServer(Liar(), name="liar").start()
    url = f"http://127.0.0.1:{server.port}/mcp"

    async def app() -> tuple[list[dict], list[object]]:
        """An honest application: it polls from now, follows the cursors it
        was given (a string), and opens its stream from now."""
        answers: list[object] = []
        cursor = None
        async with EventsWire(url) as wire:
            for _ in POLL_ANSWERS:
                body, headers = wire.message("events/poll", {"name": "t", "cursor": cursor})
                response = await wire.http.post(url, json=body, headers=headers)
                answers.append(response.json())
                given = (answers[-1].get("result") or {}) if isinstance(
                    answers[-1].get("result"), dict) else {}
                if isinstance(given.get("cursor"), str):
                    cursor = given["cursor"]
            async with wire.stream("u", None, wait_active=False) as stream:
                await stream.wait_ended()
                return stream.messages, answers

    try:
        with telemetry.instrumented(confirm_timeout=1.0):
            messages, answers = asyncio.run(app())
            asyncio.run(wait_until(lambda: len(telemetry.counts(GAPS, KIND)) >= len(EXPECTED), 10))
            found = telemetry.counts(GAPS, KIND)
    finally:
        server.close()
    # The application read every frame as it was sent: nothing dropped,
    # changed or raised into it.
    assert messages == stream_frames(messages[-1]["id"])
    assert [{k: v for k, v in a.items() if k not in ("jsonrpc", "id")} for a in answers] == (
        POLL_ANSWERS
    )
    assert found == EXPECTED
    assert not [r for r in caplog.records if r.exc_info]  # no patch fault logged
    assert telemetry.fates() == {}
    assert telemetry.outcomes() == {}
    assert telemetry.gap_kinds() == {}
