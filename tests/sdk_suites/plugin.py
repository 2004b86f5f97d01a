"""A pytest plugin that runs a whole foreign test session (the MCP Python SDK's
own suite) with the plugin instrumented, and writes what happened per test.

Loaded with ``-p plugin`` (``tests/sdk_suites`` on ``PYTHONPATH``) by
``tests/sdk_suites/run.py``.  ``MCP_RESUMPTION_SUITE_MODE`` is ``off`` (not
instrumented at all), ``observe`` or ``enforce``; ``MCP_RESUMPTION_SUITE_OUT``
is the JSON file written at the end: every test's result, and every resume
attempt and gap, each attributed to the test that sent the request it is
about (a lost call, a lost subscription) or started the resume, whenever it
was reported: during the test, after it (a window that ended later) or at the
session's end, where what still waits is decided as at a process's exit.
``counted`` gives the plugin's own counters, so that ``run.py`` can check
that every gap counted was also seen as an event (none hidden by the log
budget).

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
_client_reader: Any = None
# (server.address, server.port, jsonrpc.request.id) -> the test that sent it
_opened: dict[tuple[Any, Any, str], str] = {}


def _remember_requests(processor: Any) -> None:
    """Wrap the owner's begin_request to note which test sent each request."""
    from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import requests_in
    from opentelemetry.instrumentation.mcp_resumption.telemetry.facts import exported_request_id

    original = processor.begin_request

    def begin_request(facts, attributes=None):
        requests = requests_in(facts.body) if facts.body is not None else facts.requests
        with _lock:
            for key, _method in requests or ():
                _opened[(facts.host, facts.port, exported_request_id(key))] = _current[0]
        return original(facts, attributes)

    processor.begin_request = begin_request


def _test_of(attributes: dict, span_id: int) -> str:
    """The test a gap belongs to: the one that sent its request, else the one
    that started its resume, else the one running."""
    request_id = attributes.get("jsonrpc.request.id")
    if request_id is not None:
        key = (attributes.get("server.address"), attributes.get("server.port"), request_id)
        if key in _opened:
            return _opened[key]
    return _by_span.get(span_id, _current[0])


def _start() -> None:
    global _instrumentor, _server_instrumentor, _server_reader, _client_reader
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
                test = _test_of(attributes, record.span_id)
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
    _client_reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[_client_reader])
    _instrumentor = McpResumptionInstrumentor()
    _instrumentor.instrument(
        mode=MODE,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        logger_provider=logger_provider,
    )
    _remember_requests(_instrumentor.processor)
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
    if _server_reader is not None:
        _server_fates_of(nodeid)


# The server half's delivery fates other than delivered, per test (what a
# test's server answered that did not reach an open stream).
_fates_by_test: dict[str, dict[str, int]] = {}
_fates_seen: dict[str, int] = {}


def _server_fates_of(nodeid: str) -> None:
    now = _totals(
        _server_reader, "mcp.server.resumption.deliveries", "mcp.resumption.delivery.fate"
    )
    with _lock:
        added = {
            fate: total - _fates_seen.get(fate, 0) for fate, total in now.items()
            if fate != "delivered" and total > _fates_seen.get(fate, 0)
        }
        _fates_seen.update(now)
        if added:
            _fates_by_test[nodeid] = added


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


def _totals(reader: Any, name: str, attribute: str | None) -> dict[str, int]:
    """A counter's totals by one attribute's value (all under "all" without one)."""
    totals: dict[str, int] = {}
    data = reader.get_metrics_data() if reader is not None else None
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        value = str(point.attributes.get(attribute)) if attribute else "all"
                        totals[value] = totals.get(value, 0) + int(point.value)
    return {value: total for value, total in totals.items() if total}


def _server_outcomes() -> dict[str, int]:
    return _totals(_server_reader, "mcp.server.resumption.requests", "mcp.resumption.outcome")


def _counted() -> dict[str, dict[str, int]]:
    """What the client half counted: gaps by kind (lost subscriptions on
    their own counter, as the gap kind they are), fates, operations' errors."""
    gaps = _totals(_client_reader, "mcp.client.resumption.gaps", "mcp.resumption.gap.kind")
    lost = _totals(_client_reader, "mcp.client.resumption.lost_subscriptions", None)
    if lost:
        gaps["subscription_lost"] = lost["all"]
    return {
        "gaps": gaps,
        "fates": _totals(
            _client_reader, "mcp.client.resumption.broken_requests", "mcp.resumption.request.fate"
        ),
    }


def pytest_unconfigure(config: pytest.Config) -> None:
    if OUT is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    processor = getattr(_instrumentor, "processor", None)
    if processor is not None:
        # What still waits (a window not yet over) is decided now, as at exit,
        # and attributed to the test that sent it.
        _current[0] = "<session end>"
        processor.stop_waiting("the test session ended")
    with _lock:
        data = {
            "mode": MODE,
            "results": _results,
            "gaps": list(_gaps),
            "attempts": list(_attempts),
            "counted": _counted() if processor is not None else {},
            "server": {
                "outcomes": _server_outcomes(),
                "gaps": list(_server_gaps),
                "fates": _totals(
                    _server_reader, "mcp.server.resumption.deliveries",
                    "mcp.resumption.delivery.fate",
                ) if _server_reader is not None else {},
                "fates_by_test": dict(_fates_by_test),
            },
        }
    with open(OUT, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, sort_keys=True)
