"""cProfile one consumer (or one kind of POST) in one configuration against
the benchmark server.

    python benchmarks/profile_stream.py [NAME] [CONFIG] [--count N] [--top K]

NAME is a throughput consumer ("httpx-sse", "httpx2 EventSource", "mcp SDK")
or a request kind of run.py ("httpx2 POST→sse", ...); CONFIG one of its
configurations (default "ours").  Prints the functions by own time, and the
share of that time spent in the plugin (mcp_resumption and wrapt).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats

from configs import CONFIGS, configured
from consumers import POSTS, STREAMS, Sample
from run import sse_server


async def _measure(name: str, url: str, count: int) -> Sample:
    if name in STREAMS:
        return await STREAMS[name](url, count)
    post, json_route = POSTS[name]
    return await post(url + ("/json" if json_route else ""), count)


async def _profiled(name: str, config: str, count: int, profiler: cProfile.Profile) -> Sample:
    with sse_server() as url:
        await _measure(name, url, count)  # warm up, unprofiled
        with configured(config):
            profiler.enable()
            sample = await _measure(name, url, count)
            profiler.disable()
    return sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", default="httpx2 EventSource", choices=[*STREAMS, *POSTS])
    parser.add_argument("config", nargs="?", default="ours", choices=CONFIGS)
    parser.add_argument("--count", type=int, help="events (50,000), or requests (1,000)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    count = args.count or (50_000 if args.name in STREAMS else 1_000)
    profiler = cProfile.Profile()
    sample = asyncio.run(_profiled(args.name, args.config, count, profiler))
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    ours = sum(
        row[2]  # own time
        for (path, _, _), row in stats.stats.items()  # type: ignore[attr-defined]
        if "mcp_resumption" in path or "wrapt" in path
    )
    unit = "event" if args.name in STREAMS else "request"
    print(f"{args.name} / {args.config}: {sample.wall * 1e6:.1f} µs/{unit} under cProfile")
    print(f"own time in mcp_resumption + wrapt: {ours / total:.0%} of {total:.2f} s\n")
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
