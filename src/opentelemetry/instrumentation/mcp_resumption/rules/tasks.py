# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""``TaskLedger``: every MCP task the client was handed, followed to one fate.

Pure: standard library only, and not thread-safe on its own (the owner calls
it under its own lock).  It is fed the facts the patches already produce: a
request sent (``sent``), its answer read (``answered``: a JSON body, or the
SSE event that carried it), an answer that never came (``unanswered``), a
creating call lost with its stream (``call_lost``), and the client that stops
waiting (``stop_waiting``); it returns the tasks each fact ended
(:class:`Ended`), for the owner to report.  It never sees an SSE event that
is not the answer to a request it follows: it costs nothing per event.

Two forms of tasks are read:

* ``2026-07-28``: the ``io.modelcontextprotocol/tasks`` extension.  A
  ``tools/call`` that opted in (its ``_meta`` declares the extension among the
  client's capabilities) may be answered ``resultType: "task"`` with
  ``taskId``, ``status``, ``createdAt``, ``ttlMs``, ``pollIntervalMs``;
  ``tasks/get`` answers the status, a terminal one with the result (or error)
  inlined; ``tasks/update``, ``tasks/cancel``; ``notifications/tasks``.
* ``2025-11-25``: the experimental form.  A ``tools/call`` whose params carry
  ``task`` is answered ``{"task": {taskId, status, createdAt, ttl,
  pollInterval}}``; ``tasks/get`` answers the status, ``tasks/result`` the
  result, ``tasks/list``, ``tasks/cancel``; ``notifications/tasks/status``.
  A ``completed`` status says the result is ready: the task is ``completed``
  when the client reads it (``tasks/result``), or when it stops waiting
  without reading it (it saw the terminal status).

The fates (``Fate``), one per task:

* ``completed``, ``failed``, ``cancelled``: a terminal status the client saw.
  ``cancelled`` proves the server *labelled* the task cancelled, not that the
  work stopped (fastmcp-tasks labels it at once, mcp 1.30's default cancel
  only relabels it while the work runs on).
* ``lost``: the server answered "not found" for a handle it gave out, before
  the task's TTL could have run out (or, on 2025-11-25, 404 for the session
  the task belonged to).
* ``expired``: the same answer once the TTL may have run out.  Servers answer
  an expired task exactly as an unknown one, and count the TTL from different
  moments (the specification suggests ``createdAt``; fastmcp-tasks starts it
  when the task ends).  The rule: the TTL runs from the latest moment the
  client saw the task alive or ending: the handle (its ``createdAt``, or when
  it was received if later) or the last status the client read (its
  ``lastUpdatedAt``, or when it was read if later).  A "not found" before that
  moment plus the TTL is ``lost``; at or after it, ``expired``.  A task
  without a TTL (``null``) never expires.
* ``abandoned``: the client stopped following the task before it was
  terminal: the process exited, or the application gave up waiting without
  ``tasks/cancel``.  Work may run that no one will read.
* ``handle_lost``: the creating ``tools/call`` could have become a task and
  its answer (the handle) never came: its stream broke, or its body was cut.
  A task may run that nobody can find.  It could have become a task when the
  request opted in and the server may run it as one: on 2026-07-28, the
  request declares the extension and the server declared it in
  ``server/discover`` (or its discovery was not seen); on 2025-11-25, the
  request carries ``task`` and the tool's ``execution.taskSupport`` in
  ``tools/list`` is not ``forbidden`` (or the list was not seen).  On
  2025-11-25 ``tasks/list`` may find the task again; it is still
  ``handle_lost``: no SDK client looks for it there, and the count says the
  handle was lost, not that the work is.

A ``tasks/cancel`` the server acknowledged, followed by a ``completed``
status, is a cancel not honoured: the work ran (``Ended.cancel_ignored``).

The open tasks are a bounded table: the least recently used is dropped past
``max_tasks`` (counted in ``dropped``), with no fate.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .task_handover import HandedTask

__all__ = [
    "EXTENSION",
    "LOSSES",
    "Ended",
    "Fate",
    "TaskLedger",
    "TaskRequest",
    "task_methods",
]

EXTENSION = "io.modelcontextprotocol/tasks"
# -32602 Invalid params: what both forms answer for an unknown or expired task.
NOT_FOUND = -32602
# The open tasks kept before the least recently used is dropped.
MAX_TASKS = 10_000
# The tools/list hints and discovered servers kept (dicts emptied when full).
MAX_SERVERS = 1024
MAX_TOOLS = 4096

_TERMINAL = frozenset({"completed", "failed", "cancelled"})
# The methods whose request or answer this ledger reads.
_FOLLOWED = frozenset(
    {
        "tools/call",
        "tools/list",
        "server/discover",
        "tasks/get",
        "tasks/result",
        "tasks/update",
        "tasks/cancel",
    }
)
MODERN = "2026-07-28"
EXPERIMENTAL = "2025-11-25"


class Fate(str, enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    EXPIRED = "expired"
    ABANDONED = "abandoned"
    HANDLE_LOST = "handle_lost"


# The fates that lost something: a WARNING line each.
LOSSES = frozenset({Fate.LOST, Fate.EXPIRED, Fate.ABANDONED, Fate.HANDLE_LOST})


def task_methods() -> frozenset[str]:
    """The JSON-RPC methods the ledger reads the requests and answers of."""
    return _FOLLOWED


@dataclass
class TaskRequest:
    """One request the ledger follows, kept by the caller until its answer
    (or its loss) is told."""

    server: str
    method: str
    key: str
    tool: str | None = None
    task_id: str | None = None
    # A tools/call: the form it opted into tasks in (MODERN, EXPERIMENTAL),
    # None when it did not opt in.
    form: str | None = None
    tag: Any = None  # the caller's, handed back in Ended


@dataclass
class Ended:
    """A task's one fate, for the caller to report."""

    fate: Fate
    server: str
    task_id: str | None  # None: a handle that never came
    tool: str | None
    form: str
    duration: float | None  # s, from the handle to the fate; None: no handle
    polls: int
    cancel_ignored: bool = False
    tag: Any = None
    # The keyed hash of the task id, where only it is known (a task another
    # process handed to the fleet, decided without its id).
    task_hash: str | None = None


@dataclass
class _Task:
    server: str
    task_id: str
    tool: str | None
    form: str
    tag: Any
    received: float  # time.monotonic() of the handle
    alive_wall: float  # epoch s: the latest moment it was seen alive or ending
    ttl_s: float | None
    polls: int = 0
    cancel_acked: bool = False
    status: str = "working"
    # 2025-11-25: a completed status seen, its result not read yet.
    result_due: bool = False


@dataclass
class _Server:
    declared: bool | None = None  # server/discover named the extension
    task_support: dict[str, str] = field(default_factory=dict)  # tool -> taskSupport


class TaskLedger:
    """The tasks of every server, open until their fate."""

    def __init__(self, max_tasks: int = MAX_TASKS) -> None:
        self.max_tasks = max_tasks
        self._open: OrderedDict[tuple[str, str], _Task] = OrderedDict()
        self._servers: dict[str, _Server] = {}
        self.dropped = 0
        # The tasks opened (a handle, an adoption) since the owner last took
        # them (``take_opened``): with shared state their records are held
        # in the fleet.  Bounded as the table is.
        self._opened: list[_Task] = []

    def __len__(self) -> int:
        return len(self._open)

    # ------------------------------------------------------------ requests

    def sent(
        self, server: str, key: str, method: str, params: Any, tag: Any = None
    ) -> TaskRequest | None:
        """A request went out; the record to hand back with its answer, or
        None when it is nothing the ledger follows."""
        if method not in _FOLLOWED or (not isinstance(params, dict) and params is not None):
            return None
        params = params or {}
        request = TaskRequest(server, method, key, tag=tag)
        if method == "tools/call":
            name = params.get("name")
            request.tool = name if isinstance(name, str) else None
            request.form = _opted_in(params)
        elif method.startswith("tasks/"):
            task_id = params.get("taskId")
            if not isinstance(task_id, str):
                return None
            request.task_id = task_id
            task = self._open.get((server, task_id))
            if task is not None:
                self._open.move_to_end((server, task_id))
                if method == "tasks/get":
                    task.polls += 1
                request.tool = task.tool
        return request

    def answered(
        self, request: TaskRequest, message: dict[str, Any], wall: float | None = None
    ) -> list[Ended]:
        """The JSON-RPC response to ``request`` was read."""
        wall = time.time() if wall is None else wall
        result, error = message.get("result"), message.get("error")
        method = request.method
        if method == "server/discover":
            if isinstance(result, dict):
                self._server(request.server).declared = _declares(result)
            return []
        if method == "tools/list":
            if isinstance(result, dict):
                self._tools_listed(request.server, result.get("tools"))
            return []
        if method == "tools/call":
            if isinstance(result, dict):
                self._handle(request, result, wall)
            return []
        task = self._open.get((request.server, request.task_id or ""))
        if task is None:
            return []
        if isinstance(error, dict):
            if error.get("code") == NOT_FOUND:
                return [self._not_found(task, wall)]
            return []  # another refusal: the client may ask again
        if not isinstance(result, dict):
            return []
        if method == "tasks/result":
            # 2025-11-25: the result itself, read.
            failed = task.status == "failed"
            return [self._end(task, Fate.FAILED if failed else Fate.COMPLETED)]
        if method == "tasks/cancel":
            task.cancel_acked = True
        return self._status(task, result, wall)

    def gone(self, request: TaskRequest, wall: float | None = None) -> list[Ended]:
        """The server no longer knows the session ``request`` was sent in
        (HTTP 404 to a session id, 2025-11-25): its tasks belonged to that
        session, so the task it names is gone, as a "not found" would say."""
        task = self._open.get((request.server, request.task_id or ""))
        if task is None:
            return []
        return [self._not_found(task, time.time() if wall is None else wall)]

    def notified(
        self, server: str, params: Any, wall: float | None = None
    ) -> list[Ended]:
        """``notifications/tasks`` (2026-07-28) or ``notifications/tasks/status``
        (2025-11-25): a task's status, pushed."""
        if not isinstance(params, dict):
            return []
        task_id = params.get("taskId")
        task = self._open.get((server, task_id)) if isinstance(task_id, str) else None
        if task is None:
            return []
        return self._status(task, params, time.time() if wall is None else wall)

    def unanswered(self, request: TaskRequest) -> list[Ended]:
        """The answer to ``request`` never came (its body was cut, the
        connection died after it was sent): a creating call that could have
        become a task lost its handle.  Other requests: the client may ask
        again, nothing is decided."""
        if request.method == "tools/call" and self.may_become_task(request):
            return [self._handle_lost(request)]
        return []

    def call_lost(self, request: TaskRequest) -> Ended | None:
        """A creating call's stream broke and its answer never came (the
        request ledger decided it lost): its ``handle_lost`` if it could have
        become a task (then it is no plain lost call), else None."""
        if request.method == "tools/call" and self.may_become_task(request):
            return self._handle_lost(request)
        return None

    def may_become_task(self, request: TaskRequest) -> bool:
        """The request opted into tasks and its server may run it as one."""
        if request.form is None:
            return False
        server = self._servers.get(request.server)
        if request.form == MODERN:
            return server is None or server.declared is not False
        support = server.task_support.get(request.tool or "") if server else None
        return support != "forbidden"

    def stop_waiting(self) -> list[Ended]:
        """The client stops following every task (the process exits): those
        not terminal are abandoned; a 2025-11-25 task whose completed status
        the client saw, without reading the result, is completed."""
        ended = [
            self._end(task, Fate.COMPLETED if task.result_due else Fate.ABANDONED)
            for task in list(self._open.values())
        ]
        return ended

    def hand_over(self) -> tuple[list[Ended], list[tuple[str, str, HandedTask, Ended]]]:
        """The client stops following every task, with a fleet to hand them
        to (shared state): a 2025-11-25 task whose completed status was seen
        is completed (the first list); every other open task is handed over
        (the second: its server, id, what the next follower needs, and the
        ``abandoned`` fate to count here if the hand-over fails)."""
        ended: list[Ended] = []
        handed: list[tuple[str, str, HandedTask, Ended]] = []
        now = time.time()
        for task in list(self._open.values()):
            if task.result_due:
                ended.append(self._end(task, Fate.COMPLETED))
                continue
            facts = self._facts(task, now)
            handed.append((task.server, task.task_id, facts, self._end(task, Fate.ABANDONED)))
        return ended, handed

    def take_opened(self) -> list[tuple[str, str, HandedTask]]:
        """The tasks opened since the last call and still open (server, id,
        what the fleet needs to count them if this process dies)."""
        if not self._opened:
            return []
        opened, self._opened = self._opened, []
        now = time.time()
        return [
            (task.server, task.task_id, self._facts(task, now))
            for task in opened
            if self._open.get((task.server, task.task_id)) is task
        ]

    @staticmethod
    def _facts(task: _Task, now: float) -> HandedTask:
        received = now - max(0.0, time.monotonic() - task.received)
        return HandedTask(
            tool=task.tool,
            form=task.form,
            alive_wall=task.alive_wall,
            ttl_s=task.ttl_s,
            received_wall=received,
            polls=task.polls,
            cancel_acked=task.cancel_acked,
            status=task.status,
            tag=task.tag,
            handed_at=now,
        )

    def follows(self, server: str, task_id: str) -> bool:
        """Whether the task is open here."""
        return (server, task_id) in self._open

    def adopt(
        self, server: str, task_id: str, facts: HandedTask, tag: Any, polls: int = 0
    ) -> None:
        """A task another process handed to the fleet, followed here from now
        on, with the facts it saw (its tool, TTL and last moment alive: lost
        and expired are told apart as there); ``polls``: the tasks/get sent
        here before it was adopted."""
        if (server, task_id) in self._open:
            return
        age = max(0.0, time.time() - facts.received_wall)
        task = _Task(
            server,
            task_id,
            facts.tool,
            facts.form,
            tag,
            time.monotonic() - age,
            facts.alive_wall,
            facts.ttl_s,
            polls=facts.polls + polls,
            cancel_acked=facts.cancel_acked,
            status=facts.status,
        )
        self._open[(server, task_id)] = task
        self._note_opened(task)
        while len(self._open) > self.max_tasks:
            self._open.popitem(last=False)
            self.dropped += 1

    def gave_up(self, server: str, task_id: str) -> Ended | None:
        """The application stopped waiting for one task without cancelling
        it: abandoned (None: not followed, or ended already)."""
        task = self._open.get((server, task_id))
        if task is None:
            return None
        return self._end(task, Fate.COMPLETED if task.result_due else Fate.ABANDONED)

    # ------------------------------------------------------------ internals

    def _note_opened(self, task: _Task) -> None:
        if len(self._opened) < self.max_tasks:
            self._opened.append(task)

    def _server(self, server: str) -> _Server:
        found = self._servers.get(server)
        if found is None:
            if len(self._servers) >= MAX_SERVERS:
                self._servers.clear()
            found = self._servers[server] = _Server()
        return found

    def _tools_listed(self, server: str, tools: Any) -> None:
        if not isinstance(tools, list):
            return
        support = self._server(server).task_support
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            execution = tool.get("execution")
            value = execution.get("taskSupport") if isinstance(execution, dict) else None
            if len(support) >= MAX_TOOLS:
                support.clear()
            support[tool["name"]] = value if isinstance(value, str) else "forbidden"

    def _handle(self, request: TaskRequest, result: dict[str, Any], wall: float) -> None:
        """A tools/call's answer: a handle opens a task; anything else is an
        answer given inline."""
        if result.get("resultType") == "task":
            handle, form = result, MODERN
            ttl = handle.get("ttlMs")
        elif isinstance(result.get("task"), dict):
            handle, form = result["task"], EXPERIMENTAL
            ttl = handle.get("ttl")
        else:
            return
        task_id = handle.get("taskId")
        if not isinstance(task_id, str):
            return
        created = _epoch(handle.get("createdAt"))
        task = _Task(
            request.server,
            task_id,
            request.tool,
            form,
            request.tag,
            time.monotonic(),
            max(wall, created) if created is not None else wall,
            ttl / 1000 if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) else None,
        )
        key = (request.server, task_id)
        self._open[key] = task
        self._open.move_to_end(key)
        self._note_opened(task)
        while len(self._open) > self.max_tasks:
            self._open.popitem(last=False)
            self.dropped += 1
        status = handle.get("status")
        if isinstance(status, str) and status in _TERMINAL:
            self._status(task, handle, wall)  # a task born terminal: its fate next

    def _status(self, task: _Task, status_of: dict[str, Any], wall: float) -> list[Ended]:
        status = status_of.get("status")
        if not isinstance(status, str):
            return []
        task.status = status
        updated = _epoch(status_of.get("lastUpdatedAt"))
        task.alive_wall = max(task.alive_wall, wall if updated is None else max(wall, updated))
        if status not in _TERMINAL:
            return []
        if task.form == EXPERIMENTAL and status == "completed":
            task.result_due = True  # read by tasks/result
            return []
        if task.form == EXPERIMENTAL and status == "failed":
            task.result_due = True
            return [self._end(task, Fate.FAILED)]
        return [self._end(task, Fate(status))]

    def _not_found(self, task: _Task, wall: float) -> Ended:
        """The server no longer knows the task: expired if its TTL may have
        run out (counted from the latest moment it was seen), else lost."""
        expired = task.ttl_s is not None and wall >= task.alive_wall + task.ttl_s
        return self._end(task, Fate.EXPIRED if expired else Fate.LOST)

    def _end(self, task: _Task, fate: Fate) -> Ended:
        self._open.pop((task.server, task.task_id), None)
        return Ended(
            fate,
            task.server,
            task.task_id,
            task.tool,
            task.form,
            max(0.0, time.monotonic() - task.received),
            task.polls,
            cancel_ignored=task.cancel_acked and fate is Fate.COMPLETED,
            tag=task.tag,
        )

    def _handle_lost(self, request: TaskRequest) -> Ended:
        return Ended(
            Fate.HANDLE_LOST,
            request.server,
            None,
            request.tool,
            request.form or MODERN,
            None,
            0,
            tag=request.tag,
        )


def _opted_in(params: dict[str, Any]) -> str | None:
    """The form a tools/call opted into tasks in, or None."""
    if isinstance(params.get("task"), dict):
        return EXPERIMENTAL
    meta = params.get("_meta")
    if isinstance(meta, dict):
        capabilities = meta.get("io.modelcontextprotocol/clientCapabilities")
        if isinstance(capabilities, dict):
            extensions = capabilities.get("extensions")
            if isinstance(extensions, dict) and EXTENSION in extensions:
                return MODERN
    return None


def _declares(result: dict[str, Any]) -> bool:
    capabilities = result.get("capabilities")
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def _epoch(stamp: Any) -> float | None:
    """An ISO 8601 timestamp (``createdAt``, ``lastUpdatedAt``) in epoch
    seconds; None when absent or unreadable."""
    if not isinstance(stamp, str):
        return None
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()
