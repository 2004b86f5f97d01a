# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The downstream leg: what the proxy can say of each resume a client makes
to it, reported as the server half reports a server's resumes.

The proxy remembers, bounded, the event ids it forwarded and the session each
was forwarded in.  A client's ``Last-Event-ID`` is then one it got from this
proxy in this session (``replayed``: handed on, the upstream leg judges what
the server replays), one of another session (``other_session``), or one the
proxy never forwarded (``unknown_cursor``: a restarted proxy, or a cursor from
elsewhere; nothing on this leg can vouch for what follows it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from opentelemetry.instrumentation.mcp_resumption import config
from opentelemetry.instrumentation.mcp_resumption import semconv as sc
from opentelemetry.instrumentation.mcp_resumption.server.observer import (
    ResumeRequest,
    ServerObserver,
)

from . import legs

# As the server half remembers per store: enough for every live stream's
# recent cursors, a fixed cost for an endless one.
MAX_REMEMBERED = 65_536
_UNSET = object()


class DownstreamView:
    """Cursors the proxy forwarded, and each client resume judged against them."""

    def __init__(self, observer: ServerObserver | None) -> None:
        self.observer = observer
        self._ids: OrderedDict[str, str | None] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def for_leg(cls, **providers: Any) -> DownstreamView:
        wrapped = legs.providers(legs.CLIENT_PROXY, **providers)
        observer = ServerObserver(
            meter_provider=wrapped["meter_provider"],
            logger_provider=wrapped["logger_provider"],
            settings=config.load({"session_id": None}),
            # The server half's guard, on the proxy's own resumes:
            # OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD=reject answers a cursor
            # the proxy cannot vouch for with 410 Gone.
            guard=config.load_server_guard(None),
        )
        return cls(observer)

    def forwarded(self, event_id: str, session_id: str | None) -> None:
        """An event with ``event_id`` crossed the proxy to a client of ``session_id``."""
        ids = self._ids
        with self._lock:
            if event_id in ids:
                ids.move_to_end(event_id)
            ids[event_id] = session_id
            if len(ids) > MAX_REMEMBERED:
                ids.popitem(last=False)

    def judge(self, cursor: str, session_id: str | None) -> str:
        """The downstream outcome of a resume from ``cursor`` in ``session_id``."""
        with self._lock:
            known = self._ids.get(cursor, _UNSET)
        if known is _UNSET:
            return sc.SERVER_UNKNOWN_CURSOR
        if known != session_id:
            return sc.SERVER_OTHER_SESSION
        return sc.SERVER_REPLAYED

    def resumed(
        self,
        cursor: str,
        session_id: str | None,
        address: str,
        port: int | None,
        *,
        replayed: int | None = None,
    ) -> str:
        """Judge a client's resume and report it on the ``client_proxy`` leg;
        ``rejected_by_guard`` when the guard refuses it (answer 410)."""
        outcome = self.judge(cursor, session_id)
        if self.observer is not None:
            with self._lock:
                previous = self._ids.get(cursor)
            request = ResumeRequest(
                sc.TRANSPORT_STREAMABLE_HTTP, address, port, cursor, session_id
            )
            cursor_session = previous if outcome == sc.SERVER_OTHER_SESSION else None
            if self.observer.rejecting and outcome in sc.SERVER_GAP_KINDS:
                self.observer.record(request, sc.SERVER_REJECTED_BY_GUARD, refused=outcome,
                                     cursor_session=cursor_session)
                return sc.SERVER_REJECTED_BY_GUARD
            self.observer.record(
                request, outcome, replayed=replayed, cursor_session=cursor_session
            )
        return outcome
