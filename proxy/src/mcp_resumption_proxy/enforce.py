# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Enforce mode: a loss on the upstream leg becomes what every client
understands, whatever its SDK.

* Each request a broken upstream stream was to answer gets a JSON-RPC error
  response (a message every MCP client matches to its pending request and
  fails it with at once), naming what was lost.
* A session the upstream replaced is answered ``404`` on the client's next
  request in it, which tells a client to re-initialize (the specification's
  rule for an unknown session).

The proxy keeps, per upstream stream, the requests it was to answer and not
yet answered (``Pending``), found again from a client's ``Last-Event-ID``
through the ids the stream forwarded; bounded like the downstream view.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

MAX_STREAMS = 65_536
MAX_SESSIONS = 4096
# What an enforced error answers with: JSON-RPC's implementation-defined
# server error range, as the 502 of an unreachable upstream.
GAP_ERROR = -32000


class Pending:
    """The requests one upstream stream was to answer, until answered."""

    __slots__ = ("ids", "resumable")

    def __init__(self, ids: list[Any]) -> None:
        self.ids: dict[str, Any] = {json.dumps(i): i for i in ids}
        self.resumable = False  # the stream forwarded an event id a client can resume from

    def answered(self, data: str) -> None:
        if not self.ids or '"id"' not in data:
            return
        try:
            message = json.loads(data)
        except ValueError:
            return
        for item in message if isinstance(message, list) else (message,):
            if isinstance(item, dict) and "method" not in item and (
                "result" in item or "error" in item
            ):
                self.ids.pop(json.dumps(item.get("id")), None)


def request_ids(body: bytes) -> list[Any]:
    """The ids of the JSON-RPC requests (not notifications) in a POST body."""
    try:
        message = json.loads(body)
    except ValueError:
        return []
    found = []
    for item in message if isinstance(message, list) else (message,):
        if isinstance(item, dict) and isinstance(item.get("method"), str) and "id" in item:
            request_id = item["id"]
            if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
                found.append(request_id)
    return found


def error_events(pending: Pending, message: str) -> bytes:
    """One SSE event per unanswered request: its JSON-RPC error."""
    out = []
    for request_id in pending.ids.values():
        error = {"jsonrpc": "2.0", "id": request_id,
                 "error": {"code": GAP_ERROR, "message": message}}
        out.append(b"event: message\ndata: " + json.dumps(error).encode() + b"\n\n")
    pending.ids.clear()
    return b"".join(out)


class Ledger:
    """Pending requests by the event ids their streams forwarded, and the
    sessions the upstream replaced."""

    def __init__(self) -> None:
        self._by_event: OrderedDict[str, Pending] = OrderedDict()
        self._changed: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def forwarded(self, event_id: str, pending: Pending) -> None:
        pending.resumable = True
        with self._lock:
            self._by_event[event_id] = pending
            if len(self._by_event) > MAX_STREAMS:
                self._by_event.popitem(last=False)

    def resumed(self, cursor: str) -> Pending:
        """What the stream that forwarded ``cursor`` still owes (a stream the
        proxy never saw owes nothing it knows of)."""
        with self._lock:
            found = self._by_event.get(cursor)
        return found if found is not None else Pending([])

    def session_changed(self, old: str) -> None:
        with self._lock:
            self._changed[old] = None
            if len(self._changed) > MAX_SESSIONS:
                self._changed.popitem(last=False)

    def is_changed(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._changed


def serialize(event: Any, previous_id: str | None) -> bytes:
    """One parsed SSE event as bytes (enforce mode forwards events only once
    the client half has let them through, so it writes them anew)."""
    lines = []
    if event.event and event.event != "message":
        lines.append(b"event: " + event.event.encode())
    if event.id and event.id != previous_id:
        lines.append(b"id: " + event.id.encode())
    if event.retry is not None:
        lines.append(b"retry: %d" % event.retry)
    lines.extend(b"data: " + line.encode() for line in event.data.split("\n"))
    return b"\n".join(lines) + b"\n\n"
