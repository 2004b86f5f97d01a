# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What an SSE event id proves about order, and what it does not.

Pure: standard library only.  Event ids are opaque strings; this module
classifies one by its shape (:func:`parse_event_id`) or by a scheme the user
declared (:func:`parse_declared`) into an :class:`EventId`, keeps a shape's
ordering evidence only once the session's history shows it counting
(:func:`corroborated`), and orders two ids where they carry evidence against
each other (:func:`compare_event_ids`).  The continuity rules
(``continuity``) and the resume check (``resume_check``) order ids through
it and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "MAX_COUNTER_DIGITS",
    "MAX_ORDERED_ID_LENGTH",
    "MIN_COUNTING_IDS",
    "EventId",
    "compare_event_ids",
    "corroborated",
    "parse_declared",
    "parse_event_id",
]

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
