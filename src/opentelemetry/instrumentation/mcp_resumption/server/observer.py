# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""ServerObserver: what an MCP server did with each resume request, as telemetry.

One object per ``instrument()``: the patches report a resume request's
outcome here, and it writes ``mcp.server.resumption.requests``, the
histogram of replayed events and, for the outcomes that lose events, a
``resumption.gap`` span and log event with the client side's attribute names
and session-id policy (the same code: ``redaction.Redaction``).  It also
remembers which session each event id was issued in, per store, so that a
cursor presented in another session can be told.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from opentelemetry._logs import SeverityNumber, get_logger

from opentelemetry import metrics, trace

from .. import config
from ..telemetry import semconv as sc
from ..telemetry.redaction import Redaction
from ..telemetry.sink import LogBudget
from ..tracking.tracker import bounded_id
from ..version import __version__

# Event ids remembered per store with the session they were issued in; an
# older cursor's session is unknown (then other_session cannot be told).
MAX_ISSUED_PER_STORE = 65_536
MAX_ZERO_SERIES_SERVERS = 1024


@dataclass
class ResumeRequest:
    """One GET with Last-Event-ID, as the server received it."""

    transport: str
    address: str
    port: int | None
    last_event_id: str
    session_id: str | None  # the session the request runs in (Mcp-Session-Id)
    prefetched: Any = None  # (stream id, events) the guard already read from the store
    cursor_session: str | None = None  # the session the cursor was issued in, if known


def from_scope(
    scope: Any, transport: str, last_event_id: str, session_id: str | None
) -> ResumeRequest:
    server = scope.get("server") if isinstance(scope, dict) else None
    address, port = ("", None)
    if isinstance(server, (tuple, list)) and len(server) >= 1:
        address = str(server[0])
        port = server[1] if len(server) > 1 and isinstance(server[1], int) else None
    return ResumeRequest(transport, address, port, last_event_id, session_id)


def header(scope: Any, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class ServerObserver:
    """Counts resume requests by outcome and writes the gap events."""

    def __init__(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        logger_provider: Any | None = None,
        settings: config.Settings | None = None,
        guard: str = "off",
    ) -> None:
        self.settings = settings or config.load()
        self.guard = guard
        self.enabled = True
        # The client side's session-id policy (hash / raw / omit), the same
        # code, with a key of its own.
        redaction = Redaction(self.settings)
        self.session_attribute = redaction.session_attribute
        self.scrub = redaction.scrub
        meter = metrics.get_meter(
            sc.INSTRUMENTATION_NAME, __version__, meter_provider, schema_url=sc.SCHEMA_URL
        )
        self.meter = meter  # the deliveries' counters are made on it (delivery.py)
        self._requests = meter.create_counter(*sc.SERVER_REQUESTS)
        self._replayed = meter.create_histogram(*sc.SERVER_REPLAYED_EVENTS)
        self._logger = get_logger(
            sc.INSTRUMENTATION_NAME,
            __version__,
            logger_provider=logger_provider,
            schema_url=sc.SCHEMA_URL,
        )
        self._log_budget = LogBudget()
        self._servers_seen: set[tuple[str, str, int | None]] = set()
        self._issued: weakref.WeakKeyDictionary[Any, OrderedDict[str, str | None]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    @property
    def rejecting(self) -> bool:
        return self.enabled and self.guard == "reject"

    # ------------------------------------------------------ cursors and sessions

    def issued(self, store: Any, event_id: Any, session_id: str | None) -> None:
        """``store`` minted ``event_id`` on a stream of ``session_id``."""
        if not isinstance(event_id, str):
            return
        with self._lock:
            try:
                ids = self._issued.get(store)
                if ids is None:
                    ids = self._issued[store] = OrderedDict()
            except TypeError:  # a store that takes no weak reference: not tracked
                return
            ids[event_id] = session_id
            if len(ids) > MAX_ISSUED_PER_STORE:
                ids.popitem(last=False)

    def cursor_session(self, store: Any, event_id: str) -> tuple[bool, str | None]:
        """(known, session): whether the observer saw ``store`` issue the id,
        and in which session."""
        with self._lock:
            try:
                ids = self._issued.get(store)
            except TypeError:
                return False, None
            if ids is None or event_id not in ids:
                return False, None
            return True, ids[event_id]

    # ------------------------------------------------------ telemetry out

    def server_seen(self, transport: str, address: str, port: int | None) -> None:
        """Start every outcome's series of a server at 0 (Prometheus'
        ``increase()`` cannot see a series born at 1)."""
        key = (transport, address, port)
        if key in self._servers_seen or len(self._servers_seen) >= MAX_ZERO_SERIES_SERVERS:
            return
        self._servers_seen.add(key)
        base = self._base(transport, address, port)
        for outcome in sc.SERVER_OUTCOMES:
            if outcome == sc.SERVER_REJECTED_BY_GUARD:
                for refused in sc.SERVER_GUARDED:
                    self._requests.add(
                        0, {**base, sc.RESUMPTION_OUTCOME: outcome, sc.GAP_KIND: refused}
                    )
            else:
                self._requests.add(0, {**base, sc.RESUMPTION_OUTCOME: outcome})

    @staticmethod
    def _base(transport: str, address: str, port: int | None) -> dict[str, Any]:
        base: dict[str, Any] = {sc.MCP_TRANSPORT: transport, sc.SERVER_ADDRESS: address}
        if port is not None:
            base[sc.SERVER_PORT] = port
        return base

    def record(
        self,
        request: ResumeRequest,
        outcome: str,
        *,
        replayed: int | None = None,
        refused: str | None = None,
        cursor_session: str | None = None,
    ) -> None:
        """One resume request's outcome.  ``refused``: what the guard rejected
        (outcome ``rejected_by_guard``); ``replayed``: events the store sent."""
        if not self.enabled:
            return
        self.server_seen(request.transport, request.address, request.port)
        base = self._base(request.transport, request.address, request.port)
        attributes = {**base, sc.RESUMPTION_OUTCOME: outcome}
        if refused is not None:
            attributes[sc.GAP_KIND] = refused
        self._requests.add(1, attributes)
        if replayed is not None:
            self._replayed.record(
                replayed, {sc.RESUMPTION_OUTCOME: outcome, sc.MCP_TRANSPORT: request.transport}
            )
        kind = refused if outcome == sc.SERVER_REJECTED_BY_GUARD else outcome
        if kind in sc.SERVER_GAP_KINDS:
            self._gap(request, kind, base, cursor_session, rejected=refused is not None)

    def _gap(
        self,
        request: ResumeRequest,
        kind: str,
        base: dict[str, Any],
        cursor_session: str | None,
        *,
        rejected: bool,
    ) -> None:
        sessions = (request.session_id, cursor_session)
        cursor = bounded_id(self.scrub(request.last_event_id, sessions))
        if kind == sc.SERVER_UNKNOWN_CURSOR:
            expected = f"the events after {cursor}"
            observed = "the store knows no such event id"
            message = (
                f"resume from {cursor} cannot be honoured: the event store does not know "
                "that id, so the events after it are lost"
            )
        else:
            expected = self.session_attribute(cursor_session) or "<session>"
            observed = self.session_attribute(request.session_id) or "<session>"
            message = (
                f"resume from {cursor} was issued in another session "
                f"({expected}) than the one it arrived in ({observed})"
            )
        message += (
            "; the guard rejected it" if rejected
            else "; answered 200 as if resumed (OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD=reject "
            "refuses it)"
        )
        attributes: dict[str, Any] = {
            sc.GAP_KIND: kind,
            sc.GAP_EXPECTED: expected,
            sc.GAP_OBSERVED: observed,
            sc.RESUMPTION_LAST_EVENT_ID: cursor,
            **base,
        }
        current = self.session_attribute(request.session_id)
        if current is not None:
            attributes[sc.MCP_SESSION_ID] = current
        previous = self.session_attribute(cursor_session)
        if previous is not None and kind == sc.SERVER_OTHER_SESSION:
            attributes[sc.RESUMPTION_PREVIOUS_SESSION_ID] = previous
        span = trace.get_current_span()  # the HTTP server span, if the host has one
        if span.is_recording():
            span.add_event(sc.GAP_EVENT_NAME, attributes)
        if not self._log_budget.take((kind, f"{request.address}:{request.port}")):
            return
        self._logger.emit(
            event_name=sc.GAP_EVENT_NAME,
            body=message,
            attributes=attributes,
            context=trace.set_span_in_context(span) if span.is_recording() else None,
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
        )
