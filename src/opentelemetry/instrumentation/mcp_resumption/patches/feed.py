# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The feed of one stream's events: what the SSE patches (``patches.sse``,
and the loops of ``own_sse``) record for the tracker, and how a stream's
reads and its end are reported to the owner.

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
``RING`` events (a :class:`Feed`).  The tracker reads the ring when it needs
the stream's state (a resume looks up a cursor, the stream ends, telemetry
is collected): only the last events can matter then, the ids the seen
window keeps and the last received and consumed ones.  Events that a rule
must see as they come are reported one by one instead: a stream's first
event (a priming event or a ``retry:``), every event of a resumed stream or
of the legacy transport (``feeding`` says which streams are fed), and on a
stream that carries requests each event that may hold a response (the
ledger must know every answer).  :class:`Ends` is how a fed stream ends,
seen by the ``with`` around its loop.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import ResumptionGapError
from ..tracking.tracker import SEEN_WINDOW, SSE, Event
from . import fault, guarded

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

    __slots__ = (
        "_reader", "count", "counted", "drains", "held", "last_raw_id", "ring", "tap"
    )

    def __init__(self, ring: deque) -> None:
        self.ring = ring
        self._reader: Callable[[], Any] = lambda: None
        # Events handed out: the iterator's own count, read by calling this
        # (``count_by`` hands it; an attribute, not a method: one call less).
        self.count: Callable[[], int] = lambda: 0
        # Events already added to the event totals.
        self.counted = 0
        # Set by the iterator once it knows (it ended, or was cancelled): the
        # application holds the last event (True) or took it (False).
        self.held: bool | None = None
        self.last_raw_id: str | None = None
        # Told every event a drain takes (the events' room of an
        # events/stream: ``event_reports``); None for every other stream.
        self.tap: Callable[[list[Any]], Any] | None = None
        # Odd while a drain moves events from the ring to the tap: the
        # events' room, reading the ring between drains without the
        # tracker's lock, reads again rather than see them in neither.
        self.drains = 0

    def count_by(self, count: Callable[[], int]) -> None:
        """The iterator counts its events where this reads them: a variable
        of its closure, the cheapest count per event."""
        self.count = count

    def freeze(self) -> None:
        """Uninstrumented: the count stays what the totals hold already, as
        the iterator may go on counting."""
        counted = self.counted
        self.count = lambda: counted

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
        raw, previous = sse.id, self.last_raw_id
        self.last_raw_id = raw
        # (``normalised``, written out: every event reported or folded)
        return Event(
            None if not raw or raw == previous else raw,
            sse.data,
            sse.event,
            getattr(sse, "retry", None),
        )

    def drain(self) -> tuple[list[Event], bool]:
        """The events recorded since the last drain, oldest first, and
        whether the application holds the last one."""
        ring = self.ring
        # As many as it holds now (appends may go on meanwhile; only the
        # tracker, under its lock, takes from it): an empty ring, the common
        # case at a stream's end, raises nothing.
        if not ring:
            return [], self.holding()
        self.drains += 1
        try:
            raws = [ring.popleft() for _ in range(len(ring))]
            if self.tap is not None and raws:
                self.tap(raws)
        finally:
            self.drains += 1
        holding = self.holding()
        if len(raws) == RING:
            # Maybe overflowed: the oldest only says what id it carried.
            self.last_raw_id = raws.pop(0).id
        return [self.normalise(sse) for sse in raws], holding


def _frame_of(iterator: Any) -> Any:
    frame = getattr(iterator, "ag_frame", None)
    return frame if frame is not None else getattr(iterator, "gi_frame", None)

def asked_next(processor: Any, context: Any, delivered: bool) -> None:
    # Asking for the next event is taking the last one; an event that arrives
    # says so itself (``processor.event``), so this is only for reads that
    # end without one.
    if delivered:
        guarded("observing a consumed event", processor.asked_next, context)


def ended(
    processor: Any,
    context: Any,
    response: Any,
    reason: str,
    *,
    delivered: bool = False,
    closed_by_client: bool = False,
    clean: bool = False,
) -> None:
    """The stream's end reported to the owner, after the last event handed
    out if the application took it (``delivered``: one was)."""
    if delivered:
        asked_next(processor, context, delivered)
    try:  # ``guarded()`` written out: every stream ends here
        processor.ended(context, reason, closed_by_client=closed_by_client, clean=clean)
    except ResumptionGapError:
        raise
    except Exception:
        fault("observing the stream end")
    # Reported: the response's close that follows has nothing left to tell.
    processor.streams.pop(response, None)


def feeding(context: Any, processor: Any) -> bool | None:
    """Whether to feed this stream, and to look at each event's data for a
    response (True) or not (False); None when every event must be reported
    as it comes."""
    stream = context.stream
    if stream is None or stream.check is not None or stream.transport == SSE:
        return None
    if context.error is not None or not processor.enabled:
        return None
    return bool(stream.carries)


class Ends:
    """How a fed stream ends, seen by the ``with`` around its loop (ours or
    the wrapper's), and its events reported as they come."""

    __slots__ = ("context", "feed", "processor", "response")

    def __init__(self, context: Any, processor: Any, response: Any) -> None:
        self.context = context
        self.processor = processor
        self.response = response
        self.feed = Feed(deque(maxlen=RING))

    def report(self, sse: Any) -> None:
        # Each event a rule must see as it comes, reported (``guarded()``
        # written out: one call less for each).
        try:
            self.processor.feed_event(self.context, self.feed, sse)
        except ResumptionGapError:
            raise  # enforce mode: the owner told the task's reconnect loop
        except Exception:  # the host's read goes on whatever we got wrong
            fault("observing an event")

    def started(self, iterator: Any) -> Any:
        """``iterator``, the one the host reads, registered as the reader."""
        feed = self.feed
        feed._reader = self.context.reader = weakref.ref(iterator)
        try:  # ``guarded()`` written out: every fed stream starts here
            self.processor.feed(self.context, feed)
        except ResumptionGapError:
            raise
        except Exception:
            fault("observing a stream")
        return iterator

    def __enter__(self) -> Ends:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> bool:
        feed, processor, context = self.feed, self.processor, self.context
        closed_by_client = clean = False
        if kind is None:
            # The body ended as HTTP ends one: a read error would raise.
            feed.held = False
            reason, clean = "the stream ended", True
        elif issubclass(kind, GeneratorExit):
            feed.held = True
            reason, closed_by_client = "closed by the application", True
        elif issubclass(kind, ResumptionGapError):
            return False  # enforce mode: the application is told, the close reports the end
        elif issubclass(kind, Exception):
            # A read error (the ``yield`` raises nothing but GeneratorExit
            # from an application that iterates).
            feed.held = False
            reason = f"a read error ({kind.__name__})"
        else:  # cancelled while waiting for the next event
            feed.held = False
            return False
        # ``ended()``, written out (every fed stream ends here; the feed
        # reported no event it handed out as taken, so no ``asked_next``).
        try:
            processor.ended(context, reason, closed_by_client=closed_by_client, clean=clean)
        except ResumptionGapError:
            raise
        except Exception:
            fault("observing the stream end")
        processor.streams.pop(self.response, None)
        return False
