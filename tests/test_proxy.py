"""mcp-resumption-proxy: the command, and transparency byte for byte.

The proxy runs as a child (tests/proxy_harness.py) in front of the raw byte
server of the SSE fuzz corpus (tests/fuzz_sse.py); a plain httpx client reads
each scripted answer directly and through the proxy, and must get the same
status, end-to-end headers, body bytes and the same kind of ending.
"""

from __future__ import annotations

import dataclasses
import json
import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_sse import FRAMINGS, RawServer, Reply, block, cases, head, sse_reply
from proxy_harness import Proxy, proxy

# What each leg frames on its own (RFC 9110 7.6.1 and the framing headers).
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer",
       "upgrade", "proxy-authenticate", "proxy-authorization"}


@pytest.fixture(scope="module")
def raw():
    running = RawServer()
    yield running
    running.close()


@pytest.fixture(scope="module")
def through(raw):
    with proxy(raw.url + "/") as running:
        yield running


def read(client: httpx.Client, method: str, url: str, headers, body: bytes):
    """(status, end-to-end headers, raw body, the error that ended it)."""
    try:
        with client.stream(method, url, headers=list(headers), content=body or None) as response:
            chunks = []
            error = None
            try:
                for chunk in response.iter_raw():
                    chunks.append(chunk)
            except httpx.HTTPError as failure:
                error = type(failure).__name__
            kept = [(k.lower(), v) for k, v in response.headers.raw
                    if k.lower().decode() not in HOP]
            return response.status_code, kept, b"".join(chunks), error
    except (httpx.HTTPError, httpx.InvalidURL) as failure:  # the client's own refusal
        return None, None, None, type(failure).__name__


# ================================================================ the command


def test_prints_the_client_url_first(raw) -> None:
    # How fast it starts is benchmarks/proxy.py's row "start", against a bare
    # forwarder on the same stack: a timed bound here failed on a loaded machine.
    with proxy(raw.url + "/mcp?tenant=a") as running:
        host, port = running.origin.removeprefix("http://").split(":")
        assert host == "127.0.0.1" and int(port) > 0
        assert running.url == f"http://127.0.0.1:{port}/mcp?tenant=a"


def test_listen_takes_a_port(raw) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with proxy(raw.url + "/mcp", "--listen", f"127.0.0.1:{port}") as running:
        assert running.url == f"http://127.0.0.1:{port}/mcp"


def test_an_unreachable_upstream_is_502_with_a_jsonrpc_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with proxy(f"http://127.0.0.1:{port}/mcp") as running:
        answer = httpx.post(running.url, json={"jsonrpc": "2.0", "id": 7, "method": "ping"})
        assert answer.status_code == 502
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()
        assert error["jsonrpc"] == "2.0" and error["id"] == 7
        assert "upstream unreachable" in error["error"]["message"]
        # A GET (no JSON-RPC id to answer) gets one too, with id null.
        answer = httpx.get(running.url, headers={"accept": "text/event-stream"})
        assert answer.status_code == 502 and answer.json()["id"] is None


# ================================================================ transparency


def test_headers_pass_except_hop_by_hop(raw, through) -> None:
    seen = {}

    def script(request):
        seen["headers"] = {k.lower(): v for k, v in request.headers}
        return Reply(head(200, [(b"content-type", b"application/json"),
                                (b"mcp-session-id", b"s-1"), (b"x-custom", b"1"),
                                (b"keep-alive", b"timeout=5"), (b"content-length", b"2")]),
                     (b"{}",))

    raw.on("/headers", script)
    answer = httpx.post(through.origin + "/headers", content=b"{}", headers={
        "mcp-session-id": "s-1", "authorization": "Bearer secret-token", "x-trace": "t",
        "connection": "keep-alive, x-hop", "x-hop": "dropped", "te": "trailers",
        "last-event-id": "5",
    })
    assert answer.status_code == 200 and answer.content == b"{}"
    assert answer.headers["mcp-session-id"] == "s-1" and answer.headers["x-custom"] == "1"
    assert "keep-alive" not in answer.headers
    sent = seen["headers"]
    for name in (b"mcp-session-id", b"authorization", b"x-trace", b"last-event-id"):
        assert name in sent, name
    for name in (b"x-hop", b"te"):
        assert name not in sent, name
    assert sent[b"host"] == raw.url.removeprefix("http://").encode()


def test_redirects_are_followed_as_hops(raw, through) -> None:
    raw.reply("/old", Reply(head(307, [(b"location", b"/new"), (b"content-length", b"0")])))
    body = block("1", json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}))
    raw.reply("/new", sse_reply([body]))
    answer = httpx.post(through.origin + "/old", content=b"{}")
    assert answer.status_code == 200 and answer.content == body


def test_the_legacy_endpoint_event_names_the_proxy(raw, through) -> None:
    absolute = block(None, raw.url + "/messages?session_id=abc", event="endpoint")
    relative = block(None, "/messages/?session_id=abc", event="endpoint")
    raw.reply("/sse-absolute", sse_reply([absolute, block("1", "x")], hold=False))
    raw.reply("/sse-relative", sse_reply([relative, block("1", "x")], hold=False))
    answer = httpx.get(through.origin + "/sse-absolute")
    assert answer.content == (
        block(None, through.origin + "/messages?session_id=abc", event="endpoint")
        + block("1", "x")
    )
    answer = httpx.get(through.origin + "/sse-relative")
    assert answer.content == relative + block("1", "x")  # resolves against the proxy as it is


def test_events_reach_the_client_one_by_one(raw, through) -> None:
    """An event is forwarded when it arrives, not when the body ends."""
    first = block("1", '{"jsonrpc":"2.0","method":"notifications/progress"}')

    def script(request):
        return Reply(head(200, [(b"content-type", b"text/event-stream")]), (first,), hold=True)

    raw.on("/slow", script)
    got = []
    with httpx.stream("GET", through.origin + "/slow", timeout=10) as response:
        for chunk in response.iter_raw():
            got.append(chunk)
            break
    raw.release()
    assert b"".join(got) == first


@settings(max_examples=120, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(case=cases(socket_path=False), framing=st.sampled_from(FRAMINGS))
def test_the_fuzz_corpus_passes_byte_for_byte(raw, through, case, framing) -> None:
    """Every framing: a body cut short or never terminated breaks the client's
    read through the proxy as it breaks it directly."""
    case = dataclasses.replace(case, framing=framing)
    raw.reply("/fuzz", case.reply())
    target = "/fuzz" + ("?" + case.query if case.query else "")
    with httpx.Client(timeout=10) as client:
        direct = read(client, case.method, raw.url + target, case.request_headers,
                      case.request_body)
        proxied = read(client, case.method, through.origin + target, case.request_headers,
                       case.request_body)
    assert proxied == direct, case.brief()


def test_never_logs_secrets_or_payloads(raw) -> None:
    body = block("1", json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"secret": "payload-x"}}))
    raw.reply("/mcp", sse_reply([body], headers=[(b"content-type", b"text/event-stream"),
                                                 (b"mcp-session-id", b"raw-session-77")]))
    running = Proxy(raw.url + "/mcp", OTEL_LOGS_EXPORTER="none",
                    OTEL_METRICS_EXPORTER="none")
    try:
        httpx.post(running.url, content=b'{"jsonrpc":"2.0","id":1,"method":"x"}', headers={
            "authorization": "Bearer secret-token", "cookie": "c=secret-cookie",
            "mcp-session-id": "raw-session-77"})
        httpx.get(running.origin + "/messages?session_id=raw-session-77")
    finally:
        running.close()
    output = running.stdout + running.stderr
    for secret in ("secret-token", "secret-cookie", "raw-session-77", "payload-x"):
        assert secret not in output
