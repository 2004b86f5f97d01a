# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""mcp-resumption-proxy: an MCP HTTP proxy whose two legs are judged by the
plugin's two halves.

The upstream leg (the proxy as an httpx client of the server) is observed by
the client half as it stands; the downstream leg (each resume a client makes
to the proxy) is reported by the server half's observer.  Every finding
carries ``mcp.resumption.leg``: ``proxy_server`` or ``client_proxy``.
"""

from .app import ProxyApp
from .downstream import DownstreamView
from .version import __version__

__all__ = ["DownstreamView", "ProxyApp", "__version__"]
