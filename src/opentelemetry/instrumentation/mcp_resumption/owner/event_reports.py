# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The events' room of the owner: the Events extension's requests and
answers (``events/poll``, ``events/stream``, ``events/subscribe``,
``events/unsubscribe``) and the notifications of its push streams, handed to
the event ledger (``events.EventLedger``), and what it finds handed to the
telemetry sink.

A part of :class:`~.monitor.ResumptionMonitor` (its base
:class:`EventReports`), apart to be read alone.  Only a request whose body
names an ``events/`` method is parsed here.  A push stream's notifications
are not reported one by one: the stream is fed like any other (a reference
per event in its ring, ``patches.feed``), and read here on a tick while
push streams are open (the ring looked at, not drained: the tracker's own
state is not brought up to date for it) and at the stream's end (what the
tracker's drains took from the ring is handed here too: the feed's tap).
The read path of an event costs what any SSE event costs, and the tick
reads an ``event`` notification for its ``eventId`` and cursor alone
(``_skim``: byte searches, no parse), but for the last one it takes.  Its
first event (the ``active`` notification, with ``truncated``) is read as it
comes.  A stream whose heartbeats were heard is read more often, a quarter
of its interval apart: the moment each notification is read is when it is
taken to be heard, so its silence is said that close to when it is due.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from ..forks import renew_after_fork
from ..rules.events import METHODS, STREAM, SUBSCRIBE, EventLedger, Kind, Outcome
from ..rules.jsonrpc import loads, request_key

if TYPE_CHECKING:  # annotations only
    from .. import config
    from ..telemetry.facts import RequestFacts, StreamContext
    from ..telemetry.sink import TelemetrySink
    from ..tracking.tracker import Tracker
    from .deadlines import Deadlines

__all__ = ["EventReports", "follows_events"]

_EVENTS_METHOD = b'"events/'
_NOTIFICATION = "notifications/events/"
_EVENT = '"notifications/events/event"'
_EVENT_ID = '"eventId"'
_CURSOR = '"cursor"'
_SUBSCRIPTION = '"io.modelcontextprotocol/subscriptionId"'
_DECODER = json.JSONDecoder()
_MISSING = object()
_SKIMMED = object()  # first of a skimmed notification's tuple
# How often an open push stream's ring is read (seconds), at most and at
# least: often enough that the ring (the last events only) rarely overflows
# between two reads; never a spin.  A stream whose heartbeats were heard is
# read a quarter of its interval apart (FINE until an interval is known), so
# that when a notification was heard is known that closely.
TICK = 1.0
MIN_TICK = 0.05
FINE = 0.1
# Answers and notifications at most this long are parsed.
MAX_MESSAGE_BYTES = 1024 * 1024
# Servers whose address is kept for findings decided by time alone.
MAX_SERVERS = 1024
# With shared state: a thread's last cursor (its digest) is written at most
# this often (seconds), never per event; kept this long after its last
# write; and the threads asked of the fleet once (then forgotten, and asked
# again).
SAVE_EVERY = 5.0
THREAD_TTL = 24 * 3600
MAX_ASKED = 4096


def follows_events(body: bytes) -> bool:
    """Whether a request body names an ``events/`` method: one byte search."""
    return _EVENTS_METHOD in body


class _Watched:
    """An open push stream: its feed's ring, looked at on the tick, and the
    events its drains hand over (the tap), read here too."""

    __slots__ = ("context", "feed", "key", "last", "pace", "pending")

    def __init__(self, context: StreamContext, key: str, feed: Any) -> None:
        self.context = context
        self.key = key
        self.feed = feed
        self.pending: list[Any] = []
        self.last: Any = None  # the last event read (by identity)
        self.pace = TICK  # how often its ring is read (seconds)


class _Room:
    """The room's own state: its lock, the open push streams, the pending
    tick; made new in a forked child."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watched: dict[int, _Watched] = {}
        # server (host:port) -> (host, port): what a finding decided by time
        # alone is named by (bounded: emptied when full).
        self.servers: dict[str, tuple[str, int | None]] = {}
        self.tick: list | None = None
        self.tick_at = 0.0
        # With shared state: threads whose last cursor changed since the
        # last save, and the threads already asked of the fleet.
        self.dirty = False
        self.saved_at = 0.0
        self.asked: dict[Any, None] = {}
        renew_after_fork(self)

    def _after_fork(self) -> None:
        self.lock = threading.Lock()
        self.tick = None  # the child's timer thread starts over


class EventReports:
    """Feeds the event ledger and reports what it finds."""

    telemetry: TelemetrySink
    tracker: Tracker
    settings: config.Settings
    enabled: bool
    _deadlines: Deadlines

    def _init_events(self) -> None:
        self.event_ledger = EventLedger()
        self._events = _Room()

    # ------------------------------------------------------------ facts in

    def events_sent(self, facts: RequestFacts) -> None:
        """A request whose body ``follows_events`` is about to be sent: each
        ``events/*`` request in it judged and kept on ``facts``."""
        body = facts.body
        if body is None or facts.method != "POST":
            return
        try:
            parsed = loads(body)
        except (ValueError, TypeError, RecursionError):
            return
        messages = parsed if isinstance(parsed, list) else [parsed]
        found: dict[str, str] = {}
        outcomes: list[Outcome] = []
        server = facts.events_server = _principal_server(facts)
        if self.tracker.store.shared:
            self._inherit(server, messages)
        now = time.monotonic()
        with self._events.lock:
            servers = self._events.servers
            if server not in servers:
                if len(servers) >= MAX_SERVERS:
                    servers.clear()
                servers[server] = (facts.host, facts.port)
            for message in messages:
                if not isinstance(message, dict) or message.get("method") not in METHODS:
                    continue
                key = request_key(message.get("id"))
                if key is None:
                    continue
                method = message["method"]
                found[key] = method
                outcomes.append(
                    self.event_ledger.requested(
                        server, key, method, message.get("params"), now
                    )
                )
        if found:
            facts.events = found
        for outcome in outcomes:
            if outcome.key is not None:
                self.telemetry.event_type_seen(
                    facts.host, facts.port, outcome.delivery, outcome.key.name
                )
            self._events_found(outcome)
        self._events_schedule()

    def _inherit(self, server: str, messages: list[Any]) -> None:
        """Threads this process has not seen yet: their last cursor as the
        fleet has it (a predecessor's, another replica's), so that a restart
        that starts from now is judged against it.  One bounded read per
        thread, the first time (never per event)."""
        ledger, room, store = self.event_ledger, self._events, self.tracker.store
        for message in messages:
            if not isinstance(message, dict) or message.get("method") not in METHODS:
                continue
            with room.lock:
                key = ledger.thread_key(server, message.get("params"))
                if key is None or ledger.knows(key) or key in room.asked:
                    continue
                if len(room.asked) >= MAX_ASKED:
                    room.asked.clear()
                room.asked[key] = None
            stored = store.call(lambda client, key=key: client.get(_redis_key(store, key)))
            if isinstance(stored, bytes):
                stored = stored.decode("ascii", "replace")
            try:
                last = bytes.fromhex(stored) if isinstance(stored, str) else None
            except ValueError:
                last = None
            if last:
                with room.lock:
                    ledger.inherit(key, last)

    def events_stop_waiting(self) -> None:
        """The client stops (the process exits): with shared state, the last
        cursors not written yet are queued for the store's last writes."""
        self._save(force=True)

    def _save(self, force: bool = False) -> None:
        store = self.tracker.store
        room = self._events
        if not store.shared or not room.dirty:
            return
        now = time.monotonic()
        with room.lock:
            if not force and now - room.saved_at < SAVE_EVERY:
                return
            room.dirty = False
            room.saved_at = now
            unsaved = self.event_ledger.unsaved()
        for key, last in unsaved:
            store.submit(partial(_write_thread, _redis_key(store, key), last.hex()))

    def events_answered(self, facts: RequestFacts, answer: bytes | str) -> None:
        """A JSON answer, or an SSE event's data, on the answer of a request
        ``events_sent`` kept."""
        if len(answer) > MAX_MESSAGE_BYTES:
            return
        try:
            parsed = loads(answer)
        except (ValueError, TypeError, RecursionError):
            return
        self._events_messages(facts, parsed if isinstance(parsed, list) else [parsed])

    def _events_messages(self, facts: RequestFacts, messages: list[Any]) -> None:
        kept = facts.events or {}
        server = facts.events_server or facts.server
        now, wall = time.monotonic(), time.time()
        outcomes: list[Outcome] = []
        with self._events.lock:
            ledger = self.event_ledger
            for message in messages:
                if type(message) is tuple and message[0] is _SKIMMED:
                    outcomes.append(
                        ledger.skimmed(server, message[3], message[1], message[2], now)
                    )
                    continue
                if not isinstance(message, dict):
                    continue
                method = message.get("method")
                if isinstance(method, str):
                    if method.startswith(_NOTIFICATION):
                        outcomes.append(
                            ledger.notified(server, method, message.get("params"), now)
                        )
                    continue
                key = request_key(message.get("id"))
                if key is not None and key in kept:
                    outcomes.append(ledger.answered(server, key, message, now, wall))
            self._events.dirty = True
        for outcome in outcomes:
            self._events_found(outcome)
        if SUBSCRIBE in kept.values():
            self._events_schedule()  # its refreshBefore is a moment to wait for

    def events_stream_fed(self, context: StreamContext, feed: Any) -> None:
        """An events/stream's SSE answer is read through ``feed``: what its
        drains take from the ring is handed here too (the tap), and read on
        the tick from now on."""
        kept = context.facts.events
        if not kept or context.stream is None:
            return
        key = next((k for k, method in kept.items() if method == STREAM), None)
        if key is None:
            return
        watched = _Watched(context, key, feed)
        feed.tap = watched.pending.extend
        with self._events.lock:
            self._events.watched[id(context)] = watched
        self._events_schedule()

    def events_stream_ended(self, context: StreamContext, closed_by_client: bool) -> None:
        """A push stream's answer ended (after the tracker's last drain of
        its feed): its last events read; one the client did not close
        itself is cut (``terminated``, read first, ends it cleanly)."""
        with self._events.lock:
            watched = self._events.watched.pop(id(context), None)
        if watched is None:
            return
        self._take(watched)
        with self._events.lock:
            outcome = self.event_ledger.stream_ended(
                _server_of(context.facts), watched.key, not closed_by_client, time.monotonic()
            )
        self._events_found(outcome)
        self._events_schedule()

    # ------------------------------------------------------------ the tick

    def _take(self, watched: _Watched) -> None:
        """What the stream delivered since the last take (what its feed's
        drains handed over, then what its ring holds), told to the ledger:
        each ``event`` notification but the last skimmed for its id and
        cursor (none, when the ring overflowed), every other one parsed."""
        feed, pending = watched.feed, watched.pending
        drains = feed.drains
        if drains % 2:
            return  # a drain under way: its events are in neither; next time
        raws = pending[:]
        handed = len(raws)
        try:
            raws += feed.ring  # copied at once: the reader only appends
        except RuntimeError:
            return
        if feed.drains != drains:
            return
        del pending[:handed]
        last, found = watched.last, False
        if last is not None:
            for at in range(len(raws) - 1, -1, -1):
                if raws[at] is last:
                    del raws[: at + 1]
                    found = True
                    break
        if not raws:
            return
        watched.last = raws[-1]
        ring = feed.ring.maxlen
        # The ring overflowed since the last take: the stream is busier than
        # a take can follow, and what it dropped is lost to every reading.
        # Its events left in the ring would be a sample, read at the cost of
        # every event between: only its last notification (the cursor) and
        # any other kind (an ``active`` that says it fell behind) are read.
        busy = not found and ring is not None and len(raws) >= ring == len(feed.ring)
        messages: list[Any] = []
        final = len(raws) - 1
        for at, sse in enumerate(raws):
            data = getattr(sse, "data", "")
            if _NOTIFICATION not in data or len(data) > MAX_MESSAGE_BYTES:
                continue
            if at != final:
                if busy and _EVENT in data:
                    continue
                skim = _skim(data, watched.key)
                if skim is not None:
                    messages.append(skim)
                    continue
            try:
                messages.append(loads(data))
            except (ValueError, TypeError, RecursionError):
                continue
        if messages:
            self._events_messages(watched.context.facts, messages)

    def _events_due(self) -> None:
        """The tick: every open push stream's notifications read, then what
        time decides (cut streams not reopened, lapsed webhooks, silence)."""
        with self._events.lock:
            self._events.tick = None
            watched = list(self._events.watched.values())
        for each in watched:
            self._take(each)
            with self._events.lock:
                interval = self.event_ledger.heartbeat_interval(
                    _server_of(each.context.facts), each.key
                )
            if interval is None:
                pace = TICK
            elif interval == 0.0:
                pace = FINE
            else:
                pace = min(TICK, max(MIN_TICK, interval / 4))
            if pace < each.pace == TICK:
                with self._events.lock:
                    self.event_ledger.retime(_server_of(each.context.facts), each.key)
                pace = FINE
            each.pace = pace
        with self._events.lock:
            outcome = self.event_ledger.due(
                time.monotonic(), time.time(), self.settings.confirm_timeout
            )
        self._events_found(outcome)
        self._save()
        self._events_schedule()

    def _events_schedule(self) -> None:
        """One tick pending at a time, at the earliest moment something may
        be due (at most ``TICK`` away while push streams are open)."""
        now = time.monotonic()
        with self._events.lock:
            wait = self.event_ledger.next_due(now, time.time(), self.settings.confirm_timeout)
            if self._events.watched:
                pace = min(each.pace for each in self._events.watched.values())
                wait = pace if wait is None else min(wait, pace)
            if self._events.dirty and self.tracker.store.shared:
                wait = SAVE_EVERY if wait is None else min(wait, SAVE_EVERY)
            if wait is None:
                return
            wait = max(wait, MIN_TICK)
            pending = self._events.tick
            if pending is not None and self._events.tick_at <= now + wait:
                return
            self._deadlines.cancel(pending)
            self._events.tick_at = now + wait
            self._events.tick = self._deadlines.add(wait, self._events_due)

    # ------------------------------------------------------------ findings out

    def _events_found(self, outcome: Outcome) -> None:
        if not outcome:
            return
        telemetry = self.telemetry
        for finding in outcome.findings:
            host, port = self._event_server(finding.key.server)
            telemetry.event_finding(finding, host, port)
            if finding.kind is Kind.STREAM_SILENT:  # a state of the stream as well
                telemetry.event_stream("silent", host, port, finding.key.name)
        key = outcome.key
        if key is None:
            return
        host, port = self._event_server(key.server)
        if outcome.duplicates:
            telemetry.event_duplicates(outcome.duplicates, host, port, outcome.delivery, key.name)
        if outcome.stream is not None:
            telemetry.event_stream(outcome.stream, host, port, key.name)
        reopened = outcome.reopened
        if reopened is not None and reopened.proven:
            telemetry.event_stream("reopened", host, port, key.name)

    def _event_server(self, server: str) -> tuple[str, int | None]:
        # (a principal's digest after "#" is never an address)
        return self._events.servers.get(server) or (server.split("#", 1)[0], None)


def _principal_server(facts: RequestFacts) -> str:
    """The server as the events' threads key it: with a digest of the
    request's Authorization when it has one (kept in memory and, hashed
    again with the thread, in the shared state; never exported)."""
    headers = facts.headers
    principal = headers.get("authorization") if headers is not None else None
    if not principal or not isinstance(principal, str):
        return facts.server
    digest = hashlib.blake2b(principal.encode("utf-8", "replace"), digest_size=8)
    return f"{facts.server}#{digest.hexdigest()}"


def _server_of(facts: RequestFacts) -> str:
    return facts.events_server or facts.server


def _skim(data: str, subscription: str) -> tuple | None:
    """An ``event`` notification of the stream of request ``subscription``
    read for its ``eventId`` and cursor by byte searches (each key once in
    it, so that none is nested in the payload), or None: parse it."""
    if (
        data.count(_NOTIFICATION) != 1
        or _EVENT not in data
        or data.count(_EVENT_ID) != 1
        or data.count(_CURSOR) != 1
        or data.count(_SUBSCRIPTION) != 1
    ):
        return None
    event_id = _value(data, _EVENT_ID)
    cursor = _value(data, _CURSOR)
    named = _value(data, _SUBSCRIPTION)
    if not isinstance(event_id, str) or not (cursor is None or isinstance(cursor, str)):
        return None
    if named is _MISSING or request_key(named) != subscription:
        return None
    return (_SKIMMED, event_id, cursor, subscription)


def _value(data: str, key: str) -> Any:
    """The JSON value after ``key`` (found once in ``data``), or _MISSING."""
    at = data.find(key) + len(key)
    end = len(data)
    while at < end and data[at] in " \t\r\n":
        at += 1
    if at >= end or data[at] != ":":
        return _MISSING
    at += 1
    while at < end and data[at] in " \t\r\n":
        at += 1
    try:
        return _DECODER.raw_decode(data, at)[0]
    except (ValueError, RecursionError):
        return _MISSING


def _redis_key(store: Any, key: Any) -> str:
    """The shared state's key of a thread: each part under the store's
    keyed hash (never the server, event type or arguments' digest raw)."""
    return store.key("event", key[0], key[1], key[2])


def _write_thread(name: str, value: str, pipeline: Any) -> None:
    pipeline.set(name, value, ex=THREAD_TTL)
