"""A third-party Events client through ``mcp-resumption-proxy``: the Vercel
AI SDK's MCP client, ``@ai-sdk/mcp`` (tests/events_ts, pinned), as an
application drives it (tests/events_ts/subscribe.mjs).

    node (@ai-sdk/mcp) -> proxy (a child) -> events server -> webhook receiver

What the client speaks, read from its source: ``events/list``,
``events/subscribe`` (webhook only: ``mcp-events.ts`` refuses any other
mode), a refresh (``events/subscribe`` again with the same key) and
``events/unsubscribe``; no ``events/poll``, no ``events/stream``.  It
asks for events only of a server whose ``server/discover`` declares the
top-level ``capabilities.events`` (``mcp-client.ts``, ``assertCapability``),
so the events server runs that dialect.

The wire's truth is the events server's log (each subscribe, its cursor in,
its ``refreshBefore`` out, the unsubscribe) and the client's own output; the
verdicts are read from the proxy's telemetry, leg by leg.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from events_server import Dialect, EventsServer
from events_wire import WebhookReceiver
from proxy_harness import Proxy, proxy

pytestmark = pytest.mark.mcp2  # one lane: the client is node's, whatever the mcp SDK

TS_DIR = Path(__file__).parent / "events_ts"
GAPS = "mcp.client.resumption.event_gaps"
KIND = "mcp.events.gap.kind"
LEG = "mcp.resumption.leg"
BROKEN = "mcp.client.resumption.broken_requests"
CALL_GAPS = "mcp.client.resumption.gaps"
MODES = [pytest.param((), id="observe"), pytest.param(("--resumable",), id="resumable")]


@pytest.fixture(scope="module")
def node() -> str:
    """node, with @ai-sdk/mcp installed (scripts/test runs ``npm ci`` there;
    a run of this file alone does it here)."""
    found = shutil.which("node")
    assert found, "node is needed for the @ai-sdk/mcp client"
    if not (TS_DIR / "node_modules" / "@ai-sdk" / "mcp").is_dir():
        subprocess.run([shutil.which("npm") or "npm", "ci", "--no-audit", "--no-fund"],
                       cwd=TS_DIR, check=True)  # fmt: skip
    return found


def run_client(node: str, url: str, callback: str, scenario: str) -> dict[str, object]:
    """The client's steps, by name, once it exited."""
    done = subprocess.run([node, str(TS_DIR / "subscribe.mjs"), url, "alice", callback, scenario],
                          capture_output=True, text=True, timeout=60, cwd=TS_DIR)
    assert done.returncode == 0, done.stderr
    steps = dict((s["step"], s["result"]) for s in map(json.loads, done.stdout.splitlines()))
    assert "done" in steps, done.stdout
    return steps


def wall(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def wait_for_text(running: Proxy, text: str, until: float) -> bool:
    while text not in running.stderr and time.time() < until:
        time.sleep(0.02)
    return text in running.stderr


def nothing_lost_as_a_call(running: Proxy) -> None:
    assert running.counts(BROKEN, LEG, "mcp.resumption.request.fate") == {}
    assert running.counts(CALL_GAPS, LEG, "mcp.resumption.gap.kind") == {}
    assert "lost call" not in running.stderr


@pytest.mark.parametrize("mode", MODES)
def test_ai_sdk_subscription_refreshed_in_time_then_unsubscribed(node, mode):
    with EventsServer(dialect=Dialect(capability="top-level")) as server, \
            WebhookReceiver() as receiver, proxy(server.url, *mode) as running:
        steps = run_client(node, running.url, receiver.url, "refresh")
        # The moment the subscription would have lapsed unrefreshed, and a
        # tick of the proxy's past it: nothing is due by then.
        lapse_at = wall(steps["refresh"]["refreshBefore"]) + 1.5
        assert not wait_for_text(running, "mcp-resumption event", lapse_at)
    # The wire: subscribed, refreshed (the same subscription: its id, a later
    # refreshBefore) before its refreshBefore, then unsubscribed.
    subscribes = server.log.exchanges("events/subscribe")
    assert len(subscribes) == 2 and all(x.ended == "answered" for x in subscribes)
    assert subscribes[1].cursor_in == steps["subscribe"]["cursor"]
    assert steps["refresh"]["id"] == steps["subscribe"]["id"]
    assert len(server.log.exchanges("events/unsubscribe")) == 1
    assert server.log.exchange(steps["subscribe"]["id"], "webhook").ended == "unsubscribed"
    assert running.counts(GAPS, LEG, KIND) == {}
    nothing_lost_as_a_call(running)


@pytest.mark.parametrize("mode", MODES)
def test_ai_sdk_subscription_left_to_lapse_is_said_once_when_it_lapses(node, mode):
    with EventsServer(dialect=Dialect(capability="top-level")) as server, \
            WebhookReceiver() as receiver, proxy(server.url, *mode) as running:
        steps = run_client(node, running.url, receiver.url, "lapse")
        refresh_before = wall(steps["subscribe"]["refreshBefore"])
        said = wait_for_text(running, "mcp-resumption event lapsed:", time.time() + 15)
        said_at = time.time()
    # The wire: one subscribe, answered with its refreshBefore, never refreshed
    # nor unsubscribed.
    assert [x.ended for x in server.log.exchanges("events/subscribe")] == ["answered"]
    assert server.log.exchanges("events/unsubscribe") == []
    assert said and said_at >= refresh_before  # said when the moment passed
    # Once, on the leg whose client half watched the subscribe answer; the
    # client leg adds nothing (the same answer crossed it).
    assert running.counts(GAPS, LEG, KIND) == {("proxy_server", "lapsed"): 1}
    line = next(x for x in running.stderr.splitlines() if "event lapsed" in x)
    assert "event=ticket.created delivery=webhook" in line
    nothing_lost_as_a_call(running)
