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
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from .package import _instruments
from .version import __version__

if TYPE_CHECKING:
    from .continuity import StreamCursor, verify_resumption
    from .errors import ResumeCursorRaceError, ResumptionGapError
    from .patches import Installation
    from .processor import ContinuityProcessor

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
    "ContinuityProcessor": "processor",
    "ResumeCursorRaceError": "errors",
    "ResumptionGapError": "errors",
    "StreamCursor": "continuity",
    "verify_resumption": "continuity",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


class McpResumptionInstrumentor(BaseInstrumentor):
    """Instruments httpx, httpx2 and httpx-sse for MCP resumption continuity.

    ``instrument()`` accepts ``tracer_provider``, ``meter_provider``,
    ``logger_provider``, a ready ``processor``, and the settings ``mode``,
    ``replay_contract``, ``confirm_timeout``, ``session_id``, ``max_streams``
    and ``operation_metric`` (each overriding its
    ``OTEL_PYTHON_MCP_RESUMPTION_*`` variable).
    """

    _installation: Installation | None = None
    processor: ContinuityProcessor | None = None

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
        from . import config
        from .patches import Installation
        from .patches import http as http_patches
        from .patches import mcp_sdk as mcp_sdk_patches
        from .patches import sse as sse_patches
        from .processor import ContinuityProcessor

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
        self.processor = processor
        processor.active = True
        installation = self._installation = Installation()
        for module_name, targets in (
            ("httpx", http_patches.targets(processor)),
            ("httpx2", http_patches.targets(processor)),
            ("httpx_sse", sse_patches.targets(processor, "httpx_sse")),
            ("httpx2", sse_patches.targets(processor, "httpx2")),
            (mcp_sdk_patches.MODULE, mcp_sdk_patches.targets(processor)),
        ):
            installation.on_import(module_name, targets)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._remove()

    def _remove(self) -> None:
        if self.processor is not None:
            atexit.unregister(self.processor.stop_waiting)
            self.processor.shutdown()
            self.processor.active = False
        self.processor = None
        if self._installation is not None:
            self._installation.remove()
            self._installation = None
