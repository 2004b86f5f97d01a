"""What the bridge tests share (tests/test_bridges_supergateway.py,
tests/test_bridges_mcp_proxy.py).

Broken calls through real third-party bridges (issue 22): a stdio MCP server
(tests/bridges/stdio_server.py, the installed SDK major) put behind streamable
HTTP by npm ``supergateway`` (stateless, its default, and ``--stateful``) and
npm ``mcp-proxy`` (its event store on, its default, and ``--no-eventStore``),
each a subprocess at the version tests/bridges/package-lock.json pins, behind
the demo's loopback router, which cuts the first ``tools/call`` stream right
after its progress notification and records every exchange.

The truth is the router's record (tests/wire.py): whether the cut stream
carried event ids (something to resume with), whether the call was answered
later, re-issued under a new id, or neither.  The plugin must count the same
fate on ``mcp.client.resumption.broken_requests``, ``not_resumable`` for a
break nothing can resume, and no broken request at all in a clean run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import stop_process
from mcp_resumption_demo.router import Backend
from wire import (
    BROKEN,
    FATE,
    MCP1,
    AppClient,
    Fleet,
    Truth,
    WireRouter,
    assert_reissued,
    fates,
    instrument_env,
    orphan_logs,
    wait_until,
)

BRIDGES_DIR = Path(__file__).parent / "bridges"
CONFIRM = 1.0  # the confirmation (and reissue) window of these tests, s
DEADLINE = CONFIRM + 6
GIVE_UP = 0.5  # mcp 1.x waits on a cut stream without ids until the caller gives up
SERVER = [sys.executable, str(BRIDGES_DIR / "stdio_server.py")]

BRIDGES = {
    # name: (bin, arguments before the port, whether a cut stream carries event ids)
    "supergateway": ("supergateway", ["--stdio", " ".join(SERVER),
                                      "--outputTransport", "streamableHttp",
                                      "--logLevel", "none"]),
    "supergateway-stateful": ("supergateway", ["--stdio", " ".join(SERVER),
                                               "--outputTransport", "streamableHttp",
                                               "--stateful", "--logLevel", "none"]),
    "mcp-proxy-no-store": ("mcp-proxy", ["--server", "stream", "--host", "127.0.0.1",
                                         "--no-eventStore"]),
    "mcp-proxy-store": ("mcp-proxy", ["--server", "stream", "--host", "127.0.0.1"]),
}
NO_STORE = ["supergateway", "supergateway-stateful", "mcp-proxy-no-store"]


def node_modules() -> Path:
    """scripts/test runs ``npm ci`` here; a run of this file alone does it itself."""
    modules = BRIDGES_DIR / "node_modules"
    if not all((modules / ".bin" / binary).exists() for binary in ("supergateway", "mcp-proxy")):
        npm = shutil.which("npm")
        assert npm, "npm is needed for the bridge tests"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=BRIDGES_DIR, check=True)
    return modules


class Bridge:
    """One bridge subprocess on a loopback port, its child the stdio server."""

    def __init__(self, name: str, modules: Path, log_dir: Path) -> None:
        binary, arguments = BRIDGES[name]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        command = [shutil.which("node") or "node", str(modules / ".bin" / binary), *arguments,
                   "--port", str(self.port)]
        if binary == "mcp-proxy":
            command += ["--", *SERVER]
        self.log = (log_dir / f"{name}.log").open("w")
        self.process = subprocess.Popen(command, cwd=BRIDGES_DIR, stdout=self.log,
                                        stderr=subprocess.STDOUT, env={**os.environ})
        deadline = time.monotonic() + 30
        while True:  # until it accepts connections
            assert self.process.poll() is None, (log_dir / f"{name}.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the bridge never listened"
                time.sleep(0.05)

    def close(self) -> None:
        stop_process(self.process)
        self.log.close()


def bridges_fixture():
    """A test module's ``bridges`` fixture: each bridge started once for the
    module, on first use."""

    @pytest.fixture(scope="module")
    def bridges(tmp_path_factory):
        running: dict[str, Bridge] = {}
        modules = node_modules()
        log_dir = tmp_path_factory.mktemp("bridges")

        def get(name: str) -> Bridge:
            if name not in running:
                running[name] = Bridge(name, modules, log_dir)
            return running[name]

        yield get
        for bridge in running.values():
            bridge.close()

    return bridges


def run(telemetry, bridge: Bridge, kind: str, act, *, cut: bool = True):
    """``act(client)`` through the router in front of ``bridge``; the router."""

    async def scenario():
        router = await WireRouter(Fleet(Backend("bridge", bridge.port), cut=cut)).start()
        try:
            with telemetry.instrumented():
                async with AppClient(kind, router.url + "/mcp") as client:
                    await act(client)
                    if cut:
                        await wait_until(lambda: fates(telemetry), DEADLINE)
        finally:
            await router.close()
        return router

    return asyncio.run(scenario())


def wire_dump(truth: Truth) -> str:
    timing = ""
    for call in truth.cut:
        if truth.reissues_of(call):
            timing += f"re-issued {truth.reissued_after(call):.3f} s after the cut\n"
    return timing + "\n".join(
        f"{e.index} {e.request.method} {e.request.body[:90]!r} last-event-id="
        f"{e.request.header('last-event-id')} {e.status} severed={e.severed} "
        f"{[(ev.id, ev.data[:50]) for ev in e.events]}"
        for e in truth.exchanges
    )


async def first_call_fails(client: AppClient) -> None:
    try:
        answer = await client.call("x", idle=GIVE_UP if client.kind == MCP1 else None)
    except Exception:  # what the SDK raises is its business
        return
    raise AssertionError(f"the cut call returned {answer!r}")


def the_cut_call(truth: Truth):
    assert len(truth.cut) == 1, wire_dump(truth)
    [call] = truth.cut
    assert truth.event_ids_on(call) == [], "the bridge sent no event id: nothing to resume with"
    assert truth.resumes == [], wire_dump(truth)
    return call




# ================================================================ the cases
# Each test module runs these on its bridges, in observe and enforce mode
# where it says so.


def case_reissued(telemetry, monkeypatch, bridge: Bridge, kind: str, mode: str) -> None:
    """A cut call the application re-issues: ``reissued``, ``not_resumable``."""
    instrument_env(monkeypatch, mode, CONFIRM)

    async def act(client):
        await first_call_fails(client)
        assert await client.call("x") == "done x"

    truth = Truth(run(telemetry, bridge, kind, act))
    call = the_cut_call(truth)
    assert_reissued(truth, call, CONFIRM, wire_dump(truth))

    assert (got := fates(telemetry)) == {"reissued": 1}, (got, wire_dump(truth))
    assert (got := telemetry.outcomes()) == {"not_resumable": 1}, (got, wire_dump(truth))
    assert (got := telemetry.gap_kinds()) == {}, (got, wire_dump(truth))


def case_lost(telemetry, monkeypatch, bridge: Bridge, kind: str, mode: str) -> None:
    """A cut call the application gives up on, then another call (other
    params: not a re-issue): ``lost``, the ``orphaned_request`` gap."""
    instrument_env(monkeypatch, mode, CONFIRM)

    async def act(client):
        await first_call_fails(client)
        assert await client.call("other") == "done other"

    truth = Truth(run(telemetry, bridge, kind, act))
    call = the_cut_call(truth)
    assert truth.fate(call) == "lost"

    assert (got := fates(telemetry)) == {"lost": 1}, (got, wire_dump(truth))
    assert (got := telemetry.outcomes()) == {"not_resumable": 1}, (got, wire_dump(truth))
    assert (got := telemetry.gap_kinds()) == {"orphaned_request": 1}, (got, wire_dump(truth))
    [log] = orphan_logs(telemetry)
    assert log.log_record.attributes["jsonrpc.request.id"] == str(call.id)
    assert log.log_record.attributes["mcp.method.name"] == "tools/call"


def case_clean(telemetry, monkeypatch, bridge: Bridge, kind: str, mode: str) -> None:
    """Nothing cut: no broken request, and the fates' series exist at 0."""
    instrument_env(monkeypatch, mode, CONFIRM)

    async def act(client):
        assert await client.call("x") == "done x"
        assert await client.call("y") == "done y"

    truth = Truth(run(telemetry, bridge, kind, act, cut=False))
    assert not truth.any_severed() and len(truth.calls) == 2, wire_dump(truth)
    assert all(call.answered_on for call in truth.calls), wire_dump(truth)

    assert (got := fates(telemetry)) == {}, (got, wire_dump(truth))
    assert (got := telemetry.gap_kinds()) == {}, (got, wire_dump(truth))
    assert set(telemetry.outcomes()) <= {"resumed", "caught_up"}
    series = {point.attributes.get(FATE): point.value
              for point in telemetry.points(BROKEN)
              if point.attributes.get("server.port") == truth_port(truth)}
    assert series == {"answered": 0, "reissued": 0, "lost": 0}, "the server's fates start at 0"


def truth_port(truth: Truth) -> int:
    host = truth.exchanges[0].request.header("host")
    return int(host.rsplit(":", 1)[1])
