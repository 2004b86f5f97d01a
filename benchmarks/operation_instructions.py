"""What the standard operation metric costs per request, in instructions:

    python3 benchmarks/operation_instructions.py      # ~1 min; valgrind as instructions.py

``mcp.client.operation.duration`` is one histogram point per request that
got an answer or a fate (``TelemetrySink.operation``): its attributes built
from the request's facts, then the OpenTelemetry SDK's ``Histogram.record``.
Each configuration runs in its own process under cachegrind at a small and a
large N, as ``instructions.py`` counts: ``harness`` (the loop alone),
``record`` (the SDK's record of the same attributes, built once: what any
histogram of five attributes costs), ``operation`` (the plugin's call).
The rows of ``instructions.py`` carry it inside each POST; this shows its
share, which is mostly the SDK's own.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = ("harness", "record", "operation")


def worker(config: str, n: int) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from opentelemetry.instrumentation.mcp_resumption.config import load
    from opentelemetry.instrumentation.mcp_resumption.facts import RequestFacts
    from opentelemetry.instrumentation.mcp_resumption.redaction import Redaction
    from opentelemetry.instrumentation.mcp_resumption.telemetry import TelemetrySink

    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    sink = TelemetrySink(Redaction(load({})), meter_provider=meter_provider)
    facts = RequestFacts(
        "POST", "127.0.0.1:8000", "127.0.0.1", port=8000, protocol_version="2025-11-25",
        mcp_name="search_index",
    )
    histogram = sink._operation_duration
    attributes = {
        "mcp.method.name": "tools/call",
        "server.address": "127.0.0.1",
        "server.port": 8000,
        "gen_ai.tool.name": "search_index",
        "mcp.protocol.version": "2025-11-25",
    }

    def once() -> None:
        if config == "record":
            histogram.record(0.05, attributes)
        elif config == "operation":
            sink.operation("tools/call", None, facts, None)

    for _ in range(20):  # warm-up
        once()
    gc.collect()
    gc.freeze()
    for _ in range(n):
        once()


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
    print("| what | instructions per request |")
    print("|---|---:|")
    for config in CONFIGS[1:]:
        print(f"| {config} | {per_call[config] - per_call['harness']:+,.0f} |")


if __name__ == "__main__":
    main()
