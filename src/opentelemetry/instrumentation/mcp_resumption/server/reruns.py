# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Second runs: a ``tools/call`` run again, the same tool with the same
arguments, after its first run's stream had gone.

A client whose stream breaks usually re-issues the call at once, while the
abandoned first run is still working (before 2026-07-28 a disconnect is not a
cancellation; mcp 2.x's JSON answers are watched by nobody; a sync tool's
thread cannot be cancelled).  So a re-issue is paired with its first run
whenever it starts: while the first still runs and its stream is known gone,
or within the confirmation window after the first ended for nobody.

A pair is counted when the later of its two runs completes its work, and only
if both did: a first run cancelled before it did the work (2026-07-28 cancels
the handler when its stream closes) did not run twice, nor did a second run
that was cancelled.  Every run is kept from its start to its end (and a run
for nobody for the window after it), bounded; the arguments' digest is
computed only when a call of the same tool arrives while another is kept.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

MAX_KEPT = 4096  # runs kept (in flight, or for nobody within the window)

RUNNING, DONE, VOID = "running", "done", "void"


class Run:
    """One ``tools/call`` run, from its start to its end."""

    __slots__ = (
        "_digest", "_probe", "broken_at", "closed_at", "finished_at", "first", "for_nobody", "kept",
        "params", "second", "source", "started_at", "state", "tool", "version",
    )

    def __init__(
        self, tool: str, params: Any, version: str, probe: Callable[[], float | None] | None,
        source: Any,
    ) -> None:
        self.tool, self.params, self.version = tool, params, version
        self._probe = probe  # when its stream was known gone, or None
        self.source = source  # what answers.py may ask (its exchange)
        self._digest: str | None = None
        self.state = RUNNING
        self.started_at = time.monotonic()
        self.broken_at: float | None = None
        self.finished_at: float | None = None  # its work ended
        self.closed_at: float | None = None  # its answer went (or reached nobody)
        self.for_nobody = False  # its answer reached nobody
        self.kept = True
        self.first: Run | None = None  # the run this one runs again
        self.second: Run | None = None  # the run that runs this one again

    def digest(self) -> str:
        if self._digest is None:
            self._digest = arguments_digest(self.params)
            self.params = None  # only the digest is kept past the run
        return self._digest

    def gone(self) -> float | None:
        """When this run's stream was known gone (cached once known)."""
        if self.broken_at is None and self._probe is not None:
            self.broken_at = self._probe()
        return self.broken_at


def arguments_digest(params: Any) -> str:
    arguments = params.get("arguments") if isinstance(params, Mapping) else None
    try:
        text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        text = repr(arguments)
    return hashlib.sha256(text.encode()).hexdigest()


class Runs:
    """The runs kept, by (tool, server).  Not thread-safe: ``Deliveries``
    calls it under its lock."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._kept: OrderedDict[tuple[str, Any], list[Run]] = OrderedDict()
        self._count = 0

    def kept(self, tool: str, server: Any) -> list[Run]:
        """The runs of ``tool`` kept (answers.py probes their streams)."""
        return list(self._kept.get((tool, server), ()))

    def start(
        self, tool: str, params: Any, server: Any, version: str,
        probe: Callable[[], float | None] | None = None, source: Any = None,
    ) -> Run:
        """A run starts: kept, and paired with the first run it repeats, if any."""
        run = Run(tool, params, version, probe, source)
        key = (tool, server)
        others = self._kept.get(key)
        if others:
            now = run.started_at
            for other in others:
                if other.second is None and self._repeats(other, now) and (
                    other.digest() == run.digest()
                ):
                    other.second, run.first = run, other
                    break
            others.append(run)
            self._kept.move_to_end(key)
        else:
            self._kept[key] = [run]
        self._count += 1
        while self._count > MAX_KEPT:
            _, evicted = self._kept.popitem(last=False)
            self._count -= len(evicted)
            for each in evicted:
                each.kept = False
        return run

    def _repeats(self, first: Run, now: float) -> bool:
        """Whether a call starting ``now`` runs ``first`` again: its stream
        was gone, and it still runs, or ended for nobody within the window."""
        if first.state == VOID:
            return False
        broken = first.gone()
        if first.state == DONE:  # answering, or answered nobody
            ended = first.closed_at if first.closed_at is not None else now
            return (first.for_nobody or broken is not None) and now <= ended + self.window
        return broken is not None and now <= broken + self.window

    def finished(self, run: Run, completed: bool) -> list[tuple[Run, Run]]:
        """A run's work completed (or not: cancelled, failed); the pairs it
        completes, (first, second), each once."""
        if run.state != RUNNING:
            return []
        run.finished_at = time.monotonic()
        if not completed:
            run.state = VOID
            if run.first is not None:
                run.first.second = None
            if run.second is not None:
                run.second.first = None
            run.first = run.second = None
            return []
        run.state = DONE
        pairs = []
        if run.first is not None and run.first.state == DONE:
            pairs.append((run.first, run))
        if run.second is not None and run.second.state == DONE:
            pairs.append((run, run.second))
        return pairs

    def closed(self, run: Run, server: Any) -> None:
        """A run's answer went (or reached nobody: ``run.for_nobody``): a run
        for nobody, not yet run again, is kept for the window; the rest go."""
        now = run.closed_at = time.monotonic()  # the window runs from its answer's end
        if self._waits(run, now):
            run.digest()
        else:
            self._drop(run, server)
        others = self._kept.get((run.tool, server))
        for other in list(others or ()):
            if other.closed_at is not None and not self._waits(other, now):
                self._drop(other, server)

    def _waits(self, run: Run, now: float) -> bool:
        """Whether a closed run may still be run again."""
        return (
            run.state == DONE and run.for_nobody and run.second is None
            and run.closed_at is not None and now <= run.closed_at + self.window
        )

    def _drop(self, run: Run, server: Any) -> None:
        if not run.kept:
            return
        key = (run.tool, server)
        others = self._kept.get(key)
        if others is None or run not in others:
            return
        others.remove(run)
        run.kept = False
        self._count -= 1
        if not others:
            del self._kept[key]
