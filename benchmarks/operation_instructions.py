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

The same run then measures what each instrumentation adds per ``tools/call``
(issue 44: measure first), counted the same way (cachegrind, the client
process alone, the difference of a loop of N and of M calls over M − N), in
each environment of ``--envs`` (by default ``.venv-bench-mcp1``, mcp 1.x with
the peers, built by this command when missing, and ``.venv-mcp2``): the
bare client, ``httpx-instr``, the plugin alone with its defaults, the same
without its operation metric (the SDK's record's share, shown apart, never
subtracted), traceloop's ``opentelemetry-instrumentation-mcp`` and logfire's
``instrument_mcp()``, each over the bare client, on a ``tools/call``
answered by SSE and by JSON (``sse_server.py``), judged against the
targets (the plugin below each peer; ≤ 0.30 × httpx-instr's by SSE,
≤ 0.15 × by JSON).  Last, the plugin's function calls per ``tools/call``
(``sys.setprofile``, frames of the plugin's package) against a real SDK
server with an event store, each call answered on its own unbroken stream
(``tools_call_costs.py``).  Wall and CPU µs per call, timed natively after
the counting, stand beside (the machine's load is printed).

    python3 benchmarks/operation_instructions.py             # mcp 1.x alone: 36 min at load 6-17
    python3 benchmarks/operation_instructions.py --quick     # seconds: natively, CPU µs
    python3 benchmarks/operation_instructions.py --only tools --only calls
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools_call_costs import CONFIGS as TOOLS_CONFIGS
from tools_call_costs import PEER_MODULES, PEERS, PLUGIN, PLUGIN_NO_OPERATION

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
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
    from opentelemetry.instrumentation.mcp_resumption.telemetry.facts import RequestFacts
    from opentelemetry.instrumentation.mcp_resumption.telemetry.redaction import Redaction
    from opentelemetry.instrumentation.mcp_resumption.telemetry.sink import TelemetrySink

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


def _record_table(per_call: dict[str, float]) -> dict[str, float]:
    cost = {config: value - per_call["harness"] for config, value in per_call.items()}
    rows = [
        ("histogram record, 5 attributes, dict built once (the SDK's alone)",
         lambda: cost["record"]),
        ("... the same, exemplars off (AlwaysOffExemplarFilter)",
         lambda: cost["record_no_exemplars"]),
        ("... exemplars' share", lambda: cost["record"] - cost["record_no_exemplars"]),
        ("... a sixth string attribute adds", lambda: cost["record6"] - cost["record"]),
        ("... the dict built at each record adds", lambda: cost["record_built"] - cost["record"]),
        ("... the attributes' cleaning (1.45: in Measurement)",
         lambda: cost["record"] - cost["record_no_clean"]),
        ("... the type-tagged hash over a frozenset of the items (1.45)",
         lambda: cost["record"] - cost["record_old_hash"]),
        ("counter add, the same 5 attributes", lambda: cost["counter"]),
        ("client: mcp.client.operation.duration point (TelemetrySink.operation)",
         lambda: cost["operation"]),
        ("... of which ours (over the SDK's record of its attributes)",
         lambda: cost["operation"] - cost["record"]),
        ("server: mcp.server.operation.duration point (ServerOperations.operation)",
         lambda: cost["server"]),
        ("... of which ours (over the SDK's record of its 4 attributes)",
         lambda: cost["server"] - cost["record4"]),
    ]
    print("| what | instructions |\n|---|---:|")
    for what, value in rows:
        with contextlib.suppress(KeyError):  # a configuration not run (--record-configs)
            print(f"| {what} | {value():+,.0f} |")
    return cost


# ------------------------------------------------------ per tools/call (issue 44)

MCP1_BENCH = ROOT / ".venv-bench-mcp1" / "bin" / "python"
MCP2_ENV = ROOT / ".venv-mcp2" / "bin" / "python"
ANSWERS = ("SSE", "JSON")
TARGETS = {"SSE": 0.30, "JSON": 0.15}  # × what httpx-instr adds, the plugin over bare
CALLS_TARGET = 80  # the plugin's function calls per tools/call
# The peers and the plugin without its operation metric are weighed on the
# SSE answer only (each configuration is two processes of ~10^10 instructions
# of start-up under valgrind); the peers on mcp 1.x only (their instrumentors
# predate mcp 2.x).
SSE_ONLY = (*PEERS, PLUGIN_NO_OPERATION)


def build_bench_env(python: Path) -> None:
    """``.venv-bench-mcp1``: mcp 1.x with the two peers (never the project's
    test dependencies); without them if they cannot be installed (their rows
    then say so)."""
    venv = python.parent.parent
    base = ["-e", ".[instruments-any,test]", "-e", "./demo", "mcp<2"]
    uv = shutil.which("uv")

    def install(packages: list[str]) -> bool:
        if uv:
            made = subprocess.run([uv, "venv", "-q", "--allow-existing", str(venv)], cwd=ROOT)
            command = [uv, "pip", "install", "-q", "--python", str(python), *packages]
        else:
            made = subprocess.run([sys.executable, "-m", "venv", str(venv)], cwd=ROOT)
            command = [str(python), "-m", "pip", "install", "-q", *packages]
        return made.returncode == 0 and subprocess.run(command, cwd=ROOT).returncode == 0

    print(f"building {venv.name} (mcp 1.x and the peers)", file=sys.stderr, flush=True)
    if not install([*base, "opentelemetry-instrumentation-mcp", "logfire"]):
        print("the peers could not be installed: their rows will say so", file=sys.stderr)
        if not install(base):
            raise SystemExit(f"{venv.name} could not be built")


def _probe(python: Path) -> dict[str, Any]:
    code = (
        "import importlib.metadata as m, importlib.util as u, json, sys\n"
        "found = {}\n"
        "for name in ['mcp', 'opentelemetry-sdk', 'opentelemetry-instrumentation-httpx',"
        " 'opentelemetry-instrumentation-mcp', 'logfire']:\n"
        "    try: found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: pass\n"
        f"peers = {dict(PEER_MODULES)!r}\n"
        "found['peers'] = [p for p, mod in peers.items() if u.find_spec(mod)]\n"
        "found['python'] = sys.version.split()[0]\n"
        "print(json.dumps(found))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


class _Server:
    """A server in its own process, natively (never counted)."""

    def __init__(self, command: list[str], **kwargs: Any) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, **kwargs)
        assert self.process.stdout is not None
        self.base = f"http://127.0.0.1:{int(self.process.stdout.readline())}"

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        else:
            self.process.terminate()
        self.process.wait(timeout=30)


def _worker_command(python: Path, config: str, n: int, url: str) -> list[str]:
    return [str(python), str(HERE / "tools_call_costs.py"), "--worker", config, str(n), url]


def _native(command: list[str]) -> dict[str, float]:
    from instructions import _env

    result = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{command[3:]} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def tools_rows(envs: list[Path], answers: list[str], quick: bool, ns: tuple[int, int],
               jobs: int, records: list[tuple[str, int]],
               record_python: Path | None) -> dict[str, Any]:
    """Counts (or, quick, times natively) every row's configurations, and
    the record configurations of the metric table beside them, in one pool."""
    import concurrent.futures

    from instructions import count_instructions, ensure_valgrind

    valgrind = None if quick else ensure_valgrind()
    small, large = ns
    probes = {python: _probe(python) for python in envs}
    servers: list[_Server] = []
    jobs_to_run: dict[tuple, list[str]] = {}
    rows: dict[str, dict[str, Any]] = {}
    started = time.time()
    try:
        for python in envs:
            probe = probes[python]
            server = _Server([str(python), str(HERE / "sse_server.py")], stdin=subprocess.PIPE)
            servers.append(server)
            for answer in answers:
                row = f"tools/call mcp {probe['mcp']}, {answer}"
                peers = [p for p in PEERS if answer == "SSE" and probe["mcp"].startswith("1.")]
                url = server.base + ("/json" if answer == "JSON" else "/mcp")
                configs = [c for c in TOOLS_CONFIGS
                           if (c not in SSE_ONLY or answer == "SSE") and (c not in PEERS
                                                                          or c in peers)]
                rows[row] = {"python": python, "answer": answer, "url": url, "probe": probe,
                             "configs": [c for c in configs
                                         if c not in PEERS or c in probe["peers"]],
                             "missing": [p for p in peers if p not in probe["peers"]]}
                for config in rows[row]["configs"]:
                    for n in ((large,) if quick else (small, large)):
                        jobs_to_run[row, config, n] = _worker_command(python, config, n, url)
        if record_python is not None:
            for config, n in records:
                jobs_to_run["records", config, n] = [
                    str(record_python), str(Path(__file__).resolve()), "--worker", config, str(n)
                ]
        done = [0]

        def run(key: tuple) -> Any:
            command = jobs_to_run[key]
            if quick:
                value = _native(command) if key[0] != "records" else {}
            else:
                value = count_instructions(valgrind, command)
            done[0] += 1
            # Each count as it comes: a run stopped half-way keeps what it counted.
            print(f"[{time.time() - started:5.0f} s] {done[0]}/{len(jobs_to_run)} {key}: {value}",
                  file=sys.stderr, flush=True)
            return value

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            results = dict(zip(jobs_to_run, pool.map(run, jobs_to_run)))
        counted_seconds = time.time() - started
        # Natively, one at a time, after the counting: the wall and CPU µs.
        timed = {}
        for row, spec in rows.items():
            for config in spec["configs"]:
                timed[row, config] = (
                    results[row, config, large] if quick
                    else _native(_worker_command(spec["python"], config, large, spec["url"]))
                )
    finally:
        for server in servers:
            server.close()
    return {"rows": rows, "results": results, "timed": timed, "probes": probes,
            "counted_seconds": counted_seconds}


def _over(per: dict[str, float], config: str) -> float:
    return per[config] - per["bare"]


def print_tools(measured: dict[str, Any], quick: bool, ns: tuple[int, int],
                record_cost: dict[str, float] | None) -> list[tuple[str, str, str]]:
    small, large = ns
    unit = "CPU µs natively (quick: not instructions)" if quick else "instructions"
    verdicts = []
    print(f"\n| row | configuration | {unit} per tools/call | over bare | × httpx-instr's "
          f"| target | verdict | wall µs/call | CPU µs/call |")
    print("|---|---|---:|---:|---:|---|---|---:|---:|")
    for row, spec in measured["rows"].items():
        results, timed = measured["results"], measured["timed"]
        if quick:
            per = {c: results[row, c, large]["cpu"] / large * 1e6 for c in spec["configs"]}
        else:
            per = {c: (results[row, c, large] - results[row, c, small]) / (large - small)
                   for c in spec["configs"]}
        httpx_adds = _over(per, "httpx-instr")
        plugin = _over(per, PLUGIN)
        for config in spec["configs"]:
            over = _over(per, config)
            ratio = f"{over / httpx_adds:.3f} ×" if httpx_adds > 0 and config != "bare" else ""
            target = verdict = ""
            if config == PLUGIN:
                bound = TARGETS[spec["answer"]]
                target = f"≤ {bound:.2f} × httpx-instr"
                verdict = "PASS" if httpx_adds > 0 and plugin / httpx_adds <= bound else "MISS"
            elif config in PEERS:
                target = f"the plugin's {plugin:+,.0f} below it"
                verdict = "PASS" if plugin < over else "MISS"
            elif config == PLUGIN_NO_OPERATION:
                share = plugin - over
                ratio += f" (the operation metric: {share:+,.0f}, {share / plugin:.0%})" if (
                    plugin) else ""
            wall, cpu = timed[row, config]["wall"], timed[row, config]["cpu"]
            print(f"| {row} | {config} | {per[config]:,.0f} | {over:+,.0f} | {ratio} | {target} "
                  f"| {verdict} | {wall / large * 1e6:,.0f} | {cpu / large * 1e6:,.0f} |")
            if verdict:
                verdicts.append((row, f"{config}: {target}", verdict))
        for peer in spec["missing"]:
            print(f"| {row} | {peer} | not installed in {spec['python']} "
                  f"(build .venv-bench-mcp1: this command without --envs) | | | | NOT RUN | | |")
            verdicts.append((row, f"{peer}: not installed", "NOT RUN"))
    if record_cost is not None:
        point = record_cost["operation"]
        print(f"\nthe SDK's share, apart: one mcp.client.operation.duration point costs "
              f"{point:,.0f} instructions in this run ({record_cost['record']:,.0f} of them the "
              f"SDK's histogram record of its 5 attributes); the plugin records one per "
              f"tools/call (the row `{PLUGIN_NO_OPERATION}` is the plugin without it).")
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", type=int, nargs=2, default=(200, 2200), metavar=("SMALL", "LARGE"),
                        help="records per record worker")
    parser.add_argument("--tools-ns", type=int, nargs=2, default=(50, 100),
                        metavar=("SMALL", "LARGE"), help="tools/call per loop")
    parser.add_argument("--calls", type=int, default=400, help="tools/call profiled")
    parser.add_argument("--envs", type=Path, nargs="+",
                        help="the pythons the clients run in (default: .venv-bench-mcp1, built "
                             "when missing, and .venv-mcp2)")
    parser.add_argument("--only", action="append", choices=("records", "tools", "calls"))
    parser.add_argument("--answers", nargs="+", choices=ANSWERS, default=list(ANSWERS))
    parser.add_argument("--record-configs", nargs="+", choices=CONFIGS,
                        help="the metric table's configurations (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="natively (CPU µs, no valgrind), 5 calls a loop, 20 profiled")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "N"))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    sys.path.insert(0, str(HERE))
    started, load = time.time(), os.getloadavg()
    parts = set(args.only or ("records", "tools", "calls"))
    if args.quick:
        parts.discard("records")  # its workers print no timing; the full run counts them
        args.tools_ns, args.calls = (5, 5), min(args.calls, 20)
    envs = args.envs
    if envs is None:
        if not MCP1_BENCH.exists():
            build_bench_env(MCP1_BENCH)
        envs = [MCP1_BENCH, *([MCP2_ENV] if MCP2_ENV.exists() else [])]
    envs = [Path(python).absolute() for python in envs]
    record_configs = args.record_configs or CONFIGS
    records = [(c, n) for c in record_configs for n in args.ns] if "records" in parts else []
    measured = None
    if "tools" in parts or records:
        measured = tools_rows(envs if "tools" in parts else [], args.answers, args.quick,
                              tuple(args.tools_ns), args.jobs, records, envs[0])
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
          f"{os.cpu_count()} CPUs, load {load[0]:.1f} at the start")
    record_cost = None
    if records:
        small, large = args.ns
        per_record = {c: (measured["results"]["records", c, large]
                          - measured["results"]["records", c, small]) / (large - small)
                      for c in record_configs}
        print(f"\nthe price of a metric record ({envs[0]}: N {small}/{large})\n")
        record_cost = _record_table(per_record)
    verdicts = []
    if "tools" in parts:
        for python, probe in measured["probes"].items():
            print(f"{python}: {json.dumps(probe)}")
        verdicts = print_tools(measured, args.quick, tuple(args.tools_ns), record_cost)
    if "calls" in parts:
        python = next((p for p in envs if _probe(p)["mcp"].startswith("1.")), envs[0])
        server = _Server([str(python), str(HERE / "tools_call_costs.py"), "--serve"],
                         stderr=subprocess.DEVNULL)
        try:
            from instructions import _env

            result = subprocess.run(
                [str(python), str(HERE / "tools_call_costs.py"), "--calls", str(args.calls),
                 server.base + "/mcp"],
                env=_env(), capture_output=True, text=True, timeout=1800,
            )
        finally:
            server.close()
        if result.returncode != 0:
            raise SystemExit(f"the function-call count failed:\n{result.stderr[-3000:]}")
        counted = json.loads(result.stdout.strip().splitlines()[-1])
        verdict = "PASS" if counted["per_call"] <= CALLS_TARGET else "MISS"
        print(f"\n| the plugin's function calls per tools/call (mcp {_probe(python)['mcp']}, "
              f"event store on, each answered on its own stream, {counted['calls']} calls) "
              f"| target | verdict |\n|---:|---|---|\n"
              f"| {counted['per_call']:,.1f} | ≤ {CALLS_TARGET} | {verdict} |")
        verdicts.append(("function calls", f"≤ {CALLS_TARGET} per tools/call", verdict))
    if verdicts:
        print("\n| row | target | verdict |\n|---|---|---|")
        for row, target, verdict in verdicts:
            print(f"| {row} | {target} | {verdict} |")
    print(f"\nrun time {time.time() - started:.0f} s, load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
