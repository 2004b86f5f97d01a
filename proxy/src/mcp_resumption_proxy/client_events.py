# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The Events extension on the client leg: a push stream cut between a
client and the proxy, judged by the event ledger (``events.EventLedger``)
as the client half judges one cut below its application.

The upstream leg sees every ``events/*`` request and answer through the
proxy's own client half, and judges what the server said and what the
client supplied (``truncated``, ``cursor_lost``, ...): the same bytes cross
both legs, so those are said there, once.  What only this leg sees is a
client's stream to the proxy that ended while the server's did not: the
upstream leg saw the proxy close it, a clean end.  So this ledger follows
the cursors the proxy *wrote* to each client (an event parsed but not yet
written when the client's stream ended never reached it), and says only
what follows from such an end:

* the client reopened the thread with its last cursor and ``active`` said
  ``truncated: false``: a reopen proven
  (``mcp.client.resumption.event_streams{state=reopened}``);
* a type without replay reopened: ``unreplayable_window``, with its length;
* no reopen within the confirmation window: the proxy cannot tell a cut
  from the client's own close (2026-07-28 unsubscribes a push stream by
  closing it, and both end the client's connection the same way).  By
  default it is the client's end of the subscription, counted on
  ``mcp.proxy.cancelled_requests`` as a closed listen is, never a loss; with
  ``--events-client-close cut`` it is ``not_reopened`` (for clients known
  never to close a push stream for good).

Costs: a body is parsed only when it names an ``events/`` method; on such
a request's response an ``active``, a ``terminated`` and an answer are
parsed, an event or a heartbeat costs a substring search (only the last one
written is parsed, at the stream's end or the next message kept); one
timer while a cut stream waits.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry._logs import get_logger

from opentelemetry import metrics
from opentelemetry.instrumentation.mcp_resumption.rules.events import (
    METHODS,
    EventLedger,
    Kind,
    Outcome,
)
from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import request_key
from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc
from opentelemetry.instrumentation.mcp_resumption.telemetry.budget import LogBudget
from opentelemetry.instrumentation.mcp_resumption.telemetry.event_telemetry import (
    EventTelemetry,
)
from opentelemetry.instrumentation.mcp_resumption.version import __version__

__all__ = ["CLOSE_MODES", "ClientEvents", "EventsWatch"]

STREAM = "events/stream"
_NOTIFICATION = "notifications/events/"
_ACTIVE = _NOTIFICATION + "active"
_TERMINATED = _NOTIFICATION + "terminated"
# What a client's end of a push stream is, when it does not reopen it.
UNSUBSCRIBE, CUT = "unsubscribe", "cut"
CLOSE_MODES = (UNSUBSCRIBE, CUT)
# What only this leg can say (see the module's doc); the rest is the
# upstream leg's, which reads the same messages.
_OWN_KINDS = frozenset({Kind.NOT_REOPENED, Kind.UNREPLAYABLE_WINDOW})
MAX_MESSAGE_BYTES = 1024 * 1024
MAX_PENDING = 1024  # messages kept, not yet known written (per response)
MAX_LATEST = 8  # events and heartbeats kept before the written ones are dropped
MIN_TICK = 0.05


@dataclass(eq=False)
class EventsWatch:
    """One response toward a client that answers ``events/*`` requests: the
    requests (key -> method), and the messages parsed on it, each with the
    tee's count of chunks read when it was parsed (written once the client
    got as many)."""

    server: str
    kept: dict[str, str]
    # (mark, order, data): the messages kept, and the events and heartbeats
    # not yet known written (the last written one is all that is needed).
    pending: list[tuple[int, int, str]] = field(default_factory=list)
    latest: list[tuple[int, int, str]] = field(default_factory=list)
    seq: int = 0
    # Its push streams' threads; the response it rides on (``client_leg.Watch``:
    # whether its client is gone, how much it was written); ended already.
    threads: dict[str, Any] = field(default_factory=dict)  # request key -> thread
    owner: Any = None
    over: bool = False

    @property
    def streams(self) -> list[str]:
        return [key for key, method in self.kept.items() if method == STREAM]

    @property
    def server_name(self) -> str:
        return self.server.partition("#")[0]


class _Sink(EventTelemetry):
    """The events' telemetry, with this leg's own instruments."""

    def __init__(self, meter: Any, logger_provider: Any) -> None:
        self._event_gaps = meter.create_counter(*sc.EVENT_GAPS)
        self._event_duplicates = meter.create_counter(*sc.EVENT_DUPLICATES)
        self._event_streams = meter.create_counter(*sc.EVENT_STREAMS)
        self._event_names: dict[str, None] = {}
        self._event_series: set[tuple[str, int | None, str, str]] = set()
        self._events_logger = get_logger(
            sc.INSTRUMENTATION_NAME, __version__, logger_provider=logger_provider,
            schema_url=sc.SCHEMA_URL,
        )
        self._log_budget = LogBudget()


def _host_port(server: str) -> tuple[str, int | None]:
    host, _, port = server.partition("#")[0].rpartition(":")
    return (host, int(port)) if host and port.isdigit() else (server, None)


class ClientEvents:
    """The client leg's threads of cursors (see the module's doc)."""

    def __init__(
        self,
        *,
        meter_provider: Any = None,
        logger_provider: Any = None,
        window: float,
        on_close: str = UNSUBSCRIBE,
        cancelled: Any = None,
    ) -> None:
        meter = metrics.get_meter(
            sc.INSTRUMENTATION_NAME, __version__, meter_provider, schema_url=sc.SCHEMA_URL
        )
        self._sink = _Sink(meter, logger_provider)
        # ``cancelled(server)``: a client's end of a push stream, counted as
        # its cancel (the client leg's counter).
        self._cancelled = cancelled
        self.on_close = on_close
        self.window = window
        self.ledger = EventLedger()
        self._lock = threading.Lock()
        self._timer: Any = None
        self._timer_at = 0.0
        self.stopped = False
        # The responses carrying push streams now, by thread.
        self._streaming: dict[Any, set[EventsWatch]] = {}

    # ------------------------------------------------------------ requests

    def sent(self, body: bytes, server: str, principal: str | None = None) -> EventsWatch | None:
        """A POST about to be forwarded: its ``events/*`` requests kept (None:
        none in it).  ``principal``: its ``Authorization``, which tells the
        clients of one proxy apart (the specification keys a subscription by
        its principal; 2026-07-28 has no session): each client's threads are
        its own, under a digest of it (kept in memory only, never exported)."""
        if principal:
            digest = hashlib.blake2b(principal.encode("utf-8", "replace"), digest_size=8)
            server = f"{server}#{digest.hexdigest()}"
        try:
            parsed = json.loads(body)
        except ValueError:
            return None
        kept: dict[str, str] = {}
        threads: dict[str, Any] = {}
        outcomes = []
        for item in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(item, dict) or item.get("method") not in METHODS:
                continue
            key = request_key(item.get("id"))
            if key is None:
                continue
            if item["method"] == STREAM:
                self._gone_before(server, item.get("params"))
            kept[key] = item["method"]
            with self._lock:
                outcome = self.ledger.requested(server, key, item["method"],
                                                item.get("params"), time.monotonic())
            outcomes.append(outcome)
            if outcome.stream is not None and outcome.key is not None:
                threads[key] = outcome.key
        for outcome in outcomes:
            if outcome.key is not None:
                host, port = _host_port(server)
                self._sink.event_type_seen(host, port, outcome.delivery, outcome.key.name)
            self._found(outcome)
        if not kept:
            return None
        watch = EventsWatch(server, kept, threads=threads)
        for thread in threads.values():
            self._streaming.setdefault(thread, set()).add(watch)
        return watch

    def _gone_before(self, server: str, params: Any) -> None:
        """A push stream is opened: a stream of its thread whose client is
        gone already ended first, though the proxy has not seen it end yet
        (the client's reopen can reach the proxy before its old
        connection's close does)."""
        with self._lock:
            key = self.ledger.thread_key(server, params)
        if key is None:
            return
        for watch in list(self._streaming.get(key, ())):
            owner = watch.owner
            gone = getattr(owner, "gone", None)
            if gone is not None and gone():
                progress = getattr(owner, "progress", None)
                self.ended(watch, "left", progress() if progress is not None else None)

    # ------------------------------------------------------------ answers

    def seen(self, watch: EventsWatch, data: str, mark: int, written: int | None) -> None:
        """An SSE event's data (or a JSON answer) parsed on ``watch``'s
        response at chunk ``mark``; ``written``: the chunks the client got so
        far (None: this one was written already).

        Only what this leg's verdicts need is parsed: an ``active`` (its
        cursor and ``truncated``), a ``terminated``, an answer; of the events
        and heartbeats, only the last one written, when it is needed (the
        thread's last cursor).  So an event costs a substring search here,
        not a parse."""
        if len(data) > MAX_MESSAGE_BYTES:
            return
        mark = 0 if written is None else mark
        watch.seq += 1
        if _ACTIVE in data or _TERMINATED in data or '"result"' in data or '"error"' in data:
            if len(watch.pending) >= MAX_PENDING:
                self._take(watch, None)
            watch.pending.append((mark, watch.seq, data))
            self._take(watch, written)
        elif _NOTIFICATION in data:
            latest = watch.latest
            if written is None:  # written already, as every one before it
                watch.latest = [(mark, watch.seq, data)]
                return
            latest.append((mark, watch.seq, data))
            if len(latest) > MAX_LATEST:
                # Of those written already, only the last is still needed.
                now = written if written is not None else mark
                last = max((i for i, entry in enumerate(latest) if entry[0] <= now), default=0)
                del latest[:last]

    def _take(self, watch: EventsWatch, written: int | None) -> None:
        """What the client got (``written``: chunks written; None: all), told
        to the ledger in the order it came: every message kept, and the last
        event or heartbeat."""
        def got(entry: tuple[int, int, str]) -> bool:
            return written is None or entry[0] <= written

        pending = watch.pending
        count = 0
        while count < len(pending) and got(pending[count]):
            count += 1
        taken = pending[:count]
        del pending[:count]
        latest = watch.latest
        last = max((i for i, entry in enumerate(latest) if got(entry)), default=-1)
        if last >= 0:
            taken.append(latest[last])
            del latest[: last + 1]
        if not taken:
            return
        taken.sort(key=lambda entry: entry[1])
        messages = []
        for _, _, data in taken:
            try:
                parsed = json.loads(data)
            except ValueError:
                continue
            messages.extend(m for m in (parsed if isinstance(parsed, list) else [parsed])
                            if isinstance(m, dict))
        now, wall = time.monotonic(), time.time()
        outcomes = []
        with self._lock:
            for item in messages:
                method = item.get("method")
                if isinstance(method, str):
                    if method.startswith(_NOTIFICATION):
                        outcomes.append(self.ledger.notified(watch.server, method,
                                                             item.get("params"), now))
                    continue
                key = request_key(item.get("id"))
                if key is not None and key in watch.kept:
                    outcomes.append(self.ledger.answered(watch.server, key, item, now, wall))
        for outcome in outcomes:
            self._found(outcome)

    # ------------------------------------------------------------ ends

    def ended(self, watch: EventsWatch, how: str, written: int | None) -> None:
        """``watch``'s response ended (``how``: see ``ClientLeg.ended``).  A
        push stream whose client's stream ended first (``left``) is cut on
        this leg; any other end is the upstream's (said there) or the
        proxy's own stop."""
        if watch.over:
            return
        watch.over = True
        for thread in watch.threads.values():
            streaming = self._streaming.get(thread)
            if streaming is not None:
                streaming.discard(watch)
                if not streaming:
                    del self._streaming[thread]
        self._take(watch, written)
        watch.pending.clear()
        watch.latest.clear()
        cut = how == "left" and not self.stopped
        now = time.monotonic()
        outcomes = []
        with self._lock:
            for key in watch.streams:
                # Another stream of the thread still open here (two of one
                # client's): nothing waits for a reopen of this one.
                alone = not self._streaming.get(watch.threads.get(key))
                outcomes.append(self.ledger.stream_ended(watch.server, key, cut and alone, now))
        for outcome in outcomes:
            self._found(outcome)
        if cut:
            self._schedule()

    def stop(self) -> None:
        """The proxy stops: nothing more is decided (a stream its stop cut
        is no client's loss)."""
        self.stopped = True
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    # ------------------------------------------------------------ time

    def _due(self) -> None:
        self._timer = None
        if self.stopped:
            return
        with self._lock:
            outcome = self.ledger.due(time.monotonic(), time.time(), self.window)
        self._found(outcome)
        self._schedule()

    def _schedule(self) -> None:
        now = time.monotonic()
        with self._lock:
            wait = self.ledger.next_due(now, time.time(), self.window)
        if wait is None or self.stopped:
            return
        wait = max(wait, MIN_TICK)
        if self._timer is not None and self._timer_at <= now + wait:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = now + wait
        self._timer = loop.call_later(wait, self._due)

    # ------------------------------------------------------------ findings

    def _found(self, outcome: Outcome) -> None:
        if not outcome:
            return
        for finding in outcome.findings:
            if finding.kind not in _OWN_KINDS:
                continue
            if finding.kind is Kind.NOT_REOPENED and self.on_close == UNSUBSCRIBE:
                # No reopen: the client's own end of the subscription.
                if self._cancelled is not None:
                    self._cancelled(finding.key.server)
                continue
            host, port = _host_port(finding.key.server)
            self._sink.event_finding(finding, host, port)
        reopened = outcome.reopened
        if reopened is not None and reopened.proven:
            host, port = _host_port(reopened.key.server)
            self._sink.event_stream(sc.EVENT_STREAM_REOPENED, host, port, reopened.key.name)
