"""The workers of ``operation_instructions.py``'s per-``tools/call`` table
(issue 44: measure first): each configuration set up alone in its own
process, then a loop of ``tools/call`` through the real SDK client, and the
count of the plugin's function calls per ``tools/call``.

    python benchmarks/tools_call_costs.py --worker CONFIG N URL   # a loop (counted or timed)
    python benchmarks/tools_call_costs.py --serve                 # an SDK server, event store on
    python benchmarks/tools_call_costs.py --calls N URL           # plugin calls per tools/call

Configurations, each on fresh SDK providers (spans to a dropping exporter,
ALWAYS_ON, an in-memory metric reader): ``bare``; ``httpx-instr``
(opentelemetry-instrumentation-httpx alone); ``plugin`` (the plugin alone,
its defaults); ``plugin, no operation metric`` (the same with
``operation_metric=False``: the SDK's metric record's share, shown apart);
``traceloop`` (``opentelemetry-instrumentation-mcp``) and ``logfire``
(``logfire.instrument_mcp()``), as ``instructions.py`` sets the peers up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLUGIN = "plugin"
PLUGIN_NO_OPERATION = "plugin, no operation metric"
PEERS = ("traceloop", "logfire")
PEER_MODULES = {"traceloop": "opentelemetry.instrumentation.mcp", "logfire": "logfire"}
CONFIGS = ("bare", "httpx-instr", PLUGIN, PLUGIN_NO_OPERATION, *PEERS)


@contextlib.contextmanager
def plugin_alone(**settings: Any) -> Iterator[None]:
    """The plugin alone (no httpx instrumentation), on its own providers."""
    from configs import _NullExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(_NullExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    ours = McpResumptionInstrumentor()
    ours.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider,
        logger_provider=LoggerProvider(), **settings,
    )
    try:
        yield
    finally:
        ours.uninstrument()


def configure(config: str, stack: contextlib.ExitStack) -> None:
    from configs import configured
    from instructions import _peer

    if config == "bare":
        return
    if config == "httpx-instr":
        stack.enter_context(configured("httpx-instr"))
    elif config == PLUGIN:
        stack.enter_context(plugin_alone())
    elif config == PLUGIN_NO_OPERATION:
        stack.enter_context(plugin_alone(operation_metric=False))
    else:
        _peer(config)


def _major() -> int:
    import importlib.metadata

    return int(importlib.metadata.version("mcp").split(".", 1)[0])


def worker(config: str, n: int, url: str) -> None:
    """One ``tools/call`` of warm-up, then ``n`` of them (a new session each
    loop: its start-up cancels in the difference of two loops' counts);
    prints the loop's wall and CPU seconds (meaningful natively only)."""
    from instructions import _preload, _tools_calls

    _preload(f"tools/call mcp {_major()}.x")
    with contextlib.ExitStack() as stack:
        configure(config, stack)
        asyncio.run(_tools_calls(url, 1))
        gc.collect()
        gc.freeze()
        wall, cpu = time.perf_counter(), time.process_time()
        asyncio.run(_tools_calls(url, n))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"wall": wall, "cpu": cpu}))


# ------------------------------------------------- a real server, event store on


class _Store:
    """An in-memory event store as the SDK's example ``InMemoryEventStore``
    (uuid ids, the last 100 events per stream): the server primes each POST
    stream with an event id, so the plugin follows the call's stream."""

    def __init__(self) -> None:
        self.streams: dict[str, deque] = {}
        self.index: dict[str, tuple[str, object]] = {}

    async def store_event(self, stream_id: str, message: object) -> str:
        from uuid import uuid4

        event_id = str(uuid4())
        stream = self.streams.setdefault(stream_id, deque(maxlen=100))
        if len(stream) == stream.maxlen:
            self.index.pop(stream[0][0], None)
        stream.append((event_id, message))
        self.index[event_id] = (stream_id, message)
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        from mcp.server.streamable_http import EventMessage

        if last_event_id not in self.index:
            return None
        stream_id, _ = self.index[last_event_id]
        found = False
        for event_id, message in self.streams.get(stream_id, ()):
            if found and message is not None:
                await send_callback(EventMessage(message, event_id))
            elif event_id == last_event_id:
                found = True
        return stream_id


def serve() -> None:
    """The installed SDK's server with an event store; one tool, ``stream``,
    answered on the call's own POST stream; prints its port, serves until
    it is terminated."""
    import uvicorn
    from mcp.server.streamable_http import EventStore

    store = type("Store", (_Store, EventStore), {})()
    if _major() == 1:
        from mcp.server.fastmcp import FastMCP

        server = FastMCP("bench", event_store=store)
        app = server.streamable_http_app()
    else:
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("bench")
        app = None

    @server.tool()
    async def stream(n: int = 0) -> str:
        return "done"

    if app is None:
        app = server.streamable_http_app(event_store=store)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="critical")).run(sockets=[sock])


def count_calls(n: int, url: str) -> None:
    """The plugin's function calls per ``tools/call``: ``sys.setprofile``'s
    ``call`` events (a coroutine's or generator's resumption is one too) of
    frames whose code lives in the plugin's package, over a session of
    ``n`` calls less a session of none, after one call of warm-up."""
    from instructions import _preload, _tools_calls

    import opentelemetry.instrumentation.mcp_resumption as plugin

    _preload(f"tools/call mcp {_major()}.x")
    package = os.path.dirname(plugin.__file__) + os.sep
    counted = [0]

    def profile(frame: Any, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(package):
            counted[0] += 1

    def session(calls: int) -> int:
        counted[0] = 0
        sys.setprofile(profile)
        try:
            asyncio.run(_tools_calls(url, calls))
        finally:
            sys.setprofile(None)
        return counted[0]

    with plugin_alone():
        asyncio.run(_tools_calls(url, 1))
        empty = session(0)
        full = session(n)
    print(json.dumps({"calls": n, "per_call": (full - empty) / n, "session": empty}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs=3, metavar=("CONFIG", "N", "URL"))
    parser.add_argument("--calls", nargs=2, metavar=("N", "URL"))
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.serve:
        serve()
    elif args.calls:
        count_calls(int(args.calls[0]), args.calls[1])
    else:
        config, n, url = args.worker
        worker(config, int(n), url)


if __name__ == "__main__":
    main()
