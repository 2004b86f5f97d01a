# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The telemetry sink: what the rules found, written as spans, log events
and metrics.

The owner (``monitor.ResumptionMonitor``) decides; this module only writes:
the ``mcp.resume`` span, ``resumption.gap`` span and log events (rate
limited per gap kind and server), the attempt, gap, duration and replay
metrics, and the observable event totals and evicted-streams counter.
Every exported text goes through the owner's session-id policy
(``redaction.Redaction``).  It imports nothing above it: no patch, no owner.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Any

from opentelemetry._logs import SeverityNumber, get_logger
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind

from opentelemetry import metrics, trace

from . import semconv as sc
from .budget import LogBudget
from .continuity import Gap, Outcome, Verdict
from .facts import (
    RequestFacts,
    ResumeStart,
    StreamContext,
    exported_request_id,
    server_attributes,
)
from .fates import Broken, Decided
from .forks import renew_after_fork
from .jsonrpc import MAX_TOOL_NAME
from .redaction import Redaction
from .subscriptions import LostSubscription
from .verdict_log import server_name, verdicts
from .version import __version__

# A stream's events are added to the totals at most every this many events or
# seconds, and when the stream ends.
EVENTS_BATCH = 64
EVENTS_BATCH_SECONDS = 1.0
# Servers whose counters are started at 0 (server_seen); beyond, new servers'
# series start at their first count, as without it.
MAX_ZERO_SERIES_SERVERS = 1024


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


def known_sessions(context: StreamContext) -> list[str | None]:
    """The session ids that exported text about ``context`` may quote."""
    check = context.stream.check
    sessions = [
        context.facts.session_id,
        context.facts.legacy_session_id,
        context.stream.session.session_id,
    ]
    if check is not None:
        sessions += [check.cursor.session_id, check.response_session_id]
    return sessions


class TelemetrySink:
    """Writes the owner's findings to one tracer, meter and logger provider."""

    def __init__(
        self,
        redaction: Redaction,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        logger_provider: Any | None = None,
    ) -> None:
        self.redaction = redaction
        self._tracer = trace.get_tracer(
            sc.INSTRUMENTATION_NAME,
            __version__,
            tracer_provider=tracer_provider,
            schema_url=sc.SCHEMA_URL,
        )
        instruments = instruments_of(meter_provider)
        self._attempts = instruments.attempts
        self._gaps = instruments.gaps
        self._duration = instruments.duration
        self._replayed = instruments.replayed
        self._broken = instruments.broken
        self._lost_subscriptions = instruments.lost_subscriptions
        self._reissues = instruments.reissues
        self._duplicate_runs = instruments.duplicate_runs
        self._state_fallbacks = instruments.state_fallbacks
        self._operation_duration = instruments.operation_duration
        self.event_totals = instruments.event_totals
        self.evictions = instruments.evictions
        self._events_logger = get_logger(
            sc.INSTRUMENTATION_NAME,
            __version__,
            logger_provider=logger_provider,
            schema_url=sc.SCHEMA_URL,
        )
        self._servers_seen: set[tuple[str, int | None]] = set()
        self._log_budget = LogBudget()

    # ------------------------------------------------------ the resume span

    def start_resume(self, facts: RequestFacts, attributes: Any) -> ResumeStart:
        span = self._tracer.start_span(
            sc.RESUME_SPAN_NAME,
            kind=SpanKind.INTERNAL,
            attributes={**server_attributes(facts), **attributes},
        )
        return ResumeStart(span, time.monotonic())

    def resume_answered(
        self,
        span: Any,
        transport: str,
        status: int,
        previous_session_id: str | None,
        session_id: str | None,
    ) -> None:
        """The resume's answer arrived: its transport, status and sessions."""
        if not span.is_recording():
            return
        span.set_attribute(sc.MCP_TRANSPORT, transport)
        span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status)
        if previous_session_id is not None:
            previous = self.redaction.session_attribute(previous_session_id)
            if previous is not None:
                span.set_attribute(sc.RESUMPTION_PREVIOUS_SESSION_ID, previous)
        current = self.redaction.session_attribute(session_id)
        if current is not None:
            span.set_attribute(sc.MCP_SESSION_ID, current)

    # ------------------------------------------------------ metrics

    def server_seen(self, address: str, port: int | None) -> None:
        """Start the counters of a server at 0 the first time it is seen.

        Prometheus' ``increase()`` and ``rate()`` cannot see a series that is
        born at 1: without a 0 point per outcome and gap kind, the first gap
        against a server would show as no gap at all.  Called at each response;
        the set makes it a lookup after the first."""
        key = (address, port)
        if key in self._servers_seen or len(self._servers_seen) >= MAX_ZERO_SERIES_SERVERS:
            return
        self._servers_seen.add(key)
        self.evictions.started = True  # no series at all before the first server
        verdicts.server_seen(server_name(address, port))
        server = {sc.SERVER_ADDRESS: address}
        if port is not None:
            server[sc.SERVER_PORT] = port
        # Both transports: a server migrated from SSE is resumed over
        # streamable HTTP, and that series must exist before its first count.
        for transport in (sc.TRANSPORT_SSE, sc.TRANSPORT_STREAMABLE_HTTP):
            self.event_totals.add((transport, address, port), 0)
            for kind in sc.GAP_KINDS:
                self._gaps.add(0, {sc.GAP_KIND: kind, sc.MCP_TRANSPORT: transport, **server})
            for fate in sc.FATES:
                self._broken.add(0, {sc.REQUEST_FATE: fate, sc.MCP_TRANSPORT: transport, **server})
            base = {sc.MCP_TRANSPORT: transport, **server}
            if transport == sc.TRANSPORT_STREAMABLE_HTTP:  # where subscriptions/listen exists
                for notifications in sc.SUBSCRIPTION_FILTERS:
                    for relistened in sc.BOOLEAN_VALUES:
                        attributes = {
                            sc.SUBSCRIPTION_NOTIFICATIONS: notifications,
                            sc.SUBSCRIPTION_RELISTENED: relistened,
                        }
                        self._lost_subscriptions.add(0, {**attributes, **base})
            for idempotent in sc.IDEMPOTENT_VALUES:
                for risk in sc.REISSUE_RISKS:
                    attributes = {sc.REISSUE_IDEMPOTENT: idempotent, sc.REISSUE_RISK: risk}
                    self._reissues.add(0, {**attributes, **base})
            self._duplicate_runs.add(0, base)
            for previous in sc.PREVIOUS_TRANSPORTS:
                for outcome in sc.OUTCOMES:
                    attributes = {
                        sc.RESUMPTION_OUTCOME: outcome,
                        sc.MCP_TRANSPORT: transport,
                        sc.RESUMPTION_PREVIOUS_TRANSPORT: previous,
                        **server,
                    }
                    self._attempts.add(0, attributes)

    def count_events(self, context: StreamContext) -> None:
        uncounted = context.uncounted + self.event_totals.fed_events(context)
        if uncounted:
            self.event_totals.add(context.events_key, uncounted)
            context.uncounted = 0
        context.counted_at = time.monotonic()

    # ------------------------------------------------------ gaps and outcomes

    def gap(self, context: StreamContext, gap: Gap) -> None:
        self._gaps.add(1, {sc.GAP_KIND: gap.kind.value, **context.attributes})
        verdicts.gap(server_name(context.facts.host, context.facts.port), gap.kind.value)
        self._gap_event(context, gap)

    def _gap_event(self, context: StreamContext, gap: Gap) -> None:
        """The ``resumption.gap`` span event and log record of ``gap``."""
        scrub = self.redaction.scrub
        sessions = known_sessions(context)
        attributes: dict[str, Any] = {
            sc.GAP_KIND: gap.kind.value,
            sc.GAP_EXPECTED: scrub(gap.expected, sessions),
            sc.GAP_OBSERVED: scrub(gap.observed, sessions),
            **context.attributes,
        }
        if gap.request_id is not None:
            attributes[sc.JSONRPC_REQUEST_ID] = exported_request_id(gap.request_id)
        if gap.method is not None:
            attributes[sc.MCP_METHOD_NAME] = gap.method
        span = context.span
        if span is None or not span.is_recording():
            span = trace.get_current_span()
        if span.is_recording():
            span.add_event(sc.GAP_EVENT_NAME, attributes)
        if not self._log_budget.take((gap.kind.value, context.facts.server)):
            return
        span_context = trace.set_span_in_context(span) if span.is_recording() else None
        self._events_logger.emit(
            event_name=sc.GAP_EVENT_NAME,
            body=scrub(gap.message, sessions),
            attributes=attributes,
            context=span_context,
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
        )

    def fate(
        self,
        context: StreamContext | None,
        decided: Decided,
        attempt: StreamContext | None = None,
    ) -> None:
        """A broken request's one fate (``context``: the stream that broke);
        a lost one is its orphaned_request gap, of ``attempt`` if a resume
        waited for it."""
        if context is None:  # recorded by no patch: nothing to name it by
            return
        if decided.counted:
            self._broken.add(1, {sc.REQUEST_FATE: decided.fate.value, **context.attributes})
        if decided.idempotent is not None:
            self._reissue(context, decided)
        if decided.gap is not None:
            self.gap(attempt or context, decided.gap)
            server = server_name(context.facts.host, context.facts.port)
            verdicts.finding(
                server,
                "",
                "mcp-resumption lost call: server=%s method=%s request=%s: its stream broke "
                "and its answer never came (%s); re-issue it",
                server,
                decided.broken.method or "-",
                exported_request_id(decided.broken.key),
                decided.gap.observed,
            )

    def lost_elsewhere(self, server: str, transport: str, method: str) -> None:
        """A request in flight in a process that died (its lease lapsed) was
        claimed here, once for the fleet: lost.  ``server`` is the tracker's
        ``host:port``; the transport is one of the two this plugin names."""
        host, _, port = server.rpartition(":")
        attributes: dict[str, Any] = {
            sc.REQUEST_FATE: "lost",
            sc.MCP_TRANSPORT: transport
            if transport in (sc.TRANSPORT_SSE, sc.TRANSPORT_STREAMABLE_HTTP)
            else sc.TRANSPORT_STREAMABLE_HTTP,
        }
        if host and port.isdigit():
            attributes[sc.SERVER_ADDRESS], attributes[sc.SERVER_PORT] = host, int(port)
        else:
            attributes[sc.SERVER_ADDRESS] = server
        self._broken.add(1, attributes)

    def state_fallback(self, operation: str, reason: str) -> None:
        """A shared-state operation fell back to memory (``redis_state``:
        both values come from its bounded sets)."""
        self._state_fallbacks.add(1, {sc.STATE_OPERATION: operation, sc.STATE_REASON: reason})

    # ------------------------------------------------------ operations

    def operation(
        self, method: str, key: str | None, facts: RequestFacts, error: str | None
    ) -> None:
        """One request ended, by its answer or its fate: its duration from
        when it was sent, as the MCP conventions name it."""
        attributes: dict[str, Any] = {
            sc.MCP_METHOD_NAME: method if method in sc.CLIENT_METHODS else sc.OTHER,
            **server_attributes(facts),
        }
        if method == "tools/call":
            tool = facts.tool(key) if key is not None else facts.mcp_name
            if tool:
                attributes[sc.GEN_AI_TOOL_NAME] = tool[:MAX_TOOL_NAME]
        if error is not None:
            attributes[sc.ERROR_TYPE] = error
        if facts.protocol_version:
            attributes[sc.MCP_PROTOCOL_VERSION] = facts.protocol_version[:32]
        self._operation_duration.record(max(0.0, time.monotonic() - facts.started), attributes)

    # ------------------------------------------------------ subscriptions, re-issues

    def subscription_lost(
        self, context: StreamContext, subscription: LostSubscription, gap: Gap | None
    ) -> None:
        """A subscription was lost: its gap event and its line now; its count
        when its re-listen window closes (``count_lost_subscription``)."""
        server = server_name(context.facts.host, context.facts.port)
        if gap is not None:
            verdicts.gap(server, gap.kind.value)
            self._gap_event(context, gap)
        verdicts.finding(
            server,
            "",
            "mcp-resumption subscription lost: server=%s transport=%s notifications=%s "
            "request=%s: change notifications are missed until it re-listens; re-listen "
            "and refetch",
            server,
            context.transport,
            subscription.notifications,
            exported_request_id(subscription.key),
        )

    def count_lost_subscription(self, subscription: LostSubscription) -> None:
        context = subscription.tag
        if context is None:  # recorded by no patch: nothing to name it by
            return
        attributes = {
            sc.SUBSCRIPTION_NOTIFICATIONS: subscription.notifications,
            sc.SUBSCRIPTION_RELISTENED: "true" if subscription.relistened else "false",
            **context.attributes,
        }
        self._lost_subscriptions.add(1, attributes)

    def _reissue(self, context: StreamContext, decided: Decided) -> None:
        risk = sc.REISSUE_MAY_RUN_TWICE if decided.may_run_twice else sc.REISSUE_SAFE
        idempotent = decided.idempotent or "unknown"
        self._reissues.add(
            1, {sc.REISSUE_IDEMPOTENT: idempotent, sc.REISSUE_RISK: risk, **context.attributes}
        )
        if decided.may_run_twice:
            server = server_name(context.facts.host, context.facts.port)
            verdicts.finding(
                server,
                sc.REISSUE_MAY_RUN_TWICE,
                "mcp-resumption re-issue may run twice: server=%s tool=%s idempotent=%s "
                "request=%s: the call was sent again after its stream broke, and this "
                "server's protocol does not cancel a call whose stream breaks; make the "
                "tool safe to run twice and declare it (idempotentHint), or check its effect",
                server,
                decided.broken.tool or "-",
                idempotent,
                exported_request_id(decided.broken.key),
            )

    def ran_twice(self, context: StreamContext | None, broken: Broken) -> None:
        """A re-issued call whose first attempt was answered too."""
        if context is None:
            return
        self._duplicate_runs.add(1, context.attributes)
        server = server_name(context.facts.host, context.facts.port)
        verdicts.finding(
            server,
            "ran_twice",
            "mcp-resumption ran twice: server=%s tool=%s request=%s: the first attempt and "
            "its re-issue were both answered, so the call ran twice",
            server,
            broken.tool or broken.method,
            exported_request_id(broken.key),
        )

    def decided(self, context: StreamContext, verdict: Verdict, awaiting: int) -> None:
        """An attempt's verdict was decided (at the first decisive fact: for
        ``resumed``, the replay that proves it): its line now, with the
        ``awaiting`` calls it still waits for; tallied when the attempt
        closes (``finish``)."""
        kinds = tuple(sorted({gap.kind.value for gap in verdict.gaps}))
        context.said = (verdict.outcome.value, kinds)
        verdicts.verdict(
            server_name(context.facts.host, context.facts.port),
            context.transport,
            verdict.outcome.value,
            (gap.kind.value for gap in verdict.gaps),
            awaiting=awaiting,
            tally=False,
        )

    def not_resumable(self, context: StreamContext, awaiting: int = 0) -> None:
        """A break with requests in flight that nothing resumed: an attempt
        of its own, with no span (nothing was sent).  Its line counts the
        ``awaiting`` calls whose fate is not known yet; each that is then
        lost gets a line of its own (``fate``)."""
        self._attempts.add(
            1,
            {
                sc.RESUMPTION_OUTCOME: Outcome.NOT_RESUMABLE.value,
                sc.RESUMPTION_PREVIOUS_TRANSPORT: context.transport,
                **context.attributes,
            },
        )
        verdicts.verdict(
            server_name(context.facts.host, context.facts.port),
            context.transport,
            Outcome.NOT_RESUMABLE.value,
            awaiting=awaiting,
        )

    def finish(self, context: StreamContext, verdict: Verdict, previous: str | None) -> None:
        """The attempt is over: one outcome, with every gap it had."""
        outcome = verdict.outcome.value
        base = {sc.RESUMPTION_OUTCOME: outcome, sc.MCP_TRANSPORT: context.transport}
        server = server_attributes(context.facts)
        self._attempts.add(
            1,
            {
                **base,
                sc.RESUMPTION_PREVIOUS_TRANSPORT: previous or sc.NO_PREVIOUS_TRANSPORT,
                **server,
            },
        )
        if context.started:
            self._duration.record(
                max(0.0, (context.decided or time.monotonic()) - context.started),
                {**base, **server},
            )
        self._replayed.record(verdict.replayed_events, base)
        check = context.stream.check if context.stream is not None else None
        kinds = tuple(sorted({gap.kind.value for gap in verdict.gaps}))
        said = context.said
        verdicts.verdict(
            server_name(context.facts.host, context.facts.port),
            context.transport,
            outcome,
            (gap.kind.value for gap in verdict.gaps),
            opaque_ids=verdict.first_event_id is not None
            and check is not None
            and check.cursor.known,
            # Written when decided; again only if the final verdict differs.
            line="" if said is None else None if said == (outcome, kinds) else " (final)",
        )
        span = context.span
        if span is not None:
            if span.is_recording():
                scrub = self.redaction.scrub
                span.set_attribute(sc.RESUMPTION_OUTCOME, outcome)
                span.set_attribute(sc.RESUMPTION_REPLAYED_EVENTS, verdict.replayed_events)
                sessions = known_sessions(context)
                if verdict.first_event_id is not None:
                    first = scrub(verdict.first_event_id, sessions)
                    span.set_attribute(sc.RESUMPTION_FIRST_EVENT_ID, first)
                if previous:
                    span.set_attribute(sc.RESUMPTION_PREVIOUS_TRANSPORT, previous)
                if verdict.outcome is Outcome.REJECTED:
                    # error.type of an HTTP failure is its status code, as text
                    status = (getattr(span, "attributes", None) or {}).get(
                        sc.HTTP_RESPONSE_STATUS_CODE
                    )
                    span.set_attribute(sc.ERROR_TYPE, str(status) if status else "_OTHER")
                if verdict.gaps:
                    message = scrub(verdict.gaps[0].message, sessions)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, message))
            span.end()
