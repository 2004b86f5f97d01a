"""A request the client got a ``404`` for after its session's DELETE, through
mcp-resumption-proxy (observe and ``--resumable``): answered, never a lost
call (issue 45, point 4).

    mcp 1.x client -> client router -> proxy -> upstream router -> mcp 1.x server

The race made certain: the client's ``tools/list`` is held at the upstream
router until the server has answered the session's DELETE, so the server
answers it ``404`` (its JSON-RPC error names no id); the 404's body waits at
that router until the client has hung up on its status line (mcp 1.x fails
the request on a 404 without reading the body), and the DELETE's own answer
waits too, so that the client is still there to read the 404.  The wire's
truth is the routers' record: the DELETE answered before the ``tools/list``
reached the server; the client got ``404`` and closed.  The proxy saw its
client leave before the body: that is no loss, the status was the answer.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from mcp_resumption_demo.loopback import LoopbackServer
from mcp_resumption_demo.router import Backend, Route
from proxy_harness import LEG, Proxy
from wire import MCP1, AppClient, WireRouter, sdk_app

pytestmark = pytest.mark.mcp1

BROKEN = "mcp.client.resumption.broken_requests"
GAPS = "mcp.client.resumption.gaps"
BOUND = 10.0  # a bound on a failing test, never what a passing one waits for


class _Gated:
    """An upstream reader whose bytes wait for ``gate``."""

    def __init__(self, reader: asyncio.StreamReader, gate: asyncio.Event) -> None:
        self._reader = reader
        self._gate = gate

    async def read(self, size: int = -1) -> bytes:
        await self._gate.wait()
        return await self._reader.read(size)

    async def readline(self) -> bytes:
        await self._gate.wait()
        return await self._reader.readline()

    async def readexactly(self, size: int) -> bytes:
        await self._gate.wait()
        return await self._reader.readexactly(size)


class AfterDelete(WireRouter):
    """Routes everything to ``backend``; holds ``tools/list`` until the server
    answered the DELETE, and both answers (the DELETE's, the 404's body)
    until ``release``."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.held = asyncio.Event()
        self.deleted = asyncio.Event()
        self.release = asyncio.Event()
        super().__init__(self._policy)

    async def _policy(self, request):
        if request.jsonrpc_method == "tools/list":
            self.held.set()
            await self.deleted.wait()
        return Route(self.backend)

    async def _relay(self, client, request, route, exchange, up_reader, reason):
        if request.method == "DELETE":
            self.deleted.set()
            await self.release.wait()
        elif request.jsonrpc_method == "tools/list":
            up_reader = _Gated(up_reader, self.release)
        return await super()._relay(client, request, route, exchange, up_reader, reason)


def listing(router) -> list:
    return [e for e in router.exchanges if e.request.jsonrpc_method == "tools/list"]


@pytest.mark.parametrize("mode", [(), ("--resumable",)], ids=["observe", "resumable"])
def test_a_404_after_the_sessions_delete_is_an_answer_not_a_lost_call(mode) -> None:
    async def scenario():
        server = await LoopbackServer(sdk_app(), name="sdk").astart()
        upstream = await AfterDelete(Backend("sdk", server.port)).start()
        proxy = await asyncio.to_thread(
            Proxy, upstream.url + "/mcp", *mode, OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT="1")
        port = int(proxy.origin.rsplit(":", 1)[1])
        downstream = await WireRouter(lambda _: Route(Backend("proxy", port))).start()

        async def release_once_the_client_had_its_404() -> None:
            await downstream.wait_for(lambda log: any(
                e.status == 404 and e.client_closed for e in listing(downstream)), BOUND)
            upstream.release.set()

        releasing = asyncio.ensure_future(release_once_the_client_had_its_404())
        try:
            with contextlib.suppress(Exception):
                async with AppClient(MCP1, downstream.url + "/mcp") as client:
                    call = asyncio.ensure_future(client.session.list_tools())
                    await asyncio.wait_for(upstream.held.wait(), BOUND)
                # The application left: its session's DELETE, the call in flight.
            await asyncio.wait_for(releasing, BOUND)
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
        finally:
            upstream.release.set()
            releasing.cancel()
            await downstream.close()
            await asyncio.to_thread(proxy.close)
            await upstream.close()
            await asyncio.to_thread(server.close)
        return upstream, downstream, proxy

    upstream, downstream, proxy = asyncio.run(scenario())
    # The wire: the server answered the DELETE, then the tools/list 404; the
    # client got the 404 and hung up on it.
    [delete] = [e for e in upstream.exchanges if e.request.method == "DELETE"]
    [held] = listing(upstream)
    assert delete.status == 200 and delete.index < held.index and held.status == 404
    [answered] = listing(downstream)
    assert answered.status == 404 and answered.client_closed
    # The proxy: nothing lost, on either leg.
    assert proxy.counts(BROKEN, LEG, "mcp.resumption.request.fate") == {}, proxy.stderr
    assert proxy.counts(GAPS, LEG) == {}, proxy.stderr
    assert "lost call" not in proxy.stderr, proxy.stderr
