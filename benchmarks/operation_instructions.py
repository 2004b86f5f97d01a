"""What the standard operation metric costs per request, in instructions:

    python3 benchmarks/operation_instructions.py      # ~1 min; valgrind as instructions.py

``mcp.client.operation.duration`` is one histogram point per request that
got an answer or a fate (``TelemetrySink.operation``): its attributes built
from the request's facts, then the OpenTelemetry SDK's ``Histogram.record``.
Each configuration runs in its own process under cachegrind at a small and a
large N, as ``instructions.py`` counts: ``harness`` (the loop alone),
``record`` (the SDK's record of the same attributes, built once: what any
histogram of five attributes costs), ``operation`` (the plugin's call),
``server`` (the server half's ``mcp.server.operation.duration`` point: four
attributes), and the parts of the SDK's price: exemplars off, a sixth
attribute, the attributes' dict built at each record, a Counter.  Every
record runs inside a sampled span, as in a request.
The rows of ``instructions.py`` carry it inside each POST; this shows its
share, which is mostly the SDK's own.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = (
    "harness", "record", "record_built", "record6", "record_no_exemplars", "counter",
    "operation", "record4", "server", "record_no_clean", "record_old_hash",
)
# opentelemetry-sdk 1.45's two new steps of a record, each replaced in its own
# run to weigh it: the attributes' cleaning in ``Measurement`` (to nothing) and
# the type-tagged hash of them (to the frozenset of their items, as before).
STEPS = {
    "record_no_clean": ("measurement", "_clean_attribute_value", lambda value, _: value),
    "record_old_hash": (
        "_view_instrument_match", "_hash_attributes", lambda value: frozenset(value.items())
    ),
}


def _replace_step(config: str) -> bool:
    """Replaces the SDK step ``config`` names; False where this SDK has none."""
    import importlib

    module_name, name, replacement = STEPS[config]
    module = importlib.import_module(f"opentelemetry.sdk.metrics._internal.{module_name}")
    if not hasattr(module, name):
        return False
    setattr(module, name, replacement)
    return True


def worker(config: str, n: int) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from opentelemetry.instrumentation.mcp_resumption.config import load
    from opentelemetry.instrumentation.mcp_resumption.facts import RequestFacts
    from opentelemetry.instrumentation.mcp_resumption.redaction import Redaction
    from opentelemetry.instrumentation.mcp_resumption.telemetry import TelemetrySink

    if config == "record_no_exemplars":
        from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter

        meter_provider = MeterProvider(
            metric_readers=[InMemoryMetricReader()], exemplar_filter=AlwaysOffExemplarFilter()
        )
    else:
        meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    sink = TelemetrySink(Redaction(load({})), meter_provider=meter_provider)
    facts = RequestFacts(
        "POST", "127.0.0.1:8000", "127.0.0.1", port=8000, protocol_version="2025-11-25",
        mcp_name="search_index",
    )
    from opentelemetry.instrumentation.mcp_resumption.server.operations import (
        ServerOperations,
        _Handled,
    )

    server = ServerOperations(meter_provider)
    handled = _Handled("tools/call", "search_index", 1, "tcp")
    histogram = sink._operation_duration
    counter = meter_provider.get_meter("bench").create_counter("bench.calls")
    attributes = {
        "mcp.method.name": "tools/call",
        "server.address": "127.0.0.1",
        "server.port": 8000,
        "gen_ai.tool.name": "search_index",
        "mcp.protocol.version": "2025-11-25",
    }
    six = {**attributes, "error.type": "tool_error"}
    # What the server half's point carries.
    four = {
        "mcp.method.name": "tools/call",
        "gen_ai.tool.name": "search_index",
        "mcp.protocol.version": "2025-11-25",
        "network.transport": "tcp",
    }
    tool, version = "search_index", "2025-11-25"

    if config in STEPS:
        _replace_step(config)

    def once() -> None:
        if config in ("record", "record_no_exemplars", *STEPS):
            histogram.record(0.05, attributes)
        elif config == "record_built":
            histogram.record(0.05, {
                "mcp.method.name": "tools/call",
                "server.address": "127.0.0.1",
                "server.port": 8000,
                "gen_ai.tool.name": tool,
                "mcp.protocol.version": version,
            })
        elif config == "record6":
            histogram.record(0.05, six)
        elif config == "counter":
            counter.add(1, attributes)
        elif config == "operation":
            sink.operation("tools/call", None, facts, None)
        elif config == "record4":
            server._operation.record(0.05, four)
        elif config == "server":
            server.operation(handled, None, "2025-11-25")

    # Inside a sampled span, as in a server's request (the default exemplar
    # filter, trace-based, then keeps exemplars).
    from opentelemetry.sdk.trace import TracerProvider

    with TracerProvider().get_tracer("bench").start_as_current_span("request"):
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
    from importlib.metadata import version

    print(
        f"python {sys.version.split()[0]}, opentelemetry-sdk {version('opentelemetry-sdk')}, "
        f"N {small}/{large}\n"
    )
    cost = {config: per_call[config] - per_call["harness"] for config in CONFIGS[1:]}
    rows = (
        ("histogram record, 5 attributes, dict built once (the SDK's alone)", cost["record"]),
        ("... the same, exemplars off (AlwaysOffExemplarFilter)", cost["record_no_exemplars"]),
        ("... exemplars' share", cost["record"] - cost["record_no_exemplars"]),
        ("... a sixth string attribute adds", cost["record6"] - cost["record"]),
        ("... the dict built at each record adds", cost["record_built"] - cost["record"]),
        ("... the attributes' cleaning (1.45: in Measurement)",
         cost["record"] - cost["record_no_clean"]),
        ("... the type-tagged hash over a frozenset of the items (1.45)",
         cost["record"] - cost["record_old_hash"]),
        ("counter add, the same 5 attributes", cost["counter"]),
        ("client: mcp.client.operation.duration point (TelemetrySink.operation)",
         cost["operation"]),
        ("... of which ours (over the SDK's record of its attributes)",
         cost["operation"] - cost["record"]),
        ("server: mcp.server.operation.duration point (ServerOperations.operation)",
         cost["server"]),
        ("... of which ours (over the SDK's record of its 4 attributes)",
         cost["server"] - cost["record4"]),
    )
    print("| what | instructions |\n|---|---:|")
    for what, value in rows:
        print(f"| {what} | {value:+,.0f} |")


if __name__ == "__main__":
    main()
