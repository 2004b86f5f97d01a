"""The server dashboard and alert rules: static checks, promtool, and a real
Prometheus scraping a real SDK server that received known resumes, every
panel compared with what the server was sent."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from opentelemetry.sdk.metrics import MeterProvider

from server_harness import RawSession, UuidStore, build_app, running, server_instrumented

from dashboard_queries import iter_panels, load_dashboard, panel_queries
from prometheus_stack import Prometheus, free_port

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "mcp-resumption-server.json"
ALERTS = ROOT / "dashboards" / "alerts-server.yaml"
RUNBOOK = ROOT / "dashboards" / "RUNBOOK.md"
SERVER_METRICS = ("mcp_server_resumption_requests_total", "mcp_server_resumption_replayed_events")


def test_identity_variables_and_datasource():
    dashboard = load_dashboard(DASHBOARD)
    assert dashboard["uid"] == "mcp-resumption-server"
    assert 39 <= dashboard["schemaVersion"] <= 41
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "job", "instance", "server_address"]
    for panel in iter_panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


def test_queries_name_only_server_metrics_and_filter_job_and_instance():
    for title, expr in panel_queries(load_dashboard(DASHBOARD), {"job": "$job"}):
        metrics = set(re.findall(r"\b(mcp_\w+?)(?:_bucket|_sum|_count)?\{", expr))
        assert metrics and metrics <= set(SERVER_METRICS), (title, expr)
        assert expr.count('job=~"$job"') == expr.count("{"), (title, expr)


def test_every_alert_is_complete_and_has_its_runbook_section():
    runbook = RUNBOOK.read_text(encoding="utf-8")
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == {
        "McpServerResumptionUnknownCursor", "McpServerResumptionOtherSession",
    }
    for rule in rules:
        assert rule["for"] and rule["labels"]["severity"]
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
        anchor = rule["annotations"]["runbook_url"].rpartition("#")[2]
        assert f"## {rule['alert']}" in runbook and anchor == rule["alert"].lower()


@pytest.mark.parametrize("args", [
    ("check", "rules", "dashboards/alerts-server.yaml"),
    ("test", "rules", "dashboards/alerts-server.test.yaml"),
], ids=["check-rules", "test-rules"])
def test_promtool(args):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/test installs Debian's 'prometheus'"
    done = subprocess.run([promtool, *args], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def scalar(result: list) -> float | None:
    return float(result[0]["value"][1]) if result else None


def test_every_panel_shows_what_the_server_was_sent(tmp_path, telemetry):
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    metrics_port = free_port()
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    telemetry.meter_provider = provider
    http_server, _thread = start_http_server(metrics_port, addr="127.0.0.1")
    prometheus = Prometheus(
        tmp_path, metrics_port, interval="1s", rule_files=[ALERTS], job="mcp-server"
    )
    store = UuidStore()
    try:
        with server_instrumented(telemetry) as instrumentor, running(build_app(store)) as server:
            first, second = RawSession(server.url), RawSession(server.url)
            # every series of the server exists (at 0) before anything is counted
            series = f'mcp_server_resumption_requests_total{{server_port="{server.port}"}}'
            prometheus.wait(lambda: len(prometheus.query(series)) == 9)
            first.echo("a")
            first.resume(first.last_ids[0], timeout=1)  # replayed
            first.resume("lost-1", timeout=1)  # unknown_cursor, answered 200
            second.resume(first.last_ids[0], timeout=1)  # other_session, answered 200
            instrumentor.observer.guard = "reject"
            first.resume("lost-2", timeout=1)  # unknown_cursor, refused 410
            first.resume(first.last_ids[0], session_id="gone", timeout=1)  # unknown_session
            first.close()
            second.close()
            truth = {
                "Lossy resumes in range": 3.0,
                "Lossy resumes answered 200": 2.0,
                "Resume requests in range": 5.0,
                "Resumes replayed": 0.2,
            }
            # increase() extrapolates over the range: read the totals over 1h, as
            # the stats do, once the last count was scraped
            at = prometheus.scraped_total("mcp_server_resumption_requests_total", 5.0)
            prometheus.wait(lambda: prometheus.evaluated_after(at + 2))  # two evaluations
            variables = {"__range": "1h", "__rate_interval": "30s", "job": "mcp-server"}
            shown = {}
            for title, expr in panel_queries(load_dashboard(DASHBOARD), variables):
                result = prometheus.query(expr)
                assert result, f"{title}: no data: {expr}"
                if title in truth:
                    shown[title] = scalar(result)
            for title, value in truth.items():
                assert shown[title] == pytest.approx(value, rel=0.25), (title, shown[title])
            [table] = [e for t, e in panel_queries(load_dashboard(DASHBOARD), variables)
                       if t == "unknown_cursor by server"]
            by_server = prometheus.query(table)
            assert {r["metric"]["mcp_resumption_outcome"] for r in by_server} == {
                "unknown_cursor", "rejected_by_guard",
            }

            def raised() -> dict[str, str]:
                alerts = prometheus.alerts()
                return alerts if len(alerts) == 2 else {}

            alerts = prometheus.wait(raised, timeout=30)
            assert alerts == {
                "McpServerResumptionUnknownCursor": "pending",
                "McpServerResumptionOtherSession": "pending",
            }, alerts
    finally:
        prometheus.close()
        http_server.shutdown()
        provider.shutdown()
