"""What the server half costs per request, against the bare SDK server, in one run.

    PYTHONPATH=src:tests .venv-mcp2/bin/python benchmarks/server.py [--rounds N] [--requests N]

A real MCP SDK streamable-HTTP server (the installed major, the UUID store of
the tests) on 127.0.0.1 in this process, driven over keep-alive HTTP by a
plain httpx client.  Each round starts a fresh server per configuration, in
turn (interleaved, so drift hits every configuration alike), and measures the
CPU time of the server's thread per request (its own clock,
``pthread_getcpuclockid``: the client's time and loopback waits, 40 ms
delayed ACKs among them, are not in it), for:

* ``POST tools/call`` answered by an SSE stream: the request every tool call
  makes (the store proxy's ``store_event``, the session manager hook);
* ``GET`` resume with a known cursor: to the replayed answer, then close;
* ``GET`` resume with an unknown cursor: 200 and an empty stream (410 with
  the guard).

Configurations: ``bare`` (nothing instrumented), ``observe``
(``McpResumptionServerInstrumentor``, guard off, an SDK ``MeterProvider`` and
``LoggerProvider`` that are never exported), ``guard`` (``guard="reject"``),
``provable`` (bare, the store wrapped in ``ProvableEventStore``).  Medians over
rounds; each ratio is paired with ``bare`` of the same round.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from opentelemetry.instrumentation.mcp_resumption.server import (
    McpResumptionServerInstrumentor,
    ProvableEventStore,
)
from server_harness import MCP_MAJOR, RawSession, UuidStore, build_app, running

CONFIGS = ("bare", "observe", "guard", "provable")
KINDS = ("POST tools/call", "GET resume, known cursor", "GET resume, unknown cursor")


@contextlib.contextmanager
def configured(name: str):
    if name in ("observe", "guard"):
        instrumentor = McpResumptionServerInstrumentor()
        instrumentor.instrument(
            meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
            logger_provider=LoggerProvider(),
            guard="reject" if name == "guard" else "off",
        )
        try:
            yield
        finally:
            instrumentor.uninstrument()
    else:
        yield


def resume_known(raw: RawSession, cursor: str) -> None:
    headers = raw.headers()
    headers["accept"] = "text/event-stream"
    headers["last-event-id"] = cursor
    with raw.http.stream("GET", raw.url, headers=headers) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                return  # the replayed answer; closing ends the live tail
    raise AssertionError("no replayed event")


def resume_unknown(raw: RawSession) -> None:
    headers = raw.headers()
    headers["accept"] = "text/event-stream"
    headers["last-event-id"] = "no-such-cursor"
    with raw.http.stream("GET", raw.url, headers=headers) as response:
        for _ in response.iter_bytes():
            pass


def one_round(name: str, requests: int) -> dict[str, float]:
    # Each resume stores a priming event on the cursor's stream: room for all of them.
    store = UuidStore(max_events_per_stream=100_000)
    if name == "provable":
        store = ProvableEventStore(store)
    cpu: dict[str, float] = {}
    with configured(name), running(build_app(store)) as server:
        clock = time.pthread_getcpuclockid(server.thread.ident)
        raw = RawSession(server.url)
        raw.echo("warm")
        cursor = raw.last_ids[0]
        for kind, call, count in (
            (KINDS[0], lambda: raw.echo("x"), requests),
            (KINDS[1], lambda: resume_known(raw, cursor), requests // 2),
            (KINDS[2], lambda: resume_unknown(raw), requests // 2),
        ):
            started = time.clock_gettime(clock)
            for _ in range(count):
                call()
            cpu[kind] = (time.clock_gettime(clock) - started) / count * 1e6
        raw.close()
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)  # the SDK logs every session at INFO / WARNING
    started = time.monotonic()
    load = os.getloadavg()[0]
    rounds: list[dict[str, dict[str, float]]] = []
    for _ in range(args.rounds):
        rounds.append({name: one_round(name, args.requests) for name in CONFIGS})
    print(
        f"python {platform.python_version()}, mcp {MCP_MAJOR}.x, {os.cpu_count()} CPUs, "
        f"load {load:.2f} -> {os.getloadavg()[0]:.2f}, {args.rounds} rounds x "
        f"{args.requests} requests, {time.monotonic() - started:.1f} s, httpx {httpx.__version__}"
    )
    print()
    print(
        "| request | configuration | server CPU µs/request | ratio vs bare [min–max] "
        "| added µs/request |"
    )
    print("|---|---|---:|---:|---:|")
    for kind in KINDS:
        for name in CONFIGS:
            values = [r[name][kind] for r in rounds]
            ratios = [r[name][kind] / r["bare"][kind] for r in rounds]
            added = [r[name][kind] - r["bare"][kind] for r in rounds]
            print(
                f"| {kind} | {name} | {statistics.median(values):,.0f} | "
                f"{statistics.median(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}] | "
                f"{statistics.median(added):+,.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
