"""Hundreds of concurrent streams, each broken and resumed against a loopback
server whose behaviour a seeded RNG picks (issue 7, part 2).

The gap and outcome counters must equal the ground truth exactly, and the
tracker's lock must never be held by a thread while that thread does socket
I/O (a recording lock replaces ``Tracker._lock``; ``socket.socket`` reads and
writes check it).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
from collections import Counter
from dataclasses import dataclass

import httpx
import httpx2
import httpx_sse
import pytest

from fuzz_sse import TLS, RawRequest, Reply, block, framed, head
from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

FIRST_EVENTS = 5  # every first stream: ids 1..5 (the same ids in every session), then it breaks


def note(session: str, n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": {"session": session, "n": n}})


@dataclass(frozen=True)
class Behaviour:
    """What the server does on the resume, and what a correct detector says."""

    gaps: tuple[str, ...]
    outcome: str


BEHAVIOURS = {
    "faithful": Behaviour((), "resumed"),
    "primed": Behaviour((), "caught_up"),
    "counter_reset": Behaviour(("id_regression",), "gap"),
    "new_session": Behaviour(("session_changed", "id_regression"), "gap"),
    "new_session_same_counter": Behaviour(("session_changed",), "gap"),
    "empty": Behaviour(("replay_unconfirmed",), "gap"),
    "inclusive": Behaviour(("replay_contract_violation",), "gap"),
    "reused": Behaviour(("id_reused",), "gap"),
    "rejected": Behaviour((), "rejected"),
}


def _sse(session: str, *blocks: bytes, status: int = 200, served_session: str | None = None,
         framing: str = "chunked") -> Reply:
    headers = [(b"content-type", b"text/event-stream"),
               (b"mcp-session-id", (served_session or session).encode())]
    framing_line, chunks = framed(blocks, framing)
    return Reply(head(status, headers, extra=framing_line), chunks)


SESSION_CHANGES = ("new_session", "new_session_same_counter")


def id_prefix(behaviour: str, task: int, *, shared_ids: bool = False) -> str:
    """Integer ids, the same 1..5 in every session, except where the server
    changes the session: there the processor looks the cursor up in the
    response's session, so it can only be told apart by a unique id (see
    test_session_change_among_sessions_that_share_ids)."""
    return f"t{task}_" if behaviour in SESSION_CHANGES and not shared_ids else ""


def script(behaviour: str, prefix: str = ""):
    """The server side of one client: ids 1..5 then a broken connection
    (chunked body never terminated); the resume answered per ``behaviour``."""

    def eid(n: int) -> str:
        return f"{prefix}{n}"

    def answer(request: RawRequest) -> Reply:
        session = (request.header("mcp-session-id") or b"").decode()
        cursor = request.header("last-event-id")
        if cursor is None:
            events = [block(eid(n), note(session, n)) for n in range(1, FIRST_EVENTS + 1)]
            return _sse(session, *events, framing="broken")
        c = int(cursor.decode().removeprefix(prefix))
        if behaviour == "faithful":
            return _sse(session, block(eid(c + 1), note(session, c + 1)),
                        block(eid(c + 2), note(session, c + 2)))
        if behaviour == "primed":
            return _sse(session, block(eid(c + 1), ""), block(eid(c + 2), note(session, c + 2)))
        if behaviour == "counter_reset":
            return _sse(session, block(eid(1), note(session, 101)),
                        block(eid(2), note(session, 102)))
        if behaviour == "new_session":
            return _sse(session, block(eid(1), note("new", 1)), served_session=session + "-new")
        if behaviour == "new_session_same_counter":
            return _sse(session, block(eid(c + 1), note("new", c + 1)),
                        served_session=session + "-new")
        if behaviour == "empty":
            return _sse(session)
        if behaviour == "inclusive":
            return _sse(session, block(eid(c), note(session, c)),
                        block(eid(c + 1), note(session, c + 1)))
        if behaviour == "reused":
            return _sse(session, block(eid(c), note(session, 999)),
                        block(eid(c + 1), note(session, c + 1)))
        return Reply(head(404, [(b"content-length", b"0")]))

    return answer


class RecordingLock:
    """A drop-in for the tracker's ``threading.Lock`` that knows its owner."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None
        self.acquired = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.owner = threading.get_ident()
            self.acquired += 1
        return got

    def release(self) -> None:
        self.owner = None
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def held_here(self) -> bool:
        return self.owner == threading.get_ident()


@pytest.fixture
def socket_io(monkeypatch):
    """Every socket read and write in this process, checked against the lock."""
    state = {"lock": None, "io": 0, "violations": []}

    def checked(name):
        original = getattr(socket.socket, name)

        def io(self, *args, **kwargs):
            lock = state["lock"]
            if lock is not None and lock.held_here():
                state["violations"].append(name)
            state["io"] += 1
            return original(self, *args, **kwargs)

        return io

    for name in ("recv", "recv_into", "recvfrom", "send", "sendall", "sendmsg"):
        monkeypatch.setattr(socket.socket, name, checked(name))
    return state


@pytest.fixture
def instrumented(socket_io):
    telemetry = Telemetry()
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=120)
    lock = RecordingLock()
    instrumentor.processor.tracker._lock = lock
    socket_io["lock"] = lock
    try:
        yield telemetry, lock, instrumentor.processor
    finally:
        socket_io["lock"] = None
        instrumentor.uninstrument()
        telemetry.shutdown()


def plan(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    names = sorted(BEHAVIOURS)
    return [rng.choice(names) for _ in range(count)]


def expected(behaviours: list[str]) -> tuple[Counter, Counter]:
    gaps: Counter = Counter()
    outcomes: Counter = Counter()
    for name in behaviours:
        gaps.update(BEHAVIOURS[name].gaps)
        outcomes[BEHAVIOURS[name].outcome] += 1
    return gaps, outcomes


def check_counts(telemetry: Telemetry, behaviours: list[str], delivered: int) -> None:
    gaps, outcomes = expected(behaviours)
    assert telemetry.gap_kinds() == dict(gaps)
    assert telemetry.outcomes() == dict(outcomes)
    assert sum(telemetry.counts("mcp.client.stream.events").values()) == delivered


# ---------------------------------------------------------------- asyncio

TASKS = 200


class Barrier:
    """asyncio.Barrier's ``wait`` for one round (asyncio.Barrier is 3.11+, and
    the suite also runs on 3.10)."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.all_in = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.parties:
            self.all_in.set()
        await self.all_in.wait()


async def _read(flavour: str, http, url: str, headers: dict, barrier=None) -> tuple[list, str]:
    ids: list[str] = []
    error = ""
    try:
        async with http.stream("GET", url, headers=headers) as response:
            if response.status_code >= 400:
                await response.aread()
                return ids, f"status {response.status_code}"
            source = (httpx_sse.EventSource(response).aiter_sse() if flavour == "httpx-sse"
                      else aiter(httpx2.EventSource(response)))
            try:
                async for sse in source:
                    ids.append(sse.id)
                    if barrier is not None and len(ids) == 1:
                        await barrier.wait()  # every stream is open at once
            finally:
                await source.aclose()
    except (httpx.TransportError, httpx2.TransportError) as broken:
        error = type(broken).__name__
    return ids, error


def test_200_asyncio_streams_break_and_resume(raw_server, instrumented, socket_io):
    telemetry, lock, processor = instrumented
    behaviours = plan(seed=20260707, count=TASKS)
    for i, name in enumerate(behaviours):
        raw_server.on(f"/a/{i}", script(name, id_prefix(name, i)))

    async def main() -> int:
        barrier = Barrier(TASKS)
        limits = dict(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(verify=TLS, trust_env=False, timeout=60,
                                     limits=httpx.Limits(**limits)) as one, \
                httpx2.AsyncClient(verify=TLS, trust_env=False, timeout=60,
                                   limits=httpx2.Limits(**limits)) as two:

            async def client(i: int) -> int:
                flavour = "httpx-sse" if i % 2 else "httpx2"
                http = one if i % 2 else two
                url = f"{raw_server.url}/a/{i}"
                headers = {"accept": "text/event-stream", "mcp-session-id": f"conc-{i}"}
                ids, error = await _read(flavour, http, url, headers, barrier)
                prefix = id_prefix(behaviours[i], i)
                assert ids == [f"{prefix}{n}" for n in range(1, FIRST_EVENTS + 1)]
                assert error == "RemoteProtocolError", error  # the connection broke
                resumed, _ = await _read(flavour, http, url,
                                         {**headers, "last-event-id": ids[-1]})
                return len(ids) + len(resumed)

            counts = await asyncio.gather(*(client(i) for i in range(TASKS)))
        return sum(counts)

    delivered = asyncio.run(main())
    assert not raw_server.errors
    check_counts(telemetry, behaviours, delivered)
    assert socket_io["violations"] == []
    # Not vacuous: at least the open, the answer, a first event and the end of
    # each of a task's two streams took the lock (events in between need not).
    assert socket_io["io"] > 4 * TASKS and lock.acquired > 6 * TASKS
    assert len(processor.tracker) == 2 * TASKS


# ---------------------------------------------------------------- threads

THREADS = 16
STREAMS_PER_THREAD = 12


def _read_sync(flavour: str, http, url: str, headers: dict) -> tuple[list, str]:
    ids: list[str] = []
    error = ""
    try:
        with http.stream("GET", url, headers=headers) as response:
            if response.status_code >= 400:
                response.read()
                return ids, f"status {response.status_code}"
            source = (httpx_sse.EventSource(response).iter_sse() if flavour == "httpx-sse"
                      else iter(httpx2.EventSource(response)))
            try:
                for sse in source:
                    ids.append(sse.id)
            finally:
                source.close()
    except (httpx.TransportError, httpx2.TransportError) as broken:
        error = type(broken).__name__
    return ids, error


def test_16_threads_of_streams_break_and_resume(raw_server, instrumented, socket_io):
    telemetry, lock, processor = instrumented
    assert processor.tracker._lock is lock
    total = THREADS * STREAMS_PER_THREAD
    behaviours = plan(seed=77, count=total)
    for i, name in enumerate(behaviours):
        raw_server.on(f"/t/{i}", script(name, id_prefix(name, i)))
    barrier = threading.Barrier(THREADS)
    delivered = [0] * THREADS
    failures: list[BaseException] = []
    limits = dict(max_connections=None, max_keepalive_connections=0)
    one = httpx.Client(verify=TLS, trust_env=False, timeout=60, limits=httpx.Limits(**limits))
    two = httpx2.Client(verify=TLS, trust_env=False, timeout=60, limits=httpx2.Limits(**limits))

    def worker(w: int) -> None:
        try:
            barrier.wait(timeout=60)
            for k in range(STREAMS_PER_THREAD):
                i = w * STREAMS_PER_THREAD + k
                flavour = "httpx-sse" if (w + k) % 2 else "httpx2"
                http = one if flavour == "httpx-sse" else two
                url = f"{raw_server.url}/t/{i}"
                headers = {"accept": "text/event-stream", "mcp-session-id": f"thread-{i}"}
                ids, error = _read_sync(flavour, http, url, headers)
                prefix = id_prefix(behaviours[i], i)
                assert ids == [f"{prefix}{n}" for n in range(1, FIRST_EVENTS + 1)], ids
                assert error == "RemoteProtocolError", error
                resumed, _ = _read_sync(flavour, http, url, {**headers, "last-event-id": ids[-1]})
                delivered[w] += len(ids) + len(resumed)
        except BaseException as error:  # reported below, with the thread's name
            failures.append(error)

    workers = [threading.Thread(target=worker, args=(w,), name=f"client-{w}")
               for w in range(THREADS)]
    try:
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join(timeout=120)
    finally:
        one.close()
        two.close()
    assert not failures, failures
    assert not any(thread.is_alive() for thread in workers)
    assert not raw_server.errors
    check_counts(telemetry, behaviours, sum(delivered))
    assert socket_io["violations"] == []
    assert socket_io["io"] > 4 * total and lock.acquired > 6 * total


def test_the_recording_lock_does_catch_io_under_the_lock(instrumented, socket_io):
    """The check is live: socket I/O done while holding the tracker lock is
    recorded (this is what a patch doing I/O under the lock would look like)."""
    _, lock, _ = instrumented
    left, right = socket.socketpair()
    try:
        with lock:
            left.sendall(b"x")
            right.recv(1)
    finally:
        left.close()
        right.close()
    assert socket_io["violations"] == ["sendall", "recv"]
    socket_io["violations"].clear()


def test_session_change_among_sessions_that_share_ids(raw_server, instrumented):
    """Sessions that count their ids separately (1, 2, 3 ... in each).  A
    resume answered under a new session must be judged against the stream
    of the session the request named, not whichever stream last saw id 5:
    binding it elsewhere ends that stream, takes its pending requests and
    fills its seen-id window with this stream's ids (a false id_reused)."""
    telemetry, _, _ = instrumented
    behaviours = ["new_session", "inclusive", "new_session_same_counter", "faithful"] * 5
    for i, name in enumerate(behaviours):
        raw_server.on(f"/shared/{i}", script(name, id_prefix(name, i, shared_ids=True)))
    one = httpx.Client(verify=TLS, trust_env=False, timeout=60)
    delivered = 0
    try:
        opened = []
        for i in range(len(behaviours)):  # every first stream, then every resume
            headers = {"accept": "text/event-stream", "mcp-session-id": f"shared-{i}"}
            ids, _ = _read_sync("httpx-sse", one, f"{raw_server.url}/shared/{i}", headers)
            opened.append((i, headers, ids))
        for i, headers, ids in opened:
            resumed, _ = _read_sync("httpx-sse", one, f"{raw_server.url}/shared/{i}",
                                    {**headers, "last-event-id": ids[-1]})
            delivered += len(ids) + len(resumed)
    finally:
        one.close()
    check_counts(telemetry, behaviours, delivered)


def test_tracker_looks_the_cursor_up_in_the_session_the_request_named():
    """The tracker half of the fix above: given the request's session, a
    resume answered under a new session binds to that session's stream and
    leaves the other session's stream, pending requests and ids alone."""
    from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import Tracker

    t = Tracker()
    server = "127.0.0.1:1"
    streams = {}
    for session in ("A", "B"):
        streams[session] = t.open_stream(server, "streamable-http", session_id=session)
        t.request_sent(server, session, [(f'"{session}-call"', "tools/call")])
        for n in range(1, 6):
            t.event_consumed(streams[session])
            t.event_received(streams[session], str(n), note(session, n))
        t.event_consumed(streams[session])
        t.stream_ended(streams[session], "a read error")
    resumed = t.open_stream(server, "streamable-http", session_id="A-new", last_event_id="5",
                            request_session_id="A")
    assert resumed.check.cursor.session_id == "A" and resumed.check.cursor.known
    assert resumed.lineage == streams["A"].lineage
    assert t.response(resumed, 200, "A-new").verdict is None
    kinds = {gap.kind.value for gap in t.event_received(resumed, "1", note("new", 1)).gaps}
    assert kinds == {"session_changed", "id_regression"}
    # A's call can no longer be answered here: lost once this stream ends
    # and the reissue window passes with nothing re-sent.
    assert t.stream_ended(resumed, "the stream ended").window
    assert [d.gap.request_id for d in t.fates_due(0.0).fates] == ['"A-call"']
    # B is untouched: its own resume still owns its cursor and its request
    again = t.open_stream(server, "streamable-http", session_id="B", last_event_id="5")
    assert again.lineage == streams["B"].lineage
    assert t.response(again, 200, "B").verdict is None
    step = t.event_received(again, "6", note("B", 6))
    assert step.verdict.outcome.value == "resumed" and not step.gaps
    ended = t.stream_ended(again, "the stream ended")
    assert ended.held and not ended.gaps  # the client may resume it again
    assert t.lineage_ended(again, "the client stopped resuming").window
    assert [d.gap.request_id for d in t.fates_due(0.0).fates] == ['"B-call"']
