"""Hostile input through the real patched paths, and the fuzz target.

* :class:`RawServer`: an asyncio socket server on 127.0.0.1 that answers each
  request with exact bytes (status line, header lines, body chunks), so a test
  controls malformed and duplicate headers, framing and where a chunk ends.
* :func:`consume`: the host, a plain httpx-sse or httpx2 consumer (sync or
  async) that records every event it is handed and the exception it got.
* :class:`Harness`: our instrumentation on in-memory SDK providers; it runs a
  :class:`Case` with the instrumentation suppressed (the reference) and then
  observed, and checks that the host saw the same events and the same
  exception, and that no patch failed inside.
* :func:`run_fuzz` / :func:`run_faithful`: hypothesis targets (derandomized).

The long run (socket share 10 %)::

    PYTHONPATH=src:tests python tests/fuzz_sse.py --cases 100000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import socket
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import httpx
import httpx2
import httpx_sse
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from opentelemetry.instrumentation.utils import suppress_instrumentation

from helpers import Telemetry
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor
from opentelemetry.instrumentation.mcp_resumption import patches as patches_module

PACKAGE_LOGGER = "opentelemetry.instrumentation.mcp_resumption"
TLS = ssl.create_default_context()  # shared: building one per client costs 40 ms
TIMEOUT = 20.0

# ================================================================ raw server


@dataclass(frozen=True)
class RawRequest:
    method: str
    target: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes = b""

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (case-insensitive)."""
        wanted = name.lower().encode()
        found = None
        for key, value in self.headers:
            if key.lower() == wanted:
                found = value
        return found


@dataclass(frozen=True)
class Reply:
    """Exact bytes to write: ``head`` then each of ``chunks`` (one write and
    drain each, TCP_NODELAY).  ``hold`` keeps the connection open afterwards
    until the server closes."""

    head: bytes
    chunks: tuple[bytes, ...] = ()
    hold: bool = False


Script = Callable[[RawRequest], Reply]


class RawServer:
    """An asyncio socket server on its own thread and loop."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.served = 0
        self.errors: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raw-sse-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("raw server did not start")
        self.url = f"http://127.0.0.1:{self.port}"

    def on(self, path: str, script: Script) -> None:
        self.scripts[path] = script

    def reply(self, path: str, reply: Reply) -> None:
        self.scripts[path] = lambda request: reply

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._release = asyncio.Event()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(
                self._serve, "127.0.0.1", 0, limit=1 << 22, backlog=2048
            )
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(
                asyncio.gather(*pending, return_exceptions=True)
            )
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            request = await _read_request(reader)
            script = self.scripts.get(request.path)
            try:
                reply = script(request) if script else Reply(head(404, ()))
            except Exception as error:  # a test bug: answer 599 and remember it
                self.errors.append(f"{request.path}: {error!r}")
                reply = Reply(head(599, ()))
            self.served += 1
            for chunk in (reply.head, *reply.chunks):
                writer.write(chunk)
                await writer.drain()
            if reply.hold:
                await self._release.wait()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except ValueError as error:  # a request we cannot parse
            self.errors.append(repr(error))
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def release(self) -> None:
        """End every held stream (the connections close)."""
        self._loop.call_soon_threadsafe(self._release_and_renew)

    def _release_and_renew(self) -> None:
        self._release.set()
        self._release = asyncio.Event()

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._release.set)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _read_request(reader: asyncio.StreamReader) -> RawRequest:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw[:-4].split(b"\r\n")
    method, target, _ = lines[0].decode("latin-1").split(" ", 2)
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip(), value.strip()))
    request = RawRequest(method, target, tuple(headers))
    length = request.header("content-length")
    if length is not None:
        body = await reader.readexactly(int(length))
    elif (request.header("transfer-encoding") or b"").lower() == b"chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            parts.append(await reader.readexactly(size + 2))
            if size == 0:
                break
        body = b"".join(part[:-2] for part in parts)
    else:
        body = b""
    return RawRequest(method, target, tuple(headers), body)


# ------------------------------------------------------------ reply builders

REASONS = {200: b"OK", 202: b"Accepted", 204: b"No Content", 400: b"Bad Request",
           404: b"Not Found", 500: b"Internal Server Error"}
SSE_TYPE = (b"content-type", b"text/event-stream")


def head(status: int, headers: Iterable[tuple[bytes, bytes]], *, extra: bytes = b"",
         status_line: bytes | None = None) -> bytes:
    """A response head: status line, ``headers``, raw ``extra`` header lines,
    ``connection: close`` (no connection is ever reused), the blank line."""
    line = status_line or b"HTTP/1.1 %d %s" % (status, REASONS.get(status, b"Status"))
    lines = [line, *(name + b": " + value for name, value in headers)]
    if extra:
        lines.append(extra)
    lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def framed(body_chunks: Iterable[bytes], framing: str) -> tuple[bytes, tuple[bytes, ...]]:
    """(framing header lines, chunks to write) for one body.

    ``close``: delimited by the end of the connection; ``length``: a correct
    content-length; ``short``: a content-length beyond the body (the peer
    closes early); ``chunked``; ``broken``: chunked, never terminated."""
    chunks = tuple(chunk for chunk in body_chunks if chunk)
    total = sum(len(chunk) for chunk in chunks)
    if framing == "close":
        return b"", chunks
    if framing in ("length", "short"):
        declared = total if framing == "length" else total + 17
        return b"content-length: %d" % declared, chunks
    wrapped = tuple(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    if framing == "chunked":
        wrapped += (b"0\r\n\r\n",)
    return b"transfer-encoding: chunked", wrapped


def sse_reply(
    body_chunks: Iterable[bytes],
    *,
    status: int = 200,
    headers: Iterable[tuple[bytes, bytes]] = (SSE_TYPE,),
    framing: str = "close",
    extra: bytes = b"",
    hold: bool = False,
) -> Reply:
    framing_line, chunks = framed(body_chunks, framing)
    lines = b"\r\n".join(line for line in (framing_line, extra) if line)
    return Reply(head(status, headers, extra=lines), chunks, hold)


def block(
    event_id: str | None = None,
    data: str | None = "",
    event: str | None = None,
    retry: str | None = None,
    end: str = "\n",
) -> bytes:
    """One SSE event; ``data`` lines split on newlines, ``end`` after every line."""
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if retry is not None:
        lines.append(f"retry: {retry}")
    if data is not None:
        lines.extend(f"data: {line}" for line in data.split("\n"))
    return (end.join(lines) + end + end).encode("utf-8", "surrogatepass")


def cut(body: bytes, cuts: Iterable[int]) -> tuple[bytes, ...]:
    points = sorted({c for c in cuts if 0 < c < len(body)})
    edges = [0, *points, len(body)]
    return tuple(body[a:b] for a, b in itertools.pairwise(edges) if b > a)


def every_byte(body: bytes) -> tuple[bytes, ...]:
    return tuple(body[i : i + 1] for i in range(len(body)))


# ================================================================== the host

FLAVOURS = ("httpx-sse", "httpx-sse-async", "httpx2", "httpx2-async")
Event = tuple[str, str, str, "int | None"]


@dataclass(frozen=True)
class Seen:
    """What the host got: every event (event, data, id, retry), and the
    exception that ended its read, if any."""

    events: tuple[Event, ...]
    error: str | None = None
    status: int | None = None
    session_id: str | None = None

    @property
    def last_id(self) -> str | None:
        ids = [event[2] for event in self.events if event[2]]
        return ids[-1] if ids else None


def describe(error: BaseException) -> str:
    return f"{type(error).__module__}.{type(error).__qualname__}: {error}"


def _library(flavour: str):
    return httpx2 if flavour.startswith("httpx2") else httpx


def _event(sse) -> Event:
    return (sse.event, sse.data, sse.id, sse.retry)


def _sync_events(flavour: str, response):
    if flavour == "httpx-sse":
        return httpx_sse.EventSource(response).iter_sse()
    return iter(httpx2.EventSource(response))


def _async_events(flavour: str, response):
    if flavour == "httpx-sse-async":
        return httpx_sse.EventSource(response).aiter_sse()
    return aiter(httpx2.EventSource(response))


def consume(
    flavour: str,
    url: str,
    *,
    method: str = "GET",
    headers: Iterable[tuple[bytes | str, bytes | str]] = (),
    body: bytes = b"",
    stop_after: int | None = None,
    transport: object | None = None,
) -> Seen:
    """One request and the read of its SSE body, the way an application does
    it: the iterator is closed when the host stops early."""
    headers = list(headers)
    content = body if method == "POST" else None
    lib = _library(flavour)
    events: list[Event] = []
    status: list[int] = []
    session: list[str | None] = []
    if not flavour.endswith("async"):
        try:
            with lib.Client(verify=TLS, trust_env=False, timeout=TIMEOUT,
                            transport=transport) as http, \
                    http.stream(method, url, headers=headers, content=content) as response:
                status.append(response.status_code)
                session.append(response.headers.get("mcp-session-id"))
                iterator = _sync_events(flavour, response)
                try:
                    for sse in iterator:
                        events.append(_event(sse))
                        if stop_after is not None and len(events) >= stop_after:
                            break
                finally:
                    iterator.close()
        except Exception as error:
            return Seen(tuple(events), describe(error), *(status or [None]), *(session or [None]))
        return Seen(tuple(events), None, *(status or [None]), *(session or [None]))

    async def read() -> Seen:
        try:
            async with lib.AsyncClient(verify=TLS, trust_env=False, timeout=TIMEOUT,
                                       transport=transport) as http, \
                    http.stream(method, url, headers=headers, content=content) as response:
                status.append(response.status_code)
                session.append(response.headers.get("mcp-session-id"))
                iterator = _async_events(flavour, response)
                try:
                    async for sse in iterator:
                        events.append(_event(sse))
                        if stop_after is not None and len(events) >= stop_after:
                            break
                finally:
                    await iterator.aclose()
        except Exception as error:
            return Seen(tuple(events), describe(error), *(status or [None]), *(session or [None]))
        return Seen(tuple(events), None, *(status or [None]), *(session or [None]))

    return asyncio.run(read())


def mock_transport(flavour: str, status: int, headers, chunks: tuple[bytes, ...],
                   break_with: str | None = None):
    """A MockTransport that answers with ``chunks`` exactly as cut; with
    ``break_with`` the body then fails the way a dropped connection does."""
    lib = _library(flavour)
    headers = list(headers)

    def failure() -> Exception:
        return lib.RemoteProtocolError(break_with or "")

    if flavour.endswith("async"):

        async def abody():
            for chunk in chunks:
                yield chunk
            if break_with is not None:
                raise failure()

        def handler(request):
            return lib.Response(status, headers=headers, content=abody())

    else:

        def sbody():
            yield from chunks
            if break_with is not None:
                raise failure()

        def handler(request):
            return lib.Response(status, headers=headers, content=sbody())

    return lib.MockTransport(handler)


# ================================================================ logs


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


VERDICTS_LOGGER = "opentelemetry.instrumentation.mcp_resumption.verdicts"


@contextlib.contextmanager
def package_log() -> Iterator[list[logging.LogRecord]]:
    """Every record our package logs (a patch that failed inside logs one),
    but the verdict lines, which say what the plugin decided, not that it failed."""
    handler = _Records()
    handler.addFilter(lambda record: record.name != VERDICTS_LOGGER)
    logger = logging.getLogger(PACKAGE_LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# ================================================================ the cases

# A response head above h11's 16 KiB limit fails or not depending on how much
# of it one read returns: the generated heads stay below it (two of these and
# one extra line), the corpus tests 10 KiB values and a 70 KiB head alone.
RESPONSE_SESSION_VALUES = (
    b"s-1", b"", b"   ", b"\t", b"a" * 5000, b"\xff\xfe", "séssion-é".encode(), b"s 1",
    b"s-1, s-2", b"9" * 50,
)
REQUEST_HEADER_VALUES = (
    b"5", b"", b"0", b"-1", b"007", b"9" * 45, b"9" * 4400, b"x" * 10240, "é-5".encode(),
    "\u30fb".encode(), b"\xff\xfe", b"a b", b"e-5, e-6", b"s-77:e-104", b"4821",
    str(uuid.UUID(int=7)).encode(),
)
# h11 refuses these in a request: the host gets LocalProtocolError either way
REQUEST_HEADER_VALUES_INVALID = (b" 5", b"5 ", b"5\x00", b"5\r\nX: y", b"\x7f")
CONTENT_TYPES = (
    b"text/event-stream; charset=utf-8", b"TEXT/EVENT-STREAM",
    b"text/event-stream;charset=latin-1", b"text/event-stream; charset=bogus",
    b"application/json", b"text/event-stream, text/event-stream", b"text/plain",
)
EXTRA_HEADER_LINES = (
    b"x-junk: \xff\xfe\x80", b"last-event-id: 5", b"mcp-session-id:", b"x-folded: a\r\n b",
    b"x-long: " + b"y" * 5000, b"bad header: x", b"no-colon-line", b"x-nul: a\x00b",
    b"mcp-session-id: \xc3\xa9",
)
STATUS_LINES = (b"HTTP/1.1 abc OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 200", b"ICY 200 OK")
FRAMINGS = ("close", "length", "short", "chunked", "broken")

# Strategies are built once: rebuilding them per draw costs more than the case.
IDS = st.one_of(
    st.integers(0, 10**6).map(str),
    st.integers(-(10**6), -1).map(str),
    st.builds(lambda z, n: "0" * z + str(n), st.integers(1, 5), st.integers(0, 999)),
    st.integers(10**19, 10**60).map(str),
    st.sampled_from(
        ["", " ", "\t", " 7", "7 ", "7\t", "\u00a07", "\u30007", "\0", "7\x00",
         "e-\u0661\u0662", "-5", "+5", "5e3", "0x1f", "１２"]
    ),
    st.builds(
        lambda p, s, n: f"{p}{s}{n}",
        st.sampled_from(["e", "s-77:e", "stream", "é", "a b", "x" * 120]),
        st.sampled_from(["-", "_", ":", "/", "."]),
        st.integers(0, 10**6),
    ),
    st.text(st.characters(exclude_characters="\r\n"), max_size=12),
    st.integers(0, 2**128 - 1).map(lambda n: str(uuid.UUID(int=n))),
    st.sampled_from(["9" * 41, "9" * 4301, "x" * 10240, "é" * 5000]),
)
JSONRPC_IDS = st.one_of(
    st.integers(-(2**70), 2**70), st.text(max_size=8), st.none(), st.booleans(),
    st.floats(allow_nan=False), st.just([1]), st.just({"a": 1}),
)
_MESSAGE = st.one_of(
    st.builds(lambda i: {"jsonrpc": "2.0", "id": i, "result": {"ok": True}}, JSONRPC_IDS),
    st.builds(lambda i: {"jsonrpc": "2.0", "id": i, "error": {"code": -1}}, JSONRPC_IDS),
    st.builds(lambda i: {"jsonrpc": "2.0", "id": i, "method": "tools/call"}, JSONRPC_IDS),
    st.just({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": 1}}),
)
JSONRPC = st.one_of(_MESSAGE.map(json.dumps), st.lists(_MESSAGE, max_size=3).map(json.dumps))
NOTIFICATIONS = st.one_of(
    st.builds(
        lambda n, text: json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                    "params": {"n": n, "text": text}}),
        st.integers(), st.text(max_size=20),
    ),
    st.builds(
        lambda i: json.dumps({"jsonrpc": "2.0", "id": i, "method": "sampling/createMessage"}),
        JSONRPC_IDS,
    ),
)
_BIG = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"blob": "z" * (70 * 1024)}})
DATA = st.one_of(
    st.just(""),
    JSONRPC,
    st.builds(lambda text, n: text[: n % (len(text) + 1)], JSONRPC, st.integers(0, 200)),
    st.text(max_size=40),
    st.sampled_from(
        [
            "[" * 5000, "{" * 100 + '"result"', '{"id": ' + "1" * 5000 + ', "result": 1}',
            '{"jsonrpc":"2.0","id":1e400,"result":1}', "1e999", _BIG, '"result"', "null",
            '{"jsonrpc":"2.0","id":1,\n"result":{}}', "\ufeff{}", "\x00", "\ud7ff",
        ]
    ),
)
LINE_ENDS = st.sampled_from(["\n", "\r", "\r\n"])
_SEPARATORS = st.sampled_from([": ", ":", ":  "])
_KINDS = st.sampled_from(
    ["id", "id", "data", "data", "data", "event", "retry", "comment", "flood", "unknown",
     "bare", "raw"]
)
_EVENT_NAMES = st.sampled_from(["message", "endpoint", "", "ping", "é", "x" * 300])
_RETRIES = st.sampled_from(
    ["3000", "-1", "abc", "", "1e3", "99999999999999999999999", " 5", "٣"]
)
_UNKNOWN = st.sampled_from(["foo: bar", "Data: x", "ID: 5", "id : 5", " data: x"])
_BARE = st.sampled_from(["data", "id", "event", "retry"])
_COMMENTS = st.text(max_size=20)
_RAW = st.binary(max_size=8)
_FLOOD = st.integers(1, 3000)
_BLOCKS = st.integers(0, 10)
_FIELDS = st.integers(1, 4)


@st.composite
def sse_bodies(draw) -> bytes:
    """SSE bytes a hostile server might send: every field, odd separators,
    CR / LF / CRLF line ends, missing ends, comment floods, raw bytes."""
    lines: list[bytes] = []
    for _ in range(draw(_BLOCKS)):
        for _ in range(draw(_FIELDS)):
            kind = draw(_KINDS)
            sep = draw(_SEPARATORS)
            if kind == "id":
                text = "id" + sep + draw(IDS)
            elif kind == "data":
                text = "\n".join("data" + sep + part for part in draw(DATA).split("\n"))
            elif kind == "event":
                text = "event" + sep + draw(_EVENT_NAMES)
            elif kind == "retry":
                text = "retry" + sep + draw(_RETRIES)
            elif kind == "comment":
                text = ":" + draw(_COMMENTS)
            elif kind == "flood":
                text = "\n".join(":" for _ in range(draw(_FLOOD)))
            elif kind == "unknown":
                text = draw(_UNKNOWN)
            elif kind == "bare":
                text = draw(_BARE)
            else:
                lines.append(draw(_RAW))
                continue
            end = draw(LINE_ENDS)
            lines.append((text.replace("\n", end) + end).encode("utf-8", "surrogatepass"))
        lines.append(draw(LINE_ENDS).encode())  # the blank line that dispatches
    body = b"".join(lines)
    if body and draw(st.integers(0, 3)) == 0:
        body = body.rstrip(b"\r\n")  # missing line end
    return body


@dataclass(frozen=True)
class Case:
    flavour: str
    method: str = "GET"
    query: str = ""
    request_headers: tuple[tuple[bytes, bytes], ...] = ((b"accept", b"text/event-stream"),)
    request_body: bytes = b""
    status: int = 200
    response_headers: tuple[tuple[bytes, bytes], ...] = (SSE_TYPE,)
    extra: bytes = b""  # raw header lines (socket only)
    status_line: bytes | None = None  # raw status line (socket only)
    framing: str = "close"
    body: bytes = b""
    cuts: tuple[int, ...] = ()
    split_every_byte: bool = False
    stop_after: int | None = None

    def chunks(self) -> tuple[bytes, ...]:
        return every_byte(self.body) if self.split_every_byte else cut(self.body, self.cuts)

    def reply(self) -> Reply:
        framing_line, chunks = framed(self.chunks(), self.framing)
        lines = b"\r\n".join(line for line in (framing_line, self.extra) if line)
        status_head = head(self.status, self.response_headers, extra=lines,
                           status_line=self.status_line)
        return Reply(status_head, chunks)

    def brief(self) -> str:
        return (f"{self.flavour} {self.method} status={self.status} framing={self.framing} "
                f"body={len(self.body)}B chunks={len(self.chunks())} stop={self.stop_after}")


QUERIES = st.one_of(
    st.just(""),
    st.just(""),
    st.builds(lambda v: "session_id=" + v, st.text(max_size=12)),
    st.sampled_from(
        ["sessionId=a&sessionId=b", "session_id=" + "q" * 10240, "ession",
         "session_id=%ff%fe&x=%zz", "sessionId="]
    ),
)
REQUEST_BODIES = st.one_of(
    JSONRPC.map(str.encode),
    st.builds(lambda text, n: text.encode()[:n], JSONRPC, st.integers(0, 60)),
    st.binary(max_size=16),
    st.sampled_from(
        [json.dumps([{"jsonrpc": "2.0", "id": n, "method": "m"} for n in range(4000)]).encode(),
         b"[" * 5000]
    ),
)
_METHODS = st.sampled_from(["GET", "GET", "GET", "POST"])
_HEADER_VALUES = {
    False: st.lists(st.sampled_from(REQUEST_HEADER_VALUES), max_size=2),
    True: st.lists(
        st.sampled_from(REQUEST_HEADER_VALUES + REQUEST_HEADER_VALUES_INVALID), max_size=2
    ),
}
_CONTENT_TYPE = st.one_of(st.just(b"text/event-stream"), st.sampled_from((None, *CONTENT_TYPES)))
_SESSIONS = st.lists(st.sampled_from(RESPONSE_SESSION_VALUES), max_size=2)
_STATUSES = st.sampled_from([200] * 6 + [202, 204, 400, 404, 500])
_EXTRA = st.sampled_from((b"",) * 6 + EXTRA_HEADER_LINES)
_STATUS_LINES = st.sampled_from((None,) * 12 + STATUS_LINES)
_FRAMING = st.sampled_from(FRAMINGS)
_STOP = st.one_of(st.none(), st.none(), st.integers(0, 3))


@st.composite
def cases(draw, *, socket_path: bool) -> Case:
    """A hostile exchange.  ``socket_path`` adds what only raw bytes can carry
    (malformed head lines, framings); the direct path cuts at every byte."""
    flavour = draw(st.sampled_from(FLAVOURS))
    method = draw(_METHODS)
    request_headers = [(b"accept", b"text/event-stream")]
    for name in (b"last-event-id", b"mcp-session-id", b"mcp-protocol-version"):
        for value in draw(_HEADER_VALUES[socket_path]):
            request_headers.append((name, value))
    if draw(st.booleans()):
        request_headers.append((b"last-event-id", draw(IDS).encode("utf-8", "surrogatepass")))
    response_headers = []
    content_type = draw(_CONTENT_TYPE)
    if content_type is not None:
        response_headers.append((b"content-type", content_type))
    for value in draw(_SESSIONS):
        response_headers.append((b"mcp-session-id", value))
    body = draw(sse_bodies())
    every = draw(st.integers(0, 9)) == 0 and (not socket_path or len(body) <= 2048)
    return Case(
        flavour=flavour,
        method=method,
        query=draw(QUERIES),
        request_headers=tuple(request_headers),
        request_body=draw(REQUEST_BODIES) if method == "POST" else b"",
        status=draw(_STATUSES),
        response_headers=tuple(response_headers),
        extra=draw(_EXTRA) if socket_path else b"",
        status_line=draw(_STATUS_LINES) if socket_path else None,
        framing=draw(_FRAMING) if socket_path else "close",
        body=body,
        cuts=tuple(draw(st.lists(st.integers(0, max(len(body), 1)), max_size=12))),
        split_every_byte=every,
        stop_after=draw(_STOP),
    )


# ========================================================== faithful streams

VISIBLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
SCHEMES = ("integer", "padded", "prefixed", "unicode", "uuid", "long", "huge")


def scheme_id(scheme: str, n: int, salt: str) -> str:
    if scheme == "integer":
        return str(n)
    if scheme == "padded":
        return f"{n:012d}"
    if scheme == "prefixed":
        return f"{salt}_{n}"
    if scheme == "unicode":
        return f"ストリーム{salt}-{n}"
    if scheme == "uuid":
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{salt}/{n}"))
    if scheme == "long":
        return "L" * 200 + str(n)
    return str(10**45 + n)  # more digits than any integer type


ORDERED_SCHEMES = ("integer", "padded", "prefixed", "unicode")  # a letter, a separator, digits


@dataclass(frozen=True)
class FaithfulCase:
    flavour: str
    scheme: str
    salt: str
    session: str
    session_in_first_request: bool
    ids_before: tuple[int, ...]
    ids_after: tuple[int, ...]
    primed: bool  # the resumed stream opens with a priming event (id, no data)
    first_body: bytes
    resume_body: bytes
    first_cuts: tuple[int, ...]
    resume_cuts: tuple[int, ...]
    every_byte: bool
    break_with_error: bool

    def first_chunks(self) -> tuple[bytes, ...]:
        return every_byte(self.first_body) if self.every_byte else cut(
            self.first_body, self.first_cuts)

    def resume_chunks(self) -> tuple[bytes, ...]:
        return every_byte(self.resume_body) if self.every_byte else cut(
            self.resume_body, self.resume_cuts)

    def cursor(self) -> str:
        return scheme_id(self.scheme, self.ids_before[-1], self.salt)

    def expected_outcome(self) -> str:
        if self.primed:
            return "caught_up"  # a priming event: nothing to replay, said explicitly
        # Order is proven by a counter the session saw counting (two ids, a
        # priming event's included) against a replayed counter, or by a
        # replay that starts at exactly the cursor's next counter, even one
        # with a clock's digits; never by comparing a clock's digits (10
        # digits from 1e9).
        def clock(n: int) -> bool:
            return self.scheme != "padded" and n >= 10**9

        cursor, first = self.ids_before[-1], self.ids_after[0]
        follows = first == cursor + 1 and not clock(cursor)
        counted = len(self.ids_before) >= 2 and not clock(cursor) and not clock(first)
        ordered = self.scheme in ORDERED_SCHEMES and (follows or counted)
        return "resumed" if ordered else "unverifiable"


_FAITHFUL_DATA = st.one_of(
    # Notifications, server-to-client requests and text: a response here would
    # answer a request this client never sent (foreign_replay, rightly).
    NOTIFICATIONS,
    st.text(min_size=1, max_size=30).filter(lambda t: t.strip("\r\n") == t and "\r" not in t),
)
_NOISE = st.sampled_from(
    [":keepalive{end}", ": " + "c" * 50 + "{end}", "retry: abc{end}", "foo: bar{end}",
     ":{end}" * 40, "event: ping{end}data:{end}{end}"]
)
_NOISE_COUNT = st.integers(0, 2)
_PRIMING_RETRY = st.sampled_from([None, "3000"])
_EVENT_FIELD = st.sampled_from([None, "message", "x"])
_RETRY_FIELD = st.sampled_from([None, None, "100", "abc"])


@st.composite
def _noisy_stream(draw, ids: list[str], *, primed_id: str | None) -> bytes:
    """Well-formed SSE for ``ids`` (each event with data), with comments,
    retry lines, unknown fields, heartbeats after the first event, and mixed
    line ends; ``primed_id`` opens it with a priming event (an id, no data)."""
    out: list[bytes] = []
    if primed_id is not None:
        out.append(block(primed_id, "", retry=draw(_PRIMING_RETRY), end=draw(LINE_ENDS)))
    for n, event_id in enumerate(ids):
        for _ in range(draw(_NOISE_COUNT)):
            noise = draw(_NOISE)
            if "data:" in noise and n == 0 and primed_id is None:
                continue  # a heartbeat first would be an end-of-replay marker
            out.append(noise.format(end=draw(LINE_ENDS)).encode())
        out.append(block(event_id, draw(_FAITHFUL_DATA), event=draw(_EVENT_FIELD),
                         retry=draw(_RETRY_FIELD), end=draw(LINE_ENDS)))
    return b"".join(out)


@st.composite
def faithful_cases(draw) -> FaithfulCase:
    scheme = draw(st.sampled_from(SCHEMES))
    salt = draw(st.text("abcdefghij", min_size=1, max_size=6))
    start = draw(st.integers(0, 10**9))
    steps = draw(st.lists(st.integers(1, 3), min_size=2, max_size=12))
    numbers = list(itertools.accumulate([start, *steps]))
    split = draw(st.integers(1, len(numbers) - 1))
    before, after = numbers[:split], numbers[split:]
    before_ids = [scheme_id(scheme, n, salt) for n in before]
    first_primed = draw(st.booleans())  # a 2025-11-25 server primes every stream
    first_body = draw(_noisy_stream(before_ids[first_primed:],
                                    primed_id=before_ids[0] if first_primed else None))
    primed = draw(st.booleans())
    after_ids = [scheme_id(scheme, n, salt) for n in after]
    primed_id = after_ids.pop(0) if primed else None
    resume_body = draw(_noisy_stream(after_ids, primed_id=primed_id))
    break_with_error = draw(st.booleans())
    if break_with_error or draw(st.booleans()):
        # A CR held back at a chunk's end only becomes a line end with the next
        # byte or the end of the body: a stream that breaks loses that event.
        first_body = first_body.rstrip(b"\r\n") + b"\n\n"
    return FaithfulCase(
        flavour=draw(st.sampled_from(FLAVOURS)),
        scheme=scheme,
        salt=salt,
        session=draw(st.text(VISIBLE, min_size=1, max_size=24)),
        session_in_first_request=draw(st.booleans()),
        ids_before=tuple(before),
        ids_after=tuple(after),
        primed=primed,
        first_body=first_body,
        resume_body=resume_body,
        first_cuts=tuple(draw(st.lists(st.integers(0, len(first_body)), max_size=10))),
        resume_cuts=tuple(draw(st.lists(st.integers(0, len(resume_body)), max_size=10))),
        every_byte=draw(st.integers(0, 7)) == 0,
        break_with_error=break_with_error,
    )


# ================================================================= harness


@dataclass
class Stats:
    cases: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    events: int = 0
    resumes: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add_error(self, error: str | None) -> None:
        if error is not None:
            name = error.split(":", 1)[0]
            self.errors[name] = self.errors.get(name, 0) + 1


class Harness:
    """Our instrumentation (observe mode) on in-memory providers, a raw
    server, and the checks every case must pass."""

    MOCK_URL = "http://fuzz.invalid"

    def __init__(self, server: RawServer | None = None, **settings_: object) -> None:
        self.server = server or RawServer()
        self._own_server = server is None
        self.telemetry = Telemetry()
        self.instrumentor = McpResumptionInstrumentor()
        self.instrumentor.instrument(**self.telemetry.providers(), **settings_)
        self._counter = itertools.count()
        self.stats = Stats()
        self.samples: list[tuple[Case, bool, str, Seen]] = []  # the uninstrumented cross-check

    def close(self) -> None:
        if self.instrumentor.is_instrumented_by_opentelemetry:
            self.instrumentor.uninstrument()
        self.telemetry.shutdown()
        if self._own_server:
            self.server.close()

    def recheck_uninstrumented(self) -> int:
        """The reference (instrumentation suppressed) is what a host gets with
        no instrumentation installed at all: re-run the sampled cases so."""
        self.instrumentor.uninstrument()
        try:
            for case, through_socket, path, reference in self.samples:
                bare = self.run(case, through_socket=through_socket, path=path)
                assert bare == reference, f"{case.brief()}\n{bare}\n{reference}"
        finally:
            self.instrumentor.instrument(**self.telemetry.providers())
        return len(self.samples)

    # -- one hostile case

    def run(self, case: Case, *, through_socket: bool, path: str) -> Seen:
        if through_socket:
            self.server.reply(path, case.reply())
            url, transport = self.server.url + path, None
        else:
            url = self.MOCK_URL + path
            transport = mock_transport(case.flavour, case.status, case.response_headers,
                                       case.chunks())
        if case.query:
            url += "?" + case.query
        try:
            return consume(case.flavour, url, method=case.method, headers=case.request_headers,
                           body=case.request_body, stop_after=case.stop_after,
                           transport=transport)
        finally:
            self.server.scripts.pop(path, None)

    def check(self, case: Case, *, through_socket: bool) -> None:
        path = f"/f/{next(self._counter):09d}"  # the same URL (and length) every run
        with suppress_instrumentation():
            reference = self.run(case, through_socket=through_socket, path=path)
        patches_module._reported.clear()
        with package_log() as records:
            observed = self.run(case, through_socket=through_socket, path=path)
        assert observed == reference, (
            f"the host saw something else instrumented: {case.brief()}\n"
            f"uninstrumented: {reference}\ninstrumented:   {observed}"
        )
        assert not records, "a patch failed inside: " + "; ".join(
            f"{r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
            for r in records
        )
        self.stats.cases += 1
        self.stats.events += len(observed.events)
        self.stats.add_error(observed.error)
        if len(self.samples) < 64 and self.stats.cases % 5 == 1:
            self.samples.append((case, through_socket, path, reference))
        if self.stats.cases % 500 == 0:  # keep memory flat over long runs
            self.telemetry.spans.clear()
            self.telemetry.logs.clear()

    # -- one faithful resume

    def check_faithful(self, case: FaithfulCase, *, through_socket: bool) -> None:
        token = next(self._counter)
        path = f"/faithful/{token}"
        session = f"f{token}-{case.session}"
        cursor = case.cursor()
        response_headers = ((b"content-type", b"text/event-stream"),
                            (b"mcp-session-id", session.encode()))
        first_headers = [(b"accept", b"text/event-stream")]
        if case.session_in_first_request:
            first_headers.append((b"mcp-session-id", session.encode()))
        resume_headers = [(b"accept", b"text/event-stream"),
                          (b"mcp-session-id", session.encode()),
                          (b"last-event-id", cursor.encode())]
        if through_socket:
            first = sse_reply(case.first_chunks(), headers=response_headers,
                              framing="broken" if case.break_with_error else "close")
            resumed = Reply(head(200, response_headers), case.resume_chunks())
            self.server.on(path, lambda request: resumed
                           if request.header("last-event-id") else first)
            url, first_transport, resume_transport = self.server.url + path, None, None
        else:
            url = self.MOCK_URL + path
            first_transport = mock_transport(
                case.flavour, 200, response_headers, case.first_chunks(),
                break_with="peer closed connection" if case.break_with_error else None)
            resume_transport = mock_transport(case.flavour, 200, response_headers,
                                              case.resume_chunks())
        gaps_before = len(self._gap_logs())
        spans_before = len(self._resume_spans())
        patches_module._reported.clear()
        try:
            with package_log() as records:
                seen = consume(case.flavour, url, headers=first_headers,
                               transport=first_transport)
                assert seen.last_id == cursor, (seen, cursor)
                resumed_seen = consume(case.flavour, url, headers=resume_headers,
                                       transport=resume_transport)
        finally:
            self.server.scripts.pop(path, None)
        assert resumed_seen.error is None, resumed_seen
        expected_ids = [scheme_id(case.scheme, n, case.salt) for n in case.ids_after]
        got_ids = list(dict.fromkeys(event[2] for event in resumed_seen.events))
        assert got_ids == expected_ids, (got_ids, expected_ids)
        assert not records, [r.getMessage() for r in records]
        gaps = self._gap_logs()[gaps_before:]
        assert not gaps, (
            f"a faithful resume reported a gap: {case}\n"
            + "\n".join(str(g.log_record.body) for g in gaps)
        )
        spans = self._resume_spans()[spans_before:]
        assert len(spans) == 1, spans
        outcome = spans[0].attributes.get("mcp.resumption.outcome")
        assert outcome == case.expected_outcome(), (outcome, case)
        self.stats.cases += 1
        self.stats.resumes += 1
        self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
        if self.stats.cases % 500 == 0:
            self.telemetry.spans.clear()
            self.telemetry.logs.clear()

    def _gap_logs(self) -> list:
        return [
            record for record in self.telemetry.logs.get_finished_logs()
            if getattr(record.log_record, "event_name", None) == "resumption.gap"
        ]

    def _resume_spans(self) -> list:
        return [s for s in self.telemetry.spans.get_finished_spans() if s.name == "mcp.resume"]


# ============================================================= the targets


def _settings(cases: int, seed: int | None):
    return settings(
        max_examples=cases,
        derandomize=seed is None,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
    )


def run_fuzz(harness: Harness, cases: int, *, through_socket: bool,
             seed: int | None = None) -> Stats:
    """``cases`` generated hostile exchanges, each checked by the harness."""

    @_settings(cases, seed)
    @given(case=cases_strategy(through_socket))
    def target(case: Case) -> None:
        harness.check(case, through_socket=through_socket)

    if seed is not None:
        target = hypothesis_seed(seed)(target)
    target()
    return harness.stats


def cases_strategy(through_socket: bool):
    return cases(socket_path=through_socket)


def run_faithful(harness: Harness, cases: int, *, through_socket: bool,
                 seed: int | None = None) -> Stats:
    """``cases`` faithful break-and-resume pairs: never a gap."""

    @_settings(cases, seed)
    @given(case=faithful_cases())
    def target(case: FaithfulCase) -> None:
        harness.check_faithful(case, through_socket=through_socket)

    if seed is not None:
        target = hypothesis_seed(seed)(target)
    target()
    return harness.stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--socket-share", type=float, default=0.1,
                        help="fraction of the cases sent through the loopback socket")
    parser.add_argument("--seed", type=int, default=None,
                        help="explore with this seed instead of the derandomized sequence")
    args = parser.parse_args(argv)
    socket_cases = int(args.cases * args.socket_share)
    direct_cases = args.cases - socket_cases
    started = time.monotonic()
    harness = Harness()
    try:
        for name, target, count, through_socket in (
            ("hostile/direct", run_fuzz, direct_cases, False),
            ("hostile/socket", run_fuzz, socket_cases, True),
            ("faithful/direct", run_faithful, direct_cases // 4, False),
            ("faithful/socket", run_faithful, socket_cases // 4, True),
        ):
            if count <= 0:
                continue
            harness.stats = Stats()
            stats = target(harness, count, through_socket=through_socket, seed=args.seed)
            print(f"{name}: {stats.cases} cases, {stats.events} events, outcomes "
                  f"{stats.outcomes}, host errors {stats.errors}", flush=True)
    finally:
        harness.close()
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
