"""In-process figures of the Tracker (no network): bytes per tracked stream,
memory growth along one long stream, the cost of a resume, and the CPU the
processor spends per event."""

from __future__ import annotations

import gc
import json
import statistics
import time
import tracemalloc

from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import (
    SEEN_WINDOW,
    STREAMABLE_HTTP,
    Tracker,
    bounded_id,
)

SERVER = "127.0.0.1:8000"
EVENTS_PER_STREAM = 4  # progress notifications, then the tool result


def _progress(k: int) -> str:
    params = {"progressToken": 1, "progress": k, "total": 10}
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})


PROGRESS = _progress(5)


def _result(request_id: int) -> str:
    result = {"content": [{"type": "text", "text": "done"}], "isError": False}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


def _fill(tracker: Tracker, streams: int) -> None:
    """Each stream: its own session (a 32-hex id, as the SDKs mint them), one
    tools/call request, EVENTS_PER_STREAM progress events and the result, all
    with ids from one server-wide counter; the application consumed all, and
    the stream ended after the result, as the MCP SDKs end a POST stream (a
    tracked stream is an ended one but for the few being read: while one is
    read, the tracker also refers to its last event's data)."""
    event_id = 0
    for index in range(streams):
        session = f"{index:032x}"
        request = json.dumps(index)
        tracker.request_sent(SERVER, session, [(request, "tools/call")])
        stream = tracker.open_stream(SERVER, STREAMABLE_HTTP, session_id=session, carries=[request])
        for k in range(EVENTS_PER_STREAM + 1):
            event_id += 1
            data = _result(index) if k == EVENTS_PER_STREAM else PROGRESS
            tracker.event_received(stream, str(event_id), data)
            tracker.event_consumed(stream)
        tracker.stream_ended(stream, "the stream ended", clean=True)


# At the kept bound: 32 four-byte characters are 128 UTF-8 bytes, and 4 bytes
# each in CPython's string too.  One more character and the id is a digest.
HOSTILE_CHARACTER = "\U0001d7d8"


def _fill_hostile(tracker: Tracker, streams: int) -> None:
    """Each stream: its own session, whose id, and the id of each of the
    SEEN_WINDOW + 1 events it receives, is as long as the kept bound allows
    in the widest characters; each event a response to a request id the
    session never sent, as long as the JSON-RPC bound allows."""
    for index in range(streams):
        session = f"{index:08x}" + HOSTILE_CHARACTER * 30
        stream = tracker.open_stream(SERVER, STREAMABLE_HTTP, session_id=bounded_id(session))
        for k in range(SEEN_WINDOW + 1):
            event_id = f"{k:08x}" + HOSTILE_CHARACTER * 30
            foreign = json.dumps({"jsonrpc": "2.0", "id": HOSTILE_CHARACTER * 200 + str(k),
                                  "result": {}}, ensure_ascii=False)
            tracker.event_received(stream, event_id, foreign)


def bytes_per_stream(streams: int, *, hostile: bool = False) -> float:
    """Bytes the tracker keeps per stream; ``hostile``: the worst a server can make it."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracker = Tracker(max_streams=streams)
        (_fill_hostile if hostile else _fill)(tracker, streams)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        assert len(tracker) == streams and tracker.session_count == streams
    finally:
        tracemalloc.stop()
    return (after - before) / streams


def growth(events: int, warmup: int = 10_000) -> dict[str, float]:
    """Bytes allocated and kept by one stream between event ``warmup`` (the
    seen-id window is long full) and event ``events``."""
    tracker = Tracker()
    stream = tracker.open_stream(SERVER, STREAMABLE_HTTP, session_id="f" * 32)
    gc.collect()
    tracemalloc.start()
    try:
        for event_id in range(1, events + 1):
            if event_id == warmup:
                gc.collect()
                before = tracemalloc.get_traced_memory()[0]
            tracker.event_received(stream, str(event_id), PROGRESS)
            tracker.event_consumed(stream)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return {
        "events": events,
        "bytes": after - before,
        "bytes_per_event": (after - before) / (events - warmup),
    }


def resume_cost(replayed: int, repeats: int) -> dict[str, float]:
    """Resumes through one Tracker that also tracks 1,000 other streams: a
    stream of 100 events breaks, the client reconnects with Last-Event-ID
    (``open_stream`` + the 200 answer) and ``replayed`` events are received
    and consumed, then the stream ends.  ``verdict_us``: from the reconnect to
    the verdict (given at the first replayed event); ``total_us``: the whole
    resume.  Medians over ``repeats`` resumes."""
    tracker = Tracker()
    _fill(tracker, 1000)
    verdicts, totals = [], []
    for index in range(repeats):
        session = f"{index:031x}r"
        ids = [f"{session}_{event_id}" for event_id in range(1, 101 + replayed)]
        stream = tracker.open_stream(SERVER, STREAMABLE_HTTP, session_id=session)
        for event_id in ids[:100]:
            tracker.event_received(stream, event_id, PROGRESS)
            tracker.event_consumed(stream)
        tracker.stream_ended(stream, "a read error (RemoteProtocolError)")
        started = time.perf_counter()
        resumed = tracker.open_stream(
            SERVER, STREAMABLE_HTTP, session_id=session, last_event_id=ids[99]
        )
        tracker.response(resumed, 200, session)
        step = tracker.event_received(resumed, ids[100], PROGRESS)
        decided = time.perf_counter()
        for event_id in ids[101:]:
            tracker.event_consumed(resumed)
            tracker.event_received(resumed, event_id, PROGRESS)
        tracker.event_consumed(resumed)
        tracker.stream_ended(resumed, "the stream ended")
        ended = time.perf_counter()
        assert step.verdict is not None and step.verdict.outcome.value == "resumed", step
        verdicts.append((decided - started) * 1e6)
        totals.append((ended - started) * 1e6)
    total = statistics.median(totals)
    return {
        "replayed_events": replayed,
        "verdict_us": statistics.median(verdicts),
        "total_us": total,
        "per_event_us": total / replayed,
    }


def processor_event_cost(events: int, repeats: int) -> dict[str, float]:
    """CPU per event of the plugin's own work, no I/O: ``processor.event``
    (metrics + tracker), what the SSE patch calls per event, and the Tracker
    alone.  Fresh SDK providers, ALWAYS_ON."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from opentelemetry.instrumentation.mcp_resumption import ContinuityProcessor
    from opentelemetry.instrumentation.mcp_resumption.telemetry.facts import RequestFacts

    processor = ContinuityProcessor(
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
    )
    ids = [str(event_id) for event_id in range(1, events + 1)]
    whole, tracker_only = [], []
    for _ in range(repeats):
        facts = RequestFacts("GET", SERVER, "127.0.0.1", session_id="d" * 32)
        context = processor.end_request(facts, None, 200, None, True)
        assert context is not None
        tracker = processor.tracker
        stream = tracker.open_stream(SERVER, STREAMABLE_HTTP, session_id="c" * 32)
        event, received = processor.event, tracker.event_received
        started = time.perf_counter()
        for event_id in ids:
            event(context, "message", event_id, PROGRESS)
        middle = time.perf_counter()
        for event_id in ids:
            received(stream, event_id, PROGRESS)
        ended = time.perf_counter()
        whole.append((middle - started) / events * 1e6)
        tracker_only.append((ended - middle) / events * 1e6)
    processor.shutdown()
    return {
        "processor_us": statistics.median(whole),
        "tracker_us": statistics.median(tracker_only),
    }
