"""The seed scenarios end to end, on real MCP servers of the installed SDK
major, with the plugin enabled: detected kinds equal the ground truth."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_resumption_demo import scenarios, server_scenarios, task_scenarios

# The task rows need fastmcp-tasks (the demo's tasks extra, in the tasks
# environment of scripts/test); elsewhere they say skipped, never pass.
TASK_ROWS = {s.name for s in task_scenarios.SCENARIOS}
TASKS_HERE = task_scenarios.prepare() is None


# The rows seen from the server alone speak 2026-07-28: mcp 1.x skips them.
SERVER_ALONE_ROWS = {"work_for_nobody_server", "answer_undelivered_server"}
SERVER_ALONE_HERE = server_scenarios.MCP_MAJOR >= 2


def skipped_here(row: dict) -> bool:
    return (row["scenario"] in TASK_ROWS and not TASKS_HERE) or (
        row["scenario"] in SERVER_ALONE_ROWS and not SERVER_ALONE_HERE
    )


@pytest.fixture(scope="module")
def demo_command() -> subprocess.CompletedProcess:
    """``mcp-resumption demo --json`` as a user runs it: nothing of this
    process's OpenTelemetry settings or paths leaks in.  One run serves every
    test of the module."""
    script = Path(sys.executable).with_name("mcp-resumption")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    return subprocess.run(
        [str(script), "demo", "--json"],
        env=env,
        capture_output=True,
        text=True,
        # 32 rows now: about 70 s alone, over 120 s beside CI's two other lanes
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def rows(demo_command) -> dict[str, dict]:
    printed = json.loads(demo_command.stdout)
    assert any(row["counted"]["gaps"] for row in printed), (
        "the counts come from the exported counters"
    )
    return {row["scenario"]: row for row in printed}


@pytest.mark.parametrize("scenario", [s.name for s in scenarios.all_scenarios()])
def test_scenario_detects_exactly_its_ground_truth(rows, scenario):
    row = rows[scenario]
    if skipped_here(row):
        reason = "fastmcp-tasks" if row["scenario"] in TASK_ROWS else "needs mcp 2.x"
        assert row["pass"] is None and row["skipped"].startswith(reason), row
        return
    expected = scenarios.get_scenario(scenario)
    assert row["detected"] == sorted(expected.expected_gaps), row
    if expected.expected_outcome is None:  # no resume attempt at all
        assert row["outcome"] == "-", row
    else:
        assert expected.expected_outcome in row["outcome"].split(","), row
    # where the router's log gives the fates of the broken requests, the
    # plugin counted exactly those
    if row["fates_on_the_wire"] is not None:
        assert row["fates"] == row["fates_on_the_wire"], row
    # and likewise its re-issues by risk and declaration, the calls that ran
    # twice and the lost subscriptions
    for key, true in (row["counts_on_the_wire"] or {}).items():
        assert row["counted"][key] == true, (key, row)
    assert row["pass"], row


def test_the_new_rows_count_what_they_say(rows):
    """The dropped subscription, the risky re-issue and the call that ran
    twice, as their rows state: on the wire and as the plugin counted them,
    on either SDK major."""
    dropped = rows["subscription_dropped"]
    assert dropped["counts_on_the_wire"]["lost_subscriptions"] == {"false": 1}, dropped
    assert dropped["counted"]["lost_subscriptions_by_filter"] == {"tools": 1}, dropped
    assert dropped["fates"] == {} and dropped["counted"]["attempts"] == {}, dropped
    assert dropped["counted"]["gaps"] == {}, "never a gap of a resume, so never a lost call"
    risky = rows["reissue_may_run_twice"]
    assert risky["fates_on_the_wire"] == {"reissued": 1}, risky
    assert risky["counts_on_the_wire"]["reissues"] == {"may_run_twice": 1}, risky
    assert risky["counted"]["reissues_by_idempotent"] == {"false": 1}, risky
    assert risky["counted"]["duplicate_runs"] == {}, risky
    twice = rows["reissue_ran_twice"]
    assert twice["counts_on_the_wire"]["duplicate_runs"] == {"all": 1}, twice
    assert twice["counted"]["duplicate_runs"] == {"all": 1}, twice
    assert twice["fates"] == {"reissued": 1}, twice


def test_the_events_rows_count_what_they_say(rows):
    """The Events extension's rows, as the server's log gives them and as
    the plugin counted them: never a call, a broken request or a resume."""
    expected = {
        "events_poll_truncated": ({"truncated": 1}, {}),
        "events_cursor_lost": ({"cursor_lost": 1}, {}),
        "events_stream_reopened": ({}, {"opened": 2, "ended": 2, "reopened": 1}),
        "events_stream_silent": ({"stream_silent": 1}, {"opened": 1, "ended": 1, "silent": 1}),
        "events_webhook_lapsed": ({"lapsed": 1}, {}),
    }
    for name, (gaps, streams) in expected.items():
        row = rows[name]
        assert row["counts_on_the_wire"]["event_gaps"] == gaps, row
        assert row["counts_on_the_wire"]["event_streams"] == streams, row
        assert row["counted"]["event_gaps"] == gaps, row
        assert row["counted"]["event_streams"] == streams, row
        assert row["counted"]["event_duplicates"] == {}, row
        assert row["fates"] == {} and row["fates_on_the_wire"] == {}, row
        assert row["counted"]["attempts"] == {} and row["counted"]["gaps"] == {}, row
        assert row["outcome"] == "-" and row["pass"], row


def test_demo_command_from_a_clean_environment(demo_command):
    result = demo_command
    assert result.returncode == 0, result.stdout + result.stderr
    # stderr carries the progress and nothing else: no server's log or traceback
    noise = [
        line
        for line in result.stderr.splitlines()
        if not re.match(r"\[\d+/\d+\] |done: |installing the TypeScript MCP SDK server ", line)
    ]
    assert noise == [], result.stderr
    printed = json.loads(result.stdout)
    assert [row["scenario"] for row in printed] == [s.name for s in scenarios.all_scenarios()]
    assert all(row["pass"] for row in printed if not skipped_here(row))
    assert all(row["pass"] is None for row in printed if skipped_here(row))
    assert set(printed[0]) >= {"scenario", "happened", "expected", "detected", "outcome", "pass"}


def test_one_scenario_client_under_opentelemetry_instrument():
    """The README's by-hand recipe: the plugin is loaded by auto-instrumentation
    only, and the gaps reach the console exporters."""
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    env.update(
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="console",
        OTEL_LOGS_EXPORTER="console",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="httpx",
    )
    result = subprocess.run(
        [
            str(bin_dir / "opentelemetry-instrument"),
            str(bin_dir / "mcp-resumption"),
            *("scenario", "drain_race"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "resume 1: Last-Event-ID 'e-104' -> 200" in result.stdout
    for kind in ("drain_race", "orphaned_request"):
        assert f'"mcp.resumption.gap.kind": "{kind}"' in result.stdout
    # and the readable verdict on stderr: its line and the summary at exit
    assert re.search(
        r"^mcp-resumption verdict: gap server=127\.0\.0\.1:\d+ transport=streamable-http "
        r"gaps=drain_race lost_calls=0 awaiting=1\n"
        r"mcp-resumption lost call: server=127\.0\.0\.1:\d+ method=tools/call request=\S+: "
        r".+; re-issue it\n"
        r"mcp-resumption verdict: gap server=127\.0\.0\.1:\d+ transport=streamable-http "
        r"gaps=drain_race,orphaned_request lost_calls=1 \(final\)$",
        result.stderr,
        re.M,
    ), result.stderr
    assert re.search(r"^mcp-resumption summary: .* lost_calls=1$", result.stderr, re.M)
