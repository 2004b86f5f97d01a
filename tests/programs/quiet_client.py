"""examples/zero-code/client_mcp2.py, run after a logging configuration of
the kind a program that wants no verdict lines writes: the first argument
names it (``logger``: dictConfig raising the verdicts logger to CRITICAL;
``disable``: logging.disable; ``configured``: basicConfig at its default
WARNING, which a clean run's INFO lines do not reach); the others are the
example's."""

from __future__ import annotations

import logging
import logging.config
import runpy
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "zero-code" / "client_mcp2.py"
VERDICTS = "opentelemetry.instrumentation.mcp_resumption.verdicts"

how = sys.argv.pop(1)
if how == "logger":
    logging.config.dictConfig({
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {VERDICTS: {"level": "CRITICAL"}},
    })
elif how == "disable":
    logging.disable(logging.CRITICAL)
elif how == "configured":
    logging.basicConfig()
else:
    raise SystemExit(f"unknown configuration {how!r}")
sys.argv[0] = str(EXAMPLE)
runpy.run_path(str(EXAMPLE), run_name="__main__")
