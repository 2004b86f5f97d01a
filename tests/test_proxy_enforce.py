"""mcp-resumption-proxy --mode enforce: a loss on the upstream leg fails the
client's pending request at once, whatever the client's SDK.

The upstream router cuts the first tools/call stream right after its
progress event, and the resume that follows gets no answer at all (the
server is gone).  Through the proxy in enforce mode, the mcp 1.x, mcp 2.x and
TypeScript SDK clients each get a JSON-RPC error for the call well inside
their own timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest

from fuzz_sse import RawServer, Reply, head
from proxy_harness import find_node, is_priming, proxy, stack, ts_client
from wire import CLIENTS, MCP1, RESUMABLE_CLIENTS, AppClient, IntegerEventStore, sdk_app

# The clients' own patience, which enforce mode must beat by far.
CLIENT_TIMEOUT = 8.0
AT_ONCE = 3.0


async def timed_call(kind: str, url: str) -> tuple[float, BaseException | None]:
    """How long the client's call took, and what it raised (None: answered)."""
    client = await AppClient(kind, url).__aenter__()
    started = time.monotonic()
    try:
        idle = CLIENT_TIMEOUT if kind == MCP1 else None
        await client.call("x", timeout=CLIENT_TIMEOUT, idle=idle)
    except Exception as error:  # what the SDK raises is its business
        return time.monotonic() - started, error
    finally:
        with contextlib.suppress(Exception):
            await client.__aexit__(None, None, None)
    return time.monotonic() - started, None


async def gone() -> None:
    """Every resume from now on gets no HTTP answer: the server is gone."""
    return None


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_broken_upstream_stream_fails_the_call_at_once(kind) -> None:
    async def scenario() -> tuple[float, BaseException | None]:
        async with stack(sdk_app(IntegerEventStore()), cut_upstream=True, at_resume=gone,
                         proxy_args=("--mode", "enforce")) as running:
            return await timed_call(kind, running.url)

    elapsed, error = asyncio.run(scenario())
    assert error is not None, "the cut call was answered"
    assert not isinstance(error, TimeoutError), f"waited {elapsed:.1f} s for its own timeout"
    assert elapsed < AT_ONCE, elapsed
    assert "mcp-resumption-proxy" in str(error), repr(error)  # the proxy's error, not the SDK's


def test_the_typescript_client_fails_at_once(node) -> None:
    async def scenario() -> dict:
        async with stack(sdk_app(IntegerEventStore()), cut_upstream=True, at_resume=gone,
                         cut_after=is_priming, proxy_args=("--mode", "enforce")) as running:
            return await asyncio.to_thread(ts_client, node, running.url, "work",
                                           int(CLIENT_TIMEOUT * 1000))

    report = asyncio.run(scenario())
    assert "error" in report, report
    assert "mcp-resumption-proxy" in report["error"], report
    assert report["elapsedMs"] < AT_ONCE * 1000 + 2000, report  # its reconnect delay: 1 s


@pytest.fixture(scope="module")
def node() -> str:
    return find_node()


def test_a_replaced_session_is_404_on_the_clients_next_request() -> None:
    raw = RawServer()
    try:
        def answer(request):
            body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
            return Reply(head(200, [(b"content-type", b"application/json"),
                                    (b"mcp-session-id", b"b-new"),
                                    (b"content-length", b"%d" % len(body))]), (body,))

        raw.on("/mcp", answer)
        with proxy(raw.url + "/mcp", "--mode", "enforce") as running:
            first = httpx.post(running.url, headers={"mcp-session-id": "a-old"},
                               content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
            assert first.status_code == 200 and first.headers["mcp-session-id"] == "b-new"
            served = raw.served
            again = httpx.post(running.url, headers={"mcp-session-id": "a-old"},
                               content=b'{"jsonrpc":"2.0","id":2,"method":"ping"}')
            assert again.status_code == 404
            assert again.json()["id"] == 2 and "re-initialize" in again.json()["error"]["message"]
            assert raw.served == served, "answered by the proxy"
            # The new session passes.
            assert httpx.post(running.url, headers={"mcp-session-id": "b-new"},
                              content=b"{}").status_code == 200
    finally:
        raw.close()


@pytest.mark.parametrize("kind", RESUMABLE_CLIENTS)
def test_an_empty_replay_fails_the_call_naming_the_gap(kind) -> None:
    """The server's store lost the cursor: each resume is answered 200 with an
    empty stream that ends at once.  In observe mode the client resumes again
    and again until its application gives up; in enforce mode the client
    half's verdict (replay_unconfirmed, decided at the stream's end, with no
    read left to raise it into) fails the call."""
    async def scenario() -> tuple[float, BaseException | None]:
        async with stack(sdk_app(IntegerEventStore(lost=True)), cut_upstream=True,
                         proxy_args=("--mode", "enforce"),
                         OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT="0.5") as running:
            return await timed_call(kind, running.url)

    elapsed, error = asyncio.run(scenario())
    assert error is not None and not isinstance(error, TimeoutError), (elapsed, error)
    assert elapsed < AT_ONCE, elapsed
    assert "mcp-resumption-proxy" in str(error) and "end-of-replay" in str(error), str(error)
