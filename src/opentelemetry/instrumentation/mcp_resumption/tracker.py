# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Bounded per-stream state for the continuity rules.

Pure: standard library only.  The tracker remembers, per stream and session,
what the rules need at a resume: the session each cursor was issued in, the
last received and last consumed event ids, a window of seen ids with a digest
of each event's data, and the ledger of JSON-RPC requests still in flight.

Memory is bounded: at most ``max_streams`` streams and as many sessions (the
least recently used is dropped and the drop counted), a fixed window of ids
and a fixed ledger per session.  Every public method but ``event_consumed``
(a flag) takes one lock, does a few dictionary operations and returns; no
I/O is done under the lock, so the tracker is safe to call from many threads
and from asyncio.  Most events never reach it one by one: a stream read
through a *feed* (``attach_feed``; the SSE patch keeps a ring of references
to its last events) is folded in, under the lock, whenever the tracker reads
that stream's state, so only the last events are ever looked at.  Ids are
parsed, and the index of cursors is brought up to date, when a stream opens,
which is when a client can present a cursor.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from . import continuity
from .continuity import (
    Cursor,
    EventId,
    Gap,
    ObservedEvent,
    ReplayContract,
    ResumeCheck,
    Verdict,
    corroborated,
    parse_declared,
    parse_event_id,
    reuses_id,
)
from .fates import Broken, BrokenLedger, Decided, Fate
from .forks import renew_after_fork
from .jsonrpc import (
    LISTEN,
    TOOLS_CALL,
    TOOLS_LIST,
    answer_errors,
    calls_in,
    cancelled_in,
    canonical_digest,
    is_message,
    responses_in,
    tool_hints_in,
)
from .subscriptions import LostSubscription, SubscriptionLedger

SEEN_WINDOW = 16  # event ids remembered per session, for id_reused
MAX_REQUESTS = 256  # in-flight JSON-RPC requests remembered per session
SENT_WINDOW = 512  # request ids remembered per session (at least), for foreign_replay
# A session that sent more keeps them in a list, trimmed by this many at a
# time: one copy per SENT_TRIM requests, not a copy of the window per request.
SENT_TRIM = 64
_SENT_AS_TUPLE = 16
# Servers whose tools/list hints are kept, and re-issues watched for a second
# answer of the first attempt (the oldest dropped first).
MAX_HINTED_SERVERS = 256
MAX_WATCHED_REISSUES = 1024
# The first revision whose servers MUST take a closed response stream for
# cancellation; before it a disconnect SHOULD NOT be (2025-11-25), so the
# first attempt of a re-issued call may run on.  Dates order as strings.
CANCELS_ON_DISCONNECT = "2026-07-28"
# error.type of an operation ended by its fate rather than by an answer
# (values of ours: the conventions have none for a call that broke).
FATE_ERRORS = {Fate.REISSUED: "reissued", Fate.LOST: "orphaned_request"}

SSE = "sse"
STREAMABLE_HTTP = "streamable-http"
# Event ids (and session ids) longer than this, in UTF-8 bytes, are kept as a
# digest of the whole id: equal ids stay equal (and opaque), a server cannot
# make each kept id megabytes long, and no part of the id is kept raw, so no
# part of a session id it embeds can escape the scrub of exported text.
MAX_KEPT_ID_BYTES = 128


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


class SeenWindow:
    """The last ``SEEN_WINDOW`` event ids of a session, as kept
    (:func:`bounded_id`), each with the digest of its data (None: a marker),
    oldest first: a mapping to the rules, over the session's packed record.
    The ids themselves, not their hashes: whether a session's id scheme
    counts is read from them (:func:`corroborated`).

    Packed, because it is most of what a session costs: the ids joined into
    one UTF-8 string (an SSE id never holds a NUL; a tuple if one does), the
    digests as machine words in bytes.  A dict of ids and ints was over half
    the bytes of a typical tracked stream.

    Never repacked per event.  An event remembered one by one on a window no
    resume holds (a stream's first event, an answer on a POST stream) is
    appended to the packed record as it is (:meth:`remember`: a few bytes
    operations, no unpack).  A view a resume holds (``Session.window``) keeps
    the window unpacked while the resume is read and packs it once, when the
    resume ends (:meth:`release`): a replay remembers one event per event.
    A fold (many events at once) unpacks and packs once for all."""

    __slots__ = ("_digests_of", "_dirty", "_ids_of", "_owner", "_unpacked_digests", "_unpacked_ids")

    def __init__(self, owner: Any = None) -> None:
        self._owner = owner if owner is not None else _Packed()
        # What this view unpacked, and from which packed objects (immutable,
        # replaced on every change): a view held by a resume's check reads
        # the window for every event and unpacks it once per change.
        self._ids_of: object = _NOTHING_YET
        self._digests_of: object = _NOTHING_YET
        self._unpacked_ids: list[str] = _NO_IDS  # replaced before any read
        self._unpacked_digests: array = _NO_DIGESTS
        # A held view changed since it last packed: its unpacked lists are
        # the window, the packed record is behind until release().
        self._dirty = False

    def _ids(self) -> list[str]:
        if self._dirty:
            return self._unpacked_ids
        ids = self._owner.seen_ids
        if ids is not self._ids_of:
            if ids is None:
                unpacked = []
            elif isinstance(ids, bytes):
                unpacked = ids.decode("utf-8", "surrogatepass").split(_SEPARATOR)
            else:
                unpacked = list(ids)
            self._ids_of, self._unpacked_ids = ids, unpacked
        return self._unpacked_ids

    def _digests(self) -> array:
        if self._dirty:
            return self._unpacked_digests
        packed = self._owner.seen_digests
        if packed is not self._digests_of:
            digests = array("q")
            digests.frombytes(packed)
            self._digests_of, self._unpacked_digests = packed, digests
        return self._unpacked_digests

    def _held(self) -> bool:
        return getattr(self._owner, "window", None) is self

    def _store(self, ids: list[str], digests: array) -> None:
        if self._held():  # packed once, at release()
            self._unpacked_ids, self._unpacked_digests = ids, digests
            self._dirty = True
            return
        self._pack(ids, digests)

    def _pack(self, ids: list[str], digests: array) -> None:
        owner = self._owner
        self._dirty = False
        if not ids:
            owner.seen_ids, owner.seen_digests = None, b""
            self._ids_of, self._digests_of = _NOTHING_YET, _NOTHING_YET
            return
        packed = _SEPARATOR.join(ids)
        # More separators than ids-1 means an id held one: keep a tuple.  In
        # UTF-8: a str of wide characters takes 4 bytes per character.
        owner.seen_ids = (
            packed.encode("utf-8", "surrogatepass")
            if packed.count(_SEPARATOR) == len(ids) - 1
            else tuple(ids)
        )
        owner.seen_digests = digests.tobytes()
        self._ids_of, self._unpacked_ids = owner.seen_ids, ids
        self._digests_of, self._unpacked_digests = owner.seen_digests, digests

    def release(self) -> None:
        """The view is no longer held: its changes go to the packed record."""
        if self._dirty:
            self._pack(self._unpacked_ids, self._unpacked_digests)

    def __len__(self) -> int:
        return len(self._ids())

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids())

    def __contains__(self, event_id: object) -> bool:
        if not self._dirty and type(event_id) is str:
            found = _packed_find(self._owner.seen_ids, event_id)
            if found is not None:
                return found
        return event_id in self._ids()

    def __getitem__(self, event_id: str) -> int | None:
        digest = self._digests()[self._ids().index(event_id)]  # ValueError: not a key
        return None if digest == _MARKER else digest

    def get(self, event_id: str, default: int | None = None) -> int | None:
        try:
            return self[event_id]
        except ValueError:
            return default

    def items(self) -> Iterator[tuple[str, int | None]]:
        for event_id, digest in zip(self._ids(), self._digests()):
            yield event_id, None if digest == _MARKER else digest

    def remember(self, event_id: str, digest: int | None) -> None:
        """``event_id`` to the newest end.  On a packed record, a new id is
        appended to it as it is (the oldest dropped past the window); an id
        already in the window, an id holding a NUL, or a held view take the
        general path (:meth:`remember_all`), with the same result."""
        owner = self._owner
        ids = owner.seen_ids
        if (
            not self._dirty
            and (ids is None or type(ids) is bytes)
            and type(event_id) is str
            and _SEPARATOR not in event_id
            and not self._held()
        ):
            raw = event_id.encode("utf-8", "surrogatepass")
            word = _WORD.pack(_MARKER if digest is None else digest)
            if ids is None:
                owner.seen_ids, owner.seen_digests = raw, word
                return
            if _SEP_BYTES + raw + _SEP_BYTES not in _SEP_BYTES + ids + _SEP_BYTES:
                ids += _SEP_BYTES + raw
                digests = owner.seen_digests + word
                if len(digests) > _WINDOW_BYTES:
                    ids = ids[ids.index(_SEP_BYTES) + 1 :]
                    digests = digests[_WORD.size :]
                owner.seen_ids, owner.seen_digests = ids, digests
                return
        self.remember_all(((event_id, digest),))

    def remember_all(self, entries: Iterable[tuple[str, int | None]]) -> None:
        """Each entry to the newest end, in order: unpacked once for all."""
        ids, digests = self._ids(), self._digests()
        for event_id, digest in entries:
            if event_id in ids:
                index = ids.index(event_id)  # to the newest end
                del ids[index]
                del digests[index]
            ids.append(event_id)
            digests.append(_MARKER if digest is None else digest)
        if len(ids) > SEEN_WINDOW:
            del ids[: len(ids) - SEEN_WINDOW]
            del digests[: len(digests) - SEEN_WINDOW]
        self._store(ids, digests)

    def merge(self, other: SeenWindow) -> None:
        self.remember_all(list(other.items()))


class _Packed:
    """A window's record when no session holds it."""

    __slots__ = ("seen_digests", "seen_ids")

    def __init__(self) -> None:
        self.seen_ids: bytes | tuple[str, ...] | None = None
        self.seen_digests = b""


_SEPARATOR = "\x00"
_SEP_BYTES = b"\x00"
_NOTHING_YET = object()
_NO_IDS: list[str] = []
_NO_DIGESTS = array("q")
# One digest of the packed record: a machine word, as array("q") stores it.
_WORD = struct.Struct("=q")
_WINDOW_BYTES = SEEN_WINDOW * _WORD.size


def _packed_find(ids: bytes | tuple[str, ...] | None, event_id: str) -> bool | None:
    """Whether ``event_id`` is in a packed record, without unpacking it; None
    where that takes the unpacked view (a tuple, or an id with a NUL)."""
    if ids is None:
        return False
    if type(ids) is not bytes or _SEPARATOR in event_id:
        return None
    framed = _SEP_BYTES + event_id.encode("utf-8", "surrogatepass") + _SEP_BYTES
    return framed in _SEP_BYTES + ids + _SEP_BYTES


def _ids(indexed: str | tuple[str, ...]) -> tuple[str, ...]:
    return (indexed,) if isinstance(indexed, str) else indexed


def _session_key(
    server: str, session_id: str | None, path: str | None
) -> tuple[str, str | None, str | None]:
    """Where a session is kept: sessionless streams share ids per URL path,
    not per origin."""
    return (server, session_id, None if session_id is not None else path)


# hash() never returns -1 (CPython reserves it for errors), so it can stand
# for "no digest" (a marker) in the packed window.
_MARKER = -1


class Session:
    """What the rules need of one session, shared by its streams."""

    __slots__ = (
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
    folds it into ``last_consumed`` under its lock (see ``Tracker._settle``),
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
        # Waiting in Tracker._dirty to have its cursors indexed; the ids it
        # is indexed under now.
        self.dirty = False
        self.indexed: str | tuple[str, ...] = ()
        # The SSE patch's record of the events it did not report one by one
        # (``patches.sse.Feed``), while the stream is read; folded in under
        # the lock before anything reads the stream's state.
        self.feed: Any = None


class _Reissue:
    """A re-issued call watched for both answers: its first attempt's (which
    a resumed stream may still bring) and the re-issue's."""

    __slots__ = ("answered", "broken", "indexes")

    def __init__(self, broken: Broken, indexes: tuple[tuple[int, str], tuple[int, str]]) -> None:
        self.broken = broken
        self.indexes = indexes  # (first attempt, re-issue) as Tracker._reissues keys them
        self.answered = [False, False]


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

class Tracker:
    def __init__(
        self,
        max_streams: int = 10_000,
        contract: ReplayContract = ReplayContract.EXCLUSIVE,
        event_id_pattern: object | None = None,
    ) -> None:
        self.max_streams = max(1, max_streams)
        self.contract = contract
        # A declared scheme (a compiled regex with a ``counter`` group)
        # replaces the inference from the ids' shape.
        self._parse: Callable[[str | None], EventId | None] = (
            parse_event_id
            if event_id_pattern is None
            else (lambda raw, pattern=event_id_pattern: parse_declared(raw, pattern))
        )
        self.evicted_streams = 0
        self.evicted_sessions = 0
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        # Plain dicts in LRU order, oldest first (an OrderedDict costs ~60
        # bytes more per entry): a use moves an entry to the end by deleting
        # and re-inserting it.  Dropping the oldest skips the holes deleted
        # entries leave at the front, fewer than a resize of the dict leaves.
        self._streams: dict[int, Stream] = {}
        self._sessions: dict[tuple[str, str | None, str | None], Session] = {}
        # event id -> the stream (of any server), or {key: stream} for several, whose
        # last received or consumed event it is, most recent last: the cursors
        # a client may present on reconnect.  Several when sessions count their
        # ids separately.  Brought up to date only where it is read (a new
        # stream, an eviction): per event, a stream is just marked dirty.
        self._cursors: dict[str, Stream | dict[int, Stream]] = {}
        self._dirty: list[Stream] = []
        # Streams being read through a feed: folded in before a cursor lookup.
        self._fed: dict[int, Stream] = {}
        # Broken requests awaiting their fate (see ``fates``).
        self.broken = BrokenLedger()
        # Lost subscriptions awaiting a re-listen (see ``subscriptions``).
        self.subscriptions = SubscriptionLedger()
        # server -> tool name -> declared safe to run twice, from the last
        # tools/list answers read from it.
        self.tool_hints: dict[str, dict[str, bool]] = {}
        # (id(session), request key) -> the re-issue it takes part in (the
        # first attempt's or the re-issue's key): both answered, it ran twice.
        self._reissues: dict[tuple[int, str], _Reissue] = {}
        # Re-issued calls proven to have run twice, and lost subscriptions
        # counted before their window (a full ledger), until the caller takes them.
        self._ran_twice: list[Broken] = []
        self._ran_over: list[LostSubscription] = []
        # Operations ended by an answer or a fate, until the caller takes them
        # (``take_operations``); a list its readers test without the lock.
        self.operations_done: list[tuple[str, str, Any, str | None]] = []
        renew_after_fork(self)

    def _after_fork(self) -> None:
        # A fork copies the lock as it is: held, if another thread was inside
        # the tracker at that moment, and then held for ever in the child.
        self._lock = threading.Lock()

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._streams)

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    # ---------------------------------------------------------- requests

    def request_sent(
        self,
        server: str,
        session_id: str | None,
        requests: Iterable[tuple[str, str]] | None,
        path: str | None = None,
        operation: Any = None,
    ) -> None:
        """JSON-RPC requests POSTed in a session (or sessionless, to ``path``);
        ``None``: a body that was not read, so the ledger no longer knows
        every request of the session.  ``operation``: the caller's record of
        the request, handed back when its answer or fate ends it."""
        with self._lock:
            self._sent(self._session(server, session_id, path), requests, operation)

    def _sent(
        self,
        session: Session,
        requests: Iterable[tuple[str, str]] | None,
        operation: Any = None,
    ) -> None:
        if requests is None:
            session.ledger_unknown = True
            return
        for key, method in requests:
            if method == LISTEN:
                if self.subscriptions:
                    self.subscriptions.listened(session.server)
            elif operation is not None:  # a subscription is no operation to time
                if session.ops is None:
                    session.ops = {}
                if len(session.ops) < MAX_REQUESTS:
                    session.ops[key] = (method, operation)
            if session.pending is None:
                session.pending = {}
            if len(session.pending) < MAX_REQUESTS:
                session.pending[key] = (method, None)
            sent = session.sent
            if sent is None:
                session.sent = (key,)
            elif type(sent) is tuple and len(sent) < _SENT_AS_TUPLE:
                session.sent = (*sent, key)
            else:
                if type(sent) is tuple:
                    sent = session.sent = list(sent)
                sent.append(key)
                if len(sent) > SENT_WINDOW + SENT_TRIM:
                    del sent[:SENT_TRIM]
                    session.ledger_unknown = True

    # ----------------------------------------------------------- streams

    def open_stream(
        self,
        server: str,
        transport: str,
        *,
        session_id: str | None = None,
        last_event_id: str | None = None,
        carries: Iterable[str] = (),
        request_session_id: str | None = None,
        path: str | None = None,
        body: bytes | None = None,
        sent: Iterable[tuple[str, str]] | None = (),
        operation: Any = None,
    ) -> Stream:
        """An SSE response is about to be read.  ``last_event_id`` makes it a
        resume; ``carries`` are request keys whose responses it will carry.
        ``session_id`` is the stream's session (the response's, else the
        request's); ``request_session_id``, the session the request named,
        is the one the client says its cursor belongs to (default: the
        stream's), and the cursor is looked up there.  ``path`` scopes the
        ids of a stream without a session: never a whole origin.  ``sent``:
        the requests POSTed with it, as ``request_sent`` takes them (one
        lock for both), with their ``operation``."""
        cursor = bounded_id(last_event_id) or None
        claimed = request_session_id if request_session_id is not None else session_id
        with self._lock:
            session = None
            if sent != ():
                session = self._session(server, session_id, path)
                self._sent(session, sent, operation)
            self._flush(fold=cursor is not None)
            previous = self._cursor_owner(server, cursor, claimed, path) if cursor else None
            if previous is not None and previous.session.session_id is not None:
                session = previous.session
            elif session is None:
                session = self._session(server, session_id, path)
            stream = Stream(next(self._keys), server, transport, session, path)
            self._admit(stream)
            stream.carries = tuple(carries)
            if stream.carries:
                stream.request_body = body
            pending = session.pending
            if pending:
                for key in stream.carries:
                    if key in pending:
                        pending[key] = (pending[key][0], stream.lineage)
            if cursor is not None:
                stream.check = self._begin_resume(stream, cursor, previous, claimed)
            return stream

    def _begin_resume(
        self,
        stream: Stream,
        cursor_raw: str,
        previous: Stream | None,
        request_session_id: str | None,
    ) -> ResumeCheck:
        cursor_id = self._parse(cursor_raw)
        if previous is None:
            # Evicted or never seen: the request's own session header is the
            # only binding left, and nothing else can be proven (not even the
            # id's order: no history shows its scheme counting).
            cursor = Cursor(EventId(cursor_raw), session_id=request_session_id)
            return ResumeCheck(cursor, self.contract)
        self._settle(previous)
        self._ended(previous)
        previous.resumed_again = True
        # Attempts of this lineage that ended holding its requests are over:
        # this one takes the requests over.  The caller reports them.
        continued = [previous] if previous.check is not None and previous.check.held else []
        for holder_key in set((previous.session.holders or {}).values()):
            holder = self._streams.get(holder_key)
            if holder is not None and holder is not previous and holder.lineage == previous.lineage:
                continued.append(holder)
        stream.continued = tuple(h for h in continued if self._lineage_over(h, []) is not None)
        stream.lineage = previous.lineage
        stream.primed = previous.primed
        stream.retry_ms = previous.retry_ms
        session = previous.session
        unconsumed = previous.last_received == cursor_raw and previous.last_consumed != cursor_raw
        cursor = Cursor(
            corroborated(cursor_id, session.seen),
            session_id=session.session_id,
            known=True,
            consumed=not unconsumed,
            digest=session.seen.get(cursor_raw),
            meaning=previous.meanings.get(cursor_raw) if previous.meanings else None,
            transport=previous.transport,
        )
        pending: dict[str, str] = {}
        if session.pending:
            for key, (method, lineage) in session.pending.items():
                if lineage is None or lineage == previous.lineage:
                    pending[key] = method
            session.answered(pending)  # they are the resume's to settle now
        carrier = self._parse(previous.last_received)
        unconsumed_responses = {
            key: (pending.pop(key, ""), carrier) for key in previous.unconsumed_responses
        }
        if session.window is None:  # kept unpacked while the resume is read
            session.window = SeenWindow(session)
        return ResumeCheck(
            cursor,
            self.contract,
            seen=session.seen,
            pending=pending,
            unconsumed_responses=unconsumed_responses,
            sent_by_session=session.sent_here,
            poll=previous.server_closed,
            watch=SEEN_WINDOW,
        )

    def resuming(
        self, server: str, last_event_id: str, session_id: str | None, path: str | None = None
    ) -> None:
        """A resume of this cursor is on its way: the lineage goes on, so
        its grace may not end it while the answer (or the SDK's next try)
        is awaited."""
        cursor = bounded_id(last_event_id) or None
        if cursor is None:
            return
        with self._lock:
            self._flush(fold=True)
            owner = self._cursor_owner(server, cursor, session_id, path)
            if owner is not None:
                owner.resumed_again = True

    def cursor_session(self, server: str, last_event_id: str | None) -> str | None:
        """The session of the stream a cursor would resume, if it is tracked."""
        cursor = bounded_id(last_event_id) or None
        if cursor is None:
            return None
        with self._lock:
            self._flush(fold=True)
            owner = self._cursor_owner(server, cursor, None)
            return owner.session.session_id if owner is not None else None

    def awaits_answers(
        self, server: str, last_event_id: str, session_id: str | None, path: str | None = None
    ) -> bool:
        """Whether resuming this cursor would settle requests still in flight
        (whose answers a rejected resume would orphan)."""
        cursor = bounded_id(last_event_id) or None
        if cursor is None:
            return False
        with self._lock:
            self._flush(fold=True)
            owner = self._cursor_owner(server, cursor, session_id, path)
            if owner is None:
                return False
            if owner.unconsumed_responses:
                return True
            pending = owner.session.pending or {}
            return any(lineage in (None, owner.lineage) for _, lineage in pending.values())

    def bind_session(self, stream: Stream, session_id: str) -> None:
        """The legacy transport names its session in the ``endpoint`` event."""
        with self._lock:
            self._fold(stream)
            if stream.session.session_id == session_id:
                return
            old = stream.session
            stream.session = new = self._session(stream.server, session_id)
            if old.pending:
                if new.pending is None:
                    new.pending = {}
                new.pending.update(old.pending)
            if old.ops:
                if new.ops is None:
                    new.ops = {}
                new.ops.update(old.ops)
            new.seen.merge(old.seen)

    def response(
        self, stream: Stream, status: int, session_id: str | None, error: str | None = None
    ) -> Step:
        """The reconnect was answered (for a resume) with ``status``, or got
        no answer at all (``error``: what the client raised)."""
        with self._lock:
            self._fold(stream)
            if stream.check is None:
                return NOTHING
            check = stream.check
            if error is not None:
                return self._run(stream, lambda: check.on_failure(error))
            return self._run(stream, lambda: check.on_response(status, session_id))

    def event_received(
        self, stream: Stream, event_id: str | None, data: str, digest: int | None = None
    ) -> Step:
        """An event is handed to the application, which has thereby taken the
        one before it (it asked for this one) but not yet this one.  An empty
        ``event_id``: the event has no id of its own; empty ``data``: a marker."""
        with self._lock:
            self._fold(stream)
            return self._received(stream, event_id, data, digest)

    def attach_feed(self, stream: Stream, feed: Any) -> None:
        """``stream`` is read through ``feed``: ``feed.drain()`` gives the
        events recorded since it was last called (``Event`` records, oldest
        first) and whether the application holds the last one."""
        with self._lock:
            stream.feed = feed
            self._fed[stream.key] = stream

    def fed_event(self, stream: Stream, normalise: Callable[[Any], Event], raw: Any) -> Step:
        """An event of a fed stream that a rule must see as it comes: the
        feed's earlier events are folded in first, then this one
        (``normalise`` builds its record, in order)."""
        with self._lock:
            self._fold(stream)
            event = normalise(raw)
            if event.retry is not None:
                self._retry(stream, event.retry)
            return self._received(stream, event.id, event.data)

    def _fold(self, stream: Stream) -> None:
        """Bring a fed stream's state up to date with its feed: the events it
        recorded, as if each had been reported, and whether the application
        took the last one."""
        feed = stream.feed
        if feed is None:
            return
        if not feed.ring and (
            stream.last_received is None
            or (stream.last_consumed == stream.last_received and not stream.unconsumed_responses)
        ):
            return  # nothing new, and nothing left to take: the common case
        events, holding = feed.drain()
        for event in events:
            if event.retry is not None:
                self._retry(stream, event.retry)
            self._received(stream, event.id, event.data)
        if not holding and (stream.last_received is not None or stream.unconsumed_responses):
            self._take(stream)

    def _received(
        self, stream: Stream, event_id: str | None, data: str, digest: int | None = None
    ) -> Step:
        """An event is handed to the application, which has thereby taken the
        one before it (it asked for this one) but not yet this one.

        The hot path of the plugin: a few attribute and dict operations under
        the lock, no parsing unless the stream is a resume under check."""
        if not event_id:
            event_id = None
        elif len(event_id) > MAX_KEPT_ID_BYTES // 4:
            event_id = bounded_id(event_id)
        if digest is None:
            digest = hash(data)
        # Most events on a busy stream are notifications: skip the call.
        responses = responses_in(data) if '"result"' in data or '"error"' in data else ()
        unreadable = responses is None
        if unreadable:
            responses = ()
        priming = not data
        self._take(stream)  # asking for this event took the one before
        step = NOTHING
        check = stream.check
        session = stream.session
        if (
            check is not None
            and event_id is not None
            and data
            and reuses_id(session.seen, event_id, digest)
        ):
            # The one case that reads the data: on a resumed stream, what
            # id_reused would report.
            if not is_message(data):
                data = ""  # a keep-alive repeating the id: a marker
            elif self._same_meaning(check, event_id, data):
                digest = session.seen.get(event_id)
        if unreadable:
            session.forget_pending(stream.lineage)
        if check is not None and check.event_matters(
            event_id, digest, bool(responses) or unreadable
        ):
            event = ObservedEvent(
                self._parse(event_id), digest, not data, responses, unreadable
            )
            step = self._run(stream, lambda: check.on_event(event))
        if event_id is not None:
            if data:
                session.seen.remember(event_id, digest)
            else:
                # A marker carries no content to compare, but its id shows
                # whether the scheme counts; a priming event: the server
                # may close the stream to poll.
                if priming:
                    stream.primed = True
                if event_id not in session.seen:
                    session.seen.remember(event_id, None)
            stream.last_received = event_id
            if self.contract is ReplayContract.INCLUSIVE:
                # Only an inclusive server sends the cursor event again (see
                # _ended); else this would keep the app's data alive.
                stream.last_data = data
        stream.unconsumed_responses = responses
        if responses and session.ops:
            self._answered_ops(session, responses, data)
        if responses:
            pending = session.pending
            if pending:
                for key in responses:
                    entry = pending.get(key)
                    if entry is not None and entry[0] == TOOLS_LIST:
                        self._remember_hints(stream.server, data)
            if self._reissues:
                self._answers_seen(session, responses)
        if self.broken and (responses or unreadable):
            answered = (
                self.broken.unreadable(session)
                if unreadable
                else self.broken.answered(session, responses)
            )
            step = self._fated(answered, step)
        if not stream.dirty:
            stream.dirty = True
            self._dirty.append(stream)
        return step

    def event_consumed(self, stream: Stream) -> None:
        """The application asked for the next event: it took the last one.

        Takes no lock: a flag the tracker settles under its lock before it
        reads the stream's cursors (a list append is atomic)."""
        stream.taken = True
        if not stream.dirty:
            stream.dirty = True
            self._dirty.append(stream)

    def session_terminated(self, server: str, session_id: str) -> Step:
        """The client asked the server to end the session (HTTP DELETE):
        its broken requests are lost."""
        with self._lock:
            session = self._sessions.get(_session_key(server, session_id, None))
            if session is None:
                return NOTHING
            session.terminated = True
            if not self.broken:
                return NOTHING
            return self._fated(self.broken.session_closed(session, "the session was closed"))

    def cancelling(self, server: str, session_id: str | None, path: str, body: bytes) -> None:
        """The client is about to send ``notifications/cancelled``: the
        requests it names and that have not broken yet are no longer
        awaited, so the stream the server then ends without their answers
        breaks nothing.  Told before the cancel is sent, which is before the
        server can end those streams.  (One whose stream ended before is the
        SDK's courtesy cancel after a failure: its fate runs on.)"""
        keys = cancelled_in(body)
        with self._lock:
            session = self._sessions.get(_session_key(server, session_id, path))
            if session is None or not session.pending:
                return
            holders = session.holders or {}
            for request_key in keys:
                # Its stream ended before (a break, or a poll whose lineage
                # waits): the SDK's courtesy cancel after a failure.
                if self.broken.entry(session, request_key) is None and request_key not in holders:
                    session.pending.pop(request_key, None)
            if not session.pending:
                session.pending = None

    def reissued(
        self,
        server: str,
        session_id: str | None,
        path: str,
        body: bytes,
        protocol_version: str | None = None,
    ) -> Step:
        """Requests in ``body`` were sent to ``server`` (speaking
        ``protocol_version``): those that repeat a broken request's call under
        a new id decide its fate, and say whether that was safe."""
        calls = calls_in(body)
        with self._lock:
            session = self._sessions.get(_session_key(server, session_id, path))
            decided = self.broken.reissued(server, session, calls)
            if not decided:
                return NOTHING
            if session is None:  # its answer will be read in this session
                session = self._session(server, session_id, path)
            judged = [self._judge_reissue(each, session, protocol_version) for each in decided]
            return self._fated(judged)

    def _judge_reissue(
        self, decided: Decided, session: Session, protocol_version: str | None
    ) -> Decided:
        """Whether the server declared the re-issued tool safe to run twice,
        and whether its first attempt may have run anyway; the pair is then
        watched for both answers."""
        broken = decided.broken
        if broken.method != TOOLS_CALL:
            idempotent = "true"  # every other request of a client only reads or sets
        else:
            hints = self.tool_hints.get(broken.server)
            declared = hints.get(broken.tool) if hints and broken.tool is not None else None
            idempotent = "unknown" if declared is None else "true" if declared else "false"
        cancels = protocol_version is not None and protocol_version >= CANCELS_ON_DISCONNECT
        may_run_twice = idempotent != "true" and not cancels
        if decided.by is not None:
            first, again = (id(broken.session), broken.key), (id(session), decided.by)
            watch = _Reissue(broken, (first, again))
            self._reissues[first] = self._reissues[again] = watch
            while len(self._reissues) > 2 * MAX_WATCHED_REISSUES:
                del self._reissues[next(iter(self._reissues))]
        return replace(decided, idempotent=idempotent, may_run_twice=may_run_twice)

    def _answered_ops(self, session: Session, keys: Iterable[str], data: str) -> None:
        """The operations these answers end, with each one's error.type, for
        the caller to take (a list, not a Step: one answer per request, and
        a Step is the dearer record)."""
        ops = session.ops
        failed = None
        for key in keys:
            op = ops.pop(key, None)
            if op is not None:
                if failed is None:
                    failed = answer_errors(data)
                self.operations_done.append((op[0], key, op[1], failed.get(key)))
        if not ops:
            session.ops = None

    def take_operations(self) -> list[tuple[str, str, Any, str | None]]:
        """The operations ended since the last call: (method, request key,
        the caller's record of the request, error.type or None)."""
        with self._lock:
            done, self.operations_done = self.operations_done, []
            return done

    def _answers_seen(self, session: Session, keys: Iterable[str]) -> None:
        """Answers to these requests of ``session`` arrived: a re-issued call
        whose first attempt and re-issue are both answered ran twice."""
        for key in keys:
            watch = self._reissues.get((id(session), key))
            if watch is None:
                continue
            watch.answered[watch.indexes.index((id(session), key))] = True
            if all(watch.answered):
                self._ran_twice.append(watch.broken)
                for index in watch.indexes:
                    self._reissues.pop(index, None)

    def json_answered(
        self, server: str, session_id: str | None, path: str, lists_tools: bool, answer: bytes
    ) -> None:
        """A POST's JSON answer was read: the tools/list hints it carries (if
        ``lists_tools``), and the answers a watched re-issue waits for."""
        with self._lock:
            if lists_tools:
                self._remember_hints(server, answer)
            if self._reissues:
                session = self._sessions.get(_session_key(server, session_id, path))
                keys = responses_in(answer.decode("utf-8", "replace")) if session else None
                if keys:
                    self._answers_seen(session, keys)

    def _remember_hints(self, server: str, answer: str | bytes) -> None:
        hints = tool_hints_in(answer)
        if hints is None:
            return
        known = self.tool_hints.pop(server, None)  # to the newest end
        if known is None:
            known = {}
            while len(self.tool_hints) >= MAX_HINTED_SERVERS:
                del self.tool_hints[next(iter(self.tool_hints))]
        known.update(hints)  # pages of one list add up
        self.tool_hints[server] = known

    @property
    def watches_reissues(self) -> bool:
        return bool(self._reissues)

    @property
    def ran_twice_found(self) -> bool:
        return bool(self._ran_twice)

    def take_ran_twice(self) -> list[Broken]:
        """Re-issued calls proven to have run twice since the last call."""
        with self._lock:
            found, self._ran_twice = self._ran_twice, []
            return found

    def subscriptions_due(self, window: float) -> list[LostSubscription]:
        """Lost subscriptions whose re-listen window has passed: counted now."""
        with self._lock:
            return self.subscriptions.due(time.monotonic(), window)

    def fates_due(self, window: float) -> Step:
        """Broken requests whose reissue window has passed are lost."""
        with self._lock:
            return self._fated(self.broken.due(time.monotonic(), window))

    def all_lost(self, why: str) -> Step:
        """The client stops waiting for everything (the process exits): its
        broken requests are lost, and so are the subscriptions still open."""
        with self._lock:
            lost: list[tuple[LostSubscription, Gap | None]] = []
            for stream in list(self._streams.values()):
                pending = stream.session.pending
                if stream.ended or not pending or not stream.carries:
                    continue
                listens = [key for key in stream.carries if pending.get(key, ("",))[0] == LISTEN]
                if listens:
                    body, stream.request_body = stream.request_body, None
                    lost += self._subscriptions_lost(stream, listens, body, why)
            step = self._fated(self.broken.all_lost(why))
            if not lost:
                return step
            return replace(step, lost_subscriptions=(*step.lost_subscriptions, *lost))

    def all_subscriptions_due(self) -> list[LostSubscription]:
        """Every lost subscription still waiting: counted now (the exit)."""
        with self._lock:
            return self.subscriptions.all_due()

    def _subscriptions_lost(
        self, stream: Stream, keys: list[str], body: bytes | None, why: str
    ) -> list[tuple[LostSubscription, Gap | None]]:
        """The subscriptions ``keys`` of ``stream`` are lost: out of the
        session's requests, into the ledger that waits for a re-listen."""
        filters = {call.key: call.listen for call in calls_in(body)} if body else {}
        stream.session.answered(keys)
        now = time.monotonic()
        lost = []
        for key in keys:
            notifications = filters.get(key) or "none"
            subscription = LostSubscription(
                key, stream.server, stream.transport, notifications, now, why
            )
            # Full: the oldest are counted at once, as if their window passed.
            self._ran_over.extend(self.subscriptions.lost(subscription))
            # Through the module: the rules can be swapped there (the mutation tests).
            lost.append((subscription, continuity.subscription_lost_rule(key, notifications, why)))
        return lost

    def take_overflow(self) -> list[LostSubscription]:
        """Lost subscriptions counted early, the ledger being full."""
        with self._lock:
            found, self._ran_over = self._ran_over, []
            return found

    def retry_seen(self, stream: Stream, retry_ms: int) -> None:
        """The stream carried ``retry:``: the server polls (and how often)."""
        self._retry(stream, retry_ms)

    @staticmethod
    def _retry(stream: Stream, retry_ms: int) -> None:
        if isinstance(retry_ms, int) and retry_ms >= 0:
            stream.primed = True
            stream.retry_ms = retry_ms

    def stream_ended(
        self,
        stream: Stream,
        reason: str,
        *,
        closed_by_client: bool = False,
        clean: bool = False,
        held_open: bool = False,
    ) -> Step:
        """The stream ended.  ``clean``: its body ended as HTTP ends a body
        (not a read error, not cut short); on a polling lineage that is the
        server closing it on purpose, and the next resume is a poll.
        ``held_open``: it was open at least the confirmation window, so an
        empty poll closed then is the server's "nothing new yet"."""
        with self._lock:
            self._fold(stream)
            if stream.feed is not None:
                stream.feed = None
                self._fed.pop(stream.key, None)
            self._settle(stream)
            if stream.ended and stream.check is None:
                return NOTHING
            if stream.check is not None and stream.session.window is not None:
                stream.session.window.release()  # packed once, now
                stream.session.window = None  # nothing unpacked is kept
            self._ended(stream)
            stream.server_closed = (
                clean and not closed_by_client and stream.primed and not stream.session.terminated
            )
            if closed_by_client and set(stream.carries).intersection(stream.unconsumed_responses):
                # A POST stream closed right after the answer to its own
                # request: the client took it (that is how the MCP SDKs finish
                # a request), unlike a long-lived stream dropped mid-read.
                stream.taken = True
                self._settle(stream)
            if closed_by_client and stream.carries and stream.session.ops:
                # Closed without their answers: cancelled by the client, an
                # operation without an answer or a fate, not timed.
                ops = stream.session.ops
                for key in stream.carries:
                    ops.pop(key, None)
            broke = not closed_by_client and not stream.server_closed
            body, stream.request_body = stream.request_body, None
            if stream.check is None:
                if broke or stream.server_closed:
                    return self._broken_stream(stream, body, reason, poll=not broke)
                if closed_by_client and stream.carries and stream.session.pending:
                    # A subscription the client ended (2026-07-28 cancels a
                    # request by closing its stream): over, not lost.
                    self._ended_locally(stream)
                return NOTHING
            check = stream.check
            was_open = not check.closed
            step = self._run(
                stream,
                lambda: check.on_end(
                    reason,
                    closed_by_client=closed_by_client,
                    server_closed=stream.server_closed and held_open,
                ),
            )
            held = check.release()
            final = check.final if was_open and check.closed else None
            if held:
                session = stream.session
                if session.pending is None:
                    session.pending = {}
                if session.holders is None:
                    session.holders = {}
                for key, method in held.items():
                    session.pending[key] = (method, stream.lineage)
                    session.holders[key] = stream.key
            new: list[Broken] = []
            fates: list[Decided] = []
            if held and broke:
                for key, method in held.items():
                    self._record_break(stream, key, method, None, new, fates)
            # Orphans that waited for this stream (its answers could still
            # come on it) wait no longer.
            window = self.broken.stop_held(stream, time.monotonic()) if self.broken else False
            if step is NOTHING and final is None and not held and not window and not new:
                return NOTHING
            return Step(
                step.gaps,
                step.verdict,
                held=bool(held),
                final=final,
                broke=(*step.broke, *new),
                fates=(*step.fates, *fates),
                window=window or step.window,
            )

    def _record_break(
        self,
        stream: Stream,
        key: str,
        method: str,
        call: int | None,
        new: list[Broken],
        fates: list[Decided],
        broke: bool = True,
        tool: str | None = None,
    ) -> None:
        session = stream.session
        if self.broken.entry(session, key) is not None:
            return  # broken before, on the stream this one resumed
        broken = Broken(
            key, method, call, stream.server, session, stream.transport, broke=broke, tool=tool
        )
        fates.extend(self.broken.broke(broken))
        new.append(broken)

    @staticmethod
    def _ended_locally(stream: Stream) -> None:
        pending = stream.session.pending or {}
        listens = [key for key in stream.carries if pending.get(key, ("",))[0] == LISTEN]
        if listens:
            stream.session.answered(listens)

    def _broken_stream(
        self, stream: Stream, body: bytes | None, reason: str, poll: bool = False
    ) -> Step:
        """A stream that no resume checks ended by an error or EOF: the
        requests whose answers it was to carry are broken.  With no event id
        received nothing can resume it (``not_resumable``, and their reissue
        window starts); with one, its lineage waits for a resume.  ``poll``:
        the server closed it on purpose, which breaks nothing unless the
        client does not resume it (its lineage waits too)."""
        session = stream.session
        pending = session.pending
        if not pending or session.terminated:
            return NOTHING  # nothing awaited, or the client ended the session itself
        legacy = stream.transport == SSE
        # An answer the stream handed to the application came, taken or not.
        handed = stream.unconsumed_responses
        keys = [
            key
            for key, (_, lineage) in pending.items()
            if (lineage == stream.lineage or (legacy and lineage is None)) and key not in handed
        ]
        if not keys:
            return NOTHING
        lost: tuple[tuple[LostSubscription, Gap | None], ...] = ()
        listens = [key for key in keys if pending[key][0] == LISTEN]
        if listens and not poll:
            # Subscriptions, not calls: no fate, and nothing to resume.
            why = f"the stream ended without the server's result: {reason}"
            lost = tuple(self._subscriptions_lost(stream, listens, body, why))
            keys = [key for key in keys if key not in listens]
            if not keys:
                return Step(lost_subscriptions=lost)
        calls = {call.key: call for call in calls_in(body)} if body is not None else {}
        new: list[Broken] = []
        fates: list[Decided] = []
        for key in keys if not poll else ():
            call = calls.get(key)
            self._record_break(
                stream, key, pending[key][0], call.digest if call else None, new, fates,
                tool=call.tool if call else None,
            )
        if stream.last_received is None and not poll:
            why = "nothing could resume the stream (it carried no event id)"
            window = self.broken.stop(session, keys, time.monotonic(), why, None)
            return Step(
                broke=tuple(new), fates=tuple(fates), window=window, not_resumable=True,
                lost_subscriptions=lost,
            )
        if session.holders is None:
            session.holders = {}
        for key in keys:
            session.holders[key] = stream.key
        return Step(broke=tuple(new), fates=tuple(fates), held=True, lost_subscriptions=lost)

    def lineage_ended(self, stream: Stream, why: str) -> Step:
        """The client did not resume ``stream`` (a resumed stream that ended
        holding requests): they are orphaned now.  Nothing if a later stream
        resumed it, which then holds them."""
        with self._lock:
            session = stream.session
            holders = session.holders
            if stream.resumed_again or not holders:
                return NOTHING
            pending = session.pending or {}
            keys: list[str] = []
            new: list[Broken] = []
            fates: list[Decided] = []
            for key, holder in list(holders.items()):
                if holder != stream.key:
                    continue
                del holders[key]
                entry = pending.pop(key, None)
                if entry is not None:  # else answered, or taken by a later resume
                    keys.append(key)
                    # Not broken before: a poll the client did not resume.
                    self._record_break(stream, key, entry[0], None, new, fates)
            if not pending:
                session.pending = None
            if not holders:
                session.holders = None
            check = stream.check
            attempt = stream if check is not None and check.held else None
            window = self.broken.stop(session, keys, time.monotonic(), why, attempt)
            final = None
            if attempt is not None and not self.broken.holds(attempt):
                final = self._lineage_over(stream, [])
            if not keys and final is None:
                return NOTHING
            return Step(
                broke=tuple(new),
                fates=tuple(fates),
                window=window,
                final=final,
                # A break nothing tried to resume.
                not_resumable=check is None and bool(keys),
            )

    @staticmethod
    def _lineage_over(stream: Stream, orphans: list[Gap]) -> Verdict | None:
        """Close the attempt of ``stream`` that held its lineage's requests;
        its final verdict, if this closed it."""
        check = stream.check
        if check is None or not check.held:
            return None
        check.lineage_over(orphans)
        return check.final

    def timeout(self, stream: Stream, seconds: float) -> Step:
        with self._lock:
            if stream.check is None:
                return NOTHING
            check = stream.check
            return self._run(stream, lambda: check.on_timeout(seconds))

    # ---------------------------------------------------------- internals

    def _ended(self, stream: Stream) -> None:
        """The stream will deliver no more events: keep of its last event's
        data only what a resume may compare."""
        stream.ended = True
        received, consumed = stream.last_data, stream.consumed_data
        stream.last_data = stream.consumed_data = None
        if self.contract is ReplayContract.INCLUSIVE and (received or consumed):
            # Only an inclusive server sends the cursor event again.
            meanings: dict[str, int | None] = {}
            if consumed and stream.last_consumed is not None:
                meanings[stream.last_consumed] = canonical_digest(consumed)
            if received and stream.last_received is not None:
                meanings[stream.last_received] = canonical_digest(received)
            stream.meanings = meanings

    @staticmethod
    def _same_meaning(check: ResumeCheck | None, event_id: str, data: str) -> bool:
        """The cursor event sent again with the same JSON meaning in other
        bytes (a store that keeps JSON as JSONB)."""
        if check is None or check.cursor.meaning is None or event_id != check.cursor.event_id.raw:
            return False
        return canonical_digest(data) == check.cursor.meaning

    def _run(self, stream: Stream, observe: Callable[[], list[Gap]]) -> Step:
        check = stream.check
        undecided = check.verdict is None
        was_open = not check.closed
        gaps = observe()
        decided = check.verdict if undecided else None
        final = check.final if was_open and check.closed else None
        new: list[Broken] = []
        fates: list[Decided] = []
        window = False
        if check.orphans:
            window = self._orphaned(stream, check.take_orphans(), new, fates)
        if not gaps and decided is None and final is None and not new and not window:
            return NOTHING
        return Step(
            tuple(gaps), decided, final=final, broke=tuple(new), fates=tuple(fates), window=window
        )

    def _orphaned(
        self,
        stream: Stream,
        orphans: dict[str, tuple[str, str]],
        new: list[Broken],
        fates: list[Decided],
    ) -> bool:
        """Requests the resume of ``stream`` can no longer bring the answer
        to: broken, and their attempt waits for their fates.  A stream that
        replaced the one that broke under the same session (a reset counter)
        may still carry their answers: their window starts at its end."""
        session = stream.session
        now = time.monotonic()
        wait = stream.check.replaced and not stream.ended
        window = False
        for key, (method, why) in orphans.items():
            self._record_break(stream, key, method, None, new, fates, broke=False)
            broken = self.broken.entry(session, key)
            if broken is None:
                continue
            broken.holder = stream
            broken.why = why
            if not wait:
                window = self.broken.stop(session, (key,), now, why, stream) or window
        return window

    def _fated(self, fates: list[Decided], step: Step = NOTHING) -> Step:
        """``step`` with these fates; a lost request is a gap of the attempt
        that waited for it, which closes once it waits for no fate more."""
        if not fates:
            return step
        closed = []
        holders: dict[int, Stream] = {}
        for decided in fates:
            # Settled: no later end of its lineage may record it again.
            decided.broken.session.answered((decided.broken.key,))
            ops = decided.broken.session.ops
            op = ops.pop(decided.broken.key, None) if ops else None
            if op is not None:  # not ended by an answer read: ended by its fate
                error = None if decided.fate is Fate.ANSWERED else FATE_ERRORS[decided.fate]
                self.operations_done.append((op[0], decided.broken.key, op[1], error))
            holder = decided.broken.holder
            if holder is None or holder.check is None:
                continue
            if decided.gap is not None:
                holder.check.gaps.append(decided.gap)
            holders[holder.key] = holder
        for holder in holders.values():
            if holder.session.holders and holder.key in holder.session.holders.values():
                continue  # still holding requests its lineage may resume
            if not self.broken.holds(holder):
                final = self._lineage_over(holder, [])
                if final is not None:
                    closed.append((holder, final))
        return Step(
            step.gaps,
            step.verdict,
            held=step.held,
            final=step.final,
            broke=step.broke,
            fates=(*step.fates, *fates),
            window=step.window,
            not_resumable=step.not_resumable,
            closed=(*step.closed, *closed),
            lost_subscriptions=step.lost_subscriptions,
        )

    def _settle(self, stream: Stream) -> None:
        """Fold a ``taken`` mark into the stream's consumed state."""
        if stream.taken:
            self._take(stream)

    @staticmethod
    def _take(stream: Stream) -> None:
        """The application took the stream's last received event."""
        stream.taken = False
        if stream.unconsumed_responses:
            stream.session.answered(stream.unconsumed_responses)
            stream.unconsumed_responses = ()
        if stream.last_received is not None:
            stream.last_consumed = stream.last_received
            stream.consumed_data = stream.last_data

    def _flush(self, fold: bool = False) -> None:
        """Bring the cursor index and the LRU order up to date with the
        streams that received or consumed events since the last flush;
        ``fold``: also with the streams being read through a feed (a cursor
        is about to be looked up; they are never evicted while read)."""
        if fold:
            for fed in list(self._fed.values()):
                self._fold(fed)
        dirty = self._dirty
        streams = self._streams
        while dirty:
            stream = dirty.pop()
            stream.dirty = False
            self._settle(stream)
            if streams.get(stream.key) is not stream:
                continue  # evicted: its cursors are gone with it
            streams[stream.key] = streams.pop(stream.key)  # to the newest end
            received, consumed = stream.last_received, stream.last_consumed
            wanted: str | tuple[str, ...]
            if received is None:
                wanted = ()
            elif consumed is None or consumed == received:
                wanted = received  # one id, the common case: no tuple for it
            else:
                wanted = (consumed, received)
            if wanted == stream.indexed:
                continue
            kept = _ids(wanted)
            for event_id in _ids(stream.indexed):
                if event_id not in kept:
                    self._unindex(stream, event_id)
            for event_id in kept:
                self._index(stream, event_id)
            stream.indexed = wanted

    # The index is keyed by the event id alone (a tuple with the server cost
    # 56 bytes per stream); its owners are filtered by server on lookup.

    def _index(self, stream: Stream, event_id: str) -> None:
        key = event_id
        owners = self._cursors.get(key)
        if owners is None:
            self._cursors[key] = stream
        elif isinstance(owners, Stream):
            if owners is not stream:
                self._cursors[key] = {owners.key: owners, stream.key: stream}
        else:
            owners.pop(stream.key, None)
            owners[stream.key] = stream

    def _unindex(self, stream: Stream, event_id: str) -> None:
        key = event_id
        owners = self._cursors.get(key)
        if owners is stream:
            del self._cursors[key]
        elif isinstance(owners, dict):
            owners.pop(stream.key, None)
            if len(owners) == 1:  # back to the common case: one owner, no dict
                self._cursors[key] = next(iter(owners.values()))

    def _cursor_owner(
        self, server: str, cursor: str, session_id: str | None, path: str | None = None
    ) -> Stream | None:
        owners = self._cursors.get(cursor)
        if owners is None:
            return None
        candidates = [owners] if isinstance(owners, Stream) else list(owners.values())
        # A stream without a session issued its ids for its URL path only.
        candidates = [
            stream
            for stream in candidates
            if stream.server == server
            and (stream.session.session_id is not None or stream.path == path)
        ]
        if not candidates:
            return None
        if session_id is not None:
            for stream in reversed(candidates):
                if stream.session.session_id == session_id:
                    return stream
            # Another session's stream holds an equal id.  That binds the
            # cursor to the other session only if the named one could not
            # have issued it: per-session counters repeat ids across sessions.
            named = self._sessions.get(_session_key(server, session_id, None))
            if named is None:
                if self.evicted_sessions:
                    return None  # it may have been dropped with its streams
            elif named.history_lost or cursor in named.seen:
                return None
        return candidates[-1]

    def _session(self, server: str, session_id: str | None, path: str | None = None) -> Session:
        key = _session_key(server, session_id, path)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = Session(
                server, session_id, history_lost=self.evicted_sessions > 0
            )
            if len(self._sessions) > self.max_streams:
                del self._sessions[next(iter(self._sessions))]
                self.evicted_sessions += 1
        else:
            self._sessions[key] = self._sessions.pop(key)
        return session

    def _admit(self, stream: Stream) -> None:
        streams = self._streams
        streams[stream.key] = stream
        skipped = 0
        while len(streams) > self.max_streams:
            key = next(iter(streams))
            if streams[key].feed is not None and skipped < len(self._fed):
                # Being read, whatever its place from the last fold says.
                streams[key] = streams.pop(key)
                skipped += 1
                continue
            dropped = streams.pop(key)
            self.evicted_streams += 1
            dropped.session.history_lost = True
            if dropped.feed is not None:
                dropped.feed = None
                self._fed.pop(dropped.key, None)
            for event_id in _ids(dropped.indexed):
                self._unindex(dropped, event_id)
            dropped.indexed = ()
