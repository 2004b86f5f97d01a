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

from . import config, span_hook
from . import semconv as sc
from .continuity import (
    Gap,
    GapKind,
    Outcome,
    ResumeCursorRaceError,
    ResumptionGapError,
    Verdict,
)
from .deferral import Deferred, collecting
from .forks import renew_after_fork
from .tracker import NOTHING, Step, Stream, Tracker, bounded_id
from .version import __version__

_logger = logging.getLogger(__name__)

# A stream's events are added to the totals at most every this many events or
# seconds, and when the stream ends.
EVENTS_BATCH = 64
EVENTS_BATCH_SECONDS = 1.0
# What the MCP SDKs wait before a reconnect when the server sent no retry:.
DEFAULT_RETRY_SECONDS = 1.0
# Session ids whose keyed hash is remembered (a dict, emptied when full).
SESSION_HASH_CACHE = 1024
# Session ids at least this long are scrubbed from exported text wherever they
# appear; shorter ones only as a whole token.
MIN_SCRUBBED_ANYWHERE = 8
# Servers whose counters are started at 0 (server_seen); beyond, new servers'
# series start at their first count, as without it.
MAX_ZERO_SERIES_SERVERS = 1024

# Where HTTP client spans record a URL or its query (stable and older semconv).
_URL_ATTRIBUTES = ("url.full", "url.query", "http.url", "http.target")
# The query parameters a legacy (2024-11-05) server names the session with.
LEGACY_SESSION_PARAMETERS = ("sessionId", "session_id")
_SESSION_PARAMETER = re.compile(
    r"((?:^|[?&])(?:" + "|".join(LEGACY_SESSION_PARAMETERS) + r")=)[^&#]*"
)

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
    port: int | None = None  # server.port: with the address, what tells servers apart
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
        "decided",
        "error",
        "events_key",
        "facts",
        "feed",
        "reader",
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
        self.attributes = {sc.MCP_TRANSPORT: transport, **server_attributes(facts)}
        self.span: Span | None = None
        self.started = 0.0
        self.error: ResumptionGapError | None = None
        self.deadline: list | None = None
        self.decided = 0.0  # when the verdict was given (the attempt may close later)
        # Events read but not yet added to the totals, and when they last were.
        self.uncounted = 0
        self.counted_at = time.monotonic()
        self.events_key = (transport, facts.host, facts.port)
        self.status = 0  # of a candidate (``stream`` None), for when it is promoted
        # The SSE patch's record of a stream read without reporting each
        # event (patches.sse.Feed), and a weak reference to the iterator
        # that reads it (the close patch asks whether a close comes from
        # inside a read).
        self.feed: Any = None
        self.reader: Callable[[], Any] | None = None


@dataclass
class ResumeStart:
    """A reconnect request carrying Last-Event-ID, before its answer."""

    span: Any
    started: float


_HopKey = tuple[str, str, "str | None"]  # server, Last-Event-ID, Mcp-Session-Id


@dataclass
class _Hop:
    """A resume answered without a stream the client may still follow: a 3xx
    (the MCP SDKs follow same-origin redirects themselves, one request per
    hop), a 2xx that is not an event stream (mcp 2.x retries it), or a
    rejection that would orphan requests (both SDKs retry it).  Part of the
    attempt, not a verdict: the next request with the same cursor and session
    continues the attempt, and only if none comes is this answer judged.
    Parked at most a confirmation window, so the parked set stays small."""

    facts: RequestFacts
    resume: ResumeStart
    status: int
    session_id: str | None
    deadline: list | None = None


# Hops parked by the reconnect loop of the running task (the MCP SDK patch
# sets a list): when that loop returns, the client has stopped following them.
hop_scope: contextvars.ContextVar[list[_HopKey] | None] = contextvars.ContextVar(
    "mcp_resumption_hop_scope", default=None
)
# Streams that ended holding their lineage's requests inside an MCP SDK
# reconnect loop: when the loop returns, the client has stopped resuming them.
lineage_scope: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "mcp_resumption_lineage_scope", default=None
)


class _Deadlines:
    """One daemon thread that fires confirmation-window timeouts; a timer
    thread per resume would not survive hundreds of concurrent streams."""

    def __init__(self) -> None:
        self._heap: list[list] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._order = itertools.count()
        self._closed = False
        renew_after_fork(self)

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
            frozen = context.feed.counted
            context.feed._count = lambda frozen=frozen: frozen
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


class _LogBudget:
    """How many ``resumption.gap`` log records a (gap kind, server) may still
    write: a server answering thousands of unknown ids would otherwise write
    thousands of records.  A burst, then one per interval; the metrics and the
    span events count every gap.  Unlocked: a race lets one more through."""

    BURST = 10
    INTERVAL = 6.0  # seconds per record after the burst
    MAX_KEYS = 1024

    def __init__(self) -> None:
        self._left: dict[tuple[str, str], tuple[float, float]] = {}

    def take(self, key: tuple[str, str]) -> bool:
        now = time.monotonic()
        tokens, at = self._left.get(key, (self.BURST, now))
        tokens = min(self.BURST, tokens + (now - at) / self.INTERVAL)
        if len(self._left) >= self.MAX_KEYS and key not in self._left:
            self._left.clear()
        if tokens < 1:
            self._left[key] = (tokens, now)
            return False
        self._left[key] = (tokens - 1, now)
        return True


class _Instruments:
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
        self.event_totals = _EventTotals()
        name, unit, description = sc.STREAM_EVENTS
        meter.create_observable_counter(
            name, callbacks=[self.event_totals.observe], unit=unit, description=description
        )
        self.evicted = meter.create_counter(*sc.EVICTED_STREAMS)
        self.evicted.add(0)  # a series from the start: "none evicted" is an answer


_instruments: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_instruments_lock = threading.Lock()


def _instruments_of(meter_provider: metrics.MeterProvider | None) -> _Instruments:
    provider = meter_provider or metrics.get_meter_provider()
    with _instruments_lock:
        try:
            found = _instruments.get(provider)
        except TypeError:  # a provider that takes no weak reference
            return _Instruments(meter_provider)
        if found is None:
            found = _instruments[provider] = _Instruments(meter_provider)
        return found


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
            sc.INSTRUMENTATION_NAME,
            __version__,
            tracer_provider=tracer_provider,
            schema_url=sc.SCHEMA_URL,
        )
        self._span_source = tracer_provider  # None: the global one, maybe set later
        self.attached = False
        instruments = _instruments_of(meter_provider)
        self._attempts = instruments.attempts
        self._gaps = instruments.gaps
        self._duration = instruments.duration
        self._replayed = instruments.replayed
        self._event_totals = instruments.event_totals
        self._evicted = instruments.evicted
        self._evicted_reported = 0
        self._events_logger = get_logger(
            sc.INSTRUMENTATION_NAME,
            __version__,
            logger_provider=logger_provider,
            schema_url=sc.SCHEMA_URL,
        )
        self._servers_seen: set[tuple[str, int | None]] = set()
        self._hash_key = os.urandom(32)
        self._session_hashes: dict[str, str] = {}
        self._deadlines = _Deadlines()
        self._log_budget = _LogBudget()
        # stream key -> context of an ended attempt still open for its lineage
        self._held: dict[int, StreamContext] = {}
        self._said_unattached = False
        self._deferred = Deferred()
        renew_after_fork(self._deferred)
        self._hops: dict[_HopKey, _Hop] = {}
        self._hops_lock = threading.Lock()

    # ------------------------------------------------------ SpanProcessor

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        attributes = _request_attributes.get()
        if attributes is not None and self.enabled and span.kind is SpanKind.CLIENT:
            span.set_attributes(attributes)
            if self.settings.redact_urls:  # also where session ids are omitted
                self._redact_urls(span, attributes.get(sc.MCP_SESSION_ID) or "REDACTED")

    @staticmethod
    def _redact_urls(span: Span, session: str) -> None:
        """The legacy transport puts the raw session id in the query
        (``/messages?session_id=...``), which the HTTP client span records."""
        recorded = span.attributes or {}
        for key in _URL_ATTRIBUTES:
            url = recorded.get(key)
            if isinstance(url, str) and "ession" in url:
                redacted = _SESSION_PARAMETER.sub(lambda m: m.group(1) + session, url)
                if redacted != url:
                    span.set_attribute(key, redacted)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def attach(self) -> bool:
        """Receive span starts from the tracer provider, once it is the SDK's:
        it may be set after ``instrument()``."""
        provider = self._span_source or trace.get_tracer_provider()
        self.attached = span_hook.attach(provider, self)
        if not self.attached and not self._said_unattached:
            self._said_unattached = True
            _logger.debug(
                "mcp-resumption: %s takes no span processors; HTTP client spans get no MCP "
                "attributes until an SDK TracerProvider is set, metrics and log events count",
                type(provider).__name__,
            )
        return self.attached

    def shutdown(self) -> None:
        self.enabled = False
        self._event_totals.freeze()
        span_hook.detach(self._span_source or trace.get_tracer_provider(), self)
        self._deferred.close()
        self._deadlines.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._deferred.run()
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
        if not self.attached:
            self.attach()
        attributes: dict[str, Any] = {}
        session = self.session_attribute(facts.session_id or facts.legacy_session_id)
        if session is not None:
            attributes[sc.MCP_SESSION_ID] = session
        if facts.last_event_id is not None:
            cursor_session = self.tracker.cursor_session(facts.server, facts.last_event_id)
            sessions = (facts.session_id, facts.legacy_session_id, cursor_session)
            # Scrub, then bound: a cut could split an embedded session id.
            last_event_id = bounded_id(self.scrub(facts.last_event_id, sessions))
            attributes[sc.RESUMPTION_LAST_EVENT_ID] = last_event_id
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
            if facts.method == "DELETE" and facts.session_id:
                # Before the answer: the server closes the session's streams
                # while it handles the DELETE.
                self.tracker.session_terminated(facts.server, facts.session_id)
            return None
        hop = self._unpark((facts.server, facts.last_event_id, facts.session_id))
        if hop is not None:
            return hop.resume  # the next hop of the same attempt
        if attributes is None:
            attributes = self.request_attributes(facts)
        span = self._tracer.start_span(
            sc.RESUME_SPAN_NAME,
            kind=SpanKind.INTERNAL,
            attributes={**server_attributes(facts), **attributes},
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
        self._deferred.run()  # a stream that ended in a finalizer, before this one opens
        if not (facts.mcp or response_session_id or response_mcp):
            if event_stream and facts.method == "GET" and status < 300:
                candidate = StreamContext(facts, None, sc.TRANSPORT_SSE)
                candidate.status = status
                return candidate
            return None
        self.server_seen(facts.host, facts.port)
        if resume is None and facts.last_event_id is not None:
            resume = self.begin_request(replace(facts, mcp=True))
        if not event_stream:
            if facts.legacy_session_id and facts.requests != [] and status < 300:
                # Legacy transport: the answer comes on the session's GET stream.
                self.tracker.request_sent(facts.server, facts.legacy_session_id, facts.requests)
            if resume is None:
                return None
        if resume is not None and self._is_hop(facts, status, event_stream):
            self._park(_Hop(facts, resume, status, response_session_id))
            return None
        return self._open(facts, resume, status, response_session_id, event_stream)

    def promote(self, context: StreamContext, event_type: str) -> bool:
        """A candidate stream's first event: an ``endpoint`` event makes it a
        legacy MCP stream, tracked from this event on; anything else lets it go."""
        if event_type != "endpoint" or not self.enabled:
            return False
        facts = replace(context.facts, mcp=True)
        self.server_seen(facts.host, facts.port)
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
        self._deferred.start()  # its iterator may be finalised by the GC
        # This resume took over the requests that earlier attempts handed to
        # the lineage: those attempts are over, with the gaps they had.
        continued, stream.continued = stream.continued, ()
        for earlier in continued:
            held = self._held.pop(earlier.key, None)
            if held is not None and earlier.check is not None:
                self._apply(held, Step(final=earlier.check.final))
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
            why = "a redirect not followed" if 300 <= status < 400 else "a response without events"
            self._settle_end(context, self.tracker.stream_ended(stream, why))
            return None
        if stream.check is not None and stream.check.verdict is None and not stream.check.poll:
            # A poll waits for its first event or its end: silence is the
            # server's answer "nothing yet", not evidence of a lost replay.
            context.deadline = self._deadlines.add(
                self.settings.confirm_timeout, lambda: self._timeout(context)
            )
        return context

    def server_seen(self, address: str, port: int | None) -> None:
        """Start the counters of a server at 0 the first time it is seen.

        Prometheus' ``increase()`` and ``rate()`` cannot see a series that is
        born at 1: without a 0 point per outcome and gap kind, the first gap
        against a server would show as no gap at all.  Called at each response;
        the set makes it a lookup after the first.  Also callable by hand for
        servers known up front."""
        key = (address, port)
        if key in self._servers_seen or len(self._servers_seen) >= MAX_ZERO_SERIES_SERVERS:
            return
        self._servers_seen.add(key)
        server = {sc.SERVER_ADDRESS: address}
        if port is not None:
            server[sc.SERVER_PORT] = port
        # Both transports: a server migrated from SSE is resumed over
        # streamable HTTP, and that series must exist before its first count.
        for transport in (sc.TRANSPORT_SSE, sc.TRANSPORT_STREAMABLE_HTTP):
            self._event_totals.add((transport, address, port), 0)
            for kind in sc.GAP_KINDS:
                self._gaps.add(0, {sc.GAP_KIND: kind, sc.MCP_TRANSPORT: transport, **server})
            for previous in sc.PREVIOUS_TRANSPORTS:
                for outcome in sc.OUTCOMES:
                    attributes = {
                        sc.RESUMPTION_OUTCOME: outcome,
                        sc.MCP_TRANSPORT: transport,
                        sc.RESUMPTION_PREVIOUS_TRANSPORT: previous,
                        **server,
                    }
                    self._attempts.add(0, attributes)

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

    def feed(self, context: StreamContext, feed: Any) -> None:
        """The SSE patch records the stream's events in ``feed`` (see
        ``patches.sse``) and reports only those a rule must see as they come
        (``feed_event``); the tracker reads the rest when it needs them."""
        context.feed = feed
        self.tracker.attach_feed(context.stream, feed)
        self._event_totals.watch(context)

    def feed_event(self, context: StreamContext, feed: Any, sse: Any) -> None:
        """One event of a fed stream that a rule must see now; ``event`` for
        a fed stream."""
        if context.error is not None:
            raise context.error
        if not self.enabled:
            return
        step = self.tracker.fed_event(context.stream, feed.normalise, sse)
        if step is not NOTHING:
            self._apply(context, step)
            if context.error is not None:
                raise context.error

    def asked_next(self, context: StreamContext) -> None:
        """The application asked for the next event.  ``event`` implies it for
        the event before; this is for a read that then ends, fails or is
        cancelled without one."""
        if context.feed is not None:
            context.feed.held = False  # what the tracker reads of a fed stream
        if context.stream is not None:
            self.tracker.event_consumed(context.stream)

    def retry_seen(self, context: StreamContext, retry_ms: int) -> None:
        """The stream carried a ``retry:`` field (a polling server)."""
        if context.stream is not None and isinstance(retry_ms, int) and retry_ms >= 0:
            self.tracker.retry_seen(context.stream, retry_ms)

    def ended(
        self,
        context: StreamContext,
        reason: str,
        *,
        closed_by_client: bool = False,
        clean: bool = False,
    ) -> None:
        """The stream ended; ``clean``: its body ended normally, not by a
        read error (a server closing a polling stream on purpose)."""
        if context.stream is None:
            return  # a candidate never promoted: not MCP, nothing to report
        if collecting():
            # An iterator finalised by the GC, maybe at an allocation made while
            # this thread holds the tracker's or the SDK's lock: report later.
            self._deferred.put(self._ended, context, reason, closed_by_client, clean)
            return
        self._ended(context, reason, closed_by_client, clean)

    def _ended(
        self, context: StreamContext, reason: str, closed_by_client: bool, clean: bool
    ) -> None:
        self._count_events(context)
        if context.feed is not None:
            self._event_totals.unwatch(context)
        self._deadlines.cancel(context.deadline)
        held_open = bool(context.started) and (
            time.monotonic() - context.started >= self.settings.confirm_timeout
        )
        step = self.tracker.stream_ended(
            context.stream, reason, closed_by_client=closed_by_client, clean=clean,
            held_open=held_open,
        )
        self._settle_end(context, step)

    def _settle_end(self, context: StreamContext, step: Step) -> None:
        """Apply what a stream's end found.  Requests still pending go on with
        the lineage: a client that does not resume it within the retry it was
        asked for and the confirmation window has stopped resuming them, and
        they are orphaned then (the ended attempt closes with them)."""
        self._apply(context, step)
        if step.held:
            self._held[context.stream.key] = context
            scope = lineage_scope.get()
            if scope is not None:
                scope.append(context)
            retry = context.stream.retry_ms
            grace = (retry / 1000 if retry is not None else DEFAULT_RETRY_SECONDS) + (
                self.settings.confirm_timeout
            )
            why = f"the client did not resume the stream within {grace:g} s"
            self._deadlines.add(grace, lambda: self.lineage_ended(context, why))

    def lineage_ended(self, context: StreamContext, why: str) -> None:
        """The client stopped resuming the lineage of ``context``'s stream:
        what it still held is orphaned (called when its grace has passed)."""
        self._held.pop(context.stream.key, None)
        self._apply(context, self.tracker.lineage_ended(context.stream, why))

    # ------------------------------------------------------ hops

    def _is_hop(self, facts: RequestFacts, status: int, event_stream: bool) -> bool:
        if 300 <= status < 400:
            return True  # whatever its content type, a redirect is never the stream itself
        if status < 300:
            return not event_stream
        # A rejection: the MCP SDKs retry it.  Where it would orphan requests,
        # the answer that ends the retries decides, so that the same answer
        # gives the same outcome each time; with nothing in flight it is
        # `rejected` at once.
        return self.tracker.awaits_answers(
            facts.server, facts.last_event_id or "", facts.session_id, facts.path
        )

    def _park(self, hop: _Hop) -> None:
        key = (hop.facts.server, hop.facts.last_event_id or "", hop.facts.session_id)
        with self._hops_lock:
            replaced = self._hops.pop(key, None)
            self._hops[key] = hop
        if replaced is not None:  # another attempt with the same cursor: judge that one now
            self._deadlines.cancel(replaced.deadline)
            self._judge(replaced)
        hop.deadline = self._deadlines.add(self.settings.confirm_timeout, lambda: self.settle(key))
        scope = hop_scope.get()
        if scope is not None:
            scope.append(key)

    def _unpark(self, key: _HopKey) -> _Hop | None:
        with self._hops_lock:
            hop = self._hops.pop(key, None)
        if hop is not None:
            self._deadlines.cancel(hop.deadline)
        return hop

    def settle(self, key: _HopKey) -> None:
        """No request followed the hop parked under ``key``: judge its answer."""
        hop = self._unpark(key)
        if hop is not None:
            self._judge(hop)

    def _judge(self, hop: _Hop) -> None:
        self._open(hop.facts, hop.resume, hop.status, hop.session_id, False)

    # ------------------------------------------------------ telemetry out

    def _count_events(self, context: StreamContext) -> None:
        uncounted = context.uncounted + self._event_totals.fed_events(context)
        if uncounted:
            self._event_totals.add(context.events_key, uncounted)
            context.uncounted = 0
        context.counted_at = time.monotonic()

    def _timeout(self, context: StreamContext) -> None:
        seconds = self.settings.confirm_timeout
        self._apply(context, self.tracker.timeout(context.stream, seconds))

    def _apply(self, context: StreamContext, step: Step) -> None:
        if step is NOTHING:
            return
        check = context.stream.check
        for gap in step.gaps:
            self._emit_gap(context, gap)
        if step.verdict is not None:
            self._deadlines.cancel(context.deadline)
            context.decided = time.monotonic()
        if step.final is not None:
            # The attempt is over: one outcome, with every gap it had.
            self._finish(context, step.final, check.cursor.transport if check else None)
        if step.gaps and self.settings.enforce and context.error is None:
            context.error = enforcement_error(step.gaps)

    def _emit_gap(self, context: StreamContext, gap: Gap) -> None:
        self._gaps.add(1, {sc.GAP_KIND: gap.kind.value, **context.attributes})
        sessions = self._known_sessions(context)
        attributes: dict[str, Any] = {
            sc.GAP_KIND: gap.kind.value,
            sc.GAP_EXPECTED: self.scrub(gap.expected, sessions),
            sc.GAP_OBSERVED: self.scrub(gap.observed, sessions),
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
            body=self.scrub(gap.message, sessions),
            attributes=attributes,
            context=span_context,
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
        )

    def _finish(self, context: StreamContext, verdict: Verdict, previous: str | None) -> None:
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
        span = context.span
        if span is not None:
            if span.is_recording():
                span.set_attribute(sc.RESUMPTION_OUTCOME, outcome)
                span.set_attribute(sc.RESUMPTION_REPLAYED_EVENTS, verdict.replayed_events)
                sessions = self._known_sessions(context)
                if verdict.first_event_id is not None:
                    first = self.scrub(verdict.first_event_id, sessions)
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


def server_attributes(facts: RequestFacts) -> dict[str, Any]:
    """server.address and, when known, server.port: loopback or one host's
    several servers are told apart only by the port."""
    if facts.port is None:
        return {sc.SERVER_ADDRESS: facts.host}
    return {sc.SERVER_ADDRESS: facts.host, sc.SERVER_PORT: facts.port}


def exported_request_id(key: str) -> str:
    """The JSON-RPC id as the conventions export it: ``req-7``, not the
    tracker's key ``"req-7"`` (whose quotes keep ``1`` and ``"1"`` apart)."""
    if len(key) >= 2 and key[0] == '"' and key[-1] == '"':
        return key[1:-1]
    return key


def enforcement_error(gaps: tuple[Gap, ...]) -> ResumptionGapError:
    message = "; ".join(gap.message for gap in gaps)
    if any(gap.kind is GapKind.DRAIN_RACE for gap in gaps):
        return ResumeCursorRaceError(message)
    return ResumptionGapError(message)


def legacy_session_in_query(query: str) -> str | None:
    """The session id a legacy server names in a URL's query (``sessionId``
    or ``session_id``): of the ``endpoint`` event, and of the POSTs to it."""
    if "ession" not in query:  # most requests: no parse
        return None
    params = parse_qs(query)
    for name in LEGACY_SESSION_PARAMETERS:
        values = params.get(name)
        if values and values[0]:
            return bounded_id(values[0])
    return None


def legacy_session_from_endpoint(data: str) -> str | None:
    """The session id in a legacy ``endpoint`` event (``/messages/?session_id=…``)."""
    try:
        return legacy_session_in_query(urlsplit(data.strip()).query)
    except ValueError:
        return None
