"""Our own SSE loop (``patches/own_sse.py``) against the library's iterator.

The host must see the same events, byte for byte, and the same exception,
whether the plugin is the iterator or wraps the library's, and the verdicts
must not depend on which: on the fuzz corpus, with the guard passing and
forced to the fallback; with a library iterator wrapped or replaced by
someone else; with a version never verified.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import json
import types
from collections import Counter

import httpx_sse
import pytest

from fuzz_sse import (
    FLAVOURS,
    SSE_TYPE,
    Harness,
    Reply,
    block,
    consume,
    head,
    run_faithful,
    run_fuzz,
    sse_reply,
)
from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor
from opentelemetry.instrumentation.mcp_resumption import patches as patches_module
from opentelemetry.instrumentation.mcp_resumption.patches import own_sse
from opentelemetry.instrumentation.mcp_resumption.patches import sse as sse_patches

# The loop each flavour's stream runs where its library is verified.
LOOPS = {
    "httpx-sse": ("httpx-sse", "_httpx_sse_loop"),
    "httpx-sse-async": ("httpx-sse", "_ahttpx_sse_loop"),
    "httpx2": ("httpx2", "_httpx2_loop"),
    "httpx2-async": ("httpx2", "_ahttpx2_loop"),
}


def verified(flavour: str) -> bool:
    """Whether this environment's version of the flavour's library has a
    loop of ours (httpx2 2.5.0, in the mcp1 environments, has not)."""
    distribution, _ = LOOPS[flavour]
    version = importlib.metadata.version(distribution)
    return any(
        version in tested
        for (name, *_), by_file in own_sse.verified().items() if name == distribution
        for tested, _ in by_file.values()
    )


class Paths:
    """Which way each fed stream went: our own loop (by loop name, with its
    ``scan``) or the wrapper around the library's iterator."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.own: Counter[tuple[str, bool]] = Counter()
        self.wrapped = 0
        own_fed = sse_patches._own_fed
        fed, afed = sse_patches._fed_iterator, sse_patches._afed_iterator

        def spy_own(loop, names, instance, context, processor, response, scan):
            self.own[getattr(loop, "func", loop).__name__, scan] += 1
            return own_fed(loop, names, instance, context, processor, response, scan)

        def spy(original):
            def counted(*args, **kwargs):
                self.wrapped += 1
                return original(*args, **kwargs)

            return counted

        monkeypatch.setattr(sse_patches, "_own_fed", spy_own)
        monkeypatch.setattr(sse_patches, "_fed_iterator", spy(fed))
        monkeypatch.setattr(sse_patches, "_afed_iterator", spy(afed))

    def loops(self) -> set[str]:
        return {name for name, _ in self.own}


@pytest.fixture
def paths(monkeypatch):
    return Paths(monkeypatch)


@pytest.fixture
def no_loop_verified(monkeypatch):
    """The guard finds nothing verified: every fed stream takes the wrapper."""
    monkeypatch.setattr(own_sse, "verified", dict)


# ------------------------------------------------------- the fuzz corpus


def _fuzz(raw_server) -> Harness:
    harness = Harness(raw_server, confirm_timeout=60)
    try:
        stats = run_fuzz(harness, 800, through_socket=False)
        run_fuzz(harness, 100, through_socket=True)
        run_faithful(harness, 200, through_socket=False)
    finally:
        harness.close()
    assert stats.events > 500
    assert len(stats.errors) >= 3  # the hosts met errors, the same ones either way
    return harness


def test_fuzz_corpus_through_our_own_loop(raw_server, paths):
    """Each case is read with the instrumentation suppressed, then observed
    (``Harness.check``): the same events (event, data, id, retry) and the same
    exception; faithful resumes keep their verdicts.  Every verified
    library's fed streams ran our loops, and none the wrapper."""
    _fuzz(raw_server)
    expected = {LOOPS[f][1] for f in FLAVOURS if verified(f)}
    assert expected >= {"_httpx_sse_loop", "_ahttpx_sse_loop"}  # every environment
    assert paths.loops() == expected
    if expected == {loop for _, loop in LOOPS.values()}:
        assert paths.wrapped == 0
    else:
        assert paths.wrapped > 0  # the unverified library's streams


def test_fuzz_corpus_through_the_fallback(raw_server, paths, no_loop_verified):
    _fuzz(raw_server)
    assert not paths.own
    assert paths.wrapped > 100


# -------------------------------------------------- the guard's fallbacks


def _resumed_session(raw_server, flavour: str, path: str) -> list:
    """A GET stream of ids 1 to 3 that ends, and its resume after 3 that
    replays 4 and 5: what the host read."""
    session = (b"mcp-session-id", b"own-" + path.encode())
    first = sse_reply([block(str(n), json.dumps({"n": n})) for n in (1, 2, 3)],
                      headers=(SSE_TYPE, session))
    resumed = sse_reply([block(str(n), json.dumps({"n": n})) for n in (4, 5)],
                        headers=(SSE_TYPE, session))
    raw_server.on(path, lambda request: resumed if request.header("last-event-id") else first)
    headers = [(b"accept", b"text/event-stream"), session]
    seen = [consume(flavour, raw_server.url + path, headers=headers)]
    seen.append(consume(flavour, raw_server.url + path,
                        headers=[*headers, (b"last-event-id", b"3")]))
    return seen


def _someone_elses_wrapper(function):
    @functools.wraps(function)
    def wrapper(self):
        return function(self)

    return wrapper


def _a_replacement_of(function):
    """Someone else's iterator under the library's name: the same events,
    another source."""
    if inspect.isasyncgenfunction(function):

        async def replacement(self):
            async for sse in function(self):
                yield sse

    else:

        def replacement(self):
            yield from function(self)

    replacement.__module__ = function.__module__
    replacement.__qualname__ = function.__qualname__
    return replacement


def _a_copy_of(function):
    """The same code under another function object: a replacement with the
    very source verified."""
    copy = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__qualname__ = function.__qualname__
    copy.__module__ = function.__module__
    return copy


@pytest.mark.parametrize("change", ["wrapped before us", "replaced", "an unverified version"])
@pytest.mark.parametrize("flavour", ["httpx-sse", "httpx-sse-async"])
def test_the_fallback_still_observes(raw_server, paths, monkeypatch, change, flavour):
    """Another instrumentation's wrapper, a replacement, a version never
    verified: the wrapper reads the stream, and the resume is still judged
    on the ring it fed."""
    method = "iter_sse" if flavour == "httpx-sse" else "aiter_sse"
    original = getattr(httpx_sse.EventSource, method)
    if change == "wrapped before us":
        monkeypatch.setattr(httpx_sse.EventSource, method, _someone_elses_wrapper(original))
    elif change == "replaced":
        replacement = _a_replacement_of(original)
        monkeypatch.setattr(httpx_sse.EventSource, method, replacement)
        # under the library's name: only its fingerprint tells it apart
        assert own_sse._fingerprint(replacement) != own_sse._fingerprint(original)
    else:
        monkeypatch.setattr(own_sse, "installed_version", lambda distribution: "0.4.999")
    telemetry = Telemetry()
    with telemetry.instrumented(confirm_timeout=60):
        seen = _resumed_session(raw_server, flavour, f"/fallback/{flavour}/{len(change)}")
    assert [[event[2] for event in s.events] for s in seen] == [["1", "2", "3"], ["4", "5"]]
    assert paths.wrapped == 1 and not paths.own, (paths.wrapped, paths.own)
    assert telemetry.outcomes() == {"resumed": 1}
    assert telemetry.gap_kinds() == {}
    assert sum(telemetry.counts("mcp.client.stream.events").values()) == 5


def test_a_replacement_after_the_decision_is_refused():
    """The decision holds for the very function verified: a copy of it,
    handed over later as a bound method, is not that function."""
    own = own_sse.OwnLoop("httpx_sse", "EventSource.iter_sse")
    source = httpx_sse.EventSource(None)
    assert own.loop_for(source.iter_sse) is not None
    copy = _a_copy_of(httpx_sse.EventSource.iter_sse)
    assert own.loop_for(types.MethodType(copy, source)) is None
    assert own.loop_for(source.iter_sse) is not None


def test_an_unreadable_source_falls_back_and_logs_once(monkeypatch, caplog):
    def unreadable(function):
        raise OSError("could not get source code")

    monkeypatch.setattr(own_sse, "_fingerprint", unreadable)
    own = own_sse.OwnLoop("httpx_sse", "EventSource.iter_sse")
    source = httpx_sse.EventSource(None)
    site = "verifying httpx_sse EventSource.iter_sse"
    patches_module._reported.discard(site)
    with caplog.at_level("WARNING"):
        assert own.loop_for(source.iter_sse) is None
        assert own.loop_for(source.iter_sse) is None
    assert [r.getMessage() for r in caplog.records if site in r.getMessage()] == [
        f"mcp-resumption: {site} failed; continuity checks skip it, the application "
        "is unaffected"
    ]


# ------------------------------------------------ verdicts on both paths


def _tools_call(request_id: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": "t"}}).encode()


def _note(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": {"n": n}})


def _result(request_id: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"ok": True}})


def _verdicts(raw_server, flavour: str, tag: str) -> tuple:
    """A POST answered by SSE whose stream breaks before its result, the
    result replayed on the resume, then a GET stream whose resume replays an
    event it had seen: what the host read and what the plugin decided (both
    resumes are judged on the cursor the ring kept)."""
    session = (b"mcp-session-id", f"own-{tag}".encode())
    headers = (SSE_TYPE, session)
    post = f"/verdicts/{tag}/post"
    raw_server.on(post, lambda request: (
        sse_reply([block("7", _result(1))], headers=headers)
        if request.header("last-event-id")
        else sse_reply([block("5", _note(1)), block("6", _note(2))], headers=headers,
                       framing="broken")
    ))
    get = f"/verdicts/{tag}/get"
    raw_server.on(get, lambda request: (
        Reply(head(200, headers), (block("9", _note(9)), block("11", _note(11))))
        if request.header("last-event-id")
        else sse_reply([block(str(n), _note(n)) for n in (8, 9, 10)], headers=headers)
    ))
    telemetry = Telemetry()
    accept = (b"accept", b"text/event-stream")
    with telemetry.instrumented(confirm_timeout=60):
        seen = [
            consume(flavour, raw_server.url + post, method="POST", body=_tools_call(1),
                    headers=[accept, (b"content-type", b"application/json"), session]),
            consume(flavour, raw_server.url + post, headers=[accept, session,
                                                             (b"last-event-id", b"6")]),
            consume(flavour, raw_server.url + get, headers=[accept, session]),
            consume(flavour, raw_server.url + get, headers=[accept, session,
                                                            (b"last-event-id", b"10")]),
        ]
    return (
        seen,
        telemetry.outcomes(),
        telemetry.gap_kinds(),
        telemetry.fates(),
        sum(telemetry.counts("mcp.client.stream.events").values()),
    )


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_verdicts_are_the_same_on_both_paths(raw_server, monkeypatch, flavour):
    own_paths = Paths(monkeypatch)
    own = _verdicts(raw_server, flavour, f"own-{flavour}")
    if verified(flavour):
        assert own_paths.loops() == {LOOPS[flavour][1]}
        assert {scan for _, scan in own_paths.own} == {True, False}
    with monkeypatch.context() as forced:
        forced.setattr(own_sse, "verified", dict)
        fallback_paths = Paths(forced)
        fallback = _verdicts(raw_server, flavour, f"fallback-{flavour}")
    assert not fallback_paths.own and fallback_paths.wrapped == 2
    seen, outcomes, gaps, fates, events = own
    assert [s.error is None for s in seen] == [False, True, True, True]  # the break
    assert [[event[2] for event in s.events] for s in seen] == [
        ["5", "6"], ["7"], ["8", "9", "10"], ["9", "11"]
    ]
    assert (outcomes, gaps, fates, events) == (
        {"resumed": 2}, {}, {"answered": 1}, 8
    ), own[1:]
    assert fallback[1:] == own[1:]
    assert [s.events for s in fallback[0]] == [s.events for s in seen]


# ------------------------------------------- semantics the fuzz may miss


@pytest.mark.parametrize("flavour", ["httpx-sse", "httpx-sse-async"])
def test_wrong_content_type_raises_at_the_first_next(raw_server, paths, flavour):
    """The library checks the content type when asked for the first event,
    not when the iterator is made: so does our loop; the error is the
    library's own.  httpx-sse 0.4 wants "text/event-stream" in the exact
    case, the plugin takes an event stream in any case, so such a stream
    reaches our loop.  (httpx2 checks as the plugin does: no such stream.)"""
    raw_server.reply(f"/cased/{flavour}", sse_reply(
        [block("1", "x")], headers=((b"content-type", b"Text/Event-Stream"),
                                    (b"mcp-session-id", b"own-cased"))))
    reference = None
    for instrument in (False, True):
        instrumentor = McpResumptionInstrumentor()
        telemetry = Telemetry()
        if instrument:
            instrumentor.instrument(**telemetry.providers(), confirm_timeout=60)
        try:
            seen = consume(flavour, f"{raw_server.url}/cased/{flavour}",
                           headers=[(b"accept", b"text/event-stream"),
                                    (b"mcp-session-id", b"own-cased")])
        finally:
            if instrument:
                instrumentor.uninstrument()
        if reference is None:
            reference = seen
    assert reference.error is not None and "SSEError" in reference.error
    assert seen == reference
    assert paths.loops() == {LOOPS[flavour][1]}
