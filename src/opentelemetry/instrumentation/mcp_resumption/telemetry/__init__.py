# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The telemetry: every name this instrumentation writes, the facts of one
request it writes about, redaction, the sink (spans, log events, metrics)
and the verdict lines."""
