# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The continuity rules for a resumed MCP stream, and the words of their
verdicts.

Pure: standard library only, no OpenTelemetry, HTTP or MCP imports, so the
rules can be read, tested and reused alone.

A client that reconnects with ``Last-Event-ID`` and gets ``200 OK`` has no
proof that anything was replayed.  The rules below turn what the client saw
around a resume into a :class:`Verdict`: an outcome and every gap found, each
gap with what was expected, what was observed, and what to do about it.
Here: the vocabulary (:class:`GapKind`, :class:`Outcome`, :class:`Gap`,
:class:`Verdict`, the facts :class:`Cursor` and :class:`ObservedEvent`, the
errors the first seed's check raises), one ``*_rule`` function per gap kind,
and the first seed's :func:`verify_resumption`.  What an event id proves about order
is ``event_ids``; one resume attempt run through the rules, in the order
things happen, is ``resume_check.ResumeCheck``.  Every caller of a rule calls
it through this module (``continuity.<name>_rule``), so a rule is the one
function of its name here.

Definitions the rules share (they are the ground truth of the tests):

* The *cursor* is the ``Last-Event-ID`` the client presented, bound to the
  session id it was issued in, whether the application consumed that event,
  and the digest of its data.
* The *first event* is the first event the resumed stream delivers that is
  not a duplicate (below); the
  verdict is given there, at an error status, at the end of the stream, or
  when the confirmation window passes, whichever comes first.
* A *marker* is an event with empty data: a 2025-11-25 priming event (id and
  no data) or a heartbeat; the tracker also reads as one a keep-alive whose
  data is not a JSON-RPC message and whose id was seen with other data.  It
  says "nothing (more) to replay".
* A *poll* is a resume after the server closed the stream on purpose
  (protocol 2025-11-25: a priming event or ``retry:`` on the stream's lineage,
  then a clean end of the body).  Silence on a poll is not evidence: it waits
  for its first event, its end or the client walking away, never for the
  confirmation window.  A poll the server held open past the window and then
  closed with nothing is "nothing new yet"; one it ends sooner with nothing
  (the SDK servers' answer to a cursor they lost) is still seed 000's empty
  replay.  A resume after a broken connection (a read error, a body cut
  short) is not a poll and keeps the window.
* A request in flight is *orphaned* only when it is lost: its lineage ends
  (the client stops resuming it, a new session replaces it, the resume is
  refused or gets no answer) and then neither its answer nor a re-issue of
  it comes within the reissue window (``fates``).  The check
  (``resume_check``) hands such requests out (``ResumeCheck.take_orphans``)
  and stays open until their fates are known; the lost ones are its gaps.
  A resumed stream that ends hands its pending requests back to the lineage
  (``ResumeCheck.release``); the next resume of the lineage takes them.
* Event ids are opaque strings.  Integers and a fixed prefix plus a counter
  (``e-104``, ``s-77:e-104``, ``<stream>_<n>``) order within one prefix, once
  the session's history shows the scheme counting
  (:func:`~.event_ids.corroborated`);
  anything else (UUIDs, hex tails, decimal fractions, timestamps) is opaque
  and gives no ordering evidence, so where ordering would decide, the
  outcome is ``unverifiable`` rather than a guess.
* A *duplicate* is an event the session already saw, with the same content,
  at or before the cursor: at-least-once redelivery, skipped until the first
  new event, never a regression or a reuse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from ..errors import ResumptionGapError
from .event_ids import MAX_COUNTER_DIGITS, EventId, compare_event_ids, parse_event_id

__all__ = [
    "Cursor",
    "Gap",
    "GapKind",
    "ObservedEvent",
    "Outcome",
    "ReplayContract",
    "StreamCursor",
    "Verdict",
    "verify_resumption",
]


class GapKind(str, Enum):
    SESSION_CHANGED = "session_changed"
    ID_REGRESSION = "id_regression"
    REPLAY_UNCONFIRMED = "replay_unconfirmed"
    ID_REUSED = "id_reused"
    DRAIN_RACE = "drain_race"
    REPLAY_CONTRACT_VIOLATION = "replay_contract_violation"
    ORPHANED_REQUEST = "orphaned_request"
    FOREIGN_REPLAY = "foreign_replay"
    SUBSCRIPTION_LOST = "subscription_lost"


class Outcome(str, Enum):
    RESUMED = "resumed"
    CAUGHT_UP = "caught_up"
    GAP = "gap"
    REINITIALIZED = "reinitialized"
    REJECTED = "rejected"
    UNVERIFIABLE = "unverifiable"
    # A resume that got no HTTP answer (refused, reset, timed out).
    FAILED = "failed"
    # A stream broke with requests in flight and the client had nothing to
    # resume it with (no event id on it, a protocol without resumption), or
    # did not try.
    NOT_RESUMABLE = "not_resumable"


class ReplayContract(str, Enum):
    """What the server replays after ``Last-Event-ID: c``."""

    EXCLUSIVE = "exclusive"  # events with id > c (the MCP SDKs' EventStore contract)
    INCLUSIVE = "inclusive"  # events with id >= c: the cursor event is sent again


# ------------------------------------------------------------------ facts


@dataclass(frozen=True)
class Cursor:
    """The ``Last-Event-ID`` a client presented, with what was known of it."""

    event_id: EventId
    session_id: str | None = None  # the session it was issued in; None: unknown
    known: bool = False  # the event was seen on a tracked stream
    consumed: bool = True  # the application took the event before the break
    digest: int | None = None  # digest of the event's data
    meaning: int | None = None  # digest of its JSON meaning, where computed
    transport: str | None = None  # transport of the stream that issued it


@dataclass(frozen=True)
class ObservedEvent:
    """One event of the resumed stream, as delivered to the application."""

    event_id: EventId | None
    digest: int = 0
    is_marker: bool = False  # empty data: a priming event or heartbeat
    response_ids: tuple[str, ...] = ()  # JSON-RPC responses it carries
    # Data that may carry responses but was not read (too large, not JSON):
    # which requests it answers is unknown.
    unreadable: bool = False


@dataclass(frozen=True)
class Gap:
    kind: GapKind
    expected: str
    observed: str
    message: str
    request_id: str | None = None
    method: str | None = None  # the JSON-RPC method of request_id, when known


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    gaps: tuple[Gap, ...]
    first_event_id: str | None = None
    replayed_events: int = 0

    @property
    def kinds(self) -> frozenset[GapKind]:
        return frozenset(gap.kind for gap in self.gaps)


# ------------------------------------------------------------------ rules
# One function per gap kind.  Each returns the gap it proves, or None.


def session_changed_rule(cursor: Cursor, response_session_id: str | None) -> Gap | None:
    if cursor.session_id is None or response_session_id is None:
        return None
    if response_session_id == cursor.session_id:
        return None
    return Gap(
        GapKind.SESSION_CHANGED,
        expected="session the cursor was issued in",
        observed="a different session id on the resumed stream",
        message=(
            f"session id changed on reconnect with Last-Event-ID {cursor.event_id}: the stream "
            "was re-established, not resumed; re-initialize and replay pending work explicitly"
        ),
    )


def id_regression_rule(cursor: Cursor, first: ObservedEvent) -> Gap | None:
    if first.event_id is None:
        return None
    if compare_event_ids(first.event_id, cursor.event_id) != -1:
        return None
    return Gap(
        GapKind.ID_REGRESSION,
        expected=f">= {cursor.event_id}",
        observed=first.event_id.raw,
        message=(
            f"event id regression: requested after {cursor.event_id}, got {first.event_id}; "
            "the server's counter was reset, events after the cursor are lost"
        ),
    )


def reuses_id(seen: Mapping[str, int | None], event_id: str, digest: int) -> bool:
    """``event_id`` was seen in this session with other data: what
    :func:`id_reused_rule` proves, and what ``ResumeCheck.event_matters``
    must not skip."""
    previous = seen.get(event_id)
    return previous is not None and previous != digest


def id_reused_rule(seen: Mapping[str, int | None], event: ObservedEvent) -> Gap | None:
    if event.event_id is None or event.is_marker or event.event_id.clock:
        return None
    if not reuses_id(seen, event.event_id.raw, event.digest):
        return None
    return Gap(
        GapKind.ID_REUSED,
        expected=f"new events to carry new ids, not {event.event_id}",
        observed=f"{event.event_id} again with different data",
        message=(
            f"event id {event.event_id} was reused for a different event in this session: "
            "deduplicating by id would drop a genuinely new event"
        ),
    )


def _is_cursor_event(cursor: Cursor, event: ObservedEvent) -> bool:
    return (
        event.event_id is not None
        and event.event_id.raw == cursor.event_id.raw
        and not event.is_marker
        and (cursor.digest is None or cursor.digest == event.digest)
    )


def replay_contract_rule(
    cursor: Cursor, first: ObservedEvent, contract: ReplayContract, *, redelivered: bool = False
) -> Gap | None:
    if redelivered:
        # At-least-once: the server sent again, unchanged, events up to and
        # including the cursor, then went on.  Neither contract loses anything.
        return None
    if contract is ReplayContract.EXCLUSIVE:
        if not _is_cursor_event(cursor, first):
            return None
        observed = f"{cursor.event_id} sent again"
        expected = f"> {cursor.event_id}"
    else:
        if _is_cursor_event(cursor, first):
            return None
        if first.event_id is not None:
            order = compare_event_ids(first.event_id, cursor.event_id)
            if order is None and first.event_id.raw != cursor.event_id.raw:
                order = 1  # an unseen opaque id: the cursor event was not sent first
            if order != 1:
                return None
        observed = "first event " + (first.event_id.raw if first.event_id else "without id")
        expected = f"{cursor.event_id} sent again first (>= cursor)"
    return Gap(
        GapKind.REPLAY_CONTRACT_VIOLATION,
        expected=expected,
        observed=observed,
        message=(
            f"the server's replay start contradicts the declared {contract.value} contract; "
            "set OTEL_PYTHON_MCP_RESUMPTION_REPLAY_CONTRACT to what the server implements, "
            "or fix the server"
        ),
    )


def drain_race_rule(
    cursor: Cursor, first: ObservedEvent, *, redelivered: bool = False
) -> Gap | None:
    if cursor.consumed or not cursor.known or first.event_id is None or redelivered:
        return None
    if _is_cursor_event(cursor, first):
        return None  # the unconsumed event is delivered again
    if compare_event_ids(first.event_id, cursor.event_id) == -1:
        return None  # a counter reset, reported as id_regression
    return Gap(
        GapKind.DRAIN_RACE,
        expected=f"{cursor.event_id} (received, never consumed) delivered again",
        observed=f"replay started after it, at {first.event_id}",
        message=(
            f"Last-Event-ID {cursor.event_id} names an event the application never consumed "
            "and the server replayed strictly after it: that event is lost exactly once; "
            "advance the cursor only after consuming an event, or use an inclusive replay"
        ),
    )


def replay_unconfirmed_rule(delivered: int, reason: str) -> Gap | None:
    if delivered:
        return None
    return Gap(
        GapKind.REPLAY_UNCONFIRMED,
        expected="a replayed event or an end-of-replay marker",
        observed=f"nothing before {reason}",
        message=(
            "no replayed event and no end-of-replay marker: 'caught up' and 'replay "
            "unsupported' are indistinguishable; do not treat the stream as continuous"
        ),
    )


def orphaned_request_rule(request_id: str, method: str, why: str) -> Gap:
    return Gap(
        GapKind.ORPHANED_REQUEST,
        expected=f"the response to {method or 'request'} {request_id}",
        observed=why,
        message=(
            f"JSON-RPC request {request_id} ({method or 'unknown method'}) was in flight when "
            f"the stream broke and its response will not arrive ({why}); re-issue it"
        ),
        request_id=request_id,
        method=method or None,
    )


def subscription_lost_rule(request_id: str, notifications: str, why: str) -> Gap:
    """A subscriptions/listen stream ended without the server's result and
    without the client ending it: the notifications it carried stop, with
    nothing to say so.  Not a lost call: nothing awaited an answer."""
    return Gap(
        GapKind.SUBSCRIPTION_LOST,
        expected=f"the server's result closing subscription {request_id} ({notifications})",
        observed=why,
        message=(
            f"subscription {request_id} (notifications: {notifications}) ended without the "
            f"server's graceful close ({why}): change notifications from now on are missed; "
            "re-listen and refetch what it watched"
        ),
        request_id=request_id,
        method="subscriptions/listen",
    )


def foreign_replay_rule(response_id: str, sent_by_session: Callable[[str], bool]) -> Gap | None:
    if sent_by_session(response_id):
        return None
    return Gap(
        GapKind.FOREIGN_REPLAY,
        expected="responses only to requests this session sent",
        observed=f"a response to request id {response_id}, never sent here",
        message=(
            f"the replay carries a response to request {response_id} that this session never "
            "sent: it belongs to another stream or session; do not apply it"
        ),
        request_id=response_id,
    )


# ---------------------------------------------------- seed-compatible API


@dataclass(frozen=True)
class StreamCursor:
    """A resumption cursor bound to the session id it was issued in."""

    session_id: str
    last_event_id: int | str


def _seed_id(event_id: int | str) -> EventId | None:
    """An id as the seed's API takes it: a Python int that reads as a
    counter (not negative, at most 40 digits) is one by type, even where
    its digits would look like a clock; anything else by its shape."""
    if type(event_id) is int and 0 <= event_id < 10**MAX_COUNTER_DIGITS:
        return EventId(str(event_id), "", event_id)
    return parse_event_id(str(event_id))


def verify_resumption(
    cursor: StreamCursor,
    response_session_id: str,
    first_replayed_event_id: int | str | None,
) -> None:
    """The first seed's check: raise :class:`ResumptionGapError` unless the
    resumed stream kept its session and its first replayed id does not order
    below the cursor.  An empty replay proves nothing and raises too.  The
    gaps are the rules' own; what the seed adds is that ids giving no
    ordering evidence (``unverifiable`` above) raise as well."""
    last = _seed_id(cursor.last_event_id)
    # The seed compares the session ids as given, None included, where the
    # rule reads None as "not known": compared as their reprs, each is a
    # session of its own.
    bound = Cursor(last or EventId(str(cursor.last_event_id)), session_id=repr(cursor.session_id))
    # Session identity must survive the transport generation change.
    changed = session_changed_rule(bound, repr(response_session_id))
    if changed is not None:
        raise ResumptionGapError(changed.message)
    # "Caught up" and "replay unsupported" look the same on the wire.
    if first_replayed_event_id is None:
        unconfirmed = replay_unconfirmed_rule(0, "the resumed stream's first event")
        raise ResumptionGapError(unconfirmed.message if unconfirmed else "no replayed event")
    first = _seed_id(first_replayed_event_id)
    if first is None or last is None:
        raise ResumptionGapError("empty event id on resume; continuity is unproven")
    regression = id_regression_rule(bound, ObservedEvent(first))
    if regression is not None:
        raise ResumptionGapError(regression.message)
    if compare_event_ids(first, last) is None:
        raise ResumptionGapError(
            f"event ids {cursor.last_event_id!r} and {first_replayed_event_id!r} carry no "
            "ordering evidence; continuity is unverifiable, re-initialize"
        )
