# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The life of one stream as the tracker follows it: fed, then finished.

Pure: standard library only, and not thread-safe on its own (the tracker
calls it under its lock).  ``StreamLife`` takes a stream's events, folded in
from the SSE patch's feed (``fold``) or one by one (``received``): what
each changes in its record and its session's (``records``), in its
resume's check (``resumes``), in the requests it answers (``requests``)
and their fates (``breaks``).  Then its end (``end``): its record made
compact (``records.Stream.finish``), its check ended, and what it broke
handed on.  Where a stream is opened, the tracker composes the rooms
itself (``Tracker.open_stream``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..rules.continuity import ObservedEvent, ReplayContract, reuses_id
from ..rules.event_ids import EventId
from ..rules.jsonrpc import TOOLS_LIST, is_message, responses_in
from .breaks import Breaks
from .cursors import CursorIndex
from .records import MAX_KEPT_ID_BYTES, NOTHING, Step, Stream, bounded_id
from .requests import Reissues, Requests
from .resumes import Resumes
from .seen_window import remember_packed

__all__ = ["StreamLife"]


class StreamLife:
    """What the events and the end of a stream change."""

    def __init__(
        self,
        contract: ReplayContract,
        parse: Callable[[str | None], EventId | None],
        index: CursorIndex,
        requests: Requests,
        reissues: Reissues,
        breaks: Breaks,
        resumes: Resumes,
    ) -> None:
        self.contract = contract
        self.parse = parse
        self.index = index
        self.requests = requests
        self.reissues = reissues
        self.breaks = breaks
        self.broken = breaks.broken
        self.resumes = resumes

    def fold(self, stream: Stream) -> None:
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
                stream.retry(event.retry)
            self.received(stream, event.id, event.data)
        if not holding and (stream.last_received is not None or stream.unconsumed_responses):
            stream.take()

    def received(
        self, stream: Stream, event_id: str | None, data: str, digest: int | None = None
    ) -> Step:
        """An event is handed to the application, which has thereby taken the
        one before it (it asked for this one) but not yet this one.

        The hot path of the plugin: a few attribute and dict operations under
        the lock, no parsing unless the stream is a resume under check."""
        if not event_id:
            event_id = None
        elif len(event_id) > MAX_KEPT_ID_BYTES // 4 and not (
            len(event_id) <= MAX_KEPT_ID_BYTES and event_id.isascii()
        ):  # (an ASCII id within the bound is kept as it is: a uuid needs no call)
            event_id = bounded_id(event_id)
        if digest is None:
            digest = hash(data)
        session = stream.session
        # Most events on a busy stream are notifications: skip the call.
        responses = responses_in(data) if '"result"' in data or '"error"' in data else ()
        unreadable = responses is None
        if unreadable:
            responses = ()
        priming = not data
        # Asking for this event took the one before (``Stream.take``, written
        # out: it runs for every event reported).
        stream.taken = False
        if stream.unconsumed_responses:
            session.answered(stream.unconsumed_responses)
            stream.unconsumed_responses = ()
        if stream.last_received is not None:
            stream.last_consumed = stream.last_received
            stream.consumed_data = stream.last_data
        step = NOTHING
        check = stream.check
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
            elif self.resumes.same_meaning(check, event_id, data):
                digest = session.seen.get(event_id)
        if unreadable:
            session.forget_pending(stream.lineage)
        if check is not None and check.event_matters(
            event_id, digest, bool(responses) or unreadable
        ):
            event = ObservedEvent(
                self.parse(event_id), digest, not data, responses, unreadable
            )
            step = self.resumes.run(stream, lambda: check.on_event(event))
        if event_id is not None:
            # Where no resume holds the session's window, the packed record
            # takes a new id as it is (``remember_packed``: no view made).
            packed = session.window is None
            if data:
                if not (packed and remember_packed(session, event_id, digest)):
                    session.seen.remember(event_id, digest)
            else:
                # A marker carries no content to compare, but its id shows
                # whether the scheme counts; a priming event: the server
                # may close the stream to poll.
                if priming:
                    stream.primed = True
                if not (packed and remember_packed(session, event_id, None, if_new=True)):
                    seen = session.seen
                    if event_id not in seen:
                        seen.remember(event_id, None)
            stream.last_received = event_id
            if self.contract is ReplayContract.INCLUSIVE:
                # Only an inclusive server sends the cursor event again (see
                # Stream.finish); else this would keep the app's data alive.
                stream.last_data = data
        stream.unconsumed_responses = responses
        if responses and session.ops:
            self.requests.answered_ops(session, responses, data)
        if responses:
            pending = session.pending
            if pending:
                for key in responses:
                    entry = pending.get(key)
                    if entry is not None and entry[0] == TOOLS_LIST:
                        self.reissues.remember_hints(stream.server, data)
            if self.reissues.watched:
                self.reissues.answers_seen(session, responses)
        broken = self.broken
        if (responses or unreadable) and broken.awaited_servers:  # (bool(broken), no call)
            answered = (
                broken.unreadable(session) if unreadable else broken.answered(session, responses)
            )
            step = self.breaks.fated(answered, step)
        if not stream.dirty:
            stream.dirty = True
            self.index.dirty.append(stream)
        return step

    def end(
        self,
        stream: Stream,
        reason: str,
        closed_by_client: bool,
        clean: bool,
        held_open: bool,
    ) -> Step:
        """The stream ended (see ``Tracker.stream_ended``): its record made
        compact, its check ended, what it broke handed on."""
        feed = stream.feed
        if feed is not None and (feed.ring or not stream.taken):
            # (An empty ring and the last event taken: the fold could only
            # take it, which the settling below does.)
            self.fold(stream)
        if stream.feed is not None:
            stream.feed = None
            self.index.fed.pop(stream.key, None)
        if stream.taken:  # (Stream.settle and Stream.take, written out)
            stream.taken = False
            if stream.unconsumed_responses:
                stream.session.answered(stream.unconsumed_responses)
                stream.unconsumed_responses = ()
            if stream.last_received is not None:
                stream.last_consumed = stream.last_received
                stream.consumed_data = stream.last_data
        if stream.ended and stream.check is None:
            return NOTHING
        session = stream.session
        if stream.check is not None and session.window is not None:
            session.window.release()  # packed once, now
            session.window = None  # nothing unpacked is kept
        stream.finish(self.contract is ReplayContract.INCLUSIVE)
        stream.server_closed = (
            clean and not closed_by_client and stream.primed and not session.terminated
        )
        if closed_by_client and set(stream.carries).intersection(stream.unconsumed_responses):
            # A POST stream closed right after the answer to its own
            # request: the client took it (that is how the MCP SDKs finish
            # a request), unlike a long-lived stream dropped mid-read.
            stream.taken = True
            stream.settle()
        if closed_by_client and stream.carries and session.ops:
            # Closed without their answers: cancelled by the client, an
            # operation without an answer or a fate, not timed.
            ops = session.ops
            for key in stream.carries:
                ops.pop(key, None)
        broke = not closed_by_client and not stream.server_closed
        body, stream.request_body = stream.request_body, None
        if stream.check is None:
            if broke or stream.server_closed:
                return self.breaks.broken_stream(stream, body, reason, poll=not broke)
            if closed_by_client and stream.carries and session.pending:
                # A subscription the client ended (2026-07-28 cancels a
                # request by closing its stream): over, not lost.
                self.breaks.ended_locally(stream)
            return NOTHING
        return self.resumes.end(
            stream, reason, closed_by_client=closed_by_client, held_open=held_open,
            broke=broke,
        )
