"""Interop: the installed MCP SDK major's client against a real TypeScript MCP
SDK server (npm ``@modelcontextprotocol/sdk``, pinned in
demo/src/mcp_resumption_demo/ts_server/package.json, ``StreamableHTTPServerTransport`` with
the package's example ``InMemoryEventStore``), whose tools poll with
``extra.closeSSEStream`` (protocol 2025-11-25).

Each case first proves from the server's own wire log that its scenario
happened, then compares the plugin's verdicts with what that log shows was
lost: a stored message of the request's stream that no response carried.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession

MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
if MCP_MAJOR == 1:
    from mcp.client.streamable_http import streamablehttp_client as connect
else:
    from mcp.client.streamable_http import streamable_http_client as connect

SERVER_DIR = Path(__file__).parents[1] / "demo" / "src" / "mcp_resumption_demo" / "ts_server"
CONFIRM = 0.5  # the confirmation window of these tests, seconds
RETRY_MS = 100  # the TS server's priming retry:
# The example store's ids: <stream uuid>_<epoch ms>_<base36>; the standalone
# GET stream's stream id is "_GET_stream".
TS_ID = re.compile(r"(?:[0-9a-f-]{36}|_GET_stream)_([0-9]{13})_[0-9a-z]{1,8}")


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """scripts/test runs ``npm ci``; a run of this file alone does it here."""
    if not (SERVER_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        npm = shutil.which("npm")
        assert npm, "npm is needed for the TypeScript interop tests"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SERVER_DIR, check=True)
    return SERVER_DIR / "node_modules"


class TsServer:
    """The node server on a loopback port, and its wire log."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.log_path = tmp_path / "wire.jsonl"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.env = {**os.environ, "PORT": str(self.port), "WIRE_LOG": str(self.log_path),
                    "RETRY_MS": str(RETRY_MS), **env}
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        node = shutil.which("node")
        assert node, "node is needed for the TypeScript interop tests"
        self.process = subprocess.Popen(
            [node, "server.mjs"], cwd=SERVER_DIR, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        line = self.process.stdout.readline()
        assert json.loads(line)["port"] == self.port, line

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process.stdout.close()
            self.process.stderr.close()
            self.process = None

    def wire(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        # node may be writing a line right now: only whole lines are read.
        whole, _, _ = self.log_path.read_text().rpartition("\n")
        return [json.loads(line) for line in whole.splitlines() if line]

    def wait_for(self, predicate, timeout: float = 10) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entries = self.wire()
            if predicate(entries):
                return entries
            time.sleep(0.02)
        raise AssertionError("the server's wire never showed it")


@pytest.fixture
def ts(tmp_path, node_modules):
    servers: list[TsServer] = []

    def start(**env: str) -> TsServer:
        servers.append(TsServer(tmp_path, **env))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


class Wire:
    """What the server's log says about one tools/call."""

    def __init__(self, entries: list[dict], tool: str) -> None:
        self.entries = entries
        [self.call] = [
            e for e in entries
            if e["kind"] == "request" and (e["body"] or {}).get("method") == "tools/call"
            and e["body"]["params"]["name"] == tool
        ]
        self.request_id = self.call["body"]["id"]
        frames = [e for e in entries if e["kind"] == "frame" and e["rid"] == self.call["rid"]]
        self.stream_id = frames[0]["id"].rsplit("_", 2)[0]  # the priming event's
        self.resumes = [e for e in entries if e["kind"] == "request" and e["lastEventId"]]
        self.stored = [e for e in entries if e["kind"] == "store"
                       and e["streamId"] == self.stream_id and e["message"]]
        self.sent_ids = {e["id"] for e in entries if e["kind"] == "frame" and e["id"]}
        self.lost = [e for e in self.stored if e["eventId"] not in self.sent_ids]

    def frames(self, rid: int) -> list[dict]:
        return [e for e in self.entries if e["kind"] == "frame" and e["rid"] == rid]

    def status(self, rid: int) -> int:
        return next(e["status"] for e in self.entries if e["kind"] == "status" and e["rid"] == rid)

    def replay(self, rid: int) -> dict:
        request = next(e for e in self.entries if e["kind"] == "request" and e["rid"] == rid)
        return next(e for e in self.entries if e["kind"] == "replay"
                    and e["lastEventId"] == request["lastEventId"] and e["t"] >= request["t"])

    def result_lost(self) -> bool:
        return any(e["message"].get("id") == self.request_id for e in self.lost)


async def _call(url: str, tool: str, arguments: dict, timeout: float):
    async with connect(url) as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        with anyio.fail_after(timeout):
            return await session.call_tool(tool, arguments)


# How long after a resumed stream ends the plugin waits for the client to
# resume it again before its pending requests are orphaned (retry + window).
GRACE = RETRY_MS / 1000 + CONFIRM


def call(telemetry, server: TsServer, tool: str, arguments: dict, *, timeout: float = 10,
         during=None, settle: str | None = None, linger: float = 0):
    """The call, instrumented in-process; ``during`` runs in a thread meanwhile.
    Still instrumented after it, waits for a ``settle`` gap kind (decided on
    the lineage's deadline) or ``linger`` seconds for one that must not come."""
    with telemetry.instrumented(confirm_timeout=CONFIRM):
        try:
            return _run_call(server, tool, arguments, timeout, during)
        finally:
            if settle is not None:
                wait_for_gap(telemetry, settle)
            deadline = time.monotonic() + linger
            while time.monotonic() < deadline and "orphaned_request" not in telemetry.gap_kinds():
                time.sleep(0.02)


def _run_call(server, tool, arguments, timeout, during):
    async def main():
        if during is None:
            return await _call(server.url, tool, arguments, timeout)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(anyio.to_thread.run_sync, during)
            return await _call(server.url, tool, arguments, timeout)

    try:
        return asyncio.run(main())
    except Exception as error:  # the scenario decides what the call may do
        return error


def wait_for_gap(telemetry, kind: str, timeout: float = 5) -> None:
    """The lineage's end is decided on a deadline (retry + window): wait for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and kind not in telemetry.gap_kinds():
        time.sleep(0.02)


def text_of(result) -> str | None:
    content = getattr(result, "content", None)
    return content[0].text if content else None


def assert_ts_ids(wire: Wire) -> None:
    for event_id in wire.sent_ids:
        assert TS_ID.fullmatch(event_id), event_id


# ------------------------------------------------------------------ cases


def test_faithful_resume(telemetry, ts):
    server = ts()
    result = call(telemetry, server, "poll", {"cuts": 1, "before_result_ms": 300})
    wire = Wire(server.wire(), "poll")
    # The scenario: one cut, one resume after the priming event's retry:,
    # the result written live on the resumed stream.
    assert [f["retry"] for f in wire.frames(wire.call["rid"])][:1] == [RETRY_MS]
    [resume] = wire.resumes
    assert wire.status(resume["rid"]) == 200 and wire.replay(resume["rid"])["streamId"]
    assert any('"done"' in (f["data"] or "") for f in wire.frames(resume["rid"]))
    assert all(f["data"] for f in wire.frames(resume["rid"])), "no priming on a replay stream"
    assert wire.lost == []
    assert_ts_ids(wire)
    # The verdict: nothing lost; opaque ids prove no order, so unverifiable.
    assert text_of(result) == "done"
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"unverifiable": 1}


def test_result_that_arrives_while_the_client_is_away(telemetry, ts):
    server = ts()
    result = call(telemetry, server, "poll", {"cuts": 1})
    wire = Wire(server.wire(), "poll")
    [resume] = wire.resumes
    [stored] = [e for e in wire.stored if e["message"].get("id") == wire.request_id]
    assert stored["t"] <= resume["t"], "the result was stored before the client came back"
    assert [f["id"] for f in wire.frames(resume["rid"])] == [stored["eventId"]]  # replayed
    assert wire.lost == []
    assert text_of(result) == "done"
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"unverifiable": 1}


def test_two_cuts_of_one_request(telemetry, ts):
    server = ts()
    result = call(telemetry, server, "poll", {"cuts": 2, "away_ms": 400}, linger=GRACE + 0.5)
    wire = Wire(server.wire(), "poll")
    first, second = wire.resumes
    assert second["lastEventId"] == wire.frames(first["rid"])[-1]["id"]
    assert any('"done"' in (f["data"] or "") for f in wire.frames(second["rid"]))
    assert wire.lost == []
    assert text_of(result) == "done"
    # Once: orphaned_request when the first resumed stream ended.
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"unverifiable": 2}


def test_quiet_poll_longer_than_the_confirmation_window(telemetry, ts):
    server = ts()
    result = call(telemetry, server, "poll", {"cuts": 1, "before_result_ms": int(CONFIRM * 3000)})
    wire = Wire(server.wire(), "poll")
    [resume] = wire.resumes
    opened = next(e["t"] for e in wire.entries if e["kind"] == "status"
                  and e["rid"] == resume["rid"])
    [answer] = wire.frames(resume["rid"])
    assert (answer["t"] - opened) / 1000 > 2 * CONFIRM, "the poll was silent past the window"
    assert wire.lost == []
    assert text_of(result) == "done"
    # Once: replay_unconfirmed when the window passed.
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"unverifiable": 1}


def test_burst_across_the_cut(telemetry, ts):
    """Notifications written in one go around the cut share a millisecond;
    the example store replays by sorting ids, so some come back out of order
    and those sorted before the cursor are never sent."""
    server = ts()
    result = call(telemetry, server, "poll", {"cuts": 1, "burst": 20}, timeout=3,
                  linger=GRACE + 0.5)
    wire = Wire(server.wire(), "poll")
    [resume] = wire.resumes
    replayed = [f["id"] for f in wire.frames(resume["rid"])]
    assert replayed == sorted(replayed), "the store replays in id order, not delivery order"
    millis = {TS_ID.fullmatch(e["eventId"]).group(1) for e in wire.stored}
    assert len(millis) < len(wire.stored), "the burst shared milliseconds"
    if wire.result_lost():
        # The answer itself was not replayed: the call never completes.
        assert text_of(result) is None
        assert "orphaned_request" in telemetry.gap_kinds()
        assert "resumed" not in telemetry.outcomes()
    elif wire.lost:
        # Only notifications lost: the ids are opaque, the plugin cannot see it
        # and says so (unverifiable), never "resumed".
        assert text_of(result) == "done"
        assert telemetry.outcomes() == {"unverifiable": 1}
    else:
        assert text_of(result) == "done"
        assert telemetry.gap_kinds() == {}


def test_store_that_lost_the_cursor(telemetry, ts):
    server = ts(KEEPALIVE_MS="100")
    result = call(telemetry, server, "poll", {"cuts": 1, "forget": True,
                                              "before_result_ms": 200}, timeout=2,
                  settle="orphaned_request")
    wire = Wire(server.wire(), "poll")
    [resume] = wire.resumes
    # An unknown Last-Event-ID: 200, text/event-stream, no event, keepalives.
    assert wire.status(resume["rid"]) == 200
    assert wire.replay(resume["rid"])["streamId"] == ""
    assert wire.frames(resume["rid"]) == []
    assert any(e["kind"] == "keepalive" and e["rid"] == resume["rid"] for e in wire.entries)
    assert wire.result_lost()
    assert text_of(result) is None  # the call timed out
    # The resume was a poll (priming event, retry:, clean close), so its
    # silence alone proved nothing until the client gave up on it (it deleted
    # the session): nothing confirmed, and the lineage ended without the answer.
    assert telemetry.gap_kinds() == {"replay_unconfirmed": 1, "orphaned_request": 1}
    assert telemetry.outcomes() == {"gap": 1}


def _reconnects_after(monkeypatch, event: threading.Event) -> None:
    """The MCP SDK client's reconnect delay is ``event``: it resumes as soon
    as what the test prepares (a restarted process) is ready, however long
    a loaded machine takes to prepare it, and never before."""
    import mcp.client.streamable_http as transport

    real = transport.anyio

    class Gated:
        def __getattr__(self, name: str):
            return getattr(real, name)

        @staticmethod
        async def sleep(delay: float) -> None:
            await real.to_thread.run_sync(event.wait, 60)

    monkeypatch.setattr(transport, "anyio", Gated())


def test_restarted_server(telemetry, ts, monkeypatch):
    # The client comes back once node has restarted, so that the resume meets
    # the new process (a resume that finds nothing listening is another
    # test's case).  The retry the server asks for is long, so that the
    # plugin waits for that resume however long the restart takes (the
    # client's delay is the restart itself).
    server = ts(RETRY_MS="60000")
    restarted = threading.Event()
    _reconnects_after(monkeypatch, restarted)

    def restart() -> None:
        server.wait_for(lambda entries: any(e.get("step") == "cut" for e in entries))
        server.stop()
        server.start()
        restarted.set()

    result = call(telemetry, server, "poll", {"cuts": 1, "before_result_ms": 200},
                  timeout=12, during=restart, settle="orphaned_request")
    entries = server.wire()
    wire = Wire(entries, "poll")
    assert wire.resumes, "the client resumed after the restart"
    for resume in wire.resumes:
        assert wire.status(resume["rid"]) == 404
        body = next(e["body"] for e in entries if e["kind"] == "end" and e["t"] >= resume["t"]
                    and e["rid"] == resume["rid"])
        assert json.loads(body)["error"]["code"] == -32001
    assert not any(e["message"].get("id") == wire.request_id for e in wire.stored)
    assert text_of(result) is None  # the answer died with the process
    kinds = telemetry.gap_kinds()
    assert kinds == {"orphaned_request": 1}
    assert set(telemetry.outcomes()) <= {"gap", "rejected"}


def test_standalone_get_stream(telemetry, ts):
    server = ts()
    result = call(telemetry, server, "announce", {"away_ms": 1500})
    entries = server.wire()
    gets = [e for e in entries if e["kind"] == "request" and e["method"] == "GET"]
    first = gets[0]
    frames = [e for e in entries if e["kind"] == "frame" and e["rid"] == first["rid"]]
    assert [f["id"].split("_")[1:3] for f in frames] == [["GET", "stream"]]
    [resume] = [g for g in gets if g["lastEventId"]]
    assert resume["lastEventId"] == frames[0]["id"]
    replay = next(e for e in entries if e["kind"] == "replay")
    assert replay["streamId"] == ""  # the example store cannot resume "_GET_stream"
    stored = [e for e in entries if e["kind"] == "store" and e["streamId"] == "_GET_stream"]
    sent = {e["id"] for e in entries if e["kind"] == "frame"}
    lost = [e for e in stored if e["eventId"] not in sent]
    assert [e["message"]["params"]["data"] for e in lost] == ["announce 2"]
    assert text_of(result) == "announced"
    # The GET stream has no priming event and no retry: not a poll; the window
    # applies, and the truth is a loss.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not telemetry.outcomes():
        time.sleep(0.02)
    assert telemetry.gap_kinds() == {"replay_unconfirmed": 1}
    assert telemetry.outcomes() == {"gap": 1}


def test_ts_facts_unknown_session_and_cursor(ts):
    """The facts the rules rely on, from the raw wire: an unknown session is
    404 -32001; an unknown Last-Event-ID is 200 with keepalives only."""
    import httpx

    server = ts(KEEPALIVE_MS="100")
    headers = {"accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-11-25"}
    with httpx.Client(timeout=5) as client:
        answer = client.get(server.url, headers={**headers, "mcp-session-id": "nope"})
        assert answer.status_code == 404 and answer.json()["error"]["code"] == -32001
        init = client.post(server.url, headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}})
        session = init.headers["mcp-session-id"]
        resume = {**headers, "mcp-session-id": session, "last-event-id": "x_1_abc"}
        with client.stream("GET", server.url, headers=resume) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = response.iter_lines()
            seen = [next(lines) for _ in range(4)]
    assert [line for line in seen if line] == [": keepalive", ": keepalive"]
