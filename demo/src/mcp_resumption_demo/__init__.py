# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""The demo's wire side: the seeds' failures reproduced on 127.0.0.1 sockets.

* ``loopback``: run an ASGI app with uvicorn on a free port in a background thread.
* ``servers``: the hand-written legacy/fleet instances and the installed SDK's
  streamable-HTTP server with integer, prefixed and UUID event stores.
* ``router``: the load balancer: a streaming reverse proxy that routes by
  policy and can sever an SSE response after a chosen event.
* ``clients``: raw clients on the EventSource APIs the plugin hooks, and the SDK
  clients of the installed major (the one place that knows which it is).
* ``scenarios``: each seed scenario with its ground truth; ``run_scenario(name)``.

Nothing is imported here, so that importing the package needs no MCP SDK.
"""
