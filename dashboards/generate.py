#!/usr/bin/env python3
# ruff: noqa: E501
# (panel text and queries read better unbroken; not formatted by ruff format)
"""Writes dashboards/mcp-resumption.json (the clients) and
dashboards/mcp-resumption-server.json (the servers): every panel and query
written once.

    python3 dashboards/generate.py          # rewrite the JSON
    python3 dashboards/generate.py --check  # exit 1 if the JSON is not what this writes

Standard library only. Panels that Prometheus cannot answer show "No data"
(grey), never a green 0: every series of a seen server exists from 0, so a
real 0 is data and an empty answer means nothing was scraped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("mcp-resumption.json")
SERVER_OUT = Path(__file__).with_name("mcp-resumption-server.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance", server_address=~"$server_address"'
ATTEMPTS = "mcp_client_resumption_attempts_total"
GAPS = "mcp_client_resumption_gaps_total"
DURATION = "mcp_client_resumption_duration_seconds"
REPLAYED = "mcp_client_resumption_replayed_events"
EVENTS = "mcp_client_stream_events_total"
EVICTED = "mcp_client_resumption_evicted_streams_total"
BROKEN = "mcp_client_resumption_broken_requests_total"
LOST_SUBSCRIPTIONS = "mcp_client_resumption_lost_subscriptions_total"
REISSUES = "mcp_client_resumption_reissues_total"
DUPLICATE_RUNS = "mcp_client_resumption_duplicate_runs_total"
MAY_RUN_TWICE = 'mcp_resumption_reissue_risk="may_run_twice"'
# The MCP semantic conventions' client metric: one point per request that got
# an answer or a final fate. A histogram series is born with its first
# observation, so its panels read the cumulative values (since each client
# started), as the resume latency panels do.
OPERATION = "mcp_client_operation_duration_seconds"
# Tasks (io.modelcontextprotocol/tasks, and 2025-11-25's experimental form):
# one fate per task handed to a client; the losses are lost, expired and
# handle_lost, abandoned is work no one will read.
TASKS = "mcp_client_resumption_tasks_total"
TASK_DURATION = "mcp_client_resumption_task_duration_seconds"
TASK_POLLS = "mcp_client_resumption_task_polls"
TASK_UNROUTABLE = "mcp_client_resumption_task_unroutable_total"
TASK_FATE = "mcp_resumption_task_fate"
TASK_LOSSES = 'mcp_resumption_task_fate=~"lost|expired|handle_lost"'
TASK_ABANDONED = 'mcp_resumption_task_fate="abandoned"'
CANCEL_IGNORED = 'mcp_resumption_task_cancel_ignored="true"'
EVENT_GAPS = "mcp_client_resumption_event_gaps_total"
EVENT_DUPLICATES = "mcp_client_resumption_event_duplicates_total"
EVENT_STREAMS = "mcp_client_resumption_event_streams_total"
EVENT_KIND = "mcp_events_gap_kind"
EVENT_LOSSES = 'mcp_events_gap_kind=~"truncated|cursor_lost|not_reopened|lapsed"'
EVENT_DEGRADED = 'mcp_events_gap_kind=~"stream_silent|unreplayable_window"'
REOPENED = 'mcp_events_stream_state="reopened"'
BY_METHOD_AND_SERVER = "mcp_method_name, server_address, server_port"
ERRORED = 'error_type!=""'
SUBSCRIPTION_LABELS = "mcp_resumption_subscription_notifications, mcp_resumption_subscription_relistened"
LOST = 'mcp_resumption_gap_kind=~"orphaned_request|drain_race"'
GOOD = 'mcp_resumption_outcome=~"resumed|caught_up"'
# A break with nothing to resume with is counted as an attempt (outcome
# not_resumable) but is no resume: the resume panels and the SLI leave it out.
RESUMES = 'mcp_resumption_outcome!="not_resumable"'
VERIFIABLE = 'mcp_resumption_outcome!~"unverifiable|not_resumable"'
NOT_RESUMABLE = 'mcp_resumption_outcome="not_resumable"'
# The share of breaks not resumable above which McpResumptionBreaksNotResumable
# warns (alerts.yaml): the dashboard colours the same share.
NOT_RESUMABLE_SHARE = 0.5
UNVERIFIABLE = 'mcp_resumption_outcome="unverifiable"'
REJECTED = 'mcp_resumption_outcome="rejected"'
# The series of mcp-resumption-proxy: each carries the leg it is about.
LEG = 'mcp_resumption_leg=~".+"'
SSE_TO_HTTP = 'mcp_transport="streamable-http", mcp_resumption_previous_transport="sse"'
HTTP_TO_SSE = 'mcp_transport="sse", mcp_resumption_previous_transport="streamable-http"'
NO_DATA = [{"type": "special", "options": {"match": "null", "result": {"text": "No data", "color": "text"}}}]


def sel(metric: str, extra: str = "", *, server: bool = True) -> str:
    base = SEL if server else 'job=~"$job", instance=~"$instance"'
    return f"{metric}{{{base}{', ' + extra if extra else ''}}}"


def inc(metric: str, extra: str = "", window: str = "$__range", **kw: Any) -> str:
    return f"increase({sel(metric, extra, **kw)}[{window}])"


def rate(metric: str, extra: str = "", **kw: Any) -> str:
    return f"rate({sel(metric, extra, **kw)}[$__rate_interval])"


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, **more: Any):
    found = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend}
    if instant:
        found.update(instant=True, range=False)
    else:
        found.update(instant=False, range=True)
    return {**found, **more}


class Layout:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_height = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {"id": self._id(), "type": "row", "title": title, "collapsed": False, "panels": [],
             "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}}
        )
        self.y += 1

    def _newline(self) -> None:
        self.y += self.row_height
        self.x, self.row_height = 0, 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> dict[str, Any]:
        if self.x + w > 24:
            self._newline()
        panel = {"id": self._id(), "datasource": DS, **panel,
                 "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h}}
        self.x += w
        self.row_height = max(self.row_height, h)
        self.panels.append(panel)
        return panel


def stat(title: str, description: str, expr: str, unit: str, steps: list, **options: Any):
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "targets": [target(expr, instant=True)],
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "noValue": "No data",
                "mappings": NO_DATA,
                "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": steps},
                **options,
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        },
    }


def timeseries(title: str, description: str, targets: list, unit: str, **defaults: Any):
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "targets": targets,
        "fieldConfig": {
            "defaults": {"unit": unit, "noValue": "No data", "custom": {"fillOpacity": 10},
                         **defaults},
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "table", "placement": "right",
                               "calcs": ["max", "lastNotNull"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def table(title: str, description: str, expr: str, labels: list[str], value: str, **extra: Any):
    keep = {name: False for name in labels}
    return {
        "type": "table",
        "title": title,
        "description": description,
        "targets": [target(expr, instant=True, format="table")],
        "fieldConfig": {"defaults": {"noValue": "No data", **extra}, "overrides": []},
        "transformations": [
            {"id": "organize", "options": {
                "excludeByName": {"Time": True},
                "renameByName": {"Value": value},
                "indexByName": {name: i for i, name in enumerate(labels)},
                **({"includeByName": {}} if False else {}),
            }},
        ],
        "options": {"showHeader": True, "sortBy": [{"displayName": value, "desc": True}]},
        "_keep": keep,
    }


def quantiles(metric: str, unit: str, title: str, description: str) -> dict[str, Any]:
    # Cumulative buckets (max_over_time of the counters, not rate()): a
    # histogram series is born with its first observation, which rate() and
    # increase() cannot see; a client resumes a server rarely, so most series
    # would show nothing. Since each client started, summed over clients.
    def q(level: str, ref: str) -> dict[str, Any]:
        expr = (
            f"histogram_quantile({level}, sum by (le) (max_over_time("
            f"{sel(metric + '_bucket')}[$__range])))"
        )
        return target(expr, f"p{round(float(level) * 100)}", ref)

    return timeseries(title, description, [q("0.5", "A"), q("0.95", "B"), q("0.99", "C")], unit)


def build() -> dict[str, Any]:
    lay = Layout()
    share = {"min": 0, "max": 1, "decimals": 1}
    lay.row("Overview")
    lay.add(stat(
        "Lost tool calls in range",
        "JSON-RPC requests whose answer never reached the application across a resume "
        "(orphaned_request, drain_race). Anything above 0 is a lost tool call: re-issue it; "
        "see the runbook of McpResumptionLostToolCall.",
        f"sum({inc(GAPS, LOST)})", "short",
        [{"color": "green", "value": None}, {"color": "red", "value": 1}], decimals=0,
    ), 4, 4)
    lay.add(stat(
        "Gaps in range",
        "Every continuity gap of any kind found on resumed streams in the time range. "
        "A gap means events between the break and the resume were lost or unproven.",
        f"sum({inc(GAPS)})", "short",
        [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 4, 4)
    lay.add(stat(
        "Resume attempts in range",
        "Reconnects with Last-Event-ID that reached a verdict in the time range (every "
        "outcome but not_resumable: a break with nothing to resume with is no resume). The "
        "shares beside it are out of these; few attempts make the shares noisy.",
        f"sum({inc(ATTEMPTS, RESUMES)})", "short", [{"color": "text", "value": None}], decimals=0,
    ), 4, 4)
    lay.add(stat(
        "Resumes proven continuous",
        "Share of resumes proven continuous or caught up. Low means streams are resumed "
        "into gaps, re-initialised or rejected: look at the outcome and gap panels.",
        f"sum({inc(ATTEMPTS, GOOD)}) / sum({inc(ATTEMPTS, RESUMES)})", "percentunit",
        [{"color": "red", "value": None}, {"color": "orange", "value": 0.9},
         {"color": "green", "value": 0.99}], **share,
    ), 4, 4)
    lay.add(stat(
        "Resumes unverifiable",
        "Share of resumes whose event ids give no ordering evidence (UUIDs) or whose "
        "cursor was evicted: a lost event there would go unnoticed.",
        f"sum({inc(ATTEMPTS, UNVERIFIABLE)}) / sum({inc(ATTEMPTS, RESUMES)})",
        "percentunit", [{"color": "text", "value": None}, {"color": "orange", "value": 0.5}],
        **share,
    ), 4, 4)
    lay.add(stat(
        "Resumes rejected",
        "Share of resumes answered 4xx/5xx: the session or cursor was gone on the server. "
        "A rising share means the servers drop sessions clients still use.",
        f"sum({inc(ATTEMPTS, REJECTED)}) / sum({inc(ATTEMPTS, RESUMES)})",
        "percentunit", [{"color": "text", "value": None}, {"color": "orange", "value": 0.2}],
        **share,
    ), 4, 4)
    lay.add(timeseries(
        "Resume outcomes",
        "Resume attempts per second by outcome. resumed/caught_up are good; gap, "
        "reinitialized, rejected (4xx/5xx) and failed (no HTTP answer) lost events; "
        "unverifiable could not be checked; not_resumable is a break with requests in "
        "flight and nothing to resume with (no event id, or protocol 2026-07-28).",
        [target(f"sum by (mcp_resumption_outcome) ({rate(ATTEMPTS)})",
                "{{mcp_resumption_outcome}}")], "reqps",
    ), 16, 8)
    lay.add({
        "type": "alertlist",
        "title": "Firing and pending alerts",
        "description": "The McpResumption alerts of this Grafana's alerting (Prometheus rules "
        "appear once the data source manages alerts). Each alert links to its runbook.",
        "options": {"alertName": "McpResumption", "viewMode": "list", "groupMode": "default",
                    "maxItems": 20, "sortOrder": 1, "dashboardAlerts": False,
                    "stateFilter": {"firing": True, "pending": True, "noData": True,
                                    "normal": False, "error": True},
                    "datasource": "${datasource}"},
    }, 8, 8)

    lay.row("SLO and error budget")
    valid = f"sum({inc(ATTEMPTS, VERIFIABLE)})"
    good = f"sum({inc(ATTEMPTS, GOOD)})"
    lay.add(stat(
        "SLI: continuous or caught up, of verifiable resumes",
        "The SLI of the alert rules over the time range: resumes proven continuous or "
        "caught up, out of every resume that could be verified. Below the SLO target "
        "($slo_target) spends error budget.",
        f"{good} / {valid}", "percentunit",
        [{"color": "red", "value": None}, {"color": "green", "value": 0.99}], **share,
    ), 8, 5)
    lay.add(stat(
        "Error budget left in range",
        "1 - (bad share / allowed bad share). 100 % is untouched, 0 % or less means the "
        "SLO ($slo_target) was missed over the time range.",
        f"1 - (1 - {good} / {valid}) / (1 - $slo_target)", "percentunit",
        [{"color": "red", "value": None}, {"color": "orange", "value": 0.25},
         {"color": "green", "value": 0.5}], decimals=1,
    ), 8, 5)

    def burn(window: str) -> str:
        g = f"sum({inc(ATTEMPTS, GOOD, window)})"
        v = f"sum({inc(ATTEMPTS, VERIFIABLE, window)})"
        return f"(1 - {g} / {v}) / (1 - $slo_target)"

    lay.add(timeseries(
        "Burn rate",
        "How fast the error budget burns (1 = exactly at the SLO). The page alerts fire at "
        "14.4 (1h and 5m) and 6 (6h and 30m); the ticket at 1 (3d and 6h).",
        [target(burn("1h"), "1h", "A"), target(burn("6h"), "6h", "B")], "none",
    ), 8, 5)

    lay.row("Gaps")
    lay.add(timeseries(
        "Gaps per second by kind",
        "Continuity gaps by kind. orphaned_request and drain_race are lost tool calls; "
        "session_changed and id_regression are server restarts or migrations.",
        [target(f"sum by (mcp_resumption_gap_kind) ({rate(GAPS)})",
                "{{mcp_resumption_gap_kind}}")], "short",
    ), 12, 8)
    lay.add(table(
        "Gaps by server and kind",
        "Gaps in the time range per server and kind, largest first: which server to look at "
        "first. Empty means no gap (every series exists from 0).",
        f"sum by (server_address, server_port, mcp_resumption_gap_kind) ({inc(GAPS)}) > 0",
        ["server_address", "server_port", "mcp_resumption_gap_kind"], "gaps", decimals=0,
    ), 12, 8)
    lay.add(timeseries(
        "Tracked streams evicted",
        "Streams dropped from tracking because OTEL_PYTHON_MCP_RESUMPTION_MAX_STREAMS was "
        "reached: their resumes are unverifiable. Raise the limit if this is not 0.",
        [target(f"sum({rate(EVICTED, server=False)})", "evicted")], "short",
    ), 12, 8)
    lay.add(timeseries(
        "Resumes that crossed a transport generation",
        "Resumes whose stream moved between legacy SSE and streamable HTTP: a migration in "
        "progress. Their outcomes show whether the migration loses events.",
        [target(
            "sum by (mcp_resumption_previous_transport, mcp_transport, mcp_resumption_outcome) ("
            f"{rate(ATTEMPTS, SSE_TO_HTTP)} or {rate(ATTEMPTS, HTTP_TO_SSE)})",
            "{{mcp_resumption_previous_transport}} → {{mcp_transport}}: {{mcp_resumption_outcome}}",
        )], "reqps",
    ), 12, 8)

    lay.row("Latency")
    lay.add(quantiles(
        DURATION, "s", "Time from reconnect to verdict (p50 / p95 / p99, since each client started)",
        "From the reconnect request to the verdict. Milliseconds on a healthy replay; near "
        "the confirmation window (OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT) when the "
        "server sends nothing.",
    ), 12, 8)
    mean = (
        f"sum by (mcp_resumption_outcome) (max_over_time({sel(REPLAYED + '_sum', server=False)}[$__range]))"
        f" / sum by (mcp_resumption_outcome) (max_over_time({sel(REPLAYED + '_count', server=False)}[$__range]))"
    )
    lay.add(timeseries(
        "Replayed events per resume (since each client started)",
        "Events a resumed stream delivered up to its verdict, mean by outcome. 0 on a gap "
        "outcome is an empty replay; large values mean long outages.",
        [target(mean, "mean {{mcp_resumption_outcome}}")], "short",
    ), 12, 8)
    lay.add(timeseries(
        "Stream events per second",
        "SSE events delivered to MCP clients, by transport and server: the traffic the "
        "checks run on. A drop to 0 with resumes going on means streams are not read.",
        [target(f"sum by (mcp_transport, server_address, server_port) ({rate(EVENTS)})",
                "{{mcp_transport}} {{server_address}}:{{server_port}}")], "short",
    ), 24, 7)

    lay.row("Per server")
    lay.add({
        **stat("x", "x", "x", "short", []),
        "type": "bargauge",
        "title": "Servers ranked by gaps",
        "description": "The ten servers with the most gaps in the time range. Click a bar for "
        "its mcp.resume traces (Tempo) or resumption.gap logs (Loki), if those data "
        "sources are set.",
        "targets": [target(
            f"topk(10, sum by (server_address, server_port) ({inc(GAPS)}))",
            "{{server_address}}:{{server_port}}", instant=True,
        )],
        "options": {"orientation": "horizontal", "displayMode": "basic", "showUnfilled": True,
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
    }, 12, 9)
    lay.add(table(
        "Resumes by server and outcome",
        "Resume attempts in the time range per server and outcome. A server with only "
        "unverifiable resumes cannot be checked: ask for ordered event ids.",
        f"sum by (server_address, server_port, mcp_resumption_outcome) ({inc(ATTEMPTS)}) > 0",
        ["server_address", "server_port", "mcp_resumption_outcome"], "resumes", decimals=0,
    ), 12, 9)

    # Last, so that the panels above keep their ids (and the links to them).
    lay.row("Broken calls")
    lay.add(timeseries(
        "Broken calls by fate",
        "JSON-RPC requests whose answer stream broke (a connection error or EOF before the "
        "answer), per second, by fate: answered (the answer came later, on a resumed stream "
        "or another), reissued (the application sent the same call again under a new id), "
        "lost (neither, once the client stopped waiting: also an orphaned_request gap). "
        "lost above 0 is a lost tool call.",
        [target(f"sum by (mcp_resumption_request_fate) ({rate(BROKEN)})",
                "{{mcp_resumption_request_fate}}")], "reqps",
    ), 12, 8)
    lay.add(table(
        "Breaks not resumable by server",
        "Per server, in the time range: breaks with requests in flight and nothing to resume "
        "with (outcome not_resumable: no event id received, or protocol 2026-07-28), out of "
        "every attempt (not_resumable plus every resume outcome). High means the breaks "
        "against that server lose their calls unless the application re-issues them: a fleet "
        f"moved onto servers without resumption. McpResumptionBreaksNotResumable warns above "
        f"{NOT_RESUMABLE_SHARE * 100:g} % of at least 10 in an hour.",
        f"sum by (server_address, server_port) ({inc(ATTEMPTS, NOT_RESUMABLE)})"
        f" / (sum by (server_address, server_port) ({inc(ATTEMPTS)}) > 0)",
        ["server_address", "server_port"], "not resumable", unit="percentunit", decimals=1,
        min=0, max=1, color={"mode": "thresholds"},
        thresholds={"mode": "absolute", "steps": [
            {"color": "text", "value": None}, {"color": "orange", "value": NOT_RESUMABLE_SHARE}]},
        custom={"cellOptions": {"type": "color-text"}},
    ), 12, 8)

    # Last again: the panels above keep their ids.
    lay.row("Subscriptions and re-issues")
    lay.add(stat(
        "Lost subscriptions in range",
        "subscriptions/listen streams (2026-07-28) that ended without the server's graceful "
        "result or the client's own close: every change notification from the drop to the "
        "next listen is missed. Not a lost call: the cure is to re-listen and refetch. "
        "McpResumptionSubscriptionLost warns on one not re-listened. No data: no client "
        "saw a streamable-HTTP server (every filter's series start at 0 when one is seen).",
        f"sum({inc(LOST_SUBSCRIPTIONS)})", "short",
        [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 8, 4)
    lay.add(stat(
        "Re-issues that may run twice in range",
        "Calls the application sent again after their stream broke, to a server whose "
        "protocol (before 2026-07-28) does not cancel a call whose stream breaks, of tools "
        "not declared idempotent or read-only: the first attempt may have run too. "
        "McpResumptionReissueMayRunTwice warns on any.",
        f"sum({inc(REISSUES, MAY_RUN_TWICE)})", "short",
        [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 8, 4)
    lay.add(stat(
        "Calls proven to run twice in range",
        "Re-issued calls whose first attempt was answered as well as the re-issue: the tool "
        "ran twice on the server. Check the effect (a booking, a payment, a message) and "
        "make the tool idempotent. McpResumptionCallRanTwice warns on any.",
        f"sum({inc(DUPLICATE_RUNS)})", "short",
        [{"color": "green", "value": None}, {"color": "red", "value": 1}], decimals=0,
    ), 8, 4)
    lay.add(timeseries(
        "Lost subscriptions by notifications and re-listened",
        "Lost subscriptions per second, by the notifications they listened for (tools, "
        "prompts, resources, resource_updates, or none; joined by a comma) and by whether "
        "the client listened to that server again within the confirmation window. "
        "re-listened=false means changes stay missed until the application listens again.",
        [target(f"sum by ({SUBSCRIPTION_LABELS}) ({rate(LOST_SUBSCRIPTIONS)})",
                "{{mcp_resumption_subscription_notifications}} "
                "re-listened={{mcp_resumption_subscription_relistened}}")], "short",
    ), 12, 8)
    lay.add(table(
        "Lost subscriptions by server",
        "Lost subscriptions in the time range per server, notifications and whether the "
        "client re-listened, largest first: which server drops its listen streams (a "
        "balancer's idle timeout, restarts). Empty means none was lost.",
        f"sum by (server_address, server_port, {SUBSCRIPTION_LABELS}) "
        f"({inc(LOST_SUBSCRIPTIONS)}) > 0",
        ["server_address", "server_port", "mcp_resumption_subscription_notifications",
         "mcp_resumption_subscription_relistened"], "lost subscriptions", decimals=0,
    ), 12, 8)
    lay.add(timeseries(
        "Re-issues by declaration and risk",
        "Re-issued calls per second, by what the server's last tools/list declared of the "
        "tool (idempotent true: idempotentHint or readOnlyHint; false: neither; unknown: "
        "never listed) and by risk: may_run_twice where it is not declared safe and the "
        "protocol is older than 2026-07-28, none otherwise.",
        [target("sum by (mcp_resumption_reissue_idempotent, mcp_resumption_reissue_risk) "
                f"({rate(REISSUES)})",
                "idempotent={{mcp_resumption_reissue_idempotent}} "
                "{{mcp_resumption_reissue_risk}}")], "short",
    ), 12, 8)
    lay.add(table(
        "Re-issues that may run twice by server",
        "Per server, in the time range: re-issues that may have run the tool twice, by what "
        "the server declared of the tool (false: listed without idempotentHint or "
        "readOnlyHint; unknown: the client never read its tools/list). Declaring the tools "
        "that are safe to run twice takes those out.",
        f"sum by (server_address, server_port, mcp_resumption_reissue_idempotent) "
        f"({inc(REISSUES, MAY_RUN_TWICE)}) > 0",
        ["server_address", "server_port", "mcp_resumption_reissue_idempotent"],
        "may run twice", decimals=0,
    ), 12, 8)
    lay.add(table(
        "Calls proven to run twice by server",
        "Per server, in the time range: re-issued calls whose first attempt was answered "
        "too, so the tool ran twice there (a resume replayed the first answer after the "
        "application had sent the call again). Empty means none.",
        f"sum by (server_address, server_port) ({inc(DUPLICATE_RUNS)}) > 0",
        ["server_address", "server_port"], "ran twice", decimals=0,
    ), 24, 6)

    # Last again: the panels above keep their ids.
    lay.row("Operations")
    lay.add(quantiles(
        OPERATION, "s", "Operation duration (p50 / p95 / p99, since each client started)",
        "mcp.client.operation.duration of the MCP semantic conventions: from a request sent "
        "to its answer, or to its final fate (lost, re-issued), every method and server. "
        "High p99 with low p50: a few calls wait for a break to be decided.",
    ), 12, 8)
    lay.add(table(
        "Operation p95 by method and server (since each client started)",
        "The 95th percentile of the operation duration per method and server: which "
        "server is slow at what. tools/call includes the tools' own run time; a lost or "
        "re-issued call counts until its fate was decided.",
        f"histogram_quantile(0.95, sum by (le, {BY_METHOD_AND_SERVER}) "
        f"(max_over_time({sel(OPERATION + '_bucket')}[$__range])))",
        ["mcp_method_name", "server_address", "server_port"], "p95", unit="s", decimals=3,
    ), 12, 8)
    count = f"max_over_time({sel(OPERATION + '_count')}[$__range])"
    errors = f"max_over_time({sel(OPERATION + '_count', ERRORED)}[$__range])"
    lay.add(table(
        "Operation error share by method and server (since each client started)",
        "Per method and server, the share of operations that ended in an error: a JSON-RPC "
        "error, a tool error (tool_error), a refused request (its HTTP status), a lost call "
        "(orphaned_request) or one the application sent again (reissued). 0 % where none did.",
        f"(sum by ({BY_METHOD_AND_SERVER}) ({errors}) or 0 * sum by ({BY_METHOD_AND_SERVER}) "
        f"({count})) / sum by ({BY_METHOD_AND_SERVER}) ({count})",
        ["mcp_method_name", "server_address", "server_port"], "errors", unit="percentunit",
        decimals=1, min=0, max=1,
    ), 12, 8)
    lay.add(table(
        "Operation errors by method, server and error type (since each client started)",
        "Operations that ended in an error, per method, server and error.type, largest "
        "first. orphaned_request is a lost call, reissued a call the application sent "
        "again after its stream broke. Empty means no error.",
        f"sum by ({BY_METHOD_AND_SERVER}, error_type) ({errors}) > 0",
        ["mcp_method_name", "server_address", "server_port", "error_type"], "errors",
        decimals=0,
    ), 12, 8)

    # Last again: the panels above keep their ids.  Only mcp-resumption-proxy
    # puts mcp_resumption_leg on its series: a client's own show nothing here.
    lay.row("Proxy legs")
    lay.add(table(
        "Proxy losses by leg and gap kind",
        "mcp-resumption-proxy only: every gap in the time range, by the leg it happened on: "
        "client_proxy (between client and proxy) or proxy_server (between proxy and server), "
        "and by kind. orphaned_request and drain_race are lost tool calls. On client_proxy "
        "the fix is in front of the proxy (what cuts the clients' connections; --resumable "
        "keeps the answers for the client's resume); on proxy_server it is the server's "
        "(an event store, sticky sessions). Empty means no gap on either leg, or no proxy.",
        f"sum by (mcp_resumption_leg, mcp_resumption_gap_kind) ({inc(GAPS, LEG)}) > 0",
        ["mcp_resumption_leg", "mcp_resumption_gap_kind"], "gaps", decimals=0,
    ), 12, 8)
    lay.add(timeseries(
        "Proxy broken calls by leg and fate",
        "mcp-resumption-proxy only: JSON-RPC requests whose answer stream broke, per second, "
        "by leg (client_proxy: between client and proxy; proxy_server: between proxy and "
        "server) and fate: answered (came later), reissued (sent again), lost (neither: a "
        "lost tool call). lost above 0 on a leg is a call lost there.",
        [target(f"sum by (mcp_resumption_leg, mcp_resumption_request_fate) ({rate(BROKEN, LEG)})",
                "{{mcp_resumption_leg}} {{mcp_resumption_request_fate}}")], "reqps",
    ), 12, 8)

    # Last again: the panels above keep their ids.
    lay.row("Tasks")
    lay.add(stat(
        "Lost tasks in range",
        "Tasks whose result the application never got: lost (the server answered not found "
        "for a handle it gave out: a restart without a durable store, a replica without the "
        "task), expired (the same once the task's TTL had run out) and handle_lost (a call "
        "that could have become a task broke before its handle arrived: the work may run "
        "unseen). McpResumptionTaskLost warns on any.",
        f"sum({inc(TASKS, TASK_LOSSES)})", "short",
        [{"color": "green", "value": None}, {"color": "red", "value": 1}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Abandoned tasks in range",
        "Tasks the client stopped following before their end, without tasks/cancel (the "
        "process exited, or the application gave up waiting): work may run that no one "
        "will read. McpResumptionTaskAbandoned warns on any.",
        f"sum({inc(TASKS, TASK_ABANDONED)})", "short",
        [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Cancels not honoured in range",
        "tasks/cancel acknowledged, then the task completed: the work ran although the "
        "application cancelled it (a cancel is cooperative). A task that ends cancelled "
        "is not counted here.",
        f"sum({inc(TASKS, CANCEL_IGNORED)})", "short",
        [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Task requests without Mcp-Name in range",
        "tasks/* requests sent over streamable HTTP without the Mcp-Name header that the "
        "extension requires: a load balancer cannot route them to the replica that holds "
        "the task, so a fleet answers them not found.",
        f"sum({inc(TASK_UNROUTABLE)})", "short",
        [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 6, 4)
    lay.add(table(
        "Task fates by server",
        "Tasks in the time range per server, tool and fate, largest first. completed, "
        "failed and cancelled are terminal statuses the client saw (a failed task is an "
        "answer, not a loss); lost, expired and handle_lost lost their result; abandoned "
        "was left unread. Empty means no task ended in the range.",
        f"sum by (server_address, server_port, gen_ai_tool_name, {TASK_FATE}) "
        f"({inc(TASKS)}) > 0",
        ["server_address", "server_port", "gen_ai_tool_name", TASK_FATE], "tasks", decimals=0,
    ), 12, 8)
    lay.add(timeseries(
        "Lost, expired and handle-lost tasks per second",
        "The task losses per second by fate. lost rising with a deploy: the servers keep "
        "their tasks in memory; expired: TTLs shorter than the work; handle_lost: the "
        "creating calls' streams break.",
        [target(f"sum by ({TASK_FATE}) ({rate(TASKS, TASK_LOSSES)})",
                f"{{{{{TASK_FATE}}}}}")], "short",
    ), 12, 8)

    def task_life(level: str, ref: str) -> dict[str, Any]:
        # cumulative buckets, as the other histograms (a series is born with
        # its first observation)
        expr = (
            f"histogram_quantile({level}, sum by (le, {TASK_FATE}) (max_over_time("
            f"{sel(TASK_DURATION + '_bucket')}[$__range])))"
        )
        return target(expr, f"p{round(float(level) * 100)} {{{{{TASK_FATE}}}}}", ref)

    lay.add(timeseries(
        "Task life by fate (p50 / p95 / p99, since each client started)",
        "From the handle to the terminal status the client saw, or to the fate it was "
        "given (lost, expired, abandoned), by fate. A long life before lost: the task ran "
        "until a restart took it; expired near the TTL: the client read too late.",
        [task_life("0.5", "A"), task_life("0.95", "B"), task_life("0.99", "C")], "s",
    ), 12, 8)
    polls = (
        f"sum by ({TASK_FATE}) (max_over_time({sel(TASK_POLLS + '_sum')}[$__range]))"
        f" / sum by ({TASK_FATE}) (max_over_time({sel(TASK_POLLS + '_count')}[$__range]))"
    )
    lay.add(timeseries(
        "tasks/get polls per task by fate (since each client started)",
        "The mean number of tasks/get polls per task, by fate. Many polls for short lives: "
        "the client polls faster than the server's pollIntervalMs.",
        [target(polls, "mean {{mcp_resumption_task_fate}}")], "short",
    ), 12, 8)

    # Last again: the panels above keep their ids.
    lay.row("Events")
    lay.add(stat(
        "Events skipped in range",
        "Breaks of an event subscription's thread of cursors (the Events extension) that "
        "skipped events the application never got: truncated (the server said so), "
        "cursor_lost (the client started from now after holding a cursor), not_reopened "
        "(a cut push stream was not reopened) and lapsed (a webhook subscription was not "
        "refreshed). McpResumptionEventsLost warns on any.",
        f"sum({inc(EVENT_GAPS, EVENT_LOSSES)})", "short",
        [{"color": "green", "value": None}, {"color": "red", "value": 1}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Push streams silent or unreplayable in range",
        "Push streams silent for more than twice their heartbeat interval while still "
        "open, and streams of a type without replay cut and reopened (what was published "
        "in between is lost by design). McpResumptionEventStreamDegraded tells of any.",
        f"sum({inc(EVENT_GAPS, EVENT_DEGRADED)})", "short",
        [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Push streams reopened with continuity proven in range",
        "events/stream reopened with the thread's last cursor and answered truncated: "
        "false: resumes that lost nothing.",
        f"sum({inc(EVENT_STREAMS, REOPENED)})", "short",
        [{"color": "green", "value": None}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Events delivered again in range",
        "Events delivered again with the same eventId and payload: at-least-once delivery, "
        "to deduplicate by eventId; not a loss.",
        f"sum({inc(EVENT_DUPLICATES)})", "short",
        [{"color": "green", "value": None}], decimals=0,
    ), 6, 4)
    lay.add(table(
        "Event gaps by kind and event type",
        "Breaks of event subscriptions in the time range per server, event type and kind, "
        "largest first. truncated, cursor_lost, not_reopened, lapsed and "
        "unreplayable_window lost events; cursor_rewound redelivers; cursor_unknown "
        "proves nothing; terminated is the server ending a subscription.",
        f"sum by (server_address, server_port, mcp_events_name, {EVENT_KIND}) "
        f"({inc(EVENT_GAPS)}) > 0",
        ["server_address", "server_port", "mcp_events_name", EVENT_KIND], "gaps", decimals=0,
    ), 12, 8)
    lay.add(timeseries(
        "Push streams per second: opened, ended, reopened, silent",
        "What became of events/stream push streams, per second. opened above ended: "
        "streams open now; reopened: resumes that lost nothing; silent: streams that "
        "stopped hearing heartbeats.",
        [target("sum by (mcp_events_stream_state) (" + rate(EVENT_STREAMS) + ")",
                "{{mcp_events_stream_state}}")], "short",
    ), 12, 8)

    links = [
        {"title": "mcp.resume traces of this server (Tempo)", "url":
         "/explore?left=" + json.dumps({"datasource": "${tempo}", "queries": [{"refId": "A",
         "queryType": "traceql", "query": '{ name = "mcp.resume" && '
         'span.server.address = "${__field.labels.server_address}" && '
         'span.server.port = ${__field.labels.server_port} }'}]}, separators=(",", ":"))},
        {"title": "resumption.gap logs of this server (Loki)", "url":
         "/explore?left=" + json.dumps({"datasource": "${loki}", "queries": [{"refId": "A",
         "expr": '{service_name=~".+"} | event_name="resumption.gap" | '
         'server_address="${__field.labels.server_address}"'}]}, separators=(",", ":"))},
    ]
    for panel in lay.panels:
        if panel["type"] in ("bargauge", "table") and "server" in panel["title"].lower():
            panel["fieldConfig"]["defaults"]["links"] = links
    for panel in lay.panels:
        panel.pop("_keep", None)

    prom = {"selected": True, "text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"}
    attempts = "mcp_client_resumption_attempts_total"
    return dashboard(
        scraped="clients",
        extra_panel_types=[("bargauge", "Bar gauge"), ("alertlist", "Alert list")],
        description="MCP stream resumption continuity: did each reconnect with Last-Event-ID "
        "really continue the stream? Metrics of opentelemetry-instrumentation-mcp-resumption. "
        "Generated by dashboards/generate.py.",
        runbook="https://github.com/mcp-resumption/opentelemetry-instrumentation-mcp-resumption/blob/main/dashboards/RUNBOOK.md",
        panels=lay.panels,
        tags=["mcp", "opentelemetry", "resumption"],
        variables=[
            ds_var("datasource", "Data source", "prometheus", prom),
            query_var("job", "Job", f"label_values({attempts}, job)"),
            query_var("instance", "Instance", f'label_values({attempts}{{job=~"$job"}}, instance)'),
            query_var("server_address", "Server",
                      f'label_values({attempts}{{job=~"$job", instance=~"$instance"}}, server_address)'),
            {"name": "slo_target", "label": "SLO target", "type": "constant", "query": "0.99",
             "hide": 2, "skipUrlSync": False, "description":
             "Keep equal to the SLO of the recording rules in alerts.yaml"},
            ds_var("tempo", "Traces (optional)", "tempo", None),
            ds_var("loki", "Logs (optional)", "loki", None),
        ],
        title="MCP stream resumption",
        uid="mcp-resumption",
    )  # fmt: skip


# --- what both dashboards share: their variables and their envelope -----------------


def query_var(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "definition": query,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2, "regex": "", "sort": 1, "multi": True, "includeAll": True,
        "allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [], "hide": 0, "skipUrlSync": False,
    }  # fmt: skip


def ds_var(name: str, label: str, plugin: str, current: dict | None) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "datasource", "query": plugin, "regex": "",
            "refresh": 1, "hide": 0, "multi": False, "includeAll": False,
            "current": current or {}, "options": [], "skipUrlSync": False}  # fmt: skip


def dashboard(*, scraped: str, extra_panel_types: list[tuple[str, str]], description: str,
              runbook: str, panels: list, tags: list[str], variables: list, title: str,
              uid: str) -> dict[str, Any]:
    """A Grafana dashboard around ``panels``: its datasource input (the
    Prometheus that scrapes the instrumented MCP ``scraped``), what it needs,
    a runbook link and its template ``variables``."""
    panel_types = [("stat", "Stat"), ("timeseries", "Time series"), ("table", "Table"),
                   *extra_panel_types]
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description":
                      f"The Prometheus that scrapes the instrumented MCP {scraped}",
                      "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            *({"type": "panel", "id": kind, "name": name, "version": ""} for kind, name in panel_types),
        ],
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": description,
        "editable": True, "fiscalYearStartMonth": 0, "graphTooltip": 1, "id": None,
        "links": [{"title": "Runbook", "type": "link", "targetBlank": True, "url": runbook}],
        "panels": panels,
        "refresh": "30s", "schemaVersion": 39, "tags": tags,
        "templating": {"list": variables},
        "time": {"from": "now-6h", "to": "now"}, "timepicker": {}, "timezone": "",
        "title": title, "uid": uid, "version": 1, "weekStart": "",
    }  # fmt: skip


def main(argv: list[str]) -> int:
    from generate_server import build_server

    for out, document in ((OUT, build()), (SERVER_OUT, build_server())):
        text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        if "--check" in argv:
            if out.read_text(encoding="utf-8") != text:
                print(f"{out.name} is not what generate.py writes: run python3 {__file__}")
                return 1
            continue
        out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
