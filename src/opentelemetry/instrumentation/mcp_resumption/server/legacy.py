# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""MCP SDK legacy HTTP+SSE server (``SseServerTransport.connect_sse``).

The legacy transport keeps no events and reads no ``Last-Event-ID``: every
``GET`` of the SSE endpoint opens a fresh session, whatever cursor the client
sends.  A GET carrying one is a resume the server cannot honour: ``no_store``.
With the guard on, it is refused the way the SDK refuses a request that fails
its own validation: the error response, then ``ValueError`` out of
``connect_sse`` (which the host's endpoint already has to expect).
"""

from __future__ import annotations

from typing import Any

from ..patches import guarded
from ..telemetry import semconv as sc
from . import active, answers
from .observer import from_scope, header
from .streamable import GUARD_ERROR_CODE, GUARD_MESSAGES, GUARD_STATUS


def _connect(wrapped, instance, args, kwargs):
    observer = active.observer
    if observer is None or not observer.enabled:
        return wrapped(*args, **kwargs)
    resume = guarded("reading a legacy resume", _resume, *args, **kwargs)
    if resume is None:
        return answers.sse_session(observer, instance, wrapped(*args, **kwargs))
    if observer.rejecting:
        return _Refused(observer, resume, *args, **kwargs)
    guarded("counting a resume", observer.record, resume, sc.SERVER_NO_STORE)
    return wrapped(*args, **kwargs)


def _resume(scope: Any, *_: Any, **__: Any) -> Any:
    if not isinstance(scope, dict) or scope.get("type") != "http":
        return None
    cursor = header(scope, b"last-event-id")
    if not cursor:
        return None
    return from_scope(scope, sc.TRANSPORT_SSE, cursor, None)


class _Refused:
    """What ``connect_sse`` returns for a refused resume: an async context
    manager that answers the guard's error and raises, as the SDK's own
    validation failure does."""

    def __init__(self, observer: Any, resume: Any, scope: Any, receive: Any, send: Any) -> None:
        self._args = (observer, resume, scope, receive, send)

    async def __aenter__(self) -> Any:
        import json

        from starlette.responses import Response

        observer, resume, scope, receive, send = self._args
        guarded(
            "counting a rejected resume", observer.record, resume,
            sc.SERVER_REJECTED_BY_GUARD, refused=sc.SERVER_NO_STORE,
        )
        body = {
            "jsonrpc": "2.0",
            "id": "server-error",
            "error": {"code": GUARD_ERROR_CODE, "message": GUARD_MESSAGES[sc.SERVER_NO_STORE]},
        }
        response = Response(
            json.dumps(body), status_code=GUARD_STATUS, media_type="application/json"
        )
        await response(scope, receive, send)
        raise ValueError("Request validation failed: Last-Event-ID cannot be resumed")

    async def __aexit__(self, *exc: Any) -> None:
        return None
