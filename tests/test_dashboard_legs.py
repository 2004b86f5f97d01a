"""The client dashboard's "Proxy legs" row shows the truth: a real
mcp-resumption-proxy exports its metrics for Prometheus
(``OTEL_METRICS_EXPORTER=prometheus``), a real Prometheus scrapes it, and each
panel of the row, evaluated there, is compared with what the routers on the
proxy's two legs recorded.

The scenario: a server without an event store, its tools/call stream cut
between proxy and server after its progress event; the client (no event id to
resume from) gives the call up.  The wire's truth (tests/wire.py ``Truth``,
from the upstream router's record): one call broken on that leg, never
answered, never sent again: lost.  The client leg broke nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from proxy_harness import Stack, stack
from wire import RESUMABLE_CLIENTS, AppClient, Truth, first_call_fails, sdk_app

from dashboard_queries import iter_panels, load_dashboard, substitute
from prometheus_stack import Prometheus, free_port

RANGE = "10m"  # longer than the test: $__range covers every sample
VARIABLES = {"datasource": "prometheus", "job": ".*", "instance": ".*", "server_address": ".*",
             "__rate_interval": RANGE, "__range": RANGE}  # fmt: skip
ROW = "Proxy legs"
BROKEN = "mcp_client_resumption_broken_requests_total"


def row_panels() -> dict[str, dict]:
    """The panels of the row, by title."""
    found, inside = {}, False
    for panel in iter_panels(load_dashboard()):
        if panel["type"] == "row":
            inside = panel["title"] == ROW
        elif inside:
            found[panel["title"]] = panel
    return found


def last_scrape(prometheus: Prometheus) -> float | None:
    """The timestamp of the last scrape: there, increase() and rate() have
    nothing to extrapolate (each series started at 0 when the proxy first
    met the server), so a panel shows the count exactly."""
    found = prometheus.query(f'timestamp(up{{job="{prometheus.job}"}})')
    return float(found[0]["value"][1]) if found else None


def losses_by_leg(prometheus: Prometheus, panel: dict, at: float) -> dict[tuple[str, str], float]:
    [target] = panel["targets"]
    result = prometheus.query(substitute(target["expr"], VARIABLES), at)
    return {(r["metric"]["mcp_resumption_leg"], r["metric"]["mcp_resumption_gap_kind"]):
            float(r["value"][1]) for r in result}  # fmt: skip


def fates_by_leg(prometheus: Prometheus, panel: dict, at: float) -> dict[tuple[str, str], float]:
    """The rate panel over the whole range, times the range: the count."""
    [target] = panel["targets"]
    result = prometheus.query(substitute(target["expr"], VARIABLES), at)
    return {(r["metric"]["mcp_resumption_leg"], r["metric"]["mcp_resumption_request_fate"]):
            round(float(r["value"][1]) * 600, 6) for r in result
            if float(r["value"][1])}  # fmt: skip


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_the_proxy_legs_row_shows_each_loss_on_its_leg(tmp_path, kind) -> None:
    panels = row_panels()
    assert set(panels) == {"Proxy losses by leg and gap kind",
                           "Proxy broken calls by leg and fate"}, set(panels)
    metrics_port = free_port()
    prometheus = Prometheus(tmp_path, metrics_port, interval="1s")

    async def scenario() -> tuple[Stack, dict, dict]:
        async with stack(sdk_app(None), cut_upstream=True,
                         OTEL_METRICS_EXPORTER="prometheus",
                         OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                         OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics_port),
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT="0.5") as running:
            async with AppClient(kind, running.url) as client:
                # The proxy met the server (initialize): its series exist
                # from 0.  Prometheus reads them so before the loss, or
                # increase() would not see it (it counts from a first scrape).
                await asyncio.to_thread(prometheus.wait, lambda: prometheus.query(
                    f'{BROKEN}{{mcp_resumption_leg="proxy_server"}}'))
                await first_call_fails(client)
            truth = Truth(running.upstream_router).fates()

            last: list = []

            def shown() -> tuple[dict, dict] | None:
                at = last_scrape(prometheus)
                if at is None:
                    return None
                fates = fates_by_leg(prometheus, panels["Proxy broken calls by leg and fate"], at)
                gaps = losses_by_leg(prometheus, panels["Proxy losses by leg and gap kind"], at)
                expected = {("proxy_server", fate): float(n) for fate, n in truth.items()}
                last[:] = [fates, gaps]
                return (fates, gaps) if fates == expected and gaps else None

            shown.__doc__ = f"the proxy's broken calls by leg are the wire's {truth}"
            try:
                found = await asyncio.to_thread(prometheus.wait, shown)
            except AssertionError as error:
                raise AssertionError(f"{error}; the panels showed {last}") from None
        return running, truth, found

    try:
        running, truth, (fates, gaps) = asyncio.run(scenario())
    finally:
        prometheus.close()
    assert any(e.severed for e in running.upstream_router.exchanges)
    assert not any(e.severed for e in running.client_router.exchanges)
    assert truth == {"lost": 1}, truth
    assert fates == {("proxy_server", "lost"): 1.0}, fates
    # The lost call is its orphaned_request gap, on the same leg; nothing on
    # the client's leg, which broke nothing.
    assert gaps.get(("proxy_server", "orphaned_request")) == 1.0, gaps
    assert all(leg == "proxy_server" for leg, _ in gaps), gaps
