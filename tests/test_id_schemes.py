"""Event-id schemes: which order, which are opaque, what a session's history
adds, and what a parse costs.  The per-scheme false ``id_regression`` rate of
``benchmarks/id_schemes.py`` runs here in a small version."""

from __future__ import annotations

import ast
import inspect
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from opentelemetry.instrumentation.mcp_resumption.rules import event_ids
from opentelemetry.instrumentation.mcp_resumption.rules.event_ids import (
    EventId,
    compare_event_ids,
    corroborated,
    parse_event_id,
)
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import (
    MAX_KEPT_ID_BYTES,
    STREAMABLE_HTTP,
    Tracker,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import id_schemes

SERVER = "127.0.0.1:8000"


@pytest.mark.parametrize(
    "raw",
    [
        "1733212345.45",  # str(time.time())
        "1733212345.5",
        "1733212345450",  # Date.now()
        "1733212345",  # int(time.time())
        "1733212345450123",  # microseconds
        "1733212345450123456",  # nanoseconds
        "stream_1733212345450",  # a clock under a prefix
        "2025-11-25T10:00:07",  # ISO 8601: seconds tie
        "2025-11-25 10:00:07.123",
        "2025-11-25",
    ],
)
def test_timestamps_are_opaque_clocks(raw):
    parsed = parse_event_id(raw)
    assert parsed.scheme == "opaque" and parsed.clock
    assert compare_event_ids(parsed, parsed) is None, "a tick is shared: equal proves nothing"


@pytest.mark.parametrize(
    "raw",
    [
        "v1.2",  # a decimal fraction, not counter 2
        "e-1.45",
        "2025-11-25T10:00:00.123",  # ISO time with a fraction
        "s1-3f2a",  # hex tail
        "0f5b1c1e-6b7a-4c9e-9d47-3e2f7c1a2b3c_1733212345450_k3j2h1g0",  # TS SDK
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",  # ULID
        "12345678-1234-1234-1234-123456789012",  # a UUID of digits
    ],
)
def test_unclear_shapes_are_opaque(raw):
    assert parse_event_id(raw).scheme == "opaque"


@pytest.mark.parametrize(
    ("raw", "prefix", "counter"),
    [("0000000042", "", 42), ("999999999", "", 999999999), ("e-5", "e-", 5),
     ("abc_12", "abc_", 12), ("s-77:e-104", "s-77:e-", 104), ("1/5", "1/", 5)],
)
def test_counters_still_order(raw, prefix, counter):
    assert parse_event_id(raw) == EventId(raw, prefix, counter)


def _history(*ids: str) -> list[str]:
    return list(ids)


def test_a_scheme_orders_once_the_session_saw_it_count():
    cursor = parse_event_id("e-3")
    assert corroborated(cursor, _history("e-1", "e-2", "e-3")) == replace(cursor, successor="e-4")
    assert corroborated(cursor, _history("e-3")).scheme == "opaque", "one id shows no counting"
    assert corroborated(cursor, ()).scheme == "opaque"


def test_an_uncorroborated_counter_still_proves_its_successor():
    """One id of history cannot show a scheme counting, but the replay that
    starts at exactly the next counter is in order (a random tail is not
    the next counter); anything else stays unverifiable, never a gap."""
    assert corroborated(parse_event_id("e-3"), _history("e-3")).successor == "e-4"
    assert corroborated(parse_event_id("0099"), ()).successor == "0100"
    # Evidence against a counter leaves no successor.
    assert corroborated(parse_event_id("s1-58302914"), _history("s1-9a0c11fe")).successor is None
    assert _first_replayed_outcomes(["e-3"], ("e-4", "e-5", "e-1")) == {
        "e-4": ("resumed", []),
        "e-5": ("unverifiable", []),
        "e-1": ("unverifiable", []),
    }


def _first_replayed_outcomes(before: list[str], firsts: tuple[str, ...]) -> dict:
    """The outcome of a resume from the last of ``before``, for each first
    replayed id in ``firsts``, each on a tracker of its own."""
    outcomes = {}
    for first in firsts:
        t = Tracker()
        stream = t.open_stream(SERVER, STREAMABLE_HTTP, session_id="s")
        for raw in before:
            t.event_received(stream, raw, "{}")
            t.event_consumed(stream)
        t.stream_ended(stream, "a read error")
        resumed = t.open_stream(SERVER, STREAMABLE_HTTP, session_id="s", last_event_id=before[-1])
        t.response(resumed, 200, "s")
        step = t.event_received(resumed, first, '{"n": 1}')
        outcomes[first] = (step.verdict.outcome.value, [g.kind.value for g in step.gaps])
    return outcomes


@pytest.mark.parametrize("before", [["999999999"], ["999999998", "999999999"]])
def test_the_next_counter_proves_the_order_even_with_a_clocks_digits(before):
    """A counter that rolls over into ten digits reads like Unix seconds from
    then on, but its exact next value still proves that nothing was skipped,
    whether or not the session showed it counting.  The fuzz oracle found
    the two disagreeing (one id: resumed; two ids: unverifiable)."""
    assert parse_event_id("1000000000").clock
    assert _first_replayed_outcomes(before, ("1000000000", "1000000001")) == {
        "1000000000": ("resumed", []),
        "1000000001": ("unverifiable", []),
    }


def test_random_tails_that_happen_to_be_digits_do_not_order():
    # secrets.token_hex(4) is all digits 2.3 % of the time.
    cursor = parse_event_id("s1-58302914")
    assert corroborated(cursor, _history("s1-9a0c11fe", "s1-58302914")).scheme == "opaque"
    assert corroborated(cursor, _history("s1-70112233", "s1-58302914")).scheme == "opaque"
    bare = parse_event_id("58302914")
    assert corroborated(bare, _history("9a0c11fe", "58302914")).scheme == "opaque"


def test_other_streams_of_the_session_do_not_matter():
    cursor = parse_event_id("a_7")
    history = _history("b_9", "a_6", str(__import__("uuid").uuid4()), "b_1", "a_7")
    assert corroborated(cursor, history) == replace(cursor, successor="a_8")


def test_the_parser_uses_no_regular_expression():
    """Linear by construction: string methods and one bounded scan; no
    pattern a crafted id could make backtrack."""
    tree = ast.parse(inspect.getsource(event_ids))
    imported = {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "re" not in imported and "regex" not in imported


def test_no_id_within_the_kept_length_is_slow_to_parse():
    """The worst of many adversarial ids (runs of separators, letters and
    digits, up to the longest id kept raw) against a budget of 20 us; best
    of five runs each, so a busy machine cannot make it flaky (measured:
    about 2 us, benign 1.3 us; the regex it replaces took 86 us on the worst
    of these)."""
    ids = id_schemes.adversarial_ids()
    assert len(ids) > 50 and max(len(raw) for raw in ids) == MAX_KEPT_ID_BYTES
    worst, which = id_schemes.worst_parse_us(ids, repeats=50)
    assert worst < id_schemes.PARSE_BUDGET_US, which
    # And no id costs much more than a benign one: the cost does not depend
    # on the shape (a generous ratio; a backtracking pattern was 60x).
    benign, _ = id_schemes.worst_parse_us(["e-104"] * 3, repeats=50)
    assert worst < 10 * benign + 2.0, (worst, benign, which)


@pytest.mark.parametrize("scheme", list(id_schemes.SCHEMES))
def test_faithful_resumes_are_never_a_gap_under_any_scheme(scheme):
    """The benchmark's measurement, 2,000 faithful resumes per scheme."""
    started = time.perf_counter()
    gaps, outcomes = id_schemes.measure(id_schemes.SCHEMES[scheme], 2000, seed=12)
    assert gaps == {}, gaps
    assert sum(outcomes.values()) == 2000
    if scheme in ("integers", "zero-padded", "e-<n>", "<stream>_<n>"):
        assert outcomes["resumed"] > 1700  # counters still prove continuity
    else:
        assert set(outcomes) <= {"unverifiable", "resumed"}
    assert time.perf_counter() - started < 60
