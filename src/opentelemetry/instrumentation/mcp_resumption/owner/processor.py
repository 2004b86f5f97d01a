# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""ContinuityProcessor: the span-processor face of the one owner.

Its only span job is ``on_start``: an HTTP client span that the httpx
instrumentation opens inside a patched ``send`` gets the request's MCP
attributes (session, cursor, protocol version), and its recorded URLs lose
the legacy transport's raw session id.  Everything else, the checks and the
telemetry they write, is :class:`~.monitor.ResumptionMonitor`'s, which this
class is: one object, made by ``instrument()`` (or by hand and passed as
``instrument(processor=...)``) and bound into every patch.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

from opentelemetry import metrics, trace

from .. import config
from ..telemetry import semconv as sc
from ..telemetry.redaction import redact_urls
from . import span_hook
from .monitor import ResumptionMonitor

_logger = logging.getLogger(__name__)


class ContinuityProcessor(ResumptionMonitor, SpanProcessor):
    """Runs the continuity checks for every MCP stream the patches observe.

    The instrumentor creates one and adds it to the SDK TracerProvider; it
    can also be built and passed by hand: ``McpResumptionInstrumentor()
    .instrument(processor=ContinuityProcessor(...))``, with the providers to
    write to and ``settings`` (or settings one by one, as ``instrument()``
    takes them).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        logger_provider: Any | None = None,
        settings: config.Settings | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            logger_provider=logger_provider,
            settings=settings,
            **overrides,
        )
        self._span_source = tracer_provider  # None: the global one, maybe set later
        self._said_unattached = False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        scoped = self.request_scope.get()
        if scoped is None or not self.enabled or span.kind is not SpanKind.CLIENT:
            return
        attributes, query_names_session = scoped
        if attributes:
            span.set_attributes(attributes)
        if query_names_session and self.settings.redact_urls:  # also where ids are omitted
            session = attributes.get(sc.MCP_SESSION_ID) if attributes else None
            redact_urls(span, session or "REDACTED")

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def attach(self) -> bool:
        """Receive span starts from the tracer provider, once it is the SDK's:
        it may be set after ``instrument()``."""
        provider = self._span_source or trace.get_tracer_provider()
        self.attached = span_hook.attach(provider, self)
        if not self.attached and not self._said_unattached:
            self._said_unattached = True
            _logger.debug(
                "mcp-resumption: %s takes no span processors; HTTP client spans get no MCP "
                "attributes until an SDK TracerProvider is set, metrics and log events count",
                type(provider).__name__,
            )
        return self.attached

    def shutdown(self) -> None:
        span_hook.detach(self._span_source or trace.get_tracer_provider(), self)
        self.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._deferred.run()
        return True
