"""proxy/mcp-resumption-proxy.service: systemd accepts it, its hardening
holds, its stop timeout covers the drain, and its command line runs the
proxy and stops it as systemd does.

``systemd-analyze`` (Debian's ``systemd`` package, which scripts/test
installs where it is missing) checks the unit as shipped, its ExecStart's
program replaced by this venv's console script: the unit names where an
installed proxy lives (/opt/mcp-resumption-proxy), and ``verify`` checks that
the program exists and is executable.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mcp_resumption_demo.loopback import LoopbackServer
from proxy_harness import Proxy
from test_proxy_shutdown import admin_of
from wire import sdk_app

UNIT = Path(__file__).parents[1] / "proxy" / "mcp-resumption-proxy.service"
INSTALLED = "/opt/mcp-resumption-proxy/bin/mcp-resumption-proxy"
SCRIPT = str(Path(sys.executable).parent / "mcp-resumption-proxy")
# The OTLP exporter's default bound on the last export (OTEL_EXPORTER_OTLP_TIMEOUT).
OTLP_TIMEOUT_S = 10


def settings(section: str) -> dict[str, list[str]]:
    """The unit's ``key=value`` lines of ``section``, a key's values in order
    (systemd lets a key repeat)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section:
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def exec_start() -> list[str]:
    (line,) = settings("Service")["ExecStart"]
    return shlex.split(line)


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.fixture(scope="module")
def analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze: Debian's 'systemd' package (scripts/test installs it)"
    return found


@pytest.fixture
def unit(tmp_path: Path) -> Path:
    text = UNIT.read_text()
    assert INSTALLED in text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(INSTALLED, SCRIPT))
    return copy


def test_systemd_verifies_the_unit_without_a_word(analyze, unit) -> None:
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60, cwd=unit.parent)
    # verify exits 0 on an unknown key or a value it cannot parse, and says so:
    # silence is the pass.
    assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done


def test_a_bad_unit_is_not_silent(analyze, unit) -> None:
    """The check above can fail: a misspelt key and a bad time are reported."""
    unit.write_text(unit.read_text().replace("TimeoutStopSec=", "TimeoutStopSecs="))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60, cwd=unit.parent)
    assert "Unknown key" in done.stderr, done


def test_the_unit_is_hardened(analyze, unit) -> None:
    # --threshold counts tenths of the level shown: 20 is "2.0", well inside "OK".
    done = subprocess.run([analyze, "security", "--offline=yes", "--threshold=20", str(unit)],
                          capture_output=True, text=True, timeout=60, cwd=unit.parent)
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert done.returncode == 0 and level and float(level.group(1)) <= 2.0, done.stdout[-3000:]


def test_the_stop_timeout_covers_the_drain() -> None:
    """systemd SIGKILLs a service still running TimeoutStopSec after its
    SIGTERM: the drain, the second the proxy takes to exit after it, and
    the last export's own bound must fit before."""
    service = settings("Service")
    args = exec_start()
    assert args[0] == INSTALLED
    drain = float(option(args, "--drain"))
    assert "--admin" in args
    assert service["KillSignal"] == ["SIGTERM"]
    (stop,) = service["TimeoutStopSec"]
    assert float(stop) >= drain + 1 + OTLP_TIMEOUT_S, (stop, drain)
    assert service["Restart"] == ["on-failure"]  # a drained stop (status 0) stays stopped


def test_the_units_command_line_serves_and_stops_as_systemd_stops_it() -> None:
    """ExecStart's arguments as written (the addresses aside: free loopback
    ports here) and its Environment=, in front of a real SDK server:
    healthy, ready, and on KillSignal gone with status 0 well inside
    TimeoutStopSec."""
    args = exec_start()[1:]
    backend = LoopbackServer(sdk_app(), name="upstream").start()
    for name, value in (("--upstream", backend.url + "/mcp"), ("--listen", "127.0.0.1:0"),
                        ("--admin", "127.0.0.1:0")):
        args[args.index(name) + 1] = value
    upstream = args.pop(args.index("--upstream") + 1)
    args.remove("--upstream")
    environment = dict(line.split("=", 1) for line in settings("Service")["Environment"])
    try:
        running = Proxy(upstream, *args, script=True, **environment)
        try:
            admin = admin_of(running)
            assert httpx.get(admin + "/healthz").status_code == 200
            deadline = time.monotonic() + 10
            while httpx.get(admin + "/readyz").status_code != 200:
                assert time.monotonic() < deadline, running.stderr
            stopped = time.monotonic()
            running.process.send_signal(signal.SIGTERM)
            code = running.process.wait(float(settings("Service")["TimeoutStopSec"][0]))
            took = time.monotonic() - stopped
        finally:
            running.close()
    finally:
        backend.close()
    assert code == 0, running.stderr
    assert took < 1.0 + float(option(exec_start(), "--drain")), took
    assert "Traceback" not in running.stderr
