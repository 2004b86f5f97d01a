"""An mcp 1.x client, instrumented by hand.

    python client_mcp1.py http://127.0.0.1:8000/mcp

mcp 1.x speaks protocol 2025-11-25 over streamable HTTP: sessions and event
ids, so every resume of a cut stream can be proven.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

# Every verdict as one log line, and a per-server summary at exit. A
# program that configures logging, as this one does, sets the plugin's
# level to see the INFO ones (a proven resume, a clean summary); one
# that configures none gets every line on stderr without these two.
logging.basicConfig(format="%(message)s")
logging.getLogger("opentelemetry.instrumentation.mcp_resumption").setLevel(logging.INFO)
McpResumptionInstrumentor().instrument()

from mcp import ClientSession  # noqa: E402  (after instrument(): either order works)
from mcp.client.streamable_http import streamable_http_client  # noqa: E402


async def main(url: str) -> None:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        print(f"progress {progress:g}/{total:g}: {message}", flush=True)

    async with (
        streamable_http_client(url) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        initialized = await session.initialize()
        print(f"protocol {initialized.protocolVersion}", flush=True)
        result = await session.call_tool("countdown", {"n": 3}, progress_callback=on_progress)
        print(f"result: {result.content[0].text}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    asyncio.run(main(parser.parse_args().url))
