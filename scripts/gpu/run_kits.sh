#!/usr/bin/env bash
# SGLang's own regression test kits (sglang.test.kits on sglang.test.server_fixtures), as one
# command: install the plugin, build the tiny models, then scripts/gpu_kits.py runs every kit
# that applies to them on three flavours -- stock SGLang (SGLANG_FUTUREMAP_PATCH=off), the
# plugin (strict) and the pristine sglang package with patches/ applied (plugin off) -- each
# server with SGLANG_SPEC_NAN_DETECTION=1 and SGLANG_SPEC_OOB_DETECTION=1, and checks that every
# test passing on stock passes on the other two.
#
#   bash scripts/gpu/run_kits.sh --fit                    # once: fit the thresholds on stock (~3-5 min)
#   bash scripts/gpu/run_kits.sh --budget 520             # 16 kit cases x 3 flavours = 48 servers, 12 at a time (~15 min: shard it)
#   bash scripts/gpu/run_kits.sh --shard 1/2 --budget 520 # half the kit cases (then --shard 2/2)
#   bash scripts/gpu/run_kits.sh --kits 'spec-*' json --flavours stock,tree
#   python3 scripts/gpu_kits.py --list                    # the kit cases, and what is not applicable and why
#
# Device calls (each at most 600 s; --budget bounds gpu_kits.py's part, and jobs it could not
# start are recorded as "not run"). FA3 is used where it imports, else Triton; to run the kits
# on SGLang's Hopper default, stage FA3 first as in run_e2e.sh's header.
#   1. carry [".gpu"]: bash scripts/gpu/run_kits.sh --fit
#      then commit $OUT/kits-thresholds.json as tests/gpu/kits/thresholds.json
#   2. carry [".gpu"]: bash scripts/gpu/run_kits.sh --shard 1/2 --budget 520
#      then (FA3 staged again if the machine went back) --shard 2/2 --budget 520, and --merge
#      both records. Measured on one H100 (2026-11-23): a kit server job takes 90-216 s
#      (regex, ebnf and pause up to 314 s with 12 servers on the GPU), so the 48 jobs at 12 at
#      a time need about 15 minutes: one call with --budget 500 finished 11 of 16 kit cases on
#      all flavours, a second (--kits regex ebnf matched-stop pause sanity) the other 5 in 368 s.
#
# Arguments go to gpu_kits.py (see its --help). Results under ${OUT:-./gpu-out}: setup.log,
# kits-<tag>.json, kits-<tag>.md, logs-<tag>.tar.gz (tag: run or fit), kits-thresholds.json
# (--fit). Make the Markdown record on your machine:
#   python3 scripts/gpu_kits.py --merge path/to/kits-run.json > results/gpu-kits/README.md
#
# Environment knobs: OUT; KITS_SITE (pip --target when .gpu/activate.sh is used, default
# /tmp/site312); KITS_SKIP_INSTALL=1 (the plugin is installed already).
set -uo pipefail

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_usage_if_asked "$@"
gpu_enter_repo

gpu_use_bundle "${KITS_SITE:-/tmp/site312}"
gpu_setup_models "${KITS_SKIP_INSTALL:-0}" kits

python3 scripts/gpu_kits.py --models "$MODELS" --out "$OUT" "$@"
