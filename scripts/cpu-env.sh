#!/usr/bin/env bash
# Run a command in .venv on a CPU-only host. SGLang imports two native GPU modules at module
# level (sgl_kernel, torchvision) that cannot load without CUDA; tests/cpu_shims provides
# inert stand-ins for exactly those two (any call into them raises). On a GPU box, don't use it.
#   scripts/cpu-env.sh sglang-futuremap-patch status
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$root/tests/cpu_shims${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$root/.venv/bin:$PATH"
exec "$@"
