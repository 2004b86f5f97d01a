"""The task ledger's rules alone (tasks.TaskLedger, pure): the TTL rule that
tells lost from expired, 2025-11-25's experimental form, what may become a
task, the bound.  The real stacks are in tests/test_tasks.py."""

from __future__ import annotations

from datetime import datetime, timezone

from opentelemetry.instrumentation.mcp_resumption.rules.tasks import Fate, TaskLedger

S = "127.0.0.1:9"
MODERN_META = {
    "_meta": {"io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}}}
}


def stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


def handed(ledger, task_id="t1", ttl_ms=1000, created=1000.0, wall=1000.0, tool="crunch"):
    call = ledger.sent(S, "1", "tools/call", {"name": tool, **MODERN_META})
    handle = {"taskId": task_id, "status": "working", "createdAt": stamp(created),
              "ttlMs": ttl_ms, "pollIntervalMs": 100, "resultType": "task"}
    assert ledger.answered(call, {"id": 1, "result": handle}, wall=wall) == []
    return call


def get(ledger, task_id, answer, wall, key="2"):
    request = ledger.sent(S, key, "tasks/get", {"taskId": task_id})
    return ledger.answered(request, {"id": 2, **answer}, wall=wall)


NOT_FOUND = {"error": {"code": -32602, "message": "Task t1 not found"}}


def test_not_found_before_the_ttl_from_the_handle_is_lost_after_it_expired():
    ledger = TaskLedger()
    handed(ledger, ttl_ms=1000, created=1000.0, wall=1000.0)
    (ended,) = get(ledger, "t1", NOT_FOUND, wall=1000.5)
    assert ended.fate is Fate.LOST and ended.polls == 1 and ended.tool == "crunch"
    ledger = TaskLedger()
    handed(ledger, ttl_ms=1000, created=1000.0, wall=1000.0)
    (ended,) = get(ledger, "t1", NOT_FOUND, wall=1001.0)
    assert ended.fate is Fate.EXPIRED


def test_the_ttl_runs_from_the_last_status_seen_as_fastmcp_tasks_counts_it():
    """fastmcp-tasks starts the TTL when the task ends: a status read later
    (lastUpdatedAt) moves the start, so a not-found within a TTL of it is lost."""
    ledger = TaskLedger()
    handed(ledger, ttl_ms=1000, created=1000.0, wall=1000.0)
    working = {"result": {"taskId": "t1", "status": "working", "lastUpdatedAt": stamp(1005.0)}}
    assert get(ledger, "t1", working, wall=1005.0) == []
    (ended,) = get(ledger, "t1", NOT_FOUND, wall=1005.5, key="3")
    assert ended.fate is Fate.LOST and ended.polls == 2


def test_a_task_without_ttl_never_expires_and_terminal_statuses_end_it():
    ledger = TaskLedger()
    handed(ledger, ttl_ms=None)
    (ended,) = get(ledger, "t1", NOT_FOUND, wall=10**9)
    assert ended.fate is Fate.LOST
    for status in ("completed", "failed", "cancelled"):
        ledger = TaskLedger()
        handed(ledger)
        (ended,) = get(ledger, "t1", {"result": {"taskId": "t1", "status": status}}, wall=1000.1)
        assert ended.fate is Fate(status) and not ended.cancel_ignored
        assert len(ledger) == 0


def test_an_acknowledged_cancel_then_completed_is_a_cancel_ignored():
    ledger = TaskLedger()
    handed(ledger)
    cancel = ledger.sent(S, "5", "tasks/cancel", {"taskId": "t1"})
    assert ledger.answered(cancel, {"id": 5, "result": {}}, wall=1000.1) == []
    (ended,) = get(ledger, "t1", {"result": {"taskId": "t1", "status": "completed"}}, 1000.2)
    assert ended.fate is Fate.COMPLETED and ended.cancel_ignored


def test_open_tasks_are_abandoned_when_the_client_stops_waiting():
    ledger = TaskLedger()
    handed(ledger, task_id="a")
    handed(ledger, task_id="b")
    assert {e.task_id: e.fate for e in ledger.stop_waiting()} == {
        "a": Fate.ABANDONED, "b": Fate.ABANDONED}
    assert ledger.stop_waiting() == []


def test_a_lost_handle_only_where_the_call_could_have_become_a_task():
    ledger = TaskLedger()
    plain = ledger.sent(S, "1", "tools/call", {"name": "x"})
    assert ledger.unanswered(plain) == [] and ledger.call_lost(plain) is None
    opted = ledger.sent(S, "2", "tools/call", {"name": "x", **MODERN_META})
    (ended,) = ledger.unanswered(opted)
    assert ended.fate is Fate.HANDLE_LOST and ended.task_id is None and ended.duration is None
    # A server whose server/discover did not declare the extension runs no task.
    discover = ledger.sent(S, "3", "server/discover", {})
    ledger.answered(discover, {"id": 3, "result": {"capabilities": {"extensions": {}}}})
    assert ledger.unanswered(ledger.sent(S, "4", "tools/call", {"name": "x", **MODERN_META})) == []


def test_the_experimental_form_reads_task_support_and_tasks_result():
    ledger = TaskLedger()
    listing = ledger.sent(S, "1", "tools/list", {})
    tools = [{"name": "never", "execution": {"taskSupport": "forbidden"}},
             {"name": "slow", "execution": {"taskSupport": "optional"}}]
    ledger.answered(listing, {"id": 1, "result": {"tools": tools}})
    never = ledger.sent(S, "2", "tools/call", {"name": "never", "task": {"ttl": 1000}})
    assert ledger.call_lost(never) is None
    slow = ledger.sent(S, "3", "tools/call", {"name": "slow", "task": {"ttl": 1000}})
    assert ledger.call_lost(slow).fate is Fate.HANDLE_LOST
    call = ledger.sent(S, "4", "tools/call", {"name": "slow", "task": {"ttl": 60000}})
    task = {"taskId": "e1", "status": "working", "createdAt": stamp(1000.0), "ttl": 60000,
            "pollInterval": 100}
    ledger.answered(call, {"id": 4, "result": {"task": task}}, wall=1000.0)
    # completed: the result is ready, read by tasks/result
    assert get(ledger, "e1", {"result": {**task, "status": "completed"}}, 1000.5) == []
    result = ledger.sent(S, "6", "tasks/result", {"taskId": "e1"})
    (ended,) = ledger.answered(result, {"id": 6, "result": {"content": []}}, wall=1000.6)
    assert ended.fate is Fate.COMPLETED and ended.form == "2025-11-25"


def test_the_open_tasks_are_bounded_and_the_dropped_counted():
    ledger = TaskLedger(max_tasks=2)
    for task_id in ("a", "b", "c"):
        handed(ledger, task_id=task_id)
    assert len(ledger) == 2 and ledger.dropped == 1
    assert {e.task_id for e in ledger.stop_waiting()} == {"b", "c"}


def handed_over(ttl_ms=1000, wall=1000.0, last_seen=None):
    """A task handed out in one ledger (one process), polled, then handed to
    the fleet at its exit, decoded as the next process reads it."""
    from opentelemetry.instrumentation.mcp_resumption.rules.task_handover import HandedTask

    first = TaskLedger()
    handed(first, ttl_ms=ttl_ms, created=wall, wall=wall)
    if last_seen is not None:
        working = {"result": {"taskId": "t1", "status": "working"}}
        assert get(first, "t1", working, wall=last_seen) == []
    ended, handed_list = first.hand_over()
    assert ended == [] and len(first) == 0
    ((server, task_id, facts, abandoned),) = handed_list
    assert (server, task_id) == (S, "t1") and abandoned.fate is Fate.ABANDONED
    return HandedTask.decode(facts.encode())


def test_a_task_handed_over_is_followed_with_the_first_process_s_ttl_facts():
    """The next process tells lost from expired with the TTL and the last
    moment alive the first process saw, names the first process's tool, and
    adds up the polls."""
    for not_found_at, fate in ((1006.5, Fate.LOST), (1007.0, Fate.EXPIRED)):
        facts = handed_over(ttl_ms=2000, last_seen=1005.0)
        assert facts.tool == "crunch" and facts.polls == 1
        second = TaskLedger()
        assert not second.follows(S, "t1")
        second.adopt(S, "t1", facts, tag="here", polls=1)
        (ended,) = get(second, "t1", NOT_FOUND, wall=not_found_at)
        assert (ended.fate, ended.tool, ended.polls, ended.tag) == (fate, "crunch", 3, "here")


def test_a_2025_11_25_task_whose_completed_status_was_seen_is_not_handed_over():
    ledger = TaskLedger()
    call = ledger.sent(S, "1", "tools/call", {"name": "slow", "task": {"ttl": 1000}})
    handle = {"task": {"taskId": "t1", "status": "working", "ttl": 1000}}
    assert ledger.answered(call, {"id": 1, "result": handle}, wall=1000.0) == []
    assert get(ledger, "t1", {"result": {"taskId": "t1", "status": "completed"}}, 1000.1) == []
    ended, handed_list = ledger.hand_over()
    assert [e.fate for e in ended] == [Fate.COMPLETED] and handed_list == []
