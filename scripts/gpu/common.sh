# Shared by the scripts/gpu/run_*.sh entry points; sourced, not run.

# gpu_usage SCRIPT: print SCRIPT's header comment (line 2 up to its `set -uo` line) as its usage.
gpu_usage() {
    sed -n '2,/^set -uo/p' "$1" | sed '$d' | sed 's/^# \{0,1\}//'
}

# gpu_usage_if_asked "$@": with --help or -h first, print the calling script's usage and exit 0,
# before any setup (no install, no result folder).
gpu_usage_if_asked() {
    if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
        gpu_usage "${BASH_SOURCE[1]}"
        exit 0
    fi
}

# gpu_enter_repo: ROOT = this checkout, OUT = ${OUT:-./gpu-out} made absolute (relative to the
# caller's directory), then cd to ROOT.
gpu_enter_repo() {
    ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    OUT="${OUT:-./gpu-out}"
    mkdir -p "$OUT"
    OUT="$(cd "$OUT" && pwd)"
    cd "$ROOT" || exit 2
}

# gpu_use_bundle SITE: with the offline SGLang bundle (.gpu/activate.sh), unpack and activate it
# and let PIP_TARGET_ARGS install the plugin into SITE; without it, PIP_TARGET_ARGS is empty.
gpu_use_bundle() {
    PIP_TARGET_ARGS=()
    if [ -f .gpu/activate.sh ]; then
        # shellcheck disable=SC1091
        source .gpu/activate.sh
        PIP_TARGET_ARGS=(--no-build-isolation --upgrade --target "$1")
    fi
}

# gpu_install_plugin SKIP: unless SKIP is 1, pip install this checkout (into the bundle's SITE when
# gpu_use_bundle set PIP_TARGET_ARGS); then say which sglang.srt.plugins entry points exist and
# return 1 when ours is missing (a failed install must stop the run, not compare stock to stock).
gpu_install_plugin() {
    if [ "${1:-0}" != "1" ]; then
        echo "== pip install the plugin ${PIP_TARGET_ARGS[*]}"
        python3 -m pip install -q --no-deps "${PIP_TARGET_ARGS[@]}" . 2>&1 | tail -5
    fi
    python3 - <<'PY'
import sys
from importlib.metadata import entry_points
found = [ep.value for ep in entry_points(group="sglang.srt.plugins")]
print("entry points:", found)
if not any(v.startswith("sglang_futuremap_patch") for v in found):
    print("setup FAILED: the plugin is not installed (no sglang_futuremap_patch entry point in sglang.srt.plugins)")
    sys.exit(1)
PY
}

# gpu_require_plugin LOG: after a setup block that ran "gpu_install_plugin ... || PLUGIN_MISSING=1"
# (its output in LOG): stop the run (exit 2) with one line and the end of LOG when it failed.
gpu_require_plugin() {
    if [ -n "${PLUGIN_MISSING:-}" ]; then
        echo "setup FAILED: the plugin is not installed; the end of $1:"
        tail -8 "$1"
        exit 2
    fi
}

# gpu_fa3_status: one line saying whether FA3 (sgl_kernel.flash_ops) imports in this environment;
# FA3=1/0. The Python harnesses find out themselves too (per variant) and record it as "fa3".
gpu_fa3_status() {
    if python3 -c "import sys, sgl_kernel.flash_ops as m; sys.exit(0 if getattr(m, '__file__', None) else 1)" \
            >/dev/null 2>&1; then
        FA3=1
        echo "FA3: installed (sgl_kernel.flash_ops imports)"
    else
        FA3=0
        echo "FA3: not installed (no sgl_kernel.flash_ops): what needs it (backend fa3, or none given) is skipped"
    fi
}

# gpu_setup_models SKIP NAME: the setup a suite runs before its harness, logged to $OUT/setup.log:
# pip install the plugin (unless SKIP is 1), the GPU, FA3 or not, and the tiny models in MODELS (a
# temporary folder named after NAME, removed at exit). Stops the run (exit 2) when the setup fails
# or the plugin is missing; prints the FA3 line.
gpu_setup_models() {
    MODELS="$(mktemp -d -t "$2-models-XXXXXX")"
    trap 'rm -rf "$MODELS"' EXIT
    {
        echo "== python: $(python3 -V 2>&1)"
        gpu_install_plugin "${1:-0}" || PLUGIN_MISSING=1
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        gpu_fa3_status
        python3 scripts/make_tiny_models.py --out "$MODELS"
    } > "$OUT/setup.log" 2>&1 || { echo "setup FAILED"; cat "$OUT/setup.log"; exit 2; }
    gpu_require_plugin "$OUT/setup.log"
    grep -E '^FA3: ' "$OUT/setup.log"
}
