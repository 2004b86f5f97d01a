"""Secrets and cardinality (issue 7, part 4).

With the default settings no raw session id, no event data and no query
string reaches any exported span, log record or metric: every export of a
run of the demo scenarios (and of a run with planted secrets) is serialized
with ``to_json`` and searched.  And 10,000 sessions leave a bounded number of
metric attribute sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator
from importlib.util import find_spec
from urllib.parse import parse_qsl, urlsplit

import pytest

from fuzz_sse import RawServer, Reply, block, consume, head
from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import (
    ContinuityProcessor,
    McpResumptionInstrumentor,
)
from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc
from opentelemetry.instrumentation.mcp_resumption.telemetry.facts import RequestFacts

ACCEPT = (b"accept", b"text/event-stream")
# Protocol words that are not anyone's data (they also name methods in gap messages).
# Protocol words, not data: the revisions, and 2026-07-28's resultType
# "complete" (inside the task fate "completed", which every server's task
# series carry from 0).
NOT_DATA = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28", "complete"}


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a condition (not for a time): polls, fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def no_open_windows(processor: ContinuityProcessor) -> bool:
    """No confirmation window still waiting: every resume span has ended."""
    deadlines = processor._deadlines
    with deadlines._cv:
        return not any(entry[2] is not None for entry in deadlines._heap)


def exports(telemetry: Telemetry) -> dict[str, str]:
    data = telemetry.metric_reader.get_metrics_data()
    return {
        "spans": "\n".join(span.to_json() for span in telemetry.spans.get_finished_spans()),
        "logs": "\n".join(record.to_json() for record in telemetry.logs.get_finished_logs()),
        "metrics": data.to_json() if data else "",
    }


def leaks(exported: dict[str, str], secrets: Iterable[str]) -> list[tuple[str, str]]:
    found = []
    for secret in set(secrets):
        forms = {secret, json.dumps(secret)[1:-1]}
        for signal, text in exported.items():
            if any(form in text for form in forms):
                found.append((signal, secret[:60]))
    return sorted(found)


def _string_leaves(value: object) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _string_leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _string_leaves(item)


def data_secrets(text: str) -> set[str]:
    """An event's or a body's data, and every string inside its payload."""
    found = {text} if len(text) >= 8 else set()
    try:
        decoded = json.loads(text)
    except ValueError:
        return found
    for message in decoded if isinstance(decoded, list) else [decoded]:
        if isinstance(message, dict):
            for key in ("params", "result", "error"):
                found.update(s for s in _string_leaves(message.get(key)) if len(s) >= 8)
    return found - NOT_DATA


def called_tools(wires) -> set[str]:
    """The tools the clients called: the conventions export each as
    ``gen_ai.tool.name`` of ``mcp.client.operation.duration``, as they do the
    method's name (the calls' arguments and results stay data)."""
    return {
        exchange.request.jsonrpc["params"]["name"]
        for wire in wires
        for exchange in wire.exchanges
        if (exchange.request.jsonrpc or {}).get("method") == "tools/call"
    }


def request_ids(wires) -> set[str]:
    """The ids of the requests the clients sent: the conventions export one
    as ``jsonrpc.request.id`` on a gap about it (a subscription's id,
    ``listen-1``, also stands in the server's acknowledgment of it)."""
    return {
        str(exchange.request.jsonrpc["id"])
        for wire in wires
        for exchange in wire.exchanges
        if "id" in (exchange.request.jsonrpc or {}) and "method" in exchange.request.jsonrpc
    }


def session_and_query_secrets(target: str, headers: Iterable[tuple[str, str]]) -> set[str]:
    found = set()
    query = urlsplit(target).query
    if query:
        found.add(query)
        found.update(value for _, value in parse_qsl(query) if len(value) >= 8)
    found.update(v for k, v in headers if k.lower() == "mcp-session-id" and len(v) >= 8)
    return found


# ------------------------------------------------------------ the demo


@pytest.fixture(scope="module")
def demo_run():
    from mcp_resumption_demo.scenarios import all_scenarios

    telemetry = Telemetry()
    instrumentor = McpResumptionInstrumentor()
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=0.3)
    wires = []
    try:
        processor = instrumentor.processor
        for scenario in all_scenarios():
            if scenario.name.startswith("task_") and find_spec("fastmcp_tasks") is None:
                continue  # a task row: skipped by the demo without fastmcp-tasks
            server_alone = scenario.name.endswith("_server") and scenario.prepare is not None
            if server_alone and scenario.prepare() is not None:
                continue  # seen from the server alone on 2026-07-28: not on mcp 1.x
            wires.append(asyncio.run(scenario.run()))
            wait_until(lambda: no_open_windows(processor))
        exported = exports(telemetry)
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
    return wires, exported, telemetry


def wire_secrets(wires) -> dict[str, set[str]]:
    sessions: set[str] = set()
    queries: set[str] = set()
    data: set[str] = set()
    for wire in wires:
        for session in (wire.session_id_before, wire.session_id_after,
                        *(r.session_id_sent for r in wire.resumes),
                        *(r.session_id_received for r in wire.resumes)):
            if session and len(session) >= 8:
                sessions.add(session)
        for event in (*wire.received_before, *(e for r in wire.resumes for e in r.events)):
            data.update(data_secrets(event.data))
            if event.event == "endpoint":
                queries.update(session_and_query_secrets(event.data, ()))
        for exchange in wire.exchanges:
            request = exchange.request
            found = session_and_query_secrets(request.target, request.headers)
            queries.update(s for s in found if "=" in s)
            sessions.update(s for s in found if "=" not in s)
            sessions.update(v for k, v in exchange.response_headers
                            if k.lower() == "mcp-session-id" and len(v) >= 8)
            if request.body:
                data.update(data_secrets(request.body.decode("utf-8", "replace")))
            for event in exchange.events:
                data.update(data_secrets(event.data))
                if event.event == "endpoint":
                    queries.update(session_and_query_secrets(event.data, ()))
    return {
        "session ids": sessions,
        "query strings": queries,
        "event data": data - called_tools(wires) - request_ids(wires),
    }


def test_demo_exports_carry_no_session_id_event_data_or_query(demo_run):
    wires, exported, telemetry = demo_run
    secrets = wire_secrets(wires)
    # the run had something to leak, and the exports have something to search
    assert len(secrets["session ids"]) >= 5, secrets["session ids"]
    assert secrets["query strings"] and len(secrets["event data"]) >= 20
    assert telemetry.spans.get_finished_spans() and telemetry.gap_kinds()
    assert '"mcp.session.id"' in exported["spans"]  # present, and hashed
    for kind, values in secrets.items():
        assert leaks(exported, values) == [], f"{kind} leaked into the exports"


def test_demo_metric_attributes_are_bounded_enums(demo_run):
    wires, _, telemetry = demo_run
    tools = called_tools(wires)  # bounded by the servers' tools
    assert tools
    allowed = {
        sc.RESUMPTION_OUTCOME: set(sc.OUTCOMES),
        sc.GAP_KIND: set(sc.GAP_KINDS),
        sc.MCP_TRANSPORT: {sc.TRANSPORT_SSE, sc.TRANSPORT_STREAMABLE_HTTP},
        sc.RESUMPTION_PREVIOUS_TRANSPORT: {
            sc.TRANSPORT_SSE, sc.TRANSPORT_STREAMABLE_HTTP, sc.NO_PREVIOUS_TRANSPORT},
        sc.SERVER_ADDRESS: {"127.0.0.1", "localhost"},
        # the demo's loopback servers: bounded by the servers, never by sessions
        sc.SERVER_PORT: range(1, 65536),
        sc.REQUEST_FATE: set(sc.FATES),
        sc.REISSUE_IDEMPOTENT: set(sc.IDEMPOTENT_VALUES),
        sc.REISSUE_RISK: set(sc.REISSUE_RISKS),
        sc.SUBSCRIPTION_RELISTENED: set(sc.BOOLEAN_VALUES),
        sc.SUBSCRIPTION_NOTIFICATIONS: set(sc.SUBSCRIPTION_FILTERS),
        sc.MCP_METHOD_NAME: set(sc.CLIENT_METHODS) | {sc.OTHER},
        sc.GEN_AI_TOOL_NAME: tools,
        sc.MCP_PROTOCOL_VERSION: {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25",
                                  "2026-07-28"},
        # a JSON-RPC error's code, tool_error, an HTTP status, or a fate of ours
        sc.ERROR_TYPE: _ErrorTypes(),
    }
    for name, *_ in (sc.ATTEMPTS, sc.GAPS, sc.DURATION, sc.REPLAYED_EVENTS, sc.STREAM_EVENTS,
                     sc.EVICTED_STREAMS, sc.BROKEN_REQUESTS, sc.REISSUES, sc.DUPLICATE_RUNS,
                     sc.LOST_SUBSCRIPTIONS, sc.OPERATION_DURATION):
        for point in telemetry.points(name):
            for key, value in point.attributes.items():
                assert key in allowed and value in allowed[key], (name, key, value)


class _ErrorTypes:
    """error.type values of the operation metric: a bounded set of words, or
    an integer code as text."""

    WORDS = frozenset({"tool_error", "reissued", "orphaned_request", "_OTHER"})

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and (
            value in self.WORDS or (value.lstrip("-").isdigit() and len(value) <= 8)
        )


# ------------------------------------------------- planted secrets, real path

PLANTED_SESSION = "SESSION-5ecret-7f3a9c"
PLANTED_LEGACY = "LEGACY-5ecret-c0ffee"
PLANTED_DATA = "PAYLOAD-5ecret-credit-card-4111"
PLANTED_QUERY = "token=QUERY-5ecret-bearer"


@contextlib.contextmanager
def observed_server(server: RawServer, policy: str) -> Iterator[tuple[RawServer, Telemetry]]:
    """The raw loopback server and the instrumentation on in-memory providers,
    session ids hashed (``default``) or ``raw``; removed afterwards."""
    telemetry = Telemetry()
    instrumentor = McpResumptionInstrumentor()
    settings = {"session_id": policy} if policy in ("raw", "omit") else {}
    instrumentor.instrument(**telemetry.providers(), confirm_timeout=60, **settings)
    try:
        yield server, telemetry
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()


@pytest.mark.parametrize("policy", ["default", "raw"])
def test_planted_secrets_stay_out_of_every_export(raw_server, policy):
    """A legacy stream (session in the endpoint's query), POSTs with the
    session in the query, a streamable session, secrets in every event's
    data; resumes that gap and resumes that do not.  The control: asked for
    raw session ids, the scan finds them (and nothing else)."""
    with observed_server(raw_server, policy) as (server, telemetry):
        sse = (b"content-type", b"text/event-stream")
        endpoint = f"/messages/?session_id={PLANTED_LEGACY}&{PLANTED_QUERY}"
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"data": PLANTED_DATA}})
        answer = json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"text": PLANTED_DATA}})
        server.reply("/sse", Reply(head(200, [sse]), (
            block(None, endpoint, event="endpoint"), block("41", note), block("42", answer))))
        server.reply("/messages/", Reply(head(202, [(b"content-length", b"0")])))
        session = [sse, (b"mcp-session-id", PLANTED_SESSION.encode())]
        server.reply("/mcp", Reply(head(200, session), (block("e-1", note), block("e-2", note))))
        server.reply("/mcp/reset", Reply(head(200, session), (block("e-1", note),)))
        server.reply("/mcp/fresh", Reply(head(200, [sse, (b"mcp-session-id", b"FRESH-5ecret-x")]),
                                         (block("1", answer),)))
        server.reply("/mcp/faithful", Reply(head(200, session), (block("e-3", note),)))
        consume("httpx-sse", server.url + "/sse", headers=[ACCEPT])
        body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                           "params": {"arguments": {"q": PLANTED_DATA}}}).encode()
        consume("httpx2", server.url + endpoint, method="POST", body=body,
                headers=[(b"content-type", b"application/json")])
        consume("httpx2-async", server.url + "/mcp/fresh?" + PLANTED_QUERY,
                headers=[ACCEPT, (b"last-event-id", b"42")])
        mcp = [ACCEPT, (b"mcp-session-id", PLANTED_SESSION.encode())]
        consume("httpx-sse-async", server.url + "/mcp?" + PLANTED_QUERY, headers=mcp)
        consume("httpx2", server.url + "/mcp/reset", headers=[*mcp, (b"last-event-id", b"e-2")])
        consume("httpx-sse", server.url + "/mcp", headers=mcp)
        consume("httpx-sse", server.url + "/mcp/faithful",
                headers=[*mcp, (b"last-event-id", b"e-2")])
        # As at exit: the client stops waiting for tools/call 7, which the
        # fresh session could not answer, and the attempts that waited for
        # its fate end with their spans.
        McpResumptionInstrumentor().processor.stop_waiting("the test is over")
        exported = exports(telemetry)
    assert telemetry.gap_kinds(), "the run produced gaps (and their messages)"
    assert "resumed" in telemetry.outcomes()
    planted = {PLANTED_SESSION, PLANTED_LEGACY, PLANTED_DATA, PLANTED_QUERY, "FRESH-5ecret-x"}
    if policy == "default":
        assert leaks(exported, planted | {"5ecret"}) == []
    else:
        assert leaks(exported, planted) == [
            ("spans", "FRESH-5ecret-x"), ("spans", PLANTED_LEGACY), ("spans", PLANTED_SESSION)]


@pytest.mark.parametrize("policy", ["default", "raw"])
def test_session_ids_inside_event_ids_are_scrubbed(raw_server, policy):
    """Event ids that embed the session id, seed 004's ``s-77:e-104`` shape,
    for a long and a short session id: the cursor, the first replayed id and
    the gap messages that quote them carry the session only as the session
    attribute does.  The control: asked for raw session ids, they are there."""
    with observed_server(raw_server, policy) as (server, telemetry):
        sse = (b"content-type", b"text/event-stream")
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}})
        sessions = {"long": "PREFIXED-5ecret-0b5e55ed", "short": "s-77"}
        for name, session in sessions.items():
            answer = head(200, [sse, (b"mcp-session-id", session.encode())])
            server.reply(f"/{name}", Reply(answer, tuple(
                block(f"{session}:e-{n}", note) for n in (103, 104))))
            server.reply(f"/{name}/reset", Reply(answer, (block(f"{session}:e-1", note),)))
        for name, session in sessions.items():
            headers = [ACCEPT, (b"mcp-session-id", session.encode())]
            consume("httpx-sse", f"{server.url}/{name}", headers=headers)
            cursor = (b"last-event-id", f"{session}:e-104".encode())
            consume("httpx2", f"{server.url}/{name}/reset", headers=[*headers, cursor])
        exported = exports(telemetry)
    assert telemetry.gap_kinds() == {"id_regression": 2}
    spans = [s for s in telemetry.spans.get_finished_spans() if s.name == sc.RESUME_SPAN_NAME]
    cursors = sorted(span.attributes[sc.RESUMPTION_LAST_EVENT_ID] for span in spans)
    firsts = sorted(span.attributes[sc.RESUMPTION_FIRST_EVENT_ID] for span in spans)
    if policy == "default":
        assert leaks(exported, sessions.values()) == []
        hashed = sorted(span.attributes[sc.MCP_SESSION_ID] for span in spans)
        # still the counter an operator reads, behind the session as hashed
        assert cursors == [f"{session}:e-104" for session in hashed]
        assert firsts == [f"{session}:e-1" for session in hashed]
    else:
        assert leaks(exported, sessions.values()) == [
            ("logs", "PREFIXED-5ecret-0b5e55ed"), ("logs", "s-77"),
            ("spans", "PREFIXED-5ecret-0b5e55ed"), ("spans", "s-77")]
        assert cursors == sorted(f"{session}:e-104" for session in sessions.values())


@pytest.mark.parametrize("policy", ["default", "omit"])
def test_tokens_cookies_urls_and_long_ids_stay_out(raw_server, policy):
    """With the HTTP client spans of opentelemetry-instrumentation-httpx: a
    bearer token whose stray newline makes httpx raise (its message quotes the
    header), a cookie, a legacy POST whose URL carries the session id, and a
    session id inside event ids longer than the kept bound (a cut would split
    it in two halves that the scrub cannot recognise)."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    token, cookie = "sk-live-T0KEN-5ecret-abcdef", "sid=COOKIE-5ecret-1234"
    long_tail = "x" * 200
    with observed_server(raw_server, policy) as (server, telemetry):
        HTTPXClientInstrumentor().instrument(tracer_provider=telemetry.tracer_provider)
        try:
            sse = (b"content-type", b"text/event-stream")
            session = [sse, (b"mcp-session-id", PLANTED_SESSION.encode())]
            note = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress"})
            server.reply("/messages/", Reply(head(202, [(b"content-length", b"0")])))
            server.reply("/mcp", Reply(head(200, session), tuple(
                block(f"{PLANTED_SESSION}:{long_tail}{n}", note) for n in (1, 2))))
            server.reply("/mcp/reset", Reply(head(200, session), (block("1", note),)))
            body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}).encode()
            consume("httpx", f"{server.url}/messages/?session_id={PLANTED_LEGACY}",
                    method="POST", body=body, headers=[(b"content-type", b"application/json")])
            mcp = [ACCEPT, (b"mcp-session-id", PLANTED_SESSION.encode()), (b"cookie", cookie)]
            consume("httpx-sse", server.url + "/mcp", headers=mcp)
            cursor = (b"last-event-id", f"{PLANTED_SESSION}:{long_tail}2")
            broken = consume("httpx-sse", server.url + "/mcp/reset",
                             headers=[*mcp, cursor, (b"authorization", f"Bearer {token}\n")])
            assert broken.error, "httpx refused the header"
            consume("httpx-sse", server.url + "/mcp/reset", headers=[*mcp, cursor])
        finally:
            HTTPXClientInstrumentor().uninstrument()
        exported = exports(telemetry)
    # ids over the kept bound are digests: opaque, so no order to judge
    assert telemetry.outcomes() == {"unverifiable": 1}
    client_urls = [span.attributes.get("url.full") or span.attributes.get("http.url")
                   for span in telemetry.spans.get_finished_spans() if span.kind.name == "CLIENT"]
    assert any("session_id=" in url for url in client_urls), client_urls
    halves = {PLANTED_SESSION[:10], PLANTED_SESSION[-10:]}
    assert leaks(exported, {cookie, PLANTED_LEGACY, PLANTED_SESSION, *halves}) == []
    # The httpx instrumentation's own span records httpx's exception, header
    # value and all: not ours to rewrite.  Ours carry none of it.
    resumes = [s for s in telemetry.spans.get_finished_spans() if s.name == sc.RESUME_SPAN_NAME]
    ours = {**exported, "spans": "\n".join(span.to_json() for span in resumes)}
    assert leaks(ours, {token, "T0KEN-5ecret"}) == []
    [failed] = [span for span in resumes if span.status.status_code.name == "ERROR"
                and "error.type" in span.attributes]
    assert failed.attributes["error.type"] == "LocalProtocolError"


# ------------------------------------------------------------ cardinality

BEHAVIOURS = ("faithful", "reset", "fresh", "empty", "rejected", "primed", "inclusive")


def _session_round(processor: ContinuityProcessor, n: int, behaviour: str, host: str) -> None:
    """One session through the processor's own entry points, as the patches
    drive them: a stream that breaks, then a resume that ``behaviour``s."""
    server = f"{host}:443"
    session = f"cardinality-session-{n}"
    stream = f"stream{n}"  # an event id prefix of its own, not the session id
    facts = RequestFacts("GET", server, host, session_id=session)
    context = processor.end_request(facts, processor.begin_request(facts), 200, session, True)
    for k in range(1, 4):
        processor.event(context, "message", f"{stream}:e-{k}", f'{{"n": {k}}}')
        processor.asked_next(context)
    processor.ended(context, "a read error (RemoteProtocolError)")
    resume_facts = RequestFacts("GET", server, host, last_event_id=f"{stream}:e-3",
                                session_id=session, protocol_version="2025-11-25")
    resume = processor.begin_request(resume_facts)
    status = 404 if behaviour == "rejected" else 200
    answered = f"{session}-fresh" if behaviour == "fresh" else session
    context = processor.end_request(resume_facts, resume, status, answered, status == 200)
    if context is None:
        return
    replay = {
        "faithful": [("e-4", '{"n": 4}')], "reset": [("e-1", '{"n": 9}')],
        "fresh": [("e-1", '{"n": 1}')], "empty": [], "primed": [("e-4", "")],
        "inclusive": [("e-3", '{"n": 3}'), ("e-4", '{"n": 4}')],
    }[behaviour]
    for event_id, data in replay:
        processor.event(context, "message", f"{stream}:{event_id}", data)
        processor.asked_next(context)
    processor.ended(context, "the stream ended")


def test_10000_sessions_leave_a_bounded_number_of_attribute_sets():
    telemetry = Telemetry()
    processor = ContinuityProcessor(tracer_provider=telemetry.tracer_provider,
                                    meter_provider=telemetry.meter_provider,
                                    logger_provider=telemetry.logger_provider,
                                    confirm_timeout=60)
    rng = random.Random(10_000)
    names = (sc.ATTEMPTS[0], sc.GAPS[0], sc.DURATION[0], sc.REPLAYED_EVENTS[0],
             sc.STREAM_EVENTS[0], sc.EVICTED_STREAMS[0], sc.BROKEN_REQUESTS[0])

    def attribute_sets() -> dict[str, int]:
        return {
            name: len({frozenset(p.attributes.items()) for p in telemetry.points(name)})
            for name in names
        }

    try:
        for n in range(1000):
            _session_round(processor, n, rng.choice(BEHAVIOURS), rng.choice(("a.example", "b")))
        after_1000 = attribute_sets()
        for n in range(1000, 10_000):
            _session_round(processor, n, rng.choice(BEHAVIOURS), rng.choice(("a.example", "b")))
        after_10000 = attribute_sets()
        exported = exports(telemetry)
    finally:
        processor.shutdown()
        telemetry.shutdown()
    assert after_10000 == after_1000, "new sessions made new attribute sets"
    # outcomes x transports x previous transports x hosts, kinds x transports x hosts,
    # ...: every server's series start at 0 for both transports (server_seen)
    assert after_10000[sc.ATTEMPTS[0]] <= len(sc.OUTCOMES) * 2 * 3 * 2
    assert after_10000[sc.GAPS[0]] <= len(sc.GAP_KINDS) * 2 * 2
    assert after_10000[sc.BROKEN_REQUESTS[0]] <= len(sc.FATES) * 2 * 2
    assert after_10000[sc.STREAM_EVENTS[0]] <= 2 * 2  # transports x hosts, from 0
    assert after_10000[sc.EVICTED_STREAMS[0]] <= 1
    assert sum(telemetry.outcomes().values()) == 10_000
    assert len(telemetry.spans.get_finished_spans()) == 10_000
    assert leaks(exported, ["cardinality-session"]) == []
