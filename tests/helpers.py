"""What several test modules share: in-memory telemetry, stopping a child,
a child's clean environment, the example server in a child, and the console
metric exporter's output read.

Test modules import shared code from here or from the other helper modules
(``scripted_server``: a real HTTP server and seed 000's scripts for it;
``fuzz_sse``: the raw byte server and hostile cases; ``tracker_scenarios``:
the seeds driven through the Tracker; ``dashboard_queries``), never from one
another or from conftest: pytest collects a test module, and importing it
from another one runs its module code twice, under two names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# ================================================================ telemetry


class Telemetry:
    """SDK providers with in-memory exporters, and readers for the tests."""

    def __init__(self, sampler=None) -> None:
        self.spans = InMemorySpanExporter()
        kwargs = {"sampler": sampler} if sampler is not None else {}
        self.tracer_provider = TracerProvider(**kwargs)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        from loss_accounting import LOSS_READERS

        LOSS_READERS.append(self)  # its lost calls and gaps checked after the test

    @contextlib.contextmanager
    def instrumented(self, **settings) -> Iterator[object]:
        """Our instrumentation on these providers, removed on exit."""
        from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

        instrumentor = McpResumptionInstrumentor()
        instrumentor.instrument(**self.providers(), **settings)
        try:
            yield instrumentor
        finally:
            instrumentor.uninstrument()

    def providers(self) -> dict:
        return {
            "tracer_provider": self.tracer_provider,
            "meter_provider": self.meter_provider,
            "logger_provider": self.logger_provider,
        }

    def points(self, name: str) -> list:
        data = self.metric_reader.get_metrics_data()
        found = []
        for resource_metrics in data.resource_metrics if data else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def recorded(self, histogram: str) -> list:
        """The points of ``histogram`` that hold a record."""
        return [point for point in self.points(histogram) if point.count]

    def by_method(self, histogram: str) -> dict[tuple[str, str | None], int]:
        """Records of an operation histogram by (method, error.type)."""
        totals: dict[tuple[str, str | None], int] = {}
        for point in self.recorded(histogram):
            key = (point.attributes["mcp.method.name"], point.attributes.get("error.type"))
            totals[key] = totals.get(key, 0) + point.count
        return totals

    def counts(self, name: str, attribute: str | None = None) -> dict[object, int]:
        """Totals of metric ``name`` by the value of ``attribute`` (all under
        None without one)."""
        totals: dict[object, int] = {}
        for point in self.points(name):
            key = point.attributes.get(attribute) if attribute else None
            totals[key] = totals.get(key, 0) + int(point.value)
        # The 0 points every server starts with (ContinuityProcessor.server_seen)
        # are series, not counts.
        return {key: total for key, total in totals.items() if total}

    def gap_kinds(self) -> dict[str, int]:
        return self.counts("mcp.client.resumption.gaps", "mcp.resumption.gap.kind")

    def fates(self) -> dict[str, int]:
        return self.counts(
            "mcp.client.resumption.broken_requests", "mcp.resumption.request.fate"
        )

    def outcomes(self) -> dict[str, int]:
        return self.counts("mcp.client.resumption.attempts", "mcp.resumption.outcome")

    def gap_logs(self) -> list:
        return [
            record
            for record in self.logs.get_finished_logs()
            if getattr(record.log_record, "event_name", None) == "resumption.gap"
        ]

    def resume_spans(self) -> list:
        return [span for span in self.spans.get_finished_spans() if span.name == "mcp.resume"]

    def shutdown(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider, self.logger_provider):
            provider.shutdown()


# ====================================================== child processes


def stop_process(process: subprocess.Popen) -> None:
    """Terminate a child (a server, a bridge) and reap it; kill it if it
    does not go within 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


SCOPE = "opentelemetry.instrumentation.mcp_resumption"


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that would reach the checkout
    or configure OpenTelemetry behind the test's back."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "PYTHONPATH", "VIRTUAL_ENV", "PYTEST_"))
    }
    env.update(extra)
    return env


@contextlib.contextmanager
def example_server(*args: str) -> Iterator[str]:
    """examples/server/server.py (uninstrumented) on a free port, with
    ``args``; yields its URL."""
    server = Path(__file__).resolve().parents[1] / "examples" / "server" / "server.py"
    process = subprocess.Popen(
        [sys.executable, str(server), "--port", "0", *args],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        first = process.stdout.readline()
        match = re.match(r"serving (http://127\.0\.0\.1:\d+/mcp)$", first.strip())
        assert match, first
        yield match.group(1)
    finally:
        stop_process(process)


def console_metrics(stdout: str) -> list[dict]:
    """The console metric exporter's JSON documents, among the program's own lines."""
    decoder, found, position = json.JSONDecoder(), [], 0
    while (start := stdout.find("{", position)) != -1:
        try:
            document, position = decoder.raw_decode(stdout, start)
        except json.JSONDecodeError:
            position = start + 1
            continue
        if isinstance(document, dict) and "resource_metrics" in document:
            found.append(document)
    return found


def scope_counts(export: dict, metric: str, attribute: str) -> dict[str, int]:
    """The non-zero counts of ``metric`` by ``attribute`` in one export."""
    counts: dict[str, int] = {}
    for resource in export["resource_metrics"]:
        for scope in resource["scope_metrics"]:
            if scope["scope"]["name"] != SCOPE:
                continue
            for item in scope["metrics"]:
                if item["name"] == metric:
                    for point in item["data"]["data_points"]:
                        key = point["attributes"][attribute]
                        counts[key] = counts.get(key, 0) + int(point["value"])
    # Every series of a server starts at 0 when it is first seen: what was
    # counted is what is above it.
    return {key: value for key, value in counts.items() if value}


class RecordingHttpServer:
    """A loopback HTTP server that records every POST it is sent, as (path,
    body), and answers each ``200`` with an empty body of ``content_type``."""

    def __init__(self, content_type: str | None = None) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                received.append((self.path, body))
                self.send_response(200)
                if content_type is not None:
                    self.send_header("content-type", content_type)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class OtlpHttpCollector(RecordingHttpServer):
    """A stand-in OTLP/HTTP collector that records what it is sent."""

    def __init__(self) -> None:
        super().__init__("application/x-protobuf")
