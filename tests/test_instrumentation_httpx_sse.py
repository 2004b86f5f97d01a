"""The plugin on a raw httpx-sse consumer against a real loopback server."""

from __future__ import annotations

import asyncio

import httpx
import httpx_sse

from scripted_server import fresh_session, legacy_stream, notification, sse


def test_seed_000_migration_reset_async(server, instrumented, telemetry):
    server.on("GET", "/sse", legacy_stream)
    server.on("GET", "/mcp", fresh_session)

    async def client() -> list[str]:
        seen = []
        async with httpx.AsyncClient(base_url=server.url) as http:
            async with httpx_sse.aconnect_sse(http, "GET", "/sse") as source:
                async for event in source.aiter_sse():
                    seen.append(event.id)
            headers = {"Last-Event-ID": "4821"}
            async with httpx_sse.aconnect_sse(http, "GET", "/mcp", headers=headers) as source:
                async for event in source.aiter_sse():
                    seen.append(event.id)
        return seen

    seen = asyncio.run(client())
    assert seen[-2:] == ["1", "2"], "the host's events arrive unchanged"
    assert telemetry.gap_kinds() == {"session_changed": 1, "id_regression": 1}
    assert telemetry.outcomes() == {"gap": 1}
    [span] = telemetry.resume_spans()
    assert span.attributes["mcp.resumption.outcome"] == "gap"
    assert span.attributes["mcp.resumption.previous_transport"] == "sse"
    assert {event.name for event in span.events} == {"resumption.gap"}
    assert len(telemetry.gap_logs()) == 2


def test_faithful_resume_sync(server, instrumented, telemetry):
    def first(request, body):
        return 200, {"mcp-session-id": "s-1"}, [sse(f"e-{n}", notification(n)) for n in (1, 2, 3)]

    def resumed(request, body):
        assert request.headers["last-event-id"] == "e-3"
        return 200, {"mcp-session-id": "s-1"}, [sse(f"e-{n}", notification(n)) for n in (4, 5)]

    server.on("GET", "/faithful", first)
    server.on("GET", "/faithful-resume", resumed)
    with httpx.Client(base_url=server.url) as http:
        with httpx_sse.connect_sse(
            http, "GET", "/faithful", headers={"mcp-session-id": "s-1"}
        ) as source:
            for _ in source.iter_sse():
                pass
        headers = {"mcp-session-id": "s-1", "last-event-id": "e-3"}
        with httpx_sse.connect_sse(http, "GET", "/faithful-resume", headers=headers) as source:
            ids = [event.id for event in source.iter_sse()]
    assert ids == ["e-4", "e-5"]
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"resumed": 1}


def test_a_delete_still_ends_the_session(server, instrumented, telemetry):
    """A request that opens no resume is sent without a span scope (issue
    24): a DELETE still tells the tracker, a POST without a cursor opens no
    resume (a cursor's resume: test_faithful_resume_sync)."""

    def stream(request, body):
        return 200, {"mcp-session-id": "s-del"}, [sse("d-1", notification(1))]

    server.on("POST", "/del", stream)
    server.on("GET", "/del", stream)
    server.on("DELETE", "/del", lambda request, body: (200, {"content-type": "text/plain"}, []))
    call = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}'
    headers = {"mcp-session-id": "s-del", "content-type": "application/json"}
    with httpx.Client(base_url=server.url) as http:
        with httpx_sse.connect_sse(http, "POST", "/del", headers=headers, content=call) as source:
            assert [event.id for event in source.iter_sse()] == ["d-1"]
        assert telemetry.resume_spans() == []  # no cursor: no resume
        tracker = instrumented.processor.tracker
        [session] = [s for key, s in tracker.index.sessions.items() if key[1] == "s-del"]
        assert not session.terminated
        http.delete("/del", headers={"mcp-session-id": "s-del"})
        assert session.terminated
