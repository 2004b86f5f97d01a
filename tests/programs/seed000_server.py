"""An MCP SDK server whose store lost every cursor (seed 000's migrated
instance), run under ``opentelemetry-instrument`` by tests/test_server_auto.py:
nothing here enables the plugin.  It serves one session, receives one resume
with a cursor it does not know, prints the status it answered, and exits."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server_harness import RawSession, UuidStore, build_app, running

store = UuidStore()
store.lost = True
with running(build_app(store)) as server:
    raw = RawSession(server.url)
    raw.echo("hello")
    status, _, _ = raw.resume(raw.last_ids[0], timeout=2)
    raw.close()
print(f"resume answered {status}", flush=True)
