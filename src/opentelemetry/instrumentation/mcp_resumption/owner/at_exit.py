# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What is still awaited when the client stops waiting (the process exits,
the instrumentation is removed): every broken request is lost, each
subscription still open is lost with the stream that carries it, and all of
it is counted before the providers flush.

A part of :class:`~.monitor.ResumptionMonitor` (its base :class:`AtExit`),
apart to be read alone; ``McpResumptionInstrumentor`` registers
``stop_waiting`` with ``atexit``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    import weakref

    from ..telemetry.facts import StreamContext
    from ..telemetry.sink import TelemetrySink
    from ..tracking.tracker import Tracker

__all__ = ["AtExit"]


class AtExit:
    """Settles every request and subscription still awaited; the fates it
    decides are reported as every step's are (``_fated``, ``findings``)."""

    # The owner's: its tracker and telemetry sink, and the responses being
    # read (response -> its stream context).
    tracker: Tracker
    telemetry: TelemetrySink
    streams: weakref.WeakKeyDictionary[Any, StreamContext]

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
        self.tasks_stop_waiting()  # every task not ended: abandoned
        self.events_stop_waiting()  # the last cursors, for the next process
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
