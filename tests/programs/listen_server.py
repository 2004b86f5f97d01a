"""A 2026-07-28 MCP server (mcp 2.x ``MCPServer``) served the way
docs/server.md advises for a server with open ``subscriptions/listen``
streams: by uvicorn, its graceful shutdown bounded.

    python listen_server.py SECONDS   # prints: serving http://127.0.0.1:PORT/mcp
"""

from __future__ import annotations

import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("listen")


@server.tool()
def echo(text: str) -> str:
    return text


if __name__ == "__main__":
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"serving http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    config = uvicorn.Config(
        server.streamable_http_app(), timeout_graceful_shutdown=float(sys.argv[1])
    )
    uvicorn.Server(config).run(sockets=[sock])
