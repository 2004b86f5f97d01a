# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0

# Released together with the plugin, which it pins to the same version: the
# engine table drives the plugin's tracker directly.
__version__ = "0.1.0"
