"""An mcp 1.x client that saves its resumption token, as an application that
survives a restart does (tests/test_shared_state_restart.py), instrumented on
in-memory providers with the settings of its environment
(``OTEL_PYTHON_MCP_RESUMPTION_*``: the state URL and key among them).

``first URL``: initialize, call ``work`` with ``on_resumption_token_update``,
and print each token with the session id as a JSON line (the application's
saved state); then wait to be killed (the parent sends SIGKILL: the crash or
redeploy of the client).

``resume URL SESSION TOKEN``: a new process; the saved session id as a
header of its HTTP client (none for ``-``), no initialize, and the call resumed with the
token.  Once the plugin decided (or the wait ran out) it prints its counts
as one JSON line: ``{"outcomes":..., "gaps":..., "fates":...}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers

from helpers import Telemetry


def line(document: dict) -> None:
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


async def first(url: str) -> None:
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.message import ClientMessageMetadata

    async with (
        streamable_http_client(url, terminate_on_close=False) as (read, write, session_id),
        ClientSession(read, write) as session,
    ):
        await session.initialize()

        async def progressed(*_args) -> None:
            pass

        async def saved(token: str) -> None:
            line({"token": token, "session": session_id()})

        request = types.ClientRequest(types.CallToolRequest(
            params=types.CallToolRequestParams(name="work", arguments={"text": "x"})
        ))
        await session.send_request(
            request, types.CallToolResult,
            metadata=ClientMessageMetadata(on_resumption_token_update=saved),
            progress_callback=progressed,  # the tool's answer comes as a stream
        )
        await asyncio.Event().wait()  # until the parent kills this process


async def resume(url: str, session_id: str, token: str, telemetry: Telemetry) -> None:
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.message import ClientMessageMetadata

    # "-": an application that kept only the token, not the session id.
    client = create_mcp_http_client(
        headers={"mcp-session-id": session_id} if session_id != "-" else None
    )
    async with client, streamable_http_client(
        url, http_client=client, terminate_on_close=False
    ) as (read, write, _), ClientSession(read, write) as session:
        request = types.ClientRequest(types.CallToolRequest(
            params=types.CallToolRequestParams(name="work", arguments={"text": "x"})
        ))
        call = asyncio.ensure_future(session.send_request(
            request, types.CallToolResult,
            metadata=ClientMessageMetadata(resumption_token=token),
        ))
        # The verdict, not the answer, is what this run is for: a server
        # that replaced the session never answers the call.
        deadline = time.monotonic() + 5
        while not telemetry.outcomes() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if "resumed" in telemetry.outcomes():
            # Continuity proven: the answer is on its way to the caller (the
            # verdict may be counted a moment before the SDK hands it over).
            await asyncio.wait({call}, timeout=5)
        if call.done() and not call.cancelled() and call.exception() is None:
            line({"answer": call.result().content[0].text})
        call.cancel()


def main() -> None:
    telemetry = Telemetry()
    with telemetry.instrumented():
        if sys.argv[1] == "first":
            asyncio.run(first(sys.argv[2]))
            return
        _, _, url, session_id, token = sys.argv
        try:
            asyncio.run(asyncio.wait_for(resume(url, session_id, token, telemetry), 10))
        except BaseException as error:  # the SDK's end of a cancelled call
            line({"error": type(error).__name__})
        line({
            "outcomes": telemetry.outcomes(),
            "gaps": telemetry.gap_kinds(),
            "fates": telemetry.fates(),
        })


if __name__ == "__main__":
    main()
