"""mcp-resumption-proxy against a hostile upstream: a huge event, a trickle,
an endless stream that its client leaves.  (Malformed SSE is the fuzz
corpus of tests/test_proxy.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from fuzz_sse import RawServer, Reply, block, every_byte, head, sse_reply
from mcp_resumption_demo.router import Backend, Route
from proxy_harness import Proxy, proxy
from wire import WireRouter

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def raw():
    running = RawServer()
    yield running
    running.close()


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("args", [(), ("--resumable",)], ids=["observe", "resumable"])
def test_a_huge_event_stays_bounded_in_memory(raw, args) -> None:
    """64 MiB in one event: observe mode passes its bytes on unparsed past
    16 MiB; a resumable relay refuses to keep it.  The proxy's peak memory
    stays far below the event, and it serves on."""
    size = 64 * MIB
    body = b"data: " + b"x" * size + b"\n\n"
    chunks = tuple(body[i : i + MIB] for i in range(0, len(body), MIB))
    raw.reply("/huge", sse_reply(chunks))
    raw.reply("/small", sse_reply([block("1", "ok")]))
    with proxy(raw.url + "/", *args) as running:
        before = peak_rss(running.process.pid)
        received = 0
        with httpx.stream("GET", running.origin + "/huge", timeout=30) as response:
            try:
                for chunk in response.iter_raw():
                    received += len(chunk)
            except httpx.HTTPError:
                pass  # the resumable relay breaks the stream instead
        grown = peak_rss(running.process.pid) - before
        assert grown < 40 * MIB, f"{grown / MIB:.0f} MiB for a {size // MIB} MiB event"
        if not args:
            assert received == len(body), "observe mode passes every byte"
        assert "data: ok" in httpx.get(running.origin + "/small").text


def test_a_trickle_arrives_whole(raw) -> None:
    body = b"".join(block(str(n), f'{{"n": {n}}}') for n in range(20))
    raw.reply("/trickle", sse_reply(every_byte(body)))
    with proxy(raw.url + "/") as running:
        assert httpx.get(running.origin + "/trickle", timeout=30).content == body


def test_a_client_that_leaves_an_endless_stream_releases_it(raw) -> None:
    """The upstream never ends its stream; the client reads one event and
    goes: the proxy closes its upstream connection (the router between them
    sees its client, the proxy, leave)."""
    first = block("1", "tick")
    raw.on("/endless", lambda request: Reply(
        head(200, [(b"content-type", b"text/event-stream")]), (first,), hold=True))

    async def scenario() -> None:
        router = await WireRouter(lambda request: Route(Backend("raw", int(raw.url.rsplit(
            ":", 1)[1])))).start()
        try:
            running = await asyncio.to_thread(Proxy, router.url + "/")
            try:
                async with httpx.AsyncClient(timeout=10) as client, client.stream(
                    "GET", running.origin + "/endless"
                ) as response:
                    async for chunk in response.aiter_raw():
                        assert chunk == first
                        break
                await router.wait_for(
                    lambda exchanges: bool(exchanges) and exchanges[0].client_closed, 10)
            finally:
                await asyncio.to_thread(running.close)
        finally:
            await router.close()
            raw.release()

    asyncio.run(scenario())
