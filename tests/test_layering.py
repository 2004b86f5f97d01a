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

# The folders, one per layer, lowest first: a module may import its own
# folder and the folders below it, never one above.  The root holds the
# package's face and what every layer reads: ``errors``, ``forks``,
# ``version`` and ``package`` below everything, ``config`` above the rules
# (it reads the replay contract's words).
FOLDERS = ("rules", "shared", "tracking", "telemetry", "owner", "patches", "server")
ROOT_BELOW = {"errors", "forks", "version", "package"}
ROOT_ABOVE_RULES = {"config"}


def _layer(module: str) -> str:
    return module.split(".")[0]


def _folder_modules(folder: str) -> list[str]:
    return sorted(
        f"{folder}.{path.stem}" if path.stem != "__init__" else folder
        for path in (PACKAGE / folder).glob("*.py")
    )


def _allowed(module: str) -> set[str]:
    """What a module may import: the root's lower modules, and its own
    folder and the folders below it."""
    index = FOLDERS.index(_layer(module))
    allowed = set(ROOT_BELOW)
    if index > 0:
        allowed |= ROOT_ABOVE_RULES
    return allowed | set(FOLDERS[: index + 1])


# The rooms of the tracker (issue 30), lowest first: each may import the
# rooms before it, never one after it, nor the tracker that composes them.
ROOMS = tuple(f"tracking.{room}" for room in (
    "seen_window", "records", "requests", "cursors", "breaks", "resumes", "streams", "sharing",
    "request_side",
))
TRACKER = "tracking.tracker"
MONITOR, PROCESSOR = "owner.monitor", "owner.processor"
# The parts of the owner (issue 30): the bases of ResumptionMonitor, each read
# alone, none importing another (they meet in the monitor, through ``self``).
OWNER_PARTS = tuple(f"owner.{part}" for part in (
    "channels", "hops", "findings", "stream_reports", "at_exit", "task_reports", "event_reports",
))
# The telemetry sink and its parts, lowest first.
SINK = tuple(f"telemetry.{part}" for part in (
    "instruments", "call_telemetry", "task_telemetry", "event_telemetry", "sink",
))
FACTS, REDACTION, DEADLINES = "telemetry.facts", "telemetry.redaction", "owner.deadlines"
UPPER = {
    FACTS, REDACTION, DEADLINES, *SINK, MONITOR, PROCESSOR, "patches", *OWNER_PARTS,
}
# The rules, lowest first: what an event id proves, the rules and their
# verdicts' words, one resume run through them.
RULES = ("rules.event_ids", "rules.continuity", "rules.resume_check")
FATES, SUBSCRIPTIONS, TASKS = "rules.fates", "rules.subscriptions", "rules.tasks"
# What the patches never reach into: the rules' modules and ledgers (they
# take the errors enforce mode raises from ``errors``), the tracker's rooms
# and the owner's parts.
NOT_FOR_PATCHES = {*_folder_modules("rules"), *ROOMS, *OWNER_PARTS}


def _rooms_after(room: str) -> set[str]:
    return set(ROOMS[ROOMS.index(room) + 1 :])


def _rules_after(module: str) -> set[str]:
    return set(RULES[RULES.index(module) + 1 :])


# Within a folder, and across the owner's and the patches' modules: each
# module and the package modules it must never import at run time (the
# folders' order above holds besides).
ABOVE = {
    # What enforce mode raises: below everything, importing nothing of ours.
    "errors": {*RULES, FATES, TRACKER, *ROOMS, *UPPER},
    **{rule: {*_rules_after(rule), FATES, TRACKER, *ROOMS, *UPPER} for rule in RULES},
    FATES: {TRACKER, *ROOMS, *UPPER},
    SUBSCRIPTIONS: {FATES, TRACKER, *ROOMS, *UPPER},
    # The task ledger (issue 37): a room of its own, beside the tracker, not in it.
    TASKS: {FATES, SUBSCRIPTIONS, TRACKER, *ROOMS, *UPPER},
    # A task handed to the fleet: below the task ledger, importing nothing of ours.
    "rules.task_handover": {TASKS, FATES, SUBSCRIPTIONS, TRACKER, *ROOMS, *UPPER},
    **{room: {TRACKER, *_rooms_after(room), *UPPER} for room in ROOMS},
    TRACKER: set(UPPER),
    # The shared state's record: below the tracker, above nothing of the core.
    "shared.shared_state": {TRACKER, *ROOMS, *UPPER, *_folder_modules("shared")} - {
        "shared.shared_state", "shared"},
    # The Redis store: the settings and the record, never the telemetry (the
    # owner hands it a callback to count its fallbacks).
    "shared.redis_state": {TRACKER, *ROOMS, *UPPER},
    "shared.redis_ledger": {"shared.redis_state", TRACKER, *ROOMS, *UPPER},
    # The tasks handed to the fleet, in Redis: beside the in-flight ledger.
    "shared.redis_tasks": {"shared.redis_state", "shared.redis_ledger", TASKS, TRACKER, *ROOMS,
                           *UPPER},
    # The store's link to Redis (connection, breaker, writer thread): below
    # both the records and the ledger it carries.
    "shared.redis_link": {
        "shared.redis_state", "shared.redis_ledger", "shared.redis_tasks", TRACKER, *ROOMS,
        *UPPER,
    },
    FACTS: {REDACTION, DEADLINES, *SINK, MONITOR, PROCESSOR, "patches", *OWNER_PARTS},
    REDACTION: {DEADLINES, *SINK, MONITOR, PROCESSOR, "patches", *OWNER_PARTS},
    DEADLINES: {*SINK, MONITOR, PROCESSOR, "patches", *OWNER_PARTS},
    **{
        part: {*SINK[SINK.index(part) + 1 :], MONITOR, PROCESSOR, "patches", *OWNER_PARTS}
        for part in SINK
    },
    **{
        part: {MONITOR, PROCESSOR, "patches", *(set(OWNER_PARTS) - {part})}
        for part in OWNER_PARTS
    },
    MONITOR: {PROCESSOR, "patches"},
    PROCESSOR: {"patches"},
    # The patches know the tracker's API (its names re-exported there), not
    # its rooms, and the owner by its type only.
    "patches": {MONITOR, PROCESSOR, *NOT_FOR_PATCHES},
    "patches.http": {MONITOR, PROCESSOR, *NOT_FOR_PATCHES},
    # The feed of a stream's events, below the iteration patches that feed it.
    "patches.feed": {
        MONITOR, PROCESSOR, "patches.http", "patches.sse", "patches.own_sse",
        "patches.mcp_sdk", *NOT_FOR_PATCHES,
    },
    "patches.own_sse": {
        MONITOR, PROCESSOR, "patches.http", "patches.sse", "patches.feed", "patches.mcp_sdk",
        *NOT_FOR_PATCHES,
    },
    "patches.sse": {MONITOR, PROCESSOR, "patches.http", "patches.mcp_sdk", *NOT_FOR_PATCHES},
    "patches.mcp_sdk": {
        MONITOR, PROCESSOR, "patches.http", "patches.sse", "patches.feed", *NOT_FOR_PATCHES,
    },
    # The server half is a half of its own: it shares the telemetry's names
    # and the patches' guard, never the client half's owner.
    **{module: set(_folder_modules("owner")) for module in _folder_modules("server")},
}

# The pure core: the rules, the ledgers, the shared state's record and the
# tracker with its rooms import the standard library and each other only (no
# OpenTelemetry, no HTTP client).
PURE = (
    "errors", "forks", *_folder_modules("rules"), "shared.shared_state",
    *_folder_modules("tracking"),
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


@pytest.mark.parametrize(
    "module", [module for folder in FOLDERS for module in _folder_modules(folder)]
)
def test_no_module_imports_a_folder_above_its_own(module):
    imported = {_layer(name) for name in _runtime_imports(module)}
    upward = imported - _allowed(module)
    assert not upward, f"{module} imports from {sorted(upward)}, above its folder"


@pytest.mark.parametrize("module", sorted(ROOT_BELOW | ROOT_ABOVE_RULES))
def test_the_roots_lower_modules_import_no_layer_but_the_rules(module):
    imported = {_layer(name) for name in _runtime_imports(module)}
    allowed = {"rules", *ROOT_BELOW} if module in ROOT_ABOVE_RULES else set()
    assert imported <= allowed, f"{module} imports {sorted(imported - allowed)}"


def test_every_module_sits_in_a_folder_of_its_layer():
    """The package's top holds the face and what every layer reads, nothing
    else: a new module takes its folder."""
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top == {"__init__", "skip_notice", *ROOT_BELOW, *ROOT_ABOVE_RULES}
    assert {path.name for path in PACKAGE.iterdir() if path.is_dir()} - {"__pycache__"} == set(
        FOLDERS
    )


@pytest.mark.parametrize("module", PURE)
def test_the_pure_core_imports_the_standard_library_only(module):
    path = PACKAGE / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = PACKAGE / module.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
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
    assert set(ROOMS) <= _runtime_imports(TRACKER)


def test_the_monitor_is_composed_of_every_part():
    """Each part of the owner is a module the monitor imports, so each is
    held to the rules above (a new part takes its place in ``OWNER_PARTS``)."""
    assert set(OWNER_PARTS) <= _runtime_imports(MONITOR)


def test_the_check_sees_imports():
    """The checker itself finds what a module does import (else the test
    above could never fail)."""
    assert {MONITOR, REDACTION} <= _runtime_imports(PROCESSOR)
    assert MONITOR not in _runtime_imports("patches.http")  # TYPE_CHECKING only
    assert {FACTS, TRACKER} <= _runtime_imports("patches.http")
    assert {"tracking.records", "tracking.breaks"} <= _runtime_imports("tracking.resumes")
    assert "owner" in {_layer(name) for name in _runtime_imports(PROCESSOR)}


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
