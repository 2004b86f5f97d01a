# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

"""The demo of opentelemetry-instrumentation-mcp-resumption: the seeds'
failures reproduced on 127.0.0.1 sockets, each with its ground truth.

A project of its own (``demo/``, distribution ``mcp-resumption-demo``), so that
the plugin's wheel carries only the instrumentation.

* ``loopback``: run an ASGI app with uvicorn on a free port in a background thread.
* ``servers``: the hand-written legacy/fleet instances and the installed SDK's
  streamable-HTTP server with integer, prefixed, UUID and reset event stores.
* ``typescript_server``: the TypeScript MCP SDK's server as a node process
  (its node project is ``ts_server/``), installed on first use.
* ``router``: the load balancer: a streaming reverse proxy that routes by
  policy and can sever an SSE response after a chosen event.
* ``clients``: raw clients on the EventSource APIs the plugin hooks, and the SDK
  clients of the installed major (the one place that knows which it is).
* ``scenarios``: the seed scenarios with their ground truth, and the registry
  (``all_scenarios()``; more rows come from the modules in
  ``scenarios.SCENARIO_MODULES``, such as ``ts_scenarios``).
* ``runner``: runs the scenarios with the plugin enabled and reads back what
  it detected; ``cli``: the ``mcp-resumption`` command.

Nothing is imported here, so that importing the package needs no MCP SDK.
"""
