# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""``ResumeCheck``: one resume attempt's verdict, from its answer, its events
and its end, fed in the order things happen.

Pure: standard library only.  The check decides nothing itself: it asks the
rules of ``continuity`` (called through that module, so that each rule is
the one function every caller uses) and keeps what they find until the
attempt is over.  Its base :class:`_AwaitedAnswers` is the part that tracks
the requests the resumed stream was to answer.  The terms (cursor, first
event, marker, poll, orphaned, duplicate) are defined in ``continuity``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from . import continuity
from .continuity import Cursor, Gap, ObservedEvent, Outcome, ReplayContract, Verdict, reuses_id
from .event_ids import EventId, compare_event_ids

__all__ = ["ResumeCheck"]

# Outcomes that say how the attempt ended before any replay: kept whatever
# gaps (lost requests) the attempt then has.
_TERMINAL = (Outcome.REJECTED, Outcome.FAILED)


@dataclass
class _LostOrPending:
    method: str
    event_id: EventId | None  # the unconsumed event that carried its response, if any


class _AwaitedAnswers:
    """What one resume attempt was to answer: the requests whose responses
    must come on the resumed stream, settled as they come, handed out as
    orphans when they no longer can, or handed back to the lineage at the
    stream's end.  A part of :class:`ResumeCheck` (its base), apart to be
    read alone; not a check of its own."""

    # Set by ResumeCheck: the cursor, whether the stream is a replacement,
    # whether the cursor event was sent again, the gaps, and its closing.
    cursor: Cursor
    gaps: list[Gap]
    _replaced: bool
    _cursor_redelivered: bool

    def __init__(
        self,
        pending: Mapping[str, str] | None,
        unconsumed_responses: Mapping[str, tuple[str, EventId | None]] | None,
        sent_by_session: Callable[[str], bool] | None,
    ) -> None:
        # request id -> method: requests whose response must come on this stream
        self._pending: dict[str, _LostOrPending] = {
            rid: _LostOrPending(method, None) for rid, method in (pending or {}).items()
        }
        for rid, (method, event_id) in (unconsumed_responses or {}).items():
            self._pending[rid] = _LostOrPending(method, event_id)
        self._sent_by_session = sent_by_session
        # Requests were handed to the lineage at the stream's end, or out as
        # orphans awaiting their fate: the attempt closes when the lineage
        # goes on or ends and the fates are known (``lineage_over``).
        self.held = False
        # request id -> (method, why): requests this attempt can no longer
        # bring the answer to; their fate decides whether they are gaps.
        self.orphans: dict[str, tuple[str, str]] = {}
        # An event that may have answered requests could not be read: no
        # pending request can be proven orphaned any more.
        self._ledger_unknown = False

    @property
    def awaiting(self) -> int:
        """Calls this attempt was to answer that are neither answered nor
        decided yet: what its verdict cannot yet count as lost or not."""
        return len(self._pending) + len(self.orphans)

    def take_orphans(self) -> dict[str, tuple[str, str]]:
        """The requests this attempt handed out as orphans since the last
        call (request id -> (method, why)), for their fates to decide."""
        orphans, self.orphans = self.orphans, {}
        return orphans

    def release(self) -> dict[str, str]:
        """The requests still pending when the stream ended (request id ->
        method), handed back to the lineage: answered by a later resume, or
        orphaned when the lineage ends.  The attempt stays open until then
        (:meth:`lineage_over`): an orphan is this attempt's gap."""
        if self._replaced:
            return {}
        held = {rid: entry.method for rid, entry in self._pending.items()}
        self._pending.clear()
        self.held = self.held or bool(held)
        self._close()
        return held

    def lineage_over(self, orphans: Iterable[Gap] = ()) -> None:
        """The lineage this attempt handed its requests to went on (a later
        resume holds them now) or ended, with ``orphans`` lost."""
        if not self.held:
            return
        self.held = False
        self.gaps.extend(orphans)
        self._close()

    def _settle_unconsumed(self, first: ObservedEvent) -> list[Gap]:
        """Responses that sat in received-but-unconsumed events: redelivered,
        or lost for good because the replay starts after them."""
        found: list[Gap] = []
        for rid, entry in list(self._pending.items()):
            if entry.event_id is None:
                continue
            order = compare_event_ids(entry.event_id, self.cursor.event_id)
            resent = (first.event_id is not None and first.event_id.raw == entry.event_id.raw) or (
                self._cursor_redelivered and entry.event_id.raw == self.cursor.event_id.raw
            )
            if order == -1 or (order == 0 and not resent):
                del self._pending[rid]
                why = f"its response was in {entry.event_id}, not replayed"
                self.orphans[rid] = (entry.method, why)
                self.held = True
            else:
                entry.event_id = None  # will be replayed; wait for it
        return found

    def _responses(self, event: ObservedEvent) -> list[Gap]:
        found: list[Gap] = []
        if event.unreadable:
            self._ledger_unknown = True
            self._pending.clear()
        for rid in event.response_ids:
            if self._pending.pop(rid, None) is not None:
                continue
            if self._sent_by_session is not None:
                gap = continuity.foreign_replay_rule(rid, self._sent_by_session)
                if gap is not None:
                    found.append(gap)
        return found

    def _orphan_all(self, why: str) -> list[Gap]:
        """Hand every pending request out as an orphan (see ``take_orphans``):
        no gap yet, their fates decide."""
        if not self._ledger_unknown:
            for rid, entry in self._pending.items():
                self.orphans[rid] = (entry.method, why)
            self.held = self.held or bool(self._pending)
        self._pending.clear()
        return []

    def _close(self) -> None:
        raise NotImplementedError  # ResumeCheck's


class ResumeCheck(_AwaitedAnswers):
    """Runs the rules over one resume attempt, fed in the order things happen.

    Not thread-safe on its own: the tracker calls it under its lock.  Every
    ``on_*`` method returns the gaps it newly found.  :attr:`verdict` is set
    at the first decisive fact (what enforce mode acts on); gaps found later
    on the same stream (a reused id, a foreign response, an orphan seen at
    the stream's end) are returned as they are found.  The attempt is
    :attr:`closed` once nothing it still waits for can show a gap: the stream
    ended, or its pending requests are answered and ``watch`` more events
    passed; :attr:`final` is
    then its one verdict, every gap included, and the check stops looking:
    an attempt with a gap is never ``resumed``.
    """

    def __init__(
        self,
        cursor: Cursor,
        contract: ReplayContract = ReplayContract.EXCLUSIVE,
        *,
        seen: Mapping[str, int | None] | None = None,
        pending: Mapping[str, str] | None = None,
        unconsumed_responses: Mapping[str, tuple[str, EventId | None]] | None = None,
        sent_by_session: Callable[[str], bool] | None = None,
        poll: bool = False,
        watch: int = 32,
    ) -> None:
        self.cursor = cursor
        # Events the check keeps looking at after its verdict, for a reused id
        # or a foreign response, once nothing is pending: as many as the seen
        # window it compares with holds, after which no earlier id is left.
        self._watch = watch
        self._after_verdict = 0
        self.contract = contract
        # The server closed the stream this resumes on purpose: silence is
        # not evidence, so the confirmation window does not apply.
        self.poll = poll
        self._seen = seen if seen is not None else {}
        super().__init__(pending, unconsumed_responses, sent_by_session)
        self.response_session_id: str | None = None
        self.verdict: Verdict | None = None
        self.final: Verdict | None = None
        self.closed = False
        self.gaps: list[Gap] = []
        self.delivered = 0
        self.first_event_id: str | None = None
        self._session_changed: Gap | None = None
        self._replaced = False
        self._ended = False
        # Events sent again unchanged before the first new one (at-least-once
        # delivery), and whether the cursor event was among them.
        self._duplicates = 0
        self._cursor_redelivered = False

    # -- facts, in wire order

    def on_response(self, status: int, session_id: str | None) -> list[Gap]:
        self.response_session_id = session_id
        if status >= 400:
            self._orphan_all(f"the resume was answered {status}")
            self._decide(Outcome.REJECTED, [])
            return []
        self._session_changed = continuity.session_changed_rule(self.cursor, session_id)
        return []

    def on_failure(self, error_type: str) -> list[Gap]:
        """The resume got no HTTP answer (``error_type``: what the client raised)."""
        if self.verdict is not None:
            return []
        self._orphan_all(f"the resume got no answer ({error_type})")
        self._ended = True
        self._decide(Outcome.FAILED, [])
        return []

    @property
    def replaced(self) -> bool:
        """The resumed stream is not the one that broke (a new session or a
        reset counter)."""
        return self._replaced

    def on_event(self, event: ObservedEvent) -> list[Gap]:
        if self._ended or self.closed:
            return []
        self.delivered += 1
        found: list[Gap] = []
        if self.verdict is None:
            if self._is_duplicate(event):
                self._duplicates += 1
                return self._responses(event)
            found.extend(self._first_event(event))
        else:
            found.extend(self._later_event(event))
        return found

    def event_matters(self, event_id: str | None, digest: int, has_responses: bool) -> bool:
        """Whether an event can still decide or show anything: every event
        before the verdict; after it, only a response (answered, or foreign)
        or an id this session saw with other data.  Lets the caller skip
        building the event for the rest of a long resumed stream.  Counts
        the events after the verdict, and says yes to the one that lets the
        attempt close (see ``watch``)."""
        if self._ended or self._replaced or self.closed:
            return False
        if self.verdict is None:
            return True
        self._after_verdict += 1
        # What the rules of a later event look at (``_later_event``): its
        # responses, and a reused id.
        if has_responses:
            return True
        if event_id is not None and reuses_id(self._seen, event_id, digest):
            return True
        return not self._pending and self._after_verdict >= self._watch

    def on_end(
        self, reason: str, *, closed_by_client: bool = False, server_closed: bool = False
    ) -> list[Gap]:
        """The stream ended (``reason`` says how) or the client closed it.
        ``server_closed``: the server held it open and then ended it on
        purpose (a clean end of a polling lineage, after the confirmation
        window), so an empty stream is a poll that found nothing new.  An
        empty stream ended sooner is seed 000's empty replay.

        Requests still pending are not orphaned here: the client may resume
        the lineage again (polling does, every time).  They stay for
        :meth:`release`; the caller orphans them when the lineage ends."""
        if self._ended:
            return []
        self._ended = True
        if self.closed:
            return []
        found: list[Gap] = []
        if self.verdict is None:
            if closed_by_client and self._session_changed is not None and not self.delivered:
                # The fail-closed path: the client saw the new session id and
                # walked away before applying anything.
                self._decide(Outcome.REINITIALIZED, [])
                return []
            if self._session_changed is not None:
                found.append(self._session_changed)
                found.extend(self._orphan_all("the session changed"))
            if not server_closed:
                unconfirmed = continuity.replay_unconfirmed_rule(self.delivered, reason)
                if unconfirmed is not None:
                    found.append(unconfirmed)
            self._decide(Outcome.UNVERIFIABLE, found)
            return found
        self._close()
        return found

    def on_timeout(self, seconds: float) -> list[Gap]:
        """The confirmation window passed with the stream still open.  On a
        poll silence is not evidence: nothing is decided."""
        if self.verdict is not None or self._ended or self.poll:
            return []
        found: list[Gap] = []
        if self._session_changed is not None:
            found.append(self._session_changed)
            found.extend(self._orphan_all("the session changed"))
        unconfirmed = continuity.replay_unconfirmed_rule(
            self.delivered, f"the {seconds:g} s confirmation window passed"
        )
        if unconfirmed is not None:
            found.append(unconfirmed)
        self._decide(Outcome.UNVERIFIABLE, found)
        return found

    # -- internals

    def _is_duplicate(self, event: ObservedEvent) -> bool:
        """An event at or before the cursor that this session already saw with
        the same content: at-least-once redelivery, not the replay's start.
        The cursor event itself counts only after an earlier duplicate; sent
        first, it is the inclusive contract's re-send, which the contract
        rule judges."""
        if event.is_marker or event.event_id is None or self._session_changed is not None:
            return False
        raw = event.event_id.raw
        if raw not in self._seen or self._seen[raw] != event.digest:
            return False
        cursor = self.cursor.event_id.raw
        if raw == cursor:
            if self._duplicates:
                self._cursor_redelivered = True
                return True
            return False
        order = compare_event_ids(event.event_id, self.cursor.event_id)
        if order is not None:
            return order == -1
        for seen in self._seen:  # oldest first: opaque ids order by arrival
            if seen == raw:
                return cursor in self._seen
            if seen == cursor:
                return False
        return False

    def _first_event(self, first: ObservedEvent) -> list[Gap]:
        self.first_event_id = first.event_id.raw if first.event_id else None
        found: list[Gap] = []
        if self._session_changed is not None:
            found.append(self._session_changed)
        regression = continuity.id_regression_rule(self.cursor, first)
        if regression is not None:
            found.append(regression)
        # A new session or a reset counter means this is not the stream that
        # broke: nothing it sends can answer what was pending there.
        self._replaced = replaced = bool(found)
        # Checks below compare against this session's history, so they apply
        # only while the stream kept its session and counter.
        reused = None if replaced else continuity.id_reused_rule(self._seen, first)
        if reused is not None:
            found.append(reused)
        if not found:
            # Only a stream that kept its session and its counter can be
            # judged against the contract and the drain race.
            redelivered = self._cursor_redelivered
            for gap in (
                continuity.replay_contract_rule(
                    self.cursor, first, self.contract, redelivered=redelivered
                ),
                continuity.drain_race_rule(self.cursor, first, redelivered=redelivered),
            ):
                if gap is not None:
                    found.append(gap)
        if replaced:
            found.extend(self._orphan_all("the resumed stream is not the one that broke"))
        else:
            found.extend(self._settle_unconsumed(first))
            found.extend(self._responses(first))

        if found:
            outcome = Outcome.GAP
        elif not self.cursor.known:
            outcome = Outcome.UNVERIFIABLE  # nothing to bind the cursor to
        elif first.is_marker:
            outcome = Outcome.CAUGHT_UP
        elif first.event_id is None:
            outcome = Outcome.UNVERIFIABLE
        else:
            order = compare_event_ids(first.event_id, self.cursor.event_id)
            follows = first.event_id.raw == self.cursor.event_id.successor
            outcome = Outcome.RESUMED if order is not None or follows else Outcome.UNVERIFIABLE
        self._decide(outcome, found)
        return found

    def _later_event(self, event: ObservedEvent) -> list[Gap]:
        if self._replaced:
            self._close()
            return []
        found: list[Gap] = []
        reused = continuity.id_reused_rule(self._seen, event)
        if reused is not None:
            found.append(reused)
        found.extend(self._responses(event))
        self.gaps.extend(found)
        self._close()
        return found

    def _decide(self, outcome: Outcome, found: Iterable[Gap]) -> None:
        self.gaps.extend(found)
        if self.gaps and outcome not in _TERMINAL:
            outcome = Outcome.GAP
        self.verdict = Verdict(outcome, tuple(self.gaps), self.first_event_id, self.delivered)
        self._close()

    def _close(self) -> None:
        """Close the attempt once it is decided and waits for nothing more:
        no pending request whose answer could still come (or fail to), or
        the stream has ended."""
        verdict = self.verdict
        if self.closed or verdict is None or self.held:
            return
        if self._ended and self._pending and not self._replaced:
            return  # about to be handed to the lineage (release)
        if not (self._ended or self._replaced) and (
            self._pending or self._after_verdict < self._watch
        ):
            return
        self.closed = True
        outcome = (
            Outcome.GAP if self.gaps and verdict.outcome not in _TERMINAL else verdict.outcome
        )
        self.final = Verdict(
            outcome, tuple(self.gaps), verdict.first_event_id, verdict.replayed_events
        )
