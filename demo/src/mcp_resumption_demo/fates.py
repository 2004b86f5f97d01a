# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What happened to each broken request and each subscription, as the
router's log shows it: the demo's truth for
``mcp.client.resumption.broken_requests``, ``.reissues``,
``.duplicate_runs`` and ``.lost_subscriptions``.

Everything here reads the wire (requests as sent, events as forwarded, the
router's cuts), never the plugin, and spells out the rules it applies
itself, so that the demo's check of the plugin is not the plugin checking
itself."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .clients import WireEvent, response_id
from .router import Exchange, ForwardedEvent

__all__ = ["broken_request_fates", "listen_filter", "wire_counts"]

LISTEN = "subscriptions/listen"
# The first revision that cancels a call whose stream closes (2026-07-28:
# closing the stream is how a client cancels); before it a server SHOULD NOT
# take a disconnect for cancellation, so a re-issued call may run twice.
CANCELS_ON_CLOSE = "2026-07-28"
# The filter of a subscriptions/listen request (its ``notifications``), as
# the specification names its kinds -> the label of each.
_LISTEN_KINDS = (
    ("promptsListChanged", "prompts"),
    ("resourceSubscriptions", "resource_updates"),
    ("resourcesListChanged", "resources"),
    ("toolsListChanged", "tools"),
)


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


def _message(event: ForwardedEvent) -> dict[str, object] | None:
    try:
        decoded = json.loads(event.data) if event.data else None
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


@dataclass(frozen=True)
class _Broken:
    """A request whose POST stream the router cut before its answer."""

    exchange: Exchange
    fate: str
    reissue: Exchange | None  # the later POST that sent the same call again
    answered_later: bool  # its own answer crossed on a later exchange


def _broken_requests(exchanges: list[Exchange]) -> Iterator[_Broken]:
    reissues: set[int] = set()
    for index, exchange in enumerate(exchanges):
        message = exchange.request.jsonrpc
        if (
            exchange.request.method != "POST"
            or not exchange.severed
            or message is None
            or "id" not in message
            or "method" not in message
            # a subscription awaits no answer: it is lost, never broken
            or message["method"] == LISTEN
        ):
            continue
        request_id = message["id"]
        if _answers(exchange, request_id):
            continue  # the answer crossed before the cut: nothing broke
        later = exchanges[index + 1 :]
        again = next(
            (x for x in later
             if x.index not in reissues and x.request.method == "POST"
             and _same_call(message, x.request.jsonrpc)),
            None,
        )  # fmt: skip
        # The first of the two on the wire decides: an exchange that forwarded
        # the answer and began before the re-issue was sent, or the re-issue.
        answered_on = next((x.index for x in later if _answers(x, request_id)), None)
        if answered_on is not None and (again is None or answered_on < again.index):
            yield _Broken(exchange, "answered", None, True)
        elif again is not None:
            reissues.add(again.index)
            yield _Broken(exchange, "reissued", again, answered_on is not None)
        else:
            yield _Broken(exchange, "lost", None, False)


def broken_request_fates(exchanges: list[Exchange]) -> dict[str, int]:
    """The fate of every request whose POST stream the router cut before its
    answer, as the router's log shows it (every exchange went to one server,
    the router's host and port): ``answered`` when a later exchange forwarded
    its answer, ``reissued`` when a later POST sent the same call under a new
    id (each later call re-issues one broken request, the earliest first),
    whichever began first (the log holds the exchanges in the order their
    requests reached the router), ``lost`` otherwise. A
    ``subscriptions/listen`` request is a subscription, not a call: it has
    no fate."""
    fates: dict[str, int] = {}
    for broken in _broken_requests(exchanges):
        fates[broken.fate] = fates.get(broken.fate, 0) + 1
    return fates


def _declared_safe(exchanges: list[Exchange], before: int, tool: object) -> str:
    """What the last ``tools/list`` answer that crossed the wire before
    exchange *before* declared of *tool*: ``true`` (``idempotentHint`` or
    ``readOnlyHint``), ``false`` (listed without either), ``unknown`` (no
    answer, or the tool not in it)."""
    for exchange in reversed(exchanges[:before]):
        if exchange.request.jsonrpc_method != "tools/list":
            continue
        request_id = (exchange.request.jsonrpc or {}).get("id")
        for event in exchange.events:
            answer = _message(event)
            if answer is None or answer.get("id") != request_id:
                continue
            result = answer.get("result")
            tools = result.get("tools") if isinstance(result, dict) else None
            if not isinstance(tools, list):
                continue
            for listed in tools:
                if isinstance(listed, dict) and listed.get("name") == tool:
                    hints = listed.get("annotations") or {}
                    safe = hints.get("idempotentHint") is True or hints.get("readOnlyHint") is True
                    return "true" if safe else "false"
            return "unknown"
    return "unknown"


def listen_filter(params: object) -> str:
    """The notifications a listen request asks for: the kinds it names,
    sorted and joined by ``,``, or ``none``."""
    notifications = params.get("notifications") if isinstance(params, Mapping) else None
    if not isinstance(notifications, Mapping):
        return "none"
    return ",".join(label for name, label in _LISTEN_KINDS if notifications.get(name)) or "none"


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def wire_counts(exchanges: list[Exchange]) -> dict[str, dict[str, int]]:
    """What a correct client-side count shows for these exchanges (one
    server), each keyed as the demo's ``counted`` is:

    * ``reissues`` (by risk) and ``reissues_by_idempotent``: every
      re-issued broken request. Idempotent: ``true`` for a request other
      than ``tools/call``, else what the last ``tools/list`` answer before
      the re-issue declared of the tool. Risk ``may_run_twice`` where it is
      not ``true`` and the re-issue was sent under a protocol older than
      2026-07-28 (its ``MCP-Protocol-Version``), or none; else ``none``.
    * ``duplicate_runs``: broken requests re-issued whose own answer came
      later as well as the re-issue's: the call ran twice.
    * ``lost_subscriptions`` (by whether a later listen went to the same
      server) and ``lost_subscriptions_by_filter``: listen requests whose
      stream ended with neither the server's result for them nor the
      client's own close.
    """
    counts: dict[str, dict[str, int]] = {
        "reissues": {}, "reissues_by_idempotent": {}, "duplicate_runs": {},
        "lost_subscriptions": {}, "lost_subscriptions_by_filter": {},
    }  # fmt: skip
    for broken in _broken_requests(exchanges):
        again = broken.reissue
        if again is None:
            continue
        message = again.request.jsonrpc or {}
        if broken.answered_later and _answers(again, message.get("id")):
            _count(counts["duplicate_runs"], "all")
        params = message.get("params")
        if message.get("method") == "tools/call":
            tool = params.get("name") if isinstance(params, Mapping) else None
            idempotent = _declared_safe(exchanges, again.index, tool)
        else:
            idempotent = "true"
        version = again.request.header("mcp-protocol-version")
        cancels = version is not None and version >= CANCELS_ON_CLOSE
        risk = "may_run_twice" if idempotent != "true" and not cancels else "none"
        _count(counts["reissues"], risk)
        _count(counts["reissues_by_idempotent"], idempotent)
    for index, exchange in enumerate(exchanges):
        message = exchange.request.jsonrpc or {}
        if exchange.request.method != "POST" or message.get("method") != LISTEN:
            continue
        if _answers(exchange, message.get("id")) or exchange.client_closed:
            continue  # graceful (the server's result) or local (the client's close)
        relistened = any(
            x.request.method == "POST" and x.request.jsonrpc_method == LISTEN
            for x in exchanges[index + 1 :]
        )
        _count(counts["lost_subscriptions"], "true" if relistened else "false")
        _count(counts["lost_subscriptions_by_filter"], listen_filter(message.get("params")))
    return counts
