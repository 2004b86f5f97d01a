"""Losses between client and proxy (issue 38) on the other real stacks: the
TypeScript SDK client (node, SDK 1.x) in front of mcp-resumption-proxy, and
npm supergateway (a stdio server behind streamable HTTP, no event ids) behind
it.

    client -> client router -> proxy (a child) -> upstream router -> server

The client router cuts the call's stream after its progress notification;
the tool answers only once the proxy has left the call's upstream stream (its
client was gone), so the answer reaches nobody.  The truth is the routers'
records: cut on the client's leg, never answered there, never sent again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from pathlib import Path

import pytest

from bridge_stack import Bridge, node_modules
from proxy_harness import LEG, Proxy, Stack, find_node, stack
from test_proxy_client_leg import (
    BROKEN,
    CLIENT_WORDS,
    FATE,
    GAPS,
    KIND,
    WINDOW,
    cut_call,
    gate_on_cut,
    lost_line,
    wait_for_text,
)
from wire import LEGACY, MCP1, AppClient, Truth, first_call_fails, sdk_app

TS_CALL = Path(__file__).parent / "programs" / "ts_call.mjs"


def assert_lost_on_the_client_leg(running: Stack) -> None:
    """The wire first: the call's stream cut on the client's leg before its
    answer, never answered, never sent again; the server's leg not cut.
    Then the proxy: lost once on client_proxy, its gap, its line in words."""
    proxy: Proxy = running.proxy
    call = cut_call(running.client_router)
    assert Truth(running.client_router).fate(call) == "lost"
    assert call.answered_on == []
    [upstream_call] = Truth(running.upstream_router).calls
    assert not upstream_call.exchange.severed
    broken = proxy.counts(BROKEN, LEG, FATE)
    assert broken == {("client_proxy", "lost"): 1}, (broken, proxy.stderr[-2000:])
    gaps = proxy.counts(GAPS, LEG, KIND)
    assert gaps == {("client_proxy", "orphaned_request"): 1}, gaps
    [line] = lost_line(proxy)
    assert CLIENT_WORDS in line and "method=tools/call" in line, line
    records = [r for r in proxy.logs() if r["attributes"].get(KIND) == "orphaned_request"]
    assert [r["attributes"][LEG] for r in records] == ["client_proxy"], records
    assert "Traceback" not in proxy.stderr


# ============================================================== TypeScript client


def test_the_typescript_client_s_call_cut_before_its_answer_is_lost_on_the_client_leg() -> None:
    """An mcp SDK server without an event store: no priming event, so the
    TypeScript client cannot resume the cut stream and waits on (until its
    own timeout, long after the proxy's window).  The proxy alone saw the
    answer go to nobody: lost on client_proxy."""
    node = find_node()
    gate = threading.Event()

    async def scenario() -> tuple[Stack, list[str]]:
        async with stack(sdk_app(answer_when=gate), cut_client=True,
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT=WINDOW) as running:
            cut = asyncio.ensure_future(gate_on_cut(running, gate))
            client = subprocess.Popen(
                [node, str(TS_CALL), running.url, "work", json.dumps({"text": "x"}), "60000"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                # The client's progress line: it read its stream up to the cut.
                seen = await asyncio.to_thread(client.stdout.readline)
                await cut
                await wait_for_text(running.proxy, "mcp-resumption lost call")
            finally:
                # The client still waits for its answer: stopped before its
                # own timeout (a notifications/cancelled then) could come.
                client.kill()
                output, _ = client.communicate(timeout=10)
            await running.upstream_router.wait_for(lambda xs: all(
                e.finished.is_set() for e in xs))
        return running, (seen + output).splitlines()

    running, output = asyncio.run(scenario())
    assert {"progress": 1} in [json.loads(line) for line in output], output
    assert not any("result" in json.loads(line) for line in output), output
    call = cut_call(running.client_router)
    assert (call.exchange.request.header("user-agent") or "").startswith("node"), \
        "the node client's own request"
    assert not any(e.request.header("last-event-id") for e in running.client_router.exchanges)
    assert_lost_on_the_client_leg(running)


# ============================================================== supergateway


class GateFile:
    """gate_on_cut's gate for a tool in another process: the file it waits for."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def set(self) -> None:
        self.path.touch()


@pytest.mark.parametrize("kind", [
    pytest.param(LEGACY, marks=pytest.mark.mcp2, id=LEGACY),
    pytest.param(MCP1, marks=pytest.mark.mcp1, id=MCP1),
])
def test_a_call_through_supergateway_cut_between_client_and_proxy_is_lost_once(
    kind, tmp_path, monkeypatch
) -> None:
    """supergateway (stateful: one stdio server per session) keeps no events
    and sends no ids: the client cannot resume, and the stdio server's answer
    reaches the proxy after its client is gone.  Lost on client_proxy, once."""
    gate = tmp_path / "answer"
    monkeypatch.setenv("BRIDGED_ANSWER_WHEN", str(gate))  # the bridge's child inherits it
    bridge = Bridge("supergateway-stateful", node_modules(), tmp_path)
    opened = GateFile(gate)

    async def scenario() -> Stack:
        async with stack(bridge.port, cut_client=True,
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT=WINDOW) as running:
            cut = asyncio.ensure_future(gate_on_cut(running, opened))
            async with AppClient(kind, running.url) as client:
                await first_call_fails(client)
                await cut
                await wait_for_text(running.proxy, "mcp-resumption lost call")
            await running.upstream_router.wait_for(lambda xs: all(
                e.finished.is_set() for e in xs))
        return running

    try:
        running = asyncio.run(scenario())
    finally:
        bridge.close()
    assert gate.exists()
    upstream = Truth(running.upstream_router)
    assert not any(event.id for e in upstream.exchanges for event in e.events), \
        "supergateway sent no event id: nothing to resume with"
    assert_lost_on_the_client_leg(running)
