# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The one span processor this instrumentation adds to a TracerProvider.

The SDK cannot remove a span processor.  Adding the ContinuityProcessor
itself on every ``instrument()`` left one per cycle on the provider, each
called at every span start; instead one hook per provider is added once and
pointed at the processor of the current cycle (none while uninstrumented).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor


class SpanHook(SpanProcessor):
    def __init__(self) -> None:
        self.target: Any = None  # a ContinuityProcessor, or None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        target = self.target
        if target is not None:
            target.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        target = self.target
        if target is not None:
            target.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        target = self.target
        return target.force_flush(timeout_millis) if target is not None else True


_hooks: weakref.WeakKeyDictionary[Any, SpanHook] = weakref.WeakKeyDictionary()
_hooks_lock = threading.Lock()


def attach(tracer_provider: Any, processor: Any) -> bool:
    """Point ``tracer_provider``'s hook at ``processor``; False where the
    provider takes no span processors (not the SDK's)."""
    add_span_processor = getattr(tracer_provider, "add_span_processor", None)
    if add_span_processor is None:
        return False
    with _hooks_lock:
        hook = _hooks.get(tracer_provider)
        if hook is None:
            hook = _hooks[tracer_provider] = SpanHook()
            add_span_processor(hook)
    hook.target = processor
    return True


def detach(tracer_provider: Any, processor: Any) -> None:
    hook = _hooks.get(tracer_provider) if tracer_provider is not None else None
    if hook is not None and hook.target is processor:
        hook.target = None
