"""Every ``lost`` fate is its ``orphaned_request`` gap (issue 38, "counts
agree"): the check that tests/conftest.py runs after every test over the
metric readers the test used, whatever it was about.

The readers: ``helpers.Telemetry`` (the in-process SDK's in-memory reader:
the client half's tests) and ``proxy_harness.Proxy`` (the proxy's exit
export: both legs).  Each records itself where it is made or closed
(``LOSS_READERS``), so that a loss test in any file is covered without
asking for it.
"""

from __future__ import annotations

import time
from typing import Any

BROKEN = "mcp.client.resumption.broken_requests"
GAPS = "mcp.client.resumption.gaps"
FATE = "mcp.resumption.request.fate"
KIND = "mcp.resumption.gap.kind"
LEG = "mcp.resumption.leg"

# Readers made (Telemetry) or closed (Proxy) since the process began; the
# conftest hook looks at those of one test.
LOSS_READERS: list[Any] = []


def tally(points: list[tuple[dict, int]]) -> dict[tuple[str | None, str], int]:
    """(leg, "lost" | "orphaned_request") -> total, from (attributes, value)."""
    totals: dict[tuple[str | None, str], int] = {}
    for attributes, value in points:
        if attributes.get(FATE) == "lost":
            key = (attributes.get(LEG), "lost")
        elif attributes.get(KIND) == "orphaned_request":
            key = (attributes.get(LEG), "orphaned_request")
        else:
            continue
        totals[key] = totals.get(key, 0) + int(value)
    return totals


def disagreements(totals: dict[tuple[str | None, str], int]) -> dict[str | None, tuple[int, int]]:
    """Each leg whose lost fates and orphaned_request gaps differ: (lost, gaps)."""
    legs = {leg for leg, _ in totals}
    found = {}
    for leg in legs:
        lost, gaps = totals.get((leg, "lost"), 0), totals.get((leg, "orphaned_request"), 0)
        if lost != gaps:
            found[leg] = (lost, gaps)
    return found


def points_of(reader: Any) -> list[tuple[dict, int]]:
    """(attributes, value) of both counters in ``reader``'s last reading."""
    if hasattr(reader, "metric_reader"):  # helpers.Telemetry
        return [
            (dict(point.attributes), point.value)
            for name in (BROKEN, GAPS) for point in reader.points(name)
        ]
    return [  # proxy_harness.Proxy, closed: its exit export
        (point["attributes"], point.get("value", 0))
        for name in (BROKEN, GAPS) for point in reader.points(name)
    ]


def check(readers: list[Any], settle: float = 1.0) -> None:
    """Raise AssertionError naming each reader whose counts disagree.  An
    in-process reader may be read between a fate's two counts (a timer's
    thread): it is read again until they agree or ``settle`` seconds pass."""
    problems = []
    for reader in readers:
        deadline = time.monotonic() + settle
        while True:
            found = disagreements(tally(points_of(reader)))
            if not found or not hasattr(reader, "metric_reader") or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if found:
            problems.append(f"{type(reader).__name__}: (lost, orphaned_request) by leg {found}")
    assert not problems, "a lost call without its gap, or a gap without its fate: " + (
        "; ".join(problems))
