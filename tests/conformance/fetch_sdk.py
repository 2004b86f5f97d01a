"""Fetch what the conformance tests run of the MCP Python SDK itself: its
everything-server (``examples/servers/everything-server``) and its
conformance client (``.github/actions/conformance/client.py``), which only
the sdist carries.

Run by scripts/test at install time with a Python that has pip (the tools
venv): ``python tests/conformance/fetch_sdk.py VERSION``.  The sdist is
cached in ``.sdk-suites/`` beside the one tests/sdk_suites/run.py reads (the
same file), and the two directories are extracted next to it.  Standard
library only.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".sdk-suites"
WANTED = ("examples/servers/everything-server/", ".github/actions/conformance/")


def extracted(version: str) -> Path:
    """Where the two directories of mcp ``version`` are (once fetched)."""
    return CACHE / f"mcp-{version}-conformance"


def fetch(version: str) -> Path:
    target = extracted(version)
    if all((target / wanted).is_dir() for wanted in WANTED):
        return target
    CACHE.mkdir(exist_ok=True)
    archive = CACHE / f"mcp-{version}.tar.gz"
    if not archive.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"mcp=={version}", "-d", str(CACHE)],
            check=True,
        )
    prefix = f"mcp-{version}/"
    with tarfile.open(archive) as sdist:
        members = []
        for member in sdist.getmembers():
            name = member.name[len(prefix):] if member.name.startswith(prefix) else ""
            if name.startswith(WANTED):
                member.name = name
                members.append(member)
        sdist.extractall(target, members=members, filter="data")
    return target


if __name__ == "__main__":
    print(fetch(sys.argv[1]))
