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


def _plain_scenario(name: str) -> int:
    """The scenario as a user's own client would run: whatever instruments
    this process (opentelemetry-instrument) observes it; we only print the
    wire story."""
    import asyncio

    from .scenarios import get_scenario

    scenario = get_scenario(name)
    wire = asyncio.run(scenario.run())
    print(f"{name}: {scenario.happened}")
    print(f"  expected gaps: {', '.join(scenario.expected_gaps) or 'none'}")
    for n, attempt in enumerate(wire.resumes, 1):
        print(
            f"  resume {n}: Last-Event-ID {attempt.last_event_id_sent!r} -> {attempt.status}, "
            f"first event {attempt.event_ids[0] if attempt.event_ids else None!r}"
        )
    return 0


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
    demo.add_argument(
        "--prometheus-port",
        type=int,
        metavar="N",
        help="serve the metrics for a Prometheus scrape on 127.0.0.1:N",
    )
    demo.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep running (and the metrics endpoint up) this long after the last scenario",
    )
    client = commands.add_parser(
        "scenario",
        help="run one scenario's servers and client WITHOUT enabling the plugin, "
        "for use under opentelemetry-instrument",
    )
    client.add_argument("name")
    args = parser.parse_args(argv)

    if args.command == "engine":
        rows = engine_table.run()
        _print(rows, {}, as_json=args.json)
        return _status(rows)
    from . import scenarios

    known = [scenario.name for scenario in scenarios.all_scenarios()]
    asked = [args.name] if args.command == "scenario" else args.scenario
    unknown = sorted(set(asked) - set(known))
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(known)}")
    if args.command == "scenario":
        return _plain_scenario(args.name)
    if args.list:
        for scenario in scenarios.all_scenarios():
            print(f"{scenario.name}: {scenario.happened}")
        return 0
    from . import runner

    rows, _ = runner.run(
        args.scenario,
        prometheus_port=args.prometheus_port,
        hold=args.hold,
        # printed before the hold, so a scraper can tell the run is complete
        report=lambda rows, totals: _print(rows, totals, as_json=args.json),
    )
    return _status(rows)


def _print(rows: list[dict], totals: dict[str, dict[str, int]], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2), flush=True)
        return
    print(_table(rows))
    passed = sum(row["pass"] for row in rows)
    print(f"\n{passed} of {len(rows)} scenarios match their ground truth")
    for title, counts in totals.items():
        listed = ", ".join(f"{key} {value}" for key, value in sorted(counts.items()))
        print(f"{title}: {listed or 'none'}")
    sys.stdout.flush()


def _status(rows: list[dict]) -> int:
    return 0 if rows and all(row["pass"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
