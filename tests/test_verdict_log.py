"""The readable verdict: one Python log line per verdict at the level that
fits, one hint per server whose opaque ids make its resumes unverifiable, and
a per-server summary (at exit, or asked for).  Real streams from a loopback
server through the patched httpx-sse client; the summary at a real exit runs
in tests/test_examples.py, as a user runs the examples."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import httpx_sse
import pytest

from opentelemetry.instrumentation.mcp_resumption.telemetry import verdict_log
from opentelemetry.instrumentation.mcp_resumption.telemetry.verdict_log import LOGGER_NAME, verdicts

from scripted_server import fresh_session, legacy_stream, notification, sse


@pytest.fixture(autouse=True)
def fresh_tally(monkeypatch):
    monkeypatch.delenv(verdict_log.SETTING, raising=False)
    verdicts.reset()
    yield
    verdicts.reset()


def resume_twice(server, path: str, ids: list[str], replayed: list[str]) -> None:
    """A stream with ``ids``, then two resumes from its last id, each answered
    with ``replayed``: two attempts."""
    session = f"s-{path.strip('/')}"

    def stream(request, body):
        if request.headers.get("last-event-id"):
            events = [sse(i, notification(n)) for n, i in enumerate(replayed)]
        else:
            events = [sse(i, notification(n)) for n, i in enumerate(ids)]
        return 200, {"mcp-session-id": session}, events

    server.on("GET", path, stream)
    with httpx.Client(base_url=server.url) as http:
        headers = {"mcp-session-id": session}
        with httpx_sse.connect_sse(http, "GET", path, headers=headers) as source:
            list(source.iter_sse())
        for _ in range(2):
            resume = {**headers, "Last-Event-ID": ids[-1]}
            with httpx_sse.connect_sse(http, "GET", path, headers=resume) as source:
                list(source.iter_sse())


def lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER_NAME]


def test_a_proven_resume_is_one_info_line_and_no_hint(server, telemetry, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    with telemetry.instrumented(confirm_timeout=2):
        resume_twice(server, "/ints", ["1", "2", "3"], ["4"])
    assert telemetry.outcomes() == {"resumed": 2}
    name = f"127.0.0.1:{server.port}"
    expected = (
        logging.INFO,
        f"mcp-resumption verdict: resumed server={name} transport=streamable-http "
        "gaps=- lost_calls=0",
    )
    assert lines(caplog) == [expected, expected]
    assert verdict_log.summary_lines() == [
        f"mcp-resumption summary: server={name} attempts=2 resumed=2 gaps=- lost_calls=0"
    ]


def test_opaque_ids_give_unverifiable_with_one_hint_per_server(server, telemetry, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    with telemetry.instrumented(confirm_timeout=2):
        resume_twice(server, "/uuids", ids, [str(uuid.uuid4())])
    assert telemetry.outcomes() == {"unverifiable": 2}
    found = lines(caplog)
    verdict_lines = [text for _, text in found if "verdict: unverifiable" in text]
    hints = [(level, text) for level, text in found if "hint" in text]
    assert len(verdict_lines) == 2
    assert len(hints) == 1, found  # once per server, not once per resume
    level, text = hints[0]
    assert level == logging.WARNING
    assert f"server=127.0.0.1:{server.port}" in text
    for needed in ("opaque", "ProvableEventStore", "OTEL_PYTHON_MCP_RESUMPTION_EVENT_ID_PATTERN"):
        assert needed in text


def test_counting_ids_give_no_hint(server, telemetry, caplog):
    """The control of the hint: the same resumes with counting ids."""
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    with telemetry.instrumented(confirm_timeout=2):
        resume_twice(server, "/prefixed", ["e-1", "e-2", "e-3"], ["e-4"])
    assert telemetry.outcomes() == {"resumed": 2}
    assert not [text for _, text in lines(caplog) if "hint" in text]


def test_a_gap_is_a_warning_naming_its_kinds(server, telemetry, caplog):
    """Seed 000: the legacy stream, then a resume answered by a fresh
    session counting from 1.  Without any logging configured, a WARNING is
    what Python prints."""
    server.on("GET", "/sse", legacy_stream)
    server.on("GET", "/mcp", fresh_session)
    with telemetry.instrumented(confirm_timeout=2), httpx.Client(base_url=server.url) as http:
        with httpx_sse.connect_sse(http, "GET", "/sse") as source:
            list(source.iter_sse())
        headers = {"Last-Event-ID": "4821", "mcp-session-id": "legacy-abc"}
        with httpx_sse.connect_sse(http, "GET", "/mcp", headers=headers) as source:
            list(source.iter_sse())
    assert telemetry.outcomes() == {"gap": 1}
    name = f"127.0.0.1:{server.port}"
    assert lines(caplog) == [
        (
            logging.WARNING,
            f"mcp-resumption verdict: gap server={name} transport=streamable-http "
            "gaps=id_regression,session_changed lost_calls=0",
        )
    ]
    [summary] = verdict_log.summary_lines()
    assert summary == (
        f"mcp-resumption summary: server={name} attempts=1 gap=1 "
        "gaps=id_regression:1,session_changed:1 lost_calls=0"
    )
    caplog.clear()
    verdicts.write_summary()
    assert lines(caplog) == [(logging.WARNING, summary)]


def test_off_writes_nothing(server, telemetry, caplog, monkeypatch):
    monkeypatch.setenv(verdict_log.SETTING, "off")
    verdicts.reset()
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    with telemetry.instrumented(confirm_timeout=2):
        resume_twice(server, "/off", ["1", "2", "3"], ["4"])
    assert telemetry.outcomes() == {"resumed": 2}, "the metrics do not depend on it"
    assert lines(caplog) == []


def test_an_invalid_setting_warns_once_and_logs_as_default(server, telemetry, caplog, monkeypatch):
    monkeypatch.setenv(verdict_log.SETTING, "loud")
    verdicts.reset()
    caplog.set_level(logging.INFO)
    with telemetry.instrumented(confirm_timeout=2):
        resume_twice(server, "/invalid", ["1", "2", "3"], ["4"])
    warnings = [r.getMessage() for r in caplog.records if verdict_log.SETTING in r.getMessage()]
    accepted = "logging, stderr, off"
    assert warnings == [f"{verdict_log.SETTING}='loud' is not one of {accepted}; using 'logging'"]
    assert len([1 for _, text in lines(caplog) if "verdict: resumed" in text]) == 2


@pytest.mark.parametrize(
    ("scenario", "lost"), [("stateless_cut_lost", 1), ("stateless_cut_reissued", 0)]
)
def test_a_break_nothing_resumes_is_a_warning_and_the_exit_summary_counts_its_lost_call(
    scenario, lost
):
    """The demo's stateless rows under opentelemetry-instrument, as a user's
    client runs: the break is one not_resumable WARNING line written at the
    break, which counts the call as awaiting its fate and is never
    contradicted: the fate, once decided, has a line of its own, and the
    summary written at exit agrees with both (lost in one row, re-issued in
    the other)."""
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    result = subprocess.run(
        [str(bin_dir / "opentelemetry-instrument"), str(bin_dir / "mcp-resumption"),
         "scenario", scenario],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("mcp-resumption ")]
    # The break's line counts the call as awaiting its fate; the fate then has
    # a line of its own where it loses something: the lost call, or (mcp 1.x
    # speaks 2025-11-25, whose servers do not cancel a call when its stream
    # breaks) a re-issue that may have run the tool twice.
    risky = not lost and importlib.metadata.version("mcp").startswith("1.")
    assert len(lines) == (3 if lost or risky else 2), result.stderr
    if lost:
        verdict, fate, summary = lines
        assert re.fullmatch(
            r"mcp-resumption lost call: server=127\.0\.0\.1:\d+ method=tools/call request=\S+: .+",
            fate,
        ), fate
    elif risky:
        verdict, fate, summary = lines
        assert fate.startswith("mcp-resumption re-issue may run twice: "), fate
        assert summary.endswith(" may_run_twice=1"), summary
        summary = summary.removesuffix(" may_run_twice=1")
    else:
        verdict, summary = lines
    assert re.fullmatch(
        r"mcp-resumption verdict: not_resumable server=127\.0\.0\.1:\d+ "
        r"transport=streamable-http gaps=- lost_calls=0 awaiting=1",
        verdict,
    ), verdict
    gaps = "orphaned_request:1" if lost else "-"
    assert re.fullmatch(
        r"mcp-resumption summary: server=127\.0\.0\.1:\d+ attempts=1 not_resumable=1 "
        rf"gaps={gaps} lost_calls={lost}",
        summary,
    ), summary


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_sums_up_its_own_verdicts():
    verdicts.verdict("parent:1", "streamable-http", "resumed")
    pid = os.fork()
    if pid == 0:  # the child: its parent's tally is not its own
        os._exit(0 if verdicts.summary_lines() == [] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(verdicts.summary_lines()) == 1  # the parent's stays
