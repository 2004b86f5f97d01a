"""A FastMCP client (fastmcp_tasks imported: it drives tasks) instrumented on
in-memory providers with the settings of its environment (the shared state's
URL and key among them): one process of a fleet, for
tests/test_tasks_handover.py.

``handle URL TOOL``: call ``TOOL`` as a task, take the handle, and exit
without following it (the process's exit is where its open tasks are
settled).  Prints ``{"task_id", "fates"}``: the fates this process counted.

``follow URL TASK_ID``: a restarted client that kept the task id: poll
``tasks/get`` with it until a terminal status.  Prints ``{"status",
"fates"}``.

``hold URL TOOL``: call ``TOOL`` as a task, print ``{"task_id"}`` at once,
then follow it (poll ``tasks/get``) until a terminal status: the test kills
this process (SIGKILL) while the task is working.

``see URL SECONDS``: connect to the same server, then wait until this
process counted a task's fate, or SECONDS pass.  Prints ``{"fates"}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers

import fastmcp_tasks  # noqa: F401  (FastMCP's Client drives tasks once imported)
from fastmcp import Client
from fastmcp_tasks import call_tool_task
from fastmcp_tasks.client import _send_get

from helpers import Telemetry

TASKS = "mcp.client.resumption.tasks"
FATE = "mcp.resumption.task.fate"
TERMINAL = {"completed", "failed", "cancelled"}
# Bounds a failing run, never what a passing one waits for.
FOLLOW_TIMEOUT_S = 60.0


def fates(telemetry: Telemetry) -> dict[str, int]:
    return {fate: n for fate, n in telemetry.counts(TASKS, FATE).items() if n}


async def handle(url: str, tool: str) -> str:
    async with Client(url) as client:
        task = await call_tool_task(client, tool, {"n": 1})
        return task.task_id


async def follow(url: str, task_id: str) -> str:
    async with Client(url) as client:
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        while True:
            status = (await _send_get(client.session, task_id)).status
            if status in TERMINAL or time.monotonic() > deadline:
                return status
            await asyncio.sleep(0.2)


async def hold(url: str, tool: str) -> None:
    async with Client(url) as client:
        task = await call_tool_task(client, tool, {"n": 1})
        sys.stdout.write(json.dumps({"task_id": task.task_id}) + "\n")
        sys.stdout.flush()
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        while time.monotonic() < deadline:
            if (await _send_get(client.session, task.task_id)).status in TERMINAL:
                return
            await asyncio.sleep(0.2)


async def see(url: str, seconds: float, telemetry: Telemetry) -> None:
    async with Client(url) as client:
        await client.list_tools()
        deadline = time.monotonic() + seconds
        while not fates(telemetry) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


def main() -> None:
    telemetry = Telemetry()
    mode, url = sys.argv[1], sys.argv[2]
    found: dict = {}
    with telemetry.instrumented():
        if mode == "handle":
            found["task_id"] = asyncio.run(handle(url, sys.argv[3]))
        elif mode == "hold":
            asyncio.run(hold(url, sys.argv[3]))
        elif mode == "follow":
            found["status"] = asyncio.run(follow(url, sys.argv[3]))
        else:
            asyncio.run(see(url, float(sys.argv[3]), telemetry))
    found["fates"] = fates(telemetry)  # the exit's counts included
    sys.stdout.write(json.dumps(found) + "\n")


if __name__ == "__main__":
    main()
