# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Rows of the server half: ``ProvableEventStore`` and the server guard.

A family of rows of its own (``SCENARIOS``), named in ``scenarios``'s list,
so that the seeds' module stays as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from opentelemetry.instrumentation.mcp_resumption.server import McpResumptionServerInstrumentor
from opentelemetry.instrumentation.mcp_resumption.server.provable import ProvableEventStore

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
