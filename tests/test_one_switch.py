"""Each half of the plugin is one entry point of the group
``opentelemetry_instrumentor`` (``mcp_resumption``, ``mcp_resumption_server``),
switched off by name in ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``; and a half
that is off, or that the process never uses, costs no import of its modules.

Counted in an mcp 2.x client under the real ``opentelemetry-instrument``:
``import mcp`` there imports the SDK's server modules too, so the server
half's patches are made in every client, and still nothing of it beyond its
entry point's package may load until the process serves MCP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env, example_server

pytestmark = pytest.mark.mcp2

PROGRAM = Path(__file__).parent / "programs" / "mcp2_once.py"
# The checkout's package, whichever tree the environment installed: which
# modules load is a property of this code (the entry points are still the
# installed distribution's).
SRC = Path(__file__).resolve().parents[1] / "src"
BIN = Path(sys.executable).parent
PACKAGE = "opentelemetry.instrumentation.mcp_resumption"
SERVER_HALF = f"{PACKAGE}.server"
# What loading the entry points and the pre-instrument hook costs, whatever
# is switched off: the package, its version and dependency lists, the hook,
# and the server half's entry point itself.
ENTRY = {PACKAGE, f"{PACKAGE}.version", f"{PACKAGE}.package", f"{PACKAGE}.skip_notice"}


@pytest.fixture(scope="module")
def server():
    with example_server() as url:
        yield url


def modules_of_a_client(url: str, disabled: str) -> set[str]:
    env = clean_env(
        OTEL_SERVICE_NAME="one-switch",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled,
        PYTHONPATH=str(SRC),
    )
    result = subprocess.run(
        [str(BIN / "opentelemetry-instrument"), sys.executable, str(PROGRAM), url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "tools: countdown" in result.stdout, result.stdout
    return set(json.loads(result.stdout.splitlines()[-2]))


def test_a_client_imports_nothing_of_the_server_half(server):
    modules = modules_of_a_client(server, "")
    assert {m for m in modules if m.startswith(SERVER_HALF)} == {SERVER_HALF}
    # the control: the client half did load, and saw the server
    assert {
        f"{PACKAGE}.owner.processor", f"{PACKAGE}.tracking.tracker", f"{PACKAGE}.patches.http"
    } <= modules


def test_the_client_half_switched_off_loads_none_of_its_modules(server):
    """The issue: with ``mcp_resumption`` off, the server half's entry point
    loaded about 30 of the package's modules."""
    assert modules_of_a_client(server, "mcp_resumption") - ENTRY <= {
        SERVER_HALF,
        # the server half's patches are made at ``import mcp`` (by name only)
        f"{PACKAGE}.patches",
        f"{PACKAGE}.errors",
    }


def test_both_halves_switched_off_load_only_the_entry_points(server):
    assert modules_of_a_client(server, "mcp_resumption,mcp_resumption_server") <= ENTRY
