# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""A resume answered by a hop: a redirect the client follows itself, a 2xx
without an event stream, a rejection or no answer at all, which the MCP SDKs
retry.  The answer is parked (:class:`_Hop`) until the next request with the
same cursor and session continues the attempt, or judged when none comes
within the confirmation window.

A part of :class:`~.monitor.ResumptionMonitor` (its base :class:`Hops`),
apart to be read alone: the owner judges a hop by opening its stream's
context (``_open``) as it would have at the answer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import contextvars

    from .. import config
    from ..telemetry.facts import RequestFacts, ResumeStart
    from ..tracking.tracker import Tracker
    from .deadlines import Deadlines

__all__ = ["Hops"]

_HopKey = tuple[str, str, "str | None"]  # server, Last-Event-ID, Mcp-Session-Id


@dataclass
class _Hop:
    """A resume answered without a stream the client may still follow: a 3xx
    (the MCP SDKs follow same-origin redirects themselves, one request per
    hop), a 2xx that is not an event stream (mcp 2.x retries it), or a
    rejection that would orphan requests (both SDKs retry it).  Part of the
    attempt, not a verdict: the next request with the same cursor and session
    continues the attempt, and only if none comes is this answer judged.
    Parked at most a confirmation window, so the parked set stays small."""

    facts: RequestFacts
    resume: ResumeStart
    status: int  # 0: no HTTP answer (``error`` says what the client raised)
    session_id: str | None
    deadline: list | None = None
    error: str | None = None


class Hops:
    """Parks a resume's answer that the client may still follow, and judges
    it when nothing follows."""

    # The owner's: its settings, tracker and timer, and the running task's
    # reconnect loop's list of the hops it parked (``channels``).
    settings: config.Settings
    tracker: Tracker
    _deadlines: Deadlines
    hop_scope: contextvars.ContextVar[list[_HopKey] | None]

    def __init__(self) -> None:
        # The parked answers, by server, cursor and session.
        self._hops: dict[_HopKey, _Hop] = {}
        self._hops_lock = threading.Lock()

    def _is_hop(self, facts: RequestFacts, status: int, event_stream: bool) -> bool:
        if 300 <= status < 400:
            return True  # whatever its content type, a redirect is never the stream itself
        if status < 300:
            return not event_stream
        # A rejection: the MCP SDKs retry it.  Where it would orphan requests,
        # the answer that ends the retries decides, so that the same answer
        # gives the same outcome each time; with nothing in flight it is
        # `rejected` at once.
        return self.tracker.awaits_answers(
            facts.server, facts.last_event_id or "", facts.session_id, facts.path
        )

    def _park(self, hop: _Hop) -> None:
        key = (hop.facts.server, hop.facts.last_event_id or "", hop.facts.session_id)
        with self._hops_lock:
            replaced = self._hops.pop(key, None)
            self._hops[key] = hop
        if replaced is not None:  # another attempt with the same cursor: judge that one now
            self._deadlines.cancel(replaced.deadline)
            self._judge(replaced)
        hop.deadline = self._deadlines.add(self.settings.confirm_timeout, lambda: self.settle(key))
        scope = self.hop_scope.get()
        if scope is not None:
            scope.append(key)

    def _unpark(self, key: _HopKey) -> _Hop | None:
        with self._hops_lock:
            hop = self._hops.pop(key, None)
        if hop is not None:
            self._deadlines.cancel(hop.deadline)
        return hop

    def settle(self, key: _HopKey) -> None:
        """No request followed the hop parked under ``key``: judge its answer."""
        hop = self._unpark(key)
        if hop is not None:
            self._judge(hop)

    def _judge(self, hop: _Hop) -> None:
        self._open(hop.facts, hop.resume, hop.status, hop.session_id, False, error=hop.error)

    def request_failed(self, facts: RequestFacts, resume: ResumeStart, error: str) -> None:
        """A resume got no HTTP answer (``error``: the type the client
        raised).  Part of the attempt, as a rejection is: the MCP SDKs try
        again, and the last try's answer is the verdict."""
        self._park(_Hop(facts, resume, 0, None, error=error))
