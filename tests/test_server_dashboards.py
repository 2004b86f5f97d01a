"""The server dashboard and alert rules: static checks, promtool, and a real
Prometheus scraping a real SDK server that received known resumes, every
panel compared with what the server was sent."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from opentelemetry.sdk.metrics import MeterProvider

from server_harness import RawSession, UuidStore, build_app, running, server_instrumented

from dashboard_queries import iter_panels, load_dashboard, panel_queries, variable_queries
from prometheus_stack import Prometheus, free_port

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "mcp-resumption-server.json"
ALERTS = ROOT / "dashboards" / "alerts-server.yaml"
RUNBOOK = ROOT / "dashboards" / "RUNBOOK.md"
RESUME_METRICS = ("mcp_server_resumption_requests_total", "mcp_server_resumption_replayed_events")
DELIVERY_METRICS = (
    "mcp_server_resumption_deliveries_total",
    "mcp_server_resumption_work_for_nobody_total",
    "mcp_server_resumption_second_runs_total",
    "mcp_server_resumption_listens_total",
)
# mcp.server.operation.duration: the conventions' metric, recorded by the
# server half's operation instrumentation.
OPERATION_METRICS = ("mcp_server_operation_duration_seconds",)
SERVER_METRICS = (*RESUME_METRICS, *DELIVERY_METRICS, *OPERATION_METRICS)


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
        "McpServerAnswerUndelivered", "McpServerWorkForNobody",
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


@contextlib.contextmanager
def scraped(tmp_path: Path, telemetry, **prometheus_args) -> Iterator[Prometheus]:
    """The test's meter provider exported on a port a real Prometheus scrapes
    every second as the job ``mcp-server``."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    metrics_port = free_port()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    telemetry.meter_provider = provider
    http_server, _thread = start_http_server(metrics_port, addr="127.0.0.1")
    try:
        prometheus = Prometheus(
            tmp_path, metrics_port, interval="1s", job="mcp-server", **prometheus_args
        )
        try:
            yield prometheus
        finally:
            prometheus.close()
    finally:
        http_server.shutdown()
        provider.shutdown()


def scalar(result: list) -> float | None:
    return float(result[0]["value"][1]) if result else None


def test_every_panel_shows_what_the_server_was_sent(tmp_path, telemetry):
    store = UuidStore()
    with (
        scraped(tmp_path, telemetry, rule_files=[ALERTS]) as prometheus,
        server_instrumented(telemetry) as instrumentor,
        running(build_app(store)) as server,
    ):
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
            if not any(metric in expr for metric in RESUME_METRICS):
                continue  # the delivery row: test_the_delivery_row_... below
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


def delivery_stack_scenario(prometheus, telemetry):
    """A real mcp 2.x server on 2026-07-28 (JSON answers) behind the router:
    a clean call, a listen the client closes, then (once Prometheus read the
    series at 0) a call whose client closed its connection while the tool
    ran on, its re-issue, and a listen the server refused (its cap)."""
    import asyncio

    from test_server_delivery import Stack, json_call_cut_by_its_client
    from wire import MODERN, AppClient

    async def scenario():
        async with Stack(telemetry, json_response=True) as stack:
            async with AppClient(MODERN, stack.url) as client:
                assert await client.call("a", progress=False) == "done a"
                async with client.session.listen(resources_list_changed=True):
                    pass
                zero = (
                    'mcp_server_resumption_deliveries_total{mcp_resumption_delivery_fate="undelivered"}',
                    'mcp_server_resumption_work_for_nobody_total{gen_ai_tool_name="work"}',
                    'mcp_server_resumption_second_runs_total{gen_ai_tool_name="work"}',
                    'mcp_server_resumption_listens_total{mcp_resumption_listen_end="lost"}',
                )
                await asyncio.to_thread(
                    prometheus.wait, lambda: all(prometheus.query(q) for q in zero)
                )
                await json_call_cut_by_its_client(stack, client, "work")
                assert await client.call("x", progress=False) == "done x"  # the re-issue
                listen = stack.handlers.server._lowlevel_server._request_handlers[
                    "subscriptions/listen"
                ].handler
                listen._max_subscriptions = 0
                with pytest.raises(Exception, match="Subscription limit"):
                    async with client.session.listen(resources_list_changed=True):
                        pass
            return stack

    return asyncio.run(scenario())


@pytest.mark.mcp2
def test_the_delivery_row_shows_what_the_clients_lost(tmp_path, telemetry):
    with scraped(tmp_path, telemetry, rule_files=[ALERTS]) as prometheus:
        stack = delivery_stack_scenario(prometheus, telemetry)
        # The truth: the handler's log (x ran twice, the first time after its
        # client closed the connection) and the router's record.
        assert stack.handlers.log.count(("finished", "x")) == 2
        answered = stack.requests_answered_on_the_wire()
        at = prometheus.scraped_totals({
            "mcp_server_resumption_deliveries_total": answered + 1,
            "mcp_server_resumption_work_for_nobody_total": 1,
            "mcp_server_resumption_second_runs_total": 1,
        })
        prometheus.wait(lambda: prometheus.evaluated_after(at + 2))
        # increase() extrapolates a young series by up to half a scrape at
        # each end: read once the loss's series has 12 samples (within 10 %).
        samples = (
            "count_over_time(mcp_server_resumption_deliveries_total"
            '{mcp_resumption_delivery_fate="undelivered"}[1h])'
        )
        prometheus.wait(lambda: all(
            float(r["value"][1]) >= 12 for r in prometheus.query(samples) or [{"value": [0, 0]}]
        ))
        variables = {"__range": "1h", "__rate_interval": "30s", "job": "mcp-server"}
        truth = {
            "Undelivered answers in range": 1.0,
            "Tool calls run for nobody in range": 1.0,
            "Proven second runs in range": 1.0,
        }
        shown: dict[str, list] = {}
        for title, expr in panel_queries(load_dashboard(DASHBOARD), variables):
            if not any(metric in expr for metric in DELIVERY_METRICS):
                continue
            shown[title] = prometheus.query(expr)
            assert shown[title], f"{title}: no data: {expr}"
        for title, value in truth.items():
            assert scalar(shown[title]) == pytest.approx(value, rel=0.25), (title, shown[title])
        # every answer but one reached its client (the first ones are born
        # at 1, which increase() cannot see: hence the tolerance)
        assert scalar(shown["Answers delivered"]) == pytest.approx(
            answered / (answered + 1), rel=0.25
        )
        [row] = shown["Work done for nobody by tool"]
        assert {k: row["metric"][k] for k in (
            "gen_ai_tool_name", "mcp_protocol_version", "mcp_resumption_tool_hint"
        )} == {"gen_ai_tool_name": "work", "mcp_protocol_version": "2026-07-28",
               "mcp_resumption_tool_hint": "none"}
        [lost] = shown["Lost subscriptions by filter"]
        assert lost["metric"]["mcp_resumption_listen_filter"] == "resources"
        assert float(lost["value"][1]) == pytest.approx(1.0, rel=0.25)

        def raised() -> dict[str, str]:
            alerts = prometheus.alerts()
            wanted = {"McpServerAnswerUndelivered", "McpServerWorkForNobody"}
            return alerts if wanted <= set(alerts) else {}

        alerts = prometheus.wait(raised, timeout=30)
        assert alerts == {
            "McpServerAnswerUndelivered": "firing", "McpServerWorkForNobody": "firing",
        }, alerts


@pytest.mark.mcp2
def test_the_operation_panels_show_the_operations(tmp_path, telemetry):
    with scraped(tmp_path, telemetry) as prometheus:
        delivery_stack_scenario(prometheus, telemetry)
        variables = {"__range": "1h", "__rate_interval": "30s", "job": "mcp-server"}
        queries = [
            (title, expr) for title, expr in panel_queries(load_dashboard(DASHBOARD), variables)
            if any(metric in expr for metric in OPERATION_METRICS)
        ]
        assert len(queries) == 2
        prometheus.wait(lambda: all(prometheus.query(expr) for _, expr in queries), timeout=15)


def answers_on_the_wire(exchanges) -> int:
    """Requests (POSTs with an id) among ``exchanges`` whose answer crossed
    the wire, as an SSE event or a JSON body."""
    from wire import message

    answered = set()
    for exchange in exchanges:
        request = exchange.request.jsonrpc or {}
        if "id" not in request:
            continue
        if any(
            (decoded := message(event)) and "method" not in decoded and "id" in decoded
            for event in exchange.events
        ) or (exchange.status == 200 and (
            exchange.response_header("content-type") or ""
        ).startswith("application/json")):
            answered.add(str(request["id"]))
    return len(answered)


@pytest.mark.mcp2
def test_a_2026_07_28_server_fills_the_variables_and_its_cancelled_calls_count(
    tmp_path, telemetry
):
    """A real mcp 2.x server whose clients speak only 2026-07-28 (no resumes,
    so no resume requests): the dashboard's variables list it, and 3 of its
    10 tools/call streams cut below the server (cancelled) count against
    the answers delivered, and are shown apart."""
    import asyncio

    from test_server_delivery import Stack, _wait
    from wire import MODERN, AppClient

    cut = ("c2", "c5", "c8")
    cancelled = (
        'mcp_server_resumption_deliveries_total{mcp_resumption_delivery_fate="cancelled"}'
    )
    with scraped(tmp_path, telemetry) as prometheus:

        async def scenario():
            async with Stack(telemetry) as stack:
                async with AppClient(MODERN, stack.url) as client:
                    assert await client.call("c0") == "done c0"
                    # Prometheus read the fates (at 0) before anything is cut
                    await asyncio.to_thread(prometheus.wait, lambda: prometheus.query(cancelled))
                    first = len(stack.router.exchanges)
                    for n in range(1, 10):
                        text = f"c{n}"
                        if text in cut:
                            stack.cut = text
                            with pytest.raises(Exception):  # noqa: B017 (the SDK's own error)
                                await client.call(text)
                            await asyncio.to_thread(
                                _wait, lambda text=text: stack.handlers.saw("cancelled", text)
                            )
                        else:
                            assert await client.call(text) == f"done {text}"
                return stack, first

        stack, first = asyncio.run(scenario())
        # The truth: the router's record and the handlers' log.
        exchanges = stack.router.exchanges
        assert {e.request.header("mcp-protocol-version") for e in exchanges} == {"2026-07-28"}
        assert not any(e.request.header("last-event-id") for e in exchanges)
        severed = [e for e in exchanges if e.severed]
        assert [(e.request.jsonrpc or {}).get("method") for e in severed] == ["tools/call"] * 3
        assert [t for what, t in stack.handlers.log if what == "cancelled"] == list(cut)
        answered = answers_on_the_wire(exchanges)
        later = answers_on_the_wire(exchanges[first:])  # after Prometheus' first read
        prometheus.scraped_totals({"mcp_server_resumption_deliveries_total": answered + 3})
        # increase() extrapolates by up to half a scrape at each end: read
        # once the series have 12 samples (within 10 %).
        prometheus.wait(lambda: all(
            float(r["value"][1]) >= 12
            for r in prometheus.query(f"count_over_time({cancelled}[1h])") or [{"value": [0, 0]}]
        ))
        assert prometheus.query("mcp_server_resumption_requests_total") == []

        dashboard = load_dashboard(DASHBOARD)
        chosen: dict[str, str] = {}
        for name, selector, label in variable_queries(dashboard, chosen):
            listed = prometheus.label_values(selector, label)
            assert listed, f"${name} lists nothing: label_values({selector}, {label})"
            chosen[name] = "|".join(sorted(listed))
        targets = {s["labels"]["instance"] for s in prometheus._get("targets")["activeTargets"]}
        assert chosen == {
            "job": "mcp-server", "instance": "|".join(sorted(targets)),
            "server_address": "127.0.0.1",
        }
        variables = {"__range": "1h", "__rate_interval": "30s", **chosen}
        shown = {
            title: prometheus.query(expr) for title, expr in panel_queries(dashboard, variables)
        }
        for title in ("Undelivered answers in range", "Answers delivered",
                      "Calls cancelled in range", "Tool calls run for nobody in range",
                      "Answers by delivery fate", "Operation latency by method (p95)"):
            assert shown[title], f"{title}: no data"
        assert scalar(shown["Calls cancelled in range"]) == pytest.approx(3, rel=0.1)
        assert scalar(shown["Undelivered answers in range"]) == 0
        # what reached its client of what Prometheus saw asked after its first read
        assert scalar(shown["Answers delivered"]) == pytest.approx(later / (later + 3), rel=0.1)


async def json_first_call_cut_by_its_client(stack, client, tool: str, warm: str) -> None:
    """``tool``'s first call, with ``x``, sent straight to the server by a
    client that closes its connection once the handler started; the request
    is the SDK client's own call of ``warm``, renamed (so that ``tool`` is
    never called before)."""
    from test_server_delivery import post_x_and_leave_once_started

    assert await client.session.call_tool(warm, {"text": "warm"})
    [seen] = [e for e in stack.router.exchanges if b'"warm"' in e.request.body]
    body = json.loads(seen.request.body)
    body["params"].update(name=tool, arguments={"text": "x"})
    headers = {
        k: (tool if k.lower() == "mcp-name" else v) for k, v in seen.request.headers
        if k.lower() not in ("host", "content-length", "connection")
    }
    await post_x_and_leave_once_started(stack, headers, json=body)


@pytest.mark.mcp2
def test_a_listed_tools_first_call_run_for_nobody_is_counted(tmp_path, telemetry):
    """A tool listed, never called, whose first call runs for nobody (JSON
    answers on 2026-07-28: nothing watches the connection) and is re-issued
    at once: its series were at 0 in Prometheus since the listing, so the
    dashboard counts the call and the second run."""
    import asyncio
    import time

    from test_server_delivery import Stack
    from wire import MODERN, AppClient

    with scraped(tmp_path, telemetry) as prometheus:

        def scraped_after(at: float) -> bool:
            return any(float(r["value"][1]) > at
                       for r in prometheus.query('timestamp(up{job="mcp-server"})'))

        async def scenario():
            async with Stack(telemetry, json_response=True) as stack:
                async with AppClient(MODERN, stack.url) as client:
                    listed = await client.session.list_tools()
                    assert {t.name for t in listed.tools} == {"work", "lookup"}
                    after = time.time()
                    await asyncio.to_thread(prometheus.wait, lambda: scraped_after(after))
                    await json_first_call_cut_by_its_client(stack, client, "work", "lookup")
                    # the client re-issues the call it never got an answer to
                    assert await client.session.call_tool("work", {"text": "x"})
                return stack

        stack = asyncio.run(scenario())
        # The truth: the handler's log (x ran twice, the first time for nobody).
        assert stack.handlers.log.count(("finished", "x")) == 2
        assert not any(b'"work"' in e.request.body and b'"x"' in e.request.body
                       for e in stack.router.exchanges[:-1])  # the router saw the re-issue only
        prometheus.scraped_totals({
            "mcp_server_resumption_work_for_nobody_total": 1,
            "mcp_server_resumption_second_runs_total": 1,
        })
        samples = (
            'count_over_time(mcp_server_resumption_work_for_nobody_total{gen_ai_tool_name="work"}[1h])'
        )
        prometheus.wait(lambda: all(
            float(r["value"][1]) >= 12 for r in prometheus.query(samples) or [{"value": [0, 0]}]
        ))
        variables = {"__range": "1h", "__rate_interval": "30s", "job": "mcp-server"}
        shown = {
            title: prometheus.query(expr)
            for title, expr in panel_queries(load_dashboard(DASHBOARD), variables)
        }
        assert scalar(shown["Tool calls run for nobody in range"]) == pytest.approx(1, rel=0.1)
        assert scalar(shown["Proven second runs in range"]) == pytest.approx(1, rel=0.1)
        [row] = shown["Work done for nobody by tool"]
        assert row["metric"]["gen_ai_tool_name"] == "work"
        assert row["metric"]["mcp_protocol_version"] == "2026-07-28"


@pytest.mark.parametrize("kind", [
    pytest.param("mcp2-default", marks=pytest.mark.mcp2, id="mcp2-2026-07-28"),
    pytest.param("mcp2-legacy", marks=pytest.mark.mcp2, id="mcp2-legacy"),
    pytest.param("mcp1", marks=pytest.mark.mcp1, id="mcp1"),
])
def test_a_listed_tools_series_start_at_0_before_any_call(telemetry, kind):
    """Every revision: the tools a tools/list answer names have their
    work_for_nobody and second_runs series at 0 (with the hint they declare
    and the protocol version the client's calls will carry) before any call."""
    import asyncio

    from test_server_delivery import Stack
    from wire import AppClient

    async def scenario():
        async with Stack(telemetry) as stack, AppClient(kind, stack.url) as client:
            listed = await client.session.list_tools()
            return stack, {tool.name for tool in listed.tools}

    stack, names = asyncio.run(scenario())
    assert names == {"work", "lookup"}
    assert not any(e.request.jsonrpc_method == "tools/call" for e in stack.router.exchanges)
    versions = {
        e.request.header("mcp-protocol-version") for e in stack.router.exchanges
        if e.request.jsonrpc_method == "tools/list"
    }
    [version] = versions
    wasted = {
        (p.attributes["gen_ai.tool.name"], p.attributes["mcp.protocol.version"],
         p.attributes["mcp.resumption.tool.hint"]): p.value
        for p in telemetry.points("mcp.server.resumption.work_for_nobody")
    }
    assert wasted == {("work", version, "none"): 0, ("lookup", version, "read_only"): 0}
    second = {
        (p.attributes["gen_ai.tool.name"], p.attributes["mcp.protocol.version"]): p.value
        for p in telemetry.points("mcp.server.resumption.second_runs")
    }
    assert second == {("work", version): 0, ("lookup", version): 0}
