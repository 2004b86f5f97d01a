# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Rows of the server half: ``ProvableEventStore`` and the server guard.

A family of rows of its own (``SCENARIOS``), named in ``scenarios``'s list,
so that the seeds' module stays as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from opentelemetry.instrumentation.mcp_resumption.server import McpResumptionServerInstrumentor
from opentelemetry.instrumentation.mcp_resumption.server.provable import ProvableEventStore
from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc

from .clients import MCP_MAJOR, SESSION_PROTOCOL_VERSION, new_http_client
from .router import Route
from .scenarios import (
    Scenario,
    ScenarioWire,
    _RawStreamable,
    _resume,
    _resumed_or_reinitialized,
    _sdk_cut_call,
    _staged,
)
from .servers import IntEventStore, UuidEventStore, sdk_streamable_app


async def _faithful_resume_provable() -> ScenarioWire:
    store = ProvableEventStore(UuidEventStore())
    return await _sdk_cut_call("faithful_resume_provable", store, stateless_resume=False)


@contextlib.contextmanager
def _guarded() -> Iterator[McpResumptionServerInstrumentor]:
    """The server half with the guard on, for this row only (its own
    providers: the demo's exports stay the client's)."""
    instrumentor = McpResumptionServerInstrumentor()
    instrumentor.instrument(
        guard="reject",
        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
        logger_provider=LoggerProvider(),
    )
    try:
        yield instrumentor
    finally:
        instrumentor.uninstrument()


async def _store_reset_guarded() -> ScenarioWire:
    store = IntEventStore()
    with _guarded():
        async with _staged() as stage:
            backend = await stage.serve("sdk-guarded", sdk_streamable_app(event_store=store))
            router = await stage.route(lambda request: Route(backend))
            wire = ScenarioWire(
                "store_reset_guarded", MCP_MAJOR, transport_before="streamable-http"
            )
            async with new_http_client() as http:
                client = _RawStreamable(http, f"{router.url}/mcp")
                await client.handshake()
                await client.request("tools/call", {"name": "echo", "arguments": {"text": "ping"}})
                wire.record_before(client)
                # The migration swapped the store under the live session: every
                # cursor of it is gone (seed 000's instance that does not share
                # the state of the one that issued the cursor).
                store.events.clear()
                store._index.clear()
                attempt = await _resume(
                    http,
                    client.url,
                    last_event_id=client.cursor,
                    session_id=client.session_id,
                    protocol_version=SESSION_PROTOCOL_VERSION,
                )
            return await _resumed_or_reinitialized(
                router, wire, attempt, reinitialize=attempt.status == 410
            )


SCENARIOS = (
    Scenario(
        name="faithful_resume_provable",
        happened=(
            "Control. As faithful_resume_uuid, with the UUID store wrapped in "
            "ProvableEventStore: the same faithful replay goes out as <stream>:<n> ids, "
            "which order, so continuity is proven."
        ),
        expected_gaps=(),
        expected_outcome="resumed",
        run=_faithful_resume_provable,
    ),
    Scenario(
        name="store_reset_guarded",
        happened=(
            "The migration's empty replay (empty_replay), with the server guard on "
            "(OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD="
            "reject). The client's session lives on, but the store behind it was swapped: "
            "its cursor is unknown. Instead of 200 and an empty stream (empty_replay), the "
            "SDK server answers 410 Gone; the client re-initialises. Nothing was in flight."
        ),
        expected_gaps=(),
        expected_outcome="rejected",
        run=_store_reset_guarded,
    ),
)


# -- what the clients lost, seen from the server alone (mcp 2.x, 2026-07-28) ----------

_HELD_TOOLS = {"hold": None, "lookup_held": {"readOnlyHint": True}}


def _held_app(log: list[tuple[str, str]]) -> Any:
    """mcp 2.x's server answering JSON (``json_response``): nothing watches a
    request's connection. Its tools answer once their client is gone (the
    handler's own log says when): ``hold`` declares nothing, ``lookup_held``
    ``readOnlyHint``."""
    import anyio
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("held")

    async def held(name: str, ctx: Context) -> str:
        log.append(("started", name))
        request = ctx.request_context.request
        while not await request.is_disconnected():
            await anyio.sleep(0.01)
        log.append(("finished", name))
        return f"{name} done"

    for name, hints in _HELD_TOOLS.items():
        annotations = ToolAnnotations(**hints) if hints else None

        def make(tool_name: str) -> Any:
            async def tool(ctx):  # type: ignore[no-untyped-def]
                return await held(tool_name, ctx)

            # Resolved here: this module's annotations are strings, and
            # Context is mcp 2.x's, imported only when the row runs.
            tool.__annotations__ = {"ctx": Context, "return": str}
            return tool

        server.tool(name=name, annotations=annotations)(make(name))
    return server.streamable_http_app(json_response=True)


def _post(port: int, request_id: int, method: str, params: dict[str, Any], close: bool) -> bytes:
    """One 2026-07-28 POST, as bytes on a raw socket."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "desktop-host", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = json.dumps({
        "jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta},
    }).encode()
    name = f"Mcp-Name: {params['name']}\r\n" if "name" in params else ""
    return (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
        f"MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\n{name}"
        f"{'Connection: close' + chr(13) + chr(10) if close else ''}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _call_then_leave(port: int, tool: str, log: list[tuple[str, str]]) -> bool:
    """A client nobody can instrument (a desktop host, an IDE: here a raw
    socket) lists the tools, calls ``tool`` on 2026-07-28 and closes its
    connection once the handler started; True if no byte of an answer
    reached it and the handler ran to completion after that."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post(port, 1, "tools/list", {}, close=True))
    await writer.drain()
    listed = await reader.read()  # to the server's close
    writer.close()
    assert b'"tools"' in listed, listed[:200]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post(port, 2, "tools/call", {"name": tool, "arguments": {}}, close=False))
    await writer.drain()
    while ("started", tool) not in log:  # the handler's own log
        await asyncio.sleep(0.01)
    answered = reader.at_eof() or bool(reader._buffer)  # type: ignore[attr-defined]
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    deadline = asyncio.get_running_loop().time() + _SERVER_TIMEOUT_S
    while ("finished", tool) not in log and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    return not answered and ("finished", tool) in log


def _server_verdicts(reader: InMemoryMetricReader) -> dict[str, int]:
    """What the server half counted: fates other than delivered, and calls
    run for nobody by tool and hint."""
    found: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name not in (sc.SERVER_DELIVERIES[0], sc.SERVER_WORK_FOR_NOBODY[0]):
                    continue  # the server's other series (its operation histogram)
                for point in metric.data.data_points:
                    if not point.value:
                        continue
                    if metric.name == sc.SERVER_DELIVERIES[0]:
                        fate = point.attributes.get(sc.DELIVERY_FATE)
                        if fate != sc.DELIVERED:
                            found[f"fate:{fate}"] = found.get(f"fate:{fate}", 0) + int(point.value)
                    elif metric.name == sc.SERVER_WORK_FOR_NOBODY[0]:
                        key = (f"work_for_nobody:{point.attributes.get(sc.GEN_AI_TOOL_NAME)}:"
                               f"{point.attributes.get(sc.TOOL_HINT)}")
                        found[key] = found.get(key, 0) + int(point.value)
    return found


_SERVER_TIMEOUT_S = 10.0


async def _server_row(name: str, tool: str, hint: str) -> ScenarioWire:
    log: list[tuple[str, str]] = []
    reader = InMemoryMetricReader()
    instrumentor = McpResumptionServerInstrumentor()
    instrumentor.instrument(
        meter_provider=MeterProvider(metric_readers=[reader]), logger_provider=LoggerProvider()
    )
    try:
        async with _staged() as stage:
            backend = await stage.serve("sdk-json", _held_app(log))
            await stage.route(lambda request: Route(backend))
            wire = ScenarioWire(name, MCP_MAJOR, transport_before="streamable-http")
            gone = await _call_then_leave(backend.port, tool, log)
            # The truth: the client had no byte of an answer when it left, and
            # the handler's own log says it ran to completion after that.
            wire.server_verdicts_on_the_wire = (
                {"fate:undelivered": 1, f"work_for_nobody:{tool}:{hint}": 1} if gone else {}
            )
            deadline = asyncio.get_running_loop().time() + _SERVER_TIMEOUT_S
            while (
                _server_verdicts(reader) != wire.server_verdicts_on_the_wire
                and asyncio.get_running_loop().time() < deadline
            ):
                await asyncio.sleep(0.02)
            wire.server_verdicts = _server_verdicts(reader)
            return wire
    finally:
        instrumentor.uninstrument()


async def _work_for_nobody_server() -> ScenarioWire:
    return await _server_row("work_for_nobody_server", "hold", sc.HINT_NONE)


async def _undelivered_read_only_server() -> ScenarioWire:
    return await _server_row("answer_undelivered_server", "lookup_held", sc.HINT_READ_ONLY)


def _needs_2026_07_28() -> str | None:
    """Why the server-alone rows cannot run here: mcp 1.x speaks no 2026-07-28."""
    return None if MCP_MAJOR >= 2 else "needs mcp 2.x (2026-07-28 with JSON answers)"


SCENARIOS = (
    *SCENARIOS,
    Scenario(
        name="work_for_nobody_server",
        happened=(
            "Seen from the server alone. 2026-07-28 with JSON answers (mcp 2.x "
            "json_response): a client nobody can instrument (a desktop host) calls the tool "
            "hold and closes its connection while it runs. Nothing watches a JSON answer's "
            "connection, so the tool runs to completion for nobody, and its answer is "
            "written to a closed connection. The server half counts the answer undelivered "
            "and the call as work done for nobody (hold declares no idempotentHint: a "
            "WARNING says a re-issue runs it twice). No client verdict: the client is not "
            "instrumented."
        ),
        expected_gaps=(),
        expected_outcome=None,
        run=_work_for_nobody_server,
        prepare=_needs_2026_07_28,
    ),
    Scenario(
        name="answer_undelivered_server",
        happened=(
            "As work_for_nobody_server, with a tool that declares readOnlyHint "
            "(lookup_held): its answer is undelivered all the same, counted by the server "
            "half; the run for nobody is counted with its hint (read_only) and not warned: "
            "running it again is harmless."
        ),
        expected_gaps=(),
        expected_outcome=None,
        run=_undelivered_read_only_server,
        prepare=_needs_2026_07_28,
    ),
)
