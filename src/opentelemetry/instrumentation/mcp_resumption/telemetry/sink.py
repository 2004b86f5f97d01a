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

import time
from typing import Any

from opentelemetry._logs import SeverityNumber, get_logger
from opentelemetry.trace import SpanKind

from opentelemetry import metrics, trace

from ..rules.continuity import Gap, Outcome, Verdict
from ..version import __version__
from . import semconv as sc
from .budget import LogBudget
from .call_telemetry import CallTelemetry
from .event_telemetry import EventTelemetry
from .facts import (
    RequestFacts,
    ResumeStart,
    StreamContext,
    exported_request_id,
    server_attributes,
)
from .instruments import instruments_of
from .redaction import Redaction
from .task_telemetry import TaskTelemetry
from .verdict_log import server_name, verdicts

# Servers whose counters are started at 0 (server_seen); beyond, new servers'
# series start at their first count, as without it.
MAX_ZERO_SERIES_SERVERS = 1024

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


class TelemetrySink(CallTelemetry, TaskTelemetry, EventTelemetry):
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
        self._tasks = instruments.tasks
        self._task_duration = instruments.task_duration
        self._task_polls = instruments.task_polls
        self._task_unroutable = instruments.task_unroutable
        self._event_gaps = instruments.event_gaps
        self._event_duplicates = instruments.event_duplicates
        self._event_streams = instruments.event_streams
        self._event_names: dict[str, None] = {}
        self._event_series: set[tuple[str, int | None, str, str]] = set()
        self.event_totals = instruments.event_totals
        self.evictions = instruments.evictions
        self._events_logger = get_logger(
            sc.INSTRUMENTATION_NAME,
            __version__,
            logger_provider=logger_provider,
            schema_url=sc.SCHEMA_URL,
        )
        self.servers_seen: set[tuple[str, int | None]] = set()
        self._task_tools_seen: set[tuple[str, str, int | None, str]] = set()
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
        if key in self.servers_seen or len(self.servers_seen) >= MAX_ZERO_SERIES_SERVERS:
            return
        self.servers_seen.add(key)
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
        self.tasks_seen(server)

    def count_events(self, context: StreamContext) -> None:
        self.event_totals.count(context, context.uncounted)  # one lock for both
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

    def state_fallback(self, operation: str, reason: str) -> None:
        """A shared-state operation fell back to memory (``redis_state``:
        both values come from its bounded sets)."""
        self._state_fallbacks.add(1, {sc.STATE_OPERATION: operation, sc.STATE_REASON: reason})

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
