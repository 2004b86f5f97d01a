"""The README's one install line per role (a client, a server, a proxy), each
run as written in a fresh virtual environment made from a copy of the tree
(what a clone gives), then the role's run line (ports substituted: another
process may hold 8000 or 9464): the program starts under it, the plugin's
half for that role is loaded, and the Prometheus exporter the dashboards
read serves its series.

The truth is what the exporter's port answers and what the program's own
MCP peer saw, never what the plugin says of itself.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import clean_env

from release_env import ROOT

README = ROOT / "README.md"
SERVER = ROOT / "examples" / "server" / "server.py"
DEADLINE = 120.0  # a bound on a failing start, never what a passing one waits for

# The program a client's line runs: it speaks no MCP (no server here), so it
# checks what the line installed and loaded, and holds the exporter up
# until the test has read it.
CLIENT = '''\
import sys
import httpx  # "its HTTP client is already there"
from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor
assert McpResumptionInstrumentor().is_instrumented_by_opentelemetry, "not loaded"
print("client started", flush=True)
sys.stdin.read()
'''

# What the server role is asked, with the mcp its line installed.
ASK_SERVER = '''\
import asyncio, sys
from mcp import Client

async def main():
    async with Client(sys.argv[1]) as client:
        tools = await client.list_tools()
        print(",".join(tool.name for tool in tools.tools))

asyncio.run(main())
'''


def role_block(role: str) -> tuple[str, str]:
    """(install line, run command) of the README's block for ``role``."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^\*\*A {role}\*\*.*?\n```sh\n(.*?)\n```", text, re.DOTALL | re.MULTILINE)
    assert match, f"the README has no install line for a {role}"
    install, _, command = match.group(1).partition("\n")
    assert install.startswith("pip install "), install
    assert "opentelemetry-exporter-prometheus" in install, "the dashboards read Prometheus"
    assert "OTEL_METRICS_EXPORTER=prometheus" in command
    return install, command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def copy_of_the_tree(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file() and "node_modules" not in name:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


def run(block: str, cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert done.returncode == 0, f"{block}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def scrape(port: int, wanted: str, process: subprocess.Popen) -> str:
    """The exporter's page once it holds ``wanted``."""
    deadline = time.monotonic() + DEADLINE
    page = ""
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                page = answer.read().decode()
            if wanted in page:
                return page
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{wanted!r} never served on {port}:\n{page[-2000:]}")


def first_line(process: subprocess.Popen, pattern: str) -> re.Match:
    line = process.stdout.readline()
    match = re.search(pattern, line)
    assert match, (line, process.stderr.read()[-3000:] if process.poll() is not None else "")
    return match


@pytest.mark.parametrize("role", ["client", "server", "proxy"])
def test_the_readme_line_of_a_role_in_a_fresh_venv(role, tmp_path):
    install, command = role_block(role)
    tree = copy_of_the_tree(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = clean_env(PATH=f"{venv / 'bin'}:{clean_env()['PATH']}", VIRTUAL_ENV=str(venv))
    run(install, tree, env)
    metrics_port, mcp_port = free_port(), free_port()
    command = command.replace("9464", str(metrics_port)).replace("8000", str(mcp_port))
    if role == "client":
        run("pip install -q httpx", tree, env)  # the client's own
        (tree / "my_mcp_client.py").write_text(CLIENT)
    elif role == "server":
        shutil.copy(SERVER, tree / "my_mcp_server.py")
        command += f" --port {mcp_port}"
    process = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        if role == "client":
            first_line(process, r"^client started$")
            scrape(metrics_port, "python_info", process)  # the exporter serves
        elif role == "server":
            url = first_line(process, r"serving (http://\S+/mcp)").group(1)
            asked = subprocess.run(
                [str(venv / "bin" / "python"), "-c", ASK_SERVER, url], env=env,
                capture_output=True, text=True, timeout=DEADLINE, check=False,
            )
            assert asked.stdout.strip() == "countdown", asked.stderr[-3000:]
            page = scrape(metrics_port, 'mcp_method_name="tools/list"', process)
            assert "mcp_server_operation_duration_seconds_count{" in page
            assert "mcp_server_resumption_deliveries_total{" in page
        else:
            first_line(process, r"^http://127\.0\.0\.1:\d+/mcp")
            scrape(metrics_port, "python_info", process)  # the exporter serves
    finally:
        process.stdin.close()
        # the line's program is bash's child: stop the session the test made
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
