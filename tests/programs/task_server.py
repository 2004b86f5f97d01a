"""A fastmcp-tasks server (the demo's ``task_servers.task_app``: tools
``work(seconds)`` and ``hold()`` run as tasks) on a loopback port, in a
process of its own: the task server of tests/task_stack.py.

    python task_server.py PORT BACKEND_URL NAME

``PORT`` 0 picks a free one. ``BACKEND_URL``: ``memory://`` keeps the tasks in
this process (a restart or another replica does not know them), a
``redis://`` URL shares them. Prints ``ready <url>`` once it serves.
"""

from __future__ import annotations

import socket
import sys

import uvicorn

from mcp_resumption_demo.task_servers import task_app


class _Announcing(uvicorn.Server):
    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        port = self.servers[0].sockets[0].getsockname()[1]
        print(f"ready http://127.0.0.1:{port}/mcp", flush=True)


def main() -> None:
    port, backend, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(task_app(backend, name), log_level="warning", lifespan="on")
    _Announcing(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
