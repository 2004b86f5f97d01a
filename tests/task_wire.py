"""The wire truth of the task tests: the demo's loopback router, keeping
every request and the whole body of every answer (JSON or SSE), able to cut
one answer's body half way, in front of a server a restart can replace."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp_resumption_demo.router import Backend, Exchange, RequestHead, Route
from wire import WireRouter


class TaskRouter(WireRouter):
    """The router, keeping every answer's whole body, and cutting an
    answer's body half way where the policy's route says ``cut_body``."""

    def __init__(self, policy, **kwargs) -> None:
        super().__init__(policy, **kwargs)
        self.bodies: dict[int, bytearray] = {}
        router = self

        def scan(scanner, piece: bytes, route: Route, exchange: Exchange) -> int | None:
            if getattr(route, "cut_body", False) and piece:
                cut = max(1, len(piece) // 2)
                router.bodies.setdefault(exchange.index, bytearray()).extend(piece[:cut])
                return cut
            router.bodies.setdefault(exchange.index, bytearray()).extend(piece)
            return WireRouter._scan(scanner, piece, route, exchange)

        self._scan = scan  # type: ignore[method-assign]

    def answer(self, exchange: Exchange) -> dict | None:
        """The JSON-RPC answer that crossed the wire whole, or None."""
        body = bytes(self.bodies.get(exchange.index, b""))
        if exchange.severed or not body:
            return None
        if (exchange.response_header("content-type") or "").startswith("text/event-stream"):
            for line in body.decode().splitlines():
                if line.startswith("data:") and '"id"' in line:
                    return json.loads(line[5:])
            return None
        return json.loads(body)

    def answered(self, exchange: Exchange) -> dict | None:
        """``answer`` for a wait: None while its body is still crossing."""
        try:
            return self.answer(exchange)
        except ValueError:
            return None

    def of(self, method: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.request.jsonrpc_method == method]


def cut_body_route(backend: Backend) -> Route:
    route = Route(backend)
    object.__setattr__(route, "cut_body", True)  # frozen dataclass: an extra flag
    return route


def switchable(current: Callable[[], Any], cut: Callable[[RequestHead], bool]):
    """A policy to whichever server ``current`` names (anything with a
    ``port``: a restart switches it), cutting the answers ``cut`` picks."""

    def policy(request: RequestHead) -> Route:
        backend = Backend("server", current().port)
        return cut_body_route(backend) if cut(request) else Route(backend)

    return policy
