"""Shared by the release tests: the repository, the build tools of
scripts/test (``.venv-tools``: build, twine, uv, trove-classifiers) and the
Python versions CI tests (the floor of requires-python and the machine's own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import console_metrics, scope_counts

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".venv-tools" / "bin"


def tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        raise AssertionError(f"{path} is missing: bash scripts/test installs it")
    return str(path)


def requires_python() -> str:
    # A regex, not tomllib: these helpers must import on the 3.10 floor too.
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^requires-python = "([^"]+)"', text, re.MULTILINE).group(1)


def floor_version() -> str:
    match = re.fullmatch(r">=\s*(3\.\d+)", requires_python())
    assert match, "requires-python is expected to be a plain floor"
    return match.group(1)


# The minor that runs only this smoke test in CI (scripts/test runs the whole
# suite on the floor, 3.11 and the newest).
SMOKE_EXTRA = "3.12"


def ci_pythons() -> list[str]:
    """The Pythons the wheel's smoke test runs on: the lowest the package
    claims, 3.12, and the one running the release tests (the newest
    environment's, 3.13 in CI)."""
    running = "{}.{}".format(*sys.version_info[:2])
    return sorted({floor_version(), SMOKE_EXTRA, running}, key=minor)


def claimed_pythons() -> list[str]:
    """Every minor from the floor to the newest CI runs: the classifiers'."""
    newest = max(ci_pythons(), key=minor)
    return [f"3.{n}" for n in range(minor(floor_version()), minor(newest) + 1)]


def minor(version: str) -> int:
    return int(version.split(".")[1])


def find_python(version: str) -> str:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "find-python"), version],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "UV": tool("uv")},
    ).stdout.strip()


def totals(stdout: str, metric: str, attribute: str) -> dict[str, int]:
    """Our scope's counts of ``metric`` by ``attribute``, from the last export
    (cumulative, so the last one holds them all)."""
    exports = console_metrics(stdout)
    assert exports, f"no console metric export in:\n{stdout}"
    return scope_counts(exports[-1], metric, attribute)
