# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Every name this instrumentation puts into telemetry.

Dashboards, alert rules and users' queries depend on these strings: change
one only with a changelog entry.
"""

from .continuity import GapKind, Outcome

INSTRUMENTATION_NAME = "opentelemetry.instrumentation.mcp_resumption"

# -- attributes
MCP_SESSION_ID = "mcp.session.id"
MCP_PROTOCOL_VERSION = "mcp.protocol.version"
MCP_TRANSPORT = "mcp.transport"
RESUMPTION_LAST_EVENT_ID = "mcp.resumption.last_event_id"
RESUMPTION_PREVIOUS_SESSION_ID = "mcp.resumption.previous_session.id"
RESUMPTION_PREVIOUS_TRANSPORT = "mcp.resumption.previous_transport"
RESUMPTION_FIRST_EVENT_ID = "mcp.resumption.first_event_id"
RESUMPTION_REPLAYED_EVENTS = "mcp.resumption.replayed_events"
RESUMPTION_OUTCOME = "mcp.resumption.outcome"
GAP_KIND = "mcp.resumption.gap.kind"
GAP_EXPECTED = "mcp.resumption.gap.expected"
GAP_OBSERVED = "mcp.resumption.gap.observed"
JSONRPC_REQUEST_ID = "jsonrpc.request.id"
SERVER_ADDRESS = "server.address"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"

# -- values
TRANSPORT_SSE = "sse"
TRANSPORT_STREAMABLE_HTTP = "streamable-http"
NO_PREVIOUS_TRANSPORT = "none"
GAP_KINDS = tuple(kind.value for kind in GapKind)
OUTCOMES = tuple(outcome.value for outcome in Outcome)

# -- spans and events
RESUME_SPAN_NAME = "mcp.resume"
GAP_EVENT_NAME = "resumption.gap"

# -- metrics: (name, unit, description)
ATTEMPTS = (
    "mcp.client.resumption.attempts",
    "{attempt}",
    "Resumes of an MCP stream with Last-Event-ID, by outcome",
)
GAPS = (
    "mcp.client.resumption.gaps",
    "{gap}",
    "Continuity gaps found on resumed MCP streams, by kind",
)
DURATION = (
    "mcp.client.resumption.duration",
    "s",
    "Time from the reconnect request to the resume's verdict",
)
REPLAYED_EVENTS = (
    "mcp.client.resumption.replayed_events",
    "{event}",
    "Events delivered by a resumed stream up to its verdict",
)
STREAM_EVENTS = (
    "mcp.client.stream.events",
    "{event}",
    "SSE events delivered to MCP clients",
)
EVICTED_STREAMS = (
    "mcp.client.resumption.evicted_streams",
    "{stream}",
    "Tracked streams dropped because OTEL_PYTHON_MCP_RESUMPTION_MAX_STREAMS was reached",
)
