# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Shared state: what a resume in another process needs of an ended stream,
the default store that shares nothing, and the Redis store a fleet shares
(below the tracker, which hands it records; never above it)."""
