"""What exiting costs a program that speaks MCP, with the default OTLP
exporters and no collector, and the fixes that README.md and
docs/performance.md give for it.

The plugin's series of a server it has seen start at 0 and are exported at
exit; against no collector the metrics exporter retries them until its
timeout (docs/performance.md measures that wait). Under the real
``opentelemetry-instrument``, with what the README's install line installs
(no httpx instrumentation: switched off here), an mcp 2.x client that lists
the example server's tools once.

What decides is counted at a stand-in collector, not timed: that the
plugin's series are what the metrics exporter has to send at exit, and
that with the exporters switched off nothing is sent at all. The one timed
check compares two waits of the same program, the bounded one and the
default one, each the fastest of two: the machine's load only ever adds,
and the default's retries last seconds longer than the bound."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import OtlpHttpCollector, clean_env, example_server

pytestmark = pytest.mark.mcp2

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = Path(__file__).parent / "programs" / "mcp2_once.py"
BIN = Path(sys.executable).parent
OURS = "mcp_resumption,mcp_resumption_server"
NOT_IN_THE_README_INSTALL = "httpx,httpx2"
# The fixes the docs give, each as its environment.
BOUNDED = {"OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
SWITCHED_OFF = {f"OTEL_{signal}_EXPORTER": "none" for signal in ("TRACES", "METRICS", "LOGS")}
# The plugin's series alone: the traces exporter (the MCP SDK's own spans)
# has a wait of its own to add.
METRICS_ONLY = {"OTEL_TRACES_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}


@pytest.fixture(scope="module")
def server():
    with example_server() as url:
        yield url


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(url: str, plugin: bool, **env: str) -> subprocess.CompletedProcess:
    disabled = NOT_IN_THE_README_INSTALL + ("" if plugin else f",{OURS}")
    result = subprocess.run(
        [str(BIN / "opentelemetry-instrument"), sys.executable, str(PROGRAM), url],
        env=clean_env(
            OTEL_SERVICE_NAME="exit-cost",
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled,
            # no collector, unless env names one: nothing listens there
            **{"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}", **env},
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "tools: countdown" in result.stdout, result.stdout
    return result


def exit_delay_ms(url: str, plugin: bool, **env: str) -> float:
    """From the program's last statement to the moment its process is gone."""
    result = run(url, plugin, **env)
    exited = time.time_ns()
    return (exited - int(result.stdout.strip().splitlines()[-1])) / 1e6


@pytest.fixture
def collector():
    running = OtlpHttpCollector()
    yield running
    running.close()


def sent(collector: OtlpHttpCollector, signal: str) -> list[bytes]:
    return [body for path, body in collector.received if path == f"/v1/{signal}"]


def test_the_docs_give_both_fixes():
    readme = " ".join((ROOT / "README.md").read_text().split())
    performance = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    for fix in (BOUNDED, SWITCHED_OFF):
        written = " ".join(f"{key}={value}" for key, value in fix.items())
        assert written in readme and written in performance, written


def test_the_plugin_s_series_are_what_the_metrics_exporter_sends_at_exit(server, collector):
    """The cause of the wait: with the plugin, the program's one metrics
    export (at exit: the export interval is a minute) carries the plugin's
    zero-started series; with the plugin disabled, nothing of it."""
    to_collector = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        **METRICS_ONLY,
    }
    run(server, True, **to_collector)
    [export] = sent(collector, "metrics")
    assert b"mcp.client.resumption.attempts" in export
    assert b"mcp.client.operation.duration" in export
    collector.received.clear()
    run(server, False, **to_collector)
    assert not any(b"mcp.client.resumption" in body for body in sent(collector, "metrics"))


def test_switched_off_exporters_send_nothing(server, collector):
    run(
        server,
        True,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        **SWITCHED_OFF,
    )
    assert collector.received == []


def test_a_bounded_wait_ends_the_exit_sooner_than_the_default(server):
    """Against no collector, the plugin's series alone: the default retries
    for seconds (~7 s measured), the bound for about one."""
    default = [exit_delay_ms(server, True, **METRICS_ONLY) for _ in range(2)]
    bounded = [exit_delay_ms(server, True, **METRICS_ONLY, **BOUNDED) for _ in range(2)]
    print(f"exit delay, ms: default {default}, bounded {bounded}")
    assert min(bounded) * 2 < min(default), (bounded, default)
