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

This module holds the owner (what it makes, its lifecycle) and the request's
side: a request sent, its answer, the stream's context opened, a JSON answer
and the operations it ends.  The rest of the one object is in its bases, one
module each, to be read alone: ``stream_reports`` (a stream's events, reads
and end), ``hops`` (a resume's answer parked until the client follows it),
``findings`` (what the rules found, reported and enforced), ``at_exit``
(what is still awaited when the client stops waiting) and ``channels``
(what the patches share).

Imports go one way (tests/test_layering.py): the patches know the monitor
by its type only, the monitor imports the tracker and rules, and the
telemetry sink, redaction and timer it drives; none of those imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from opentelemetry import metrics, trace

from .. import config
from ..forks import renew_after_fork
from ..rules.jsonrpc import EVENTS_STREAM, LISTEN, TOOLS_LIST, answer_errors
from ..shared.redis_state import state_store
from ..telemetry import semconv as sc
from ..telemetry.facts import RequestFacts, ResumeStart, StreamContext, transport_of
from ..telemetry.redaction import Redaction
from ..telemetry.sink import TelemetrySink
from ..tracking.tracker import Step, Tracker, bounded_id
from .at_exit import AtExit
from .channels import PatchChannels
from .deadlines import Deadlines
from .deferral import Deferred
from .event_reports import EventReports, follows_events
from .findings import Findings
from .hops import Hops, _Hop
from .stream_reports import StreamReports
from .task_reports import TASK_MARKERS, TaskReports, follows_tasks

# A body with none of these is followed by neither ledger (``follows_tasks``
# and ``follows_events`` both False): four byte searches, no call, for most
# requests.  The markers holding ``task`` are searched for as that (three in
# one), the others as they are; the events' marker is ``follows_events``'s.
# ``bytes.find``, not a regular expression of the markers (1.9 µs a body, 5
# times the searches) nor ``in`` (twice ``find``'s cost on 3.11, 7 times on
# 3.13).
_FOLLOWED = tuple(
    dict.fromkeys(
        b"task" if b"task" in marker else marker for marker in (*TASK_MARKERS, b'"events/')
    )
)


class ResumptionMonitor(
    StreamReports, Hops, Findings, AtExit, PatchChannels, TaskReports, EventReports
):
    """Runs the continuity checks for every MCP stream the patches observe.

    Not a span processor itself: :class:`~.processor.ContinuityProcessor` is
    this class with the span processor's face, which is what the
    instrumentor makes and binds.  Its bases are its parts (see the module's
    docstring); no method is defined in two of them.
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
                lambda *handed: self.task_abandoned_elsewhere(*handed),
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
        Hops.__init__(self)
        PatchChannels.__init__(self)
        self._init_tasks(self.settings.max_streams)
        self._init_events()

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

    # ------------------------------------------------------ session-id policy

    def session_attribute(self, session_id: str | None) -> str | None:
        return self.redaction.session_attribute(session_id)

    def scrub(self, text: str, session_ids: Iterable[str | None]) -> str:
        return self.redaction.scrub(text, session_ids)

    # ------------------------------------------------------ the request's side

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
        body = facts.body
        if body is not None:
            for marker in _FOLLOWED:
                if body.find(marker) != -1:
                    if follows_tasks(body):
                        self.tasks_sent(facts)
                    if follows_events(body):
                        self.events_sent(facts)
                    break
            session_id = facts.session_id or facts.legacy_session_id
            if facts.server in self.tracker.broken.awaited_servers:
                # Matched as it is sent: its answer may come after the window.
                step = self.tracker.reissued(
                    facts.server, session_id, facts.path, body, facts.protocol_version
                )
                self._fated(step)
            if body.find(b"notifications/cancelled") != -1:
                self.tracker.cancelling(facts.server, session_id, facts.path, body)
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
        if self._deferred.calls:  # a stream that ended in a finalizer, before this one opens
            self._deferred.run()
        if not (facts.mcp or response_session_id or response_mcp):
            if event_stream and facts.method == "GET" and status < 300:
                candidate = StreamContext(facts, None, sc.TRANSPORT_SSE)
                candidate.status = status
                return candidate
            return None
        # Each once: the first answer of a server, of any server (a set's
        # lookup here, no call, for every later request).
        if (facts.host, facts.port) not in self.telemetry.servers_seen:
            self.server_seen(facts.host, facts.port)
        if not self._fleet_swept:
            self.fleet_seen()
        if facts.tasks and status == 404 and facts.session_id:
            self.session_gone(facts)  # a 2025-11-25 server's tasks went with it
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
        if not self.enabled:
            return
        if facts.tasks:
            self.tasks_answered(facts, answer)
        if facts.events:
            self.events_answered(facts, answer)
        if body is None and not facts.requests:
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
        # A push stream (events/stream) carries no answer anyone awaits.
        carries = []
        for key, method in requests or ():  # a loop, not a comprehension: no frame
            if method != EVENTS_STREAM:
                carries.append(key)
        stream = self.tracker.open_stream(
            facts.server,
            transport,
            session_id=session_id,
            request_session_id=facts.session_id,
            last_event_id=facts.last_event_id,
            carries=carries,
            path=facts.path,
            body=body,
            sent=requests if requests != [] and event_stream else (),
            operation=facts if self.settings.operation_metric else None,  # (_timed)
        )
        if self._deferred.worker is None:  # its iterator may be finalised by the GC
            self._deferred.start()
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

    def _operations_ended(self) -> None:
        for method, key, facts, error in self.tracker.take_operations():
            self.telemetry.operation(method, key, facts, error)
