"""Static checks of the Grafana dashboard, the Prometheus alert rules and the runbook.

The promtool checks need ``promtool`` on PATH (Debian: ``apt-get install prometheus``);
without it they fail rather than skip, because CI installs it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = REPO / "dashboards"
ALERTS = DASHBOARDS / "alerts.yaml"
ALERT_TESTS = DASHBOARDS / "alerts.test.yaml"
RUNBOOK = DASHBOARDS / "RUNBOOK.md"
RUNBOOK_URL_PREFIX = (
    "https://github.com/mcp-resumption/opentelemetry-instrumentation-mcp-resumption"
    "/blob/main/dashboards/RUNBOOK.md#"
)


def _load_dashboard_queries() -> Any:
    # Loaded by path so that it works whether or not tests/ is a package.
    name = "mcp_resumption_dashboard_queries"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).with_name("dashboard_queries.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


dashboard_queries = _load_dashboard_queries()

# --- the metrics the instrumentation emits (Prometheus names) ----------------

# Every metric name a dashboard query or an alert may use, histograms without
# their _bucket/_sum/_count suffix.
EMITTED_METRICS: tuple[str, ...] = (
    "mcp_client_resumption_attempts_total",
    "mcp_client_resumption_gaps_total",
    "mcp_client_resumption_duration_seconds",
    "mcp_client_resumption_replayed_events",
    "mcp_client_stream_events_total",
    "mcp_client_resumption_evicted_streams_total",
    "mcp_client_resumption_broken_requests_total",
    "mcp_client_resumption_lost_subscriptions_total",
    "mcp_client_resumption_reissues_total",
    "mcp_client_resumption_duplicate_runs_total",
    "mcp_client_operation_duration_seconds",
    # tasks: one fate per task handed to the client
    "mcp_client_resumption_tasks_total",
    "mcp_client_resumption_task_duration_seconds",
    "mcp_client_resumption_task_polls",
    "mcp_client_resumption_task_unroutable_total",
    # events: each break of a subscription's thread of cursors
    "mcp_client_resumption_event_gaps_total",
    "mcp_client_resumption_event_duplicates_total",
    "mcp_client_resumption_event_streams_total",
)
HISTOGRAMS = frozenset(
    {"mcp_client_resumption_duration_seconds", "mcp_client_resumption_replayed_events",
     "mcp_client_operation_duration_seconds", "mcp_client_resumption_task_duration_seconds",
     "mcp_client_resumption_task_polls"}
)  # fmt: skip
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
SCRAPE_LABELS = frozenset({"job", "instance"})
# mcp-resumption-proxy adds the leg to every metric point it exports
# (proxy/src/mcp_resumption_proxy/legs.py).
PROXY_LABELS = frozenset({"mcp_resumption_leg"})

OUTCOMES = frozenset(
    {"resumed", "caught_up", "gap", "reinitialized", "rejected", "unverifiable",
     "not_resumable", "failed"}
)  # fmt: skip
FATES = frozenset({"answered", "reissued", "lost"})
TASK_FATES = frozenset(
    {"completed", "failed", "cancelled", "lost", "expired", "abandoned", "handle_lost"}
)
GAP_KINDS = frozenset(
    {
        "session_changed",
        "id_regression",
        "replay_unconfirmed",
        "id_reused",
        "drain_race",
        "replay_contract_violation",
        "orphaned_request",
        "foreign_replay",
    }
)
TRANSPORTS = frozenset({"sse", "streamable-http"})
LABEL_VALUES: dict[str, frozenset[str]] = {
    "mcp_resumption_outcome": OUTCOMES,
    "mcp_resumption_gap_kind": GAP_KINDS,
    "mcp_transport": TRANSPORTS,
    "mcp_resumption_previous_transport": TRANSPORTS | {"none"},
    "mcp_resumption_request_fate": FATES,
    "mcp_resumption_subscription_relistened": frozenset({"true", "false"}),
    "mcp_resumption_reissue_idempotent": frozenset({"true", "false", "unknown"}),
    "mcp_resumption_reissue_risk": frozenset({"none", "may_run_twice"}),
    "mcp_resumption_task_fate": TASK_FATES,
    "mcp_resumption_task_cancel_ignored": frozenset({"true"}),
}
TASK_LABELS = frozenset(
    {"mcp_resumption_task_fate", "mcp_transport", "server_address", "server_port",
     "gen_ai_tool_name"}
)  # fmt: skip
METRIC_LABELS: dict[str, frozenset[str]] = {
    "mcp_client_resumption_attempts_total": frozenset(
        {
            "mcp_resumption_outcome",
            "mcp_transport",
            "mcp_resumption_previous_transport",
            "server_address",
            "server_port",
        }
    ),
    "mcp_client_resumption_gaps_total": frozenset(
        {"mcp_resumption_gap_kind", "mcp_transport", "server_address", "server_port"}
    ),
    "mcp_client_resumption_duration_seconds": frozenset(
        {"mcp_resumption_outcome", "mcp_transport", "server_address", "server_port"}
    ),
    "mcp_client_resumption_replayed_events": frozenset({"mcp_resumption_outcome", "mcp_transport"}),
    "mcp_client_stream_events_total": frozenset({"mcp_transport", "server_address", "server_port"}),
    "mcp_client_resumption_evicted_streams_total": frozenset(),
    "mcp_client_resumption_broken_requests_total": frozenset(
        {"mcp_resumption_request_fate", "mcp_transport", "server_address", "server_port"}
    ),
    "mcp_client_resumption_lost_subscriptions_total": frozenset(
        {"mcp_resumption_subscription_notifications", "mcp_resumption_subscription_relistened",
         "mcp_transport", "server_address", "server_port"}
    ),
    "mcp_client_resumption_reissues_total": frozenset(
        {"mcp_resumption_reissue_idempotent", "mcp_resumption_reissue_risk", "mcp_transport",
         "server_address", "server_port"}
    ),
    "mcp_client_resumption_duplicate_runs_total": frozenset(
        {"mcp_transport", "server_address", "server_port"}
    ),
    # the MCP semantic conventions' names
    "mcp_client_operation_duration_seconds": frozenset(
        {"mcp_method_name", "gen_ai_tool_name", "error_type", "mcp_protocol_version",
         "server_address", "server_port"}
    ),
    "mcp_client_resumption_tasks_total": TASK_LABELS | {"mcp_resumption_task_cancel_ignored"},
    "mcp_client_resumption_task_duration_seconds": TASK_LABELS,
    "mcp_client_resumption_task_polls": TASK_LABELS,
    "mcp_client_resumption_task_unroutable_total": frozenset(
        {"mcp_transport", "server_address", "server_port"}
    ),
    "mcp_client_resumption_event_gaps_total": frozenset(
        {"mcp_events_gap_kind", "mcp_events_delivery", "mcp_events_name", "server_address",
         "server_port"}
    ),
    "mcp_client_resumption_event_duplicates_total": frozenset(
        {"mcp_events_delivery", "mcp_events_name", "server_address", "server_port"}
    ),
    "mcp_client_resumption_event_streams_total": frozenset(
        {"mcp_events_stream_state", "mcp_events_delivery", "mcp_events_name", "server_address",
         "server_port"}
    ),
}

# --- a small PromQL scanner: enough to find selectors and grouping labels ----

PROMQL_FUNCTIONS = frozenset(
    {
        # aggregation operators
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile",
        # functions
        "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max",
        "clamp_min", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta",
        "deriv", "exp", "floor", "histogram_quantile", "histogram_count", "histogram_sum",
        "histogram_fraction", "holt_winters", "hour", "idelta", "increase", "irate",
        "label_join", "label_replace", "ln", "log2", "log10", "minute", "month",
        "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc",
        "sqrt", "time", "timestamp", "vector", "year", "avg_over_time", "min_over_time",
        "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time",
        "stddev_over_time", "stdvar_over_time", "last_over_time", "present_over_time",
    }
)  # fmt: skip
GROUPING_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
OTHER_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"})
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass
class Selector:
    name: str
    matchers: list[tuple[str, str, str]]
    range: str | None


@dataclass
class ParsedExpr:
    selectors: list[Selector] = field(default_factory=list)
    grouping: list[list[str]] = field(default_factory=list)
    # the labels of `without (...)`: dropped, so every other one is kept
    without: list[list[str]] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)


def _skip_string(expr: str, i: int) -> int:
    quote = expr[i]
    i += 1
    while i < len(expr) and expr[i] != quote:
        i += 2 if expr[i] == "\\" else 1
    return i + 1


def _read_until(expr: str, i: int, closing: str) -> tuple[str, int]:
    """expr[i] is an opening bracket; return its content and the index after the closing one."""
    start = i + 1
    i = start
    while i < len(expr) and expr[i] != closing:
        i = _skip_string(expr, i) if expr[i] in "\"'`" else i + 1
    assert i < len(expr), f"unbalanced {closing!r} in: {expr}"
    return expr[start:i], i + 1


def _skip_spaces(expr: str, i: int) -> int:
    while i < len(expr) and expr[i].isspace():
        i += 1
    return i


def parse_promql(expr: str) -> ParsedExpr:
    parsed = ParsedExpr()
    i = 0
    while i < len(expr):
        char = expr[i]
        if char in "\"'`":
            i = _skip_string(expr, i)
            continue
        if char == "[":
            _, i = _read_until(expr, i, "]")
            continue
        if char == "{":
            raise AssertionError(f"selector without a metric name in: {expr}")
        match = _IDENT.match(expr, i)
        if match is None or (i > 0 and (expr[i - 1].isalnum() or expr[i - 1] in "$._")):
            i += 1
            continue
        ident = match.group()
        i = _skip_spaces(expr, match.end())
        following = expr[i] if i < len(expr) else ""
        if ident in GROUPING_KEYWORDS and following == "(":
            labels, i = _read_until(expr, i, ")")
            named = [lab.strip() for lab in labels.split(",") if lab.strip()]
            (parsed.without if ident == "without" else parsed.grouping).append(named)
        elif ident in GROUPING_KEYWORDS or ident in OTHER_KEYWORDS:
            pass
        elif following == "(" or (
            ident in PROMQL_FUNCTIONS and re.match(r"(by|without)\b", expr[i:])
        ):
            # a function call, or an aggregation written as `sum by (labels) (expr)`
            parsed.functions.append(ident)
        else:
            matchers: list[tuple[str, str, str]] = []
            if following == "{":
                body, i = _read_until(expr, i, "}")
                position = 0
                while position < len(body.strip()):
                    matcher = _MATCHER.match(body, position)
                    assert matcher is not None, f"cannot read matchers {body!r} in: {expr}"
                    matchers.append(matcher.groups())
                    position = matcher.end()
                i = _skip_spaces(expr, i)
            selector_range = None
            if i < len(expr) and expr[i] == "[":
                selector_range, i = _read_until(expr, i, "]")
            parsed.selectors.append(Selector(ident, matchers, selector_range))
    return parsed


def base_metric(name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return name[: -len(suffix)]
    return name


def check_expr_metrics(expr: str, where: str) -> ParsedExpr:
    """Every selector names an emitted metric, with known labels and label values."""
    parsed = parse_promql(expr)
    assert parsed.selectors, f"{where}: no metric in {expr}"
    unknown_functions = set(parsed.functions) - PROMQL_FUNCTIONS
    assert not unknown_functions, f"{where}: unknown PromQL functions {unknown_functions}"
    available: set[str] = set(SCRAPE_LABELS)
    for selector in parsed.selectors:
        base = base_metric(selector.name)
        assert base in EMITTED_METRICS, (
            f"{where}: {selector.name} is not a metric the instrumentation emits "
            f"({', '.join(EMITTED_METRICS)})"
        )
        assert base not in HISTOGRAMS or selector.name != base, (
            f"{where}: histogram {base} needs a _bucket/_sum/_count suffix"
        )
        labels = METRIC_LABELS[base] | SCRAPE_LABELS | PROXY_LABELS
        if selector.name.endswith("_bucket"):
            labels = labels | {"le"}
        available |= labels
        for label, operator, value in selector.matchers:
            assert label in labels, f"{where}: {selector.name} has no label {label}"
            if label in LABEL_VALUES and operator in ("=", "=~"):
                values = value.split("|") if operator == "=~" else [value]
                unknown = set(values) - LABEL_VALUES[label]
                assert not unknown, f"{where}: {label} never takes the values {unknown}"
    for grouping in parsed.grouping + parsed.without:
        unknown = set(grouping) - available
        assert not unknown, f"{where}: grouping by labels no metric here has: {unknown}"
    return parsed


# --- the dashboard -------------------------------------------------------------

DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dashboard_queries.load_dashboard()


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return dashboard_queries.iter_panels(dashboard)


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {var["name"]: var for var in dashboard["templating"]["list"]}


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "mcp-resumption"
    assert 39 <= dashboard["schemaVersion"] <= 41
    assert dashboard["title"]
    # null id: importable and provisionable into any Grafana
    assert dashboard.get("id") is None


def test_dashboard_variables(dashboard: dict[str, Any]) -> None:
    variables = _variables(dashboard)
    datasource = variables["datasource"]
    assert datasource["type"] == "datasource"
    assert datasource["query"] == "prometheus"
    for name in ("job", "instance"):
        var = variables[name]
        assert var["type"] == "query", name
        assert var["multi"] is True, name
        assert var["includeAll"] is True, name
        assert var["datasource"] == DATASOURCE_REF, name
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        assert query.startswith("label_values(mcp_client_resumption_attempts_total"), name
        assert query.rstrip().endswith(f", {name})"), name
        if var.get("definition"):
            assert var["definition"] == query, name


def test_every_panel_and_target_uses_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    panels = _panels(dashboard)
    assert panels
    for panel in panels:
        if panel["type"] in ("row", "alertlist"):  # an alert list queries Grafana itself
            continue
        title = panel.get("title")
        assert panel.get("datasource") == DATASOURCE_REF, title
        assert panel.get("targets"), f"{title}: no targets"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{title}: duplicate refId"
        for target in panel["targets"]:
            assert target.get("datasource") == DATASOURCE_REF, title


def test_every_panel_says_what_a_bad_value_means(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        if panel["type"] != "row":
            assert len(panel.get("description", "")) >= 80, panel.get("title")
            assert panel.get("title"), panel["id"]


def test_panel_ids_are_unique(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in _panels(dashboard)]
    assert all(isinstance(panel_id, int) for panel_id in ids)
    assert len(ids) == len(set(ids)), ids


def test_grid_positions_are_valid_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        title = panel.get("title")
        x, y, w, h = grid["x"], grid["y"], grid["w"], grid["h"]
        assert all(isinstance(value, int) for value in (x, y, w, h)), title
        assert 1 <= w <= 24 and x >= 0 and x + w <= 24, title
        assert h > 0 and y >= 0, title
        for column in range(x, x + w):
            for row in range(y, y + h):
                assert (column, row) not in cells, f"{title} overlaps {cells[(column, row)]}"
                cells[(column, row)] = title


def test_dashboard_queries_name_only_emitted_metrics(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            check_expr_metrics(target["expr"], panel["title"])


def test_dashboard_queries_filter_job_and_instance_and_use_grafana_ranges(
    dashboard: dict[str, Any],
) -> None:
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            expr, title = target["expr"], panel["title"]
            for selector in parse_promql(expr).selectors:
                assert ("job", "=~", "$job") in selector.matchers, f"{title}: {expr}"
                assert ("instance", "=~", "$instance") in selector.matchers, f"{title}: {expr}"
                # every emitted metric is a counter or a histogram: only rates make
                # sense; fixed windows only for the burn rates of the alert rules
                assert selector.range in ("$__rate_interval", "$__range") or (
                    title == "Burn rate" and selector.range in ("1h", "6h")
                ), f"{title}: {expr}"
            calls = re.findall(r"\b(rate|increase)\(\s*[\w:]+\{[^}]*\}\[([^\]]+)\]\s*\)", expr)
            assert len(calls) == len(re.findall(r"\b(?:rate|increase)\(", expr)), expr
            for function, window in calls:
                if function == "rate":
                    assert window == "$__rate_interval", f"{title}: {expr}"


def test_dashboard_has_the_agreed_panels(dashboard: dict[str, Any]) -> None:
    exprs = [expr for _, expr in dashboard_queries.panel_queries(dashboard, {})]
    joined = "\n".join(exprs)

    def some(pattern: str) -> bool:
        return any(re.search(pattern, expr, re.S) for expr in exprs)

    assert some(r"sum by \(mcp_resumption_gap_kind\) \(rate\(mcp_client_resumption_gaps_total")
    assert some(r"sum by \(mcp_resumption_outcome\) \(rate\(mcp_client_resumption_attempts_total")
    assert some(r'mcp_resumption_outcome=~"resumed\|caught_up".*/')
    assert some(r'mcp_resumption_outcome="unverifiable".*/')
    for quantile in ("0.5", "0.95", "0.99"):
        assert some(
            rf"histogram_quantile\({quantile}, .*mcp_client_resumption_duration_seconds_bucket"
        )
    assert "mcp_client_resumption_replayed_events_sum" in joined
    assert some(
        r"topk\(\d+, sum by \(server_address, server_port\) \(.*mcp_client_resumption_gaps_total"
    )
    assert some(
        r'mcp_transport="streamable-http", mcp_resumption_previous_transport="sse"'
        r'.* or .*mcp_transport="sse", mcp_resumption_previous_transport="streamable-http"'
    )
    assert some(r"rate\(mcp_client_stream_events_total")
    assert some(
        r"sum by \(mcp_resumption_request_fate\) \("
        r"rate\(mcp_client_resumption_broken_requests_total"
    )
    # lost subscriptions: increase() and rate(), as the other counters (each
    # filter's series starts at 0 when a subscription with it opens), per
    # server, by the filter and whether the client re-listened
    subscriptions = [e for e in exprs if "mcp_client_resumption_lost_subscriptions_total" in e]
    assert len(subscriptions) == 3 and all(
        re.search(r"\b(rate|increase)\(mcp_client_resumption_lost_subscriptions_total", e)
        and "max_over_time" not in e
        for e in subscriptions
    ), subscriptions
    assert some(
        r"sum by \(server_address, server_port, mcp_resumption_subscription_notifications, "
        r"mcp_resumption_subscription_relistened\) \(increase\("
        r"mcp_client_resumption_lost_subscriptions_total\{[^}]*\}\[[^\]]+\]\)\) > 0"
    )
    assert some(
        r"sum by \(mcp_resumption_subscription_notifications, "
        r"mcp_resumption_subscription_relistened\) \(rate\("
        r"mcp_client_resumption_lost_subscriptions_total\{[^}]*\}\[[^\]]+\]\)\)"
    )
    # re-issues that may run twice, per server and by declaration; and the ones by risk
    assert some(
        r"sum by \(server_address, server_port, mcp_resumption_reissue_idempotent\) \("
        r'increase\(mcp_client_resumption_reissues_total\{[^}]*'
        r'mcp_resumption_reissue_risk="may_run_twice"\}'
    )
    assert some(
        r"sum by \(mcp_resumption_reissue_idempotent, mcp_resumption_reissue_risk\) \("
        r"rate\(mcp_client_resumption_reissues_total"
    )
    assert some(r"increase\(mcp_client_resumption_duplicate_runs_total")
    # the Events extension: losses, degraded streams, reopens proven,
    # duplicates (increase()), gaps per server, type and kind, streams by state
    assert some(
        r'increase\(mcp_client_resumption_event_gaps_total\{[^}]*'
        r'mcp_events_gap_kind=~"truncated\|cursor_lost\|not_reopened\|lapsed"\}'
    )
    assert some(
        r'increase\(mcp_client_resumption_event_gaps_total\{[^}]*'
        r'mcp_events_gap_kind=~"stream_silent\|unreplayable_window"\}'
    )
    assert some(
        r'increase\(mcp_client_resumption_event_streams_total\{[^}]*'
        r'mcp_events_stream_state="reopened"\}'
    )
    assert some(r"increase\(mcp_client_resumption_event_duplicates_total")
    assert some(
        r"sum by \(server_address, server_port, mcp_events_name, mcp_events_gap_kind\) \("
        r"increase\(mcp_client_resumption_event_gaps_total\{[^}]*\}\[[^\]]+\]\)\) > 0"
    )
    assert some(
        r"sum by \(mcp_events_stream_state\) \(rate\(mcp_client_resumption_event_streams_total"
    )
    # the conventions' operation duration: quantiles, p95 per method and server,
    # and the share of operations that ended in an error, from cumulative values
    for quantile in ("0.5", "0.95", "0.99"):
        assert some(
            rf"histogram_quantile\({quantile}, sum by \(le\) \(max_over_time\("
            r"mcp_client_operation_duration_seconds_bucket"
        )
    assert some(
        r"histogram_quantile\(0.95, sum by \(le, mcp_method_name, server_address, server_port\)"
    )
    assert some(
        r'mcp_client_operation_duration_seconds_count\{[^}]*error_type!=""\}.* / sum by '
        r"\(mcp_method_name, server_address, server_port\)"
    )
    # mcp-resumption-proxy's losses split by the leg they happened on
    assert some(
        r"sum by \(mcp_resumption_leg, mcp_resumption_gap_kind\) \(increase\("
        r'mcp_client_resumption_gaps_total\{[^}]*mcp_resumption_leg=~"\.\+"\}'
    )
    assert some(
        r"sum by \(mcp_resumption_leg, mcp_resumption_request_fate\) \(rate\("
        r'mcp_client_resumption_broken_requests_total\{[^}]*mcp_resumption_leg=~"\.\+"\}'
    )
    # tasks: the losses, fates per server and tool, the losses per second by
    # fate, and each task's life by fate from cumulative buckets
    losses = r'mcp_resumption_task_fate=~"lost\|expired\|handle_lost"'
    assert some(rf"sum\(increase\(mcp_client_resumption_tasks_total\{{[^}}]*{losses}\}}")
    assert some(
        r"sum\(increase\(mcp_client_resumption_tasks_total\{[^}]*"
        r'mcp_resumption_task_fate="abandoned"\}'
    )
    assert some(
        r"sum by \(server_address, server_port, gen_ai_tool_name, mcp_resumption_task_fate\) "
        r"\(increase\(mcp_client_resumption_tasks_total\{[^}]*\}\[1h\]\)\) > 0"
    )
    assert some(
        rf"sum by \(mcp_resumption_task_fate\) \(rate\(mcp_client_resumption_tasks_total"
        rf"\{{[^}}]*{losses}\}}"
    )
    for quantile in ("0.5", "0.95", "0.99"):
        assert some(
            rf"histogram_quantile\({quantile}, sum by \(le, mcp_resumption_task_fate\) "
            r"\(max_over_time\(mcp_client_resumption_task_duration_seconds_bucket"
        )
    assert some(r"increase\(mcp_client_resumption_task_unroutable_total")
    # the share of breaks not resumable, per server: not_resumable over every attempt
    assert some(
        r'sum by \(server_address, server_port\) \(increase\(mcp_client_resumption_attempts_total'
        r'\{[^}]*mcp_resumption_outcome="not_resumable"\}\[1h\]\)\)'
        r' / \(sum by \(server_address, server_port\) \(increase\('
        r"mcp_client_resumption_attempts_total\{[^}]*\}\[1h\]\)\) > 0\)"
    )


def test_panel_queries_substitutes_every_variable(dashboard: dict[str, Any]) -> None:
    queries = dashboard_queries.panel_queries(
        dashboard, {"job": "mcp-client", "instance": "127.0.0.1:9464", "__rate_interval": "2m"}
    )
    assert len(queries) == sum(len(panel.get("targets", [])) for panel in _panels(dashboard))
    for title, expr in queries:
        assert "$" not in expr, f"{title}: {expr}"
        assert 'job=~"mcp-client"' in expr and 'instance=~"127.0.0.1:9464"' in expr, title
    assert any("[2m]" in expr for _, expr in queries)
    assert any("[1h]" in expr for _, expr in queries)
    with pytest.raises(KeyError):
        dashboard_queries.substitute('rate(x{a=~"$nope"}[5m])', {})


# --- the alerts and the runbook ------------------------------------------------


def _all_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in _all_rules() if "alert" in rule]


def _recorded() -> set[str]:
    return {rule["record"] for rule in _all_rules() if "record" in rule}


# Alerts about the client itself, not about a server: grouped by the client.
CLIENT_ALERTS = frozenset({"McpResumptionStreamsEvicted"})
SEVERITIES = ("page", "ticket", "warning", "info")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_anchors() -> set[str]:
    anchors = set()
    for line in RUNBOOK.read_text(encoding="utf-8").splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            anchors.add(github_anchor(match.group(1)))
    return anchors


def _without_recorded(expr: str) -> str:
    """The expression with the recorded series (``mcp_resumption:*``) replaced
    by an emitted metric of the same labels, for the metric checks."""
    return re.sub(r"\bmcp_resumption:[\w:]+", "mcp_client_resumption_attempts_total", expr)


def test_recording_rules_are_the_sli_and_use_emitted_metrics() -> None:
    recorded = _recorded()
    assert "mcp_resumption:slo_target" in recorded
    for window in ("5m", "30m", "1h", "6h", "3d"):
        assert f"mcp_resumption:sli:ratio_rate{window}" in recorded, window
    for rule in _all_rules():
        if "record" in rule and rule["record"] != "mcp_resumption:slo_target":
            parsed = check_expr_metrics(rule["expr"], rule["record"])
            for grouping in parsed.grouping:
                assert {"job", "server_address", "server_port"} <= set(grouping), rule["record"]
                assert "instance" not in grouping, f"{rule['record']}: grouped by client"
    # the SLO target is one number, in one place
    [target] = [r for r in _all_rules() if r.get("record") == "mcp_resumption:slo_target"]
    assert re.fullmatch(r"vector\(0\.\d+\)", target["expr"].strip()), target["expr"]


def test_alert_exprs_name_only_emitted_metrics() -> None:
    recorded = _recorded()
    for rule in _alert_rules():
        for name in re.findall(r"\bmcp_resumption:[\w:]+", rule["expr"]):
            assert name in recorded, f"{rule['alert']}: {name} is not recorded"
        parsed = check_expr_metrics(_without_recorded(rule["expr"]), rule["alert"])
        # one alert per server, not per client pod: every aggregation keeps the
        # server and drops the client instance
        for grouping in parsed.grouping:
            if rule["alert"] in CLIENT_ALERTS:
                assert grouping == ["job", "instance"], rule["alert"]
                continue
            assert "server_address" in grouping, f"{rule['alert']}: by {grouping}"
            assert "instance" not in grouping, f"{rule['alert']}: by {grouping}"
        # the workaround that paged for old gaps after an outage is gone
        assert "offset" not in rule["expr"], rule["alert"]


def test_every_alert_is_complete() -> None:
    rules = _alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    anchors = runbook_anchors()
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: for"
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), name
        if name not in CLIENT_ALERTS:
            assert "{{ $labels.server_address }}" in annotations["description"], name
        url = annotations["runbook_url"]
        assert url.startswith(RUNBOOK_URL_PREFIX), f"{name}: {url}"
        anchor = url[len(RUNBOOK_URL_PREFIX) :]
        assert anchor in anchors, f"{name}: RUNBOOK.md has no heading with anchor #{anchor}"


def test_the_agreed_alerts_exist() -> None:
    rules = _alert_rules()

    def alerts_on(pattern: str) -> list[dict[str, Any]]:
        return [rule for rule in rules if re.search(pattern, rule["expr"])]

    pages = [rule for rule in rules if rule["labels"]["severity"] == "page"]
    # pages come from the error budget only, and need more than one bad resume
    assert {rule["alert"] for rule in pages} == {
        "McpResumptionErrorBudgetBurnFast",
        "McpResumptionErrorBudgetBurn",
    }
    burns = {
        rule["alert"]: rule["expr"] for rule in rules if "ErrorBudgetBurn" in rule["alert"]
    }
    assert re.search(r"ratio_rate1h\) > 14\.4 \*.*ratio_rate5m\) > 14\.4 \*", burns[
        "McpResumptionErrorBudgetBurnFast"], re.S)  # fmt: skip
    assert re.search(r"ratio_rate6h\) > 6 \*.*ratio_rate30m\) > 6 \*", burns[
        "McpResumptionErrorBudgetBurn"], re.S)  # fmt: skip
    assert re.search(r"ratio_rate3d\) > 1 \*.*ratio_rate6h\) > 1 \*", burns[
        "McpResumptionErrorBudgetBurnSlow"], re.S)  # fmt: skip
    for rule in pages:
        assert re.search(r"resumes_bad:increase\w+ >= [3-9]", rule["expr"]), rule["alert"]
    for kind in ("orphaned_request", "drain_race", "session_changed", "id_regression",
                 "replay_unconfirmed", "id_reused"):  # fmt: skip
        matching = alerts_on(rf'mcp_resumption_gap_kind=~?"[^"]*\b{kind}\b')
        assert matching, kind
        assert all(rule["labels"]["severity"] == "warning" for rule in matching), kind
    # a lost subscription warns on its own counter, and no lost-call alert reads it
    [subscription] = alerts_on(r"mcp_client_resumption_lost_subscriptions_total")
    assert subscription["alert"] == "McpResumptionSubscriptionLost"
    assert subscription["labels"]["severity"] == "warning"
    [lost_call] = [rule for rule in rules if rule["alert"] == "McpResumptionLostToolCall"]
    assert "subscription" not in lost_call["expr"]
    # the plain form of the other counters: only losses not re-listened
    assert re.search(
        r"sum by \(job, server_address, server_port\) \(\s*increase\("
        r"mcp_client_resumption_lost_subscriptions_total"
        r'\{mcp_resumption_subscription_relistened="false"\}\[10m\]\)\s*\) > 0',
        subscription["expr"],
    ), subscription["expr"]
    [risky] = alerts_on(r'mcp_resumption_reissue_risk="may_run_twice"')
    [twice] = alerts_on(r"mcp_client_resumption_duplicate_runs_total")
    assert risky["labels"]["severity"] == twice["labels"]["severity"] == "warning"
    # a lost task warns as a lost call does (same severity, at once); abandoned
    # tasks warn; no clean fate (completed, failed, cancelled) alerts
    task_alerts = alerts_on(r"mcp_client_resumption_tasks_total")
    assert {rule["alert"] for rule in task_alerts} == {
        "McpResumptionTaskLost", "McpResumptionTaskAbandoned"}
    for rule in task_alerts:
        assert rule["labels"]["severity"] == lost_call["labels"]["severity"], rule["alert"]
        assert rule["for"] == lost_call["for"], rule["alert"]
        fates = {m[2] for s in parse_promql(rule["expr"]).selectors for m in s.matchers
                 if m[0] == "mcp_resumption_task_fate"}  # fmt: skip
        assert fates == ({"lost|expired|handle_lost"} if rule["alert"] ==
                         "McpResumptionTaskLost" else {"abandoned"}), rule["expr"]
    unverifiable = alerts_on(r'mcp_resumption_outcome="unverifiable"')
    assert unverifiable and all(
        rule["labels"]["severity"] == "info" and ">=" in rule["expr"] for rule in unverifiable
    ), "the unverifiable alert is info and needs a minimum number of attempts"
    assert alerts_on(r"mcp_client_resumption_evicted_streams_total")
    assert alerts_on(r'mcp_resumption_outcome="rejected"')
    # breaks that stop being resumable warn, on a share with a minimum volume
    not_resumable = alerts_on(r'mcp_resumption_outcome="not_resumable"')
    assert [rule["alert"] for rule in not_resumable] == ["McpResumptionBreaksNotResumable"]
    assert all(
        rule["labels"]["severity"] == "warning" and ">=" in rule["expr"] and "/" in rule["expr"]
        for rule in not_resumable
    )
    # a break with nothing to resume is no resume: every share of resumes, and
    # the SLI, leaves it out (the not-resumable share alone counts it)
    for rule in _all_rules():
        name = rule.get("alert") or rule["record"]
        if name in ("McpResumptionBreaksNotResumable", "mcp_resumption:slo_target"):
            continue
        for selector in parse_promql(rule["expr"]).selectors:
            if selector.name == "mcp_client_resumption_attempts_total":
                outcome = [m for m in selector.matchers if m[0] == "mcp_resumption_outcome"]
                assert outcome, f"{name}: every outcome, not_resumable too: {rule['expr']}"
                [(_, operator, value)] = outcome
                assert ("not_resumable" in value) == (operator in ("!=", "!~")), name


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    document = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    assert document["rule_files"] == ["alerts.yaml"]
    firing: set[str] = set()
    quiet: dict[str, set[str]] = {"quiet": set(), "outage": set(), "old counters": set()}
    for case in document["tests"]:
        series = [s["values"] for s in case["input_series"]]
        outage = any("_x" in values for values in series)
        old = any(re.match(r"[1-9]\d*x", values) for values in series)
        for check in case.get("alert_rule_test", []):
            if check["exp_alerts"]:
                firing.add(check["alertname"])
                continue
            quiet["quiet"].add(check["alertname"])
            if outage:
                quiet["outage"].add(check["alertname"])
            if old:
                quiet["old counters"].add(check["alertname"])
    names = {rule["alert"] for rule in _alert_rules()}
    assert names - firing == set(), "alerts without a firing test"
    for what, alerts in quiet.items():
        assert names - alerts == set(), f"alerts without a quiet test ({what})"


@pytest.mark.parametrize("script", ["generate.py", "alert_tests.py"])
def test_generated_files_are_up_to_date(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(DASHBOARDS / script), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_runbook_says_how_to_confirm_and_what_to_change() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    for needle in (
        "resumption.gap",
        "mcp.resumption.gap.kind",
        "mcp.resumption.gap.expected",
        "mcp.resumption.gap.observed",
        "OTEL_PYTHON_MCP_RESUMPTION_MODE=enforce",
        "OTEL_PYTHON_MCP_RESUMPTION_REPLAY_CONTRACT=exclusive",
        "bind the cursor to the session id",
        "advance the cursor only after the application consumed the event",
    ):
        assert needle.lower() in text.lower(), needle


# --- promtool --------------------------------------------------------------------


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail(
            "promtool is not on PATH: install it (Debian: apt-get install -y prometheus) "
            "to check dashboards/alerts.yaml and run dashboards/alerts.test.yaml"
        )
    return promtool


@pytest.mark.parametrize(
    "args",
    [
        ("check", "rules", "dashboards/alerts.yaml"),
        ("test", "rules", "dashboards/alerts.test.yaml"),
        ("check", "config", "dashboards/prometheus.yml"),
    ],
    ids=["check-rules", "test-rules", "check-config"],
)
def test_promtool(args: tuple[str, ...]) -> None:
    result = subprocess.run(
        [_promtool(), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"


# --- what an SRE keeps: rows, variables, alert list, imports, no green 0 ------------


def test_dashboard_rows_variables_and_import(dashboard: dict[str, Any]) -> None:
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "SLO and error budget", "Gaps", "Latency", "Per server",
                    "Broken calls", "Subscriptions and re-issues", "Operations",
                    "Proxy legs", "Tasks", "Events"]  # fmt: skip
    variables = _variables(dashboard)
    assert {"datasource", "job", "instance", "server_address", "slo_target"} <= set(variables)
    assert variables["server_address"]["query"]["query"].endswith(", server_address)")
    assert variables["tempo"]["query"] == "tempo" and variables["loki"]["query"] == "loki"
    [prometheus] = dashboard["__inputs"]
    assert prometheus["type"] == "datasource" and prometheus["pluginId"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == "${" + prometheus["name"] + "}"
    # the SLO target of the dashboard is the one of the recording rules
    [target] = [r for r in _all_rules() if r.get("record") == "mcp_resumption:slo_target"]
    assert target["expr"].strip() == f"vector({variables['slo_target']['query']})"
    # the share of breaks not resumable that the dashboard colours is the alert's
    [alert] = [r for r in _alert_rules() if r["alert"] == "McpResumptionBreaksNotResumable"]
    [threshold] = re.findall(r"\) > (0\.\d+)", alert["expr"])
    [share] = [p for p in _panels(dashboard) if p["title"] == "Breaks not resumable by server"]
    steps = share["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == float(threshold), (steps, threshold)
    assert any(p["type"] == "alertlist" for p in _panels(dashboard))


def test_no_data_is_never_a_green_zero(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        if panel["type"] in ("row", "alertlist"):
            continue
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults.get("noValue") == "No data", panel["title"]
        if panel["type"] == "stat":
            [mapping] = defaults["mappings"]
            assert mapping["options"]["match"] == "null", panel["title"]
            assert mapping["options"]["result"]["color"] != "green", panel["title"]


def test_servers_link_to_their_traces_and_logs(dashboard: dict[str, Any]) -> None:
    linked = [
        p for p in _panels(dashboard) if p.get("fieldConfig", {}).get("defaults", {}).get("links")
    ]
    assert linked
    for panel in linked:
        urls = " ".join(link["url"] for link in panel["fieldConfig"]["defaults"]["links"])
        assert "${tempo}" in urls and "mcp.resume" in urls, panel["title"]
        assert "${loki}" in urls and "resumption.gap" in urls, panel["title"]
