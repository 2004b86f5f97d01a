# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The server's last counts, flushed when the server shuts down.

uvicorn (0.55) re-raises SIGTERM once its graceful shutdown is done, so a
server stopped the way Docker and Kubernetes stop it dies of the signal
before the OpenTelemetry SDK's exit export runs: the counts since the last
periodic export are lost (only SIGINT, which ends in a normal exit, flushes
them).  The ASGI lifespan's shutdown is the last moment the application has:
before the server is told ``lifespan.shutdown.complete``, the providers the
server half writes to are flushed, each within ``FLUSH_TIMEOUT_MS``.

Wrapped where every SDK app (and any Starlette or FastAPI app that mounts
one) answers the lifespan: ``starlette.routing.Router.lifespan``.  A process
that never served MCP has no observer, and nothing is flushed for it.
"""

from __future__ import annotations

from typing import Any

from ..patches import guarded
from . import active

FLUSH_TIMEOUT_MS = 2000
_DONE = ("lifespan.shutdown.complete", "lifespan.shutdown.failed")


def flush() -> None:
    """Flush the server half's meter and logger providers, if it has served MCP."""
    observer = active.made
    for provider in getattr(observer, "providers", ()):
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is not None:
            guarded("flushing at shutdown", force_flush, timeout_millis=FLUSH_TIMEOUT_MS)


def _lifespan(wrapped, instance, args, kwargs):
    if len(args) != 3 or kwargs:
        return wrapped(*args, **kwargs)
    scope, receive, send = args

    async def flushing_send(message: Any) -> None:
        if isinstance(message, dict) and message.get("type") in _DONE:
            flush()  # blocks the loop, bounded: nothing else runs at this point
        await send(message)

    return wrapped(scope, receive, flushing_send)
