"""Broken calls through npm ``supergateway`` (tests/bridges/package-lock.json),
a stdio MCP server behind streamable HTTP, ``--stateful`` and stateless (its
default).  It keeps no events and sends no event ids, so a cut call cannot be
resumed: the router's record shows it re-issued or lost, and the plugin must
say the same (tests/bridge_stack.py).

Stateless, supergateway starts the stdio server anew for every request, and
so it does, stateful, for every request of the 2026-07-28 client (which has no
session): a second each, for the SDK's import.  Those stacks run the cases
that differ, in one mode each, stateless with the mcp 1.x client only (it
behaves there as mcp 2.x's legacy mode does); the stateful legacy sessions
run them all.  (Under a minute on two shared cores.)"""

from __future__ import annotations

import pytest

from bridge_stack import bridges_fixture, case_clean, case_lost, case_reissued
from wire import LEGACY, MCP1, MODERN

bridges = bridges_fixture()
STATEFUL, STATELESS = "supergateway-stateful", "supergateway"


def cases(*triples):
    return [
        pytest.param(name, kind, mode, id=f"{name}-{kind}-{mode}",
                     marks=pytest.mark.mcp1 if kind == MCP1 else pytest.mark.mcp2)
        for name, kind, mode in triples
    ]


@pytest.mark.parametrize(("name", "kind", "mode"), cases(
    (STATEFUL, LEGACY, "observe"), (STATEFUL, LEGACY, "enforce"),
    (STATEFUL, MCP1, "observe"), (STATEFUL, MCP1, "enforce"),
    (STATEFUL, MODERN, "observe"),
    (STATELESS, MCP1, "observe"),
))
def test_a_cut_call_the_application_reissues(telemetry, monkeypatch, bridges, name, kind,
                                             mode):
    case_reissued(telemetry, monkeypatch, bridges(name), kind, mode)


@pytest.mark.parametrize(("name", "kind", "mode"), cases(
    (STATEFUL, LEGACY, "observe"), (STATEFUL, MCP1, "observe"), (STATEFUL, MCP1, "enforce"),
    (STATELESS, MODERN, "observe"),
))
def test_a_cut_call_the_application_gives_up_on(telemetry, monkeypatch, bridges, name, kind,
                                                mode):
    case_lost(telemetry, monkeypatch, bridges(name), kind, mode)


@pytest.mark.parametrize(("name", "kind", "mode"), cases(
    (STATEFUL, LEGACY, "observe"), (STATEFUL, LEGACY, "enforce"),
    (STATEFUL, MCP1, "observe"), (STATEFUL, MCP1, "enforce"),
    (STATEFUL, MODERN, "enforce"),
    (STATELESS, MCP1, "observe"),
))
def test_a_clean_run(telemetry, monkeypatch, bridges, name, kind, mode):
    case_clean(telemetry, monkeypatch, bridges(name), kind, mode)
