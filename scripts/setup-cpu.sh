#!/usr/bin/env bash
# Set up .venv on a fresh CPU-only machine: torch 2.13.0 (CPU), SGLang 0.5.12.post1 without
# its CUDA-pinned dependencies, SGLang's pure-Python import-time dependencies (pinned), and
# this package in editable mode. Idempotent: a second run only checks.
#   SGLANG_VERSION=0.5.12 scripts/setup-cpu.sh     # the other supported release
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_VERSION="${SGLANG_VERSION:-0.5.12.post1}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip() { .venv/bin/python -m pip "$@"; }
constraints="$(mktemp)"; trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" > "$constraints"
pip install -q --disable-pip-version-check "torch==2.13.0"
pip install -q --disable-pip-version-check --no-deps "sglang==${SGLANG_VERSION}"
pip install -q --disable-pip-version-check -r requirements-cpu.txt -c "$constraints"
pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
.venv/bin/python - <<'PY'
import importlib.metadata as md
print("environment ready: torch", md.version("torch"), "| sglang", md.version("sglang"),
      "| sglang-futuremap-patch", md.version("sglang-futuremap-patch"))
PY
