# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Facts about one MCP request and the stream that answers it.

What the HTTP patch reads off a request (``RequestFacts``), the owner's view
of the SSE response being read (``StreamContext``), a resume before its
answer (``ResumeStart``), and the few readings of those facts that every
layer above shares: which transport they show, a server's metric attributes,
the legacy transport's session id in a URL query, and a JSON-RPC id as the
conventions export it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import ResumptionGapError
from ..rules.jsonrpc import requests_in
from ..tracking.tracker import Stream, bounded_id
from . import semconv as sc

# The query parameters a legacy (2024-11-05) server names the session with.
LEGACY_SESSION_PARAMETERS = ("sessionId", "session_id")


@dataclass
class RequestFacts:
    """What one outgoing HTTP request tells the continuity checks."""

    method: str
    server: str  # host:port; event ids are scoped to a session on it, or to a path
    host: str  # for metric attributes: bounded, never a path or query
    last_event_id: str | None = None
    session_id: str | None = None  # Mcp-Session-Id header
    legacy_session_id: str | None = None  # sessionId / session_id query parameter
    protocol_version: str | None = None
    # JSON-RPC (id key, method) in the body; None: a body that was not read.
    # Read through ledger(): the body may not be parsed yet.
    requests: list[tuple[str, str]] | None = field(default_factory=list)
    port: int | None = None  # server.port: with the address, what tells servers apart
    path: str = ""  # the URL path: the scope of a sessionless stream's event ids
    # The request itself shows MCP: an Mcp-Session-Id or MCP-Protocol-Version
    # header, a legacy session query parameter, or a JSON-RPC body.
    mcp: bool = True
    # The query may name the legacy session (``?session_id=``): only then can
    # the HTTP client span's URL attributes carry it.
    query_names_session: bool = False
    # A JSON-RPC body kept to be parsed when its requests are first needed:
    # a POST answered with JSON never needs them, and the parse was a third
    # of what the plugin added to such a request.
    body: bytes | None = field(default=None, repr=False)
    # When it was sent (time.monotonic()): where an operation's duration starts.
    started: float = 0.0
    # 2026-07-28's Mcp-Method and Mcp-Name headers: the one request's method
    # and the tool it calls, without a parse of the body.
    mcp_method: str | None = None
    mcp_name: str | None = None
    # The tool each tools/call of the body names, by id key, once parsed.
    tools: dict[str, str] | None = field(default=None, repr=False)
    # The requests of the body the task ledger follows (tasks.TaskRequest),
    # by id key; None: none (most requests).
    tasks: dict[str, Any] | None = field(default=None, repr=False)
    # The events/* requests of the body the event ledger follows, by id key
    # (their method); None: none (most requests).
    events: dict[str, str] | None = field(default=None, repr=False)
    # The request's headers, read only for an events/* request (its
    # principal: ``events_server``); never exported.
    headers: Any = field(default=None, repr=False)
    # The server as the events' threads know it: with a digest of the
    # request's Authorization, when it has one (the specification keys a
    # subscription by its principal; 2026-07-28 has no session, and one
    # process, a proxy say, may subscribe for several principals).
    events_server: str | None = field(default=None, repr=False)

    def ledger(self) -> list[tuple[str, str]] | None:
        """The JSON-RPC requests in the body (see ``requests``)."""
        if self.body is not None:
            self.tools = {}
            self.requests = requests_in(self.body, self.tools)
            self.body = None
        return self.requests

    def tool(self, key: str) -> str | None:
        """The tool the tools/call ``key`` of this request names."""
        if self.tools:
            return self.tools.get(key)
        return self.mcp_name


class StreamContext:
    """The owner's view of one SSE response being read."""

    __slots__ = (
        "attributes",
        "counted_at",
        "deadline",
        "decided",
        "error",
        "events_key",
        "facts",
        "feed",
        "reader",
        "said",
        "span",
        "started",
        "status",
        "stream",
        "transport",
        "uncounted",
    )

    def __init__(self, facts: RequestFacts, stream: Stream | None, transport: str) -> None:
        self.facts = facts
        self.stream = stream
        self.transport = transport
        # (server_attributes, written out: every stream)
        attributes = {sc.MCP_TRANSPORT: transport, sc.SERVER_ADDRESS: facts.host}
        if facts.port is not None:
            attributes[sc.SERVER_PORT] = facts.port
        self.attributes = attributes
        self.span: Any = None
        self.started = 0.0
        self.error: ResumptionGapError | None = None
        self.deadline: list | None = None
        self.decided = 0.0  # when the verdict was given (the attempt may close later)
        # (outcome, gap kinds) of the verdict line written when it was decided:
        # the attempt's close writes another only if its final verdict differs.
        self.said: tuple[str, tuple[str, ...]] | None = None
        # Events read but not yet added to the totals, and when they last were.
        self.uncounted = 0
        self.counted_at = time.monotonic()
        self.events_key = (transport, facts.host, facts.port)
        self.status = 0  # of a candidate (``stream`` None), for when it is promoted
        # The SSE patch's record of a stream read without reporting each
        # event (patches.feed.Feed), and a weak reference to the iterator
        # that reads it (the close patch asks whether a close comes from
        # inside a read).
        self.feed: Any = None
        self.reader: Callable[[], Any] | None = None


@dataclass
class ResumeStart:
    """A reconnect request carrying Last-Event-ID, before its answer."""

    span: Any
    started: float


def transport_of(facts: RequestFacts, response_session_id: str | None) -> str:
    """The transport a request and its answer show: the legacy SSE transport
    names its session in the query; anything streamable HTTP sends or answers
    (a POST, a session or protocol header, a cursor) shows the newer one."""
    if facts.legacy_session_id is None and (
        facts.method == "POST"
        or facts.session_id
        or facts.protocol_version
        or facts.last_event_id
        or response_session_id
    ):
        return sc.TRANSPORT_STREAMABLE_HTTP
    return sc.TRANSPORT_SSE


def server_attributes(facts: RequestFacts) -> dict[str, Any]:
    """server.address and, when known, server.port: loopback or one host's
    several servers are told apart only by the port."""
    if facts.port is None:
        return {sc.SERVER_ADDRESS: facts.host}
    return {sc.SERVER_ADDRESS: facts.host, sc.SERVER_PORT: facts.port}


def exported_request_id(key: str) -> str:
    """The JSON-RPC id as the conventions export it: ``req-7``, not the
    tracker's key ``"req-7"`` (whose quotes keep ``1`` and ``"1"`` apart)."""
    if len(key) >= 2 and key[0] == '"' and key[-1] == '"':
        return key[1:-1]
    return key


def legacy_session_in_query(query: str) -> str | None:
    """The session id a legacy server names in a URL's query (``sessionId``
    or ``session_id``): of the ``endpoint`` event, and of the POSTs to it."""
    if "ession" not in query:  # most requests: no parse
        return None
    params = parse_qs(query)
    for name in LEGACY_SESSION_PARAMETERS:
        values = params.get(name)
        if values and values[0]:
            return bounded_id(values[0])
    return None


def legacy_session_from_endpoint(data: str) -> str | None:
    """The session id in a legacy ``endpoint`` event (``/messages/?session_id=…``)."""
    try:
        return legacy_session_in_query(urlsplit(data.strip()).query)
    except ValueError:
        return None
