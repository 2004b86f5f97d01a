# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""``OTEL_PYTHON_MCP_RESUMPTION_*`` settings.

An invalid value never stops the host: it logs one warning naming the
variable and the accepted values, and the default applies.  One warning per
process: the settings are read more than once (the client half, the server
half, each ``instrument()`` cycle), and a repeated line would read as a
second mistake.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from .rules.continuity import ReplayContract

_logger = logging.getLogger(__name__)
# (variable, value) pairs warned about already: a logging de-dup for the
# process, as the patches' fault log is, not a setting.
_warned: set[tuple[str, str]] = set()

MODE = "OTEL_PYTHON_MCP_RESUMPTION_MODE"
REPLAY_CONTRACT = "OTEL_PYTHON_MCP_RESUMPTION_REPLAY_CONTRACT"
CONFIRM_TIMEOUT = "OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT"
SESSION_ID = "OTEL_PYTHON_MCP_RESUMPTION_SESSION_ID"
MAX_STREAMS = "OTEL_PYTHON_MCP_RESUMPTION_MAX_STREAMS"
REDACT_URLS = "OTEL_PYTHON_MCP_RESUMPTION_REDACT_URLS"
EVENT_ID_PATTERN = "OTEL_PYTHON_MCP_RESUMPTION_EVENT_ID_PATTERN"
OPERATION_METRIC = "OTEL_PYTHON_MCP_RESUMPTION_OPERATION_METRIC"
# Shared state (docs/shared-state.md): a Redis URL, and the key of the hash
# that names sessions in it (and in telemetry).
STATE = "OTEL_PYTHON_MCP_RESUMPTION_STATE"
STATE_KEY = "OTEL_PYTHON_MCP_RESUMPTION_STATE_KEY"

MODES = ("observe", "enforce")
SESSION_ID_POLICIES = ("hash", "raw", "omit")


@dataclass(frozen=True)
class Settings:
    mode: str = "observe"
    replay_contract: ReplayContract = ReplayContract.EXCLUSIVE
    confirm_timeout: float = 5.0
    session_id: str = "hash"
    max_streams: int = 10_000
    redact_urls: bool = True
    # The servers' declared event-id scheme: a regex with a named group
    # ``counter`` (decimal digits) and optionally ``stream``; None: inferred.
    event_id_pattern: re.Pattern[str] | None = None
    # mcp.client.operation.duration: one histogram point per request (the
    # SDK's record is most of its cost; off for who has the metric elsewhere).
    operation_metric: bool = True
    # Where state is shared: None (memory, the default) or a redis:// or
    # rediss:// URL; and the key every process of the fleet hashes session
    # ids with (None: a random key per process, so nothing can be shared).
    state: str | None = None
    state_key: bytes | None = None

    @property
    def enforce(self) -> bool:
        return self.mode == "enforce"


def _warn(name: str, value: object, message: str, *args: object) -> None:
    """Log ``message`` unless this variable with this value was warned about."""
    key = (name, repr(value))
    if key in _warned:
        return
    _warned.add(key)
    _logger.warning(message, name, value, *args)


def _choice(name: str, value: object, accepted: tuple[str, ...], default: str) -> str:
    text = str(value).strip().lower()
    if text in accepted:
        return text
    _warn(name, value, "%s=%r is not one of %s; using %r", ", ".join(accepted), default)
    return default


def _number(name: str, value: object, default: float, *, integer: bool) -> float:
    try:
        number = int(str(value).strip()) if integer else float(str(value).strip())
    except (TypeError, ValueError):
        number = -1
    if number > 0 and math.isfinite(number):
        return number
    kind = "a positive integer" if integer else "a positive number of seconds"
    _warn(name, value, "%s=%r is not %s; using %r", kind, default)
    return default


def _pattern(name: str, value: object) -> re.Pattern[str] | None:
    if isinstance(value, re.Pattern):
        pattern = value
    else:
        try:
            pattern = re.compile(str(value))
        except re.error as error:
            _warn(
                name, value,
                "%s=%r is not a regular expression (%s); event ids are classified by their shape",
                error,
            )
            return None
    if "counter" not in pattern.groupindex:
        _warn(
            name, value,
            "%s=%r has no named group 'counter' (and optionally 'stream'); event ids are "
            "classified by their shape",
        )
        return None
    return pattern


def load(
    overrides: Mapping[str, object] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Settings from keyword ``overrides`` (``instrument(mode=...)``) first,
    then the environment, then the defaults."""
    env = os.environ if env is None else env
    overrides = overrides or {}
    defaults = Settings()

    def raw(key: str, variable: str) -> object | None:
        value = overrides.get(key)
        if value is None:
            value = env.get(variable) or None
        return value

    mode = raw("mode", MODE)
    contract = raw("replay_contract", REPLAY_CONTRACT)
    if isinstance(contract, ReplayContract):
        contract = contract.value
    timeout = raw("confirm_timeout", CONFIRM_TIMEOUT)
    session_id = raw("session_id", SESSION_ID)
    max_streams = raw("max_streams", MAX_STREAMS)
    redact = raw("redact_urls", REDACT_URLS)
    if isinstance(redact, bool):
        redact = str(redact)
    pattern = raw("event_id_pattern", EVENT_ID_PATTERN)
    state = raw("state", STATE)
    state_key = raw("state_key", STATE_KEY)
    if isinstance(state_key, str):
        state_key = state_key.encode("utf-8")
    operations = raw("operation_metric", OPERATION_METRIC)
    if isinstance(operations, bool):
        operations = str(operations)
    return Settings(
        mode=defaults.mode if mode is None else _choice(MODE, mode, MODES, defaults.mode),
        replay_contract=ReplayContract(
            defaults.replay_contract.value
            if contract is None
            else _choice(
                REPLAY_CONTRACT,
                contract,
                tuple(c.value for c in ReplayContract),
                defaults.replay_contract.value,
            )
        ),
        confirm_timeout=defaults.confirm_timeout
        if timeout is None
        else _number(CONFIRM_TIMEOUT, timeout, defaults.confirm_timeout, integer=False),
        session_id=defaults.session_id
        if session_id is None
        else _choice(SESSION_ID, session_id, SESSION_ID_POLICIES, defaults.session_id),
        max_streams=defaults.max_streams
        if max_streams is None
        else int(_number(MAX_STREAMS, max_streams, defaults.max_streams, integer=True)),
        redact_urls=defaults.redact_urls
        if redact is None
        else _choice(REDACT_URLS, redact, ("true", "false"), "true") == "true",
        event_id_pattern=None if pattern is None else _pattern(EVENT_ID_PATTERN, pattern),
        operation_metric=defaults.operation_metric
        if operations is None
        else _choice(OPERATION_METRIC, operations, ("true", "false"), "true") == "true",
        state=None if state is None else str(state).strip() or None,
        state_key=state_key if isinstance(state_key, bytes) and state_key else None,
    )


def warn_state(url: str, why: str) -> None:
    """The shared state cannot be used: one warning per process and reason,
    and the plugin runs in memory (``monitor``)."""
    _warn(
        STATE, without_password(url),
        "%s=%r cannot be used (%s); the state stays in this process's memory", why,
    )


def without_password(url: str) -> str:
    """``url`` as it may be logged: a password in it is replaced."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


SERVER_GUARD = "OTEL_PYTHON_MCP_RESUMPTION_SERVER_GUARD"
SERVER_GUARDS = ("off", "reject")


def load_server_guard(override: object | None = None, env: Mapping[str, str] | None = None) -> str:
    """The server guard: ``instrument(guard=...)`` first, then the environment.
    A function of its own beside ``load``: only the server instrumentor reads it."""
    env = os.environ if env is None else env
    value = override if override is not None else (env.get(SERVER_GUARD) or None)
    return SERVER_GUARDS[0] if value is None else _choice(SERVER_GUARD, value, SERVER_GUARDS, "off")
