from __future__ import annotations

import pytest

from helpers import Telemetry


@pytest.fixture
def telemetry():
    return Telemetry()


@pytest.fixture(scope="session")
def server():
    from scripted_server import ScriptedServer

    running = ScriptedServer()
    yield running
    running.close()


@pytest.fixture
def instrumented(telemetry):
    with telemetry.instrumented(confirm_timeout=2) as instrumentor:
        yield instrumentor


@pytest.fixture(scope="module")
def raw_server():
    """A :class:`fuzz_sse.RawServer` on 127.0.0.1 for the module: each path
    answers with the exact bytes a test scripts for it (``on`` / ``reply``)."""
    from fuzz_sse import RawServer

    running = RawServer()
    yield running
    running.close()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A real redis-server on a loopback port of its own (``redis_stack``),
    one per test module: the shared-state and proxy-fleet tests flush it."""
    from redis_stack import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.close()


@pytest.fixture(scope="session")
def shipped_stack(tmp_path_factory):
    """The whole demo, scraped by a real Prometheus on the shipped
    configuration (15 s scrapes, the shipped rules): (Prometheus, the demo's
    rows, the timestamp of the scrape that read its last count).  Shared by
    the dashboard and alert tests: one demo run feeds them all."""
    from prometheus_stack import Prometheus, ScrapedDemo, free_port

    metrics_port = free_port()
    prometheus = Prometheus(tmp_path_factory.mktemp("shipped-prometheus"), metrics_port)
    demo = None
    try:
        demo = ScrapedDemo(metrics_port)
        at = prometheus.scraped_totals(demo.totals)
        yield prometheus, demo.rows, at
    finally:
        if demo is not None:
            demo.close()
        prometheus.close()


@pytest.fixture(autouse=True)
def lost_calls_are_their_gaps():
    """After every test: each metric reader it used (an in-process
    ``Telemetry``, a proxy's exit export) counts as many ``lost`` fates as
    ``orphaned_request`` gaps, leg by leg (tests/loss_accounting.py)."""
    from loss_accounting import LOSS_READERS, check

    start = len(LOSS_READERS)
    yield
    readers = LOSS_READERS[start:]
    del LOSS_READERS[start:]  # nothing kept alive past its test
    check(readers)


@pytest.fixture(scope="session", autouse=True)
def no_exit_summary_of_the_test_process():
    """The tests instrument this process against hundreds of loopback servers:
    its exit summary would be hundreds of lines after pytest's own.  The
    summary at a real exit is tested in subprocesses (test_examples)."""
    yield
    import atexit

    from opentelemetry.instrumentation.mcp_resumption.telemetry.verdict_log import verdicts

    atexit.unregister(verdicts.write_summary)
