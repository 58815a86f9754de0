#!/usr/bin/env bash
# GPU smoke matrix, as one device command (fits ~9 minutes): install the plugin, build the tiny
# models once, then run scripts/gpu_smoke.py (stock vs patched, token for token) per case:
#
#   a  triton-sync       Triton, piecewise CUDA graph off, CUDA graph on, --sync-probe
#   b  flashinfer-sync   FlashInfer, piecewise CUDA graph off, CUDA graph on, --sync-probe
#   c  triton-nograph    Triton, --no-cuda-graph (no probe overhead: its tok/s are the timed ones)
#   d  default-sync      SGLang's own configuration (no attention backend given: FA3 + piecewise CUDA
#                        graph on H100/H200), --sync-probe: seq_lens host syncs per decode iteration
#                        there. Needs FA3 (stage .gpu-fa3a/.gpu-fa3b first; SKIPPED (no FA3) without);
#                        its Engines compile (piecewise CUDA graph): ~4-5 min for the case alone, so
#                        run it on its own: MATRIX_CASES="d" (or "d a")
#
#   source .gpu/activate.sh; bash scripts/gpu/run_matrix.sh     # results under ${OUT:-./gpu-out}
#
# Output (7 files, one folder level): matrix.txt (setup, per-case status, overall verdict) and per
# case <case>.json (gpu_smoke.py --out-json) + <case>.txt (its report, then the stock/patched logs
# trimmed to plugin lines, warnings, errors, tracebacks and their last lines).
#
# Sync-probe cases slow the scheduler down (a Python wrapper per tensor method call): compare
# tokens/s only between runs without the probe.
#
# Knobs:
#   MATRIX_CASES         which cases, in order (default "a b c"; e.g. "a" or "c a")
#   MATRIX_BUDGET_S      seconds for all cases together (default 500); a case starts only when at
#                        least MATRIX_MIN_CASE_S (default 100) remain, each of its two runs gets
#                        min(MATRIX_RUN_TIMEOUT_S (default 150; 240 for d), what is left / 2)
#   MATRIX_EXPECT_ZERO   1: pass --expect-zero-seq-lens-syncs in case a (Triton, PCG off) -- once the
#                        back-port that drops the Triton seq_lens D2H has landed
#   MATRIX_ARGS          extra arguments for every gpu_smoke.py call
#   MATRIX_SELFTEST      1: run the CPU self-test of the harness first (~20-40 s; default 0)
#   SMOKE_SITE, SMOKE_SKIP_INSTALL, SMOKE_MODELS: as in run_smoke.sh
#   SMOKE_NO_ACTIVATE    1: do not source .gpu/activate.sh (a dry run here against a fake sglang)
# A failing or timed-out case does not stop the others; exit status is 0 only if every case that
# ran passed (or was SKIPPED for no FA3) and none was skipped for lack of time. A harness error
# (an Engine did not start or did not finish) shows as SMOKE ERROR with the end of its log.
set -uo pipefail

START=$(date +%s)
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_usage_if_asked "$@"
gpu_enter_repo
MATRIX="$OUT/matrix.txt"
: > "$MATRIX"
log() { echo "$*" | tee -a "$MATRIX"; }

if [ "${SMOKE_NO_ACTIVATE:-0}" != "1" ]; then
    gpu_use_bundle "${SMOKE_SITE:-/tmp/site312}"
else
    PIP_TARGET_ARGS=()
fi

{
    echo "== setup"
    echo "python: $(python3 -V 2>&1)"
    gpu_install_plugin "${SMOKE_SKIP_INSTALL:-0}" || PLUGIN_MISSING=1
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -2
    python3 -c "import flashinfer; print('flashinfer', getattr(flashinfer, '__version__', '?'))" 2>&1 | tail -1
    gpu_fa3_status
} >> "$MATRIX" 2>&1
gpu_require_plugin "$MATRIX"

SELFTEST_RC=0
if [ "${MATRIX_SELFTEST:-0}" = "1" ]; then
    python3 scripts/gpu_smoke_selftest.py > /tmp/matrix-selftest.log 2>&1
    SELFTEST_RC=$?
    { echo "== self-test rc $SELFTEST_RC"; grep -E '\[FAIL\]|self-tests passed|failure' /tmp/matrix-selftest.log | grep -v 'prompt ' | tail -15; } >> "$MATRIX"
fi

if [ -n "${SMOKE_MODELS:-}" ]; then
    MODELS="$SMOKE_MODELS"
else
    MODELS="$(mktemp -d -t smoke-models-XXXXXX)"
fi
WORK="$(mktemp -d -t smoke-matrix-XXXXXX)"
cleanup() { rm -rf "$WORK"; [ -z "${SMOKE_MODELS:-}" ] && rm -rf "$MODELS"; }
trap cleanup EXIT
if ! python3 scripts/make_tiny_models.py --out "$MODELS" > "$WORK/models.log" 2>&1; then
    log "model factory FAILED"; tail -20 "$WORK/models.log" >> "$MATRIX"; exit 2
fi
log "== setup done after $(( $(date +%s) - START )) s"

case_args() {
    case "$1" in
        a) echo "--attention-backend triton --no-piecewise-cuda-graph --cuda-graph --sync-probe$([ "${MATRIX_EXPECT_ZERO:-0}" = 1 ] && echo ' --expect-zero-seq-lens-syncs')" ;;
        b) echo "--attention-backend flashinfer --no-piecewise-cuda-graph --cuda-graph --sync-probe" ;;
        c) echo "--attention-backend triton --no-piecewise-cuda-graph --no-cuda-graph" ;;
        d) echo "--attention-backend default --cuda-graph --sync-probe" ;;
        *) return 1 ;;
    esac
}
case_name() {
    case "$1" in
        a) echo triton-sync ;; b) echo flashinfer-sync ;; c) echo triton-nograph ;; d) echo default-sync ;;
        *) echo "$1" ;;
    esac
}
# Engines with piecewise CUDA graph (d) compile at start-up: a longer per-run timeout.
case_run_timeout() {
    case "$1" in d) echo "${MATRIX_RUN_TIMEOUT_S:-240}" ;; *) echo "${MATRIX_RUN_TIMEOUT_S:-150}" ;; esac
}

BUDGET=${MATRIX_BUDGET_S:-500}
MIN_CASE=${MATRIX_MIN_CASE_S:-100}
OVERALL=0
BUDGET_START=$(date +%s)
for c in ${MATRIX_CASES:-a b c}; do
    name="$(case_name "$c")"
    if ! args="$(case_args "$c")"; then log "case $c: unknown, skipped"; OVERALL=1; continue; fi
    left=$(( BUDGET - ($(date +%s) - BUDGET_START) ))
    if [ "$left" -lt "$MIN_CASE" ]; then
        log "case $c ($name): SKIPPED, ${left} s of the ${BUDGET} s budget left"
        OVERALL=1
        continue
    fi
    RUN_TIMEOUT="$(case_run_timeout "$c")"
    t=$(( left / 2 - 5 )); [ "$t" -gt "$RUN_TIMEOUT" ] && t=$RUN_TIMEOUT
    logs="$WORK/logs-$name"
    mkdir -p "$logs"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    python3 scripts/gpu_smoke.py --models "$MODELS" --log-dir "$logs" --out-json "$OUT/$name.json" \
        --timeout "$t" $args ${MATRIX_ARGS:-} > "$OUT/$name.txt" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && OVERALL=1
    verdict="$(grep -E '^SMOKE (PASSED|FAILED|ERROR|SKIPPED)' "$OUT/$name.txt" | tail -1)"
    log "case $c ($name): rc $rc, ${verdict:-no verdict}, $(( $(date +%s) - t0 )) s, per-run timeout ${t} s; args: $args ${MATRIX_ARGS:-}"
    grep -E '^  (stock|patched): [0-9]+ decode iterations' "$OUT/$name.txt" | cut -c1-260 >> "$MATRIX"
    grep -E '^(stock|patched): .*tok/s|^(stock|patched): [a-z0-9]+( \(SGLang.s default\))?, PCG' "$OUT/$name.txt" >> "$MATRIX"
    grep -E '^  \[FAIL\] [a-z]' "$OUT/$name.txt" | grep -v '\] prompt ' | head -8 >> "$MATRIX"
    for run in stock patched; do
        if [ -f "$logs/$run.log" ]; then
            {
                echo
                echo "===== $run.log (trimmed) ====="
                python3 -c "import sys; sys.path.insert(0, 'scripts'); from gpu_harness import logs; print(logs.trim_log(open(sys.argv[1], errors='replace').read()))" "$logs/$run.log"
            } >> "$OUT/$name.txt" 2>&1
        fi
    done
done

log "== matrix $([ "$OVERALL" -eq 0 ] && echo PASSED || echo FAILED) after $(( $(date +%s) - START )) s (self-test rc $SELFTEST_RC)"
[ "$OVERALL" -ne 0 ] && exit 1
exit "$SELFTEST_RC"
