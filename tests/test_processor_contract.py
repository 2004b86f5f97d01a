"""The telemetry contract: sampling does not change counts, the httpx
instrumentation and ours coexist in either order, enforce mode raises into
the reader, session ids stay out of the exports."""

from __future__ import annotations

import json

import httpx
import httpx_sse
import pytest
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import (
    McpResumptionInstrumentor,
    ResumeCursorRaceError,
    ResumptionGapError,
)

from scripted_server import fresh_session, legacy_stream, sse


def seed_000_client(server) -> list[str]:
    server.on("GET", "/sse", legacy_stream)
    server.on("GET", "/mcp", fresh_session)
    with httpx.Client(base_url=server.url) as http:
        with httpx_sse.connect_sse(http, "GET", "/sse") as source:
            ids = [event.id for event in source.iter_sse()]
        headers = {"Last-Event-ID": "4821", "mcp-session-id": "legacy-abc"}
        with httpx_sse.connect_sse(http, "GET", "/mcp", headers=headers) as source:
            ids += [event.id for event in source.iter_sse()]
    return ids


@pytest.mark.parametrize("sampler", [ALWAYS_ON, ALWAYS_OFF], ids=["always_on", "always_off"])
def test_sampling_does_not_change_counts(server, sampler):
    telemetry = Telemetry(sampler=sampler)
    with telemetry.instrumented():
        seed_000_client(server)
    assert telemetry.gap_kinds() == {"session_changed": 1, "id_regression": 1}
    assert telemetry.outcomes() == {"gap": 1}
    assert len(telemetry.gap_logs()) == 2
    assert bool(telemetry.resume_spans()) is (sampler is ALWAYS_ON)


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours-first", "httpx-first"])
def test_with_httpx_instrumentation_in_either_order(server, ours_first):
    telemetry = Telemetry()
    ours, theirs = McpResumptionInstrumentor(), HTTPXClientInstrumentor()
    steps = [
        lambda: ours.instrument(**telemetry.providers()),
        lambda: theirs.instrument(
            tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
        ),
    ]
    for step in steps if ours_first else reversed(steps):
        step()
    try:
        ids = seed_000_client(server)
    finally:
        theirs.uninstrument()
        ours.uninstrument()
    assert ids[-2:] == ["1", "2"]
    assert telemetry.gap_kinds() == {"session_changed": 1, "id_regression": 1}
    spans = telemetry.spans.get_finished_spans()
    client_spans = [span for span in spans if span.kind.name == "CLIENT"]
    assert len(client_spans) == 2, "the httpx instrumentation keeps its own spans"
    resumed = [s for s in client_spans if "mcp.resumption.last_event_id" in s.attributes]
    assert len(resumed) == 1
    assert resumed[0].attributes["mcp.resumption.last_event_id"] == "4821"
    assert len(resumed[0].attributes["mcp.session.id"]) == 16  # a hash, not the raw id
    assert any(key.startswith("http.") for key in resumed[0].attributes)
    [resume] = telemetry.resume_spans()
    assert resumed[0].parent.span_id == resume.context.span_id
    assert telemetry.points("http.client.request.duration") or telemetry.points(
        "http.client.duration"
    ), "the httpx instrumentation's metrics are unchanged"


def test_enforce_mode_raises_into_the_reader(server, telemetry):
    server.on("GET", "/sse", legacy_stream)
    server.on("GET", "/mcp", fresh_session)
    with telemetry.instrumented(mode="enforce"), httpx.Client(base_url=server.url) as http:
        with httpx_sse.connect_sse(http, "GET", "/sse") as source:
            assert list(source.iter_sse())
        with httpx_sse.connect_sse(
            http, "GET", "/mcp", headers={"Last-Event-ID": "4821"}
        ) as source:
            received = []
            with pytest.raises(ResumptionGapError) as raised:
                for event in source.iter_sse():
                    received.append(event)
    assert received == [], "no event of the unproven stream reaches the application"
    assert not isinstance(raised.value, ResumeCursorRaceError)
    assert "re-initialize" in str(raised.value)


def test_enforce_mode_drain_race_raises_the_race_error(server, telemetry):
    result = {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}

    def legacy(request, body):
        events = [sse(event="endpoint", data="/messages/?session_id=s-77")]
        events += [sse(f"e-{n}", json.dumps({"jsonrpc": "2.0", "method": "n"})) for n in (103,)]
        events.append(sse("e-104", json.dumps(result)))
        return 200, {}, events

    def posted(request, body):
        return 202, {"content-type": "text/plain"}, []

    def resumed(request, body):
        note = json.dumps({"jsonrpc": "2.0", "method": "n"})
        return 200, {"mcp-session-id": "s-77"}, [sse("e-105", note)]

    server.on("GET", "/legacy", legacy)
    server.on("POST", "/messages/", posted)
    server.on("GET", "/stream", resumed)
    with telemetry.instrumented(mode="enforce"), httpx.Client(base_url=server.url) as http:
        with httpx_sse.connect_sse(http, "GET", "/legacy") as source:
            events = source.iter_sse()
            next(events)  # endpoint
            call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}
            http.post("/messages/?session_id=s-77", json=call)
            for event in events:
                if event.id == "e-104":
                    break  # the read loop dies before it drains e-104
            events.close()
        headers = {"mcp-session-id": "s-77", "last-event-id": "e-104"}
        with (
            httpx_sse.connect_sse(http, "GET", "/stream", headers=headers) as source,
            pytest.raises(ResumptionGapError) as raised,
        ):
            list(source.iter_sse())
    # What a host catches: every enforced gap is a ResumptionGapError (a
    # RuntimeError, as in seed 000), and a drain race is the race error.
    assert type(raised.value) is ResumeCursorRaceError
    assert isinstance(raised.value, RuntimeError)
    assert telemetry.gap_kinds() == {"drain_race": 1, "orphaned_request": 1}
    [log] = [r for r in telemetry.gap_logs() if r.log_record.attributes.get("jsonrpc.request.id")]
    assert log.log_record.attributes["jsonrpc.request.id"] == "7"


def test_no_raw_session_id_in_any_export(server, telemetry):
    with telemetry.instrumented():
        seed_000_client(server)
    exported = [span.to_json() for span in telemetry.spans.get_finished_spans()]
    exported += [record.to_json() for record in telemetry.logs.get_finished_logs()]
    exported.append(telemetry.metric_reader.get_metrics_data().to_json())
    text = "\n".join(exported)
    assert "resumption.gap" in text
    for secret in ("legacy-abc", "fresh-1", "session_id="):
        assert secret not in text


def test_uninstrument_restores_the_libraries(server, telemetry):
    original = (httpx.Client.send, httpx_sse.EventSource.iter_sse)
    instrumentor = McpResumptionInstrumentor()
    for _ in range(2):
        instrumentor.instrument(**telemetry.providers())
        assert httpx.Client.send is not original[0]
        instrumentor.uninstrument()
        assert (httpx.Client.send, httpx_sse.EventSource.iter_sse) == original
    seed_000_client(server)
    assert telemetry.gap_kinds() == {}, "nothing is observed once uninstrumented"


def test_evictions_are_counted_when_they_happen(server, telemetry):
    def stream(request, body):
        return 200, {"mcp-session-id": request.query_params["s"]}, [sse("1", "{}")]

    server.on("GET", "/many", stream)
    with telemetry.instrumented(max_streams=2), httpx.Client(base_url=server.url) as http:
        for n in range(5):
            headers = {"mcp-session-id": f"s{n}"}
            with httpx_sse.connect_sse(http, "GET", f"/many?s=s{n}", headers=headers) as source:
                list(source.iter_sse())
    [point] = telemetry.points("mcp.client.resumption.evicted_streams")
    assert point.value == 3


def test_evictions_add_up_over_instrument_cycles(server, telemetry):
    """The counter is read at collection from each owner's tracker; an owner
    that closed keeps what it counted."""

    def stream(request, body):
        return 200, {"mcp-session-id": request.query_params["s"]}, [sse("1", "{}")]

    def evicted() -> int:
        [point] = telemetry.points("mcp.client.resumption.evicted_streams")
        return int(point.value)

    server.on("GET", "/cycle", stream)
    for cycle in range(3):
        with telemetry.instrumented(max_streams=2), httpx.Client(base_url=server.url) as http:
            for n in range(5):
                session = f"c{cycle}-{n}"
                url = f"/cycle?s={session}"
                headers = {"mcp-session-id": session}
                with httpx_sse.connect_sse(http, "GET", url, headers=headers) as source:
                    list(source.iter_sse())
            assert evicted() == 3 * (cycle + 1), "read while the cycle's owner is open"
        assert evicted() == 3 * (cycle + 1), "read once it closed"


def test_stream_events_are_counted_exactly(server, telemetry):
    def many(request, body):
        return 200, {"mcp-session-id": "s-many"}, [sse(str(n), "{}") for n in range(1, 151)]

    server.on("GET", "/count", many)
    headers = {"mcp-session-id": "s-many"}

    def counted() -> int:
        return sum(int(point.value) for point in telemetry.points("mcp.client.stream.events"))

    with (
        telemetry.instrumented(),
        httpx.Client(base_url=server.url) as http,
        httpx_sse.connect_sse(http, "GET", "/count", headers=headers) as source,
    ):
        events = source.iter_sse()
        for _ in range(100):
            next(events)
        assert 100 - 64 < counted() <= 100, "an open stream's count lags by a batch at most"
        assert len(list(events)) == 50
    assert counted() == 150


def test_an_httpx2_without_event_source_leaves_the_rest_instrumented(
    server, telemetry, monkeypatch
):
    import httpx2

    monkeypatch.delattr(httpx2, "EventSource")  # as in httpx2 < 2.5
    with telemetry.instrumented():
        ids = seed_000_client(server)
    assert ids[-2:] == ["1", "2"]
    assert telemetry.gap_kinds() == {"session_changed": 1, "id_regression": 1}
