"""The built artifacts, as a user gets them: ``python -m build`` makes an
sdist and a wheel that ``twine check`` accepts; the wheel holds the package
and nothing else; and installed alone into a fresh venv (plus only what the
clients need) it is loaded by ``opentelemetry-instrument`` and counts resumes
of a raw httpx-sse client and of an MCP SDK client."""

from __future__ import annotations

import email.parser
import json
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from helpers import SCOPE, clean_env, console_metrics

from release_env import (
    ROOT,
    ci_pythons,
    claimed_pythons,
    find_python,
    requires_python,
    tool,
    totals,
)

HERE = Path(__file__).parent
PACKAGE = "opentelemetry/instrumentation/mcp_resumption/"
# What the smoke test's clients need, and nothing more.
CLIENT_NEEDS = ["httpx", "httpx-sse", "mcp", "opentelemetry-distro"]


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [tool("python"), "-m", "build", "--installer", "uv", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    [wheel] = out.glob("*.whl")
    [sdist] = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_twine_check_passes_on_both(dist):
    result = subprocess.run(
        [tool("twine"), "check", "--strict", str(dist["wheel"]), str(dist["sdist"])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def tracked(under: str) -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files", under], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return set(listed)


def test_wheel_holds_the_package_and_nothing_else(dist):
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    info = [name for name in names if ".dist-info/" in name]
    package = {name for name in names if name not in info}
    # Exactly the package's tracked files: no tests, benchmarks, caches or scripts.
    assert package == {name.removeprefix("src/") for name in tracked("src")}
    assert all(name.startswith(PACKAGE) for name in package)
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]
    assert {name.split("/", 1)[1] for name in info} == {
        "METADATA",
        "WHEEL",
        "RECORD",
        "entry_points.txt",
        "licenses/LICENSE",
    }
    entry_points = zipfile.ZipFile(dist["wheel"]).read(
        next(name for name in info if name.endswith("entry_points.txt"))
    )
    assert b"mcp_resumption = opentelemetry.instrumentation.mcp_resumption:" in entry_points
    assert (
        b"mcp_resumption_server = opentelemetry.instrumentation.mcp_resumption.server:"
        in entry_points
    )


def test_sdist_can_rebuild_and_test_but_carries_no_caches(dist):
    with tarfile.open(dist["sdist"]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or ".venv" in n]
    assert not [n for n in names if n.startswith(("benchmarks/", ".ci/"))]
    for needed in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "PKG-INFO"):
        assert needed in names
    assert tracked("src") | tracked("tests") | tracked("demo") | tracked("dashboards") <= names


def metadata(dist) -> email.message.Message:
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(wheel.read(name).decode())


def test_metadata_carries_urls_license_classifiers_and_readme(dist):
    meta = metadata(dist)
    urls = dict(value.split(", ", 1) for value in meta.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Source", "Issues", "Changelog", "Runbook"}
    assert all(url.startswith("https://") for url in urls.values())
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Requires-Python"] == requires_python()
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    classifiers = meta.get_all("Classifier")
    # One classifier per Python minor CI tests (the floor to the newest),
    # and no claim beyond them.
    versions = {
        c.rsplit(" :: ", 1)[1]
        for c in classifiers
        if c.count(" :: ") == 2 and c.startswith("Programming Language :: Python :: 3.")
    }
    assert sorted(versions, key=lambda v: int(v.split(".")[1])) == claimed_pythons()
    known = subprocess.run(
        [
            tool("python"),
            "-c",
            "import sys, trove_classifiers as t;"
            "print([c for c in sys.argv[1:] if c not in t.classifiers])",
            *classifiers,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert known == "[]", f"not trove classifiers: {known}"


# ---------------------------------------------------------------- smoke test


@pytest.fixture(scope="session", params=ci_pythons())
def venv(request, dist, tmp_path_factory) -> Path:
    """A fresh venv on each tested Python with the wheel and the clients' needs only."""
    home = tmp_path_factory.mktemp(f"venv-{request.param}")
    python = find_python(request.param)
    subprocess.run([tool("uv"), "venv", "-q", "--python", python, str(home / "venv")], check=True)
    subprocess.run(
        [
            tool("uv"),
            "pip",
            "install",
            "-q",
            "--python",
            str(home / "venv" / "bin" / "python"),
            str(dist["wheel"]),
            *CLIENT_NEEDS,
        ],
        check=True,
        env=clean_env(),
    )
    # The programs run from a copy, so that nothing of the checkout is importable.
    for program in ("smoke_server.py", "smoke_clients.py"):
        shutil.copy(HERE / program, home / program)
    return home


@pytest.fixture(scope="session")
def servers(venv):
    process = subprocess.Popen(
        [str(venv / "venv" / "bin" / "python"), "smoke_server.py"],
        cwd=venv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        line = process.stdout.readline()
        assert line, "the smoke server exited before it printed its URLs"
        yield json.loads(line)
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def instrumented(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    bin_dir = venv / "venv" / "bin"
    result = subprocess.run(
        [str(bin_dir / "opentelemetry-instrument"), str(bin_dir / "python"), *args],
        cwd=venv,
        env=clean_env(
            OTEL_SERVICE_NAME="wheel-smoke",
            OTEL_METRICS_EXPORTER="console",
            OTEL_TRACES_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            **env,
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_the_installed_package_is_the_wheel(venv):
    probe = (
        "import importlib.metadata as m, opentelemetry.instrumentation.mcp_resumption as p;"
        "print(p.__file__);"
        "print([e.name for e in m.entry_points(group='opentelemetry_instrumentor')])"
    )
    result = subprocess.run(
        [str(venv / "venv" / "bin" / "python"), "-c", probe],
        cwd=venv,
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    )
    where, entry_points = result.stdout.splitlines()
    assert Path(where).is_relative_to(venv / "venv"), where
    # only ours: the client half and the server half
    assert sorted(eval(entry_points)) == ["mcp_resumption", "mcp_resumption_server"]


def test_httpx_sse_client_resumes_are_counted(venv, servers):
    result = instrumented(venv, "smoke_clients.py", "sse", servers["sse"])
    assert "sse client saw 1,2,3,4,5,1,2" in result.stdout, "the host's events are unchanged"
    attempts = totals(result.stdout, "mcp.client.resumption.attempts", "mcp.resumption.outcome")
    assert attempts == {"resumed": 1, "gap": 1}
    gaps = totals(result.stdout, "mcp.client.resumption.gaps", "mcp.resumption.gap.kind")
    assert gaps == {"id_regression": 1}


def test_mcp_sdk_client_reconnection_is_counted(venv, servers):
    result = instrumented(venv, "smoke_clients.py", "mcp", servers["mcp"])
    assert "mcp client got done" in result.stdout
    attempts = totals(result.stdout, "mcp.client.resumption.attempts", "mcp.resumption.outcome")
    assert set(attempts) <= {"resumed", "caught_up"} and sum(attempts.values()) >= 1, attempts
    assert totals(result.stdout, "mcp.client.resumption.gaps", "mcp.resumption.gap.kind") == {}


def test_the_counts_come_from_the_mcp_resumption_entry_point(venv, servers):
    """The control: with the entry point disabled by name, nothing is counted,
    so the counts above prove that ``mcp_resumption`` was loaded."""
    result = instrumented(
        venv,
        "smoke_clients.py",
        "sse",
        servers["sse"],
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="mcp_resumption",
    )
    assert "sse client saw 1,2,3,4,5,1,2" in result.stdout
    # The SDK exports nothing when nothing was recorded; any export must not be ours.
    for export in console_metrics(result.stdout):
        assert SCOPE not in json.dumps(export)
