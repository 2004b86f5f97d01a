# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""SSE event iteration: httpx-sse (``EventSource.iter_sse`` / ``aiter_sse``)
and httpx2's own ``EventSource`` (``__iter__`` / ``__aiter__``).

Received and consumed, the contract every rule relies on (stated here
only): an event is *received* when the iterator hands it to the
application, and *consumed* once the application asks for the next one,
closes the response in an orderly way after it, or the body ends (or fails,
or the read is cancelled) while it waits for the next.  An iterator closed
in between, or a response closed while an exception from the event's
handler is on its way out, leaves it received but unconsumed: the
precondition of the drain race.

This module also owns what an event *is* for the rules (``normalised``):
its id, or None when it has no ``id:`` line of its own (the parsers carry
the last id over to such events); its data, ``""`` for a marker; its type;
its ``retry:``.  Nothing below reinterprets it.

The cost per event is what observing adds to the parser's own loop: a
count, and a reference to each event appended to a ring of the last
``RING`` events (a ``Feed``).  Where the library's iterator is one verified
in ``own_sse`` (its version, the hash of its module, and at each call that
wrapt still hands us that very function), the plugin is the iterator: its
own copy of the library's loop, with the library's own parser, does that
inline.  Anywhere else, a generator around the library's iterator does the
same, at the cost of a generator layer per event.  The tracker reads the
ring when it needs the stream's state (a resume looks up a cursor, the
stream ends, telemetry is collected): only the last events can matter then,
the ids the seen window keeps and the last received and consumed ones.
Events that a rule must see as they come are reported one by one instead:
a stream's first event (a priming event or a ``retry:``), every event of a
resumed stream or of the legacy transport (always through the wrapper),
and on a stream that carries requests each event that may hold a response
(the ledger must know every answer).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from ..continuity import ResumptionGapError
from ..tracker import SEEN_WINDOW, SSE, Event
from . import Targets, fault, guarded
from .own_sse import Loop, OwnLoop

if TYPE_CHECKING:  # the owner is bound in at instrument(); no import upward
    from ..monitor import ResumptionMonitor

# The ring holds one more than the seen window: its oldest event, once the
# ring may have overflowed, only tells the id the next one carries over.
RING = SEEN_WINDOW + 1


def normalised(sse: Any, previous_raw_id: str | None) -> Event:
    """The event record of one parsed SSE event; ``previous_raw_id`` is the
    ``id`` the parser gave the event before it."""
    raw = sse.id
    return Event(
        None if not raw or raw == previous_raw_id else raw,
        sse.data,
        sse.event,
        getattr(sse, "retry", None),
    )


class Feed:
    """What the iterator of one stream records for the tracker: a ring of
    references to the last events it handed out (no copies, nothing
    parsed), their count, and whether the application still holds the last
    one.  Read under the tracker's lock, from any thread; the iterator's
    appends are atomic."""

    __slots__ = ("_count", "_reader", "counted", "held", "last_raw_id", "ring")

    def __init__(self, ring: deque) -> None:
        self.ring = ring
        self._reader: Callable[[], Any] = lambda: None
        # Events handed out: read from the iterator's own count (count_by).
        self._count: Callable[[], int] = lambda: 0
        # Events already added to the event totals.
        self.counted = 0
        # Set by the iterator once it knows (it ended, or was cancelled): the
        # application holds the last event (True) or took it (False).
        self.held: bool | None = None
        self.last_raw_id: str | None = None

    def read_by(self, iterator: Any) -> None:
        self._reader = weakref.ref(iterator)

    def count_by(self, count: Callable[[], int]) -> None:
        """The iterator counts its events where this reads them: a variable
        of its closure, the cheapest count per event."""
        self._count = count

    def count(self) -> int:
        return self._count()

    def freeze(self) -> None:
        """Uninstrumented: the count stays what the totals hold already, as
        the iterator may go on counting."""
        counted = self.counted
        self._count = lambda: counted

    def holding(self) -> bool:
        """The application was handed the last event and has not asked for
        the next: the iterator is suspended where it handed it out."""
        if self.held is not None:
            return self.held
        iterator = self._reader()
        if iterator is None:
            # Dropped while it held an event (every other way out of the
            # iterator says so in ``held``); its finalizer, that closes it
            # there, may still be to come.
            return True
        running = getattr(iterator, "ag_running", None)
        if running is None:
            running = iterator.gi_running
        # A generator runs from the moment it is asked for the next event
        # until it hands one out: while it waits for the socket too.
        return not running and _frame_of(iterator) is not None

    def normalise(self, sse: Any) -> Event:
        """The record of the next event, in order (updates the carried id)."""
        event = normalised(sse, self.last_raw_id)
        self.last_raw_id = sse.id
        return event

    def drain(self) -> tuple[list[Event], bool]:
        """The events recorded since the last drain, oldest first, and
        whether the application holds the last one."""
        ring = self.ring
        # As many as it holds now (appends may go on meanwhile; only the
        # tracker, under its lock, takes from it): an empty ring, the common
        # case at a stream's end, raises nothing.
        raws = [ring.popleft() for _ in range(len(ring))]
        holding = self.holding()
        if len(raws) == RING:
            # Maybe overflowed: the oldest only says what id it carried.
            self.last_raw_id = raws.pop(0).id
        return [self.normalise(sse) for sse in raws], holding


def _frame_of(iterator: Any) -> Any:
    frame = getattr(iterator, "ag_frame", None)
    return frame if frame is not None else getattr(iterator, "gi_frame", None)


def _response_of(event_source: Any) -> Any:
    return getattr(event_source, "response", None) or getattr(event_source, "_response", None)


def _stream_of(owner: ResumptionMonitor, event_source: Any) -> tuple[Any, Any] | None:
    """(the response ``event_source`` reads, its stream context) where the
    owner observes that response; None otherwise."""
    if not owner.active:
        return None
    response = _response_of(event_source)
    context = owner.streams.get(response) if response is not None else None
    return None if context is None else (response, context)


def _asked_next(processor: Any, context: Any, delivered: bool) -> None:
    # Asking for the next event is taking the last one; an event that arrives
    # says so itself (``processor.event``), so this is only for reads that
    # end without one.
    if delivered:
        guarded("observing a consumed event", processor.asked_next, context)


def _ended(
    processor: Any,
    context: Any,
    response: Any,
    reason: str,
    *,
    delivered: bool = False,
    closed_by_client: bool = False,
    clean: bool = False,
) -> None:
    _asked_next(processor, context, delivered)
    guarded(
        "observing the stream end", processor.ended, context, reason,
        closed_by_client=closed_by_client, clean=clean,
    )
    # Reported: the response's close that follows has nothing left to tell.
    processor.streams.pop(response, None)


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


def _report(processor: Any, context: Any, feed: Feed, sse: Any) -> None:
    """One event of a fed stream reported as it comes (after the ring)."""
    try:
        processor.feed_event(context, feed, sse)
    except ResumptionGapError:
        raise  # enforce mode: the owner told the task's reconnect loop
    except Exception:  # the host's read goes on whatever we got wrong
        fault("observing an event")


def _fed(context: Any, processor: Any) -> bool | None:
    """Whether to feed this stream, and to look at each event's data for a
    response (True) or not (False); None when every event must be reported
    as it comes."""
    stream = context.stream
    if stream is None or stream.check is not None or stream.transport == SSE:
        return None
    if context.error is not None or not processor.enabled:
        return None
    return bool(stream.carries)


class _Ends:
    """How a fed stream ends, seen by the ``with`` around its loop (ours or
    the wrapper's), and its events reported as they come."""

    __slots__ = ("context", "feed", "processor", "response")

    def __init__(self, context: Any, processor: Any, response: Any) -> None:
        self.context = context
        self.processor = processor
        self.response = response
        self.feed = Feed(deque(maxlen=RING))

    def report(self, sse: Any) -> None:
        _report(self.processor, self.context, self.feed, sse)

    def started(self, iterator: Any) -> Any:
        """``iterator``, the one the host reads, registered as the reader."""
        feed = self.feed
        feed.read_by(iterator)
        self.context.reader = feed._reader
        guarded("observing a stream", self.processor.feed, self.context, feed)
        return iterator

    def __enter__(self) -> _Ends:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> bool:
        feed, processor, context, response = self.feed, self.processor, self.context, self.response
        if kind is None:
            # The body ended as HTTP ends one: a read error would raise.
            feed.held = False
            _ended(processor, context, response, "the stream ended", clean=True)
        elif issubclass(kind, GeneratorExit):
            feed.held = True
            _ended(processor, context, response, "closed by the application", closed_by_client=True)
        elif issubclass(kind, ResumptionGapError):
            pass  # enforce mode: the application is told, the close reports the end
        elif issubclass(kind, Exception):
            # A read error (the ``yield`` raises nothing but GeneratorExit
            # from an application that iterates).
            feed.held = False
            _ended(processor, context, response, f"a read error ({kind.__name__})")
        else:  # cancelled while waiting for the next event
            feed.held = False
        return False


def _chosen(context: Any, processor: Any) -> bool | None:
    return guarded("choosing how to observe a stream", _fed, context, processor)


def _observed(
    events: Iterator[Any], context: Any, processor: Any, response: Any, scan: bool | None
) -> Iterator[Any]:
    if scan is None:
        iterator = _each(events, context, processor, response)
        context.reader = weakref.ref(iterator)
        return iterator
    ends = _Ends(context, processor, response)
    return ends.started(_fed_iterator(events, ends, scan))


def _aobserved(
    events: AsyncIterator[Any], context: Any, processor: Any, response: Any, scan: bool | None
) -> AsyncIterator[Any]:
    if scan is None:
        iterator = _aeach(events, context, processor, response)
        context.reader = weakref.ref(iterator)
        return iterator
    ends = _Ends(context, processor, response)
    return ends.started(_afed_iterator(events, ends, scan))


def _fed_iterator(events: Iterator[Any], ends: _Ends, scan: bool) -> Iterator[Any]:
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


def _afed_iterator(events: AsyncIterator[Any], ends: _Ends, scan: bool) -> AsyncIterator[Any]:
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
                _ended(
                    processor, context, response, "the stream ended",
                    delivered=delivered, clean=True,
                )
                return
            except Exception as error:
                reason = f"a read error ({type(error).__name__})"
                _ended(processor, context, response, reason, delivered=delivered)
                raise
            except BaseException:  # cancelled while waiting for the next event
                _asked_next(processor, context, delivered)
                raise
            previous = _observe(processor, event, context, sse, previous)
            delivered = True
            yield sse
    except GeneratorExit:
        _ended(processor, context, response, "closed by the application", closed_by_client=True)
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
                _ended(
                    processor, context, response, "the stream ended",
                    delivered=delivered, clean=True,
                )
                return
            except Exception as error:
                reason = f"a read error ({type(error).__name__})"
                _ended(processor, context, response, reason, delivered=delivered)
                raise
            except BaseException:  # cancelled while waiting for the next event
                _asked_next(processor, context, delivered)
                raise
            previous = _observe(processor, event, context, sse, previous)
            delivered = True
            yield sse
    except GeneratorExit:
        _ended(processor, context, response, "closed by the application", closed_by_client=True)
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
    found = guarded("finding the stream", _stream_of, owner, instance)
    if found is None:
        return wrapped(*args, **kwargs)
    response, context = found
    if context.stream is None:
        return candidate(wrapped(*args, **kwargs), context, owner, response)
    scan = _chosen(context, owner)
    if scan is not None and not args and not kwargs:
        loop = guarded("choosing our own loop", own.loop_for, wrapped)
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
    ends = _Ends(context, processor, response)
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

