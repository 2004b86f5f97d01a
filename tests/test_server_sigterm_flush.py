"""The last counts survive a stop: a real SDK server (examples/server) under
the real ``opentelemetry-instrument``, exporting OTLP/HTTP to a recording
stand-in collector with a periodic export far beyond the test, serves one
tool call and is stopped with SIGTERM, the way Docker and Kubernetes stop
it.  uvicorn re-raises the signal after its graceful shutdown, so the SDK's
exit export never runs: only the server half's flush at the lifespan's
shutdown gets the counts out.

The truth is the collector's record (what reached it) and the process's
exit by the signal; the call itself is checked on its answer."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import OtlpHttpCollector, clean_env

SERVER = Path(__file__).resolve().parents[1] / "examples" / "server" / "server.py"
SRC = Path(__file__).resolve().parents[1] / "src"
BIN = Path(sys.executable).parent


async def call_once(url: str) -> str:
    import importlib.metadata

    from mcp import ClientSession

    if int(importlib.metadata.version("mcp").split(".")[0]) == 1:
        from mcp.client.streamable_http import streamablehttp_client as connect
    else:
        from mcp.client.streamable_http import streamable_http_client as connect
    async with connect(url) as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        tools = await session.list_tools()
        return ",".join(tool.name for tool in tools.tools)


def listening(port: int, process: subprocess.Popen) -> None:
    """Wait until uvicorn listens on the socket the program bound (it prints
    the port first, then starts the server)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, "never listened"
            time.sleep(0.05)


@pytest.mark.parametrize("disabled", ["mcp_resumption", "mcp_resumption,mcp_resumption_server"],
                         ids=["server-half-on", "control-both-off"])
def test_sigterm_keeps_the_last_counts(disabled):
    collector = OtlpHttpCollector()
    env = clean_env(
        OTEL_SERVICE_NAME="sigterm-server",
        OTEL_TRACES_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_METRIC_EXPORT_INTERVAL="600000",  # no periodic export within the test
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled,
        PYTHONPATH=str(SRC),
    )
    process = subprocess.Popen(
        [str(BIN / "opentelemetry-instrument"), sys.executable, str(SERVER), "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = process.stdout.readline()
        match = re.match(r"serving (http://127\.0\.0\.1:\d+/mcp)$", first.strip())
        assert match, (first, process.stderr.read() if process.poll() is not None else "")
        port = int(match.group(1).rsplit(":", 1)[1].split("/")[0])
        listening(port, process)
        tools = asyncio.run(call_once(match.group(1)))
        assert tools, "the server answered"
        assert collector.received == [], "nothing exported before the stop"
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        collector.close()
    # uvicorn's way: the graceful shutdown ran, then the signal ended it.
    assert process.returncode == -signal.SIGTERM, (process.returncode, process.stderr.read())
    metrics = b"".join(body for path, body in collector.received if path == "/v1/metrics")
    if disabled == "mcp_resumption":
        assert b"mcp.server.resumption.requests" in metrics, "the last counts reached it"
        assert b"mcp.server.operation.duration" in metrics
        assert b"tools/list" in metrics
    else:  # the control: without the server half nothing gets out at SIGTERM
        assert b"mcp.server" not in metrics


DOCS = Path(__file__).resolve().parents[1] / "docs" / "server.md"
LISTEN_SERVER = Path(__file__).resolve().parent / "programs" / "listen_server.py"


def test_the_docs_say_how_to_stop_a_server_with_open_listens():
    """Under ``MCPServer.run`` an open listen holds SIGTERM's graceful
    shutdown until the orchestrator's SIGKILL: the docs say so, and how to
    bound it (measured by hand; the bound's effect is the test below)."""
    text = " ".join(DOCS.read_text(encoding="utf-8").split())
    assert "open `subscriptions/listen` streams" in text
    assert "SIGKILL" in text and "MCPServer.run" in text
    assert "timeout_graceful_shutdown=5" in text and "--timeout-graceful-shutdown" in text


@pytest.mark.mcp2
def test_a_bounded_graceful_shutdown_ends_an_open_listen_and_keeps_the_counts():
    """The docs' advice, for real: a 2026-07-28 server served by uvicorn with
    ``timeout_graceful_shutdown``, one call answered and one listen open,
    then SIGTERM: the process ends by the signal (no SIGKILL needed) and the
    collector has the deliveries and the listens."""
    from mcp import Client

    collector = OtlpHttpCollector()
    env = clean_env(
        OTEL_SERVICE_NAME="listen-server",
        OTEL_TRACES_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_METRIC_EXPORT_INTERVAL="600000",  # no periodic export within the test
        PYTHONPATH=str(SRC),
    )
    process = subprocess.Popen(
        [str(BIN / "opentelemetry-instrument"), sys.executable, str(LISTEN_SERVER), "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = process.stdout.readline()
        match = re.match(r"serving (http://127\.0\.0\.1:(\d+)/mcp)$", first.strip())
        assert match, (first, process.stderr.read() if process.poll() is not None else "")
        listening(int(match.group(2)), process)

        answers: list[str] = []

        async def listen_through_the_stop() -> None:
            async with Client(match.group(1)) as client:
                answers.append((await client.call_tool("echo", {"text": "hi"})).content[0].text)
                async with client.listen(resources_list_changed=True):
                    process.send_signal(signal.SIGTERM)
                    # the server's stop, not a time: the process ends
                    await asyncio.to_thread(process.wait, 60)

        with contextlib.suppress(Exception):  # the listen is cut under the client
            asyncio.run(listen_through_the_stop())
        assert answers == ["hi"]
        assert process.poll() is not None, "the bounded shutdown ended it"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        collector.close()
    stderr = process.stderr.read()
    assert process.returncode == -signal.SIGTERM, (process.returncode, stderr)
    assert "timeout graceful shutdown exceeded" in stderr
    metrics = b"".join(body for path, body in collector.received if path == "/v1/metrics")
    assert b"mcp.server.resumption.deliveries" in metrics, "the last counts reached it"
    assert b"mcp.server.resumption.listens" in metrics
