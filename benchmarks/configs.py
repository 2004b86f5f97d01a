"""The four configurations, switched in one process: instrument on entry,
uninstrument on exit, fresh SDK providers each time (the SDK cannot remove a
span processor, so reusing a provider would pile up disabled ones)."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler

CONFIGS = ("bare", "httpx-instr", "ours", "ours ALWAYS_OFF")


class _NullExporter(SpanExporter):
    """Spans are built and handed to an exporter that drops them: the cost
    measured is the instrumentation's, not a collector's."""

    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _httpx_instrumentors() -> list[Any]:
    from opentelemetry.instrumentation import httpx as otel_httpx

    found = []
    if importlib.util.find_spec("httpx") is not None:
        found.append(otel_httpx.HTTPXClientInstrumentor())
    # At the floors (mcp 1.x env) the httpx instrumentation predates httpx2.
    if importlib.util.find_spec("httpx2") is not None and hasattr(
        otel_httpx, "HTTPX2ClientInstrumentor"
    ):
        found.append(otel_httpx.HTTPX2ClientInstrumentor())
    return found


@contextlib.contextmanager
def configured(name: str, *, span_processor: Any = None, **settings: Any) -> Iterator[Any]:
    """Yields our ContinuityProcessor where the configuration has one, else
    None; ``settings`` go to our instrument() (e.g. ``max_streams``), and
    ``span_processor``, if any, onto the tracer provider (a stand-in's hook)."""
    if name == "bare":
        yield None
        return
    sampler: Sampler = ALWAYS_OFF if "ALWAYS_OFF" in name else ALWAYS_ON
    tracer_provider = TracerProvider(sampler=sampler)
    tracer_provider.add_span_processor(SimpleSpanProcessor(_NullExporter()))
    if span_processor is not None:
        tracer_provider.add_span_processor(span_processor)
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    logger_provider = LoggerProvider()
    providers = {"tracer_provider": tracer_provider, "meter_provider": meter_provider}
    instrumentors = _httpx_instrumentors()
    for instrumentor in instrumentors:
        instrumentor.instrument(**providers)
    processor = None
    if name.startswith("ours"):
        from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

        ours = McpResumptionInstrumentor()
        ours.instrument(**providers, logger_provider=logger_provider, **settings)
        instrumentors.append(ours)
        processor = ours.processor
    try:
        yield processor
    finally:
        for instrumentor in reversed(instrumentors):
            instrumentor.uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()
        logger_provider.shutdown()
