"""Attribute values true to the semantic conventions, series that exist from
0, and duration buckets in seconds: through the real httpx-sse path against
a loopback server."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx
import httpx_sse

from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc

from scripted_server import sse


def _port(server) -> int:
    return urlsplit(server.url).port


def _drain_race(server, telemetry, request_id: object) -> None:
    """Seed 004 with a JSON-RPC id of the caller's choice: e-104 carries the
    response, the reader dies before it drains it, the resume starts after it."""
    result = {"jsonrpc": "2.0", "id": request_id, "result": {"content": []}}

    def legacy(request, body):
        events = [sse(event="endpoint", data="/messages/?session_id=s-77")]
        events.append(sse("e-103", json.dumps({"jsonrpc": "2.0", "method": "n"})))
        events.append(sse("e-104", json.dumps(result)))
        return 200, {}, events

    def posted(request, body):
        return 202, {"content-type": "text/plain"}, []

    def resumed(request, body):
        return 200, {"mcp-session-id": "s-77"}, [sse("e-105", '{"jsonrpc":"2.0","method":"n"}')]

    server.on("GET", "/legacy", legacy)
    server.on("POST", "/messages/", posted)
    server.on("GET", "/stream", resumed)
    with telemetry.instrumented(), httpx.Client(base_url=server.url) as http:
        with httpx_sse.connect_sse(http, "GET", "/legacy") as source:
            events = source.iter_sse()
            next(events)  # endpoint
            call = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {}}
            http.post("/messages/?session_id=s-77", json=call)
            for event in events:
                if event.id == "e-104":
                    break
            events.close()
        headers = {"mcp-session-id": "s-77", "last-event-id": "e-104"}
        with httpx_sse.connect_sse(http, "GET", "/stream", headers=headers) as source:
            list(source.iter_sse())


def _orphan_log(telemetry):
    [log] = [
        record
        for record in telemetry.gap_logs()
        if record.log_record.attributes[sc.GAP_KIND] == "orphaned_request"
    ]
    return log.log_record


def test_string_request_id_is_exported_without_quotes(server, telemetry):
    _drain_race(server, telemetry, "req-7")
    attributes = _orphan_log(telemetry).attributes
    assert attributes[sc.JSONRPC_REQUEST_ID] == "req-7"
    assert attributes[sc.MCP_METHOD_NAME] == "tools/call"
    [span] = telemetry.resume_spans()
    [event] = [e for e in span.events if e.attributes[sc.GAP_KIND] == "orphaned_request"]
    assert event.attributes[sc.JSONRPC_REQUEST_ID] == "req-7"
    assert event.attributes[sc.MCP_METHOD_NAME] == "tools/call"


def test_integer_request_id_is_its_digits(server, telemetry):
    _drain_race(server, telemetry, 7)
    assert _orphan_log(telemetry).attributes[sc.JSONRPC_REQUEST_ID] == "7"


def test_server_port_beside_every_server_address(server, telemetry):
    _drain_race(server, telemetry, 7)
    port = _port(server)
    [span] = telemetry.resume_spans()
    assert span.attributes[sc.SERVER_ADDRESS] == "127.0.0.1"
    assert span.attributes[sc.SERVER_PORT] == port
    for record in telemetry.gap_logs():
        assert record.log_record.attributes[sc.SERVER_PORT] == port
    for name in (sc.ATTEMPTS[0], sc.GAPS[0], sc.DURATION[0], sc.STREAM_EVENTS[0]):
        points = telemetry.points(name)
        assert points, name
        for point in points:
            assert point.attributes[sc.SERVER_ADDRESS] == "127.0.0.1", name
            assert point.attributes[sc.SERVER_PORT] == port, name


def test_every_series_of_a_seen_server_starts_at_zero(server, telemetry):
    """One plain stream, no resume: every outcome and gap kind already has
    a series, at 0, so that the first real count is an increase."""
    session = {"mcp-session-id": "zero-series"}  # MCP traffic: only that is tracked
    server.on("GET", "/plain", lambda request, body: (200, session, [sse("1", "{}")]))
    with telemetry.instrumented(), httpx.Client(base_url=server.url) as http:
        with httpx_sse.connect_sse(http, "GET", "/plain") as source:
            list(source.iter_sse())
        gaps = telemetry.points(sc.GAPS[0])
        attempts = telemetry.points(sc.ATTEMPTS[0])
    port = _port(server)
    assert {
        (p.attributes[sc.GAP_KIND], p.attributes[sc.MCP_TRANSPORT], p.value) for p in gaps
    } == {(kind, t, 0) for kind in sc.GAP_KINDS for t in ("sse", "streamable-http")}
    assert {
        (
            p.attributes[sc.RESUMPTION_OUTCOME],
            p.attributes[sc.MCP_TRANSPORT],
            p.attributes[sc.RESUMPTION_PREVIOUS_TRANSPORT],
            p.value,
        )
        for p in attempts
    } == {
        (outcome, t, previous, 0)
        for outcome in sc.OUTCOMES
        for t in ("sse", "streamable-http")
        for previous in sc.PREVIOUS_TRANSPORTS
    }
    assert {p.attributes[sc.SERVER_PORT] for p in gaps + attempts} == {port}


def test_duration_buckets_are_seconds_from_1ms_to_300s(server, telemetry):
    _drain_race(server, telemetry, 7)
    [point] = telemetry.points(sc.DURATION[0])
    assert tuple(point.explicit_bounds) == sc.DURATION_BUCKETS
    assert point.explicit_bounds[0] == 0.001 and point.explicit_bounds[-1] == 300
    # a loopback verdict is milliseconds: not in the first bucket of the
    # SDK's default boundaries (0, 5, 10, ...), which were meant for ms
    assert point.count == 1 and point.sum < 1.0
    assert sum(point.bucket_counts[: sc.DURATION_BUCKETS.index(1.0) + 1]) == 1


def test_rejected_resume_has_error_type(server, telemetry):
    server.on("GET", "/gone", lambda request, body: (404, {"content-type": "text/plain"}, []))
    headers = {"mcp-session-id": "s-1", "last-event-id": "5"}
    with telemetry.instrumented(), httpx.Client(base_url=server.url) as http:
        http.get("/gone", headers={**headers, "accept": "text/event-stream"})
    assert telemetry.outcomes() == {"rejected": 1}
    [span] = telemetry.resume_spans()
    assert span.attributes[sc.RESUMPTION_OUTCOME] == "rejected"
    assert span.attributes[sc.ERROR_TYPE] == "404"


def test_tracer_meter_and_logger_carry_the_schema_url(server, telemetry):
    _drain_race(server, telemetry, 7)
    [span] = telemetry.resume_spans()
    assert span.instrumentation_scope.schema_url == sc.SCHEMA_URL
    record = _orphan_log(telemetry)
    [log] = [r for r in telemetry.gap_logs() if r.log_record is record]
    assert log.instrumentation_scope.schema_url == sc.SCHEMA_URL
    data = telemetry.metric_reader.get_metrics_data()
    scopes = [
        scope.scope
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        if scope.scope.name == sc.INSTRUMENTATION_NAME
    ]
    assert scopes and all(scope.schema_url == sc.SCHEMA_URL for scope in scopes)
