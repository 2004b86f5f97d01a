# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What a stream's reader reports to the owner: each event handed to the
application (one by one, or recorded in a feed), the application asking for
the next, a ``retry:``, and the stream's end, with what the end leaves held
for the lineage until the client resumes it or stops.

A part of :class:`~.monitor.ResumptionMonitor` (its base
:class:`StreamReports`), apart to be read alone; the request's side (a
request sent, its answer, the stream's context opened) is the monitor's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..telemetry.facts import legacy_session_from_endpoint
from ..telemetry.instruments import EVENTS_BATCH, EVENTS_BATCH_SECONDS
from ..tracking.tracker import NOTHING, Step
from .deferral import collecting, collecting_threads

if TYPE_CHECKING:  # annotations only
    import contextvars

    from .. import config
    from ..telemetry.facts import StreamContext
    from ..telemetry.sink import TelemetrySink
    from ..tracking.tracker import Tracker
    from .deadlines import Deadlines
    from .deferral import Deferred

__all__ = ["DEFAULT_RETRY_SECONDS", "StreamReports"]

# What the MCP SDKs wait before a reconnect when the server sent no retry:.
DEFAULT_RETRY_SECONDS = 1.0


class StreamReports:
    """Feeds a stream's events, reads and end to the tracker, and holds what
    its end leaves for the lineage.  What a step found goes to ``_apply``
    (``findings``), an error enforce mode raises through ``_enforced``
    (``channels``), ended operations to the monitor's ``_operations_ended``."""

    # The owner's: whether the checks run, its settings, tracker, telemetry
    # sink, timer and deferred reports, the attempts held open for their
    # lineage, and the running task's reconnect loop's list of lineages.
    enabled: bool
    settings: config.Settings
    tracker: Tracker
    telemetry: TelemetrySink
    _deadlines: Deadlines
    _deferred: Deferred
    _held: dict[int, StreamContext]
    lineage_scope: contextvars.ContextVar[list[Any] | None]
    # (And the tasks' room, ``task_reports.TaskReports.tasks_answered``:
    # an answer on a task request's stream; and the events' room,
    # ``event_reports.EventReports``: an events/* answer, a push stream's
    # feed and end.)

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
        if context.facts.tasks:
            self.tasks_answered(context.facts, data)
        if context.facts.events:
            self.events_answered(context.facts, data)
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
        if context.facts.events:
            self.events_stream_fed(context, feed)
        self.telemetry.event_totals.watch(context)

    def feed_event(self, context: StreamContext, feed: Any, sse: Any) -> None:
        """One event of a fed stream that a rule must see now; ``event`` for
        a fed stream."""
        if context.error is not None:
            raise self._enforced(context.error)
        if not self.enabled:
            return
        if context.facts.tasks:
            self.tasks_answered(context.facts, sse.data)
        if context.facts.events:
            self.events_answered(context.facts, sse.data)
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
        stream = context.stream
        if stream is None:
            return  # a candidate never promoted: not MCP, nothing to report
        if (
            stream.ended
            and stream.check is None
            and not context.facts.events
            and not self.tracker.store.shared
        ):
            # Told already: the response's close, then its loop's own end (the
            # MCP SDKs close a POST's response, then its iterator).  The
            # tracker finds nothing at a second end of a stream that is no
            # resume (with shared state it hands the store what this end
            # says: that path stays); only events the iterator still handed
            # out after the close are left to count.
            feed = context.feed
            if context.uncounted or (feed is not None and feed.count() != feed.counted):
                self.telemetry.count_events(context)
            return
        if collecting_threads and collecting():
            # An iterator finalised by the GC, maybe at an allocation made while
            # this thread holds the tracker's or the SDK's lock: report later.
            self._deferred.put(self._ended, context, reason, closed_by_client, clean)
            return
        # The events not yet in the totals, into them, and the feed no longer
        # watched (``TelemetrySink.count_events``, written out: every stream
        # ends here).
        self.telemetry.event_totals.count(context, context.uncounted, context.feed is not None)
        context.uncounted = 0
        context.counted_at = time.monotonic()
        if context.deadline is not None:
            self._deadlines.cancel(context.deadline)
        held_open = bool(context.started) and (
            time.monotonic() - context.started >= self.settings.confirm_timeout
        )
        step = self.tracker.stream_ended(
            context.stream, reason, closed_by_client=closed_by_client, clean=clean,
            held_open=held_open,
        )
        if step is not NOTHING:
            self._settle_end(context, step)
        if context.facts.events:
            self.events_stream_ended(context, closed_by_client)
        if self.tracker.operations_done:
            self._operations_ended()
        if self.tracker.ran_twice_found:
            self._report_ran_twice()

    def _ended(
        self, context: StreamContext, reason: str, closed_by_client: bool, clean: bool
    ) -> None:
        """An end reported during a garbage collection, made later (from
        ``Deferred.run``, where nothing collects)."""
        self.ended(context, reason, closed_by_client=closed_by_client, clean=clean)

    def _settle_end(self, context: StreamContext, step: Step) -> None:
        """Apply what a stream's end found.  Requests still pending go on with
        the lineage: a client that does not resume it within the retry it was
        asked for and the confirmation window has stopped resuming them, and
        they are orphaned then (the ended attempt closes with them)."""
        if step is NOTHING:
            return
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
