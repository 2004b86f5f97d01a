# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Patches that observe MCP traffic and report facts to their owner.

Each patches module has ``targets(owner)``: what it wraps, each wrapper with
the owner (the ``ContinuityProcessor`` that ``instrument()`` made) bound in
by ``functools.partial``, as the contrib instrumentations bind their tracer.
No patch reads state from a module: the owner holds it all.

Every patch catches its own faults, logs once and lets the host's call go
on; the only exception that may leave a patch on purpose is the gap error
of enforce mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

from opentelemetry.instrumentation.utils import unwrap
from wrapt import register_post_import_hook, wrap_function_wrapper

from ..errors import ResumptionGapError

_logger = logging.getLogger(__name__)
# Sites whose fault was logged already: a logging de-dup for the process (a
# fault is ours, whichever instrument() cycle hit it), not state of an owner.
_reported: set[str] = set()

T = TypeVar("T")


def fault(site: str) -> None:
    """Something we got wrong at ``site``: logged once, the host goes on.
    Call from an ``except`` block."""
    if site not in _reported:
        _reported.add(site)
        _logger.warning(
            "mcp-resumption: %s failed; continuity checks skip it, the application "
            "is unaffected",
            site,
            exc_info=True,
        )


def guarded(site: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    try:
        return function(*args, **kwargs)
    except ResumptionGapError:
        # Enforce mode: told to the task's reconnect loop by the owner, where
        # it raised the error; the application is meant to get it.
        raise
    except Exception:  # the host's call must go on whatever we got wrong
        fault(site)
        return None


# What a patches module wraps: ("Class.method", wrapt wrapper) pairs, made
# for one owner by the module's ``targets(owner)``.
Targets = Iterable[tuple[str, Callable[..., Any]]]
# What was wrapped: (class, method name) pairs, as ``unwrap`` takes them.
Patched = list[tuple[Any, str]]


def wrap_targets(module: ModuleType, targets: Targets) -> Patched:
    """Wrap each ``Class.method`` of ``module`` with its wrapper, the way
    the contrib instrumentations do (``wrapt.wrap_function_wrapper``), and
    return what was wrapped, for :func:`unwrap_all`.  A target the library
    lacks is skipped and the others are still observed (httpx2 before 2.5
    has no ``EventSource``; older MCP SDKs lack a reconnect method)."""
    patched: Patched = []
    for target, wrapper in targets:
        class_name, _, method = target.rpartition(".")
        # "function" alone: a function of the module itself
        owner = getattr(module, class_name, None) if class_name else module
        if owner is None or not hasattr(owner, method):
            _logger.debug("%s has no %s: not observed", module.__name__, target)
            continue
        wrap_function_wrapper(module, target, wrapper)
        patched.append((owner, method))
    return patched


def unwrap_all(patched: Patched) -> None:
    """Remove every patch :func:`wrap_targets` made (``unwrap``, as contrib's
    ``_uninstrument`` does)."""
    for owner, method in patched:
        unwrap(owner, method)


class Installation:
    """The patches of one ``instrument()``, made as each library is imported
    (at once for one imported already): a program that never imports a
    library pays nothing for it, not even its import."""

    def __init__(self) -> None:
        self.patched: Patched = []
        self.active = True

    def on_import(self, module_name: str, targets: Targets) -> None:
        register_post_import_hook(partial(self._patch, tuple(targets)), module_name)

    def _patch(self, targets: Targets, module: ModuleType) -> None:
        if not self.active:  # a hook of an earlier cycle, never removable from wrapt
            return
        try:
            self.patched += wrap_targets(module, targets)
        except Exception:  # runs inside the host's import: never fail it
            fault(f"patching {getattr(module, '__name__', module)}")

    def remove(self) -> None:
        self.active = False
        unwrap_all(self.patched)
        self.patched = []
