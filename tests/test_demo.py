"""The seed scenarios end to end, on real MCP servers of the installed SDK
major, with the plugin enabled: detected kinds equal the ground truth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opentelemetry.instrumentation.mcp_resumption.demo import runner, scenarios


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {row["scenario"]: row for row in runner.run()}


@pytest.mark.parametrize("scenario", [s.name for s in scenarios.all_scenarios()])
def test_scenario_detects_exactly_its_ground_truth(rows, scenario):
    row = rows[scenario]
    expected = scenarios.get_scenario(scenario)
    assert row["detected"] == sorted(expected.expected_gaps), row
    assert expected.expected_outcome in row["outcome"].split(","), row
    assert row["pass"], row


def test_demo_command_from_a_clean_environment():
    script = Path(sys.executable).with_name("mcp-resumption")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    result = subprocess.run(
        [str(script), "demo", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    printed = json.loads(result.stdout)
    assert [row["scenario"] for row in printed] == [s.name for s in scenarios.all_scenarios()]
    assert all(row["pass"] for row in printed)
    assert set(printed[0]) >= {"scenario", "happened", "expected", "detected", "outcome", "pass"}
