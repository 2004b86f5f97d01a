"""Never harm the host: no lock on a finalizer's path, the SDK's recursion
budget kept, any number of instrument cycles, setup in any order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz_sse import RawServer, Reply, block, head

PROGRAMS = Path(__file__).parent / "programs"
SRC = Path(__file__).resolve().parents[1] / "src"


def note(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n}})


@pytest.fixture(scope="module")
def raw_server():
    server = RawServer()
    events = tuple(block(str(i), note(i)) for i in (1, 2, 3))
    server.reply("/cycle/stream", Reply(head(200, [(b"content-type", b"text/event-stream")]),
                                        events, False))
    yield server
    server.close()


def _env(server_url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(Path(__file__).parent)])
    env["HARDENING_SERVER_URL"] = server_url
    return env


@pytest.mark.parametrize(
    ("threshold", "threads", "iterations"),
    [("default", 1, 2500), ("1", 1, 300), ("1", 3, 150)],
    ids=["default-threshold", "threshold-1", "threshold-1-threads"],
)
def test_iterators_abandoned_in_a_cycle_never_hang_the_host(raw_server, threshold, threads,
                                                            iterations):
    """The cyclic GC finalises an abandoned iterator at any allocation, also one
    made while the instrumentation holds a lock: the report of that stream's
    end must never block on it (it hung at iteration 212 in one run)."""
    try:
        result = subprocess.run(
            [sys.executable, str(PROGRAMS / "abandon_in_cycle.py"), threshold, str(threads),
             str(iterations)],
            env=_env(raw_server.url), capture_output=True, text=True, timeout=90, check=False,
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the host hung: {expired.stderr!r}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    total = threads * iterations
    # every stream's end reported (its one event counted), none lost in a finalizer
    assert json.loads(result.stdout) == {"done": total, "threads": threads, "events": total}
