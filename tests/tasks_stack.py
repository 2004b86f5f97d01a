"""A real fastmcp-tasks server (FastMCP 4 with the memory backend, in a
thread of its own, restartable), to put behind ``task_wire.TaskRouter``.

Used by tests/test_tasks.py, and run as a program by its subprocess tests
(``python tasks_stack.py serve``: prints the port, serves until stdin closes).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
import urllib.request
from datetime import timedelta

import uvicorn
from fastmcp import FastMCP
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension

from task_wire import TaskRouter, cut_body_route, switchable

__all__ = ["TaskRouter", "TaskServer", "cut_body_route", "switchable"]

# Bounds a failing test's wait, never what a passing one waits for.
GATE_TIMEOUT_S = 30.0


class TaskServer:
    """One fastmcp-tasks server on a loopback port: tools ``crunch``
    (a task that ends at once), ``gated`` (a task that ends when
    ``release`` is set), ``inline`` (never a task) and ``broken`` (a task
    whose tool raises)."""

    def __init__(
        self, name: str = "a", execution_ttl: timedelta | None = None, store: str | None = None
    ) -> None:
        """``store``: a Redis URL the task store lives in (a restarted server
        finds its tasks there), else the memory backend (they die with it)."""
        self.release = threading.Event()
        self.ended = threading.Event()  # the gated tool returned
        self.store = store
        mcp = FastMCP("tasks-" + name)
        url = store or f"memory://{name}-{id(self)}"
        mcp.add_extension(TasksExtension(url=url, name="tasks-test"))
        release, ended = self.release, self.ended

        @mcp.tool(task=True)
        async def crunch(n: int) -> str:
            return f"crunched {n}"

        @mcp.tool(task=TaskConfig(mode="optional", poll_interval=timedelta(seconds=1)))
        async def gated(n: int) -> str:
            while not release.is_set():
                await asyncio.sleep(0.02)
            ended.set()
            return f"gated {n}"

        @mcp.tool
        async def inline(n: int) -> str:
            return f"inline {n}"

        @mcp.tool(task=True)
        async def broken(n: int) -> str:
            raise ValueError("the tool failed")

        self.mcp = mcp
        self.execution_ttl = execution_ttl
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(mcp.http_app(path="/mcp"), log_level="critical")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if execution_ttl is not None:
            self.mcp._docket.execution_ttl = execution_ttl

    def knows(self, task_id: str) -> bool:
        """Asked of the server directly (urllib: no plugin sees it): whether
        ``tasks/get`` still finds the task."""
        return self.status(task_id) is not None

    def status(self, task_id: str) -> str | None:
        """The task's status as the server answers ``tasks/get`` to a request
        of the test's own (urllib: no plugin sees it); None: not found."""
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tasks/get",
                "params": {
                    "taskId": task_id,
                    "_meta": {
                        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
                        "io.modelcontextprotocol/clientCapabilities": {
                            "extensions": {"io.modelcontextprotocol/tasks": {}}
                        },
                    },
                },
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/mcp",
            data=body,
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2026-07-28",
                "Mcp-Method": "tasks/get",
                "Mcp-Name": task_id,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as error:
            answer = json.loads(error.read())
        return answer["result"]["status"] if "result" in answer else None

    def close(self) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    served = TaskServer("sub")
    print(served.port, flush=True)
    sys.stdin.read()
    served.close()
