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

With shared state (``OTEL_PYTHON_MCP_RESUMPTION_STATE``) the process's open
tasks are handed to the fleet when it stops following them (its exit), not
counted ``abandoned`` here: a process that polls such a task later (a
restarted client that kept its task ids) takes it over and follows it to its
fate, with the facts the first process saw; one that finds it due, nobody
having followed it, counts it ``abandoned`` (``redis_tasks``: once for the
fleet).  Each take is queued for the store's writer thread: no Redis call
here, and a follower's answers that come before its take are held (bounded)
and read once it is known whose task it is.  So that a process killed
while it follows tasks (no exit runs) leaves them to the fleet too, each
task is *held* in the fleet under the process's lease when its handle comes
(or it is adopted) and released at its fate: two queued writes per task,
none per poll or event.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import TYPE_CHECKING

from ..forks import renew_after_fork
from ..rules.jsonrpc import loads, request_key
from ..rules.tasks import EXTENSION, Ended, Fate, TaskLedger, TaskRequest
from ..shared.redis_tasks import HAND_OVER_WAIT
from ..telemetry import semconv as sc
from ..telemetry.facts import transport_of

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable

    from ..rules.fates import Decided
    from ..rules.task_handover import HandedTask
    from ..telemetry.facts import RequestFacts, StreamContext
    from ..telemetry.sink import TelemetrySink
    from ..tracking.tracker import Tracker

__all__ = ["TASK_MARKERS", "TaskReports", "follows_tasks"]

# A body worth parsing for the ledger: one of these in its bytes.
_TASK_METHOD = b'"tasks/'
_TOOLS_CALL = b'"tools/call"'
_OPT_INS = (EXTENSION.encode(), b'"task"')
_DISCOVER = b'"server/discover"'
_TOOLS_LIST = b'"tools/list"'
# A body holding none of these is one ``follows_tasks`` passes over (a
# tools/call is followed only with an opt-in): what the monitor searches
# for at once, with the events' marker, before it calls either.
TASK_MARKERS = (_TASK_METHOD, _DISCOVER, _TOOLS_LIST, *_OPT_INS)
# Answers at most this long are parsed (a completed task inlines its result).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
# Tasks of other processes asked of the fleet (then forgotten, and asked
# again), and the answers held per task until its take is known.
MAX_ADOPTING = 1024
MAX_PARKED = 16
# Tasks held in the fleet past the ledger's bound before those it dropped
# (no fate: nobody will release them) are released.
HELD_SLACK = 64


def follows_tasks(body: bytes) -> bool:
    """Whether a request body holds something the task ledger follows: a
    few byte searches, no parse."""
    if _TASK_METHOD in body or _DISCOVER in body or _TOOLS_LIST in body:
        return True
    if _TOOLS_CALL in body:
        for opt_in in _OPT_INS:  # a loop, not any(): no generator per request
            if opt_in in body:
                return True
    return False


class TaskReports:
    """Feeds the task ledger and reports the fates it decides."""

    telemetry: TelemetrySink
    tracker: Tracker
    enabled: bool

    def _init_tasks(self, max_tasks: int) -> None:
        self.task_ledger = TaskLedger(max_tasks)
        self._tasks_lock = threading.Lock()
        # (server, task id) -> [tasks/get sent, answers held, tag]: a task of
        # another process being taken from the fleet; and those asked once.
        self._adopting: dict[tuple[str, str], list] = {}
        self._asked: dict[tuple[str, str], None] = {}
        self._fleet_swept = False
        # The tasks held in the fleet (their records under this process's
        # lease), to release at their fate.
        self._fleet_held: dict[tuple[str, str], None] = {}
        renew_after_fork(self)

    def _after_fork(self) -> None:
        self._tasks_lock = threading.Lock()
        # The child's store starts over (its writer thread, its queue): it
        # looks at the fleet's handed tasks again, and asks afresh.
        self._fleet_swept = False
        self._adopting = {}

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
        shared = self.tracker.store.shared
        adopt: list[tuple[str, str]] = []
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
                if shared and request.task_id is not None and self._foreign(request):
                    adopt.append((request.server, request.task_id))
                if (
                    method.startswith("tasks/")
                    and transport == sc.TRANSPORT_STREAMABLE_HTTP
                    and not facts.mcp_name
                ):
                    self.telemetry.task_unroutable(transport, facts.host, facts.port)
        if found:
            facts.tasks = found
        for task in adopt:
            self.tracker.store.adopt(*task, partial(self._task_taken, task))

    def _foreign(self, request: TaskRequest) -> bool:
        """A tasks/* request for a task not followed here (under the lock):
        True the first time, to ask the fleet for it; a tasks/get while it
        is asked for is counted as its poll."""
        task = (request.server, request.task_id or "")
        if self.task_ledger.follows(*task):
            return False
        adoption = self._adopting.get(task)
        if adoption is not None:
            adoption[0] += request.method == "tasks/get"
            return False
        if task in self._asked or len(self._adopting) >= MAX_ADOPTING:
            return False
        if len(self._asked) >= MAX_ADOPTING:
            self._asked.clear()
        self._asked[task] = None
        self._adopting[task] = [int(request.method == "tasks/get"), [], request.tag]
        return True

    def _held_for_adoption(self, request: TaskRequest, message: dict | None) -> bool:
        """An answer (None: "the session is gone") to a request for a task
        being taken from the fleet: held until the take is known (under the
        lock)."""
        if request.task_id is None or not self._adopting:
            return False
        adoption = self._adopting.get((request.server, request.task_id))
        if adoption is None:
            return False
        if len(adoption[1]) < MAX_PARKED:
            adoption[1].append((request, message, time.time()))
        return True

    def _task_taken(self, task: tuple[str, str], facts: HandedTask | None) -> None:
        """The fleet's answer to a take (the store's writer thread): the
        task another process handed over, followed here from now on, with
        the answers held for it; None: nobody handed it over (or Redis
        failed): not followed, as without shared state."""
        ended: list[Ended] = []
        with self._tasks_lock:
            adoption = self._adopting.pop(task, None)
            if adoption is None or facts is None:
                return
            polls, held, tag = adoption
            self.task_ledger.adopt(*task, facts, tag, polls)
            for request, message, wall in held:
                if message is None:
                    ended += self.task_ledger.gone(request, wall)
                else:
                    ended += self.task_ledger.answered(request, message, wall)
            self._hold_opened()
        self._tasks_ended(ended)

    def task_abandoned_elsewhere(self, task_hash: str, facts: HandedTask) -> None:
        """A task another process handed to the fleet, which nobody followed
        in time, taken here (the store's writer thread): abandoned, counted
        once for the fleet, under the server and tool the first process saw."""
        if facts.tag is None:
            return
        ended = Ended(
            Fate.ABANDONED,
            "",
            None,
            facts.tool,
            facts.form,
            max(0.0, time.time() - facts.received_wall),
            facts.polls,
            tag=facts.tag,
            task_hash=task_hash,
        )
        self._tasks_ended([ended])

    def fleet_seen(self) -> None:
        """An MCP server answered: the first time, with shared state, the
        fleet's handed tasks are looked at (queued) for any nobody followed."""
        if self._fleet_swept:
            return
        self._fleet_swept = True
        store = self.tracker.store
        if store.shared:
            store.sweep_tasks()

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
                if request is not None and not self._held_for_adoption(request, message):
                    ended += self.task_ledger.answered(request, message)
            self._hold_opened()
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
                gone = decide is TaskLedger.gone
                if gone and self._held_for_adoption(request, None):
                    continue
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
        """The client stops following every task (the process exits): those
        not ended are abandoned; with shared state they are handed to the
        fleet instead (bounded: if they are not written within
        ``HAND_OVER_WAIT``, they are abandoned here, as without it)."""
        store = self.tracker.store
        handed: list = []
        with self._tasks_lock:
            self._adopting.clear()
            if store.shared:
                ended, handed = self.task_ledger.hand_over()
            else:
                ended = self.task_ledger.stop_waiting()
            self._release_locked(ended)
            # Those handed over are the fleet's now (or counted here if that
            # fails); those the ledger dropped, with no fate, nobody's.
            handed_over = {(server, task) for server, task, *_ in handed}
            for task in [task for task in self._fleet_held if task not in handed_over]:
                store.release_task(*task)
            self._fleet_held.clear()
        if handed:
            outcome = store.hand_over([(server, task, facts) for server, task, facts, _ in handed])
            if outcome is None or not outcome.written(HAND_OVER_WAIT):
                ended += [abandoned for *_, abandoned in handed]
                # Counted here: their held records out too, if Redis answers
                # before the store closes (else the fleet counts them again).
                for server, task, *_ in handed:
                    store.release_task(server, task)
        self._tasks_ended(ended)

    def task_given_up(self, server: str, task_id: str) -> None:
        """The application stopped waiting for one task without cancelling
        it (told by hand: no SDK says so on the wire)."""
        with self._tasks_lock:
            ended = self.task_ledger.gave_up(server, task_id)
        if ended is not None:
            self._tasks_ended([ended])

    # ------------------------------------------------------------ the fleet's records

    def _hold_opened(self) -> None:
        """The tasks just opened, held in the fleet (under the lock: a task's
        hold is queued before its release, whichever thread ends it)."""
        opened = self.task_ledger.take_opened()
        if not opened:
            return
        store = self.tracker.store
        if not store.shared:
            return
        held = self._fleet_held
        for server, task_id, facts in opened:
            held[(server, task_id)] = None
            store.hold_task(server, task_id, facts)
        if len(held) > self.task_ledger.max_tasks + HELD_SLACK:
            follows = self.task_ledger.follows
            for task in [task for task in held if not follows(*task)]:
                del held[task]
                store.release_task(*task)

    def _release_ended(self, ended: list[Ended]) -> None:
        """Tasks whose fate was counted here: out of the fleet."""
        if not self._fleet_held:
            return
        with self._tasks_lock:
            self._release_locked(ended)

    def _release_locked(self, ended: list[Ended]) -> None:
        store = self.tracker.store
        for each in ended:
            task = (each.server, each.task_id or "")
            if task in self._fleet_held:
                del self._fleet_held[task]
                store.release_task(*task)

    # ------------------------------------------------------------ fates out

    def _tasks_ended(self, ended: list[Ended]) -> None:
        if ended:
            self._release_ended(ended)
        for each in ended:
            transport, host, port = each.tag
            self.telemetry.task_ended(each, transport, host, port)

