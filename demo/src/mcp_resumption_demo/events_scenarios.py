# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The rows of the Events extension (``io.modelcontextprotocol/events``):
an application polls, streams and subscribes to the demo's events server
(:mod:`.events_server`, which follows the specification to the letter) over
the HTTP client the installed SDK brings (:mod:`.events_wire`).

A poll the server answers ``truncated``, an application that lost its
cursor, a push stream cut and reopened with its cursor (nothing lost), a
push stream gone silent while open, and a webhook subscription left to
lapse.  Nothing of it is a call: no row may count a broken request or a
resume attempt.  The truth is read from the server's own log
(:class:`.events_log.EventsLog`: what it published, every cursor it handed
out and got, each exchange's end, what it truncated) by the rules of
:func:`event_counts`, never from the plugin; a silence, which no server
logs, from the application's own clock (when each notification arrived).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

from . import scenarios
from .clients import MCP_MAJOR
from .events_log import EventsLog
from .events_server import REPLAYABLE, EventsServer
from .events_wire import EventsWire, PushStream, WebhookReceiver, new_secret
from .scenarios import Scenario, ScenarioWire

__all__ = ["SCENARIOS", "EventsScenarioWire", "event_counts"]

HEARTBEAT: Final = "notifications/events/heartbeat"
# The silent row: the server's heartbeat interval, the heartbeats the
# application hears before the server goes silent, and how long the
# application waits on a silent stream before it gives up and closes it
# (its read timeout: twenty heartbeat intervals).  The plugin reads an open
# push stream's notifications on its tick (at most a second apart), so the
# interval it observes is that second, not the server's 0.2 s: it says the
# silence within 2 to 3 s; the application waits longer.
_HEARTBEAT_S: Final = 0.2
_HEARTBEATS_HEARD: Final = 3
_READ_TIMEOUT_S: Final = 20 * _HEARTBEAT_S
# The truncated row: the events the server keeps, and those published
# between the two polls (more than it keeps).
_RETENTION: Final = 5
_PUBLISHED_BETWEEN: Final = 12
# The lapsed row: the subscription's ttl (the server's shortest grant).
_TTL_MS: Final = 500
# Only a guard against a demo bug: no row waits for it to expire.
_GUARD_S: Final = 15.0


@dataclass
class EventsScenarioWire(ScenarioWire):
    """A row's wire, with the events server's log; ``silences``: for each
    push stream the application closed, (longest gap between two
    heartbeats it heard, how long it then heard nothing), by its clock."""

    log: EventsLog | None = None
    silences: list[tuple[float, float]] = field(default_factory=list)
    # Event ids published that no exchange ever delivered to the client.
    never_delivered: list[str] = field(default_factory=list)


def _loss_free(log: EventsLog) -> list[str]:
    delivered = set(log.delivered_ids())
    return [p.event_id for p in log.published_events() if p.event_id not in delivered]


def event_counts(log: EventsLog, silences: list[tuple[float, float]] = ()) -> dict:
    """What a correct client-side count is, read from the server's log:
    ``event_gaps`` by kind, ``event_streams`` by state, ``event_duplicates``.

    - ``truncated``: each exchange the server answered truncated (it said so
      on the wire, and its log holds what it skipped);
    - ``cursor_lost``: a poll or stream that sent no cursor after the client
      had sent one back the server handed out, for the same event type (it
      had been following its cursors, and started again from now);
    - push streams: each ``events/stream`` opened; each one no longer open
      ended; ``reopened`` each that sent the last cursor a cut stream of its
      type had carried and was not truncated; ``not_reopened`` a cut stream
      no later stream of its type followed;
    - ``stream_silent`` (and the state ``silent``): a stream the client
      heard nothing on for more than twice the longest gap between two
      heartbeats it heard before (``silences``, the client's clock);
    - ``lapsed``: a webhook subscription the server let expire, not
      refreshed;
    - duplicates: an event id delivered to the client again.
    """
    gaps: dict[str, int] = {}
    streams: dict[str, int] = {}

    def add(counts: dict[str, int], key: str, n: int = 1) -> None:
        if n:
            counts[key] = counts.get(key, 0) + n

    handed_out = {cursor for _, _, cursor in log.cursors_handed_out() if cursor is not None}
    add(gaps, "truncated", sum(1 for e in log.exchanges() if e.truncated))
    following: set[str] = set()
    for exchange in log.exchanges():
        if exchange.method not in ("events/poll", "events/stream"):
            continue
        if exchange.cursor_in is None and exchange.type in following:
            add(gaps, "cursor_lost")
        if exchange.cursor_in in handed_out:
            following.add(exchange.type)
    pushed = log.exchanges("events/stream")
    for index, stream in enumerate(pushed):
        add(streams, "opened")
        add(streams, "ended", stream.ended != "open")
        if stream.ended != "cut":
            continue
        later = [s for s in pushed[index + 1:] if s.type == stream.type]
        if not later:
            add(gaps, "not_reopened")
            continue
        carried = [cursor for _, cursor in stream.cursors_out if cursor is not None]
        following_stream = later[0]
        if carried and following_stream.cursor_in == carried[-1] \
                and not following_stream.truncated:
            add(streams, "reopened")
    for heartbeat_gap, silence in silences:
        if silence > 2 * heartbeat_gap:
            add(gaps, "stream_silent")
            add(streams, "silent")
    add(gaps, "lapsed", sum(1 for e in log.exchanges("webhook") if e.ended == "expired"))
    delivered = log.delivered_ids()
    duplicates = len(delivered) - len(set(delivered))
    return {
        "event_gaps": gaps,
        "event_streams": streams,
        "event_duplicates": {"all": duplicates} if duplicates else {},
    }


@contextlib.contextmanager
def _server(**settings: object) -> Iterator[EventsServer]:
    """The events server on the port reserved for this row (announced
    before a scrape), or any free one."""
    sock = scenarios.router_sockets.pop(0) if scenarios.router_sockets else None
    server = EventsServer(sock=sock, **settings).start()
    scenarios.last_router_port = server.port
    try:
        yield server
    finally:
        server.close()


def _record(name: str, server: EventsServer, **more: object) -> EventsScenarioWire:
    wire = EventsScenarioWire(name, MCP_MAJOR, transport_before="streamable-http",
                              log=server.log, **more)  # fmt: skip
    wire.never_delivered = _loss_free(server.log)
    # Nothing here is a call: the plugin must count no broken request.
    wire.fates = {}
    wire.counts = event_counts(server.log, wire.silences)
    return wire


async def _poll_truncated() -> EventsScenarioWire:
    with _server(retention=_RETENTION) as server:
        async with EventsWire(server.url) as wire:
            first = await wire.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, _PUBLISHED_BETWEEN)  # more than the server keeps
            await wire.poll(REPLAYABLE, first["cursor"])
        return _record("events_poll_truncated", server)


async def _cursor_lost() -> EventsScenarioWire:
    with _server() as server:
        async with EventsWire(server.url) as wire:
            first = await wire.poll(REPLAYABLE, None)
            server.publish(REPLAYABLE, 3)
            await wire.poll(REPLAYABLE, first["cursor"])  # the loop follows its cursor
            server.publish(REPLAYABLE, 2)
            await wire.poll(REPLAYABLE, None)  # restarted: the cursor was kept in memory
        return _record("events_cursor_lost", server)


async def _stream_reopened() -> EventsScenarioWire:
    # Heartbeats slower than the row: the stream's cursor is its last event's.
    with _server(heartbeat_s=30) as server:
        async with EventsWire(server.url) as wire:
            async with wire.stream(REPLAYABLE, None) as stream:
                server.publish(REPLAYABLE, 2)
                await stream.next_event(_GUARD_S)
                await stream.next_event(_GUARD_S)
                server.cut(stream.request_id)  # the connection dies, nothing said
                await stream.wait_ended(_GUARD_S)
                cursor = stream.cursor
            server.publish(REPLAYABLE, 1)  # while it was cut
            async with wire.stream(REPLAYABLE, cursor) as again:
                await again.next_event(_GUARD_S)
            await server.await_streams(0, _GUARD_S)  # the server saw the close
        return _record("events_stream_reopened", server)


async def _heard(stream: PushStream, method: str) -> float:
    await stream.next(method, _GUARD_S)
    return time.monotonic()


async def _stream_silent() -> EventsScenarioWire:
    with _server(heartbeat_s=_HEARTBEAT_S) as server:
        async with EventsWire(server.url) as wire:
            async with wire.stream(REPLAYABLE, None) as stream:
                heard = [time.monotonic()]  # `active`, read on opening
                for _ in range(_HEARTBEATS_HEARD):
                    heard.append(await _heard(stream, HEARTBEAT))
                server.silence(stream.request_id)  # nothing more, the stream stays open
                try:
                    await stream.next(None, _READ_TIMEOUT_S)
                    raise RuntimeError("the silenced stream said something")
                except asyncio.TimeoutError:
                    pass  # the application's read timeout: it gives up, closes it
                silence = time.monotonic() - heard[-1]
            await server.await_streams(0, _GUARD_S)  # the server saw the close
            gap = max(b - a for a, b in itertools.pairwise(heard))
        return _record("events_stream_silent", server, silences=[(gap, silence)])


async def _webhook_lapsed() -> EventsScenarioWire:
    with _server() as server, WebhookReceiver() as receiver:
        async with EventsWire(server.url, token="demo") as wire:
            await wire.subscribe(REPLAYABLE, receiver.url, new_secret(), ttl_ms=_TTL_MS)
        server.publish(REPLAYABLE, 2)
        await _until(lambda: len(receiver.accepted()) == 2, "the 2 events delivered")
        # Never refreshed: the server lets the subscription expire.
        await _until(
            lambda: [e.ended for e in server.log.exchanges("webhook")] == ["expired"],
            "the subscription expired",
        )
        server.publish(REPLAYABLE, 1)  # nobody is subscribed: never delivered
        return _record("events_webhook_lapsed", server)


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {_GUARD_S:g} s for {what}")
        await asyncio.sleep(0.02)


_CLIENT: Final = (
    "An application of the Events extension (2026-07-28) on "
    + ("httpx2" if MCP_MAJOR >= 2 else "httpx and httpx-sse")
    + f", against a server that follows the specification, for {REPLAYABLE!r}"
)

SCENARIOS = (
    Scenario(
        name="events_poll_truncated",
        happened=(
            f"{_CLIENT}. It polls with the cursor of its last poll, but the server keeps "
            f"{_RETENTION} events and {_PUBLISHED_BETWEEN} were published in between: it "
            f"answers truncated: true, from the oldest it keeps. {_PUBLISHED_BETWEEN - _RETENTION} "
            "events are skipped, and said so on the wire: one truncated gap, no lost call."
        ),
        expected_gaps=("truncated",),
        expected_outcome=None,
        run=_poll_truncated,
        event_series=(("poll", REPLAYABLE),),
    ),
    Scenario(
        name="events_cursor_lost",
        happened=(
            f"{_CLIENT}. Its poll loop follows its cursors, then the process restarts with the "
            "cursor kept in memory and polls with none: the server starts from now and answers "
            "truncated: false, so the wire says nothing of the 2 events published meanwhile, "
            "never delivered. One cursor_lost gap, no lost call."
        ),
        expected_gaps=("cursor_lost",),
        expected_outcome=None,
        run=_cursor_lost,
        event_series=(("poll", REPLAYABLE),),
    ),
    Scenario(
        name="events_stream_reopened",
        happened=(
            f"{_CLIENT}. Its events/stream push stream is cut after 2 events, nothing said; it "
            "reopens with the last cursor it got, and the server answers active with "
            "truncated: false and delivers the event published while it was cut: nothing lost. "
            "Two streams opened and ended, one reopened with continuity proven, no gap."
        ),
        expected_gaps=(),
        expected_outcome=None,
        run=_stream_reopened,
        event_series=(("push", REPLAYABLE),),
    ),
    Scenario(
        name="events_stream_silent",
        happened=(
            f"{_CLIENT}. Its push stream hears a heartbeat every {_HEARTBEAT_S:g} s, then "
            "nothing at all, still open (a stalled server, or a proxy holding the connection); "
            f"the application gives up after {_READ_TIMEOUT_S:g} s of silence and closes it. "
            "One stream_silent gap, said while the stream was open; not a loss, no lost call."
        ),
        expected_gaps=("stream_silent",),
        expected_outcome=None,
        run=_stream_silent,
        event_series=(("push", REPLAYABLE),),
    ),
    Scenario(
        name="events_webhook_lapsed",
        happened=(
            f"{_CLIENT}. It subscribes a webhook for {_TTL_MS} ms and never refreshes: 2 events "
            "are delivered, then the server lets the subscription expire after refreshBefore, "
            "and the event published after that is delivered to nobody. One lapsed gap, "
            "no lost call."
        ),
        expected_gaps=("lapsed",),
        expected_outcome=None,
        run=_webhook_lapsed,
        event_series=(("webhook", REPLAYABLE),),
    ),
)
