#!/usr/bin/env python3
# ruff: noqa: E501
# (test tables read better one case to a line)
"""Writes dashboards/alerts.test.yaml, the promtool unit tests of alerts.yaml,
and dashboards/alerts-server.test.yaml, those of alerts-server.yaml.

    python3 dashboards/alert_tests.py          # rewrite the tests
    python3 dashboards/alert_tests.py --check  # exit 1 if the file is not what this writes

Every alert gets four cases: it fires, it stays quiet, it stays quiet after a
scrape outage, and it stays quiet on a fresh Prometheus that first sees old
counters. The expected annotations are the rule's own, with the labels filled
in, so a test fails when an alert's wording and its labels disagree.
Needs PyYAML (a test dependency).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
OUT = HERE / "alerts.test.yaml"
SERVER_OUT = HERE / "alerts-server.test.yaml"
JOB, CLIENT = "mcp-client", "client-a:9464"
SERVER = {"server_address": "tools.example.com", "server_port": "443"}


def rules() -> dict[str, dict[str, Any]]:
    document = {"groups": []}
    for name in ("alerts.yaml", "alerts-server.yaml"):
        document["groups"] += yaml.safe_load((HERE / name).read_text(encoding="utf-8"))["groups"]
    return {r["alert"]: r for g in document["groups"] for r in g["rules"] if "alert" in r}


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    merged = {"job": JOB, "instance": CLIENT, **labels}
    inner = ", ".join(f'{k}="{v}"' for k, v in merged.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def attempts(outcome: str, values: str, server: dict = SERVER, **labels: str) -> dict[str, str]:
    return series("mcp_client_resumption_attempts_total", values, **server,
                  mcp_transport="streamable-http", mcp_resumption_previous_transport="none",
                  mcp_resumption_outcome=outcome, **labels)  # fmt: skip


def gaps(kind: str, values: str, server: dict = SERVER, **labels: str) -> dict[str, str]:
    return series("mcp_client_resumption_gaps_total", values, **server,
                  mcp_transport="streamable-http", mcp_resumption_gap_kind=kind, **labels)  # fmt: skip


def expected(alert: str, **labels: str) -> dict[str, Any]:
    rule = rules()[alert]
    all_labels = {**rule["labels"], **labels}

    def fill(text: str) -> str:
        text = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: all_labels[m.group(1)], text)
        assert "{{" not in text, f"{alert}: the tests fill in labels only: {text}"
        return " ".join(text.split())

    return {"exp_labels": all_labels,
            "exp_annotations": {k: fill(v) for k, v in rule["annotations"].items()}}  # fmt: skip


def check(alert: str, at: str, *alerts: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": list(alerts)}


def case(name: str, inputs: list, checks: list) -> dict[str, Any]:
    return {"name": name, "interval": "1m", "input_series": inputs, "alert_rule_test": checks}


SRV = {"job": JOB, **SERVER}
OTHER = {"server_address": "other.example.com", "server_port": "443"}
OLD = {"server_address": "old.example.com", "server_port": "443"}


def burn_cases() -> list[dict[str, Any]]:
    fast, burn, slow = ("McpResumptionErrorBudgetBurnFast", "McpResumptionErrorBudgetBurn",
                        "McpResumptionErrorBudgetBurnSlow")  # fmt: skip
    return [
        case("fast burn pages: 17 % of resumes lost events (14.4x of a 1 % budget is 14.4 %)",
             [attempts("resumed", "0+100x90"), attempts("gap", "0+20x90")],
             [check(fast, "60m", expected(fast, **SRV)), check(fast, "1m")]),
        case("6x burn pages, fast burn does not: 7.4 % lost",
             [attempts("resumed", "0+100x120"), attempts("gap", "0+8x120")],
             [check(burn, "60m", expected(burn, **SRV)), check(fast, "60m")]),
        case("1x burn tickets, no page: 2 % lost",
             [attempts("resumed", "0+100x240"), attempts("rejected", "0+2x240")],
             [check(slow, "180m", expected(slow, **SRV)), check(burn, "180m"), check(fast, "180m")]),
        case("quiet: 0.1 % lost is within the budget",
             [attempts("resumed", "0+1000x240"), attempts("gap", "0+1x240")],
             [check(a, "180m") for a in (fast, burn, slow)]),
        case("a single gap never pages, even with no other traffic",
             [attempts("resumed", "0x120"), attempts("gap", "0x30 1x90")],
             [check(fast, "40m"), check(burn, "60m")]),
        case("quiet after a scrape outage: no bad resume before or after it",
             [attempts("resumed", "0+100x30 _x30 6000+100x60"), attempts("gap", "5x30 _x30 5x60")],
             [check(a, t) for a in (fast, burn, slow) for t in ("61m", "75m", "120m")]),
        case("quiet on a fresh Prometheus with old counters",
             [attempts("resumed", "0+100x120"), attempts("gap", "500x120")],
             [check(a, t) for a in (fast, burn, slow) for t in ("5m", "90m")]),
        case("failed resumes (no HTTP answer) burn the budget: 17 % failed pages",
             [attempts("resumed", "0+100x90"), attempts("failed", "0+20x90")],
             [check(fast, "60m", expected(fast, **SRV))]),
        case("breaks with nothing to resume are no resumes: they burn no budget",
             [attempts("resumed", "0+100x240"), attempts("not_resumable", "0+50x240")],
             [check(a, "180m") for a in (fast, burn, slow)]),
    ]


def gap_cases(alert: str, kind: str, other_kind: str) -> list[dict[str, Any]]:
    labels = {**SRV}
    if "mcp_resumption_gap_kind" in rules()[alert]["expr"].split("sum by")[1].split(")")[0]:
        labels["mcp_resumption_gap_kind"] = kind
    quiet_at = ("5m", "40m")
    return [
        case(f"{alert} fires on one {kind} gap and resolves",
             [gaps(kind, "0x10 1x30")],
             [check(alert, "9m"), check(alert, "13m", expected(alert, **labels)),
              check(alert, "30m")]),
        case(f"{alert} quiet: other kinds only",
             [gaps(kind, "0x40"), gaps(other_kind, "0+1x40")],
             [check(alert, t) for t in quiet_at]),
        case(f"{alert} quiet after a scrape outage: the gap before it is not news",
             [gaps(kind, "0x5 1x10 _x15 1x20")],
             [check(alert, "8m", expected(alert, **labels)), check(alert, "35m"),
              check(alert, "45m")]),
        case(f"{alert} quiet on a fresh Prometheus with old counters",
             [gaps(kind, "4x40", server=OLD)],
             [check(alert, t) for t in quiet_at]),
    ]


def share_cases() -> list[dict[str, Any]]:
    storm, rejected, unverifiable = ("McpResumptionReplayUnconfirmedStorm",
                                     "McpResumptionRejectedShareRising",
                                     "McpResumptionServerUnverifiable")  # fmt: skip
    cases = [
        case("replay_unconfirmed storm: 25 % of resumes unconfirmed",
             [attempts("resumed", "0+3x40"), attempts("gap", "0+1x40"),
              gaps("replay_unconfirmed", "0+1x40")],
             [check(storm, "30m", expected(storm, **SRV)), check(storm, "5m")]),
        case("replay_unconfirmed quiet: 10 %, and old counters elsewhere",
             [attempts("resumed", "0+9x40"), attempts("gap", "0+1x40"),
              gaps("replay_unconfirmed", "0+1x40"),
              attempts("gap", "300x40", server=OLD), gaps("replay_unconfirmed", "300x40", server=OLD)],
             [check(storm, "30m")]),
        case("replay_unconfirmed quiet after a scrape outage",
             [attempts("resumed", "0+9x20 _x20 400+9x20"), attempts("gap", "50x20 _x20 50x20"),
              gaps("replay_unconfirmed", "50x20 _x20 50x20")],
             [check(storm, t) for t in ("41m", "50m", "60m")]),
        case("rejected share rising: 33 % in the last hour, 5 % over the day",
             [attempts("resumed", "0+10x600"), attempts("rejected", "0x540 0+5x60")],
             [check(rejected, "600m", expected(rejected, **SRV)), check(rejected, "500m")]),
        case("rejected share steady at 17 %: not rising",
             [attempts("resumed", "0+10x600"), attempts("rejected", "0+2x600")],
             [check(rejected, "600m")]),
        case("refused resumes whose requests were lost are rejected: the share rises",
             [attempts("resumed", "0+10x600"), attempts("rejected", "0x540 0+5x60"),
              gaps("orphaned_request", "0x540 0+5x60")],
             [check(rejected, "600m", expected(rejected, **SRV))]),
        case("breaks with nothing to resume do not dilute the rejected share",
             [attempts("resumed", "0+10x600"), attempts("rejected", "0x540 0+5x60"),
              attempts("not_resumable", "0+100x600")],
             [check(rejected, "600m", expected(rejected, **SRV))]),
        case("rejected quiet after a scrape outage and with old counters",
             [attempts("resumed", "0+10x100 _x30 1300+10x60"),
              attempts("rejected", "40x100 _x30 40x60"),
              attempts("rejected", "900x190", server=OLD), attempts("resumed", "0+10x190", server=OLD)],
             [check(rejected, t) for t in ("131m", "150m", "190m")]),
        case("unverifiable server: info, and it resolves when the share drops",
             [attempts("unverifiable", "0+2x60 120x120"), attempts("resumed", "0+1x180")],
             [check(unverifiable, "40m", expected(unverifiable, **SRV)),
              check(unverifiable, "180m")]),
        case("unverifiable quiet: 30 %, after an outage, and with old counters",
             [attempts("unverifiable", "0+3x30 _x30 180+3x30"),
              attempts("resumed", "0+7x30 _x30 420+7x30"),
              attempts("unverifiable", "800x90", server=OLD),
              attempts("resumed", "0+1x90", server=OLD)],
             [check(unverifiable, t) for t in ("25m", "61m", "80m")]),
    ]
    return cases


def not_resumable_cases() -> list[dict[str, Any]]:
    alert = "McpResumptionBreaksNotResumable"
    return [
        case("the fleet moves onto servers without resumption: from 84m over half the "
             "breaks are not resumable, firing 15m later",
             [attempts("resumed", "0+2x60 120x60"), attempts("not_resumable", "0x60 0+3x60")],
             [check(alert, "80m"), check(alert, "95m"), check(alert, "110m", expected(alert, **SRV))]),
        case(f"{alert} quiet: 30 % not resumable, and 100 % of too few",
             [attempts("resumed", "0+7x120"), attempts("not_resumable", "0+3x120"),
              attempts("not_resumable", "0x10 1x30 2x30 3x50", server=OTHER)],
             [check(alert, t) for t in ("60m", "110m")]),
        case(f"{alert} quiet after a scrape outage: the breaks before it are not news",
             [attempts("resumed", "0+9x20 _x20 180+9x40"),
              attempts("not_resumable", "50x20 _x20 50x40")],
             [check(alert, t) for t in ("41m", "50m", "80m")]),
        case(f"{alert} quiet on a fresh Prometheus with old counters",
             [attempts("not_resumable", "800x90", server=OLD), attempts("resumed", "0+1x90", server=OLD)],
             [check(alert, t) for t in ("25m", "80m")]),
        case(f"{alert} a lost call at a break with no resume warns at once as a lost tool call",
             [attempts("not_resumable", "0x10 1x30"), gaps("orphaned_request", "0x10 1x30")],
             [check("McpResumptionLostToolCall", "13m", expected(
                 "McpResumptionLostToolCall", **SRV, mcp_resumption_gap_kind="orphaned_request")),
              check(alert, "30m")]),
    ]


def evicted_cases() -> list[dict[str, Any]]:
    alert = "McpResumptionStreamsEvicted"

    def evicted(values: str, instance: str = CLIENT) -> dict[str, str]:
        return {"series": f'mcp_client_resumption_evicted_streams_total{{job="{JOB}", '
                          f'instance="{instance}"}}', "values": values}  # fmt: skip

    return [
        case("evictions warn and resolve",
             [evicted("0x10 3x30")],
             [check(alert, "13m", expected(alert, job=JOB, instance=CLIENT)),
              check(alert, "30m")]),
        case("no evictions: quiet",
             [evicted("0x30")], [check(alert, "20m")]),
        case("evictions quiet after a scrape outage and with old counters",
             [evicted("0x5 2x5 _x15 2x20"), evicted("40x40", instance="client-b:9464")],
             [check(alert, "7m", expected(alert, job=JOB, instance=CLIENT)),
              check(alert, "30m"), check(alert, "40m")]),
    ]


def lost_subscriptions(values: str, relistened: str = "false", notifications: str = "tools",
                       server: dict = SERVER) -> dict[str, str]:
    """A lost-subscription series of one notifications filter: the plugin
    starts it at 0 when a subscription with that filter opens, before any
    loss of it is counted (``_x..`` before the 0: not opened yet)."""
    return series("mcp_client_resumption_lost_subscriptions_total", values, **server,
                  mcp_transport="streamable-http",
                  mcp_resumption_subscription_notifications=notifications,
                  mcp_resumption_subscription_relistened=relistened)  # fmt: skip


def reissues(risk: str, idempotent: str, values: str, server: dict = SERVER) -> dict[str, str]:
    return series("mcp_client_resumption_reissues_total", values, **server,
                  mcp_transport="streamable-http", mcp_resumption_reissue_idempotent=idempotent,
                  mcp_resumption_reissue_risk=risk)  # fmt: skip


def duplicate_runs(values: str, server: dict = SERVER) -> dict[str, str]:
    return series("mcp_client_resumption_duplicate_runs_total", values, **server,
                  mcp_transport="streamable-http")  # fmt: skip


def subscription_cases() -> list[dict[str, Any]]:
    alert, lost_call = "McpResumptionSubscriptionLost", "McpResumptionLostToolCall"

    def opened(notifications: str = "tools", values: str = "0x40", **kw: Any) -> dict[str, str]:
        """The re-listened series of a filter, at 0 from when a subscription
        with it opens (the plugin starts both; ``_`` before: not opened yet)."""
        return lost_subscriptions(values, relistened="true", notifications=notifications, **kw)

    no_gap = [gaps(kind, "0x40") for kind in ("orphaned_request", "drain_race")]
    return [
        case(f"{alert} fires on one lost subscription not re-listened, and resolves; "
             "the lost-call alert stays quiet",
             [opened(), *no_gap, lost_subscriptions("0x10 1x30")],
             [check(alert, "9m"), check(alert, "13m", expected(alert, **SRV)),
              check(lost_call, "13m"), check(alert, "30m")]),
        case(f"{alert} fires on the first loss of a filter opened later, after an old one",
             [opened(), lost_subscriptions("1x40"), opened("prompts,tools", "_x15 0x25"),
              lost_subscriptions("_x15 0x5 1x20", notifications="prompts,tools")],
             [check(alert, "15m"), check(alert, "23m", expected(alert, **SRV))]),
        case(f"{alert} quiet: re-listened losses only (the client listened again)",
             [lost_subscriptions("0x40"), lost_subscriptions("0x10 1x30", relistened="true")],
             [check(alert, t) for t in ("5m", "13m", "40m")]),
        case(f"{alert} quiet after a scrape outage: the loss before it is not news",
             [opened(), lost_subscriptions("0x5 1x5 _x15 1x15")],
             [check(alert, "8m", expected(alert, **SRV)), check(alert, "35m"),
              check(alert, "40m")]),
        case(f"{alert} quiet on a fresh Prometheus with old counters",
             [opened(server=OLD), lost_subscriptions("3x40", server=OLD)],
             [check(alert, t) for t in ("5m", "40m")]),
    ]


def count_cases(alert: str, counted: Any, other: list[dict[str, str]]) -> list[dict[str, Any]]:
    """An alert on any increase of one counter: ``counted(values, server=...)``
    is its series, ``other`` series that must not make it fire."""
    quiet_at = ("5m", "40m")
    return [
        case(f"{alert} fires on one count and resolves",
             [counted("0x10 1x30"), *other],
             [check(alert, "9m"), check(alert, "13m", expected(alert, **SRV)),
              check(alert, "30m")]),
        case(f"{alert} quiet: nothing counted on it",
             [counted("0x40"), *other], [check(alert, t) for t in quiet_at]),
        case(f"{alert} quiet after a scrape outage: the count before it is not news",
             [counted("0x5 1x10 _x15 1x20")],
             [check(alert, "8m", expected(alert, **SRV)), check(alert, "35m"),
              check(alert, "45m")]),
        case(f"{alert} quiet on a fresh Prometheus with old counters",
             [counted("4x40", server=OLD)], [check(alert, t) for t in quiet_at]),
    ]


def tasks(fate: str, values: str, server: dict = SERVER, tool: str = "render",
          **labels: str) -> dict[str, str]:
    """The task-fate series of one tool: the plugin starts every fate of a
    tool at 0 when the client is first handed a task of it, or sends a call
    that could become one (``_x..`` before the 0: not seen yet)."""
    return series("mcp_client_resumption_tasks_total", values, **server,
                  mcp_transport="streamable-http", gen_ai_tool_name=tool,
                  mcp_resumption_task_fate=fate, **labels)  # fmt: skip


def task_cases() -> list[dict[str, Any]]:
    lost, abandoned, lost_call = ("McpResumptionTaskLost", "McpResumptionTaskAbandoned",
                                  "McpResumptionLostToolCall")  # fmt: skip
    clean = [tasks(fate, "0+1x40") for fate in ("completed", "failed", "cancelled")]
    # a cancel acknowledged and then completed: the work ran, nothing was lost
    ignored = tasks("completed", "0+1x40", mcp_resumption_task_cancel_ignored="true")
    no_gap = [gaps(kind, "0x40") for kind in ("orphaned_request", "drain_race")]
    cases = []
    for fate in ("lost", "expired", "handle_lost"):
        labels = {**SRV, "mcp_resumption_task_fate": fate}
        cases.append(case(
            f"{lost} fires on one {fate} task and resolves; the lost-call alert stays quiet",
            [*clean, *no_gap, tasks(fate, "0x10 1x30")],
            [check(lost, "9m"), check(lost, "13m", expected(lost, **labels)),
             check(lost_call, "13m"), check(lost, "30m")]))
    cases += [
        case(f"{lost} fires on the proxy's upstream leg too (its series carry the leg)",
             [tasks("lost", "0x10 1x30", mcp_resumption_leg="proxy_server")],
             [check(lost, "13m", expected(lost, **SRV, mcp_resumption_task_fate="lost"))]),
        case(f"{lost} fires on the first loss of a tool first seen later, after an old one",
             [tasks("lost", "1x40"), tasks("lost", "_x15 0x5 1x20", tool="export")],
             [check(lost, "15m"),
              check(lost, "23m", expected(lost, **SRV, mcp_resumption_task_fate="lost"))]),
        case(f"{lost} quiet: clean fates only (completed, failed, cancelled, a cancel not "
             "honoured), and abandoned tasks",
             [*clean, ignored, tasks("lost", "0x40"), tasks("abandoned", "0+1x40")],
             [check(lost, t) for t in ("5m", "13m", "40m")]),
        case(f"{lost} quiet after a scrape outage: the loss before it is not news",
             [tasks("lost", "0x5 1x10 _x15 1x20")],
             [check(lost, "8m", expected(lost, **SRV, mcp_resumption_task_fate="lost")),
              check(lost, "35m"), check(lost, "45m")]),
        case(f"{lost} quiet on a fresh Prometheus with old counters",
             [tasks(fate, "4x40", server=OLD) for fate in ("lost", "expired", "handle_lost")],
             [check(lost, t) for t in ("5m", "40m")]),
    ]
    cases += count_cases(
        abandoned, lambda values, server=SERVER: tasks("abandoned", values, server),
        [*clean, tasks("lost", "0+1x40"), tasks("handle_lost", "0+1x40")],
    )
    return cases


def event_gaps(kind: str, values: str, server: dict = SERVER, name: str = "ticket.created",
               **labels: str) -> dict[str, str]:
    """The event-gap series of one event type: the plugin starts every kind
    at 0 when a subscription to the type is first seen."""
    return series("mcp_client_resumption_event_gaps_total", values, **server,
                  mcp_events_delivery="push", mcp_events_name=name,
                  mcp_events_gap_kind=kind, **labels)  # fmt: skip


def event_cases() -> list[dict[str, Any]]:
    lost, degraded = "McpResumptionEventsLost", "McpResumptionEventStreamDegraded"
    quiet = [event_gaps(kind, "0+1x40") for kind in (
        "cursor_rewound", "cursor_unknown", "terminated", "delivery_failing", "event_id_reused")]
    cases = []
    for kind in ("truncated", "cursor_lost", "not_reopened", "lapsed"):
        labels = {**SRV, "mcp_events_gap_kind": kind, "mcp_events_name": "ticket.created"}
        cases.append(case(
            f"{lost} fires on one {kind} and resolves; the degraded alert stays quiet",
            [*quiet, event_gaps(kind, "0x10 1x30")],
            [check(lost, "9m"), check(lost, "13m", expected(lost, **labels)),
             check(degraded, "13m"), check(lost, "30m")]))
    for kind in ("stream_silent", "unreplayable_window"):
        labels = {**SRV, "mcp_events_gap_kind": kind, "mcp_events_name": "ticket.created"}
        cases.append(case(
            f"{degraded} fires on one {kind} and resolves; the loss alert stays quiet",
            [*quiet, event_gaps(kind, "0x10 1x30")],
            [check(degraded, "9m"), check(degraded, "13m", expected(degraded, **labels)),
             check(lost, "13m"), check(degraded, "30m")]))
    cases += [
        case(f"{lost} quiet: duplicates, unknown cursors, terminated subscriptions",
             quiet, [check(lost, t) for t in ("5m", "13m", "40m")]),
        case(f"{lost} quiet after a scrape outage: the loss before it is not news",
             [event_gaps("truncated", "0x5 1x10 _x15 1x20")],
             [check(lost, "8m", expected(lost, **SRV, mcp_events_gap_kind="truncated",
                                         mcp_events_name="ticket.created")),
              check(lost, "35m"), check(lost, "45m")]),
        case(f"{lost} quiet on a fresh Prometheus with old counters",
             [event_gaps(kind, "4x40", server=OLD) for kind in ("truncated", "lapsed")],
             [check(lost, t) for t in ("5m", "40m")]),
        case(f"{degraded} quiet: losses and clean kinds only",
             [*quiet, event_gaps("truncated", "0+1x40")],
             [check(degraded, t) for t in ("5m", "13m", "40m")]),
        case(f"{degraded} quiet after a scrape outage: the silence before it is not news",
             [event_gaps("stream_silent", "0x5 1x10 _x15 1x20")],
             [check(degraded, "8m", expected(degraded, **SRV, mcp_events_gap_kind="stream_silent",
                                             mcp_events_name="ticket.created")),
              check(degraded, "35m"), check(degraded, "45m")]),
        case(f"{degraded} quiet on a fresh Prometheus with old counters",
             [event_gaps("stream_silent", "4x40", server=OLD)],
             [check(degraded, t) for t in ("5m", "40m")]),
    ]
    return cases


def build() -> dict[str, Any]:
    tests = burn_cases()
    tests += gap_cases("McpResumptionLostToolCall", "orphaned_request", "session_changed")
    tests += gap_cases("McpResumptionSessionChanged", "session_changed", "id_regression")
    tests += gap_cases("McpResumptionEventIdRegression", "id_regression", "session_changed")
    tests += gap_cases("McpResumptionReplayInconsistent", "id_reused", "session_changed")
    tests += share_cases()
    tests += not_resumable_cases()
    tests += evicted_cases()
    tests += subscription_cases()
    tests += count_cases(
        "McpResumptionReissueMayRunTwice",
        lambda values, server=SERVER: reissues("may_run_twice", "false", values, server),
        # safe re-issues: declared idempotent, or under 2026-07-28, which cancels
        [reissues("none", "true", "0+1x40"), reissues("none", "false", "0+1x40"),
         reissues("may_run_twice", "true", "0x40")],
    )
    tests += count_cases(
        "McpResumptionCallRanTwice", duplicate_runs,
        [reissues("may_run_twice", "unknown", "0+1x40")],
    )
    tests += task_cases()
    tests += event_cases()
    return {"rule_files": ["alerts.yaml"], "evaluation_interval": "1m", "tests": tests}


def server_cases() -> list[dict[str, Any]]:
    srv_instance = "server-a:9464"

    def requests(outcome: str, values: str, server: dict = SERVER, **labels: str) -> dict[str, str]:
        merged = {"job": "mcp-server", "instance": srv_instance, **server,
                  "mcp_transport": "streamable-http", "mcp_resumption_outcome": outcome, **labels}
        inner = ", ".join(f'{k}="{v}"' for k, v in merged.items())
        return {"series": f"mcp_server_resumption_requests_total{{{inner}}}", "values": values}

    labels = {"job": "mcp-server", **SERVER}
    tests = []
    for alert, kind, other in (("McpServerResumptionUnknownCursor", "unknown_cursor", "other_session"),
                               ("McpServerResumptionOtherSession", "other_session", "unknown_cursor")):
        tests += [
            case(f"{alert} fires on one {kind} answered 200, and resolves",
                 [requests(kind, "0x10 1x30"), requests("replayed", "0+5x40")],
                 [check(alert, "9m"), check(alert, "13m", expected(alert, **labels)), check(alert, "30m")]),
            case(f"{alert} fires on one {kind} refused by the guard",
                 [requests("rejected_by_guard", "0x10 1x30", mcp_resumption_gap_kind=kind)],
                 [check(alert, "13m", expected(alert, **labels))]),
            case(f"{alert} quiet: other outcomes only (the guard refusing the other kind, no_store, unknown_session)",
                 [requests(kind, "0x40"), requests(other, "0+1x40"), requests("unknown_session", "0+1x40"),
                  requests("rejected_by_guard", "0+1x40", mcp_resumption_gap_kind="no_store"),
                  requests("rejected_by_guard", "0+1x40", mcp_resumption_gap_kind=other)],
                 [check(alert, t) for t in ("5m", "40m")]),
            case(f"{alert} quiet after a scrape outage: the request before it is not news",
                 [requests(kind, "0x5 1x10 _x15 1x20")],
                 [check(alert, "8m", expected(alert, **labels)), check(alert, "35m"), check(alert, "45m")]),
            case(f"{alert} quiet on a fresh Prometheus with old counters",
                 [requests(kind, "4x40", server=OLD)],
                 [check(alert, t) for t in ("5m", "40m")]),
        ]
    tests += delivery_cases(srv_instance)
    return tests


def delivery_cases(srv_instance: str) -> list[dict[str, Any]]:
    def server_series(metric: str, values: str, server: dict = SERVER, **labels: str) -> dict[str, str]:
        merged = {"job": "mcp-server", "instance": srv_instance, **server,
                  "mcp_transport": "streamable-http", **labels}
        inner = ", ".join(f'{k}="{v}"' for k, v in merged.items())
        return {"series": f"{metric}{{{inner}}}", "values": values}

    def fates(fate: str, values: str, server: dict = SERVER) -> dict[str, str]:
        return server_series("mcp_server_resumption_deliveries_total", values, server,
                             mcp_resumption_delivery_fate=fate)

    def wasted(values: str, hint: str = "none", server: dict = SERVER) -> dict[str, str]:
        return server_series("mcp_server_resumption_work_for_nobody_total", values, server,
                             gen_ai_tool_name="book_flight", mcp_protocol_version="2025-11-25",
                             mcp_resumption_tool_hint=hint)

    labels = {"job": "mcp-server", **SERVER}
    undelivered, nobody = "McpServerAnswerUndelivered", "McpServerWorkForNobody"
    tool = {**labels, "gen_ai_tool_name": "book_flight"}
    quiet_at = ("5m", "40m")
    return [
        case(f"{undelivered} pages on one answer that reached nobody, and resolves",
             [fates("undelivered", "0x10 1x30"), fates("delivered", "0+5x40")],
             [check(undelivered, "9m"), check(undelivered, "13m", expected(undelivered, **labels)),
              check(undelivered, "30m")]),
        case(f"{undelivered} quiet: delivered, stored, replayed and cancelled answers only",
             [fates("undelivered", "0x40"), fates("delivered", "0+5x40"), fates("stored", "0+1x40"),
              fates("replayed", "0+1x40"), fates("cancelled", "0+1x40")],
             [check(undelivered, t) for t in quiet_at]),
        case(f"{undelivered} quiet after a scrape outage: the answer before it is not news",
             [fates("undelivered", "0x5 1x10 _x15 1x20")],
             [check(undelivered, "8m", expected(undelivered, **labels)), check(undelivered, "35m"),
              check(undelivered, "45m")]),
        case(f"{undelivered} quiet on a fresh Prometheus with old counters",
             [fates("undelivered", "4x40", server=OLD)], [check(undelivered, t) for t in quiet_at]),
        case(f"{nobody} warns on one call run for nobody, naming the tool, and resolves",
             [wasted("0x10 1x30")],
             [check(nobody, "9m"), check(nobody, "13m", expected(nobody, **tool)), check(nobody, "30m")]),
        case(f"{nobody} quiet: the tools that ran for nobody declared a second run harmless",
             [wasted("0x40"), wasted("0+1x40", hint="idempotent"), wasted("0+1x40", hint="read_only")],
             [check(nobody, t) for t in quiet_at]),
        case(f"{nobody} quiet on a fresh Prometheus with old counters",
             [wasted("4x40", server=OLD)], [check(nobody, t) for t in quiet_at]),
    ]


HEADER = """\
# promtool unit tests for alerts.yaml, written by dashboards/alert_tests.py
# (edit that, then run it). Every alert: firing, quiet, quiet after a scrape
# outage, quiet on a fresh Prometheus with old counters.
# Run: bash dashboards/check.sh  (or: promtool test rules dashboards/alerts.test.yaml)
"""
SERVER_HEADER = HEADER.replace("alerts.yaml", "alerts-server.yaml").replace(
    "alerts.test.yaml", "alerts-server.test.yaml"
)


def main(argv: list[str]) -> int:
    outputs = (
        (OUT, HEADER, build()),
        (SERVER_OUT, SERVER_HEADER, {"rule_files": ["alerts-server.yaml"],
                                     "evaluation_interval": "1m", "tests": server_cases()}),
    )
    for out, header, document in outputs:
        text = header + yaml.safe_dump(document, sort_keys=False, width=200, allow_unicode=True)
        if "--check" in argv:
            if out.read_text(encoding="utf-8") != text:
                print(f"{out.name} is not what alert_tests.py writes: run python3 {__file__}")
                return 1
            continue
        out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
