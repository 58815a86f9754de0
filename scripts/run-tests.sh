#!/usr/bin/env bash
# The test suite on a fresh machine (what CI runs): set up, then pytest. GPU tests skip here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-cpu.sh
scripts/cpu-env.sh python -m pytest -q -p no:cacheprovider "$@"
