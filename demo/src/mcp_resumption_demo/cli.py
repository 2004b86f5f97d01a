# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The ``mcp-resumption`` command: the demo's three ways in."""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from .version import __version__

PROG = "mcp-resumption"
PLUGIN = "opentelemetry-instrumentation-mcp-resumption"

DESCRIPTION = """\
See opentelemetry-instrumentation-mcp-resumption catch silent event loss when
MCP clients resume SSE / streamable-HTTP streams with Last-Event-ID, without a
client or server of your own.  `mcp-resumption COMMAND --help` says more.
"""

DEMO_DESCRIPTION = """\
Run every scenario on real MCP servers on 127.0.0.1 (the installed MCP Python
SDK's; hand-written legacy HTTP+SSE servers and misbehaving streamable-HTTP
ones, as a load-balanced deployment has in the middle of a migration; and the
TypeScript MCP SDK's when node is installed) behind a router that severs and re-routes
streams, with the plugin enabled; print each scenario's written ground truth
beside what the plugin detected.  Exits 0 only if every scenario that ran
matches it.
"""

SCENARIO_DESCRIPTION = """\
Run one scenario's servers and client WITHOUT enabling the plugin, and print
what went over the wire: run it under opentelemetry-instrument, as you would
your own client, to see what the plugin reports.  `--list` lists the names.
"""

ENGINE_DESCRIPTION = """\
Play the demo's scenarios straight into the plugin's pure rules: no network,
milliseconds.  Prints the same table as `demo`.
"""

# The table fits a terminal this wide: long cells wrap, none is cut.
TABLE_WIDTH = 120

EPILOG = """\
examples:
  mcp-resumption demo
  mcp-resumption demo --scenario drain_race --json
  mcp-resumption demo --prometheus-port 9464 --hold 600
  OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=console OTEL_LOGS_EXPORTER=console \\
    opentelemetry-instrument mcp-resumption scenario drain_race

(Every exporter is set: their default, OTLP over gRPC, is not installed with
the demo, and without it opentelemetry-instrument loads no plugin at all.)
"""


def _versions() -> str:
    """This demo's version, and the plugin's and MCP SDK's it runs with."""
    found = []
    for name in (PLUGIN, "mcp"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return f"{PROG} {__version__} ({', '.join(found)})"


def _error(message: str) -> int:
    """One line on stderr, and the exit status of a usage error."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return 2


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (1-65535): {port}")
    return port


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not seconds >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text}")
    return seconds


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser, and each subcommand's (for its own usage in an
    error)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_versions())
    # Not required here: a missing command is reported after the unknown
    # options, so that `mcp-resumption --bogus` names --bogus.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter
    engine = commands.add_parser(
        "engine",
        help="play the demo's scenarios straight into the pure rules",
        description=ENGINE_DESCRIPTION,
        formatter_class=raw,
    )
    engine.add_argument("--json", action="store_true", help="print one JSON list")
    demo = commands.add_parser(
        "demo",
        help="run the scenarios on real MCP servers on 127.0.0.1, plugin enabled",
        description=DEMO_DESCRIPTION,
        formatter_class=raw,
    )
    demo.add_argument("--json", action="store_true", help="print one JSON list")
    demo.add_argument("--list", action="store_true", help="list the scenarios and exit")
    demo.add_argument(
        "--scenario", action="append", default=[], metavar="NAME", help="run only NAME (repeatable)"
    )
    demo.add_argument(
        "--prometheus-port",
        type=_port,
        metavar="N",
        help="serve the metrics for a Prometheus scrape on 127.0.0.1:N",
    )
    demo.add_argument(
        "--hold",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="with --prometheus-port: keep the metrics endpoint up this long after the table",
    )
    client = commands.add_parser(
        "scenario",
        help="run one scenario's servers and client WITHOUT enabling the plugin, "
        "for use under opentelemetry-instrument",
        description=SCENARIO_DESCRIPTION,
        formatter_class=raw,
    )
    client.add_argument("name", nargs="?", help="the scenario to run (see --list)")
    client.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser, {"engine": engine, "demo": demo, "scenario": client}


def _kinds(kinds: Sequence[str], width: int) -> list[str]:
    """Gap kinds joined by commas, wrapped at commas to ``width``."""
    lines: list[str] = []
    for n, kind in enumerate(kinds):
        item = kind + ("," if n < len(kinds) - 1 else "")
        if lines and len(lines[-1]) + len(item) <= width:
            lines[-1] += item
        else:
            lines.append(item)
    return lines or ["-"]


def _table(rows: list[dict]) -> str:
    """One block per row: the short columns on its first lines (gap kinds
    wrapped at commas), then what happened, wrapped under it.  Nothing is
    cut, and no line is wider than TABLE_WIDTH."""
    headers = ("scenario", "expected", "detected", "outcome", "pass")
    fixed = [
        max(len(headers[0]), *(len(row["scenario"]) for row in rows)),
        0,
        0,
        max(len(headers[3]), *(len(row["outcome"]) for row in rows)),
        max(len(headers[4]), *(len(_verdict(row)) for row in rows)),
    ]
    kinds = [row[column] for row in rows for column in ("expected", "detected")]
    longest_kind = max([len(headers[1]), *(len(kind) + 1 for row in kinds for kind in row)])
    whole = max([len(headers[1]), *(len(",".join(row)) for row in kinds)])
    room = TABLE_WIDTH - fixed[0] - fixed[3] - fixed[4] - 2 * (len(headers) - 1)
    fixed[1] = fixed[2] = max(longest_kind, min(whole, room // 2))
    widths = fixed
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        columns = [
            [row["scenario"]],
            _kinds(row["expected"], widths[1]),
            _kinds(row["detected"], widths[2]),
            [row["outcome"]],
            [_verdict(row)],
        ]
        for n in range(max(len(column) for column in columns)):
            cells = [column[n] if n < len(column) else "" for column in columns]
            lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
        lines += textwrap.wrap(
            row["happened"], TABLE_WIDTH, initial_indent="    ", subsequent_indent="    "
        )
    return "\n".join(lines)


def _verdict(row: dict) -> str:
    if row.get("skipped"):
        return f"skipped: {row['skipped']}"
    return "PASS" if row["pass"] else "FAIL"


def _plain_scenario(name: str) -> int:
    """The scenario as a user's own client would run: whatever instruments
    this process (opentelemetry-instrument) observes it; we only print the
    wire story."""
    import asyncio

    from .scenarios import get_scenario

    scenario = get_scenario(name)
    if scenario.prepare is not None and (reason := scenario.prepare()) is not None:
        return _error(f"scenario {name} cannot run here: {reason}")
    wire = asyncio.run(scenario.run())
    print(f"{name}: {scenario.happened}")
    print(f"  expected gaps: {', '.join(scenario.expected_gaps) or 'none'}")
    for n, attempt in enumerate(wire.resumes, 1):
        print(
            f"  resume {n}: Last-Event-ID {attempt.last_event_id_sent!r} -> {attempt.status}, "
            f"first event {attempt.event_ids[0] if attempt.event_ids else None!r}"
        )
    return 0


def _scenario_names() -> list[str] | None:
    """The scenarios' names without importing them (which imports the MCP
    SDK, servers and clients: about a second): read from the modules'
    source, the ``name=`` of each ``Scenario(...)``, in their order.  None
    if the source cannot be read that way (then the caller imports)."""
    try:
        spec = importlib.util.find_spec(f"{__package__}.scenarios")
        if spec is None or spec.origin is None:
            return None
        root = Path(spec.origin)
        tree = ast.parse(root.read_text())
        sources = [tree]
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign | ast.Assign) and "SCENARIO_MODULES" in ast.dump(
                node.targets[0] if isinstance(node, ast.Assign) else node.target
            ):
                for module in ast.literal_eval(node.value):
                    path = root.with_name(module.rsplit(".", 1)[1] + ".py")
                    sources.append(ast.parse(path.read_text()))
        names = []
        for source in sources:
            for node in ast.walk(source):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Scenario":
                    for keyword in node.keywords:
                        if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                            names.append(keyword.value.value)
        return names or None
    except (OSError, SyntaxError, ValueError, ImportError):
        return None


def _list_scenarios() -> int:
    from . import scenarios

    for scenario in scenarios.all_scenarios():
        print(f"{scenario.name}: {scenario.happened}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, subparsers = _parser()
    args, unknown_options = parser.parse_known_args(argv)
    if unknown_options:
        # The subcommand's own usage, naming what it does not know.
        where = subparsers.get(args.command or "", parser)
        where.error(f"unrecognized arguments: {' '.join(unknown_options)}")
    if args.command is None:
        parser.error(f"a COMMAND is required: {', '.join(subparsers)}")
    if args.command == "scenario":
        if args.list:
            return _list_scenarios()
        if args.name is None:
            subparsers["scenario"].error("a scenario NAME is required (--list lists them)")
        # An unknown name fails at once, before the scenarios' imports.
        names = _scenario_names()
        if names is not None and args.name not in names:
            return _error(f"unknown scenario {args.name}; known: {', '.join(names)}")

    if args.command == "engine":
        from . import engine_table

        rows = engine_table.run()
        _print(rows, {}, as_json=args.json)
        return _status(rows)
    if args.command == "demo" and args.hold and args.prometheus_port is None:
        # Without an endpoint there is nothing to hold up: refuse rather than
        # sleep for nothing.
        return _error("--hold needs --prometheus-port (it keeps the metrics endpoint up)")
    from . import scenarios

    known = [scenario.name for scenario in scenarios.all_scenarios()]
    asked = [args.name] if args.command == "scenario" else args.scenario
    unknown = sorted(set(asked) - set(known))
    if unknown:
        return _error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(known)}")
    if args.command == "scenario":
        return _plain_scenario(args.name)
    if args.list:
        return _list_scenarios()
    from . import runner

    try:
        rows, _ = runner.run(
            args.scenario,
            prometheus_port=args.prometheus_port,
            hold=args.hold,
            # printed before the hold, so a scraper can tell the run is complete
            report=lambda rows, totals: _print(rows, totals, as_json=args.json),
        )
    except runner.DemoError as error:
        return _error(str(error))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return _status(rows)


def _print(rows: list[dict], totals: dict[str, dict[str, int]], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2), flush=True)
        return
    print(_table(rows))
    ran = [row for row in rows if not row.get("skipped")]
    passed = sum(bool(row["pass"]) for row in ran)
    print(f"\n{passed} of {len(ran)} scenarios match their ground truth")
    skipped = [row for row in rows if row.get("skipped")]
    if skipped:
        reasons = sorted({row["skipped"] for row in skipped})
        print(f"{len(skipped)} skipped ({'; '.join(reasons)})")
    for title, counts in totals.items():
        listed = ", ".join(f"{key} {value}" for key, value in sorted(counts.items()))
        print(f"{title}: {listed or 'none'}")
    sys.stdout.flush()


def _status(rows: list[dict]) -> int:
    """0 when something ran and every row that ran matched its ground truth."""
    ran = [row for row in rows if not row.get("skipped")]
    return 0 if ran and all(row["pass"] for row in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
