# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""FastMCP servers that run their tools as tasks (fastmcp-tasks, the
io.modelcontextprotocol/tasks extension of 2026-07-28, on Docket): the
servers of the task rows (a task lost by a restart, a lost handle, a fleet
without a shared task store) and of the task tests.

fastmcp-tasks needs mcp >= 2.3 (``pip install 'mcp-resumption-demo[tasks]'``
next to mcp 2.x); it is imported when a server is built, so the rest of the
demo runs on mcp 1.x without it.

With the ``memory://`` backend each server instance keeps its tasks to
itself (two instances in one process do not share them either): a restarted
server, or another replica, answers ``-32602`` "not found" for a task the
first one handed out. A ``redis://`` URL shared by every replica keeps them.
"""

from __future__ import annotations

import asyncio
from typing import Any

MEMORY = "memory://"


def task_server(backend: str = MEMORY, name: str = "a") -> Any:
    """A FastMCP server named ``tasks-<name>`` with two task tools:
    ``work(seconds)`` sleeps, then answers ``done by <name>``; ``hold()``
    never ends (a task still ``working`` when its server goes away)."""
    from fastmcp import FastMCP
    from fastmcp_tasks import TasksExtension

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


def task_app(backend: str = MEMORY, name: str = "a", path: str = "/mcp") -> Any:
    """The ASGI app of :func:`task_server` on streamable HTTP at ``path``
    (for :class:`mcp_resumption_demo.loopback.LoopbackServer`)."""
    return task_server(backend, name).http_app(path=path)
