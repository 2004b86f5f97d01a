"""False ``id_regression`` per event-id scheme, over faithful resumes, and the
worst-case cost of parsing an id.

Each resume: a fresh session receives a stream of 1 to 12 events whose ids
follow the scheme (clock schemes tick 0 to 6 ms per event, so they tie), the
application consumes every one, the connection breaks, and the client
resumes with the last id; the server replays faithfully, strictly after the
cursor, 1 to 4 events of the same scheme.  The real Tracker (the rules the
plugin runs) judges every resume.  Every ``id_regression`` is false: the
server never reset anything, and every other gap too (listed).  With clock
ids two events can share an id; a replay that sends the other event of the
tie under the cursor's id is a tie, not a reuse: clock ids are opaque and
never ``id_reused``.

    PYTHONPATH=src python benchmarks/id_schemes.py            # 10^5 resumes per scheme
    PYTHONPATH=src python benchmarks/id_schemes.py --resumes 2000 --seed 7

Exits 1 if any scheme's false id_regression rate is not 0, or if an id of at
most the kept length takes longer than ``PARSE_BUDGET_US`` to parse.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

from opentelemetry.instrumentation.mcp_resumption.rules.event_ids import (
    MAX_ORDERED_ID_LENGTH,
    parse_event_id,
)
from opentelemetry.instrumentation.mcp_resumption.tracking.tracker import (
    MAX_KEPT_ID_BYTES,
    STREAMABLE_HTTP,
    Tracker,
)

SERVER = "127.0.0.1:8000"
PARSE_BUDGET_US = 20.0
_BASE36 = string.digits + string.ascii_lowercase
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

# A scheme: given a random source, an endless iterator of the ids one
# stream's consecutive events get.
Scheme = Callable[[random.Random], Iterator[str]]


def _counter(rng: random.Random) -> Iterator[int]:
    n = rng.randrange(0, 10**6)
    while True:
        yield n
        n += rng.choice((1, 1, 1, 2, 3))


def _clock_ms(rng: random.Random) -> Iterator[int]:
    """Milliseconds since the epoch, 0 to 6 ms apart: ties happen."""
    ms = rng.randrange(1_700_000_000_000, 1_800_000_000_000)
    while True:
        yield ms
        ms += rng.randrange(0, 7)


def _clock_seconds(rng: random.Random) -> Iterator[float]:
    """``time.time()``: float seconds, microseconds apart to milliseconds."""
    t = rng.uniform(1_700_000_000, 1_800_000_000)
    while True:
        yield t
        t += rng.choice((0.0, 1e-6, 3e-5, 4e-4, 2e-3, 0.05, 0.5))


def _token(rng: random.Random, alphabet: str, size: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(size))


def integers(rng):
    return (str(n) for n in _counter(rng))


def zero_padded(rng):
    return (f"{n:012d}" for n in _counter(rng))


def e_dash(rng):
    return (f"e-{n}" for n in _counter(rng))


def stream_underscore(rng):
    stream = _token(rng, _BASE36, 8)
    return (f"{stream}_{n}" for n in _counter(rng))


def float_seconds(rng):
    return (str(t) for t in _clock_seconds(rng))  # str(time.time())


def js_seconds(rng):
    # String(Date.now() / 1000): JavaScript prints the shortest round-trip
    # form, as Python's repr does: 1733212345.45, 1733212345.5
    return (repr(ms / 1000) for ms in _clock_ms(rng))


def js_milliseconds(rng):
    return (str(ms) for ms in _clock_ms(rng))  # String(Date.now())


def hex_counter(rng):
    stream = _token(rng, _BASE36, 6)
    return (f"{stream}-{n:x}" for n in _counter(rng))


def hex_suffix(rng):
    """A random hex tail, as ``secrets.token_hex(4)``: all digits 2.3 % of the time."""
    stream = _token(rng, _BASE36, 6)
    while True:
        yield f"{stream}-{_token(rng, '0123456789abcdef', 8)}"


def ts_sdk(rng):
    """The TypeScript SDK's InMemoryEventStore: <stream uuid>_<ms>_<8 base36>."""
    stream = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return (f"{stream}_{ms}_{_token(rng, _BASE36, 8)}" for ms in _clock_ms(rng))


def uuids(rng):
    while True:
        yield str(uuid.UUID(int=rng.getrandbits(128), version=4))


def ulids(rng):
    for ms in _clock_ms(rng):
        value = (ms << 80) | rng.getrandbits(80)
        yield "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


SCHEMES: dict[str, Scheme] = {
    "integers": integers,
    "zero-padded": zero_padded,
    "e-<n>": e_dash,
    "<stream>_<n>": stream_underscore,
    "float seconds": float_seconds,
    "JS seconds (Date.now()/1000)": js_seconds,
    "JS milliseconds (Date.now())": js_milliseconds,
    "hex counter": hex_counter,
    "hex suffix (random)": hex_suffix,
    "TS SDK <uuid>_<ms>_<rand>": ts_sdk,
    "UUIDs": uuids,
    "ULIDs": ulids,
}


def _message(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}})


def measure(scheme: Scheme, resumes: int, seed: int) -> tuple[Counter, Counter]:
    """(gap kinds, outcomes) over ``resumes`` faithful resumes."""
    rng = random.Random(seed)
    tracker = Tracker(max_streams=2000)
    gaps: Counter = Counter()
    outcomes: Counter = Counter()
    for index in range(resumes):
        session = f"s{index}"
        ids = scheme(rng)
        stream = tracker.open_stream(SERVER, STREAMABLE_HTTP, session_id=session)
        n = 0
        cursor = previous = ""
        for _ in range(rng.randint(1, 12)):
            cursor = next(ids)
            # As the SSE patch reports it: an id equal to the one before is the
            # parser's carry-over, no id of the event's own.
            tracker.event_received(stream, None if cursor == previous else cursor, _message(n))
            tracker.event_consumed(stream)
            previous = cursor
            n += 1
        tracker.stream_ended(stream, "a read error (RemoteProtocolError)")
        resumed = tracker.open_stream(
            SERVER, STREAMABLE_HTTP, session_id=session, last_event_id=cursor,
            request_session_id=session,
        )
        steps = [tracker.response(resumed, 200, session)]
        previous = ""
        for _ in range(rng.randint(1, 4)):
            event_id = next(ids)
            own = None if event_id == previous else event_id
            steps.append(tracker.event_received(resumed, own, _message(n)))
            tracker.event_consumed(resumed)
            previous = event_id
            n += 1
        steps.append(tracker.stream_ended(resumed, "the stream ended"))
        for step in steps:
            gaps.update(gap.kind.value for gap in step.gaps)
            if step.verdict is not None:
                outcomes[step.verdict.outcome.value] += 1
    return gaps, outcomes


def adversarial_ids() -> list[str]:
    """Ids of at most the kept length built to make a backtracking parser
    work: long runs of separators, letters, digits and their mixtures."""
    runs = []
    # The longest ids the parser still looks into, and the longest kept.
    for n in sorted({MAX_ORDERED_ID_LENGTH, MAX_KEPT_ID_BYTES}):
        for unit in ("-", "a", "1", "a-", "a1", "-1", "1-", "a-1", ".", "1.", "é", " ", "_:"):
            body = (unit * n)[: n - 1]
            runs += [body, body + "x", body + "5", "a" + body[1:], body[:-1] + "-5"]
        runs += ["9" * n, "e-" + "9" * (n - 2), "a" + "-" * (n - 2) + "x", "1.5" * (n // 3)]
        runs += ["a" + "-" * (n - 3) + "-x", "a1" * (n // 2 - 1) + "-", "a-" * (n // 2 - 1) + "-x"]
    runs += ["9" * 40, "f" * 32, "0" * 8 + "-" + "0" * 27, "1" * 13]
    # Those on which a backtracking "prefix + separator + counter" pattern took 60-270 us.
    runs += ["a" * 64 + "-" * 63 + "x", "1" * 127 + "x", "a" + "-" * 80 + "1" * 41 + "x"]
    runs += ["x" + "-:" * 63 + "7", " a" * 64]
    return [raw for raw in runs if len(raw) <= MAX_KEPT_ID_BYTES]


def worst_parse_us(ids: list[str], repeats: int = 200) -> tuple[float, str]:
    """The slowest id's best-of-5 time per parse, in microseconds."""
    worst, which = 0.0, ""
    for raw in ids:
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeats):
                parse_event_id(raw)
            best = min(best, (time.perf_counter() - started) / repeats)
        if best > worst:
            worst, which = best, raw
    return worst * 1e6, which


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resumes", type=int, default=100_000, help="faithful resumes per scheme")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    failed = False
    print(f"{args.resumes:,} faithful resumes per scheme, seed {args.seed}")
    print("| scheme | false id_regression | rate | other gaps | outcomes |")
    print("|---|---:|---:|---|---|")
    for name, scheme in SCHEMES.items():
        gaps, outcomes = measure(scheme, args.resumes, args.seed)
        regressions = gaps.pop("id_regression", 0)
        failed |= regressions > 0
        others = ", ".join(f"{kind} {count}" for kind, count in sorted(gaps.items())) or "-"
        shown = ", ".join(f"{kind} {count}" for kind, count in sorted(outcomes.items()))
        print(f"| {name} | {regressions} | {regressions / args.resumes:.5f} | {others} | {shown} |")
    worst, which = worst_parse_us(adversarial_ids())
    benign, _ = worst_parse_us(["e-104", "4821", "s-77:e-104"])
    print(f"parse_event_id: worst adversarial id {worst:.2f} µs ({which[:24]!r}...), "
          f"benign {benign:.2f} µs; budget {PARSE_BUDGET_US:g} µs")
    failed |= worst > PARSE_BUDGET_US
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
