"""An mcp 2.x client, with no OpenTelemetry code: run it under
opentelemetry-instrument (see README.md).

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

from mcp import Client


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
