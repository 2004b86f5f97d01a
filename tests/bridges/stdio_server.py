"""The stdio MCP server the bridges of tests/test_bridges.py put behind
streamable HTTP: the installed MCP SDK major's server, one tool ``work`` that
reports progress once and answers a moment later (so that a stream cut right
after the progress notification is cut before the answer)."""

import asyncio
import importlib.metadata

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
    await asyncio.sleep(0.05)
    return "done " + text


if __name__ == "__main__":
    server.run("stdio")
