"""The proxy's modules (``proxy/src/mcp_resumption_proxy``) import each other
in no circle: each can be read, and changed, after the ones it imports.

Every import counts, wherever it stands: at the top, inside a function (a
deferred import is still a dependency, only hidden), and under ``if
TYPE_CHECKING:`` (a circle of annotations is still a circle a reader walks).
"""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[1] / "proxy" / "src" / "mcp_resumption_proxy"
PACKAGE = "mcp_resumption_proxy"


def _modules() -> list[str]:
    return sorted(path.stem for path in PROXY.glob("*.py"))


def imports_of(module: str, source: str | None = None) -> set[str]:
    """The proxy's modules that ``module`` imports, however and wherever."""
    tree = ast.parse(source if source is not None else (PROXY / f"{module}.py").read_text())
    known = set(_modules())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = node.module.split(".")[0] if node.module else None
            elif node.module and node.module.split(".")[0] == PACKAGE:
                parts = node.module.split(".")
                target = parts[1] if len(parts) > 1 else None
            else:
                continue
            if target is not None:
                found.add(target)
            else:  # ``from . import x``
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE and len(parts) > 1:
                    found.add(parts[1])
    return (found & known) - {module}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (its modules in order, the first repeated at
    the end), or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for after in sorted(graph.get(node, ())):
            if state.get(after) == 1:
                return [*path[path.index(after):], after]
            if after not in state and (found := walk(after)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)) is not None:
            return found
    return None


def test_the_proxy_modules_import_each_other_in_no_circle() -> None:
    graph = {module: imports_of(module) for module in _modules()}
    cycle = find_cycle(graph)
    assert cycle is None, "the proxy's modules import each other in a circle: " + " -> ".join(
        cycle or ())


def test_the_check_sees_every_kind_of_import() -> None:
    """The checker finds imports at the top, in a function and for
    annotations only, relative and absolute (else the test above could
    never fail)."""
    assert {"forwarding", "passthrough", "downstream"} <= imports_of("app")
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import enforce\n"
        "import mcp_resumption_proxy.legs\n"
        "if TYPE_CHECKING:\n"
        "    from .shared import SharedRelays\n"
        "def later():\n"
        "    from mcp_resumption_proxy.app import ProxyApp\n"
        "    from .resumable import Relay\n"
    )
    assert imports_of("cli", source) == {"enforce", "legs", "shared", "app", "resumable"}


def test_the_check_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
