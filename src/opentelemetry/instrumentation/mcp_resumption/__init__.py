# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Catch silent event loss when MCP clients resume SSE and streamable-HTTP
streams.

Usage with auto-instrumentation (nothing else to configure)::

    opentelemetry-instrument python my_mcp_client.py

or by hand::

    from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

    McpResumptionInstrumentor().instrument(mode="enforce")

The instrumentor patches the httpx / httpx2 clients and the SSE iterators of
httpx-sse and httpx2, and adds a :class:`ContinuityProcessor` to the SDK
TracerProvider.  Every resume (a request carrying ``Last-Event-ID``) gets an
``mcp.resume`` span, and every gap a ``resumption.gap`` event and metric.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from .package import _instruments
from .version import __version__

if TYPE_CHECKING:
    from .errors import ResumeCursorRaceError, ResumptionGapError
    from .owner.processor import ContinuityProcessor
    from .patches import Installation
    from .rules.continuity import StreamCursor, verify_resumption

__all__ = [
    "ContinuityProcessor",
    "McpResumptionInstrumentor",
    "ResumeCursorRaceError",
    "ResumptionGapError",
    "StreamCursor",
    "__version__",
    "verify_resumption",
]

_logger = logging.getLogger(__name__)

# The public names that live in the client half's modules, and their module:
# imported when first asked for.  Importing this package must not load the
# client half: the server half's entry point (a submodule) imports it, as does
# the pre-instrument hook, in processes where the client half is disabled.
_LAZY = {
    "ContinuityProcessor": "owner.processor",
    "ResumeCursorRaceError": "errors",
    "ResumptionGapError": "errors",
    "StreamCursor": "rules.continuity",
    "verify_resumption": "rules.continuity",
}
# Modules the docs named at the package's top before they moved into their
# layer's folder: ``from opentelemetry.instrumentation.mcp_resumption import
# verdict_log`` (its ``summary_lines()``) and ``semconv`` keep working.
_MOVED = {"semconv": "telemetry.semconv", "verdict_log": "telemetry.verdict_log"}


def __getattr__(name: str) -> Any:
    moved = _MOVED.get(name)
    if moved is not None:
        return importlib.import_module(f"{__name__}.{moved}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


# What the client half wraps, by name: (the library's module, our patches
# module, its ``targets()`` arguments after the owner, the names it wraps).
# Names only: what is wrapped at the library's import is a forwarder, and the
# patches, the owner, the tracker and the telemetry load at the first request
# that may be MCP (``opentelemetry-instrument`` imports httpx in every
# process, for its own httpx instrumentation).  tests/test_startup_modules.py
# holds these names to the patches modules' own.
_HTTP = ("Client.send", "AsyncClient.send", "Response.close", "Response.aclose")
SITES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("httpx", "http", (), _HTTP),
    ("httpx2", "http", (), _HTTP),
    ("httpx_sse", "sse", ("httpx_sse",), ("EventSource.iter_sse", "EventSource.aiter_sse")),
    ("httpx2", "sse", ("httpx2",), ("EventSource.__iter__", "EventSource.__aiter__")),
    (
        "mcp.client.streamable_http",  # patches.mcp_sdk.MODULE
        "mcp_sdk",
        (),
        (
            "StreamableHTTPTransport._handle_reconnection",
            "StreamableHTTPTransport._handle_resumption_request",
        ),
    ),
)
# The targets whose call opens the gate when it may be MCP (the others only
# ever see what such a call began, or are MCP by themselves: mcp_sdk's).
_SENDS = ("Client.send", "AsyncClient.send")
# The request headers that may show MCP (as patches.http reads them: any
# request it keeps facts of has one of these, an event-stream Accept, or a
# legacy session id in its query).
_MCP_HEADERS = ("mcp-session-id", "mcp-protocol-version", "last-event-id", "mcp-method")


def _may_be_mcp(args: tuple, kwargs: dict) -> bool:
    """A request ``patches.http.request_facts`` might keep facts of: a
    superset, read without loading the patches."""
    request = args[0] if args else kwargs.get("request")
    headers = getattr(request, "headers", None)
    if headers is None:
        return False
    if any(name in headers for name in _MCP_HEADERS):
        return True
    if "text/event-stream" in headers.get("accept", ""):
        return True
    query = getattr(getattr(request, "url", None), "query", b"")
    return (b"ession" if isinstance(query, bytes) else "ession") in query


class McpResumptionInstrumentor(BaseInstrumentor):
    """Instruments httpx, httpx2 and httpx-sse for MCP resumption continuity.

    ``instrument()`` accepts ``tracer_provider``, ``meter_provider``,
    ``logger_provider``, a ready ``processor``, and the settings ``mode``,
    ``replay_contract``, ``confirm_timeout``, ``session_id``, ``max_streams``
    and ``operation_metric`` (each overriding its
    ``OTEL_PYTHON_MCP_RESUMPTION_*`` variable).

    Under auto-instrumentation (no provider or processor given) the owner is
    made at the first request that may be MCP; given one, at
    ``instrument()``; reading ``processor`` makes it.
    """

    _installation: Installation | None = None
    _processor: ContinuityProcessor | None = None
    # The real wrappers by (library module, "Class.method"), once the gate
    # opened; None while it is closed.
    _wrappers: dict[tuple[str, str], Any] | None = None
    _kwargs: dict[str, Any] | None = None

    @property
    def processor(self) -> ContinuityProcessor | None:
        """The owner of this cycle (made now if no MCP request made it yet);
        None while uninstrumented."""
        if self._processor is None and self._installation is not None:
            self._open()
        return self._processor

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # An exception escaping here would abort every instrumentor loaded
        # after this one: log it and leave the host uninstrumented instead.
        try:
            self._install(**kwargs)
        except Exception:
            _logger.warning("mcp-resumption instrumentation failed to start", exc_info=True)
            self._remove()

    def _install(self, **kwargs: Any) -> None:
        from .patches import Installation

        self._kwargs = kwargs
        self._lock = threading.Lock()
        installation = self._installation = Installation()
        given = ("processor", "tracer_provider", "meter_provider", "logger_provider")
        # Set up by hand: as before, at once, and each library's methods
        # wrapped with the real patch itself (no forwarder to call through on
        # every call); else a forwarder each, until the first MCP request.
        real = self._open() if any(kwargs.get(key) is not None for key in given) else {}
        for module_name, _, _, names in SITES:
            installation.on_import(
                module_name,
                [
                    (name, real.get((module_name, name)) or self._forwarder(module_name, name))
                    for name in names
                ],
            )

    def _forwarder(self, module_name: str, name: str) -> Any:
        key = (module_name, name)
        opens = name in _SENDS or module_name == SITES[-1][0]

        def forward(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            wrappers = self._wrappers
            if wrappers is None:
                if not opens or not _may_be_mcp_guarded(args, kwargs, name in _SENDS):
                    return wrapped(*args, **kwargs)
                wrappers = self._open()
            real = wrappers.get(key)
            if real is None:
                return wrapped(*args, **kwargs)
            return real(wrapped, instance, args, kwargs)

        return forward

    def _open(self) -> dict[tuple[str, str], Any]:
        """Make the owner and the real patches (once): the first MCP request."""
        with self._lock:
            if self._wrappers is not None:
                return self._wrappers
            wrappers: dict[tuple[str, str], Any] = {}
            try:
                owner = self._owner(self._kwargs or {})
                for module_name, patches, arguments, _ in SITES:
                    module = importlib.import_module(f"{__name__}.patches.{patches}")
                    for name, wrapper in module.targets(owner, *arguments):
                        wrappers[(module_name, name)] = wrapper
            except Exception:  # in the host's request: it goes on unobserved
                _logger.warning("mcp-resumption instrumentation failed to start", exc_info=True)
                wrappers = {}
            self._wrappers = wrappers
            return wrappers

    def _owner(self, kwargs: dict[str, Any]) -> ContinuityProcessor:
        from . import config
        from .owner.processor import ContinuityProcessor

        processor = kwargs.get("processor")
        if processor is None:
            settings = config.load(
                {key: kwargs.get(key) for key in config.Settings.__dataclass_fields__}
            )
            processor = ContinuityProcessor(
                tracer_provider=kwargs.get("tracer_provider"),
                meter_provider=kwargs.get("meter_provider"),
                logger_provider=kwargs.get("logger_provider"),
                settings=settings,
            )
        processor.attach()
        processor.enabled = True
        # Registered after the SDK's providers (opentelemetry-instrument makes
        # them first), so it runs before they flush at exit: the requests
        # still waiting for an answer are counted lost in that flush.
        atexit.register(processor.stop_waiting, "the process exited")
        # The one owner of this cycle: bound into every patch (no module
        # holds it), told when its patches report to it.
        self._processor = processor
        processor.active = True
        return processor

    def _uninstrument(self, **kwargs: Any) -> None:
        self._remove()

    def _remove(self) -> None:
        if self._processor is not None:
            atexit.unregister(self._processor.stop_waiting)
            self._processor.shutdown()
            self._processor.active = False
        self._processor = None
        self._wrappers = None
        self._kwargs = None
        if self._installation is not None:
            self._installation.remove()
            self._installation = None


def _may_be_mcp_guarded(args: tuple, kwargs: dict, send: bool) -> bool:
    if not send:
        return True  # the MCP SDK's reconnect: MCP by itself
    try:
        return _may_be_mcp(args, kwargs)
    except Exception:  # never the host's request's fault: look closer
        return True
