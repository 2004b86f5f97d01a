# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The one registry of what a forked child must make new.

A fork copies a lock as it is (held, if another thread was inside it at that
moment, and then held for ever in the child) and no thread but the one that
forked.  Whatever holds a lock or a thread registers here and makes them new
in its ``_after_fork``.  Standard library only, so that the pure modules can
register too.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class MadeNewAfterFork(Protocol):
    def _after_fork(self) -> None: ...


_registered: weakref.WeakSet[MadeNewAfterFork] = weakref.WeakSet()


def renew_after_fork(held: MadeNewAfterFork) -> None:
    """Call ``held._after_fork()`` in every child forked while it lives."""
    _registered.add(held)


def _in_child() -> None:
    for held in list(_registered):
        held._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
