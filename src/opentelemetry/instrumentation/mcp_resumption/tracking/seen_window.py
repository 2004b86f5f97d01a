# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The seen window: the last event ids of a session, packed.

Pure: standard library only, and not thread-safe on its own (the tracker
reads and changes it under its lock).  ``SeenWindow`` is the view the rules
read (``continuity.reuses_id``, ``corroborated``): the last ``SEEN_WINDOW``
event ids of a session, oldest first, each with a digest of its event's
data.  Its record, kept on the session (``records.Session``) or on a
``_Packed`` when no session holds it, is packed: the ids joined into one
UTF-8 string, the digests as machine words, never repacked per event.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["SEEN_WINDOW", "SeenWindow", "remember_packed"]

SEEN_WINDOW = 16  # event ids remembered per session, for id_reused


class SeenWindow:
    """The last ``SEEN_WINDOW`` event ids of a session, as kept
    (``records.bounded_id``), each with the digest of its data (None: a marker),
    oldest first: a mapping to the rules, over the session's packed record.
    The ids themselves, not their hashes: whether a session's id scheme
    counts is read from them (:func:`corroborated`).

    Packed, because it is most of what a session costs: the ids joined into
    one UTF-8 string (an SSE id never holds a NUL; a tuple if one does), the
    digests as machine words in bytes.  A dict of ids and ints was over half
    the bytes of a typical tracked stream.

    Never repacked per event.  An event remembered one by one on a window no
    resume holds (a stream's first event, an answer on a POST stream) is
    appended to the packed record as it is (:meth:`remember`: a few bytes
    operations, no unpack).  A view a resume holds (``Session.window``) keeps
    the window unpacked while the resume is read and packs it once, when the
    resume ends (:meth:`release`): a replay remembers one event per event.
    A fold (many events at once) unpacks and packs once for all."""

    __slots__ = ("_digests_of", "_dirty", "_ids_of", "_owner", "_unpacked_digests", "_unpacked_ids")

    def __init__(self, owner: Any = None) -> None:
        self._owner = owner if owner is not None else _Packed()
        # What this view unpacked, and from which packed objects (immutable,
        # replaced on every change): a view held by a resume's check reads
        # the window for every event and unpacks it once per change.
        self._ids_of: object = _NOTHING_YET
        self._digests_of: object = _NOTHING_YET
        self._unpacked_ids: list[str] = _NO_IDS  # replaced before any read
        self._unpacked_digests: array = _NO_DIGESTS
        # A held view changed since it last packed: its unpacked lists are
        # the window, the packed record is behind until release().
        self._dirty = False

    def _ids(self) -> list[str]:
        if self._dirty:
            return self._unpacked_ids
        ids = self._owner.seen_ids
        if ids is not self._ids_of:
            if ids is None:
                unpacked = []
            elif isinstance(ids, bytes):
                unpacked = ids.decode("utf-8", "surrogatepass").split(_SEPARATOR)
            else:
                unpacked = list(ids)
            self._ids_of, self._unpacked_ids = ids, unpacked
        return self._unpacked_ids

    def _digests(self) -> array:
        if self._dirty:
            return self._unpacked_digests
        packed = self._owner.seen_digests
        if packed is not self._digests_of:
            digests = array("q")
            digests.frombytes(packed)
            self._digests_of, self._unpacked_digests = packed, digests
        return self._unpacked_digests

    def _held(self) -> bool:
        return getattr(self._owner, "window", None) is self

    def _store(self, ids: list[str], digests: array) -> None:
        if self._held():  # packed once, at release()
            self._unpacked_ids, self._unpacked_digests = ids, digests
            self._dirty = True
            return
        self._pack(ids, digests)

    def _pack(self, ids: list[str], digests: array) -> None:
        owner = self._owner
        self._dirty = False
        if not ids:
            owner.seen_ids, owner.seen_digests = None, b""
            self._ids_of, self._digests_of = _NOTHING_YET, _NOTHING_YET
            return
        packed = _SEPARATOR.join(ids)
        # More separators than ids-1 means an id held one: keep a tuple.  In
        # UTF-8: a str of wide characters takes 4 bytes per character.
        owner.seen_ids = (
            packed.encode("utf-8", "surrogatepass")
            if packed.count(_SEPARATOR) == len(ids) - 1
            else tuple(ids)
        )
        owner.seen_digests = digests.tobytes()
        self._ids_of, self._unpacked_ids = owner.seen_ids, ids
        self._digests_of, self._unpacked_digests = owner.seen_digests, digests

    def release(self) -> None:
        """The view is no longer held: its changes go to the packed record."""
        if self._dirty:
            self._pack(self._unpacked_ids, self._unpacked_digests)

    def __len__(self) -> int:
        return len(self._ids())

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids())

    def __contains__(self, event_id: object) -> bool:
        if not self._dirty and type(event_id) is str:
            found = _packed_find(self._owner.seen_ids, event_id)
            if found is not None:
                return found
        return event_id in self._ids()

    def __getitem__(self, event_id: str) -> int | None:
        digest = self._digests()[self._ids().index(event_id)]  # ValueError: not a key
        return None if digest == _MARKER else digest

    def get(self, event_id: str, default: int | None = None) -> int | None:
        try:
            return self[event_id]
        except ValueError:
            return default

    def items(self) -> Iterator[tuple[str, int | None]]:
        for event_id, digest in zip(self._ids(), self._digests()):
            yield event_id, None if digest == _MARKER else digest

    def remember(self, event_id: str, digest: int | None) -> None:
        """``event_id`` to the newest end.  On a packed record, a new id is
        appended to it as it is (the oldest dropped past the window) and an
        id already in the window is moved within it (``_remembered``); an id
        holding a NUL, a record kept as a tuple or a held view take the
        general path (:meth:`remember_all`), with the same result."""
        owner = self._owner
        ids = owner.seen_ids
        if (
            not self._dirty
            and (ids is None or type(ids) is bytes)
            and type(event_id) is str
            and _SEPARATOR not in event_id
            and not self._held()
        ):
            raw = event_id.encode("utf-8", "surrogatepass")
            word = _WORD.pack(_MARKER if digest is None else digest)
            if ids is None:
                owner.seen_ids, owner.seen_digests = raw, word
                return
            owner.seen_ids, owner.seen_digests = _remembered(ids, owner.seen_digests, raw, word)
            return
        self.remember_all(((event_id, digest),))

    def remember_all(self, entries: Iterable[tuple[str, int | None]]) -> None:
        """Each entry to the newest end, in order: unpacked once for all."""
        ids, digests = self._ids(), self._digests()
        for event_id, digest in entries:
            if event_id in ids:
                index = ids.index(event_id)  # to the newest end
                del ids[index]
                del digests[index]
            ids.append(event_id)
            digests.append(_MARKER if digest is None else digest)
        if len(ids) > SEEN_WINDOW:
            del ids[: len(ids) - SEEN_WINDOW]
            del digests[: len(digests) - SEEN_WINDOW]
        self._store(ids, digests)

    def merge(self, other: SeenWindow) -> None:
        self.remember_all(list(other.items()))


def remember_packed(owner: Any, event_id: str, digest: int | None, if_new: bool = False) -> bool:
    """``SeenWindow(owner).remember(event_id, digest)`` on a record no view
    holds (``owner.window`` is None), without making the view: the one
    event remembered as it comes on a stream no resume reads.  True when
    done; False where the view's general path is needed (an id holding a
    NUL, a record kept as a tuple).  ``if_new``:
    an id already in the window stays where it is (True: nothing to do),
    as ``if event_id not in seen: seen.remember(...)`` leaves it."""
    ids = owner.seen_ids
    if (ids is None or type(ids) is bytes) and type(event_id) is str and _SEPARATOR not in event_id:
        raw = event_id.encode("utf-8", "surrogatepass")
        word = _WORD.pack(_MARKER if digest is None else digest)
        if ids is None:
            owner.seen_ids, owner.seen_digests = raw, word
            return True
        # ``_appended`` written out (a new id, the common case): this runs for
        # every event of a session.  ``find``, not ``in``: on the delimited copies
        # ``in`` cost four times as much on 3.13.
        if ids.find(raw) == -1:
            ids += _SEP_BYTES + raw
            digests = owner.seen_digests + word
            if len(digests) > _WINDOW_BYTES:
                ids = ids[ids.index(_SEP_BYTES) + 1 :]
                digests = digests[_WORD.size :]
            owner.seen_ids, owner.seen_digests = ids, digests
            return True
        start = _whole_id_at(ids, raw)
        if start == -1:
            owner.seen_ids, owner.seen_digests = _appended(ids, owner.seen_digests, raw, word)
        elif not if_new:
            owner.seen_ids, owner.seen_digests = _moved(ids, owner.seen_digests, raw, word, start)
        return True
    return False


class _Packed:
    """A window's record when no session holds it."""

    __slots__ = ("seen_digests", "seen_ids")

    def __init__(self) -> None:
        self.seen_ids: bytes | tuple[str, ...] | None = None
        self.seen_digests = b""


_SEPARATOR = "\x00"
_SEP_BYTES = b"\x00"
_NOTHING_YET = object()
_NO_IDS: list[str] = []
_NO_DIGESTS = array("q")
# One digest of the packed record: a machine word, as array("q") stores it.
_WORD = struct.Struct("=q")
_WINDOW_BYTES = SEEN_WINDOW * _WORD.size


def _whole_id_at(ids: bytes, raw: bytes) -> int:
    """Where ``raw`` starts as a whole id of the packed ``ids`` (between
    separators), or -1: the leading separator's place in the delimited copy
    is the id's in ``ids``."""
    return (_SEP_BYTES + ids + _SEP_BYTES).find(_SEP_BYTES + raw + _SEP_BYTES)


def _remembered(ids: bytes, digests: bytes, raw: bytes, word: bytes) -> tuple[bytes, bytes]:
    """The packed record with ``raw`` (its digest ``word``) at the newest end,
    as ``SeenWindow.remember_all`` leaves it, without unpacking: a new id
    appended, an id already there moved (a server that counts each stream's
    ids from 1 sends ids its session's window holds on every stream)."""
    start = -1 if ids.find(raw) == -1 else _whole_id_at(ids, raw)
    if start == -1:
        return _appended(ids, digests, raw, word)
    return _moved(ids, digests, raw, word, start)


def _appended(ids: bytes, digests: bytes, raw: bytes, word: bytes) -> tuple[bytes, bytes]:
    """A new id at the newest end, the oldest dropped past the window."""
    ids += _SEP_BYTES + raw
    digests += word
    if len(digests) > _WINDOW_BYTES:
        ids = ids[ids.index(_SEP_BYTES) + 1 :]
        digests = digests[_WORD.size :]
    return ids, digests


def _moved(
    ids: bytes, digests: bytes, raw: bytes, word: bytes, start: int
) -> tuple[bytes, bytes]:
    """The id at ``start`` in ``ids`` moved to the newest end with its new
    digest (the window's length unchanged)."""
    end = start + len(raw)
    at = ids.count(_SEP_BYTES, 0, start) * _WORD.size
    if end == len(ids):  # the newest already: its digest replaced
        return ids, digests[:at] + word
    return (
        ids[:start] + ids[end + 1 :] + _SEP_BYTES + raw,
        digests[:at] + digests[at + _WORD.size :] + word,
    )


def _packed_find(ids: bytes | tuple[str, ...] | None, event_id: str) -> bool | None:
    """Whether ``event_id`` is in a packed record, without unpacking it; None
    where that takes the unpacked view (a tuple, or an id with a NUL)."""
    if ids is None:
        return False
    if type(ids) is not bytes or _SEPARATOR in event_id:
        return None
    framed = _SEP_BYTES + event_id.encode("utf-8", "surrogatepass") + _SEP_BYTES
    return framed in _SEP_BYTES + ids + _SEP_BYTES


# hash() never returns -1 (CPython reserves it for errors), so it can stand
# for "no digest" (a marker) in the packed window.
_MARKER = -1
