# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What a stream's end breaks, handed to the ledgers that wait for fates.

Pure: standard library only, and not thread-safe on its own (the tracker
calls it under its lock).  ``Breaks`` turns the facts the tracker sees into
entries of the two ledgers and back into ``Step``s:

* a stream that ended without the answers it was to carry, a lineage the
  client did not resume, a resume that can no longer bring an answer: the
  requests are broken, entered in ``fates.BrokenLedger``;
* a ``subscriptions/listen`` stream that ended without its result: lost,
  entered in ``subscriptions.SubscriptionLedger``;
* fates decided there: each settles its request and its operation, and
  closes the resume attempt that waited for it once it waits for none more.

What a fate is, and when each is decided, is ``fates``'s; what a resume
concludes, ``continuity``'s.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from ..rules import continuity
from ..rules.continuity import Gap, Verdict
from ..rules.fates import Broken, BrokenLedger, Decided
from ..rules.jsonrpc import LISTEN, calls_in
from ..rules.subscriptions import LostSubscription, SubscriptionLedger
from .records import NOTHING, SSE, Session, Step, Stream
from .requests import Requests

__all__ = ["Breaks"]


class Breaks:
    """The hand-offs between the tracked streams and the fates' ledgers."""

    def __init__(self, requests: Requests, subscriptions: SubscriptionLedger) -> None:
        # Broken requests awaiting their fate (see ``fates``).
        self.broken = BrokenLedger()
        # Lost subscriptions awaiting a re-listen (see ``subscriptions``).
        self.subscriptions = subscriptions
        # Their fates end the operations of broken requests.
        self.requests = requests
        # Lost subscriptions counted before their window (a full ledger),
        # until the caller takes them.
        self.ran_over: list[LostSubscription] = []

    def all_lost(
        self,
        streams: Iterable[Stream],
        why: str,
        elsewhere: frozenset[tuple[int, str]] = frozenset(),
    ) -> Step:
        """The client stops waiting for everything (the process exits): its
        broken requests are lost, and so are the subscriptions still open."""
        lost: list[tuple[LostSubscription, Gap | None]] = []
        for stream in list(streams):
            pending = stream.session.pending
            if stream.ended or not pending or not stream.carries:
                continue
            listens = [key for key in stream.carries if pending.get(key, ("",))[0] == LISTEN]
            if listens:
                body, stream.request_body = stream.request_body, None
                lost += self.subscriptions_lost(stream, listens, body, why)
        step = self.fated(self.broken.all_lost(why, elsewhere))
        if not lost:
            return step
        return replace(step, lost_subscriptions=(*step.lost_subscriptions, *lost))

    def subscriptions_lost(
        self, stream: Stream, keys: list[str], body: bytes | None, why: str
    ) -> list[tuple[LostSubscription, Gap | None]]:
        """The subscriptions ``keys`` of ``stream`` are lost: out of the
        session's requests, into the ledger that waits for a re-listen."""
        filters = {call.key: call.listen for call in calls_in(body)} if body else {}
        stream.session.answered(keys)
        now = time.monotonic()
        lost = []
        for key in keys:
            notifications = filters.get(key) or "none"
            subscription = LostSubscription(
                key, stream.server, stream.transport, notifications, now, why
            )
            # Full: the oldest are counted at once, as if their window passed.
            self.ran_over.extend(self.subscriptions.lost(subscription))
            # Through the module: the rules can be swapped there (the mutation tests).
            lost.append((subscription, continuity.subscription_lost_rule(key, notifications, why)))
        return lost


    def session_closed(self, session: Session) -> Step:
        """The client ended ``session`` (HTTP DELETE): its broken requests
        are lost."""
        session.terminated = True
        if not self.broken:
            return NOTHING
        return self.fated(self.broken.session_closed(session, "the session was closed"))

    def cancelling(self, session: Session, keys: Iterable[str]) -> None:
        """The client cancels ``keys``: those not broken yet are no longer
        awaited (see ``Tracker.cancelling``)."""
        holders = session.holders or {}
        for request_key in keys:
            # Its stream ended before (a break, or a poll whose lineage
            # waits): the SDK's courtesy cancel after a failure.
            if self.broken.entry(session, request_key) is None and request_key not in holders:
                session.pending.pop(request_key, None)
        if not session.pending:
            session.pending = None

    def take_overflow(self) -> list[LostSubscription]:
        found, self.ran_over = self.ran_over, []
        return found

    def held_at_end(
        self, stream: Stream, held: dict[str, str], broke: bool
    ) -> tuple[list[Broken], list[Decided], bool]:
        """A resumed stream ended holding ``held`` (request key -> method),
        which its lineage may still resume: broken now if it ``broke``; and
        the orphans that waited for this stream (its answers could still
        come on it) wait no longer.  The requests newly broken, the fates
        that decided, and whether a reissue window started."""
        new: list[Broken] = []
        fates: list[Decided] = []
        if held and broke:
            for key, method in held.items():
                self.record_break(stream, key, method, None, new, fates)
        window = self.broken.stop_held(stream, time.monotonic()) if self.broken else False
        return new, fates, window

    def record_break(
        self,
        stream: Stream,
        key: str,
        method: str,
        call: int | None,
        new: list[Broken],
        fates: list[Decided],
        broke: bool = True,
        tool: str | None = None,
    ) -> None:
        session = stream.session
        if self.broken.entry(session, key) is not None:
            return  # broken before, on the stream this one resumed
        if session.fated is not None and key in session.fated:
            return  # decided while a resume held it: one fate
        broken = Broken(
            key, method, call, stream.server, session, stream.transport, broke=broke, tool=tool
        )
        fates.extend(self.broken.broke(broken))
        new.append(broken)

    @staticmethod
    def ended_locally(stream: Stream) -> None:
        pending = stream.session.pending or {}
        listens = [key for key in stream.carries if pending.get(key, ("",))[0] == LISTEN]
        if listens:
            stream.session.answered(listens)

    def broken_stream(
        self, stream: Stream, body: bytes | None, reason: str, poll: bool = False
    ) -> Step:
        """A stream that no resume checks ended by an error or EOF: the
        requests whose answers it was to carry are broken.  With no event id
        received nothing can resume it (``not_resumable``, and their reissue
        window starts); with one, its lineage waits for a resume.  ``poll``:
        the server closed it on purpose, which breaks nothing unless the
        client does not resume it (its lineage waits too)."""
        session = stream.session
        pending = session.pending
        if not pending or session.terminated:
            return NOTHING  # nothing awaited, or the client ended the session itself
        legacy = stream.transport == SSE
        # An answer the stream handed to the application came, taken or not.
        handed = stream.unconsumed_responses
        keys = [
            key
            for key, (_, lineage) in pending.items()
            if (lineage == stream.lineage or (legacy and lineage is None)) and key not in handed
        ]
        if not keys:
            return NOTHING
        lost: tuple[tuple[LostSubscription, Gap | None], ...] = ()
        listens = [key for key in keys if pending[key][0] == LISTEN]
        if listens and not poll:
            # Subscriptions, not calls: no fate, and nothing to resume.
            why = f"the stream ended without the server's result: {reason}"
            lost = tuple(self.subscriptions_lost(stream, listens, body, why))
            keys = [key for key in keys if key not in listens]
            if not keys:
                return Step(lost_subscriptions=lost)
        calls = {call.key: call for call in calls_in(body)} if body is not None else {}
        new: list[Broken] = []
        fates: list[Decided] = []
        for key in keys if not poll else ():
            call = calls.get(key)
            self.record_break(
                stream, key, pending[key][0], call.digest if call else None, new, fates,
                tool=call.tool if call else None,
            )
        if stream.last_received is None and not poll:
            why = "nothing could resume the stream (it carried no event id)"
            window = self.broken.stop(session, keys, time.monotonic(), why, None)
            return Step(
                broke=tuple(new), fates=tuple(fates), window=window, not_resumable=True,
                lost_subscriptions=lost,
            )
        if session.holders is None:
            session.holders = {}
        for key in keys:
            session.holders[key] = stream.key
        return Step(broke=tuple(new), fates=tuple(fates), held=True, lost_subscriptions=lost)

    def lineage_ended(self, stream: Stream, why: str) -> Step:
        """The client did not resume ``stream`` (a resumed stream that ended
        holding requests): they are orphaned now.  Nothing if a later stream
        resumed it, which then holds them."""
        session = stream.session
        holders = session.holders
        if stream.resumed_again or not holders:
            return NOTHING
        pending = session.pending or {}
        keys: list[str] = []
        new: list[Broken] = []
        fates: list[Decided] = []
        for key, holder in list(holders.items()):
            if holder != stream.key:
                continue
            del holders[key]
            entry = pending.pop(key, None)
            if entry is not None:  # else answered, or taken by a later resume
                keys.append(key)
                # Not broken before: a poll the client did not resume.
                self.record_break(stream, key, entry[0], None, new, fates)
        if not pending:
            session.pending = None
        if not holders:
            session.holders = None
        check = stream.check
        attempt = stream if check is not None and check.held else None
        window = self.broken.stop(session, keys, time.monotonic(), why, attempt)
        final = None
        if attempt is not None and not self.broken.holds(attempt):
            final = self.lineage_over(stream, [])
        if not keys and final is None:
            return NOTHING
        return Step(
            broke=tuple(new),
            fates=tuple(fates),
            window=window,
            final=final,
            # A break nothing tried to resume.
            not_resumable=check is None and bool(keys),
        )

    @staticmethod
    def lineage_over(stream: Stream, orphans: list[Gap]) -> Verdict | None:
        """Close the attempt of ``stream`` that held its lineage's requests;
        its final verdict, if this closed it."""
        check = stream.check
        if check is None or not check.held:
            return None
        check.lineage_over(orphans)
        return check.final

    def orphaned(
        self,
        stream: Stream,
        orphans: dict[str, tuple[str, str]],
        new: list[Broken],
        fates: list[Decided],
    ) -> bool:
        """Requests the resume of ``stream`` can no longer bring the answer
        to: broken, and their attempt waits for their fates.  A stream that
        replaced the one that broke under the same session (a reset counter)
        may still carry their answers: their window starts at its end."""
        session = stream.session
        now = time.monotonic()
        wait = stream.check.replaced and not stream.ended
        window = False
        for key, (method, why) in orphans.items():
            self.record_break(stream, key, method, None, new, fates, broke=False)
            broken = self.broken.entry(session, key)
            if broken is None:
                continue
            broken.holder = stream
            broken.why = why
            if not wait:
                window = self.broken.stop(session, (key,), now, why, stream) or window
        return window

    def fated(self, fates: list[Decided], step: Step = NOTHING) -> Step:
        """``step`` with these fates; a lost request is a gap of the attempt
        that waited for it, which closes once it waits for no fate more."""
        if not fates:
            return step
        closed = []
        holders: dict[int, Stream] = {}
        for decided in fates:
            # Settled: no later end of its lineage may record it again.
            decided.broken.session.settled(decided.broken.key)
            # Its operation, unless an answer read ended it, ends by its fate.
            self.requests.fated(decided)
            holder = decided.broken.holder
            if holder is None or holder.check is None:
                continue
            if decided.gap is not None:
                holder.check.gaps.append(decided.gap)
            holders[holder.key] = holder
        for holder in holders.values():
            if holder.session.holders and holder.key in holder.session.holders.values():
                continue  # still holding requests its lineage may resume
            if not self.broken.holds(holder):
                final = self.lineage_over(holder, [])
                if final is not None:
                    closed.append((holder, final))
        return Step(
            step.gaps,
            step.verdict,
            held=step.held,
            final=step.final,
            broke=step.broke,
            fates=(*step.fates, *fates),
            window=step.window,
            not_resumable=step.not_resumable,
            closed=(*step.closed, *closed),
            lost_subscriptions=step.lost_subscriptions,
        )
