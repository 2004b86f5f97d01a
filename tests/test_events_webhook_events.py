"""Webhook subscriptions of the Events extension against what others wrote:
``mcp-webhook-events`` 0.2.0 (PyPI) on the real mcp 2.x server, stateless
2026-07-28 with JSON answers, its callbacks verified by a single-use
challenge that a receiver of the test's own echoes.

It declares the extension the older way (a top-level ``capabilities.events``)
and answers every cursor null.  Its grants are at least an hour; the test
hands it a clock an hour behind (its own ``clock=`` parameter) so that a
grant runs out within seconds.  The wire's truth is the server's own
``refreshBefore`` and its subscriptions table; the plugin's verdicts are
compared with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from events_wire import EventsWire, new_secret
from helpers import Telemetry
from wire import wait_until

# mcp-webhook-events needs mcp >= 2.2: the mcp2 environment installs it
# (scripts/test), and these tests run there only.
pytestmark = pytest.mark.mcp2

GAPS = "mcp.client.resumption.event_gaps"
KIND = "mcp.events.gap.kind"
NAME = "ticket.updated"
HOUR = 3600.0


def in_asyncio(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


class ChallengeReceiver:
    """A loopback webhook endpoint that echoes a verification challenge and
    keeps every other POST."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                body = json.loads(raw or b"{}")
                answer = b""
                if body.get("type") == "verification":
                    answer = json.dumps({"challenge": body["challenge"]}).encode()
                else:
                    receiver.posts.append(body)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def webhook_server(tmp_path, behind: float):
    """mcp-webhook-events on the mcp 2.x server under uvicorn, its clock
    ``behind`` seconds in the past; yields (url, its McpEvents)."""
    import uvicorn
    from mcp.server import MCPServer
    from mcp_webhook_events import EventDefinition, McpEvents, SafeHttp

    server = MCPServer("webhook events")
    events = McpEvents(
        server,
        store=str(tmp_path / "events.sqlite3"),
        definitions=[
            EventDefinition(
                name=NAME,
                description="A ticket was updated.",
                input_schema={"type": "object", "properties": {"ticket_id": {"type": "string"}}},
                payload_schema={"type": "object", "properties": {"ticket_id": {"type": "string"}}},
            )
        ],
        http=SafeHttp(allow_insecure_for_tests=True),
        clock=lambda: time.time() - behind,
    )
    events.install()
    app = server.streamable_http_app(stateless_http=True, json_response=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp", events
    finally:
        uv.should_exit = True
        thread.join(10)


def lines(caplog, kind: str) -> list[str]:
    said = (record.getMessage() for record in caplog.records)
    return [line for line in said if f"mcp-resumption event {kind}:" in line]


@in_asyncio
async def test_a_subscription_left_to_lapse_is_said_when_its_refresh_before_passes(
    tmp_path, caplog
):
    caplog.set_level(logging.WARNING)
    receiver = ChallengeReceiver()
    telemetry = Telemetry()
    try:
        # Its clock an hour behind, less 2 s: an hour's grant ends 2 s from now.
        with webhook_server(tmp_path, HOUR - 2.0) as (url, events), telemetry.instrumented():
            async with EventsWire(url) as wire:
                discovered = await wire.discover()
                answer = await wire.subscribe(
                    NAME, receiver.url, new_secret(), arguments={"ticket_id": "T-1"},
                    ttl_ms=int(HOUR * 1000),
                )
            # The wire: the server's own word on when it lapses, and its table.
            assert discovered["capabilities"].get("events") == {}  # the older declaration
            lapses = datetime.fromisoformat(answer["refreshBefore"].replace("Z", "+00:00"))
            assert 0 < lapses.timestamp() - time.time() < 5
            assert [s["name"] for s in events.active_subscriptions()] == [NAME]
            found = await wait_until(lambda: telemetry.counts(GAPS, KIND), 15)
            assert time.time() >= lapses.timestamp()  # said when it passed, not before
    finally:
        receiver.close()
    assert found == {"lapsed": 1}
    (line,) = lines(caplog, "lapsed")
    assert f"event={NAME}" in line and "delivery=webhook" in line
    assert "T-1" not in line  # never an argument


@in_asyncio
async def test_a_refreshed_then_unsubscribed_subscription_is_clean(tmp_path):
    receiver = ChallengeReceiver()
    telemetry = Telemetry()
    secret = new_secret()
    try:
        with webhook_server(tmp_path, HOUR - 2.0) as (url, events), telemetry.instrumented():
            async with EventsWire(url) as wire:
                arguments = {"ticket_id": "T-2"}
                first = await wire.subscribe(
                    NAME, receiver.url, secret, arguments=arguments, ttl_ms=int(HOUR * 1000)
                )
                # The refresh, with no cursor (this server has none): its
                # grant moves, and the same id comes back.
                again = await wire.subscribe(NAME, receiver.url, secret, arguments=arguments)
                assert again["id"] == first["id"] and again["cursor"] is None
                # This server names the subscription by its delivery's mode and url.
                await wire.request("events/unsubscribe", {
                    "name": NAME, "arguments": arguments,
                    "delivery": {"mode": "webhook", "url": receiver.url},
                })  # fmt: skip
                assert events.active_subscriptions() == []  # the wire: gone
                events.publish(NAME, {"ticket_id": "T-2"})
                events.deliver_pending()
            assert receiver.posts == []  # nothing delivered after the unsubscribe
            quiet = await wait_until(lambda: telemetry.counts(GAPS, KIND), 5)
    finally:
        receiver.close()
    assert quiet == {}
