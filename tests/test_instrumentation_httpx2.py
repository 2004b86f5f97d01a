"""The plugin on a raw httpx2 ``EventSource`` consumer against a real server."""

from __future__ import annotations

import asyncio

import httpx2

from scripted_server import fresh_session, legacy_stream, notification, sse


def test_seed_000_migration_reset_async(server, instrumented, telemetry):
    server.on("GET", "/sse2", legacy_stream)
    server.on("GET", "/mcp2", fresh_session)

    async def client() -> list[str]:
        seen = []
        async with httpx2.AsyncClient(base_url=server.url) as http:
            async with http.stream("GET", "/sse2", headers={"accept": "text/event-stream"}) as r:
                async for event in httpx2.EventSource(r):
                    seen.append(event.id)
            headers = {"accept": "text/event-stream", "last-event-id": "4821"}
            async with http.stream("GET", "/mcp2", headers=headers) as response:
                async for event in httpx2.EventSource(response):
                    seen.append(event.id)
        return seen

    seen = asyncio.run(client())
    assert seen[-2:] == ["1", "2"]
    assert telemetry.gap_kinds() == {"session_changed": 1, "id_regression": 1}
    assert telemetry.outcomes() == {"gap": 1}


def test_caught_up_with_priming_event_sync(server, instrumented, telemetry):
    def first(request, body):
        return 200, {"mcp-session-id": "s-2"}, [sse(f"{n}", notification(n)) for n in (7, 8)]

    def resumed(request, body):
        return 200, {"mcp-session-id": "s-2"}, [sse("9")]  # priming: an id and no data

    server.on("GET", "/primed", first)
    server.on("GET", "/primed-resume", resumed)
    headers = {"accept": "text/event-stream", "mcp-session-id": "s-2"}
    with httpx2.Client(base_url=server.url) as http:
        with http.stream("GET", "/primed", headers=headers) as response:
            assert [e.id for e in httpx2.EventSource(response)] == ["7", "8"]
        with http.stream("GET", "/primed-resume", headers={**headers, "last-event-id": "8"}) as r:
            assert [e.id for e in httpx2.EventSource(r)] == ["9"]
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"caught_up": 1}
