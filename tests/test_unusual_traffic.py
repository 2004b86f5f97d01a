"""Legitimate but unusual traffic is never a gap (issue 12), end to end.

A raw loopback server writes exact bytes; the host is a plain httpx-sse or
httpx2 consumer, sync and async, with the plugin in observe and in enforce
mode.  Each case is lawful server behaviour that was once reported as a gap:
bodies too large to read, SSE feeds that are not MCP, timestamp ids,
at-least-once replay, a cursor event sent again as JSONB, a keep-alive that
repeats the last id.  In both modes no gap is reported and the host gets
exactly the events the server sent.  The true positives next to them (a
reused id, a counter reset) still fire, and enforce mode still stops them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_sse import FLAVOURS, RawServer, Reply, block, consume, head, package_log
from helpers import Telemetry

SSE_TYPE = (b"content-type", b"text/event-stream")
ACCEPT = (b"accept", b"text/event-stream, application/json")
PROTOCOL = (b"mcp-protocol-version", b"2025-11-25")
BIG = 70 * 1024  # over the 64 KiB the plugin parses
_paths = itertools.count()


def note(n: int, **extra) -> str:
    params = {"n": n, **extra}
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": params})


def result(request_id: int, text: str = "done") -> str:
    content = [{"type": "text", "text": text}]
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": content}})


def tools_call(request_id: int, argument: str = "x") -> bytes:
    params = {"name": "t", "arguments": {"text": argument}}
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return json.dumps(message).encode()


@dataclass
class Exchange:
    """One request of a case and the exact bytes that answer it."""

    method: str
    headers: list[tuple[bytes, bytes]]
    response_headers: tuple[tuple[bytes, bytes], ...]
    events: list[tuple[str | None, str, str | None]]  # (id, data, event type)
    body: bytes = b""
    path: str | None = None  # shared with another exchange of the case, if set

    def chunks(self) -> tuple[bytes, ...]:
        return tuple(block(i, d, event=t) for i, d, t in self.events)


@dataclass
class Case:
    exchanges: list[Exchange]
    gaps: dict[str, int] = field(default_factory=dict)  # expected, all modes
    outcome: str | None = None  # of the (last) resume; None: no resume tracked
    contract: str = "exclusive"


def _mcp(session: bytes) -> list[tuple[bytes, bytes]]:
    return [ACCEPT, PROTOCOL, (b"mcp-session-id", session)]


def _answer(session: bytes) -> tuple[tuple[bytes, bytes], ...]:
    return (SSE_TYPE, (b"mcp-session-id", session))


def _resume(session: bytes, cursor: str) -> list[tuple[bytes, bytes]]:
    return [*_mcp(session), (b"last-event-id", cursor.encode())]


# ------------------------------------------------------------------ cases
# Each takes a session id (unique per run) and returns the case.


def big_request(s: bytes) -> Case:
    """A tools/call with 70 KB of arguments is not read; the replay of its
    answer is not foreign (the ledger is unknown)."""
    return Case([
        Exchange("POST", _mcp(s), _answer(s), [("1", "", None), ("2", note(1), None)],
                 body=tools_call(7, "a" * BIG)),
        Exchange("GET", _resume(s, "2"), _answer(s), [("3", result(7), None)]),
    ], outcome="resumed")


def big_result(s: bytes) -> Case:
    """A 70 KB result on the resumed stream is not parsed; its request is not
    orphaned (the host got the answer)."""
    return Case([
        Exchange("POST", _mcp(s), _answer(s), [("1", "", None), ("2", note(1), None)],
                 body=tools_call(8)),
        Exchange("GET", _resume(s, "2"), _answer(s), [("3", result(8, "r" * BIG), None)]),
    ], outcome="resumed")


def streamed_request(s: bytes) -> Case:
    """A POST whose body is streamed (httpx cannot show it): not evidence of
    a foreign replay either."""
    return Case([
        Exchange("POST", _mcp(s), _answer(s), [("1", "", None), ("2", note(1), None)],
                 body=b"STREAMED:" + tools_call(9)),
        Exchange("GET", _resume(s, "2"), _answer(s), [("3", result(9), None)]),
    ], outcome="resumed")


def two_feeds(s: bytes) -> Case:
    """Two SSE feeds on one origin that are not MCP, each counting 1, 2, 3:
    not tracked at all, so a faithful resume of one is nothing."""
    plain = (SSE_TYPE,)
    a, b = f"/feed-a-{s.decode()}", f"/feed-b-{s.decode()}"
    feed_a = [(str(n), f"a{n}", None) for n in (1, 2, 3)]
    feed_b = [(str(n), f"b{n}", None) for n in (1, 2, 3, 4, 5)]
    return Case([
        Exchange("GET", [ACCEPT], plain, feed_a, path=a),
        Exchange("GET", [ACCEPT], plain, feed_b, path=b),
        Exchange("GET", [ACCEPT, (b"last-event-id", b"3")], plain, [("4", "a4", None)], path=a),
    ])


def two_sessionless_paths(s: bytes) -> Case:
    """Two sessionless MCP streams on one origin, each counting 1, 2, 3 on its
    own path: ids are scoped to the path, not the origin."""
    headers = [ACCEPT, PROTOCOL]
    a, b = f"/mcp-a-{s.decode()}", f"/mcp-b-{s.decode()}"
    return Case([
        Exchange("GET", headers, (SSE_TYPE,), [(str(n), note(n, feed="a"), None)
                                                for n in (1, 2, 3)], path=a),
        Exchange("GET", headers, (SSE_TYPE,), [(str(n), note(n, feed="b"), None)
                                                for n in (1, 2, 3, 4, 5)], path=b),
        Exchange("GET", [*headers, (b"last-event-id", b"3")], (SSE_TYPE,),
                 [("4", note(4, feed="a"), None)], path=a),
    ], outcome="resumed")


def float_ids(s: bytes) -> Case:
    """str(time.time()) ids: '.5' after '.45' is later, not a regression;
    the ids are a clock, so the resume is unverifiable."""
    before = ["1733212345.4", "1733212345.45"]
    return Case([
        Exchange("GET", _mcp(s), _answer(s), [(i, note(n), None) for n, i in enumerate(before)]),
        Exchange("GET", _resume(s, before[-1]), _answer(s),
                 [("1733212345.5", note(2), None), ("1733212345.51", note(3), None)]),
    ], outcome="unverifiable")


def at_least_once(s: bytes) -> Case:
    """The server sends 4 and 5 again, byte for byte, then 6."""
    events = [(str(n), note(n), None) for n in range(1, 6)]
    return Case([
        Exchange("GET", _mcp(s), _answer(s), events),
        Exchange("GET", _resume(s, "5"), _answer(s), [*events[3:], ("6", note(6), None)]),
    ], outcome="resumed")


def jsonb_cursor(s: bytes) -> Case:
    """An inclusive server keeps JSON as JSONB: the cursor event comes back
    with sorted keys and no spaces, the same message."""
    def message(n: int) -> dict:
        return {"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"z": n, "a": [n, {"y": 1, "b": 2}]}}

    first = [(str(n), json.dumps(message(n)), None) for n in (1, 2, 3)]
    again = json.dumps(message(3), sort_keys=True, separators=(",", ":"))
    return Case([
        Exchange("GET", _mcp(s), _answer(s), first),
        Exchange("GET", _resume(s, "3"), _answer(s), [("3", again, None), ("4", note(4), None)]),
    ], outcome="resumed", contract="inclusive")


def keepalive_first(s: bytes) -> Case:
    """A keep-alive that repeats the last id as the resumed stream's first
    event is a marker, not a reuse."""
    events = [(str(n), note(n), None) for n in (1, 2, 3)]
    return Case([
        Exchange("GET", _mcp(s), _answer(s), events),
        Exchange("GET", _resume(s, "3"), _answer(s),
                 [("3", "ping", "ping"), ("4", note(4), None)]),
    ], outcome="caught_up")


# True positives beside them.

def reused_id(s: bytes) -> Case:
    events = [(str(n), note(n), None) for n in (1, 2, 3)]
    return Case([
        Exchange("GET", _mcp(s), _answer(s), events),
        Exchange("GET", _resume(s, "3"), _answer(s), [("3", note(30), None)]),
    ], gaps={"id_reused": 1}, outcome="gap")


def counter_reset(s: bytes) -> Case:
    events = [(str(n), note(n), None) for n in (4817, 4818, 4819)]
    return Case([
        Exchange("GET", _mcp(s), _answer(s), events),
        Exchange("GET", _resume(s, "4819"), _answer(s), [("1", note(1, fresh=True), None)]),
    ], gaps={"id_regression": 1}, outcome="gap")


LAWFUL: dict[str, Callable[[bytes], Case]] = {
    "big request body": big_request,
    "big result": big_result,
    "streamed request body": streamed_request,
    "two non-MCP feeds": two_feeds,
    "two sessionless paths": two_sessionless_paths,
    "float-seconds ids": float_ids,
    "at-least-once replay": at_least_once,
    "JSONB cursor event": jsonb_cursor,
    "keep-alive repeating the id": keepalive_first,
}
TRUE_POSITIVES = {"reused id": reused_id, "counter reset": counter_reset}


def _streamed(body: bytes, flavour: str):
    """A request body httpx does not hold (``request.content`` raises)."""
    def chunks():
        yield body

    async def achunks():
        yield body

    return achunks() if flavour.endswith("async") else chunks()


def run(raw_server: RawServer, flavour: str, case: Case, mode: str):
    """Every exchange of ``case`` through the host; what it saw per exchange."""
    token = next(_paths)
    seen = []
    for index, exchange in enumerate(case.exchanges):
        path = exchange.path or f"/unusual/{token}/{index}"
        reply = Reply(head(200, exchange.response_headers), exchange.chunks())
        raw_server.on(path, lambda request, reply=reply: reply)
        body: object = exchange.body
        if body.startswith(b"STREAMED:"):
            body = _streamed(body[len(b"STREAMED:"):], flavour)
        seen.append(consume(flavour, raw_server.url + path, method=exchange.method,
                            headers=exchange.headers, body=body))
    return seen


def _expected_events(exchange: Exchange) -> list[tuple[str, str]]:
    """(id, data) as an SSE parser hands them over: an event without an id
    line carries the last one."""
    return [(data, event_id or "") for event_id, data, _ in exchange.events]


@pytest.mark.parametrize("mode", ["observe", "enforce"])
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("name", list(LAWFUL))
def test_lawful_traffic_is_never_a_gap(raw_server, flavour, mode, name):
    session = f"u-{next(_paths)}".encode()
    case = LAWFUL[name](session)
    telemetry = Telemetry()
    with package_log() as records, telemetry.instrumented(
        mode=mode, replay_contract=case.contract, confirm_timeout=30
    ) as instrumentor:
        seen = run(raw_server, flavour, case, mode)
        tracked = len(instrumentor.processor.tracker)
    assert not raw_server.errors
    for exchange, got in zip(case.exchanges, seen, strict=True):
        assert got.error is None, got
        assert [(data, event_id) for _, data, event_id, _ in got.events] == _expected_events(
            exchange
        ), "the host's events arrive unchanged"
    assert not records, [record.getMessage() for record in records]
    assert telemetry.gap_kinds() == {}
    assert not telemetry.gap_logs()
    if case.outcome is None:
        assert telemetry.outcomes() == {} and not telemetry.resume_spans()
        assert tracked == 0, "traffic without a sign of MCP is not tracked"
    else:
        assert telemetry.outcomes() == {case.outcome: 1}


@pytest.mark.parametrize("mode", ["observe", "enforce"])
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("name", list(TRUE_POSITIVES))
def test_true_positives_stay_true(raw_server, flavour, mode, name):
    session = f"t-{next(_paths)}".encode()
    case = TRUE_POSITIVES[name](session)
    telemetry = Telemetry()
    with telemetry.instrumented(mode=mode, confirm_timeout=30):
        seen = run(raw_server, flavour, case, mode)
    assert telemetry.gap_kinds() == case.gaps
    assert telemetry.outcomes() == {case.outcome: 1}
    resumed = seen[-1]
    if mode == "enforce":
        assert resumed.error is not None and "ResumptionGapError" in resumed.error
        assert resumed.events == ()
    else:
        assert resumed.error is None and len(resumed.events) == 1


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_non_mcp_sse_client_costs_one_check_per_response(raw_server, flavour):
    """A feed that never shows MCP: the plugin looks at its answer's headers
    and its first event's type, once, and never at an event again."""
    telemetry = Telemetry()
    calls = {"promote": 0, "event": 0, "asked_next": 0, "ended": 0}
    with telemetry.instrumented() as instrumentor:
        processor = instrumentor.processor
        for name in calls:
            original = getattr(processor, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                calls[_name] += 1
                return _original(*args, **kwargs)

            setattr(processor, name, counted)
        path = f"/plain-feed/{next(_paths)}"
        events = tuple(block(str(n), f"tick {n}") for n in range(50))
        raw_server.on(path, lambda request: Reply(head(200, (SSE_TYPE,)), events))
        for _ in range(3):
            seen = consume(flavour, raw_server.url + path, headers=[ACCEPT])
            assert [event[2] for event in seen.events] == [str(n) for n in range(50)]
        tracked = len(processor.tracker)
    assert calls == {"promote": 3, "event": 0, "asked_next": 0, "ended": 0}
    assert tracked == 0 and telemetry.outcomes() == {}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_legacy_stream_shows_itself_by_its_endpoint_event(raw_server, flavour):
    """The legacy transport sends no MCP header: its endpoint event is the
    evidence, and from it on the stream is tracked (a reset is found)."""
    telemetry = Telemetry()
    with telemetry.instrumented(confirm_timeout=30) as instrumentor:
        token = next(_paths)
        legacy = [block(None, f"/messages/?session_id=leg-{token}", event="endpoint")]
        legacy += [block(str(n), note(n)) for n in (4817, 4818, 4819)]
        raw_server.on(f"/sse/{token}", lambda request: Reply(head(200, (SSE_TYPE,)), tuple(legacy)))
        fresh = (SSE_TYPE, (b"mcp-session-id", b"fresh"))
        raw_server.on(f"/mcp/{token}", lambda request: Reply(
            head(200, fresh), (block("1", note(1, fresh=True)),)))
        first = consume(flavour, raw_server.url + f"/sse/{token}", headers=[ACCEPT])
        assert len(first.events) == 4 and len(instrumentor.processor.tracker) == 1
        consume(flavour, raw_server.url + f"/mcp/{token}",
                headers=[ACCEPT, (b"last-event-id", b"4819")])
    assert telemetry.gap_kinds() == {"session_changed": 1, "id_regression": 1}


# ------------------------------------------------- a scheme the user declares


def test_an_invalid_event_id_pattern_warns_once_and_falls_back(caplog):
    from opentelemetry.instrumentation.mcp_resumption import config

    for value in ("evt(?P<counter>[0-9]+", "evt[0-9]+"):  # does not compile; no counter group
        caplog.clear()
        with caplog.at_level("WARNING", logger=config.__name__):
            settings = config.load(env={config.EVENT_ID_PATTERN: value})
        assert settings.event_id_pattern is None
        [record] = caplog.records
        assert config.EVENT_ID_PATTERN in record.getMessage()
    declared = config.load(env={config.EVENT_ID_PATTERN: r"(?P<stream>\w+)\.(?P<counter>\d+)"})
    assert declared.event_id_pattern.pattern == r"(?P<stream>\w+)\.(?P<counter>\d+)"


@pytest.mark.parametrize("mode", ["observe", "enforce"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_declared_scheme_orders_what_the_shape_cannot(raw_server, flavour, mode):
    """``evt12`` has no separator, so by its shape it is opaque; declared as
    ``evt(?P<counter>[0-9]+)`` it orders, and a reset is found after one id."""
    outcomes = {}
    for pattern in (None, r"evt(?P<counter>[0-9]+)"):
        session = f"d-{next(_paths)}".encode()
        case = Case([
            Exchange("GET", _mcp(session), _answer(session), [("evt12", note(12), None)]),
            Exchange("GET", _resume(session, "evt12"), _answer(session),
                     [("evt1", note(1, fresh=True), None)]),
        ])
        telemetry = Telemetry()
        settings = {"event_id_pattern": pattern} if pattern else {}
        with telemetry.instrumented(mode=mode, confirm_timeout=30, **settings):
            seen = run(raw_server, flavour, case, mode)
        outcomes[pattern] = (telemetry.outcomes(), telemetry.gap_kinds(), seen[-1].error)
    assert outcomes[None] == ({"unverifiable": 1}, {}, None)
    declared_outcomes, declared_gaps, error = outcomes[r"evt(?P<counter>[0-9]+)"]
    assert declared_outcomes == {"gap": 1} and declared_gaps == {"id_regression": 1}
    assert (error is not None) == (mode == "enforce")


@pytest.mark.parametrize(
    ("raw", "session_headers"),
    [
        ("é-7".encode(), [b"s-1"]),  # UTF-8: httpx decodes the list as UTF-8
        (b"\xe9-7", [b"s-1"]),  # not UTF-8: httpx falls back to latin-1
        (b"e-7", [b"s-1", b"s-2"]),  # a repeated header: httpx joins the values
    ],
    ids=["utf-8", "latin-1", "repeated"],
)
def test_request_headers_read_as_httpx_reads_them(raw_server, telemetry, raw, session_headers):
    """The patch reads a request's headers in one pass over the raw list;
    what it records must be what ``Headers.get`` gives the application."""
    import httpx

    path = f"/headers-{next(_paths)}"
    raw_server.reply(path, Reply(head(200, [SSE_TYPE, PROTOCOL]), (block("e-8", note(8)),)))
    headers = [(b"last-event-id", raw), *((b"mcp-session-id", s) for s in session_headers)]
    headers += [ACCEPT, PROTOCOL]
    with telemetry.instrumented(session_id="raw"), httpx.Client() as client:
        request = client.build_request("GET", raw_server.url + path, headers=headers)
        response = client.send(request, stream=True)
        response.read()
        response.close()
        expected_id = request.headers.get("last-event-id")
        expected_session = request.headers.get("mcp-session-id")
    [span] = telemetry.resume_spans()
    assert span.attributes["mcp.resumption.last_event_id"] == expected_id
    assert span.attributes["mcp.session.id"] == expected_session


_HEADER_NAMES = st.sampled_from([b"Last-Event-ID", b"mcp-session-id", b"MCP-Session-Id",
                                 b"accept", b"x-other", b"Content-Type"])
_HEADER_VALUES = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12).map(
        str.encode),
    st.sampled_from(["é-7".encode(), b"\xe9-7", b"\xff\xfe"]),
)


class _RawOnly:
    """Headers as a client library without ``_list`` would hold them."""

    def __init__(self, headers) -> None:
        self.raw, self.encoding = headers.raw, headers.encoding


@given(st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=8))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_the_one_pass_header_reader_gives_what_headers_get_gives(pairs):
    """On httpx's and httpx2's ``Headers`` (their ``_list``) and on a raw
    list alone: repeated headers joined, each list decoded as the library
    decodes it."""
    import httpx
    import httpx2

    from opentelemetry.instrumentation.mcp_resumption.patches.http import (
        MAX_HEADER_LENGTH,
        _headers,
    )
    from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import bounded_id

    names = frozenset((b"last-event-id", b"mcp-session-id", b"content-type"))
    kept = frozenset((b"last-event-id", b"mcp-session-id"))
    for library in (httpx, httpx2):
        headers = library.Headers(pairs)
        for view in (headers, _RawOnly(headers)):
            found = _headers(view, names)
            for name in names:
                assert found.get(name) == headers.get(name.decode()), (library, name)
            # Those it keeps: stripped, cut, None when empty, a session id bounded.
            found = _headers(view, names, kept)
            for name in names:
                value = headers.get(name.decode())
                if name in kept and value is not None:
                    value = value.strip()[:MAX_HEADER_LENGTH] or None
                    if name == b"mcp-session-id":
                        value = bounded_id(value)
                assert found.get(name) == value, (library, name)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def _json_texts(draw) -> str | bytes:
    """Bodies as peers send them and as they break: JSON of any shape and
    spacing, cut short or followed by more, in any of the encodings
    json.loads detects, or any text at all."""
    text = draw(st.one_of(
        st.builds(lambda value, separators: json.dumps(value, separators=separators),
                  _JSON_VALUES, st.sampled_from([(", ", ": "), (",", ":")])),
        st.text(max_size=40),
        st.sampled_from(['{"a": }', '[1, 2', '{"a": 1} {"b": 2}', '{"a": NaN}', '{} ', ' {}',
                         '\ufeff{}', '{"a": "\\ud800"}', '[' * 3000 + ']' * 3000,
                         '{"id": 1, "id": 2}']),
    ))
    cut = draw(st.sampled_from([None, None, "cut", "more"]))
    if cut == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif cut == "more":
        text += draw(st.sampled_from([" ", "\n", "}", "x", "\x00"]))
    encoding = draw(st.sampled_from([None, "utf-8", "utf-8", "utf-8-sig", "utf-16-le", "utf-16",
                                     "utf-32-be", "latin-1"]))
    if encoding is None:
        return text
    try:
        encoded = text.encode(encoding, "surrogatepass")
    except UnicodeEncodeError:
        return text
    if draw(st.booleans()) and encoded:  # a byte off: invalid UTF-8 now and then
        index = draw(st.integers(0, len(encoded) - 1))
        encoded = encoded[:index] + bytes([draw(st.integers(0, 255))]) + encoded[index + 1:]
    return encoded


def _outcome(parse: Callable[[str | bytes], object], text: str | bytes) -> tuple:
    try:
        return ("parsed", repr(parse(text)))
    except Exception as error:  # the same kind and message, or it is not the same parse
        return ("raised", type(error), str(error))


@given(_json_texts())
@settings(max_examples=1500, deadline=None, derandomize=True)
def test_the_parse_without_json_loads_wrappers_is_json_loads(text):
    """The request bodies and event data the plugin parses go to json.loads'
    own scanner directly where that is all json.loads would do; on every
    other text, json.loads itself answers: the same value, or the same error."""
    from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import loads

    assert _outcome(loads, text) == _outcome(json.loads, text)


_IDS = st.one_of(
    st.integers(-(2**70), 2**70), st.text(max_size=8), st.none(), st.booleans(), st.floats()
)


@st.composite
def _jsonrpc_texts(draw) -> str | bytes:
    """JSON-RPC messages as peers send them (requests, answers, errors,
    notifications, batches), some with a key twice, cut, or followed by
    more; or any of ``_json_texts``."""
    if draw(st.integers(0, 3)) == 0:
        return draw(_json_texts())
    message = {"jsonrpc": "2.0"}
    for key in draw(st.lists(st.sampled_from(["id", "method", "result", "error", "params"]),
                             max_size=4)):
        message[key] = draw(_IDS) if key == "id" else draw(_JSON_VALUES)
    if "method" in message and draw(st.booleans()):
        message["method"] = draw(st.sampled_from(["tools/call", "tools/list", "ping"]))
    text = json.dumps(message, separators=draw(st.sampled_from([(", ", ": "), (",", ":")])))
    shape = draw(st.sampled_from(["one", "one", "batch", "twice", "cut", "more"]))
    if shape == "batch":
        text = f"[{text}, {text}]"
    elif shape == "twice" and text != "{}":
        text = text[:-1] + f', "id": {json.dumps(draw(_IDS))}}}'
    elif shape == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif shape == "more":
        text += draw(st.sampled_from([" ", "\n", "}", "x"]))
    return text.encode() if draw(st.booleans()) else text


def _reference_messages(text: str | bytes | None) -> list | None:
    """What the messages of a body or event are, by json.loads itself."""
    from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import within_limit

    if not text or not within_limit(text):
        return None
    try:
        decoded = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return None
    if isinstance(decoded, dict):
        return [decoded]
    if isinstance(decoded, list):
        return [item for item in decoded if isinstance(item, dict)]
    return []


@given(_jsonrpc_texts())
@settings(max_examples=1500, deadline=None, derandomize=True)
def test_the_ids_read_without_the_parse_wrappers_are_json_loads(text):
    """requests_in and responses_in take a body or event that is one JSON
    object straight from json.loads' scanner (``_one_object``): every id key
    and method they return is what json.loads' parse of the same text gives,
    duplicate keys, batches, broken and trailing text included."""
    from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import (
        _one_object,
        request_key,
        requests_in,
        responses_in,
    )

    messages = _reference_messages(text)
    one = _one_object(text)
    if one is not None:
        assert messages is not None and repr([one]) == repr(messages)
    tools: dict[str, str] = {}
    if messages is None:
        assert requests_in(text, tools) is None
    else:
        expected = []
        for message in messages:
            method, key = message.get("method"), request_key(message.get("id"))
            if isinstance(method, str) and key is not None:
                expected.append((key, method[:64]))
        assert requests_in(text, tools) == expected
    if isinstance(text, str):
        answers = responses_in(text)
        if '"result"' not in text and '"error"' not in text:
            assert answers == ()
        elif messages is None:
            assert answers is None
        else:
            keys = [
                request_key(message.get("id"))
                for message in messages
                if "method" not in message and ("result" in message or "error" in message)
            ]
            assert answers == tuple(key for key in keys if key is not None)
