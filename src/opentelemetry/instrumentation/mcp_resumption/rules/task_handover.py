# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""A task handed to the fleet: what a process that exits while following a
task leaves for the next process that follows it (a restarted client that
kept its task ids, as the specification asks), and when nobody following it
makes it ``abandoned``.

Pure: standard library only.  The record never holds the task id (the store
keys it by the keyed hash; a follower knows the id it polls), only the facts
the first process saw: the tool, the form, the TTL and the latest moment the
task was seen alive (so a follower still tells ``lost`` from ``expired``),
its polls, and the transport and server the first process counted it under.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["VERSION", "HandedTask", "abandon_due"]

VERSION = 1
# A tool name longer than this is cut (the telemetry cuts it shorter).
MAX_TOOL = 256


@dataclass
class HandedTask:
    """One open task, as the process that stops following it saw it."""

    tool: str | None
    form: str
    alive_wall: float  # epoch s: the latest moment it was seen alive or ending
    ttl_s: float | None
    received_wall: float  # epoch s: when the handle came
    polls: int
    cancel_acked: bool
    status: str
    tag: Any  # the owner's (transport, host, port), JSON-able
    handed_at: float = 0.0  # epoch s

    def encode(self) -> bytes:
        document = {
            "v": VERSION,
            "tool": self.tool[:MAX_TOOL] if self.tool else None,
            "form": self.form,
            "alive": self.alive_wall,
            "ttl": self.ttl_s,
            "received": self.received_wall,
            "polls": self.polls,
            "cancel": self.cancel_acked,
            "status": self.status[:32],
            "tag": list(self.tag) if isinstance(self.tag, (tuple, list)) else None,
            "handed": self.handed_at,
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | str | None) -> HandedTask | None:
        """The task in ``raw``; None for nothing, another version, or
        anything malformed (a store is shared: never trusted)."""
        if not raw:
            return None
        try:
            document = json.loads(raw)
            if not isinstance(document, dict) or document.get("v") != VERSION:
                return None
            tool = document.get("tool")
            ttl = document.get("ttl")
            tag = document.get("tag")
            if isinstance(tag, list) and len(tag) == 3:
                transport, host, port = tag
                tag = (str(transport), str(host), None if port is None else int(port))
            else:
                tag = None
            return cls(
                tool=str(tool)[:MAX_TOOL] if tool is not None else None,
                form=str(document["form"]),
                alive_wall=float(document["alive"]),
                ttl_s=None if ttl is None else float(ttl),
                received_wall=float(document["received"]),
                polls=max(0, int(document.get("polls") or 0)),
                cancel_acked=bool(document.get("cancel")),
                status=str(document.get("status") or "working")[:32],
                tag=tag,
                handed_at=float(document.get("handed") or 0.0),
            )
        except (ValueError, TypeError, KeyError):
            return None


def abandon_due(task: HandedTask, window: float, cap: float) -> float:
    """When (epoch s) a handed task nobody followed is ``abandoned``: once its
    TTL may have run out (counted from the latest moment it was seen alive,
    the rule that tells ``expired`` from ``lost``), but never sooner than
    ``window`` (the reissue window) after it was handed over, and never
    later than ``cap`` after it (a task without a TTL, or a long one)."""
    latest = task.handed_at + cap
    expiry = latest if task.ttl_s is None else task.alive_wall + task.ttl_s
    return max(task.handed_at + window, min(expiry, latest))
