"""A FastMCP server running its tools as tasks (fastmcp-tasks, the
io.modelcontextprotocol/tasks extension on Docket), on a loopback port:
the task server of tests/task_stack.py.

    python task_server.py PORT BACKEND_URL NAME

``PORT`` 0 picks a free one. ``BACKEND_URL``: ``memory://`` keeps the tasks in
this process (a restart or another replica does not know them), a
``redis://`` URL shares them. Prints ``ready <url>`` once it serves. Its
tools:

- ``work(seconds)``: sleeps, then answers ``done by <NAME>``: a task that
  completes;
- ``hold()``: never ends, a task still ``working`` when the server is
  restarted or another replica is asked about it.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
from fastmcp import FastMCP
from fastmcp_tasks import TasksExtension


def build(backend: str, name: str) -> FastMCP:
    mcp = FastMCP(f"tasks-{name}")
    mcp.add_extension(TasksExtension(url=backend))

    @mcp.tool(task=True)
    async def work(seconds: float = 0.2) -> str:
        await asyncio.sleep(seconds)
        return f"done by {name}"

    @mcp.tool(task=True)
    async def hold() -> str:
        await asyncio.Event().wait()
        return "never"

    return mcp


class _Announcing(uvicorn.Server):
    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        port = self.servers[0].sockets[0].getsockname()[1]
        print(f"ready http://127.0.0.1:{port}/mcp", flush=True)


def main() -> None:
    port, backend, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    app = build(backend, name).http_app(path="/mcp")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    _Announcing(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
