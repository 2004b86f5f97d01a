"""The check behind "counts agree" (issue 38): every ``lost`` fate has its
``orphaned_request`` gap, leg by leg, in every metric reader a test used
(tests/loss_accounting.py, run by tests/conftest.py after each test).  Here:
that it fails on a disagreement, on real SDK readers, and that the readers
the loss tests use are the ones it looks at."""

from __future__ import annotations

import pytest

from helpers import Telemetry
from loss_accounting import BROKEN, GAPS, LOSS_READERS, check


def counters(telemetry: Telemetry):
    meter = telemetry.meter_provider.get_meter("opentelemetry.instrumentation.mcp_resumption")
    return meter.create_counter(BROKEN), meter.create_counter(GAPS)


def test_a_lost_call_without_its_gap_fails_the_check() -> None:
    telemetry = Telemetry()
    broken, gaps = counters(telemetry)
    broken.add(1, {"mcp.resumption.request.fate": "lost", "mcp.resumption.leg": "client_proxy"})
    # Its gap on the other leg is no gap of this loss.
    gaps.add(1, {"mcp.resumption.gap.kind": "orphaned_request",
                 "mcp.resumption.leg": "proxy_server"})
    with pytest.raises(AssertionError, match="client_proxy"):
        check([telemetry], settle=0)
    gaps.add(1, {"mcp.resumption.gap.kind": "orphaned_request",
                 "mcp.resumption.leg": "client_proxy"})
    with pytest.raises(AssertionError, match="proxy_server"):
        check([telemetry], settle=0)
    broken.add(1, {"mcp.resumption.request.fate": "lost", "mcp.resumption.leg": "proxy_server"})
    check([telemetry], settle=0)
    LOSS_READERS.remove(telemetry)  # checked here, not again after the test


def test_other_fates_and_gaps_are_not_counted_as_losses() -> None:
    telemetry = Telemetry()
    broken, gaps = counters(telemetry)
    broken.add(2, {"mcp.resumption.request.fate": "answered"})
    gaps.add(1, {"mcp.resumption.gap.kind": "id_regression"})
    check([telemetry], settle=0)


def test_the_readers_of_a_test_are_the_ones_checked() -> None:
    """Every Telemetry a test makes is in LOSS_READERS, so the conftest hook
    reads it after the test (a proxy, once closed: proxy_harness)."""
    telemetry = Telemetry()
    assert LOSS_READERS[-1] is telemetry
