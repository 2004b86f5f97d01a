# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""One visible line when auto-instrumentation will skip the plugin because
none of the HTTP clients it instruments is installed.

``opentelemetry-instrument`` checks an instrumentation's ``instruments-any``
extra before loading it, and says that it skipped it only at DEBUG level: a
user who installed the wheel alone would see nothing at all.  This runs from
the ``opentelemetry_pre_instrument`` entry point, before that check, and
writes one WARNING (which Python prints even when the program configured no
logging) naming what to install.  Silent when the clients are there, when
both halves are disabled by name, and on a version conflict (the loader
reports that one itself, as an error).
"""

from __future__ import annotations

import logging
import os

from opentelemetry.instrumentation.dependencies import get_dependency_conflicts

from .package import _instruments_any

_logger = logging.getLogger("opentelemetry.instrumentation.mcp_resumption")
NAMES = ("mcp_resumption", "mcp_resumption_server")


def missing_clients_message() -> str | None:
    """The line to write, or None when there is nothing to say."""
    disabled = {
        name.strip()
        for name in os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")
    }
    if "*" in disabled or disabled.issuperset(NAMES):
        return None
    conflict = get_dependency_conflicts([], _instruments_any)
    if conflict is None or getattr(conflict, "_is_version_conflict", False):
        return None
    names = ", ".join(requirement.split(" ")[0] for requirement in _instruments_any)
    return (
        f"mcp-resumption is not loaded: none of {names} is installed. Install the HTTP "
        "client of your MCP SDK (mcp 1.x: httpx and httpx-sse; mcp 2.x: httpx2), for "
        "example: pip install 'opentelemetry-instrumentation-mcp-resumption[instruments-any]'"
    )


def report() -> None:
    """The ``opentelemetry_pre_instrument`` hook.  Never raises."""
    try:
        message = missing_clients_message()
    except Exception:  # never break the host's start
        return
    if message is not None:
        _logger.warning(message)
