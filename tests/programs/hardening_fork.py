"""Fork an instrumented process at the worst moment: another thread holds
one of the instrumentation's locks (``tracker``: it is inside a tracker call;
``deadlines``: it is arming a confirmation window) and the confirmation-window
thread is running.  The child must still observe a resume (a counter reset
and a confirmation timeout) and export it; then the parent does the same.

    python hardening_fork.py tracker|deadlines

Prints one JSON line per process; exit code 0 only if both worked.
Needs HARDENING_SERVER_URL (a fuzz_sse.RawServer with the /fork/* replies).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

import httpx

from fuzz_sse import TLS, consume
from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

URL = os.environ["HARDENING_SERVER_URL"]
ACCEPT = (b"accept", b"text/event-stream")
CHILD_TIMEOUT = 30.0


def wait_for(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def delta(after: dict, before: dict) -> dict:
    return {key: value - before.get(key, 0) for key, value in after.items()
            if value != before.get(key, 0)}


def observe(telemetry: Telemetry, who: str) -> dict:
    """A counter reset, then a silent resume that only the confirmation-window
    thread can decide; returns what this process's telemetry counted."""
    gaps_before, outcomes_before = telemetry.gap_kinds(), telemetry.outcomes()
    unconfirmed = gaps_before.get("replay_unconfirmed", 0)
    session = [ACCEPT, (b"mcp-session-id", f"fork-{who}".encode())]
    first = consume("httpx-sse", URL + "/fork/first", headers=session)
    assert [e[2] for e in first.events] == ["1", "2", "3"], first
    reset = consume("httpx-sse", URL + "/fork/reset", headers=[*session, (b"last-event-id", b"3")])
    assert [e[2] for e in reset.events] == ["1"], reset
    # a resume that sends nothing and stays open: only the deadline thread decides it
    with httpx.Client(verify=TLS, trust_env=False) as http:
        headers = [ACCEPT, (b"mcp-session-id", f"fork-{who}".encode()), (b"last-event-id", b"1")]
        with http.stream("GET", URL + "/fork/silent", headers=headers) as response:
            decided = wait_for(
                lambda: telemetry.gap_kinds().get("replay_unconfirmed", 0) > unconfirmed)
    return {
        "who": who,
        "pid": os.getpid(),
        "gaps": delta(telemetry.gap_kinds(), gaps_before),
        "outcomes": delta(telemetry.outcomes(), outcomes_before),
        "timer_decided": decided,
        "spans": len(telemetry.spans.get_finished_spans()),
        "status": response.status_code,
    }


def report(line: dict) -> None:
    """One write(2) per line: parent and child share the pipe and print at
    the same moment, and print() may split a line into two writes."""
    os.write(1, (json.dumps(line) + "\n").encode())


def stuck_locks(processor) -> list[str]:
    """The locks this process cannot take within 2 s (held by a thread that
    did not survive the fork, they would block the next call for ever)."""
    stuck = []
    for name, lock in (("tracker", processor.tracker._lock),
                       ("deadlines", processor._deadlines._cv)):
        if lock.acquire(timeout=2):
            lock.release()
        else:
            stuck.append(name)
    return stuck


def main() -> int:
    held = sys.argv[1] if len(sys.argv) > 1 else "tracker"
    telemetry = Telemetry()
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=0.2)
    processor = instrumentor.processor
    report(observe(telemetry, "parent-before"))

    # Another thread inside the instrumentation (holding a lock) while we fork.
    lock = processor.tracker._lock if held == "tracker" else processor._deadlines._cv
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    holding.wait(10)
    for provider in (telemetry.tracer_provider,):
        provider.force_flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            telemetry.spans.clear()
            telemetry.logs.clear()
            stuck = stuck_locks(processor)
            if stuck:
                report({"who": "child", "stuck": stuck})
                code = 5
            else:
                report(observe(telemetry, "child"))
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    release.set()
    holder.join(10)
    report(observe(telemetry, "parent-after"))
    deadline = time.monotonic() + CHILD_TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            report({"who": "child", "deadlocked": True})
            return 3
        time.sleep(0.05)
    instrumentor.uninstrument()
    return 0 if os.waitstatus_to_exitcode(status) == 0 else 4


if __name__ == "__main__":
    sys.exit(main())
