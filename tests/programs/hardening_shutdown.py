"""An MCP-style client that exits while an SSE stream is mid-read.

    python hardening_shutdown.py MODE FLAVOUR INSTRUMENTATION

MODE: ``thread`` (a daemon thread is blocked reading a silent resumed stream:
the ``mcp.resume`` span is open and its confirmation window armed),
``asyncio`` (a task reads it; ``asyncio.run`` returns and cancels the task),
``exit`` (``sys.exit(0)`` from inside the event loop of a stream that keeps
going).  FLAVOUR: ``httpx-sse`` or ``httpx2``.  INSTRUMENTATION: ``manual``
(SDK providers with console exporters and ``instrument()``) or ``auto`` (the
program is run under ``opentelemetry-instrument`` and has no OTel code).

Needs HARDENING_SERVER_URL.  Prints ``ready`` once the stream is being read.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import httpx
import httpx2
import httpx_sse

URL = os.environ["HARDENING_SERVER_URL"]
MODE, FLAVOUR, INSTRUMENTATION = sys.argv[1:4]
SESSION = f"shutdown-{MODE}-{FLAVOUR}-{INSTRUMENTATION}"
HEADERS = {"accept": "text/event-stream", "mcp-session-id": SESSION}


def manual_instrumentation() -> None:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(ConsoleLogRecordExporter()))
    meter_provider = MeterProvider(
        metric_readers=[PeriodicExportingMetricReader(ConsoleMetricExporter())]
    )
    McpResumptionInstrumentor().instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        logger_provider=logger_provider,
        confirm_timeout=30,
    )


def events_of(response):
    if FLAVOUR == "httpx-sse":
        return httpx_sse.EventSource(response).iter_sse()
    return iter(httpx2.EventSource(response))


def aevents_of(response):
    if FLAVOUR == "httpx-sse":
        return httpx_sse.EventSource(response).aiter_sse()
    return aiter(httpx2.EventSource(response))


def library():
    return httpx if FLAVOUR == "httpx-sse" else httpx2


def first_stream(http) -> str:
    with http.stream("GET", URL + "/shutdown/first", headers=HEADERS) as response:
        ids = [event.id for event in events_of(response)]
    return ids[-1]


def thread_mode() -> None:
    ready = threading.Event()

    def reader() -> None:
        http = library().Client(trust_env=False)
        cursor = first_stream(http)
        headers = {**HEADERS, "last-event-id": cursor}
        with http.stream("GET", URL + "/shutdown/silent", headers=headers) as response:
            events = events_of(response)
            ready.set()
            for _ in events:  # blocks: the server holds the stream open
                pass

    threading.Thread(target=reader, daemon=True).start()
    ready.wait(20)
    print("ready", flush=True)


def asyncio_mode() -> None:
    async def main() -> None:
        ready = asyncio.Event()

        async def reader() -> None:
            async with library().AsyncClient(trust_env=False) as http:
                async with http.stream("GET", URL + "/shutdown/first", headers=HEADERS) as r:
                    ids = [event.id async for event in aevents_of(r)]
                headers = {**HEADERS, "last-event-id": ids[-1]}
                async with http.stream("GET", URL + "/shutdown/silent", headers=headers) as r:
                    events = aevents_of(r)
                    ready.set()
                    async for _ in events:
                        pass

        task = asyncio.create_task(reader())
        await ready.wait()
        print("ready", flush=True)
        assert not task.done()
        # returning leaves the task to asyncio.run, which cancels it

    asyncio.run(main())


def exit_mode() -> None:
    with library().Client(trust_env=False) as http:
        cursor = first_stream(http)
        headers = {**HEADERS, "last-event-id": cursor}
        with http.stream("GET", URL + "/shutdown/ongoing", headers=headers) as response:
            for event in events_of(response):
                print("ready", event.id, flush=True)
                sys.exit(0)


if INSTRUMENTATION == "manual":
    manual_instrumentation()
{"thread": thread_mode, "asyncio": asyncio_mode, "exit": exit_mode}[MODE]()
