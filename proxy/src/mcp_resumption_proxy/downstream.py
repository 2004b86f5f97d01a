# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The downstream leg: what the proxy can say of each resume a client makes
to it, reported as the server half reports a server's resumes.

The proxy remembers, bounded, the event ids it forwarded and the session each
was forwarded in.  A client's ``Last-Event-ID`` is then one it got from this
proxy in this session (``replayed`` once the resume was forwarded and not
refused: handed on, the upstream leg judges what the server replays), one of
another session (``other_session``), or one the proxy never forwarded
(``UNCARRIED``: a restarted proxy, a cursor from elsewhere, a made-up one;
counted apart by the app, as nothing this proxy carried can be lost by it,
and anyone can send one).

With shared state (``shared.SharedCursors``) "this proxy" is the fleet: the
ids forwarded here are written at each response's end, and a cursor this
instance never forwarded is looked up (``prefetch``, once per resume) before
it is judged.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

from opentelemetry.instrumentation.mcp_resumption import config
from opentelemetry.instrumentation.mcp_resumption.server.observer import (
    ResumeRequest,
    ServerObserver,
)
from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc

from . import legs

# As the server half remembers per store: enough for every live stream's
# recent cursors, a fixed cost for an endless one.
MAX_REMEMBERED = 65_536
# Ids waiting for the next write to the fleet, and the fleet's ids looked up.
MAX_UNSAVED = 4096
_UNSET = object()
_UNANSWERED = object()
# What judge_resume says of a cursor no stream through the proxy carried.
UNCARRIED = "uncarried_cursor"


class ResponseIds:
    """The ids one upstream response's events were forwarded with (the last
    ones, bounded), and the last id the proxy read on it: what its client
    half's record of that stream is keyed by in the shared state."""

    __slots__ = ("ids", "last", "session")

    def __init__(self, session: str | None) -> None:
        self.session = session
        self.ids: deque[str] = deque(maxlen=MAX_UNSAVED)
        self.last: str | None = None


class DownstreamView:
    """Cursors the proxy forwarded, and each client resume judged against them."""

    def __init__(self, observer: ServerObserver | None, shared: Any = None) -> None:
        self.observer = observer
        self._ids: OrderedDict[str, str | None] = OrderedDict()
        self._lock = threading.Lock()
        # The fleet's ids (``shared.SharedCursors``), None: this process only.
        self.shared = shared
        # Forwarded here since the last write to the fleet (bounded).
        self._unsaved: OrderedDict[str, str | None] = OrderedDict()
        # Cursors the fleet forwarded, looked up here: cursor -> session hash.
        self._fleet: OrderedDict[str, str] = OrderedDict()
        # Cursors whose lookup Redis did not answer (until judged).
        self._unsure: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def for_leg(cls, shared: Any = None, **providers: Any) -> DownstreamView:
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
        return cls(observer, shared)

    def response(self, session_id: str | None) -> ResponseIds | None:
        """What one upstream response forwards, for the fleet (None: no fleet)."""
        return None if self.shared is None else ResponseIds(session_id)

    def forwarded(
        self, event_id: str, session_id: str | None, response: ResponseIds | None = None
    ) -> None:
        """An event with ``event_id`` crossed the proxy to a client of
        ``session_id``, on ``response`` (None: a relay's)."""
        ids = self._ids
        with self._lock:
            if event_id in ids:
                ids.move_to_end(event_id)
            ids[event_id] = session_id
            if len(ids) > MAX_REMEMBERED:
                ids.popitem(last=False)
            if response is not None:
                response.ids.append(event_id)
            elif self.shared is not None:
                unsaved = self._unsaved
                unsaved[event_id] = session_id
                if len(unsaved) > MAX_UNSAVED:
                    unsaved.popitem(last=False)

    def save(self, response: ResponseIds | None = None) -> None:
        """A response ended: the ids it forwarded (and the relays' since the
        last write) go to the fleet, queued for the store's writer thread."""
        if self.shared is None:
            return
        if response is not None and response.ids:
            self.shared.save([(i, response.session) for i in response.ids], response.last)
        with self._lock:
            if not self._unsaved:
                return
            forwarded = list(self._unsaved.items())
            self._unsaved.clear()
        self.shared.save(forwarded)

    def prefetch(self, cursor: str) -> None:
        """Before a resume from ``cursor`` is judged: a cursor this instance
        never forwarded is looked up in the fleet's (one bounded read; made
        off the event loop by the caller)."""
        if self.shared is None:
            return
        with self._lock:
            if cursor in self._ids or cursor in self._fleet:
                return
        found = self._fleet_lookup(cursor)
        if found is None:
            return
        if found is _UNANSWERED:
            # Redis did not answer: the fleet may have carried it.  Judged as
            # a cursor unknown here (as before shared state), not as one no
            # stream carried.
            with self._lock:
                self._unsure[cursor] = None
                if len(self._unsure) > MAX_UNSAVED:
                    self._unsure.popitem(last=False)
            return
        session_hash, last = found
        if last is not None:
            # The instance that forwarded it read its stream further than
            # the client got (up to ``last``): its client half's record of
            # that stream is found under ``last``, as of this cursor.
            self.shared.store.alias(cursor, last)
        with self._lock:
            self._fleet[cursor] = session_hash
            if len(self._fleet) > MAX_UNSAVED:
                self._fleet.popitem(last=False)

    def _fleet_lookup(self, cursor: str) -> Any:
        """``SharedCursors.session_of``, telling a cursor the fleet never
        forwarded (None) from a Redis that did not answer (``_UNANSWERED``)."""
        shared = self.shared
        key = shared.store.key("d", shared.upstream, cursor)
        answer = shared.store.call(lambda client: (client.get(key),))
        if answer is None:
            return _UNANSWERED
        found = answer[0]
        if found is None:
            return None
        text = found.decode("ascii", "replace") if isinstance(found, bytes) else str(found)
        session_hash, _, last = text.partition("|")
        return session_hash, (last or None)

    def judge(self, cursor: str, session_id: str | None) -> str:
        """The downstream outcome of a resume from ``cursor`` in ``session_id``."""
        with self._lock:
            known = self._ids.get(cursor, _UNSET)
            fleet = self._fleet.get(cursor) if known is _UNSET else None
        if known is _UNSET and fleet is not None:
            # Forwarded by another instance: its session by the keyed hash.
            if fleet != self.shared.session_hash(session_id):
                return sc.SERVER_OTHER_SESSION
            return sc.SERVER_REPLAYED
        if known is _UNSET:
            return sc.SERVER_UNKNOWN_CURSOR
        if known != session_id:
            return sc.SERVER_OTHER_SESSION
        return sc.SERVER_REPLAYED

    def judge_resume(
        self, cursor: str, session_id: str | None, address: str, port: int | None
    ) -> str:
        """A client's resume judged: ``rejected_by_guard`` (reported; answer
        410), ``other_session`` (reported), or, reported by the caller once
        it knows what became of the resume, ``replayed`` (``record`` when the
        resume was forwarded and answered) and ``UNCARRIED`` (a cursor no
        stream through this proxy, or the fleet, carried: counted apart,
        never as a gap: anyone can send a made-up ``Last-Event-ID``)."""
        outcome = self.judge(cursor, session_id)
        if self.observer is None:
            return UNCARRIED if outcome == sc.SERVER_UNKNOWN_CURSOR else outcome
        if self.observer.rejecting and outcome in sc.SERVER_GAP_KINDS:
            self.record(outcome, cursor, session_id, address, port, guard=True)
            return sc.SERVER_REJECTED_BY_GUARD
        if outcome == sc.SERVER_UNKNOWN_CURSOR:
            with self._lock:
                unsure = self._unsure.pop(cursor, _UNSET) is not _UNSET
            if not unsure:
                return UNCARRIED
            self.record(outcome, cursor, session_id, address, port)
        if outcome == sc.SERVER_OTHER_SESSION:
            self.record(outcome, cursor, session_id, address, port)
        return outcome

    def record(
        self,
        outcome: str,
        cursor: str,
        session_id: str | None,
        address: str,
        port: int | None,
        *,
        replayed: int | None = None,
        guard: bool = False,
    ) -> None:
        """Report one resume's ``outcome`` on the ``client_proxy`` leg."""
        if self.observer is None:
            return
        with self._lock:
            previous = self._ids.get(cursor)
        request = ResumeRequest(sc.TRANSPORT_STREAMABLE_HTTP, address, port, cursor, session_id)
        cursor_session = previous if outcome == sc.SERVER_OTHER_SESSION else None
        if guard:
            self.observer.record(request, sc.SERVER_REJECTED_BY_GUARD, refused=outcome,
                                 cursor_session=cursor_session)
            return
        self.observer.record(request, outcome, replayed=replayed, cursor_session=cursor_session)
