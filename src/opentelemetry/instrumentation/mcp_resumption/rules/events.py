# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The Events extension's cursors: each subscription a thread of cursors,
every break of the thread one finding.

Pure: standard library only, not thread-safe on its own (its caller holds a
lock) and told the time (``now``: monotonic seconds; ``wall``: epoch
seconds, for the server's ``refreshBefore``).

The extension (``io.modelcontextprotocol/events``, 2026-07-28 and later)
delivers things that happen upstream three ways: ``events/poll`` pages,
``events/stream`` push streams (``notifications/events/active``, then
``event``, ``heartbeat``, ``error``, ``terminated``) and webhooks
(``events/subscribe``, refreshed before its ``refreshBefore``).  Every
answer, ``active``, event and heartbeat carries an opaque cursor; a client
that comes back supplies the last one it received and the server continues
from there.  Nothing in the ids orders events: a gap is never inferred
from them.  What can be proven is what the cursors and the server's own
word say:

* a *thread* is one logical subscription: the server, the event type's
  name and a digest of its canonical arguments (never the arguments: they
  may hold secrets).  The subscription id changes on every reconnect, so it
  is not the key.  A thread follows the last cursor the client received,
  and the digests of the cursors it carried before (bounded);
* every request that supplies a cursor is judged against its thread:
  the last cursor continues it; null after a non-null one loses everything
  in between (``cursor_lost``, though the server truthfully says nothing was
  truncated); an older cursor of the thread replays what was delivered
  (``cursor_rewound``: duplicates, no loss); a cursor the thread never
  carried proves nothing (``cursor_unknown``, like a foreign id);
* the server's ``truncated: true`` (dialects: ``cursorGap``, a
  ``CursorExpired`` error) is the one signal that delivery started later
  than the cursor supplied (``truncated``);
* a push stream cut (or ended without ``terminated``) waits one window for
  the client to reopen it with its cursor: a reopen with the thread's last
  cursor that ``active`` answers ``truncated: false`` is a resume proven
  (:class:`Reopened`); none within the window is ``not_reopened``.  An
  event type without replay (its cursor is null) loses what was published
  while it was cut, by design: its reopen reports the window
  (``unreplayable_window``);
* a push stream silent for more than twice the heartbeat interval observed
  on it is ``stream_silent``, once, while it is still open; ``terminated``
  ends a subscription on the server's word, with its error's kind;
* a webhook subscription not refreshed by its ``refreshBefore`` has
  ``lapsed``, said when that moment passes; a ``deliveryStatus`` that turns
  inactive or names a ``lastError`` is ``delivery_failing``;
* delivery is at least once: an ``eventId`` delivered again with the same
  payload is a duplicate (counted, not a loss); with another payload it is
  ``event_id_reused``: a consumer that deduplicates by id drops a new event.

An ``events/poll`` or ``events/stream`` is never a lost call: the client
resumes it with its cursor, which is what this module judges.  The
application's own close of a stream and ``events/unsubscribe`` end a
subscription cleanly.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .jsonrpc import request_key

__all__ = [
    "EXTENSION",
    "LOSSES",
    "METHODS",
    "PAGES",
    "SUBSCRIPTION_ID",
    "EventLedger",
    "Finding",
    "Kind",
    "Reopened",
    "ThreadKey",
    "arguments_digest",
    "declares_events",
]

EXTENSION = "io.modelcontextprotocol/events"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
POLL = "events/poll"
STREAM = "events/stream"
SUBSCRIBE = "events/subscribe"
UNSUBSCRIBE = "events/unsubscribe"
METHODS = frozenset({POLL, STREAM, SUBSCRIBE, UNSUBSCRIBE})
_NOTIFY = "notifications/events/"
ACTIVE = _NOTIFY + "active"
EVENT = _NOTIFY + "event"
HEARTBEAT = _NOTIFY + "heartbeat"
ERROR = _NOTIFY + "error"
TERMINATED = _NOTIFY + "terminated"

# How each delivery is named in telemetry (a bounded label).
DELIVERY = {POLL: "poll", STREAM: "push", SUBSCRIBE: "webhook"}

# Bounds: threads kept (least recently used dropped, with no finding), the
# cursor digests and event ids each remembers, requests awaiting answers,
# open streams and webhook subscriptions.
MAX_THREADS = 4096
MAX_CURSORS = 64
MAX_EVENT_IDS = 256
MAX_ASKED = 1024
MAX_STREAMS = 4096
MAX_WEBHOOKS = 4096
# Names and ids longer than this are cut before they are kept or reported.
MAX_NAME = 128
# Heartbeat gaps below this are not an interval (two notifications at once).
MIN_INTERVAL = 0.05
# One encoder, built once: ``json.dumps`` with options builds one per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


class Kind(str, enum.Enum):
    """What broke a thread (``mcp.events.gap.kind``)."""

    TRUNCATED = "truncated"
    CURSOR_LOST = "cursor_lost"
    CURSOR_REWOUND = "cursor_rewound"
    CURSOR_UNKNOWN = "cursor_unknown"
    STREAM_SILENT = "stream_silent"
    TERMINATED = "terminated"
    NOT_REOPENED = "not_reopened"
    UNREPLAYABLE_WINDOW = "unreplayable_window"
    LAPSED = "lapsed"
    DELIVERY_FAILING = "delivery_failing"
    EVENT_ID_REUSED = "event_id_reused"


# Confirmed losses: each is also a ``resumption.gap`` event.
LOSSES = frozenset(
    {Kind.TRUNCATED, Kind.CURSOR_LOST, Kind.NOT_REOPENED, Kind.UNREPLAYABLE_WINDOW, Kind.LAPSED}
)
# The kinds the shipped alerts page on (the rest warn or are counted).
PAGES = frozenset({Kind.TRUNCATED, Kind.CURSOR_LOST, Kind.NOT_REOPENED, Kind.LAPSED})


class ThreadKey(tuple):
    """``(server, event type, digest of the arguments)``."""

    __slots__ = ()

    def __new__(cls, server: str, name: str, arguments: str) -> ThreadKey:
        return tuple.__new__(cls, (server, name, arguments))

    @property
    def server(self) -> str:
        return self[0]

    @property
    def name(self) -> str:
        return self[1]


@dataclass(frozen=True)
class Finding:
    """One break of a thread, with the words a WARNING line gives it."""

    kind: Kind
    key: ThreadKey
    delivery: str  # poll, push, webhook
    detail: str  # what was lost, or why nothing can be said
    window: float | None = None  # unreplayable_window: seconds nothing could be delivered
    error: str | None = None  # terminated, delivery_failing: the server's kind of error

    @property
    def loss(self) -> bool:
        return self.kind in LOSSES


@dataclass(frozen=True)
class Reopened:
    """A push stream reopened with its thread's last cursor: ``proven`` when
    ``active`` said ``truncated: false`` (a resume whose continuity holds)."""

    key: ThreadKey
    proven: bool


@dataclass(frozen=True)
class Outcome:
    """What one fact told: findings, a reopen, duplicates delivered again,
    a push stream opened or ended (``stream``), on the thread ``key``."""

    findings: tuple[Finding, ...] = ()
    reopened: Reopened | None = None
    duplicates: int = 0
    key: ThreadKey | None = None
    delivery: str = ""
    stream: str | None = None  # "opened", "ended"

    def __bool__(self) -> bool:
        return bool(self.findings or self.reopened or self.duplicates or self.stream)


NOTHING = Outcome()


def arguments_digest(arguments: Any) -> str:
    """A digest of the arguments by JSON meaning (keys sorted): the thread's
    key, never the arguments themselves."""
    try:
        canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    except (ValueError, TypeError, RecursionError):
        canonical = repr(type(arguments))
    return hashlib.blake2b(canonical.encode("utf-8", "replace"), digest_size=12).hexdigest()


def _cursor_digest(cursor: str) -> bytes:
    # A digest, not the cursor: cursors are opaque and may be large (a
    # megabyte of cursor costs one hash, then 8 bytes).
    return hashlib.blake2b(cursor.encode("utf-8", "replace"), digest_size=8).digest()


def declares_events(result: Any) -> bool:
    """Whether a ``server/discover`` (or ``initialize``) result declares the
    extension: under ``capabilities.extensions``, or the top-level
    ``capabilities.events`` some servers use."""
    if not isinstance(result, dict):
        return False
    capabilities = result.get("capabilities")
    if not isinstance(capabilities, dict):
        return False
    extensions = capabilities.get("extensions")
    if isinstance(extensions, dict) and EXTENSION in extensions:
        return True
    return "events" in capabilities


def _name(value: Any) -> str | None:
    return value[:MAX_NAME] if isinstance(value, str) and value else None


def _cursor(params: dict, missing: Any = None) -> Any:
    """The cursor a message carries: a string, None (null: "from now"), or
    ``missing`` when it has none of its own."""
    if "cursor" not in params:
        return missing
    cursor = params["cursor"]
    return cursor if isinstance(cursor, str) else None


def _truncated(params: dict) -> bool:
    # cursorGap: the dialect of servers written against an earlier draft.
    return params.get("truncated") is True or params.get("cursorGap") is True


def _expired_error(error: Any) -> bool:
    """A ``CursorExpired``-style error: the dialect that refuses an old
    cursor instead of answering ``truncated``.  The error codes of the
    extension are not settled, so it is read by its words and its data."""
    if not isinstance(error, dict):
        return False
    message = error.get("message")
    data = error.get("data")
    words = message.lower() if isinstance(message, str) else ""
    if isinstance(data, dict):
        for name in ("reason", "type", "kind", "code"):
            value = data.get(name)
            if isinstance(value, str):
                words += " " + value.lower()
        if "cursor" in data or "oldestCursor" in data:
            words += " cursor"
    flat = words.replace("_", "").replace("-", "").replace(" ", "")
    return "cursor" in flat and any(
        sign in flat for sign in ("expired", "toold", "gone", "unavailable", "nolonger", "gap")
    )


def _wall(value: Any) -> float | None:
    """``refreshBefore`` as epoch seconds: an ISO 8601 string, or a number
    of milliseconds since the epoch; None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) / 1000.0
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            return None  # a local time of the server's: proves no moment
        return parsed.timestamp()
    return None


@dataclass(eq=False)
class _Thread:
    last: bytes | None = None  # the digest of the last cursor received; None: null
    held: bool = False  # it has carried a non-null cursor
    replays: bool | None = None  # False: the type answers cursor null (no replay)
    # Digests of the cursors carried before the last (oldest first).
    carried: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    # eventId -> digest of its payload, the last ones delivered.
    ids: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    cut_at: float | None = None  # a push stream of it was cut: waiting for a reopen
    live_streams: int = 0
    saved: bytes | None = None  # the last cursor's digest as the shared state has it

    def receive(self, cursor: Any) -> None:
        """The client received ``cursor`` (a string, or None: null; anything
        else is a server's malformed cursor, read past: the thread keeps the
        last cursor it carried, as a client that takes only strings does)."""
        if cursor is None:
            self.last = None
            return
        if not isinstance(cursor, str):
            return
        digest = _cursor_digest(cursor)
        if digest == self.last:
            return
        if self.last is not None:
            carried = self.carried
            carried[self.last] = None
            carried.move_to_end(self.last)
            if len(carried) > MAX_CURSORS:
                carried.popitem(last=False)
        self.carried.pop(digest, None)
        self.last = digest
        self.held = True

    def delivered(self, event_id: Any, payload: Any, read: bool = True) -> tuple[int, bool]:
        """An event delivered: (1 if a duplicate, whether its id was reused
        with another payload).  ``read`` False: its payload was not read (a
        push stream's events skimmed for their ids); a repeat of such an id
        is a duplicate, as payloads that were not both read prove no reuse."""
        if not isinstance(event_id, str) or not event_id:
            return 0, False
        digest = b""
        if read:
            try:
                text = _CANONICAL.encode(payload)
            except (ValueError, TypeError, RecursionError):
                text = repr(type(payload))
            digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest()
        event_id = event_id[:MAX_NAME]
        ids = self.ids
        seen = ids.get(event_id)
        if seen is not None:
            ids.move_to_end(event_id)
            if not seen or not digest or seen == digest:
                if not seen:
                    ids[event_id] = digest
                return 1, False
            return 0, True
        ids[event_id] = digest
        if len(ids) > MAX_EVENT_IDS:
            ids.popitem(last=False)
        return 0, False


@dataclass(eq=False)
class _Asked:
    key: ThreadKey
    method: str
    supplied: Any  # the cursor the request supplied (str or None)
    reopening: bool = False  # an events/stream that reopens a cut stream
    cut_at: float | None = None


@dataclass(eq=False)
class _Stream:
    key: ThreadKey
    opened_at: float
    asked: _Asked
    last_heard: float
    last_beat: float | None = None  # the last heartbeat (or active) heard
    interval: float | None = None  # the longest gap between two of them seen
    silent_said: bool = False
    active_seen: bool = False
    beats: bool = False  # a heartbeat was heard
    remeasure: bool = False  # the next gap replaces the interval (``retime``)


@dataclass(eq=False)
class _Webhook:
    key: ThreadKey
    refresh_before: float | None  # epoch seconds
    lapsed_said: bool = False
    failing: bool = False


class EventLedger:
    """Every thread of cursors of the client's event subscriptions, and the
    push streams and webhook subscriptions open on them."""

    def __init__(self, max_threads: int = MAX_THREADS) -> None:
        self._max_threads = max_threads
        self._threads: OrderedDict[ThreadKey, _Thread] = OrderedDict()
        # (server, request id) -> the request, until its answer (or its
        # stream's end, for events/stream).
        self._asked: OrderedDict[tuple[str, str], _Asked] = OrderedDict()
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._webhooks: dict[tuple[str, str], _Webhook] = {}
        self.dropped = 0  # threads dropped for room, with no finding

    # ------------------------------------------------------------ threads

    def _thread(self, key: ThreadKey, create: bool = True) -> _Thread | None:
        thread = self._threads.get(key)
        if thread is not None:
            self._threads.move_to_end(key)
            return thread
        if not create:
            return None
        thread = self._threads[key] = _Thread()
        while len(self._threads) > self._max_threads:
            self._threads.popitem(last=False)
            self.dropped += 1
        return thread

    def threads(self) -> int:
        return len(self._threads)

    def open_streams(self) -> int:
        return len(self._streams)

    def last_cursor(self, key: ThreadKey) -> bytes | None:
        """The digest of the last cursor the thread received (for the shared
        state: a restarted process is judged against its predecessor's)."""
        thread = self._threads.get(key)
        return thread.last if thread is not None else None

    def thread_key(self, server: str, params: Any) -> ThreadKey | None:
        """The thread an ``events/poll``, ``events/stream`` or
        ``events/subscribe`` with ``params`` belongs to."""
        name = _name(params.get("name")) if isinstance(params, dict) else None
        if name is None:
            return None
        return ThreadKey(server, name, arguments_digest(params.get("arguments")))

    def knows(self, key: ThreadKey) -> bool:
        return key in self._threads

    def inherit(self, key: ThreadKey, last: bytes) -> None:
        """The last cursor (its digest) a predecessor's thread held (the
        shared state): this process's requests are judged against it."""
        thread = self._thread(key)
        if thread is not None and thread.last is None and not thread.held:
            thread.last = thread.saved = last
            thread.held = True

    def unsaved(self) -> list[tuple[ThreadKey, bytes]]:
        """The threads whose last cursor the shared state does not have yet,
        marked saved (the caller writes them)."""
        found = []
        for key, thread in self._threads.items():
            if thread.last is not None and thread.last != thread.saved:
                thread.saved = thread.last
                found.append((key, thread.last))
        return found

    # ------------------------------------------------------------ requests

    def requested(
        self, server: str, request_id: str, method: str, params: Any, now: float
    ) -> Outcome:
        """The client sent an ``events/*`` request: its supplied cursor
        judged against the thread, and the request kept for its answer."""
        if not isinstance(params, dict):
            params = {}
        if method == UNSUBSCRIBE:
            # By the subscription's id, or by what names it (its type and
            # arguments, and its delivery's url): every webhook of the thread.
            subscription = _name(params.get("id"))
            if subscription is not None:
                self._webhooks.pop((server, subscription), None)
            name = _name(params.get("name"))
            if name is not None:
                key = ThreadKey(server, name, arguments_digest(params.get("arguments")))
                for known, webhook in list(self._webhooks.items()):
                    if webhook.key == key:
                        del self._webhooks[known]
            return NOTHING
        name = _name(params.get("name"))
        if name is None or method not in DELIVERY:
            return NOTHING
        key = ThreadKey(server, name, arguments_digest(params.get("arguments")))
        delivery = DELIVERY[method]
        supplied = _cursor(params)
        thread = self._thread(key)
        asked = _Asked(key, method, supplied)
        findings: list[Finding] = []
        live_webhook = method == SUBSCRIBE and any(
            hook.key == key and not hook.lapsed_said for hook in self._webhooks.values()
        )
        if not live_webhook:
            # A webhook refresh need not carry a cursor: its deliveries went
            # to the receiver, not through this client.
            finding = self._judge(thread, key, delivery, supplied)
            if finding is not None:
                findings.append(finding)
        if method == STREAM and thread.cut_at is not None:
            asked.reopening, asked.cut_at = True, thread.cut_at
            thread.cut_at = None
        self._asked[(server, request_id)] = asked
        if len(self._asked) > MAX_ASKED:
            self._asked.popitem(last=False)
        opened = None
        if method == STREAM and len(self._streams) < MAX_STREAMS:
            self._streams[(server, request_id)] = _Stream(key, now, asked, now)
            thread.live_streams += 1
            opened = "opened"
        return Outcome(tuple(findings), key=key, delivery=delivery, stream=opened)

    @staticmethod
    def _judge(thread: _Thread, key: ThreadKey, delivery: str, supplied: Any) -> Finding | None:
        if supplied is None:
            if thread.held and thread.last is not None:
                return Finding(
                    Kind.CURSOR_LOST,
                    key,
                    delivery,
                    "the request started from now (cursor null) after the client had "
                    "held a cursor: every event published in between is skipped, and "
                    "the server truthfully says nothing was truncated",
                )
            return None
        digest = _cursor_digest(supplied)
        if digest == thread.last:
            return None
        if digest in thread.carried:
            return Finding(
                Kind.CURSOR_REWOUND,
                key,
                delivery,
                "the request supplied an older cursor of the subscription: what "
                "follows up to its last cursor is delivered again (duplicates, no loss)",
            )
        return Finding(
            Kind.CURSOR_UNKNOWN,
            key,
            delivery,
            "the request supplied a cursor this subscription never received here: "
            "nothing proves what it skips or repeats",
        )

    # ------------------------------------------------------------ answers

    def answered(
        self, server: str, request_id: str, message: Any, now: float, wall: float
    ) -> Outcome:
        """The answer to a kept request (a JSON-RPC response)."""
        asked = self._asked.get((server, request_id))
        if asked is None or not isinstance(message, dict):
            return NOTHING
        if asked.method != STREAM:
            del self._asked[(server, request_id)]
        thread = self._thread(asked.key)
        delivery = DELIVERY[asked.method]
        if "error" in message:
            if _expired_error(message.get("error")):
                thread.receive(None)
                return Outcome(
                    (
                        Finding(
                            Kind.TRUNCATED,
                            asked.key,
                            delivery,
                            "the server refused the cursor as expired: the events "
                            "between it and what the server still holds are gone",
                        ),
                    )
                )
            error = message.get("error")
            if asked.method == POLL and thread.held and isinstance(error, dict):
                # A poll's error is how the server ends a subscription it
                # held (forbidden, gone): what was published since is not
                # delivered until the client subscribes again.
                thread.receive(None)
                code = error.get("code", error.get("message"))
                return Outcome(
                    (
                        Finding(
                            Kind.TERMINATED,
                            asked.key,
                            delivery,
                            "the server answered the poll with an error: the subscription "
                            "it held has ended",
                            error=str(code)[:MAX_NAME] if code is not None else None,
                        ),
                    ),
                    key=asked.key,
                    delivery=delivery,
                )
            return NOTHING
        result = message.get("result")
        if not isinstance(result, dict) or asked.method == STREAM:
            return NOTHING  # a stream's final result carries nothing to rely on
        findings: list[Finding] = []
        duplicates = 0
        if _truncated(result) and asked.supplied is not None:
            findings.append(
                Finding(
                    Kind.TRUNCATED,
                    asked.key,
                    delivery,
                    "the server said delivery started later than the cursor supplied "
                    "(truncated): the events in between were skipped",
                )
            )
        if asked.method == POLL:
            events = result.get("events")
            for event in events if isinstance(events, list) else ():
                if isinstance(event, dict):
                    duplicate, reused = thread.delivered(event.get("eventId"), event.get("data"))
                    duplicates += duplicate
                    if reused:
                        findings.append(self._reused(asked.key, delivery))
        if "cursor" in result:
            thread.receive(result["cursor"])
        if asked.method == SUBSCRIBE:
            findings += self._subscribed(server, asked.key, result)
        return Outcome(tuple(findings), duplicates=duplicates, key=asked.key, delivery=delivery)

    @staticmethod
    def _reused(key: ThreadKey, delivery: str) -> Finding:
        return Finding(
            Kind.EVENT_ID_REUSED,
            key,
            delivery,
            "an eventId came again with another payload: a consumer that "
            "deduplicates by eventId drops a new event",
        )

    def _subscribed(self, server: str, key: ThreadKey, result: dict) -> list[Finding]:
        subscription = _name(result.get("id"))
        if subscription is None:
            return []
        webhook = self._webhooks.get((server, subscription))
        if webhook is None:
            if len(self._webhooks) >= MAX_WEBHOOKS:
                return []
            webhook = self._webhooks[(server, subscription)] = _Webhook(key, None)
        webhook.refresh_before = _wall(result.get("refreshBefore"))
        webhook.lapsed_said = False
        status = result.get("deliveryStatus")
        failing = isinstance(status, dict) and (
            status.get("active") is False or bool(status.get("lastError"))
        )
        found: list[Finding] = []
        if failing and not webhook.failing:
            error = status.get("lastError")
            kind = error.get("code") if isinstance(error, dict) else error
            found.append(
                Finding(
                    Kind.DELIVERY_FAILING,
                    key,
                    "webhook",
                    "the server says its deliveries to the webhook are failing"
                    + (" (inactive)" if status.get("active") is False else ""),
                    error=str(kind)[:MAX_NAME] if kind is not None else None,
                )
            )
        webhook.failing = failing
        return found

    # ------------------------------------------------------------ push streams

    def notified(self, server: str, method: str, params: Any, now: float) -> Outcome:
        """A ``notifications/events/*`` on a push stream; its
        ``_meta[subscriptionId]`` names the stream's request (its id, keyed
        as ``jsonrpc.request_key`` keys it, as ``requested`` was told)."""
        if not isinstance(params, dict):
            return NOTHING
        meta = params.get("_meta")
        subscription = request_key(meta.get(SUBSCRIPTION_ID)) if isinstance(meta, dict) else None
        if subscription is None:
            return NOTHING
        stream = self._streams.get((server, subscription))
        if stream is None:
            return NOTHING
        stream.last_heard = now
        # A gap that spans a silence already said is no heartbeat interval.
        was_silent, stream.silent_said = stream.silent_said, False
        thread = self._thread(stream.key)
        key = stream.key
        if method == ACTIVE:
            return self._active(stream, thread, params, now)
        if method == EVENT:
            duplicate, reused = thread.delivered(params.get("eventId"), params.get("data"))
            if "cursor" in params:
                thread.receive(params["cursor"])
            findings = (self._reused(key, "push"),) if reused else ()
            return Outcome(findings, duplicates=duplicate, key=key, delivery="push")
        if method == HEARTBEAT:
            beat = stream.last_beat
            if beat is not None and now - beat >= MIN_INTERVAL and not was_silent:
                gap = now - beat
                if stream.interval is None or stream.remeasure:
                    stream.interval, stream.remeasure = gap, False
                else:
                    stream.interval = max(stream.interval, gap)
            stream.last_beat = now
            stream.beats = True
            if "cursor" in params:
                thread.receive(params["cursor"])
            return NOTHING
        if method == TERMINATED:
            del self._streams[(server, subscription)]
            thread.live_streams = max(0, thread.live_streams - 1)
            error = params.get("error")
            kind = None
            if isinstance(error, dict):
                kind = error.get("code", error.get("message"))
            elif isinstance(error, str):
                kind = error
            reason = params.get("reason")
            if kind is None and isinstance(reason, str):
                kind = reason
            return Outcome(
                (
                    Finding(
                        Kind.TERMINATED,
                        key,
                        "push",
                        "the server ended the subscription (terminated): nothing more "
                        "is delivered until the client subscribes again",
                        error=str(kind)[:MAX_NAME] if kind is not None else None,
                    ),
                ),
                key=key,
                delivery="push",
                stream="ended",
            )
        return NOTHING  # error: transient, the stream goes on

    def skimmed(
        self, server: str, subscription: str, event_id: str, cursor: Any, now: float
    ) -> Outcome:
        """A ``notifications/events/event`` of the push stream of request
        ``subscription`` read for its id and cursor alone (not its payload),
        as ``notified`` reads one."""
        stream = self._streams.get((server, subscription))
        if stream is None:
            return NOTHING
        stream.last_heard = now
        stream.silent_said = False
        thread = self._thread(stream.key)
        duplicate, _ = thread.delivered(event_id, None, read=False)
        thread.receive(cursor)
        if not duplicate:
            return NOTHING
        return Outcome(duplicates=duplicate, key=stream.key, delivery="push")

    def heartbeat_interval(self, server: str, subscription: str) -> float | None:
        """The push stream's heartbeat interval as observed, 0.0 while
        heartbeats were heard but no interval is known yet, None without a
        heartbeat (or no such stream): how finely its silence needs timing."""
        stream = self._streams.get((server, subscription))
        if stream is None or not stream.beats:
            return None
        return stream.interval if stream.interval is not None else 0.0

    def retime(self, server: str, subscription: str) -> None:
        """The push stream's notifications are read more finely from now on:
        the heartbeat interval is measured again, the next gap replacing the
        longest seen so far (timed by coarser reads), which holds until then."""
        stream = self._streams.get((server, subscription))
        if stream is not None:
            stream.last_beat = None
            stream.remeasure = True

    def _active(self, stream: _Stream, thread: _Thread, params: dict, now: float) -> Outcome:
        asked = stream.asked
        stream.active_seen = True
        stream.last_beat = now
        truncated = _truncated(params)
        raw = params.get("cursor")
        cursor = raw if isinstance(raw, str) else None
        findings: list[Finding] = []
        if truncated and asked.supplied is not None:
            findings.append(
                Finding(
                    Kind.TRUNCATED,
                    stream.key,
                    "push",
                    "the server said the stream starts later than the cursor supplied "
                    "(truncated): the events in between were skipped",
                )
            )
        reopened = None
        if raw is None:
            thread.replays = False
            if asked.reopening and asked.cut_at is not None:
                window = max(0.0, stream.opened_at - asked.cut_at)
                findings.append(
                    Finding(
                        Kind.UNREPLAYABLE_WINDOW,
                        stream.key,
                        "push",
                        f"the event type has no replay (cursor null): whatever was "
                        f"published in the {window:.1f} s the stream was cut is lost "
                        f"by design",
                        window=window,
                    )
                )
        elif cursor is not None:
            thread.replays = True
            if asked.reopening and isinstance(asked.supplied, str):
                reopened = Reopened(stream.key, proven=not truncated and not findings)
        thread.receive(raw)
        return Outcome(tuple(findings), reopened, key=stream.key, delivery="push")

    def stream_ended(self, server: str, request_id: str, cut: bool, now: float) -> Outcome:
        """A push stream's response ended.  ``cut``: by an error, or by the
        server without ``terminated``; otherwise the application closed it
        (a clean end of the subscription)."""
        self._asked.pop((server, request_id), None)
        stream = self._streams.pop((server, request_id), None)
        if stream is None:
            return NOTHING
        thread = self._thread(stream.key)
        thread.live_streams = max(0, thread.live_streams - 1)
        if cut:
            thread.cut_at = now
        return Outcome(key=stream.key, delivery="push", stream="ended")

    # ------------------------------------------------------------ time

    def due(self, now: float, wall: float, window: float) -> Outcome:
        """What the passing of time decides: cut streams not reopened within
        ``window``, webhook subscriptions past their ``refreshBefore``, open
        streams silent for more than twice their heartbeat interval."""
        findings: list[Finding] = []
        for key, thread in self._threads.items():
            if (
                thread.cut_at is not None
                and now - thread.cut_at >= window
                and not thread.live_streams
            ):
                thread.cut_at = None
                findings.append(
                    Finding(
                        Kind.NOT_REOPENED,
                        key,
                        "push",
                        f"the push stream was cut and not reopened within {window:g} s: "
                        f"events published since are not being delivered",
                    )
                )
        for webhook in self._webhooks.values():
            before = webhook.refresh_before
            if before is not None and not webhook.lapsed_said and wall >= before:
                webhook.lapsed_said = True
                findings.append(
                    Finding(
                        Kind.LAPSED,
                        webhook.key,
                        "webhook",
                        "the webhook subscription was not refreshed before its "
                        "refreshBefore: it expired, and events published since are not "
                        "delivered",
                    )
                )
        for stream in self._streams.values():
            interval = stream.interval
            if interval is None or stream.silent_said:
                continue
            silence = now - stream.last_heard
            if silence > 2 * interval:
                stream.silent_said = True
                findings.append(
                    Finding(
                        Kind.STREAM_SILENT,
                        stream.key,
                        "push",
                        f"the push stream has been silent for {silence:.1f} s, more than "
                        f"twice its heartbeat interval ({interval:.1f} s): it is likely "
                        f"dead; reopen it with its last cursor",
                    )
                )
        return Outcome(tuple(findings))

    def next_due(self, now: float, wall: float, window: float) -> float | None:
        """Seconds until ``due`` may find something, or None: nothing waits."""
        waits: list[float] = []
        for thread in self._threads.values():
            # A cut beside a live stream of its thread waits for nothing yet
            # (``due`` leaves it until that stream ends, which asks again).
            if thread.cut_at is not None and not thread.live_streams:
                waits.append(thread.cut_at + window - now)
        for webhook in self._webhooks.values():
            if webhook.refresh_before is not None and not webhook.lapsed_said:
                waits.append(webhook.refresh_before - wall)
        for stream in self._streams.values():
            if stream.interval is not None and not stream.silent_said:
                waits.append(stream.last_heard + 2 * stream.interval - now)
        return max(0.0, min(waits)) if waits else None
