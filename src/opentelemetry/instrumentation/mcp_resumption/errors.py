# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""What enforce mode raises into a stream's reader: :class:`ResumptionGapError`
(:class:`ResumeCursorRaceError` for the drain race).

Pure and alone: standard library only, and nothing else of the package, so
that the patches, which raise and let pass these errors and decide nothing,
import them without loading the rules (``continuity``).
"""

from __future__ import annotations

__all__ = ["ResumeCursorRaceError", "ResumptionGapError"]


class ResumptionGapError(RuntimeError):
    """Raised when a resumed MCP stream cannot be proven continuous."""


class ResumeCursorRaceError(ResumptionGapError):
    """The cursor names an event the application never consumed, and the
    server replayed strictly after it: that event is lost exactly once."""
