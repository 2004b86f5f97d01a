"""Open SSE streams, read one event, and abandon each iterator in a reference
cycle (``except E as e: err = e``), so that the cyclic garbage collector
finalises the suspended iterators at whatever allocation it likes, also one
made while the instrumentation holds a lock.

    python abandon_in_cycle.py THRESHOLD THREADS ITERATIONS

THRESHOLD is ``gc.set_threshold``'s first value ("default" keeps it).
Prints one JSON line when every thread has finished; a hang is the failure.
Needs HARDENING_SERVER_URL (a fuzz_sse.RawServer with a /cycle/* reply).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading

import httpx
import httpx_sse

from fuzz_sse import TLS
from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

URL = os.environ["HARDENING_SERVER_URL"]


def abandon(client: httpx.Client, n: int) -> None:
    headers = {"accept": "text/event-stream", "mcp-session-id": f"cycle-{n}"}
    request = client.build_request("GET", URL + "/cycle/stream", headers=headers)
    response = client.send(request, stream=True)
    events = httpx_sse.EventSource(response).iter_sse()
    next(events)
    # Closed, so that finalising the iterator asks nothing more of httpcore,
    # whose pool lock has the same hazard without any instrumentation.
    response.close()
    try:
        raise LookupError(n)
    except LookupError as error:
        kept = error  # noqa: F841  frame -> kept -> traceback -> frame: a cycle


def run(iterations: int, offset: int, done: list[int]) -> None:
    with httpx.Client(verify=TLS, trust_env=False) as client:
        for n in range(iterations):
            abandon(client, offset + n)
    done.append(iterations)


def main() -> None:
    threshold, threads, iterations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    telemetry = Telemetry()
    if os.environ.get("ABANDON_BARE") != "1":  # the uninstrumented control
        McpResumptionInstrumentor().instrument(**telemetry.providers())
    if threshold != "default":
        gc.set_threshold(int(threshold), 10, 10)
    done: list[int] = []
    workers = [
        threading.Thread(target=run, args=(iterations, i * iterations, done), daemon=True)
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    gc.set_threshold(700, 10, 10)
    gc.collect()
    telemetry.tracer_provider.force_flush()  # the reports deferred from finalizers
    events = sum(telemetry.counts("mcp.client.stream.events").values())
    print(json.dumps({"done": sum(done), "threads": len(done), "events": events}), flush=True)


if __name__ == "__main__":
    main()
