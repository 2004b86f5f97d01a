"""What the plugin costs a program that starts under opentelemetry-instrument
and never uses MCP: ``python -c pass``, both halves enabled vs both disabled
(OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=mcp_resumption,mcp_resumption_server),
interleaved in one run.  Target: at most 10 ms more; on 2 shared cores the
median swings by about 15 ms between runs, so the plugin's module count
(tests/test_startup_modules.py: at most 10) decides, and the time is reported.

    python benchmarks/startup.py [--rounds N] [--src PATH]

``--src``: the package tree to measure (PYTHONPATH), e.g. another checkout's
``src`` to compare two versions in the same conditions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_MS = 10.0
BOTH = "mcp_resumption,mcp_resumption_server"
PACKAGE = "opentelemetry.instrumentation.mcp_resumption"
PROGRAM = (
    "import sys, json; print(json.dumps([len(sys.modules), "
    f"sum(m == {PACKAGE!r} or m.startswith({PACKAGE + '.'!r}) for m in sys.modules)]))"
)


def one_start(disabled: bool, src: str | None) -> tuple[float, int, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none",
               OTEL_LOGS_EXPORTER="none")
    if src:
        env["PYTHONPATH"] = src
    if disabled:
        env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = BOTH
    instrument = shutil.which("opentelemetry-instrument", path=str(Path(sys.executable).parent))
    started = time.perf_counter()
    result = subprocess.run(
        [instrument, sys.executable, "-c", PROGRAM],
        env=env, capture_output=True, text=True, check=True,
    )
    elapsed = time.perf_counter() - started
    total, ours = json.loads(result.stdout.strip().splitlines()[-1])
    return elapsed, total, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--src")
    args = parser.parse_args()
    enabled, disabled, modules = [], [], {}
    for _ in range(args.rounds):
        for off in (False, True):
            seconds, total, ours = one_start(off, args.src)
            (disabled if off else enabled).append(seconds)
            modules[off] = (total, ours)
    on_ms, off_ms = statistics.median(enabled) * 1e3, statistics.median(disabled) * 1e3
    paired = statistics.median(a - b for a, b in zip(enabled, disabled)) * 1e3
    verdict = "PASS" if paired <= TARGET_MS else "MISS"
    print(f"| configuration | median ms | modules | the plugin's |\n|---|---:|---:|---:|\n"
          f"| both halves disabled | {off_ms:,.0f} | {modules[True][0]} | {modules[True][1]} |\n"
          f"| both halves enabled | {on_ms:,.0f} | {modules[False][0]} | {modules[False][1]} |\n\n"
          f"added: {paired:+.1f} ms per start (median of {args.rounds} paired rounds), "
          f"ratio {on_ms / off_ms:.3f}; target <= {TARGET_MS:.0f} ms: {verdict}")


if __name__ == "__main__":
    main()
