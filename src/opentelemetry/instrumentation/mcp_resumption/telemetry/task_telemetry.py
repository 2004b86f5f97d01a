# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What the telemetry sink writes about tasks: each task's one fate (its
count, its life and its polls, recorded once at its end), the verdict line
of each loss, and the ``tasks/*`` requests a load balancer cannot route.

``TaskTelemetry`` is a base of ``telemetry.TelemetrySink``, read alone: it
writes with the instruments the sink made, and writes only (the owner
decides, ``task_reports``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..rules.jsonrpc import MAX_TOOL_NAME
from ..rules.tasks import EXPERIMENTAL, Ended, Fate
from . import semconv as sc
from .verdict_log import server_name, verdicts

if TYPE_CHECKING:
    from .redaction import Redaction

__all__ = ["TaskTelemetry"]

# Tools whose task series are started at 0, at most (then a new tool's first
# fate is born at 1, as before): a bound on a client calling ever new names.
MAX_ZERO_SERIES_TOOLS = 1024

# What each loss's line tells the reader to do.
_ADVICE = {
    Fate.LOST: "the server no longer knows the task (restarted without a durable store, "
    "another replica, evicted): its result is gone; re-run the work only if the tool is "
    "idempotent",
    Fate.EXPIRED: "its TTL ran out before the client read the result: re-run the work only "
    "if the tool is idempotent, and read results within the TTL",
    Fate.ABANDONED: "the client stopped following it before it ended, without tasks/cancel: "
    "the work may run on for no one; cancel tasks you stop waiting for, and re-run the work "
    "only if the tool is idempotent",
    Fate.HANDLE_LOST: "the call's answer (the task handle) never came: the work may still run "
    "unseen, and nothing can find it; re-run the work only if the tool is idempotent",
}


class TaskTelemetry:
    """The tasks' part of the telemetry sink (a base of ``TelemetrySink``)."""

    redaction: Redaction
    _tasks: Any
    _task_duration: Any
    _task_polls: Any
    _task_unroutable: Any
    _task_tools_seen: set[tuple[str, str, int | None, str]]

    def tasks_seen(self, server: dict[str, Any]) -> None:
        """A new server's task series, at 0 (``server_seen``)."""
        for transport in (sc.TRANSPORT_SSE, sc.TRANSPORT_STREAMABLE_HTTP):
            for fate in sc.TASK_FATES:
                self._tasks.add(0, {sc.TASK_FATE: fate, sc.MCP_TRANSPORT: transport, **server})
        self._task_unroutable.add(
            0, {sc.MCP_TRANSPORT: sc.TRANSPORT_STREAMABLE_HTTP, **server}
        )

    def task_tool_seen(self, transport: str, host: str, port: int | None, tool: str) -> None:
        """A call that could become a task names ``tool``: the first time,
        its task series (each fate, with ``gen_ai.tool.name``) start at 0.

        ``tasks_seen`` cannot start them (tool names are not known up front),
        and Prometheus' ``increase()`` cannot see a series born at 1: without
        this the first lost task of each tool would show, and page, as none.
        A set lookup per such call after the first."""
        tool = tool[:MAX_TOOL_NAME]
        key = (transport, host, port, tool)
        seen = self._task_tools_seen
        if key in seen or len(seen) >= MAX_ZERO_SERIES_TOOLS:
            return
        seen.add(key)
        attributes: dict[str, Any] = {
            sc.MCP_TRANSPORT: transport,
            sc.SERVER_ADDRESS: host,
            sc.GEN_AI_TOOL_NAME: tool,
        }
        if port is not None:
            attributes[sc.SERVER_PORT] = port
        for fate in sc.TASK_FATES:
            self._tasks.add(0, {sc.TASK_FATE: fate, **attributes})

    def task_ended(self, ended: Ended, transport: str, host: str, port: int | None) -> None:
        """One task's fate: counted, its life and polls recorded, and a
        verdict line if it lost something or its cancel was not honoured."""
        attributes: dict[str, Any] = {
            sc.TASK_FATE: ended.fate.value,
            sc.MCP_TRANSPORT: transport,
            sc.SERVER_ADDRESS: host,
        }
        if port is not None:
            attributes[sc.SERVER_PORT] = port
        if ended.tool:
            attributes[sc.GEN_AI_TOOL_NAME] = ended.tool[:MAX_TOOL_NAME]
        if ended.cancel_ignored:
            attributes[sc.TASK_CANCEL_IGNORED] = "true"
        self._tasks.add(1, attributes)
        if ended.duration is not None:  # a task that was handed out
            self._task_duration.record(ended.duration, attributes)
            self._task_polls.record(ended.polls, attributes)
        server = server_name(host, port)
        verdicts.task(server, ended.fate.value)
        # A handed task decided by its hash alone: the fleet's key, the same hash.
        task = self.redaction.task_id(ended.task_id) if ended.task_id else ended.task_hash or "-"
        tool = ended.tool[:MAX_TOOL_NAME] if ended.tool else "-"
        if ended.fate in _ADVICE:
            advice = _ADVICE[ended.fate]
            if ended.fate is Fate.HANDLE_LOST and ended.form == EXPERIMENTAL:
                advice += " (on 2025-11-25, tasks/list may still find it)"
            verdicts.finding(
                server,
                "",
                "mcp-resumption task %s: server=%s tool=%s task=%s: %s",
                ended.fate.value,
                server,
                tool,
                task,
                advice,
            )
        elif ended.cancel_ignored:
            verdicts.finding(
                server,
                "cancel_ignored",
                "mcp-resumption task cancel ignored: server=%s tool=%s task=%s: the server "
                "acknowledged tasks/cancel, then the task completed: the work ran; check its "
                "effect",
                server,
                tool,
                task,
            )

    def task_unroutable(self, transport: str, host: str, port: int | None) -> None:
        """A tasks/* request over streamable HTTP without Mcp-Name."""
        attributes: dict[str, Any] = {sc.MCP_TRANSPORT: transport, sc.SERVER_ADDRESS: host}
        if port is not None:
            attributes[sc.SERVER_PORT] = port
        self._task_unroutable.add(1, attributes)
