#!/usr/bin/env bash
# GPU end-to-end suite, as one command: install the plugin, build the tiny models (target,
# STANDALONE draft, EAGLE3 draft, EAGLE-1 draft, tokenizer; MiMoV2 target + MTP draft; DeepSeek-V3-shaped MLA
# target with its NextN layer), then scripts/gpu_e2e.py (stock vs patched SGLang,
# token for token, over the spec-v2 matrix, retraction, the soak, the text path and the FA3 set).
#
#   bash scripts/gpu/run_e2e.sh --group base         # the suite before the FA3 set (~5-7 min on one H100)
#   bash scripts/gpu/run_e2e.sh --group fa3 --jobs 10   # the FA3 set, 15 cases (~6-8 min on one H100)
#   bash scripts/gpu/run_e2e.sh --cases 'default-*' 'fa3-*' 'page16-*' 'radix-*' 'seeded-*' 'eos-*'
#   bash scripts/gpu/run_e2e.sh --shard 1/2          # half of everything (fits a 10-minute slot)
#   bash scripts/gpu/run_e2e.sh --group pd           # PD-disaggregation decode, fake transfer (one GPU; FA3 rows need FA3)
#   bash scripts/gpu/run_e2e.sh --group multi        # TP=2 and dp_size 2 (nvidia-h200-x2; FA3 staged for the default rows)
#   bash scripts/gpu/run_e2e.sh --group mtp --jobs 5 # multi-layer EAGLE: MiMoV2 + 3-layer MTP draft, 5 cases (FA3 staged for default/fa3)
#   bash scripts/gpu/run_e2e.sh --group mla --jobs 4 # DeepSeek MTP (MLA, NextN layer), SGLang's defaults (FA3 staged), 6 cases (2 with back-port 18 off: MLA on the mirror), sync probe
#   bash scripts/gpu/run_e2e.sh --group tree --jobs 8 # SGLang's auto-chosen tree (Llama + EAGLE3 or EAGLE-1, no spec flags) kept on spec v1 (SGLANG_FUTUREMAP_TREE_SPEC_V2=0) vs stock given it explicitly (FA3 staged)
#   bash scripts/gpu/run_e2e.sh --group intake --jobs 2 # back-port 19 (on by default; the group sets SGLANG_FUTUREMAP_EARLY_INTAKE=1): Triton matrix workload and HTTP arrivals, token for token (no FA3 needed)
#   bash scripts/gpu/run_e2e.sh --group fihost --jobs 2 # back-port 20 (on by default; the group sets SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM=1): FlashInfer matrix workload, PCG on and off (no FA3 needed)
#   bash scripts/gpu/run_e2e.sh --group released --jobs 5 # grammar requests (xgrammar) on the default (FA3 staged), FlashInfer and Triton, and back-port 16 switched on: decodes that hold a request freed just before their launch, token for token; the FA3 tree with back-ports 16 and 22 on
#   bash scripts/gpu/run_e2e.sh --group tree-v2 --jobs 8 --timeout 420 # 18 EAGLE trees (topk > 1) on spec v2 with the plugin vs stock's spec v1 (FA3 staged for the fa3/default ones)
#
# Device calls for the FA3 set (FA3 lives in /tmp of the machine: stage it right before, in two calls):
#   1. carry [".gpu-fa3a"]: bash .gpu-fa3a/stage.sh
#   2. carry [".gpu-fa3b"]: bash .gpu-fa3b/stage.sh
#   3. carry [".gpu"]:      bash scripts/gpu/run_e2e.sh --group fa3 --jobs 10
# Without FA3 the cases that need it (fa3-*, default-*, page16-standalone-fa3, *-eagle3-fa3) are
# reported as skipped (no FA3); the others run. setup.log and the report say which it was.
#
# Arguments go to gpu_e2e.py (see its --help). Results under ${OUT:-./gpu-out}: setup.log,
# e2e-<tag>.json, e2e-<tag>.txt, logs-<tag>.tar.gz (tag: the groups and shard, or "all"). Make the
# Markdown record on your machine:
#   python3 scripts/gpu_e2e.py --merge path/to/e2e-*.json > results/gpu-e2e/README.md
#
# Environment knobs: OUT; E2E_SITE (pip --target when .gpu/activate.sh is used, default
# /tmp/site312); E2E_SKIP_INSTALL=1 (the plugin is installed already).
set -uo pipefail

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_usage_if_asked "$@"
gpu_enter_repo

gpu_use_bundle "${E2E_SITE:-/tmp/site312}"
gpu_setup_models "${E2E_SKIP_INSTALL:-0}" e2e

python3 scripts/gpu_e2e.py --models "$MODELS" --out "$OUT" "$@"
