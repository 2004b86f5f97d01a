# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The fate of each broken request, as the router's log shows it: the
demo's truth for ``mcp.client.resumption.broken_requests``."""

from __future__ import annotations

from collections.abc import Mapping

from .clients import WireEvent, response_id
from .router import Exchange

__all__ = ["broken_request_fates"]


def _without_meta(params: object) -> object:
    if isinstance(params, Mapping):
        return {k: v for k, v in params.items() if k != "_meta"}
    return params


def _same_call(original: Mapping[str, object], later: Mapping[str, object] | None) -> bool:
    """*later* re-issues *original*: the same method and params (``_meta``,
    which carries the request's own ``progressToken``, aside), a new id."""
    return (
        later is not None
        and "id" in later
        and later.get("id") != original.get("id")
        and later.get("method") == original.get("method")
        and _without_meta(later.get("params")) == _without_meta(original.get("params"))
    )


def _answers(exchange: Exchange, request_id: object) -> bool:
    return any(
        response_id(WireEvent(e.id, e.event, e.data)) == request_id for e in exchange.events
    )


def broken_request_fates(exchanges: list[Exchange]) -> dict[str, int]:
    """The fate of every request whose POST stream the router cut before its
    answer, as the router's log shows it (every exchange went to one server,
    the router's host and port): ``answered`` when a later exchange forwarded
    its answer, ``reissued`` when a later POST sent the same call under a new
    id (each later call re-issues one broken request, the earliest first),
    ``lost`` otherwise."""
    fates: dict[str, int] = {}
    reissues: set[int] = set()
    for index, exchange in enumerate(exchanges):
        message = exchange.request.jsonrpc
        if (
            exchange.request.method != "POST"
            or not exchange.severed
            or message is None
            or "id" not in message
            or "method" not in message
        ):
            continue
        request_id = message["id"]
        if _answers(exchange, request_id):
            continue  # the answer crossed before the cut: nothing broke
        later = exchanges[index + 1 :]
        again = next(
            (x.index for x in later
             if x.index not in reissues and x.request.method == "POST"
             and _same_call(message, x.request.jsonrpc)),
            None,
        )  # fmt: skip
        if any(_answers(x, request_id) for x in later):
            fate = "answered"
        elif again is not None:
            reissues.add(again)
            fate = "reissued"
        else:
            fate = "lost"
        fates[fate] = fates.get(fate, 0) + 1
    return fates
