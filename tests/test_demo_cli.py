"""The ``mcp-resumption`` command as a user meets it, through the installed
console script in a subprocess: its help and version, its progress on
stderr, and one-line errors (no traceback) for what the user must fix."""

from __future__ import annotations

import importlib.metadata
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
COMMAND = Path(sys.executable).with_name("mcp-resumption")
PROGRESS = re.compile(
    r"^\[(\d+)/(\d+)\] ([a-z0-9_]+)(?: \.\.\. \(\d+\.\d s elapsed\)"
    r"|: (?:PASS|FAIL) in \d+\.\d s|: skipped: .+)$"
    r"|^done: \d+ scenarios in \d+\.\d s$"
)


def cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    return subprocess.run(
        [str(COMMAND), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("mcp-resumption: error: "), line
    for needle in needles:
        assert needle in line, line
    assert result.stdout == ""
    return line


def test_version_names_the_demo_the_plugin_and_the_sdk():
    result = cli("--version")
    assert result.returncode == 0, result.stderr
    plugin = importlib.metadata.version("opentelemetry-instrumentation-mcp-resumption")
    assert result.stdout.strip() == (
        f"mcp-resumption {importlib.metadata.version('mcp-resumption-demo')} "
        f"(opentelemetry-instrumentation-mcp-resumption {plugin}, "
        f"mcp {importlib.metadata.version('mcp')})"
    )


def test_the_demo_pins_the_plugin_of_its_own_version():
    """The engine table drives the plugin's tracker: they are released together."""
    pyproject = (ROOT / "demo" / "pyproject.toml").read_text()
    [pin] = re.findall(r'"opentelemetry-instrumentation-mcp-resumption == ([^"]+)"', pyproject)
    plugin = importlib.metadata.version("opentelemetry-instrumentation-mcp-resumption")
    assert pin == plugin == importlib.metadata.version("mcp-resumption-demo")


def test_help_says_what_the_command_is_for():
    result = cli("--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "catch silent event loss when MCP clients resume" in text
    assert "the command-line entry point" not in text
    for command in ("demo", "scenario", "engine"):
        assert re.search(rf"^ +{command} ", result.stdout, re.M), result.stdout
    assert "mcp-resumption demo --prometheus-port 9464 --hold 600" in result.stdout


def test_hold_without_a_metrics_endpoint_is_refused_at_once():
    started = time.monotonic()
    result = cli("demo", "--hold", "30")
    one_line_error(result, "--hold needs --prometheus-port")
    assert time.monotonic() - started < 20, "refused before running or holding anything"


def test_a_busy_prometheus_port_is_one_line_and_runs_nothing():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("demo", "--prometheus-port", str(port), "--scenario", "caught_up_priming")
    one_line_error(result, f"127.0.0.1:{port} is already in use", "--prometheus-port")


def test_the_ports_announced_for_a_scrape_stay_the_demos_until_its_routers_use_them():
    """With --prometheus-port the routers' ports are announced (their series
    at 0) before the scenarios run; a port merely picked and released then
    could be taken meanwhile by any program's connection, and the demo failed
    when its router came to listen.  Each announced port is held: binding it
    from outside fails, and the demo still runs its scenarios."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    names = ("caught_up_priming", "faithful_resume_int")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    demo = subprocess.Popen(
        [str(COMMAND), "demo", "--prometheus-port", str(metrics_port),
         *(arg for name in names for arg in ("--scenario", name))],
        env=clean, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert demo.stderr is not None
        for line in demo.stderr:
            if line.startswith("waiting for a scrape"):
                break
        else:
            raise AssertionError("the demo never waited for a scrape")
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:  # the scrape it waits for
            exposition = answer.read().decode()
        ports = sorted({int(port) for port in re.findall(r'server_port="(\d+)"', exposition)})
        assert len(ports) == len(names), exposition
        for port in ports:
            with socket.socket() as intruder, pytest.raises(OSError):
                intruder.bind(("127.0.0.1", port))
        stdout, stderr = demo.communicate(timeout=120)
    finally:
        demo.kill()
        demo.wait()
    assert demo.returncode == 0, stdout + stderr
    assert f"{len(names)} of {len(names)} scenarios match their ground truth" in stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("demo", "--scenario", "no_such_row"), "unknown scenario no_such_row; known: "),
        (("scenario", "no_such_row"), "unknown scenario no_such_row; known: "),
    ],
)
def test_an_unknown_scenario_is_one_line(args, needle):
    one_line_error(cli(*args), needle)


def test_progress_counts_scenarios_and_seconds_and_nothing_else_reaches_stderr():
    """stateless_migration is where uvicorn used to log "ASGI callable returned
    without starting response." (the SDK's transport without an event store
    answered nothing); every scenario whose client ends an SDK session is
    where mcp 1.x logged a ClosedResourceError traceback."""
    names = ("stateless_migration", "faithful_resume_int")
    result = cli("demo", *(arg for name in names for arg in ("--scenario", name)))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert [line for line in lines if not PROGRESS.match(line)] == [], result.stderr
    starts = [PROGRESS.match(line).groups()[:3] for line in lines if "elapsed)" in line]
    assert starts == [("1", "2", names[0]), ("2", "2", names[1])]
    ends = [line for line in lines if re.search(r": PASS in \d+\.\d s$", line)]
    assert len(ends) == 2
    assert re.fullmatch(r"done: 2 scenarios in \d+\.\d s", lines[-1])
    assert "2 of 2 scenarios match their ground truth" in result.stdout
    # the table wraps, within 120 columns, and cuts nothing
    assert max(len(line) for line in result.stdout.splitlines()) <= 120
    text = " ".join(result.stdout.split())
    from mcp_resumption_demo import scenarios

    for name in names:
        assert " ".join(scenarios.get_scenario(name).happened.split()) in text


def test_without_node_the_typescript_rows_say_skipped_and_the_rest_still_decides():
    """PATH with the venv's scripts only: no node, no npm."""
    ts_rows = ("ts_poll_cut_twice", "ts_store_lost_cursor")
    names = ("caught_up_priming", *ts_rows)
    result = cli(
        "demo", *(arg for name in names for arg in ("--scenario", name)), PATH=str(COMMAND.parent)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ts_rows:
        row = rf"^{name} .* skipped: node not found$"
        assert re.search(row, result.stdout, re.M), result.stdout
        assert f"] {name}: skipped: node not found" in result.stderr
    assert "1 of 1 scenarios match their ground truth" in result.stdout
    assert "2 skipped (node not found)" in result.stdout
    assert [line for line in result.stderr.splitlines() if not PROGRESS.match(line)] == []


def test_without_node_a_typescript_scenario_alone_is_a_one_line_error():
    result = cli("scenario", "ts_poll_cut_twice", PATH=str(COMMAND.parent))
    one_line_error(result, "scenario ts_poll_cut_twice cannot run here: node not found")


# ---------------------------------------------------------------- usage errors


def test_an_unknown_option_is_named_with_the_commands_usage():
    result = cli("--bogus")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "usage: mcp-resumption [-h] [--version] COMMAND ...",
        "mcp-resumption: error: unrecognized arguments: --bogus",
    ]


@pytest.mark.parametrize("command", ["demo", "scenario", "engine"])
def test_an_unknown_option_of_a_subcommand_shows_that_subcommands_usage(command):
    result = cli(command, "--bogus")
    assert result.returncode == 2 and result.stdout == ""
    usage, *_, error = result.stderr.splitlines()
    assert usage.startswith(f"usage: mcp-resumption {command} [-h]"), result.stderr
    assert error == f"mcp-resumption {command}: error: unrecognized arguments: --bogus"


def test_no_command_names_the_commands():
    result = cli()
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "mcp-resumption: error: a COMMAND is required: engine, demo, scenario"
    )


def test_help_lists_each_command_once_and_each_has_a_description():
    top = cli("--help").stdout
    for command in ("demo", "scenario", "engine"):
        assert len(re.findall(rf"^ +{command} ", top, re.M)) == 1, top
        own = cli(command, "--help")
        assert own.returncode == 0
        # usage, a blank line, then a description paragraph before the arguments
        description = own.stdout.split("\n\n")[1]
        assert len(description.split()) >= 10 and not description.startswith(
            ("positional", "options")
        ), own.stdout


def test_scenario_list_names_every_scenario():
    from mcp_resumption_demo import scenarios

    result = cli("scenario", "--list")
    assert result.returncode == 0, result.stderr
    listed = [line.split(":", 1)[0] for line in result.stdout.splitlines()]
    assert listed == [s.name for s in scenarios.all_scenarios()]


def test_an_unknown_scenario_fails_at_once_with_the_list():
    from mcp_resumption_demo import cli as demo_cli
    from mcp_resumption_demo import scenarios

    names = [s.name for s in scenarios.all_scenarios()]
    assert demo_cli._scenario_names() == names, "the fast list is the imported one"
    started = time.monotonic()
    result = cli("scenario", "no_such_scenario")
    elapsed = time.monotonic() - started
    line = one_line_error(result, "unknown scenario no_such_scenario; known: ")
    assert line.endswith("known: " + ", ".join(names))
    # Without importing the scenarios (the MCP SDK, servers, clients): a
    # fraction of the ~1.3 s that import takes, in the same interpreter start.
    assert elapsed < 0.5 * _import_seconds(), elapsed


def _import_seconds() -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import mcp_resumption_demo.scenarios"], check=True, timeout=60
    )
    return time.monotonic() - started


def test_the_table_fits_120_columns_and_cuts_nothing():
    from mcp_resumption_demo import engine_table

    result = cli("engine")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    text = " ".join(result.stdout.split())
    for row in engine_table.run():
        assert " ".join(row["happened"].split()) in text, row["happened"]
    assert "…" not in result.stdout


# Internal words a user cannot look up: the numbers of the documents the
# scenarios came from, and the demo's private name for its servers.
UNEXPLAINED = re.compile(r"\bseeds?\b|\bseed-|\bfleet\b", re.IGNORECASE)


def test_rows_and_help_name_the_incident_in_plain_words():
    """Every row's story (as ``scenario --list`` and the demo's table print
    it) and every help text says what happened, not which internal document
    it came from."""
    texts = [cli("scenario", "--list"), cli("--help")]
    texts += [cli(command, "--help") for command in ("demo", "scenario", "engine")]
    assert "migration_reset:" in texts[0].stdout  # the rows are listed
    for result in texts:
        assert result.returncode == 0, result.stderr
        found = UNEXPLAINED.findall(result.stdout)
        assert not found, (found, result.stdout)


# Words of the docs that need their meaning where a document first uses them.
TERMS = ("lineage", "ledger")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_each_doc_explains_its_terms_where_it_first_uses_them(doc):
    """The paragraph of a term's first use in a document glosses it, in
    parentheses right after the term."""
    paragraphs = doc.read_text().split("\n\n")
    for term in TERMS:
        first = next((p for p in paragraphs if re.search(rf"\b{term}\b", p)), None)
        if first is None:
            continue
        assert re.search(rf"\b{term}\*?\s+\(", first), (doc.name, term, first)
