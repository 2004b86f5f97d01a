# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""The TypeScript MCP SDK's server (npm ``@modelcontextprotocol/sdk``, the
version ``ts_server/package-lock.json`` pins) as a node process on 127.0.0.1.

The node project (``ts_server/``: ``package.json``, ``package-lock.json``,
``server.mjs``) ships inside this package. Its packages are installed with
``npm ci`` on first use: in place when a checkout already has them (the test
suite's ``npm ci``), otherwise once into a cache directory keyed by the
project's content, since an installed package's directory may be read-only and
is no place for a ``node_modules``. ``server.mjs`` logs its wire (requests,
SSE frames, what its event store stored and replayed) to a file, which is
the ground truth of the demo's TypeScript rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Final

__all__ = ["PROJECT", "TsServer", "node_project", "prepare"]

PROJECT: Final = Path(__file__).with_name("ts_server")
_FILES: Final = ("package.json", "package-lock.json", "server.mjs")
_SDK: Final = Path("node_modules", "@modelcontextprotocol", "sdk", "package.json")
_STARTUP_TIMEOUT_S: Final = 15.0
_NPM_TIMEOUT_S: Final = 300.0

_ready: Path | None = None
_unavailable: str | None = None


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mcp-resumption-demo"


def _digest() -> str:
    hashed = hashlib.sha256()
    for name in _FILES:
        hashed.update((PROJECT / name).read_bytes())
    return hashed.hexdigest()[:16]


def _install(npm: str) -> Path:
    """``npm ci`` into the cache, atomically: a half-done install never counts."""
    target = _cache_root() / f"ts_server-{_digest()}"
    if (target / _SDK).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(
        "installing the TypeScript MCP SDK server (npm ci, once) into "
        f"{target} ...",
        file=sys.stderr,
        flush=True,
    )
    staging = Path(tempfile.mkdtemp(prefix=".ts_server-", dir=target.parent))
    try:
        for name in _FILES:
            shutil.copy2(PROJECT / name, staging / name)
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=_NPM_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"npm ci failed: {last}")
        with contextlib.suppress(OSError):  # another process won the race: use its copy
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def prepare() -> str | None:
    """None when the server can run (its packages installed now if needed),
    else why not: "node not found", "npm not found", "npm ci failed: ..."."""
    global _ready, _unavailable
    if _ready is not None or _unavailable is not None:
        return _unavailable
    if shutil.which("node") is None:
        _unavailable = "node not found"
    elif (PROJECT / _SDK).is_file():
        _ready = PROJECT
    elif (npm := shutil.which("npm")) is None:
        _unavailable = "npm not found"
    else:
        try:
            _ready = _install(npm)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
            _unavailable = str(error) if isinstance(error, RuntimeError) else f"npm ci: {error}"
    return _unavailable


def node_project() -> Path:
    """Where the node project's packages are installed (after ``prepare()``
    said None): the TypeScript server's, and the bridge row's supergateway."""
    if prepare() is not None or _ready is None:
        raise RuntimeError(f"the node project cannot run here: {_unavailable}")
    return _ready


class TsServer:
    """``node server.mjs`` on a free loopback port, with its wire log."""

    def __init__(self, **env: str) -> None:
        if prepare() is not None or _ready is None:
            raise RuntimeError(f"the TypeScript server cannot run here: {_unavailable}")
        self._dir = Path(tempfile.mkdtemp(prefix="mcp-resumption-ts-"))
        self.log_path = self._dir / "wire.jsonl"
        self._stderr: IO[str] = (self._dir / "stderr").open("w")
        node = shutil.which("node")
        assert node is not None
        self.process = subprocess.Popen(
            [node, "server.mjs"],
            cwd=_ready,
            env={**os.environ, "PORT": "0", "WIRE_LOG": str(self.log_path), **env},
            stdout=subprocess.PIPE,
            stderr=self._stderr,  # node's own warnings stay out of the demo's output
            text=True,
        )
        self.port = self._read_port()

    def _read_port(self) -> int:
        """server.mjs prints ``{"port": N}`` once it listens."""
        assert self.process.stdout is not None
        readable, _, _ = select.select([self.process.stdout], [], [], _STARTUP_TIMEOUT_S)
        line = self.process.stdout.readline() if readable else ""
        if not line:
            self.close()
            raise RuntimeError(f"the TypeScript server did not start: {self.stderr()[-500:]}")
        return int(json.loads(line)["port"])

    def stderr(self) -> str:
        self._stderr.flush()
        return (self._dir / "stderr").read_text()

    def wire(self) -> list[dict[str, Any]]:
        """The server's wire log so far, one entry per line."""
        if not self.log_path.exists():
            return []
        # node may be writing a line right now: only whole lines are read.
        whole, _, _ = self.log_path.read_text().rpartition("\n")
        return [json.loads(line) for line in whole.splitlines() if line]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()
        shutil.rmtree(self._dir, ignore_errors=True)
