# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""``mcp-resumption``: the command-line entry point."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import engine_table


def _table(rows: list[dict]) -> str:
    headers = ("scenario", "happened", "expected", "detected", "outcome", "pass")
    cells = [
        [
            row["scenario"],
            row["happened"][:60] + ("…" if len(row["happened"]) > 60 else ""),
            ",".join(row["expected"]) or "-",
            ",".join(row["detected"]) or "-",
            row["outcome"],
            "PASS" if row["pass"] else "FAIL",
        ]
        for row in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp-resumption", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    engine = commands.add_parser(
        "engine", help="play the seeds' scenarios straight into the continuity engine"
    )
    engine.add_argument("--json", action="store_true", help="print one JSON list")
    demo = commands.add_parser(
        "demo", help="run the seed scenarios on real MCP servers on 127.0.0.1, plugin enabled"
    )
    demo.add_argument("--json", action="store_true", help="print one JSON list")
    demo.add_argument("--list", action="store_true", help="list the scenarios and exit")
    demo.add_argument(
        "--scenario", action="append", default=[], metavar="NAME", help="run only NAME"
    )
    args = parser.parse_args(argv)

    if args.command == "engine":
        rows = engine_table.run()
    else:
        from . import runner, scenarios

        if args.list:
            for scenario in scenarios.all_scenarios():
                print(f"{scenario.name}: {scenario.happened}")
            return 0
        known = {scenario.name for scenario in scenarios.all_scenarios()}
        unknown = sorted(set(args.scenario) - known)
        if unknown:
            parser.error(f"unknown scenario {', '.join(unknown)}; see --list")
        rows = runner.run(args.scenario)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows))
        passed = sum(row["pass"] for row in rows)
        print(f"\n{passed} of {len(rows)} scenarios match their ground truth")
    return 0 if all(row["pass"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
