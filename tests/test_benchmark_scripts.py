"""The in-process per-POST benchmarks run, shortened, and print every row
they judge (``benchmarks/README.md``, "Per POST without the network")."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str) -> str:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--rounds", "1", "--posts", "30"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def test_post_in_process_judges_each_answer_and_the_bound():
    out = _run("post_in_process.py")
    for request in ("POST→json", "POST→sse (httpx-sse)", "POST→sse, every stream evicts one"):
        [judged] = [line for line in out.splitlines() if line.startswith(f"| {request} | ours |")]
        assert judged.endswith(("| PASS |", "| MISS |")), judged


def test_request_path_floor_prints_its_rows():
    out = _run("request_path_floor.py")
    for row in ("httpx-instr", "stand-in (patch points only)", "ours"):
        assert f"| {row} |" in out, out


ROOT = BENCHMARKS.parent


@pytest.mark.mcp2
@pytest.mark.skipif(
    shutil.which("valgrind") is None or not (ROOT / ".venv-mcp2" / "bin" / "python").exists(),
    reason="valgrind or .venv-mcp2 missing (scripts/bench-instructions installs both)",
)
def test_instruction_benchmark_counts_and_judges_a_row():
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "instructions.py"), "--rows", "httpx-sse sync",
         "--ns", "20", "120", "--timed", "1"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # The µs factor needs a positive timed difference, which a short run on a
    # loaded machine may not get; the instruction counts decide the verdicts.
    assert re.search(
        r"^factor: (\d+\.\d{3} µs per 1,000 instructions|not measured)", result.stdout, re.M
    ), result.stdout
    [judged] = [
        line for line in result.stdout.splitlines()
        if line.startswith("| httpx-sse sync (per event) | ours |")
    ]
    assert judged.endswith(("| PASS |", "| MISS |")), judged


def test_tracker_instruction_stages_each_run():
    """Each stage the tracker benchmark counts runs as a worker (natively
    here: the counting under valgrind is instructions.py's, tested above),
    so the calls it makes cannot drift from the tracker's API unnoticed."""
    sys.path.insert(0, str(BENCHMARKS))
    from tracker_instructions import STAGES

    for stage in STAGES:
        result = subprocess.run(
            [sys.executable, str(BENCHMARKS / "tracker_instructions.py"), "--worker", stage, "5"],
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert result.returncode == 0, (stage, result.stderr[-4000:])


@pytest.mark.mcp1
def test_tools_call_costs_run_every_row_quickly():
    """Issue 44's per-``tools/call`` rows (``operation_instructions.py``) in
    their quick mode (natively, no valgrind): every configuration runs
    through the real SDK client against a real server, and the plugin's
    function calls are counted.  A peer that is not installed (a clean
    clone without ``.venv-bench-mcp1``) is reported as not run, never left
    out; the bare and plugin rows run either way."""
    bench_env = ROOT / ".venv-bench-mcp1" / "bin" / "python"
    python = bench_env if bench_env.exists() else Path(sys.executable)
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "operation_instructions.py"), "--quick",
         "--envs", str(python), "--only", "tools", "--only", "calls"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    [version] = re.findall(r"^\| tools/call mcp (1\.\d+\.\d+), SSE \| bare \|", out, re.M)
    for answer in ("SSE", "JSON"):
        row = f"| tools/call mcp {version}, {answer} |"
        for config in ("bare", "httpx-instr"):
            assert f"{row} {config} |" in out, out
        [judged] = [line for line in out.splitlines() if line.startswith(f"{row} plugin |")]
        assert re.search(r"\| (PASS|MISS) \| [\d,]+ \| [\d,]+ \|$", judged), judged
    sse = f"| tools/call mcp {version}, SSE |"
    assert f"{sse} plugin, no operation metric |" in out, out
    for peer in ("traceloop", "logfire"):
        [line] = [line for line in out.splitlines() if line.startswith(f"{sse} {peer} |")]
        assert re.search(r"\| (PASS|MISS|NOT RUN) \|", line), line
    assert re.search(r"^\| [\d,.]+ \| ≤ 80 \| (PASS|MISS) \|$", out, re.M), out


@pytest.mark.mcp2
def test_server_instruction_benchmark_server_serves_a_session_and_stops():
    """``server_instructions.py``'s server, in both configurations and both
    answers, natively (the counting under valgrind is ``instructions.py``'s
    method, tested above): it answers the session's tools/calls and exits
    cleanly when its stdin closes, as the count needs."""
    sys.path.insert(0, str(ROOT / "tests"))
    from server_harness import RawSession

    for config, answer in (("server half", "SSE"), ("bare", "JSON")):
        server = subprocess.Popen(
            [sys.executable, str(BENCHMARKS / "server_instructions.py"), "--serve", config,
             answer],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            port = int(server.stdout.readline())
            raw = RawSession(f"http://127.0.0.1:{port}/mcp")
            for k in range(3):
                assert raw.echo(f"call {k}")["result"]["content"][0]["text"] == f"call {k}"
            raw.close()
        finally:
            server.stdin.close()
            assert server.wait(timeout=30) == 0, (config, answer)


@pytest.mark.mcp2
@pytest.mark.skipif(
    shutil.which("cc") is None or not Path("/usr/include/valgrind/callgrind.h").exists(),
    reason="cc or valgrind's callgrind.h missing (Debian's valgrind package carries it)",
)
def test_attribution_switch_compiles_and_runs_natively(tmp_path):
    """``attribute_instructions.py``'s switch (``cgmon.c``) compiles against
    this Python and its worker runs a session through it natively (callgrind's
    requests are no-ops outside valgrind), for the whole plugin and for one
    module; and the buckets a tools/call enters are listed."""
    sys.path.insert(0, str(BENCHMARKS))
    from attribute_instructions import _buckets, _compile
    from operation_instructions import _Server

    _compile(sys.executable, str(tmp_path))
    server = _Server([sys.executable, str(BENCHMARKS / "sse_server.py")], stdin=subprocess.PIPE)
    try:
        url = server.base + "/mcp"
        for bucket in ("all", "patches/http.py"):
            result = subprocess.run(
                [sys.executable, str(BENCHMARKS / "attribute_instructions.py"), "--worker",
                 bucket, "3", url, str(tmp_path)],
                capture_output=True, text=True, timeout=120, check=False,
            )
            assert result.returncode == 0, (bucket, result.stderr[-4000:])
        buckets = _buckets(sys.executable, url, "module")
    finally:
        server.close()
    assert "patches/http.py" in buckets and "tracking/tracker.py" in buckets, buckets
