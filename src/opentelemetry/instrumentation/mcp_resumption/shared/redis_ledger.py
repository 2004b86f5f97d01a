# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The in-flight ledger in Redis: the requests each process awaits answers
to, so that the requests of a process that dies before their fates are
counted lost once, by another.

``InFlightLedger`` is a base of ``redis_state.RedisStore``, read alone: the
callers' side (``in_flight``, ``settled``, ``sweep``: a few dict operations
or a queued item, never I/O) and the writer thread's (``_write_held``,
``_ledger_ops``, ``_renew_lease``, ``_sweep``), on the client, queue and
lock of the store's other base (``redis_link.RedisLink``).  An entry is
written only if its request is still unanswered ``IN_FLIGHT_DELAY`` after
it was sent; a process's entries are covered by a lease it renews; a sweep
claims each entry of a lapsed lease with ``SET NX`` (once for the whole
fleet) and counts it lost.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from .redis_link import KEY_PREFIX
from .shared_state import SharedRecord, keyed_hash

__all__ = ["KEY_PREFIX", "MAX_RAW_REQUEST_KEY", "MAX_SWEPT", "InFlightLedger"]

MAX_SWEPT = 1000  # entries one sweep reads
MAX_RAW_REQUEST_KEY = 40  # longer request ids are hashed in ledger fields


class InFlightLedger:
    """The in-flight ledger's part of the Redis store (a base of ``RedisStore``)."""

    writer: str
    lost_claimed: int
    _client: Any
    _key: bytes
    _ttl: int
    _lease: float
    _delay: float
    _leased_at: float
    _closed: bool
    _mine: dict[str, set[str]]
    _held: dict[tuple[str, str], tuple[float, tuple[str, str, float]]]
    _sweeps: dict[str, float]
    _wake: threading.Condition
    _on_lost: Callable[[str, str, str], None]

    # The store's own, reached through ``self``.
    def _enqueue(self, item: SharedRecord | tuple) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def call(self, operation: Callable[[Any], Any], kind: str = "read") -> Any:
        raise NotImplementedError

    def _field(self, writer: str, session_hash: str | None, key: str) -> str:
        # A JSON-RPC id as the ledger keys it ("1", '"abc"'): not a secret,
        # hashed only when long (an HMAC per request is most of this cost).
        if len(key) > MAX_RAW_REQUEST_KEY or "|" in key:
            key = "h:" + keyed_hash(self._key, key)
        return f"{writer}|{session_hash or '-'}|{key}"

    def _ledger(self, server: str) -> str:
        return f"{KEY_PREFIX}:f:{keyed_hash(self._key, server)}"

    def in_flight(
        self, server: str, session_hash: str | None, requests: list[tuple[str, str]],
        transport: str,
    ) -> None:
        """Requests sent on a stream now open: held ``IN_FLIGHT_DELAY``, then
        entered in the server's in-flight ledger (by the writer thread) if
        still unanswered, so that if this process dies before their fates,
        another process counts them lost.  A few dict operations here: the
        writer is woken only for the first entry held."""
        due = time.monotonic() + self._delay
        now = time.time()
        with self._wake:
            first = not self._held
            for key, method in requests:
                field = self._field(self.writer, session_hash, key)
                self._held[(server, field)] = (due, (method, transport, now))
            if first and not self._closed:
                self._start()
                self._wake.notify()

    def settled(
        self, server: str, session_hash: str | None, keys: list[str], writer: str | None = None
    ) -> None:
        """Their fates are known here (or, with another ``writer``'s record
        restored, this process takes them over): out of the ledger.  One
        still held never reaches Redis."""
        written = []
        kept = self._kept()
        with self._wake:
            for key in keys:
                field = self._field(writer or self.writer, session_hash, key)
                if (server, field) in kept:
                    continue  # left to the fleet at exit (its fate: elsewhere)
                if self._held.pop((server, field), None) is None:
                    written.append(field)
        if written:
            self._enqueue(("del", server, written))

    def sweep(self, server: str) -> None:
        """Look for entries of dead processes on ``server`` (queued: the
        writer thread reads them)."""
        self._enqueue(("sweep", server))

    # The one fate of a broken request for the whole fleet: a process that
    # resumes another's broken stream from its record takes its requests
    # over (``took_over``, queued), and the process that broke them, when
    # its reissue window passes, counts lost only those it can claim
    # (``fates_elsewhere``): the claim key is one per request, whoever holds it.

    def _fate_key(self, server: str, session_hash: str | None, key: str) -> str:
        field = self._field("", session_hash, key)
        return f"{KEY_PREFIX}:o:{keyed_hash(self._key, server)}:{field}"

    def _fate_key_of(self, server: str, field: str) -> str:
        """``_fate_key`` of a ledger field (``<writer>|<session>|<key>``, its
        key hashed already where long)."""
        return f"{KEY_PREFIX}:o:{keyed_hash(self._key, server)}:" + field[field.index("|"):]

    def took_over(self, server: str, session_hash: str | None, keys: list[str]) -> None:
        """This process decides the fates of these requests, broken in
        another (queued: ``SET NX`` by the writer thread)."""
        claims = [self._fate_key(server, session_hash, key) for key in keys]
        writer, ttl = self.writer, self._ttl

        def claim(pipe: Any) -> None:
            for name in claims:
                pipe.set(name, writer, nx=True, ex=ttl)

        self._enqueue(("call", claim))

    def fates_elsewhere(self, requests: list[tuple[str, str | None, str]]) -> list[int]:
        """Of ``requests`` (server, session hash, key) about to be counted
        lost here, the indexes another process took over: each claimed here
        unless claimed already (one bounded round trip; none if Redis
        fails, so they are counted here).  Called outside the tracker's lock."""
        claims = [self._fate_key(*request) for request in requests]
        writer, ttl = self.writer, self._ttl

        def claim(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for name in claims:
                pipe.set(name, writer, nx=True, ex=ttl)
                pipe.get(name)
            return pipe.execute()

        answers = self.call(claim, "write")  # a claim: SET NX, then GET
        if not answers:
            return []
        holders = answers[1::2]
        return [
            index
            for index, holder in enumerate(holders)
            if holder is not None
            and (holder.decode() if isinstance(holder, bytes) else str(holder)) != writer
        ]

    def _ledger_ops(self, pipe: Any, op: tuple) -> None:
        """Entries written (by this process, or by another whose requests
        this one took over with a restored record) out of the ledger."""
        server, written = op[1], op[2]
        pipe.hdel(self._ledger(server), *written)
        mine = self._mine.get(server)
        if mine:
            mine.difference_update(written)
            if not mine:
                del self._mine[server]

    # A proxy of a fleet (``hands_at_exit``, set by the proxy) counts no
    # broken request lost at its exit: another instance may still resume
    # it.  Its entries stay in the ledger (``keep_at_exit``), under the
    # lease its last write renews, and once that lapses the first sweep
    # counts each lost once, unless a process took it over (``took_over``).
    hands_at_exit = False

    def _kept(self) -> set[tuple[str, str]]:
        return self.__dict__.setdefault("_kept_at_exit", set())

    def keep_at_exit(self, requests: list[tuple[str, str | None, str]]) -> list[int]:
        """Of ``requests`` (server, session hash, key) about to be counted
        lost at exit, the indexes left to the fleet: those in the ledger
        (written, or held and written at the close), kept there."""
        if not self.hands_at_exit:
            return []
        kept = []
        with self._wake:
            for index, (server, session_hash, key) in enumerate(requests):
                field = self._field(self.writer, session_hash, key)
                if (server, field) in self._held or field in self._mine.get(server, ()):
                    self._kept().add((server, field))
                    kept.append(index)
        return kept

    def _forget_ops(self, pipe: Any) -> None:
        """The close: this process's entries out of the ledgers (it counted
        their requests itself), but those kept for the fleet, written."""
        kept = self._kept()
        with self._wake:
            held = {k: v for k, v in self._held.items() if k in kept}
            self._held.clear()  # never written: nothing to take out
            self._held.update(held)
        if held:
            self._write_held(pipe, everything=True)
        for server, fields in list(self._mine.items()):
            forgotten = sorted(f for f in fields if (server, f) not in kept)
            if forgotten:
                self._ledger_ops(pipe, ("del", server, forgotten))

    def _write_held(self, pipe: Any, everything: bool = False) -> None:
        """The held entries whose delay is over (``everything``: all)."""
        now = time.monotonic()
        due: dict[str, dict[str, str]] = {}
        with self._wake:
            for (server, field), (when, entry) in list(self._held.items()):
                if everything or when <= now:
                    del self._held[(server, field)]
                    method, transport, at = entry
                    due.setdefault(server, {})[field] = json.dumps(
                        {"m": method, "t": transport, "at": at}
                    )
        for server, entries in due.items():
            ledger = self._ledger(server)
            pipe.hset(ledger, mapping=entries)
            pipe.expire(ledger, self._ttl)
            self._mine.setdefault(server, set()).update(entries)

    def _renew_lease(self, pipe: Any) -> None:
        if self._mine:
            pipe.set(f"{KEY_PREFIX}:w:{self.writer}", 1, px=max(1, int(self._lease * 1000)))
            self._leased_at = time.monotonic()

    def _sweep(self, server: str) -> None:
        """Claim, once for the whole fleet (SET NX), each entry whose
        process's lease lapsed, and count it lost; come back for entries of
        processes still alive (their lease may yet lapse)."""
        client = self._client
        ledger = self._ledger(server)
        _, found = client.hscan(ledger, 0, count=MAX_SWEPT)
        entries = {
            (field.decode() if isinstance(field, bytes) else field): value
            for field, value in list(found.items())[:MAX_SWEPT]
        }
        writers = sorted({field.split("|", 1)[0] for field in entries} - {self.writer})
        if not writers:
            return
        pipe = client.pipeline(transaction=False)
        for writer in writers:
            pipe.exists(f"{KEY_PREFIX}:w:{writer}")
        alive = {writer for writer, live in zip(writers, pipe.execute()) if live}
        if alive:
            self._sweeps[server] = time.monotonic() + self._lease / 2
        for field, value in entries.items():
            writer = field.split("|", 1)[0]
            if writer == self.writer or writer in alive:
                continue
            claim = f"{KEY_PREFIX}:k:{keyed_hash(self._key, server)}:{field}"
            if client.set(claim, self.writer, nx=True, ex=self._ttl):
                client.hdel(ledger, field)
                try:
                    entry = json.loads(value)
                    method, transport = str(entry["m"]), str(entry["t"])
                except (ValueError, TypeError, KeyError):
                    continue
                counted = self._counters().get(server)
                if counted is None and not client.set(
                    self._fate_key_of(server, field), self.writer, nx=True, ex=self._ttl
                ):
                    continue  # a process took it over: its fate is that one's
                self.lost_claimed += 1
                if counted is not None:
                    counted(entry)  # a ledger handed over: its owner's count
                else:
                    self._on_lost(server, transport, method)

    # Losses a process claims as it stops (the proxy's client leg: the
    # answers it had not delivered when it was drained), handed to the
    # fleet in a ledger of their own, as in-flight entries of the process:
    # held for the rest of its window by a lease it sets as it hands them,
    # taken by the process that serves their resume (``take_handed``), or,
    # once that lease lapses, claimed lost once by the first ``sweep`` (the
    # dead process's sweep above), whose count is the ledger's own
    # (``count_swept``).

    def _counters(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        return self.__dict__.setdefault("_swept_counters", {})

    def count_swept(self, ledger: str, count: Callable[[dict[str, Any]], None]) -> None:
        """Entries of ``ledger`` a sweep claims here are counted by
        ``count(entry)`` (on the writer thread), not as the client half's."""
        self._counters()[ledger] = count

    def hand_claims(
        self, ledger: str, entries: list[tuple[str | None, str, dict[str, Any]]], hold: float
    ) -> bool:
        """Write ``entries`` (session hash, request key, what to count it
        by: at least ``m`` and ``t``) to ``ledger`` under this process,
        whose lease is set to ``hold`` s from now: no sweep claims them
        sooner.  One bounded round trip; False when Redis failed (the
        caller counts them itself)."""
        if not entries:
            return True
        fields = {
            self._field(self.writer, session_hash, key): json.dumps(entry)
            for session_hash, key, entry in entries
        }
        name, lease, ttl = self._ledger(ledger), f"{KEY_PREFIX}:w:{self.writer}", self._ttl

        def write(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            pipe.hset(name, mapping=fields)
            pipe.expire(name, ttl)
            pipe.set(lease, 1, px=max(1, int(hold * 1000)))
            return pipe.execute()

        return self.call(write, "write") is not None

    def take_handed(self, ledger: str, session_hash: str | None) -> list[dict[str, Any]] | None:
        """The entries of ``ledger`` handed over in ``session_hash``'s
        session, each claimed here (``SET NX``, the sweep's claim: once
        for the fleet) and taken out; None when Redis failed.  Two bounded
        round trips, the first a scan of the session's fields."""
        name = self._ledger(ledger)
        claim_prefix = f"{KEY_PREFIX}:k:{keyed_hash(self._key, ledger)}:"
        pattern = f"*|{session_hash or '-'}|*"
        writer, ttl = self.writer, self._ttl

        def take(client: Any) -> list[dict[str, Any]]:
            _, found = client.hscan(name, 0, match=pattern, count=MAX_SWEPT)
            handed = [
                (field.decode() if isinstance(field, bytes) else field, value)
                for field, value in list(found.items())[:MAX_SWEPT]
            ]
            if not handed:
                return []
            pipe = client.pipeline(transaction=False)
            for field, _ in handed:
                pipe.set(claim_prefix + field, writer, nx=True, ex=ttl)
            won = [item for item, claimed in zip(handed, pipe.execute()) if claimed]
            if won:
                client.hdel(name, *[field for field, _ in won])
            taken = []
            for _, value in won:
                try:
                    taken.append(json.loads(value))
                except ValueError:
                    continue
            return taken

        return self.call(take, "write")
