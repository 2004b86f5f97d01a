# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""The owner: ``ResumptionMonitor`` and its parts, the one holder of the
client side's state, which the patches report to; its timers; and its
span-processor face, ``ContinuityProcessor``."""
