"""What the server half adds per ``tools/call`` to a real mcp 2.x server, in
instructions, beside the bare server (issue 44):

    .venv-mcp2/bin/python benchmarks/server_instructions.py   # ~5 min; valgrind as instructions.py

The installed SDK's streamable-HTTP server (``MCPServer``, one ``echo``
tool; the tests' UUID event store when the call is answered by SSE,
``json_response=True`` when by JSON) runs alone in its own process under
cachegrind (``--cache-sim=no``, the server process only); a plain httpx
client in this process, natively, opens one session and makes N
``tools/call``, then closes the server's stdin, and the server exits.  Each
configuration at a small and a large N; a row is the difference of the two
counts over the difference of the Ns, so start-up and the session's
initialize cancel.  Configurations: ``bare``; ``server half``
(``McpResumptionServerInstrumentor().instrument()`` with its defaults, on
an SDK ``MeterProvider`` with an in-memory reader and a ``LoggerProvider``:
the operation metric's record, one histogram point per request, inside);
and the same with ``operation_metric=False`` (the SDK's record's share,
shown apart, never subtracted).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NO_METRIC = "server half, no operation metric"
CONFIGS = ("bare", "server half", NO_METRIC)
ANSWERS = ("SSE", "JSON")


def serve(config: str, answer: str) -> None:
    """The server: prints its port once it listens, serves until its stdin
    closes."""
    import logging
    import socket

    import uvicorn
    from mcp.server.mcpserver import MCPServer

    from server_harness import UuidStore

    logging.disable(logging.WARNING)  # the SDK logs every session
    if config != "bare":
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        from opentelemetry.instrumentation.mcp_resumption.server import (
            McpResumptionServerInstrumentor,
        )

        McpResumptionServerInstrumentor().instrument(
            meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
            logger_provider=LoggerProvider(),
            **({"operation_metric": False} if config == NO_METRIC else {}),
        )
    server = MCPServer("bench")

    @server.tool()
    async def echo(text: str) -> str:
        return text

    if answer == "JSON":
        app = server.streamable_http_app(json_response=True)
    else:
        app = server.streamable_http_app(event_store=UuidStore(max_events_per_stream=100_000))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    class Announced(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            print(port, flush=True)  # listening: the client may come

    runner = Announced(uvicorn.Config(app, log_level="critical"))

    def stop_at_eof() -> None:
        sys.stdin.read()
        runner.should_exit = True

    threading.Thread(target=stop_at_eof, daemon=True).start()
    runner.run(sockets=[sock])


def _env() -> dict[str, str]:
    from instructions import _env as plugin_env

    env = plugin_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT / "tests")])
    return env


def count(valgrind: str, python: str, config: str, answer: str, n: int) -> int:
    """The server's instructions for a session of ``n`` tools/call."""
    from instructions import cachegrind, instructions_in

    from server_harness import RawSession

    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "valgrind.log"
        process = subprocess.Popen(
            [*cachegrind(valgrind, log), python, str(Path(__file__).resolve()), "--serve",
             config, answer],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(), text=True,
        )
        try:
            port = int(process.stdout.readline())
            url = f"http://127.0.0.1:{port}/mcp"
            raw = RawSession(url)
            raw.http.timeout = 120
            for k in range(n):
                answered = raw.echo(f"call {k}")
                assert "result" in answered, answered
            raw.close()
        finally:
            process.stdin.close()
            process.wait(timeout=600)
        return instructions_in(log, (config, answer, n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the server's")
    parser.add_argument("--ns", nargs=2, type=int, default=(60, 120), metavar=("SMALL", "LARGE"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--answers", nargs="+", choices=ANSWERS, default=list(ANSWERS))
    parser.add_argument("--serve", nargs=2, metavar=("CONFIG", "ANSWER"))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT / "tests"))
    if args.serve:
        serve(*args.serve)
        return
    from instructions import ensure_valgrind

    valgrind = ensure_valgrind()
    started, load = time.time(), os.getloadavg()[0]
    small, large = args.ns
    jobs = [(config, answer, n) for answer in args.answers for config in CONFIGS
            for n in (small, large)]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(jobs, pool.map(lambda job: count(valgrind, args.python, *job), jobs)))
    versions = subprocess.run(
        [args.python, "-c", "import sys, importlib.metadata as m; print(sys.version.split()[0],"
                            " m.version('mcp'), m.version('opentelemetry-sdk'))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    print(f"\nPython {versions[0]}, mcp {versions[1]}, opentelemetry-sdk {versions[2]}; "
          f"N {small} and {large}; load {load:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{time.time() - started:.0f} s\n")
    print("| answer | configuration | server instructions per tools/call | over bare |")
    print("|---|---|---:|---:|")
    for answer in args.answers:
        per_call = {config: (counts[config, answer, large] - counts[config, answer, small])
                    / (large - small) for config in CONFIGS}
        for config in CONFIGS:
            added = per_call[config] - per_call["bare"]
            print(f"| {answer} | {config} | {per_call[config]:,.0f} | {added:+,.0f} |")


if __name__ == "__main__":
    main()
