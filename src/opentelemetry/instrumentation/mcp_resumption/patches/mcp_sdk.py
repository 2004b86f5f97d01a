# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""MCP SDK 1.x and 2.x: ``StreamableHTTPTransport`` reconnection.

The SDK reconnects a broken POST stream with ``Last-Event-ID`` on its own
(``_handle_reconnection``), and resumes explicit resumption tokens
(``_handle_resumption_request``); the HTTP and SSE patches already see every
such reconnect as a resume attempt.  What they cannot do alone is enforce
mode: the SDK catches any exception from its event loop and reconnects again,
and 1.x then leaves the caller of the pending request waiting for ever.  So
once a gap error was raised on a request's stream, the next reconnect of that
request is not attempted: the request is answered with a JSON-RPC error that
carries the gap, and the caller's pending call fails with it.

The reconnect loop is also where a resume's hops end: a redirect or a non-SSE
answer that the SDK retries continues the same attempt, and when the
outermost call returns, the client has stopped following them, so what is
still parked is judged then rather than when the confirmation window passes.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import ResumptionGapError
from . import Targets, fault, guarded

if TYPE_CHECKING:  # the owner is bound in at instrument(); no import upward
    from ..owner.monitor import ResumptionMonitor

MODULE = "mcp.client.streamable_http"
GAP_ERROR_CODE = -32001  # implementation-defined server-error range of JSON-RPC


def _error_message(ctx: Any, error: ResumptionGapError) -> Any:
    from mcp.shared.message import SessionMessage

    try:  # 2.x: messages are the JSON-RPC models themselves
        from mcp_types import ErrorData, JSONRPCError

        def wrap(message: Any) -> Any:
            return message
    except ImportError:  # 1.x wraps them in a RootModel
        from mcp.types import ErrorData, JSONRPCError
        from mcp.types import JSONRPCMessage as wrap

    kind = type(error).__name__
    request = ctx.session_message.message
    request = getattr(request, "root", request)
    answer = JSONRPCError(
        jsonrpc="2.0",
        id=request.id,
        error=ErrorData(code=GAP_ERROR_CODE, message=f"{kind}: {error}"),
    )
    return SessionMessage(wrap(answer))


class _Answered:
    """Put in a task's list of enforced errors once its request has been failed."""


async def _fail_request(ctx: Any, raised: list) -> None:
    """Answer the pending request with the first enforced error, once."""
    if not raised or raised[0] is _Answered:
        return
    error = raised[0]
    raised[:] = [_Answered]
    message = guarded("failing the pending request", _error_message, ctx, error)
    if message is None:
        return
    try:
        await ctx.read_stream_writer.send(message)
    except Exception:  # the session is gone: nobody waits for the answer
        fault("failing the pending request")


def _reconnect(owner: ResumptionMonitor, wrapped, instance, args, kwargs):
    # Not a coroutine function itself: the SDK's reconnection recurses, once
    # per reconnect, and an async wrapper would add a frame to every level,
    # halving the number of reconnects the SDK can make before its stack runs
    # out.  Only the outermost call of a request gets a frame of ours.
    raised = owner.enforced_errors.get()
    if raised is None:
        return _outermost(owner, wrapped, instance, args, kwargs)
    if raised:
        # A gap was enforced on this request's stream: do not resume it again.
        return _fail_request(args[0] if args else kwargs.get("ctx"), raised)
    return wrapped(*args, **kwargs)


async def _outermost(owner: ResumptionMonitor, wrapped, instance, args, kwargs):
    raised: list = []  # errors enforced on this request; _Answered once failed
    token = owner.enforced_errors.set(raised)
    hops: list = []  # keys of the hops parked inside this loop
    hops_token = owner.hop_scope.set(hops)
    held: list = []  # streams of this request that ended holding it
    held_token = owner.lineage_scope.set(held)
    ctx = args[0] if args else kwargs.get("ctx")
    try:
        result = await wrapped(*args, **kwargs)
    except ResumptionGapError as error:  # 2.x lets it out of an explicit resumption
        raised.insert(0, error)
        await _fail_request(ctx, raised)
        return None
    finally:
        owner.hop_scope.reset(hops_token)
        owner.lineage_scope.reset(held_token)
        if owner.active:
            # Judged while this task's errors are still collected: a refused
            # or unanswered resume is enforced on the request below.
            for key in hops:
                guarded("judging an unfollowed hop", owner.settle, key)
            # The SDK gave up on (or finished) this request: its lineage ends.
            for context in held:
                guarded(
                    "ending a lineage", owner.lineage_ended, context,
                    "the client stopped resuming it",
                )
        owner.enforced_errors.reset(token)
    if not hasattr(instance, "_resolve_abandoned_request"):
        # mcp 1.x gives up on a refused resume without answering the call,
        # which then waits for the caller's own timeout (2.x answers it).
        await _fail_request(ctx, raised)
    return result


def targets(owner: ResumptionMonitor) -> Targets:
    """What McpResumptionInstrumentor.instrument() wraps for ``owner`` (with
    patches.wrap_targets, as the module is imported)."""
    reconnect = partial(_reconnect, owner)
    return (
        ("StreamableHTTPTransport._handle_reconnection", reconnect),
        ("StreamableHTTPTransport._handle_resumption_request", reconnect),
    )
