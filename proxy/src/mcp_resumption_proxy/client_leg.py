# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The client leg's broken requests: the answers the proxy could not deliver.

Only the proxy sees this loss.  The upstream gave the answer (or was still
going to), but the client's stream to the proxy ended before the answer was
written to it: the client half on the upstream leg saw nothing break, and a
client without event ids cannot resume.  Each such request waits here for
its fate, as the client half's fates wait (``mcp.client.resumption.broken_requests``
and, for ``lost``, the ``orphaned_request`` gap and the lost-call line, all
on ``mcp.resumption.leg=client_proxy``):

* ``answered``: a resume from the client (same session) delivered the answer;
* ``reissued``: the client sent the same call again (same method and
  params, ``_meta`` aside) under a new id;
* ``lost``: neither within the confirmation window
  (``OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT``), while no resume of its
  session is still open.

A stream closed by a 2026-07-28 client is that client's cancel (the
revision makes closing the response stream the way to cancel, and a client
whose stream broke MUST re-issue): re-issued, it is ``reissued``; otherwise
it is counted on ``mcp.proxy.cancelled_requests``, never ``lost``.  Before
2026-07-28 a client cancels with ``notifications/cancelled``: a request so
cancelled while its answer was still coming is counted there too (one
cancelled after the break is an SDK's courtesy for a call it already failed),
and a close without it is a break.

At shutdown (``stop_waiting``) the proxy stops waiting: every request whose
answer it had not delivered is ``lost``, the ones on streams it cut itself
included; with shared state it hands them to the fleet instead
(``handoff.py``), and the instance that serves their resume, or else the
first sweep once the window has passed, decides each once.  Resumes the
proxy does not judge as a resume of a stream it carried are counted apart,
on ``mcp.proxy.client_resumes``.

Costs: a POST's body is parsed once (its requests' ids); an event is looked
at only on a response that may answer a watched request; timers only for
broken requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry._logs import SeverityNumber, get_logger

from opentelemetry import metrics
from opentelemetry.instrumentation.mcp_resumption import config
from opentelemetry.instrumentation.mcp_resumption.rules.jsonrpc import (
    EVENTS_POLL,
    EVENTS_STREAM,
    LISTEN,
)
from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc
from opentelemetry.instrumentation.mcp_resumption.telemetry.verdict_log import (
    LOST,
    server_name,
    verdicts,
)
from opentelemetry.instrumentation.mcp_resumption.version import __version__

from . import legs
from .client_events import ClientEvents, EventsWatch

_logger = logging.getLogger("mcp_resumption_proxy")

# The revision from which closing a response stream is the client's cancel.
CANCELS_ON_CLOSE = "2026-07-28"
MAX_AWAITING = 4096  # broken requests awaiting a fate; the oldest is decided first
MAX_SERVERS = 1024  # addresses whose series are started at 0
MAX_TOOL = 64
MAX_HANDED_KEY = 256  # a request key read back from the shared state

CANCELLED_REQUESTS = (
    "mcp.proxy.cancelled_requests",
    "{request}",
    "Requests whose client closed its stream to the proxy before the answer and did not "
    "re-issue them, or cancelled them with notifications/cancelled: the client's cancel",
)
CLIENT_RESUMES = (
    "mcp.proxy.client_resumes",
    "{resume}",
    "Client resumes the proxy did not judge as resumes of a stream it carried, by result",
)
RESUME_RESULT = "mcp.proxy.resume.result"
# A cursor no stream through this proxy (or the fleet) ever carried: a client
# of another deployment, a probe, a forged id.  Nothing was lost here.
UNCARRIED_CURSOR = "uncarried_cursor"
# The proxy could not forward the resume, or the server refused it (>= 400):
# the upstream leg judges it; nothing was replayed.
NOT_FORWARDED = "not_forwarded"
RESUME_RESULTS = (UNCARRIED_CURSOR, NOT_FORWARDED)


def _key(request_id: Any) -> str:
    return json.dumps(request_id)


def _shown(key: str) -> str:
    return key[1:-1] if len(key) >= 2 and key[0] == '"' == key[-1] else key


def _params_key(params: Any) -> str:
    if isinstance(params, dict):
        params = {k: v for k, v in params.items() if k != "_meta"}
    return json.dumps(params, sort_keys=True, default=str)


def _messages(body: bytes | str) -> list[dict[str, Any]]:
    try:
        message = json.loads(body)
    except ValueError:
        return []
    items = message if isinstance(message, list) else [message]
    return [item for item in items if isinstance(item, dict)]


_RESUMED_BY_CURSOR = frozenset({EVENTS_POLL, EVENTS_STREAM})


def requests_in(body: bytes) -> list[tuple[str, str, str]]:
    """(key, method, params key) of each JSON-RPC request in a POST body."""
    found = []
    for item in _messages(body):
        method, request_id = item.get("method"), item.get("id")
        if isinstance(method, str) and isinstance(request_id, (str, int)) and not isinstance(
            request_id, bool
        ):
            found.append((_key(request_id), method, _params_key(item.get("params"))))
    return found


def answers_in(data: str) -> list[str]:
    """The keys of the JSON-RPC responses in one SSE event's data (or a JSON body)."""
    if '"id"' not in data:
        return []
    return [
        _key(item.get("id")) for item in _messages(data)
        if "method" not in item and ("result" in item or "error" in item)
    ]


@dataclass(eq=False)
class Watch:
    """One response toward a client: the requests it may answer, and the
    answers it carried (each with the tee's chunk count when it was parsed,
    so that an answer parsed but never written is told apart)."""

    server: str
    session: str | None
    protocol: str | None
    requests: dict[str, tuple[str, str]]  # key -> (method, params key)
    resume: bool = False
    answered: dict[str, int] = field(default_factory=dict)
    # The chunks written to the client so far (the tee's count), if counted.
    progress: Callable[[], int] | None = None
    # How the response ended, where the forwarding knows (see ClientLeg.ended).
    how: str | None = None
    over: bool = False
    cancelled: set[str] = field(default_factory=set)  # by notifications/cancelled
    # Its events/* requests, followed on the events' own ledger (client_events.py).
    events: EventsWatch | None = None
    events_leg: ClientEvents | None = None
    # Whether its client's connection is closed, as of now (where known).
    gone: Callable[[], bool] | None = None

    def seen(self, data: str, mark: int = 0) -> None:
        """An answer (or an event) parsed at chunk ``mark`` (0: written to
        the client already)."""
        if self.events is not None and self.events_leg is not None:
            written = None if not mark or self.progress is None else self.progress()
            self.events_leg.seen(self.events, data, mark, written)
        for key in answers_in(data):
            if key in self.requests and key not in self.answered:
                self.answered[key] = mark

    def seen_frames(self, frames: bytes) -> None:
        """Answers in raw SSE bytes (a relay's frames), written already."""
        if b'"id"' not in frames and (
            self.events is None or b"notifications/events/" not in frames
        ):
            return
        for line in frames.splitlines():
            if line.startswith(b"data:"):
                self.seen(line[5:].strip().decode("utf-8", "replace"))

    def status_sent(self, status: int) -> None:
        """The response's status line went to the client: an HTTP error is
        the answer to every request of the POST (an SDK fails each on it,
        mcp 1.x without reading the body, whose JSON-RPC error, as the 404
        of a closed session, names no id).  Not a resume's: its error
        brings none of the answers it was to deliver."""
        if status >= 400 and not self.resume:
            for key in self.requests:
                self.answered.setdefault(key, 0)

    @property
    def subscription(self) -> bool:
        """A ``subscriptions/listen`` or an ``events/stream``: a
        subscription, never a call."""
        if not self.requests:
            return self.events is not None and bool(self.events.streams)
        return all(
            method == LISTEN for method, _ in self.requests.values())

    def delivered(self, sent: int | None) -> set[str]:
        """The answers written to the client (``sent``: chunks written; None:
        every answer seen was written)."""
        return {k for k, mark in self.answered.items() if sent is None or mark <= sent}


@dataclass(eq=False)
class _Broken:
    key: str
    method: str
    params: str
    server: str
    session: str | None
    protocol: str | None
    broke_at: float
    timer: Any = None


class ClientLeg:
    """The client leg's broken requests and their fates (see the module's doc)."""

    def __init__(
        self,
        *,
        meter_provider: Any = None,
        logger_provider: Any = None,
        window: float | None = None,
    ) -> None:
        meter = metrics.get_meter(
            sc.INSTRUMENTATION_NAME, __version__, meter_provider, schema_url=sc.SCHEMA_URL
        )
        # The client half's own instruments (same names, same scope): the
        # leg attribute tells the legs apart, and the alerts read them as
        # they read the client half's.
        self._broken = meter.create_counter(*sc.BROKEN_REQUESTS)
        self._gaps = meter.create_counter(*sc.GAPS)
        self._cancelled = meter.create_counter(*CANCELLED_REQUESTS)
        self._resumes = meter.create_counter(*CLIENT_RESUMES)
        self._logger = get_logger(
            sc.INSTRUMENTATION_NAME, __version__, logger_provider=logger_provider,
            schema_url=sc.SCHEMA_URL,
        )
        self.window = config.load().confirm_timeout if window is None else window
        # The Events extension's push streams cut on this leg (client_events.py).
        self.events = ClientEvents(
            meter_provider=meter_provider, logger_provider=logger_provider,
            window=self.window, cancelled=self._events_cancelled,
        )
        self._lock = threading.Lock()
        self._awaiting: OrderedDict[tuple[str | None, str], _Broken] = OrderedDict()
        self._open: set[Watch] = set()
        self._servers: set[str] = set()
        self.stopped = False
        # With shared state: where losses at shutdown go (handoff.FleetClaims),
        # and this instance's own address, under which it counts the ones it
        # decides for the fleet.
        self.fleet: Any = None
        self.home: str | None = None

    @classmethod
    def for_leg(cls, **providers: Any) -> ClientLeg:
        wrapped = legs.providers(legs.CLIENT_PROXY, **providers)
        return cls(meter_provider=wrapped["meter_provider"],
                   logger_provider=wrapped["logger_provider"])

    # ------------------------------------------------------------ responses

    def watch_post(
        self, body: bytes, server: str, session: str | None, protocol: str | None,
        principal: str | None = None,
    ) -> Watch | None:
        """A POST about to be forwarded: what its response is to answer (None:
        no request in it).  Also where a re-issue or a cancel is seen."""
        if self._awaiting or (self._open and b"notifications/cancelled" in body):
            self._sent(body, session)
        if b'"method"' not in body or b'"id"' not in body:
            return None
        events = self.events.sent(body, server, principal) if b'"events/' in body else None
        # A push stream or a poll of the Events extension is resumed with its
        # cursor, which the events' ledger judges: never a call to lose here.
        requests = [r for r in requests_in(body) if r[1] not in _RESUMED_BY_CURSOR]
        if not requests and events is None:
            return None
        self._seen_server(server)
        watch = Watch(server, session, protocol, {k: (m, p) for k, m, p in requests},
                      events=events, events_leg=self.events if events is not None else None)
        if events is not None:
            events.owner = watch
        with self._lock:
            self._open.add(watch)
        return watch

    def watch_resume(self, server: str, session: str | None) -> Watch | None:
        """A client's resume: the session's broken requests it may answer."""
        if not self._awaiting:
            return None
        with self._lock:
            keys = {
                key: (b.method, b.params) for (s, key), b in self._awaiting.items() if s == session
            }
        if not keys:
            return None
        watch = Watch(server, session, None, keys, resume=True)
        with self._lock:
            self._open.add(watch)
        return watch

    def ended(self, watch: Watch | None, how: str, sent: int | None = None) -> None:
        """``watch``'s response ended: ``done`` (written to its end), ``left``
        (the client's stream ended first), ``upstream`` (the upstream's
        stream broke or was refused: the upstream leg's to judge), ``cut``
        (the proxy stopped it: shutdown).  ``sent``: see ``Watch.delivered``."""
        if watch is None:
            return
        with self._lock:
            if watch.over:  # counted at shutdown already
                return
            watch.over = True
            self._open.discard(watch)
        if watch.events is not None:
            self.events.ended(watch.events, how, None if how == "done" else sent)
        delivered = watch.delivered(None if how == "done" else sent)
        if watch.resume:
            for key in delivered:
                self._decide((watch.session, key), "answered")
            return
        if how not in ("left", "cut"):
            return
        now = time.monotonic()
        stopped: list[_Broken] = []
        for key, (method, params) in watch.requests.items():
            if key in delivered:
                continue
            if key in watch.cancelled or (how == "left" and method == LISTEN):
                # A listen's stream closed by its client is the client's own
                # end of it (2026-07-28 cancels by closing): counted now, and
                # never awaited as a broken call, a re-listen being no re-issue.
                self._cancelled.add(1, self._attributes(watch.server))
                continue
            broken = _Broken(key, method, params, watch.server, watch.session,
                             watch.protocol, now)
            if how == "cut" or self.stopped:
                stopped.append(broken)
                continue
            self._await(broken)
        self._lost_at_stop(stopped, "the proxy stopped before its answer was written")

    # ------------------------------------------------------------ fates

    def _await(self, broken: _Broken) -> None:
        with self._lock:
            self._awaiting[(broken.session, broken.key)] = broken
            oldest = None
            if len(self._awaiting) > MAX_AWAITING:
                _, oldest = self._awaiting.popitem(last=False)
        if oldest is not None:
            self._expired(oldest)
        self._arm(broken)

    def _arm(self, broken: _Broken) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        broken.timer = loop.call_later(self.window, self._deadline, broken)

    def _deadline(self, broken: _Broken) -> None:
        with self._lock:
            if self._awaiting.get((broken.session, broken.key)) is not broken:
                return
            resuming = broken.session is not None and any(
                w.resume and w.session == broken.session for w in self._open
            )
        if resuming:
            # The client is still resuming its session: still waiting.
            self._arm(broken)
            return
        with self._lock:
            self._awaiting.pop((broken.session, broken.key), None)
        self._expired(broken)

    def _expired(self, broken: _Broken) -> None:
        if broken.protocol is not None and broken.protocol >= CANCELS_ON_CLOSE:
            self._cancel(broken)
            return
        self._fated(broken, "lost", "no resume delivered its answer, and it was not re-issued")

    def _decide(self, key: tuple[str | None, str], fate: str) -> None:
        with self._lock:
            broken = self._awaiting.pop(key, None)
        if broken is None:
            return
        if broken.timer is not None:
            broken.timer.cancel()
        self._fated(broken, fate, "")

    def _sent(self, body: bytes, session: str | None) -> None:
        """A POST from a client: a re-issue or a cancel of a broken request?"""
        for item in _messages(body):
            method = item.get("method")
            if method == "notifications/cancelled":
                # Only a cancel sent while the answer was still coming is the
                # client's: one after the break is an SDK's courtesy for a
                # call it already failed, and decides nothing.
                params = item.get("params")
                request_id = params.get("requestId") if isinstance(params, dict) else None
                key = _key(request_id)
                with self._lock:
                    for watch in self._open:
                        if watch.session == session and key in watch.requests:
                            watch.cancelled.add(key)
                continue
            if not isinstance(method, str) or "id" not in item:
                continue
            params = _params_key(item.get("params"))
            key = _key(item.get("id"))
            with self._lock:
                match = next((
                    k for k, b in self._awaiting.items()
                    if b.session == session and b.method == method and b.params == params
                    and b.key != key
                ), None)
            if match is not None:
                self._decide(match, "reissued")

    def _attributes(self, server: str) -> dict[str, Any]:
        host, _, port = server.rpartition(":")
        attributes: dict[str, Any] = {sc.MCP_TRANSPORT: sc.TRANSPORT_STREAMABLE_HTTP}
        if host and port.isdigit():
            attributes[sc.SERVER_ADDRESS], attributes[sc.SERVER_PORT] = host, int(port)
        else:
            attributes[sc.SERVER_ADDRESS] = server
        return attributes

    def _seen_server(self, server: str) -> None:
        """Start the leg's series of a new address at 0 (Prometheus' increase()
        cannot see a series born at 1), and name its leg in its lines."""
        if server in self._servers or len(self._servers) >= MAX_SERVERS:
            return
        with self._lock:
            if server in self._servers:
                return
            self._servers.add(server)
        verdicts.set_leg(server, legs.named(legs.CLIENT_PROXY))
        attributes = self._attributes(server)
        for fate in sc.FATES:
            self._broken.add(0, {sc.REQUEST_FATE: fate, **attributes})
        self._gaps.add(0, {sc.GAP_KIND: LOST, **attributes})
        self._cancelled.add(0, attributes)

    def _cancel(self, broken: _Broken) -> None:
        self._cancelled.add(1, self._attributes(broken.server))

    def _events_cancelled(self, server: str) -> None:
        """A push stream its client closed and did not reopen: its end of
        the subscription, counted as a closed listen is."""
        self._cancelled.add(1, self._attributes(server))

    def _fated(self, broken: _Broken, fate: str, why: str) -> None:
        attributes = self._attributes(broken.server)
        if fate != "lost":
            self._broken.add(1, {sc.REQUEST_FATE: fate, **attributes})
            return
        # Its gap first: a reader who sees the fate sees its gap.
        self._gaps.add(1, {sc.GAP_KIND: LOST, **attributes})
        self._broken.add(1, {sc.REQUEST_FATE: fate, **attributes})
        verdicts.server_seen(broken.server)
        verdicts.gap(broken.server, LOST)
        request = _shown(broken.key)
        verdicts.finding(
            broken.server,
            "",
            "mcp-resumption lost call: server=%s method=%s request=%s: the client's stream "
            "to the proxy ended before its answer was written (%s); re-issue it",
            broken.server,
            broken.method,
            request,
            why,
        )
        gap = {
            sc.GAP_KIND: LOST,
            sc.GAP_EXPECTED: f"the answer to request {request}",
            sc.GAP_OBSERVED: "the client's stream ended before the answer was written: " + why,
            sc.JSONRPC_REQUEST_ID: request,
            sc.MCP_METHOD_NAME: broken.method[:MAX_TOOL],
            **attributes,
        }
        self._logger.emit(
            event_name=sc.GAP_EVENT_NAME,
            body=f"request {request} ({broken.method[:MAX_TOOL]}) lost between client and "
            f"proxy: {why}",
            attributes=gap,
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
        )

    # ------------------------------------------------------------ resumes apart

    def resume_apart(self, result: str, server: str) -> None:
        """A client resume not judged as a resume of a carried stream."""
        self._resumes.add(1, {RESUME_RESULT: result, **self._attributes(server)})

    # ------------------------------------------------------------ shutdown

    def stop_waiting(self) -> None:
        """The proxy shuts down: every answer it has not delivered is lost
        (a 2026-07-28 client's own close stays its cancel); streams still
        open are counted lost when they end, at once."""
        self.stopped = True
        self.events.stop()
        with self._lock:
            awaiting = list(self._awaiting.values())
            self._awaiting.clear()
            still_open = [w for w in self._open if not w.resume]
        if self.fleet is not None:
            self.fleet.stop()
        lost = []
        for broken in awaiting:
            if broken.timer is not None:
                broken.timer.cancel()
            if broken.protocol is not None and broken.protocol >= CANCELS_ON_CLOSE:
                self._cancel(broken)
            else:
                lost.append(broken)
        self._lost_at_stop(lost, "the proxy stopped before a resume or a re-issue")
        for watch in still_open:
            self.ended(watch, "cut", watch.progress() if watch.progress is not None else 0)

    # ------------------------------------------------------------ the fleet

    def start(self) -> None:
        """The server is up (on its loop): with shared state, this
        instance's series start at 0 and its sweeps of the fleet's handed
        losses begin."""
        if self.fleet is None:
            return
        if self.home is not None:
            self._seen_server(self.home)
        self.fleet.start(self._swept_lost)

    def _lost_at_stop(self, brokens: list[_Broken], why: str) -> None:
        """Answers the proxy stops waiting for: handed to the fleet (shared
        state), else lost here, as when Redis fails."""
        if not brokens:
            return
        if self.fleet is not None:
            try:
                handed = self.fleet.hand([
                    (b.session, b.key, {"m": b.method, "p": b.protocol}) for b in brokens
                ])
            except Exception:  # the count must not keep the process from stopping
                handed = False
            if handed:
                _logger.info(
                    "mcp-resumption-proxy: %d answer(s) not delivered handed to the fleet: the "
                    "instance that serves their resume settles them, else they are lost once "
                    "the window (%g s) has passed", len(brokens), self.fleet.window)
                return
        for broken in brokens:
            self._fated(broken, "lost", why)

    def take_over(self, taken: list[dict[str, Any]], server: str,
                  session: str | None) -> Watch | None:
        """``taken``: the session's losses another instance handed to the
        fleet, claimed here by the resume that ``server`` now serves: this
        instance decides them, as its own broken requests."""
        now = time.monotonic()
        for entry in taken:
            broken = _handed(entry, server, session, now)
            if broken is not None:
                self._await(broken)
        return self.watch_resume(server, session)

    def _swept_lost(self, entry: dict[str, Any]) -> None:
        """A handed loss this instance's sweep claimed (the writer thread):
        no resume anywhere within the window."""
        try:
            broken = _handed(entry, self.home or "-", None, time.monotonic())
            if broken is not None:
                self._seen_server(broken.server)
                self._fated(broken, "lost", "the proxy stopped before its answer was written, "
                            "and no instance of the fleet served a resume within the window")
        except Exception:  # the sweep goes on
            _logger.warning("mcp-resumption-proxy: counting a handed loss failed", exc_info=True)

    def server_of(self, scope: dict[str, Any]) -> str:
        server = scope.get("server") or ("", None)
        return server_name(str(server[0]), server[1])


def _handed(entry: dict[str, Any], server: str, session: str | None,
            now: float) -> _Broken | None:
    """A loss handed to the fleet, as a broken request of this instance."""
    key, method, protocol = entry.get("r"), entry.get("m"), entry.get("p")
    if not isinstance(key, str) or not isinstance(method, str) or len(key) > MAX_HANDED_KEY:
        return None
    return _Broken(key, method[:MAX_TOOL], "", server, session,
                   protocol if isinstance(protocol, str) else None, now)
