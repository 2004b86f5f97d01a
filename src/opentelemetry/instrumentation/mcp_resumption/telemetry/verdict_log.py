# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What the plugin decided, readable without a collector: one log line per
verdict, a hint the first time a server's resumes cannot be proven for its
opaque event ids, and a per-server summary at exit.

Python's ``logging``, logger ``opentelemetry.instrumentation.mcp_resumption.verdicts``:
it is where a Python programmer looks first, it needs no exporter or
collector, and its levels and handlers are the host's to set.  A verdict that
lost something or could not resume (``gap``, ``rejected``, ``not_resumable``,
``failed``), the hint, and the summary of a server that had one of those, a
gap or a lost call, are WARNINGs; the other verdicts and summaries are INFO.

Where the program configured no logging (no handler on the logger or its
parents), Python would print only the WARNINGs (its "last resort" handler);
then every line goes to stderr, the message alone, as that handler writes
it: a person running a script sees the summary the README shows without
setting anything.  A level set on the logger or a parent is still obeyed
(the root's default WARNING aside, which is what "configured nothing"
looks like), as are ``logging.disable`` and a disabled logger.  Once a
handler is configured, the program's configuration alone decides.  The
summary is written at exit because a short-lived client has no other
moment, and a long-lived one can ask for it at any time
(:func:`summary_lines`).

``OTEL_PYTHON_MCP_RESUMPTION_VERDICT_LOG``: ``logging`` (default: as above),
``stderr`` (every verdict and the summary to stderr, whatever the logging
configuration), ``off``.

Process-wide, as the exit is: every instrument() cycle adds to the same
tally.  The exit hook is registered when this module is imported, before
``instrument()`` registers its own (which decides the calls still waiting
as lost): exit hooks run last-registered first, so the summary counts those
too.  Before the first MCP server is seen it writes nothing and adds no
handler, so a program that never speaks MCP is untouched.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..forks import renew_after_fork
from ..rules.tasks import LOSSES as TASK_LOSSES  # a task that lost something: a WARNING summary
from .budget import LogBudget

LOGGER_NAME = "opentelemetry.instrumentation.mcp_resumption.verdicts"
SETTING = "OTEL_PYTHON_MCP_RESUMPTION_VERDICT_LOG"
MODES = ("logging", "stderr", "off")

# Outcomes that lost something or could not resume: WARNING.  The others
# (resumed, caught_up, reinitialized, unverifiable) are INFO.
WARNING_OUTCOMES = frozenset({"gap", "rejected", "not_resumable", "failed"})
LOST = "orphaned_request"  # a call whose answer never came: a lost call
MAX_SERVERS = 1024  # servers tallied; beyond, their verdicts are logged, not summed

_logger = logging.getLogger(LOGGER_NAME)
_config_logger = logging.getLogger(__name__)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Python's last-resort handler, for every level: the message alone, to
    ``sys.stderr`` as it is when the line is written (a program or a test
    may replace it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        pass


_unconfigured = _Stderr()


def _threshold_unconfigured() -> int:
    """The level from which a line is written when no handler is configured:
    a level set on the logger or a parent below the root, else the root's,
    unless that is its default WARNING."""
    logger: logging.Logger | None = _logger
    while logger is not None and logger.parent is not None:
        if logger.level:
            return logger.level
        logger = logger.parent
    root = logging.getLogger().level
    return logging.INFO if root == logging.WARNING else root


def _enabled(level: int) -> bool:
    if _logger.hasHandlers():
        return _logger.isEnabledFor(level)
    if _logger.disabled or _logger.manager.disable >= level:
        return False
    return level >= _threshold_unconfigured()


def _write(level: int, message: str, *args: object) -> None:
    """One line: through the program's logging configuration, or to stderr
    where it configured none (see the module's doc)."""
    if _logger.hasHandlers():
        _logger.log(level, message, *args)
        return
    if not _enabled(level):
        return
    record = _logger.makeRecord(_logger.name, level, "(unknown file)", 0, message, args, None)
    if _logger.filter(record):
        _unconfigured.handle(record)


@dataclass
class _Server:
    outcomes: Counter[str] = field(default_factory=Counter)
    gaps: Counter[str] = field(default_factory=Counter)
    hinted: bool = False
    # Findings that are not a resume's: "may_run_twice", "ran_twice".
    findings: Counter[str] = field(default_factory=Counter)
    # Tasks by fate (tasks.Fate's values).
    tasks: Counter[str] = field(default_factory=Counter)


class VerdictLog:
    """The tally and the lines.  One per process (:data:`verdicts`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[str, _Server] = {}
        self._budget = LogBudget(MAX_SERVERS * 4)
        self._mode: str | None = None
        # A process with two legs (mcp-resumption-proxy) ends each line with
        # the leg it is about: server -> words, None -> every other server.
        self._legs: dict[str | None, str] = {}

    # -- settings

    def set_leg(self, server: str | None, words: str) -> None:
        """End every line about ``server`` (None: any server not set) with
        ``words`` (the proxy's `` leg=... (between ...)``)."""
        with self._lock:
            if server is None or len(self._legs) < MAX_SERVERS:
                self._legs[server] = words

    def _leg(self, server: str) -> str:
        legs = self._legs
        return legs.get(server, legs.get(None, "")) if legs else ""

    def mode(self) -> str:
        if self._mode is None:
            value = os.environ.get(SETTING, "").strip().lower() or "logging"
            if value not in MODES:
                _config_logger.warning(
                    "%s=%r is not one of %s; using 'logging'", SETTING, value, ", ".join(MODES)
                )
                value = "logging"
            self._mode = value
            if value == "stderr" and not any(
                getattr(h, "_mcp_resumption", False) for h in _logger.handlers
            ):
                handler = logging.StreamHandler()
                handler.setFormatter(logging.Formatter("%(message)s"))
                handler._mcp_resumption = True  # type: ignore[attr-defined]
                _logger.addHandler(handler)
                _logger.setLevel(logging.INFO)
                _logger.propagate = False
        return self._mode

    # -- what the sink reports

    def server_seen(self, server: str) -> None:
        """The first MCP server: from here on there is something to sum up."""
        if self.mode() == "off":
            return
        self._tally(server)

    def gap(self, server: str, kind: str) -> None:
        tally = self._tally(server)
        if tally is not None:
            with self._lock:
                tally.gaps[kind] += 1

    def verdict(
        self,
        server: str,
        transport: str,
        outcome: str,
        gap_kinds: Iterable[str] = (),
        *,
        opaque_ids: bool = False,
        awaiting: int = 0,
        line: str | None = "",
        tally: bool = True,
    ) -> None:
        """One attempt's verdict: tallied (``tally``: when the attempt is
        over), and written as one line (``line``: None for none, else what
        follows it: "" when it is decided, " (final)" when the attempt's
        final verdict differs from the line written at the decision).
        ``awaiting``: calls still without an answer or a fate, which the line
        counts apart from the lost ones (each lost call gets its own line)."""
        if self.mode() == "off":
            return
        kinds = sorted(gap_kinds)
        lost = kinds.count(LOST)
        hint = False
        if tally:
            record = self._tally(server)
            if record is not None:
                with self._lock:
                    record.outcomes[outcome] += 1
                    if outcome == "unverifiable" and opaque_ids and not record.hinted:
                        record.hinted = hint = True
        level = logging.WARNING if outcome in WARNING_OUTCOMES else logging.INFO
        if line is not None and _enabled(level) and self._budget.take((outcome, server)):
            _write(
                level,
                "mcp-resumption verdict: %s server=%s transport=%s gaps=%s lost_calls=%d%s%s%s",
                outcome,
                server,
                transport,
                ",".join(sorted(set(kinds))) or "-",
                lost,
                f" awaiting={awaiting}" if awaiting else "",
                self._leg(server),
                line,
            )
        if hint:
            _write(
                logging.WARNING,
                "mcp-resumption hint: server=%s: its resumes are unverifiable because its event "
                "ids are opaque (no counter the plugin can order them by, e.g. UUIDs). To make "
                "them provable, wrap the server's event store in ProvableEventStore "
                "(opentelemetry.instrumentation.mcp_resumption.server), or declare the ids' "
                "scheme in OTEL_PYTHON_MCP_RESUMPTION_EVENT_ID_PATTERN%s",
                server,
                self._leg(server),
            )

    def finding(self, server: str, kind: str, line: str, *args: object) -> None:
        """A finding that is no resume's verdict (a lost subscription, a
        re-issue that may run a tool twice, one that did): one WARNING line,
        tallied under ``kind`` (a gap kind is tallied by ``gap``)."""
        if self.mode() == "off":
            return
        tally = self._tally(server)
        if tally is not None and kind:
            with self._lock:
                tally.findings[kind] += 1
        if _enabled(logging.WARNING) and self._budget.take((kind or line, server)):
            leg = self._leg(server)
            if leg:
                # Next to the server's name (the line's first argument).
                line = line.replace("server=%s", "server=%s" + leg.replace("%", "%%"), 1)
            _write(logging.WARNING, line, *args)

    def task(self, server: str, fate: str) -> None:
        """A task's fate, tallied for the summary."""
        if self.mode() == "off":
            return
        tally = self._tally(server)
        if tally is not None:
            with self._lock:
                tally.tasks[fate] += 1

    # -- the summary

    def summary_lines(self) -> list[str]:
        """One line per server seen: its resumes by outcome, its gaps by kind
        and its lost calls."""
        return [line for line, _ in self._summaries()]

    def write_summary(self) -> None:
        """Log the summary (at exit): WARNING for a server that had a gap, a
        lost call or a verdict logged as a WARNING, INFO for the others.
        Never raises."""
        try:
            if not self._servers or self.mode() == "off":
                return
            for line, bad in self._summaries():
                _write(logging.WARNING if bad else logging.INFO, "%s", line)
        except Exception:  # at exit, in the host's process: never a traceback
            pass

    def _summaries(self) -> list[tuple[str, bool]]:
        """(the summary line, whether it is bad) of each server, by name."""
        with self._lock:
            servers = {
                name: (
                    Counter(tally.outcomes),
                    Counter(tally.gaps),
                    Counter(tally.findings),
                    Counter(tally.tasks),
                )
                for name, tally in self._servers.items()
            }
        summaries = []
        for name, (outcomes, gaps, findings, tasks) in sorted(servers.items()):
            by_outcome = " ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))
            by_kind = ",".join(f"{k}:{v}" for k, v in sorted(gaps.items())) or "-"
            line = (
                f"mcp-resumption summary: server={name} attempts={sum(outcomes.values())}"
                + (f" {by_outcome}" if by_outcome else "")
                + f" gaps={by_kind} lost_calls={gaps.get(LOST, 0)}"
                + "".join(f" {kind}={n}" for kind, n in sorted(findings.items()))
                + (
                    " tasks=" + ",".join(f"{k}:{v}" for k, v in sorted(tasks.items()))
                    if tasks
                    else ""
                )
                + self._leg(name)
            )
            bad = (
                bool(gaps)
                or bool(findings)
                or not WARNING_OUTCOMES.isdisjoint(outcomes)
                or not TASK_LOSSES.isdisjoint(tasks)
            )
            summaries.append((line, bad))
        return summaries

    def _after_fork(self) -> None:
        """A forked child sums up its own resumes, not its parent's."""
        self._lock = threading.Lock()
        self._servers = {}
        self._budget = LogBudget(MAX_SERVERS * 4)

    def reset(self) -> None:
        """Forget the tally (tests)."""
        with self._lock:
            self._servers.clear()
            self._legs.clear()
        self._budget = LogBudget(MAX_SERVERS * 4)
        self._mode = None

    def _tally(self, server: str) -> _Server | None:
        with self._lock:
            tally = self._servers.get(server)
            if tally is None and len(self._servers) < MAX_SERVERS:
                tally = self._servers[server] = _Server()
            return tally


verdicts = VerdictLog()
atexit.register(verdicts.write_summary)  # see the module's doc for the order
renew_after_fork(verdicts)


def summary_lines() -> list[str]:
    """The per-server summary so far, as the exit would log it."""
    return verdicts.summary_lines()


def server_name(address: str, port: int | None) -> str:
    return address if port is None else f"{address}:{port}"
