"""Two plain MCP clients with no OpenTelemetry code, for the wheel smoke test:
``sse URL`` resumes a raw httpx-sse stream twice, ``mcp URL`` calls a tool
through the MCP SDK client, whose stream the server closes mid-call.

Without arguments (as the README's ``python my_mcp_client.py``), the kind and
URL come from ``SMOKE_CLIENT`` and ``SMOKE_URL``; with ``SMOKE_SCRAPE`` set,
the client then prints its own Prometheus endpoint (``OTEL_EXPORTER_PROMETHEUS_PORT``),
which lives only as long as the process."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import sys

import anyio
import httpx
import httpx_sse


def sse_client(url: str) -> None:
    seen = []
    with httpx.Client() as http:
        for last in (None, "3", "5"):
            headers = {"Last-Event-ID": last} if last else {}
            with httpx_sse.connect_sse(http, "GET", url, headers=headers) as source:
                seen += [event.id for event in source.iter_sse()]
    print("sse client saw", ",".join(seen))


async def mcp_client(url: str) -> None:
    from mcp import ClientSession

    if int(importlib.metadata.version("mcp").split(".")[0]) == 1:
        from mcp.client.streamable_http import streamablehttp_client as connect
    else:
        from mcp.client.streamable_http import streamable_http_client as connect
    async with connect(url) as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        with anyio.fail_after(20):
            result = await session.call_tool("slow", {})
    print("mcp client got", result.content[0].text)


if __name__ == "__main__":
    kind, url = sys.argv[1:] or (os.environ["SMOKE_CLIENT"], os.environ["SMOKE_URL"])
    if kind == "sse":
        sse_client(url)
    else:
        asyncio.run(mcp_client(url))
    if os.environ.get("SMOKE_SCRAPE"):
        port = os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"]
        print(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
