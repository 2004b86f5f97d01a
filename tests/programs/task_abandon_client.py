"""A FastMCP client (fastmcp_tasks imported: it polls tasks) that calls a
task tool, gives up waiting after a second without tasks/cancel, and exits:
its task is abandoned.  Run under ``opentelemetry-instrument`` by
tests/test_tasks.py; the URL is argv[1]."""

import asyncio
import sys

import fastmcp_tasks  # noqa: F401  (FastMCP's Client drives tasks once imported)
from fastmcp import Client


async def main(url: str) -> None:
    async with Client(url) as client:
        try:
            await client.call_tool("gated", {"n": 1}, timeout=1)
        except TimeoutError as error:
            print("gave up:", error, flush=True)


asyncio.run(main(sys.argv[1]))
