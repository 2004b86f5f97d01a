# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""SSE event iteration: httpx-sse (``EventSource.iter_sse`` / ``aiter_sse``)
and httpx2's own ``EventSource`` (``__iter__`` / ``__aiter__``).

An event counts as *received* when the iterator hands it to the application
and as *consumed* only when the application asks for the next one; an
iterator closed in between leaves it received but unconsumed, which is the
precondition of the drain race.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..continuity import ResumptionGapError
from . import active, enforced, fault, guarded
from .http import reading, streams


def _response_of(event_source: Any) -> Any:
    return getattr(event_source, "response", None) or getattr(event_source, "_response", None)


def _context_for(event_source: Any):
    if active.processor is None:
        return None
    response = _response_of(event_source)
    return streams.get(response) if response is not None else None


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
    streams.pop(response, None)


def _observe(event: Any, context: Any, sse: Any, previous: str | None) -> str | None:
    """Reports one event (``event`` is the processor's); returns its id as the
    parser carries it.  ``guarded()`` written out: this runs for every event."""
    # SSE parsers carry the last id over to events that have no `id:` line;
    # such an event claims no id of its own.
    event_id = sse.id or None
    try:
        retry = getattr(sse, "retry", None)
        if retry is not None:  # rare: a polling server says how often
            active.processor.retry_seen(context, retry)
        event(context, sse.event, None if event_id == previous else event_id, sse.data)
    except ResumptionGapError as error:
        enforced(error)
        raise
    except Exception:  # the host's read goes on whatever we got wrong
        fault("observing an event")
    return event_id


def _observed(
    events: Iterator[Any], context: Any, processor: Any, response: Any = None
) -> Iterator[Any]:
    previous: str | None = None
    delivered = False
    event = processor.event  # bound once: it runs for every event
    response_id = id(response)
    try:
        while True:
            token = reading.set(response_id)
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
            finally:
                reading.reset(token)
            previous = _observe(event, context, sse, previous)
            delivered = True
            yield sse
    except GeneratorExit:
        _ended(processor, context, response, "closed by the application", closed_by_client=True)
        raise
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


async def _aobserved(
    events: AsyncIterator[Any], context: Any, processor: Any, response: Any = None
) -> AsyncIterator[Any]:
    previous: str | None = None
    delivered = False
    event = processor.event  # bound once: it runs for every event
    response_id = id(response)
    try:
        while True:
            token = reading.set(response_id)
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
            finally:
                reading.reset(token)
            previous = _observe(event, context, sse, previous)
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
    streams.pop(response, None)  # not MCP: nothing more to look at
    return False


def _candidate(
    events: Iterator[Any], context: Any, processor: Any, response: Any
) -> Iterator[Any]:
    """An event stream whose request and answer showed no MCP: one look at
    its first event, then either observed as MCP or passed through."""
    try:
        first = next(events)
    except StopIteration:
        streams.pop(response, None)
        return
    if not _promoted(processor, context, response, first):
        yield first
        yield from events
        return
    yield from _observed(_prepend(first, events), context, processor, response)


def _prepend(first: Any, events: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from events  # closing this closes ``events`` too


async def _acandidate(
    events: AsyncIterator[Any], context: Any, processor: Any, response: Any
) -> AsyncIterator[Any]:
    try:
        first = await events.__anext__()
    except StopAsyncIteration:
        streams.pop(response, None)
        return
    if _promoted(processor, context, response, first):
        events = _aprepend(first, events)
        observed = _aobserved(events, context, processor, response)
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


def _iterate(wrapped, instance, args, kwargs):
    events = wrapped(*args, **kwargs)
    context = guarded("finding the stream", _context_for, instance)
    if context is None:
        return events
    if context.stream is None:
        return _candidate(events, context, active.processor, _response_of(instance))
    return _observed(events, context, active.processor, _response_of(instance))


def _aiterate(wrapped, instance, args, kwargs):
    events = wrapped(*args, **kwargs)
    context = guarded("finding the stream", _context_for, instance)
    if context is None:
        return events
    if context.stream is None:
        return _acandidate(events, context, active.processor, _response_of(instance))
    return _aobserved(events, context, active.processor, _response_of(instance))


# What McpResumptionInstrumentor.instrument() wraps, by library (with
# patches.wrap_targets, as each library is imported).
TARGETS = {
    "httpx_sse": (("EventSource.iter_sse", _iterate), ("EventSource.aiter_sse", _aiterate)),
    "httpx2": (("EventSource.__iter__", _iterate), ("EventSource.__aiter__", _aiterate)),
}

