"""The dashboard's Tasks row shows the truth: FastMCP's client follows a task
that completes and one lost in a fleet without a shared task store
(``tests/programs/task_client.py``, under the plugin, its metrics served to a
real Prometheus), and each panel of the row is compared with what the
routers in front of the servers recorded.

Tolerances as in test_dashboard_values.py: counts exact (the instant queries
are evaluated at the scrape that read the last count), rates integrated over
the whole range; each fate's median life where Prometheus interpolates in
the bucket that holds the wire's life (from the tools/call to the last poll,
as the router received them). The row reads the task ledger's metrics, which
the plugin does not emit yet: strict xfail until it does.
"""

from __future__ import annotations

import bisect
import json
import re
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from helpers import clean_env, stop_process
from test_alertmanager import Alertmanager, Webhook, shortened_rules, wait
from test_dashboard_values import (
    RANGE_SECONDS,
    VARIABLES,
    close,
    histogram_quantile,
    instant,
    scalar,
)

from dashboard_queries import iter_panels, load_dashboard, row_of, substitute
from prometheus_stack import Prometheus, free_port

# fastmcp-tasks needs mcp >= 2.3: the tasks environment of scripts/test only
pytestmark = [pytest.mark.mcp2, pytest.mark.fastmcp_tasks]

CLIENT = Path(__file__).resolve().parent / "programs" / "task_client.py"
TASKS = "mcp_client_resumption_tasks_total"
TASK_LOST, TASK_ABANDONED = "McpResumptionTaskLost", "McpResumptionTaskAbandoned"
LOST_CALL = "McpResumptionLostToolCall"
TASK_LIFE = "mcp_client_resumption_task_duration_seconds"
LOSSES = ("lost", "expired", "handle_lost")


@pytest.fixture(scope="module")
def task_stack(tmp_path_factory):
    """(Prometheus, the client's truth, the timestamp of the scrape that
    read its last count, the client's metrics text, the Alertmanager's
    webhook receiver)."""
    metrics_port = free_port()
    tmp = tmp_path_factory.mktemp("tasks-prometheus")
    webhook = Webhook()
    alertmanager = Alertmanager(tmp, webhook.url)
    # Prometheus first: the client waits for a scrape of its servers at 0.
    # It evaluates the task alerts and the lost-call alert as shipped, their
    # 10-minute window shortened to 15 s (as tests/test_alertmanager.py does)
    prometheus = Prometheus(
        tmp, metrics_port, interval="1s", alertmanager_port=alertmanager.port,
        rule_files=[shortened_rules(tmp, TASK_LOST, TASK_ABANDONED, LOST_CALL)],
    )  # fmt: skip
    client = subprocess.Popen(
        [sys.executable, str(CLIENT), str(metrics_port)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    try:
        line = client.stdout.readline()
        assert line, client.stderr.read()[-3000:]
        truth = json.loads(line)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            exposed = response.read().decode()
        at = None
        if TASKS in exposed:  # else the row can show nothing: no wait for it
            at = prometheus.scraped_totals({TASKS: len(truth["tasks"])})
        yield prometheus, truth, at, exposed, webhook
    finally:
        prometheus.close()
        alertmanager.close()
        webhook.close()
        client.stdin.close()
        stop_process(client)


def _task_panels() -> dict[str, dict]:
    dashboard = load_dashboard()
    rows = row_of(dashboard)
    return {p["title"]: p for p in iter_panels(dashboard)
            if p["type"] != "row" and rows[p["id"]] == "Tasks"}  # fmt: skip


def test_the_wire_has_a_completed_and_a_lost_task(task_stack):
    _, truth, _, _, _ = task_stack
    assert sorted(t["fate"] for t in truth["tasks"]) == ["completed", "lost"], truth
    assert truth["unroutable"] > 0, truth


def test_every_task_panel_shows_what_the_wire_recorded(task_stack):
    prometheus, truth, at, exposed, _ = task_stack
    assert TASKS in exposed, "the client exposes no task metric"
    panels = _task_panels()
    tasks = truth["tasks"]
    report: list[tuple] = []

    def shown_stat(title: str) -> float | None:
        result = instant(prometheus, panels[title]["targets"][0]["expr"], at)
        return scalar(result) if result else None

    def stat(title: str, true: float) -> None:
        shown = shown_stat(title)
        report.append((title, shown, true, shown is not None and close(shown, true)))

    stat("Lost tasks in range", sum(t["fate"] in LOSSES for t in tasks))
    stat("Task requests without Mcp-Name in range", truth["unroutable"])
    # nothing of these happened: 0, or no series yet (never a count)
    for title in ("Abandoned tasks in range", "Cancels not honoured in range"):
        shown = shown_stat(title)
        report.append((title, shown, 0, shown in (None, 0.0)))

    title = "Task fates by server"
    result = instant(prometheus, panels[title]["targets"][0]["expr"], at)
    shown_rows = {(r["metric"]["server_port"], r["metric"]["gen_ai_tool_name"],
                   r["metric"]["mcp_resumption_task_fate"]): float(r["value"][1])
                  for r in result}  # fmt: skip
    true_rows = Counter((str(t["server_port"]), t["tool"], t["fate"]) for t in tasks)
    report.append((title, shown_rows, dict(true_rows), shown_rows == {
        k: float(v) for k, v in true_rows.items()}))  # fmt: skip

    title = "Lost, expired and handle-lost tasks per second"
    [query] = panels[title]["targets"]
    whole = {**VARIABLES, "__rate_interval": VARIABLES["__range"]}
    result = prometheus.api("query", query=substitute(query["expr"], whole), time=str(at))
    shown_rates = {r["metric"]["mcp_resumption_task_fate"]:
                   round(float(r["value"][1]) * RANGE_SECONDS, 6) for r in result}  # fmt: skip
    true_losses = Counter(t["fate"] for t in tasks if t["fate"] in LOSSES)
    ok = all(close(shown_rates.get(k, 0.0), v) for k, v in true_losses.items()) and all(
        v == 0 for k, v in shown_rates.items() if k not in true_losses)
    report.append((title, shown_rates, dict(true_losses), ok))

    # each fate's one task in the bucket the wire's life falls in: the p50
    # is where Prometheus interpolates in that bucket (the plugin's own
    # bounds, read from what it exposes)
    title = "Task life by fate (p50 / p95 / p99, since each client started)"
    bounds = sorted({float(le) for le in re.findall(
        rf'{TASK_LIFE}_bucket{{[^}}]*le="([^"]+)"', exposed) if le != "+Inf"})  # fmt: skip
    [median] = [t for t in panels[title]["targets"] if t["legendFormat"].startswith("p50")]
    result = instant(prometheus, median["expr"], at)
    shown_life = {r["metric"]["mcp_resumption_task_fate"]: float(r["value"][1]) for r in result}
    for task in tasks:
        counts = [0] * (len(bounds) + 1)
        counts[bisect.bisect_left(bounds, task["life_s"])] = 1
        true = histogram_quantile(0.5, bounds, counts)
        shown = shown_life.get(task["fate"])
        report.append((f"{title} {task['fate']}", shown, true,
                       shown is not None and close(shown, true, rel=0.01)))  # fmt: skip

    title = "tasks/get polls per task by fate (since each client started)"
    result = instant(prometheus, panels[title]["targets"][0]["expr"], at)
    shown_polls = {r["metric"]["mcp_resumption_task_fate"]: float(r["value"][1]) for r in result}
    true_polls = {t["fate"]: float(t["polls"]) for t in tasks}  # one task per fate here
    report.append((title, shown_polls, true_polls, set(shown_polls) == set(true_polls) and all(
        close(shown_polls[k], v) for k, v in true_polls.items())))  # fmt: skip

    table = "\n".join(f"| {t} | {s} | {v} | {'yes' if ok else 'NO'} |" for t, s, v, ok in report)
    print(table)
    compared = {title.split(" completed")[0].split(" lost")[0] for title, *_ in report}
    assert set(panels) <= compared | {"Lost tasks in range"}, (set(panels) - compared, table)
    assert all(ok for *_, ok in report), table


def test_the_lost_task_warns_through_alertmanager_and_nothing_else_does(task_stack):
    """The fleet's lost task reaches the receiver as McpResumptionTaskLost,
    with its server and fate, the summary and the runbook link, and the
    severity of a lost call; no lost-call and no abandoned-task alert."""
    prometheus, truth, at, exposed, webhook = task_stack
    assert TASKS in exposed, "the client exposes no task metric"
    [lost] = [t for t in truth["tasks"] if t["fate"] == "lost"]
    firing = wait(lambda: webhook.alerts("firing", TASK_LOST),
                  "the lost-task warning reached the webhook")  # fmt: skip
    [alert] = firing
    labels = alert["labels"]
    assert (labels["server_port"], labels["mcp_resumption_task_fate"]) == (
        str(lost["server_port"]), "lost"), labels  # fmt: skip
    assert labels["severity"] == "warning"
    assert alert["annotations"]["summary"] == (
        f"An MCP task on {labels['server_address']}:{labels['server_port']} was lost (lost)."
    )
    assert alert["annotations"]["runbook_url"].endswith(
        "dashboards/RUNBOOK.md#mcpresumptiontasklost")  # fmt: skip
    evaluated = prometheus.wait(lambda: prometheus.evaluated_after(at + 2))
    others = prometheus.query(f'ALERTS{{alertname=~"{LOST_CALL}|{TASK_ABANDONED}"}}', evaluated)
    assert others == [] and webhook.alerts("firing", LOST_CALL) == [], others
