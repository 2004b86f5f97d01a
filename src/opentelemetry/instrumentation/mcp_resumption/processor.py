# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""ContinuityProcessor: owns the tracker and the rules, writes the telemetry.

The patches report facts (a request went out, a response came back, an event
was handed to the application, the application asked for the next one, the
stream ended); the processor feeds them to the tracker and turns what the
rules find into an ``mcp.resume`` span, ``resumption.gap`` span and log
events, and metrics.  Rules and metrics run on every observation, whether
the trace is sampled or not, so sampling never changes the counts.
"""

from __future__ import annotations

import contextvars
import hashlib
import heapq
import hmac
import itertools
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from opentelemetry._logs import SeverityNumber, get_logger
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

from opentelemetry import metrics, trace

from . import config
from . import semconv as sc
from .continuity import Gap, GapKind, ResumeCursorRaceError, ResumptionGapError, Verdict
from .tracker import NOTHING, Step, Stream, Tracker
from .version import __version__

_logger = logging.getLogger(__name__)

# A stream's events are added to the totals at most every this many events or
# seconds, and when the stream ends.
EVENTS_BATCH = 64
EVENTS_BATCH_SECONDS = 1.0
# Session ids whose keyed hash is remembered (a dict, emptied when full).
SESSION_HASH_CACHE = 1024
# Session ids at least this long are scrubbed from exported text wherever they
# appear; shorter ones only as a whole token.
MIN_SCRUBBED_ANYWHERE = 8

# Request facts for the HTTP client span that the httpx instrumentation
# opens inside the patched call; read in on_start.
_request_attributes: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "mcp_resumption_request_attributes", default=None
)


@dataclass
class RequestFacts:
    """What one outgoing HTTP request tells the continuity checks."""

    method: str
    server: str  # host:port; event ids are scoped to a session on it, or to a path
    host: str  # for metric attributes: bounded, never a path or query
    last_event_id: str | None = None
    session_id: str | None = None  # Mcp-Session-Id header
    legacy_session_id: str | None = None  # sessionId / session_id query parameter
    protocol_version: str | None = None
    # JSON-RPC (id key, method) in the body; None: a body that was not read
    requests: list[tuple[str, str]] | None = field(default_factory=list)
    path: str = ""  # the URL path: the scope of a sessionless stream's event ids
    # The request itself shows MCP: an Mcp-Session-Id or MCP-Protocol-Version
    # header, a legacy session query parameter, or a JSON-RPC body.
    mcp: bool = True


class StreamContext:
    """The processor's view of one SSE response being read."""

    __slots__ = (
        "attributes",
        "counted_at",
        "deadline",
        "error",
        "events_key",
        "facts",
        "span",
        "started",
        "status",
        "stream",
        "transport",
        "uncounted",
    )

    def __init__(self, facts: RequestFacts, stream: Stream | None, transport: str) -> None:
        self.facts = facts
        self.stream = stream
        self.transport = transport
        self.attributes = {sc.MCP_TRANSPORT: transport, sc.SERVER_ADDRESS: facts.host}
        self.span: Span | None = None
        self.started = 0.0
        self.error: ResumptionGapError | None = None
        self.deadline: list | None = None
        # Events read but not yet added to the totals, and when they last were.
        self.uncounted = 0
        self.counted_at = time.monotonic()
        self.events_key = (transport, facts.host)
        self.status = 0  # of a candidate (``stream`` None), for when it is promoted


@dataclass
class ResumeStart:
    """A reconnect request carrying Last-Event-ID, before its answer."""

    span: Any
    started: float


class _Deadlines:
    """One daemon thread that fires confirmation-window timeouts; a timer
    thread per resume would not survive hundreds of concurrent streams."""

    def __init__(self) -> None:
        self._heap: list[list] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._order = itertools.count()
        self._closed = False
        _reset_in_child.add(self)

    def _after_fork(self) -> None:
        # The child has none of the parent's threads: a condition another
        # thread held at the fork would never be released, and the parent's
        # deadlines are the parent's to decide.
        self._cv = threading.Condition()
        self._heap = []
        self._thread = None

    def add(self, delay: float, callback: Callable[[], None]) -> list:
        entry = [time.monotonic() + delay, next(self._order), callback]
        with self._cv:
            if self._closed:
                return entry
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="mcp-resumption-deadlines", daemon=True
                )
                self._thread.start()
            self._cv.notify()
        return entry

    @staticmethod
    def cancel(entry: list | None) -> None:
        if entry is not None:
            entry[2] = None

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(timeout)
                if self._closed:
                    return
                _, _, callback = heapq.heappop(self._heap)
            if callback is not None:
                try:
                    callback()
                except Exception:  # never let the timer thread die
                    _logger.debug("confirmation timeout callback failed", exc_info=True)


class _EventTotals:
    """Events delivered per (transport, server address), reported by the
    observable counter ``mcp.client.stream.events``: a batch costs a dict
    addition here, where an SDK ``Counter.add`` cost ~20 us in a real client
    (once per stream, a tenth of the plugin's cost of a POST answered by SSE)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str], int] = {}
        _reset_in_child.add(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the totals go on, like a counter's

    def add(self, key: tuple[str, str], events: int) -> None:
        with self._lock:
            self._totals[key] = self._totals.get(key, 0) + events

    def observe(self, options: CallbackOptions) -> list[Observation]:
        with self._lock:
            totals = list(self._totals.items())
        return [
            Observation(events, {sc.MCP_TRANSPORT: transport, sc.SERVER_ADDRESS: host})
            for (transport, host), events in totals
        ]


# Objects holding a lock or a thread, made new in a forked child.
_reset_in_child: weakref.WeakSet[_Deadlines | _EventTotals] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for held in list(_reset_in_child):
        held._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class ContinuityProcessor(SpanProcessor):
    """Runs the continuity checks for every MCP stream the patches observe.

    The instrumentor creates one and adds it to the SDK TracerProvider; it
    can also be built and passed by hand: ``McpResumptionInstrumentor()
    .instrument(processor=ContinuityProcessor(...))``.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        logger_provider: Any | None = None,
        settings: config.Settings | None = None,
        **overrides: Any,
    ) -> None:
        self.settings = settings or config.load(overrides)
        self.tracker = Tracker(
            self.settings.max_streams,
            self.settings.replay_contract,
            event_id_pattern=self.settings.event_id_pattern,
        )
        self.enabled = True
        self._tracer = trace.get_tracer(
            sc.INSTRUMENTATION_NAME, __version__, tracer_provider=tracer_provider
        )
        meter = metrics.get_meter(sc.INSTRUMENTATION_NAME, __version__, meter_provider)
        self._attempts = meter.create_counter(*sc.ATTEMPTS)
        self._gaps = meter.create_counter(*sc.GAPS)
        self._duration = meter.create_histogram(*sc.DURATION)
        self._replayed = meter.create_histogram(*sc.REPLAYED_EVENTS)
        self._event_totals = _EventTotals()
        name, unit, description = sc.STREAM_EVENTS
        meter.create_observable_counter(
            name, callbacks=[self._event_totals.observe], unit=unit, description=description
        )
        self._evicted = meter.create_counter(*sc.EVICTED_STREAMS)
        self._evicted.add(0)  # a series from the start: "none evicted" is an answer
        self._evicted_reported = 0
        self._events_logger = get_logger(
            sc.INSTRUMENTATION_NAME, __version__, logger_provider=logger_provider
        )
        self._hash_key = os.urandom(32)
        self._session_hashes: dict[str, str] = {}
        self._deadlines = _Deadlines()

    # ------------------------------------------------------ SpanProcessor

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        attributes = _request_attributes.get()
        if attributes and self.enabled and span.kind is SpanKind.CLIENT:
            span.set_attributes(attributes)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        self.enabled = False
        self._deadlines.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    # ------------------------------------------------------ facts in

    def session_attribute(self, session_id: str | None) -> str | None:
        if session_id is None or self.settings.session_id == "omit":
            return None
        if self.settings.session_id == "raw":
            return session_id
        hashed = self._session_hashes.get(session_id)
        if hashed is None:
            # An HMAC per request was a tenth of the plugin's cost per request;
            # a session sends many.
            if len(self._session_hashes) >= SESSION_HASH_CACHE:
                self._session_hashes.clear()
            digest = hmac.new(self._hash_key, session_id.encode("utf-8", "replace"), hashlib.sha256)
            hashed = self._session_hashes[session_id] = digest.hexdigest()[:16]
        return hashed

    def scrub(self, text: str, session_ids: Iterable[str | None]) -> str:
        """``text`` with each of ``session_ids`` in it written as the session
        attribute is: event ids may embed the session (``s-77:e-104``), and
        gap messages quote event ids."""
        if self.settings.session_id == "raw":
            return text
        for session_id in session_ids:
            if not session_id or session_id not in text:
                continue
            replacement = self.session_attribute(session_id) or "<session>"
            if len(session_id) >= MIN_SCRUBBED_ANYWHERE:
                text = text.replace(session_id, replacement)
            else:  # short: only as a whole token, not inside another id's digits
                token = rf"(?<![A-Za-z0-9]){re.escape(session_id)}(?![A-Za-z0-9])"
                text = re.sub(token, lambda _, kept=replacement: kept, text)
        return text

    def request_attributes(self, facts: RequestFacts) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        session = self.session_attribute(facts.session_id or facts.legacy_session_id)
        if session is not None:
            attributes[sc.MCP_SESSION_ID] = session
        if facts.last_event_id is not None:
            cursor_session = self.tracker.cursor_session(facts.server, facts.last_event_id)
            sessions = (facts.session_id, facts.legacy_session_id, cursor_session)
            last_event_id = self.scrub(facts.last_event_id, sessions)
            attributes[sc.RESUMPTION_LAST_EVENT_ID] = last_event_id[:128]
        if facts.protocol_version is not None:
            attributes[sc.MCP_PROTOCOL_VERSION] = facts.protocol_version[:32]
        return attributes

    def begin_request(
        self, facts: RequestFacts, attributes: Mapping[str, Any] | None = None
    ) -> ResumeStart | None:
        """Called before the request is sent; a resume opens ``mcp.resume``.
        ``attributes``: ``request_attributes(facts)`` if the caller has them.
        A request that does not show MCP itself gets its span, if its answer
        does, when the answer arrives."""
        if facts.last_event_id is None or not facts.mcp:
            return None
        if attributes is None:
            attributes = self.request_attributes(facts)
        span = self._tracer.start_span(
            sc.RESUME_SPAN_NAME,
            kind=SpanKind.INTERNAL,
            attributes={sc.SERVER_ADDRESS: facts.host, **attributes},
        )
        return ResumeStart(span, time.monotonic())

    def end_request(
        self,
        facts: RequestFacts,
        resume: ResumeStart | None,
        status: int,
        response_session_id: str | None,
        event_stream: bool,
        response_mcp: bool = False,
    ) -> StreamContext | None:
        """The response's headers arrived.  Returns the context of the SSE
        stream to read, or None when there is nothing to follow.

        Only MCP traffic is tracked.  ``response_mcp``: the answer has an
        MCP-Protocol-Version header.  A request and answer without any sign
        of MCP are let go here, except a GET answered with an event stream:
        the legacy transport shows itself only by its first event
        (``endpoint``), so that stream is a *candidate* (``stream`` None),
        promoted or let go at its first event (:meth:`promote`)."""
        if not (facts.mcp or response_session_id or response_mcp):
            if event_stream and facts.method == "GET" and status < 300:
                candidate = StreamContext(facts, None, sc.TRANSPORT_SSE)
                candidate.status = status
                return candidate
            return None
        if resume is None and facts.last_event_id is not None:
            resume = self.begin_request(replace(facts, mcp=True))
        return self._open(facts, resume, status, response_session_id, event_stream)

    def promote(self, context: StreamContext, event_type: str) -> bool:
        """A candidate stream's first event: an ``endpoint`` event makes it a
        legacy MCP stream, tracked from this event on; anything else lets it go."""
        if event_type != "endpoint" or not self.enabled:
            return False
        facts = replace(context.facts, mcp=True)
        resume = self.begin_request(facts)
        return self._open(facts, resume, context.status, None, True, context) is not None

    def _open(
        self,
        facts: RequestFacts,
        resume: ResumeStart | None,
        status: int,
        response_session_id: str | None,
        event_stream: bool,
        context: StreamContext | None = None,
    ) -> StreamContext | None:
        if not event_stream:
            if facts.legacy_session_id and facts.requests != [] and status < 300:
                # Legacy transport: the answer comes on the session's GET stream.
                self.tracker.request_sent(facts.server, facts.legacy_session_id, facts.requests)
            if resume is None:
                return None
        transport = self._transport(facts, response_session_id)
        session_id = response_session_id or facts.session_id
        if facts.requests != [] and event_stream:
            self.tracker.request_sent(facts.server, session_id, facts.requests, facts.path)
        stream = self.tracker.open_stream(
            facts.server,
            transport,
            session_id=session_id,
            request_session_id=facts.session_id,
            last_event_id=facts.last_event_id,
            carries=[key for key, _ in facts.requests or ()],
            path=facts.path,
        )
        self._report_evictions()  # admitting a stream is what evicts one
        if context is None:
            context = StreamContext(facts, stream, transport)
        else:  # a candidate promoted: the patches already hold it
            context.__init__(facts, stream, transport)
        if resume is None:
            return context
        context.span = resume.span
        context.started = resume.started
        if resume.span.is_recording():
            resume.span.set_attribute(sc.MCP_TRANSPORT, transport)
            resume.span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status)
            check = stream.check
            if check is not None and check.cursor.session_id is not None:
                previous = self.session_attribute(check.cursor.session_id)
                if previous is not None:
                    resume.span.set_attribute(sc.RESUMPTION_PREVIOUS_SESSION_ID, previous)
            current = self.session_attribute(response_session_id)
            if current is not None:
                resume.span.set_attribute(sc.MCP_SESSION_ID, current)
        self._apply(context, self.tracker.response(stream, status, response_session_id))
        if not event_stream:
            self._apply(context, self.tracker.stream_ended(stream, "a response without events"))
            return None
        if stream.check is not None and stream.check.verdict is None:
            context.deadline = self._deadlines.add(
                self.settings.confirm_timeout, lambda: self._timeout(context)
            )
        return context

    def event(
        self, context: StreamContext, event_type: str, event_id: str | None, data: str
    ) -> None:
        """An event is about to be handed to the application.  In enforce mode
        raises the gap error instead, so the application never sees an event
        of an unproven stream."""
        if context.error is not None:
            raise context.error
        if not self.enabled or context.stream is None:
            return
        context.uncounted += 1
        if context.uncounted >= EVENTS_BATCH or (
            time.monotonic() - context.counted_at >= EVENTS_BATCH_SECONDS
        ):
            self._count_events(context)
        if event_type == "endpoint":
            session_id = legacy_session_from_endpoint(data)
            if session_id is not None:
                self.tracker.bind_session(context.stream, session_id)
            return
        step = self.tracker.event_received(context.stream, event_id, data)
        if step is not NOTHING:
            self._apply(context, step)
            if context.error is not None:
                raise context.error

    def asked_next(self, context: StreamContext) -> None:
        """The application asked for the next event.  ``event`` implies it for
        the event before; this is for a read that then ends, fails or is
        cancelled without one."""
        if context.stream is not None:
            self.tracker.event_consumed(context.stream)

    def ended(self, context: StreamContext, reason: str, *, closed_by_client: bool = False) -> None:
        if context.stream is None:
            return  # a candidate never promoted: not MCP, nothing to report
        self._count_events(context)
        self._deadlines.cancel(context.deadline)
        self._apply(
            context,
            self.tracker.stream_ended(context.stream, reason, closed_by_client=closed_by_client),
        )

    # ------------------------------------------------------ telemetry out

    def _count_events(self, context: StreamContext) -> None:
        if context.uncounted:
            self._event_totals.add(context.events_key, context.uncounted)
            context.uncounted = 0
        context.counted_at = time.monotonic()

    def _timeout(self, context: StreamContext) -> None:
        seconds = self.settings.confirm_timeout
        self._apply(context, self.tracker.timeout(context.stream, seconds))

    def _apply(self, context: StreamContext, step: Step) -> None:
        if step.verdict is None and not step.gaps:
            return
        check = context.stream.check
        for gap in step.gaps:
            self._emit_gap(context, gap)
        if step.verdict is not None:
            self._deadlines.cancel(context.deadline)
            self._finish(context, step.verdict, check.cursor.transport if check else None)
        if step.gaps and self.settings.enforce and context.error is None:
            context.error = enforcement_error(step.gaps)

    def _emit_gap(self, context: StreamContext, gap: Gap) -> None:
        self._gaps.add(1, {sc.GAP_KIND: gap.kind.value, **context.attributes})
        sessions = self._known_sessions(context)
        attributes: dict[str, Any] = {
            sc.GAP_KIND: gap.kind.value,
            sc.GAP_EXPECTED: self.scrub(gap.expected, sessions),
            sc.GAP_OBSERVED: self.scrub(gap.observed, sessions),
            sc.MCP_TRANSPORT: context.transport,
            sc.SERVER_ADDRESS: context.facts.host,
        }
        if gap.request_id is not None:
            attributes[sc.JSONRPC_REQUEST_ID] = gap.request_id
        span = context.span
        if span is None or not span.is_recording():
            span = trace.get_current_span()
        if span.is_recording():
            span.add_event(sc.GAP_EVENT_NAME, attributes)
        span_context = trace.set_span_in_context(span) if span.is_recording() else None
        self._events_logger.emit(
            event_name=sc.GAP_EVENT_NAME,
            body=self.scrub(gap.message, sessions),
            attributes=attributes,
            context=span_context,
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
        )

    def _finish(self, context: StreamContext, verdict: Verdict, previous: str | None) -> None:
        outcome = verdict.outcome.value
        base = {sc.RESUMPTION_OUTCOME: outcome, sc.MCP_TRANSPORT: context.transport}
        self._attempts.add(
            1,
            {
                **base,
                sc.RESUMPTION_PREVIOUS_TRANSPORT: previous or sc.NO_PREVIOUS_TRANSPORT,
                sc.SERVER_ADDRESS: context.facts.host,
            },
        )
        if context.started:
            self._duration.record(
                max(0.0, time.monotonic() - context.started),
                {**base, sc.SERVER_ADDRESS: context.facts.host},
            )
        self._replayed.record(verdict.replayed_events, base)
        span = context.span
        if span is not None:
            if span.is_recording():
                span.set_attribute(sc.RESUMPTION_OUTCOME, outcome)
                span.set_attribute(sc.RESUMPTION_REPLAYED_EVENTS, verdict.replayed_events)
                sessions = self._known_sessions(context)
                if verdict.first_event_id is not None:
                    first = self.scrub(verdict.first_event_id, sessions)
                    span.set_attribute(sc.RESUMPTION_FIRST_EVENT_ID, first[:128])
                if previous:
                    span.set_attribute(sc.RESUMPTION_PREVIOUS_TRANSPORT, previous)
                if verdict.gaps:
                    message = self.scrub(verdict.gaps[0].message, sessions)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, message))
            span.end()

    @staticmethod
    def _known_sessions(context: StreamContext) -> list[str | None]:
        check = context.stream.check
        sessions = [
            context.facts.session_id,
            context.facts.legacy_session_id,
            context.stream.session.session_id,
        ]
        if check is not None:
            sessions += [check.cursor.session_id, check.response_session_id]
        return sessions

    def _report_evictions(self) -> None:
        evicted = self.tracker.evicted_streams
        if evicted > self._evicted_reported:
            self._evicted.add(evicted - self._evicted_reported)
            self._evicted_reported = evicted

    @staticmethod
    def _transport(facts: RequestFacts, response_session_id: str | None) -> str:
        if facts.legacy_session_id is None and (
            facts.method == "POST"
            or facts.session_id
            or facts.protocol_version
            or facts.last_event_id
            or response_session_id
        ):
            return sc.TRANSPORT_STREAMABLE_HTTP
        return sc.TRANSPORT_SSE


def enforcement_error(gaps: tuple[Gap, ...]) -> ResumptionGapError:
    message = "; ".join(gap.message for gap in gaps)
    if any(gap.kind is GapKind.DRAIN_RACE for gap in gaps):
        return ResumeCursorRaceError(message)
    return ResumptionGapError(message)


def legacy_session_from_endpoint(data: str) -> str | None:
    """The session id in a legacy ``endpoint`` event (``/messages/?session_id=…``)."""
    try:
        query = parse_qs(urlsplit(data.strip()).query)
    except ValueError:
        return None
    for name in ("sessionId", "session_id"):
        values = query.get(name)
        if values and values[0]:
            return values[0][:256]
    return None
