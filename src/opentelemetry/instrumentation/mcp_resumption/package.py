# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

# The instrumentor loads when any one of these is installed: mcp 1.x brings
# httpx (+ httpx-sse), mcp 2.x brings httpx2.  The same list as the
# `instruments-any` extra of pyproject.toml (tests/test_packaging.py).
_instruments_httpx = ("httpx >= 0.27.1", "httpx-sse >= 0.4")
_instruments_httpx2 = ("httpx2 >= 2.5",)

_instruments = ()
_instruments_any = (*_instruments_httpx, *_instruments_httpx2)

_supports_metrics = True
