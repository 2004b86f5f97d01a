# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""A resume under check: begun at its cursor's stream, run, ended.

Pure: standard library only, and not thread-safe on its own (the tracker
calls it under its lock).  ``Resumes`` starts a resume's
``continuity.ResumeCheck`` from what the stream that issued the cursor left
(its lineage, its last ids, the session's seen window, the requests it was
to answer), runs each observation of the resumed stream through it into a
``Step``, and ends it with the stream, handing the requests it still holds
back to its lineage.  The rules themselves are ``continuity``'s.
"""

from __future__ import annotations

from collections.abc import Callable

from ..rules.continuity import Cursor, Gap, ReplayContract
from ..rules.event_ids import EventId, corroborated
from ..rules.fates import Broken, Decided
from ..rules.jsonrpc import canonical_digest
from ..rules.resume_check import ResumeCheck
from .breaks import Breaks
from .records import NOTHING, Step, Stream
from .seen_window import SEEN_WINDOW, SeenWindow

__all__ = ["Resumes"]


class Resumes:
    """The checks of resumed streams: begun, run, ended."""

    def __init__(
        self,
        contract: ReplayContract,
        parse: Callable[[str | None], EventId | None],
        streams: dict[int, Stream],
        breaks: Breaks,
    ) -> None:
        self.contract = contract
        self.parse = parse
        self.streams = streams  # the tracked streams (CursorIndex.streams)
        self.breaks = breaks

    def begin(
        self,
        stream: Stream,
        cursor_raw: str,
        previous: Stream | None,
        request_session_id: str | None,
    ) -> ResumeCheck:
        cursor_id = self.parse(cursor_raw)
        if previous is None:
            # Evicted or never seen: the request's own session header is the
            # only binding left, and nothing else can be proven (not even the
            # id's order: no history shows its scheme counting).
            cursor = Cursor(EventId(cursor_raw), session_id=request_session_id)
            return ResumeCheck(cursor, self.contract)
        previous.settle()
        previous.finish(self.contract is ReplayContract.INCLUSIVE)
        previous.resumed_again = True
        # Attempts of this lineage that ended holding its requests are over:
        # this one takes the requests over.  The caller reports them.
        continued = [previous] if previous.check is not None and previous.check.held else []
        for holder_key in set((previous.session.holders or {}).values()):
            holder = self.streams.get(holder_key)
            if holder is not None and holder is not previous and holder.lineage == previous.lineage:
                continued.append(holder)
        over = self.breaks.lineage_over
        stream.continued = tuple(h for h in continued if over(h, []) is not None)
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
        carrier = self.parse(previous.last_received)
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

    @staticmethod
    def same_meaning(check: ResumeCheck | None, event_id: str, data: str) -> bool:
        """The cursor event sent again with the same JSON meaning in other
        bytes (a store that keeps JSON as JSONB)."""
        if check is None or check.cursor.meaning is None or event_id != check.cursor.event_id.raw:
            return False
        return canonical_digest(data) == check.cursor.meaning

    def run(self, stream: Stream, observe: Callable[[], list[Gap]]) -> Step:
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
            window = self.breaks.orphaned(stream, check.take_orphans(), new, fates)
        if not gaps and decided is None and final is None and not new and not window:
            return NOTHING
        return Step(
            tuple(gaps), decided, final=final, broke=tuple(new), fates=tuple(fates), window=window
        )


    def end(
        self,
        stream: Stream,
        reason: str,
        *,
        closed_by_client: bool,
        held_open: bool,
        broke: bool,
    ) -> Step:
        """A resumed stream ended (its record finished): the check's end,
        and the requests it still holds handed back to its lineage (broken
        now if the stream ``broke``)."""
        check = stream.check
        was_open = not check.closed
        step = self.run(
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
        new, fates, window = self.breaks.held_at_end(stream, held, broke)
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
