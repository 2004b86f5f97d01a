# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Runs the wire scenarios with the plugin enabled and reads back what it
detected, from the same telemetry a user's backend would receive."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterable

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from .. import McpResumptionInstrumentor
from .. import semconv as sc
from .scenarios import all_scenarios

SETTLE_SECONDS = 1.0  # the confirmation window the demo runs with


def _outcomes(reader: InMemoryMetricReader) -> dict[str, int]:
    totals: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == sc.ATTEMPTS[0]:
                    for point in metric.data.data_points:
                        key = str(point.attributes.get(sc.RESUMPTION_OUTCOME))
                        totals[key] = totals.get(key, 0) + int(point.value)
    return totals


def run(names: Iterable[str] | None = None) -> list[dict]:
    wanted = set(names or ())
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    reader = InMemoryMetricReader()
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(metric_readers=[reader]),
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
    finally:
        instrumentor.uninstrument()
    return rows
