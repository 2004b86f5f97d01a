"""The dashboard and the alert rules against a real Prometheus that scrapes
the demo: every panel query returns data, every gap scenario raises its
alert, and the controls raise none."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from dashboard_queries import load_dashboard, panel_queries

ROOT = Path(__file__).resolve().parent.parent
GAP_SCENARIOS = {
    "migration_reset": {"McpResumptionSessionChanged", "McpResumptionEventIdRegression"},
    "shared_allocator_reuse": {"McpResumptionReplayInconsistent"},
    "drain_race": {"McpResumptionLostToolCall"},
    "stateless_migration": {"McpResumptionLostToolCall"},
    "poll_store_reset": {"McpResumptionLostToolCall"},
}
CONTROLS = (
    "faithful_resume_int",
    "faithful_resume_uuid",
    "caught_up_priming",
    "reinitialize",
    "expired_session_404",
)
SCRAPE_JOB = "mcp-demo"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Stack:
    """Prometheus scraping ``mcp-resumption demo --prometheus-port`` on loopback."""

    def __init__(self, tmp_path: Path, scenarios: list[str]) -> None:
        prometheus = shutil.which("prometheus")
        assert prometheus, "Prometheus is missing: scripts/test installs Debian's 'prometheus'"
        metrics_port, self.port = free_port(), free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(ROOT / "dashboards" / "alerts.yaml")],
                    "scrape_configs": [
                        {
                            "job_name": SCRAPE_JOB,
                            "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
                        }
                    ],
                }
            )
        )
        self.prometheus = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        demo = Path(sys.executable).with_name("mcp-resumption")
        args = [str(demo), "demo", "--prometheus-port", str(metrics_port), "--hold", "90"]
        for name in scenarios:
            args += ["--scenario", name]
        self.demo = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )

    def query(self, expr: str) -> list:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def alerts(self) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.port}/api/v1/alerts"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        return {alert["labels"]["alertname"]: alert["state"] for alert in body["data"]["alerts"]}

    def wait_for(self, condition, timeout: float = 60.0):
        """The condition's first true value; its last value once time is up."""
        deadline = time.monotonic() + timeout
        result = None
        while time.monotonic() < deadline:
            try:
                result = condition()
                if result:
                    return result
            except OSError:  # Prometheus still starting
                pass
            time.sleep(0.5)
        return result

    def close(self) -> None:
        for process in (self.demo, self.prometheus):
            process.terminate()
        for process in (self.demo, self.prometheus):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def run_until_done(stack: Stack) -> None:
    """Wait for the demo's table (every scenario ran, printed before the hold),
    then for scrapes and rule evaluations after it."""
    assert stack.demo.stdout is not None
    table = stack.demo.stdout.readline()  # blocks until the table's header
    assert table.startswith("scenario"), table
    time.sleep(2.5)


@pytest.fixture(scope="module")
def demo_stack(tmp_path_factory):
    """The whole demo: panels need a realistic mix of outcomes."""
    stack = Stack(tmp_path_factory.mktemp("prometheus"), [])
    try:
        run_until_done(stack)
        yield stack
    finally:
        stack.close()


def test_every_panel_query_returns_data(demo_stack):
    queries = panel_queries(load_dashboard())

    def empty() -> list[str]:
        return [f"{title}: {expr}" for title, expr in queries if not demo_stack.query(expr)]

    demo_stack.wait_for(lambda: not empty(), timeout=30)
    assert empty() == []


def test_each_gap_scenario_raises_its_alert(demo_stack):
    expected = set().union(*GAP_SCENARIOS.values())

    def raised() -> dict[str, str]:
        alerts = demo_stack.alerts()
        return alerts if expected <= set(alerts) else {}

    demo_stack.wait_for(raised, timeout=30)
    alerts = demo_stack.alerts()
    assert expected <= set(alerts), alerts
    assert {alerts[name] for name in expected} <= {"pending", "firing"}
    assert alerts["McpResumptionLostToolCall"] == "firing", "a lost tool call warns at once"
    # a single gap is never a page: the burn alerts need 3 bad resumes against
    # one server, which only empty_replay's server has (3 unconfirmed resumes)
    pages = {a["metric"]["server_port"] for a in demo_stack.query('ALERTS{severity="page"}')}
    bad = (
        "mcp_client_resumption_attempts_total"
        '{mcp_resumption_outcome=~"gap|reinitialized|rejected"}'
    )
    three = {r["metric"]["server_port"] for r in demo_stack.query(
        f"sum by (server_port) ({bad}) >= 3")}  # fmt: skip
    assert len(three) == 1 and pages <= three, (pages, three)


def test_controls_raise_no_alert(tmp_path):
    stack = Stack(tmp_path, list(CONTROLS))
    try:
        run_until_done(stack)
        stack.wait_for(lambda: stack.query("mcp_client_resumption_attempts_total"), timeout=30)
        time.sleep(3)  # several rule evaluations on the controls' data
        # reinitialize and expired_session_404 resume only into the correct
        # fail-closed paths, which still did not continue the stream: their
        # servers miss the SLO, a ticket that waits out its 1 h `for`
        assert stack.alerts() == {"McpResumptionErrorBudgetBurnSlow": "pending"}
    finally:
        stack.close()
