#!/usr/bin/env bash
# Serving benchmark as users measure it: stock and patched `python -m sglang.launch_server`
# (8B-shaped dummy target, 1-layer STANDALONE draft, 3/1/4, a word-level tokenizer) against
# SGLang's own `python -m sglang.bench_serving` (offline dataset, ignore_eos), fresh servers,
# alternating order. Arguments go to scripts/gpu_serve_bench.py (see its --help).
#
#   bash scripts/gpu/run_serve_bench.sh --boots 1 --first-boot 0 --concurrency 1,8,16,32,48   # one pair per call
#   bash scripts/gpu/run_serve_bench.sh --boots 1 --first-boot 1 --concurrency 1,8,16,32,48   # the next, other order
#   bash scripts/gpu/run_serve_bench.sh --backend triton --boots 1
#   bash scripts/gpu/run_serve_bench.sh --server-arg=--cuda-graph-max-bs --server-arg=8 --concurrency 24   # eager batches
#   bash scripts/gpu/run_serve_bench.sh --spec tree --backend fa3 --concurrency 1,16,45   # the Llama auto tree's 5/4/8
#       given explicitly on FA3 (stock: spec v1, the plugin: spec v2); without --backend SGLang picks FlashInfer
#       for an explicit tree on Hopper, where both sides run spec v1 (the summary's "Servers" line says which)
#   bash scripts/gpu/run_serve_bench.sh --gpus 2 --backend triton --variants stock,patched,patched-no-early-intake \
#       --timeline --boots 3 --concurrency 1,4,16   # the plugin without back-port 19 (on by default) beside it
#   bash scripts/gpu/run_serve_bench.sh --gpus 2 --timeline --freeze-gc --concurrency 32,45,48   # SGLang's /freeze_gc
#       once each server is ready (both sides): the cells without the one long API-server collection per server
#   bash scripts/gpu/run_serve_bench.sh --gpus 2 --pin-cpus --timeline --backend triton --concurrency 1,4,8
#       # each server and its bench client on an equal set of cores of its own (both sides alike)
#   bash scripts/gpu/run_serve_bench.sh --gpus 2 --pin-cpus --pin-scheduler --timeline --backend triton --concurrency 1,8,32
#       # and, within that set, the scheduler process on a physical core of its own (nothing on its SMT
#       # sibling): does a server's host speed still move in steps (serve_prefill_batches.py --host-states)?
#   bash scripts/gpu/run_serve_bench.sh --gpus 2 --boots 2   # two-GPU machine (nvidia-h100-x2): each boot's stock and
#       (patched servers at the same time, one per GPU, the card of each side alternating with the boot: twice
#       the boots per device-minute; FA3 staged the same way; one host, so both servers share its CPUs)
#
# The default backend (none named: FA3 + piecewise CUDA graph on Hopper) needs FA3 staged first
# (`bash .gpu-fa3a/stage.sh`, then `bash .gpu-fa3b/stage.sh`, each in its own call right before). One stock/patched pair with 5 concurrencies takes ~8 min on an H100.
#
# DeepSeek MTP on MLA (--model deepseek: the tiny DeepSeek-V3 with its NextN layer, seeded weights
# and its own tokenizer; --speculative-algorithm NEXTN, no draft path; FA3 MLA + PCG on Hopper, FA3
# staged first). patched-mla-mirror = the plugin with SGLANG_FUTUREMAP_FA3_MLA=0 (back-port 18 off). One
# pair per call, alternating order across calls, then --merge; guessed, never timed: a boot ~2 min
# with PCG (~30 s without), the three cells ~1 min, so a pair ~5-6 min:
#   bash scripts/gpu/run_serve_bench.sh --model deepseek --variants stock,patched-mla-mirror --boots 1 --first-boot 0 \
#       --concurrency 1,8,32 --budget 500
#   bash scripts/gpu/run_serve_bench.sh --model deepseek --variants stock,patched-mla-mirror --boots 1 --first-boot 1 \
#       --concurrency 1,8,32 --budget 500
#   (--variants stock,patched,patched-mla-mirror: three servers, ~8-9 min, if boots turn out short)
#
# Results under ${OUT:-./gpu-out}: serve-bench.json, serve-bench.md, serve-bench.svg and
# serve-logs.tar.gz (setup.log, logs/, bench/, and timeline/ with --timeline). Join the
# records of several calls on your machine:
#   python3 scripts/gpu_serve_bench.py --merge a/serve-bench.json b/serve-bench.json > results/serve-bench/README.md
# Where a call's --budget cut a boot off and the next call on the same machine ran the rest of it
# (--variants stock --boots 1 --first-boot N), --join pairs that boot's servers across the two:
#   python3 scripts/gpu_serve_bench.py --merge a/serve-bench.json b/serve-bench.json --join
set -uo pipefail

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_usage_if_asked "$@"
gpu_enter_repo

gpu_use_bundle "${SERVE_SITE:-/tmp/site312}"
gpu_install_plugin "${SERVE_SKIP_INSTALL:-0}" > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }

python3 scripts/gpu_serve_bench.py --out "$OUT" "$@"
rc=$?
# One archive for the setup log, the server logs and bench_serving's JSONL files: four files per
# run (a device call brings back eight, so two runs fit in one call).
(cd "$OUT" && tar czf serve-logs.tar.gz setup.log logs bench $(test -d timeline && echo timeline) 2>/dev/null \
    && rm -rf setup.log logs bench timeline models)
exit $rc
