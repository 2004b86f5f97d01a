# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The installed MCP SDK's server over stdio, with the demo's tools: what a
bridge (npm ``supergateway``) puts behind streamable HTTP in the bridge row.

Run as ``python -m mcp_resumption_demo.stdio_server``."""

from __future__ import annotations

from .servers import _register_tools, _SdkServer


def main() -> None:
    server = _SdkServer("demo-stdio", log_level="WARNING")
    _register_tools(server)
    server.run("stdio")


if __name__ == "__main__":
    main()
