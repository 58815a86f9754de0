#!/usr/bin/env bash
# GPU smoke test, as one command: install the plugin, self-test the harness on CPU, build the
# tiny models, then compare stock SGLang with the patched one (scripts/gpu_smoke.py).
#
#   bash scripts/gpu/run_smoke.sh            # results under ${OUT:-./gpu-out}
#
# Environment knobs:
#   OUT                 result folder (default ./gpu-out); gets at most 5 files:
#                       setup.log, stock.log, patched.log, smoke.json, summary.txt
#   SMOKE_SITE          pip --target for the plugin when .gpu/activate.sh is used (default /tmp/site312)
#   SMOKE_SKIP_INSTALL  1: do not pip-install the plugin (it is installed already)
#   SMOKE_MODELS        where to write the tiny models (default: a fresh temporary folder)
#   SMOKE_ARGS          extra arguments for gpu_smoke.py, e.g. "--no-cuda-graph",
#                       "--attention-backend flashinfer", "--sync-probe", or
#                       "--attention-backend default --sync-probe" (SGLang's own configuration:
#                       FA3 + piecewise CUDA graph on H100/H200; needs FA3 staged first,
#                       `bash .gpu-fa3a/stage.sh` then `.gpu-fa3b/stage.sh`, and is reported SKIPPED (no FA3) without it)
#                       (see gpu_smoke.py --help; several configurations in one command:
#                       scripts/gpu/run_matrix.sh)
# Exit status: gpu_smoke.py's (0 passed or skipped, 1 failed, 2 harness error: an Engine did not
# run to the end), else the self-test's. setup.log and summary.txt say whether FA3 was there.
set -uo pipefail

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_usage_if_asked "$@"
gpu_enter_repo
SETUP="$OUT/setup.log"
: > "$SETUP"

gpu_use_bundle "${SMOKE_SITE:-/tmp/site312}"

{
    echo "== python: $(python3 -V 2>&1)"
    gpu_install_plugin "${SMOKE_SKIP_INSTALL:-0}" || PLUGIN_MISSING=1
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
    gpu_fa3_status
} >> "$SETUP" 2>&1
gpu_require_plugin "$SETUP"

echo "== harness self-test (CPU)" >> "$SETUP"
python3 scripts/gpu_smoke_selftest.py >> "$SETUP" 2>&1
SELFTEST_RC=$?
echo "self-test rc $SELFTEST_RC" >> "$SETUP"

if [ -n "${SMOKE_MODELS:-}" ]; then
    MODELS="$SMOKE_MODELS"
else
    MODELS="$(mktemp -d -t smoke-models-XXXXXX)"
    trap 'rm -rf "$MODELS"' EXIT
fi
echo "== tiny models -> $MODELS" >> "$SETUP"
python3 scripts/make_tiny_models.py --out "$MODELS" >> "$SETUP" 2>&1 || { echo "model factory FAILED" | tee -a "$SETUP"; exit 2; }

# shellcheck disable=SC2086
python3 scripts/gpu_smoke.py --models "$MODELS" --log-dir "$OUT" --out-json "$OUT/smoke.json" ${SMOKE_ARGS:-} \
    2>&1 | tee "$OUT/summary.txt"
SMOKE_RC=${PIPESTATUS[0]}

echo "self-test rc $SELFTEST_RC, smoke rc $SMOKE_RC" | tee -a "$OUT/summary.txt"
if [ "$SMOKE_RC" -ne 0 ]; then exit "$SMOKE_RC"; fi
exit "$SELFTEST_RC"
