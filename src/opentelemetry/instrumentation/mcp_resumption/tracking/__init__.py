# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The tracker and its rooms: the streams, sessions and requests of one
client process, under one lock, asking the rules.  Pure, like the rules."""
