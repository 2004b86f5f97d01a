"""The official MCP conformance suite (issue 45, point 3) through every part
of the plugin: its server scenarios (``--suite all``) at the 2025-11-25 and
the 2026-07-28 wire against the SDK's everything-server under the server
half, and behind ``mcp-resumption-proxy`` in observe mode and with
``--resumable``; its client scenarios that touch streams against the SDK's
conformance client under the client half.

Whatever the plugin is in front of or inside, every scenario must pass as it
passes bare (the suite's exit code and each check's status: the ground
truth), and the plugin must count no loss the suite's own record does not
show.  Both wires run at once (tests/conformance_stack.py); the module takes
about a minute.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.mcp2  # the everything-server and client are mcp 2.x's

import conformance_stack as cs  # noqa: E402
from loss_accounting import check as check_loss_accounting  # noqa: E402
from proxy_harness import Proxy  # noqa: E402

BROKEN = "mcp.client.resumption.broken_requests"
GAPS = "mcp.client.resumption.gaps"
LOST_SUBSCRIPTIONS = "mcp.client.resumption.lost_subscriptions"
ATTEMPTS = "mcp.client.resumption.attempts"
FATE = "mcp.resumption.request.fate"
KIND = "mcp.resumption.gap.kind"
LEG = "mcp.resumption.leg"
# server-sse-multiple-streams at 2025-11-25 opens three tools/list streams
# (ids 1000-1002), reads one event of each and cancels it: an answer that
# had not yet reached the proxy's client then never reaches it, is not
# resumed and not re-issued, which is a lost call by the rules of that wire
# (a disconnect is no cancel).  Whether any answer is that late is a matter
# of timing; these, and only these, may be counted lost.
ABANDONED_BY_THE_SUITE = {("tools/list", str(request)) for request in (1000, 1001, 1002)}
LOST_LINE = re.compile(r"mcp-resumption lost call: .* leg=(\S+) .*method=(\S+) request=(\S+):")
# The client scenarios that put a call on a stream, each at the wire it is
# written for (initialize is tools_call's first step): sse-retry closes the
# call's stream and answers on the GET resume; elicitation-sep1034 asks the
# client something on the call's stream; request-metadata runs every
# callback at 2026-07-28.
CLIENT_SCENARIOS = (
    ("tools_call", "2025-11-25"),
    ("sse-retry", "2025-11-25"),
    ("elicitation-sep1034-client-defaults", "2025-11-25"),
    ("tools_call", "2026-07-28"),
    ("request-metadata", "2026-07-28"),
)


@dataclass
class ServerSuites:
    """Each server-side stack's two runs (wire -> SuiteRun), and what each
    plugin process exported at its exit."""

    runs: dict[str, dict[str, cs.SuiteRun]]
    server_half: dict[str, cs.EverythingServer]
    proxies: dict[str, dict[str, Proxy]]


@pytest.fixture(scope="module")
def server_suites(tmp_path_factory) -> Iterator[ServerSuites]:
    """The server suite at both wires against four stacks at once (each run
    mostly waits on its server): the everything-server bare (the reference),
    under the server half, and behind the proxy in observe mode and with
    ``--resumable``; each plugin process serves one wire (so that each count
    is known to be one wire's).  Every process is stopped before a test reads its counts."""
    out = tmp_path_factory.mktemp("server-suites")
    with contextlib.ExitStack() as stack:
        # Started side by side: each process spends its start importing.
        servers = started(stack, [lambda: cs.EverythingServer(instrumented=False)]
                          + [lambda: cs.EverythingServer(instrumented=True)] * len(cs.WIRES))
        bare, half = servers[0], dict(zip(cs.WIRES, servers[1:]))
        modes = (("observe", ()), ("resumable", ("--resumable",)))
        fronts = started(stack, [lambda args=args: Proxy(bare.url, *args)
                                 for _, args in modes for _ in cs.WIRES])
        proxies = {mode: dict(zip(cs.WIRES, fronts[i * len(cs.WIRES):]))
                   for i, (mode, _) in enumerate(modes)}
        urls = {"bare": dict.fromkeys(cs.WIRES, bare.url),
                "server_half": {wire: running.url for wire, running in half.items()},
                **{mode: {wire: running.url for wire, running in by_wire.items()}
                   for mode, by_wire in proxies.items()}}
        with ThreadPoolExecutor(len(urls) * len(cs.WIRES)) as pool:
            pending = {(stack_name, wire): pool.submit(cs.server_suite, url, wire,
                                                       out / stack_name / wire)
                       for stack_name, by_wire in urls.items() for wire, url in by_wire.items()}
            runs: dict[str, dict[str, cs.SuiteRun]] = {}
            for (stack_name, wire), future in pending.items():
                runs.setdefault(stack_name, {})[wire] = future.result()
        for stack_name, by_wire in runs.items():
            for wire, run in by_wire.items():
                cs.alone(run, urls[stack_name][wire], wire, out / stack_name / f"{wire}-alone")
                if run.alone:
                    print(f"{stack_name} {wire}: failed side by side, run again alone: {run.alone}")
    for wire, run in runs["bare"].items():
        assert run.returncode == 0 and not run.failures(), (wire, run.output[-3000:])
        assert run.checks, (wire, run.output[-3000:])
    yield ServerSuites(runs, half, proxies)


def started(stack: contextlib.ExitStack, makers: list) -> list:
    """Each maker's process, made at once; each closed by ``stack``."""
    with ThreadPoolExecutor(len(makers)) as pool:
        pending = [pool.submit(make) for make in makers]
    made = []
    for future in pending:
        if future.exception() is None:
            stack.callback(future.result().close)
            made.append(future.result())
    assert len(made) == len(makers), [future.exception() for future in pending]
    return made


def assert_passes_as_bare(suites: ServerSuites, stack_name: str) -> None:
    for wire, run in suites.runs[stack_name].items():
        assert run.returncode == 0, (wire, run.output[-3000:])
        assert run.failures() == {}, wire
        assert run.unlike(suites.runs["bare"][wire]) == {}, wire


def test_the_server_half_passes_every_server_scenario(server_suites):
    assert_passes_as_bare(server_suites, "server_half")
    for wire, server in server_suites.server_half.items():
        fates = server.counts("mcp.server.resumption.deliveries", "mcp.resumption.delivery.fate")
        assert fates.get("delivered"), server.stdout[-3000:]  # the half ran and exported
        # Every answer reached an open stream or its resume, but for the
        # streams server-sse-multiple-streams cancels after one event (see
        # ABANDONED_BY_THE_SUITE): an answer not yet written then reaches
        # nobody (2025-11-25), or its handler is cancelled (2026-07-28).
        abandoned = "undelivered" if wire == "2025-11-25" else "cancelled"
        assert set(fates) <= {"delivered", "stored", "replayed", abandoned}, (wire, fates)
        assert fates.get(abandoned, 0) <= len(ABANDONED_BY_THE_SUITE), (wire, fates)
        assert server.counts("mcp.server.resumption.work_for_nobody", "gen_ai.tool.name") == {}
        assert server.counts("mcp.server.resumption.second_runs", "gen_ai.tool.name") == {}
        ends = server.counts("mcp.server.resumption.listens", "mcp.resumption.listen.end")
        assert "lost" not in ends, (wire, ends)
        # Each resume the suite sent (server-sse-polling's GET), replayed.
        outcomes = server.counts("mcp.server.resumption.requests", "mcp.resumption.outcome")
        resumes = server_suites.runs["server_half"][wire].resumes()
        assert outcomes == ({"replayed": resumes} if resumes else {}), (wire, outcomes)
    assert server_suites.runs["server_half"]["2025-11-25"].resumes() == 1


@pytest.mark.parametrize("mode", ["observe", "resumable"])
def test_the_proxy_passes_every_server_scenario(server_suites, mode):
    """With ``--resumable``, server-sse-polling (the server closes the
    call's stream after its priming event and answers on the client's GET
    resume) fails until the proxy resumes its own upstream stream: its
    answer never comes, and the proxy counts the call lost on its leg to
    the server."""
    runs, proxies = server_suites.runs[mode], server_suites.proxies[mode]
    bare = server_suites.runs["bare"]
    # Every finding at once: a failed scenario and a false loss are two bugs.
    problems: dict[str, object] = {}
    try:
        check_loss_accounting(list(proxies.values()))
    except AssertionError as disagreement:
        problems["lost calls unlike their gaps"] = str(disagreement)
    for wire, run in runs.items():
        if run.returncode or run.failures():
            problems[f"{wire} scenarios"] = (run.returncode, run.failures())
        # With --resumable the proxy may keep the client's stream across the
        # server's own close (then the suite logs INFO where bare it saw the
        # close and the resume succeed): the same scenarios must pass.
        elif unlike := run.unlike(bare[wire], same_checks=mode == "observe"):
            problems[f"{wire} unlike bare"] = unlike
    for wire, running in proxies.items():
        lines = [(match.groups(), line) for line in running.stderr.splitlines()
                 if (match := LOST_LINE.search(line))]
        lost = [groups for groups, _ in lines]
        allowed = ABANDONED_BY_THE_SUITE if wire == "2025-11-25" else set()
        if unexplained := [line for (leg, method, request), line in lines
                           if leg != "client_proxy" or (method, request) not in allowed]:
            problems[f"{wire} lost calls"] = unexplained
        broken = running.counts(BROKEN, FATE, LEG)
        if sum(n for (fate, _), n in broken.items() if fate == "lost") != len(lost):
            problems[f"{wire} lost calls counted"] = broken
        gaps = running.counts(GAPS, KIND, LEG)
        if any(kind != "orphaned_request" for kind, _ in gaps):
            problems[f"{wire} gaps"] = gaps
        # The suite closes every subscriptions/listen it opens itself, once
        # it has the notifications it waits for (2026-07-28: the close is
        # the client's cancel); the server ends none.
        if subscriptions := running.counts(LOST_SUBSCRIPTIONS, LEG):
            problems[f"{wire} lost subscriptions"] = subscriptions
        attempts = running.counts(ATTEMPTS, "mcp.resumption.outcome", LEG)
        if any(outcome not in {"resumed", "caught_up", "replayed"} for outcome, _ in attempts):
            problems[f"{wire} resume verdicts"] = attempts
    assert problems == {}, problems


def test_the_client_half_passes_the_stream_client_scenarios(tmp_path):
    """The SDK's conformance client under ``opentelemetry-instrument``; two
    scenarios at a time (each a client process the suite starts)."""
    sources = cs.sdk_sources()
    instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    client = sources / ".github" / "actions" / "conformance" / "client.py"
    command = f"{instrument} {sys.executable} {client}"
    env = cs.clean_env(
        OTEL_SERVICE_NAME="conformance-client",
        OTEL_METRICS_EXPORTER="console",
        OTEL_TRACES_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    with ThreadPoolExecutor(2) as pool:
        pending = {
            (scenario, wire): pool.submit(cs.client_scenario, command, scenario, wire,
                                          tmp_path / wire / scenario, env)
            for scenario, wire in CLIENT_SCENARIOS
        }
        runs = {key: future.result() for key, future in pending.items()}
    failed = {key: (run.returncode, run.failures()) for key, run in runs.items()
              if run.returncode or run.failures() or not run.checks}
    assert failed == {}, failed
    for (scenario, wire), run in runs.items():
        [(stdout, stderr)] = cs.client_outputs(tmp_path / wire / scenario).values()
        assert "mcp-resumption summary:" in stderr, (scenario, wire, stderr[-2000:])
        for metric, attribute in ((BROKEN, FATE), (GAPS, KIND), (LOST_SUBSCRIPTIONS, LEG)):
            assert cs.export_counts(stdout, metric, attribute) == {}, (scenario, wire, metric)
        # Each resume the suite's server saw, judged once, and not a gap.
        attempts = cs.export_counts(stdout, ATTEMPTS, "mcp.resumption.outcome")
        assert sum(attempts.values()) == run.resumes(), (scenario, wire, attempts)
        assert set(attempts) <= {"resumed", "caught_up", "replayed"}, (scenario, attempts)
    assert runs[("sse-retry", "2025-11-25")].resumes() == 1
