"""What the state of a stream still being read must give, whatever record a
finished stream leaves: through the real patched paths (httpx, httpx-sse's
``iter_sse``, read event by event while the server holds the POST stream
open), where most events are only recorded in the iterator's ring and the
tracker folds them in when it needs them.

* a cursor looked up while the POST stream that issued it is still open;
* a replay that answers the request of a POST whose stream is still open;
* eviction order at the bound of tracked streams when streams interleave.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import httpx_sse
import pytest

from fuzz_sse import SSE_TYPE, block, sse_reply
from helpers import Telemetry

CALL = 7


def progress(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": {"progressToken": CALL, "progress": n}})


def result() -> str:
    return json.dumps({"jsonrpc": "2.0", "id": CALL,
                       "result": {"content": [{"type": "text", "text": "done"}]}})


def _headers(session: str, last_event_id: str | None = None) -> dict[str, str]:
    headers = {"accept": "application/json, text/event-stream",
               "content-type": "application/json", "mcp-session-id": session,
               "mcp-protocol-version": "2025-06-18"}
    if last_event_id is not None:
        headers["last-event-id"] = last_event_id
    return headers


def _session_reply(session: str, events: list[bytes], *, framing: str | None = None):
    """The SSE answer of ``session``; with a ``framing``, held open after
    ``events`` until the server is released."""
    headers = (SSE_TYPE, (b"mcp-session-id", session.encode()))
    return sse_reply(events, headers=headers, framing=framing or "close", hold=bool(framing))


class OpenPost:
    """A ``tools/call`` POST whose SSE answer the server holds open after
    ``ids`` (progress events), read one event at a time."""

    def __init__(self, raw_server, http: httpx.Client, path: str, session: str,
                 ids: list[str], framing: str = "close") -> None:
        events = [block(i, progress(n)) for n, i in enumerate(ids, 1)]
        raw_server.reply(path, _session_reply(session, events, framing=framing))
        body = json.dumps({"jsonrpc": "2.0", "id": CALL, "method": "tools/call",
                           "params": {"name": "slow", "arguments": {}}})
        self._source = httpx_sse.connect_sse(http, "POST", raw_server.url + path,
                                             headers=_headers(session), content=body)
        self.events: Iterator = self._source.__enter__().iter_sse()

    def read(self, count: int) -> list[str]:
        return [next(self.events).id for _ in range(count)]

    def finish(self) -> list[str]:
        """The rest, once the server released the stream (a clean end)."""
        try:
            return [sse.id for sse in self.events]
        finally:
            self._source.__exit__(None, None, None)


def _read_all(http: httpx.Client, url: str, session: str,
              last_event_id: str | None = None) -> list[str]:
    with httpx_sse.connect_sse(http, "GET", url,
                               headers=_headers(session, last_event_id)) as source:
        return [sse.id for sse in source.iter_sse()]


@pytest.fixture
def telemetry():
    recorded = Telemetry()
    yield recorded
    recorded.shutdown()


def test_a_cursor_is_found_on_a_post_stream_still_open(raw_server, telemetry):
    raw_server.reply("/open/resume", _session_reply("S1", [block("3", progress(3)),
                                                           block("4", result())]))
    with telemetry.instrumented(confirm_timeout=60), httpx.Client(trust_env=False) as http:
        post = OpenPost(raw_server, http, "/open/post", "S1", ["1", "2", "3"])
        try:
            assert post.read(3) == ["1", "2", "3"]
            # "2" was only recorded in the iterator's ring: the lookup folds
            # the open stream in before it looks.
            assert _read_all(http, raw_server.url + "/open/resume", "S1", "2") == ["3", "4"]
        finally:
            raw_server.release()
        assert post.finish() == []
    assert telemetry.outcomes() == {"resumed": 1}, telemetry.outcomes()
    assert telemetry.gap_kinds() == {}
    assert telemetry.fates() == {}
    [span] = telemetry.resume_spans()
    assert span.attributes["mcp.resumption.last_event_id"] == "2"


def test_a_replay_answers_the_request_of_a_post_stream_still_open(raw_server, telemetry):
    """The answer to the open POST's request comes on a resume while the POST
    stream is still read; when the POST stream then breaks (a read error),
    no request broke with it."""
    raw_server.reply("/answered/resume", _session_reply("S2", [block("3", progress(3)),
                                                               block("4", result())]))
    with telemetry.instrumented(confirm_timeout=60) as instrumentor, \
            httpx.Client(trust_env=False) as http:
        post = OpenPost(raw_server, http, "/answered/post", "S2", ["1", "2", "3"],
                        framing="broken")
        try:
            assert post.read(3) == ["1", "2", "3"]
            assert _read_all(http, raw_server.url + "/answered/resume", "S2", "2") == ["3", "4"]
        finally:
            raw_server.release()
        with pytest.raises(httpx.RemoteProtocolError):
            post.finish()
        instrumentor.processor.stop_waiting("the test ended")
    assert telemetry.outcomes() == {"resumed": 1}, telemetry.outcomes()
    assert telemetry.gap_kinds() == {}
    assert telemetry.fates() == {}


def test_a_post_stream_without_its_answer_is_broken(raw_server, telemetry):
    """The control of the test above: the same POST stream ending without
    the answer, with no resume, broke its request."""
    with telemetry.instrumented(confirm_timeout=60) as instrumentor, \
            httpx.Client(trust_env=False) as http:
        post = OpenPost(raw_server, http, "/unanswered/post", "S3", ["1", "2"])
        try:
            assert post.read(2) == ["1", "2"]
        finally:
            raw_server.release()
        assert post.finish() == []
        instrumentor.processor.stop_waiting("the test ended")
    assert telemetry.fates() == {"lost": 1}, telemetry.fates()
    assert telemetry.gap_kinds() == {"orphaned_request": 1}


def test_eviction_at_the_bound_spares_the_stream_being_read(raw_server, telemetry):
    """Four tracked streams at most.  A POST stream is read, interleaved with
    five GET streams of other sessions that come and go: the stream being
    read is never evicted, the finished ones leave oldest first, and a
    resume is proven where its cursor's stream is still tracked and
    unverifiable (never a gap) where it was evicted."""
    for n in range(5):
        raw_server.reply(f"/bound/get{n}", _session_reply(f"G{n}", [
            block(f"g{n}-1", progress(1)), block(f"g{n}-2", progress(2))]))
        raw_server.reply(f"/bound/resume{n}",
                         _session_reply(f"G{n}", [block(f"g{n}-3", progress(3))]))
    raw_server.reply("/bound/resume", _session_reply("P", [block("p-3", progress(3)),
                                                           block("p-4", result())]))
    with telemetry.instrumented(confirm_timeout=60, max_streams=4) as instrumentor, \
            httpx.Client(trust_env=False) as http:
        tracker = instrumentor.processor.tracker
        post = OpenPost(raw_server, http, "/bound/post", "P", ["p-1", "p-2", "p-3"])
        try:
            assert post.read(1) == ["p-1"]
            for n in range(5):
                assert _read_all(http, f"{raw_server.url}/bound/get{n}", f"G{n}") == [
                    f"g{n}-1", f"g{n}-2"]
                if n == 2:
                    assert post.read(2) == ["p-2", "p-3"]  # ring only
            assert tracker.evicted_streams == 2  # get0, get1
            assert _read_all(http, raw_server.url + "/bound/resume", "P", "p-2") == ["p-3", "p-4"]
            assert telemetry.outcomes() == {"resumed": 1}
            # the resume's own stream evicted get2; get4's is the newest
            assert _read_all(http, f"{raw_server.url}/bound/resume4", "G4", "g4-2") == ["g4-3"]
            assert telemetry.outcomes() == {"resumed": 2}
            assert _read_all(http, f"{raw_server.url}/bound/resume2", "G2", "g2-2") == ["g2-3"]
        finally:
            raw_server.release()
        assert post.finish() == []
    assert telemetry.outcomes() == {"resumed": 2, "unverifiable": 1}, telemetry.outcomes()
    assert telemetry.gap_kinds() == {}
