# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What the telemetry sink writes about calls: broken requests and their
fates, the operation metric, lost subscriptions, re-issues and calls that
ran twice.

``CallTelemetry`` is a base of ``telemetry.TelemetrySink``, read alone: it
writes with the instruments, logger and log budget the sink made, and
writes only (the owner decides).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..rules.fates import Broken, Decided
from ..rules.jsonrpc import MAX_TOOL_NAME
from ..rules.subscriptions import LostSubscription
from . import semconv as sc
from .facts import RequestFacts, StreamContext, exported_request_id
from .verdict_log import LOST, server_name, verdicts

if TYPE_CHECKING:
    from ..rules.continuity import Gap
    from .budget import LogBudget
    from .redaction import Redaction

__all__ = ["CallTelemetry"]


class CallTelemetry:
    """The calls' part of the telemetry sink (a base of ``TelemetrySink``)."""

    redaction: Redaction
    _broken: Any
    _gaps: Any
    _lost_subscriptions: Any
    _reissues: Any
    _duplicate_runs: Any
    _operation_duration: Any
    _events_logger: Any
    _log_budget: LogBudget

    # The sink's own, reached through ``self``.
    def gap(self, context: StreamContext, gap: Gap) -> None:
        raise NotImplementedError

    def _gap_event(self, context: StreamContext, gap: Gap) -> None:
        raise NotImplementedError

    def fate(
        self,
        context: StreamContext | None,
        decided: Decided,
        attempt: StreamContext | None = None,
    ) -> None:
        """A broken request's one fate (``context``: the stream that broke);
        a lost one is its orphaned_request gap, of ``attempt`` if a resume
        waited for it."""
        if context is None:  # recorded by no patch: nothing to name it by
            return
        if decided.counted:
            self._broken.add(1, {sc.REQUEST_FATE: decided.fate.value, **context.attributes})
        if decided.idempotent is not None:
            self._reissue(context, decided)
        if decided.gap is not None:
            self.gap(attempt or context, decided.gap)
            server = server_name(context.facts.host, context.facts.port)
            verdicts.finding(
                server,
                "",
                "mcp-resumption lost call: server=%s method=%s request=%s: its stream broke "
                "and its answer never came (%s); re-issue it",
                server,
                decided.broken.method or "-",
                exported_request_id(decided.broken.key),
                decided.gap.observed,
            )

    def lost_elsewhere(self, server: str, transport: str, method: str) -> None:
        """A request in flight in a process that died (its lease lapsed) was
        claimed here, once for the fleet: lost.  ``server`` is the tracker's
        ``host:port``; the transport is one of the two this plugin names."""
        host, _, port = server.rpartition(":")
        attributes: dict[str, Any] = {
            sc.REQUEST_FATE: "lost",
            sc.MCP_TRANSPORT: transport
            if transport in (sc.TRANSPORT_SSE, sc.TRANSPORT_STREAMABLE_HTTP)
            else sc.TRANSPORT_STREAMABLE_HTTP,
        }
        if host and port.isdigit():
            attributes[sc.SERVER_ADDRESS], attributes[sc.SERVER_PORT] = host, int(port)
        else:
            attributes[sc.SERVER_ADDRESS] = server
        # A lost request is its orphaned_request gap, whoever claims it (the
        # alerts read the gap counter); counted before its fate, so that a
        # reader who sees the fate sees its gap.
        gap = {**attributes, sc.GAP_KIND: LOST}
        del gap[sc.REQUEST_FATE]
        self._gaps.add(1, gap)
        self._broken.add(1, attributes)
        # Read first by a user: the lost call's line, and in the exit summary.
        verdicts.gap(server, LOST)
        verdicts.finding(
            server,
            "",
            "mcp-resumption lost call: server=%s method=%s: it was in flight in a process "
            "that died (counted here, once for every process that shares the state); "
            "re-issue it",
            server,
            method or "-",
        )

    # ------------------------------------------------------ operations

    def operation(
        self, method: str, key: str | None, facts: RequestFacts, error: str | None
    ) -> None:
        """One request ended, by its answer or its fate: its duration from
        when it was sent, as the MCP conventions name it."""
        # server_attributes(facts) written out: one dict per request, not two.
        attributes: dict[str, Any] = {
            sc.MCP_METHOD_NAME: method if method in sc.CLIENT_METHODS else sc.OTHER,
            sc.SERVER_ADDRESS: facts.host,
        }
        if facts.port is not None:
            attributes[sc.SERVER_PORT] = facts.port
        if method == "tools/call":
            tools = facts.tools  # (``facts.tool(key)``, written out)
            tool = tools.get(key) if key is not None and tools else facts.mcp_name
            if tool:
                attributes[sc.GEN_AI_TOOL_NAME] = tool[:MAX_TOOL_NAME]
        if error is not None:
            attributes[sc.ERROR_TYPE] = error
        if facts.protocol_version:
            attributes[sc.MCP_PROTOCOL_VERSION] = facts.protocol_version[:32]
        self._operation_duration.record(max(0.0, time.monotonic() - facts.started), attributes)

    # ------------------------------------------------------ subscriptions, re-issues

    def subscription_lost(
        self, context: StreamContext, subscription: LostSubscription, gap: Gap | None
    ) -> None:
        """A subscription was lost: its gap event and its line now; its count
        when its re-listen window closes (``count_lost_subscription``)."""
        server = server_name(context.facts.host, context.facts.port)
        if gap is not None:
            verdicts.gap(server, gap.kind.value)
            self._gap_event(context, gap)
        verdicts.finding(
            server,
            "",
            "mcp-resumption subscription lost: server=%s transport=%s notifications=%s "
            "request=%s: change notifications are missed until it re-listens; re-listen "
            "and refetch",
            server,
            context.transport,
            subscription.notifications,
            exported_request_id(subscription.key),
        )

    def count_lost_subscription(self, subscription: LostSubscription) -> None:
        context = subscription.tag
        if context is None:  # recorded by no patch: nothing to name it by
            return
        attributes = {
            sc.SUBSCRIPTION_NOTIFICATIONS: subscription.notifications,
            sc.SUBSCRIPTION_RELISTENED: "true" if subscription.relistened else "false",
            **context.attributes,
        }
        self._lost_subscriptions.add(1, attributes)

    def _reissue(self, context: StreamContext, decided: Decided) -> None:
        risk = sc.REISSUE_MAY_RUN_TWICE if decided.may_run_twice else sc.REISSUE_SAFE
        idempotent = decided.idempotent or "unknown"
        self._reissues.add(
            1, {sc.REISSUE_IDEMPOTENT: idempotent, sc.REISSUE_RISK: risk, **context.attributes}
        )
        if decided.may_run_twice:
            server = server_name(context.facts.host, context.facts.port)
            verdicts.finding(
                server,
                sc.REISSUE_MAY_RUN_TWICE,
                "mcp-resumption re-issue may run twice: server=%s tool=%s idempotent=%s "
                "request=%s: the call was sent again after its stream broke, and this "
                "server's protocol does not cancel a call whose stream breaks; make the "
                "tool safe to run twice and declare it (idempotentHint), or check its effect",
                server,
                decided.broken.tool or "-",
                idempotent,
                exported_request_id(decided.broken.key),
            )

    def ran_twice(self, context: StreamContext | None, broken: Broken) -> None:
        """A re-issued call whose first attempt was answered too."""
        if context is None:
            return
        self._duplicate_runs.add(1, context.attributes)
        server = server_name(context.facts.host, context.facts.port)
        verdicts.finding(
            server,
            "ran_twice",
            "mcp-resumption ran twice: server=%s tool=%s request=%s: the first attempt and "
            "its re-issue were both answered, so the call ran twice",
            server,
            broken.tool or broken.method,
            exported_request_id(broken.key),
        )
