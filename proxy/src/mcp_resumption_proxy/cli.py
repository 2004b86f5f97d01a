# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""``mcp-resumption-proxy --upstream URL [--listen HOST:PORT] [--mode observe|enforce]
[--resumable] [--drain SECONDS] [--admin HOST:PORT] [--upstream-probe SECONDS]``

Prints the URL clients should use as its first line, then serves until
interrupted.  Alone, it sets up the OpenTelemetry SDK from the standard
``OTEL_*`` variables (exporters, endpoint, resource); under
``opentelemetry-instrument`` it takes the providers that set up.

SIGTERM (or Ctrl-C) stops it in this order: it stops accepting connections
and reports not ready; the streams still open get ``--drain`` seconds; what
is still open then is cut (``drain.py``); the app's shutdown runs (the
upstream client closed, the requests it could not deliver counted); the
telemetry's last export and the plugin's summary are made at exit, status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import socket
import sys
import time
from typing import Any

import httpx

_logger = logging.getLogger("mcp_resumption_proxy")

MODES = ("observe", "enforce")
# Long enough for most calls in flight to be answered, and well inside the
# grace periods of the usual supervisors (systemd's 90 s, Kubernetes' 30 s).
DRAIN_S = 10.0
# After the cut, the exchanges' return through their own path
# (drain.GRACE_S), then uvicorn's own cancellation: a last resort that is
# never reached when the cut works.
BACKSTOP_S = 0.5


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``HOST:`` or ``HOST`` (a free port), ``[v6]:PORT``."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif ":" in text:  # a bare IPv6 address
        host, port = text, ""
    else:
        host, port = text, ""
    try:
        number = int(port) if port else 0
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {port!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {port!r}")
    return host or "127.0.0.1", number


def _upstream(text: str) -> str:
    url = httpx.URL(text)
    if url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"not between 0 and 3600 seconds: {text!r}")
    return value


def _interval(text: str) -> float:
    value = _seconds(text)
    if value < 0.05:
        raise argparse.ArgumentTypeError(f"too short an interval: {text!r}")
    return value


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    from .client_events import CLOSE_MODES, UNSUBSCRIBE

    parser = argparse.ArgumentParser(
        prog="mcp-resumption-proxy",
        description="Forward MCP requests to an upstream server, judging both legs' "
        "stream resumption with opentelemetry-instrumentation-mcp-resumption.",
    )
    parser.add_argument("--upstream", required=True, type=_upstream,
                        help="the MCP server's URL (its path is the one clients use)")
    parser.add_argument("--listen", type=parse_listen, default=("127.0.0.1", 0),
                        help="HOST:PORT to listen on (default 127.0.0.1 and a free port); "
                        "anything wider than loopback exposes the upstream to that network")
    parser.add_argument("--mode", choices=MODES, default=None,
                        help="observe (default: OTEL_PYTHON_MCP_RESUMPTION_MODE, else observe) "
                        "or enforce")
    parser.add_argument("--resumable", action="store_true",
                        help="keep the events forwarded on each stream (bounded) under ids "
                        "of the proxy's, so that a client whose connection to the proxy "
                        "breaks resumes from the proxy; in observe mode only")
    parser.add_argument("--events-client-close", choices=CLOSE_MODES, default=UNSUBSCRIBE,
                        help="what a client's end of an events/stream push stream is when it "
                        "does not reopen it within the confirmation window: its unsubscribe "
                        "(default; 2026-07-28 unsubscribes by closing, which the proxy cannot "
                        "tell from a cut), or a cut, reported not_reopened on the client leg")
    parser.add_argument("--drain", type=_seconds, default=DRAIN_S, metavar="SECONDS",
                        help="at SIGTERM, how long the streams still open may run on before "
                        f"they are cut (default {DRAIN_S:g}); new connections are refused "
                        "at once")
    parser.add_argument("--admin", type=parse_listen, default=None, metavar="HOST:PORT",
                        help="serve GET /healthz (live) and /readyz (ready: the upstream "
                        "answers and the proxy is not draining) on this address of their own, "
                        "and /metrics with OTEL_METRICS_EXPORTER=prometheus; its URL is printed "
                        "to stderr")
    parser.add_argument("--upstream-probe", type=_interval, default=None, metavar="SECONDS",
                        help="how often the upstream is probed (a TCP connection, no HTTP "
                        "request) for readiness and for the unreachable/back log lines "
                        "(default 5)")
    return parser.parse_args(argv)


def setup_telemetry() -> None:
    """The SDK from the ``OTEL_*`` variables, unless a program (such as
    ``opentelemetry-instrument``) set providers up already."""
    from opentelemetry import trace

    if type(trace.get_tracer_provider()).__name__ != "ProxyTracerProvider":
        return
    os.environ.setdefault("OTEL_SERVICE_NAME", "mcp-resumption-proxy")
    try:
        from opentelemetry.sdk._configuration import _OTelSDKConfigurator

        _OTelSDKConfigurator().configure()
    except Exception as error:  # the proxy forwards without telemetry rather than not at all
        print(f"mcp-resumption-proxy: OpenTelemetry setup failed ({error})", file=sys.stderr)


def instrument_upstream(mode: str | None, **providers: Any) -> Any:
    """The client half on the upstream leg's providers.  Under
    ``opentelemetry-instrument`` it is instrumented already, on providers
    that do not say which leg: it is instrumented again on ours."""
    from opentelemetry.instrumentation.mcp_resumption import McpResumptionInstrumentor

    from . import legs

    instrumentor = McpResumptionInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    settings = {"mode": mode} if mode is not None else {}
    instrumentor.instrument(**legs.providers(legs.PROXY_SERVER, **providers), **settings)
    return instrumentor


def stream_errors(processor: Any) -> Any:
    """The error the client half decided for an upstream response, if any
    (set by its confirmation window's timer, raised only at a next read)."""
    streams = processor.streams

    def error_of(response: Any) -> BaseException | None:
        context = streams.get(response)
        return None if context is None else context.error

    return error_of


def client_url(upstream: str, host: str, port: int) -> str:
    url = httpx.URL(upstream)
    shown = f"[{host}]" if ":" in host else host
    target = url.raw_path.decode("ascii")
    return f"http://{shown}:{port}{target}"


def bound(host: str, port: int, what: str = "") -> socket.socket | None:
    """A TCP socket bound to ``host:port``, or None (said on stderr)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        print(f"mcp-resumption-proxy: {what}cannot listen on {host}:{port} ({error})",
              file=sys.stderr)
        return None
    return sock


def setup_logging() -> None:
    """The proxy's own lines (the upstream's reachability, the drain) to
    stderr, the message alone, where the program configured no logging."""
    logger = logging.getLogger("mcp_resumption_proxy")
    if not logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        if not logger.level:
            logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    import uvicorn

    from . import handoff, shared
    from .admin import PROBE_INTERVAL_S, UpstreamProbe
    from .app import ProxyApp
    from .downstream import DownstreamView
    from .drain import GRACE_S, Drain

    setup_logging()
    setup_telemetry()
    instrumentor = instrument_upstream(args.mode)
    processor = instrumentor.processor
    enforcing = processor is not None and processor.settings.enforce
    if enforcing and args.resumable:
        # Enforce fails a broken stream's requests; a resumable proxy keeps
        # them for the client's resume: one or the other.
        print("mcp-resumption-proxy: --resumable runs in observe mode only", file=sys.stderr)
        return 2
    # With OTEL_PYTHON_MCP_RESUMPTION_STATE the client half's store is shared
    # by the fleet; the downstream leg's cursors go through it too.
    store = shared.store_of(processor)
    probe = UpstreamProbe(args.upstream, interval=args.upstream_probe or PROBE_INTERVAL_S)
    proxy_app = ProxyApp(
        args.upstream,
        downstream=DownstreamView.for_leg(
            shared=None if store is None else shared.SharedCursors(store, args.upstream)
        ),
        enforce=enforcing,
        stream_error=stream_errors(processor) if enforcing else None,
        resumable=args.resumable,
        enforced_errors=processor.enforced_errors if enforcing else None,
        shared_relays=None if store is None or not args.resumable else shared.SharedRelays(store),
        reachability=probe,
    )
    if proxy_app.client_leg is not None:
        proxy_app.client_leg.events.on_close = args.events_client_close
    if store is not None and proxy_app.client_leg is not None:
        # Its undelivered answers at shutdown go to the fleet (handoff.py).
        leg = proxy_app.client_leg
        leg.fleet = handoff.FleetClaims(store, args.upstream, leg.window)
        # And the upstream leg's broken requests at exit too: the instance
        # that resumes them decides them, else the fleet's sweep.
        store.hands_at_exit = True
    # At the drain's end the app stops waiting for the answers it could not
    # deliver (they are lost, on their leg) before the cut, not after it.
    app = Drain(proxy_app, before_cut=getattr(proxy_app, "stop_waiting", None))
    host, port = args.listen
    sock = bound(host, port)
    if sock is None:
        return 2
    port = sock.getsockname()[1]
    if proxy_app.client_leg is not None:
        proxy_app.client_leg.home = proxy_app.client_leg.server_of({"server": (host, port)})
    admin_sock = None
    if args.admin is not None:
        admin_sock = bound(*args.admin, what="--admin: ")
        if admin_sock is None:
            return 2
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        # The access log prints paths and queries: the legacy transport's
        # carry the raw session id.
        access_log=False,
        # The client's address and scheme as the socket gives them: the proxy
        # appends its own peer to X-Forwarded-For, and the server decides
        # whom it trusts (uvicorn would put a forwarded address in their place).
        proxy_headers=False,
        lifespan="on",
        server_header=False,
        date_header=False,
        # A last resort: the drain cuts every stream first (drain.py).
        timeout_graceful_shutdown=args.drain + GRACE_S + BACKSTOP_S,
    )
    server = _Server(config, client_url(args.upstream, host, port), app, probe,
                     admin_sock, args.drain)
    server.run(sockets=[sock])
    return 0


class _Server:
    """uvicorn's server, printing the client URL once it accepts connections,
    with the upstream's probe and the admin address beside it, and the
    drain before its own shutdown."""

    def __new__(cls, config: Any, url: str, drain: Any, probe: Any,
                admin: socket.socket | None, drain_s: float) -> Any:
        import uvicorn

        from .admin import AdminServer, prometheus_metrics

        class Server(uvicorn.Server):
            _stop_asked: float | None = None

            async def startup(self, sockets: Any = None) -> None:
                self.admin = None
                if admin is not None:
                    self.admin = AdminServer(admin, ready=self.not_ready,
                                             metrics=prometheus_metrics())
                    await self.admin.start()
                probe.start()
                await super().startup(sockets=sockets)
                # What the imports and the setup made lives as long as the
                # process: out of the collector's sight, it costs no pass
                # while serving, and the exit no 0.2-0.5 s collection of it
                # (the drain's bound is the period plus 1 s).
                gc.freeze()
                print(url, flush=True)
                if self.admin is not None:
                    served = "/healthz, /readyz" + (", /metrics" if self.admin.metrics else "")
                    print(f"mcp-resumption-proxy: admin on {self.admin.url} ({served})",
                          file=sys.stderr, flush=True)

            def not_ready(self) -> str | None:
                # Not should_exit: the signal sets it up to a tick before
                # shutdown() closes the listener, and a probe must never see
                # "not ready" while a new connection is still accepted.
                if drain.draining:
                    return "shutting down"
                if probe.reachable is None:
                    return "the upstream not probed yet"
                if not probe.reachable:
                    return "the upstream is unreachable"
                return None

            def handle_exit(self, sig: int, frame: Any) -> None:
                if self._stop_asked is None:
                    self._stop_asked = time.monotonic()
                # uvicorn raises a caught SIGTERM again once it has shut down,
                # which ends the process before atexit: the telemetry
                # providers' last export and the client half's summary are
                # made there.  A graceful stop is a normal exit.
                super().handle_exit(sig, frame)
                self._captured_signals.clear()

            async def shutdown(self, sockets: Any = None) -> None:
                # Not ready, and no new exchange, in the same step as
                # uvicorn's shutdown closes the listening sockets (below).
                still_open = drain.begin()
                if still_open:
                    _logger.info(
                        "mcp-resumption-proxy: stopping: %d stream(s) open, given %g s "
                        "(--drain) before they are cut", still_open, drain_s)
                cutting = asyncio.ensure_future(self._cut_when_due())
                try:
                    await super().shutdown(sockets=sockets)
                finally:
                    cutting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await cutting
                    await probe.stop()
                    if self.admin is not None:
                        await self.admin.close()

            async def _cut_when_due(self) -> None:
                asked = self._stop_asked if self._stop_asked is not None else time.monotonic()
                # The drain ends at its period's end, or once no stream left
                # can carry an answer (drain.py).
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        drain.quiet(), max(0.0, asked + drain_s - time.monotonic()))
                cut = await drain.cut()
                if cut:
                    _logger.warning(
                        "mcp-resumption-proxy: the drain period (%g s) is over: %d stream(s) "
                        "still open were cut", drain_s, cut)

        return Server(config)


if __name__ == "__main__":
    sys.exit(main())
