# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Deliveries: what became of each answer an MCP server computed, as telemetry.

On 2026-07-28 there are no resumes: a broken stream loses its request, and
closing a response stream is how a client cancels.  Only the server knows
whether the answer it computed reached an open stream, went into its event
store for a resume, or was written for a client already gone; and whether a
tool ran to completion for nobody (before 2026-07-28 a disconnect is not a
cancellation, and mcp 2.x's JSON answers are not watched on 2026-07-28
either), so that the client's re-issue runs it twice.

Cost.  A metric record costs ~111,000 instructions on OpenTelemetry SDK 1.45,
and the answer path of a server had none.  So nothing here records on that
path: each fate, each call done for nobody, each second run and each
listen's end is added to an in-process tally (a dict addition under a lock),
and the observable counters report the tallies at each collection, as the
client half's ``mcp.client.stream.events`` does.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from ..telemetry import semconv as sc
from ..telemetry.budget import LogBudget
from .reruns import Run, Runs

_logger = logging.getLogger("opentelemetry.instrumentation.mcp_resumption.server")

# Bounds: tool names are the server's own (its tools/list answers), but a
# client may call any name; past these, the rest share one value.
MAX_TOOLS = 256
OTHER_TOOL = "_OTHER"
MAX_SERVERS = 1024
# The listen filters a client may ask for (SubscriptionFilter's fields): the
# attribute is the sorted set of those asked, so it stays bounded.
LISTEN_FILTERS = {
    "toolsListChanged": "tools",
    "promptsListChanged": "prompts",
    "resourcesListChanged": "resources",
    "resourceSubscriptions": "resource_updates",
}

Server = tuple[str, str, "int | None"]  # transport, address, port


class Deliveries:
    """The tallies of one observer, and the counters that report them."""

    def __init__(self, meter: Meter, confirm_timeout: float) -> None:
        self._lock = threading.Lock()
        self.window = confirm_timeout
        self._fates: dict[tuple[str, str, str, int | None], int] = {}
        # (tool, version, hint, server) and (tool, version, server)
        self._wasted: dict[tuple[str, str, str, Server], int] = {}
        self._second: dict[tuple[str, str, Server], int] = {}
        self._listens: dict[tuple[str, str, str], int] = {}
        self._servers: set[Server] = set()
        # Tool name -> the hint of its annotations (from tools/list answers).
        self._hints: OrderedDict[str, str] = OrderedDict()
        self._names: set[str] = set()
        self._started: set[tuple[str, Server]] = set()  # (tool, server) series at 0
        # Each tools/call run, from its start to its end (and a run for
        # nobody for the window after it): the runs a re-issue repeats.
        self._runs = Runs(confirm_timeout)
        self._budget = LogBudget()
        name, unit, description = sc.SERVER_DELIVERIES
        meter.create_observable_counter(name, [self._observe_fates], unit, description)
        name, unit, description = sc.SERVER_WORK_FOR_NOBODY
        meter.create_observable_counter(name, [self._observe_wasted], unit, description)
        name, unit, description = sc.SERVER_SECOND_RUNS
        meter.create_observable_counter(name, [self._observe_second], unit, description)
        name, unit, description = sc.SERVER_LISTENS
        meter.create_observable_counter(name, [self._observe_listens], unit, description)

    # ------------------------------------------------------------ the tallies

    def seen(self, server: Server) -> None:
        """A request of ``server``: every fate of it starts at 0 before its
        first answer (Prometheus' increase() cannot see a series born at 1)."""
        if server in self._servers:  # the usual case: no lock
            return
        transport, address, port = server
        with self._lock:
            if len(self._servers) < MAX_SERVERS:
                self._servers.add(server)
                for each in sc.DELIVERY_FATES:
                    self._fates.setdefault((each, transport, address, port), 0)

    def fate(self, fate: str, server: Server) -> None:
        self.seen(server)
        transport, address, port = server
        with self._lock:
            key = (fate, transport, address, port)
            self._fates[key] = self._fates.get(key, 0) + 1

    def listen_started(self, notifications: Any, transport: str) -> None:
        """Every end of a listen's filter starts at 0 when one is opened."""
        wanted = _listen_filter(notifications)
        with self._lock:
            for each in sc.LISTEN_ENDS:
                self._listens.setdefault((each, wanted, transport), 0)

    def listen_ended(self, end: str, notifications: Any, transport: str) -> None:
        wanted = _listen_filter(notifications)
        with self._lock:
            for each in sc.LISTEN_ENDS:
                self._listens.setdefault((each, wanted, transport), 0)
            key = (end, wanted, transport)
            self._listens[key] = self._listens.get(key, 0) + 1

    # ------------------------------------------------------------ tools

    def tools_listed(
        self, result: Any, server: Server | None = None, version: str | None = None
    ) -> None:
        """A tools/list answer: the hints its tools declare.  Each listed
        tool's series start at 0 here, before its first call: a call run for
        nobody before Prometheus read a 0 is a series born at 1, which
        increase() cannot see."""
        tools = result.get("tools") if isinstance(result, Mapping) else None
        if not isinstance(tools, list):
            return
        with self._lock:
            for tool in tools:
                if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
                    continue
                annotations = tool.get("annotations")
                hint = sc.HINT_NONE
                if isinstance(annotations, Mapping):
                    if annotations.get("readOnlyHint") is True:
                        hint = sc.HINT_READ_ONLY
                    elif annotations.get("idempotentHint") is True:
                        hint = sc.HINT_IDEMPOTENT
                self._hints[tool["name"]] = hint
                self._hints.move_to_end(tool["name"])
                if len(self._hints) > MAX_TOOLS:
                    self._hints.popitem(last=False)
        if server is None:
            return
        for tool in tools:
            name = tool.get("name") if isinstance(tool, Mapping) else None
            if isinstance(name, str) and (name, server) not in self._started:
                self._start(name, server, version or "unknown")

    def called(
        self, params: Any, server: Server, version: str | None,
        probe: Callable[[], float | None] | None = None, source: Any = None,
    ) -> Run | None:
        """A tools/call arrived: its run, paired with the run it repeats
        (reruns.py).  ``probe`` tells when its stream was known gone.  The
        first call of a tool starts its series at 0."""
        name = _tool(params)
        if name is None:
            return None
        if (name, server) not in self._started:
            self._start(name, server, version or "unknown")
        with self._lock:
            return self._runs.start(name, params, server, version or "unknown", probe, source)

    def kept(self, tool: Any, server: Server) -> list[Run]:
        """The runs of ``tool`` in flight (answers.py probes their streams)."""
        if not isinstance(tool, str):
            return []
        with self._lock:
            return self._runs.kept(tool, server)

    def finished(self, run: Run | None, completed: bool, server: Server) -> None:
        """A run's work completed (or not): a pair it completes is a second run."""
        if run is None:
            return
        with self._lock:
            pairs = self._runs.finished(run, completed)
            for first, _ in pairs:
                key = (self._bounded(first.tool), first.version, server)
                self._second[key] = self._second.get(key, 0) + 1
        for first, second in pairs:
            self._ran_twice(first, second)

    def closed(self, run: Run | None, server: Server) -> None:
        """A run's answer went, or reached nobody (``work_for_nobody`` first)."""
        if run is not None:
            with self._lock:
                self._runs.closed(run, server)

    def _ran_twice(self, first: Run, second: Run) -> None:
        with self._lock:
            name = self._bounded(first.tool)
            hint = self._hints.get(first.tool, sc.HINT_NONE)
            speak = self._budget.take(("second_run", name))
        if not speak:
            return
        if first.finished_at is not None and first.finished_at <= second.started_at:
            when = "after its first run had answered nobody"
        else:
            when = "while its first run was still working for a client gone"
        declared = {
            sc.HINT_READ_ONLY: "it declares readOnlyHint",
            sc.HINT_IDEMPOTENT: "it declares idempotentHint",
        }.get(hint, "it declares neither idempotentHint nor readOnlyHint")
        _logger.warning(
            "tool %r ran twice: its call, re-issued with the same arguments %s, ran "
            "again, and both runs completed (protocol %s); %s",
            name, when, first.version, declared,
        )

    def _start(self, tool: str, server: Server, version: str) -> None:
        with self._lock:
            if len(self._started) >= MAX_TOOLS * 4:
                return
            self._started.add((tool, server))
            name = self._bounded(tool)
            hint = self._hints.get(tool, sc.HINT_NONE)
            self._wasted.setdefault((name, version, hint, server), 0)
            self._second.setdefault((name, version, server), 0)

    def work_for_nobody(
        self, params: Any, version: str | None, reason: str, server: Server,
        run: Run | None = None,
    ) -> None:
        """A tools/call ran to completion after its client's stream was gone;
        its run (if known) may be run again within the window."""
        tool = _tool(params)
        if tool is None:
            return
        version = version or "unknown"
        with self._lock:
            hint = self._hints.get(tool, sc.HINT_NONE)
            name = self._bounded(tool)
            key = (name, version, hint, server)
            self._wasted[key] = self._wasted.get(key, 0) + 1
            if run is not None:
                run.for_nobody = True
            speak = self._budget.take(("work_for_nobody", name))
        if not speak:
            return
        if hint == sc.HINT_NONE:
            _logger.warning(
                "tool %r ran to completion after its client's stream was gone (%s, "
                "protocol %s): its answer reached nobody. The client may re-issue the "
                "call, and then the work runs twice; declare idempotentHint or "
                "readOnlyHint on the tool if running it twice is harmless",
                name, reason, version,
            )
        else:
            _logger.info(
                "tool %r ran to completion after its client's stream was gone (%s, "
                "protocol %s); it declares %sHint, so a re-issued call running it "
                "again is harmless",
                name, reason, version,
                "readOnly" if hint == sc.HINT_READ_ONLY else "idempotent",
            )

    def _bounded(self, tool: str) -> str:
        if tool in self._hints or tool in self._names:
            return tool
        if len(self._names) < MAX_TOOLS:
            self._names.add(tool)
            return tool
        return OTHER_TOOL

    # ------------------------------------------------------------ callbacks

    def _observe_fates(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            tallies = list(self._fates.items())
        for (fate, transport, address, port), value in tallies:
            yield Observation(
                value, {sc.DELIVERY_FATE: fate, **_server_attributes((transport, address, port))}
            )

    def _observe_wasted(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            tallies = list(self._wasted.items())
        for (tool, version, hint, server), value in tallies:
            yield Observation(value, {
                sc.GEN_AI_TOOL_NAME: tool, sc.MCP_PROTOCOL_VERSION: version, sc.TOOL_HINT: hint,
                **_server_attributes(server),
            })

    def _observe_second(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            tallies = list(self._second.items())
        for (tool, version, server), value in tallies:
            yield Observation(value, {
                sc.GEN_AI_TOOL_NAME: tool, sc.MCP_PROTOCOL_VERSION: version,
                **_server_attributes(server),
            })

    def _observe_listens(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            tallies = list(self._listens.items())
        for (end, wanted, transport), value in tallies:
            yield Observation(
                value, {sc.LISTEN_END: end, sc.LISTEN_FILTER: wanted, sc.MCP_TRANSPORT: transport}
            )


def _server_attributes(server: Server) -> dict[str, Any]:
    transport, address, port = server
    attributes: dict[str, Any] = {sc.MCP_TRANSPORT: transport, sc.SERVER_ADDRESS: address}
    if port is not None:
        attributes[sc.SERVER_PORT] = port
    return attributes


def _tool(params: Any) -> str | None:
    name = params.get("name") if isinstance(params, Mapping) else None
    return name if isinstance(name, str) else None


def _listen_filter(notifications: Any) -> str:
    if not isinstance(notifications, Mapping):
        return "none"
    asked = sorted(
        short for key, short in LISTEN_FILTERS.items() if notifications.get(key)
    )
    return ",".join(asked) or "none"


def deliveries(observer: Any) -> Deliveries:
    """The tallies of ``observer``, made at its first answer."""
    found = getattr(observer, "_deliveries", None)
    if found is None:
        with observer._lock:
            found = getattr(observer, "_deliveries", None)
            if found is None:
                found = observer._deliveries = Deliveries(
                    observer.meter, observer.settings.confirm_timeout
                )
    return found
