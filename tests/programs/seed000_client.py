"""An MCP-style client with no OpenTelemetry code at all: a legacy SSE stream,
then a reconnect with Last-Event-ID to the streamable endpoint."""

import os

import httpx
import httpx_sse

base = os.environ["SEED_SERVER_URL"]
with httpx.Client(base_url=base) as http:
    with httpx_sse.connect_sse(http, "GET", "/sse") as source:
        ids = [event.id for event in source.iter_sse()]
    with httpx_sse.connect_sse(http, "GET", "/mcp", headers={"Last-Event-ID": ids[-1]}) as source:
        ids += [event.id for event in source.iter_sse()]
print("client saw", ",".join(ids))
