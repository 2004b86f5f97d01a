"""mcp-resumption-proxy adds ``X-Forwarded-For``, ``X-Forwarded-Proto`` and
``X-Forwarded-Host`` to each upstream request: the client's own
``X-Forwarded-For`` list kept with the proxy's peer appended, the client's own
``-Proto`` and ``-Host`` kept, else the proxy's scheme and the host the client
asked the proxy for.

The truth is what the upstream received, read off the wire: the raw byte
server's parse of each request head, and the loopback router's record of
every request an MCP SDK client made through the proxy.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fuzz_sse import RawServer, Reply, head
from proxy_harness import Stack, proxy, stack
from wire import RESUMABLE_CLIENTS, AppClient, sdk_app

FORWARDED = ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host")


@pytest.fixture(scope="module")
def raw():
    running = RawServer()
    yield running
    running.close()


def heads_seen(raw: RawServer, path: str) -> list[list[tuple[bytes, bytes]]]:
    seen: list[list[tuple[bytes, bytes]]] = []

    def script(request):
        seen.append([(k.lower(), v) for k, v in request.headers])
        return Reply(head(200, [(b"content-type", b"application/json"),
                                (b"content-length", b"2")]), (b"{}",))

    raw.on(path, script)
    return seen


def values(headers: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]


def test_the_proxy_names_the_client_its_scheme_and_its_host(raw) -> None:
    seen = heads_seen(raw, "/fwd")
    with proxy(raw.url + "/fwd") as running:
        answer = httpx.post(running.url, content=b"{}")
    assert answer.status_code == 200
    [sent] = seen
    assert values(sent, b"x-forwarded-for") == [b"127.0.0.1"]  # the proxy's peer: this test
    assert values(sent, b"x-forwarded-proto") == [b"http"]
    # The host the client asked for (the proxy's), while Host names the upstream.
    assert values(sent, b"x-forwarded-host") == [running.origin.removeprefix("http://").encode()]
    assert values(sent, b"host") == [raw.url.removeprefix("http://").encode()]


def test_the_clients_own_forwarded_headers_are_kept_and_the_peer_appended(raw) -> None:
    """As a chain of proxies builds it: a TLS terminator in front of this proxy
    named the user's address, scheme and host; the proxy adds its own peer."""
    seen = heads_seen(raw, "/chain")
    with proxy(raw.url + "/chain") as running:
        answer = httpx.post(running.url, content=b"{}", headers=[
            ("X-Forwarded-For", "203.0.113.7, 198.51.100.2"),
            ("X-Forwarded-For", "192.0.2.1"),
            ("X-Forwarded-Proto", "https"),
            ("X-Forwarded-Host", "mcp.example.com"),
        ])
    assert answer.status_code == 200
    [sent] = seen
    assert values(sent, b"x-forwarded-for") == [b"203.0.113.7, 198.51.100.2, 192.0.2.1, 127.0.0.1"]
    assert values(sent, b"x-forwarded-proto") == [b"https"]
    assert values(sent, b"x-forwarded-host") == [b"mcp.example.com"]


@pytest.mark.parametrize("resumable", [False, True], ids=["observe", "resumable"])
@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_every_request_of_an_mcp_session_carries_them(kind, resumable) -> None:
    """Every request an SDK client makes (initialize, the standalone GET
    stream, the call, the session's DELETE), in each way the proxy forwards."""
    async def scenario() -> Stack:
        args = ("--resumable",) if resumable else ()
        async with stack(sdk_app(), proxy_args=args) as running, AppClient(
            kind, running.url
        ) as client:
            assert await client.call("x") == "done x"
        return running

    running = asyncio.run(scenario())
    client_leg = running.client_router.url.removeprefix("http://")
    upstream = running.upstream_router.exchanges
    methods = {exchange.request.method for exchange in upstream}
    assert {"POST", "GET"} <= methods, methods
    for exchange in upstream:
        request = exchange.request
        sent = {name: [v for k, v in request.headers if k.lower() == name] for name in FORWARDED}
        # The proxy's peer is the client's router, on loopback.
        assert sent == {"x-forwarded-for": ["127.0.0.1"], "x-forwarded-proto": ["http"],
                        "x-forwarded-host": [client_leg]}, (request.method, sent)
