# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The pure core: what a stream, an event id, a resume, a JSON-RPC message,
a broken request, a subscription, a task and an Events subscription prove.
The standard library only, no OpenTelemetry, so the rules can be read,
tested and reused alone."""
