# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What the patches of one owner share, and the per-task channels between
them: the responses being read (so the SSE patch finds a response's stream
context), the redirects a client follows itself, where a reader's frame was
found, and the context variables of the running task (the request's span
attributes, the hops and lineages a reconnect loop parks, the gap errors
enforce mode raised).

A part of :class:`~.monitor.ResumptionMonitor` (its base
:class:`PatchChannels`), apart to be read alone: one set per owner, none at
module level (``tests/test_layering.py``).
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from ..errors import ResumptionGapError
    from ..telemetry.facts import StreamContext
    from .hops import _HopKey

__all__ = ["PatchChannels"]


class PatchChannels:
    """The state the owner shares with its patches (made by the owner's
    ``__init__``), and how an error enforce mode raises reaches the task's
    reconnect loop."""

    def __init__(self) -> None:
        # The responses being read and their redirects, shared by the HTTP
        # and SSE patches of this owner.
        # response -> the stream context its EventSource reads through
        self.streams: weakref.WeakKeyDictionary[Any, StreamContext] = (
            weakref.WeakKeyDictionary()
        )
        # The next request of a redirect the client follows itself (one
        # ``send`` per hop, as the MCP SDKs do) -> the JSON-RPC requests of
        # the request it redirects: the re-sent body is a stream
        # ``request.content`` cannot give.
        self.redirected: weakref.WeakKeyDictionary[Any, list[tuple[str, str]]] = (
            weakref.WeakKeyDictionary()
        )
        # How many frames above the close patch's check a reader's frame was
        # found when a client closed a response inside its read (a few call
        # chains of the libraries': looked at before a walk up the stack).
        self.read_depths: list[int] = []

        # Per-task channels between the patches, one set per owner (an
        # owner lives for one instrument() cycle, so the few variables a
        # process ever makes stay few).
        # For the HTTP client span that the httpx instrumentation opens
        # inside the patched call, read in on_start: its attributes, and
        # whether its URL may name the legacy session.
        self.request_scope: contextvars.ContextVar[
            tuple[Mapping[str, Any] | None, bool] | None
        ] = contextvars.ContextVar("mcp_resumption_request_attributes", default=None)
        # Hops parked by the reconnect loop of the running task (the MCP SDK
        # patch sets a list): when that loop returns, the client has stopped
        # following them.
        self.hop_scope: contextvars.ContextVar[list[_HopKey] | None] = contextvars.ContextVar(
            "mcp_resumption_hop_scope", default=None
        )
        # Streams that ended holding their lineage's requests inside an MCP
        # SDK reconnect loop: when the loop returns, the client has stopped
        # resuming them.
        self.lineage_scope: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
            "mcp_resumption_lineage_scope", default=None
        )
        # Gap errors raised in enforce mode, collected per task by the MCP SDK
        # patch so that the SDK's reconnect loop can fail the pending request
        # instead of retrying.
        self.enforced_errors: contextvars.ContextVar[list[ResumptionGapError] | None] = (
            contextvars.ContextVar("mcp_resumption_enforced_errors", default=None)
        )

    def _enforced(self, error: ResumptionGapError) -> ResumptionGapError:
        """``error`` is about to leave a patch on purpose (enforce mode): the
        MCP SDK patch's reconnect loop, if this task runs in one, is told
        here, where the error is raised, so that it fails the pending
        request instead of retrying."""
        raised = self.enforced_errors.get()
        if raised is not None:
            raised.append(error)
        return error
