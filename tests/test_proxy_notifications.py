"""mcp-resumption-proxy --resumable keeps the notification stream: when the
client's standalone GET stream is cut between client and proxy, the client's
re-opened GET gets 200 and the server's notifications keep reaching it.

The server (the installed SDK's, without an event store) allows one GET
stream per session, and the proxy still holds its upstream GET (a relay reads
on after its client left).  Were the re-opened GET forwarded, the server would
refuse it (409 Conflict) and the SDK give up after its retries; the proxy
hands it the upstream GET it holds instead, from the last event it wrote to
the cut one.

The router in front of the proxy cuts the client's GET (its connection
closes, as an idle timeout closes it), and holds the client's re-opened GET
until the server has sent a notification into the held stream: that
notification was sent while the client had no stream.  The truth comes from
the routers' records (statuses, the events on each leg) and from what the
client's SDK handed its application.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from mcp_resumption_demo.loopback import LoopbackServer
from mcp_resumption_demo.router import Backend, Route
from proxy_harness import Proxy, RawRouter, Stack
from wire import MCP1, MCP_MAJOR, RESUMABLE_CLIENTS, Context, message

NOTE = "note://{}"
WAIT = 15.0  # a bound on a failing test, never what a passing one waits for


def notes_app():
    """The installed major's streamable-HTTP server, no event store, with a
    tool ``notify`` whose notification (a resource update, related to no
    request) the server sends on the session's standalone GET stream."""
    if MCP_MAJOR == 1:
        from mcp.server.fastmcp import FastMCP

        server = FastMCP("notes")
    else:
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("notes")

    @server.tool()
    async def notify(n: str, ctx: Context) -> str:
        await ctx.session.send_resource_updated(NOTE.format(n))
        return "sent " + n

    return server.streamable_http_app()


def is_standalone(exchange) -> bool:
    """The session's standalone GET stream (opened, or re-opened, without a cursor)."""
    return is_standalone_head(exchange.request)


def is_standalone_head(request) -> bool:
    return (request.method == "GET" and request.header("mcp-session-id") is not None
            and request.header("last-event-id") is None)


def notes_in(exchange) -> list[str]:
    found = []
    for event in exchange.events:
        decoded = message(event)
        if decoded and decoded.get("method") == "notifications/resources/updated":
            found.append(decoded["params"]["uri"])
    return found


class SeveringRouter(RawRouter):
    """The client's router: it can cut one exchange's client connection while
    its stream is idle (``sever``), as an idle timeout or a lost network cuts it."""

    async def _relay(self, client, request, route, exchange, up_reader, reason):
        exchange.client_leg = client
        return await super()._relay(client, request, route, exchange, up_reader, reason)

    async def sever(self, exchange) -> None:
        exchange.severed = True
        self.cut_at[exchange.index] = time.monotonic()
        exchange.client_leg.writer.close()
        # The router has closed its connection to the proxy too.
        await asyncio.wait_for(exchange.upstream_finished.wait(), WAIT)


class NotesClient:
    """An SDK client of ``kind`` that records each resource update it is handed."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind, self.url = kind, url
        self.notes: list[str] = []
        self.arrived = asyncio.Event()
        self._stack = contextlib.AsyncExitStack()

    async def on_message(self, incoming) -> None:
        root = getattr(incoming, "root", incoming)
        if getattr(root, "method", None) == "notifications/resources/updated":
            self.notes.append(str(root.params.uri))
            self.arrived.set()

    async def __aenter__(self) -> NotesClient:
        if self.kind == MCP1:
            from mcp import ClientSession
            from mcp.client.streamable_http import streamablehttp_client

            read, write, *_ = await self._stack.enter_async_context(streamablehttp_client(self.url))
            self.session = await self._stack.enter_async_context(
                ClientSession(read, write, message_handler=self.on_message))
            await self.session.initialize()
        else:
            from mcp import Client

            self.session = await self._stack.enter_async_context(
                Client(self.url, mode="legacy", message_handler=self.on_message))
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._stack.aclose()

    async def notify(self, n: str) -> None:
        result = await self.session.call_tool("notify", {"n": n})
        assert result.content[0].text == "sent " + n

    async def received(self, note: str) -> None:
        async def until() -> None:
            while note not in self.notes:
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(until(), WAIT)


@contextlib.asynccontextmanager
async def notes_stack(kind: str):
    backend = await LoopbackServer(notes_app(), name="notes").astart()
    upstream = await RawRouter(lambda request: Route(Backend("notes", backend.port))).start()
    running = await asyncio.to_thread(Proxy, upstream.url + "/mcp", "--resumable")
    proxy_port = int(running.origin.rsplit(":", 1)[1])
    opened: list[int] = []

    async def policy(request):
        if is_standalone_head(request):
            opened.append(1)
            if len(opened) > 1:
                # The re-opened GET waits until the server has sent note 1
                # into the stream the proxy holds: sent while the client had none.
                await upstream.wait_for(lambda xs: any(
                    NOTE.format(1) in notes_in(x) for x in xs))
        return Route(Backend("proxy", proxy_port))

    client_router = await SeveringRouter(policy).start()
    try:
        yield Stack(client_router, upstream, running, client_router.url + "/mcp")
    finally:
        await client_router.close()
        await asyncio.to_thread(running.close)
        await upstream.close()
        await asyncio.to_thread(backend.close)


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_a_cut_notification_stream_is_reopened_and_its_notifications_arrive(kind) -> None:
    async def scenario() -> tuple[Stack, list[str]]:
        async with notes_stack(kind) as running, NotesClient(kind, running.url) as client:
            router = running.client_router
            await router.wait_for(lambda xs: any(is_standalone(x) and x.status == 200
                                                 for x in xs))
            [first] = [x for x in router.exchanges if is_standalone(x)]
            await router.sever(first)
            # The wire, not this wait, decides: a note that never came shows
            # below as the statuses and events that kept it away.
            with contextlib.suppress(TimeoutError):
                await client.notify("1")  # while the client's GET is down
                await client.received(NOTE.format(1))
                await client.notify("2")  # on the re-opened GET
                await client.received(NOTE.format(2))
            return running, list(client.notes)

    running, notes = asyncio.run(scenario())
    client_gets = [x for x in running.client_router.exchanges if is_standalone(x)]
    assert client_gets[0].severed and not notes_in(client_gets[0])
    assert [x.status for x in client_gets[1:]] == [200], [x.status for x in client_gets]
    assert notes == [NOTE.format(1), NOTE.format(2)], notes  # each once, in order
    assert notes_in(client_gets[1]) == [NOTE.format(1), NOTE.format(2)]
    assert not any(x.status == 409 for x in running.client_router.exchanges)
    # The server sent both on the one GET stream the proxy opened and held.
    upstream_gets = [x for x in running.upstream_router.exchanges if is_standalone(x)]
    assert len(upstream_gets) == 1, [x.status for x in upstream_gets]
    assert notes_in(upstream_gets[0]) == [NOTE.format(1), NOTE.format(2)]
    assert not any(x.status == 409 for x in running.upstream_router.exchanges)



def test_the_held_stream_goes_only_to_its_own_session_and_credentials() -> None:
    """Who may be handed a held standalone stream: a GET of the same session
    with the same Authorization and cookies, while no client reads it and it
    still runs; any other GET goes to the server, which judges it."""
    from mcp_resumption_proxy.resumable import Relays

    relays = Relays()
    relay = relays.new("s-1")
    opened_with = [(b"authorization", b"Bearer a"), (b"cookie", b"c=1")]
    relays.hold_standalone(relay, "s-1", opened_with, 200,
                           [(b"content-type", b"text/event-stream")])
    assert relays.standalone("s-1", [(b"Authorization", b"Bearer a"), (b"Cookie", b"c=1")]) is relay
    assert relays.standalone("s-1", [(b"authorization", b"Bearer b"), (b"cookie", b"c=1")]) is None
    assert relays.standalone("s-1", [(b"authorization", b"Bearer a")]) is None
    assert relays.standalone("s-2", opened_with) is None
    assert relays.standalone(None, opened_with) is None
    relay.followers = 1  # a client reads it: a second GET is the server's to refuse
    assert relays.standalone("s-1", opened_with) is None
    relay.followers = 0
    relay.ended = True  # the server closed it: a new GET opens a new one
    assert relays.standalone("s-1", opened_with) is None
