"""Nothing paid before MCP: under the real ``opentelemetry-instrument`` (which
imports httpx in every process, for its own httpx instrumentation), a process
that never speaks MCP loads the client half's patch points and nothing else;
the owner, the tracker and the telemetry load at the first request that may
be MCP, and that request (the first resume of the process among them) still
gets its verdict."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_env, example_server

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
BIN = Path(sys.executable).parent
PACKAGE = "opentelemetry.instrumentation.mcp_resumption"
MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
MAX_MODULES = 10
LISTED = (
    "import sys, json; print(json.dumps(sorted(m for m in sys.modules "
    f"if m == {PACKAGE!r} or m.startswith({PACKAGE + '.'!r}))))"
)
# What loading the entry points and the pre-instrument hook costs, whatever
# is switched off (as tests/test_one_switch.py counts it).
ENTRY = {PACKAGE, f"{PACKAGE}.version", f"{PACKAGE}.package", f"{PACKAGE}.skip_notice"}


def modules_at_start(disabled: str) -> set[str]:
    result = subprocess.run(
        [str(BIN / "opentelemetry-instrument"), sys.executable, "-c", LISTED],
        env=clean_env(
            OTEL_SERVICE_NAME="startup",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled,
            PYTHONPATH=str(SRC),
        ),
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_a_process_that_never_speaks_mcp_loads_at_most_10_modules():
    """Was 52 of them (the whole client half: its owner, tracker, telemetry,
    shared state), against 4 with both halves off."""
    on = modules_at_start("")
    off = modules_at_start("mcp_resumption,mcp_resumption_server")
    assert off == ENTRY
    assert len(on) <= MAX_MODULES, sorted(on)
    heavy = {
        "owner.monitor", "owner.processor", "tracking.tracker", "telemetry.sink", "config",
        "patches.http",
    }
    assert not {f"{PACKAGE}.{name}" for name in heavy} & on, sorted(on)
    # the control: the halves did load (their entry points and patch points)
    assert {f"{PACKAGE}.server", f"{PACKAGE}.patches"} <= on


class _Owner:
    """Stands in for the owner: ``targets()`` only binds it."""


@pytest.mark.parametrize("site", range(5))
def test_the_patch_points_are_the_patches_own(site):
    """The names the instrumentor wraps before anything loads are the names
    each patches module wraps once the first MCP request loads it."""
    from opentelemetry.instrumentation.mcp_resumption import SITES

    library, patches, arguments, names = SITES[site]
    module = importlib.import_module(f"{PACKAGE}.patches.{patches}")
    assert tuple(name for name, _ in module.targets(_Owner(), *arguments)) == names
    if patches == "mcp_sdk":
        assert library == module.MODULE


def test_the_first_resume_of_a_process_gets_its_verdict():
    """The example server's tool closes its stream three times; the client
    (the example, no OpenTelemetry code) resumes each time.  Its first MCP
    request loads the client half; its first resume is judged ``resumed``
    as every later one."""
    client = ROOT / "examples" / "zero-code" / ("client_mcp2.py" if MCP_MAJOR == 2 else
                                                  "client_mcp1.py")
    extra = ["--mode", "legacy"] if MCP_MAJOR == 2 else []
    with example_server() as url:
        result = subprocess.run(
            [str(BIN / "opentelemetry-instrument"), sys.executable, str(client), url, *extra],
            env=clean_env(
                OTEL_SERVICE_NAME="first-resume",
                OTEL_TRACES_EXPORTER="none",
                OTEL_METRICS_EXPORTER="none",
                OTEL_LOGS_EXPORTER="none",
                PYTHONPATH=str(SRC),
            ),
            capture_output=True, text=True, timeout=90, check=False,
        )
    assert result.returncode == 0, result.stderr
    assert "result: liftoff" in result.stdout, result.stdout
    verdicts = [
        line for line in result.stderr.splitlines() if line.startswith("mcp-resumption verdict:")
    ]
    assert len(verdicts) == 3, result.stderr
    assert all(line.split()[2] == "resumed" for line in verdicts), verdicts
