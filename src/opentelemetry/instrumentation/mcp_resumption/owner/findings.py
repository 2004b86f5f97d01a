# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What the rules found, handed out: each step the tracker returns (gaps,
verdicts, the final outcome, requests broken and their fates, lost
subscriptions, attempts closed) reported to the telemetry sink, turned into
the error enforce mode raises, and the windows it opens timed.

A part of :class:`~.monitor.ResumptionMonitor` (its base :class:`Findings`),
apart to be read alone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import ResumeCursorRaceError, ResumptionGapError
from ..rules.continuity import Gap, GapKind, Outcome
from ..rules.fates import Fate
from ..tracking.tracker import NOTHING, Step

if TYPE_CHECKING:  # annotations only
    from .. import config
    from ..telemetry.facts import StreamContext
    from ..telemetry.sink import TelemetrySink
    from ..tracking.tracker import Tracker
    from .deadlines import Deadlines

__all__ = ["Findings", "enforcement_error"]

# Outcomes of a resume that could not bring any answer.
_REFUSED = (Outcome.REJECTED, Outcome.FAILED)


def enforcement_error(gaps: tuple[Gap, ...]) -> ResumptionGapError:
    message = "; ".join(gap.message for gap in gaps)
    if any(gap.kind is GapKind.DRAIN_RACE for gap in gaps):
        return ResumeCursorRaceError(message)
    return ResumptionGapError(message)


class Findings:
    """Reports what each step of the tracker found, and raises it in enforce
    mode (through ``_enforced``, ``channels``); ended operations go to the
    monitor's ``_operations_ended``."""

    # The owner's: its settings, tracker, telemetry sink and timer, and the
    # attempts held open for their lineage or their requests' fates (stream
    # key -> the context of the stream that ended).
    settings: config.Settings
    tracker: Tracker
    telemetry: TelemetrySink
    _deadlines: Deadlines
    _held: dict[int, StreamContext]
    # (And the tasks' room, ``task_reports.TaskReports.task_call_lost``: a
    # lost call that was a task's handle.)

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
            if decided.fate is Fate.LOST and self.task_call_lost(decided):
                continue  # a task's handle lost (task_reports), no plain lost call
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
    def _fates_due(self) -> None:
        self._fated(self.tracker.fates_due(self.settings.confirm_timeout))

    def _subscriptions_due(self) -> None:
        due = self.tracker.subscriptions_due(self.settings.confirm_timeout)
        for subscription in (*self.tracker.take_overflow(), *due):
            self.telemetry.count_lost_subscription(subscription)

    def _report_ran_twice(self) -> None:
        for broken in self.tracker.take_ran_twice():
            self.telemetry.ran_twice(broken.tag, broken)
