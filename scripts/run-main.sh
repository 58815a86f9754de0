#!/usr/bin/env bash
# The main job on a fresh machine: set up, then tell whether and how the plugin patches the
# installed SGLang, and verify that it works (strict apply + CPU self-check).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-cpu.sh
scripts/cpu-env.sh sglang-futuremap-patch status
scripts/cpu-env.sh sglang-futuremap-patch verify
