# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Runs the wire scenarios with the plugin enabled and reads back what it
detected, from the same telemetry a user's backend would receive."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor
from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc
from opentelemetry.instrumentation.mcp_resumption.telemetry.verdict_log import (
    LOGGER_NAME as VERDICT_LOGGER,
)

from . import scenarios
from .scenarios import all_scenarios

SETTLE_SECONDS = 1.0  # the confirmation window the demo runs with
# How long a row whose wire gives the fates of its broken requests waits for
# the plugin to count them all (a lost one is decided a confirmation window
# after the client stopped waiting): a guard, the wait ends at the count.
FATES_TIMEOUT = 10 * SETTLE_SECONDS
# How long --prometheus-port waits for the scrape that sees every server at 0.
FIRST_SCRAPE_TIMEOUT = 60.0


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


def _joint(reader: InMemoryMetricReader, metric_name: str, attributes: tuple[str, ...]) -> dict:
    """A counter's total per combination of attributes' values, keyed by the
    values joined with ``|`` (an attribute a series lacks: empty)."""
    sums: dict[str, int] = {}
    for point in _points(reader, metric_name):
        key = "|".join(str(point.attributes.get(name, "")) for name in attributes)
        sums[key] = sums.get(key, 0) + int(point.value)
    return {key: total for key, total in sums.items() if total}


def _operations(reader: InMemoryMetricReader) -> dict[str, dict[str, Any]]:
    """The operation histogram (mcp.client.operation.duration) by server
    port, method and error (``port|method|error``, an error-free one: empty):
    count, sum and per-bucket counts."""
    found: dict[str, dict[str, Any]] = {}
    for point in _points(reader, sc.OPERATION_DURATION[0]):
        key = "|".join(
            str(point.attributes.get(name, ""))
            for name in (sc.SERVER_PORT, sc.MCP_METHOD_NAME, sc.ERROR_TYPE)
        )
        merged = found.setdefault(
            key, {"count": 0, "sum": 0.0, "bounds": list(point.explicit_bounds),
                  "bucket_counts": [0] * len(point.bucket_counts)}
        )  # fmt: skip
        merged["count"] += point.count
        merged["sum"] += point.sum
        buckets = zip(merged["bucket_counts"], point.bucket_counts)
        merged["bucket_counts"] = [a + b for a, b in buckets]
    return found


def _outcomes(reader: InMemoryMetricReader) -> dict[str, int]:
    return _sums(reader, sc.ATTEMPTS[0], sc.RESUMPTION_OUTCOME)


def _durations(reader: InMemoryMetricReader) -> dict[str, Any]:
    """The duration histogram summed over its series: count, sum, buckets."""
    merged: dict[str, Any] = {"count": 0, "sum": 0.0, "bounds": list(sc.DURATION_BUCKETS)}
    counts = [0] * (len(sc.DURATION_BUCKETS) + 1)
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == sc.DURATION[0]:
                    for point in metric.data.data_points:
                        merged["bounds"] = list(point.explicit_bounds)
                        counts = counts[: len(point.bucket_counts)]
                        merged["count"] += point.count
                        merged["sum"] += point.sum
                        counts = [a + b for a, b in zip(counts, point.bucket_counts)]
    merged["bucket_counts"] = counts
    return merged


def _points(reader: InMemoryMetricReader, metric_name: str) -> list:
    data = reader.get_metrics_data()
    return [
        point
        for resource in (data.resource_metrics if data else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == metric_name
        for point in metric.data.data_points
    ]


def _counted(reader: InMemoryMetricReader) -> dict[str, Any]:
    crossings = 0
    for point in _points(reader, sc.ATTEMPTS[0]):
        previous = point.attributes.get(sc.RESUMPTION_PREVIOUS_TRANSPORT)
        if previous not in (sc.NO_PREVIOUS_TRANSPORT, point.attributes.get(sc.MCP_TRANSPORT)):
            crossings += int(point.value)
    replayed: dict[str, int] = {}
    for point in _points(reader, sc.REPLAYED_EVENTS[0]):
        outcome = str(point.attributes.get(sc.RESUMPTION_OUTCOME))
        replayed[outcome] = replayed.get(outcome, 0) + int(point.sum)
    return {
        "attempts": _outcomes(reader),
        "gaps": _sums(reader, sc.GAPS[0], sc.GAP_KIND),
        "duration": _durations(reader),
        "transport_crossings": {"all": crossings} if crossings else {},
        "replayed_events": replayed,
        "stream_events": {"all": sum(int(p.value) for p in _points(reader, sc.STREAM_EVENTS[0]))},
        "fates": _sums(reader, sc.BROKEN_REQUESTS[0], sc.REQUEST_FATE),
        **_wire_kept(reader),
        # for the dashboards' breakdowns by two labels at once
        "lost_subscriptions_joint": _joint(
            reader,
            sc.LOST_SUBSCRIPTIONS[0],
            (sc.SUBSCRIPTION_NOTIFICATIONS, sc.SUBSCRIPTION_RELISTENED),
        ),
        "reissues_joint": _joint(
            reader, sc.REISSUES[0], (sc.REISSUE_IDEMPOTENT, sc.REISSUE_RISK)
        ),
        "event_gaps_joint": _joint(reader, sc.EVENT_GAPS[0], (sc.EVENT_NAME, sc.EVENT_GAP_KIND)),
        "operations": _operations(reader),
    }


def _wire_kept(reader: InMemoryMetricReader) -> dict[str, dict[str, int]]:
    """The counts a row's wire also gives (``ScenarioWire.counts``): re-issues
    by risk and by what the server declared, calls that ran twice, lost
    subscriptions by whether the client re-listened and by their filter;
    the Events extension's gaps by kind, push streams by state and events
    delivered again."""
    duplicates = sum(int(p.value) for p in _points(reader, sc.DUPLICATE_RUNS[0]))
    again = sum(int(p.value) for p in _points(reader, sc.EVENT_DUPLICATES[0]))
    return {
        "reissues": _sums(reader, sc.REISSUES[0], sc.REISSUE_RISK),
        "reissues_by_idempotent": _sums(reader, sc.REISSUES[0], sc.REISSUE_IDEMPOTENT),
        "duplicate_runs": {"all": duplicates} if duplicates else {},
        "lost_subscriptions": _sums(
            reader, sc.LOST_SUBSCRIPTIONS[0], sc.SUBSCRIPTION_RELISTENED
        ),
        "lost_subscriptions_by_filter": _sums(
            reader, sc.LOST_SUBSCRIPTIONS[0], sc.SUBSCRIPTION_NOTIFICATIONS
        ),
        "tasks": _sums(reader, sc.TASKS[0], sc.TASK_FATE),
        "event_gaps": _sums(reader, sc.EVENT_GAPS[0], sc.EVENT_GAP_KIND),
        "event_streams": _sums(reader, sc.EVENT_STREAMS[0], sc.EVENT_STREAM_STATE),
        "event_duplicates": {"all": again} if again else {},
    }


# The keys of ``_counted`` that are counts by one attribute, as the wire may give them.
WIRE_COUNTS = (
    "reissues",
    "reissues_by_idempotent",
    "duplicate_runs",
    "lost_subscriptions",
    "lost_subscriptions_by_filter",
    "tasks",
    "event_gaps",
    "event_streams",
    "event_duplicates",
)


def _difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What one scenario added to the totals of ``_counted``."""
    changed = {}
    names = ("attempts", "gaps", "transport_crossings", "replayed_events", "stream_events",
             "fates", *WIRE_COUNTS, "lost_subscriptions_joint", "reissues_joint",
             "event_gaps_joint")  # fmt: skip
    for name in names:
        changed[name] = {
            key: value - before[name].get(key, 0)
            for key, value in after[name].items()
            if value > before[name].get(key, 0)
        }
    changed["operations"] = {}
    for key, now in after["operations"].items():
        then = before["operations"].get(key)
        if then is None:
            changed["operations"][key] = now
        elif now["count"] > then["count"]:
            changed["operations"][key] = {
                "count": now["count"] - then["count"],
                "sum": now["sum"] - then["sum"],
                "bounds": now["bounds"],
                "bucket_counts": [
                    x - y for x, y in zip(now["bucket_counts"], then["bucket_counts"])
                ],
            }
    a, b = after["duration"], before["duration"]
    changed["duration"] = {
        "count": a["count"] - b["count"],
        "sum": a["sum"] - b["sum"],
        "bounds": a["bounds"],
        "bucket_counts": [x - y for x, y in zip(a["bucket_counts"], b["bucket_counts"])],
    }
    return changed


class _Scrapes:
    """Counts the scrapes of the Prometheus endpoint."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def seen(self) -> None:
        with self.changed:
            self.count += 1
            self.changed.notify_all()

    def wait_after(self, count: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count > count, timeout)


class DemoError(Exception):
    """A problem of the demo's setting (a busy port), not of a scenario: the
    command line prints it as one line."""


def _prometheus_reader(port: int, scrapes: _Scrapes) -> MetricReader:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    # The endpoint first: a busy port is the user's to fix, before anything runs.
    try:
        start_http_server(port, addr="127.0.0.1")
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise DemoError(
                f"127.0.0.1:{port} is already in use: choose another --prometheus-port"
            ) from None
        raise DemoError(f"cannot serve metrics on 127.0.0.1:{port}: {error.strerror}") from None

    class CountingReader(PrometheusMetricReader):
        def _receive_metrics(self, metrics_data: Any, *args: Any, **kwargs: Any) -> None:
            super()._receive_metrics(metrics_data, *args, **kwargs)
            scrapes.seen()

    return CountingReader()


def _reserved_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def _announce_servers(
    instrumentor: McpResumptionInstrumentor, rows: list[scenarios.Scenario], scrapes: _Scrapes
) -> None:
    """A real client knows its servers long before a stream breaks, and
    Prometheus has scraped their counters at 0 by then; the demo's scenarios
    break their streams within a second of the first request.  So, for a
    scrape, the routers' ports are reserved up front, their servers are seen
    (every series at 0), and the scenarios start once a scrape has read that:
    otherwise each first count would be a series born at 1, which increase()
    cannot see.  Likewise the event types each events row's client
    subscribes to (``Scenario.event_series``): each row takes the next
    reserved port."""
    scenarios.router_sockets[:] = [_reserved_socket() for _ in rows]
    before = scrapes.count
    processor = instrumentor.processor
    for sock, scenario in zip(scenarios.router_sockets, rows):
        port = sock.getsockname()[1]
        processor.server_seen("127.0.0.1", port)
        for delivery, name in scenario.event_series:
            processor.telemetry.event_type_seen("127.0.0.1", port, delivery, name)
    print("waiting for a scrape of the metrics endpoint ...", file=sys.stderr, flush=True)
    if not scrapes.wait_after(before, FIRST_SCRAPE_TIMEOUT):
        print(
            f"no scrape within {FIRST_SCRAPE_TIMEOUT:g} s: the first counts will not show "
            "in increase() and rate()",
            file=sys.stderr,
            flush=True,
        )


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


def _wait_for_counts(
    reader: InMemoryMetricReader, before: dict[str, Any], totals: dict[str, int]
) -> None:
    """Until the plugin has counted, on each of ``totals``' keys of
    ``_counted``, that many more than ``before`` (or the guard passes: the
    row then fails on the count). A lost call is decided, and a lost
    subscription counted, a confirmation window after the wire showed it."""
    deadline = time.monotonic() + FATES_TIMEOUT
    while time.monotonic() < deadline:
        counted = _difference(_counted(reader), before)
        if all(sum(counted[key].values()) >= total for key, total in totals.items()):
            return
        time.sleep(0.05)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _skipped_row(scenario: scenarios.Scenario, reason: str, nothing: dict[str, Any]) -> dict:
    """A scenario that could not run here (node is missing): said so, never a
    pass; ``nothing`` is a ``counted`` of zeros, so that every row has one."""
    return {
        "scenario": scenario.name,
        "happened": scenario.happened,
        "expected": sorted(scenario.expected_gaps),
        "detected": [],
        "outcome": "-",
        "pass": None,
        "skipped": reason,
        "resumes": 0,
        "server_address": "127.0.0.1",
        "server_port": 0,
        "counted": nothing,
        "fates": {},
        "fates_on_the_wire": None,
        "counts_on_the_wire": None,
        "legs": None,
        "legs_on_the_wire": None,
    }


def run(
    names: Iterable[str] | None = None,
    *,
    prometheus_port: int | None = None,
    hold: float = 0.0,
    report: Callable[[list[dict], dict[str, dict[str, int]]], None] | None = None,
) -> tuple[list[dict], dict[str, dict[str, int]]]:
    """Run the scenarios (all, or ``names``); return one row each, and the
    metric totals (resumes by outcome, gaps by kind, broken requests by fate)
    of the whole run.

    With ``prometheus_port`` the metrics are served on 127.0.0.1 for a scrape,
    and kept up ``hold`` seconds after ``report`` was given the results.
    Progress (``[N/total]`` and the elapsed seconds) goes to stderr. A
    scenario whose ``prepare`` gives a reason (node is missing) gets a row that
    says ``skipped`` with that reason. Raises :class:`DemoError` for a busy
    Prometheus port."""
    started = time.monotonic()
    wanted = set(names or ())
    resource = Resource.create({"service.name": "mcp-resumption-demo"})
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    tracer_provider = TracerProvider(resource=resource)
    reader = InMemoryMetricReader()
    readers: list[Any] = [reader, *_otlp(tracer_provider, logger_provider)]
    scrapes = _Scrapes()
    if prometheus_port is not None:
        readers.append(_prometheus_reader(prometheus_port, scrapes))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    # The table is this command's readable verdict: the plugin's verdict
    # lines and exit summary (Python logging, WARNING for a gap) would only
    # repeat it on stderr, which carries the progress.
    # So would the server half's lines (a tool run for nobody) in the rows
    # seen from the server alone.
    for name in (VERDICT_LOGGER, "opentelemetry.instrumentation.mcp_resumption.server"):
        quiet = logging.getLogger(name)
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        logger_provider=logger_provider,
        confirm_timeout=SETTLE_SECONDS,
    )
    rows = []
    selected = [s for s in all_scenarios() if not wanted or s.name in wanted]
    try:
        # Before any port is announced: a scenario that cannot run here
        # (node is missing) gets no server to show at 0.
        unavailable = {
            s.name: reason
            for s in selected
            if s.prepare is not None and (reason := s.prepare()) is not None
        }
        if prometheus_port is not None:
            runnable = [s for s in selected if s.name not in unavailable]
            _announce_servers(instrumentor, runnable, scrapes)
        total = len(selected)
        for number, scenario in enumerate(selected, 1):
            step = f"[{number}/{total}]"
            _progress(f"{step} {scenario.name} ... ({time.monotonic() - started:.1f} s elapsed)")
            began = time.monotonic()
            if (reason := unavailable.get(scenario.name)) is not None:
                now = _counted(reader)
                rows.append(_skipped_row(scenario, reason, _difference(now, now)))
                _progress(f"{step} {scenario.name}: skipped: {reason}")
                continue
            logs.clear()
            counted_before = _counted(reader)
            before = counted_before["attempts"]
            wire = asyncio.run(scenario.run())
            awaited = {key: sum(n.values()) for key, n in (wire.counts or {}).items()}
            if wire.fates is not None:
                awaited["fates"] = sum(wire.fates.values())
            _wait_for_counts(reader, counted_before, awaited)
            time.sleep(SETTLE_SECONDS + 0.2)  # let open confirmation windows close
            counted = _difference(_counted(reader), counted_before)
            after = _outcomes(reader)
            outcomes = sorted(k for k in after if after[k] > before.get(k, 0))
            # A resume's gap events, and the Events extension's breaks: its
            # losses are gap events too, and every break is counted.
            detected = sorted(
                {
                    str(attributes.get(sc.GAP_KIND, attributes.get(sc.EVENT_GAP_KIND)))
                    for record in logs.get_finished_logs()
                    if (attributes := record.log_record.attributes) is not None
                }
                | set(counted["event_gaps"])
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
                    # outcome must be among them, and a control none that is
                    # a gap; a row that expects no attempt gets none.
                    "pass": detected == expected
                    and (
                        scenario.expected_outcome in outcomes
                        if scenario.expected_outcome is not None
                        else not outcomes
                    )
                    and (bool(expected) or "gap" not in outcomes)
                    # where the wire gives the fates of the broken requests,
                    # the plugin counted exactly those
                    and (wire.fates is None or counted["fates"] == wire.fates)
                    # and likewise the re-issues, double runs, lost subscriptions
                    and all(counted[key] == n for key, n in (wire.counts or {}).items())
                    # and, through the proxy, what it counted on each leg is
                    # what the two routers' logs say
                    and wire.legs == wire.legs_on_the_wire
                    # and, seen from the server alone, what the server half
                    # counted is what the wire and the handler's log say
                    and wire.server_verdicts == wire.server_verdicts_on_the_wire
                    and (wire.server_verdicts_on_the_wire is None
                         or bool(wire.server_verdicts_on_the_wire)),
                    "fates": counted["fates"],
                    "fates_on_the_wire": wire.fates,
                    "counts_on_the_wire": wire.counts,
                    "legs": wire.legs,
                    "legs_on_the_wire": wire.legs_on_the_wire,
                    "server_verdicts": wire.server_verdicts,
                    "server_verdicts_on_the_wire": wire.server_verdicts_on_the_wire,
                    "resumes": len(wire.resumes),
                    # what the plugin counted in this scenario, and against
                    # which server (the router the client connected to)
                    "server_address": "127.0.0.1",
                    "server_port": scenarios.last_router_port,
                    "counted": counted,
                }
            )
            verdict = "PASS" if rows[-1]["pass"] else "FAIL"
            _progress(f"{step} {scenario.name}: {verdict} in {time.monotonic() - began:.1f} s")
        _progress(f"done: {total} scenarios in {time.monotonic() - started:.1f} s")
        totals = {
            "resumes by outcome": _outcomes(reader),
            "gaps by kind": _sums(reader, sc.GAPS[0], sc.GAP_KIND),
            "broken requests by fate": _sums(reader, sc.BROKEN_REQUESTS[0], sc.REQUEST_FATE),
            "re-issues by risk": _sums(reader, sc.REISSUES[0], sc.REISSUE_RISK),
            "lost subscriptions by re-listened": _sums(
                reader, sc.LOST_SUBSCRIPTIONS[0], sc.SUBSCRIPTION_RELISTENED
            ),
            "event gaps by kind": _sums(reader, sc.EVENT_GAPS[0], sc.EVENT_GAP_KIND),
        }
        if report is not None:
            report(rows, totals)
        if hold > 0:
            _progress(f"holding the metrics endpoint on 127.0.0.1:{prometheus_port} for {hold:g} s")
            time.sleep(hold)
    finally:
        for sock in scenarios.router_sockets:  # reserved for scenarios that did not run
            sock.close()
        scenarios.router_sockets[:] = []
        instrumentor.uninstrument()
        for provider in (tracer_provider, meter_provider, logger_provider):
            provider.shutdown()
    return rows, totals
