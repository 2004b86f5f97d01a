# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""The task rows (the io.modelcontextprotocol/tasks extension, 2026-07-28):
FastMCP's own ``Client`` (fastmcp-tasks makes it follow tasks) calls a task
tool of fastmcp-tasks servers (memory backend, ``task_servers``) through
the router, which keeps every answer's whole body: the wire truth.

- ``task_lost_by_restart``: the server is replaced mid-task (a new process
  at the same address): the next ``tasks/get`` is answered "not found";
- ``task_handle_lost``: the router cuts the creating ``tools/call``'s answer
  half way: the task runs on the server, nobody has its handle;
- ``task_fleet_no_shared_store``: two replicas in round robin, each with its
  own task store: the poll lands on the replica that never had the task.

Each row passes only when the plugin counted, by fate, the tasks the wire
gives (``ScenarioWire.counts["tasks"]``). They need fastmcp-tasks (mcp >=
2.3, the demo's ``tasks`` extra): without it they are skipped.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import re
from collections.abc import Callable
from typing import Any

from . import scenarios as _scenarios
from .loopback import LoopbackServer, close_all
from .router import Backend, Exchange, RequestHead, Route, Router
from .scenarios import Scenario, ScenarioWire
from .task_servers import task_app

NOT_FOUND = -32602
# A bound on a failing row's wait, never what a passing one waits for.
WAIT_S = 60.0


def prepare() -> str | None:
    if importlib.util.find_spec("fastmcp_tasks") is None:
        return "fastmcp-tasks is not installed (pip install './demo[tasks]', with mcp 2.x)"
    return None


class _BodyRouter(Router):
    """The router, keeping every answer's whole body (a JSON answer has no
    events to record), and cutting an answer half way where ``cut`` says."""

    def __init__(self, policy: Callable[[RequestHead], Route],
                 cut: Callable[[RequestHead], bool] = lambda request: False) -> None:
        super().__init__(policy)
        self.bodies: dict[int, bytearray] = {}
        router = self

        def scan(scanner: Any, piece: bytes, route: Route, exchange: Exchange) -> int | None:
            body = router.bodies.setdefault(exchange.index, bytearray())
            if cut(exchange.request) and piece:
                half = max(1, len(piece) // 2)
                body.extend(piece[:half])
                return half
            body.extend(piece)
            return Router._scan(scanner, piece, route, exchange)

        self._scan = scan  # type: ignore[method-assign]

    def answer(self, exchange: Exchange) -> dict[str, Any] | None:
        """The JSON-RPC answer that crossed whole, or None."""
        body = bytes(self.bodies.get(exchange.index, b""))
        if exchange.severed or not body:
            return None
        if (exchange.response_header("content-type") or "").startswith("text/event-stream"):
            for line in body.decode(errors="replace").splitlines():
                if line.startswith("data:") and '"id"' in line:
                    return json.loads(line[5:])
            return None
        try:
            return json.loads(body)
        except ValueError:  # not all of it yet
            return None


def _task_fates(router: _BodyRouter) -> dict[str, int]:
    """Each task the wire shows, by the fate its last answer gives: a
    handle followed by polls whose last answer is "not found" is ``lost``,
    a terminal status is that status; a creating call opted into tasks
    whose answer was cut, with a task id in the half that crossed, is
    ``handle_lost``."""
    fates: dict[str, int] = {}
    exchanges = list(router.exchanges)
    for call in (e for e in exchanges if e.request.jsonrpc_method == "tools/call"):
        answer = router.answer(call)
        if answer is None:
            half = bytes(router.bodies.get(call.index, b""))
            if call.severed and re.search(rb'"taskId"\s*:', half):
                fates["handle_lost"] = fates.get("handle_lost", 0) + 1
            continue
        result = answer.get("result") or {}
        if result.get("resultType") != "task":
            continue
        task_id = result.get("taskId")
        polls = [
            e for e in exchanges
            if e.request.jsonrpc_method == "tasks/get"
            and ((e.request.jsonrpc or {}).get("params") or {}).get("taskId") == task_id
        ]  # fmt: skip
        last = router.answer(polls[-1]) if polls else None
        if last is None:
            continue  # no answer to follow: the row's client would be wrong
        if (last.get("error") or {}).get("code") == NOT_FOUND:
            fate = "lost"
        else:
            fate = str((last.get("result") or {}).get("status"))
        fates[fate] = fates.get(fate, 0) + 1
    return fates


async def _serve(name: str, servers: list[LoopbackServer]) -> Backend:
    server = LoopbackServer(task_app(name=name), name=name)
    servers.append(server)
    await server.astart()
    return Backend(name=name, port=server.port)


async def _route(policy: Callable[[RequestHead], Route],
                 cut: Callable[[RequestHead], bool] = lambda request: False) -> _BodyRouter:
    sock = _scenarios.router_sockets.pop(0) if _scenarios.router_sockets else None
    router = await _BodyRouter(policy, cut).start(sock)
    _scenarios.last_router_port = router.port
    return router


async def _call(router: Router, tool: str, arguments: dict[str, Any]) -> str:
    """FastMCP's client calls ``tool`` and follows its task; what it got."""
    import fastmcp_tasks  # noqa: F401  (turns on the Client's task polling)
    from fastmcp import Client

    try:
        async with Client(router.url + "/mcp") as client:
            result = await client.call_tool(tool, arguments)
        return f"result: {result.data}"
    except Exception as error:  # the client's failure is the observation
        return f"{type(error).__name__}: {error}"


def _wire(name: str, router: _BodyRouter) -> ScenarioWire:
    wire = ScenarioWire(name=name, mcp_major=2, transport_before="streamable-http")
    wire.exchanges = list(router.exchanges)
    wire.counts = {"tasks": _task_fates(router)}
    # no request broke but the creating call of a lost handle, which is a
    # task's fate, never also a plain lost call: no broken request's fate
    wire.fates = {}
    return wire


async def _task_lost_by_restart() -> ScenarioWire:
    servers: list[LoopbackServer] = []
    current = [await _serve("a", servers)]
    router = await _route(lambda request: Route(current[0]))
    try:
        # the work outlives the first poll; it ends on the first server
        # meanwhile, so that the server can stop at the end of the row
        call = asyncio.ensure_future(_call(router, "work", {"seconds": 2.0}))

        def working(exchanges: list[Exchange]) -> bool:
            return any(
                e.request.jsonrpc_method == "tasks/get"
                and ((router.answer(e) or {}).get("result") or {}).get("status") == "working"
                for e in exchanges
            )  # fmt: skip

        await router.wait_for(working, timeout=WAIT_S)
        # the replacement takes the address: no request reaches the first
        # process again, as after a restart
        current[0] = await _serve("a-restarted", servers)
        await asyncio.wait_for(call, WAIT_S)
        return _wire("task_lost_by_restart", router)
    finally:
        await router.close()
        await asyncio.to_thread(close_all, servers)


async def _task_handle_lost() -> ScenarioWire:
    servers: list[LoopbackServer] = []
    backend = await _serve("a", servers)
    router = await _route(
        lambda request: Route(backend), cut=lambda r: r.jsonrpc_method == "tools/call"
    )
    try:
        await _call(router, "work", {"seconds": 0.2})
        return _wire("task_handle_lost", router)
    finally:
        await router.close()
        await asyncio.to_thread(close_all, servers)


async def _task_fleet_no_shared_store() -> ScenarioWire:
    servers: list[LoopbackServer] = []
    backends = itertools.cycle([await _serve("a", servers), await _serve("b", servers)])
    router = await _route(lambda request: Route(next(backends)))
    try:
        await _call(router, "work", {"seconds": 0.5})
        return _wire("task_fleet_no_shared_store", router)
    finally:
        await router.close()
        await asyncio.to_thread(close_all, servers)


SCENARIOS = (
    Scenario(
        name="task_lost_by_restart",
        happened=(
            "Tasks (2026-07-28): FastMCP's client calls a task tool of a fastmcp-tasks server "
            "(memory backend) and polls tasks/get while the task is working; the server is "
            "replaced by a new process at the same address, which answers the next poll "
            "-32602 (not found). The work and its result are gone: one task lost."
        ),
        expected_gaps=(),
        expected_outcome=None,
        run=_task_lost_by_restart,
        prepare=prepare,
    ),
    Scenario(
        name="task_handle_lost",
        happened=(
            "Tasks: the router cuts the answer to the creating tools/call (opted into tasks) "
            "half way: the server runs the task, the client never gets its handle, and no "
            "tasks/list can find it. One handle_lost task, and no plain lost call."
        ),
        expected_gaps=(),
        expected_outcome=None,
        run=_task_handle_lost,
        prepare=prepare,
    ),
    Scenario(
        name="task_fleet_no_shared_store",
        happened=(
            "Tasks: two fastmcp-tasks replicas, each with its own memory task store, behind "
            "a round-robin router (FastMCP's client sends no Mcp-Name to route by): the task "
            "is created on one, the poll lands on the other, which answers not found. One "
            "task lost."
        ),
        expected_gaps=(),
        expected_outcome=None,
        run=_task_fleet_no_shared_store,
        prepare=prepare,
    ),
)
