"""The lines a person running a script sees, as the README shows them: a
clean run's verdicts and its summary at exit appear on stderr without any
logging configuration, and a program that asked for silence (the setting
``off``, or a logging configuration that silences the verdicts logger) gets
none.  Real processes: the example server, and the example mcp 2.x client
under the real ``opentelemetry-instrument``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env, example_server

pytestmark = pytest.mark.mcp2

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CLIENT = ROOT / "examples" / "zero-code" / "client_mcp2.py"
QUIET = Path(__file__).parent / "programs" / "quiet_client.py"


@pytest.fixture(scope="module")
def server():
    with example_server() as url:
        yield url


def run(program: list[str], url: str, **env: str) -> list[str]:
    """The plugin's lines on the client's stderr."""
    result = subprocess.run(
        [str(BIN / "opentelemetry-instrument"), sys.executable, *program, url, "--mode", "legacy"],
        env=clean_env(
            OTEL_SERVICE_NAME="exit-summary",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            **env,
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "result: liftoff" in result.stdout, result.stdout  # it did speak MCP
    return [line for line in result.stderr.splitlines() if line.startswith("mcp-resumption")]


def shown_in_the_readme() -> list[str]:
    """README.md's block of a clean run's lines (a call of the example
    server's tool, which makes three resumes)."""
    readme = (ROOT / "README.md").read_text()
    [block] = [
        body
        for kind, body in re.findall(r"^ *```(\w*)\n(.*?)^ *```$", readme, re.S | re.M)
        if not kind and "mcp-resumption summary:" in body
    ]
    return [line.strip() for line in block.strip().splitlines()]


def test_a_clean_run_shows_its_verdicts_and_summary_unconfigured(server):
    port = server.split(":")[2].split("/")[0]
    printed = run([str(CLIENT)], server)
    shown = [line.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for line in shown_in_the_readme()]
    assert printed == shown, printed


@pytest.mark.parametrize(
    ("program", "env"),
    [
        pytest.param([str(CLIENT)], {"OTEL_PYTHON_MCP_RESUMPTION_VERDICT_LOG": "off"}, id="off"),
        pytest.param([str(QUIET), "logger"], {}, id="logger-level"),
        pytest.param([str(QUIET), "disable"], {}, id="logging-disable"),
    ],
)
def test_a_program_that_asked_for_silence_gets_none(server, program, env):
    assert run(program, server, **env) == []


def test_a_configured_handler_makes_the_program_s_levels_decide(server):
    """basicConfig() at its WARNING: the clean run's INFO lines are the
    program's to drop, as the README says."""
    assert run([str(QUIET), "configured"], server) == []
