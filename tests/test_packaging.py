"""What the distribution declares agrees with what the code and CI use:
the ``instruments-any`` extra is the loader's list (``_instruments_any``),
the server half declares the mcp it instruments as the ``server`` extra, at
the floor CI tests, and the pre-instrument hook that says a skip is
registered."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from packaging.requirements import Requirement

from opentelemetry.instrumentation.mcp_resumption.package import _instruments_any

ROOT = Path(__file__).resolve().parents[1]
DIST = "opentelemetry-instrumentation-mcp-resumption"


def extra(name: str) -> set[str]:
    found = set()
    for text in importlib.metadata.requires(DIST) or ():
        requirement = Requirement(text)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": name}):
            requirement.marker = None
            found.add(str(requirement))
    return found


def normal(requirements) -> set[str]:
    return {str(Requirement(r)) for r in requirements}


def test_instruments_any_is_the_extra():
    assert extra("instruments-any") == normal(_instruments_any)


def test_the_server_extra_declares_mcp_at_the_floor_ci_tests():
    [server] = extra("server")
    assert Requirement(server).name == "mcp"
    [floor] = re.findall(r"^mcp==(\S+)$", (ROOT / "scripts" / "lowest.txt").read_text(), re.M)
    assert Requirement(server).specifier.contains(floor)
    assert not Requirement(server).specifier.contains("1.29.9"), "the floor is the declared one"


def test_the_skip_notice_is_a_pre_instrument_hook():
    hooks = importlib.metadata.entry_points(group="opentelemetry_pre_instrument")
    [ours] = [hook for hook in hooks if hook.name == "mcp_resumption"]
    assert ours.value == "opentelemetry.instrumentation.mcp_resumption.skip_notice:report"
    assert callable(ours.load())
