#!/usr/bin/env bash
# Validate the Prometheus alert rules and run their promtool unit tests.
# Usage: bash dashboards/check.sh   (from anywhere; exits non-zero on any failure)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v promtool >/dev/null 2>&1; then
    echo "check.sh: promtool not found on PATH; install it with: apt-get install -y prometheus" >&2
    exit 2
fi

promtool check rules dashboards/alerts.yaml
promtool test rules dashboards/alerts.test.yaml
promtool check rules dashboards/alerts-server.yaml
promtool test rules dashboards/alerts-server.test.yaml
promtool check config dashboards/prometheus.yml
# the dashboards and the alert tests are generated: fail if they were edited by hand
"${PYTHON:-python3}" dashboards/generate.py --check
