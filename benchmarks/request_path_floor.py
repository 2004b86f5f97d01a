"""The floor of the per-POST target: what the plugin's four patch points cost
a POST answered with SSE when they do nothing but the least any continuity
check needs, against the httpx instrumentation alone, in one interleaved run.

    PYTHONPATH=src .venv-mcp2/bin/python benchmarks/request_path_floor.py [--rounds N] [--posts N]

``post_in_process.py``'s harness (a POST answered in the same process, the
httpx instrumentation's client span made), with, in place of the plugin, a
stand-in that wraps what the plugin wraps (``Client.send``,
``EventSource.iter_sse``, ``Response.close``; a span processor's
``on_start``), as the plugin does (wrapt), and only: reads the request's and
the answer's headers in one pass, puts one attribute on the client span,
registers the response, and keeps a ring of references to its events.  No
request body or event is parsed, no tracker is kept, nothing is checked.
What it adds over ``httpx-instr`` is a floor under any design that keeps
these patch points: the checks' own work (the two JSON-RPC parses, the
session's ledger and seen window, the stream's cursors) comes on top.
"""

from __future__ import annotations

import argparse
import contextvars
import statistics
import sys
import weakref
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import httpx_sse
from opentelemetry.instrumentation.utils import unwrap
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import SpanKind
from wrapt import wrap_function_wrapper

from opentelemetry.instrumentation.mcp_resumption.patches.http import _headers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import configs
from post_in_process import warmed_posts

# The headers the plugin reads, with its own one-pass reader.
_REQUEST = frozenset((b"last-event-id", b"mcp-session-id", b"mcp-protocol-version", b"accept"))
_RESPONSE = frozenset((b"mcp-session-id", b"mcp-protocol-version", b"content-type"))


class _StandIn(SpanProcessor):
    """The least the plugin's patches could do, and their span hook."""

    def __init__(self) -> None:
        self.scope: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
            "floor", default=None
        )
        self.streams: weakref.WeakKeyDictionary[Any, deque] = weakref.WeakKeyDictionary()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        attributes = self.scope.get()
        if attributes is not None and span.kind is SpanKind.CLIENT:
            span.set_attributes(attributes)

    def send(self, wrapped, instance, args, kwargs):
        request = args[0] if args else kwargs["request"]
        session = _headers(request.headers, _REQUEST).get(b"mcp-session-id")
        if session is None:
            return wrapped(*args, **kwargs)
        token = self.scope.set({"mcp.session.id": session[:8]})
        try:
            response = wrapped(*args, **kwargs)
        finally:
            self.scope.reset(token)
        content_type = _headers(response.headers, _RESPONSE).get(b"content-type", "")
        if content_type.startswith("text/event-stream"):
            self.streams[response] = deque(maxlen=17)
        return response

    def iter_sse(self, wrapped, instance, args, kwargs):
        events = wrapped(*args, **kwargs)
        ring = self.streams.get(instance.response)
        return events if ring is None else self._ringed(events, ring, instance.response)

    def _ringed(self, events, ring: deque, response: Any):
        append = ring.append
        for sse in events:
            append(sse)
            yield sse
        self.streams.pop(response, None)

    def close(self, wrapped, instance, args, kwargs):
        if instance in self.streams:
            pass  # the plugin asks whether the close comes from inside a read here
        return wrapped(*args, **kwargs)


def _stand_in_posts(count: int) -> float:
    """CPU µs per POST under the httpx instrumentation and the stand-in."""
    stand_in = _StandIn()
    with configs.configured("httpx-instr", span_processor=stand_in):
        wrap_function_wrapper(httpx, "Client.send", stand_in.send)
        wrap_function_wrapper(httpx_sse, "EventSource.iter_sse", stand_in.iter_sse)
        wrap_function_wrapper(httpx, "Response.close", stand_in.close)
        try:
            return warmed_posts("sse", count)
        finally:
            unwrap(httpx.Client, "send")
            unwrap(httpx_sse.EventSource, "iter_sse")
            unwrap(httpx.Response, "close")


def _configured_posts(config: str, count: int) -> float:
    with configs.configured(config):
        return warmed_posts("sse", count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--posts", type=int, default=2000)
    args = parser.parse_args()
    runs = {
        "httpx-instr": partial(_configured_posts, "httpx-instr"),
        "stand-in (patch points only)": _stand_in_posts,
        "ours": partial(_configured_posts, "ours"),
    }
    per: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            per[name].append(run(args.posts))
    baseline = statistics.median(per["httpx-instr"])
    print(f"{args.rounds} rounds of {args.posts} POSTs answered with SSE (httpx-sse)\n")
    print("| configuration | CPU µs/POST | vs httpx-instr |")
    print("|---|---:|---:|")
    for name, values in per.items():
        value = statistics.median(values)
        print(f"| {name} | {value:,.1f} | {value - baseline:+.1f} |")


if __name__ == "__main__":
    main()
