"""Every rule in continuity.py decides at least one seed scenario: with the
rule turned into a no-op, some scenario of test_tracker reports a different
set of gap kinds."""

from __future__ import annotations

import pytest

from opentelemetry.instrumentation.mcp_resumption import continuity
from opentelemetry.instrumentation.mcp_resumption.continuity import ResumeCheck
from test_tracker import SCENARIOS

KIND_OF_RULE = {
    "session_changed_rule": "session_changed",
    "id_regression_rule": "id_regression",
    "id_reused_rule": "id_reused",
    "replay_contract_rule": "replay_contract_violation",
    "drain_race_rule": "drain_race",
    "replay_unconfirmed_rule": "replay_unconfirmed",
    "orphaned_request_rule": "orphaned_request",
    "foreign_replay_rule": "foreign_replay",
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


def test_every_rule_is_named_in_continuity():
    for rule in RULES:
        assert callable(getattr(continuity, rule))
    assert {name for name in vars(continuity) if name.endswith("_rule")} == set(RULES)


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
