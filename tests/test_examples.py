"""Every example of examples/, run as its README writes it, and what each
README says the user will see, checked against what the run printed.

The commands are read from the READMEs' ``sh`` blocks (so a command in a
README is a command tested here), with two substitutions only: the
README's ``.venv/bin/`` is this environment's, and port 8000 is a free
port.  The server runs with the installed mcp; the mcp 2.x clients run in
the mcp2 environment, the mcp 1.x clients in the mcp1 one, the raw
httpx-sse clients in both.  The install command of examples/README.md runs
in a fresh copy of the tree in tests/release/test_readme_commands.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import clean_env, console_metrics, scope_counts

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
MCP_MAJOR = int(__import__("importlib.metadata").metadata.version("mcp").split(".")[0])


def fenced(readme: Path) -> list[tuple[str, str]]:
    """(``sh`` or ``""``, body) of each fenced block, in order."""
    return FENCE.findall(readme.read_text())


def commands(readme: Path) -> list[str]:
    return [body.strip() for kind, body in fenced(readme) if kind == "sh"]


def outputs(readme: Path) -> list[str]:
    return [body.strip() for kind, body in fenced(readme) if kind == ""]


def command_for(readme: Path, *needles: str, without: tuple[str, ...] = ()) -> str:
    """The one command of ``readme`` holding every needle and none of ``without``."""
    [found] = [
        c
        for c in commands(readme)
        if all(n in c for n in needles) and not any(w in c for w in without)
    ]
    return found


def runnable(command: str, port: int | str) -> str:
    return command.replace(".venv/bin/", f"{BIN}/").replace("8000", str(port))


class Server:
    """A README's server command, in the background; its stdout collected."""

    def __init__(self, command: str) -> None:
        self.process = subprocess.Popen(
            ["bash", "-c", runnable(command, 0)],
            cwd=ROOT,
            env=clean_env(),
            start_new_session=True,  # its own process group: bash and the server
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        first = self.process.stdout.readline()
        match = re.match(r"serving http://127\.0\.0\.1:(\d+)/mcp$", first.strip())
        assert match, first + self.process.stdout.read()
        self.port = int(match.group(1))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def close(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture(scope="module")
def server():
    readme = EXAMPLES / "server" / "README.md"
    running = Server(command_for(readme, "server.py", without=("--opaque", "instrument")))
    yield running
    running.close()


@pytest.fixture(scope="module")
def opaque_server():
    running = Server(command_for(EXAMPLES / "server" / "README.md", "--opaque"))
    yield running
    running.close()


def run_client(command: str, port: int) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["bash", "-c", runnable(command, port)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def plugin_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mcp-resumption ")]


# Each resume is decided at its replay, while the example's call still runs.
RESUMED = [
    "mcp-resumption verdict: resumed server=127.0.0.1:{port} transport=streamable-http "
    "gaps=- lost_calls=0 awaiting=1"
] * 3 + ["mcp-resumption summary: server=127.0.0.1:{port} attempts=3 resumed=3 gaps=- lost_calls=0"]
NOTHING = ["mcp-resumption summary: server=127.0.0.1:{port} attempts=0 gaps=- lost_calls=0"]

# (client file, extra words of its command, the mcp major it needs, what it prints)
CLIENTS = [
    ("client_mcp2.py", "--mode legacy", 2, RESUMED, "protocol 2025-11-25"),
    ("client_mcp2.py", "--mode auto", 2, NOTHING, "protocol 2026-07-28"),
    ("client_mcp1.py", "", 1, RESUMED, "protocol 2025-11-25"),
    ("client_httpx_sse.py", "", None, RESUMED, "protocol 2025-11-25"),
]


def needs(major: int | None) -> list:
    if major is None:
        return []
    return [pytest.mark.mcp2 if major == 2 else pytest.mark.mcp1]


@pytest.mark.parametrize("shape", ["manual", "zero-code"])
@pytest.mark.parametrize(
    ("client", "words", "expected", "protocol"),
    [
        pytest.param(client, words, expected, protocol, marks=needs(major), id=f"{client}{words}")
        for client, words, major, expected, protocol in CLIENTS
    ],
)
def test_each_client_prints_what_its_readme_says(server, shape, client, words, expected, protocol):
    readme = EXAMPLES / shape / "README.md"
    result = run_client(command_for(readme, f"{shape}/{client}", words), server.port)
    assert protocol in result.stdout
    assert "result: liftoff" in result.stdout, "the host's call is answered"
    lines = plugin_lines(result.stderr)
    assert lines == [line.format(port=server.port) for line in expected], result.stderr


def test_every_readme_output_block_is_a_real_output(server, opaque_server):
    """Each block of plugin lines in the examples' READMEs equals what a run
    printed (a client of the installed mcp, against the plain or the opaque
    server)."""
    client = "client_mcp2.py" if MCP_MAJOR >= 2 else "client_mcp1.py"
    words = "--mode legacy" if MCP_MAJOR >= 2 else client
    plain = run_client(command_for(EXAMPLES / "manual" / "README.md", client, words), server.port)
    printed = {server.port: plugin_lines(plain.stderr)}
    if MCP_MAJOR >= 2:
        auto = command_for(EXAMPLES / "manual" / "README.md", client, "--mode auto")
        printed_auto = plugin_lines(run_client(auto, server.port).stderr)
    opaque = run_client(
        command_for(EXAMPLES / "manual" / "README.md", client, words), opaque_server.port
    )
    printed_opaque = plugin_lines(opaque.stderr)
    for readme in sorted(EXAMPLES.rglob("README.md")):
        for kind, body in fenced(readme):
            if kind or not body.startswith("mcp-resumption "):
                continue
            if "unverifiable" in body:
                block = body.strip().replace("8000", str(opaque_server.port)).splitlines()
                # the README shows the first verdict and the hint, in that order
                assert printed_opaque[: len(block)] == block, (readme, printed_opaque)
            elif "attempts=0" in body:
                if MCP_MAJOR >= 2:
                    assert body.strip().replace("8000", str(server.port)).splitlines() == (
                        printed_auto
                    )
            else:
                block = body.strip().replace("8000", str(server.port)).splitlines()
                assert block == printed[server.port], (readme, block)


def test_opaque_ids_get_one_hint_per_server(opaque_server):
    client = "client_mcp2.py" if MCP_MAJOR >= 2 else "client_mcp1.py"
    words = "--mode legacy" if MCP_MAJOR >= 2 else client
    command = command_for(EXAMPLES / "zero-code" / "README.md", f"zero-code/{client}", words)
    lines = plugin_lines(run_client(command, opaque_server.port).stderr)
    verdicts = [line for line in lines if line.startswith("mcp-resumption verdict: ")]
    hints = [line for line in lines if line.startswith("mcp-resumption hint: ")]
    assert len(verdicts) == 3 and all(" unverifiable " in line for line in verdicts), lines
    assert len(hints) == 1, lines
    assert "ProvableEventStore" in hints[0]
    assert lines[-1] == (
        f"mcp-resumption summary: server=127.0.0.1:{opaque_server.port} attempts=3 "
        "unverifiable=3 gaps=- lost_calls=0"
    )


def test_the_server_half_counts_the_resumes_it_replayed():
    """The server README's ``opentelemetry-instrument`` command: after one
    client call, its console metrics count 3 replayed resumes."""
    command = command_for(EXAMPLES / "server" / "README.md", "opentelemetry-instrument")
    running = Server(command)
    try:
        client = command_for(EXAMPLES / "manual" / "README.md", "client_httpx_sse.py")
        run_client(client, running.port)
        deadline = time.monotonic() + 60
        while (replayed := server_requests("".join(running.lines))) != {"replayed": 3}:
            assert time.monotonic() < deadline, (replayed, "".join(running.lines)[-3000:])
            assert running.process.poll() is None, "".join(running.lines)[-3000:]
            time.sleep(0.2)
    finally:
        running.close()


def server_requests(stdout: str) -> dict[str, int]:
    """The last console export's non-zero mcp.server.resumption.requests by outcome."""
    exports = console_metrics(stdout)
    if not exports:
        return {}
    return scope_counts(exports[-1], "mcp.server.resumption.requests", "mcp.resumption.outcome")
