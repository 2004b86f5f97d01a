"""The page arrives: the shipped alert rules, evaluated by a real Prometheus
scraping the demo's instrumented client, routed by a real Alertmanager
(Debian's ``prometheus-alertmanager``, installed by scripts/test) to a
webhook receiver.  The lost-call page names the server, carries the summary
and the runbook link, and resolves once the client's series are gone.

Every wait is for something a component reports (a scrape, an alert state,
a notification), never a length of time."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from helpers import RecordingHttpServer, stop_process

from prometheus_stack import Prometheus, ScrapedDemo, free_port

ROOT = Path(__file__).resolve().parents[1]
ALERT = "McpResumptionLostToolCall"
RUNBOOK = "dashboards/RUNBOOK.md#mcpresumptionlosttoolcall"
WAIT_S = 120.0


class Webhook(RecordingHttpServer):
    """The receiver: every notification Alertmanager POSTs, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.url = f"{self.endpoint}/page"

    def alerts(self, status: str, name: str = ALERT) -> list[dict]:
        """Every alert ``name`` a notification carried with ``status``."""
        return [
            alert
            for _, body in list(self.received)
            for alert in json.loads(body)["alerts"]
            if alert["labels"].get("alertname") == name and alert["status"] == status
        ]


class Alertmanager:
    def __init__(self, tmp: Path, webhook: str) -> None:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        assert binary, (
            "Alertmanager is missing: scripts/test installs Debian's 'prometheus-alertmanager'"
        )
        config = {
            "route": {
                "receiver": "webhook",
                # one page per server (and gap kind), as the alert groups
                "group_by": ["alertname", "server_address", "server_port"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {"name": "webhook", "webhook_configs": [{"url": webhook, "send_resolved": True}]}
            ],
        }
        path = tmp / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, f"--config.file={path}", f"--storage.path={tmp / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def close(self) -> None:
        stop_process(self.process)


def wait(condition, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def shortened_rules(tmp: Path, *names: str) -> Path:
    """The shipped rules ``names`` alone, their 10-minute window shortened
    to 15 s (see the module's doc); expressions, labels and annotations as
    shipped."""
    shipped = yaml.safe_load((ROOT / "dashboards" / "alerts.yaml").read_text())
    rules = [r for g in shipped["groups"] for r in g["rules"] if r.get("alert") in names]
    assert len(rules) == len(names), names
    for rule in rules:
        assert rule["expr"].count("[10m]") == 1, rule["expr"]
        rule["expr"] = rule["expr"].replace("[10m]", "[15s]")
    path = tmp / "shortened.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "shortened", "rules": rules}]}))
    return path


@pytest.fixture
def rules():
    """The rules the stack's Prometheus evaluates: the lost-call alert."""
    return (ALERT,)


@pytest.fixture
def stack(tmp_path, rules):
    webhook = Webhook()
    alertmanager = Alertmanager(tmp_path, webhook.url)
    metrics_port = free_port()
    prometheus = Prometheus(
        tmp_path,
        metrics_port,
        interval="1s",
        rule_files=[shortened_rules(tmp_path, *rules)],
        alertmanager_port=alertmanager.port,
    )
    try:
        yield webhook, prometheus, metrics_port
    finally:
        prometheus.close()
        alertmanager.close()
        webhook.close()


def test_the_lost_call_page_arrives_with_server_summary_runbook_and_resolves(stack):
    webhook, prometheus, metrics_port = stack
    # Seed 004 on the demo's legacy server: the tool call's result is lost
    # (drain_race, orphaned_request), once.
    demo = ScrapedDemo(metrics_port, ["drain_race"])
    try:
        [row] = demo.rows
        assert "orphaned_request" in row["detected"], row
        lost = prometheus.wait(
            lambda: prometheus.query(
                'mcp_client_resumption_gaps_total{mcp_resumption_gap_kind="orphaned_request"} > 0'
            )
        )
        server = {k: lost[0]["metric"][k] for k in ("server_address", "server_port")}
        firing = wait(
            lambda: [
                a
                for a in webhook.alerts("firing")
                if a["labels"].get("mcp_resumption_gap_kind") == "orphaned_request"
            ],
            "the firing page reached the webhook",
        )
    finally:
        demo.close()  # the client's series go stale: nothing is lost any more
    page = firing[0]
    assert {k: page["labels"][k] for k in server} == server, page["labels"]
    assert page["labels"]["severity"] == "warning"
    assert page["annotations"]["summary"] == (
        "An MCP tool call was lost across a stream resume (orphaned_request)."
    )
    assert page["annotations"]["runbook_url"].endswith(RUNBOOK)
    # the link's anchor is a heading of the runbook
    runbook = (ROOT / "dashboards" / "RUNBOOK.md").read_text().splitlines()
    assert f"## {ALERT}" in runbook
    assert (
        f"{server['server_address']}:{server['server_port']}" in page["annotations"]["description"]
    )

    resolved = wait(
        lambda: [
            a
            for a in webhook.alerts("resolved")
            if a["labels"].get("mcp_resumption_gap_kind") == "orphaned_request"
        ],
        "the resolved notification reached the webhook",
    )
    assert {k: resolved[0]["labels"][k] for k in server} == server
    assert resolved[0]["endsAt"] >= page["startsAt"]


SUBSCRIPTION = "McpResumptionSubscriptionLost"


@pytest.mark.parametrize("rules", [(ALERT, SUBSCRIPTION)])
def test_a_lost_subscription_warns_and_never_pages_as_a_lost_call(stack):
    """The demo's dropped subscription (a listen stream cut after its
    acknowledgment): its warning reaches the receiver with the server, the
    summary and the runbook link; the lost-call alert, evaluated on the same
    scrapes, never fires."""
    webhook, prometheus, metrics_port = stack
    demo = ScrapedDemo(metrics_port, ["subscription_dropped"])
    try:
        [row] = demo.rows
        assert row["detected"] == ["subscription_lost"], row
        scraped = prometheus.scraped_totals(demo.totals)
        lost = prometheus.query("mcp_client_resumption_lost_subscriptions_total > 0")
        server = {k: lost[0]["metric"][k] for k in ("server_address", "server_port")}
        firing = wait(lambda: webhook.alerts("firing", SUBSCRIPTION),
                      "the lost-subscription warning reached the webhook")  # fmt: skip
        # both rules were evaluated on the scrape that read the loss, and since
        evaluated = prometheus.wait(lambda: prometheus.evaluated_after(scraped + 2))
        assert ALERT not in prometheus.alerts(), prometheus.alerts()
        assert prometheus.query(f'ALERTS{{alertname="{ALERT}"}}', evaluated) == []
    finally:
        demo.close()
    warning = firing[0]
    assert {k: warning["labels"][k] for k in server} == server, warning["labels"]
    assert warning["labels"]["severity"] == "warning"
    assert warning["annotations"]["summary"] == (
        f"An MCP subscription to {server['server_address']}:{server['server_port']} was lost "
        "and not re-listened."
    )
    assert warning["annotations"]["runbook_url"].endswith(
        "dashboards/RUNBOOK.md#mcpresumptionsubscriptionlost"
    )
    assert webhook.alerts("firing") == [], "no lost-call page"
