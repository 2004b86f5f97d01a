"""The package reads top-down: the patches report to one owner, the owner
asks the pure rules and tracker and writes through the telemetry sink, and
no module imports a layer above its own (a patch imports the owner's type
only, for its annotations)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = (
    Path(__file__).resolve().parents[1] / "src" / "opentelemetry" / "instrumentation"
    / "mcp_resumption"
)

# The rooms of the tracker (issue 30), lowest first: each may import the
# rooms before it, never one after it, nor the tracker that composes them.
ROOMS = (
    "seen_window", "records", "requests", "cursors", "breaks", "resumes", "streams", "sharing",
    "request_side",
)
# The parts of the owner (issue 30): the bases of ResumptionMonitor, each read
# alone, none importing another (they meet in the monitor, through ``self``).
OWNER_PARTS = (
    "channels", "hops", "findings", "stream_reports", "at_exit", "task_reports", "event_reports",
)
# The telemetry sink and its parts, lowest first.
SINK = ("instruments", "call_telemetry", "task_telemetry", "event_telemetry", "telemetry")
UPPER = {
    "facts", "redaction", "deadlines", *SINK, "monitor", "processor", "patches",
    *OWNER_PARTS,
}
# What the patches never reach into: the rules' modules and ledgers (they
# take the errors enforce mode raises from ``errors``), the tracker's rooms
# and the owner's parts.
NOT_FOR_PATCHES = {
    "event_ids", "continuity", "resume_check", "fates", "subscriptions", "tasks", *ROOMS,
    *OWNER_PARTS,
}


def _rooms_after(room: str) -> set[str]:
    return set(ROOMS[ROOMS.index(room) + 1 :])


# The rules, lowest first: what an event id proves, the rules and their
# verdicts' words, one resume run through them.
RULES = ("event_ids", "continuity", "resume_check")


def _rules_after(module: str) -> set[str]:
    return set(RULES[RULES.index(module) + 1 :])


# Each module and the package modules it must never import at run time.
ABOVE = {
    # What enforce mode raises: below everything, importing nothing of ours.
    "errors": {*RULES, "fates", "tracker", *ROOMS, *UPPER},
    **{rule: {*_rules_after(rule), "fates", "tracker", *ROOMS, *UPPER} for rule in RULES},
    "fates": {"tracker", *ROOMS, *UPPER},
    "subscriptions": {"fates", "tracker", *ROOMS, *UPPER},
    # The task ledger (issue 37): a room of its own, beside the tracker, not in it.
    "tasks": {"fates", "subscriptions", "tracker", *ROOMS, *UPPER},
    # A task handed to the fleet: below the task ledger, importing nothing of ours.
    "task_handover": {"tasks", "fates", "subscriptions", "tracker", *ROOMS, *UPPER},
    **{room: {"tracker", *_rooms_after(room), *UPPER} for room in ROOMS},
    "tracker": set(UPPER),
    # The shared state's record: below the tracker, above nothing of the core.
    "shared_state": {"tracker", *ROOMS, *UPPER},
    # The Redis store: the settings and the record, never the telemetry (the
    # owner hands it a callback to count its fallbacks).
    "redis_state": {"tracker", *ROOMS, *UPPER},
    "redis_ledger": {"redis_state", "tracker", *ROOMS, *UPPER},
    # The tasks handed to the fleet, in Redis: beside the in-flight ledger.
    "redis_tasks": {"redis_state", "redis_ledger", "tasks", "tracker", *ROOMS, *UPPER},
    # The store's link to Redis (connection, breaker, writer thread): below
    # both the records and the ledger it carries.
    "redis_link": {
        "redis_state", "redis_ledger", "redis_tasks", "tracker", *ROOMS, *UPPER,
    },
    "facts": {"redaction", "deadlines", *SINK, "monitor", "processor", "patches", *OWNER_PARTS},
    "redaction": {"deadlines", *SINK, "monitor", "processor", "patches", *OWNER_PARTS},
    "deadlines": {*SINK, "monitor", "processor", "patches", *OWNER_PARTS},
    **{
        part: {*SINK[SINK.index(part) + 1 :], "monitor", "processor", "patches", *OWNER_PARTS}
        for part in SINK
    },
    **{
        part: {"monitor", "processor", "patches", *(set(OWNER_PARTS) - {part})}
        for part in OWNER_PARTS
    },
    "monitor": {"processor", "patches"},
    "processor": {"patches"},
    # The patches know the tracker's API (its names re-exported there), not
    # its rooms, and the owner by its type only.
    "patches": {"monitor", "processor", *NOT_FOR_PATCHES},
    "patches.http": {"monitor", "processor", *NOT_FOR_PATCHES},
    # The feed of a stream's events, below the iteration patches that feed it.
    "patches.feed": {
        "monitor", "processor", "patches.http", "patches.sse", "patches.own_sse",
        "patches.mcp_sdk", *NOT_FOR_PATCHES,
    },
    "patches.own_sse": {
        "monitor", "processor", "patches.http", "patches.sse", "patches.feed", "patches.mcp_sdk",
        *NOT_FOR_PATCHES,
    },
    "patches.sse": {"monitor", "processor", "patches.http", "patches.mcp_sdk", *NOT_FOR_PATCHES},
    "patches.mcp_sdk": {
        "monitor", "processor", "patches.http", "patches.sse", "patches.feed", *NOT_FOR_PATCHES,
    },
}

# The pure core: the rules, the ledgers and the tracker with its rooms import
# the standard library and each other only (no OpenTelemetry, no HTTP client).
PURE = (
    "errors", *RULES, "fates", "subscriptions", "tasks", "task_handover", "events", "jsonrpc",
    "forks",
    "shared_state", *ROOMS, "tracker",
)


def _runtime_imports(module: str) -> set[str]:
    """The package modules ``module`` imports, outside ``if TYPE_CHECKING:``."""
    path = PACKAGE / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = PACKAGE / module.replace(".", "/") / "__init__.py"
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue  # annotations only
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
                if node.module:
                    found.add(".".join(target))
                for alias in node.names:  # ``from . import x`` and ``from .patches import y``
                    found.add(".".join([*target, alias.name]))
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)

    visit(tree.body)
    return found


@pytest.mark.parametrize("module", sorted(ABOVE))
def test_no_module_imports_a_layer_above_it(module):
    imported = _runtime_imports(module)
    upward = {name for name in imported if name in ABOVE[module]}
    assert not upward, f"{module} imports {sorted(upward)}, a layer above it"


@pytest.mark.parametrize("module", PURE)
def test_the_pure_core_imports_the_standard_library_only(module):
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    absolute = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and not node.level and node.module
    }
    foreign = absolute - set(sys.stdlib_module_names) - {"__future__"}
    assert not foreign, f"{module} imports {sorted(foreign)}: not the standard library"


def test_the_tracker_composes_every_room():
    """Each room is a module the tracker imports, so each is held to the
    order above (a new room takes its place in ``ROOMS``)."""
    assert set(ROOMS) <= _runtime_imports("tracker")


def test_the_monitor_is_composed_of_every_part():
    """Each part of the owner is a module the monitor imports, so each is
    held to the rules above (a new part takes its place in ``OWNER_PARTS``)."""
    assert set(OWNER_PARTS) <= _runtime_imports("monitor")


def test_the_check_sees_imports():
    """The checker itself finds what a module does import (else the test
    above could never fail)."""
    assert {"monitor", "redaction"} <= _runtime_imports("processor")
    assert "monitor" not in _runtime_imports("patches.http")  # TYPE_CHECKING only
    assert {"facts", "tracker"} <= _runtime_imports("patches.http")
    assert {"records", "breaks"} <= _runtime_imports("resumes")


def test_no_patch_module_keeps_a_channel():
    """No module-level mutable state between the patches and the owner: a
    patch module binds at top level only functions, classes, constants,
    lookup tables of constants, type aliases and its logger, and no function
    rebinds a module global.  The one exception is the log-once de-dup of
    ``patches.fault`` (a logging matter, the same for every owner)."""
    allowed_calls = {"tuple", "frozenset", "TypeVar", "logging.getLogger"}
    for path in sorted((PACKAGE / "patches").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            assert not isinstance(node, ast.Global), f"{path.name}: {ast.unparse(node)}"
        for node in tree.body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            value = node.value
            name = ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            if path.name == "__init__.py" and name == "_reported":
                continue
            where = f"{path.name}: {name} = {ast.unparse(value)}"
            if isinstance(value, ast.Call):
                assert ast.unparse(value.func) in allowed_calls, where
            elif isinstance(value, ast.Dict):
                assert value.keys and all(
                    isinstance(part, ast.Constant) for part in (*value.keys, *value.values)
                ), where
            else:
                assert not isinstance(value, (ast.List, ast.Set, ast.ListComp, ast.DictComp,
                                              ast.SetComp)), where


def test_every_module_has_its_line_in_the_layout():
    """docs/layout.md names every module of the package (a new module
    takes its line there)."""
    layout = (PACKAGE.parents[3] / "docs" / "layout.md").read_text()
    missing = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if f"`{path.relative_to(PACKAGE)}`" not in layout
    ]
    assert not missing, f"not in docs/layout.md: {missing}"
