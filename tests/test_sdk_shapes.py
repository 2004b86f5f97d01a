"""Shapes the MCP SDKs' own test suites drive, through the real patched paths
against a real loopback server, with raw httpx + httpx-sse and httpx2 clients:

* a same-origin 307 that the client follows itself, one ``send`` per hop, on
  the POST and on the resume (Starlette's ``Mount("/mcp")``);
* a ``200 text/plain`` answer to a resume that the client retries;
* reading some events, closing the response, resuming from the last one read.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import httpx2
import httpx_sse
import pytest

from scripted_server import sse

LIBRARIES = ("httpx", "httpx2")


def _http(library: str):
    return httpx.AsyncClient if library == "httpx" else httpx2.AsyncClient


def _events(library: str, response):
    if library == "httpx":
        return httpx_sse.EventSource(response).aiter_sse()
    return httpx2.EventSource(response).__aiter__()


def _result(request_id: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": []}})


def _notice(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}})


async def _send_following(http, request):
    """What the MCP SDKs do (``stream_within_origin``): ``send`` without
    following, then ``send`` the next request of a same-origin redirect."""
    response = await http.send(request, stream=True, follow_redirects=False)
    while response.next_request is not None:
        await response.aread()
        await response.aclose()
        response = await http.send(response.next_request, stream=True, follow_redirects=False)
    return response


def _redirect(request, body):
    return 307, {"location": str(request.url.path) + "/", "content-type": "text/plain"}, []


def _wait_for(predicate, seconds: float = 10.0):
    """Poll until ``predicate()`` is true: a verdict given by the timer thread."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the verdict")
        time.sleep(0.02)


@pytest.mark.parametrize("library", LIBRARIES)
def test_redirected_post_and_resume_are_one_faithful_attempt(
    server, instrumented, telemetry, library
):
    base = f"/hop-{library}"
    session = {"mcp-session-id": f"hop-{library}"}
    server.on("POST", base, _redirect)
    server.on("GET", base, _redirect)
    # The POST's stream: a priming event, then the connection ends mid-call.
    server.on("POST", base + "/", lambda request, body: (200, session, [sse("1")]))
    # The resume replays strictly after 1: the answer to request 7.
    server.on("GET", base + "/", lambda request, body: (200, session, [sse("2", _result(7))]))

    async def client() -> list[str | None]:
        seen = []
        headers = {"accept": "application/json, text/event-stream", **session}
        async with _http(library)(base_url=server.url) as http:
            call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "x"}}
            request = http.build_request("POST", base, json=call, headers=headers)
            response = await _send_following(http, request)
            async for event in _events(library, response):
                seen.append(event.id)
            await response.aclose()
            resume = http.build_request("GET", base, headers={**headers, "last-event-id": "1"})
            response = await _send_following(http, resume)
            async for event in _events(library, response):
                seen.append(event.id)
            await response.aclose()
        return seen

    assert asyncio.run(client()) == ["1", "2"]
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"resumed": 1}
    (span,) = telemetry.resume_spans()
    assert span.attributes["http.response.status_code"] == 200


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_retried_text_plain_answer_is_part_of_the_attempt(
    server, instrumented, telemetry, library
):
    path = f"/retry-{library}"
    session = {"mcp-session-id": f"retry-{library}"}
    answers = []

    def resume(request, body):
        answers.append(request.headers.get("last-event-id"))
        if len(answers) == 1:  # a proxy's temporary answer; the client tries again
            return 200, {"content-type": "text/plain"}, ["temporarily unavailable"]
        return 200, session, [sse("2", _result(3))]

    server.on("POST", path, lambda request, body: (200, session, [sse("1")]))
    server.on("GET", path, resume)

    async def client() -> None:
        headers = {"accept": "application/json, text/event-stream", **session}
        async with _http(library)(base_url=server.url) as http:
            call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "x"}}
            async with http.stream("POST", path, json=call, headers=headers) as response:
                async for _ in _events(library, response):
                    pass
            for _ in range(2):
                retry = {**headers, "last-event-id": "1"}
                async with http.stream("GET", path, headers=retry) as response:
                    if response.headers["content-type"].startswith("text/plain"):
                        await response.aread()
                        continue
                    async for _ in _events(library, response):
                        pass

    asyncio.run(client())
    assert answers == ["1", "1"]
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"resumed": 1}
    assert len(telemetry.resume_spans()) == 1


@pytest.mark.parametrize("library", LIBRARIES)
def test_an_unfollowed_redirect_is_judged_when_the_window_passes(
    server, instrumented, telemetry, library
):
    path = f"/elsewhere-{library}"
    session = {"mcp-session-id": f"elsewhere-{library}"}
    server.on("POST", path, lambda request, body: (200, session, [sse("1")]))
    # No content type: the scripted server then says text/event-stream, and a
    # redirect is still a redirect.
    server.on(
        "GET", path, lambda request, body: (307, {"location": "http://other.invalid/mcp"}, [])
    )

    async def client() -> int:
        headers = {"accept": "application/json, text/event-stream", **session}
        async with _http(library)(base_url=server.url) as http:
            call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "x"}}
            async with http.stream("POST", path, json=call, headers=headers) as response:
                async for _ in _events(library, response):
                    pass
            retry = {**headers, "last-event-id": "1"}
            async with http.stream("GET", path, headers=retry) as response:
                return response.status_code  # another origin: not followed

    assert asyncio.run(client()) == 307
    _wait_for(lambda: telemetry.outcomes())
    assert telemetry.gap_kinds() == {"replay_unconfirmed": 1, "orphaned_request": 1}
    assert telemetry.outcomes() == {"gap": 1}


@pytest.mark.parametrize("library", LIBRARIES)
def test_read_some_close_and_resume_from_the_last_read_is_no_drain_race(
    server, instrumented, telemetry, library
):
    """The 2.3 SDK's hosting tests: read two events, close the response, and
    resume from the last one the test processed; the server replays after it."""
    path = f"/partial-{library}"
    session = {"mcp-session-id": f"partial-{library}"}
    first = [sse(f"{n}", _notice(n)) for n in (1, 2, 3)]
    server.on("GET", path, lambda request, body: (200, session, first))
    server.on("GET", path + "-resume", lambda request, body: (200, session, first[2:]))

    async def client() -> list[str | None]:
        headers = {"accept": "text/event-stream", **session}
        async with _http(library)(base_url=server.url) as http:
            async with http.stream("GET", path, headers=headers) as response:
                events = _events(library, response)
                read = [(await events.__anext__()).id for _ in range(2)]
            resume = {**headers, "last-event-id": read[-1]}
            async with http.stream("GET", path + "-resume", headers=resume) as response:
                read += [event.id async for event in _events(library, response)]
            return read

    assert asyncio.run(client()) == ["1", "2", "3"]
    assert telemetry.gap_kinds() == {}
    assert telemetry.outcomes() == {"resumed": 1}


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_close_while_the_handler_is_cancelled_is_still_the_drain_race(
    server, instrumented, telemetry, library
):
    """Seed 004 as an application writes it: the handler of an event is
    cancelled (an idle timeout) inside the read loop; the cancellation closes
    the response on its way out, and the client resumes from that event."""
    path = f"/cancelled-{library}"
    session = {"mcp-session-id": f"cancelled-{library}"}
    first = [sse(f"{n}", _notice(n)) for n in (1, 2, 3)]
    server.on("GET", path, lambda request, body: (200, session, first))
    server.on("GET", path + "-resume", lambda request, body: (200, session, first[2:]))

    async def client() -> list[str | None]:
        headers = {"accept": "text/event-stream", **session}
        received: list[str | None] = []
        handled = asyncio.Event()

        async def read_loop(http) -> None:
            async with http.stream("GET", path, headers=headers) as response:
                async for event in _events(library, response):
                    received.append(event.id)
                    if event.id == "2":
                        handled.set()
                        await asyncio.sleep(3600)  # applying event 2: cancelled here

        async with _http(library)(base_url=server.url) as http:
            loop = asyncio.ensure_future(read_loop(http))
            await handled.wait()
            loop.cancel()
            with pytest.raises(asyncio.CancelledError):
                await loop
            resume = {**headers, "last-event-id": received[-1]}
            async with http.stream("GET", path + "-resume", headers=resume) as response:
                received += [event.id async for event in _events(library, response)]
        return received

    assert asyncio.run(client()) == ["1", "2", "3"]
    assert telemetry.gap_kinds() == {"drain_race": 1}
    assert telemetry.outcomes() == {"gap": 1}


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_gap_found_after_the_verdict_makes_the_attempt_a_gap(
    server, instrumented, telemetry, library
):
    """The replay starts right after the cursor (a verdict of continuity at
    its first event), then ends without the answer to the pending request:
    the attempt had a gap, so its outcome, its span and its gaps say so."""
    path = f"/late-{library}"
    session = {"mcp-session-id": f"late-{library}"}
    server.on("POST", path, lambda request, body: (200, session, [sse("1", _notice(1))]))
    server.on("GET", path, lambda request, body: (200, session, [sse("2", _notice(2))]))

    async def client() -> None:
        headers = {"accept": "application/json, text/event-stream", **session}
        async with _http(library)(base_url=server.url) as http:
            call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "x"}}
            async with http.stream("POST", path, json=call, headers=headers) as response:
                async for _ in _events(library, response):
                    pass
            resume = {**headers, "last-event-id": "1"}
            async with http.stream("GET", path, headers=resume) as response:
                async for _ in _events(library, response):
                    pass

    asyncio.run(client())
    # The request is orphaned when its lineage ends: the client did not resume
    # the stream within retry (1 s) plus the confirmation window.
    _wait_for(lambda: telemetry.outcomes())
    assert telemetry.gap_kinds() == {"orphaned_request": 1}
    assert telemetry.outcomes() == {"gap": 1}
    (span,) = telemetry.resume_spans()
    assert span.attributes["mcp.resumption.outcome"] == "gap"
    assert span.status.status_code.name == "ERROR"
    assert [event.attributes["mcp.resumption.gap.kind"] for event in span.events] == [
        "orphaned_request"
    ]


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("in_flight", [True, False], ids=["in-flight", "nothing-pending"])
def test_the_same_rejection_gives_the_same_outcome_each_time(
    server, instrumented, telemetry, library, in_flight
):
    """A restarted server answers both of the SDK's reconnects 404: with a
    request in flight that is one rejected attempt whose request is orphaned,
    not two attempts; with nothing in flight, two rejections."""
    path = f"/restarted-{library}-{in_flight}"
    session = {"mcp-session-id": f"restarted-{library}-{in_flight}"}
    first = [sse("1", _notice(1))] if in_flight else [sse("1", _notice(1)), sse("2", _result(4))]
    server.on("POST", path, lambda request, body: (200, session, first))
    server.on("GET", path, lambda request, body: (404, {"content-type": "application/json"}, []))

    async def client() -> list[int]:
        headers = {"accept": "application/json, text/event-stream", **session}
        statuses = []
        async with _http(library)(base_url=server.url) as http:
            call = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "x"}}
            async with http.stream("POST", path, json=call, headers=headers) as response:
                last = [event.id async for event in _events(library, response)][-1]
            for _ in range(2):  # the SDKs' MAX_RECONNECTION_ATTEMPTS
                retry = {**headers, "last-event-id": last}
                async with http.stream("GET", path, headers=retry) as response:
                    statuses.append(response.status_code)
        return statuses

    assert asyncio.run(client()) == [404, 404]
    if in_flight:
        _wait_for(lambda: telemetry.outcomes())
        # Refused is the outcome, with the request it then loses as its gap.
        assert telemetry.outcomes() == {"rejected": 1}
        assert telemetry.gap_kinds() == {"orphaned_request": 1}
        assert len(telemetry.resume_spans()) == 1
    else:
        assert telemetry.outcomes() == {"rejected": 2}
        assert telemetry.gap_kinds() == {}
