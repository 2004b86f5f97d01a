"""A real fastmcp-tasks server (FastMCP 4 with the memory backend, in a
thread of its own, restartable) behind the demo's loopback router, which
records every request and the whole body of every answer (JSON or SSE) as
the wire truth, and can cut one answer's body half way.

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
from collections.abc import Callable
from datetime import timedelta

import uvicorn
from fastmcp import FastMCP
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension

from mcp_resumption_demo.router import Backend, Exchange, RequestHead, Route
from wire import WireRouter

# Bounds a failing test's wait, never what a passing one waits for.
GATE_TIMEOUT_S = 30.0


class TaskServer:
    """One fastmcp-tasks server on a loopback port: tools ``crunch``
    (a task that ends at once), ``gated`` (a task that ends when
    ``release`` is set), ``inline`` (never a task) and ``broken`` (a task
    whose tool raises)."""

    def __init__(self, name: str = "a", execution_ttl: timedelta | None = None) -> None:
        self.release = threading.Event()
        self.ended = threading.Event()  # the gated tool returned
        mcp = FastMCP("tasks-" + name)
        mcp.add_extension(TasksExtension(url=f"memory://{name}-{id(self)}"))
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
        return "result" in answer

    def close(self) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)


class TaskRouter(WireRouter):
    """The router, keeping every answer's whole body, and cutting an
    answer's body half way where the policy's route says ``cut_body``."""

    def __init__(self, policy, **kwargs) -> None:
        super().__init__(policy, **kwargs)
        self.bodies: dict[int, bytearray] = {}
        router = self

        def scan(scanner, piece: bytes, route: Route, exchange: Exchange) -> int | None:
            if getattr(route, "cut_body", False) and piece:
                cut = max(1, len(piece) // 2)
                router.bodies.setdefault(exchange.index, bytearray()).extend(piece[:cut])
                return cut
            router.bodies.setdefault(exchange.index, bytearray()).extend(piece)
            return WireRouter._scan(scanner, piece, route, exchange)

        self._scan = scan  # type: ignore[method-assign]

    def answer(self, exchange: Exchange) -> dict | None:
        """The JSON-RPC answer that crossed the wire whole, or None."""
        body = bytes(self.bodies.get(exchange.index, b""))
        if exchange.severed or not body:
            return None
        if (exchange.response_header("content-type") or "").startswith("text/event-stream"):
            for line in body.decode().splitlines():
                if line.startswith("data:") and '"id"' in line:
                    return json.loads(line[5:])
            return None
        return json.loads(body)

    def of(self, method: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.request.jsonrpc_method == method]


def cut_body_route(backend: Backend) -> Route:
    route = Route(backend)
    object.__setattr__(route, "cut_body", True)  # frozen dataclass: an extra flag
    return route


def switchable(current: Callable[[], TaskServer], cut: Callable[[RequestHead], bool]):
    """A policy to whichever server ``current`` names (a restart switches
    it), cutting the answers ``cut`` picks."""

    def policy(request: RequestHead) -> Route:
        backend = Backend("server", current().port)
        return cut_body_route(backend) if cut(request) else Route(backend)

    return policy


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    served = TaskServer("sub")
    print(served.port, flush=True)
    sys.stdin.read()
    served.close()
