"""A raw httpx-sse client, instrumented by hand: MCP's streamable HTTP
written out, with the resume a client library does for you.

    python client_httpx_sse.py http://127.0.0.1:8000/mcp

It initializes a session (protocol 2025-11-25), calls ``countdown``, and
each time the server closes the call's SSE stream it reconnects with a GET
carrying ``Last-Event-ID`` (the last event id it received) and the session
id, until the call's result arrives.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

# Every verdict as one log line, and a per-server summary at exit. A
# program that configures logging, as this one does, sets the plugin's
# level to see the INFO ones (a proven resume, a clean summary); one
# that configures none gets every line on stderr without these two.
logging.basicConfig(format="%(message)s")
logging.getLogger("opentelemetry.instrumentation.mcp_resumption").setLevel(logging.INFO)
McpResumptionInstrumentor().instrument()

import httpx  # noqa: E402  (after instrument(): either order works)
from httpx_sse import connect_sse  # noqa: E402

PROTOCOL = "2025-11-25"


def call(url: str) -> None:
    headers = {"accept": "application/json, text/event-stream"}
    with httpx.Client(timeout=10) as http:
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "raw-httpx-sse", "version": "1"},
            },
        }
        with connect_sse(http, "POST", url, json=initialize, headers=headers) as source:
            session = source.response.headers["mcp-session-id"]
            for event in source.iter_sse():
                if event.data:
                    print(f"protocol {json.loads(event.data)['result']['protocolVersion']}")
                    break
        headers |= {"mcp-session-id": session, "mcp-protocol-version": PROTOCOL}
        notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        http.post(url, json=notification, headers=headers).raise_for_status()

        request = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "countdown", "arguments": {"n": 3}, "_meta": {"progressToken": 2}},
        }
        last_event_id, retry_ms, result = None, 1000, None
        method, body, extra = "POST", request, {}
        while result is None:
            with connect_sse(http, method, url, json=body, headers=headers | extra) as source:
                for event in source.iter_sse():
                    last_event_id = event.id or last_event_id
                    retry_ms = event.retry or retry_ms
                    if not event.data:  # a priming event: an id, nothing to apply
                        continue
                    message = json.loads(event.data)
                    if message.get("id") == 2:
                        result = message["result"]["content"][0]["text"]
                        break
                    params = message.get("params", {})
                    print(f"progress {params.get('progress'):g}/{params.get('total'):g}")
            if result is None:  # the server closed the stream: resume it
                time.sleep(retry_ms / 1000)
                method, body, extra = "GET", None, {"last-event-id": last_event_id}
        print(f"result: {result}")
        http.delete(url, headers=headers)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    call(parser.parse_args().url)
