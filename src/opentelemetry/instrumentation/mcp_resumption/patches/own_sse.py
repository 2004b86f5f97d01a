# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Our own SSE loop: where a library's event iterator is one we verified,
the plugin is that iterator instead of a generator around it.

Each loop below does what one verified version of a library's iterator
does, statement for statement, with the objects of that library's own
module (its decoder and parser classes, taken from the verified function's
``__globals__``): the events handed out are the library's own, its
exceptions are raised at the same moment, closing the loop closes what
closing the library's iterator would.  What it adds per event is written
inline (``ends`` is how the fed stream ends, ``patches.feed``): count it,
then report it (the first, and on a stream that carries requests each one
that may hold a response) or append it to the ring.

A loop is taken only when, decided once per instrumentation, the source
file of the library's function hashes to a fingerprint recorded here and the
installed version is one whose wheel carries that very file, and, at each
call, the function wrapt hands the patch is the one verified: anything else,
another instrumentation wrapped in between included, keeps the generator
around the library's iterator.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import types
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import Any

from . import fault

# A loop: (the EventSource, the library module's globals, the stream's ends,
# whether to scan data for a response) -> the iterator the host gets.
Loop = Callable[[Any, dict, Any, bool], Any]


# Per event, each loop below adds what ``patches.feed`` describes and no
# more: a count in a cell of its own closure (``Feed.count_by``: an attribute
# of the feed would cost a load and a store more), one flag, and the ring's
# append; the flag is up for the first event and, on a stream that carries
# requests, stays up so that each event is looked at for a response.


def _httpx_sse_loop(
    source: Any, names: dict, ends: Any, scan: bool, split: str | None = None
) -> Iterator[Any]:
    """httpx-sse ``EventSource.iter_sse``: 0.4.0 reads the body's lines as
    httpx splits them, 0.4.3 with its own splitter, ``split``."""
    count = 0

    def loop() -> Iterator[Any]:
        nonlocal count
        append = ends.feed.ring.append
        report = ends.report
        looking = first = True
        with ends:
            source._check_content_type()
            decoder = names["SSEDecoder"]()
            response = source._response
            for line in response.iter_lines() if split is None else names[split](response):
                line = line.rstrip("\n")
                sse = decoder.decode(line)
                if sse is not None:
                    count += 1
                    if looking:
                        if first or '"result"' in sse.data or '"error"' in sse.data:
                            report(sse)
                        else:
                            append(sse)
                        first, looking = False, scan
                    else:
                        append(sse)
                    yield sse

    ends.feed.count = lambda: count  # (Feed.count_by)
    return loop()


def _ahttpx_sse_loop(
    source: Any, names: dict, ends: Any, scan: bool, split: str | None = None
) -> AsyncIterator[Any]:
    """httpx-sse ``EventSource.aiter_sse``, as ``_httpx_sse_loop``; 0.4.3
    also closes its splitter when it stops (0.4.0 leaves ``aiter_lines`` to
    the garbage collector, and so does this loop)."""
    count = 0

    async def loop() -> AsyncIterator[Any]:
        nonlocal count
        append = ends.feed.ring.append
        report = ends.report
        looking = first = True
        with ends:
            source._check_content_type()
            decoder = names["SSEDecoder"]()
            response = source._response
            lines = response.aiter_lines() if split is None else names[split](response)
            try:
                async for line in lines:
                    line = line.rstrip("\n")
                    sse = decoder.decode(line)
                    if sse is not None:
                        count += 1
                        if looking:
                            if first or '"result"' in sse.data or '"error"' in sse.data:
                                report(sse)
                            else:
                                append(sse)
                            first, looking = False, scan
                        else:
                            append(sse)
                        yield sse
            finally:
                if split is not None:
                    await lines.aclose()

    ends.feed.count = lambda: count  # (Feed.count_by)
    return loop()


def _httpx2_loop(source: Any, names: dict, ends: Any, scan: bool) -> Iterator[Any]:
    """httpx2 2.16 ``EventSource.__iter__``.  The library's loop over the
    body's text and then its parser's ``flush()`` are one loop here, over
    each batch of events in turn, so the per-event lines are written once."""
    count = 0

    def loop() -> Iterator[Any]:
        nonlocal count
        append = ends.feed.ring.append
        report = ends.report
        looking = first = True
        with ends, names["request_context"](request=source._response.request):
            source._check_content_type()
            parser = names["_SSEParser"](source._max_event_size)
            texts = source._response.iter_text()
            body_left = True
            while body_left:
                try:
                    batch = parser.decode(next(texts))
                except StopIteration:
                    batch, body_left = parser.flush(), False
                for sse in batch:
                    count += 1
                    if looking:
                        if first or '"result"' in sse.data or '"error"' in sse.data:
                            report(sse)
                        else:
                            append(sse)
                        first, looking = False, scan
                    else:
                        append(sse)
                    yield sse

    ends.feed.count = lambda: count  # (Feed.count_by)
    return loop()


def _ahttpx2_loop(source: Any, names: dict, ends: Any, scan: bool) -> AsyncIterator[Any]:
    """httpx2 2.16 ``EventSource.__aiter__``, as ``_httpx2_loop``."""
    count = 0

    async def loop() -> AsyncIterator[Any]:
        nonlocal count
        append = ends.feed.ring.append
        report = ends.report
        looking = first = True
        with ends, names["request_context"](request=source._response.request):
            source._check_content_type()
            parser = names["_SSEParser"](source._max_event_size)
            texts = source._response.aiter_text()
            body_left = True
            while body_left:
                try:
                    batch = parser.decode(await texts.__anext__())
                except StopAsyncIteration:
                    batch, body_left = parser.flush(), False
                for sse in batch:
                    count += 1
                    if looking:
                        if first or '"result"' in sse.data or '"error"' in sse.data:
                            report(sse)
                        else:
                            append(sse)
                        first, looking = False, scan
                    else:
                        append(sse)
                    yield sse

    ends.feed.count = lambda: count  # (Feed.count_by)
    return loop()


# The fingerprints are _fingerprint() of the function's module file, the
# same bytes in each version listed with it (their wheels compared); the test
# suite runs the loop on one of them, through the fuzz corpus.
_HTTPX_SSE_040 = "0d1d496406d8ddfa56a28e2c2d345b9547e8f429c28069da5d83b4fe99e33451"
_HTTPX_SSE_042 = "0fba5f91a8e6747966b3be4e57c1e974eace12be4d6d64250f031f485709f055"
_HTTPX2_210 = "219d4b7fa36b82865aec53f9fa7fd584a864d1e1181643d9b4e0bc8392694029"
_HTTPX2_VERSIONS = (
    "2.10.0", "2.11.0", "2.12.0", "2.13.0", "2.13.1", "2.14.0", "2.15.0", "2.15.1",
    "2.16.0", "2.16.1", "2.16.2", "2.17.0",
)
Verified = dict[tuple[str, str, str], dict[str, tuple[tuple[str, ...], Loop]]]


def verified() -> Verified:
    """(distribution, module, function) -> {fingerprint: (versions, loop)}:
    each library iterator our loops copy.  Built when a decision asks (a
    function, so that the patch modules keep no tables of objects)."""
    return {
        ("httpx-sse", "httpx_sse._api", "EventSource.iter_sse"): {
            _HTTPX_SSE_040: (("0.4.0",), _httpx_sse_loop),
            _HTTPX_SSE_042: (
                ("0.4.2", "0.4.3"),
                partial(_httpx_sse_loop, split="_iter_sse_lines"),
            ),
        },
        ("httpx-sse", "httpx_sse._api", "EventSource.aiter_sse"): {
            _HTTPX_SSE_040: (("0.4.0",), _ahttpx_sse_loop),
            _HTTPX_SSE_042: (
                ("0.4.2", "0.4.3"),
                partial(_ahttpx_sse_loop, split="_aiter_sse_lines"),
            ),
        },
        ("httpx2", "httpx2._sse", "EventSource.__iter__"): {
            _HTTPX2_210: (_HTTPX2_VERSIONS, _httpx2_loop),
        },
        ("httpx2", "httpx2._sse", "EventSource.__aiter__"): {
            _HTTPX2_210: (_HTTPX2_VERSIONS, _ahttpx2_loop),
        },
    }


# The distribution each patched library module comes from.
_DISTRIBUTIONS = {"httpx_sse": "httpx-sse", "httpx2": "httpx2"}


def _fingerprint(function: types.FunctionType) -> str:
    """SHA-256 of the source file that defines the function, as installed:
    the loop copies that function and, in httpx-sse 0.4.3, a line splitter
    of the same module.  Read at the first stream, not parsed (a parse for
    the function's lines alone took 14 ms, its tokenizer's start-up)."""
    with open(function.__code__.co_filename, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


def installed_version(distribution: str) -> str:
    return importlib.metadata.version(distribution)


def _verified_loop(library: str, method: str, function: Any) -> Loop | None:
    # Only the library's own plain function: a wrapper (wrapt's, or one made
    # with functools.wraps) would hash to the source it wraps.
    if type(function) is not types.FunctionType or hasattr(function, "__wrapped__"):
        return None
    distribution = _DISTRIBUTIONS[library]
    versions = verified().get((distribution, function.__module__, function.__qualname__))
    if versions is None or function.__qualname__ != method:
        return None
    same_file = versions.get(_fingerprint(function))
    if same_file is None:
        return None
    tested, loop = same_file
    return loop if installed_version(distribution) in tested else None


class OwnLoop:
    """Whether the plugin may be ``library``'s iterator ``method`` itself,
    decided at the first stream read through it and kept for this
    instrumentation; then, at each call, whether the function wrapt hands
    the patch is still the one verified."""

    __slots__ = ("_decided", "_library", "_method", "function", "loop", "names")

    def __init__(self, library: str, method: str) -> None:
        self._library = library
        self._method = method
        self._decided = False
        # The function verified, and its loop; None for the fallback.  (The
        # patch compares what it is handed with ``function`` itself: a
        # verified one needs no call of ``loop_for``.)
        self.function: Any = None
        self.loop: Loop | None = None
        # The verified function's module globals: what its loop takes the
        # library's parser from.
        self.names: dict = {}

    def loop_for(self, wrapped: Any) -> Loop | None:
        """The loop to run instead of ``wrapped`` (wrapt hands the patch the
        library's function bound to the instance), or None for the fallback."""
        function = getattr(wrapped, "__func__", None)
        if not self._decided:
            self._decide(function)
        # A refused function leaves _loop None: the fallback, whatever is handed.
        return self.loop if function is self.function else None

    def _decide(self, function: Any) -> None:
        self._decided = True
        try:
            loop = _verified_loop(self._library, self._method, function)
        except Exception:  # source unreadable, metadata missing: the wrapper it is
            fault(f"verifying {self._library} {self._method}")
            loop = None
        if loop is not None:
            self.names = function.__globals__
            self.function, self.loop = function, loop
