"""instrument() first, the SDK's providers set afterwards (as a program that
configures OpenTelemetry after its imports does): the HTTP client spans must
still carry the MCP attributes, and every signal must count.

Prints one JSON line.  Needs HARDENING_SERVER_URL (a RawServer with /late/*).
"""

from __future__ import annotations

import json
import os

from opentelemetry._logs import set_logger_provider
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.metrics import set_meter_provider

from fuzz_sse import consume
from helpers import Telemetry
from opentelemetry import trace
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

URL = os.environ["HARDENING_SERVER_URL"]

McpResumptionInstrumentor().instrument()
HTTPXClientInstrumentor().instrument()
telemetry = Telemetry()
trace.set_tracer_provider(telemetry.tracer_provider)
set_meter_provider(telemetry.meter_provider)
set_logger_provider(telemetry.logger_provider)

headers = [(b"accept", b"text/event-stream"), (b"mcp-session-id", b"late-session-1")]
consume("httpx-sse", URL + "/late/first", headers=headers)
consume("httpx-sse", URL + "/late/reset", headers=[*headers, (b"last-event-id", b"3")])
spans = telemetry.spans.get_finished_spans()
client_spans = [span for span in spans if span.kind is trace.SpanKind.CLIENT]
print(json.dumps({
    "client_spans": len(client_spans),
    "with_session": sum("mcp.session.id" in span.attributes for span in client_spans),
    "resume_spans": sum(span.name == "mcp.resume" for span in spans),
    "gaps": telemetry.gap_kinds(),
    "events": sum(telemetry.counts("mcp.client.stream.events").values()),
    "gap_logs": sum(1 for record in telemetry.logs.get_finished_logs()
                    if record.log_record.event_name == "resumption.gap"),
}))
