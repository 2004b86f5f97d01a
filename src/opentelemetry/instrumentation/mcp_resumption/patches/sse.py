# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""SSE event iteration: the patches of httpx-sse (``EventSource.iter_sse`` /
``aiter_sse``) and of httpx2's own ``EventSource`` (``__iter__`` /
``__aiter__``).

Each patch finds the stream context of the response the ``EventSource``
reads, and observes its events one of three ways:

* fed (``patches.feed``, where the stream is one ``feeding`` chooses):
  where the library's iterator is one verified in ``own_sse`` (its version,
  the hash of its module, and at each call that wrapt still hands us that
  very function), the plugin is the iterator: its own copy of the library's
  loop, with the library's own parser, feeds the ring inline.  Anywhere
  else, a generator around the library's iterator does the same, at the
  cost of a generator layer per event;
* every event reported as it comes (a resumed stream, the legacy
  transport), always through a generator around the library's iterator;
* a candidate (an event stream whose request and answer showed no MCP):
  one look at its first event, then observed as MCP (an ``endpoint`` event:
  the legacy transport) or passed through.

What *received* and *consumed* mean, and what an event is for the rules,
are ``patches.feed``'s; nothing here reinterprets them.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import ResumptionGapError
from . import Targets, fault, guarded
from .feed import Ends, asked_next, ended, feeding, normalised
from .own_sse import Loop, OwnLoop

if TYPE_CHECKING:  # the owner is bound in at instrument(); no import upward
    from ..owner.monitor import ResumptionMonitor

def _observe(
    processor: Any, event: Any, context: Any, sse: Any, previous: str | None
) -> str | None:
    """Reports one event (``event`` is ``processor.event``, bound once);
    returns its id as the parser carries it.  ``guarded()`` written out: this
    runs for every event."""
    record = normalised(sse, previous)
    try:
        if record.retry is not None:  # rare: a polling server says how often
            processor.retry_seen(context, record.retry)
        event(context, record.type, record.id, record.data)
    except ResumptionGapError:
        raise  # enforce mode: the owner told the task's reconnect loop
    except Exception:  # the host's read goes on whatever we got wrong
        fault("observing an event")
    return sse.id


def _chosen(context: Any, processor: Any) -> bool | None:
    return guarded("choosing how to observe a stream", feeding, context, processor)


def _observed(
    events: Iterator[Any], context: Any, processor: Any, response: Any, scan: bool | None
) -> Iterator[Any]:
    if scan is None:
        iterator = _each(events, context, processor, response)
        context.reader = weakref.ref(iterator)
        return iterator
    ends = Ends(context, processor, response)
    return ends.started(_fed_iterator(events, ends, scan))


def _aobserved(
    events: AsyncIterator[Any], context: Any, processor: Any, response: Any, scan: bool | None
) -> AsyncIterator[Any]:
    if scan is None:
        iterator = _aeach(events, context, processor, response)
        context.reader = weakref.ref(iterator)
        return iterator
    ends = Ends(context, processor, response)
    return ends.started(_afed_iterator(events, ends, scan))


def _fed_iterator(events: Iterator[Any], ends: Ends, scan: bool) -> Iterator[Any]:
    """The wrapper around the library's iterator, where our own loop is not
    safe; its per-event lines are those of the loops in ``own_sse``."""
    count = 0

    def loop() -> Iterator[Any]:
        nonlocal count
        append = ends.feed.ring.append
        report = ends.report
        looking = first = True
        try:
            with ends:
                for sse in events:
                    count += 1
                    if looking:
                        if first or '"result"' in sse.data or '"error"' in sse.data:
                            report(sse)
                        else:
                            append(sse)
                        first, looking = False, scan
                    else:
                        append(sse)
                    yield sse
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    ends.feed.count_by(lambda: count)
    return loop()


def _afed_iterator(events: AsyncIterator[Any], ends: Ends, scan: bool) -> AsyncIterator[Any]:
    count = 0

    async def loop() -> AsyncIterator[Any]:
        nonlocal count
        append = ends.feed.ring.append
        report = ends.report
        looking = first = True
        try:
            with ends:
                async for sse in events:
                    count += 1
                    if looking:
                        if first or '"result"' in sse.data or '"error"' in sse.data:
                            report(sse)
                        else:
                            append(sse)
                        first, looking = False, scan
                    else:
                        append(sse)
                    yield sse
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    ends.feed.count_by(lambda: count)
    return loop()


def _each(
    events: Iterator[Any], context: Any, processor: Any, response: Any = None
) -> Iterator[Any]:
    """Every event reported as it comes (a resume, the legacy transport)."""
    previous: str | None = None
    delivered = False
    event = processor.event  # bound once: it runs for every event
    try:
        while True:
            try:
                sse = next(events)
            except StopIteration:
                # The body ended as HTTP ends one: a read error would raise.
                ended(
                    processor, context, response, "the stream ended",
                    delivered=delivered, clean=True,
                )
                return
            except Exception as error:
                reason = f"a read error ({type(error).__name__})"
                ended(processor, context, response, reason, delivered=delivered)
                raise
            except BaseException:  # cancelled while waiting for the next event
                asked_next(processor, context, delivered)
                raise
            previous = _observe(processor, event, context, sse, previous)
            delivered = True
            yield sse
    except GeneratorExit:
        ended(processor, context, response, "closed by the application", closed_by_client=True)
        raise
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


async def _aeach(
    events: AsyncIterator[Any], context: Any, processor: Any, response: Any = None
) -> AsyncIterator[Any]:
    previous: str | None = None
    delivered = False
    event = processor.event  # bound once: it runs for every event
    try:
        while True:
            try:
                sse = await events.__anext__()
            except StopAsyncIteration:
                ended(
                    processor, context, response, "the stream ended",
                    delivered=delivered, clean=True,
                )
                return
            except Exception as error:
                reason = f"a read error ({type(error).__name__})"
                ended(processor, context, response, reason, delivered=delivered)
                raise
            except BaseException:  # cancelled while waiting for the next event
                asked_next(processor, context, delivered)
                raise
            previous = _observe(processor, event, context, sse, previous)
            delivered = True
            yield sse
    except GeneratorExit:
        ended(processor, context, response, "closed by the application", closed_by_client=True)
        raise
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def _promoted(processor: Any, context: Any, response: Any, sse: Any) -> bool:
    """A candidate stream's first event decides whether it is MCP."""
    if guarded("checking for an endpoint event", processor.promote, context, sse.event):
        return True
    processor.streams.pop(response, None)  # not MCP: nothing more to look at
    return False


def _candidate(
    events: Iterator[Any], context: Any, processor: Any, response: Any
) -> Iterator[Any]:
    """An event stream whose request and answer showed no MCP: one look at
    its first event, then either observed as MCP or passed through."""
    try:
        first = next(events)
    except StopIteration:
        processor.streams.pop(response, None)
        return
    if not _promoted(processor, context, response, first):
        yield first
        yield from events
        return
    scan = _chosen(context, processor)
    yield from _observed(_prepend(first, events), context, processor, response, scan)


def _prepend(first: Any, events: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from events  # closing this closes ``events`` too


async def _acandidate(
    events: AsyncIterator[Any], context: Any, processor: Any, response: Any
) -> AsyncIterator[Any]:
    try:
        first = await events.__anext__()
    except StopAsyncIteration:
        processor.streams.pop(response, None)
        return
    if _promoted(processor, context, response, first):
        events = _aprepend(first, events)
        observed = _aobserved(events, context, processor, response, _chosen(context, processor))
        try:
            async for sse in observed:
                yield sse
        finally:
            await observed.aclose()
        return
    try:
        yield first
        async for sse in events:
            yield sse
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def _aprepend(first: Any, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        yield first
        async for sse in events:
            yield sse
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def _iterate(
    owner: ResumptionMonitor,
    own: OwnLoop,
    candidate: Callable[..., Any],
    observed: Callable[..., Any],
    wrapped,
    instance,
    args,
    kwargs,
):
    """The patch of a library's iterator method, sync or async (``candidate``
    and ``observed``: ``_candidate`` and ``_observed`` or their async twins)."""
    # Each step ``guarded()`` written out: every stream is read through here.
    # The response the EventSource reads (httpx-sse names it ``_response``,
    # httpx2 ``response``), and its context where the owner observes it.
    context = response = None
    if owner.active:
        try:
            response = getattr(instance, "response", None) or getattr(
                instance, "_response", None
            )
            if response is not None:
                context = owner.streams.get(response)
        except Exception:
            fault("finding the stream")
            context = None
    if context is None:
        return wrapped(*args, **kwargs)
    if context.stream is None:
        return candidate(wrapped(*args, **kwargs), context, owner, response)
    try:
        scan = feeding(context, owner)
    except Exception:
        fault("choosing how to observe a stream")
        scan = None
    if scan is not None and not args and not kwargs:
        function = getattr(wrapped, "__func__", None)
        if function is not None and function is own.function:
            loop = own.loop  # verified already, and handed the very function
        else:
            try:
                loop = own.loop_for(wrapped)
            except Exception:
                fault("choosing our own loop")
                loop = None
        if loop is not None:
            return _own_fed(loop, own.names, instance, context, owner, response, scan)
    return observed(wrapped(*args, **kwargs), context, owner, response, scan)


def _own_fed(
    loop: Loop, names: dict, instance: Any, context: Any, processor: Any, response: Any,
    scan: bool,
) -> Any:
    """Our own loop in place of the library's iterator, fed as
    ``_fed_iterator`` feeds; ``names``, the library module's globals, lend
    it the library's parser."""
    ends = Ends(context, processor, response)
    return ends.started(loop(instance, names, ends, scan))


# The iterator methods of each library's EventSource: (library, sync, async).
_METHODS = (
    ("httpx_sse", "EventSource.iter_sse", "EventSource.aiter_sse"),
    ("httpx2", "EventSource.__iter__", "EventSource.__aiter__"),
)


def targets(owner: ResumptionMonitor, library: str) -> Targets:
    """What McpResumptionInstrumentor.instrument() wraps in ``library``'s
    EventSource for ``owner`` (with patches.wrap_targets, as the library is
    imported)."""
    [(sync, asynchronous)] = [methods for name, *methods in _METHODS if name == library]
    return (
        (sync, partial(_iterate, owner, OwnLoop(library, sync), _candidate, _observed)),
        (
            asynchronous,
            partial(_iterate, owner, OwnLoop(library, asynchronous), _acandidate, _aobserved),
        ),
    )
