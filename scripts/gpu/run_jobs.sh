#!/usr/bin/env bash
# Several GPU entry points at the same time, each on its own GPUs, after one shared setup (the
# bundle unpacked and the plugin installed once; two entry points doing it at once would race).
# Meant for a four-GPU machine (nvidia-h100-x4 / nvidia-h200-x4): two stock/patched pairs of
# run_serve_bench.sh --gpus 2 side by side, twice the boots per device-minute. Every job's stock
# and patched servers still run at the same time on one host, so each comparison stays within a
# job; the jobs share the host's CPUs (64 cores on those machines).
#
#   bash scripts/gpu/run_jobs.sh \
#       'gsp|0,1|bash scripts/gpu/run_serve_bench.sh --gpus 2 --dataset generated-shared-prefix --boots 3' \
#       'intake|2,3|bash scripts/gpu/run_serve_bench.sh --gpus 2 --port 32200 --backend triton --boots 3'
#
# A job is NAME|GPUS|COMMAND. COMMAND runs under bash with CUDA_VISIBLE_DEVICES=GPUS, OUT=$OUT/NAME
# and the entry points' skip-install knobs set; its output goes to $OUT/NAME/job.log. Several
# commands in one job run one after the other: 'e|0,1|OUT=$OUT/a bash ...; OUT=$OUT/b bash ...'
# (single quotes: $OUT is the job's). Give each job's servers their own ports (--port); the
# harnesses' own port blocks keep to a slice per job (GPU_HARNESS_PORT_SLICE=K/N, job K of N).
# At the end everything under $OUT goes into one archive, $OUT/jobs.tar.gz (the device box brings
# back a limited number of files; JOBS_ARCHIVE=0 leaves the folders as they are).
# JOBS_SKIP_INSTALL=1: the plugin is installed already (only its entry point is checked);
# JOBS_SITE: pip --target for the plugin when .gpu/activate.sh is used (default /tmp/site312),
# handed to the jobs as SERVE_SITE / E2E_SITE.
# Exit status: the largest of the jobs' (2 when an argument is malformed or the setup fails).
set -uo pipefail

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
gpu_usage_if_asked "$@"
if [ $# -eq 0 ]; then
    gpu_usage "${BASH_SOURCE[0]}"
    exit 2
fi

names=()
for job in "$@"; do
    IFS='|' read -r name gpus command <<< "$job"
    if [ -z "$name" ] || [ -z "$gpus" ] || [ -z "$command" ] || [[ ! "$name" =~ ^[A-Za-z0-9._-]+$ ]] \
            || [[ ! "$gpus" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
        echo "error: a job is NAME|GPUS|COMMAND (NAME of letters, digits, . _ -; GPUS like 0,1), got: $job" >&2
        exit 2
    fi
    if [ "$name" = "setup.log" ] || [ "$name" = "jobs.tar.gz" ]; then
        echo "error: a job may not be named $name (the runner's own file)" >&2
        exit 2
    fi
    for seen in "${names[@]}"; do
        if [ "$seen" = "$name" ]; then echo "error: two jobs named $name" >&2; exit 2; fi
    done
    names+=("$name")
done

gpu_enter_repo
SITE="${JOBS_SITE:-/tmp/site312}"
gpu_use_bundle "$SITE"
gpu_install_plugin "${JOBS_SKIP_INSTALL:-0}" > "$OUT/setup.log" 2>&1 || { echo "setup FAILED"; cat "$OUT/setup.log"; exit 2; }

pids=()
k=0
for job in "$@"; do
    IFS='|' read -r name gpus command <<< "$job"
    k=$((k + 1))
    mkdir -p "$OUT/$name"
    echo "== job $name on GPUs $gpus: $command"
    CUDA_VISIBLE_DEVICES="$gpus" OUT="$OUT/$name" SERVE_SKIP_INSTALL=1 E2E_SKIP_INSTALL=1 \
        SERVE_SITE="$SITE" E2E_SITE="$SITE" GPU_HARNESS_PORT_SLICE="$k/$#" \
        bash -c "$command" > "$OUT/$name/job.log" 2>&1 &
    pids+=($!)
done

worst=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    echo "== job ${names[$i]}: exit $rc; the end of its log:"
    tail -25 "$OUT/${names[$i]}/job.log"
    [ "$rc" -gt "$worst" ] && worst=$rc
done
if [ "${JOBS_ARCHIVE:-1}" != "0" ]; then
    (cd "$OUT" && tar czf jobs.tar.gz setup.log "${names[@]}" && rm -rf setup.log "${names[@]}") \
        || echo "warning: could not pack $OUT into jobs.tar.gz; the folders are left as they are"
fi
exit "$worst"
