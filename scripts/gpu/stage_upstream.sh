#!/usr/bin/env bash
# Unpack the upstream bundle (stock SGLang 0.5.13, .gpu-0513) on the GPU machine, for the
# benchmark's upstream variant (bench_spec_v2.py --variants ...,upstream). One short device call
# with carry [".gpu-0513"], right before the benchmark call (carry [".gpu"]) on the same warm
# machine: the two bundles (45-48 MB each) cannot travel in one call.
#
#   bash scripts/gpu/stage_upstream.sh
#
# Its activate.sh unpacks the bundle to /tmp/site312-0.5.13 (once per machine) and installs the
# FA3 of its sglang-kernel when both parts were staged first (carry [".gpu-0513-fa3a"]: bash
# .gpu-0513-fa3a/stage.sh, then the same with .gpu-0513-fa3b). This script then says which SGLang
# the site holds, whether its FA3 imports, and the site to give the benchmark
# (SGLANG_UPSTREAM_SITE, default /tmp/site312-0.5.13, which the benchmark uses by itself).
#
# Environment knobs: UPSTREAM_BUNDLE (default .gpu-0513). Exit status 2 when the bundle was not
# sent along or holds no SGLang after unpacking.
set -uo pipefail

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_usage_if_asked "$@"

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# In two halves, when the working tree plus the 48 MB bundle exceed one call's 64 MiB:
#   split -n 2 -d .gpu-0513/site312.tar.xz p && mkdir -p .gpu-0513-p1 .gpu-0513-p2 &&
#   mv p00 .gpu-0513-p1/part && mv p01 .gpu-0513-p2/part && cp .gpu-0513/activate.sh .gpu-0513-p2/
# then carry [".gpu-0513-p1"] and carry [".gpu-0513-p2"], each with this script: the first half
# waits in /tmp, the second joins it and goes on as with the whole bundle.
PARTS=/tmp/upstream-bundle-parts
if [ -f .gpu-0513-p1/part ]; then
    mkdir -p "$PARTS" && cp .gpu-0513-p1/part "$PARTS/a" && echo "stage_upstream.sh: first half staged"
    exit 0
fi
if [ -f .gpu-0513-p2/part ]; then
    if [ ! -f "$PARTS/a" ]; then
        echo "stage_upstream.sh: stage .gpu-0513-p1 first (a fresh machine has lost it)"
        exit 2
    fi
    cat "$PARTS/a" .gpu-0513-p2/part > "$PARTS/site312.tar.xz" && cp .gpu-0513-p2/activate.sh "$PARTS/"
    UPSTREAM_BUNDLE="$PARTS"
fi
BUNDLE="${UPSTREAM_BUNDLE:-.gpu-0513}"
if [ ! -f "$BUNDLE/activate.sh" ]; then
    echo "stage_upstream.sh: $BUNDLE/activate.sh is missing: send $BUNDLE along (carry [\"$BUNDLE\"])"
    exit 2
fi
# shellcheck disable=SC1090
source "$BUNDLE/activate.sh"   # prints "activate.sh: FA3 installed" or "... no FA3"
SITE="${_site:-/tmp/site312-0.5.13}"
VERSION="$(python3 -c "import sys; sys.path.insert(0, 'scripts'); from gpu_harness import child_env; print(child_env.site_sglang_version(sys.argv[1]) or '')" "$SITE")"
if [ -z "$VERSION" ]; then
    echo "stage_upstream.sh: $SITE holds no SGLang after unpacking $BUNDLE"
    exit 2
fi
echo "upstream site: $SITE (SGLang $VERSION)"
if python3 -c "import sys, sgl_kernel.flash_ops as m; sys.exit(0 if getattr(m, '__file__', None) else 1)" \
        >/dev/null 2>&1; then
    echo "upstream FA3: installed (its sgl_kernel.flash_ops imports)"
else
    echo "upstream FA3: not installed (stage .gpu-0513-fa3a and .gpu-0513-fa3b first for backend default / fa3-*)"
fi
echo "SGLANG_UPSTREAM_SITE=$SITE  (the benchmark's default; it stays while the machine is warm)"
