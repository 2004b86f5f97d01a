# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""A row of a break behind a bridge: npm ``supergateway`` puts a stdio MCP
server (the installed SDK's, :mod:`.stdio_server`) behind streamable HTTP, as
people do during a migration. It keeps sessions (``--stateful``) but has no
event store: its streams carry no event ids, so a cut stream cannot be
resumed at all.

supergateway comes from the node project that also holds the TypeScript
server (``ts_server/``, installed with ``npm ci`` on first use); the row is
skipped where node or npm is missing. Its truth is read from the router's
log, as the stateless rows' is.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Final

from .clients import MCP_MAJOR, sdk_streamable_session
from .router import Backend
from .scenarios import Scenario, ScenarioWire, _staged
from .stateless_scenarios import call_until_cut, cut_first_call, record_cut
from .typescript_server import node_project, prepare

__all__ = ["SCENARIOS"]

_STARTUP_TIMEOUT_S: Final = 30.0


class Supergateway:
    """``supergateway --stateful`` on a free loopback port, its child the
    demo's stdio server."""

    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        node = shutil.which("node") or "node"
        entry = node_project() / "node_modules" / ".bin" / "supergateway"
        server = f"{sys.executable} -m mcp_resumption_demo.stdio_server"
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            [node, str(entry), "--stdio", server, "--outputTransport", "streamableHttp",
             "--stateful", "--logLevel", "none", "--port", str(self.port)],
            # A pipe of its own: supergateway ends at the end of its stdin, and
            # the demo's may be closed already (run from cron, CI, < /dev/null).
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while True:  # until it accepts connections
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"supergateway did not start: {self._output()[-500:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)

    def _output(self) -> str:
        self._log.seek(0)
        return self._log.read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdin is not None:
            self.process.stdin.close()
        self._log.close()


async def _bridge_cut_lost() -> ScenarioWire:
    bridge = await asyncio.to_thread(Supergateway)
    try:
        async with _staged() as stage:
            backend = Backend(name="supergateway", port=bridge.port)
            router = await stage.route(cut_first_call(backend))
            wire = ScenarioWire("bridge_cut_lost", MCP_MAJOR, transport_before="streamable-http")
            async with sdk_streamable_session(f"{router.url}/mcp") as session:
                wire.tool_result = await call_until_cut(session, router)
            return record_cut(wire, router)
    finally:
        await asyncio.to_thread(bridge.close)


SCENARIOS = (
    Scenario(
        name="bridge_cut_lost",
        happened=(
            "A stdio server behind npm supergateway (streamable HTTP with sessions, no event "
            "store), as a migration puts one. The SDK client's tools/call slow is cut after "
            "its first progress notification, which carried no event id: nothing to resume "
            "with. The application gives up on the failed call; the result is lost. Fate: lost."
        ),
        expected_gaps=("orphaned_request",),
        expected_outcome="not_resumable",
        run=_bridge_cut_lost,
        prepare=prepare,
    ),
)
