"""The stdio MCP server the bridges of tests/test_bridges.py put behind
streamable HTTP: the installed MCP SDK major's server, one tool ``work`` that
reports progress once and answers a moment later (so that a stream cut right
after the progress notification is cut before the answer), or, with
``BRIDGED_ANSWER_WHEN=PATH`` in its environment, once that file exists."""

import asyncio
import importlib.metadata
import os
from pathlib import Path

if importlib.metadata.version("mcp").startswith("1."):
    from mcp.server.fastmcp import Context
    from mcp.server.fastmcp import FastMCP as Server
else:
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver import MCPServer as Server

server = Server("bridged")


@server.tool()
async def work(text: str, ctx: Context) -> str:
    await ctx.report_progress(1, 2)
    gate = os.environ.get("BRIDGED_ANSWER_WHEN")
    if gate:
        # A test's gate (a file it creates): the answer comes only once the
        # test has seen the cut it needs, however long that takes.
        for _ in range(3000):  # a bound on a failing test (30 s)
            if Path(gate).exists():
                break
            await asyncio.sleep(0.01)
    else:
        await asyncio.sleep(0.05)
    return "done " + text


if __name__ == "__main__":
    server.run("stdio")
