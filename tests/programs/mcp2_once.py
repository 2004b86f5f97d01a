"""An mcp 2.x client that speaks MCP once: it lists the tools of the server
at the URL given, in the legacy mode (sessions, event ids), and quits.

Its last two lines: the modules of the plugin's package it imported, as a
JSON list, and the time (ns) at which it was done, from which the parent
measures the exit delay."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from mcp import Client

PACKAGE = "opentelemetry.instrumentation.mcp_resumption"


async def main(url: str) -> None:
    async with Client(url, mode="legacy") as client:
        tools = await client.list_tools()
        print("tools:", ",".join(tool.name for tool in tools.tools), flush=True)


asyncio.run(main(sys.argv[1]))
ours = sorted(name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + "."))
print(json.dumps(ours))
print(time.time_ns(), flush=True)
