# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""``mcp-resumption-proxy --upstream URL [--listen HOST:PORT] [--mode observe|enforce]``

Prints the URL clients should use as its first line, then serves until
interrupted.  Alone, it sets up the OpenTelemetry SDK from the standard
``OTEL_*`` variables (exporters, endpoint, resource); under
``opentelemetry-instrument`` it takes the providers that set up.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import Any

import httpx

_logger = logging.getLogger("mcp_resumption_proxy")

MODES = ("observe", "enforce")


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


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
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


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    import uvicorn

    from . import shared
    from .app import ProxyApp
    from .downstream import DownstreamView

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
    app = ProxyApp(
        args.upstream,
        downstream=DownstreamView.for_leg(
            shared=None if store is None else shared.SharedCursors(store, args.upstream)
        ),
        enforce=enforcing,
        stream_error=stream_errors(processor) if enforcing else None,
        resumable=args.resumable,
        enforced_errors=processor.enforced_errors if enforcing else None,
        shared_relays=None if store is None or not args.resumable else shared.SharedRelays(store),
    )
    host, port = args.listen
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        print(f"mcp-resumption-proxy: cannot listen on {host}:{port} ({error})", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
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
        timeout_graceful_shutdown=2,
    )
    server = _Server(config, client_url(args.upstream, host, port))
    server.run(sockets=[sock])
    return 0


class _Server:
    """uvicorn's server, printing the client URL once it accepts connections."""

    def __new__(cls, config: Any, url: str) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets=sockets)
                print(url, flush=True)

            def handle_exit(self, sig: int, frame: Any) -> None:
                # uvicorn raises a caught SIGTERM again once it has shut down,
                # which ends the process before atexit: the telemetry
                # providers' last export and the client half's summary are
                # made there.  A graceful stop is a normal exit.
                super().handle_exit(sig, frame)
                self._captured_signals.clear()

        return Server(config)


if __name__ == "__main__":
    sys.exit(main())
