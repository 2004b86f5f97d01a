"""The tasks handed to the fleet (issue 37), in a real redis-server, through
the store alone: two stores are two processes of a fleet.  A hand-over
writes no raw task id or server and expires; a handed task is taken by one
process only (a follower, or the sweep that finds it due and counts it
``abandoned``), however many race; a sweep before the task is due takes
nothing and comes back at its time on its own; Redis down makes the
hand-over and the take fall back within a bound, counted."""

from __future__ import annotations

import threading
import time

import pytest

from opentelemetry.instrumentation.mcp_resumption.rules.task_handover import HandedTask
from opentelemetry.instrumentation.mcp_resumption.shared.redis_state import KEY_PREFIX, RedisStore
from opentelemetry.instrumentation.mcp_resumption.shared.redis_tasks import HAND_OVER_WAIT

pytest.importorskip("redis")

KEY = b"a fleet's shared key"
SERVER = "http://127.0.0.1:8123/mcp"
TASK = "task-7c1d4e0f9a2b4c3d8e5f6a7b"  # a capability: never in Redis as it is
WAIT_S = 10.0  # bounds a failing wait, never what a passing one waits for


@pytest.fixture
def fresh(redis_server):
    if redis_server.process.poll() is not None:
        redis_server.start()
    redis_server.client().flushall()
    return redis_server


class Fallbacks(list):
    def __call__(self, operation: str, reason: str) -> None:
        self.append((operation, reason))


class Abandoned:
    """The store's ``on_abandoned``: what this process counted."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, HandedTask]] = []
        self.event = threading.Event()

    def __call__(self, task_hash: str, facts: HandedTask) -> None:
        self.seen.append((task_hash, facts))
        self.event.set()


OPENED: list[RedisStore] = []


@pytest.fixture(autouse=True)
def close_stores():
    yield
    while OPENED:
        OPENED.pop().close()


def store(url: str, **kwargs) -> RedisStore:
    kwargs.setdefault("on_abandoned", Abandoned())
    opened = RedisStore(url, KEY, kwargs.pop("fallbacks", Fallbacks()), **kwargs)
    OPENED.append(opened)
    return opened


def facts(ttl_s: float | None = 60.0, alive: float | None = None) -> HandedTask:
    now = time.time()
    return HandedTask(
        tool="slow_report", form="2026-07-28", alive_wall=now if alive is None else alive,
        ttl_s=ttl_s, received_wall=now - 2, polls=3, cancel_acked=False, status="working",
        tag=("streamable_http", "127.0.0.1", 8123), handed_at=now,
    )  # fmt: skip


def take(shared: RedisStore, task: str = TASK) -> HandedTask | None:
    found: list = []
    done = threading.Event()
    shared.adopt(SERVER, task, lambda taken: (found.append(taken), done.set()))
    assert done.wait(WAIT_S), "the take never answered"
    return found[0]


def test_a_hand_over_writes_no_raw_task_id_and_every_key_expires(fresh):
    first = store(fresh.url)
    assert first.hand_over([(SERVER, TASK, facts())]).written(HAND_OVER_WAIT)
    client = fresh.client()
    keys = client.keys("*")
    assert sorted(k.decode().split(":")[2] for k in keys) == ["t", "th"], keys
    for key in keys:
        assert client.ttl(key) > 0, key
        dumped = key + (
            b"".join(b"".join(kv) for kv in client.hgetall(key).items())
            if client.type(key) == b"hash" else client.get(key)
        )  # fmt: skip
        assert TASK.encode() not in dumped and b"8123/mcp" not in dumped, dumped
    # What the next process needs is there: the tool, the TTL, the last moment alive.
    taken = take(store(fresh.url))
    assert (taken.tool, taken.ttl_s, taken.polls) == ("slow_report", 60.0, 3)
    assert taken.tag == ("streamable_http", "127.0.0.1", 8123)


def test_a_handed_task_is_taken_by_one_process_however_many_race(fresh):
    assert store(fresh.url).hand_over([(SERVER, TASK, facts())]).written(HAND_OVER_WAIT)
    followers = [store(fresh.url) for _ in range(4)]
    found: list = []
    threads = [threading.Thread(target=lambda s=s: found.append(take(s))) for s in followers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert len(found) == 4
    assert sum(taken is not None for taken in found) == 1, found
    assert fresh.client().keys(f"{KEY_PREFIX}:t:*") == []
    assert fresh.client().hlen(f"{KEY_PREFIX}:th") == 0
    # A task nobody handed over (its process is alive, or it was never one): nothing.
    assert take(followers[0], "task-never-handed") is None


def test_a_task_nobody_follows_is_abandoned_once_at_its_time(fresh):
    """Due once its TTL (0.6 s from the last moment alive) ran out and the
    reissue window (0.3 s) passed; two processes sweep at once, before it is
    due: neither takes it then, each comes back on its own, one counts it."""
    first = store(fresh.url, lease=0.3)
    handed_at = time.time()
    assert first.hand_over([(SERVER, TASK, facts(ttl_s=0.6))]).written(HAND_OVER_WAIT)
    sweepers = [store(fresh.url, lease=0.3) for _ in range(2)]
    for sweeper in sweepers:
        sweeper.sweep_tasks()
    for sweeper in sweepers:
        assert sweeper.flush()
    assert all(not s._on_abandoned.seen for s in sweepers), "not before it is due"
    assert fresh.client().keys(f"{KEY_PREFIX}:t:*"), "still handed"
    assert any(s._on_abandoned.event.wait(WAIT_S) for s in sweepers)
    counted = [s._on_abandoned.seen for s in sweepers]
    assert sorted(len(seen) for seen in counted) == [0, 1], counted
    (task_hash, taken), = [seen[0] for seen in counted if seen]
    assert time.time() - handed_at >= 0.6
    assert taken.tool == "slow_report" and task_hash == first.key_hash(TASK)
    for sweeper in sweepers:  # the other comes back too, and finds nothing
        sweeper.sweep_tasks()
        assert sweeper.flush()
    assert sorted(len(s._on_abandoned.seen) for s in sweepers) == [0, 1]
    assert fresh.client().keys(f"{KEY_PREFIX}:t:*") == []


def test_the_abandon_time_is_the_ttl_within_the_reissue_window_and_the_cap():
    from opentelemetry.instrumentation.mcp_resumption.rules.task_handover import abandon_due

    expired_long_ago = facts(ttl_s=1.0, alive=400.0)
    expired_long_ago.handed_at = 1000.0
    assert abandon_due(expired_long_ago, 5.0, 3600) == 1005.0
    endless = facts(ttl_s=None)
    endless.handed_at = 1000.0
    assert abandon_due(endless, 5.0, 3600) == 4600.0
    running = facts(ttl_s=60.0, alive=1010.0)
    running.handed_at = 1000.0
    assert abandon_due(running, 5.0, 3600) == 1070.0


@pytest.mark.parametrize("fault", ["stopped", "killed"])
def test_redis_down_the_hand_over_and_the_take_fall_back_bounded_and_counted(fresh, fault):
    fallbacks = Fallbacks()
    shared = store(fresh.url, fallbacks=fallbacks, cooldown=0.2)
    assert shared.hand_over([(SERVER, "task-before", facts())]).written(HAND_OVER_WAIT)
    fresh.stop() if fault == "stopped" else fresh.kill()
    started = time.monotonic()
    outcome = shared.hand_over([(SERVER, TASK, facts())])
    assert not outcome.written(HAND_OVER_WAIT)  # the exit counts them itself
    assert time.monotonic() - started < HAND_OVER_WAIT + 0.5
    assert take(shared, "task-before") is None  # not followed, as without shared state
    # A sweep Redis cannot make is tried again after the cooldown, not at once
    # (the writer thread would spin on a due sweep while the breaker is open).
    shared.sweep_tasks()
    assert shared.flush()
    assert shared._task_sweep_at is not None and shared._task_sweep_at > time.monotonic()
    assert ("write", "connection") in fallbacks or ("write", "timeout") in fallbacks
    assert {reason for _, reason in fallbacks} <= {"connection", "timeout", "breaker_open"}
    fresh.start()
    # A hand-over the exit withdrew is never written later.
    assert shared.flush()
    assert fresh.client().keys(f"{KEY_PREFIX}:t:*") == []


# Held tasks (issue 45): a task's record is written under its process's lease
# when its handle comes, so that a process killed while it follows the task
# (no exit, no hand-over) still leaves it to the fleet.  A closed store stands
# for the killed process here: its writer thread stops, its lease is renewed
# no more, and no hand-over is written.


def lease_gone(redis_server, store_: RedisStore) -> None:
    """Wait until Redis let the process's lease lapse (its own truth)."""
    deadline = time.monotonic() + WAIT_S
    while redis_server.client().exists(f"{KEY_PREFIX}:w:{store_.writer}"):
        assert time.monotonic() < deadline, "the lease never lapsed"
        time.sleep(0.02)


def test_a_held_task_writes_no_raw_id_expires_and_is_released_at_its_fate(fresh):
    holder = store(fresh.url)
    holder.hold_task(SERVER, TASK, facts())
    assert holder.flush()
    client = fresh.client()
    keys = client.keys("*")
    assert sorted(k.decode().split(":")[2] for k in keys) == ["t", "th", "w"], keys
    for key in keys:
        assert client.ttl(key) > 0, key
        dumped = key + (
            b"".join(b"".join(kv) for kv in client.hgetall(key).items())
            if client.type(key) == b"hash" else client.get(key)
        )  # fmt: skip
        assert TASK.encode() not in dumped and b"8123/mcp" not in dumped, dumped
    assert list(client.hgetall(f"{KEY_PREFIX}:th").values()) == [f"w:{holder.writer}".encode()]
    holder.release_task(SERVER, TASK)
    assert holder.flush()
    assert client.keys(f"{KEY_PREFIX}:t*") == []


def test_a_held_task_is_taken_only_once_its_process_is_gone(fresh):
    holder = store(fresh.url, lease=0.3)
    holder.hold_task(SERVER, TASK, facts())
    assert holder.flush()
    follower = store(fresh.url, lease=0.3)
    # Its process follows it still (the lease is renewed): not taken, not touched.
    assert take(follower, TASK) is None
    assert len(fresh.client().keys(f"{KEY_PREFIX}:t:*")) == 1
    assert fresh.client().hlen(f"{KEY_PREFIX}:th") == 1
    holder.close()  # killed: no hand-over
    lease_gone(fresh, holder)
    others = [store(fresh.url, lease=0.3) for _ in range(3)]
    found: list = []
    threads = [threading.Thread(target=lambda s=s: found.append(take(s))) for s in others]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert sum(taken is not None for taken in found) == 1, found
    (taken,) = [t for t in found if t is not None]
    assert (taken.tool, taken.polls) == ("slow_report", 3)
    assert fresh.client().keys(f"{KEY_PREFIX}:t*") == []


def test_a_dead_processs_held_task_is_abandoned_once_by_the_sweepers(fresh):
    """Its TTL (0.1 s) ran out long ago: due a reissue window (0.3 s) after
    a sweep found the lease lapsed; two sweepers race, one counts it."""
    holder = store(fresh.url, lease=0.3)
    holder.hold_task(SERVER, TASK, facts(ttl_s=0.1))
    assert holder.flush()
    sweepers = [store(fresh.url, lease=0.3) for _ in range(2)]
    for sweeper in sweepers:  # alive yet: they come back a lease later
        sweeper.sweep_tasks()
        assert sweeper.flush()
    assert all(not s._on_abandoned.seen for s in sweepers)
    assert all(s._task_sweep_at is not None for s in sweepers)
    holder.close()
    lease_gone(fresh, holder)
    assert any(s._on_abandoned.event.wait(WAIT_S) for s in sweepers)
    for sweeper in sweepers:  # the other comes back too, and finds nothing
        sweeper.sweep_tasks()
        assert sweeper.flush()
    counted = [s._on_abandoned.seen for s in sweepers]
    assert sorted(len(seen) for seen in counted) == [0, 1], counted
    ((task_hash, abandoned),) = [seen[0] for seen in counted if seen]
    assert task_hash == holder.key_hash(TASK) and abandoned.tool == "slow_report"
    assert fresh.client().keys(f"{KEY_PREFIX}:t*") == []


def test_redis_down_a_hold_and_a_release_never_block_and_are_written_once_it_answers(fresh):
    fallbacks = Fallbacks()
    holder = store(fresh.url, fallbacks=fallbacks, cooldown=0.2, lease=0.6)
    fresh.stop()
    started = time.monotonic()
    holder.hold_task(SERVER, TASK, facts())
    holder.hold_task(SERVER, "task-ended", facts())
    holder.release_task(SERVER, "task-ended")
    assert time.monotonic() - started < 0.05  # queued: the caller never waits
    assert holder.flush()
    assert fallbacks, "counted"
    fresh.start()
    holder.hold_task(SERVER, "task-later", facts())  # the next round trip
    deadline = time.monotonic() + WAIT_S
    while fresh.client().hlen(f"{KEY_PREFIX}:th") < 2:
        assert time.monotonic() < deadline, fresh.client().hgetall(f"{KEY_PREFIX}:th")
        time.sleep(0.02)
    assert holder.flush()
    index = fresh.client().hgetall(f"{KEY_PREFIX}:th")
    assert sorted(index) == sorted(
        f"{holder.key_hash(SERVER)}:{holder.key_hash(task)}".encode()
        for task in (TASK, "task-later")
    ), index
