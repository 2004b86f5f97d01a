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

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from opentelemetry.instrumentation.utils import unwrap
from wrapt import wrap_function_wrapper

from . import active, guarded
from .http import reading, streams

_logger = logging.getLogger(__name__)


def _response_of(event_source: Any) -> Any:
    return getattr(event_source, "response", None) or getattr(event_source, "_response", None)


def _context_for(event_source: Any):
    if active.processor is None:
        return None
    response = _response_of(event_source)
    return streams.get(response) if response is not None else None


def _new_id(sse: Any, previous: str | None) -> str | None:
    # SSE parsers carry the last id over to events that have no `id:` line;
    # such an event claims no id of its own.
    event_id = sse.id or None
    return None if event_id == previous else event_id


def _observed(
    events: Iterator[Any], context: Any, processor: Any, response: Any = None
) -> Iterator[Any]:
    previous: str | None = None
    delivered = False
    try:
        while True:
            if delivered:
                guarded("observing a consumed event", processor.asked_next, context)
            token = reading.set(id(response))
            try:
                sse = next(events)
            except StopIteration:
                guarded("observing the stream end", processor.ended, context, "the stream ended")
                return
            except Exception as error:
                reason = f"a read error ({type(error).__name__})"
                guarded("observing a stream error", processor.ended, context, reason)
                raise
            finally:
                reading.reset(token)
            event_id = _new_id(sse, previous)
            previous = sse.id or None
            guarded("observing an event", processor.event, context, sse.event, event_id, sse.data)
            delivered = True
            yield sse
    except GeneratorExit:
        guarded(
            "observing a closed stream",
            processor.ended,
            context,
            "closed by the application",
            closed_by_client=True,
        )
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
    try:
        while True:
            if delivered:
                guarded("observing a consumed event", processor.asked_next, context)
            token = reading.set(id(response))
            try:
                sse = await events.__anext__()
            except StopAsyncIteration:
                guarded("observing the stream end", processor.ended, context, "the stream ended")
                return
            except Exception as error:
                reason = f"a read error ({type(error).__name__})"
                guarded("observing a stream error", processor.ended, context, reason)
                raise
            finally:
                reading.reset(token)
            event_id = _new_id(sse, previous)
            previous = sse.id or None
            guarded("observing an event", processor.event, context, sse.event, event_id, sse.data)
            delivered = True
            yield sse
    except GeneratorExit:
        guarded(
            "observing a closed stream",
            processor.ended,
            context,
            "closed by the application",
            closed_by_client=True,
        )
        raise
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def _iterate(wrapped, instance, args, kwargs):
    events = wrapped(*args, **kwargs)
    context = guarded("finding the stream", _context_for, instance)
    if context is None:
        return events
    return _observed(events, context, active.processor, _response_of(instance))


def _aiterate(wrapped, instance, args, kwargs):
    events = wrapped(*args, **kwargs)
    context = guarded("finding the stream", _context_for, instance)
    if context is None:
        return events
    return _aobserved(events, context, active.processor, _response_of(instance))


TARGETS = {
    "httpx_sse": (("EventSource.iter_sse", _iterate), ("EventSource.aiter_sse", _aiterate)),
    "httpx2": (("EventSource.__iter__", _iterate), ("EventSource.__aiter__", _aiterate)),
}


def instrument(module_names: tuple[str, ...]) -> list[tuple[Any, str]]:
    patched = []
    for module_name in module_names:
        module = __import__(module_name)
        for target, wrapper in TARGETS[module_name]:
            class_name, method = target.split(".")
            owner = getattr(module, class_name, None)
            if owner is None or not hasattr(owner, method):
                # httpx2 before 2.5 has no EventSource: its HTTP facts are still
                # observed, and the other libraries' events too.
                _logger.debug("%s has no %s; its SSE events are not observed", module_name, target)
                continue
            wrap_function_wrapper(module_name, target, wrapper)
            patched.append((owner, method))
    return patched


def uninstrument(patched: list[tuple[Any, str]]) -> None:
    for owner, method in patched:
        unwrap(owner, method)
