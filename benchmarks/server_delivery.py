"""What the server half's delivery fates cost per answered request, in instructions:

    python3 benchmarks/server_delivery.py      # ~1 min; valgrind as instructions.py

Every request a server answers now has a delivery fate
(``mcp.server.resumption.deliveries``), on a path that had no metric record.
So the fate is not recorded per answer: it is added to an in-process tally
that an observable counter reports at each collection.  Each configuration
runs in its own process under cachegrind at a small and a large N, as
``instructions.py`` counts:

* ``harness``: the loop alone;
* ``record``: what a record per answer would have cost, the OpenTelemetry
  SDK's ``Counter.add`` with the fate's four attributes (built once);
* ``tally``: the plugin's ``Deliveries.fate`` (a dict addition under a lock);
* ``answer``: the whole of what the server half does for one answered request
  before 2026-07-28 (the request seen on the transport's inbound stream, its
  answer on the outbound one, its fate), with the SDK's own message objects.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = ("harness", "record", "tally", "answer")


def worker(config: str, n: int) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from opentelemetry.instrumentation.mcp_resumption.server.answers import _Pending
    from opentelemetry.instrumentation.mcp_resumption.server.delivery import Deliveries

    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
    counter = meter.create_counter("bench.deliveries")
    attributes = {
        "mcp.resumption.delivery.fate": "delivered",
        "mcp.transport": "streamable-http",
        "server.address": "127.0.0.1",
        "server.port": 8000,
    }
    tallies = Deliveries(meter, 5.0)
    server = ("streamable-http", "127.0.0.1", 8000)

    class Observer:  # what _Pending reads of the server half's observer
        _deliveries = tallies

    class Transport:  # the request's stream is open: the answer is delivered
        _event_store = None

    transport = Transport()
    transport._request_streams = {"7": None}
    pending = _Pending(Observer(), transport)
    request, answer = _messages()

    def once() -> None:
        if config == "record":
            counter.add(1, attributes)
        elif config == "tally":
            tallies.fate("delivered", server)
        elif config == "answer":
            pending.request(request)
            pending.answer(answer)

    for _ in range(20):  # warm-up
        once()
    gc.collect()
    gc.freeze()
    for _ in range(n):
        once()


def _messages() -> tuple[object, object]:
    """A tools/call and its answer as the SDK's transports carry them."""
    from mcp.shared.message import SessionMessage
    from mcp.types import JSONRPCRequest, JSONRPCResponse

    call = JSONRPCRequest(
        jsonrpc="2.0", id=7, method="tools/call",
        params={"name": "search_index", "arguments": {"query": "mcp"}},
    )
    result = JSONRPCResponse(jsonrpc="2.0", id=7, result={"content": []})
    from mcp.types import JSONRPCMessage

    if isinstance(JSONRPCMessage, type):  # mcp 1.x: a RootModel around each message
        call, result = JSONRPCMessage(call), JSONRPCMessage(result)
    return SessionMessage(call), SessionMessage(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", type=int, nargs=2, default=(200, 2200), metavar=("SMALL", "LARGE"))
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "N"))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    sys.path.insert(0, str(HERE))
    from instructions import per_unit

    small, large = args.ns
    per_call = per_unit(Path(__file__).resolve(), CONFIGS, (small, large))
    print(f"python {sys.version.split()[0]}, N {small}/{large}\n")
    print("| what | instructions per answered request |")
    print("|---|---:|")
    for config in CONFIGS[1:]:
        print(f"| {config} | {per_call[config] - per_call['harness']:+,.0f} |")


if __name__ == "__main__":
    main()
