"""Where the plugin's instructions per ``tools/call`` go, by module or by
function (issue 44: name each remaining cost by function and by instructions):

    python3 benchmarks/attribute_instructions.py                          # by module, ~5 min
    python3 benchmarks/attribute_instructions.py --by function --n 10     # ~8 min
    python3 benchmarks/attribute_instructions.py --answer JSON

A session of the installed MCP SDK's client against ``sse_server.py`` (one
``tools/call`` answered by SSE, or by JSON), the plugin alone with its
defaults (``tools_call_costs.plugin_alone``), under callgrind with its
instrumentation off until the calls: after 5 calls of warm-up, a loop of N
and one of 2N calls, each call's share the difference over N.  What is
counted is switched by ``cgmon.c`` on ``sys.monitoring``'s function events
(Python 3.12 or later): in one run, only the instructions spent while the
innermost of the plugin's frames is the bucket's (its module, or its
function), with what it calls of the standard library and of OpenTelemetry
(the SDK's metric record counts for the function that records), and never
the HTTP client's, the MCP SDK's or asyncio's code, even under the plugin's
frames.  One run per bucket; ``all`` counts every frame of the plugin, and
its difference from the sum of the buckets is what the switch itself costs.
Garbage collection is off during the loops, so a collection is charged to
nobody.  Each bucket's count is its *self* cost: a module's rows add up to
``all``.

The extension is compiled each run with ``cc`` against the measured Python's
headers and valgrind's ``callgrind.h`` (``apt-get install valgrind``, whose
package carries it).  ``--python`` (default ``.venv-mcp2/bin/python``) must
be 3.12 or later: 3.11's ``sys.setprofile`` reports every C call too, and
the interpreter's own price of reporting them tripled the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = HERE / "cgmon.c"
# Never counted, even under the plugin's frames: the work the plugin wraps.
OUTSIDE = ("httpx", "httpcore", "h11", "anyio", "mcp/", "pydantic", "sniffio", "httpx_sse",
           "starlette", "typing_extensions")
OUTSIDE_STDLIB = ("asyncio", "selectors", "socket", "ssl")
WARM_UP = 5


# ------------------------------------------------------------ the worker


def _classifier(bucket: str):
    import opentelemetry.instrumentation.mcp_resumption as plugin

    package = os.path.dirname(plugin.__file__) + os.sep
    paths = sysconfig.get_paths()
    outside = tuple(os.path.join(paths["purelib"], name) for name in OUTSIDE) + tuple(
        os.path.join(paths["stdlib"], name) for name in OUTSIDE_STDLIB
    )

    def classify(code) -> int:
        filename = code.co_filename
        if filename.startswith(package):
            if bucket == "all":
                return 1
            module = filename[len(package):]
            if ":" in bucket:
                return 1 if f"{module}:{code.co_qualname}" == bucket else 2
            return 1 if module == bucket else 2
        if filename.startswith(outside):
            return 0
        return 3

    return classify


async def _session(url: str, n: int, measured, bucket: str) -> None:
    from consumers import mcp_session

    async with mcp_session(url) as call_tool:
        for _ in range(WARM_UP):
            await call_tool("stream", {"n": 0})
        gc.collect()
        gc.freeze()
        gc.disable()
        for count in (n, 2 * n):
            with measured(f"{bucket}|{count}"):
                for _ in range(count):
                    await call_tool("stream", {"n": 0})
        gc.enable()


def worker(bucket: str, n: int, url: str, extension_dir: str) -> None:
    sys.path.insert(0, extension_dir)
    import cgmon  # the compiled switch
    from tools_call_costs import plugin_alone

    monitoring = sys.monitoring
    events = monitoring.events
    tool = monitoring.PROFILER_ID
    classify = _classifier(bucket)

    @contextlib.contextmanager
    def measured(name: str):
        monitoring.use_tool_id(tool, "attribute_instructions")
        mask = 0
        for callback, kinds in ((cgmon.on_start, (events.PY_START, events.PY_RESUME,
                                                  events.PY_THROW)),
                                (cgmon.on_return, (events.PY_RETURN, events.PY_YIELD,
                                                   events.PY_UNWIND))):
            for event in kinds:
                monitoring.register_callback(tool, event, callback)
                mask |= event
        cgmon.start(classify)
        monitoring.set_events(tool, mask)
        try:
            yield
        finally:
            monitoring.set_events(tool, 0)
            cgmon.stop(name)
            monitoring.free_tool_id(tool)

    with plugin_alone():
        asyncio.run(_session(url, n, measured, bucket))


# ------------------------------------------------------------ the runner


def _compile(python: str, directory: str) -> None:
    probe = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['include']);"
                       "print(sysconfig.get_config_var('EXT_SUFFIX'))"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    include, suffix = probe
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{include}", "-o",
                    os.path.join(directory, "cgmon" + suffix), str(SOURCE)], check=True)


def _buckets(python: str, url: str, by: str) -> list[str]:
    """The plugin's modules (or functions) a tools/call enters, counted
    natively with sys.setprofile, most called first."""
    from instructions import _env as plugin_env

    script = f"""
import asyncio, collections, os, sys
sys.path.insert(0, {str(HERE)!r})
import opentelemetry.instrumentation.mcp_resumption as plugin
from tools_call_costs import plugin_alone
from instructions import _tools_calls
package = os.path.dirname(plugin.__file__) + os.sep
seen = collections.Counter()
def profile(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_filename.startswith(package):
        module = code.co_filename[len(package):]
        seen[module if {by!r} == "module" else module + ":" + code.co_qualname] += 1
with plugin_alone():
    asyncio.run(_tools_calls({url!r}, 2))
    sys.setprofile(profile)
    asyncio.run(_tools_calls({url!r}, 20))
    sys.setprofile(None)
for name, count in seen.most_common():
    if count >= 20:
        print(name)
"""
    out = subprocess.run([python, "-c", script], check=True, capture_output=True, text=True,
                         env=plugin_env()).stdout
    return out.split()


def _count(valgrind: str, python: str, bucket: str, n: int, url: str, directory: str) -> float:
    from instructions import _env as plugin_env

    out = Path(tempfile.mkdtemp(prefix="attribute-", dir=directory))
    subprocess.run(
        [valgrind, "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
         f"--callgrind-out-file={out / 'callgrind.out'}", python, str(Path(__file__).resolve()),
         "--worker", bucket, str(n), url, directory],
        check=True, env=plugin_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    totals: dict[int, int] = {}
    for dump in out.glob("callgrind.out.*"):
        text = dump.read_text()
        trigger = re.search(r"^desc: Trigger: Client Request: .*\|(\d+)$", text, re.M)
        total = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and total:
            totals[int(trigger.group(1))] = int(total.group(1))
    return (totals[2 * n] - totals[n]) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=str(ROOT / ".venv-mcp2" / "bin" / "python"))
    parser.add_argument("--answer", choices=("SSE", "JSON"), default="SSE")
    parser.add_argument("--by", choices=("module", "function"), default="module")
    parser.add_argument("--n", type=int, default=20, help="calls in the shorter loop")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--buckets", nargs="+", metavar="BUCKET",
                        help="these alone (a module path as `patches/http.py`, or"
                             " `module:qualname`), not the ones a tools/call enters")
    parser.add_argument("--worker", nargs=4, metavar=("BUCKET", "N", "URL", "DIR"))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.worker:
        bucket, n, url, directory = args.worker
        worker(bucket, int(n), url, directory)
        return
    import concurrent.futures

    from instructions import ensure_valgrind
    from operation_instructions import _Server

    valgrind = ensure_valgrind()
    started = time.time()
    with tempfile.TemporaryDirectory() as directory:
        _compile(args.python, directory)
        server = _Server([args.python, str(HERE / "sse_server.py")], stdin=subprocess.PIPE)
        try:
            url = server.base + ("/json" if args.answer == "JSON" else "/mcp")
            buckets = ["all", *(args.buckets or _buckets(args.python, url, args.by))]
            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                counts = dict(zip(buckets, pool.map(
                    lambda bucket: _count(valgrind, args.python, bucket, args.n, url, directory),
                    buckets)))
        finally:
            server.close()
    version = subprocess.run([args.python, "-c", "import sys, importlib.metadata as m;"
                              "print(sys.version.split()[0], m.version('mcp'),"
                              " m.version('opentelemetry-sdk'))"],
                             capture_output=True, text=True).stdout.split()
    total = counts.pop("all")
    print(f"\nPython {version[0]}, mcp {version[1]}, opentelemetry-sdk {version[2]}; "
          f"a tools/call answered by {args.answer}; {time.time() - started:.0f} s\n")
    print(f"| {args.by} | instructions per tools/call | share |")
    print("|---|---:|---:|")
    for bucket, count in sorted(counts.items(), key=lambda item: -item[1]):
        print(f"| `{bucket}` | {count:,.0f} | {count / total:.1%} |")
    print(f"| all of the plugin's frames | {total:,.0f} | |")
    rest = total - sum(counts.values())
    print(f"| all less the rows' sum: the switch's own tail, frames in no row | {rest:,.0f} | |")


if __name__ == "__main__":
    main()
