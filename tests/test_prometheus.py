"""The dashboard and the alert rules against a real Prometheus that scrapes
the demo: every panel query returns data, every gap scenario raises its
alert, and the controls raise none."""

from __future__ import annotations

import pytest

from dashboard_queries import iter_panels, load_dashboard, panel_queries, row_of
from prometheus_stack import Prometheus, ScrapedDemo, free_port

GAP_SCENARIOS = {
    "migration_reset": {"McpResumptionSessionChanged", "McpResumptionEventIdRegression"},
    "shared_allocator_reuse": {"McpResumptionReplayInconsistent"},
    "drain_race": {"McpResumptionLostToolCall"},
    "stateless_migration": {"McpResumptionLostToolCall"},
    "poll_store_reset": {"McpResumptionLostToolCall"},
    # lost at a break that nothing could resume: no resume, still a lost call
    "stateless_cut_lost": {"McpResumptionLostToolCall"},
    "bridge_cut_lost": {"McpResumptionLostToolCall"},
    # the demo's client lost the call it could not resume (the proxy's own
    # count, on client_proxy, is in the proxy's export, not scraped here)
    "proxy_cut_client_no_store": {"McpResumptionLostToolCall"},
}
# Warnings of the 2026-07-28 revision, raised for the row's server alone:
# never the lost-call alert (nothing was lost but a subscription, or the
# call was sent again).
WARNING_SCENARIOS = {
    "subscription_dropped": {"McpResumptionSubscriptionLost"},
    "reissue_may_run_twice": {"McpResumptionReissueMayRunTwice"},
    "reissue_ran_twice": {"McpResumptionReissueMayRunTwice", "McpResumptionCallRanTwice"},
}
CONTROLS = (
    "faithful_resume_int",
    "faithful_resume_uuid",
    "caught_up_priming",
    "reinitialize",
    "expired_session_404",
)
# Rule evaluations after the last count, before the alerts are read: the
# recording rules, then the alerts that read them, with a cycle to spare.
EVALUATIONS = 3
SHIPPED_INTERVAL_S = 15.0


def _settled(prometheus: Prometheus, at: float, interval: float) -> float:
    """A time EVALUATIONS rule evaluations after ``at``, once every group has
    been evaluated past it.  Alerts are read at that time, not now, so the
    verdict does not depend on when the test runs."""
    settled = at + EVALUATIONS * interval
    prometheus.wait(lambda: prometheus.evaluated_after(settled))
    return settled


# The Tasks row reads the task ledger's metrics, which the demo emits once it
# runs tasks: checked apart, below, until then.
TASK_ROW = "Tasks"


# Only mcp-resumption-proxy puts a leg on its series, and the demo's own are a
# client's: the "Proxy legs" row is checked against a real proxy scraped by a
# real Prometheus in tests/test_dashboard_legs.py, and shown empty on the
# demo's series by tests/test_dashboard_values.py.
PROXY_LEGS_ROW = "Proxy legs"


def _queries(*, tasks: bool) -> list[tuple[str, str]]:
    """(title, expr) of every panel outside the Tasks and Proxy legs rows, or
    of the Tasks row."""
    dashboard = load_dashboard()
    row = {p["title"]: row_of(dashboard)[p["id"]] for p in iter_panels(dashboard)}
    return [
        (t, e)
        for t, e in panel_queries(dashboard)
        if row[t] != PROXY_LEGS_ROW and (row[t] == TASK_ROW) == tasks
    ]


def test_every_panel_query_returns_data(shipped_stack):
    prometheus, _, at = shipped_stack
    queries = _queries(tasks=False)
    empty = [f"{title}: {expr}" for title, expr in queries if not prometheus.query(expr, at)]
    assert empty == []


# The demo runs its task rows only with fastmcp-tasks (the tasks environment),
# where this module does not run: the Tasks row's values are checked by
# tests/test_task_dashboard_values.py there.
@pytest.mark.xfail(strict=True, reason="the demo's task rows are skipped without fastmcp-tasks")
def test_every_task_panel_query_returns_data(shipped_stack):
    prometheus, _, at = shipped_stack
    queries = _queries(tasks=True)
    assert len(queries) >= 10
    empty = [f"{title}: {expr}" for title, expr in queries if not prometheus.query(expr, at)]
    assert empty == []


def _alerts(prometheus: Prometheus, at: float, selector: str = "") -> dict[str, str]:
    """The alerts as Prometheus evaluated them at ``at``: name -> pending or firing."""
    return {
        a["metric"]["alertname"]: a["metric"]["alertstate"]
        for a in prometheus.query(f"ALERTS{selector}", at)
    }


def test_each_gap_scenario_raises_its_alert(shipped_stack):
    prometheus, _, scraped = shipped_stack
    at = _settled(prometheus, scraped, SHIPPED_INTERVAL_S)
    expected = set().union(*GAP_SCENARIOS.values())
    alerts = _alerts(prometheus, at)
    assert expected <= set(alerts), alerts
    assert alerts["McpResumptionLostToolCall"] == "firing", "a lost tool call warns at once"
    # a single gap is never a page: the burn alerts need 3 bad resumes against
    # one server, which only empty_replay's server has (3 unconfirmed resumes)
    pages = {a["metric"]["server_port"] for a in prometheus.query('ALERTS{severity="page"}', at)}
    bad = (
        "mcp_client_resumption_attempts_total"
        '{mcp_resumption_outcome=~"gap|reinitialized|rejected|failed"}'
    )
    three = {r["metric"]["server_port"] for r in prometheus.query(
        f"sum by (server_port) ({bad}) >= 3", at)}  # fmt: skip
    assert len(three) == 1 and pages <= three, (pages, three)


def test_controls_raise_no_alert(tmp_path):
    metrics_port = free_port()
    prometheus = Prometheus(tmp_path, metrics_port, interval="1s")
    demo = None
    try:
        demo = ScrapedDemo(metrics_port, list(CONTROLS))
        at = prometheus.scraped_total("mcp_client_resumption_attempts_total", demo.attempts)
        evaluated = _settled(prometheus, at, 1.0)
        # reinitialize and expired_session_404 resume only into the correct
        # fail-closed paths, which still did not continue the stream: their
        # servers miss the SLO, a ticket that waits out its 1 h `for`
        assert _alerts(prometheus, evaluated) == {"McpResumptionErrorBudgetBurnSlow": "pending"}
    finally:
        if demo is not None:
            demo.close()
        prometheus.close()


def test_lost_subscriptions_and_risky_reissues_warn_and_are_no_lost_call(shipped_stack):
    prometheus, rows, scraped = shipped_stack
    at = _settled(prometheus, scraped, SHIPPED_INTERVAL_S)
    for scenario, expected in WARNING_SCENARIOS.items():
        [port] = [row["server_port"] for row in rows if row["scenario"] == scenario]
        selector = f'{{server_port="{port}"}}'
        assert _alerts(prometheus, at, selector) == dict.fromkeys(expected, "firing"), scenario
        severities = {a["metric"]["severity"] for a in prometheus.query(f"ALERTS{selector}", at)}
        assert severities == {"warning"}, (scenario, severities)
