# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""ResumptionMonitor: the one owner of the client side's state.

``McpResumptionInstrumentor.instrument()`` makes one (a
:class:`~.processor.ContinuityProcessor`, its span-processor face) and binds
it into every patch with ``functools.partial``, the way the contrib
instrumentations bind their tracer.  It owns the tracker, the settings, the
registry of the responses being read, the parked hops of a resume and the
lineages still held, the deferred reports, the deadline timer, the
session-id policy and the telemetry sink, and the per-task context variables
the patches share; nothing of it lives at module level.

The patches report facts (a request went out, a response came back, an event
was handed to the application, the application asked for the next one, the
stream ended); the monitor feeds them to the tracker and hands what the
rules find to the telemetry sink.  Rules and metrics run on every
observation, whether the trace is sampled or not, so sampling never changes
the counts.

Imports go one way (tests/test_layering.py): the patches know the monitor
by its type only, the monitor imports the tracker and rules, and the
telemetry sink, redaction and timer it drives; none of those imports it.
"""

from __future__ import annotations

import contextvars
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import metrics, trace

from . import config
from . import semconv as sc
from .continuity import (
    Gap,
    GapKind,
    Outcome,
    ResumeCursorRaceError,
    ResumptionGapError,
)
from .deadlines import Deadlines
from .deferral import Deferred, collecting
from .facts import (
    RequestFacts,
    ResumeStart,
    StreamContext,
    legacy_session_from_endpoint,
    transport_of,
)
from .forks import renew_after_fork
from .jsonrpc import LISTEN, TOOLS_LIST, answer_errors
from .redaction import Redaction
from .redis_state import state_store
from .telemetry import EVENTS_BATCH, EVENTS_BATCH_SECONDS, TelemetrySink
from .tracker import NOTHING, Step, Tracker, bounded_id

# What the MCP SDKs wait before a reconnect when the server sent no retry:.
DEFAULT_RETRY_SECONDS = 1.0

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
    status: int  # 0: no HTTP answer (``error`` says what the client raised)
    session_id: str | None
    deadline: list | None = None
    error: str | None = None


# Outcomes of a resume that could not bring any answer.
_REFUSED = (Outcome.REJECTED, Outcome.FAILED)


def enforcement_error(gaps: tuple[Gap, ...]) -> ResumptionGapError:
    message = "; ".join(gap.message for gap in gaps)
    if any(gap.kind is GapKind.DRAIN_RACE for gap in gaps):
        return ResumeCursorRaceError(message)
    return ResumptionGapError(message)


class ResumptionMonitor:
    """Runs the continuity checks for every MCP stream the patches observe.

    Not a span processor itself: :class:`~.processor.ContinuityProcessor` is
    this class with the span processor's face, which is what the
    instrumentor makes and binds.
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
            # Memory unless OTEL_PYTHON_MCP_RESUMPTION_STATE names a Redis;
            # its fallbacks are counted once the sink below exists.
            store=state_store(
                self.settings,
                lambda op, why: self.telemetry.state_fallback(op, why),
                lambda *lost: self.telemetry.lost_elsewhere(*lost),
            ),
        )
        # enabled: the checks run (False once shut down); active: the
        # instrumentor's patches report here (between instrument() and
        # uninstrument()).
        self.enabled = True
        self.active = False
        self.attached = False
        self.redaction = Redaction(self.settings)
        self.telemetry = TelemetrySink(
            self.redaction,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            logger_provider=logger_provider,
        )
        self._evictions_token = self.telemetry.evictions.watch(self.tracker)
        self._deadlines = Deadlines()
        # stream key -> context of an ended attempt still open for its lineage
        self._held: dict[int, StreamContext] = {}
        self._deferred = Deferred()
        renew_after_fork(self._deferred)
        self._hops: dict[_HopKey, _Hop] = {}
        self._hops_lock = threading.Lock()

        # The responses being read and their redirects, shared by the HTTP
        # and SSE patches of this owner.
        # response -> the stream context its EventSource reads through
        self.streams: weakref.WeakKeyDictionary[Any, StreamContext] = (
            weakref.WeakKeyDictionary()
        )
        # The next request of a redirect the client follows itself (one
        # ``send`` per hop, as the MCP SDKs do) -> the JSON-RPC requests of
        # the request it redirects: the re-sent body is a stream
        # ``request.content`` cannot give.
        self.redirected: weakref.WeakKeyDictionary[Any, list[tuple[str, str]]] = (
            weakref.WeakKeyDictionary()
        )
        # How many frames above the close patch's check a reader's frame was
        # found when a client closed a response inside its read (a few call
        # chains of the libraries': looked at before a walk up the stack).
        self.read_depths: list[int] = []

        # Per-task channels between the patches, one set per owner (an
        # owner lives for one instrument() cycle, so the few variables a
        # process ever makes stay few).
        # For the HTTP client span that the httpx instrumentation opens
        # inside the patched call, read in on_start: its attributes, and
        # whether its URL may name the legacy session.
        self.request_scope: contextvars.ContextVar[
            tuple[Mapping[str, Any] | None, bool] | None
        ] = contextvars.ContextVar("mcp_resumption_request_attributes", default=None)
        # Hops parked by the reconnect loop of the running task (the MCP SDK
        # patch sets a list): when that loop returns, the client has stopped
        # following them.
        self.hop_scope: contextvars.ContextVar[list[_HopKey] | None] = contextvars.ContextVar(
            "mcp_resumption_hop_scope", default=None
        )
        # Streams that ended holding their lineage's requests inside an MCP
        # SDK reconnect loop: when the loop returns, the client has stopped
        # resuming them.
        self.lineage_scope: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
            "mcp_resumption_lineage_scope", default=None
        )
        # Gap errors raised in enforce mode, collected per task by the MCP SDK
        # patch so that the SDK's reconnect loop can fail the pending request
        # instead of retrying.
        self.enforced_errors: contextvars.ContextVar[list[ResumptionGapError] | None] = (
            contextvars.ContextVar("mcp_resumption_enforced_errors", default=None)
        )

    def attach(self) -> bool:
        """Start receiving span starts; the span-processor face
        (ContinuityProcessor) does, a bare monitor has none to receive."""
        return False

    def close(self) -> None:
        """Stop: no more checks, the feeds' counts frozen, the deferred
        reports made and the timer stopped."""
        if self.enabled:
            self.stop_waiting("the client stopped before its answer came")
        self.enabled = False
        self.telemetry.event_totals.freeze()
        self.telemetry.evictions.unwatch(self._evictions_token, self.tracker.evicted_streams)
        self._deferred.close()
        self._deadlines.close()
        self.tracker.store.close()  # what is queued for the shared state, bounded

    def _enforced(self, error: ResumptionGapError) -> ResumptionGapError:
        """``error`` is about to leave a patch on purpose (enforce mode): the
        MCP SDK patch's reconnect loop, if this task runs in one, is told
        here, where the error is raised, so that it fails the pending
        request instead of retrying."""
        raised = self.enforced_errors.get()
        if raised is not None:
            raised.append(error)
        return error

    # ------------------------------------------------------ session-id policy

    def session_attribute(self, session_id: str | None) -> str | None:
        return self.redaction.session_attribute(session_id)

    def scrub(self, text: str, session_ids: Iterable[str | None]) -> str:
        return self.redaction.scrub(text, session_ids)

    # ------------------------------------------------------ facts in

    def request_attributes(self, facts: RequestFacts) -> dict[str, Any]:
        if not self.attached:
            self.attach()
        redaction = self.redaction
        attributes: dict[str, Any] = {}
        session = redaction.session_attribute(facts.session_id or facts.legacy_session_id)
        if session is not None:
            attributes[sc.MCP_SESSION_ID] = session
        if facts.last_event_id is not None:
            cursor_session = self.tracker.cursor_session(facts.server, facts.last_event_id)
            sessions = (facts.session_id, facts.legacy_session_id, cursor_session)
            # Scrub, then bound: a cut could split an embedded session id.
            last_event_id = bounded_id(redaction.scrub(facts.last_event_id, sessions))
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
        if facts.body is not None:
            session_id = facts.session_id or facts.legacy_session_id
            if self.tracker.broken.awaits(facts.server):
                # Matched as it is sent: its answer may come after the window.
                step = self.tracker.reissued(
                    facts.server, session_id, facts.path, facts.body, facts.protocol_version
                )
                self._fated(step)
            if b"notifications/cancelled" in facts.body:
                self.tracker.cancelling(facts.server, session_id, facts.path, facts.body)
        if facts.last_event_id is None or not facts.mcp:
            if facts.method == "DELETE" and facts.session_id:
                # Before the answer: the server closes the session's streams
                # while it handles the DELETE.
                self._fated(self.tracker.session_terminated(facts.server, facts.session_id))
            return None
        self.tracker.resuming(facts.server, facts.last_event_id, facts.session_id, facts.path)
        hop = self._unpark((facts.server, facts.last_event_id, facts.session_id))
        if hop is not None:
            return hop.resume  # the next hop of the same attempt
        if attributes is None:
            attributes = self.request_attributes(facts)
        return self.telemetry.start_resume(facts, attributes)

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
            if facts.legacy_session_id and status < 300 and (requests := facts.ledger()) != []:
                # Legacy transport: the answer comes on the session's GET stream.
                self.tracker.request_sent(
                    facts.server, facts.legacy_session_id, requests, operation=self._timed(facts)
                )
            if resume is None:
                return None
        if resume is not None and self._is_hop(facts, status, event_stream):
            self._park(_Hop(facts, resume, status, response_session_id))
            return None
        return self._open(facts, resume, status, response_session_id, event_stream)

    def json_answered(self, facts: RequestFacts, answer: bytes, status: int) -> None:
        """The JSON answer of an MCP POST, read when the client closed it:
        the operations it ends, the tools/list hints and the answers a
        watched re-issue waits for."""
        body = facts.body  # None: parsed already, or a redirect's hop
        if not self.enabled or (body is None and not facts.requests):
            return
        if body is not None:
            lists_tools = b'"tools/list"' in body
        else:
            lists_tools = any(method == TOOLS_LIST for _, method in facts.requests or ())
        if lists_tools or self.tracker.watches_reissues:
            session_id = facts.session_id or facts.legacy_session_id
            self.tracker.json_answered(facts.server, session_id, facts.path, lists_tools, answer)
            self._report_ran_twice()
        if not self.settings.operation_metric:
            return
        failed = answer_errors(answer)
        rejected = str(status) if status >= 400 else None
        if facts.mcp_method is not None and body is not None and b'"id"' in body:
            # 2026-07-28 names the one request's method in a header: no parse.
            error = next(iter(failed.values()), rejected)
            self.telemetry.operation(facts.mcp_method, None, facts, error)
            return
        for key, method in facts.ledger() or ():
            if method != LISTEN:
                self.telemetry.operation(method, key, facts, failed.get(key, rejected))

    def _timed(self, facts: RequestFacts) -> RequestFacts | None:
        """What the tracker keeps of a request to time its operation: the
        request's facts, or nothing when the operation metric is off."""
        return facts if self.settings.operation_metric else None

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
        error: str | None = None,
    ) -> StreamContext | None:
        transport = transport_of(facts, response_session_id)
        session_id = response_session_id or facts.session_id
        body = facts.body
        requests = facts.ledger()
        stream = self.tracker.open_stream(
            facts.server,
            transport,
            session_id=session_id,
            request_session_id=facts.session_id,
            last_event_id=facts.last_event_id,
            carries=[key for key, _ in requests or ()],
            path=facts.path,
            body=body,
            sent=requests if requests != [] and event_stream else (),
            operation=self._timed(facts),
        )
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
        check = stream.check
        self.telemetry.resume_answered(
            resume.span,
            transport,
            status,
            check.cursor.session_id if check is not None else None,
            response_session_id,
        )
        self._apply(context, self.tracker.response(stream, status, response_session_id, error))
        if not event_stream:
            if error is not None:
                why = "no answer"
            elif 300 <= status < 400:
                why = "a redirect not followed"
            else:
                why = "a response without events"
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
        """Start the counters of a server at 0 the first time it is seen
        (Prometheus' ``increase()`` cannot see a series born at 1).  Called
        at each response; also callable by hand for servers known up front."""
        self.telemetry.server_seen(address, port)

    def event(
        self, context: StreamContext, event_type: str, event_id: str | None, data: str
    ) -> None:
        """An event is about to be handed to the application.  In enforce mode
        raises the gap error instead, so the application never sees an event
        of an unproven stream."""
        if context.error is not None:
            raise self._enforced(context.error)
        if not self.enabled or context.stream is None:
            return
        context.uncounted += 1
        if context.uncounted >= EVENTS_BATCH or (
            time.monotonic() - context.counted_at >= EVENTS_BATCH_SECONDS
        ):
            self.telemetry.count_events(context)
        if event_type == "endpoint":
            session_id = legacy_session_from_endpoint(data)
            if session_id is not None:
                self.tracker.bind_session(context.stream, session_id)
            return
        step = self.tracker.event_received(context.stream, event_id, data)
        if self.tracker.operations_done:
            self._operations_ended()
        if step is not NOTHING:
            self._apply(context, step)
            if context.error is not None:
                raise self._enforced(context.error)

    def feed(self, context: StreamContext, feed: Any) -> None:
        """The SSE patch records the stream's events in ``feed`` (see
        ``patches.sse``) and reports only those a rule must see as they come
        (``feed_event``); the tracker reads the rest when it needs them."""
        context.feed = feed
        self.tracker.attach_feed(context.stream, feed)
        self.telemetry.event_totals.watch(context)

    def feed_event(self, context: StreamContext, feed: Any, sse: Any) -> None:
        """One event of a fed stream that a rule must see now; ``event`` for
        a fed stream."""
        if context.error is not None:
            raise self._enforced(context.error)
        if not self.enabled:
            return
        step = self.tracker.fed_event(context.stream, feed.normalise, sse)
        if self.tracker.operations_done:
            self._operations_ended()
        if step is not NOTHING:
            self._apply(context, step)
            if context.error is not None:
                raise self._enforced(context.error)

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
        self.telemetry.count_events(context)
        if context.feed is not None:
            self.telemetry.event_totals.unwatch(context)
        self._deadlines.cancel(context.deadline)
        held_open = bool(context.started) and (
            time.monotonic() - context.started >= self.settings.confirm_timeout
        )
        step = self.tracker.stream_ended(
            context.stream, reason, closed_by_client=closed_by_client, clean=clean,
            held_open=held_open,
        )
        self._settle_end(context, step)
        if self.tracker.operations_done:
            self._operations_ended()
        if self.tracker.ran_twice_found:
            self._report_ran_twice()

    def _settle_end(self, context: StreamContext, step: Step) -> None:
        """Apply what a stream's end found.  Requests still pending go on with
        the lineage: a client that does not resume it within the retry it was
        asked for and the confirmation window has stopped resuming them, and
        they are orphaned then (the ended attempt closes with them)."""
        self._apply(context, step)
        if step.held:
            self._held[context.stream.key] = context
            scope = self.lineage_scope.get()
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
        what it still held waits for its fate (called when its grace has
        passed); the attempt closes with those fates."""
        self._apply(context, self.tracker.lineage_ended(context.stream, why))
        check = context.stream.check
        if check is None or check.closed or not check.held:
            self._held.pop(context.stream.key, None)

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
        scope = self.hop_scope.get()
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
        self._open(hop.facts, hop.resume, hop.status, hop.session_id, False, error=hop.error)

    def request_failed(self, facts: RequestFacts, resume: ResumeStart, error: str) -> None:
        """A resume got no HTTP answer (``error``: the type the client
        raised).  Part of the attempt, as a rejection is: the MCP SDKs try
        again, and the last try's answer is the verdict."""
        self._park(_Hop(facts, resume, 0, None, error=error))

    # ------------------------------------------------------ findings out

    def _timeout(self, context: StreamContext) -> None:
        seconds = self.settings.confirm_timeout
        self._apply(context, self.tracker.timeout(context.stream, seconds))

    def _apply(self, context: StreamContext, step: Step) -> None:
        if step is NOTHING:
            return
        for broken in step.broke:
            broken.tag = context
        check = context.stream.check
        if check is not None and check.held and not check.closed:
            # Waits for its requests' fates: closed by a later step.
            self._held.setdefault(context.stream.key, context)
        for gap in step.gaps:
            self.telemetry.gap(context, gap)
        for subscription, gap in step.lost_subscriptions:
            subscription.tag = context
            self.telemetry.subscription_lost(context, subscription, gap)
        if step.lost_subscriptions:
            self._deadlines.add(self.settings.confirm_timeout, self._subscriptions_due)
        if step.not_resumable:
            self.telemetry.not_resumable(context, awaiting=len(step.broke))
        if step.verdict is not None:
            self._deadlines.cancel(context.deadline)
            context.decided = time.monotonic()
            # Its calls still in flight, and those it handed out to their
            # fates in this same step.
            awaiting = (check.awaiting if check is not None else 0) + len(step.broke)
            self.telemetry.decided(context, step.verdict, awaiting)
        if step.final is not None:
            # The attempt is over: one outcome, with every gap it had.
            self.telemetry.finish(
                context, step.final, check.cursor.transport if check else None
            )
        verdict = step.verdict
        if (
            self.settings.enforce
            and verdict is not None
            and verdict.outcome in _REFUSED
            and check is not None
            and check.held
            and context.error is None
        ):
            # The requests this stream was to answer will not come: the
            # pending call fails now rather than at the caller's timeout.
            context.error = self._enforced(
                ResumptionGapError(
                    f"the resume was {verdict.outcome.value}: the requests in flight on the "
                    "broken stream will not be answered; re-initialize and re-issue them"
                )
            )
        if step.gaps and self.settings.enforce and context.error is None:
            context.error = enforcement_error(step.gaps)
            if context.stream.ended:
                # No read left to raise it into: the MCP SDK's reconnect
                # loop, if this task runs one, fails the request instead of
                # resuming again.
                self._enforced(context.error)
        self._fated(step, context)

    def _fated(self, step: Step, context: StreamContext | None = None) -> None:
        """Report the fates a step decided and the operations it ended, close
        the attempts that waited for them, and time the reissue windows it
        started; ``context``: the stream the step was observed on."""
        if self.tracker.operations_done:
            self._operations_ended()
        if step is NOTHING:
            return
        self.tracker.share_fates(step.fates)  # out of the shared in-flight ledger
        for decided in step.fates:
            # A lost request is a gap of the attempt that waited for it, if any.
            holder = decided.broken.holder
            attempt = self._held.get(holder.key) if holder is not None else None
            if attempt is None and context is not None and context.stream is holder:
                attempt = context
            self.telemetry.fate(decided.broken.tag, decided, attempt)
        for stream, final in step.closed:
            held = self._held.pop(stream.key, None)
            if held is None and context is not None and context.stream is stream:
                held = context  # closed by the step that made it wait
            if held is not None:
                check = stream.check
                self.telemetry.finish(held, final, check.cursor.transport if check else None)
        if step.window:
            self._deadlines.add(self.settings.confirm_timeout, self._fates_due)

    def _operations_ended(self) -> None:
        for method, key, facts, error in self.tracker.take_operations():
            self.telemetry.operation(method, key, facts, error)

    def _fates_due(self) -> None:
        self._fated(self.tracker.fates_due(self.settings.confirm_timeout))

    def _subscriptions_due(self) -> None:
        due = self.tracker.subscriptions_due(self.settings.confirm_timeout)
        for subscription in (*self.tracker.take_overflow(), *due):
            self.telemetry.count_lost_subscription(subscription)

    def _report_ran_twice(self) -> None:
        for broken in self.tracker.take_ran_twice():
            self.telemetry.ran_twice(broken.tag, broken)

    def stop_waiting(self, why: str) -> None:
        """The client stops waiting for every broken request (the process
        exits, the instrumentation is removed): they are lost, and the
        subscriptions still open with them, counted before the providers
        flush."""
        step = self.tracker.all_lost(why)
        for subscription, gap in step.lost_subscriptions:
            context = self._context_of(subscription)
            if context is not None:
                subscription.tag = context
                self.telemetry.subscription_lost(context, subscription, gap)
        self._fated(step)
        self._report_ran_twice()
        for subscription in (*self.tracker.take_overflow(), *self.tracker.all_subscriptions_due()):
            self.telemetry.count_lost_subscription(subscription)
        # The shared state's last writes (bounded): a clean exit takes its
        # requests out of the in-flight ledger, as it counted them itself.
        self.tracker.store.close()

    def _context_of(self, subscription: Any) -> StreamContext | None:
        """The context of the open stream that carries ``subscription``."""
        for context in list(self.streams.values()):
            stream = context.stream
            if (
                stream is not None
                and stream.server == subscription.server
                and subscription.key in stream.carries
            ):
                return context
        return None
