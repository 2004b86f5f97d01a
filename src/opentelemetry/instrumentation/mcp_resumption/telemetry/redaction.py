# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Session ids in exported telemetry: hashed, kept raw or omitted, as the
``session_id`` setting says; scrubbed from exported text; and replaced in
the URLs that HTTP client spans record.

One ``Redaction`` per owner (client or server side): its HMAC key is made
new for each, so the hashes of two processes, or of two instrument() cycles,
cannot be joined; unless the shared state's key is set
(``OTEL_PYTHON_MCP_RESUMPTION_STATE_KEY``), which a fleet shares on purpose.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from typing import Any

from .. import config
from .facts import LEGACY_SESSION_PARAMETERS

# Session ids whose keyed hash is remembered (a dict, emptied when full).
SESSION_HASH_CACHE = 1024
# Session ids at least this long are scrubbed from exported text wherever they
# appear; shorter ones only as a whole token.
MIN_SCRUBBED_ANYWHERE = 8

# Where HTTP client spans record a URL or its query (stable and older semconv).
URL_ATTRIBUTES = ("url.full", "url.query", "http.url", "http.target")
_SESSION_PARAMETER = re.compile(
    r"((?:^|[?&])(?:" + "|".join(LEGACY_SESSION_PARAMETERS) + r")=)[^&#]*"
)


class Redaction:
    """The session-id policy of one owner."""

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        # The shared state's key, where one is set: the fleet's telemetry and
        # its Redis keys name a session by the same hash (docs/shared-state.md).
        self._hash_key = settings.state_key or os.urandom(32)
        self._session_hashes: dict[str, str] = {}

    def session_attribute(self, session_id: str | None) -> str | None:
        if session_id is None or self.settings.session_id == "omit":
            return None
        if self.settings.session_id == "raw":
            return session_id
        hashed = self._session_hashes.get(session_id)
        if hashed is None:
            # An HMAC per request was a tenth of the plugin's cost per request;
            # a session sends many.
            if len(self._session_hashes) >= SESSION_HASH_CACHE:
                self._session_hashes.clear()
            digest = hmac.new(self._hash_key, session_id.encode("utf-8", "replace"), hashlib.sha256)
            hashed = self._session_hashes[session_id] = digest.hexdigest()[:16]
        return hashed

    def task_id(self, task_id: str) -> str:
        """A task id as the verdict lines name it: always the keyed hash (a
        task id is a capability: whoever holds it may read the result)."""
        digest = hmac.new(self._hash_key, task_id.encode("utf-8", "replace"), hashlib.sha256)
        return digest.hexdigest()[:16]

    def scrub(self, text: str, session_ids: Iterable[str | None]) -> str:
        """``text`` with each of ``session_ids`` in it written as the session
        attribute is: event ids may embed the session (``s-77:e-104``), and
        gap messages quote event ids."""
        if self.settings.session_id == "raw":
            return text
        for session_id in session_ids:
            if not session_id or session_id not in text:
                continue
            replacement = self.session_attribute(session_id) or "<session>"
            if len(session_id) >= MIN_SCRUBBED_ANYWHERE:
                text = text.replace(session_id, replacement)
            else:  # short: only as a whole token, not inside another id's digits
                token = rf"(?<![A-Za-z0-9]){re.escape(session_id)}(?![A-Za-z0-9])"
                text = re.sub(token, lambda _, kept=replacement: kept, text)
        return text


def redact_urls(span: Any, session: str) -> None:
    """The legacy transport puts the raw session id in the query
    (``/messages?session_id=...``), which the HTTP client span records."""
    recorded = span.attributes or {}
    for key in URL_ATTRIBUTES:
        url = recorded.get(key)
        if isinstance(url, str) and "ession" in url:
            redacted = _SESSION_PARAMETER.sub(lambda m: m.group(1) + session, url)
            if redacted != url:
                span.set_attribute(key, redacted)
