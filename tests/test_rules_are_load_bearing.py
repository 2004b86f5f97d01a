"""Every rule in rules/continuity.py decides at least one seed scenario: with the
rule turned into a no-op, some scenario of test_tracker reports a different
set of gap kinds (tracker_scenarios)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from opentelemetry.instrumentation.mcp_resumption.rules import continuity
from opentelemetry.instrumentation.mcp_resumption.rules.continuity import GapKind
from opentelemetry.instrumentation.mcp_resumption.rules.resume_check import ResumeCheck
from tracker_scenarios import SCENARIOS

KIND_OF_RULE = {
    "session_changed_rule": "session_changed",
    "id_regression_rule": "id_regression",
    "id_reused_rule": "id_reused",
    "replay_contract_rule": "replay_contract_violation",
    "drain_race_rule": "drain_race",
    "replay_unconfirmed_rule": "replay_unconfirmed",
    "orphaned_request_rule": "orphaned_request",
    "foreign_replay_rule": "foreign_replay",
    "subscription_lost_rule": "subscription_lost",
}
RULES = list(KIND_OF_RULE)


def _kinds() -> dict[str, frozenset[str]]:
    return {name: scenario().kinds for name, scenario in SCENARIOS.items()}


def _disable(monkeypatch: pytest.MonkeyPatch, rule: str) -> None:
    if rule != "orphaned_request_rule":
        monkeypatch.setattr(continuity, rule, lambda *args, **kwargs: None)
        return

    # orphaned_request_rule always returns a gap; its callers must skip it.
    def orphan_none(self: ResumeCheck, why: str) -> list:
        self._pending.clear()
        return []

    def settle_none(self: ResumeCheck, first: object) -> list:
        for entry in self._pending.values():
            entry.event_id = None
        return []

    monkeypatch.setattr(ResumeCheck, "_orphan_all", orphan_none)
    monkeypatch.setattr(ResumeCheck, "_settle_unconsumed", settle_none)


def test_every_gap_kind_has_one_rule_and_every_rule_reports_its_own_kind(monkeypatch):
    # Every rule of rules/continuity.py is in RULES (so the test below covers it),
    # one rule to a gap kind ...
    assert {name for name in vars(continuity) if name.endswith("_rule")} == set(RULES)
    assert sorted(KIND_OF_RULE.values()) == sorted(kind.value for kind in GapKind)
    # ... and, over the scenarios, each rule proves gaps of its kind only.
    reported: dict[str, set[str]] = {rule: set() for rule in RULES}

    def recording(rule: str, original):
        def call(*args, **kwargs):
            gap = original(*args, **kwargs)
            if gap is not None:
                reported[rule].add(gap.kind.value)
            return gap

        return call

    for rule in RULES:
        monkeypatch.setattr(continuity, rule, recording(rule, getattr(continuity, rule)))
    _kinds()
    assert reported == {rule: {kind} for rule, kind in KIND_OF_RULE.items()}


def test_every_caller_calls_a_rule_through_continuity():
    """A module that bound a rule by name (``from .continuity import
    x_rule``) would keep the original when the tests below turn it into a
    no-op, and their mutation would prove nothing about that caller."""
    package = Path(continuity.__file__).parent
    bound = {
        f"{path.relative_to(package)}: {alias.name}"
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("continuity")
        for alias in node.names
        if alias.name.endswith("_rule") or alias.name == "*"
    }
    assert not bound


@pytest.mark.parametrize("rule", RULES)
def test_rule_is_load_bearing(monkeypatch: pytest.MonkeyPatch, rule: str):
    baseline = _kinds()
    kind = KIND_OF_RULE[rule]
    assert any(kind in kinds for kinds in baseline.values()), f"no scenario reports {kind}"
    _disable(monkeypatch, rule)
    disabled = _kinds()
    changed = {name for name in SCENARIOS if disabled[name] != baseline[name]}
    assert changed, f"disabling {rule} changes no scenario"
    assert any(kind in baseline[name] and kind not in disabled[name] for name in changed)
