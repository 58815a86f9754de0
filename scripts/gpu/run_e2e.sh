#!/usr/bin/env bash
# GPU end-to-end suite, as one command: install the plugin, build the tiny models (target,
# STANDALONE draft, EAGLE3 draft, tokenizer), then scripts/gpu_e2e.py (stock vs patched SGLang,
# token for token, over the spec-v2 matrix, retraction, the soak and the text path).
#
#   bash scripts/gpu/run_e2e.sh                      # every case (~10 min on one H200)
#   bash scripts/gpu/run_e2e.sh --shard 1/2          # half of them (fits a 10-minute slot)
#   bash scripts/gpu/run_e2e.sh --cases 'eagle3-triton-*' soak-eagle3-triton-det
#
# Arguments go to gpu_e2e.py (see its --help). Results under ${OUT:-./gpu-out}: setup.log,
# e2e-<tag>.json, e2e-<tag>.txt. Make the Markdown record on your machine:
#   python3 scripts/gpu_e2e.py --merge path/to/e2e-*.json > results/gpu-e2e/README.md
#
# Environment knobs: OUT; E2E_SITE (pip --target when .gpu/activate.sh is used, default
# /tmp/site312); E2E_SKIP_INSTALL=1 (the plugin is installed already).
set -uo pipefail

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_enter_repo

gpu_use_bundle "${E2E_SITE:-/tmp/site312}"
MODELS="$(mktemp -d -t e2e-models-XXXXXX)"
trap 'rm -rf "$MODELS"' EXIT
{
    echo "== python: $(python3 -V 2>&1)"
    if [ "${E2E_SKIP_INSTALL:-0}" != "1" ]; then
        python3 -m pip install -q --no-deps "${PIP_TARGET_ARGS[@]}" . || echo "pip install FAILED"
    fi
    python3 -c "from importlib.metadata import entry_points as e; print('entry points:', e(group='sglang.srt.plugins'))"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 scripts/make_tiny_models.py --out "$MODELS"
} > "$OUT/setup.log" 2>&1 || { echo "setup FAILED"; cat "$OUT/setup.log"; exit 2; }

python3 scripts/gpu_e2e.py --models "$MODELS" --out "$OUT" "$@"
