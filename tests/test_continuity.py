"""Event-id parsing and ordering, the seed-compatible ``verify_resumption``,
and the skip filter ``ResumeCheck.event_matters`` against the rules.

Event ids are opaque strings: integers and a fixed prefix plus a counter order
within one prefix, everything else is opaque (docs/rules.md).  The
seed-compatible check must behave exactly as the code of seed 000, which is
copied below verbatim as the oracle.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentelemetry.instrumentation.mcp_resumption.errors import ResumptionGapError
from opentelemetry.instrumentation.mcp_resumption.rules.continuity import (
    Cursor,
    ObservedEvent,
    ReplayContract,
    StreamCursor,
    verify_resumption,
)
from opentelemetry.instrumentation.mcp_resumption.rules.event_ids import (
    MAX_ORDERED_ID_LENGTH,
    EventId,
    compare_event_ids,
    parse_event_id,
)
from opentelemetry.instrumentation.mcp_resumption.rules.resume_check import ResumeCheck

# ------------------------------------------------------------- the oracle
# Seed 000's code, verbatim apart from the names.


class _SeedResumptionGapError(RuntimeError):
    pass


@dataclass(frozen=True)
class _SeedStreamCursor:
    session_id: str
    last_event_id: int


def _seed_verify_resumption(
    cursor: _SeedStreamCursor,
    response_session_id: str,
    first_replayed_event_id: int | None,
) -> None:
    if response_session_id != cursor.session_id:
        raise _SeedResumptionGapError("session id changed")
    if first_replayed_event_id is None:
        raise _SeedResumptionGapError("no replayed event")
    if first_replayed_event_id < cursor.last_event_id:
        raise _SeedResumptionGapError("event id regression")


def _seed_raises(session: str, cursor: int, answered: str, first: int | None) -> bool:
    try:
        _seed_verify_resumption(_SeedStreamCursor(session, cursor), answered, first)
    except _SeedResumptionGapError:
        return True
    return False


def _engine_raises(session: str, cursor: int | str, answered: str, first: int | str | None) -> bool:
    try:
        verify_resumption(StreamCursor(session, cursor), answered, first)
    except ResumptionGapError:
        return True
    return False


def _order(a: str, b: str) -> int | None:
    first, second = parse_event_id(a), parse_event_id(b)
    assert first is not None and second is not None
    return compare_event_ids(first, second)


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("raw", "scheme", "prefix", "counter"),
    [
        ("0", "integer", "", 0),
        ("4821", "integer", "", 4821),
        ("00042", "integer", "", 42),
        ("9" * 40, "integer", "", int("9" * 40)),
        ("e-104", "prefixed", "e-", 104),
        ("e-0104", "prefixed", "e-", 104),
        ("s-77:e-104", "prefixed", "s-77:e-", 104),
        ("stream_12", "prefixed", "stream_", 12),
        ("abc_7", "prefixed", "abc_", 7),
        ("1/5", "prefixed", "1/", 5),
    ],
)
def test_ordered_ids_parse_to_prefix_and_counter(raw, scheme, prefix, counter):
    parsed = parse_event_id(raw)
    assert parsed == EventId(raw, prefix, counter)
    assert parsed.scheme == scheme
    assert str(parsed) == raw


@pytest.mark.parametrize(
    "raw",
    [
        str(uuid.UUID("123e4567-e89b-42d3-a456-426614174000")),
        "123E4567-E89B-42D3-A456-426614174000",
        "123e4567e89b42d3a456426614174000",
        "12345678123456781234567812345678",  # all digits, but UUID-shaped
        "-5",
        " 5",
        "5 ",
        "+5",
        "e-5 ",
        "e- 5",
        "e-5\n",
        "abc",
        "e-",
        "-",
        "5e",
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",  # a ULID
        "2025-11-25T10:00:00.123Z",
        "é-5",
        "\u0661\u0662\u0663",  # Arabic-Indic digits are not a counter
        "e-\u0661\u0662",
        "\uff15",  # fullwidth 5
        "\x00",
        "9" * 41,
        "e-" + "9" * 41,
        "7" * (MAX_ORDERED_ID_LENGTH + 1),
        "x" * 10 * 1024,
        "e-" + "1" * 10 * 1024,
        "\U0001f600-5" * 2000,
    ],
)
def test_everything_else_is_opaque(raw):
    parsed = parse_event_id(raw)
    assert parsed is not None
    assert parsed.scheme == "opaque"
    assert parsed.prefix is None and parsed.counter is None
    assert parsed.raw == raw


@pytest.mark.parametrize("raw", [None, "", b"5", 5, 5.0, ["5"]])
def test_absent_empty_or_non_string_ids_are_none(raw):
    assert parse_event_id(raw) is None


@pytest.mark.parametrize(
    "raw",
    [
        "a" + "-" * (MAX_ORDERED_ID_LENGTH - 2) + "x",
        "a1" * (MAX_ORDERED_ID_LENGTH // 2),
        "a-" * (MAX_ORDERED_ID_LENGTH // 2),
        "a" * (MAX_ORDERED_ID_LENGTH - 1) + "-",
        "a-" * (MAX_ORDERED_ID_LENGTH // 2 - 1) + "-x",
    ],
)
def test_worst_case_ids_parse_quickly(raw):
    started = time.perf_counter()
    for _ in range(100):
        parse_event_id(raw)
    assert time.perf_counter() - started < 1.0


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="0123456789e-_:s ", max_size=60)))
def test_any_string_parses_without_crashing(raw):
    parsed = parse_event_id(raw)
    if not raw:
        assert parsed is None
        return
    assert parsed is not None and parsed.raw == raw
    assert parsed.scheme in {"integer", "prefixed", "opaque"}
    if parsed.counter is not None:
        assert len(raw) <= MAX_ORDERED_ID_LENGTH
        assert raw.endswith(str(parsed.counter)[-1])
        assert parsed.prefix is not None and raw.startswith(parsed.prefix)


# --------------------------------------------------------------- ordering


@pytest.mark.parametrize(
    ("a", "b", "order"),
    [
        ("4820", "4821", -1),
        ("4821", "4821", 0),
        ("4822", "4821", 1),
        ("99", "100", -1),  # numeric, not lexicographic
        ("0099", "0100", -1),
        ("e-9", "e-10", -1),
        ("e-105", "e-104", 1),
        ("e-104", "e-104", 0),
        ("s-77:e-103", "s-77:e-104", -1),
        ("stream_12", "stream_9", 1),
        ("1", "4821", -1),
        ("e-1", "e-104", -1),
    ],
)
def test_ids_order_within_one_prefix(a, b, order):
    assert _order(a, b) == order
    assert _order(b, a) == -order


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("e-104", "f-105"),
        ("e-104", "104"),
        ("e-104", "E-104"),
        ("s-77:e-104", "e-104"),
        ("s-77:e-104", "s-78:e-105"),
        ("stream_12", "other_13"),
        ("4821", str(uuid.UUID(int=4821, version=4))),
        (str(uuid.UUID(int=1, version=4)), str(uuid.UUID(int=2, version=4))),
        ("-5", "-4"),
        (" 5", " 6"),
        ("9" * 41, "9" * 40),
    ],
)
def test_ids_across_prefixes_or_schemes_carry_no_order(a, b):
    assert _order(a, b) is None
    assert _order(b, a) is None


@pytest.mark.parametrize(
    "raw", ["4821", "e-104", str(uuid.UUID(int=7, version=4)), "-5", "x" * 10 * 1024]
)
def test_an_id_orders_equal_to_itself(raw):
    assert _order(raw, raw) == 0


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    st.one_of(st.text(max_size=20), st.from_regex(r"\A(e-|s-7:e-|)[0-9]{1,5}\Z")),
    st.one_of(st.text(max_size=20), st.from_regex(r"\A(e-|s-7:e-|)[0-9]{1,5}\Z")),
)
def test_comparison_is_antisymmetric_and_prefix_bound(a, b):
    first, second = parse_event_id(a), parse_event_id(b)
    if first is None or second is None:
        return
    forward, backward = compare_event_ids(first, second), compare_event_ids(second, first)
    if forward is None:
        assert backward is None
    else:
        assert forward == -backward
        if a != b:
            assert first.prefix == second.prefix and first.prefix is not None


# ------------------------------------------------- the seed-compatible check


def test_seed_000_changed_session_raises():
    with pytest.raises(ResumptionGapError, match="session id changed"):
        verify_resumption(StreamCursor("sess-legacy-1", 4821), "fresh-9f2", 4822)


def test_seed_000_changed_session_raises_before_anything_else():
    with pytest.raises(ResumptionGapError, match="session id changed"):
        verify_resumption(StreamCursor("sess-legacy-1", 4821), "fresh-9f2", None)


def test_seed_000_empty_replay_raises():
    with pytest.raises(ResumptionGapError, match="no replayed event"):
        verify_resumption(StreamCursor("s-1", 4821), "s-1", None)


def test_seed_000_counter_reset_raises():
    with pytest.raises(ResumptionGapError, match="regression"):
        verify_resumption(StreamCursor("s-1", 4821), "s-1", 1)


@pytest.mark.parametrize("first", [4821, 4822, 10**6, "4821", "4822"])
def test_seed_000_equal_or_higher_id_passes(first):
    assert verify_resumption(StreamCursor("s-1", 4821), "s-1", first) is None


@pytest.mark.parametrize(
    ("cursor", "first", "passes"),
    [
        ("e-104", "e-105", True),
        ("e-104", "e-104", True),
        ("e-104", "e-103", False),
        ("s-77:e-104", "s-77:e-1000", True),
        ("e-104", "f-105", False),  # another prefix: no ordering evidence
        ("e-104", str(uuid.UUID(int=105, version=4)), False),
        (str(uuid.UUID(int=104, version=4)), str(uuid.UUID(int=105, version=4)), False),
        ("e-104", "", False),
    ],
)
def test_string_ids_pass_only_on_proven_order(cursor, first, passes):
    assert _engine_raises("s-77", cursor, "s-77", first) is not passes


@settings(max_examples=400, derandomize=True, deadline=None)
@given(
    # None and "" too: the seed compares them as given, no session as a session.
    session=st.sampled_from(["s-1", "s-2", "", None]),
    answered=st.sampled_from(["s-1", "s-2", "", None]),
    cursor=st.integers(min_value=0, max_value=10**40 - 1),
    first=st.one_of(
        st.none(),
        st.integers(min_value=0, max_value=10**40 - 1),
        st.integers(min_value=0, max_value=10),
    ),
    near=st.integers(min_value=-2, max_value=2),
    use_near=st.booleans(),
)
def test_verify_resumption_matches_seed_000(session, answered, cursor, first, near, use_near):
    if use_near and first is not None:
        first = min(max(cursor + near, 0), 10**40 - 1)
    assert _engine_raises(session, cursor, answered, first) == _seed_raises(
        session, cursor, answered, first
    )


@pytest.mark.parametrize(
    ("cursor", "first"),
    [(-5, -3), (-5, 0), (10**40, 10**40 + 1), (10**40 - 1, 10**40)],
)
def test_verify_resumption_fails_closed_where_ids_stop_being_ordered(cursor, first):
    # Divergence from the seed, reported: the seed compares Python ints and
    # passes these; the engine reads ids as strings, where "-5" and ids past
    # 40 digits are opaque, and refuses to call the resume continuous.
    assert not _seed_raises("s-1", cursor, "s-1", first)
    with pytest.raises(ResumptionGapError, match="no ordering evidence"):
        verify_resumption(StreamCursor("s-1", cursor), "s-1", first)


# ---------------------------------------------------------- the skip filter
# The tracker builds an event and runs the rules on it only where
# ``event_matters`` says yes.  Skipping must never change what the rules
# find: one check fed as the tracker feeds it and one fed every event give
# the same gaps and the same final verdict.

_SKIP_IDS = st.sampled_from([None, "3", "4", "5", "6", "e-5", "x"])
_SKIP_EVENTS = st.lists(
    st.tuples(
        _SKIP_IDS,
        st.integers(0, 2),  # the digest: 0 and 1 are what "3" and "4" were seen with
        st.booleans(),  # a marker
        st.lists(st.sampled_from(["1", "2", "99"]), max_size=2, unique=True),
        st.booleans(),  # unreadable: it may answer requests, nobody knows which
    ),
    max_size=12,
)


def _skip_check(
    cursor: str, pending: list[str], contract: ReplayContract
) -> tuple[ResumeCheck, dict[str, int]]:
    """A check of a resume from ``cursor``, and the session's seen ids it reads."""
    seen = {"3": 0, "4": 1}
    sent = {"1", "2"}  # "99" was never sent here: a foreign response
    check = ResumeCheck(
        Cursor(parse_event_id(cursor), session_id="s-1", known=True),
        contract,
        seen=seen,
        pending={rid: "tools/call" for rid in pending},
        sent_by_session=sent.__contains__,
        watch=3,
    )
    return check, seen


@settings(max_examples=400, derandomize=True, deadline=None)
@given(
    cursor=st.sampled_from(["4", "e-4", "x"]),
    pending=st.lists(st.sampled_from(["1", "2"]), unique=True),
    contract=st.sampled_from(list(ReplayContract)),
    events=_SKIP_EVENTS,
)
def test_events_event_matters_skips_change_no_gap_and_no_verdict(cursor, pending, contract, events):
    skipping, skipping_seen = _skip_check(cursor, pending, contract)
    every, every_seen = _skip_check(cursor, pending, contract)
    for raw, digest, marker, responses, unreadable in events:
        event = ObservedEvent(parse_event_id(raw), digest, marker, tuple(responses), unreadable)
        # As the tracker asks: an unreadable event may carry responses.
        carries = bool(responses) or unreadable
        if skipping.event_matters(raw, digest, carries):
            skipping.on_event(event)
        every.event_matters(raw, digest, carries)  # it counts the events
        every.on_event(event)
        if raw is not None and not marker:  # the tracker remembers what it saw
            skipping_seen[raw] = every_seen[raw] = digest
    for check in (skipping, every):
        check.on_end("eof")
        check.release()
        check.lineage_over()
    assert skipping.gaps == every.gaps
    assert skipping.verdict == every.verdict
    assert (skipping.closed, skipping.final) == (every.closed, every.final)


def test_the_skip_filter_test_skips_events():
    # The property above is not empty: some events are skipped (a verdict
    # given, an event with nothing for the rules), and yet gaps are found.
    check, _ = _skip_check("4", [], ReplayContract.EXCLUSIVE)
    check.on_event(ObservedEvent(parse_event_id("5"), 2))
    assert check.verdict is not None and not check.gaps
    assert not check.event_matters("6", 2, False)  # a new id, no response
    assert check.event_matters("3", 2, False)  # seen with other data: id_reused
    assert check.event_matters("7", 2, True)  # a response: answered or foreign
