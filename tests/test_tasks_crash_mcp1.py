"""Tasks survive a crash (issue 45), in 2025-11-25's experimental form: an
mcp 1.30 client (``session.experimental``) killed with SIGKILL while it
polls its task leaves the task to the fleet with shared state; once its
lease lapses in Redis, one process of the fleet counts it ``abandoned``,
once, with its WARNING line.  (Adoption by a later poller is not shown
here: mcp 1.30's tasks belong to the session, which dies with the client.)

Real processes (tests/programs/task_mcp1_client.py, under the plugin), mcp
1.30's own task server behind the loopback router (its record is the wire
truth), and a real redis-server.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

from redis_stack import process_env
from task_wire import TaskRouter, switchable

pytest.importorskip("redis")

# mcp 1.30 warns that its experimental tasks API will go: it is what is tested.
pytestmark = [pytest.mark.mcp1, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

PROGRAM = Path(__file__).resolve().parent / "programs" / "task_mcp1_client.py"
CONFIRM = 1.0  # the reissue window, s: the lease of each process
TTL_MS = 8000  # the task's TTL: its abandon time is when it may have run out
SEE_S = 20.0  # how long each sweeping process waits for a count
ABANDONED_LINE = "mcp-resumption task abandoned"
# Bounds a failing wait, never what a passing one waits for.
WAIT_S = 30.0


def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_killed_clients_experimental_task_is_abandoned_once_for_the_fleet(redis_server):
    from test_tasks_mcp1 import ExperimentalServer

    client = redis_server.client()
    client.flushall()
    server = ExperimentalServer()
    router = TaskRouter(switchable(lambda: server, lambda request: False))
    started = threading.Event()
    stop = threading.Event()

    async def serve() -> None:
        await router.start()
        started.set()
        while not stop.is_set():
            await anyio.sleep(0.02)
        await router.close()

    loop = threading.Thread(target=anyio.run, args=(serve,), daemon=True)
    loop.start()
    env = process_env(redis_server.url, CONFIRM)
    try:
        assert started.wait(WAIT_S)
        url = router.url + "/mcp/"
        holder = subprocess.Popen(
            [sys.executable, str(PROGRAM), "hold", url, str(TTL_MS)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            line = holder.stdout.readline()
            assert line, holder.stderr.read().decode()[-3000:]
            task_id = json.loads(line)["task_id"]

            def gets() -> list:
                return [
                    e for e in router.of("tasks/get")
                    if (e.request.jsonrpc.get("params") or {}).get("taskId") == task_id
                ]  # fmt: skip

            until(gets, "the client never polled its task")
            until(
                lambda: any(v.startswith(b"w:") for v in client.hvals("mcpres:v1:th"))
                or len(gets()) >= 3,
                "the client stopped polling its task",
            )
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(WAIT_S)
        assert holder.returncode == -signal.SIGKILL
        until(lambda: not list(client.scan_iter("mcpres:v1:w:*")), "the lease never lapsed")
        polled = len(gets())
        see = [sys.executable, str(PROGRAM), "see", url, str(SEE_S)]
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        seers = [subprocess.Popen(see, env=env, **pipes) for _ in range(2)]
        found = []
        for seer in seers:
            out, err = seer.communicate(timeout=SEE_S + WAIT_S)
            assert seer.returncode == 0, err.decode()[-3000:]
            found.append({**json.loads(out.decode().splitlines()[-1]), "stderr": err.decode()})
    finally:
        stop.set()
        loop.join(WAIT_S)
        server.close()
    # The wire: the handle (working, the TTL asked), the killed client's
    # polls (all working), then nobody's; no cancel.
    (call,) = router.of("tools/call")
    handle = router.answer(call)["result"]["task"]
    assert handle["status"] == "working" and handle["ttl"] == TTL_MS, handle
    assert len(gets()) == polled >= 1
    assert {router.answer(g)["result"]["status"] for g in gets()} == {"working"}
    assert router.of("tasks/cancel") == []
    # Counted once for the fleet, by one of the two processes, with its line.
    assert sorted(f["fates"].get("abandoned", 0) for f in found) == [0, 1], found
    assert all(set(f["fates"]) <= {"abandoned"} for f in found), found
    lines = [line for f in found for line in f["stderr"].splitlines() if ABANDONED_LINE in line]
    assert len(lines) == 1 and "tool=slow" in lines[0], lines
    assert client.keys("mcpres:v1:t*") == [], "taken once, nothing left"
