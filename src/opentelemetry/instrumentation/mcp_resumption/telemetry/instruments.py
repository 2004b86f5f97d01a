# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The client half's instruments, made once per MeterProvider, and the
state their observable callbacks read: the event totals of the streams
being read (``EventTotals``) and the streams the trackers evicted
(``Evictions``).  The telemetry sink (``telemetry``) records on them.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from opentelemetry import metrics

from ..forks import renew_after_fork
from ..version import __version__
from . import semconv as sc
from .facts import StreamContext

__all__ = ["EVENTS_BATCH", "EVENTS_BATCH_SECONDS", "EventTotals", "Evictions", "Instruments",
           "instruments_of"]

# A stream's events are added to the totals at most every this many events or
# seconds, and when the stream ends.
EVENTS_BATCH = 64
EVENTS_BATCH_SECONDS = 1.0


class EventTotals:
    """Events delivered per (transport, server address), reported by the
    observable counter ``mcp.client.stream.events``: a batch costs a dict
    addition here, where an SDK ``Counter.add`` cost ~20 us in a real client
    (once per stream, a tenth of the plugin's cost of a POST answered by SSE)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str, int | None], int] = {}
        # Streams whose events are counted by the SSE patch's feed (id() ->
        # context, from the feed's start to the stream's end), read here at
        # collection: a stream that is read pays nothing per event for its
        # count.
        self._fed: dict[int, StreamContext] = {}
        renew_after_fork(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the totals go on, like a counter's

    def add(self, key: tuple[str, str, int | None], events: int) -> None:
        with self._lock:
            self._totals[key] = self._totals.get(key, 0) + events

    def watch(self, context: StreamContext) -> None:
        self._fed[id(context)] = context  # a dict's item assignment: atomic

    def unwatch(self, context: StreamContext) -> None:
        self._fed.pop(id(context), None)

    def count(self, context: StreamContext, uncounted: int, unwatch: bool = False) -> None:
        """``uncounted`` events of ``context``'s stream and those its feed
        counted since, into the totals: ``fed_events`` then ``add`` in one
        lock acquisition (a stream's end, a batch); ``unwatch``: and then
        ``unwatch`` (a fed stream's end)."""
        feed = context.feed
        with self._lock:
            if feed is not None:
                total = feed.count()
                uncounted += total - feed.counted
                feed.counted = total
            if uncounted:
                key = context.events_key
                self._totals[key] = self._totals.get(key, 0) + uncounted
        if unwatch:
            self._fed.pop(id(context), None)

    def fed_events(self, context: StreamContext) -> int:
        """Events counted by the stream's feed and not yet in the totals
        (taken: the caller adds them)."""
        feed = context.feed
        if feed is None:
            return 0
        with self._lock:  # a collection and the stream's end may race here
            total = feed.count()
            new, feed.counted = total - feed.counted, total
        return new

    def freeze(self) -> None:
        """Uninstrumented: what the feeds counted so far goes into the
        totals, what they count from now on does not."""
        for context in list(self._fed.values()):
            self.add(context.events_key, self.fed_events(context))
            context.feed.freeze()
        self._fed.clear()

    def observe(self, options: CallbackOptions) -> list[Observation]:
        for context in list(self._fed.values()):
            new = self.fed_events(context)
            if new:
                self.add(context.events_key, new)
        with self._lock:
            totals = list(self._totals.items())
        observations = []
        for (transport, host, port), events in totals:
            attributes: dict[str, Any] = {sc.MCP_TRANSPORT: transport, sc.SERVER_ADDRESS: host}
            if port is not None:
                attributes[sc.SERVER_PORT] = port
            observations.append(Observation(events, attributes))
        return observations


class Evictions:
    """Streams the trackers dropped at their bound, reported by the
    observable counter ``mcp.client.resumption.evicted_streams``: read at
    collection, where a ``Counter.add`` at each admission cost ~4 us per
    stream to a client that runs at the bound.  Every owner of a
    MeterProvider's instruments watches its tracker here (weakly: an owner
    dropped unclosed keeps the count it was last read with).  A series from
    the first MCP server seen (``started``), as "none evicted" is an answer;
    none before it, so that a process that never speaks MCP exports nothing."""

    def __init__(self) -> None:
        self.started = False
        self._lock = threading.Lock()
        self._tokens = itertools.count()
        self._trackers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._last_read: dict[int, int] = {}
        self._of_the_gone = 0
        renew_after_fork(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def watch(self, tracker: Any) -> int:
        """Count ``tracker``'s evictions; returns its token for ``unwatch``."""
        token = next(self._tokens)
        with self._lock:
            self._trackers[token] = tracker
            self._last_read[token] = 0
        return token

    def unwatch(self, token: int, evicted: int) -> None:
        """The tracker's owner closed, having evicted ``evicted`` streams."""
        with self._lock:
            if self._last_read.pop(token, None) is not None:
                self._of_the_gone += evicted
            self._trackers.pop(token, None)

    def observe(self, options: CallbackOptions) -> list[Observation]:
        if not self.started:
            return []
        with self._lock:
            for token in list(self._last_read):
                tracker = self._trackers.get(token)
                if tracker is None:
                    self._of_the_gone += self._last_read.pop(token)
                else:
                    self._last_read[token] = tracker.evicted_streams
            return [Observation(self._of_the_gone + sum(self._last_read.values()))]


class Instruments:
    """The instruments of one MeterProvider, made once for every processor
    that writes to it: the SDK hands an instrument made a second time back
    as it was, with the first one's callbacks, so a second processor's own
    event totals would never be read."""

    def __init__(self, meter_provider: metrics.MeterProvider | None) -> None:
        meter = metrics.get_meter(
            sc.INSTRUMENTATION_NAME, __version__, meter_provider, schema_url=sc.SCHEMA_URL
        )
        self.attempts = meter.create_counter(*sc.ATTEMPTS)
        self.gaps = meter.create_counter(*sc.GAPS)
        self.duration = meter.create_histogram(
            *sc.DURATION, explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS
        )
        self.replayed = meter.create_histogram(*sc.REPLAYED_EVENTS)
        self.broken = meter.create_counter(*sc.BROKEN_REQUESTS)
        self.lost_subscriptions = meter.create_counter(*sc.LOST_SUBSCRIPTIONS)
        self.reissues = meter.create_counter(*sc.REISSUES)
        self.duplicate_runs = meter.create_counter(*sc.DUPLICATE_RUNS)
        self.state_fallbacks = meter.create_counter(*sc.STATE_FALLBACKS)
        self.operation_duration = meter.create_histogram(
            *sc.OPERATION_DURATION, explicit_bucket_boundaries_advisory=sc.OPERATION_BUCKETS
        )
        self.tasks = meter.create_counter(*sc.TASKS)
        self.task_duration = meter.create_histogram(
            *sc.TASK_DURATION, explicit_bucket_boundaries_advisory=sc.TASK_DURATION_BUCKETS
        )
        self.task_polls = meter.create_histogram(
            *sc.TASK_POLLS, explicit_bucket_boundaries_advisory=sc.TASK_POLL_BUCKETS
        )
        self.task_unroutable = meter.create_counter(*sc.TASK_UNROUTABLE)
        self.event_gaps = meter.create_counter(*sc.EVENT_GAPS)
        self.event_duplicates = meter.create_counter(*sc.EVENT_DUPLICATES)
        self.event_streams = meter.create_counter(*sc.EVENT_STREAMS)
        self.event_totals = EventTotals()
        name, unit, description = sc.STREAM_EVENTS
        meter.create_observable_counter(
            name, callbacks=[self.event_totals.observe], unit=unit, description=description
        )
        self.evictions = Evictions()
        name, unit, description = sc.EVICTED_STREAMS
        meter.create_observable_counter(
            name, callbacks=[self.evictions.observe], unit=unit, description=description
        )


# One Instruments per MeterProvider, for as long as the provider lives: a
# cache, not a channel (re-instrumenting against the same provider must find
# the instruments, and the callbacks, it made the first time).
_instruments: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()
_instruments_lock = threading.Lock()


def instruments_of(meter_provider: metrics.MeterProvider | None) -> Instruments:
    provider = meter_provider or metrics.get_meter_provider()
    with _instruments_lock:
        try:
            found = _instruments.get(provider)
        except TypeError:  # a provider that takes no weak reference
            return Instruments(meter_provider)
        if found is None:
            found = _instruments[provider] = Instruments(meter_provider)
        return found
