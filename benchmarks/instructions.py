"""The plugin's hot paths counted in instructions (issue 24), one command:

    python3 benchmarks/instructions.py            # ~8 min on 2 shared cores
    python3 benchmarks/instructions.py --quick    # ~3 min, smaller N, 1 timed repeat
    python3 benchmarks/instructions.py --rows "httpx-sse sync" --rows "POST→json"

Timed benchmarks swing ±30 % on a shared 2-core machine; instruction counts do
not.  Each row runs a client loop in its own process, under valgrind's
cachegrind (``--cache-sim=no``, the client process only: the MCP server runs
natively in another process, never traced), with ``PYTHONHASHSEED=0``, once
with a small N and once with a large N: the row's figure is the difference
in instructions divided by the difference in N, so that start-up, imports and
``instrument()`` cancel.  Each configuration is its own pair of processes:

* ``bare``: nothing instrumented; ``httpx-instr``: opentelemetry-instrumentation-httpx
  (and its httpx2 instrumentor) on an SDK TracerProvider (ALWAYS_ON, spans
  dropped) and MeterProvider; ``ours``: the same plus the plugin
  (``configs.py``: the plugin enabled minus ``httpx-instr`` is what it adds);
* on mcp 1.x, the peers alone on the same providers: ``traceloop``
  (``opentelemetry-instrumentation-mcp``'s ``McpInstrumentor``) and
  ``logfire`` (``logfire.configure(send_to_logfire=False, console=False)``
  then ``logfire.instrument_mcp()``).

Rows: per SSE event (one GET stream of N progress events, answered in the
process by a connection pool that hands the body out in 16 KiB pieces, as
``post_in_process.py`` answers POSTs: httpx-sse ``iter_sse`` and
``aiter_sse``, httpx2 ``EventSource``); per MCP POST answered by JSON or by an
SSE stream of one event (``post_in_process.py``'s loop, httpx + httpx-sse);
per ``tools/call`` through the real SDK client (mcp 1.x ``ClientSession``,
mcp 2.x ``Client``) against ``sse_server.py`` over loopback (the result only,
on a POST stream).

``--state URL`` (a Redis the run may write to, e.g. a loopback
``redis-server``): the plugin once more with the shared state in that Redis
(``ours, state``: ``docs/shared-state.md``) on the rows per event
(httpx-sse sync: must not move) and per POST answered by SSE, and a row per
resume: a GET with a ``Last-Event-ID`` this process never saw, answered by
one event, whose stream's record another process left in Redis (the
orchestrator writes the records first): ``ours`` judges it from memory
(``unverifiable``), ``ours, state`` reads the record (one round trip) and
restores the stream.  The store's writer thread runs in the counted process:
what it writes (the resumed stream's record, batched) is counted too.

Instructions are converted to µs with a factor derived in the same run: each
(row, configuration) is also run natively (``--timed`` times, small and large
N), its loop timed with the process CPU clock; the factor is the median over
all pairs of Δ CPU time ÷ Δ instructions.  The timed µs are printed as a
secondary column.  Every target (issue 30's) is marked PASS or MISS.

Environments: ``.venv-mcp2`` (event, POST and mcp 2.x rows) and
``.venv-bench-mcp1`` (mcp 1.x with the two peers), built by
``scripts/bench-instructions`` when missing; valgrind is installed from
Debian's package (``apt-get install -y valgrind``) when it is not on PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MCP2 = ROOT / ".venv-mcp2" / "bin" / "python"
MCP1 = ROOT / ".venv-bench-mcp1" / "bin" / "python"
SESSION = "3f1c2a9e8b7d4c6f9e0a1b2c3d4e5f60"
CHUNK = 16 * 1024

# The plugin with OTEL_PYTHON_MCP_RESUMPTION_OPERATION_METRIC=false: the POST
# rows show what the operation metric adds beside what the rest costs.
NO_OPERATION = "ours, no operation metric"

# The plugin with its state in the Redis of --state (the workers get the URL here).
STATE = "ours, state"
STATE_VARIABLE = "MCP_RESUMPTION_BENCH_STATE"
STATE_KEY = b"benchmark key"
STATE_ROWS = ("httpx-sse sync", "POST→sse", "tasks/get→json")
RESUME_ROW = "resume"

# row -> (python, unit, configurations, (small N, large N), quick Ns)
PUSH_ROW = "events/stream httpx-sse sync"
ROWS: dict[str, tuple[Path, str, tuple[str, ...], tuple[int, int], tuple[int, int]]] = {
    "httpx-sse sync": (
        MCP2,
        "event",
        ("bare", "httpx-instr", "floor", "ours"),
        (2000, 22000),
        (500, 5500),
    ),
    "httpx-sse async": (
        MCP2,
        "event",
        ("bare", "httpx-instr", "floor", "ours"),
        (2000, 22000),
        (500, 5500),
    ),
    "httpx2 EventSource": (
        MCP2,
        "event",
        ("bare", "httpx-instr", "floor", "ours"),
        (2000, 22000),
        (500, 5500),
    ),
    # An events/stream push stream (the Events extension): what the events'
    # room adds per notification, on the read path and in the tick that
    # reads the feed's drains; beside a plain SSE event above.
    PUSH_ROW: (
        MCP2,
        "event",
        ("bare", "httpx-instr", "ours"),
        (2000, 22000),
        (500, 5500),
    ),
    "POST→json": (MCP2, "POST", ("bare", "httpx-instr", "floor", NO_OPERATION, "ours"), (50, 550),
                  (20, 170)),
    "POST→sse": (MCP2, "POST", ("bare", "httpx-instr", "floor", NO_OPERATION, "ours"), (50, 550),
                 (20, 170)),
    # A tasks/get poll of a followed task (2026-07-28, JSON): what the task
    # room adds to a POST→json (its request parsed, its answer read).
    "tasks/get→json": (MCP2, "POST", ("bare", "httpx-instr", NO_OPERATION, "ours"), (50, 550),
                       (20, 170)),
    "tools/call mcp 1.x": (
        MCP1,
        "tools/call",
        ("bare", "httpx-instr", "ours", "traceloop", "logfire"),
        (20, 220),
        (10, 60),
    ),
    "tools/call mcp 2.x": (
        MCP2,
        "tools/call",
        ("bare", "httpx-instr", "ours"),
        (20, 220),
        (10, 60),
    ),
}
EVENT_ROWS = {row for row, spec in ROWS.items() if spec[1] == "event"}
# Per event: what the plugin adds, as a share of what the read itself costs
# (bare): a ratio that noise cannot move, and a guard against regressions.
# An exact count and the ring's append are ~300 by themselves, so an
# absolute bound would only measure the noise of a read of ~25,000.
EVENT_TARGET = 0.02  # x bare, ours - httpx-instr
POST_TARGETS = {"POST→sse": 0.30, "POST→json": 0.15}  # x (httpx-instr - bare)
TOOLS_TARGET = 0.35  # x (httpx-instr - bare), mcp 1.x; and below every peer


# ------------------------------------------------------------------ the worker


def _sse_body(n: int) -> bytes:
    progress = (
        '{"jsonrpc": "2.0", "method": "notifications/progress", '
        '"params": {"progressToken": 1, "progress": %d, "total": %d}}'
    )
    return "".join(
        f"id: {k}\nevent: message\ndata: {progress % (k, n)}\n\n" for k in range(1, n + 1)
    ).encode()


def _push_body(n: int) -> bytes:
    """An events/stream answer: ``active``, then N events, each with its
    cursor and the stream's subscription id (the request's id, 1)."""
    meta = '"_meta": {"io.modelcontextprotocol/subscriptionId": 1}'
    active = (
        '{"jsonrpc": "2.0", "method": "notifications/events/active", '
        f'"params": {{"cursor": "c0", "truncated": false, {meta}}}}}'
    )
    event = (
        '{"jsonrpc": "2.0", "method": "notifications/events/event", "params": '
        '{"eventId": "evt_%d", "name": "ticket.created", "timestamp": '
        '"2026-12-07T10:00:00Z", "data": {"project": "alpha", "n": %d}, "cursor": "c%d", '
        + meta + "}}"
    )
    lines = [f"data: {active}\n\n"]
    lines += [f"data: {event % (k, k, k)}\n\n" for k in range(1, n)]
    return "".join(lines).encode()


PUSH_REQUEST = json.dumps(
    {"jsonrpc": "2.0", "id": 1, "method": "events/stream",
     "params": {"name": "ticket.created", "arguments": {"project": "alpha"}, "cursor": None}}
).encode()  # fmt: skip


def _push_sync(body: str, n: int) -> None:
    import httpx
    import httpx_sse

    raw = Path(body).read_bytes() if body else _push_body(1)
    chunks = [raw[i : i + CHUNK] for i in range(0, len(raw), CHUNK)]
    transport = _stub_transport(lambda request: iter(chunks))
    headers = {**REQUEST_HEADERS, "content-type": "application/json",
               "mcp-protocol-version": "2026-07-28"}  # fmt: skip
    headers.pop("mcp-session-id")
    with (
        httpx.Client(transport=transport) as client,
        httpx_sse.connect_sse(
            client, "POST", "http://127.0.0.1:8000/mcp", headers=headers, content=PUSH_REQUEST
        ) as source,
    ):
        count = sum(1 for _ in source.iter_sse())
    assert count == n, count


def _chunks(path: str) -> list[bytes]:
    """The body of ``path``'s stream in 16 KiB pieces ("": one event)."""
    body = Path(path).read_bytes() if path else _sse_body(1)
    return [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]


def _stream_headers() -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"text/event-stream"), (b"mcp-session-id", SESSION.encode())]


REQUEST_HEADERS = {
    "mcp-session-id": SESSION,
    "accept": "text/event-stream",
    "mcp-protocol-version": "2025-06-18",
}


def _stub_transport(answer: Any) -> Any:
    """An httpx transport whose connection pool answers every request with
    ``answer(request)``'s bytes as an SSE response: no socket."""
    import httpcore
    import httpx

    class Pool:
        def handle_request(self, request: Any) -> Any:
            return httpcore.Response(200, headers=_stream_headers(), content=answer(request))

        def close(self) -> None:
            pass

        def __enter__(self) -> Pool:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    transport = httpx.HTTPTransport()
    transport._pool = Pool()  # type: ignore[assignment]
    return transport


def _events_sync(body: str, n: int) -> None:
    import httpx
    import httpx_sse

    chunks = _chunks(body)
    transport = _stub_transport(lambda request: iter(chunks))
    with (
        httpx.Client(transport=transport) as client,
        httpx_sse.connect_sse(
            client, "GET", "http://127.0.0.1:8000/mcp", headers=REQUEST_HEADERS
        ) as source,
    ):
        count = sum(1 for _ in source.iter_sse())
    assert count == n, count


class _AsyncChunks:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = iter(chunks)

    def __aiter__(self) -> _AsyncChunks:
        return self

    async def __anext__(self) -> bytes:
        for chunk in self.chunks:
            return chunk
        raise StopAsyncIteration

    async def aclose(self) -> None:
        pass


def _async_pool(core: Any, chunks: list[bytes]) -> Any:
    class Pool:
        async def handle_async_request(self, request: Any) -> Any:
            return core.Response(200, headers=_stream_headers(), content=_AsyncChunks(chunks))

        async def aclose(self) -> None:
            pass

        async def __aenter__(self) -> Pool:
            return self

        async def __aexit__(self, *exc: object) -> None:
            pass

    return Pool()


async def _events_async(body: str, n: int) -> None:
    import httpcore
    import httpx
    import httpx_sse

    transport = httpx.AsyncHTTPTransport()
    transport._pool = _async_pool(httpcore, _chunks(body))  # type: ignore[assignment]
    async with (
        httpx.AsyncClient(transport=transport) as client,
        httpx_sse.aconnect_sse(
            client, "GET", "http://127.0.0.1:8000/mcp", headers=REQUEST_HEADERS
        ) as source,
    ):
        count = 0
        async for _ in source.aiter_sse():
            count += 1
    assert count == n, count


async def _events_httpx2(body: str, n: int) -> None:
    import httpcore2
    import httpx2

    transport = httpx2.AsyncHTTPTransport()
    transport._pool = _async_pool(httpcore2, _chunks(body))  # type: ignore[assignment]
    async with (
        httpx2.AsyncClient(transport=transport) as client,
        client.stream("GET", "http://127.0.0.1:8000/mcp", headers=REQUEST_HEADERS) as response,
    ):
        count = 0
        async for _ in httpx2.EventSource(response):
            count += 1
    assert count == n, count


async def _tools_calls(url: str, n: int) -> None:
    from consumers import mcp_session

    async with mcp_session(url) as call_tool:
        for _ in range(n):
            result = await call_tool("stream", {"n": 0})
            # mcp 2.x names it ``is_error``, mcp 1.x ``isError``
            assert not getattr(result, "is_error", getattr(result, "isError", False)), result


def _peer(name: str) -> None:
    """A peer alone on the same kind of providers as configs.py's."""
    from configs import _NullExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    if name == "traceloop":
        from opentelemetry.instrumentation.mcp import McpInstrumentor

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_NullExporter()))
        McpInstrumentor().instrument(tracer_provider=provider)
    elif name == "logfire":
        import logfire

        logfire.configure(send_to_logfire=False, console=False, inspect_arguments=False)
        logfire.instrument_mcp()
    else:
        raise SystemExit(f"unknown configuration {name}")


def _ringed_layer(row: str) -> None:
    """The floor of the per-event target: a layer around the client's own
    SSE iterator, wrapped as the plugin wraps it (wrapt), that keeps a ring
    of references to the last events and does nothing else."""
    from collections import deque

    from wrapt import wrap_function_wrapper

    def sync(wrapped, instance, args, kwargs):
        events = wrapped(*args, **kwargs)
        ring: deque = deque(maxlen=17)

        def layer():
            append = ring.append
            for sse in events:
                append(sse)
                yield sse

        return layer()

    def asynchronous(wrapped, instance, args, kwargs):
        events = wrapped(*args, **kwargs)
        ring: deque = deque(maxlen=17)

        async def layer():
            append = ring.append
            async for sse in events:
                append(sse)
                yield sse

        return layer()

    if row.startswith("httpx-sse"):
        wrap_function_wrapper("httpx_sse", "EventSource.iter_sse", sync)
        wrap_function_wrapper("httpx_sse", "EventSource.aiter_sse", asynchronous)
    else:
        wrap_function_wrapper("httpx2", "EventSource.__aiter__", asynchronous)


def _floor(row: str, stack: Any) -> None:
    """``floor``: httpx-instr plus the least a design with the plugin's patch
    points does: for an event row the ringed layer alone; for a POST row
    ``request_path_floor.py``'s stand-in (send, iter_sse, close, on_start)."""
    from configs import configured

    if row in EVENT_ROWS:
        stack.enter_context(configured("httpx-instr"))
        _ringed_layer(row)
        return
    import httpx
    import httpx_sse
    from request_path_floor import _StandIn
    from wrapt import wrap_function_wrapper

    stand_in = _StandIn()
    stack.enter_context(configured("httpx-instr", span_processor=stand_in))
    wrap_function_wrapper(httpx, "Client.send", stand_in.send)
    wrap_function_wrapper(httpx_sse, "EventSource.iter_sse", stand_in.iter_sse)
    wrap_function_wrapper(httpx, "Response.close", stand_in.close)


def _preload(row: str) -> None:
    """Everything the loop imports, imported before it (and before the
    configuration, as an application imports its libraries first)."""
    import httpcore  # noqa: F401
    import httpx  # noqa: F401
    import httpx_sse  # noqa: F401

    if row == "httpx2 EventSource" or row == "tools/call mcp 2.x":
        import httpcore2  # noqa: F401
        import httpx2  # noqa: F401
    if row.startswith("tools/call"):
        import mcp
        import mcp.client.streamable_http  # noqa: F401
    if row.startswith(("POST", "tasks/")):
        import post_in_process  # noqa: F401


RESUME_SERVER = "127.0.0.1:8000"
RESUME_PATH = "/mcp"
_resumed = [0]


def _resume_cursor(k: int) -> str:
    return str(1000 + 2 * k)  # a counting scheme: the event after it is one more


def _resumes(n: int) -> None:
    """``n`` resumes, each of a cursor this process never saw (counted on
    across calls: the warm-up takes the first), each answered by the event
    after it."""
    import httpx
    import httpx_sse

    def the_event_after(request: Any) -> Any:
        cursor = next(v for k, v in request.headers if k.lower() == b"last-event-id").decode()
        return iter([_sse_body(1).replace(b"id: 1\n", f"id: {int(cursor) + 1}\n".encode())])

    with httpx.Client(transport=_stub_transport(the_event_after)) as client:
        for _ in range(n):
            cursor = _resume_cursor(_resumed[0])
            _resumed[0] += 1
            with httpx_sse.connect_sse(
                client, "GET", f"http://{RESUME_SERVER}{RESUME_PATH}",
                headers={**REQUEST_HEADERS, "last-event-id": cursor},
            ) as source:
                count = sum(1 for _ in source.iter_sse())
            assert count == 1, count


def seed_records(url: str, n: int) -> None:
    """The records of the streams the resume row resumes, as another
    process of the fleet would have left them (natively, before counting)."""
    from opentelemetry.instrumentation.mcp_resumption.shared.redis_state import RedisStore
    from opentelemetry.instrumentation.mcp_resumption.shared.shared_state import SharedRecord

    store = RedisStore(url, STATE_KEY, timeout=2.0)
    for k in range(n + 2):
        cursor = _resume_cursor(k)
        store.save(SharedRecord.of(
            server=RESUME_SERVER, session_id=SESSION, session_hash=store.session_hash(SESSION),
            path=RESUME_PATH, transport="streamable-http", last_received=cursor,
            last_consumed=cursor, seen=[(cursor, None)], meanings=None, pending=[],
            unconsumed_responses=(), primed=False, retry_ms=None, server_closed=False,
            writer="seed",
        ))
    assert store.flush(timeout=30.0), "the records were not written"
    store.close()


def _loop(row: str, n: int, argument: str) -> None:
    if row == RESUME_ROW:
        _resumes(n)
    elif row == "httpx-sse sync":
        _events_sync(argument, n)
    elif row == PUSH_ROW:
        _push_sync(argument, n)
    elif row == "httpx-sse async":
        asyncio.run(_events_async(argument, n))
    elif row == "httpx2 EventSource":
        asyncio.run(_events_httpx2(argument, n))
    elif row in ("POST→json", "POST→sse"):
        from post_in_process import _posts

        _posts("json" if row == "POST→json" else "sse", n)
    elif row == "tasks/get→json":
        from post_in_process import _task_polls

        _task_polls(n)
    else:
        asyncio.run(_tools_calls(argument, n))


def worker(
    row: str, config: str, n: int, argument: str, repeats: int, small: int, small_argument: str
) -> None:
    """``row``'s loop of ``n`` units under ``config``, after one unit of
    warm-up and with what was allocated until then frozen out of the
    collector's scans (so that the cost per unit does not depend on how much
    the configuration imported).  With ``repeats`` (natively, for the timed
    figures), the loop of ``small`` units and the loop of ``n`` run that many
    times, alternately, and the CPU seconds of each are printed as JSON."""
    import contextlib
    import gc

    from configs import CONFIGS, configured

    _preload(row)
    with contextlib.ExitStack() as stack:
        if config in CONFIGS:
            stack.enter_context(configured(config))
        elif config == NO_OPERATION:
            stack.enter_context(configured("ours", operation_metric=False))
        elif config == STATE:
            stack.enter_context(
                configured("ours", state=os.environ[STATE_VARIABLE], state_key=STATE_KEY)
            )
        elif config == "floor":
            _floor(row, stack)
        else:
            _peer(config)
        _loop(row, 1, "" if row in EVENT_ROWS else argument)
        gc.collect()
        gc.freeze()
        if not repeats:
            _loop(row, n, argument)
        cpu: dict[str, list[float]] = {"small": [], "large": []}
        for _ in range(repeats):
            for size, count, path in (("small", small, small_argument), ("large", n, argument)):
                started = time.process_time()
                _loop(row, count, path)
                cpu[size].append(time.process_time() - started)
    import opentelemetry.instrumentation.mcp_resumption as plugin

    print(json.dumps({"cpu": cpu, "plugin": plugin.__file__}))


# ------------------------------------------------------------ the orchestrator


def ensure_valgrind() -> str:
    found = shutil.which("valgrind")
    if found is None:
        print("valgrind missing: apt-get install -y valgrind", flush=True)
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        subprocess.run([*sudo, "apt-get", "install", "-y", "valgrind"], check=True)
        found = shutil.which("valgrind")
        if found is None:
            raise SystemExit("valgrind is still missing")
    return found


SOURCE = {"src": ROOT / "src"}  # the plugin measured (--src)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join([str(SOURCE["src"]), str(HERE)])
    env.pop("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", None)
    return env


def _command(python: Path, row: str, config: str, n: int, argument: str) -> list[str]:
    return [str(python), str(Path(__file__).resolve()), "--worker", row, config, str(n), argument]


def _timed_command(command: list[str], repeats: int, small: int, small_argument: str) -> list[str]:
    return [
        *command,
        "--repeats",
        str(repeats),
        "--small",
        str(small),
        "--small-arg",
        small_argument,
    ]


def per_unit(script: Path, names: tuple[str, ...], ns: tuple[int, int]) -> dict[str, float]:
    """Instructions per unit of each of ``names``: ``script --worker NAME N``
    counted under cachegrind at a small and a large N, the difference over
    the difference in N (start-up and imports cancel)."""
    valgrind = ensure_valgrind()
    small, large = ns
    found = {}
    for name in names:
        counts = [
            count_instructions(valgrind, [sys.executable, str(script), "--worker", name, str(n)])
            for n in (small, large)
        ]
        found[name] = (counts[1] - counts[0]) / (large - small)
    return found


def cachegrind(valgrind: str, log: Path) -> list[str]:
    """The command prefix that counts a process's instructions alone, into ``log``."""
    return [valgrind, "--tool=cachegrind", "--cache-sim=no", "--trace-children=no",
            "--cachegrind-out-file=/dev/null", f"--log-file={log}"]


def instructions_in(log: Path, what: object) -> int:
    """The instruction count cachegrind wrote to ``log``."""
    text = log.read_text()
    match = re.search(r"I\s+refs:\s+([\d,]+)", text)
    if match is None:
        raise RuntimeError(f"no instruction count for {what}:\n{text[-2000:]}")
    return int(match.group(1).replace(",", ""))


def count_instructions(valgrind: str, command: list[str]) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "valgrind.log"
        result = subprocess.run(
            [*cachegrind(valgrind, log), *command],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{command[3:]} failed under valgrind:\n{result.stderr[-3000:]}")
        return instructions_in(log, command[3:])


def time_loop(command: list[str]) -> dict[str, list[float]]:
    result = subprocess.run(
        command, env=_env(), capture_output=True, text=True, timeout=1800, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{command[3:]} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["cpu"]


class McpServer:
    """sse_server.py, natively, in its own process (never under valgrind)."""

    def __init__(self, python: Path) -> None:
        self.process = subprocess.Popen(
            [str(python), str(HERE / "sse_server.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.process.stdout.readline())}/mcp"

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


def _versions(python: Path) -> str:
    code = (
        "import importlib.metadata as m, json\n"
        "names = ['mcp', 'httpx', 'httpx-sse', 'httpx2', 'opentelemetry-sdk',"
        " 'opentelemetry-instrumentation-httpx', 'opentelemetry-instrumentation-mcp', 'logfire']\n"
        "found = {}\n"
        "for name in names:\n"
        "    try: found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(found))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _fmt(value: float) -> str:
    return f"{value:+,.0f}" if value else "+0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", action="append", choices=[*ROWS, RESUME_ROW])
    parser.add_argument("--state", metavar="URL", help="also with shared state in this Redis")
    parser.add_argument("--timed", type=int, help="native timed repeats (3; --quick 2)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--ns", type=int, nargs=2, metavar=("SMALL", "LARGE"), help="every row's N")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the plugin measured")
    parser.add_argument("--worker", nargs=4, metavar=("ROW", "CONFIG", "N", "ARG"))
    parser.add_argument("--repeats", type=int, default=0)
    parser.add_argument("--small", type=int, default=0)
    parser.add_argument("--small-arg", default="")
    args = parser.parse_args()
    if args.worker:
        row, config, n, argument = args.worker
        worker(row, config, int(n), argument, args.repeats, args.small, args.small_arg)
        return
    SOURCE["src"] = args.src.resolve()
    if args.state:
        with_state(args.state)
    valgrind = ensure_valgrind()
    rows = [row for row in ROWS if not args.rows or row in args.rows]
    timed = args.timed or (2 if args.quick else 3)
    for python in {ROWS[row][0] for row in rows}:
        if not python.exists():
            raise SystemExit(f"{python} missing: run scripts/bench-instructions")
    started = time.time()
    load = os.getloadavg()[0]
    scratch = tempfile.mkdtemp(prefix="bench-instructions-")
    servers: dict[Path, McpServer] = {}
    counting: dict[tuple[str, str, int], list[str]] = {}
    timing: dict[tuple[str, str], list[str]] = {}
    try:
        for row in rows:
            python, unit, configs, ns, quick_ns = ROWS[row]
            if row == RESUME_ROW:
                seed_records(args.state, max(args.ns or (quick_ns if args.quick else ns)))
            arguments = []
            for n in args.ns or (quick_ns if args.quick else ns):
                if row == PUSH_ROW:
                    argument = str(Path(scratch) / f"push-{n}.sse")
                    if not Path(argument).exists():
                        Path(argument).write_bytes(_push_body(n))
                elif unit == "event":
                    argument = str(Path(scratch) / f"events-{n}.sse")
                    if not Path(argument).exists():
                        Path(argument).write_bytes(_sse_body(n))
                elif unit == "tools/call":
                    if python not in servers:
                        servers[python] = McpServer(python)
                    argument = servers[python].url
                else:
                    argument = "-"
                arguments.append((n, argument))
                for config in configs:
                    counting[row, config, n] = _command(python, row, config, n, argument)
            (small, small_argument), (large, argument) = arguments
            for config in configs:
                command = _command(python, row, config, large, argument)
                timing[row, config] = _timed_command(command, timed, small, small_argument)
        done = [0]

        def counted_one(command: list[str]) -> int:
            instructions = count_instructions(valgrind, command)
            done[0] += 1
            print(
                f"[{time.time() - started:5.0f} s] {done[0]}/{len(counting)} "
                f"{command[3]} | {command[4]} | N={command[5]}: {instructions:,} instructions",
                file=sys.stderr,
                flush=True,
            )
            return instructions

        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            counted = dict(zip(counting, pool.map(counted_one, counting.values())))
        # The native timed runs after the counted ones, one at a time (not
        # beside each other nor beside valgrind).
        times = {key: time_loop(command) for key, command in timing.items()}
    finally:
        for server in servers.values():
            server.close()
        shutil.rmtree(scratch, ignore_errors=True)
    report(rows, args.quick, args.ns, counted, times, started, load)


def with_state(url: str) -> None:
    """``--state``: the configuration with shared state on the rows it can
    change, and the resume row (its workers inherit the URL)."""
    os.environ[STATE_VARIABLE] = url
    for row in STATE_ROWS:
        python, unit, configs, ns, quick_ns = ROWS[row]
        ROWS[row] = (python, unit, (*configs, STATE), ns, quick_ns)
    ROWS[RESUME_ROW] = (MCP2, "resume", ("bare", "httpx-instr", "ours", STATE), (20, 220),
                        (10, 60))


def report(rows, quick, forced, counted, times, started, load) -> None:
    per: dict[tuple[str, str], float] = {}
    timed: dict[tuple[str, str], float] = {}
    factors = []
    for row in rows:
        _, _, configs, ns, quick_ns = ROWS[row]
        small, large = forced or (quick_ns if quick else ns)
        for config in configs:
            instructions = counted[row, config, large] - counted[row, config, small]
            cpu = statistics.median(times[row, config]["large"]) - statistics.median(
                times[row, config]["small"]
            )
            per[row, config] = instructions / (large - small)
            timed[row, config] = cpu / (large - small) * 1e6
            if instructions > 0 and cpu > 0:
                factors.append(cpu * 1e6 / instructions * 1000)  # µs per 1,000 instructions
    # A short run on a loaded machine can time no positive difference at all;
    # the instruction counts, which decide every verdict, stand without it.
    factor = statistics.median(factors) if factors else None
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load {load:.2f}, "
        f"{'quick, ' if quick else ''}{time.time() - started:.0f} s, plugin from {SOURCE['src']}; "
        f"mcp2 env {_versions(MCP2)}"
        + (f"; mcp1 env {_versions(MCP1)}" if any(ROWS[r][0] == MCP1 for r in rows) else "")
    )
    if factor is None:
        print(
            "\nfactor: not measured (no row × configuration pair timed a positive "
            "Δ CPU time; run longer or with more --timed repeats); µs columns show –\n"
        )
    else:
        print(
            f"\nfactor: {factor:.3f} µs per 1,000 instructions (median over {len(factors)} "
            f"row × configuration pairs of Δ CPU time natively (median of the timed repeats) "
            f"÷ Δ instructions under cachegrind; "
            f"range {min(factors):.3f}–{max(factors):.3f})\n"
        )
    print(
        "| row | configuration | instructions per unit | µs at the factor "
        "| added instructions | vs | µs timed (secondary) | target | verdict |"
    )
    print("|---|---|---:|---:|---:|---|---:|---|---|")
    verdicts = []

    def line(row, config, added, against, target="", verdict=""):
        unit = ROWS[row][1]
        print(
            f"| {row} (per {unit}) | {config} | {per[row, config]:,.0f} "
            f"| {'–' if factor is None else f'{per[row, config] * factor / 1000:,.2f}'} "
            f"| {_fmt(added)} | {against} "
            f"| {timed[row, config]:,.2f} | {target} | {verdict} |"
        )
        if verdict:
            verdicts.append((row, target, verdict))

    for row in rows:
        _, unit, configs, _, _ = ROWS[row]
        bare, instr = per[row, "bare"], per[row, "httpx-instr"]
        httpx_adds = instr - bare
        line(row, "bare", 0, "")
        line(row, "httpx-instr", httpx_adds, "bare")
        if "floor" in configs:
            floor = per[row, "floor"] - instr
            what = "a ringed layer, nothing else" if unit == "event" else "patch points only"
            against = f"httpx-instr ({what}"
            if unit != "event":
                against += f"; {floor / httpx_adds:.2f} × httpx-instr's own"
            line(row, "floor", floor, against + ")")
        if NO_OPERATION in configs:
            # The plugin less the standard operation metric, whose cost is
            # mostly the SDK's histogram record (operation_instructions.py).
            without = per[row, NO_OPERATION] - instr
            line(row, NO_OPERATION, without,
                 f"httpx-instr ({without / httpx_adds:.3f} × httpx-instr's own)")
        ours = per[row, "ours"] - instr
        if unit == "event":
            share = ours / bare
            verdict = "PASS" if share <= EVENT_TARGET else "MISS"
            line(row, "ours", ours, f"httpx-instr ({share:.2%} of the read, bare)",
                 f"≤ {EVENT_TARGET:.0%} of the read", verdict)
        elif row in POST_TARGETS:
            bound = POST_TARGETS[row]
            ratio = ours / httpx_adds
            verdict = "PASS" if ratio <= bound else "MISS"
            line(
                row,
                "ours",
                ours,
                f"httpx-instr ({ratio:.3f} × httpx-instr's own)",
                f"≤ {bound:.2f} × httpx-instr",
                verdict,
            )
        elif "traceloop" in configs:
            ratio = ours / httpx_adds
            verdict = "PASS" if ratio <= TOOLS_TARGET else "MISS"
            line(
                row,
                "ours",
                ours,
                f"httpx-instr ({ratio:.3f} × httpx-instr's own)",
                f"≤ {TOOLS_TARGET:.2f} × httpx-instr",
                verdict,
            )
            for peer in ("traceloop", "logfire"):
                peer_adds = per[row, peer] - bare
                verdict = "PASS" if ours < peer_adds else "MISS"
                line(
                    row,
                    peer,
                    peer_adds,
                    "bare",
                    f"ours' {_fmt(ours)} below {peer}'s",
                    verdict,
                )
        else:
            line(
                row,
                "ours",
                ours,
                f"httpx-instr ({ours / httpx_adds:.2f} × httpx-instr's own; "
                f"{per[row, 'ours'] / bare:.3f} × bare, {_fmt(per[row, 'ours'] - bare)} over bare)",
                "reported against bare",
                "",
            )
        if STATE in configs:
            with_state_adds = per[row, STATE] - per[row, "ours"]
            line(row, STATE, with_state_adds, "ours (what the shared state adds)")
    print("\n| target | verdict |\n|---|---|")
    for row, target, verdict in verdicts:
        print(f"| {row}: {target} | {verdict} |")


if __name__ == "__main__":
    main()
