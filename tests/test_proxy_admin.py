"""mcp-resumption-proxy's admin address (``--admin``) and its probe of the
upstream.

The proxy runs as a child (tests/proxy_harness.py); the upstream is a real SDK
server on a loopback socket the test controls: bound but not listening (a
connection is refused), then served, then stopped.  Ground truth: whether
that socket listens, and the routers' records of what reached each leg.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import sys

import httpx
import pytest

from helpers import clean_env
from mcp_resumption_demo.loopback import LoopbackServer
from proxy_harness import proxy, stack
from test_proxy_sdk import settled
from test_proxy_shutdown import ADMIN, admin_of, until_status
from wire import LEGACY, MCP1, AppClient, IntegerEventStore, sdk_app

from prometheus_stack import Prometheus, free_port

UNREACHABLE = "is unreachable"
BACK = "answers again (unreachable for"
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


def test_health_and_readiness_take_no_mcp_path() -> None:
    async def scenario():
        async with stack(sdk_app(), proxy_args=ADMIN) as running:
            admin = await asyncio.to_thread(admin_of, running.proxy)
            await until_status(admin + "/readyz", 200)
            answers = {}
            for method, path in [("GET", "/healthz"), ("GET", "/readyz"), ("HEAD", "/readyz"),
                                 ("GET", "/readyz?verbose=1"), ("GET", "/mcp"),
                                 ("POST", "/healthz")]:
                answer = await asyncio.to_thread(
                    httpx.request, method, admin + path, timeout=2.0)
                answers[method, path] = (answer.status_code, answer.text)
            return running, answers

    running, answers = asyncio.run(scenario())
    assert answers["GET", "/healthz"] == (200, "ok\n")
    assert answers["GET", "/readyz"] == (200, "ready\n")
    assert answers["HEAD", "/readyz"] == (200, "")
    assert answers["GET", "/readyz?verbose=1"][0] == 200
    assert answers["GET", "/mcp"][0] == 404  # the admin address forwards nothing
    assert answers["POST", "/healthz"][0] == 405
    # Neither leg carried a request: no health check, no probe, went upstream
    # as HTTP (the probe is a TCP connection, which the router records no
    # exchange for).
    assert running.client_router.exchanges == []
    assert running.upstream_router.exchanges == []
    assert running.proxy.points("mcp.client.operation.duration") == []


def lines(text: str, needle: str) -> int:
    return sum(needle in line for line in text.splitlines())


def test_readiness_follows_the_upstream_with_one_line_each_way() -> None:
    """Down at the start, up, down again: readiness follows each change, and
    each change is one line, however many probes and requests saw it."""
    backend = LoopbackServer(sdk_app(), name="upstream")  # bound, not listening yet
    url = f"http://127.0.0.1:{backend.port}/mcp"
    try:
        with proxy(url, *ADMIN) as running:
            admin = admin_of(running)
            asyncio.run(until_status(admin + "/readyz", 503))
            assert httpx.get(admin + "/readyz").text == "not ready: the upstream is unreachable\n"
            assert httpx.get(admin + "/healthz").status_code == 200  # alive all the same
            for _ in range(3):
                assert httpx.post(running.url, json=PING).status_code == 502
            backend.start()
            asyncio.run(until_status(admin + "/readyz", 200))
            answer = httpx.post(running.url, json=PING, headers={
                "accept": "application/json, text/event-stream"})
            assert answer.status_code != 502, answer.text
            backend.close()
            asyncio.run(until_status(admin + "/readyz", 503))
            # Many probes saw each state (one every 0.1 s): the lines are
            # written at the changes only.
            stderr = running.stderr
    finally:
        backend.close()
    assert lines(stderr, UNREACHABLE) == 2, stderr
    assert lines(stderr, BACK) == 1, stderr
    where = f"127.0.0.1:{backend.port}"
    first, back, second = (stderr.index(UNREACHABLE), stderr.index(BACK),
                           stderr.rindex(UNREACHABLE))
    assert first < back < second, stderr
    assert f"the upstream {where} is unreachable (ConnectionRefusedError)" in stderr
    assert f"the upstream {where} answers again (unreachable for " in stderr
    assert "Traceback" not in stderr


def test_the_log_lines_need_no_admin_address() -> None:
    with socket.socket() as sock:  # bound, never listening: refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with proxy(f"http://127.0.0.1:{port}/mcp", "--upstream-probe", "0.1") as running:
            for _ in range(3):
                assert httpx.post(running.url, json=PING).status_code == 502
            asyncio.run(until_line(running, UNREACHABLE))
    assert lines(running.stderr, UNREACHABLE) == 1, running.stderr
    assert "admin on" not in running.stderr


async def until_line(running, needle: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while needle not in running.stderr:
        assert loop.time() < deadline, running.stderr
        await asyncio.sleep(0.02)


def test_an_admin_address_taken_is_one_line_and_status_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "mcp_resumption_proxy", "--upstream",
             "http://127.0.0.1:9/mcp", "--admin", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=30,
            env=clean_env(OTEL_METRICS_EXPORTER="none", OTEL_TRACES_EXPORTER="none",
                          OTEL_LOGS_EXPORTER="none"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(
        f"mcp-resumption-proxy: --admin: cannot listen on 127.0.0.1:{port}"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr



# ================================================================ Prometheus

SCRAPED = [
    pytest.param(LEGACY, marks=pytest.mark.mcp2, id=LEGACY),
    pytest.param(MCP1, marks=pytest.mark.mcp1, id=MCP1),
]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
MCP_SERIES = re.compile(r"^mcp_\w+\{[^}]*\} \S+$", re.MULTILINE)


@pytest.mark.parametrize("kind", SCRAPED)
def test_prometheus_scrapes_both_legs_from_the_admin_address(kind, tmp_path) -> None:
    """OTEL_METRICS_EXPORTER=prometheus: a real Prometheus scraping the admin
    address's /metrics reads each leg's series apart, by mcp_resumption_leg,
    and the admin address serves what the exporter's own port serves.  The
    upstream router cuts the call's stream after its progress (one cut on
    proxy_server, the wire's truth); the client resumes through the proxy
    (one resume on client_proxy)."""
    exporter_port = free_port()

    async def scenario():
        async with stack(sdk_app(IntegerEventStore()), cut_upstream=True, proxy_args=ADMIN,
                         OTEL_METRICS_EXPORTER="prometheus",
                         OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                         OTEL_EXPORTER_PROMETHEUS_PORT=str(exporter_port)) as running:
            admin = await asyncio.to_thread(admin_of, running.proxy)
            async with AppClient(kind, running.url) as client:
                assert await client.call("x") == "done x"
            await settled(running.client_router, running.upstream_router)
            prometheus = Prometheus(tmp_path, int(admin.rsplit(":", 1)[1]), interval="1s")
            try:
                legs = await asyncio.to_thread(prometheus.wait, lambda: read_legs(prometheus))
            finally:
                await asyncio.to_thread(prometheus.close)
            exporter = f"http://127.0.0.1:{exporter_port}/metrics"
            from_admin = await asyncio.to_thread(httpx.get, admin + "/metrics")
            from_exporter = await asyncio.to_thread(httpx.get, exporter)
            # The format follows the scraper's Accept, as the exporter's does.
            types = {}
            for url in (admin + "/metrics", exporter):
                answer = await asyncio.to_thread(httpx.get, url, headers={"accept": OPENMETRICS})
                types[url == exporter] = answer.headers["content-type"]
            return running, legs, from_admin, from_exporter, types

    running, legs, from_admin, from_exporter, types = asyncio.run(scenario())
    assert types[True] == types[False] and "openmetrics" in types[True], types
    assert sum(e.severed for e in running.upstream_router.exchanges) == 1
    assert not any(e.severed for e in running.client_router.exchanges)
    assert legs == {
        ("proxy_server", "mcp_client_resumption_broken_requests_total", "answered"): 1.0,
        ("client_proxy", "mcp_server_resumption_requests_total", "replayed"): 1.0,
    }, legs
    assert from_admin.status_code == 200
    assert from_admin.headers["content-type"] == from_exporter.headers["content-type"]
    admin_series = sorted(MCP_SERIES.findall(from_admin.text))
    assert admin_series and admin_series == sorted(MCP_SERIES.findall(from_exporter.text))


def read_legs(prometheus: Prometheus) -> dict[tuple, float] | None:
    """Prometheus has read a broken request and a client resume, by leg."""
    found = {}
    for metric, label in (("mcp_client_resumption_broken_requests_total",
                           "mcp_resumption_request_fate"),
                          ("mcp_server_resumption_requests_total", "mcp_resumption_outcome")):
        for series in prometheus.query(
                f"sum by (mcp_resumption_leg, {label}) ({metric})"):
            labels = series["metric"]
            value = float(series["value"][1])
            if value:
                found[labels.get("mcp_resumption_leg"), metric, labels.get(label)] = value
    return found if len(found) >= 2 else None


def test_the_probe_stops_even_when_a_cancel_is_swallowed(monkeypatch) -> None:
    """Python 3.10's asyncio.wait_for swallows a cancel that lands as the
    connect completes: the probe's loop went on, and the shutdown that
    awaited it never ended (CI saw a proxy still running 16 s after SIGTERM).
    Here a probe swallows each cancel as that wait_for does; stop() still
    returns, and the loop probes no more."""
    from mcp_resumption_proxy.admin import UpstreamProbe

    probes = []
    swallow = [True]

    async def swallowing(self) -> bool:
        probes.append(1)
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if not swallow[0]:
                raise
        return True

    monkeypatch.setattr(UpstreamProbe, "probe", swallowing)

    async def scenario() -> tuple[bool, int, int]:
        probe = UpstreamProbe("http://127.0.0.1:9/mcp", interval=0.01)
        probe.start()
        while not probes:
            await asyncio.sleep(0.001)
        stopping = asyncio.ensure_future(probe.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
        count = len(probes)
        await asyncio.sleep(0.1)
        later = len(probes)
        swallow[0] = False  # a failing run ends here, not at pytest's timeout
        probe._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
        return bool(done), count, later

    stopped, count, later = asyncio.run(scenario())
    assert stopped, "stop() never returned"
    assert later == count, "the loop went on after stop()"
