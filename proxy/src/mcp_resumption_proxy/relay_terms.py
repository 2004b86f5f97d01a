# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The terms every ``--resumable`` relay keeps, whether its events live in
this process (``resumable.Relay``) or in the fleet's Redis
(``shared.SharedRelays``): the ids it gives its events and its bounds.

Both sides read them from here, so that neither imports the other for them.
"""

from __future__ import annotations

import re

# Like an event store's retention: per stream, the last events up to both bounds.
MAX_EVENTS = 1024
MAX_BYTES = 4 * 1024 * 1024
MAX_RELAYS = 1024
MAX_EVENT_BYTES = 16 * 1024 * 1024
# How long a relay reads on without a client before it lets the upstream go.
LINGER = 30.0
# A server that closes a call's stream on purpose (SSE polling) names when to
# resume it (``retry:``); the SDK clients wait 1 s without one.  The proxy
# waits as it is told, within these bounds: a server's 0 must not make it
# poll in a loop, nor a large value hold the client's call for long.
POLL_DELAY = 1.0
POLL_DELAY_MIN = 0.05
POLL_DELAY_MAX = 30.0

# ``<relay key>:<n>``: the key is ``p<8 hex>-<count>``, random per process.
PROXY_ID = re.compile(r"^(p[0-9a-f]{8}-[0-9]+):([0-9]+)$")


def parse(cursor: str) -> tuple[str, int] | None:
    """The relay key and event number an id of the proxy's names, else None."""
    match = PROXY_ID.match(cursor)
    return None if match is None else (match.group(1), int(match.group(2)))
