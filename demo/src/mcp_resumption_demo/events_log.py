# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The ground truth of :mod:`events_server`: what it published, handed out and skipped.

The demo's events rows and the tests compare what the plugin reports
against this record, never against the product itself.  Offsets are the server's internal
positions (1, 2, ... per event type and epoch); the wire never shows them.
Every list is appended to from the server's thread under one lock; read it
through the methods, which copy.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Published:
    event_id: str
    type: str
    offset: int
    epoch: str
    timestamp: str


@dataclass
class Exchange:
    """One JSON-RPC request the server answered (poll, stream, subscribe...),
    or one webhook subscription's deliveries (``method == "webhook"``)."""

    seq: int
    method: str
    request_id: object
    type: str | None = None
    cursor_in: str | None = None
    cursor_in_offset: int | None = None  # None: no cursor, or one the server cannot place
    start_offset: int | None = None  # the first offset this exchange could deliver
    truncated: bool = False
    event_ids: list[str] = field(default_factory=list)
    cursors_out: list[tuple[str, str | None]] = field(default_factory=list)  # (where, cursor)
    error_code: int | None = None
    ended: str = "open"  # open | answered | completed | client_closed | cut | terminated | error
    last_sent_at: float | None = None  # epoch seconds: a push stream's last notification sent


@dataclass(frozen=True)
class Truncation:
    seq: int
    request_id: object
    type: str
    cursor_offset: int | None  # the offset the client's cursor named (None: unknown epoch)
    resumed_at: int  # the first offset delivered after the jump
    skipped_offsets: tuple[int, int] | None  # inclusive span, None when nothing was known
    skipped_event_ids: tuple[str, ...]
    reason: str  # retention | max_age | epoch | stream_behind


class EventsLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._published: list[Published] = []
        self._exchanges: list[Exchange] = []
        self._truncations: list[Truncation] = []
        self._cursors_received: list[tuple[int, str | None]] = []
        self._webhook_posts: list[dict] = []

    # -- writers (the server) -------------------------------------------------
    def published(self, item: Published) -> None:
        with self._lock:
            self._published.append(item)

    def open(self, method: str, request_id: object, **fields: object) -> Exchange:
        with self._lock:
            exchange = Exchange(len(self._exchanges), method, request_id, **fields)
            self._exchanges.append(exchange)
            if "cursor_in" in fields:
                self._cursors_received.append((exchange.seq, fields["cursor_in"]))  # type: ignore[arg-type]
            return exchange

    def update(self, exchange: Exchange, **fields: object) -> None:
        with self._lock:
            for key, value in fields.items():
                setattr(exchange, key, value)

    def delivered(self, exchange: Exchange, event_id: str) -> None:
        with self._lock:
            exchange.event_ids.append(event_id)

    def sent(self, exchange: Exchange, at: float) -> None:
        with self._lock:
            exchange.last_sent_at = at

    def cursor_out(self, exchange: Exchange, where: str, cursor: str | None) -> None:
        with self._lock:
            exchange.cursors_out.append((where, cursor))

    def truncation(self, item: Truncation) -> None:
        with self._lock:
            self._truncations.append(item)

    def webhook_post(self, record: dict) -> None:
        with self._lock:
            self._webhook_posts.append(record)

    # -- readers (the tests) --------------------------------------------------
    def published_events(self, type: str | None = None) -> list[Published]:
        with self._lock:
            return [p for p in self._published if type is None or p.type == type]

    def exchanges(self, method: str | None = None) -> list[Exchange]:
        with self._lock:
            return [_copy(e) for e in self._exchanges if method is None or e.method == method]

    def exchange(self, request_id: object, method: str | None = None) -> Exchange:
        """The latest exchange with this JSON-RPC id (ids may repeat across clients)."""
        matches = [e for e in self.exchanges(method) if e.request_id == request_id]
        if not matches:
            raise KeyError(request_id)
        return matches[-1]

    def delivered_ids(self, request_id: object | None = None) -> list[str]:
        """Event ids delivered, in order: to one request id, or to every exchange."""
        return [
            i
            for e in self.exchanges()
            if request_id is None or e.request_id == request_id
            for i in e.event_ids
        ]

    def truncations(self) -> list[Truncation]:
        with self._lock:
            return list(self._truncations)

    def skipped_event_ids(self) -> list[str]:
        return [i for t in self.truncations() for i in t.skipped_event_ids]

    def cursors_handed_out(self) -> list[tuple[object, str, str | None]]:
        """(request id, where, cursor) for every cursor the server put on the wire."""
        return [(e.request_id, w, c) for e in self.exchanges() for w, c in e.cursors_out]

    def cursors_received(self) -> list[tuple[object, str | None]]:
        with self._lock:
            return [(self._exchanges[s].request_id, c) for s, c in self._cursors_received]

    def snapshot(self) -> dict:
        """The whole record as JSON-ready data (the admin endpoint's ``/admin/log``)."""
        return {
            "published": [p.__dict__ for p in self.published_events()],
            "exchanges": [e.__dict__ for e in self.exchanges()],
            "truncations": [t.__dict__ for t in self.truncations()],
            "cursors_received": self.cursors_received(),
            "webhook_posts": self.webhook_posts(),
        }

    def webhook_posts(self) -> list[dict]:
        with self._lock:
            return [dict(p) for p in self._webhook_posts]


def _copy(exchange: Exchange) -> Exchange:
    return Exchange(
        **{
            **exchange.__dict__,
            "event_ids": list(exchange.event_ids),
            "cursors_out": list(exchange.cursors_out),
        }
    )
