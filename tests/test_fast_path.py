"""The fast path (issue 44, "one pass per request"): an unbroken
``tools/call`` passes through the plugin in at most 80 calls of its
functions, counted as ``benchmarks/tools_call_costs.py --calls`` counts them
against the SDK's own server with an event store; and the shortcuts it takes
compute what the general paths compute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import clean_env

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# Issue 44's target for the plugin's function calls per unbroken tools/call.
MAX_CALLS_PER_TOOLS_CALL = 80


def test_an_unbroken_tools_call_passes_the_plugin_in_at_most_80_calls():
    """The installed SDK's client and server (this environment's: mcp 1.x
    over httpx-sse, or 2.x over httpx2), the call answered on its own
    unbroken POST stream; the count is sys.setprofile's ``call`` events of
    the plugin's frames (a coroutine's resumption is one too), over 60
    calls less a session of none."""
    server = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / "tools_call_costs.py"), "--serve"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=clean_env(),
    )
    try:
        port = int(server.stdout.readline())
        result = subprocess.run(
            [sys.executable, str(BENCHMARKS / "tools_call_costs.py"), "--calls", "60",
             f"http://127.0.0.1:{port}/mcp"],
            capture_output=True, text=True, timeout=300, check=False, env=clean_env(),
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert result.returncode == 0, result.stderr[-4000:]
    counted = json.loads(result.stdout.strip().splitlines()[-1])
    assert counted["per_call"] <= MAX_CALLS_PER_TOOLS_CALL, counted


_IDS = st.sampled_from(["e-1", "e-2", "e-3", "s-1:e-4", "é-5", "a\x00b", "", "x" * 40])
_STEPS = st.lists(
    st.tuples(_IDS, st.none() | st.integers(-(2**63), 2**63 - 1).filter(lambda d: d != -1),
              st.booleans()),
    max_size=40,
)


@given(_STEPS, st.booleans())
@settings(max_examples=300, deadline=None, derandomize=True)
def test_remember_packed_is_what_a_view_remembers(steps, as_tuple):
    """``remember_packed`` (the one event a stream no resume reads remembers,
    without a view) leaves a session's packed window as ``SeenWindow`` does:
    an event's id (``remember``), a marker's (``if event_id not in seen``),
    an id seen already (moved in the packed record), and where it declines
    (a NUL, a record kept as a tuple), the view's general path after it
    does the rest."""
    from opentelemetry.instrumentation.mcp_resumption.tracking.records import Session
    from opentelemetry.instrumentation.mcp_resumption.tracking.seen_window import (
        SeenWindow,
        remember_packed,
    )

    viewed, packed = Session("s", "a"), Session("s", "a")
    if as_tuple:  # a window holding an id with a NUL is kept as a tuple
        SeenWindow(viewed).remember("n\x00ul", 7)
        SeenWindow(packed).remember("n\x00ul", 7)
    for event_id, digest, marker in steps:
        if marker:
            seen = SeenWindow(viewed)
            if event_id not in seen:
                seen.remember(event_id, None)
            if not remember_packed(packed, event_id, None, if_new=True):
                seen = SeenWindow(packed)
                if event_id not in seen:
                    seen.remember(event_id, None)
        else:
            SeenWindow(viewed).remember(event_id, digest)
            if not remember_packed(packed, event_id, digest):
                SeenWindow(packed).remember(event_id, digest)
        assert (packed.seen_ids, packed.seen_digests) == (viewed.seen_ids, viewed.seen_digests)
        assert list(SeenWindow(packed).items()) == list(SeenWindow(viewed).items())
