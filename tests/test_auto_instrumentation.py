"""``opentelemetry-instrument`` in a subprocess, configured by environment
variables only, catches the first seed's gap and exports it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripted_server import fresh_session, legacy_stream

PROGRAM = Path(__file__).parent / "programs" / "seed000_client.py"


def run_instrumented(server, **extra_env: str) -> subprocess.CompletedProcess:
    server.on("GET", "/sse", legacy_stream)
    server.on("GET", "/mcp", fresh_session)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "PYTHONPATH"))
    }
    env.update(
        SEED_SERVER_URL=server.url,
        OTEL_SERVICE_NAME="seed-client",
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="console",
        OTEL_LOGS_EXPORTER="console",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="httpx",
        **extra_env,
    )
    instrument = Path(sys.executable).with_name("opentelemetry-instrument")
    return subprocess.run(
        [str(instrument), sys.executable, str(PROGRAM)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_opentelemetry_instrument_exports_the_gap(server):
    result = run_instrumented(server)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "client saw ,4817,4818,4819,4820,4821,1,2" in out
    # the counter, by kind, in the console metric export
    assert '"name": "mcp.client.resumption.gaps"' in out
    assert '"mcp.resumption.gap.kind": "session_changed"' in out
    assert '"mcp.resumption.gap.kind": "id_regression"' in out
    # the log-based event and the resume span
    assert '"event_name": "resumption.gap"' in out
    assert '"name": "mcp.resume"' in out
    assert "legacy-abc" not in out and "fresh-1" not in out, "raw session ids leaked"


def test_each_invalid_setting_warns_once_and_keeps_working(server):
    """Both halves' instrumentors read the settings (and each instrument()
    cycle would again): still one line per invalid variable."""
    invalid = {
        "OTEL_PYTHON_MCP_RESUMPTION_MODE": "strict",
        "OTEL_PYTHON_MCP_RESUMPTION_SESSION_ID": "plain",
        "OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT": "soon",
    }
    result = run_instrumented(server, **invalid)
    assert result.returncode == 0, result.stderr
    for variable, value in invalid.items():
        warnings = [line for line in result.stderr.splitlines() if f"{variable}={value!r}" in line]
        assert len(warnings) == 1, result.stderr
    assert '"mcp.resumption.gap.kind": "session_changed"' in result.stdout
