"""The server half under ``opentelemetry-instrument`` in a subprocess,
configured by environment variables only: its entry point loads, it counts
the resume that its store cannot honour, and with the guard on, refuses it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = Path(__file__).parent / "programs" / "seed000_server.py"


def run(**extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    env.update(
        OTEL_SERVICE_NAME="seed-server",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="console",
        OTEL_LOGS_EXPORTER="console",
        **extra_env,
    )
    instrument = Path(sys.executable).with_name("opentelemetry-instrument")
    done = subprocess.run(
        [str(instrument), sys.executable, str(PROGRAM)],
        env=env, capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.parametrize(("guard", "status", "outcome"), [
    ("off", 200, "unknown_cursor"), ("reject", 410, "rejected_by_guard"),
])
def test_opentelemetry_instrument_loads_the_server_half(guard, status, outcome):
    done = run(OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD=guard)
    assert f"resume answered {status}" in done.stdout
    out = done.stdout
    assert '"name": "mcp.server.resumption.requests"' in out
    assert f'"mcp.resumption.outcome": "{outcome}"' in out
    assert '"event_name": "resumption.gap"' in out
    assert '"mcp.resumption.gap.kind": "unknown_cursor"' in out


def test_the_server_half_can_be_disabled_on_its_own():
    done = run(OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="mcp_resumption_server")
    assert "resume answered 200" in done.stdout
    assert "mcp.server.resumption.requests" not in done.stdout


def test_a_setting_both_halves_read_warns_once():
    """A process that is client and server alike loads both halves, and each
    reads the session-id policy (the server half at its first request)."""
    done = run(OTEL_PYTHON_MCP_RESUMPTION_SESSION_ID="plain")
    assert '"mcp.resumption.outcome": "unknown_cursor"' in done.stdout  # the server half ran
    warnings = [line for line in done.stderr.splitlines() if "SESSION_ID='plain'" in line]
    assert len(warnings) == 1, done.stderr
