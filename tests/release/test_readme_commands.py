"""Every shell block of README.md, docs/, examples/README.md and
dashboards/README.md, and every example of the demo command's ``--help``,
run as written.

The blocks that install run in a fresh copy of the tree (what a clone gives),
in the venv the README's first command makes there. Each block the documents
show is one of the constants below, which the first test holds equal to the
documents; the shortened runs (bench, fuzz) and the substituted ports (9464
and 8000, which another process on the machine may hold) are the only
departures, and the documents say so. The examples' own READMEs
(examples/*/README.md) are run by tests/test_examples.py in both mcp
environments. Not run here: ``bash scripts/test`` (it is what CI runs,
and it runs this file) and the Grafana ``docker run`` example (no Docker
engine on the test machines), whose mounted paths are checked instead.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import clean_env

from release_env import ROOT

HERE = Path(__file__).parent
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "examples" / "README.md",
    ROOT / "dashboards" / "README.md",
]

DEMO = (
    "python3 -m venv .venv && .venv/bin/pip install -q . \"./demo[tasks]\" ./proxy "
    "&& .venv/bin/mcp-resumption demo"
)
TESTS = "bash scripts/test"
EXPORT = (
    "OTEL_METRICS_EXPORTER=prometheus OTEL_EXPORTER_PROMETHEUS_PORT=9464 "
    "OTEL_TRACES_EXPORTER=none OTEL_LOGS_EXPORTER=none \\\n  "
)
FROM_CLONE = (
    "pip install opentelemetry-distro opentelemetry-exporter-prometheus .\n"
    + EXPORT + "opentelemetry-instrument python my_mcp_client.py"
)
# The server's and the proxy's lines: run in a fresh venv each, with the
# client's, by tests/release/test_install_roles.py.
SERVER_LINE = (
    'pip install opentelemetry-distro opentelemetry-exporter-prometheus ".[server]"\n'
    + EXPORT + "opentelemetry-instrument python my_mcp_server.py"
)
PROXY_LINE = (
    "pip install opentelemetry-exporter-prometheus . ./proxy\n"
    + EXPORT + "mcp-resumption-proxy --upstream http://127.0.0.1:8000/mcp"
)
FROM_WHEEL = (
    "pip install build && python -m build\n"
    "pip install dist/opentelemetry_instrumentation_mcp_resumption-*.whl"
)
PUBLISHED = (
    "pip install opentelemetry-distro opentelemetry-exporter-prometheus "
    "opentelemetry-instrumentation-mcp-resumption"
)
SCENARIO = (
    "OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=console OTEL_LOGS_EXPORTER=console \\\n"
    "  .venv/bin/opentelemetry-instrument .venv/bin/mcp-resumption scenario drain_race"
)
SCRAPE_TARGET = ".venv/bin/mcp-resumption demo --prometheus-port 9464 --hold 600"
BENCH = "bash scripts/bench            # ~5 min (plus the install on a fresh clone); --quick ~1 min"
# Run shortened (one row, short runs) by tests/test_benchmark_scripts.py.
BENCH_INSTRUCTIONS = (
    "bash scripts/bench-instructions            # ~13 min on 2 shared cores "
    "(the first time: the installs)"
)
FUZZ = "PYTHONPATH=src:tests .venv-mcp2/bin/python tests/fuzz_sse.py --cases 100000"
CHECKING = (
    "bash dashboards/check.sh             # needs promtool: apt-get install -y prometheus\n"
    ".venv-mcp2/bin/python -m pytest tests/test_dashboards.py"
)
DOCKER = (
    "docker run -p 3000:3000 \\\n"
    '  -v "$PWD/dashboards/provisioning/datasources:/etc/grafana/provisioning/datasources" \\\n'
    '  -v "$PWD/dashboards/provisioning/dashboards:/etc/grafana/provisioning/dashboards" \\\n'
    '  -v "$PWD/dashboards/mcp-resumption.json:'
    '/var/lib/grafana/dashboards/mcp-resumption/mcp-resumption.json" \\\n'
    "  grafana/grafana"
)
EXAMPLES_INSTALL = (
    "python3 -m venv .venv && .venv/bin/pip install -q "
    '".[instruments-any,server]" opentelemetry-distro'
)
EXAMPLES_SERVER = ".venv/bin/python examples/server/server.py --port 8000"
EXAMPLES_CLIENT = (
    ".venv/bin/python examples/manual/client_mcp2.py http://127.0.0.1:8000/mcp --mode legacy"
)
# The examples of `mcp-resumption --help` (and of each command's), run as
# written in the venv that DEMO makes, with that venv first on PATH.
HELP_DEMO = "mcp-resumption demo"
HELP_JSON = "mcp-resumption demo --scenario drain_race --json"
HELP_SCRAPE = "mcp-resumption demo --prometheus-port 9464 --hold 600"
HELP_SCENARIO = (
    "OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=console OTEL_LOGS_EXPORTER=console \\\n"
    "  opentelemetry-instrument mcp-resumption scenario drain_race"
)
HELP_EXAMPLES = {HELP_DEMO, HELP_JSON, HELP_SCRAPE, HELP_SCENARIO}
ALL = {DEMO, TESTS, FROM_CLONE, SERVER_LINE, PROXY_LINE, FROM_WHEEL, PUBLISHED, SCENARIO}
ALL |= {SCRAPE_TARGET}
ALL |= {BENCH, BENCH_INSTRUCTIONS, FUZZ, CHECKING, DOCKER, EXAMPLES_INSTALL, EXAMPLES_SERVER}
ALL |= {EXAMPLES_CLIENT}

FENCE = re.compile(r"^( *)```sh\n(.*?)^\1```$", re.DOTALL | re.MULTILINE)


def shell_blocks(doc: Path) -> list[str]:
    blocks = []
    for indent, body in FENCE.findall(doc.read_text()):
        lines = [line.removeprefix(indent) for line in body.splitlines()]
        blocks.append("\n".join(lines))
    return blocks


def test_every_shell_block_is_one_that_this_file_runs():
    found = {block for doc in DOCS for block in shell_blocks(doc)}
    assert found == ALL, {"not run here": found - ALL, "no longer in the docs": ALL - found}
    for doc in DOCS:
        # A command in an indented code block would escape this file.
        text = FENCE.sub("", doc.read_text())
        indented = re.findall(r"\n\n((?:    \S.*\n)+)", text)
        assert not [b for b in indented if not b.lstrip().startswith(("|", "python 3"))], indented


def run(block: str, cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{block}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The tree as a clone has it: tracked files (and new ones not yet committed)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    target = tmp_path_factory.mktemp("clone")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


@pytest.fixture(scope="module")
def demo(clone) -> subprocess.CompletedProcess:
    return run(DEMO, clone)


def test_demo_command(demo):
    assert re.search(r"^(\d+) of \1 scenarios match their ground truth$", demo.stdout, re.M)
    assert " FAIL" not in demo.stdout


def test_one_scenario_under_opentelemetry_instrument(demo, clone):
    result = run(SCENARIO, clone)
    for kind in ("drain_race", "orphaned_request"):
        assert f'"mcp.resumption.gap.kind": "{kind}"' in result.stdout
    assert "mcp-resumption verdict: gap " in result.stderr


def test_the_examples_as_a_new_user_runs_them(demo, clone):
    """examples/README.md in the clone: its install, its server, one client,
    and the lines (verdicts and the summary at exit) the page shows."""
    run(EXAMPLES_INSTALL, clone)
    port = free_port()
    server = subprocess.Popen(
        shlex.split(EXAMPLES_SERVER.replace("8000", str(port))),
        cwd=clone,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == f"serving http://127.0.0.1:{port}/mcp"
        result = run(EXAMPLES_CLIENT.replace("8000", str(port)), clone)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "result: liftoff" in result.stdout
    page = (ROOT / "examples" / "README.md").read_text()
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", page, re.S | re.M)
    [shown] = [body for kind, body in blocks if not kind and "verdict" in body]
    printed = [line for line in result.stderr.splitlines() if line.startswith("mcp-resumption ")]
    assert printed == shown.replace("8000", str(port)).strip().splitlines(), result.stderr


def help_examples(clone: Path) -> set[str]:
    """The example commands of each ``--help`` text: the indented lines under
    ``examples:``, a line ending in a backslash joined to the next."""
    found = set()
    for command in ("", "demo", "scenario", "engine"):
        text = run(f".venv/bin/mcp-resumption {command} --help", clone).stdout
        if "\nexamples:\n" not in text:
            continue
        lines = []
        for line in text.split("\nexamples:\n", 1)[1].splitlines():
            if not line.startswith("  "):
                break
            lines.append(line[2:])
        found |= set("\n".join(lines).replace("\\\n", "\0").split("\n"))
    return {example.replace("\0", "\\\n") for example in found}


def in_demo_venv(clone: Path) -> dict[str, str]:
    return {"PATH": f"{clone / '.venv' / 'bin'}:{clean_env()['PATH']}"}


def test_every_help_example_is_one_that_this_file_runs(demo, clone):
    assert help_examples(clone) == HELP_EXAMPLES
    # HELP_DEMO is DEMO's last command, which the demo fixture ran
    assert DEMO.endswith(f".venv/bin/{HELP_DEMO}")


def test_help_example_one_scenario_as_json(demo, clone):
    [row] = json.loads(run(HELP_JSON, clone, **in_demo_venv(clone)).stdout)
    assert row["scenario"] == "drain_race" and row["pass"], row


def test_help_example_one_scenario_under_opentelemetry_instrument(demo, clone):
    """It used to set only the traces exporter: the others' default (OTLP
    over gRPC) is not installed with the demo, so the SDK's configuration
    failed and the scenario ran without the plugin, exiting 0."""
    result = run(HELP_SCENARIO, clone, **in_demo_venv(clone))
    assert "not found" not in result.stderr, result.stderr
    for kind in ("drain_race", "orphaned_request"):
        assert f'"mcp.resumption.gap.kind": "{kind}"' in result.stdout
    assert "mcp-resumption verdict: gap " in result.stderr


@pytest.mark.parametrize("command", [SCRAPE_TARGET, HELP_SCRAPE])
def test_demo_as_a_scrape_target(demo, clone, tmp_path, command):
    port = free_port()
    log = tmp_path / "stderr"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            ["bash", "-c", command.replace("9464", str(port))],
            cwd=clone,
            env=clean_env(**in_demo_venv(clone)),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # bash and the demo: one group to stop
        )
    try:
        deadline, scraped = time.monotonic() + 180, ""
        # The counters fill as the scenarios run; drain_race is one of the last.
        while 'mcp_resumption_gap_kind="drain_race"' not in scraped:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the demo never served its gap counters"
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    scraped = r.read().decode()
            except OSError:
                continue  # not listening yet
        assert "mcp_client_resumption_gaps_total{" in scraped
        assert process.poll() is None, "--hold keeps the endpoint up"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def venv_env(demo, clone) -> dict[str, str]:
    """The README's ``pip`` and ``python``: the clone's venv, activated."""
    bin_dir = clone / ".venv" / "bin"
    path = f"{bin_dir}:{clean_env()['PATH']}"
    env = {"PATH": path, "VIRTUAL_ENV": str(clone / ".venv")}
    # "Your client's virtual environment" has your client's libraries: here the
    # raw client's (the demo project brings mcp 2.x, which is on httpx2).
    run("pip install -q httpx httpx-sse", clone, **env)
    return env


@pytest.fixture(scope="module")
def server(demo, clone, tmp_path_factory):
    """The smoke test's loopback servers, for the README's ``my_mcp_client.py``
    (the smoke test's raw httpx-sse client, copied into the clone)."""
    for name in ("my_mcp_client.py", "my_client.py"):
        shutil.copy(HERE / "smoke_clients.py", clone / name)
    home = tmp_path_factory.mktemp("server")
    shutil.copy(HERE / "smoke_server.py", home)
    process = subprocess.Popen(
        [str(clone / ".venv" / "bin" / "python"), "smoke_server.py"],
        cwd=home,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        yield json.loads(process.stdout.readline())
    finally:
        process.stdin.close()
        process.wait(timeout=10)


def client_env(server, venv_env, **extra: str) -> dict[str, str]:
    # Console metrics, and no OTLP export: no collector listens here.
    return {
        **venv_env,
        "SMOKE_CLIENT": "sse",
        "SMOKE_URL": server["sse"],
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "console",
        "OTEL_LOGS_EXPORTER": "none",
        **extra,
    }


def installed(venv_env: dict[str, str], clone: Path) -> dict:
    probe = (
        "import importlib.metadata as m, json;"
        "d = m.distribution('opentelemetry-instrumentation-mcp-resumption');"
        "print(json.dumps({'version': d.version, 'direct_url': d.read_text('direct_url.json')}))"
    )
    return json.loads(run(f"python -c {shlex.quote(probe)}", clone, **venv_env).stdout)


@pytest.fixture(scope="module")
def from_clone(server, venv_env, clone) -> subprocess.CompletedProcess:
    # The client reads its own exporter's page (SMOKE_SCRAPE) and prints it.
    command = FROM_CLONE.replace("9464", str(free_port()))
    return run(command, clone, **client_env(server, venv_env, SMOKE_SCRAPE="1"))


def test_install_from_the_clone_and_run_a_client(from_clone, venv_env, clone):
    assert "sse client saw 1,2,3,4,5,1,2" in from_clone.stdout
    assert "mcp_client_resumption_attempts_total{" in from_clone.stdout
    assert re.search(r'mcp_resumption_outcome="resumed"[^}]*} 1\.0', from_clone.stdout)
    assert re.search(r'mcp_resumption_outcome="gap"[^}]*} 1\.0', from_clone.stdout)
    assert installed(venv_env, clone)["direct_url"], "installed from the directory"


@pytest.fixture(scope="module")
def from_wheel(from_clone, venv_env, clone) -> subprocess.CompletedProcess:
    return run(FROM_WHEEL, clone, **venv_env)


def test_install_from_a_built_wheel(from_wheel, clone):
    [wheel] = (clone / "dist").glob("*.whl")
    assert wheel.name in from_wheel.stdout + from_wheel.stderr


def test_install_by_name_once_published(from_wheel, venv_env, clone):
    """Not on PyPI yet: the name is resolved from the wheel just built, with the
    index switched off (so nothing else of that name can be taken instead)."""
    run("pip uninstall -q -y opentelemetry-instrumentation-mcp-resumption", clone, **venv_env)
    run(PUBLISHED, clone, **venv_env, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(clone / "dist"))
    got = installed(venv_env, clone)
    assert got["direct_url"] is None, "installed by name, not from a path"
    assert got["version"] in next((clone / "dist").glob("*.whl")).name


def test_bench_shortened():
    result = run(BENCH.split("#")[0].strip() + " --quick --rounds 1 --json /dev/null", ROOT)
    assert "SSE throughput" in result.stdout


def test_fuzz_shortened():
    run(FUZZ.replace("--cases 100000", "--cases 50"), ROOT)


def test_dashboards_checks():
    result = run(CHECKING, ROOT)
    assert re.search(r"\d+ passed", result.stdout)


def test_docker_example_mounts_what_grafana_expects():
    mounts = dict(
        mount.removeprefix("$PWD/").split(":", 1) for mount in re.findall(r'-v "([^"]+)"', DOCKER)
    )
    for source in mounts:
        assert (ROOT / source).exists(), source
    provider = (ROOT / "dashboards/provisioning/dashboards/mcp-resumption.yaml").read_text()
    [path] = re.findall(r"^\s*path:\s*(\S+)", provider, re.M)
    assert Path(mounts["dashboards/mcp-resumption.json"]).parent == Path(path)
    assert mounts["dashboards/provisioning/datasources"].endswith("provisioning/datasources")
    assert mounts["dashboards/provisioning/dashboards"].endswith("provisioning/dashboards")
