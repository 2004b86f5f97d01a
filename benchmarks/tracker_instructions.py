"""The tracker's share of a POST answered by SSE, counted in instructions:

    python3 benchmarks/tracker_instructions.py          # ~1 min; valgrind as instructions.py
    python3 benchmarks/tracker_instructions.py --ns 50 250
    python3 benchmarks/tracker_instructions.py --state redis://127.0.0.1:6379/0

What the monitor asks of the ``Tracker`` for one MCP POST whose SSE answer is
its one event, called directly, without HTTP: the request's parse
(``requests_in``), ``open_stream``, ``attach_feed`` with the SSE patch's
``Feed``, the answer reported (``fed_event``, its parse inside), and the
stream's end (``stream_ended``, closed by the client after the answer, as
the MCP SDKs close it).  Each stage is run cumulatively in its own process
under cachegrind, at a small and a large N, as ``instructions.py`` counts;
a stage's row is what it adds to the one before.  This is the part of the
plugin's cost per POST that a different record of a finished stream could
change (``docs/performance-instructions.md``, the per-POST floor).

``--state URL``: the same with the shared state in that Redis configured
(``docs/shared-state.md``): what the host's thread does for it (the hashes,
the in-flight entry held, the record built and queued).  The store's writer
thread is not started: its work is off the host's path, and how much of it
a run does depends on time (the 250 ms hold, the batching), which would make
the difference of two runs meaningless.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import sys
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGES = ("harness", "request parse", "open_stream", "attach_feed", "answer reported", "end")
SERVER = "127.0.0.1:8000"
STATE_VARIABLE = "MCP_RESUMPTION_BENCH_STATE"


def worker(stage: str, n: int) -> None:
    import httpx_sse

    # The POST, its answer and the session of that benchmark.
    from post_in_process import SESSION, _body, _result

    from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import requests_in
    try:
        from opentelemetry.instrumentation.mcp_resumption.patches.feed import RING, Feed
    except ImportError:  # a plugin from before the feed had a module of its own
        from opentelemetry.instrumentation.mcp_resumption.patches.sse import RING, Feed
    from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import (
        STREAMABLE_HTTP,
        Tracker,
    )

    last = STAGES.index(stage)
    state = os.environ.get(STATE_VARIABLE)
    store = None
    if state:
        from opentelemetry.instrumentation.mcp_resumption.shared.redis_state import RedisStore

        store = RedisStore(state, b"benchmark key")
        store._start = lambda: None  # no writer thread: the host's share only
    tracker = Tracker(store=store)
    # The monitor's record of each request, handed back when its answer ends
    # the operation (a plugin from before the operation metric takes none).
    takes_operation = "operation" in inspect.signature(tracker.open_stream).parameters
    operation = {"operation": SERVER} if takes_operation else {}

    def post(request_id: int) -> None:
        body = _body(request_id)
        sse = httpx_sse.ServerSentEvent(data=_result(request_id), id=str(request_id))
        if last < 1:
            return
        requests = requests_in(body)
        if last < 2:
            return
        stream = tracker.open_stream(
            SERVER, STREAMABLE_HTTP, session_id=SESSION, request_session_id=SESSION,
            carries=[key for key, _ in requests or ()], path="/mcp", body=body, sent=requests,
            **operation,
        )
        if last < 3:
            return
        feed = Feed(deque(maxlen=RING))
        tracker.attach_feed(stream, feed)
        if last < 4:
            return
        tracker.fed_event(stream, feed.normalise, sse)
        if last < 5:
            return
        feed.held = False
        tracker.stream_ended(stream, "closed by the application", closed_by_client=True)

    for request_id in range(1, 21):  # warm-up
        post(request_id)
    gc.collect()
    gc.freeze()
    for request_id in range(21, 21 + n):
        post(request_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", type=int, nargs=2, default=(200, 2200), metavar=("SMALL", "LARGE"))
    parser.add_argument("--worker", nargs=2, metavar=("STAGE", "N"))
    parser.add_argument("--state", metavar="URL", help="shared state in this Redis")
    args = parser.parse_args()
    if args.state:
        os.environ[STATE_VARIABLE] = args.state  # the workers inherit it
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    sys.path.insert(0, str(HERE))
    from instructions import per_unit

    small, large = args.ns
    per_post = per_unit(Path(__file__).resolve(), STAGES, (small, large))
    state = f", state {args.state}" if args.state else ""
    print(f"python {sys.version.split()[0]}, N {small}/{large}{state}\n")
    print("| stage | instructions per POST, added |")
    print("|---|---:|")
    previous = per_post["harness"]
    for stage in STAGES[1:]:
        print(f"| {stage} | {per_post[stage] - previous:+,.0f} |")
        previous = per_post[stage]
    print(f"| the tracker's share, in all | {per_post['end'] - per_post['harness']:+,.0f} |")


if __name__ == "__main__":
    main()
