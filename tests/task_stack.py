"""MCP tasks (the io.modelcontextprotocol/tasks extension, 2026-07-28) on
real stacks, and the wire truth about them.

- :class:`TaskServer`: a fastmcp-tasks server (``tests/programs/task_server.py``)
  in a child process. With the ``memory://`` backend a restarted server
  (:meth:`TaskServer.replaced`), or another replica, does not know the tasks
  the first one handed out; with a ``redis://`` URL every replica shares them.
- :func:`task_wire`: what the loopback router (the demo's router, recording
  every exchange and its response bytes) saw: each JSON-RPC request with its
  ``Mcp-Name`` header, the replica it went to, and its answer. The ground
  truth of the task tests comes from there, never from the plugin.
- :func:`ts_tasks_client`: the TypeScript SDK v2 requester
  (``@modelcontextprotocol/client`` with ``@modelcontextprotocol/ext-tasks``,
  ``tests/tasks_ts/client.mjs``) in a child process.

Needs fastmcp-tasks (mcp 2.x only: the tests that use this are marked
``mcp2``).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from helpers import clean_env, stop_process
from mcp_resumption_demo.router import Backend, Exchange, RequestHead, Route
from wire import message

HERE = Path(__file__).resolve().parent
SERVER = HERE / "programs" / "task_server.py"
TS_DIR = HERE / "tasks_ts"
# fastmcp and Docket take seconds to import on a busy machine: a bound on a
# failing start, not what a passing one waits for.
START_TIMEOUT_S = 120.0
NOT_FOUND = -32602


class TaskServer:
    """``task_server.py PORT BACKEND NAME`` in a child process."""

    def __init__(self, backend: str = "memory://", name: str = "a", port: int = 0,
                 label: str | None = None) -> None:
        self.backend, self.name, self.port = backend, name, port
        # the router's name for it: a replacement is told apart on the wire
        self.label = label or name
        self.starts = 0
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), str(self.port), self.backend, self.name],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
        )  # fmt: skip
        self._stderr: list[str] = []
        threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True).start()
        line = self._first_line()
        assert line.startswith("ready "), (line, "".join(self._stderr)[-3000:])
        self.url = line.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1].split("/", 1)[0])
        self.starts += 1

    def _first_line(self) -> str:
        found: list[str] = []
        reader = threading.Thread(
            target=lambda: found.append(self.process.stdout.readline()), daemon=True
        )
        reader.start()
        reader.join(START_TIMEOUT_S)
        return found[0].strip() if found else ""

    def _drain(self, stream) -> None:
        for line in stream:
            self._stderr.append(line)

    @property
    def backend_of(self) -> Backend:
        return Backend(self.label, self.port)

    def replaced(self) -> TaskServer:
        """A new process of this server (same backend and name, a port of its
        own): what a restart or a redeploy puts behind the same address. The
        caller routes to it, then closes this one, so that no request finds
        the address down (a poll refused while a restart is under way would
        be an outage, not a restart)."""
        return TaskServer(self.backend, self.name, label=f"{self.label}-restarted")

    def close(self) -> None:
        if self.process.poll() is None:
            stop_process(self.process)


class RoundRobin:
    """A policy spreading requests over ``backends`` one request at a time,
    as a balancer without affinity does (it ignores ``Mcp-Name``)."""

    def __init__(self, *backends: Backend) -> None:
        self._next = itertools.cycle(backends)

    def __call__(self, request: RequestHead) -> Route:
        return Route(next(self._next))


@dataclass
class WireCall:
    """One JSON-RPC request as the router forwarded it, and its answer."""

    method: str
    params: dict
    mcp_name: str | None
    backend: str
    answer: dict | None  # the JSON-RPC response, None if none crossed
    exchange: Exchange | None = None  # the router's record of it

    @property
    def result(self) -> dict | None:
        return (self.answer or {}).get("result")

    @property
    def error(self) -> dict | None:
        return (self.answer or {}).get("error")

    @property
    def task_id(self) -> str | None:
        """The task a tasks/* request names, or the one a tools/call created."""
        if self.method.startswith("tasks/"):
            return self.params.get("taskId")
        result = self.result or {}
        return result.get("taskId") if result.get("resultType") == "task" else None

    @property
    def status(self) -> str | None:
        """The task's status in a tools/call handle or a tasks/* answer."""
        return (self.result or {}).get("status")


def _answer(exchange: Exchange, request_id: object) -> dict | None:
    content_type = exchange.response_header("content-type") or ""
    if "text/event-stream" in content_type:
        found = [message(event) for event in exchange.events]
    else:
        raw = getattr(exchange, "raw", b"")
        try:
            found = [json.loads(raw)] if raw else []
        except ValueError:
            found = []
    return next(
        (m for m in found if isinstance(m, dict) and m.get("id") == request_id
         and ("result" in m or "error" in m)),
        None,
    )  # fmt: skip


def task_wire(router) -> list[WireCall]:
    """Every JSON-RPC request the router (a ``proxy_harness.RawRouter``)
    forwarded, in order, with the answer that crossed back."""
    calls = []
    for exchange in router.exchanges:
        request = exchange.request.jsonrpc
        if not request or "method" not in request or "id" not in request:
            continue
        calls.append(WireCall(
            method=request["method"], params=request.get("params") or {},
            mcp_name=exchange.request.header("mcp-name"), backend=exchange.backend,
            answer=_answer(exchange, request["id"]), exchange=exchange,
        ))  # fmt: skip
    return calls


def handles(calls: list[WireCall]) -> list[WireCall]:
    """The tools/call answers that were task handles."""
    return [c for c in calls if c.method == "tools/call" and c.task_id]


def polls(calls: list[WireCall], task_id: str) -> list[WireCall]:
    return [c for c in calls if c.method == "tasks/get" and c.task_id == task_id]


def is_not_found(call: WireCall) -> bool:
    return bool(call.error) and call.error.get("code") == NOT_FOUND


# ================================================================ the TS requester


def ts_tasks_node() -> str:
    """node, with the TypeScript requester installed (scripts/test runs
    ``npm ci`` there; a run of these files alone does it here)."""
    node = shutil.which("node")
    assert node, "node is needed for the TypeScript tasks client"
    if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "ext-tasks").is_dir():
        subprocess.run([shutil.which("npm") or "npm", "ci", "--no-audit", "--no-fund"],
                       cwd=TS_DIR, check=True)  # fmt: skip
    return node


def ts_tasks_client(node: str, url: str, tool: str, arguments: dict,
                    timeout_ms: int = 30000) -> subprocess.Popen:
    """The TS requester calling ``tool`` at ``url`` and following its task;
    :func:`ts_result` reads its one line."""
    return subprocess.Popen(
        [node, str(TS_DIR / "client.mjs"), url, tool, json.dumps(arguments), str(timeout_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def ts_result(process: subprocess.Popen, timeout: float = 60) -> dict:
    stdout, stderr = process.communicate(timeout=timeout)
    lines = stdout.strip().splitlines()
    assert lines, stderr[-3000:]
    return json.loads(lines[-1])
