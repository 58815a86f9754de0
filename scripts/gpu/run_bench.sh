#!/usr/bin/env bash
# Decode benchmark chunk, as one device command (< 9.5 minutes): install the plugin, then
# scripts/bench_spec_v2.py with the given case arguments. Results under ${OUT:-./gpu-out}.
#
#   bash scripts/gpu/run_bench.sh CASESPEC...      (CASESPEC = bench_spec_v2.py arguments)
#   bash scripts/gpu/run_bench.sh --help
#
# Device call: carry [".gpu"], e.g.
#   bash scripts/gpu/run_bench.sh --model tiny --backend triton-nopcg --reps 3 --profile
#
# OUT gets at most 4 files (flat): setup.log, bench-<tag>.json, summary-<tag>.txt,
# logs-<tag>.tar.gz (every Engine log). <tag> = BENCH_TAG or model-backend[-s<spec>...] from the
# arguments.
# Merge the JSONs of several chunks on your machine:
#   python3 scripts/plot_bench.py path/to/bench-*.json      # -> results/bench/{bench.png,README.md}
#
# Time budget. Each Engine run = start + warm-up + timed work + shutdown. Start (seen/expected
# on one H200): tiny without piecewise CUDA graph (PCG) ~30 s, tiny with PCG ~2 min (torch.compile
# of the prefill sizes), 8B-shaped dummy weights ~1 min without PCG, ~2.5-3 min with PCG,
# flashinfer unknown (its kernels may JIT-compile on a fresh machine). Timed work per Engine with
# the defaults (bs 1,4,16,48; 256 new tokens; 3 trials) ~10-20 s tiny, ~30-40 s 8B.
# Setup (bundle unpack + pip) ~20-40 s. A chunk runs 2*reps Engines (+2 with the probe, which is
# on by default). Per Engine, roughly: tiny-nopcg 50 s, tiny-pcg 150 s, 8b-nopcg 100 s,
# 8b-pcg 220 s. Chunks that fit:
#   --model tiny --backend triton-nopcg --reps 3 --profile            8 Engines  ~7 min
#   --model 8b   --backend triton-nopcg --reps 2 --profile            6 Engines  ~8 min
#   --model 8b   --backend triton-nopcg --reps 2 --no-probe           4 Engines  ~6 min (more reps)
#   --model tiny --backend triton-nopcg --reps 3 --pin-cpus --no-probe --max-new-tokens 1024
#                                                                      6 Engines  ~6-7 min (the tiny record)
#   --model tiny --backend triton-nopcg --reps 1 --pin-cpus --host-profile --max-new-tokens 1024
#                                                                      6 Engines  ~6 min (where host time goes)
#   --model tiny --backend triton-pcg   --reps 1 --profile            4 Engines  ~8-9 min
#   --model tiny --backend triton-pcg   --reps 2 --no-probe           4 Engines  ~8-9 min
#   --model 8b   --backend triton-pcg   --reps 1 --no-probe           2 Engines  ~6-8 min
#   --model 8b   --backend triton-pcg   --reps 0 --probe              2 Engines  ~6-8 min
#   --model tiny --backend flashinfer   --reps 1                      4 Engines  ? (first try)
#   --model 8b   --backend default --batch-sizes 16,24 --cuda-graph-max-bs 8 --pcg-max-tokens 128 --reps 2 --no-probe --pin-cpus
#                                                                      4 Engines  ~8 min on H200 (eager decode: every batch above the graphs)
#
# SGLang's default configuration on H100/H200 (backend default = none given: FA3 + PCG; its PCG
# capture limit is 512 tokens, so an 8b Engine starts in ~2-2.5 min, ~3-3.5 min with its work).
# Needs FA3 staged on the machine right before (two short calls):
#   carry [".gpu-fa3a"]: bash .gpu-fa3a/stage.sh      then carry [".gpu-fa3b"]: bash .gpu-fa3b/stage.sh
# then, each chunk one call with carry [".gpu"] (rows at bs 1/4/16/48 unless said):
#   --model 8b --backend default --reps 1 --no-probe --profile        2 Engines  ~7-8 min (timed + GPU idle)
#   --model 8b --backend default --reps 0 --probe                     2 Engines  ~7 min (host syncs: probe)
#   --model 8b --backend default --prompt-len 8192 --batch-sizes 8 --max-new-tokens 512 --reps 1 --no-probe
#                                                                      2 Engines  ~7-8 min (long context: 8k
#                                                                      prompts at bs 8, model context 16384)
#   --model 8b --backend fa3-nopcg --reps 1 --no-probe --profile      2 Engines  ~4-5 min
#   --model tiny --backend default --reps 1 --profile                 4 Engines  ~7-8 min
# Without FA3 these rows are skipped (no FA3) with a line, and the chunk ends at once.
#
# DeepSeek MTP on MLA (--model deepseek: the model factory's tiny DeepSeek-V3 with its NextN layer,
# seeded weights, built in ~2 s on the host; NEXTN, no draft path; with backend default SGLang picks
# FA3 MLA + PCG on Hopper). FA3 staged first, as above. Variant patched-mla-mirror = the plugin with
# SGLANG_FUTUREMAP_FA3_MLA=0 (back-port 18 off: MLA on the host mirror). Guessed, never timed: an Engine starts in ~30 s
# without PCG and ~2 min with it (as tiny; the bench's first guess is 150 s with the 512-token PCG
# limit), timed work ~15-30 s (the draft accepts part of each chain, so more iterations than tiny's):
#   --model deepseek --backend default --variants stock,patched,patched-mla-mirror --reps 1 --no-probe
#                                                                      3 Engines  ~7-8.5 min (one row each;
#                                                                      if the third is left out, run it
#                                                                      with --variants stock,patched-mla-mirror)
#   --model deepseek --backend default --variants stock,patched,patched-mla-mirror --reps 0 --probe
#                                                                      3 Engines  ~7-8.5 min (host syncs per
#                                                                      decode iteration, untimed)
#   --model deepseek --backend default --variants stock,patched-mla-mirror --reps 2 --no-probe
#                                                                      4 Engines  ~9 min (more pairs; cut by
#                                                                      the budget when starts are slow)
#
# EAGLE trees (--spec STEPS,TOPK,DRAFT_TOKENS; default 3,1,4 = the chain of every row above):
# stock 0.5.12.post1 runs a tree on spec v1, the plugin on spec v2 (each run's spec path is in
# the JSON and the summary; a patched tree run without the plugin's "spec v2 runs the EAGLE tree"
# line is left out). Name the backend: with none, SGLang picks FlashInfer for a tree on Hopper.
# Time per 8b tree Engine: start as a chain (~1 min without PCG, ~2.5-3 min with; seen on the
# H100: 45 s and 50-150 s, the first Engine of a fresh machine the slowest) + timed work, guessed
# ~40-80 s (a chain's is 30-40 s; the tree verifies 16 or 8 tokens per request, stock without the
# overlap scheduler): ~2-2.5 min without PCG, ~3.5-4.5 min with. Each chunk one call, carry
# [".gpu"] (fa3-pcg: FA3 staged first, as above); bs 1/4/16/48:
#   --model 8b --backend flashinfer --spec 3,4,16 --spec 3,1,4 --reps 1 --no-probe
#                                                                      4 Engines  ~6-8.5 min (tree + its chain
#                                                                      from one machine: the "spec v2 topk 4
#                                                                      vs spec v2 topk 1" table)
#   --model 8b --backend flashinfer --spec 5,4,8 --reps 1 --no-probe  2 Engines  ~4-5.5 min
#   --model 8b --backend flashinfer --spec 3,4,16 --spec 5,4,8 --reps 1 --no-probe
#                                                                      4 Engines  ~7-9 min (both trees, no chain)
#   --model 8b --backend fa3-pcg --spec 3,4,16 --reps 1 --no-probe    2 Engines  ~5-9 min
#   --model 8b --backend fa3-pcg --spec 5,4,8 --reps 1 --no-probe     2 Engines  ~5-9 min
#   --model 8b --backend fa3-pcg --reps 1 --no-probe                  2 Engines  ~4-8 min (the fa3-pcg chain
#                                                                      for that table: no record has it yet)
#   --model 8b --backend flashinfer --spec 3,4,16 --spec 5,4,8 --reps 0 --probe
#                                                                      4 Engines  ~6-8.5 min (probe only: host
#                                                                      syncs per decode iteration, stock spec
#                                                                      v1 vs patched spec v2, untimed)
# The flashinfer chain (3,1,4) of earlier records merges with these by its label (8b/flashinfer),
# but the table takes medians over every file: a chain from the same machine and day is better.
# The bench guesses a tree Engine at a chain's wall time (the first guess, then what the chunk's
# Engines took) + 40 s, and leaves out an Engine pair the budget does not hold (its JSON keeps the
# rest); split a two-spec chunk into one --spec each if that happens.
#
# The upstream column (stock SGLang 0.5.13 from .gpu-0513; ratios against stock 0.5.12.post1):
#   [carry [".gpu-0513-fa3a"]: bash .gpu-0513-fa3a/stage.sh; carry [".gpu-0513-fa3b"]: bash .gpu-0513-fa3b/stage.sh]
#                                                   (its FA3: needed for backend default / fa3-*)
#   carry [".gpu-0513"]: bash scripts/gpu/stage_upstream.sh            (~30 s: unpacks /tmp/site312-0.5.13)
#   carry [".gpu"]:      bash scripts/gpu/run_bench.sh --model 8b --backend default --variants stock,upstream \
#                            --reps 1 --no-probe                       2 Engines  ~7-8 min
#                        bash scripts/gpu/run_bench.sh --model 8b --backend triton-nopcg \
#                            --variants stock,patched,upstream --reps 1 --no-probe   3 Engines  ~6 min
# (.gpu and .gpu-0513 are 45-48 MB each: they cannot travel in one call; the staged folders stay
# on the machine while it is warm, ~30 s between calls.) Where the upstream site holds no SGLang,
# the variant is skipped with a line (SGLANG_UPSTREAM_SITE or --upstream-site name another).
#
# The bench never starts an Engine pair that is not expected to end before the budget
# (BENCH_BUDGET_S, default 555 s from this script's start, less setup), and rewrites its JSON
# after every Engine, so a chunk that runs long still returns what it measured.
#
# Environment knobs:
#   OUT                 result folder (default ./gpu-out)
#   BENCH_TAG           file-name tag (default model-backend[-p<prompt len>][-s<spec>...][-<variants>]
#                       from the arguments, e.g. 8b-default-p8192, 8b-default-stock_upstream or
#                       8b-flashinfer-s3_4_16-s5_4_8; the default spec 3,1,4 adds nothing)
#   SGLANG_UPSTREAM_SITE  the upstream variant's site folder (default /tmp/site312-0.5.13)
#   BENCH_BUDGET_S      seconds this whole script may take (default 555)
#   BENCH_SITE          pip --target for the plugin when .gpu/activate.sh is used (default /tmp/site312)
#   BENCH_SKIP_INSTALL  1: do not pip-install the plugin
set -uo pipefail

START=$(date +%s)
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_usage_if_asked "$@"
gpu_enter_repo

# Tag from --model/--backend values (first of each), a --prompt-len other than 64, every --spec
# other than 3,1,4 (each "-s" and its numbers, ';'-separated ones too) and --variants other than
# stock,patched, e.g. 8b-triton-nopcg, 8b-default-p8192, 8b-flashinfer-s3_4_16-s5_4_8,
# 8b-default-stock_upstream.
tag_of() {
    local model="" backend="" plen="" variants="" specs="" prev="" s one parts
    for a in "$@"; do
        s=""
        case "$prev" in
            --model|--models) model="$a" ;; --backend|--backends) backend="$a" ;;
            --prompt-len) plen="$a" ;; --variants) variants="$a" ;; --spec) s="$a" ;;
        esac
        case "$a" in
            --model=*|--models=*) model="${a#*=}" ;; --backend=*|--backends=*) backend="${a#*=}" ;;
            --prompt-len=*) plen="${a#*=}" ;; --variants=*) variants="${a#*=}" ;; --spec=*) s="${a#*=}" ;;
        esac
        if [ -n "$s" ]; then
            IFS=';' read -r -a parts <<< "$s"
            for one in "${parts[@]}"; do
                one="${one// /}"; one="${one//\//,}"
                if [ -n "$one" ] && [ "$one" != "3,1,4" ]; then specs+="-s${one//,/_}"; fi
            done
        fi
        prev="$a"
    done
    printf '%s-%s' "${model:-tiny}" "${backend:-triton-nopcg}"
    if [ -n "$plen" ] && [ "$plen" != 64 ]; then printf -- '-p%s' "$plen"; fi
    printf '%s' "$specs"
    if [ -n "$variants" ] && [ "$variants" != "stock,patched" ]; then printf -- '-%s' "${variants//,/_}"; fi
}
# Only [A-Za-z0-9_.-] in file names: the device tool does not bring back a name with "+" in it.
TAG="$(printf '%s' "${BENCH_TAG:-$(tag_of "$@")}" | tr -c 'A-Za-z0-9_.-' '_')"
SETUP="$OUT/setup.log"
: > "$SETUP"

gpu_use_bundle "${BENCH_SITE:-/tmp/site312}"

{
    echo "== $(date -u +%FT%TZ) run_bench.sh $*"
    echo "== python: $(python3 -V 2>&1)"
    gpu_install_plugin "${BENCH_SKIP_INSTALL:-0}" || PLUGIN_MISSING=1
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1 | head -3
    gpu_fa3_status
} >> "$SETUP" 2>&1
gpu_require_plugin "$SETUP"
grep -E '^FA3: ' "$SETUP"

BUDGET="${BENCH_BUDGET_S:-555}"
NOW=$(date +%s)
# Keep ~25 s for the last JSON write, the log tarball and the transfer.
DEADLINE=$(( BUDGET - (NOW - START) - 25 ))
if [ "$DEADLINE" -lt 60 ]; then DEADLINE=60; fi
echo "== setup took $((NOW - START)) s; bench deadline ${DEADLINE} s; tag $TAG" | tee -a "$SETUP"

LOGS="$(mktemp -d -t bench-logs-XXXXXX)"
trap 'rm -rf "$LOGS"' EXIT
python3 scripts/bench_spec_v2.py "$@" --deadline-s "$DEADLINE" --out "$OUT/bench-$TAG.json" --log-dir "$LOGS" \
    2>&1 | tee "$OUT/summary-$TAG.txt"
RC=${PIPESTATUS[0]}

tar -C "$LOGS" -czf "$OUT/logs-$TAG.tar.gz" . 2>> "$SETUP"
echo "bench rc $RC, total $(( $(date +%s) - START )) s" | tee -a "$OUT/summary-$TAG.txt"
exit "$RC"
