"""The plugin's own time per event inside each real consumer.

A difference of two rates (the throughput rows) carries the machine's noise
between two runs; this measures, in one run, the time the plugin's SSE layer
adds to each step of the iterator the application reads.  Two timing layers
are put around the patched iterator method (``httpx_sse.EventSource.aiter_sse``,
``httpx2.EventSource.__aiter__``), one above and one below:

    application -> [above] -> plugin's layer (under ``ours``) -> [below] -> parser

Per event, ``above - below`` is the plugin's layer plus the cost of the
``below`` layer itself; under ``bare`` (no plugin layer between them) the same
difference is the ``below`` layer's cost alone.  The plugin's time per event
is the difference of the two, paired in the same round.  Waiting for the
socket or for other tasks happens inside the parser, in both layers, and
cancels out.  Everything the plugin does per event happens in that layer (the
other patches act per request or per reconnect), so this is its whole
per-event cost, in situ: with the client's own work between two events
evicting the plugin's code and data from the caches.
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from configs import configured

# (module, class, method) of the SSE iterators the plugin patches
TARGETS = (("httpx_sse", "EventSource", "aiter_sse"), ("httpx2", "EventSource", "__aiter__"))


async def _timed(events: AsyncIterator[Any], spent: list[int]) -> AsyncIterator[Any]:
    """``events``, with the ns each step takes added to ``spent[0]``."""
    clock = time.perf_counter_ns
    step = events.__anext__
    try:
        while True:
            begin = clock()
            try:
                item = await step()
            except StopAsyncIteration:
                spent[0] += clock() - begin
                return
            spent[0] += clock() - begin
            spent[1] += 1
            yield item
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def _layer(method: Any, spent: list[int]) -> Callable[..., AsyncIterator[Any]]:
    def layered(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return _timed(method.__get__(self, type(self))(*args, **kwargs), spent)

    return layered


def _owners() -> Iterator[tuple[type, str]]:
    for module_name, class_name, method in TARGETS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner = getattr(module, class_name, None)
        if owner is not None and method in vars(owner):
            yield owner, method


@contextlib.contextmanager
def _below(spent: list[int]) -> Iterator[None]:
    """The timing layer between the plugin's patch and the parser: installed
    before the plugin patches the method, so that the plugin wraps it."""
    originals = [(owner, method, vars(owner)[method]) for owner, method in _owners()]
    for owner, method, original in originals:
        setattr(owner, method, _layer(original, spent))
    try:
        yield
    finally:
        for owner, method, original in originals:
            setattr(owner, method, original)


@contextlib.contextmanager
def _above(spent: list[int]) -> Iterator[None]:
    """The timing layer the application reads: around whatever the method is
    now (the plugin's wrapper under ``ours``), put back before the plugin
    removes its wrapper."""
    current = [(owner, method, vars(owner)[method]) for owner, method in _owners()]
    for owner, method, wrapper in current:
        setattr(owner, method, _layer(wrapper, spent))
    try:
        yield
    finally:
        for owner, method, wrapper in current:
            setattr(owner, method, wrapper)


async def _sample(measure: Callable[[], Awaitable[Any]], config: str) -> float:
    """ns per event between the two layers' times, under ``config``."""
    above, below = [0, 0], [0, 0]
    with _below(below), configured(config), _above(above):
        await measure()
    if not above[1] or above[1] != below[1]:
        raise RuntimeError(f"in situ: {above[1]} events above, {below[1]} below ({config})")
    return (above[0] - below[0]) / above[1]


async def event_cost(measure: Callable[[], Awaitable[Any]], rounds: int) -> dict[str, Any]:
    """Median over ``rounds`` of the µs per event the plugin's layer adds
    (``ours`` minus ``bare`` in the same round, alternating which goes first),
    and the ns the bare timing layer costs."""
    await _sample(measure, "bare")  # warm-up
    added, bare_ns = [], []
    for index in range(rounds):
        order = ("bare", "ours") if index % 2 == 0 else ("ours", "bare")
        found = {config: await _sample(measure, config) for config in order}
        added.append((found["ours"] - found["bare"]) / 1000)
        bare_ns.append(found["bare"])
    q1, median, q3 = (
        statistics.quantiles(added, n=4, method="inclusive") if len(added) > 1 else added * 3
    )
    return {
        "event_us": median,
        "event_us_q1": q1,
        "event_us_q3": q3,
        "layer_ns": statistics.median(bare_ns),
        "samples_us": added,
    }
