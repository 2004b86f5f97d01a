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
