# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What the continuity checks need from a JSON-RPC message: request and
response ids, and the meaning of an event's data.  Pure: standard library
only; never raises.

A body that is not read (over the limit, streamed, compressed, not JSON) is
*unknown*, which is not the same as "holds no request": the callers must
not take it for evidence of anything (``None`` below, never ``()``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import NamedTuple

# JSON-RPC ids are chosen by the peer, the server's at any length: a key over
# this many UTF-8 bytes is a digest of the id (equal ids keep equal keys).
MAX_KEY_BYTES = 128
# Bodies above this many UTF-8 bytes are not parsed: a tool result can be
# megabytes, and the ids are not worth that much CPU on the host's hot path.
MAX_PARSED_BYTES = 64 * 1024
# Tool names kept (a server chooses them) and tools read per tools/list answer.
MAX_TOOL_NAME = 128
MAX_TOOLS = 1024

TOOLS_CALL = "tools/call"
TOOLS_LIST = "tools/list"
# A subscription (2026-07-28): its stream stays open, and the server's result
# is its graceful close, not an answer a caller waits for.
LISTEN = "subscriptions/listen"
# The Events extension's requests a client resumes with a cursor, never a
# call whose answer is lost with its stream (``events``).
EVENTS_POLL = "events/poll"
EVENTS_STREAM = "events/stream"


def request_key(request_id: object) -> str | None:
    """A stable key for a JSON-RPC id that keeps ``1`` and ``"1"`` apart."""
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        return None
    # Not json.dumps: this runs for every request and response, and only
    # needs to be unique (a string's key alone starts with a quote).
    key = f'"{request_id}"' if isinstance(request_id, str) else str(request_id)
    if len(key) <= MAX_KEY_BYTES // 4:
        return key
    encoded = key.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_KEY_BYTES:
        return key
    # '#' starts neither an integer's key nor a string's
    return "#sha256:" + hashlib.sha256(encoded).hexdigest()[:32]


# The integer ids whose key is their decimal text within MAX_KEY_BYTES // 4
# characters: ``request_key`` of one of these, written out where every
# request and answer pays for it (the SDKs number their requests).
_SHORT_INTS = (-(10 ** (MAX_KEY_BYTES // 4 - 1)), 10 ** (MAX_KEY_BYTES // 4))


def within_limit(text: str | bytes) -> bool:
    """``text`` is at most ``MAX_PARSED_BYTES`` long in UTF-8."""
    size = len(text)
    if size > MAX_PARSED_BYTES:
        return False
    if isinstance(text, bytes) or size * 4 <= MAX_PARSED_BYTES or text.isascii():
        return True
    return len(text.encode("utf-8", "surrogatepass")) <= MAX_PARSED_BYTES


# The scanner json.loads itself runs (the C one where there is one).
_scan = json.JSONDecoder().scan_once


def loads(text: str | bytes) -> object:
    """``json.loads(text)``, without its Python wrappers where they do
    nothing: for a text that starts with ``{`` or ``[`` (UTF-8 for a bytes
    text whose second byte is not NUL: no BOM, not UTF-16 or -32), json.loads
    is its scanner at 0, then a check that nothing follows.  Anything else,
    and any text the scanner refuses or does not consume whole, goes to
    json.loads itself, which decides.  The wrappers were a third of a small
    body's parse."""
    if type(text) is bytes:
        if text[:1] not in (b"{", b"[") or text[1:2] == b"\x00":
            return json.loads(text)
        try:
            text = text.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return json.loads(text)
    elif type(text) is not str or text[:1] not in ("{", "["):
        return json.loads(text)
    try:
        parsed, end = _scan(text, 0)
    except (ValueError, StopIteration, RecursionError):
        return json.loads(text)
    return parsed if end == len(text) else json.loads(text)


def _decoded(text: str | bytes | None) -> object:
    """The parsed JSON, or ``_UNREAD``."""
    if not text or not within_limit(text):
        return _UNREAD
    try:
        return loads(text)
    except (ValueError, TypeError, RecursionError):
        return _UNREAD


_UNREAD = object()


def _one_object(text: str | bytes | None) -> dict | None:
    """The one JSON object ``text`` is, where ``_messages`` would be the
    scanner alone (``loads``'s first path: a ``{`` within the limit, scanned
    whole, nothing after it) and its answer that object alone; None where
    ``_messages`` decides (a batch, an error, anything else).  Most bodies
    and event data are one message: the wrappers were a fifth of a parse."""
    if type(text) is bytes:
        if len(text) > MAX_PARSED_BYTES or text[:1] != b"{" or text[1:2] == b"\x00":
            return None
        try:
            text = text.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return None
    elif type(text) is not str or len(text) * 4 > MAX_PARSED_BYTES or text[:1] != "{":
        return None
    try:
        parsed, end = _scan(text, 0)
    except (ValueError, StopIteration, RecursionError):
        return None
    return parsed if end == len(text) else None


def _messages(text: str | bytes | None) -> list[dict] | None:
    decoded = _decoded(text)
    if decoded is _UNREAD:
        return None
    if isinstance(decoded, dict):  # one message, not a batch: most bodies
        return [decoded]
    if isinstance(decoded, list):
        return [item for item in decoded if isinstance(item, dict)]
    return []


def requests_in(
    text: str | bytes | None, tools: dict[str, str] | None = None
) -> list[tuple[str, str]] | None:
    """(id key, method) of every request (not notification) in a body;
    ``None`` when the body could not be read.  ``tools``, if given, gets the
    tool each ``tools/call`` names, by id key (the same parse)."""
    message = _one_object(text)
    messages = [message] if message is not None else _messages(text)
    if messages is None:
        return None
    found = []
    low, high = _SHORT_INTS
    for message in messages:
        method = message.get("method")
        rid = message.get("id")
        key = str(rid) if type(rid) is int and low < rid < high else request_key(rid)
        if isinstance(method, str) and key is not None:
            found.append((key, method[:64]))
            if tools is not None and method == TOOLS_CALL:
                params = message.get("params")
                name = params.get("name") if isinstance(params, dict) else None
                if isinstance(name, str):
                    tools[key] = name[:MAX_TOOL_NAME]
    return found


# What error.type says of an answer that is a tool's own error (a result with
# isError true), as the MCP conventions name it.
TOOL_ERROR = "tool_error"
# Where a text may hold such a result: the SDKs write "isError":false into
# every tool result, so the key alone would parse each one.  JSON allows
# whitespace around the colon.
TOOL_FAILED = re.compile(r'"isError"\s*:\s*true')
_TOOL_FAILED_BYTES = re.compile(rb'"isError"\s*:\s*true')


def answer_errors(text: str | bytes | None) -> dict[str, str]:
    """Id key -> ``error.type`` of every answer in ``text`` that failed: the
    JSON-RPC error's code as text, or ``tool_error`` for a tool result with
    ``isError`` true.  Answers that succeeded are not in it.  Parses only a
    text that may hold such an answer."""
    if not text:
        return {}
    if isinstance(text, bytes):
        if b'"error"' not in text and not _TOOL_FAILED_BYTES.search(text):
            return {}
    elif '"error"' not in text and not TOOL_FAILED.search(text):
        return {}
    failed = {}
    for message in _messages(text) or ():
        key = request_key(message.get("id"))
        if key is None or "method" in message:
            continue
        error = message.get("error")
        result = message.get("result")
        if isinstance(error, dict):
            code = error.get("code")
            numeric = isinstance(code, int) and not isinstance(code, bool)
            failed[key] = str(code) if numeric else "_OTHER"
        elif isinstance(result, dict) and result.get("isError") is True:
            failed[key] = TOOL_ERROR
    return failed


class Call(NamedTuple):
    """One request of a body, as a re-issue is matched against it."""

    key: str
    digest: int | None  # of its method and params, less _meta; None: unknown
    tool: str | None = None  # the tool a tools/call names
    # A subscriptions/listen request: the notifications it asks for, as a
    # bounded label (see ``listen_filter``); None for any other request.
    listen: str | None = None


def calls_in(text: str | bytes | None) -> list[Call]:
    """Every request in a body, with the digest of its method and its params
    by JSON meaning, less ``_meta`` (where the MCP SDKs put the request id,
    as ``progressToken``), so that a re-issue of a call under a new id has
    the same digest.  Costs a parse: only for the bodies of requests that
    broke, or that may re-issue one."""
    messages = _messages(text) or []
    found = []
    for message in messages:
        method = message.get("method")
        key = request_key(message.get("id"))
        if not isinstance(method, str) or key is None:
            continue
        params = message.get("params")
        if isinstance(params, dict) and "_meta" in params:
            params = {name: value for name, value in params.items() if name != "_meta"}
        try:
            call = hash(json.dumps([method, params], sort_keys=True, separators=(",", ":")))
        except (ValueError, TypeError, RecursionError):
            call = None
        tool = listen = None
        if isinstance(params, dict):
            if method == TOOLS_CALL and isinstance(params.get("name"), str):
                tool = params["name"][:MAX_TOOL_NAME]
            elif method == LISTEN:
                listen = listen_filter(params.get("notifications"))
        elif method == LISTEN:
            listen = listen_filter(None)
        found.append(Call(key, call, tool, listen))
    return found


# The filter of a subscriptions/listen request -> the label it is counted
# under: a fixed set of values, whatever URIs it names.
_LISTEN_KINDS = (
    ("promptsListChanged", "prompts"),
    ("resourceSubscriptions", "resource_updates"),
    ("resourcesListChanged", "resources"),
    ("toolsListChanged", "tools"),
)


# Every value listen_filter gives: each combination of the kinds, and "none".
LISTEN_FILTERS = (
    *(
        ",".join(label for index, (_, label) in enumerate(_LISTEN_KINDS) if mask >> index & 1)
        for mask in range(1, 1 << len(_LISTEN_KINDS))
    ),
    "none",
)


def listen_filter(notifications: object) -> str:
    """The notifications a subscription asks for, as a bounded label: the
    kinds it names, sorted and joined by ``,`` (``prompts``,
    ``resource_updates`` for any resource URIs, ``resources``, ``tools``),
    or ``none``."""
    if not isinstance(notifications, dict):
        return "none"
    kinds = [label for name, label in _LISTEN_KINDS if notifications.get(name)]
    return ",".join(kinds) or "none"


def tool_hints_in(text: str | bytes | None) -> dict[str, bool] | None:
    """Of a ``tools/list`` result in ``text``: each tool's name -> whether
    the server declared it safe to run twice (``idempotentHint`` or
    ``readOnlyHint`` true in its annotations).  None where no such result
    could be read.  Costs a parse: only for the answers to tools/list."""
    for message in _messages(text) or ():
        result = message.get("result")
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            continue
        hints: dict[str, bool] = {}
        for tool in tools[:MAX_TOOLS]:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            annotations = tool.get("annotations")
            safe = isinstance(annotations, dict) and (
                annotations.get("idempotentHint") is True or annotations.get("readOnlyHint") is True
            )
            hints[tool["name"][:MAX_TOOL_NAME]] = safe
        return hints
    return None


def cancelled_in(text: str | bytes | None) -> list[str]:
    """Id keys of the requests a body's ``notifications/cancelled`` name."""
    found = []
    for message in _messages(text) or []:
        params = message.get("params")
        if message.get("method") == "notifications/cancelled" and isinstance(params, dict):
            key = request_key(params.get("requestId"))
            if key is not None:
                found.append(key)
    return found


def responses_in(text: str | None) -> tuple[str, ...] | None:
    """Id keys of every response (result or error) in an event's data;
    ``None`` when the data may hold one but could not be read."""
    # Cheap pre-check: most events on a busy stream are notifications.
    if not text or ('"result"' not in text and '"error"' not in text):
        return ()
    message = _one_object(text)
    if message is not None:  # one message, the common case: the loop below for it
        if "method" not in message and ("result" in message or "error" in message):
            rid = message.get("id")
            low, high = _SHORT_INTS
            key = str(rid) if type(rid) is int and low < rid < high else request_key(rid)
            if key is not None:
                return (key,)
        return ()
    messages = _messages(text)
    if messages is None:
        return None
    found = []
    for message in messages:
        if "method" not in message and ("result" in message or "error" in message):
            key = request_key(message.get("id"))
            if key is not None:
                found.append(key)
    return tuple(found)


def is_message(text: str | None) -> bool:
    """``text`` is a JSON-RPC message (or batch): what an MCP event carries.
    Anything else on an MCP stream (``ping``, ``{}``) is a keep-alive."""
    if not text or '"jsonrpc"' not in text:
        return False
    messages = _messages(text)
    return messages is None or any("jsonrpc" in message for message in messages)


def canonical_digest(text: str | None) -> int | None:
    """A digest of what JSON ``text`` means, not of its bytes: the same for
    ``{"a": 1, "b": 2}`` and ``{"b":2,"a":1}`` (a store that keeps JSON as
    JSONB sends it back so).  ``None`` where it does not parse.  Costs a
    parse: for the few events a resume compares, never per event."""
    decoded = _decoded(text)
    if decoded is _UNREAD:
        return None
    try:
        return hash(json.dumps(decoded, sort_keys=True, separators=(",", ":")))
    except (ValueError, TypeError, RecursionError):
        return None
