# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""httpx and httpx2 clients (sync and async): request and response facts.

``Client.send`` is wrapped rather than the transport, so that the facts are
in a ContextVar while the httpx instrumentation's client span starts inside
the transport (the owner's ``on_start`` copies them onto it) and so that
the resume's ``mcp.resume`` span is that span's parent.
"""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from functools import partial
from types import GeneratorType
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from opentelemetry import trace

from ..errors import ResumptionGapError
from ..telemetry.facts import RequestFacts, StreamContext, legacy_session_in_query
from ..tracking.tracker import MAX_KEPT_ID_BYTES, bounded_id
from . import Targets, fault, guarded

if TYPE_CHECKING:  # the owner is bound in at instrument(); no import upward
    from ..owner.monitor import ResumptionMonitor

MAX_HEADER_LENGTH = 1024
# server.port when the URL leaves it implicit (the conventions ask for the port
# the client connects to).
_DEFAULT_PORTS = {"http": 80, "https": 443}


# The headers the plugin reads, found in one pass: httpx's ``Headers.get``
# scans and decodes the whole list on each call, seven calls a request.
_REQUEST_HEADERS = frozenset(
    (
        b"last-event-id",
        b"mcp-session-id",
        b"mcp-protocol-version",
        b"accept",
        b"content-encoding",
        b"mcp-method",
        b"mcp-name",
    )
)
_RESPONSE_HEADERS = frozenset((b"mcp-session-id", b"mcp-protocol-version", b"content-type"))
# The headers whose values are kept stripped and bounded (None when empty),
# in the same pass: the others (accept, content-encoding, content-type) are
# read as they came.
_KEPT = frozenset(
    (b"last-event-id", b"mcp-session-id", b"mcp-protocol-version", b"mcp-method", b"mcp-name")
)
_SESSION = b"mcp-session-id"
_ID_CHARS = MAX_KEPT_ID_BYTES // 4  # at most 4 bytes a character: kept as it is


def _headers(
    headers: Any, names: frozenset[bytes], kept: frozenset[bytes] = frozenset()
) -> dict[bytes, str | None]:
    """The values of ``names`` (lower case) in ``headers``, decoded as httpx
    decodes them, a repeated header's values joined with ", " as
    ``Headers.get`` joins them; those of ``kept`` stripped, cut at
    ``MAX_HEADER_LENGTH`` and None when empty, a session id as the tracker
    keeps it (``bounded_id``)."""
    # httpx and httpx2 keep (raw key, lower-case key, value) for each header
    # in ``_list``; ``raw`` would build a list and ``lower()`` every key again.
    entries = getattr(headers, "_list", None)
    if entries is None or (entries and len(entries[0]) != 3):
        entries = [(key, key.lower(), value) for key, value in headers.raw]
    found: dict[bytes, str] = {}
    for _, key, value in entries:
        if key in names:
            try:
                text = value.decode("ascii")  # what any encoding makes of ASCII
            except UnicodeDecodeError:
                # httpx's choice for the whole list (ascii, utf-8, latin-1):
                # working it out decodes every header, so only when needed
                text = value.decode(headers.encoding)
            found[key] = f"{found[key]}, {text}" if key in found else text
    for key, text in found.items():  # values replaced, no key added
        if key in kept:
            text = text.strip()[:MAX_HEADER_LENGTH] or None
            if key == _SESSION and text is not None and len(text) > _ID_CHARS:
                text = bounded_id(text)
            found[key] = text
    return found


def _body_requests(
    owner: ResumptionMonitor, request: Any, mcp: bool, encoding: str | None
) -> tuple[list[tuple[str, str]] | None, bytes | None, bool]:
    """(the JSON-RPC requests in a POST body, or the body to parse for them
    when they are needed, and whether it is JSON-RPC); the requests are None
    where the body was not read: streamed (httpx raises RequestNotRead),
    compressed, over the limit or, on a request that shows MCP otherwise
    (``mcp``), not JSON."""
    try:
        body = request.content
    except Exception:  # a streamed body: the hop of a redirect, or the caller's stream
        carried = owner.redirected.get(request)
        if carried is not None:
            return carried, None, True
        # A bytes body re-sent as a stream can be read again without consuming
        # anything; any other stream is the caller's to read, not ours.
        body = getattr(getattr(request, "stream", None), "_stream", None)
        if not isinstance(body, bytes):
            return None, None, False
    if not body:
        return [], None, False
    jsonrpc = body.find(b'"jsonrpc"') != -1
    if encoding and encoding.strip().lower() != "identity":
        return None, None, False
    if not jsonrpc and not mcp:
        return [], None, False  # read, and not MCP: nothing to look for
    return [], body, jsonrpc


def request_facts(owner: ResumptionMonitor, request: Any) -> RequestFacts | None:
    """Facts of a request that may be MCP; None for other HTTP traffic, which
    is left alone at the cost of a few header lookups.  ``mcp`` says whether
    the request shows MCP itself; if not, its answer has to (see
    ``ResumptionMonitor.end_request``)."""
    headers = _headers(request.headers, _REQUEST_HEADERS, _KEPT)
    last_event_id = headers.get(b"last-event-id")
    session_id = headers.get(_SESSION)
    accept = headers.get(b"accept", "")
    url = request.url
    query = url.query.decode("ascii", "replace") if isinstance(url.query, bytes) else url.query
    legacy_session_id = legacy_session_in_query(query) if query else None
    protocol_version = headers.get(b"mcp-protocol-version")
    # Inside the MCP SDK transport's reconnect loop (its patch opens the hop
    # scope), a resume is MCP even before any session: an explicit
    # resumption token is sent with no header that shows it.
    mcp = bool(session_id or legacy_session_id or protocol_version) or (
        last_event_id is not None and owner.hop_scope.get() is not None
    )
    method = request.method
    requests: list[tuple[str, str]] | None = []
    body = None
    if method == "POST" and (mcp or "text/event-stream" in accept):
        encoding = headers.get(b"content-encoding")
        try:
            body = request.content
        except Exception:  # streamed: ``_body_requests`` says what it is
            body = None
        # ``find``: a bytes ``in`` costs twice as much on 3.11, 7 times on 3.13.
        if body and not encoding and body.find(b'"jsonrpc"') != -1:
            mcp = True  # the common case (``_body_requests``' last), no call
        else:
            requests, body, jsonrpc = _body_requests(owner, request, mcp, encoding)
            mcp = mcp or jsonrpc
    if not (mcp or last_event_id or "text/event-stream" in accept):
        return None
    host = url.host or ""
    port = url.port
    return RequestFacts(
        method=method,
        server=f"{host}:{port}" if port else host,
        host=host,
        port=port or _DEFAULT_PORTS.get(url.scheme),
        last_event_id=last_event_id,
        session_id=session_id,
        legacy_session_id=legacy_session_id,
        protocol_version=protocol_version,
        requests=requests,
        path=url.path,
        mcp=mcp,
        query_names_session=bool(query) and "ession" in query,
        body=body,
        started=time.monotonic(),
        mcp_method=headers.get(b"mcp-method"),
        mcp_name=headers.get(b"mcp-name"),
        headers=request.headers,
    )


def _prepare(owner: ResumptionMonitor, args: tuple, kwargs: dict):
    if not owner.active or not owner.enabled or not is_instrumentation_enabled():
        return None
    request = args[0] if args else kwargs.get("request")
    # ``guarded()`` written out: this runs for every request.
    try:
        facts = request_facts(owner, request)
    except Exception:
        fault("reading request facts")
        return None
    if facts is None:
        return None
    try:
        attributes = owner.request_attributes(facts)
    except Exception:
        fault("request attributes")
        attributes = None
    try:
        resume = owner.begin_request(facts, attributes)
    except ResumptionGapError:
        raise  # enforce mode: the owner told the task's reconnect loop
    except Exception:
        fault("opening the resume span")
        resume = None
    return facts, resume, attributes


def _span_scope(resume: Any):
    if resume is None:
        return nullcontext()
    return trace.use_span(resume.span, end_on_exit=False, record_exception=False)


def _observe_response(
    owner: ResumptionMonitor, facts: RequestFacts, resume: Any, response: Any
) -> None:
    headers = _headers(response.headers, _RESPONSE_HEADERS, _KEPT)
    next_request = getattr(response, "next_request", None)
    if next_request is not None and (requests := facts.ledger()):
        owner.redirected[next_request] = requests
    content_type = headers.get(b"content-type", "")
    context = owner.end_request(
        facts,
        resume,
        response.status_code,
        headers.get(_SESSION),
        content_type.split(";", 1)[0].strip().lower() == "text/event-stream",
        response_mcp=b"mcp-protocol-version" in headers,
    )
    if context is not None:
        owner.streams[response] = context
    elif (facts.body is not None or facts.requests) and content_type.startswith(
        "application/json"
    ):
        # An MCP POST answered with JSON: read when the client closes it, or
        # now where send() read it already (not streamed).  The reader rides
        # on the response itself (an attribute costs a fifth of a weak
        # mapping's entry, and goes with it).
        answer = getattr(response, "_content", None)
        if isinstance(answer, bytes):
            owner.json_answered(facts, answer, response.status_code)
        else:
            response._mcp_resumption_answer = (owner, facts)


def _failed(
    owner: ResumptionMonitor, facts: RequestFacts, resume: Any, error: BaseException
) -> None:
    if facts.tasks and isinstance(error, Exception) and owner.enabled:
        owner.request_unanswered(facts, type(error).__qualname__)
    if resume is None:
        return
    # The type only: an HTTP client's message can quote a header value
    # (httpx: "Illegal header value b'Bearer ...'").
    kind = type(error).__qualname__
    resume.span.set_attribute("error.type", kind)
    resume.span.set_status(trace.Status(trace.StatusCode.ERROR, kind))
    if isinstance(error, Exception) and owner.enabled:
        owner.request_failed(facts, resume, kind)  # the attempt's verdict ends the span
    else:  # a cancellation: the client stopped this attempt itself
        resume.span.end()


def _send(owner: ResumptionMonitor, wrapped, instance, args, kwargs):
    prepared = _prepare(owner, args, kwargs)
    if prepared is None:
        return wrapped(*args, **kwargs)
    facts, resume, attributes = prepared
    request_scope = owner.request_scope
    token = request_scope.set((attributes, facts.query_names_session))
    try:
        if resume is None:  # no span to make current (a with costs a little)
            response = wrapped(*args, **kwargs)
        else:
            with _span_scope(resume):
                response = wrapped(*args, **kwargs)
    except BaseException as error:
        guarded("recording a failed reconnect", _failed, owner, facts, resume, error)
        raise
    finally:
        request_scope.reset(token)
    try:  # ``guarded()`` written out: this runs for every request.
        _observe_response(owner, facts, resume, response)
    except ResumptionGapError:
        raise
    except Exception:
        fault("reading response facts")
    return response


async def _async_send(owner: ResumptionMonitor, wrapped, instance, args, kwargs):
    prepared = _prepare(owner, args, kwargs)
    if prepared is None:
        return await wrapped(*args, **kwargs)
    facts, resume, attributes = prepared
    request_scope = owner.request_scope
    token = request_scope.set((attributes, facts.query_names_session))
    try:
        if resume is None:
            response = await wrapped(*args, **kwargs)
        else:
            with _span_scope(resume):
                response = await wrapped(*args, **kwargs)
    except BaseException as error:
        guarded("recording a failed reconnect", _failed, owner, facts, resume, error)
        raise
    finally:
        request_scope.reset(token)
    try:  # ``guarded()`` written out: this runs for every request.
        _observe_response(owner, facts, resume, response)
    except ResumptionGapError:
        raise
    except Exception:
        fault("reading response facts")
    return response


# The depths ``_inside_read`` remembers (``ResumptionMonitor.read_depths``).
_MAX_READ_DEPTHS = 4


def _inside_read(context: StreamContext, depths: list[int]) -> bool:
    """This close is made from inside a read of the stream's observed SSE
    iterator: its frame is on this thread's stack.  httpx closes a response
    itself when its body ends, inside that read, and the events the SSE
    parser flushes at the end come after that close; the iterator reports
    that end itself.  A close from another task or thread is still the
    application's.  Looked up at the close, so a read costs nothing."""
    reader = context.reader() if context.reader is not None else None
    if reader is None:
        return False
    if type(reader) is GeneratorType:
        running, frame = reader.gi_running, reader.gi_frame
    else:
        running = getattr(reader, "ag_running", False)
        frame = getattr(reader, "ag_frame", None)
    if not running or frame is None:
        return False  # not in a read anywhere, so not in this thread's stack
    # Where it was found before first (one C call each, checked by
    # identity: a wrong depth costs the walk, never a wrong answer).
    for depth in depths:
        try:
            if sys._getframe(depth) is frame:
                return True
        except ValueError:  # this stack is not that deep
            pass
    caller, depth = sys._getframe(1), 1
    while caller is not None:
        if caller is frame:
            if len(depths) < _MAX_READ_DEPTHS:
                depths.append(depth)
            return True
        caller, depth = caller.f_back, depth + 1
    return False


def _close_seen(owner: ResumptionMonitor, instance: Any) -> None:
    context = owner.streams.get(instance)
    if context is None or _inside_read(context, owner.read_depths):
        return
    context = owner.streams.pop(instance, None)  # (not another thread's already)
    if context is not None and owner.active:
        if sys.exc_info()[1] is None:
            # The application closed the response itself, in its own time: it
            # read what it wanted and is done with the last event it was
            # handed (it may resume from that one).  A close while an error or
            # a cancellation is on its way out (the handler of that event was
            # cut short) and an iterator closed before the next event leave it
            # unconsumed: the precondition of the drain race.
            owner.asked_next(context)
        owner.ended(context, "closed by the application", closed_by_client=True)


def _answer_read(owner: ResumptionMonitor, instance: Any) -> None:
    # httpx keeps a body it read whole (``_content``), and closes the response
    # once from inside that read, before it keeps it: the close after it
    # finds it.  A body the client never read is not ours to read.
    answer = getattr(instance, "_content", None)
    if isinstance(answer, bytes):
        registered, facts = instance._mcp_resumption_answer
        del instance._mcp_resumption_answer
        if registered is owner:  # not another instrument() cycle's
            owner.json_answered(facts, answer, instance.status_code)
    elif sys.exc_info()[1] is not None:
        # Closed by an error with the body unread (httpx's own close after
        # a whole body, from inside the read, has no error on its way out):
        # the answer never came.
        registered, facts = instance._mcp_resumption_answer
        if registered is owner and facts.tasks:
            owner.tasks_unanswered(facts)


def _close(owner: ResumptionMonitor, wrapped, instance, args, kwargs):
    # A client that reads the headers and walks away never iterates the
    # events: the close is the only sign (the fail-closed re-initialise path).
    if instance in owner.streams:
        guarded("observing a closed response", _close_seen, owner, instance)
    elif hasattr(instance, "_mcp_resumption_answer"):
        guarded("reading a JSON answer", _answer_read, owner, instance)
    return wrapped(*args, **kwargs)


def _aclose(owner: ResumptionMonitor, wrapped, instance, args, kwargs):
    # Not a coroutine itself: what it looks at is there when the close is
    # asked for, and the library's own coroutine is handed back as it is (a
    # coroutine of ours would be resumed at each of its awaits).
    if instance in owner.streams:
        try:  # ``guarded()`` written out: every stream is closed so
            _close_seen(owner, instance)
        except ResumptionGapError:
            raise
        except Exception:
            fault("observing a closed response")
    elif hasattr(instance, "_mcp_resumption_answer"):
        guarded("reading a JSON answer", _answer_read, owner, instance)
    return wrapped(*args, **kwargs)


def targets(owner: ResumptionMonitor) -> Targets:
    """What McpResumptionInstrumentor.instrument() wraps in httpx and in
    httpx2 for ``owner`` (with patches.wrap_targets, as each library is
    imported)."""
    return (
        ("Client.send", partial(_send, owner)),
        ("AsyncClient.send", partial(_async_send, owner)),
        ("Response.close", partial(_close, owner)),
        ("Response.aclose", partial(_aclose, owner)),
    )

