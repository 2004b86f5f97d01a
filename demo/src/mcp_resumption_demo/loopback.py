# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""Run an ASGI app with uvicorn on 127.0.0.1, on a free port, in a background thread.

Each server gets its own thread and event loop, as a separate process of the
fleet would; the scenario's client and the router run in the caller's loop.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterable
from typing import Any

import uvicorn

__all__ = ["LoopbackServer", "close_all"]

_STARTUP_TIMEOUT_S = 10.0
_SHUTDOWN_TIMEOUT_S = 5.0
# Streams that are still open at shutdown get this long before uvicorn cancels
# them; the router closes its connections first, so this is only a backstop.
_GRACEFUL_SHUTDOWN_S = 1.0


class _Server(uvicorn.Server):
    """uvicorn.Server that reports the end of its startup instead of being polled."""

    def __init__(self, config: uvicorn.Config, startup_done: threading.Event) -> None:
        super().__init__(config)
        self._startup_done = startup_done

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self._startup_done.set()


class LoopbackServer:
    """An ASGI app served on ``127.0.0.1:<free port>`` until :meth:`close`."""

    def __init__(self, app: Any, *, name: str = "asgi") -> None:
        self.name = name
        # Binding here (port 0) rather than in uvicorn makes the port known
        # before the thread starts and rules out a race for a "free" number.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_config=None,  # never reconfigure the host program's logging
            log_level="warning",
            access_log=False,
            lifespan="auto",
            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
        )
        self._startup_done = threading.Event()
        self._server = _Server(config, self._startup_done)
        self._thread = threading.Thread(target=self._run, name=f"loopback-{name}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self._startup_done.set()  # wake start() if startup failed before it could

    def start(self) -> LoopbackServer:
        """Start serving; return once the socket accepts connections."""
        self._thread.start()
        if not self._startup_done.wait(_STARTUP_TIMEOUT_S) or not self._server.started:
            self.close()
            raise RuntimeError(f"loopback server {self.name!r} failed to start")
        return self

    def request_stop(self) -> None:
        self._server.should_exit = True

    def join(self) -> None:
        """Wait for the serving thread to end (after :meth:`request_stop`)."""
        if self._thread.is_alive():
            self._thread.join(_SHUTDOWN_TIMEOUT_S)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(_SHUTDOWN_TIMEOUT_S)
        self._sock.close()
        if self._thread.is_alive():
            raise RuntimeError(f"loopback server {self.name!r} did not stop")

    def close(self) -> None:
        self.request_stop()
        self.join()

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def astart(self) -> LoopbackServer:
        """:meth:`start` without blocking the caller's event loop."""
        return await asyncio.to_thread(self.start)


def close_all(servers: Iterable[LoopbackServer]) -> None:
    """Stop several servers at once (their shutdowns overlap instead of adding up)."""
    pending = list(servers)
    for server in pending:
        server.request_stop()
    for server in pending:
        server.join()
