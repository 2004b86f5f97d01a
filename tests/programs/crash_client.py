"""A client of the installed MCP SDK major for the crash test
(tests/test_shared_state_crash.py), instrumented on in-memory providers with
the settings of its environment (the state URL and key among them).

``call URL``: call the tool ``work`` (which never answers) and wait: the
parent kills this process with SIGKILL while the call is in flight.

``see URL SECONDS``: connect to the same server (its first stream makes the
plugin sweep the server's in-flight ledger), then wait until this process
counted a request lost, or SECONDS pass; print one JSON line: the fates
counted and, if any, the wall-clock time of the count.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers, wire

from helpers import Telemetry
from wire import LEGACY, MCP1, MCP_MAJOR, AppClient

KIND = MCP1 if MCP_MAJOR == 1 else LEGACY


async def call(url: str) -> None:
    async with AppClient(KIND, url) as client:
        await client.call("x", timeout=3600)


async def see(url: str, seconds: float, telemetry: Telemetry) -> dict:
    async with AppClient(KIND, url):
        deadline = time.monotonic() + seconds
        while not telemetry.fates() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        fates = telemetry.fates()
        return {"fates": fates, "at": time.time() if fates else None,
                "gaps": telemetry.gap_kinds()}


def main() -> None:
    telemetry = Telemetry()
    with telemetry.instrumented():
        if sys.argv[1] == "call":
            asyncio.run(call(sys.argv[2]))
            return
        found = asyncio.run(see(sys.argv[2], float(sys.argv[3]), telemetry))
    sys.stdout.write(json.dumps(found) + "\n")


if __name__ == "__main__":
    main()
