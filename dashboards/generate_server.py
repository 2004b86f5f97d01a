# ruff: noqa: E501
# (panel text and queries read better unbroken)
"""The server dashboard (uid ``mcp-resumption-server``), written by generate.py.

What MCP servers instrumented with ``McpResumptionServerInstrumentor`` did
with the resumes they received: requests by outcome, the lossy ones
(``unknown_cursor``, ``other_session``, counted whether the guard answered
them 200 or refused them 410) by server, replayed events per request.
Standard library only; the helpers are generate.py's.
"""

from __future__ import annotations

from typing import Any

from generate import NO_DATA, Layout, dashboard, ds_var, query_var, stat, table, target, timeseries

REQUESTS = "mcp_server_resumption_requests_total"
REPLAYED = "mcp_server_resumption_replayed_events"
SEL = 'job=~"$job", instance=~"$instance", server_address=~"$server_address"'


def sel(extra: str = "", metric: str = REQUESTS) -> str:
    return f"{metric}{{{SEL}{', ' + extra if extra else ''}}}"


def inc(extra: str = "", window: str = "$__range") -> str:
    return f"increase({sel(extra)}[{window}])"


def rate(extra: str = "") -> str:
    return f"rate({sel(extra)}[$__rate_interval])"


def lossy(kind: str, fn: Any = inc) -> str:
    """Resumes of one lossy kind, answered 200 (outcome = kind) or refused by
    the guard (outcome rejected_by_guard, gap kind = kind): the events are lost
    either way; the guard only makes the client know it."""
    answered = f'mcp_resumption_outcome="{kind}"'
    refused = f'mcp_resumption_outcome="rejected_by_guard", mcp_resumption_gap_kind="{kind}"'
    return f"{fn(answered)} or {fn(refused)}"


GOOD = 'mcp_resumption_outcome=~"replayed|nothing_to_replay"'
LOSSY_KINDS = "unknown_cursor|other_session"
LOSSY_ANSWERED = f'mcp_resumption_outcome=~"{LOSSY_KINDS}"'
LOSSY_REFUSED = f'mcp_resumption_outcome="rejected_by_guard", mcp_resumption_gap_kind=~"{LOSSY_KINDS}"'


DELIVERIES = "mcp_server_resumption_deliveries_total"
WASTED = "mcp_server_resumption_work_for_nobody_total"
SECOND_RUNS = "mcp_server_resumption_second_runs_total"
LISTENS = "mcp_server_resumption_listens_total"
OPERATION = "mcp_server_operation_duration_seconds"
# The listens carry no server (the transport and the filter only).
HOST = 'job=~"$job", instance=~"$instance"'
UNDELIVERED = 'mcp_resumption_delivery_fate="undelivered"'
REACHED = 'mcp_resumption_delivery_fate=~"delivered|replayed"'
# On 2026-07-28 closing the stream is how a client cancels, and a stream cut
# below the server (a proxy, a load balancer) looks the same to it: a
# cancelled call got no answer, so it counts against the delivered share.
CANCELLED = 'mcp_resumption_delivery_fate="cancelled"'
OWED = 'mcp_resumption_delivery_fate=~"delivered|replayed|undelivered|cancelled"'
LISTEN_LOST = 'mcp_resumption_listen_end="lost"'
FAILED = 'error_type!=""'


def of(metric: str, extra: str = "", selector: str = SEL) -> str:
    return f"{metric}{{{selector}{', ' + extra if extra else ''}}}"


def delivery_row(lay: Layout) -> None:
    """What became of each answer (2026-07-28 has no resumes: only the
    server knows), the calls run for nobody, the listens, the operations."""
    lay.row("Delivery: what the clients lost, seen from the server")
    lay.add(stat(
        "Undelivered answers in range",
        "Answers the servers computed that reached nobody: written after the client's stream "
        "was gone with no event store, or stored and never replayed before the session ended. "
        "Each is a call its client lost (and may re-issue). McpServerAnswerUndelivered pages on it.",
        f"sum(increase({of(DELIVERIES, UNDELIVERED)}[$__range]))",
        "short", [{"color": "green", "value": None}, {"color": "red", "value": 1}], decimals=0,
    ), 5, 4)
    lay.add(stat(
        "Answers delivered",
        "Share of the calls answered or cancelled in range whose answer was written to an open "
        "stream (or as the JSON body), or replayed by a resume. Cancelled calls count against it: "
        "on 2026-07-28 the server cannot tell a client's cancel from a stream cut below it, and "
        "either way the client got no answer (the next panel shows them apart).",
        f"sum(increase({of(DELIVERIES, REACHED)}[$__range]))"
        f" / sum(increase({of(DELIVERIES, OWED)}[$__range]))",
        "percentunit", [{"color": "red", "value": None}, {"color": "orange", "value": 0.99},
                        {"color": "green", "value": 0.999}], min=0, max=1, decimals=2,
    ), 5, 4)
    lay.add(stat(
        "Calls cancelled in range",
        "Calls whose stream closed before the handler answered, so the handler was cancelled "
        "(2026-07-28, where closing the stream is how a client cancels; and a legacy SSE session "
        "cut under mcp 2.x). A rise with no change in the clients is streams cut below the "
        "server: a proxy's or load balancer's timeout, a restart, a network drop.",
        f"sum(increase({of(DELIVERIES, CANCELLED)}[$__range]))",
        "short", [{"color": "text", "value": None}], decimals=0,
    ), 4, 4)
    lay.add(stat(
        "Tool calls run for nobody in range",
        "tools/call handlers that ran to completion after their client's stream was gone "
        "(before 2026-07-28 a disconnect is not a cancellation; mcp 2.x's JSON answers are not "
        "watched on 2026-07-28 either). A re-issue runs the work again.",
        f"sum(increase({of(WASTED)}[$__range]))",
        "short", [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 5, 4)
    lay.add(stat(
        "Proven second runs in range",
        "Calls run for nobody that the same tool then ran again with the same arguments within "
        "the confirmation window: the work ran twice on the server.",
        f"sum(increase({of(SECOND_RUNS)}[$__range]))",
        "short", [{"color": "green", "value": None}, {"color": "orange", "value": 1}], decimals=0,
    ), 5, 4)
    lay.add(timeseries(
        "Answers by delivery fate",
        "Answers per second by fate: delivered (open stream or JSON body), stored (written to "
        "the event store after the stream was gone), replayed (a resume delivered a stored one), "
        "undelivered (reached nobody), cancelled (the client closed the stream before the "
        "handler answered). A stored answer is counted again when it is replayed or lost.",
        [target(f"sum by (mcp_resumption_delivery_fate) (rate({of(DELIVERIES)}[$__rate_interval]))",
                "{{mcp_resumption_delivery_fate}}")], "reqps",
    ), 12, 8)
    lay.add(table(
        "Work done for nobody by tool",
        "tools/call handlers that ran to completion for nobody in the time range, by tool, "
        "protocol version and the hint the tool declared (none: a re-issue may do its work "
        "twice; idempotent / read_only: harmless). McpServerWorkForNobody warns on none.",
        f"sum by (gen_ai_tool_name, mcp_protocol_version, mcp_resumption_tool_hint) "
        f"(increase({of(WASTED)}[$__range])) > 0",
        ["gen_ai_tool_name", "mcp_protocol_version", "mcp_resumption_tool_hint"], "calls", decimals=0,
    ), 12, 8)
    lay.add(table(
        "Lost subscriptions by filter",
        "subscriptions/listen streams (2026-07-28) the server ended without its result (a "
        "shutdown, an error in the handler, the subscription cap), by the notifications they "
        "asked for. A client's own close, or a cut below the server (it cannot tell them apart), "
        "is closed_by_client and never counted here.",
        f"sum by (mcp_resumption_listen_filter) "
        f"(increase({of(LISTENS, LISTEN_LOST, HOST)}[$__range])) > 0",
        ["mcp_resumption_listen_filter"], "listens", decimals=0,
    ), 12, 8)
    lay.add(timeseries(
        "Listens ended per second, by how",
        "closed_by_server: the server's result (graceful); closed_by_client: the client left or "
        "its stream was cut; lost: the server ended it without its result.",
        [target(f"sum by (mcp_resumption_listen_end) (rate({of(LISTENS, '', HOST)}[$__rate_interval]))",
                "{{mcp_resumption_listen_end}}")], "short",
    ), 12, 8)
    lay.add(timeseries(
        "Operation latency by method (p95)",
        "mcp.server.operation.duration (the MCP semantic conventions): the 95th percentile of "
        "the server's handling time per method.",
        [target(f"histogram_quantile(0.95, sum by (le, mcp_method_name) "
                f"(rate({of(OPERATION + '_bucket', '', HOST)}[$__rate_interval])))",
                "{{mcp_method_name}}")], "s",
    ), 12, 8)
    lay.add(timeseries(
        "Operation errors by method",
        "Operations per second that ended in an error, by method and error.type (tool_error: "
        "the tool's own error).",
        [target(f"sum by (mcp_method_name, error_type) "
                f"(rate({of(OPERATION + '_count', FAILED, HOST)}[$__rate_interval]))",
                "{{mcp_method_name}} {{error_type}}")], "reqps",
    ), 12, 8)


def build_server() -> dict[str, Any]:
    lay = Layout()
    lay.row("Overview")
    lay.add(stat(
        "Lossy resumes in range",
        "Resumes the server could not honour: a cursor its store does not know (unknown_cursor) "
        "or one issued in another session (other_session), answered 200 or refused by the guard. "
        "Anything above 0 lost events; see the runbook of McpServerResumptionUnknownCursor.",
        f"sum({inc(LOSSY_ANSWERED)} or {inc(LOSSY_REFUSED)})", "short",
        [{"color": "green", "value": None}, {"color": "red", "value": 1}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Lossy resumes answered 200",
        "Of the lossy resumes, those answered 200 with an empty (or another session's) stream: "
        "the client was not told. 0 with lossy resumes above means the guard refuses them all.",
        f"sum({inc(LOSSY_ANSWERED)})", "short",
        [{"color": "green", "value": None}, {"color": "red", "value": 1}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Resume requests in range",
        "GETs with Last-Event-ID the servers received in the time range, of any outcome.",
        f"sum({inc()})", "short", [{"color": "text", "value": None}], decimals=0,
    ), 6, 4)
    lay.add(stat(
        "Resumes replayed",
        "Share of resume requests whose store replayed at least one event or had nothing after "
        "the cursor. Low means the servers lose the cursors their clients hold.",
        f"sum({inc(GOOD)}) / sum({inc()})",
        "percentunit", [{"color": "red", "value": None}, {"color": "orange", "value": 0.9},
                        {"color": "green", "value": 0.99}], min=0, max=1, decimals=1,
    ), 6, 4)
    lay.add(timeseries(
        "Resume requests by outcome",
        "Resume requests per second by outcome. replayed and nothing_to_replay are good; "
        "unknown_cursor and other_session lost events; unknown_session is an expired session "
        "(404); no_store a server that keeps no events; rejected_by_guard a refusal (410).",
        [target(f"sum by (mcp_resumption_outcome) ({rate()})", "{{mcp_resumption_outcome}}")],
        "reqps",
    ), 24, 8)

    lay.row("Lossy resumes by server")
    for kind, what in (
        ("unknown_cursor", "a cursor the store does not know: a restarted or migrated instance, "
         "a store shared by too few instances, or one that keeps too few events"),
        ("other_session", "a cursor issued in another session: a client (or a proxy) that "
         "carried a cursor across a re-initialisation; the store replays that session's events"),
    ):
        lay.add(table(
            f"{kind} by server",
            f"Resumes in the time range with {what}. Answered 200 or refused by the guard "
            "(answer column). Empty means none (every series exists from 0).",
            f"sum by (server_address, server_port, mcp_resumption_outcome) ({lossy(kind)}) > 0",
            ["server_address", "server_port", "mcp_resumption_outcome"], "resumes", decimals=0,
        ), 12, 8)
    lay.add(timeseries(
        "Lossy resumes per second by server",
        "unknown_cursor and other_session per server, answered or refused.",
        [target(f"sum by (server_address, server_port) ({rate(LOSSY_ANSWERED)} or {rate(LOSSY_REFUSED)})",
                "{{server_address}}:{{server_port}}")], "reqps",
    ), 12, 8)
    # The histogram has no server.address (bounded: outcome and transport only).
    hist = 'job=~"$job", instance=~"$instance"'
    mean = (
        f"sum by (mcp_resumption_outcome) (max_over_time({REPLAYED}_sum{{{hist}}}[$__range]))"
        f" / sum by (mcp_resumption_outcome) (max_over_time({REPLAYED}_count{{{hist}}}[$__range]))"
    )
    lay.add(timeseries(
        "Replayed events per resume request (since each server started)",
        "Events the store replayed per resume request, mean by outcome (cumulative: a "
        "histogram series is born with its first request). Large values mean long outages.",
        [target(mean, "mean {{mcp_resumption_outcome}}")], "short",
    ), 12, 8)
    delivery_row(lay)
    for panel in lay.panels:
        panel.pop("_keep", None)

    prom = {"selected": True, "text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"}
    assert NO_DATA  # the stat helper maps "no answer" to "No data", never a green 0
    return dashboard(
        scraped="servers",
        extra_panel_types=[],
        description="What MCP servers did with the resumes (Last-Event-ID) they received. "
        "Metrics of opentelemetry-instrumentation-mcp-resumption's server half. "
        "Generated by dashboards/generate.py.",
        runbook="https://github.com/mcp-resumption/opentelemetry-instrumentation-mcp-resumption/blob/main/dashboards/RUNBOOK.md#mcpserverresumptionunknowncursor",
        panels=lay.panels,
        tags=["mcp", "opentelemetry", "resumption", "server"],
        variables=[
            ds_var("datasource", "Data source", "prometheus", prom),
            # Series every server exports whatever the protocol revision: a
            # 2026-07-28 server has no resumes, so no resume requests.
            query_var("job", "Job", f"label_values({OPERATION}_count, job)"),
            query_var("instance", "Instance", f'label_values({OPERATION}_count{{job=~"$job"}}, instance)'),
            query_var("server_address", "Server", f'label_values({DELIVERIES}{{job=~"$job", instance=~"$instance"}}, server_address)'),
        ],
        title="MCP stream resumption: servers",
        uid="mcp-resumption-server",
    )  # fmt: skip
