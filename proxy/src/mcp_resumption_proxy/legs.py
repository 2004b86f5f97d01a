# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The two legs of the proxy, each reported by one of the plugin's halves,
and the one attribute that tells them apart.

The halves write their telemetry through the providers they are given, and
know nothing of proxies.  Rather than teach them, each leg gets providers
that add ``mcp.resumption.leg`` to every metric point, span and log record
written through them: the upstream leg (the proxy as an httpx client of the
server) is the client half as it stands, on ``proxy_server`` providers; the
downstream leg (the resumes clients make to the proxy) is the server half's
observer on ``client_proxy`` providers.  Everything else is forwarded to the
wrapped provider, so the SDK's own behaviour (span processors, readers,
shutdown) is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry._logs import get_logger_provider
from opentelemetry.metrics import Observation

from opentelemetry import metrics, trace
from opentelemetry.instrumentation.mcp_resumption.telemetry import semconv as sc
from opentelemetry.instrumentation.mcp_resumption.telemetry.verdict_log import verdicts

CLIENT_PROXY = sc.LEG_CLIENT_PROXY
PROXY_SERVER = sc.LEG_PROXY_SERVER
# What a user reads beside the attribute's value in every line of the proxy.
WORDS = {CLIENT_PROXY: "between client and proxy", PROXY_SERVER: "between proxy and server"}


def named(leg: str) -> str:
    """`` leg=client_proxy (between client and proxy)``: what ends a line about ``leg``."""
    return f" leg={leg} ({WORDS[leg]})"


class _Forwarding:
    """Anything not overridden goes to the wrapped object."""

    def __init__(self, inner: Any, leg: str) -> None:
        self._inner = inner
        self._leg = leg

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _tagged(self, attributes: Mapping[str, Any] | None) -> dict[str, Any]:
        return {**(attributes or {}), sc.RESUMPTION_LEG: self._leg}


# ------------------------------------------------------------------ metrics


class _Instrument(_Forwarding):
    def add(self, amount: Any, attributes: Mapping[str, Any] | None = None, *a: Any,
            **k: Any) -> None:
        self._inner.add(amount, self._tagged(attributes), *a, **k)

    def record(self, amount: Any, attributes: Mapping[str, Any] | None = None, *a: Any,
               **k: Any) -> None:
        self._inner.record(amount, self._tagged(attributes), *a, **k)

    def set(self, amount: Any, attributes: Mapping[str, Any] | None = None, *a: Any,
            **k: Any) -> None:
        self._inner.set(amount, self._tagged(attributes), *a, **k)


class _Meter(_Forwarding):
    def _synchronous(self, create: str) -> Callable[..., Any]:
        def make(*args: Any, **kwargs: Any) -> _Instrument:
            return _Instrument(getattr(self._inner, create)(*args, **kwargs), self._leg)

        return make

    def _observable(self, create: str) -> Callable[..., Any]:
        def make(name: str, callbacks: Iterable[Callable[..., Any]] | None = None,
                 *args: Any, **kwargs: Any) -> Any:
            wrapped = [self._callback(callback) for callback in callbacks or ()]
            return getattr(self._inner, create)(name, wrapped, *args, **kwargs)

        return make

    def _callback(self, callback: Callable[..., Any]) -> Callable[..., Any]:
        def observe(options: Any) -> list[Observation]:
            return [
                Observation(o.value, self._tagged(o.attributes), getattr(o, "context", None))
                for o in callback(options)
            ]

        return observe

    def __getattr__(self, name: str) -> Any:
        if name.startswith("create_observable_"):
            return self._observable(name)
        if name.startswith("create_"):
            return self._synchronous(name)
        return getattr(self._inner, name)


class LegMeterProvider(_Forwarding):
    """A MeterProvider whose instruments add the leg to every point."""

    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return _Meter(self._inner.get_meter(*args, **kwargs), self._leg)


# ------------------------------------------------------------------ traces


class _Tracer(_Forwarding):
    def start_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["attributes"] = self._tagged(kwargs.get("attributes"))
        return self._inner.start_span(name, *args, **kwargs)

    def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["attributes"] = self._tagged(kwargs.get("attributes"))
        return self._inner.start_as_current_span(name, *args, **kwargs)


class LegTracerProvider(_Forwarding):
    """A TracerProvider whose spans carry the leg (a span's gap events are
    about its leg)."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return _Tracer(self._inner.get_tracer(*args, **kwargs), self._leg)


# -------------------------------------------------------------------- logs


class _Logger(_Forwarding):
    def emit(self, record: Any = None, **kwargs: Any) -> None:
        if record is None:
            kwargs["attributes"] = self._tagged(kwargs.get("attributes"))
            self._inner.emit(**kwargs)
            return
        record.attributes = self._tagged(getattr(record, "attributes", None))
        self._inner.emit(record, **kwargs)


class LegLoggerProvider(_Forwarding):
    def get_logger(self, *args: Any, **kwargs: Any) -> Any:
        return _Logger(self._inner.get_logger(*args, **kwargs), self._leg)


def providers(
    leg: str,
    *,
    tracer_provider: Any | None = None,
    meter_provider: Any | None = None,
    logger_provider: Any | None = None,
) -> dict[str, Any]:
    """The given providers (else the global ones, which must be set by now)
    wrapped for ``leg``, as ``instrument()`` keyword arguments."""
    if leg == PROXY_SERVER:
        # The client half's lines (verdicts, lost calls, the summary) are the
        # upstream leg's, unless a server is named for the client leg.
        verdicts.set_leg(None, named(PROXY_SERVER))
    return {
        "tracer_provider": LegTracerProvider(
            tracer_provider or trace.get_tracer_provider(), leg
        ),
        "meter_provider": LegMeterProvider(meter_provider or metrics.get_meter_provider(), leg),
        "logger_provider": LegLoggerProvider(logger_provider or get_logger_provider(), leg),
    }
