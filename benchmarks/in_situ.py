"""The plugin's own time per event inside each real consumer.

The throughput rows judge the plugin by the difference of two noisy rates;
this times ``ContinuityProcessor.event`` itself (the metrics and the Tracker:
everything the SSE patch calls per event) with ``perf_counter_ns`` while the
consumer runs under the ``ours`` configuration.  The SSE iterator wrapped
around it is not included; the clock's own cost (two back-to-back reads) is
subtracted.  Against the tight-loop figure of ``memory.py`` it shows what a
client's other work between two events (evicting our code and data from the
caches) does to the same code.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from configs import configured

from opentelemetry.instrumentation.mcp_resumption.processor import ContinuityProcessor


def _clock_cost(repeats: int = 100_000) -> float:
    """ns between two back-to-back clock reads: what timing adds to a call."""
    clock = time.perf_counter_ns
    total = 0
    for _ in range(repeats):
        begin = clock()
        total += clock() - begin
    return total / repeats


async def event_cost(measure: Callable[[], Awaitable[Any]], rounds: int) -> dict[str, float]:
    """Median over ``rounds`` samples of the µs per event spent in
    ``processor.event``."""
    original = ContinuityProcessor.event
    clock = time.perf_counter_ns
    spent = [0, 0]  # ns, events

    def timed(self: ContinuityProcessor, *args: Any) -> None:
        begin = clock()
        try:
            original(self, *args)
        finally:
            spent[0] += clock() - begin
            spent[1] += 1

    overhead_ns = _clock_cost()
    per_event = []
    ContinuityProcessor.event = timed  # type: ignore[method-assign]
    try:
        for _ in range(rounds):
            spent[:] = [0, 0]
            with configured("ours"):
                await measure()
            if spent[1]:
                per_event.append((spent[0] / spent[1] - overhead_ns) / 1000)
    finally:
        ContinuityProcessor.event = original  # type: ignore[method-assign]
    return {"event_us": statistics.median(per_event), "timer_overhead_ns": overhead_ns}
