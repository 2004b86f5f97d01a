"""FastMCP's client following tasks of fastmcp-tasks servers under the
plugin, its metrics served for a Prometheus scrape: the feed of
tests/test_task_dashboard_values.py.

    python task_client.py METRICS_PORT

Once Prometheus has scraped the servers' series at 0, runs, each behind a
loopback router of its own (the wire truth):
- ``clean``: one server (memory backend), ``work`` completes;
- ``fleet``: two replicas without a shared task store in round robin: the
  task's poll lands on the other replica, "not found" (lost).
Prints one JSON line, the truth per task from the routers' records
(server port, tool, fate, polls, life from the handle to the last answer, and
the tasks/* requests without Mcp-Name), then serves its metrics until stdin
closes.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server

from mcp_resumption_demo.loopback import LoopbackServer
from mcp_resumption_demo.router import Backend
from mcp_resumption_demo.task_servers import task_app
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor
from proxy_harness import RawRouter
from task_stack import RoundRobin, handles, is_not_found, polls, task_wire


async def _run(url: str, seconds: float) -> None:
    import fastmcp_tasks  # noqa: F401 (turns on the Client's task polling)
    from fastmcp import Client

    try:
        async with Client(url) as client:
            await client.call_tool("work", {"seconds": seconds})
    except Exception:  # the lost task fails the call: the observation
        pass


# A bound on a test that fails (no Prometheus scraping), not a schedule.
SCRAPE_TIMEOUT_S = 120.0


class _CountingReader(PrometheusMetricReader):
    """Counts the scrapes of the metrics endpoint (as the demo's runner does)."""

    def __init__(self) -> None:
        super().__init__()
        self.scrapes = 0
        self.changed = threading.Condition()

    def _receive_metrics(self, *args, **kwargs) -> None:
        super()._receive_metrics(*args, **kwargs)
        with self.changed:
            self.scrapes += 1
            self.changed.notify_all()

    def wait_after(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.scrapes > count, SCRAPE_TIMEOUT_S)


class _AfterScrape:
    """A router policy: ``inner``'s route, but a task's first ``tasks/get``
    waits for a scrape first. The client already holds the handle then, so
    whatever series the plugin starts at 0 for the task (its server, tool
    and fates) are read at 0 before its fate is counted: increase() sees the
    first count, as it does for a client whose tasks run longer than a
    scrape interval."""

    def __init__(self, inner, reader: _CountingReader) -> None:
        self.inner, self.reader, self.seen = inner, reader, set()
        # when each request went on to its server (id of its RequestHead):
        # after the wait for a scrape, which the router's received_at counts
        # and the client's task life does not (it waits for the answer)
        self.forwarded_at: dict[int, float] = {}

    async def __call__(self, request):
        message = request.jsonrpc or {}
        task_id = (message.get("params") or {}).get("taskId")
        if message.get("method") == "tasks/get" and task_id not in self.seen:
            self.seen.add(task_id)
            before = self.reader.scrapes
            assert await asyncio.to_thread(self.reader.wait_after, before), "no scrape"
        self.forwarded_at[id(request)] = time.monotonic()
        return self.inner(request)


async def main(metrics_port: int) -> None:
    start_http_server(metrics_port, addr="127.0.0.1")
    reader = _CountingReader()
    provider = MeterProvider(metric_readers=[reader])
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(meter_provider=provider)
    servers = [await LoopbackServer(task_app(name=n), name=n).astart() for n in "abc"]
    sockets = [socket.socket() for _ in range(2)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    policies = [
        _AfterScrape(RoundRobin(Backend("a", servers[0].port)), reader),
        _AfterScrape(RoundRobin(Backend("b", servers[1].port), Backend("c", servers[2].port)),
                     reader),
    ]  # fmt: skip
    clean = await RawRouter(policies[0]).start(sockets[0])
    fleet = await RawRouter(policies[1]).start(sockets[1])
    # A real client knows its servers before a task is lost, and Prometheus
    # has scraped their series at 0 by then (increase() cannot see a series
    # born at 1): the routers' servers are seen, then a scrape, then the tasks.
    before = reader.scrapes
    for router in (clean, fleet):
        instrumentor.processor.server_seen("127.0.0.1", router.port)
    assert await asyncio.to_thread(reader.wait_after, before), "no scrape"
    truth, unnamed = [], 0
    for router, policy in zip((clean, fleet), policies):
        await _run(router.url + "/mcp", 0.3)
        found, n = _truth_of(router, policy.forwarded_at)
        truth += found
        unnamed += n
    print(json.dumps({"tasks": truth, "unroutable": unnamed}), flush=True)
    await asyncio.to_thread(sys.stdin.read)
    for router in (clean, fleet):
        await router.close()
    for server in servers:
        await asyncio.to_thread(server.close)


def _truth_of(router, forwarded_at: dict[int, float]) -> tuple[list[dict], int]:
    """Each task the router saw handed out: its fate from the last answer
    to its polls, and its life from the tools/call to that poll, as the
    router sent them on to the server; and the tasks/* requests without
    Mcp-Name."""
    calls = task_wire(router)

    def at(call) -> float:
        return forwarded_at[id(call.exchange.request)]

    found = []
    for handle in handles(calls):
        gets = polls(calls, handle.task_id)
        last = gets[-1] if gets else None
        if last is None:
            fate = "abandoned"
        elif is_not_found(last):
            fate = "lost"
        else:
            fate = last.status
        life = at(last) - at(handle) if last else 0.0
        found.append({"server_port": router.port, "tool": handle.params["name"], "fate": fate,
                      "polls": len(gets), "life_s": life})  # fmt: skip
    unnamed = sum(1 for c in calls if c.method.startswith("tasks/") and not c.mcp_name)
    return found, unnamed


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
