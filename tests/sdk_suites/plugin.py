"""A pytest plugin that runs a whole foreign test session (the MCP Python SDK's
own suite) with the plugin instrumented, and writes what happened per test.

Loaded with ``-p plugin`` (``tests/sdk_suites`` on ``PYTHONPATH``) by
``tests/sdk_suites/run.py``.  ``MCP_RESUMPTION_SUITE_MODE`` is ``off`` (not
instrumented at all), ``observe`` or ``enforce``; ``MCP_RESUMPTION_SUITE_OUT``
is the JSON file written at the end: every test's result, and every resume
attempt and gap, each attributed to the test that started the resume.

In observe and enforce mode the server half (``McpResumptionServerInstrumentor``,
guard off) is instrumented too: the SDK's server tests must give the same
results with it as without.  What it counted goes into ``server``: outcomes
per test, and its gap events, kept apart from the client's.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pytest

MODE = os.environ.get("MCP_RESUMPTION_SUITE_MODE", "off")
OUT = os.environ.get("MCP_RESUMPTION_SUITE_OUT")

_lock = threading.Lock()
_current: list[str] = ["<collection>"]  # the running test's node id
_by_span: dict[int, str] = {}  # span id of an mcp.resume span -> node id
_results: dict[str, str] = {}
_gaps: list[dict[str, Any]] = []
_attempts: list[dict[str, Any]] = []
_server_gaps: list[dict[str, Any]] = []
_instrumentor: Any = None
_server_instrumentor: Any = None
_server_reader: Any = None


def _start() -> None:
    global _instrumentor, _server_instrumentor, _server_reader
    from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

    class Spans(SpanProcessor):
        def on_start(self, span, parent_context=None):
            if span.name == "mcp.resume":
                with _lock:
                    _by_span[span.context.span_id] = _current[0]

        def on_end(self, span):
            if span.name != "mcp.resume":
                return
            with _lock:
                test = _by_span.get(span.context.span_id, _current[0])
                _attempts.append(
                    {
                        "test": test,
                        "outcome": span.attributes.get("mcp.resumption.outcome"),
                        "status": span.status.status_code.name,
                        "last_event_id": span.attributes.get("mcp.resumption.last_event_id"),
                        "http_status": span.attributes.get("http.response.status_code"),
                        "gaps": [
                            event.attributes.get("mcp.resumption.gap.kind")
                            for event in span.events
                            if event.name == "resumption.gap"
                        ],
                    }
                )

    class Gaps(LogRecordProcessor):
        def on_emit(self, log_data):  # the SDK calls it log_data or log_record by version
            record = getattr(log_data, "log_record", log_data)
            if getattr(record, "event_name", None) != "resumption.gap":
                return
            attributes = dict(record.attributes or {})
            if attributes.get("mcp.resumption.gap.kind") in ("unknown_cursor", "other_session"):
                with _lock:  # the server half's kinds: not a client gap
                    _server_gaps.append({"test": _current[0], **attributes})
                return
            with _lock:
                test = _by_span.get(record.span_id, _current[0])
                _gaps.append(
                    {
                        "test": test,
                        "kind": attributes.get("mcp.resumption.gap.kind"),
                        "expected": attributes.get("mcp.resumption.gap.expected"),
                        "observed": attributes.get("mcp.resumption.gap.observed"),
                        "request_id": attributes.get("jsonrpc.request.id"),
                        "message": str(record.body),
                    }
                )

        emit = on_emit  # newer SDKs

        def shutdown(self):
            pass

        def force_flush(self, timeout_millis=30000):
            return True

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(Spans())
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(Gaps())
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    _instrumentor = McpResumptionInstrumentor()
    _instrumentor.instrument(
        mode=MODE,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        logger_provider=logger_provider,
    )
    from opentelemetry.instrumentation.mcp_resumption.server import (
        McpResumptionServerInstrumentor,
    )

    _server_reader = InMemoryMetricReader()
    _server_instrumentor = McpResumptionServerInstrumentor()
    _server_instrumentor.instrument(
        guard="off",
        meter_provider=MeterProvider(metric_readers=[_server_reader]),
        logger_provider=logger_provider,
    )


def pytest_configure(config: pytest.Config) -> None:
    if MODE not in ("off", "observe", "enforce"):
        raise pytest.UsageError(f"MCP_RESUMPTION_SUITE_MODE={MODE!r}: off, observe or enforce")
    if MODE != "off":
        _start()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[0] = item.nodeid


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    # A test's clients are gone with it: what they still waited for is lost
    # now, as at a process's exit, and attributed to the test that lost it
    # (the reissue window would otherwise end inside a later test).
    processor = getattr(_instrumentor, "processor", None)
    if processor is not None:
        processor.stop_waiting("the test ended")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # One result per test: the first of setup, call, teardown that did not pass.
    if report.when == "call" or report.outcome != "passed":
        previous = _results.get(report.nodeid)
        if previous in (None, "passed"):
            outcome = report.outcome
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
            if report.when != "call" and report.outcome == "failed":
                outcome = f"error in {report.when}"
            _results[report.nodeid] = outcome


def _server_outcomes() -> dict[str, int]:
    totals: dict[str, int] = {}
    data = _server_reader.get_metrics_data() if _server_reader is not None else None
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "mcp.server.resumption.requests":
                    for point in metric.data.data_points:
                        outcome = str(point.attributes.get("mcp.resumption.outcome"))
                        totals[outcome] = totals.get(outcome, 0) + int(point.value)
    return {outcome: total for outcome, total in totals.items() if total}


def pytest_unconfigure(config: pytest.Config) -> None:
    if OUT is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with _lock:
        data = {
            "mode": MODE,
            "results": _results,
            "gaps": list(_gaps),
            "attempts": list(_attempts),
            "server": {"outcomes": _server_outcomes(), "gaps": list(_server_gaps)},
        }
    with open(OUT, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, sort_keys=True)
