"""The PromQL queries of the Grafana dashboard, with Grafana's variables filled in.

Used by tests/test_dashboards.py and by integration tests that run every panel
query against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD_PATH = Path(__file__).resolve().parent.parent / "dashboards" / "mcp-resumption.json"

# Values used for any variable the caller does not give. "All" of a multi-select
# variable with includeAll is its allValue, ".*".
DEFAULT_VARIABLES: dict[str, str] = {
    "datasource": "prometheus",
    "job": ".*",
    "instance": ".*",
    "server_address": ".*",
    "slo_target": "0.99",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}

# $name or ${name}; Grafana's [[name]] form is deprecated and not used here.
_VARIABLE = re.compile(r"\$\{(?P<braced>\w+)\}|\$(?P<bare>\w+)")


def load_dashboard(path: Path = DASHBOARD_PATH) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        return json.load(handle)


def iter_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including the panels nested in collapsed rows."""
    panels: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def row_of(dashboard: dict[str, Any]) -> dict[int, str]:
    """Each panel's id -> the title of the row above it (rows are not collapsed:
    a row holds the panels that follow it, up to the next row)."""
    rows: dict[int, str] = {}
    current = ""
    for panel in dashboard.get("panels", []):
        if panel["type"] == "row":
            current = panel["title"]
        rows[panel["id"]] = current
        for nested in panel.get("panels", []):
            rows[nested["id"]] = panel["title"]
    return rows


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Replace $name and ${name} with variables[name]; unknown names raise KeyError."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bare")
        if name not in variables:
            raise KeyError(f"dashboard query uses ${name}, which has no value: {expr}")
        return variables[name]

    return _VARIABLE.sub(replace, expr)


def panel_queries(
    dashboard: dict[str, Any], variables: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, variables substituted.

    ``variables`` overrides DEFAULT_VARIABLES, e.g. ``{"job": "mcp-client",
    "__rate_interval": "30s"}``. Keys are variable names without the ``$``.
    """
    values = {**DEFAULT_VARIABLES, **(variables or {})}
    queries: list[tuple[str, str]] = []
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if expr:
                queries.append((panel.get("title", ""), substitute(expr, values)))
    return queries


_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def variable_queries(
    dashboard: dict[str, Any], variables: dict[str, str] | None = None
) -> list[tuple[str, str, str]]:
    """(variable name, series selector, label) of every ``label_values``
    query variable, the variables it uses substituted: what Grafana asks
    Prometheus' series API for."""
    values = {**DEFAULT_VARIABLES, **(variables or {})}
    found: list[tuple[str, str, str]] = []
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        match = _LABEL_VALUES.match(query or "") if variable.get("type") == "query" else None
        if match:
            found.append(
                (variable["name"], substitute(match["selector"], values), match["label"])
            )
    return found
