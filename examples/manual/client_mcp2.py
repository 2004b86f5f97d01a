"""An mcp 2.x client, instrumented by hand.

    python client_mcp2.py http://127.0.0.1:8000/mcp --mode legacy
    python client_mcp2.py http://127.0.0.1:8000/mcp --mode auto

mcp 2.x's ``Client(url)`` defaults to ``mode="auto"``, which speaks protocol
2026-07-28 to a server that offers it: no session and no event ids, so a cut
stream cannot be resumed, only lost.  ``mode="legacy"`` speaks 2025-11-25
(the initialize handshake, sessions, event ids): the mode in which a resume
can be proven.
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

from mcp import Client  # noqa: E402  (after instrument(): either order works)


async def main(url: str, mode: str) -> None:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        print(f"progress {progress:g}/{total:g}: {message}", flush=True)

    async with Client(url, mode=mode) as client:
        print(f"protocol {client.protocol_version}", flush=True)
        result = await client.call_tool("countdown", {"n": 3}, progress_callback=on_progress)
        print(f"result: {result.content[0].text}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--mode", choices=["legacy", "auto"], default="legacy")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.mode))
