"""The seen window is never repacked per event (issue 24): an event
remembered one by one is appended to the packed record as it is, and a view a
resume holds packs once, when it is released.  Both give exactly the window
the general path (unpack, update, pack) gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from opentelemetry.instrumentation.mcp_resumption.tracking.records import Session
from opentelemetry.instrumentation.mcp_resumption.tracking.seen_window import (
    SEEN_WINDOW,
    SeenWindow,
    _Packed,
)

# Few distinct ids, so that repeats (moved to the newest end) are common; a
# NUL (kept as a tuple), wide characters, the empty id and markers included.
IDS = st.sampled_from(["1", "2", "3", "17", "", "a\x00b", "é", "𝄞𝄞", "x" * 40, "9"]) | st.text(
    max_size=6
)
ENTRIES = st.lists(st.tuples(IDS, st.none() | st.integers(-(2**63) + 2, 2**63 - 1)), max_size=60)


def _general(entries: list[tuple[str, int | None]]) -> _Packed:
    """The window as the general path keeps it, one entry at a time."""
    record = _Packed()
    for entry in entries:
        SeenWindow(record).remember_all([entry])
    return record


@settings(max_examples=400, deadline=None)
@given(ENTRIES)
def test_remember_one_by_one_packs_what_the_general_path_packs(entries):
    session = Session("server", "s")
    for event_id, digest in entries:
        session.seen.remember(event_id, digest)
    expected = _general(entries)
    assert (session.seen_ids, session.seen_digests) == (expected.seen_ids, expected.seen_digests)
    view = SeenWindow(expected)
    assert list(session.seen.items()) == list(view.items())
    assert len(session.seen) <= SEEN_WINDOW
    for event_id, _ in entries:
        assert (event_id in session.seen) == (event_id in list(view))


@settings(max_examples=200, deadline=None)
@given(ENTRIES, ENTRIES)
def test_a_held_view_packs_once_when_released(before, during):
    session = Session("server", "s")
    for event_id, digest in before:
        session.seen.remember(event_id, digest)
    packed = (session.seen_ids, session.seen_digests)
    session.window = SeenWindow(session)  # as a resume holds it
    for event_id, digest in during:
        session.seen.remember(event_id, digest)
        assert event_id in session.seen
    if during:  # not repacked while held: the record is as it was
        assert (session.seen_ids, session.seen_digests) == packed
    expected = _general(before + during)
    assert list(session.seen.items()) == list(SeenWindow(expected).items())
    session.window.release()
    session.window = None
    assert (session.seen_ids, session.seen_digests) == (expected.seen_ids, expected.seen_digests)


def test_the_oldest_id_leaves_at_the_window_bound():
    session = Session("server", "s")
    for k in range(SEEN_WINDOW + 3):
        session.seen.remember(str(k), k)
    assert list(session.seen) == [str(k) for k in range(3, SEEN_WINDOW + 3)]
    assert "2" not in session.seen and "3" in session.seen
    assert session.seen.get("3") == 3
