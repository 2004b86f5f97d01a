"""What the plugin costs a program that starts under opentelemetry-instrument
and never uses MCP: ``python -c pass``, the plugin enabled vs disabled
(OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=mcp_resumption), interleaved in one
run.  Target: at most 50 ms more.

    python benchmarks/startup.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_MS = 50.0


def one_start(disabled: bool) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none",
               OTEL_LOGS_EXPORTER="none")
    if disabled:
        env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "mcp_resumption"
    instrument = shutil.which("opentelemetry-instrument", path=str(Path(sys.executable).parent))
    started = time.perf_counter()
    result = subprocess.run(
        [instrument, sys.executable, "-c", "import sys; print(len(sys.modules))"],
        env=env, capture_output=True, text=True, check=True,
    )
    return time.perf_counter() - started, int(result.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    enabled, disabled, modules = [], [], {}
    for _ in range(rounds):
        for off in (False, True):
            seconds, count = one_start(off)
            (disabled if off else enabled).append(seconds)
            modules[off] = count
    on_ms, off_ms = statistics.median(enabled) * 1e3, statistics.median(disabled) * 1e3
    paired = statistics.median(a - b for a, b in zip(enabled, disabled)) * 1e3
    verdict = "PASS" if paired <= TARGET_MS else "MISS"
    print(f"| configuration | median ms | modules |\n|---|---:|---:|\n"
          f"| plugin disabled | {off_ms:,.0f} | {modules[True]} |\n"
          f"| plugin enabled | {on_ms:,.0f} | {modules[False]} |\n\n"
          f"added: {paired:+.0f} ms per start (median of {rounds} paired rounds), "
          f"ratio {on_ms / off_ms:.3f}; target <= {TARGET_MS:.0f} ms: {verdict}")


if __name__ == "__main__":
    main()
