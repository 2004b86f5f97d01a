# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What the continuity checks need from a JSON-RPC message: request and
response ids.  Pure: standard library only; never raises."""

from __future__ import annotations

import hashlib
import json

# JSON-RPC ids are chosen by the peer, the server's at any length: a key over
# this many UTF-8 bytes is a digest of the id (equal ids keep equal keys).
MAX_KEY_BYTES = 128
# Bodies above this are not parsed: a tool result can be megabytes, and the
# ids are not worth that much CPU on the host's hot path.
MAX_PARSED_BYTES = 64 * 1024


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


def _messages(text: str | bytes | None) -> list[dict]:
    if not text or len(text) > MAX_PARSED_BYTES:
        return []
    try:
        decoded = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return []
    items = decoded if isinstance(decoded, list) else [decoded]
    return [item for item in items if isinstance(item, dict)]


def requests_in(text: str | bytes | None) -> list[tuple[str, str]]:
    """(id key, method) of every request (not notification) in a body."""
    found = []
    for message in _messages(text):
        method = message.get("method")
        key = request_key(message.get("id"))
        if isinstance(method, str) and key is not None:
            found.append((key, method[:64]))
    return found


def responses_in(text: str | None) -> tuple[str, ...]:
    """Id keys of every response (result or error) in an event's data."""
    # Cheap pre-check: most events on a busy stream are notifications.
    if not text or ('"result"' not in text and '"error"' not in text):
        return ()
    return tuple(
        key
        for message in _messages(text)
        if "method" not in message and ("result" in message or "error" in message)
        for key in (request_key(message.get("id")),)
        if key is not None
    )
