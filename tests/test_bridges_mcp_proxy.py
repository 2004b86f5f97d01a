"""Broken calls through npm ``mcp-proxy`` (tests/bridges/package-lock.json), a
stdio MCP server behind streamable HTTP, with its event store off
(``--no-eventStore``: no event ids, nothing to resume with) and on (its
default: the stream has ids and a resumable client resumes).  The router's
record says what became of the cut call; the plugin must say the same
(tests/bridge_stack.py)."""

from __future__ import annotations

import pytest

from bridge_stack import (
    CONFIRM,
    bridges_fixture,
    case_clean,
    case_lost,
    case_reissued,
    run,
    wire_dump,
)
from wire import CLIENTS, MODERN, MODES, Truth, fates, instrument_env

bridges = bridges_fixture()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_cut_call_reissued_without_the_event_store(telemetry, monkeypatch, bridges, kind,
                                                     mode):
    case_reissued(telemetry, monkeypatch, bridges("mcp-proxy-no-store"), kind, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_cut_call_given_up_without_the_event_store(telemetry, monkeypatch, bridges, kind,
                                                     mode):
    case_lost(telemetry, monkeypatch, bridges("mcp-proxy-no-store"), kind, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_cut_call_with_the_event_store(telemetry, monkeypatch, bridges, kind, mode):
    """With the store, a resumable client resumes and gets the answer
    (``answered``, no gap); the 2026-07-28 client resumes nothing and
    re-issues (``reissued``, ``not_resumable``).  The wire shows which."""
    instrument_env(monkeypatch, mode, CONFIRM)

    async def act(client):
        try:
            assert await client.call("x", timeout=5) == "done x"
        except Exception:  # the cut was not resumed: re-issue
            assert await client.call("x") == "done x"

    truth = Truth(run(telemetry, bridges("mcp-proxy-store"), kind, act))
    assert len(truth.cut) == 1, wire_dump(truth)
    [call] = truth.cut
    if kind == MODERN:
        assert truth.event_ids_on(call) == [] and truth.resumes == [], wire_dump(truth)
        assert truth.fate(call) == "reissued", wire_dump(truth)
        assert fates(telemetry) == {"reissued": 1}
        assert telemetry.outcomes() == {"not_resumable": 1}
    else:
        ids = truth.event_ids_on(call)
        assert ids, wire_dump(truth)
        [resume, *_] = truth.resumes
        assert resume.request.header("last-event-id") == ids[-1], wire_dump(truth)
        assert resume.index in call.answered_on, wire_dump(truth)
        assert truth.fate(call) == "answered"
        assert fates(telemetry) == {"answered": 1}
        assert "not_resumable" not in telemetry.outcomes()
    assert telemetry.gap_kinds() == {}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("name", ["mcp-proxy-no-store", "mcp-proxy-store"])
def test_a_clean_run(telemetry, monkeypatch, bridges, name, kind, mode):
    case_clean(telemetry, monkeypatch, bridges(name), kind, mode)
