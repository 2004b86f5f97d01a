# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""``--resumable``: the proxy keeps what it forwarded, so that a break
between client and proxy loses nothing.

Each upstream SSE stream becomes a ``Relay``: its events, numbered by the
proxy under ids that count (``<stream>:<n>``, whatever the upstream's ids
were, or where it sent none), kept in a bounded buffer like an event store,
and read by one client at a time from a cursor.  The upstream stream is read
on its own task, so a client that leaves does not end it: for ``LINGER``
seconds the relay keeps reading, and a client that resumes with one of its
ids gets every event after it once, in order.  When the upstream stream
itself breaks, the relay remembers the upstream's last id and resumes the
upstream with it on the client's next resume (the proxy wraps the upstream's
ids rather than hides them).  When the server closes a call's stream on
purpose before its answer (SSE polling, protocol 2025-11-25: the body ends
cleanly), the relay resumes the upstream itself with the upstream's last id
after the ``retry:`` it was given, as an SDK client would, and reads on into
the same relay: its client's stream stays open and gets the answer there, and
the resume is a poll on the server's leg, never a break.

With shared state (``SharedRelays``) a relay's events are also written to
Redis, so that a client whose resume lands on another instance of a fleet
gets them there: each event is queued (a deque append: no Redis call on the
per-event path) and the store's writer thread writes what queued since its
last round trip, one Redis stream per relay (``XADD``, trimmed to
``MAX_EVENTS``), and the relay's state (its session's keyed hash, its last
number, ended, failed, the upstream's last id) beside it.  The instance the
client reaches reads the events after its cursor from there, and follows
the stream while the first instance reads on; where the upstream broke, it
resumes the upstream itself with the upstream's last id, into a relay of
the same key.  Payloads are written to Redis only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import secrets
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx
from httpx_sse import EventSource

from .enforce import Pending
from .relay_terms import (
    LINGER,
    MAX_BYTES,
    MAX_EVENT_BYTES,
    MAX_EVENTS,
    MAX_RELAYS,
    POLL_DELAY,
    POLL_DELAY_MAX,
    POLL_DELAY_MIN,
    parse,
)

if TYPE_CHECKING:
    from .shared import SharedBuffer, SharedRelays


class Relay:
    """One upstream SSE stream, numbered and kept for its clients."""

    def __init__(
        self, key: str, shared: SharedBuffer | None = None, session: str | None = None
    ) -> None:
        self.key = key
        self.shared = shared
        self.session = session
        self.frames: deque[tuple[int, bytes]] = deque()
        self.size = 0
        self.last = 0  # the number of the last event added
        self.upstream_last_id: str | None = None
        self.ended = False
        self.failed = False
        self.followers = 0
        # The number of the last event written to a client: where a client
        # re-opening this stream without a cursor is served from.
        self.written = 0
        # A standalone GET stream's answer, for the client that re-opens it.
        self.status = 200
        self.headers: list[tuple[bytes, bytes]] = []
        self.credentials = b""
        # The requests a POST's stream is to answer, until answered: the
        # relay resumes a stream the server closed before them (a poll).
        self.pending: Pending | None = None
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._linger: asyncio.TimerHandle | None = None

    def add(self, event: Any) -> None:
        self.last += 1
        lines = []
        if event.event and event.event != "message":
            lines.append(b"event: " + event.event.encode())
        lines.append(b"id: %s:%d" % (self.key.encode(), self.last))
        if event.retry is not None:
            lines.append(b"retry: %d" % event.retry)
        lines.extend(b"data: " + line.encode() for line in event.data.split("\n"))
        frame = b"\n".join(lines) + b"\n\n"
        self.frames.append((self.last, frame))
        self.size += len(frame)
        while len(self.frames) > MAX_EVENTS or (self.size > MAX_BYTES and len(self.frames) > 1):
            _, dropped = self.frames.popleft()
            self.size -= len(dropped)
        if event.id:
            self.upstream_last_id = event.id
        if self.shared is not None:
            self.shared.added(self, self.last, frame)
        self._wake()

    def end(self, failed: bool) -> None:
        self.ended, self.failed = True, failed
        if self.shared is not None:
            self.shared.changed(self)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def holds(self, after: int) -> bool:
        """Every event after ``after`` is still here (none was dropped)."""
        oldest = self.frames[0][0] if self.frames else self.last + 1
        return after + 1 >= oldest and after <= self.last

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """The frames after number ``after``, then each new one, until the
        upstream stream ends."""
        self.followers += 1
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        try:
            while True:
                changed = self._changed
                # A follower is at the tail but for what arrived since it
                # last wrote: walk back to it, and write what it lacks at once.
                missing = []
                for number, frame in reversed(self.frames):
                    if number <= after:
                        break
                    missing.append(frame)
                if missing:
                    after = self.last
                    missing.reverse()
                    yield b"".join(missing)
                    self.written = max(self.written, after)  # the client's write returned
                if self.ended and after >= self.last:
                    return
                await changed.wait()
        finally:
            self.followers -= 1
            if self.followers == 0 and not self.ended and self.task is not None:
                self._linger = asyncio.get_running_loop().call_later(LINGER, self.task.cancel)


class Relays:
    """The relays by key, bounded: the oldest ended ones go first.
    ``shared``: the fleet's buffers (``SharedRelays``), None: this process's."""

    def __init__(self, shared: SharedRelays | None = None) -> None:
        self._relays: OrderedDict[str, Relay] = OrderedDict()
        self._prefix = secrets.token_hex(4)
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        self.shared = shared
        # Per session, the key of its standalone GET stream's relay.
        self._standalone: OrderedDict[str, str] = OrderedDict()

    def new(self, session: str | None = None, key: str | None = None) -> Relay:
        key = key or f"p{self._prefix}-{next(self._count)}"
        shared = None if self.shared is None else self.shared.buffer(key, session)
        relay = Relay(key, shared, session)
        self._add(relay)
        return relay

    def session_ended(self, session: str) -> None:
        """The client ended ``session`` (its DELETE): its streams' requests
        end with it, so no relay of it polls the server for their answers
        (the server would answer 404, and the proxy would count them lost)."""
        with self._lock:
            relays = [relay for relay in self._relays.values() if relay.session == session]
        for relay in relays:
            relay.pending = None

    def hold_standalone(
        self,
        relay: Relay,
        session: str,
        request_headers: list[tuple[bytes, bytes]],
        status: int,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """``relay`` reads ``session``'s standalone GET stream (a GET without
        a cursor): a server allows one per session, so the client that
        re-opens it after a break is handed this one (``standalone``)."""
        relay.status, relay.headers = status, headers
        relay.credentials = _credentials(request_headers)
        with self._lock:
            self._standalone[session] = relay.key
            self._standalone.move_to_end(session)
            while len(self._standalone) > MAX_RELAYS:
                self._standalone.popitem(last=False)

    def standalone(
        self, session: str | None, request_headers: list[tuple[bytes, bytes]]
    ) -> Relay | None:
        """The standalone GET stream of ``session`` that the proxy still reads
        with no client on it (its client's leg broke), if the request asking
        for it carries the same credentials as the one that opened it; else
        None, and the request goes to the server, which judges it."""
        if session is None:
            return None
        with self._lock:
            key = self._standalone.get(session)
            relay = None if key is None else self._relays.get(key)
            if relay is None or relay.ended:
                self._standalone.pop(session, None)
                return None
        if relay.followers or not hmac.compare_digest(
            relay.credentials, _credentials(request_headers)
        ):
            return None
        return relay

    def _add(self, relay: Relay) -> None:
        with self._lock:
            self._relays[relay.key] = relay
            while len(self._relays) > MAX_RELAYS:
                key = next((k for k, r in self._relays.items() if r.ended), None)
                if key is None:
                    key = next(iter(self._relays))
                    gone = self._relays[key]
                    if gone.task is not None:
                        gone.task.cancel()
                del self._relays[key]

    def adopt(self, remote: Any, frames: list[tuple[int, bytes]]) -> Relay:
        """A relay another instance read until its upstream broke, taken
        over here under the same key: its events after the client's cursor
        (``frames``, from Redis), numbered on from its last; the caller
        resumes the upstream with the upstream's last id into it."""
        relay = Relay(remote.key)
        if self.shared is not None:
            relay.shared = self.shared.buffer(remote.key, remote.session)
            relay.shared.written = remote.last
        relay.frames.extend(frames)
        relay.size = sum(len(frame) for _, frame in frames)
        relay.last = remote.last
        relay.upstream_last_id = remote.upstream_last_id()
        relay.ended = relay.failed = True
        self._add(relay)
        return relay

    def find(self, cursor: str) -> tuple[Relay, int] | None:
        parsed = parse(cursor)
        if parsed is None:
            return None
        with self._lock:
            relay = self._relays.get(parsed[0])
        return None if relay is None else (relay, parsed[1])


def _credentials(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A digest of what authenticates a request (its Authorization and
    cookies): kept instead of the values."""
    digest = hashlib.sha256()
    for key, value in headers:
        if key.lower() in (b"authorization", b"cookie"):
            digest.update(key.lower() + b"\0" + value + b"\0")
    return digest.digest()


class _Limited(httpx.AsyncByteStream):
    """A relay keeps events whole: an event past MAX_EVENT_BYTES breaks the
    stream (as the upstream's break would) rather than the proxy's memory."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._open = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            end = max(chunk.rfind(b"\n\n"), chunk.rfind(b"\r\r"), chunk.rfind(b"\n\r\n"))
            self._open = len(chunk) - end if end >= 0 else self._open + len(chunk)
            if self._open > MAX_EVENT_BYTES:
                raise ValueError("an SSE event too large to keep")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


# A resume of the upstream that the relay makes itself: the upstream's answer
# to a GET with ``Last-Event-ID`` set to the id given, if it is an event
# stream (None: refused, and the relay ends as broken).
Poll = Callable[[str], Awaitable["httpx.Response | None"]]


def poll_delay(retry_ms: int | None) -> float:
    """Seconds to wait before resuming a stream the server closed, from the
    last ``retry:`` it gave (milliseconds), bounded."""
    if retry_ms is None:
        return POLL_DELAY
    return min(max(retry_ms / 1000.0, POLL_DELAY_MIN), POLL_DELAY_MAX)


def start(
    relay: Relay,
    response: httpx.Response,
    forwarded: Callable[[str], None] | None = None,
    poll: Poll | None = None,
) -> None:
    """Read ``response``'s events into ``relay`` on a task of its own; the
    response is closed when the stream ends or the relay lets it go.
    ``poll``: how to resume the upstream when it closes the stream cleanly
    with requests of ``relay.pending`` unanswered (None: never)."""

    async def pump() -> None:
        failed = True
        current: httpx.Response | None = response
        retry: int | None = None
        polled = False
        try:
            while current is not None:
                current.stream = _Limited(current.stream)
                async for event in EventSource(current).aiter_sse():
                    relay.add(event)
                    if event.retry is not None:
                        retry = event.retry
                    if relay.pending is not None:
                        relay.pending.answered(event.data)
                    if forwarded is not None:
                        forwarded(f"{relay.key}:{relay.last}")
                    if polled and relay.pending is not None and not relay.pending.ids:
                        # Read as the client reads its own resume, to the
                        # answer: a server may hold a resumed stream open.
                        break
                if poll is None or relay.pending is None or not relay.pending.ids or (
                    relay.upstream_last_id is None
                ):
                    failed = False
                    break
                # The server closed the stream before the answers: it polls.
                await current.aclose()
                current = None
                await asyncio.sleep(poll_delay(retry))
                if relay.pending is None or not relay.pending.ids:
                    failed = False  # the client ended the session meanwhile
                    break
                current = await poll(relay.upstream_last_id)
                polled = True
        except asyncio.CancelledError:
            failed = False  # let go: no client came back within LINGER
        except Exception:
            pass  # the upstream broke: the next resume resumes it
        finally:
            relay.end(failed)
            if current is not None:
                with contextlib.suppress(Exception):
                    await current.aclose()

    relay.ended = relay.failed = False
    relay.task = asyncio.ensure_future(pump())
