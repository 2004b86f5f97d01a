# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The tasks' room of the owner: the facts the patches already report (a
request sent, its JSON answer or the SSE event that answers it, an answer
that never came, a creating call decided lost, the client that stops
waiting) handed to the task ledger (``tasks.TaskLedger``), and the fates it
decides handed to the telemetry sink.

A part of :class:`~.monitor.ResumptionMonitor` (its base
:class:`TaskReports`), apart to be read alone.  Not threaded through the
stream tracker: it keeps its own ledger under its own lock.  Only requests
whose body names a task method (or a ``tools/call`` that opted into tasks,
``server/discover``, a ``tools/list``) are parsed here, and only their
answers are read: an SSE event is looked at only on the stream of such a
request (``facts.tasks``), so the other events cost nothing.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from . import semconv as sc
from .facts import transport_of
from .forks import renew_after_fork
from .jsonrpc import loads, request_key
from .tasks import EXTENSION, Ended, TaskLedger, TaskRequest

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable

    from .facts import RequestFacts, StreamContext
    from .fates import Decided
    from .telemetry import TelemetrySink

__all__ = ["TaskReports", "follows_tasks"]

# A body worth parsing for the ledger: one of these in its bytes.
_TASK_METHOD = b'"tasks/'
_TOOLS_CALL = b'"tools/call"'
_OPT_INS = (EXTENSION.encode(), b'"task"')
_DISCOVER = b'"server/discover"'
_TOOLS_LIST = b'"tools/list"'
# Answers at most this long are parsed (a completed task inlines its result).
MAX_ANSWER_BYTES = 16 * 1024 * 1024


def follows_tasks(body: bytes) -> bool:
    """Whether a request body holds something the task ledger follows: a
    few byte searches, no parse."""
    if _TASK_METHOD in body or _DISCOVER in body or _TOOLS_LIST in body:
        return True
    return _TOOLS_CALL in body and any(opt_in in body for opt_in in _OPT_INS)


class TaskReports:
    """Feeds the task ledger and reports the fates it decides."""

    telemetry: TelemetrySink
    enabled: bool

    def _init_tasks(self, max_tasks: int) -> None:
        self.task_ledger = TaskLedger(max_tasks)
        self._tasks_lock = threading.Lock()
        renew_after_fork(self)

    def _after_fork(self) -> None:
        self._tasks_lock = threading.Lock()

    # ------------------------------------------------------------ facts in

    def tasks_sent(self, facts: RequestFacts) -> None:
        """A request is about to be sent whose body ``follows_tasks``: the
        requests the ledger follows are kept on ``facts`` for their answers,
        and a tasks/* request without Mcp-Name over streamable HTTP counted."""
        body = facts.body
        if body is None or facts.method != "POST":
            return
        try:
            parsed = loads(body)
        except (ValueError, TypeError, RecursionError):
            return
        messages = parsed if isinstance(parsed, list) else [parsed]
        transport = transport_of(facts, None)
        tag = (transport, facts.host, facts.port)
        found: dict[str, TaskRequest] = {}
        with self._tasks_lock:
            for message in messages:
                if not isinstance(message, dict) or not isinstance(message.get("method"), str):
                    continue
                key = request_key(message.get("id"))
                method = message["method"]
                if key is None:
                    continue
                request = self.task_ledger.sent(
                    facts.server, key, method, message.get("params"), tag
                )
                if request is None:
                    continue
                found[key] = request
                if request.form is not None and request.tool:
                    self.telemetry.task_tool_seen(transport, facts.host, facts.port, request.tool)
                if (
                    method.startswith("tasks/")
                    and transport == sc.TRANSPORT_STREAMABLE_HTTP
                    and not facts.mcp_name
                ):
                    self.telemetry.task_unroutable(transport, facts.host, facts.port)
        if found:
            facts.tasks = found

    def tasks_answered(self, facts: RequestFacts, answer: bytes | str) -> None:
        """A JSON answer, or an SSE event's data, on the answer of a request
        that ``tasks_sent`` kept requests of."""
        requests = facts.tasks
        if not requests or len(answer) > MAX_ANSWER_BYTES:
            return
        if isinstance(answer, bytes):
            listed = b"taskSupport" in answer
        else:  # an SSE event: maybe not the answer yet (a priming event, a notification)
            listed = "taskSupport" in answer or '"result"' not in answer
        if not listed and all(r.method == "tools/list" for r in requests.values()):
            facts.tasks = None  # a list without task support says nothing: no parse
            return
        if isinstance(answer, str) and '"id"' not in answer and "notifications/tasks" not in answer:
            return  # another notification on the request's stream
        try:
            parsed = loads(answer)
        except (ValueError, TypeError, RecursionError):
            return
        messages = parsed if isinstance(parsed, list) else [parsed]
        ended: list[Ended] = []
        with self._tasks_lock:
            for message in messages:
                if not isinstance(message, dict):
                    continue
                if "id" not in message:
                    method = message.get("method")
                    if method in ("notifications/tasks", "notifications/tasks/status"):
                        ended += self.task_ledger.notified(facts.server, message.get("params"))
                    continue
                request = facts.tasks.pop(request_key(message.get("id")) or "", None)
                if request is not None:
                    ended += self.task_ledger.answered(request, message)
        self._tasks_ended(ended)

    def session_gone(self, facts: RequestFacts) -> None:
        """The server answered 404 to the session id ``facts`` carried: it no
        longer knows the session, and the tasks of a 2025-11-25 server belong
        to their session."""
        self._settle(facts, TaskLedger.gone)

    def tasks_unanswered(self, facts: RequestFacts) -> None:
        """The answer to the requests kept on ``facts`` never came: the JSON
        body was cut or not read, or the request failed after it was sent."""
        self._settle(facts, TaskLedger.unanswered)

    def _settle(
        self, facts: RequestFacts, decide: Callable[[TaskLedger, TaskRequest], list[Ended]]
    ) -> None:
        """The requests kept on ``facts`` will get no answer: ``decide``
        what that means for each, and report it."""
        requests, facts.tasks = facts.tasks, None
        if not requests:
            return
        ended: list[Ended] = []
        with self._tasks_lock:
            for request in requests.values():
                ended += decide(self.task_ledger, request)
        self._tasks_ended(ended)

    def request_unanswered(self, facts: RequestFacts, error: str) -> None:
        """A request kept on ``facts`` failed with no answer (``error``: the
        type the client raised).  A connection never made (``ConnectError``,
        ``ConnectTimeout``) sent nothing: no task can exist."""
        if facts.tasks and "Connect" not in error:
            self.tasks_unanswered(facts)
        else:
            facts.tasks = None

    def task_call_lost(self, decided: Decided) -> bool:
        """A broken request was decided lost: if it was a tools/call that
        could have become a task, it is a ``handle_lost`` task (True), and
        no plain lost call."""
        broken = decided.broken
        if broken.method != "tools/call":
            return False
        context: StreamContext | None = broken.tag
        requests = context.facts.tasks if context is not None else None
        request = requests.pop(broken.key, None) if requests else None
        if request is None:
            return False
        with self._tasks_lock:
            ended = self.task_ledger.call_lost(request)
        if ended is None:
            return False
        self._tasks_ended([ended])
        return True

    def tasks_stop_waiting(self) -> None:
        """The client stops following every task (the process exits)."""
        with self._tasks_lock:
            ended = self.task_ledger.stop_waiting()
        self._tasks_ended(ended)

    def task_given_up(self, server: str, task_id: str) -> None:
        """The application stopped waiting for one task without cancelling
        it (told by hand: no SDK says so on the wire)."""
        with self._tasks_lock:
            ended = self.task_ledger.gave_up(server, task_id)
        if ended is not None:
            self._tasks_ended([ended])

    # ------------------------------------------------------------ fates out

    def _tasks_ended(self, ended: list[Ended]) -> None:
        for each in ended:
            transport, host, port = each.tag
            self.telemetry.task_ended(each, transport, host, port)

