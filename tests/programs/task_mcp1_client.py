"""mcp 1.30's client with its experimental tasks (2025-11-25: the call
carries ``task``) instrumented on in-memory providers with the settings of
its environment (the shared state's URL and key among them): one process
of a fleet, for tests/test_tasks_crash.py.

``hold URL TTL_MS``: call ``slow`` as a task, print ``{"task_id"}`` at once,
then poll ``tasks/get`` until a terminal status: the test kills this
process (SIGKILL) while the task is working.

``see URL SECONDS``: connect to the same server, then wait until this
process counted a task's fate, or SECONDS pass.  Prints ``{"fates"}``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from helpers import Telemetry

TASKS = "mcp.client.resumption.tasks"
FATE = "mcp.resumption.task.fate"
TERMINAL = {"completed", "failed", "cancelled"}
# Bounds a failing run, never what a passing one waits for.
FOLLOW_TIMEOUT_S = 60.0

# mcp 1.30 warns that its experimental tasks API will go: it is what is used.
warnings.simplefilter("ignore", DeprecationWarning)


def fates(telemetry: Telemetry) -> dict[str, int]:
    return {fate: n for fate, n in telemetry.counts(TASKS, FATE).items() if n}


async def hold(url: str, ttl_ms: int) -> None:
    async with streamablehttp_client(url) as (reader, writer, _), ClientSession(
        reader, writer
    ) as client:
        await client.initialize()
        await client.list_tools()  # the tool's taskSupport
        created = await client.experimental.call_tool_as_task("slow", {}, ttl=ttl_ms)
        task_id = created.task.taskId
        sys.stdout.write(json.dumps({"task_id": task_id}) + "\n")
        sys.stdout.flush()
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        while time.monotonic() < deadline:
            if (await client.experimental.get_task(task_id)).status in TERMINAL:
                return
            await anyio.sleep(0.2)


async def see(url: str, seconds: float, telemetry: Telemetry) -> None:
    async with streamablehttp_client(url) as (reader, writer, _), ClientSession(
        reader, writer
    ) as client:
        await client.initialize()
        deadline = time.monotonic() + seconds
        while not fates(telemetry) and time.monotonic() < deadline:
            await anyio.sleep(0.02)


def main() -> None:
    telemetry = Telemetry()
    mode, url = sys.argv[1], sys.argv[2]
    with telemetry.instrumented():
        if mode == "hold":
            anyio.run(hold, url, int(sys.argv[3]))
        else:
            anyio.run(see, url, float(sys.argv[3]), telemetry)
    sys.stdout.write(json.dumps({"fates": fates(telemetry)}) + "\n")


if __name__ == "__main__":
    main()
