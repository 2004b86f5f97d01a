# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Rows of a cut on each leg of ``mcp-resumption-proxy``.

    SDK client -> router (client_proxy) -> proxy -> router (proxy_server) -> SDK server

The proxy runs as a user runs it, a child process (``python -m
mcp_resumption_proxy``; it instruments httpx process-wide, and the demo's own
client must stay outside what the proxy judges), with the console exporters;
its telemetry is read from that output when it exits. A router on each leg
records what crossed it: the wire truth. A row passes when the demo's client
(judged in-process, as every row's) matches its ground truth *and* what the
proxy counted on each leg (``mcp.resumption.leg``) equals what the two
routers' logs say it must count (``ScenarioWire.legs``).

The rows are skipped where ``mcp_resumption_proxy`` is not installed
(``pip install ./proxy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc

from .clients import MCP_MAJOR, WireEvent, response_id, sdk_streamable_session
from .fates import broken_request_fates
from .router import Backend, Exchange, ForwardedEvent, Route, Router
from .scenarios import (
    _GUARD_TIMEOUT_S,
    Scenario,
    ScenarioWire,
    _record_call,
    _staged,
)
from .servers import IntEventStore, sdk_streamable_app
from .stateless_scenarios import call_until_cut, cut_first_call

__all__ = ["SCENARIOS"]

_STEPS: Final = 3
_START_TIMEOUT_S: Final = 10.0
_SCOPE: Final = "opentelemetry.instrumentation.mcp_resumption"
# What the proxy counts, by leg, that the routers' logs also give.
_COUNTED: Final = (
    (sc.ATTEMPTS[0], sc.RESUMPTION_OUTCOME),
    (sc.SERVER_REQUESTS[0], sc.RESUMPTION_OUTCOME),
    (sc.BROKEN_REQUESTS[0], sc.REQUEST_FATE),
    (sc.GAPS[0], sc.GAP_KIND),
)


def prepare() -> str | None:
    if importlib.util.find_spec("mcp_resumption_proxy") is None:
        return "mcp-resumption-proxy is not installed (pip install ./proxy)"
    return None


def _source_paths() -> str:
    """Where the child finds the proxy and the plugin this process imports
    (an installed copy finds the same; a checkout run on PYTHONPATH needs them)."""
    import mcp_resumption_proxy
    import opentelemetry.instrumentation.mcp_resumption as plugin

    paths = [
        str(Path(mcp_resumption_proxy.__file__).resolve().parents[1]),
        str(Path(plugin.__file__).resolve().parents[3]),
        *os.environ.get("PYTHONPATH", "").split(os.pathsep),
    ]
    return os.pathsep.join(p for p in dict.fromkeys(paths) if p)


class _Proxy:
    """``python -m mcp_resumption_proxy --upstream URL ...`` until :meth:`close`,
    which returns what it counted."""

    def __init__(self, upstream: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHONPATH"))}
        env.update(
            PYTHONPATH=_source_paths(),
            OTEL_METRICS_EXPORTER="console",
            OTEL_TRACES_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_METRIC_EXPORT_INTERVAL="600000",  # one export, at exit
        )
        self._out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mcp_resumption_proxy", "--upstream", upstream, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._out,  # its verdict lines: the table says the same
            text=True,
        )
        self.url = self.process.stdout.readline().strip() if self.process.stdout else ""
        if not self.url.startswith("http://"):
            self.close()
            raise RuntimeError(f"mcp-resumption-proxy did not start: {self.url!r}")
        self.port = int(self.url.split("/", 3)[2].rsplit(":", 1)[1])
        self.counted: dict[str, int] = {}

    def close(self) -> dict[str, int]:
        """SIGTERM (its providers flush), then what it counted by leg."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            stdout, _ = self.process.communicate(timeout=_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            stdout, _ = self.process.communicate()
        self._out.close()
        return _leg_counts(stdout or "")


def _leg_counts(stdout: str) -> dict[str, int]:
    """Non-zero totals ``leg|metric|value`` in the console exporter's last export."""
    decoder, exports, position = json.JSONDecoder(), [], 0
    while (start := stdout.find("{", position)) != -1:
        try:
            document, position = decoder.raw_decode(stdout, start)
        except json.JSONDecodeError:
            position = start + 1
            continue
        if isinstance(document, dict) and "resource_metrics" in document:
            exports.append(document)
    totals: dict[str, int] = {}
    for resource in exports[-1]["resource_metrics"] if exports else ():
        for scope in resource["scope_metrics"]:
            if scope["scope"]["name"] != _SCOPE:
                continue
            for metric in scope["metrics"]:
                for name, attribute in _COUNTED:
                    if metric["name"] != name:
                        continue
                    for point in metric["data"]["data_points"]:
                        leg = point["attributes"].get(sc.RESUMPTION_LEG)
                        key = f"{leg}|{name}|{point['attributes'].get(attribute)}"
                        totals[key] = totals.get(key, 0) + int(point.get("value", 0))
    return {key: value for key, value in totals.items() if value}


def _after_progress(event: ForwardedEvent) -> bool:
    return "notifications/progress" in event.data


def _cuts_first_call(backend: Backend, *, drain: bool = False) -> Any:
    """Cut the first tools/call's stream right after its first progress
    notification (whatever priming event the server or the proxy sent).
    ``drain``: the router then reads the rest of the answer to its end, as a
    connection that died on the client's side only: the one behind it (the
    proxy) forwards the whole answer, past what its client got."""
    return cut_first_call(backend, sever_after=_after_progress, drain_upstream=drain)


def _answers(exchange: Exchange, request_id: object) -> bool:
    return any(response_id(WireEvent(e.id, e.event, e.data)) == request_id for e in exchange.events)


def _faithful(stream: Exchange, resume: Exchange) -> bool:
    """Every event of ``resume`` whose id ``stream`` carried before carries
    the same data again."""
    read = {e.id: e.data for e in stream.events if e.id is not None}
    return all(read.get(e.id, e.data) == e.data for e in resume.events if e.id is not None)


def _legs_on_the_wire(
    client_leg: list[Exchange], upstream_leg: list[Exchange], drained: bool = False
) -> dict[str, int]:
    """What the proxy must count on each leg, from the routers' logs.

    ``client_proxy``: each resume the client made to the proxy is ``replayed``
    when its Last-Event-ID is one the proxy sent this client before and the
    resume was answered (below 400; a cursor the proxy never sent, or a
    resume it could not forward, is counted apart, off these metrics); each
    call whose stream the client's router cut before its answer crossed has
    the fate the client leg's log gives it (``answered``, ``reissued``,
    ``lost``; each lost one also its ``orphaned_request`` gap), unless the
    client's router read the proxy's answer on after the cut (``drained``):
    the proxy then wrote every answer to its peer, and nothing broke on its
    side of that leg.
    ``proxy_server``: each resume the proxy made to the server is
    ``resumed`` when it was answered (200) with the answer to the call whose
    stream carried its Last-Event-ID, and every event it replayed
    that the proxy had read before (a cursor behind what the proxy read)
    came back with the same data (anything else is left unmodelled: the row
    fails rather than guess); each call whose stream the
    upstream router cut has the fate ``answered`` when a later exchange
    carried its answer, else ``lost``.
    """
    truth: dict[str, int] = {}

    def count(leg: str, metric: str, value: str) -> None:
        key = f"{leg}|{metric}|{value}"
        truth[key] = truth.get(key, 0) + 1

    sent: set[str] = set()
    for exchange in client_leg:
        if (cursor := exchange.last_event_id_sent) is not None and cursor in sent and (
            exchange.status is not None and exchange.status < 400
        ):
            count(sc.LEG_CLIENT_PROXY, sc.SERVER_REQUESTS[0], "replayed")
        sent.update(e.id for e in exchange.events if e.id is not None)
    for fate, n in ({} if drained else broken_request_fates(client_leg)).items():
        for _ in range(n):
            count(sc.LEG_CLIENT_PROXY, sc.BROKEN_REQUESTS[0], fate)
            if fate == "lost":
                count(sc.LEG_CLIENT_PROXY, sc.GAPS[0], "orphaned_request")
    for index, exchange in enumerate(upstream_leg):
        later = upstream_leg[index + 1 :]
        if exchange.severed:
            request_id = (exchange.request.jsonrpc or {}).get("id")
            answered = any(_answers(x, request_id) for x in later)
            count(sc.LEG_PROXY_SERVER, sc.BROKEN_REQUESTS[0], "answered" if answered else "lost")
            if not answered:
                count(sc.LEG_PROXY_SERVER, sc.GAPS[0], "orphaned_request")
        if (cursor := exchange.last_event_id_sent) is not None:
            stream = next(
                (x for x in upstream_leg[:index] if any(e.id == cursor for e in x.events)), None
            )
            request_id = (stream.request.jsonrpc or {}).get("id") if stream else None
            ok = (
                exchange.status == 200
                and stream is not None
                and _answers(exchange, request_id)
                and _faithful(stream, exchange)
            )
            count(sc.LEG_PROXY_SERVER, sc.ATTEMPTS[0], "resumed" if ok else "unmodelled")
    return truth


@contextlib.asynccontextmanager
async def _proxied(
    *, store: bool, cut: str, proxy_args: tuple[str, ...] = (), drain: bool = False,
    answer_when: threading.Event | None = None,
) -> AsyncIterator[tuple[Router, Router, _Proxy]]:
    """The SDK server (with or without an event store), a router before it
    (the upstream leg), the proxy, and the client's router in front of the
    proxy (the scenario's router); ``cut``: ``upstream`` or ``client``;
    ``drain``: the cutting router reads the answer on (``_cuts_first_call``);
    ``answer_when``: the server's ``slow`` answers once it is set."""
    async with _staged() as stage:
        server = await stage.serve(
            "sdk-stateful" if store else "sdk-no-store",
            sdk_streamable_app(event_store=IntEventStore() if store else None,
                               answer_when=answer_when),
        )
        upstream = await Router(
            _cuts_first_call(server, drain=drain) if cut == "upstream" else lambda r: Route(server)
        ).start()
        try:
            proxy = await asyncio.to_thread(_Proxy, f"{upstream.url}/mcp", *proxy_args)
            try:
                backend = Backend(name="proxy", port=proxy.port)
                client = await stage.route(
                    _cuts_first_call(backend, drain=drain)
                    if cut == "client"
                    else lambda r: Route(backend)
                )
                yield client, upstream, proxy
            finally:
                # the client's router closes with the stage; the proxy first
                # would end streams the client router still holds
                await client.close()
                proxy.counted = await asyncio.to_thread(proxy.close)
        finally:
            await upstream.close()


async def _proxied_row(
    name: str, *, store: bool, cut: str, resumable: bool, drain: bool = False,
    lost: bool = False,
) -> ScenarioWire:
    """``lost``: nothing can bring the cut call's answer (no event id to
    resume with): the application stops waiting once the cut stream ended."""
    args = ("--resumable",) if resumable else ()
    wire = ScenarioWire(name, MCP_MAJOR, transport_before="streamable-http")
    # Where the row's truth depends on it, the server answers only once the
    # proxy knows its client's stream is gone (else the answer may be written
    # to the cut connection before the proxy hears of the cut, which no log
    # tells apart): lost, once the proxy left the call's upstream stream;
    # with --resumable, once the client resumes.
    gate = threading.Event() if lost or (resumable and cut == "client") else None
    async with (
        _proxied(store=store, cut=cut, proxy_args=args, drain=drain, answer_when=gate) as (
            client, upstream, proxy),
        sdk_streamable_session(f"{client.url}/mcp") as session,
    ):
        opened = None
        if gate is not None:
            opened = asyncio.ensure_future(_open_when(
                upstream if lost else client, gate,
                _proxy_left if lost else _client_resumed))
        if lost:
            with contextlib.suppress(Exception):  # what the SDK raises is its business
                wire.tool_result = await call_until_cut(session, client)
        else:
            wire.tool_result = await session.call_tool(
                "slow", {"steps": _STEPS}, read_timeout=_GUARD_TIMEOUT_S
            )
        if opened is not None:
            await opened
    exchanges = client.exchanges
    _record_call(wire, exchanges)
    wire.severed = any(x.severed for x in exchanges + upstream.exchanges)
    # the client leg's broken call, as the demo's client half must count it
    wire.fates = broken_request_fates(exchanges)
    wire.upstream_exchanges = upstream.exchanges
    wire.legs = proxy.counted
    wire.legs_on_the_wire = _legs_on_the_wire(exchanges, upstream.exchanges, drained=drain)
    return wire


def _proxy_left(exchanges: list[Exchange]) -> bool:
    """The proxy closed the call's stream to the server (the upstream's log)."""
    return any(x.request.jsonrpc_method == "tools/call" and x.client_closed for x in exchanges)


def _client_resumed(exchanges: list[Exchange]) -> bool:
    """The client resumed at the proxy (the client leg's log)."""
    return any(x.last_event_id_sent is not None for x in exchanges)


async def _open_when(router: Router, gate: threading.Event, happened: Any) -> None:
    """Set ``gate`` once ``happened`` holds for ``router``'s log (or its bound passed)."""
    try:
        with contextlib.suppress(TimeoutError):
            await router.wait_for(happened)
    finally:
        gate.set()


async def _proxy_cut_upstream() -> ScenarioWire:
    return await _proxied_row("proxy_cut_upstream", store=True, cut="upstream", resumable=False)


async def _proxy_cut_client() -> ScenarioWire:
    # The client's router reads the proxy's answer on after the cut: the proxy
    # has forwarded the whole answer, and the client resumes from behind it.
    return await _proxied_row(
        "proxy_cut_client", store=True, cut="client", resumable=False, drain=True
    )


async def _proxy_cut_client_no_store() -> ScenarioWire:
    return await _proxied_row(
        "proxy_cut_client_no_store", store=False, cut="client", resumable=False, lost=True
    )


async def _proxy_resumable_no_store() -> ScenarioWire:
    return await _proxied_row("proxy_resumable_no_store", store=False, cut="client", resumable=True)


_PATH: Final = (
    "the SDK client -> a router (leg client_proxy) -> mcp-resumption-proxy -> a router "
    "(leg proxy_server) -> the SDK server; the client calls tools/call slow"
)

SCENARIOS = (
    Scenario(
        name="proxy_cut_upstream",
        happened=(
            f"Through the proxy in observe mode: {_PATH} (event store). The upstream router "
            "cuts the call's stream between proxy and server after the priming event and the "
            "first progress notification. The proxy passes the break on; the SDK client "
            "resumes through it with Last-Event-ID, the proxy forwards the resume (replayed on "
            "client_proxy), the server replays after the cursor and the answer arrives: on "
            "proxy_server the broken call is answered and the resume resumed."
        ),
        expected_gaps=(),
        expected_outcome="resumed",
        run=_proxy_cut_upstream,
        prepare=prepare,
    ),
    Scenario(
        name="proxy_cut_client",
        happened=(
            f"Through the proxy in observe mode: {_PATH} (event store). The client's router "
            "cuts the call's stream between client and proxy after the priming event and the "
            "first progress notification, and reads the rest on: the proxy forwarded the whole "
            "answer, its client got the first progress only. The client's resume, from behind "
            "what the proxy read, reaches the server through the proxy, which counts it "
            "replayed on client_proxy; the server replays the same events the proxy read, and "
            "the answer arrives: resumed on proxy_server."
        ),
        expected_gaps=(),
        expected_outcome="resumed",
        run=_proxy_cut_client,
        prepare=prepare,
    ),
    Scenario(
        name="proxy_cut_client_no_store",
        happened=(
            f"Through the proxy in observe mode: {_PATH}, a server without an event store (its "
            "events carry no id). The client's router cuts the call's stream between client and "
            "proxy after the first progress notification: the client has no id to resume with, "
            "and the server answers once the proxy has left the call's upstream stream: the "
            "answer reaches no one. Only the proxy can see this loss: it counts the call lost "
            "on client_proxy (between client and proxy), with its orphaned_request gap and its "
            "lost-call line; nothing broke on proxy_server."
        ),
        expected_gaps=("orphaned_request",),
        expected_outcome="not_resumable",
        run=_proxy_cut_client_no_store,
        prepare=prepare,
    ),
    Scenario(
        name="proxy_resumable_no_store",
        happened=(
            f"mcp-resumption-proxy --resumable: {_PATH}, a server without an event store (its "
            "events carry no id). The client's router cuts the call's stream after the first "
            "progress notification, which the proxy numbered. The proxy reads on; the client "
            "resumes with the proxy's id and is served from the proxy's buffer: every event "
            "once, in order, and the answer; the server never sees a resume. Without "
            "--resumable the event would carry no id and the call would be lost."
        ),
        expected_gaps=(),
        expected_outcome="resumed",
        run=_proxy_resumable_no_store,
        prepare=prepare,
    ),
)
