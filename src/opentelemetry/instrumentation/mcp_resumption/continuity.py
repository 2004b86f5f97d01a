# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The continuity rules for a resumed MCP stream.

Pure: standard library only, no OpenTelemetry, HTTP or MCP imports, so the
rules can be read, tested and reused alone.

A client that reconnects with ``Last-Event-ID`` and gets ``200 OK`` has no
proof that anything was replayed.  The rules below turn what the client saw
around a resume into a :class:`Verdict`: an outcome and every gap found, each
gap with what was expected, what was observed, and what to do about it.

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
  it comes within the reissue window (``fates``).  The check hands such
  requests out (:meth:`ResumeCheck.take_orphans`) and stays open until their
  fates are known; the lost ones are its gaps.  A resumed stream that ends
  hands its pending requests back to the lineage (:meth:`ResumeCheck.release`);
  the next resume of the lineage takes them.
* Event ids are opaque strings.  Integers and a fixed prefix plus a counter
  (``e-104``, ``s-77:e-104``, ``<stream>_<n>``) order within one prefix, once
  the session's history shows the scheme counting (:func:`corroborated`);
  anything else (UUIDs, hex tails, decimal fractions, timestamps) is opaque
  and gives no ordering evidence, so where ordering would decide, the
  outcome is ``unverifiable`` rather than a guess.
* A *duplicate* is an event the session already saw, with the same content,
  at or before the cursor: at-least-once redelivery, skipped until the first
  new event, never a regression or a reuse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

__all__ = [
    "Cursor",
    "EventId",
    "Gap",
    "GapKind",
    "ObservedEvent",
    "Outcome",
    "ReplayContract",
    "ResumeCheck",
    "ResumeCursorRaceError",
    "ResumptionGapError",
    "StreamCursor",
    "Verdict",
    "compare_event_ids",
    "corroborated",
    "parse_declared",
    "parse_event_id",
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


# Outcomes that say how the attempt ended before any replay: kept whatever
# gaps (lost requests) the attempt then has.
_TERMINAL = (Outcome.REJECTED, Outcome.FAILED)


class ReplayContract(str, Enum):
    """What the server replays after ``Last-Event-ID: c``."""

    EXCLUSIVE = "exclusive"  # events with id > c (the MCP SDKs' EventStore contract)
    INCLUSIVE = "inclusive"  # events with id >= c: the cursor event is sent again


class ResumptionGapError(RuntimeError):
    """Raised when a resumed MCP stream cannot be proven continuous."""


class ResumeCursorRaceError(ResumptionGapError):
    """The cursor names an event the application never consumed, and the
    server replayed strictly after it: that event is lost exactly once."""


# ---------------------------------------------------------------- event ids

# Longer ids are kept opaque: ordering them would cost more than it proves,
# and int() refuses digit strings past 4300 characters anyway.
MAX_ORDERED_ID_LENGTH = 128
MAX_COUNTER_DIGITS = 40
_DIGITS = "0123456789"
_HEX = frozenset("0123456789abcdefABCDEF")
_ASCII_ALNUM = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# Digit counts of Unix time in s, ms, us and ns from 2001 to 2286 (a leading
# "1"..."9"): a clock, not a counter.  Clocks tie (two events in one tick
# share an id) and step back, so their order proves nothing.
_EPOCH_DIGITS = (10, 13, 16, 19)
_FRACTION_SEPARATORS = ".,"


def _is_decimal(text: str) -> bool:
    return text.isascii() and text.isdigit()


@dataclass(frozen=True)
class EventId:
    """An SSE event id and the ordering evidence it carries, if any."""

    raw: str
    prefix: str | None = None  # None: opaque; "": a bare integer
    counter: int | None = None
    # A timestamp (opaque): two events in one tick share it, so an equal id
    # with other data is a tie, not a reuse.
    clock: bool = False
    declared: bool = False  # parsed by the user's declared pattern
    # A cursor whose shape counts (:func:`corroborated`): the one id that
    # would follow it, which proves the order on its own, before the session
    # has shown it counting (a random tail is not the next counter) and
    # where the next counter has a clock's digits.
    successor: str | None = None

    @property
    def scheme(self) -> str:
        if self.counter is None:
            return "opaque"
        return "integer" if self.prefix == "" else "prefixed"

    def __str__(self) -> str:
        return self.raw


def _is_uuid(raw: str) -> bool:
    if len(raw) == 36:
        if raw[8] != "-" or raw[13] != "-" or raw[18] != "-" or raw[23] != "-":
            return False
        raw = raw.replace("-", "")
    return len(raw) == 32 and _HEX.issuperset(raw)


def _is_clock(digits: str) -> bool:
    return len(digits) in _EPOCH_DIGITS and digits[0] != "0"


def _is_date(head: str) -> bool:
    """``head`` starts with an ISO 8601 date (``2025-11-``): what follows
    is a day or a time of day, not a counter."""
    return (
        len(head) >= 8
        and head[4] == "-"
        and head[7] == "-"
        and head[:4].isdigit()
        and head[5:7].isdigit()
        and head[:8].isascii()
    )


def parse_declared(raw: str | None, pattern: Any) -> EventId | None:
    """Classify one id by a scheme the user declared: ``pattern`` (a compiled
    regex) with a named group ``counter`` of decimal digits and optionally
    ``stream``; an id it does not match is opaque.  Declared ids order
    without the session's history (:func:`corroborated` passes them)."""
    if not raw or not isinstance(raw, str):
        return None
    if len(raw) > MAX_ORDERED_ID_LENGTH:
        return EventId(raw)
    match = pattern.fullmatch(raw)
    digits = match.group("counter") if match else None
    if not digits or len(digits) > MAX_COUNTER_DIGITS or not _is_decimal(digits):
        return EventId(raw)
    stream = match.groupdict().get("stream") or ""
    return EventId(raw, f"declared:{stream}", int(digits), declared=True)


def parse_event_id(raw: str | None) -> EventId | None:
    """Classify one id by its own shape; ``None`` for an absent or empty id.

    Orders only where the shape leaves no doubt: a bare decimal integer, or
    a prefix that holds an ASCII letter or digit and ends in a separator
    (``-``, ``_``, ``:``, ``/``...), followed by a decimal counter.  Opaque:
    UUIDs, a decimal fraction (``1733212345.45``: ``.45`` is not counter 45),
    anything whose tail is not all decimal digits (hex, base36, ULIDs), a
    Unix timestamp in s/ms/us/ns or an ISO 8601 time (clocks tie), and ids
    over ``MAX_ORDERED_ID_LENGTH``.

    No regular expression: string methods and one scan of at most
    ``MAX_ORDERED_ID_LENGTH`` characters, so every input costs about the same.
    """
    if not raw or not isinstance(raw, str):
        return None
    if len(raw) > MAX_ORDERED_ID_LENGTH or raw[-1] not in _DIGITS or _is_uuid(raw):
        return EventId(raw)
    head = raw.rstrip(_DIGITS)
    digits = raw[len(head) :]
    if _is_clock(digits):
        return EventId(raw, clock=True)
    if len(digits) > MAX_COUNTER_DIGITS:
        return EventId(raw)
    if not head:
        return EventId(raw, "", int(digits))
    separator = head[-1]
    if separator in _ASCII_ALNUM or separator.isspace():
        return EventId(raw)  # "5e5", "e- 5": no separator right before the counter
    if separator in _FRACTION_SEPARATORS and len(head) > 1 and head[-2] in _DIGITS:
        # A decimal fraction; seconds since the epoch with one are a clock.
        whole = head[:-1]
        return EventId(raw, clock=(whole.isdigit() and _is_clock(whole)) or _is_date(head))
    if _ASCII_ALNUM.isdisjoint(head):
        return EventId(raw)  # "-5", "é-5": a sign or a symbol, not a stream name
    if _is_date(head):
        return EventId(raw, clock=True)  # 2025-11-25T10:00:07
    return EventId(raw, head, int(digits))


# A scheme orders only once a session has shown it counting.
MIN_COUNTING_IDS = 2


def corroborated(cursor: EventId, history: Iterable[str]) -> EventId:
    """``cursor`` with its ordering evidence kept only if ``history`` (the
    ids its session received, oldest first) shows the scheme counting: at
    least ``MIN_COUNTING_IDS`` ids under the cursor's prefix, each above the
    one before, and none under that prefix with a tail that is not decimal.
    A random or hex tail is all digits now and then (``s-58302914``); one
    id cannot tell it from a counter, a short history of the stream can.
    Either way a counting cursor carries its ``successor``: a replay that
    starts exactly there is in order, even where that next counter has the
    digits of a clock (``999999999``, then ``1000000000``)."""
    if cursor.counter is None or cursor.declared:
        return cursor
    prefix = cursor.prefix or ""
    last = -1
    counted = 0
    for raw in history:
        if not raw.startswith(prefix):
            continue
        parsed = parse_event_id(raw)
        if parsed is not None and parsed.counter is not None and parsed.prefix == prefix:
            if parsed.counter <= last:
                return EventId(cursor.raw)  # not counting up: not a counter
            last = parsed.counter
            counted += 1
            continue
        tail = raw[len(prefix) :]
        if prefix:
            hexlike = tail.isascii() and tail.isalnum()
        else:  # bare ids: a token of the cursor's width in hex digits
            hexlike = len(tail) == len(cursor.raw) and _HEX.issuperset(tail)
        if hexlike:
            return EventId(cursor.raw)
    digits = len(cursor.raw) - len(prefix)
    successor = f"{prefix}{cursor.counter + 1:0{digits}d}"
    if counted >= MIN_COUNTING_IDS:
        return replace(cursor, successor=successor)
    return EventId(cursor.raw, successor=successor)



def compare_event_ids(a: EventId, b: EventId) -> int | None:
    """-1, 0 or 1 as ``a`` orders before, with or after ``b``; ``None`` when
    the two ids carry no ordering evidence against each other (equal
    timestamps included: two events of one tick share one)."""
    if a.raw == b.raw:
        return None if a.clock else 0
    if a.counter is None or b.counter is None or a.prefix != b.prefix:
        return None
    return (a.counter > b.counter) - (a.counter < b.counter)


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
    :func:`id_reused_rule` proves, and what :meth:`ResumeCheck.event_matters`
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


# --------------------------------------------------------------- the check


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
                gap = foreign_replay_rule(rid, self._sent_by_session)
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
        self._session_changed = session_changed_rule(self.cursor, session_id)
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
                unconfirmed = replay_unconfirmed_rule(self.delivered, reason)
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
        unconfirmed = replay_unconfirmed_rule(
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
        regression = id_regression_rule(self.cursor, first)
        if regression is not None:
            found.append(regression)
        # A new session or a reset counter means this is not the stream that
        # broke: nothing it sends can answer what was pending there.
        self._replaced = replaced = bool(found)
        # Checks below compare against this session's history, so they apply
        # only while the stream kept its session and counter.
        reused = None if replaced else id_reused_rule(self._seen, first)
        if reused is not None:
            found.append(reused)
        if not found:
            # Only a stream that kept its session and its counter can be
            # judged against the contract and the drain race.
            redelivered = self._cursor_redelivered
            for gap in (
                replay_contract_rule(self.cursor, first, self.contract, redelivered=redelivered),
                drain_race_rule(self.cursor, first, redelivered=redelivered),
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
        reused = id_reused_rule(self._seen, event)
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
