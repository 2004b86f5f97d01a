"""The plugin installed without any HTTP client it instruments: under
``opentelemetry-instrument`` one WARNING line says it is not loaded and what
to install (the loader itself says so only at DEBUG level).  The controls:
with httpx installed, or the plugin disabled by name, nothing is said."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import clean_env

from release_env import ROOT, tool


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """The package and opentelemetry-distro, and none of httpx, httpx-sse, httpx2."""
    home = tmp_path_factory.mktemp("bare")
    venv = home / "venv"
    subprocess.run([tool("uv"), "venv", "-q", str(venv)], check=True)
    subprocess.run(
        [
            tool("uv"),
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            str(ROOT),
            "opentelemetry-distro",
        ],
        check=True,
        env=clean_env(),
    )
    return venv


def instrument(venv: Path, **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [
            str(venv / "bin" / "opentelemetry-instrument"),
            str(venv / "bin" / "python"),
            "-c",
            "print('ran')",
        ],
        env=clean_env(
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
    assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
    return result


def test_missing_clients_are_named_in_one_line(bare_venv):
    probe = subprocess.run(
        [str(bare_venv / "bin" / "python"), "-c", "import httpx"],
        capture_output=True,
        check=False,
    )
    assert probe.returncode != 0, "the venv was meant to have no httpx"
    [line] = instrument(bare_venv).stderr.splitlines()
    assert line.startswith(
        "mcp-resumption is not loaded: none of httpx, httpx-sse, httpx2 is installed"
    )
    assert "pip install 'opentelemetry-instrumentation-mcp-resumption[instruments-any]'" in line


def test_disabled_by_name_says_nothing(bare_venv):
    disabled = "mcp_resumption,mcp_resumption_server"
    assert instrument(bare_venv, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled).stderr == ""


def test_with_a_client_installed_says_nothing(bare_venv):
    subprocess.run(
        [
            tool("uv"),
            "pip",
            "install",
            "-q",
            "--python",
            str(bare_venv / "bin" / "python"),
            "httpx",
        ],
        check=True,
        env=clean_env(),
    )
    assert instrument(bare_venv).stderr == ""
