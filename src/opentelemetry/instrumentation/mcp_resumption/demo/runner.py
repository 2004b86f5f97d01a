# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Runs the wire scenarios with the plugin enabled and reads back what it
detected, from the same telemetry a user's backend would receive."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from .. import McpResumptionInstrumentor
from .. import semconv as sc
from .scenarios import all_scenarios

SETTLE_SECONDS = 1.0  # the confirmation window the demo runs with


def _sums(reader: InMemoryMetricReader, metric_name: str, attribute: str) -> dict[str, int]:
    """A counter's total per value of one attribute."""
    sums: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == metric_name:
                    for point in metric.data.data_points:
                        key = str(point.attributes.get(attribute))
                        sums[key] = sums.get(key, 0) + int(point.value)
    # every server's series start at 0: only what was counted
    return {key: total for key, total in sums.items() if total}


def _outcomes(reader: InMemoryMetricReader) -> dict[str, int]:
    return _sums(reader, sc.ATTEMPTS[0], sc.RESUMPTION_OUTCOME)


def _prometheus_reader(port: int) -> MetricReader:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    start_http_server(port, addr="127.0.0.1")
    return PrometheusMetricReader()


def _otlp(tracer_provider: TracerProvider, logger_provider: LoggerProvider) -> list[MetricReader]:
    """OTLP/HTTP export of all three signals, when the standard variable asks."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return []
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    return [PeriodicExportingMetricReader(OTLPMetricExporter())]


def run(
    names: Iterable[str] | None = None,
    *,
    prometheus_port: int | None = None,
    hold: float = 0.0,
    report: Callable[[list[dict], dict[str, dict[str, int]]], None] | None = None,
) -> tuple[list[dict], dict[str, dict[str, int]]]:
    """Run the scenarios (all, or ``names``); return one row each, and the
    metric totals (resumes by outcome, gaps by kind) of the whole run.

    With ``prometheus_port`` the metrics are served on 127.0.0.1 for a scrape,
    and kept up ``hold`` seconds after ``report`` was given the results."""
    wanted = set(names or ())
    resource = Resource.create({"service.name": "mcp-resumption-demo"})
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    tracer_provider = TracerProvider(resource=resource)
    reader = InMemoryMetricReader()
    readers: list[Any] = [reader, *_otlp(tracer_provider, logger_provider)]
    if prometheus_port is not None:
        readers.append(_prometheus_reader(prometheus_port))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        logger_provider=logger_provider,
        confirm_timeout=SETTLE_SECONDS,
    )
    rows = []
    try:
        for scenario in all_scenarios():
            if wanted and scenario.name not in wanted:
                continue
            print(f"running {scenario.name} ...", file=sys.stderr, flush=True)
            logs.clear()
            before = _outcomes(reader)
            wire = asyncio.run(scenario.run())
            time.sleep(SETTLE_SECONDS + 0.2)  # let open confirmation windows close
            after = _outcomes(reader)
            outcomes = sorted(k for k in after if after[k] > before.get(k, 0))
            detected = sorted(
                {
                    str(record.log_record.attributes.get(sc.GAP_KIND))
                    for record in logs.get_finished_logs()
                }
            )
            expected = sorted(scenario.expected_gaps)
            rows.append(
                {
                    "scenario": scenario.name,
                    "happened": scenario.happened,
                    "expected": expected,
                    "detected": detected,
                    "outcome": ",".join(outcomes) or "-",
                    # A reconnect loop makes several attempts: the expected
                    # outcome must be among them, and a control none that is a gap.
                    "pass": detected == expected
                    and scenario.expected_outcome in outcomes
                    and (bool(expected) or "gap" not in outcomes),
                    "resumes": len(wire.resumes),
                }
            )
        totals = {
            "resumes by outcome": _outcomes(reader),
            "gaps by kind": _sums(reader, sc.GAPS[0], sc.GAP_KIND),
        }
        if report is not None:
            report(rows, totals)
        if hold > 0:
            print(f"holding the metrics endpoint for {hold:g} s ...", file=sys.stderr, flush=True)
            time.sleep(hold)
    finally:
        instrumentor.uninstrument()
        for provider in (tracer_provider, meter_provider, logger_provider):
            provider.shutdown()
    return rows, totals
