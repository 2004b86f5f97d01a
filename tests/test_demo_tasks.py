"""The demo's task rows (``mcp_resumption_demo.task_scenarios``), as a user
runs them with the demo's ``tasks`` extra: a task lost by a restart, a lost
handle and a fleet without a shared task store, each one task whose fate
the router's record gives, counted so by the plugin, with no broken
request's fate beside it, and the row PASS. Elsewhere (no fastmcp-tasks)
tests/test_demo.py checks that they say skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_resumption_demo import task_scenarios

pytestmark = [pytest.mark.mcp2, pytest.mark.fastmcp_tasks]

COMMAND = Path(sys.executable).with_name("mcp-resumption")
TRUE = {
    "task_lost_by_restart": {"lost": 1},
    "task_handle_lost": {"handle_lost": 1},
    "task_fleet_no_shared_store": {"lost": 1},
}


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    names = [s.name for s in task_scenarios.SCENARIOS]
    result = subprocess.run(
        [str(COMMAND), "demo", "--json", *(a for n in names for a in ("--scenario", n))],
        env=clean, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return {row["scenario"]: row for row in json.loads(result.stdout)}


def test_the_task_rows_are_the_three_of_the_issue(rows):
    assert sorted(rows) == sorted(TRUE)


def test_each_task_row_counts_the_fate_the_wire_gives(rows):
    for name, true in TRUE.items():
        row = rows[name]
        assert row["counts_on_the_wire"]["tasks"] == true, row
        assert row["counted"]["tasks"] == true, row
        assert row["fates"] == {} == row["fates_on_the_wire"], row
        assert row["detected"] == [] and row["outcome"] == "-", row
        assert row["pass"] is True, row
