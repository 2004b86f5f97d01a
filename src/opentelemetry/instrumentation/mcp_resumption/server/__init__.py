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

import importlib
import logging
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

if TYPE_CHECKING:
    from ..patches import Installation
    from .observer import ServerObserver
    from .provable import ProvableEventStore

__all__ = ["McpResumptionServerInstrumentor", "ProvableEventStore"]

_logger = logging.getLogger(__name__)

# The SDK releases whose server transports the patches know.
_instruments = ("mcp >= 1.30",)

# What the server half wraps, by name: (the SDK's module, its "Class.method",
# our module, the wrapper there).  Names only, because mcp 2.x's ``import
# mcp`` imports these SDK modules into every client too: what is wrapped at
# their import is a forwarder, and the wrapper's module (with the observer
# and everything it needs) is imported at the first call, when the process
# serves MCP.
SITES = (
    ("mcp.server.streamable_http", "StreamableHTTPServerTransport.__init__", "streamable", "_init"),
    (
        "mcp.server.streamable_http",
        "StreamableHTTPServerTransport._replay_events",
        "streamable",
        "_replay",
    ),
    # Not the manager's handle_request: the SDK's ASGI app calls its
    # asgi_app, bound when the manager was made; every stateful request
    # comes to _handle_stateful_request.
    (
        "mcp.server.streamable_http_manager",
        "StreamableHTTPSessionManager._handle_stateful_request",
        "streamable",
        "_manager_request",
    ),
    ("mcp.server.sse", "SseServerTransport.connect_sse", "legacy", "_connect"),
    # The conventions' duration metrics (operations.py): mcp 1.x ...
    ("mcp.server.lowlevel.server", "Server._handle_request", "operations", "_handle_request"),
    (
        "mcp.server.lowlevel.server",
        "Server._handle_notification",
        "operations",
        "_handle_notification",
    ),
    ("mcp.server.lowlevel.server", "Server.run", "operations", "_run"),
    ("mcp.server.session", "ServerSession._received_request", "operations", "_received_request"),
    ("mcp.server.session", "ServerSession._send_response", "operations", "_send_response"),
    # ... and mcp 2.x, where every transport and era goes through the runner
    # (the functions are looked up in their module when called).
    ("mcp.server.runner", "ServerRunner._on_request", "operations", "_on_request"),
    ("mcp.server.runner", "ServerRunner._on_notify", "operations", "_on_notify"),
    ("mcp.server.runner", "aclose_shielded", "operations", "_aclose"),
    ("mcp.server.runner", "_serve_legacy_stream", "operations", "_legacy_stream"),
    # The last counts before the server stops (a SIGTERM under uvicorn ends
    # the process before the SDK's exit export): the ASGI lifespan's shutdown.
    ("starlette.routing", "Router.lifespan", "shutdown", "_lifespan"),
    # Where each answer went (answers.py): a 2026-07-28 request and its
    # handler's run; a session's answers before 2026-07-28.
    (
        "mcp.server.streamable_http_manager",
        "StreamableHTTPSessionManager._handle_request",
        "answers",
        "_manager_request",
    ),
    ("mcp.server.runner", "ServerRunner._on_request", "answers", "_on_request"),
    ("mcp.server.streamable_http", "StreamableHTTPServerTransport.connect", "answers", "_connect"),
)


class _Active:
    """The observer the server patches report to, made at the first report
    (so that a process that never serves MCP never loads it); None while
    uninstrumented."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._make: Callable[[], ServerObserver] | None = None
        self._observer: ServerObserver | None = None

    @property
    def observer(self) -> ServerObserver | None:
        if self._observer is None and self._make is not None:
            with self._lock:
                if self._observer is None and self._make is not None:
                    make, self._make = self._make, None
                    try:
                        self._observer = make()
                    except Exception:  # in the host's request: never fail it
                        _logger.warning(
                            "mcp-resumption server instrumentation failed to start",
                            exc_info=True,
                        )
        return self._observer

    @property
    def made(self) -> ServerObserver | None:
        """The observer if a server call made it already (never makes one)."""
        return self._observer

    def start(self, make: Callable[[], ServerObserver]) -> None:
        with self._lock:
            self._make, self._observer = make, None

    def stop(self) -> None:
        with self._lock:
            if self._observer is not None:
                self._observer.enabled = False
            self._make = self._observer = None


active = _Active()


def __getattr__(name: str) -> Any:
    # ProvableEventStore imports mcp: only when it is asked for, so that
    # loading the instrumentor imports nothing of the SDK.
    if name == "ProvableEventStore":
        from .provable import ProvableEventStore

        return ProvableEventStore
    raise AttributeError(name)


def _unobserved(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    return wrapped(*args, **kwargs)


def _forwarder(module: str, wrapper: str) -> Callable[..., Any]:
    """A wrapt wrapper that calls ``wrapper`` of our ``module``, importing it
    at the first call."""
    found: list[Callable[..., Any]] = []

    def forward(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not found:
            try:
                found.append(getattr(importlib.import_module(f"{__name__}.{module}"), wrapper))
            except Exception:  # logged once; the host's calls go on unobserved
                _logger.warning("mcp-resumption: loading %s failed", module, exc_info=True)
                found.append(_unobserved)
        return found[0](wrapped, instance, args, kwargs)

    return forward


class McpResumptionServerInstrumentor(BaseInstrumentor):
    """Observes (and with ``guard="reject"`` guards) MCP server resumption.

    ``instrument()`` accepts ``meter_provider``, ``logger_provider``, ``guard``
    (``off`` / ``reject``, else ``OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD``)
    ``session_id`` (``hash`` / ``raw`` / ``omit``, as on the client side) and
    ``operation_metric`` (``mcp.server.operation.duration`` and
    ``mcp.server.session.duration``; ``OTEL_PYTHON_MCP_RESUMPTION_OPERATION_METRIC``).
    """

    _installation: Installation | None = None

    @property
    def observer(self) -> ServerObserver | None:
        """The observer of this cycle (made now if no server call made it
        yet); None while uninstrumented."""
        return active.observer if self._installation is not None else None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        try:  # never abort the instrumentors loaded after this one
            self._install(**kwargs)
        except Exception:
            _logger.warning("mcp-resumption server instrumentation failed to start", exc_info=True)
            self._remove()

    def _install(self, **kwargs: Any) -> None:
        from ..patches import Installation

        active.start(lambda: _observer(kwargs))
        installation = self._installation = Installation()
        by_module: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        for sdk_module, target, module, wrapper in SITES:
            by_module.setdefault(sdk_module, []).append((target, _forwarder(module, wrapper)))
        for sdk_module, targets in by_module.items():
            installation.on_import(sdk_module, targets)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._remove()

    def _remove(self) -> None:
        active.stop()
        if self._installation is not None:
            self._installation.remove()
            self._installation = None


def _observer(kwargs: dict[str, Any]) -> ServerObserver:
    """The observer for ``instrument(**kwargs)``: its settings are read here,
    so an invalid one is reported when the process first serves MCP."""
    from opentelemetry._logs import get_logger_provider

    from opentelemetry import metrics

    from .. import config
    from .observer import ServerObserver
    from .operations import ServerOperations

    settings = config.load(
        {"session_id": kwargs.get("session_id"), "operation_metric": kwargs.get("operation_metric")}
    )
    observer = ServerObserver(
        meter_provider=kwargs.get("meter_provider"),
        logger_provider=kwargs.get("logger_provider"),
        settings=settings,
        guard=config.load_server_guard(kwargs.get("guard")),
    )
    # What the server half writes to, flushed at the server's shutdown (shutdown.py).
    observer.providers = (
        kwargs.get("meter_provider") or metrics.get_meter_provider(),
        kwargs.get("logger_provider") or get_logger_provider(),
    )
    # The conventions' durations: off with the client half's operation metric
    # (OTEL_PYTHON_MCP_RESUMPTION_OPERATION_METRIC=false), for who has them elsewhere.
    observer.operations = (
        ServerOperations(kwargs.get("meter_provider")) if settings.operation_metric else None
    )
    return observer
