# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What the telemetry sink writes about the Events extension: each break of
a subscription's thread of cursors (its count, its WARNING line, and for a
confirmed loss its ``resumption.gap`` event), the duplicates delivered
again, and what became of the push streams.

``EventTelemetry`` is a base of ``telemetry.TelemetrySink``, read alone: it
writes with the instruments the sink made, and writes only (the owner
decides, ``event_reports``).  Nothing here runs per event: a finding, a
batch of duplicates, a stream's open and end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry._logs import SeverityNumber

from ..rules.events import Finding, Kind
from . import semconv as sc
from .verdict_log import server_name, verdicts

if TYPE_CHECKING:
    from .budget import LogBudget

__all__ = ["EventTelemetry"]

# What each kind's line tells the reader to do.
_ADVICE = {
    Kind.TRUNCATED: "resync what the events describe (refetch the state)",
    Kind.CURSOR_LOST: "persist the last cursor and pass it back; resync what was skipped",
    Kind.CURSOR_REWOUND: "expect duplicates; deduplicate by eventId",
    Kind.CURSOR_UNKNOWN: "nothing can be proven about this resume",
    Kind.STREAM_SILENT: "reopen the stream with its last cursor",
    Kind.TERMINATED: "subscribe again if the events are still wanted",
    Kind.NOT_REOPENED: "reopen the stream with its last cursor, or resync",
    Kind.UNREPLAYABLE_WINDOW: "resync what the events describe, or keep the stream open",
    Kind.LAPSED: "refresh webhook subscriptions before refreshBefore; resubscribe and resync",
    Kind.DELIVERY_FAILING: "check the webhook endpoint the server delivers to",
    Kind.EVENT_ID_REUSED: "do not deduplicate this server's events by eventId alone",
}


class EventTelemetry:
    """The events' part of the telemetry sink (a base of ``TelemetrySink``)."""

    _event_gaps: Any
    _event_duplicates: Any
    _event_streams: Any
    _events_logger: Any
    _log_budget: LogBudget
    _event_names: dict[str, None]
    _event_series: set[tuple[str, int | None, str, str]]

    def _event_name(self, name: str) -> str:
        names = self._event_names
        if name in names:
            return name
        if len(names) >= sc.MAX_EVENT_NAMES:
            return sc.OTHER
        names[name] = None
        return name

    def _event_attributes(
        self, host: str, port: int | None, delivery: str, name: str
    ) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            sc.SERVER_ADDRESS: host,
            sc.EVENT_DELIVERY: delivery,
            sc.EVENT_NAME: self._event_name(name),
        }
        if port is not None:
            attributes[sc.SERVER_PORT] = port
        return attributes

    def event_type_seen(self, host: str, port: int | None, delivery: str, name: str) -> None:
        """A subscription to ``name`` by ``delivery``: the first time, its
        gap series start at 0 (Prometheus' ``increase()`` cannot see a
        series born at 1: the first truncation would show as none)."""
        key = (host, port, delivery, name)
        if key in self._event_series or len(self._event_series) >= sc.MAX_EVENT_NAMES * 3:
            return
        self._event_series.add(key)
        attributes = self._event_attributes(host, port, delivery, name)
        for kind in sc.EVENT_GAP_KINDS:
            self._event_gaps.add(0, {sc.EVENT_GAP_KIND: kind, **attributes})
        self._event_duplicates.add(0, attributes)
        if delivery == "push":
            for state in sc.EVENT_STREAM_STATES:
                self._event_streams.add(0, {sc.EVENT_STREAM_STATE: state, **attributes})

    def event_finding(self, finding: Finding, host: str, port: int | None) -> None:
        """One break of a thread: counted, one WARNING line, and for a
        confirmed loss its ``resumption.gap`` log event."""
        key = finding.key
        attributes = self._event_attributes(host, port, finding.delivery, key.name)
        self._event_gaps.add(1, {sc.EVENT_GAP_KIND: finding.kind.value, **attributes})
        server = server_name(host, port)
        extra = ""
        if finding.error is not None:
            extra = f" error={finding.error}"
        verdicts.finding(
            server,
            f"event_{finding.kind.value}",
            "mcp-resumption event %s: server=%s event=%s delivery=%s%s: %s; %s",
            finding.kind.value,
            server,
            key.name,
            finding.delivery,
            extra,
            finding.detail,
            _ADVICE[finding.kind],
        )
        if not finding.loss or not self._log_budget.take((finding.kind.value, key.server)):
            return
        record = {sc.EVENT_GAP_KIND: finding.kind.value, **attributes}
        if finding.window is not None:
            record[sc.EVENT_WINDOW] = round(finding.window, 3)
        self._events_logger.emit(
            event_name=sc.GAP_EVENT_NAME,
            body=f"{finding.kind.value}: {finding.detail}",
            attributes=record,
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
        )

    def event_duplicates(
        self, count: int, host: str, port: int | None, delivery: str, name: str
    ) -> None:
        self._event_duplicates.add(count, self._event_attributes(host, port, delivery, name))

    def event_stream(self, state: str, host: str, port: int | None, name: str) -> None:
        attributes = self._event_attributes(host, port, "push", name)
        self._event_streams.add(1, {sc.EVENT_STREAM_STATE: state, **attributes})
