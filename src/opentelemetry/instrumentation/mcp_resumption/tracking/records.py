# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What is kept about one stream and one session: their records.

Pure: standard library only, and not thread-safe on their own (the tracker
changes them under its lock).

* ``Stream``: one SSE response body, open, fed, then finished.  A finished
  stream's record is this same object after ``Stream.finish``: its last
  received and consumed ids (raw, as ``bounded_id`` keeps them), the
  digests of their JSON meaning where an inclusive server may send them
  again, its lineage and whether the server closed it to poll; nothing of
  the events' data.
* ``Session``: what the streams of one session share: the seen window
  (packed, see ``seen_window``), the requests in flight and their
  operations, the request ids sent.
* ``Event``: one SSE event as the rules see it; ``Step``: what one
  observation produced, and ``NOTHING``, what most produce.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..rules.continuity import Gap, Verdict
from ..rules.fates import Broken, Decided
from ..rules.jsonrpc import canonical_digest
from ..rules.resume_check import ResumeCheck
from ..rules.subscriptions import LostSubscription
from .seen_window import SeenWindow

__all__ = [
    "MAX_KEPT_ID_BYTES", "NOTHING", "SSE", "STREAMABLE_HTTP", "Event", "Session", "Step",
    "Stream", "bounded_id",
]

SSE = "sse"
STREAMABLE_HTTP = "streamable-http"
# Event ids (and session ids) longer than this, in UTF-8 bytes, are kept as a
# digest of the whole id: equal ids stay equal (and opaque), a server cannot
# make each kept id megabytes long, and no part of the id is kept raw, so no
# part of a session id it embeds can escape the scrub of exported text.
MAX_KEPT_ID_BYTES = 128
# Fated request keys a session remembers (Session.fated): a resume holds its
# lineage's few pending requests, so the newest few hundred cover it.
MAX_FATED = 256


def bounded_id(event_id: str | None) -> str | None:
    """``event_id`` as it is kept: itself, or a digest if over the bound."""
    # len() in characters bounds the bytes from below (at most 4 each): most
    # ids never pay for an encode.
    if not isinstance(event_id, str) or len(event_id) <= MAX_KEPT_ID_BYTES // 4:
        return event_id
    encoded = event_id.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_KEPT_ID_BYTES:
        return event_id
    return "sha256:" + hashlib.sha256(encoded).hexdigest()[:32]


class Event(NamedTuple):
    """One SSE event as the rules see it, built by the SSE patch (which
    alone knows what the parser meant)."""

    id: str | None  # None: no ``id:`` line of its own
    data: str  # "" for a marker (a priming event, a heartbeat with an id)
    type: str
    retry: int | None  # ms, from a ``retry:`` line


class Session:
    """What the rules need of one session, shared by its streams."""

    __slots__ = (
        "fated",
        "history_lost",
        "holders",
        "ledger_unknown",
        "ops",
        "pending",
        "seen_digests",
        "seen_ids",
        "sent",
        "server",
        "session_id",
        "terminated",
        "window",
    )

    def __init__(self, server: str, session_id: str | None, history_lost: bool = False) -> None:
        self.server = server
        self.session_id = session_id
        # The client ended the session (HTTP DELETE): the server closing its
        # streams then is the client's doing, not a poll.
        self.terminated = False
        # The seen window, packed (see SeenWindow, the view the rules read).
        self.seen_ids: bytes | tuple[str, ...] | None = None
        self.seen_digests = b""
        # The view a resume of this session holds while it is read (it keeps
        # the window unpacked); None otherwise, so nothing unpacked is kept.
        self.window: SeenWindow | None = None
        # request key -> (method, lineage of the stream its response must come
        # on; None where any stream of the session may carry it, as in legacy
        # SSE); None until the first request, as most sessions hold few
        self.pending: dict[str, tuple[str, int | None]] | None = None
        # request key -> (method, the caller's record of the request): the
        # operations awaiting their answer or fate, to time them; None while none
        self.ops: dict[str, tuple[str, Any]] | None = None
        # request key -> key of the resumed stream that ended holding it: its
        # lineage's deadline may orphan it only while no later stream took it
        self.holders: dict[str, int] | None = None
        # request keys sent, oldest first, searched only at a resume: a tuple
        # while few (smaller than a list of one, the common case), then a list
        self.sent: tuple[str, ...] | list[str] | None = None
        # Requests were sent that the ledger does not know: it forgot the
        # oldest, or a body was not read (too large, streamed, not JSON).
        self.ledger_unknown = False
        # request keys whose broken request got its fate, the newest
        # MAX_FATED: a resume that still held one when it was decided (the
        # client closed the session, the window passed) must not break it
        # anew at its end.  None until the first fate.
        self.fated: dict[str, None] | None = None
        # A stream of this session was dropped (or the session is a new record
        # for a key whose older one may have been): its cursors can be gone.
        self.history_lost = history_lost

    @property
    def seen(self) -> SeenWindow:
        window = self.window
        return window if window is not None else SeenWindow(self)

    def sent_here(self, request_key: str) -> bool:
        # A ledger that does not know every id sent cannot prove a response foreign.
        return self.ledger_unknown or (self.sent is not None and request_key in self.sent)

    def answered(self, request_keys: Iterable[str]) -> None:
        pending = self.pending
        if pending:
            holders = self.holders
            for key in request_keys:
                pending.pop(key, None)
                if holders:
                    holders.pop(key, None)
            if not pending:
                self.pending = None  # an emptied dict keeps its table
                self.holders = None

    def settled(self, request_key: str) -> None:
        """``request_key``'s broken request got its one fate."""
        self.answered((request_key,))
        fated = self.fated
        if fated is None:
            fated = self.fated = {}
        fated[request_key] = None
        if len(fated) > MAX_FATED:
            del fated[next(iter(fated))]

    def forget_pending(self, lineage: int) -> None:
        """An event of ``lineage`` may have answered any of its requests, but
        could not be read: none of them can be proven orphaned."""
        pending = self.pending
        if pending:
            for key, (_, owner) in list(pending.items()):
                if owner is None or owner == lineage:
                    del pending[key]
            if not pending:
                self.pending = None


class Stream:
    """One SSE response body; a resumed one continues its cursor's lineage.

    Event ids are kept as the raw strings the server sent and parsed only
    at a resume: the per-event path does no parsing.  ``taken`` says the
    application asked for the event after ``last_received``; the tracker
    folds it into ``last_consumed`` under its lock (``settle``),
    so that marking it costs the reader no lock.
    """

    __slots__ = (
        "carries",
        "check",
        "consumed_data",
        "continued",
        "dirty",
        "ended",
        "feed",
        "indexed",
        "key",
        "last_consumed",
        "last_data",
        "last_received",
        "lineage",
        "meanings",
        "path",
        "primed",
        "request_body",
        "resumed_again",
        "retry_ms",
        "server",
        "server_closed",
        "session",
        "taken",
        "transport",
        "unconsumed_responses",
    )

    def __init__(
        self, key: int, server: str, transport: str, session: Session, path: str | None = None
    ) -> None:
        self.key = key
        self.server = server
        self.path = path  # the URL path: the scope of a sessionless stream's ids
        self.transport = transport
        self.session = session
        self.lineage = key
        self.last_received: str | None = None
        self.last_consumed: str | None = None
        self.taken = False
        # The data of the last received and last consumed events while the
        # stream is read (references, not copies); once it ended, under the
        # inclusive contract, the digests of their JSON meaning by id: what
        # a server may send again in other bytes.
        self.last_data: str | None = None
        self.consumed_data: str | None = None
        self.meanings: dict[str, int | None] | None = None
        self.unconsumed_responses: tuple[str, ...] = ()
        self.check: ResumeCheck | None = None
        self.continued: tuple[Stream, ...] = ()
        self.carries: tuple[str, ...] = ()
        # The body of the POST whose answers it carries (a reference, until
        # the stream ends): what a re-issue of a request it breaks is
        # compared with.
        self.request_body: bytes | None = None
        self.ended = False
        # Polling (2025-11-25): the lineage carried a priming event (an id and
        # no data) or a ``retry:`` field, so a clean end of its body is the
        # server closing it on purpose; the retry it asked for, in ms.
        self.primed = False
        self.retry_ms: int | None = None
        self.server_closed = False
        # A later stream resumed this one's cursor: its lineage goes on there.
        self.resumed_again = False
        # Waiting in CursorIndex.dirty to have its cursors indexed; the ids it
        # is indexed under now.
        self.dirty = False
        self.indexed: str | tuple[str, ...] = ()
        # The SSE patch's record of the events it did not report one by one
        # (``patches.sse.Feed``), while the stream is read; folded in under
        # the lock before anything reads the stream's state.
        self.feed: Any = None

    def take(self) -> None:
        """The application took the stream's last received event."""
        self.taken = False
        if self.unconsumed_responses:
            self.session.answered(self.unconsumed_responses)
            self.unconsumed_responses = ()
        if self.last_received is not None:
            self.last_consumed = self.last_received
            self.consumed_data = self.last_data

    def settle(self) -> None:
        """Fold a ``taken`` mark into the stream's consumed state."""
        if self.taken:
            self.take()

    def retry(self, retry_ms: int) -> None:
        """The stream carried ``retry:``: the server polls (and how often)."""
        if isinstance(retry_ms, int) and retry_ms >= 0:
            self.primed = True
            self.retry_ms = retry_ms

    def finish(self, inclusive: bool) -> None:
        """The stream will deliver no more events: keep of its last event's
        data only what a resume may compare (``inclusive``: the servers send
        the cursor event again, so the digests of its JSON meaning)."""
        self.ended = True
        received, consumed = self.last_data, self.consumed_data
        self.last_data = self.consumed_data = None
        if inclusive and (received or consumed):
            # Only an inclusive server sends the cursor event again.
            meanings: dict[str, int | None] = {}
            if consumed and self.last_consumed is not None:
                meanings[self.last_consumed] = canonical_digest(consumed)
            if received and self.last_received is not None:
                meanings[self.last_received] = canonical_digest(received)
            self.meanings = meanings


@dataclass(frozen=True)
class Step:
    """What one observation produced: gaps newly found, the verdict if this
    observation decided it (at the first decisive fact), and the attempt's
    one final verdict, every gap of the attempt in it, if it closed it."""

    gaps: tuple[Gap, ...] = ()
    verdict: Verdict | None = None
    # Requests still pending when a resumed stream ended, handed back to its
    # lineage: the caller ends the lineage (``Tracker.lineage_ended``) if the
    # client does not resume it.
    held: bool = False
    final: Verdict | None = None
    # Broken requests newly recorded (the caller tags each with its record
    # of the break), fates decided, and whether a reissue window started.
    broke: tuple[Broken, ...] = ()
    fates: tuple[Decided, ...] = ()
    window: bool = False
    # The stream broke with requests in flight and nothing resumed it.
    not_resumable: bool = False
    # Attempts of other streams that these fates closed: (stream, final).
    closed: tuple[tuple[Stream, Verdict], ...] = ()
    # Subscriptions the stream's end lost, each with its gap (the caller tags
    # each with its record of the stream).
    lost_subscriptions: tuple[tuple[LostSubscription, Gap | None], ...] = ()


NOTHING = Step()  # what most observations produce; compared by identity
