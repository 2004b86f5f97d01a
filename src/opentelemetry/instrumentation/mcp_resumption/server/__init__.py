# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The server half: what an MCP server does with the resumes it receives.

``McpResumptionServerInstrumentor`` (entry point ``mcp_resumption_server``)
observes the MCP Python SDK's streamable-HTTP server (1.x and 2.x: the
session manager, the transport's replay, the ``EventStore`` calls) and the
legacy SSE server transport.  Every resume request is counted by outcome
(``mcp.server.resumption.requests``), the events replayed per request go
into a histogram, and a resume that loses events (``unknown_cursor``,
``other_session``) writes a ``resumption.gap`` event.  With
``OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD=reject`` those resumes are refused
with ``410 Gone`` instead of ``200`` and an empty stream.

A separate instrumentor from the client's, because a process is usually one
or the other: a client needs httpx patched and never the server, a server the
reverse, and each can be disabled on its own
(``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=mcp_resumption_server``).

``ProvableEventStore`` wraps any SDK event store so that its ids carry order.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from .. import config
from ..patches import Installation

if TYPE_CHECKING:
    from .observer import ServerObserver
    from .provable import ProvableEventStore

__all__ = ["McpResumptionServerInstrumentor", "ProvableEventStore"]

_logger = logging.getLogger(__name__)

# The SDK releases whose server transports the patches know.
_instruments = ("mcp >= 1.30",)


class _Active:
    """The observer the server patches report to; None while uninstrumented."""

    observer: ServerObserver | None = None


active = _Active()


def __getattr__(name: str) -> Any:
    # ProvableEventStore imports mcp: only when it is asked for, so that
    # loading the instrumentor imports nothing of the SDK.
    if name == "ProvableEventStore":
        from .provable import ProvableEventStore

        return ProvableEventStore
    raise AttributeError(name)


class McpResumptionServerInstrumentor(BaseInstrumentor):
    """Observes (and with ``guard="reject"`` guards) MCP server resumption.

    ``instrument()`` accepts ``meter_provider``, ``logger_provider``, ``guard``
    (``off`` / ``reject``, else ``OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD``)
    and ``session_id`` (``hash`` / ``raw`` / ``omit``, as on the client side).
    """

    _installation: Installation | None = None
    observer: ServerObserver | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        try:  # never abort the instrumentors loaded after this one
            self._install(**kwargs)
        except Exception:
            _logger.warning("mcp-resumption server instrumentation failed to start", exc_info=True)
            self._remove()

    def _install(self, **kwargs: Any) -> None:
        from . import legacy, streamable
        from .observer import ServerObserver

        settings = config.load({"session_id": kwargs.get("session_id")})
        observer = ServerObserver(
            meter_provider=kwargs.get("meter_provider"),
            logger_provider=kwargs.get("logger_provider"),
            settings=settings,
            guard=config.load_server_guard(kwargs.get("guard")),
        )
        self.observer = active.observer = observer
        installation = self._installation = Installation()
        for module_name, targets in (
            (streamable.MODULE, streamable.TARGETS),
            (streamable.MANAGER_MODULE, streamable.MANAGER_TARGETS),
            (legacy.MODULE, legacy.TARGETS),
        ):
            installation.on_import(module_name, targets)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._remove()

    def _remove(self) -> None:
        if self.observer is not None:
            self.observer.enabled = False
        active.observer = None
        self.observer = None
        if self._installation is not None:
            self._installation.remove()
            self._installation = None
