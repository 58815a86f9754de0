#!/usr/bin/env python3
"""Serving benchmark as users run it: ``sglang.launch_server`` + SGLang's own ``bench_serving``.

Stock (``SGLANG_FUTUREMAP_PATCH=off``) and patched (``strict``) servers are started exactly as a
user starts them (``python -m sglang.launch_server``; ``--backend default`` names no attention
backend: FA3 + piecewise CUDA graph on Hopper), on an 8B-shaped dummy-weight Llama target with a
1-layer STANDALONE draft (3 steps, topk 1, 4 draft tokens) and a word-level tokenizer, or with
``--model deepseek`` on the model factory's tiny DeepSeek-V3 (MLA, seeded weights, its own
tokenizer) launched as DeepSeek users do: ``--speculative-algorithm NEXTN`` and no draft path
(SGLang drafts with the checkpoint's NextN layer; FA3 MLA on Hopper), the same 3 / 1 / 4. Each boot
is a fresh server; boots alternate their order (stock first, then patched first, ...). Against
each server SGLang's ``bench_serving`` command line runs once per ``--max-concurrency`` (offline
dataset ``random-ids`` or ``generated-shared-prefix``, ``ignore_eos``), all of them in one client
process (``serve_bench_client.py``: the module's own ``__main__``, imported once per server). Per cell the record keeps
every boot's p50 / p99 TTFT, TPOT and ITL, output tok/s and accept length, plus SGLang's own
forward occupancy (``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1``: the ``fwd occupancy`` of the
decode log lines written during that run, the value ``sglang:fwd_occupancy`` exports); the
summary is the median over boots with the spread, and patched / stock.

    python3 scripts/gpu_serve_bench.py --out OUT --boots 3 --concurrency 1,4,8,13,16,32,45,48
    python3 scripts/gpu_serve_bench.py --out OUT --backend triton --boots 1 --concurrency 1,8
    python3 scripts/gpu_serve_bench.py --out OUT --model deepseek --variants stock,patched-mla-mirror --boots 1
    python3 scripts/gpu_serve_bench.py --merge a.json b.json > results/serve-bench/README.md

``--merge`` joins the records of several calls (one boot pair each fits a 10-minute device
call) into one summary. Each cell also keeps a digest of every request's generated text, and the
summary counts, per concurrency, the requests whose output equals stock's in the same boot
(``--logs`` reads them from older records' archives).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_harness import child_env, engine_config, launch, model_factory, records  # noqa: E402

#: ``gpu_probe/sched_timeline.py``'s pure helpers (the probe itself loads in the server).
sched_timeline = child_env.probe_module("sched_timeline")
BACKENDS = {"default": (), "triton": ("--attention-backend", "triton"),
            "flashinfer": ("--attention-backend", "flashinfer"), "fa3": ("--attention-backend", "fa3")}
#: Variant -> (the plugin's mode, extra server environment). ``upstream``: stock SGLang of another
#: site folder (0.5.13, the release with publish/stash: ``--upstream-site``), the plugin off; the
#: bench client stays on the current SGLang. ``patched-prefill-first``: the plugin with back-port
#: 16's reordering switched on (a small or finished prefill's result processed before the next
#: launch; a tree's default, a chain's opt-in), to measure it beside ``patched`` on a chain. ``patched-mla-mirror``: the plugin with back-port 18
#: off (FA3 with MLA keeps the host mirror), for ``--model deepseek``.
MODES = {"stock": ("off", {}), "patched": ("strict", {}), "upstream": ("off", {}),
         "patched-prefill-first": ("strict", {"SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST": "1"}),
         # back-port 17's barrier off: what it costs
         "patched-no-war": ("strict", {"SGLANG_FUTUREMAP_WAR_BARRIER": "0"}),
         "patched-mla-mirror": ("strict", dict(child_env.MLA_MIRROR_ENV)),
         # back-port 19 switched on (an opt-in until 2026-11-26, on by default since: = patched)
         "patched-early-intake": ("strict", {"SGLANG_FUTUREMAP_EARLY_INTAKE": "1"}),
         # back-port 19 off: the plugin without the early intake, to measure it beside patched
         "patched-no-early-intake": ("strict", {"SGLANG_FUTUREMAP_EARLY_INTAKE": "0"}),
         # back-port 20 switched on (an opt-in until 2026-11-26, on by default since: = patched)
         "patched-fi-host-sum": ("strict", {"SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM": "1"}),
         # back-port 20 off: FlashInfer's own device-sum read-back, beside patched
         "patched-no-fi-host-sum": ("strict", {"SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM": "0"}),
         # back-port 22 switched on: a mirrored backend's decodes read host lengths from the relay
         "patched-mirror-relay": ("strict", {"SGLANG_FUTUREMAP_MIRROR_RELAY": "1"}),
         # the same with both checks on: relayed lengths and FlashInfer's host indptrs read back
         # against the device at every decode / plan (a host wait each: for finding faults)
         "patched-mirror-relay-check": ("strict", {"SGLANG_FUTUREMAP_MIRROR_RELAY": "1",
                                                   "SGLANG_FUTUREMAP_RELAY_CHECK": "1",
                                                   "SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR_CHECK": "1"}),
         # back-port 22 on, back-port 23 off: FlashInfer plans from its device indptrs
         "patched-mirror-relay-device-indptr": ("strict", {"SGLANG_FUTUREMAP_MIRROR_RELAY": "1",
                                                           "SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR": "0"}),
         # both switched on (a tree's default): back-port 22's relay for the wait after a prefill, back-port 16's order
         # for the decode launched before an idle server's prefill result
         "patched-relay-prefill-first": ("strict", {"SGLANG_FUTUREMAP_MIRROR_RELAY": "1",
                                                    "SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST": "1"}),
         # both switched off: a tree as the plugin ran it before they became its default for trees
         "patched-tree-switches-off": ("strict", {"SGLANG_FUTUREMAP_MIRROR_RELAY": "0",
                                                  "SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST": "0"}),
         # back-port 27 switched on; taken out after the 2026-11-28 record (RETIRED_MODES): merge only
         "patched-prefill-before-next-batch": ("strict", {"SGLANG_FUTUREMAP_PREFILL_BEFORE_NEXT_BATCH": "1"}),
         # SGLang's own switch on top of the plugin: consecutive prefills without overlap
         "patched-serial-prefills": ("strict", {"SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP": "1"}),
         # back-port 27 switched on (opt-in): back-port 17's barrier right after each spec-v2 launch
         "patched-war-after-launch": ("strict", {"SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH": "1"}),
         # back-port 17's barrier left out after an idle poll (the default since 2026-11-29: = patched)
         "patched-skip-idle": ("strict", {"SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE": "1"}),
         # back-port 17's barrier at every poll again, as the plugin ran it before that day
         "patched-poll-barrier": ("strict", {"SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE": "0"})}
#: What the summary says of each variant besides stock, patched and upstream (its own table).
MODE_NOTES = {
    "patched-prefill-first": "the plugin with back-port 16 switched on: a small or finished prefill's result "
                             "processed before the next launch",
    "patched-no-war": "the plugin with back-port 17's WAR barrier off",
    "patched-mla-mirror": "the plugin with back-port 18 off (SGLANG_FUTUREMAP_FA3_MLA=0): FA3 with MLA "
                          "keeps the host mirror",
    "patched-early-intake": "the plugin with back-port 19 switched on (on by default since 2026-11-26): requests "
                            "that arrive while a finished request's lookahead decode runs are launched before its "
                            "result is waited on",
    "patched-no-early-intake": "the plugin with back-port 19 off (SGLANG_FUTUREMAP_EARLY_INTAKE=0): the overlap "
                               "loop's own order",
    "patched-fi-host-sum": "the plugin with back-port 20 switched on (on by default since 2026-11-26): "
                           "FlashInfer's ragged prefill sums its prefix lengths on the host instead of reading "
                           "them back",
    "patched-no-fi-host-sum": "the plugin with back-port 20 off (SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM=0): "
                              "FlashInfer's own device-sum read-back",
    "patched-mirror-relay": "the plugin with back-port 22 switched on (SGLANG_FUTUREMAP_MIRROR_RELAY=1): on a "
                            "backend that keeps the host mirror, a decode reads its host lengths from the relay",
    "patched-mirror-relay-check": "the plugin with back-port 22 switched on and both checks on "
                                  "(SGLANG_FUTUREMAP_RELAY_CHECK=1, SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR_CHECK=1): "
                                  "every relayed length and host indptr compared with the device's (not a timing)",
    "patched-mirror-relay-device-indptr": "the plugin with back-port 22 switched on and back-port 23 off "
                                          "(SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR=0)",
    "patched-relay-prefill-first": "the plugin with back-ports 22 and 16's switches both on: host lengths from the "
                                   "relay, and a small or finished prefill's result processed before the next launch "
                                   "(a tree's default since 2026-11-26: = patched there)",
    "patched-tree-switches-off": "the plugin with back-ports 22 and 16 switched off (=0): a tree as the plugin ran "
                                 "it before they became its default for trees; on a chain = patched",
    "patched-prefill-before-next-batch": "the plugin with back-port 27 switched on "
                                         "(SGLANG_FUTUREMAP_PREFILL_BEFORE_NEXT_BATCH=1; taken out of the plugin "
                                         "after the 2026-11-28 record): a tree's small prefill's result processed "
                                         "before the next batch is built",
    "patched-serial-prefills": "the plugin with SGLang's own SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1: a "
                               "prefill's result is processed before the next prefill is launched",
    "patched-war-after-launch": "the plugin with back-port 27 switched on "
                                "(SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH=1): back-port 17's barrier right "
                                "after each spec-v2 launch, none in an idle loop",
    "patched-skip-idle": "the plugin with back-port 17's barrier left out after an idle poll "
                         "(SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=1): every launch ordered as before; the "
                         "default since 2026-11-29, so the same code as patched from then on",
    "patched-poll-barrier": "the plugin with back-port 17's barrier at every poll of the loop, idle ones "
                            "included (SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=0): the plugin before 2026-11-29",
}

#: Variants whose switch the plugin no longer has: their records still merge, but a run would
#: start the plugin as it ships under their name, so ``main`` refuses them.
RETIRED_MODES = {
    "patched-prefill-before-next-batch": "back-port 27 was taken out of the plugin after its GPU record "
                                         "(results/serve-bench/h200x4-2026-11-28); it lives at commit 67600a0",
}
#: Variants that run the plugin (its startup line must be in their log, and only theirs).
PATCHED_VARIANTS = frozenset(v for v, (mode, _) in MODES.items() if mode != "off")
#: The timeline probe's settings a caller may set in the environment (recorded in the config).
PROBE_ENV = ("SMOKE_SAMPLE_DEPTH", "SMOKE_STEADY_SAMPLE_EVERY", "SMOKE_TIME_FUNCS", "SMOKE_CORE_SPEED",
             "SMOKE_CALL_CENSUS", "SMOKE_CALL_CENSUS_TIMES")
#: Bootstrap resamples for the pooled TTFT ratios' interval (seeded: the record is reproducible).
BOOTSTRAP_N = 1000
#: Draft shapes (``--spec``): ``chain`` 3 steps / topk 1 / 4 draft tokens (SGLang's choice for
#: most targets), ``tree`` 5 / 4 / 8 (the tree SGLang picks by itself for a Llama target; given
#: explicitly, so stock runs it as its docs tell users to: on spec v1, the plugin on spec v2).
SPECS = {"chain": (3, 1, 4), "tree": (5, 4, 8)}


class ServeModel(NamedTuple):
    """A ``--model`` choice: how the record describes it, its speculative algorithm, and whether
    it loads dummy weights (config.json only) or the factory's seeded ones."""

    description: str
    algorithm: str
    dummy: bool


MODELS = {
    "8b": ServeModel("8B-shaped Llama, dummy weights; 1-layer STANDALONE draft", "STANDALONE", True),
    "deepseek": ServeModel("tiny DeepSeek-V3 (MLA, MoE), seeded weights; its own NextN layer as draft (NEXTN, "
                           "no draft path)", engine_config.NEXTN_ALGORITHM, False),
}


def spec_args(spec: str = "chain", algorithm: str = "STANDALONE", draft: str | None = None) -> list[str]:
    """The speculative launch flags (the e2e harness's own, ``engine_config.spec_launch``): the
    draft path where there is one, the algorithm, and the shape ``SPECS[spec]``."""
    return engine_config.server_flags(engine_config.spec_launch(algorithm, draft, SPECS[spec]))


#: Launch flags every server gets (recorded with the results): with SGLang's default memory
#: fraction (0.754 on an H100) this model's piecewise CUDA graph capture at 8,192 tokens fails
#: (CUBLAS_STATUS_EXECUTION_FAILED, stock and patched alike, seen 2026-11-23); the decode
#: benchmark's values avoid it and keep the start short.
DEFAULT_SERVER_ARGS = ("--mem-fraction-static", "0.55", "--piecewise-cuda-graph-max-tokens", "1024")
#: Per-cell values, as bench_serving names them (lower is better for the latency ones).
LATENCY_KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms")
OTHER_KEYS = ("output_throughput", "accept_length", "fwd_occupancy")
_OCCUPANCY = re.compile(r"fwd occupancy: ([0-9.]+)%")


def parse_int_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def boot_order(variants: Sequence[str], boot: int) -> list[str]:
    """Variants in the order boot ``boot`` starts them: alternating, so neither side always
    gets the first (cold) slot."""
    return list(variants) if boot % 2 == 0 else list(reversed(variants))


#: Port distance between servers that run at the same time (``--gpus``): each server takes ports
#: above its own (SGLang's NCCL / scheduler ports), and a boot's ports are ``10 * boot`` apart.
SLOT_PORT_STRIDE = 500


def placements(variants: Sequence[str], boot: int, gpus: Sequence[str]) -> list[list[tuple[str, str | None, int]]]:
    """Boot ``boot``'s servers as waves run one after another: each wave a list of
    (variant, GPU, port offset) that run at the same time, one per GPU. With one GPU (or none
    named) every wave holds one server and no GPU is pinned: the sequential order of
    :func:`boot_order`. With several, which GPU a variant gets moves on with the boot, so over
    boots each side runs on each GPU (one card slower than the other does not favour a side)."""
    order = boot_order(variants, boot)
    if len(gpus) < 2:
        return [[(v, None, 0)] for v in order]
    # The GPU follows the variant's place in ``variants``, not its slot in the boot's order: the
    # order reverses every other boot, which would cancel a rotation by slot (with two variants
    # each side kept one card).
    place = {v: i for i, v in enumerate(variants)}
    waves = [order[i:i + len(gpus)] for i in range(0, len(order), len(gpus))]
    return [[(v, gpus[(place[v] + boot) % len(gpus)], slot * SLOT_PORT_STRIDE) for slot, v in enumerate(wave)]
            for wave in waves]


def parse_cpulist(text: str) -> list[int]:
    """A kernel CPU list (``0-3,8,10-11``, as in ``local_cpulist``) -> its CPUs in order."""
    cpus: list[int] = []
    for part in (p.strip() for p in text.strip().split(",")):
        if part:
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus: Sequence[int]) -> str:
    """CPUs -> the kernel's compact list (``0-3,8``)."""
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and c == last + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
        last = c
    return ",".join(out)


def physical_cores(cpus: Sequence[int], sys_cpu: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """``cpus`` grouped by physical core (sysfs ``physical_package_id`` and ``core_id``: a
    core's hyperthreads stay together), cores in the order of their first CPU. A CPU without
    topology files counts as a core of its own."""
    cores: dict[tuple[int, int] | tuple[str, int], list[int]] = {}
    for c in sorted(cpus):
        topo = sys_cpu / f"cpu{c}" / "topology"
        try:
            key: tuple[Any, int] = (int((topo / "physical_package_id").read_text()), int((topo / "core_id").read_text()))
        except (OSError, ValueError):
            key = ("cpu", c)
        cores.setdefault(key, []).append(c)
    return sorted(cores.values(), key=lambda core: core[0])


def gpu_local_cpus(gpu: str, pci_root: Path = Path("/sys/bus/pci/devices")) -> set[int] | None:
    """The CPUs of the NUMA node nearest GPU ``gpu`` (``nvidia-smi`` index): its PCI device's
    ``local_cpulist``; None where that cannot be read."""
    try:
        bus = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", gpu],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    # nvidia-smi writes an 8-digit domain (00000000:1B:00.0); sysfs names it with 4, lower case.
    m = re.fullmatch(r"(?:[0-9A-Fa-f]*?)([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])", bus)
    if not m:
        return None
    try:
        return set(parse_cpulist((pci_root / m.group(1).lower() / "local_cpulist").read_text()))
    except (OSError, ValueError):
        return None


def cpu_sets(slots: Sequence[str], cores: Sequence[Sequence[int]],
             local: dict[str, set[int] | None]) -> dict[str, list[int]]:
    """Disjoint CPU sets, one per slot (a GPU of ``--gpus``, or the one slot of a run with one
    GPU), each the same number of whole physical cores (``len(cores) // len(slots)``). A slot
    takes cores of its GPU's NUMA node first (``local``; None: unknown), slots of the same node
    splitting it evenly, and tops its share up from the other cores. ValueError when there are
    fewer cores than slots. Servers that run side by side then never share a core, and the two
    sides of a comparison get equal room."""
    if len(cores) < len(slots):
        raise ValueError(f"{len(cores)} physical core(s) for {len(slots)} server(s)")
    per = len(cores) // len(slots)
    taken: set[int] = set()
    out: dict[str, list[int]] = {}
    for slot in slots:
        node = local.get(slot)
        free = [core for core in cores if core[0] not in taken]
        near = [core for core in free if node and set(core) <= node]
        far = [core for core in free if core not in near]
        # Slots still to place on the same node split its cores evenly; a slot tops its share
        # up from the other nodes first, so that the later ones keep theirs.
        sharing = sum(1 for s in slots if s not in out and local.get(s) == node) if node else 1
        mine = near[:min(per, len(near) // sharing)]
        pick = mine + (far + near[len(mine):])[:per - len(mine)]
        out[slot] = sorted(c for core in pick for c in core)
        taken.update(core[0] for core in pick)
    return out


def pin_process(pid: int, cpus: Sequence[int] | None) -> str | None:
    """Restrict process ``pid`` (and what it starts later: SGLang's scheduler and detokenizer
    inherit it) to ``cpus``; the CPU list it then has, or None without ``cpus`` or where the
    process is gone."""
    if not cpus:
        return None
    try:
        os.sched_setaffinity(pid, cpus)
        return format_cpulist(sorted(os.sched_getaffinity(pid)))
    except OSError:
        return None


#: SGLang's scheduler process names itself so (``setproctitle``); the kernel's ``comm`` keeps 15 bytes.
SCHEDULER_TITLE = "sglang::scheduler"


def process_tree(pid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """``pid`` and every process below it (by ``/proc/<pid>/stat``'s parent), ``pid`` first."""
    parents: dict[int, list[int]] = {}
    for d in proc_root.iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(sorted(parents.get(p, ())))
    return out


def is_scheduler(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether process ``pid`` is an SGLang scheduler (its title, or its truncated ``comm``)."""
    try:
        title = (proc_root / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        comm = (proc_root / str(pid) / "comm").read_text().strip()
    except OSError:
        return False
    return title.startswith(SCHEDULER_TITLE) or (len(comm) >= 15 and SCHEDULER_TITLE.startswith(comm))


def pin_tasks(pid: int, cpus: Sequence[int], proc_root: Path = Path("/proc")) -> int:
    """Every thread of process ``pid`` on ``cpus`` (``pin_process`` per thread:
    ``sched_setaffinity`` sets one); how many were set (a thread that ended meanwhile is not)."""
    try:
        tids = [int(t.name) for t in (proc_root / str(pid) / "task").iterdir() if t.name.isdigit()]
    except OSError:
        return 0
    return sum(pin_process(tid, cpus) is not None for tid in tids)


def pin_scheduler_apart(server_pid: int, client_pid: int, slot: Sequence[int],
                        cores: Sequence[Sequence[int]] | None = None,
                        proc_root: Path = Path("/proc")) -> dict[str, Any]:
    """``--pin-scheduler``: within the server's CPU set ``slot``, its scheduler process (every
    thread) gets the first physical core alone, both hyperthreads of it, and every other process
    of the server (API server, detokenizer) and the bench client get the rest. Nothing else then
    runs on the scheduler thread's core or on its SMT sibling. ``cores``: ``slot`` by physical
    core (``physical_cores``). The CPU lists given, or ``error`` (nothing pinned)."""
    cores = list(cores) if cores is not None else physical_cores(slot)
    if len(cores) < 2:
        return {"error": f"--pin-scheduler needs 2 physical cores per server, {len(cores)} here"}
    tree = process_tree(server_pid, proc_root)
    schedulers = [p for p in tree if is_scheduler(p, proc_root)]
    if not schedulers:
        return {"error": "no SGLang scheduler process under the server"}
    own = sorted(cores[0])
    rest = sorted(c for core in cores[1:] for c in core)
    for p in schedulers:
        pin_tasks(p, own, proc_root)
    others = [p for p in tree if p not in schedulers] + process_tree(client_pid, proc_root)
    for p in others:
        pin_tasks(p, rest, proc_root)
    return {"scheduler": format_cpulist(own), "others": format_cpulist(rest), "schedulers": len(schedulers)}


def plan_cpus(gpus: Sequence[str]) -> dict[str, list[int]]:
    """``--pin-cpus``: the CPU set of each slot (``gpus``; a run with one GPU has the one slot
    ``""``, placed near the first visible GPU) from this process's CPUs. ValueError as
    :func:`cpu_sets`."""
    slots = list(gpus) or [""]
    local = {s: gpu_local_cpus(s or child_env.visible_gpus(1)[0]) for s in slots}
    return cpu_sets(slots, physical_cores(sorted(os.sched_getaffinity(0))), local)


def num_prompts(concurrency: int, rounds: int, floor: int) -> int:
    """Requests per cell: ``rounds`` full waves at that concurrency, at least ``floor``."""
    return max(concurrency * rounds, floor)


#: ``generated-shared-prefix`` prompts per system prompt (``--gsp-prompts-per-group``).
GSP_PER_GROUP = 8


def gsp_groups(prompts: int) -> int:
    """System prompts of a ``generated-shared-prefix`` cell of ``prompts`` requests."""
    return max(1, prompts // GSP_PER_GROUP)


def requests_sent(dataset: str, prompts: int) -> int:
    """Requests ``bench_serving`` measures for ``--num-prompts prompts``: that many, except on
    ``generated-shared-prefix``, which sends every group's prompts and ignores ``--num-prompts``
    (12 at concurrency 1 are one group of 8)."""
    return gsp_groups(prompts) * GSP_PER_GROUP if dataset == "generated-shared-prefix" else prompts


def server_argv(model: str, draft: str | None, backend: str, port: int, extra: Sequence[str] = (),
                spec: str = "chain", served: str = "8b") -> list[str]:
    """The ``launch_server`` command line of one server: ``model`` (the target's directory) as
    ``--model`` ``served`` runs it; ``draft`` None names no draft path (DeepSeek MTP)."""
    kind = MODELS[served]
    weights = ["--load-format", "dummy"] if kind.dummy else []
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", model, *weights,
            *spec_args(spec, kind.algorithm, draft), *BACKENDS[backend],
            "--host", "127.0.0.1", "--port", str(port), "--enable-metrics", "--random-seed", "0",
            *DEFAULT_SERVER_ARGS, *extra]


def cell_seed(seed: int, concurrency: int) -> int:
    """bench_serving's prompts follow its seed: one seed per cell, so no cell finds the
    previous cells' prompts in the radix cache (both sides would, alike, but users do not)."""
    return seed * 1000 + concurrency


def bench_argv(model: str, port: int, concurrency: int, prompts: int, out_file: Path, args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1",
            "--port", str(port), "--tokenizer", model, "--model", model, "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency), "--output-file", str(out_file), "--disable-tqdm",
            "--seed", str(cell_seed(args.seed, concurrency)),
            "--warmup-requests", str(warmup_requests(args.warmup, concurrency)), "--output-details"]
    if args.dataset == "random-ids":
        argv += ["--dataset-name", "random-ids", "--random-input-len", str(args.input_len),
                 "--random-output-len", str(args.output_len),
                 "--random-range-ratio", str(args.range_ratio)]
    else:
        argv += ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(gsp_groups(prompts)),
                 "--gsp-prompts-per-group", str(GSP_PER_GROUP), "--gsp-system-prompt-len", str(args.input_len),
                 "--gsp-question-len", "64", "--gsp-output-len", str(args.output_len)]
    return argv


def warmup_requests(mode: str, concurrency: int) -> int:
    """bench_serving's warm-up, sent at once before the measured requests: ``one`` request
    (its default), or a ``wave`` of ``concurrency`` requests. A server compiles kernels and
    captures shapes the first time a batch size or token count occurs (a prefill launch of
    100-200 ms instead of 15-30, on either side); one request only warms size 1, so the first
    wave of every cell paid that, at random, in the TTFT it measured."""
    return concurrency if mode == "wave" else 1


def request_ttfts(bench: dict[str, Any]) -> list[float] | None:
    """Per-request TTFT (ms, 0.1 ms) of a bench_serving result written with ``--output-details``."""
    ttfts = bench.get("ttfts")
    if not ttfts:
        return None
    return [round(t * 1e3, 1) for t in ttfts if t is not None and t > 0]


def pooled_ttft(runs: Sequence[dict[str, Any]], other: str = "patched", seed: int = 0) -> dict[int, dict[str, Any]]:
    """TTFT p50 / p99 over every request of every boot, per concurrency, stock and ``other``,
    and how much better ``other`` is (stock / other) with a 90% bootstrap interval.

    A boot's cell holds 4-16 waves of requests that arrive together, so its own median moves
    by 10-40% between boots; pooling the requests of all boots gives one TTFT per side over all
    of them. The interval resamples requests within each side (seeded), so it leaves out the
    scatter between boots: ``boot_pair_ratios`` gives the interval that counts it, several times
    wider in these records."""
    import random

    pools: dict[str, dict[int, list[float]]] = {}
    for run in runs:
        for c, vals in run["cells"].items():
            if vals.get("ttfts_ms"):
                pools.setdefault(run["variant"], {}).setdefault(int(c), []).extend(vals["ttfts_ms"])
    stock, theirs = pools.get("stock", {}), pools.get(other, {})
    rng = random.Random(seed)
    out: dict[int, dict[str, Any]] = {}
    for c in sorted(set(stock) & set(theirs)):
        s, o = stock[c], theirs[c]
        row: dict[str, Any] = {"n": [len(s), len(o)]}
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            ratios = []
            for _ in range(BOOTSTRAP_N):
                rs = [s[rng.randrange(len(s))] for _ in s]
                ro = [o[rng.randrange(len(o))] for _ in o]
                ratios.append(records.quantile(rs, q) / records.quantile(ro, q))
            row[name] = {"stock": records.quantile(s, q), other: records.quantile(o, q),
                         "ratio": records.quantile(s, q) / records.quantile(o, q),
                         "ci90": [records.quantile(ratios, 0.05), records.quantile(ratios, 0.95)]}
        out[c] = row
    return out


#: The cells whose boot pairs ``boot_pair_ratios`` sets out (latencies: stock / the other side).
PAIR_KEYS = (("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"), ("median_tpot_ms", "TPOT p50"))
#: Two-sided 95% quantiles of Student's t by degrees of freedom; between two entries the lower
#: one's (a wider interval), beyond the last the normal's.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
#: The target's margin (+3%) as a half-width on the log scale, for ``pairs_for_3pct``.
TARGET_LOG = math.log(1.03)


def t95(df: int) -> float:
    """Student's t, two-sided 95%, for ``df`` degrees of freedom (``T95``)."""
    if df > max(T95):
        return 1.96
    return T95[max(k for k in T95 if k <= df)]


def pair_placement(docs: Sequence[dict[str, Any]]) -> str:
    """How a boot's servers ran in these records, as the boot-pair table says it: side by side
    (``--gpus``, one GPU each, at the same time) or one after the other (one GPU)."""
    side = [bool(d["environment"]["config"].get("gpus")) for d in docs]
    if all(side):
        return "side by side"
    if not any(side):
        return "one after the other"
    return "side by side in some records, one after the other in the others"


def boot_pair_ratios(runs: Sequence[dict[str, Any]], other: str = "patched") -> dict[int, dict[str, dict[str, Any]]]:
    """Per concurrency and ``PAIR_KEYS`` cell: each boot pair's stock / ``other`` (the two servers
    of one boot of one record), their geometric mean (``ratio``), its 95%
    interval over the pairs (Student's t on the log ratios; None with one pair) and how many pairs
    an interval of +-3% would take at this scatter (``pairs_for_3pct``).

    Unlike ``pooled_ttft``'s bootstrap over requests, this counts the scatter between boots, the
    largest one in these records (one pair moves by +-13%); it is the interval that says whether a
    cell's miss is measured or within what its boots can resolve."""
    logs: dict[int, dict[str, list[float]]] = {}
    by_boot: dict[tuple[Any, Any], dict[str, dict[str, Any]]] = {}
    for run in runs:
        by_boot.setdefault((run.get("record", 0), run.get("boot")), {})[run["variant"]] = run["cells"]
    for sides in by_boot.values():
        stock, theirs = sides.get("stock"), sides.get(other)
        if not stock or not theirs:
            continue
        for c in set(stock) & set(theirs):
            for key, _ in PAIR_KEYS:
                a, b = stock[c].get(key), theirs[c].get(key)
                if a and b:
                    logs.setdefault(int(c), {}).setdefault(key, []).append(math.log(a / b))
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for c, keys in sorted(logs.items()):
        for key, xs in keys.items():
            mean = statistics.fmean(xs)
            row: dict[str, Any] = {"pairs": len(xs), "ratio": math.exp(mean), "ci95": None, "pairs_for_3pct": None}
            if len(xs) > 1:
                sd = statistics.stdev(xs)
                half = t95(len(xs) - 1) * sd / math.sqrt(len(xs))
                row["ci95"] = [math.exp(mean - half), math.exp(mean + half)]
                row["pairs_for_3pct"] = math.ceil((1.96 * sd / TARGET_LOG) ** 2)
            out.setdefault(c, {})[key] = row
    return out


def format_pair_table(pairs: dict[int, dict[str, dict[str, Any]]]) -> str:
    """Markdown: ``boot_pair_ratios`` per concurrency (x: how much better the other side is,
    [95% interval over pairs], pairs a +-3% interval would need)."""
    if not pairs:
        return ""
    lines = ["| conc | boot pairs | " + " | ".join(label for _, label in PAIR_KEYS) + " |",
             "|---|---|" + "---|" * len(PAIR_KEYS)]
    for c, row in sorted(pairs.items()):
        cells = []
        for key, _ in PAIR_KEYS:
            r = row.get(key)
            if r is None:
                cells.append("-")
            elif r["ci95"] is None:
                cells.append(f"x{r['ratio']:.3f} (one pair)")
            else:
                need = r["pairs_for_3pct"]
                cells.append(f"x{r['ratio']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]; "
                             f"+-3%: {need} pair{'' if need == 1 else 's'}")
        n = max(r["pairs"] for r in row.values())
        lines.append(f"| {c} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_pooled_table(pooled: dict[int, dict[str, Any]], other: str = "patched") -> str:
    """Markdown: pooled TTFT per concurrency, stock -> ``other`` (x: how much better, [90% CI])."""
    if not pooled:
        return ""
    lines = ["| conc | requests (stock / " + other + ") | TTFT p50 | TTFT p99 |", "|---|---|---|---|"]
    for c, row in sorted(pooled.items()):
        cells = []
        for name in ("p50", "p99"):
            r = row[name]
            cells.append(f"{r['stock']:.1f} -> {r[other]:.1f} (x{r['ratio']:.3f} [{r['ci90'][0]:.3f}, "
                         f"{r['ci90'][1]:.3f}])")
        lines.append(f"| {c} | {row['n'][0]} / {row['n'][1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: Fields of SGLang's own ``server_args=ServerArgs(...)`` log line that ``server_config`` keeps.
_SERVER_ARG = re.compile(r"\b(attention_backend|disable_overlap_schedule|speculative_eagle_topk)=('?)([\w.]*)\2")


def server_config(log_text: str) -> dict[str, Any] | None:
    """What a server runs, from SGLang's ``server_args=ServerArgs(...)`` log line, printed once
    SGLang has resolved its defaults: the attention backend (``--backend default`` names none,
    and SGLang picks one per model, GPU and draft shape), whether the overlap scheduler is on
    (SGLang turns it off where it falls back to spec v1) and the draft's topk; None without the
    line."""
    line = next((x for x in log_text.splitlines() if "server_args=ServerArgs(" in x), None)
    if line is None:
        return None
    vals = {k: v for k, _, v in _SERVER_ARG.findall(line)}
    topk = vals.get("speculative_eagle_topk")
    return {"attention_backend": vals.get("attention_backend"),
            "overlap": None if "disable_overlap_schedule" not in vals else vals["disable_overlap_schedule"] == "False",
            "topk": int(topk) if topk and topk.isdigit() else None}


def server_lines(runs: Sequence[dict[str, Any]]) -> str:
    """One line: what each variant's servers ran (``server_config``, with how many runs), and a
    warning when stock and another variant ran different attention backends; "" for records
    made before the field."""
    seen: dict[str, dict[str, int]] = {}
    backends: dict[str, set[str | None]] = {}
    for run in runs:
        cfg = run.get("server")
        if cfg:
            overlap = {True: "overlap on", False: "overlap off", None: "overlap ?"}[cfg.get("overlap")]
            desc = f"{cfg.get('attention_backend')}, {overlap}, topk {cfg.get('topk')}"
            by = seen.setdefault(run["variant"], {})
            by[desc] = by.get(desc, 0) + 1
            backends.setdefault(run["variant"], set()).add(cfg.get("attention_backend"))
    if not seen:
        return ""
    parts = [f"{v}: " + "; ".join(f"{d} (x{n})" for d, n in seen[v].items()) for v in [m for m in MODES if m in seen]]
    line = "Servers as SGLang resolved them (attention backend, overlap scheduler, draft topk): " + "; ".join(parts)
    differ = [v for v in seen if v != "stock" and "stock" in seen and backends[v] != backends["stock"]]
    if differ:
        line += (f". **The attention backends differ between stock and {', '.join(differ)}**: "
                 "not one configuration")
    return line


def occupancy(log_text: str) -> float | None:
    """Median forward occupancy (percent) of the decode log lines in ``log_text``."""
    values = [float(v) for v in _OCCUPANCY.findall(log_text)]
    values = [v for v in values if v == v]  # nan before the first window
    return statistics.median(values) if values else None


def output_digests(bench: dict[str, Any]) -> list[str | None] | None:
    """Per measured request (``bench_serving``'s order, the order of its prompts), the first 12
    hex digits of the SHA-1 of its generated text (``--output-details``); None for a request that
    failed. Both sides of a cell get the same prompts (seeded ``random-ids``; one cached
    ``generated-shared-prefix`` file per cell, see ``serve_bench_client``), so equal digests are
    equal outputs: the serving workload's own token check (with the 8b model's word-level
    tokenizer, one word per token)."""
    texts = bench.get("generated_texts")
    if not isinstance(texts, list):
        return None
    errors = bench.get("errors") or [""] * len(texts)
    return [hashlib.sha1(t.encode()).hexdigest()[:12] if isinstance(t, str) and not err else None
            for t, err in zip(texts, errors)]


def cell_values(bench: dict[str, Any], occ: float | None) -> dict[str, Any]:
    out = {k: bench.get(k) for k in (*LATENCY_KEYS, "mean_ttft_ms", "output_throughput", "accept_length",
                                      "completed")}
    out["fwd_occupancy"] = occ
    ttfts = request_ttfts(bench)
    if ttfts:
        out["ttfts_ms"] = ttfts
    digests = output_digests(bench)
    if digests:
        out["output_digests"] = digests
    return out


def logs_texts(tar_path: Path, folder: str, keep: Callable[[str], bool]) -> Iterator[tuple[str, str]]:
    """Name and text of each file directly in ``folder`` of a ``serve-logs.tar.gz`` whose name
    ``keep`` accepts (the others are not read)."""
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            path = Path(m.name)
            if m.isfile() and path.parent.name == folder and keep(path.name):
                f = tar.extractfile(m)
                assert f is not None
                yield path.name, f.read().decode(errors="replace")


def bench_results(tar_path: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The ``bench_serving`` result of each cell that a ``serve-logs.tar.gz`` keeps
    (``bench/<variant>-boot<n>-c<c>.jsonl``, written with ``--output-details``: every record has
    them; the file's last line is the measured run): ``(variant, boot, concurrency)`` -> that JSON."""
    cell_file = re.compile(r"(.+)-boot(\d+)-c(\d+)\.jsonl")
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    for name, text in logs_texts(tar_path, "bench", lambda n: cell_file.fullmatch(n) is not None):
        hit = cell_file.fullmatch(name)
        lines = text.strip().splitlines()
        if hit and lines:
            out[(hit.group(1), int(hit.group(2)), int(hit.group(3)))] = json.loads(lines[-1])
    return out


def digests_from_logs(doc: dict[str, Any], tar_path: Path) -> None:
    """Fill in ``output_digests`` of ``doc``'s cells that lack them from the ``bench_serving``
    files its ``serve-logs.tar.gz`` keeps (``bench_results``)."""
    results = bench_results(tar_path)
    for run in doc["runs"]:
        for c, vals in run["cells"].items():
            bench = results.get((run["variant"], run["boot"], int(c)))
            if vals.get("output_digests") or bench is None:
                continue
            digests = output_digests(bench)
            if digests:
                vals["output_digests"] = digests


def servers_from_logs(doc: dict[str, Any], tar_path: Path) -> None:
    """Fill in ``server`` (``server_config``) of ``doc``'s runs that lack it from the server logs
    its ``serve-logs.tar.gz`` keeps (``logs/<variant>-boot<n>.log``; records before 2026-11-27)."""
    wanted = {f"{run['variant']}-boot{run['boot']}.log": run for run in doc["runs"] if not run.get("server")}
    for name, text in logs_texts(tar_path, "logs", wanted.__contains__):
        cfg = server_config(text)
        if cfg:
            wanted[name]["server"] = cfg


def same_outputs(runs: Sequence[dict[str, Any]]) -> dict[str, dict[int, list[int]]]:
    """Per variant other than stock and concurrency: ``[identical, compared]`` requests, each
    run's outputs against those of the stock run of the same boot (a record's boots share
    prompts, so a boot without a stock run is held against the first stock run of that cell).
    Requests that failed on either side and records without digests are left out."""
    stock: dict[int, dict[int, list[str | None]]] = {}
    for run in runs:
        if run["variant"] == "stock":
            for c, vals in run["cells"].items():
                if vals.get("output_digests"):
                    stock.setdefault(int(c), {}).setdefault(run["boot"], vals["output_digests"])
    out: dict[str, dict[int, list[int]]] = {}
    for run in runs:
        if run["variant"] == "stock":
            continue
        for c, vals in run["cells"].items():
            mine, by_boot = vals.get("output_digests"), stock.get(int(c))
            if not mine or not by_boot:
                continue
            theirs = by_boot.get(run["boot"], next(iter(by_boot.values())))
            pairs = [(a, b) for a, b in zip(theirs, mine) if a is not None and b is not None]
            slot = out.setdefault(run["variant"], {}).setdefault(int(c), [0, 0])
            slot[0] += sum(a == b for a, b in pairs)
            slot[1] += len(pairs)
    return out


def format_same_outputs(same: dict[str, dict[int, list[int]]]) -> str:
    """Markdown: per concurrency, requests whose output equals stock's, per variant."""
    variants = [v for v in MODES if v in same]
    if not variants:
        return ""
    rows = sorted({c for v in variants for c in same[v]})
    lines = ["| conc | " + " | ".join(f"{v}: identical to stock" for v in variants) + " |",
             "|---|" + "---|" * len(variants)]
    for c in rows:
        cells = [f"{same[v][c][0]} / {same[v][c][1]}" if c in same[v] else "-" for v in variants]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def flat_cell(vals: dict[str, Any]) -> dict[str, Any]:
    """A cell's values with the scheduler split (``sched``, a dict) as ``sched_<key>`` entries."""
    out = {k: v for k, v in vals.items() if k not in ("sched", "ttfts_ms", "client_requests", "output_digests")}
    for k, v in (vals.get("sched") or {}).items():
        if not isinstance(v, dict):  # per-site waits stay in the record only
            out[f"sched_{k}"] = v
    return out


def spread(values: Sequence[float | None]) -> dict[str, Any] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def ratio_key(other: str) -> str:
    """Where ``summarize`` keeps stock -> ``other``: ``ratio`` for patched, ``ratio_<other>``
    for any other variant."""
    return "ratio" if other == "patched" else f"ratio_{other}"


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median over boots per (variant, concurrency) and key; ``ratio`` = how much better
    patched is (stock / patched for latencies, patched / stock for throughput)."""
    cells: dict[str, dict[int, dict[str, list[float | None]]]] = {}
    for run in runs:
        for c, vals in run["cells"].items():
            slot = cells.setdefault(run["variant"], {}).setdefault(int(c), {})
            for k, v in flat_cell(vals).items():
                slot.setdefault(k, []).append(v)
    summary: dict[str, Any] = {"variants": {}, "ratio": {}}
    for variant, by_c in cells.items():
        summary["variants"][variant] = {c: {k: spread(v) for k, v in d.items()} for c, d in sorted(by_c.items())}
    stock = summary["variants"].get("stock", {})
    others = [(v, ratio_key(v)) for v in MODES if v != "stock"]
    for other, key in others:
        theirs = summary["variants"].get(other, {})
        if other != "patched" and not theirs:
            continue
        summary[key] = {}
        for c in sorted(set(stock) & set(theirs)):
            row = {}
            for k in (*LATENCY_KEYS, "output_throughput"):
                s, p = stock[c].get(k), theirs[c].get(k)
                if s and p and s["median"] and p["median"]:
                    row[k] = s["median"] / p["median"] if k in LATENCY_KEYS else p["median"] / s["median"]
            summary[key][c] = row
    return summary


def format_table(summary: dict[str, Any], other: str = "patched") -> str:
    """Markdown: one row per concurrency, stock -> ``other`` medians and how much better
    ``other`` (patched, or upstream) is."""
    cols = [("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"), ("median_tpot_ms", "TPOT p50"),
            ("p99_tpot_ms", "TPOT p99"), ("median_itl_ms", "ITL p50"), ("p99_itl_ms", "ITL p99"),
            ("output_throughput", "out tok/s")]
    head = "| conc | " + " | ".join(name for _, name in cols) + " | accept | fwd occupancy |"
    lines = [head, "|" + "---|" * (len(cols) + 3)]
    stock, patched = summary["variants"].get("stock", {}), summary["variants"].get(other, {})
    ratio = summary[ratio_key(other)]

    def med(d: dict[str, Any], k: str) -> float | None:
        return (d.get(k) or {}).get("median")

    for c in sorted(set(stock) & set(patched)):
        cells = []
        for k, _ in cols:
            s, p, r = med(stock[c], k), med(patched[c], k), ratio[c].get(k)
            cells.append("-" if s is None or p is None else f"{s:.1f} -> {p:.1f} (x{r:.3f})")
        acc = [med(stock[c], "accept_length"), med(patched[c], "accept_length")]
        occ = [med(stock[c], "fwd_occupancy"), med(patched[c], "fwd_occupancy")]
        fmt = lambda pair, spec: " / ".join("-" if v is None else format(v, spec) for v in pair)  # noqa: E731
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {fmt(acc, '.2f')} | {fmt(occ, '.1f')}% |")
    return "\n".join(lines)


SCHED_COLS = (("sched_total_ms", "received -> first tokens sent"), ("sched_queue_ms", "queue"),
              ("sched_launch_ms", "prefill launch"), ("sched_between_ms", "launch end -> processing"),
              ("sched_next_launch_ms", "next batch launch"), ("sched_process_ms", "processing"),
              ("sched_decode_launch_ms", "decode launch"))


#: TTFT outside the scheduler (``--timeline``'s API-server events), beside the client's TTFT.
API_COLS = (("median_ttft_ms", "client TTFT p50"), ("sched_api_total_ms", "API server: received -> first output"),
            ("sched_api_before_dispatch_ms", "received -> sent to the scheduler"),
            ("sched_dispatch_to_sched_ms", "sent -> scheduler received"),
            ("sched_total_ms", "scheduler: received -> first tokens sent"),
            ("sched_sched_to_api_ms", "first tokens sent -> API server"),
            ("sched_api_loop_lag_ms", "API server loop lag (mean)"),
            ("sched_client_to_api_ms", "client sent -> API server received"),
            ("sched_api_to_client_ms", "API server first output -> client"),
            ("client_loop_lag_mean_ms", "client loop lag (mean)"), ("client_loop_lag_max_ms", "client loop lag (max)"))

#: The GPU side of prefill launches (``--timeline`` on CUDA, ``sched_timeline.gpu_breakdown``;
#: records from before have none).
GPU_COLS = (("sched_prefill_gpu_queue_ms", "prefill queued on the GPU ms"),
            ("sched_prefill_gpu_ms", "prefill GPU ms"), ("sched_prefill_ready_wait_ms", "first tokens ready -> processed ms"),
            ("sched_prefill_gpu_gap_ms", "GPU idle before a prefill ms"),
            ("sched_prefill_host_bound", "prefills host-bound (share)"), ("sched_next_gpu_ms", "next batch GPU ms"),
            ("sched_first_decode_exposed", "first decodes exposed (share)"),
            ("sched_next_prefill_exposed", "next prefills exposed (share)"))


def format_sched_table(summary: dict[str, Any], cols: Sequence[tuple[str, str]] = SCHED_COLS,
                       pair: tuple[str, str] = ("stock", "patched")) -> str:
    """Markdown: the scheduler's part of TTFT per concurrency (``--timeline``), ``pair[0] ->
    pair[1]`` (stock -> patched unless told) medians over boots, ms; empty when no run has it.
    ``cols=API_COLS``: the parts outside the scheduler (empty when no run has the API server's
    events); ``cols=GPU_COLS``: the GPU side of prefill launches (empty when no run has GPU
    fields)."""
    stock, patched = (summary["variants"].get(v, {}) for v in pair)
    # A row needs a value of its own table: API_COLS repeats the client's TTFT and the
    # scheduler's total, which records without the API server's events have too.
    own = {k for k, _ in SCHED_COLS} if cols is SCHED_COLS else {k for k, _ in cols} - {k for k, _ in SCHED_COLS}
    probed = [k for k, _ in cols if k.startswith("sched_") and k in own]
    rows = []
    for c in sorted(set(stock) & set(patched)):
        if not any((stock[c].get(k) or patched[c].get(k)) for k in probed):
            continue
        cells = []
        for k, _ in cols:
            s, p = ((d.get(k) or {}).get("median") for d in (stock[c], patched[c]))
            cells.append("-" if s is None or p is None else f"{s:.2f} -> {p:.2f}")
        rows.append(f"| {c} | " + " | ".join(cells) + " |")
    if not rows:
        return ""
    head = "| conc | " + " | ".join(name for _, name in cols) + " |"
    return "\n".join([head, "|" + "---|" * (len(cols) + 1), *rows])


def worse_cells(summary: dict[str, Any], tolerance: float = 0.03) -> list[str]:
    """Cells where a latency is more than ``tolerance`` worse patched than stock."""
    out = []
    for c, row in sorted(summary["ratio"].items()):
        for k in LATENCY_KEYS:
            r = row.get(k)
            if r is not None and r < 1 / (1 + tolerance):
                out.append(f"conc {c} {k}: x{r:.3f}")
    return out


PLOT_KEYS = (("median_ttft_ms", "TTFT p50", "#d62728"), ("p99_ttft_ms", "TTFT p99", "#ff9896"),
             ("median_tpot_ms", "TPOT p50", "#1f77b4"), ("median_itl_ms", "ITL p50", "#2ca02c"),
             ("output_throughput", "out tok/s", "#7f7f7f"))


def plot_svg(summary: dict[str, Any], title: str) -> str:
    """An SVG line plot of how much better patched is (``summary['ratio']``) per concurrency, one
    line per metric of ``PLOT_KEYS``, with the parity line (x1.0) and the +3% latency bound. A
    record without patched plots the first other variant it has against stock (``MODES`` order);
    empty without stock."""
    other = next((v for v in MODES if v != "stock" and summary.get(ratio_key(v))), "patched")
    ratio = summary[ratio_key(other)]
    conc = sorted(ratio)
    vals = [r for c in conc for k, _, _ in PLOT_KEYS if (r := ratio[c].get(k)) is not None]
    if not conc or not vals:
        return ""
    lo, hi = min(0.7, min(vals)), max(1.4, max(vals))
    w, h, left, right, top, bottom = 640, 360, 56, 110, 28, 36
    x = lambda i: left + (w - left - right) * (i / max(1, len(conc) - 1))  # noqa: E731
    y = lambda v: top + (h - top - bottom) * (hi - v) / (hi - lo)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           'font-size="11">', f'<text x="{left}" y="16">{title} ({other} vs stock, above 1 = better)</text>']
    for v, dash in ((1.0, ""), (1 / 1.03, ' stroke-dasharray="4 3"')):
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="black"{dash}/>')
    for v in sorted({round(lo, 1), 1.0, round(hi, 1)}):
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">x{v:.1f}</text>')
    for i, c in enumerate(conc):
        out.append(f'<text x="{x(i):.1f}" y="{h - bottom + 16}" text-anchor="middle">{c}</text>')
    out.append(f'<text x="{(left + w - right) / 2:.0f}" y="{h - 4}" text-anchor="middle">max concurrency</text>')
    for n, (k, name, color) in enumerate(PLOT_KEYS):
        pts = [(x(i), y(r)) for i, c in enumerate(conc) if (r := ratio[c].get(k)) is not None]
        if not pts:
            continue
        out.append(f'<polyline data-metric="{k}" fill="none" stroke="{color}" stroke-width="2" points="'
                   + " ".join(f"{px:.1f},{py:.1f}" for px, py in pts) + '"/>')
        out.append(f'<text x="{w - right + 8}" y="{top + 14 * n + 10}" fill="{color}">{name}</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


# ----------------------------------------------------------------------------- GPU side


def stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except Exception:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except Exception:
            pass


def make_models(root: Path, model: str = "8b") -> tuple[str, str | None]:
    """The target and its draft directory: for ``8b`` the 8B-shaped target and its 1-layer draft
    (config.json + a word-level tokenizer each); for ``deepseek`` the factory's DeepSeek target,
    which brings its weights and tokenizer, and no draft directory (None)."""
    target, draft = model_factory.write_model_dirs(model, root)
    if draft is not None:
        vocab = model_factory.model_config(target)["vocab_size"]
        for d in (target, draft):
            model_factory.write_tokenizer(Path(d), vocab)
    return target, draft


class BenchClient:
    """One ``scripts/serve_bench_client.py`` process: ``bench_serving`` calls without paying
    its import for every cell. Its output goes to ``log``."""

    def __init__(self, env: dict[str, str], log: Path, argv: Sequence[str] | None = None) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "w")
        cmd = list(argv) if argv is not None else [sys.executable, str(HERE / "serve_bench_client.py")]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=env, text=True, start_new_session=True)

    def call(self, argv: Sequence[str], timeout: float) -> dict[str, Any]:
        """Run one ``bench_serving`` command line; its reply. TimeoutError past ``timeout`` s."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(list(argv)) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"rc": 1, "error": f"the bench client exited ({self.proc.poll()})"}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"bench_serving gave no reply in {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            return {"rc": 1, "error": f"the bench client exited ({self.proc.wait()})"}
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            stop_group(self.proc)
        self._log.close()


def variant_env(variant: str, base: dict[str, str]) -> dict[str, str]:
    """A variant's environment (server and bench client) from ``base``: the plugin's mode, the
    variant's own switches, and no other variant's switch (a ``patched`` server runs the plugin
    as it ships, whatever the caller's shell holds)."""
    mode, extra_env = MODES[variant]
    switches = {k for _, e in MODES.values() for k in e}
    env = {k: v for k, v in base.items() if k not in switches}
    env.update(SGLANG_FUTUREMAP_PATCH=mode, SGLANG_ENABLE_METRICS_DEVICE_TIMER="1", PYTHONUNBUFFERED="1", **extra_env)
    # bench_serving imports ``datasets`` at module level; the GPU box has none (offline datasets only).
    env["PYTHONPATH"] = os.pathsep.join([str(child_env.DATASETS_STAND_IN), env.get("PYTHONPATH", "")])
    return env


def run_server(variant: str, boot: int, target: str, draft: str | None, args: argparse.Namespace,
               deadline: float, port: int, gpu: str | None = None) -> dict[str, Any]:
    """One fresh server of ``variant`` and every ``--concurrency`` cell against it; with ``gpu``,
    the server sees that GPU only (``CUDA_VISIBLE_DEVICES``)."""
    tag = f"{variant}-boot{boot}"
    log_path = args.out / "logs" / f"{tag}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = variant_env(variant, dict(os.environ))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    server_base = upstream_env(env, args.upstream_site) if variant == "upstream" else env
    timeline_dir = args.out / "timeline" / tag if args.timeline else None
    argv = server_argv(target, draft, args.backend, port, args.server_arg, args.spec, args.model)
    run: dict[str, Any] = {"variant": variant, "boot": boot, "cells": {}, "error": None}
    if gpu is not None:
        run["gpu"] = gpu
    if variant == "upstream":
        run["sglang"] = child_env.site_sglang_version(args.upstream_site)
        if run["sglang"] is None:
            run["error"] = (f"upstream site {args.upstream_site} holds no SGLang "
                            "(bash scripts/gpu/stage_upstream.sh with .gpu-0513 sent along)")
            return run
    windows: dict[int, tuple[float, float]] = {}
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=server_env(server_base, timeline_dir),
                                start_new_session=True)
    # --pin-cpus: set right after the start, while the server is one thread that has started nothing.
    cpus = (getattr(args, "cpu_sets", None) or {}).get(gpu or "")
    pinned = pin_process(proc.pid, cpus)
    if cpus:
        run["cpus"] = pinned
    # bench_serving's client imports SGLang once, while the server boots (see serve_bench_client.py).
    # With the timeline, the client also samples its own event loop (serve_bench_client.py).
    client = BenchClient(dict(env, SERVE_BENCH_CLIENT_LAG="1") if args.timeline else env,
                         args.out / "logs" / f"{tag}-bench.log")
    pin_process(client.proc.pid, cpus)
    try:
        # /health_generate: ready once the model has generated, not just once the port is open.
        not_ready = launch.wait_until_ready(proc, f"http://127.0.0.1:{port}/health_generate", deadline, poll_s=2)
        if not_ready:
            run["error"] = f"server {not_ready}" + (" (--budget)" if proc.poll() is None else "")
            return run
        run["start_s"] = round(time.monotonic() - t0, 1)
        if cpus and getattr(args, "pin_scheduler", False):
            run["pin_scheduler"] = pin_scheduler_apart(proc.pid, client.proc.pid, cpus)
            if "error" in run["pin_scheduler"]:
                run["error"] = run["pin_scheduler"]["error"]
                return run
        log_text = log_path.read_text(errors="replace")
        applied = "sglang_futuremap_patch: applied" in log_text
        run["plugin_applied"] = applied
        run["server"] = server_config(log_text)
        if applied != (variant in PATCHED_VARIANTS):
            # A stock server that got patched, or a patched one that did not: no comparison.
            run["error"] = f"{variant} server: plugin {'applied' if applied else 'not applied'}"
            return run
        if getattr(args, "freeze_gc", False):
            run["freeze_gc"] = freeze_gc(port)
        for c in args.concurrency:
            if time.monotonic() > deadline:
                run["error"] = f"cut off by --budget before concurrency {c}"
                break
            out_file = args.out / "bench" / f"{tag}-c{c}.jsonl"
            out_file.parent.mkdir(parents=True, exist_ok=True)
            mark = log_path.stat().st_size
            prompts = num_prompts(c, args.rounds, args.min_prompts)
            t_cell = time.time()
            reply = client.call(bench_argv(target, port, c, prompts, out_file, args)[3:],
                                max(60.0, deadline - time.monotonic()))
            if reply.get("rc") != 0 or not out_file.exists():
                run["error"] = f"bench_serving failed at concurrency {c}: {reply.get('error')}"
                break
            with open(log_path, errors="replace") as f:
                f.seek(mark)
                window = f.read()
            result = json.loads(out_file.read_text().strip().splitlines()[-1])
            run["cells"][c] = cell_values(result, occupancy(window))
            lag = reply.get("client_lag")
            if lag:
                run["cells"][c].update(client_loop_lag_mean_ms=lag["mean_ms"], client_loop_lag_max_ms=lag["max_ms"])
            if reply.get("requests"):
                run["cells"][c]["client_requests"] = reply["requests"]
            windows[c] = (t_cell, time.time())
            print(f"   {tag} c={c}: TTFT p50 {result.get('median_ttft_ms'):.1f} ms, TPOT p50 "
                  f"{result.get('median_tpot_ms'):.2f} ms, {result.get('output_throughput'):.0f} tok/s", flush=True)
    except TimeoutError:
        run["error"] = "bench_serving cut off by --budget"
    finally:
        client.close()
        if timeline_dir is not None:
            time.sleep(2 * sched_timeline.FLUSH_S)  # the scheduler's last flush
        stop_group(proc)
    if timeline_dir is not None:
        add_sched_breakdown(run, timeline_dir, windows)
    return run


def freeze_gc(port: int) -> str:
    """SGLang's own ``/freeze_gc`` on the server at ``port`` (what its long-garbage-collection
    warning recommends after warm-up): its API server, scheduler and detokenizer move every
    object they hold now out of the collector's reach, so a later full collection has far less
    to scan. ``"ok"``, or why not."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/freeze_gc", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return "ok" if reply.status == 200 else f"HTTP {reply.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"failed: {exc}"


def upstream_env(env: dict[str, str], site: str) -> dict[str, str]:
    """The upstream server's environment: ``site`` first on ``PYTHONPATH`` and every other entry
    that holds an SGLang dropped (the stand-ins stay); the plugin's switch is off anyway."""
    return dict(env, PYTHONPATH=child_env.pythonpath_for_site(env.get("PYTHONPATH"), site))


def server_env(env: dict[str, str], timeline_dir: Path | None) -> dict[str, str]:
    """The server's environment: with ``timeline_dir``, the scheduler timeline probe
    (``scripts/gpu_probe/sched_timeline.py``) writes there."""
    if timeline_dir is None:
        return env
    return dict(env, PYTHONPATH=os.pathsep.join([str(child_env.PROBE_DIR), env.get("PYTHONPATH", "")]),
                SMOKE_PROBE_DIR=str(timeline_dir), SMOKE_SCHED_TIMELINE="1", SMOKE_PROBE_PLUGIN_LOG="0")


def add_sched_breakdown(run: dict[str, Any], timeline_dir: Path, windows: dict[int, tuple[float, float]]) -> None:
    """Each cell's scheduler-side TTFT split (``sched_timeline.ttft_breakdown``) into ``run``."""
    files = sorted(str(p) for p in timeline_dir.glob("timeline-*") if sched_timeline.is_timeline_file(p.name))
    if not files:
        run["timeline_error"] = "no timeline file (the probe did not load in the scheduler)"
        return
    events = sched_timeline.load_events(files)
    for c, (lo, hi) in windows.items():
        cell = run["cells"][c]
        cell["sched"] = sched_timeline.ttft_breakdown(events, lo, hi)
        if cell.get("client_requests"):
            cell["sched"].update(client_split(cell["client_requests"], events, lo, hi, cell.get("completed")))


def client_api_pairs(requests: Sequence[Sequence[float | None]], events: Sequence[dict[str, Any]], lo: float,
                     hi: float, measured: int | None) -> list[tuple[Sequence[float], dict[str, Any]]] | None:
    """The measured requests of a cell, each as ``(client [start, ttft], API server api event)``.

    ``requests`` are the client's ``[start, ttft]`` stamps (``serve_bench_client``, warm-up first),
    the API server's ``api`` events in ``[lo, hi)`` its own stamps of the same requests (same host,
    same ``time.time()`` clock). The last ``measured`` calls and the first ``measured`` receipts
    from 1 ms before the first of those calls on are paired in order (``bench_serving`` sends them
    through one HTTP server, which takes them in as they come; its warm-up is over before they
    start, and a window that reaches into the next cell holds that cell's first receipts after
    them). None when the counts do not match or a receipt comes before its call by more than 1 ms
    (then the order did not hold)."""
    sent = sorted((r for r in requests if r[1] is not None), key=lambda r: r[0])
    n = measured or 0
    if n <= 0 or len(sent) < n:
        return None
    since = sent[-n][0] - 1e-3
    api = sorted((e for e in events if e["kind"] == "api" and e.get("first") is not None
                  and max(lo, since) <= e["received"] < hi), key=lambda e: e["received"])
    if len(api) < n:
        return None
    pairs = list(zip(sent[-n:], api[:n]))
    if min(a["received"] - start for (start, _), a in pairs) < -1e-3:
        return None
    return pairs


def client_split(requests: Sequence[Sequence[float | None]], events: Sequence[dict[str, Any]], lo: float, hi: float,
                 measured: int | None) -> dict[str, Any]:
    """The client's TTFT outside the API server, per measured request of a cell
    (``client_api_pairs``): the client's call -> the API server's receipt (``client_to_api_ms``:
    HTTP intake) and the API server's first output -> the client's first chunk
    (``api_to_client_ms``: streaming out), medians in ms. None for both when the requests cannot
    be paired or a first chunk comes before its first output by more than 1 ms."""
    none = {"client_to_api_ms": None, "api_to_client_ms": None, "client_pairs": 0}
    pairs = client_api_pairs(requests, events, lo, hi, measured)
    if pairs is None:
        return none
    intake = [a["received"] - start for (start, _), a in pairs]
    out = [start + ttft - a["first"] for (start, ttft), a in pairs]
    if min(out) < -1e-3:
        return none
    return {"client_to_api_ms": round(statistics.median(intake) * 1e3, 2),
            "api_to_client_ms": round(statistics.median(out) * 1e3, 2), "client_pairs": len(pairs)}


def environment(args: argparse.Namespace) -> dict[str, Any]:
    try:
        import sglang

        version = sglang.__version__
    except Exception as exc:  # informative only
        version = f"unknown ({type(exc).__name__})"
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "gpu": child_env.gpu_name(), "sglang": version,
            # The host's CPUs by physical core: the timeline's ``core`` of each launch is read
            # against it (serve_prefill_batches.py --host-states).
            "cpu_cores": physical_cores(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None,
            "command": "python3 scripts/gpu_serve_bench.py " + " ".join(
                a if not str(a).startswith(str(args.out)) else "OUT" for a in sys.argv[1:]),
            "config": {"model": f"{MODELS[args.model].description}, " + "/".join(map(str, SPECS[args.spec])),
                       "model_name": args.model, "spec": args.spec,
                       "backend": args.backend, "server_args": [*DEFAULT_SERVER_ARGS, *args.server_arg], "dataset": args.dataset,
                       "input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio,
                       "rounds": args.rounds,
                       "min_prompts": args.min_prompts, "concurrency": args.concurrency, "boots": args.boots,
                       "warmup": args.warmup, "freeze_gc": bool(getattr(args, "freeze_gc", False)),
                       # The timeline probe's stack sampling and function timers, where the caller
                       # set them (sched_timeline).
                       "probe_env": {k: os.environ[k] for k in PROBE_ENV if os.environ.get(k)}}}


def card_counts(runs: Sequence[dict[str, Any]]) -> str:
    """One line: how many runs of each variant had each GPU (``--gpus`` records), and a note when
    the sides did not get every card equally often (an odd boot count gives one side a card
    twice: host-bound launches then follow the card, see h100x2-2026-11-26); "" without GPUs."""
    counts: dict[str, dict[str, int]] = {}
    for run in runs:
        if run.get("gpu") is not None:
            by_gpu = counts.setdefault(run["variant"], {})
            by_gpu[str(run["gpu"])] = by_gpu.get(str(run["gpu"]), 0) + 1
    if not counts:
        return ""
    gpus = sorted({g for by_gpu in counts.values() for g in by_gpu})
    parts = [f"{v}: " + ", ".join(f"GPU {g} x{counts[v].get(g, 0)}" for g in gpus)
             for v in [m for m in MODES if m in counts]]
    even = all(len({by_gpu.get(g, 0) for g in gpus}) == 1 for by_gpu in counts.values())
    return ("Cards (server runs per variant): " + "; ".join(parts)
            + ("" if even else " (not the same number of runs on every card: compare with care)"))


def paired_runs(docs: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each record's runs with only the cells that every variant of that record has in the same
    boot, and one ``variant boot N conc C`` per cell left out. A boot cut off by ``--budget``
    can leave one side a cell the other never ran (h200x2-tf-2026-11-26: stock's concurrency 1
    of a boot whose patched server was cut before it); a median over boots would count it for
    one side only. Runs left without cells are dropped; each kept run names its record's place
    in ``docs`` (``record``: the same boot number in two records is two boots)."""
    kept: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, doc in enumerate(docs):
        runs = [r for r in doc["runs"] if not r.get("error") or r["cells"]]
        variants = {r["variant"] for r in runs}
        by_boot: dict[Any, dict[str, set[str]]] = {}
        for r in runs:
            by_boot.setdefault(r.get("boot"), {}).setdefault(r["variant"], set()).update(r["cells"])
        for r in runs:
            sides = by_boot[r.get("boot")]
            common = set.intersection(*(sides.get(v, set()) for v in variants))
            dropped += [f"{r['variant']} boot {r.get('boot')} conc {c}"
                        for c in sorted(r["cells"], key=int) if c not in common]
            cells = {c: cell for c, cell in r["cells"].items() if c in common}
            if cells:
                kept.append({**r, "cells": cells, "record": i})
    return kept, dropped


# What may differ between records joined into one run (--join): how many boots and which cells
# each call ran; everything the servers and the client ran with must be the same.
JOIN_FREE_CONFIG = frozenset({"boots", "concurrency"})


def join_records(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """These records as one: runs of one machine in consecutive calls, where a later call
    finishes a boot that an earlier call's ``--budget`` cut off (h100-triton-2026-12-07: stock's
    boot 1 started after the patched one in the next call, the machine still warm), so that the
    boot's servers pair as they would within one call. A ``ValueError`` where the records differ
    in date, GPU, SGLang or configuration (but for ``JOIN_FREE_CONFIG``) or where two of them
    hold cells of the same variant and boot. A run cut off before any cell is dropped."""
    first = docs[0]["environment"]
    for doc in docs[1:]:
        env = doc["environment"]
        for key in ("date", "gpu", "sglang"):
            if env.get(key) != first.get(key):
                raise ValueError(f"--join: the records differ in {key} ({first.get(key)} / {env.get(key)}); "
                                 "join only calls of one machine, one after another")
        ours, theirs = first.get("config", {}), env.get("config", {})
        differ = sorted(k for k in (set(ours) | set(theirs)) - JOIN_FREE_CONFIG if ours.get(k) != theirs.get(k))
        if differ:
            raise ValueError(f"--join: the records differ in {', '.join(differ)}; join only runs of one configuration")
    runs: list[dict[str, Any]] = []
    seen: set[tuple[str, Any]] = set()
    for doc in docs:
        for run in doc["runs"]:
            if not run.get("cells"):
                continue
            key = (run["variant"], run.get("boot"))
            if key in seen:
                raise ValueError(f"--join: {run['variant']} boot {run.get('boot')} has cells in two records; "
                                 "--join is for a boot that a later call finished")
            seen.add(key)
            runs.append(run)
    commands = [d["environment"].get("command", "") for d in docs]
    return {**docs[0], "environment": {**first, "command": " ; ".join(c for c in commands if c)}, "runs": runs}


def merge(paths: Sequence[Path], plot: Path | None = None, logs: Sequence[Path] = (),
          only: Sequence[int] | None = None, join: bool = False) -> str:
    """The Markdown summary of these records (median over all their boots); with ``plot``, also
    an SVG of the patched / stock ratios there; with ``logs`` (each record's
    ``serve-logs.tar.gz``, in order), outputs compared from the ``bench_serving`` files there
    where a record has no digests (records before 2026-11-26); with ``only``, the cells of those
    concurrencies alone (records that pool well at some concurrencies and not at others: two
    builds that differ where only some cells reach); with ``join``, the records as one run
    (``join_records``: a boot's servers pair across them)."""
    docs = [json.loads(p.read_text()) for p in paths]
    if logs and len(logs) != len(docs):
        raise ValueError(f"--logs: {len(logs)} archive(s) for {len(docs)} record(s); give one per record, in order")
    for doc, tar_path in zip(docs, logs):
        digests_from_logs(doc, tar_path)
        servers_from_logs(doc, tar_path)
    models = sorted({record_model(d) for d in docs})
    if len(models) > 1:
        raise ValueError(f"these records ran different models ({', '.join(models)}): merge each model's apart")
    joined = len(docs) if join else 0
    if join:
        docs = [join_records(docs)]
    if only is not None:
        # Before pairing, so that a cell left out is neither summarised nor listed as unpaired.
        keep = {str(c) for c in only}
        for doc in docs:
            for r in doc["runs"]:
                r["cells"] = {c: v for c, v in r["cells"].items() if c in keep}
    runs, unpaired = paired_runs(docs)
    if only is not None and not runs:
        raise ValueError(f"no cell at concurrency {', '.join(str(c) for c in only)} in these records")
    summary = summarize(runs)
    env = docs[0]["environment"]
    worse = worse_cells(summary)
    lines = [f"Serving benchmark, {env['date']}, {env['gpu']}, SGLang {env['sglang']}, backend "
             f"{env['config']['backend']} {' '.join(env['config']['server_args'])}".rstrip()
             + f", dataset {env['config'].get('dataset', 'random-ids')}"
             + (f", model {env['config']['model_name']}" if "model_name" in env["config"] else "")
             + (f", {env['config']['model'].split('; ')[-1]}" if "model" in env["config"] else "")
             + (f"; a boot's variants ran at the same time on GPUs {','.join(env['config']['gpus'])}, "
                "the GPU of each side alternating with the boot" if env["config"].get("gpus") else "")
             + ("; SGLang's /freeze_gc called once each server was ready" if env["config"].get("freeze_gc") else "")
             + ("; timeline probe " + ", ".join(f"{k}={v}" for k, v in env["config"]["probe_env"].items())
                + " (more probe work on the scheduler thread, both sides alike: compare timings within this record)"
                if env["config"].get("probe_env") else "")
             + ("; each server and its bench client pinned to its own physical cores (--pin-cpus: "
                + ", ".join(f"{('GPU ' + s) if s else 'servers'} {c}" for s, c in env["config"]["pin_cpus"].items())
                + ")" if env["config"].get("pin_cpus") else "")
             + ("; each scheduler process on a physical core of its own, the rest of the server and its client "
                "on the others (--pin-scheduler)" if env["config"].get("pin_scheduler") else ""),
             "",
             *record_differences(docs),
             f"{len(runs)} server runs from {len(docs)} record(s); cells: stock -> patched, median over boots "
             "(x: how much better patched is; > 1 is better)"
             + (f"; only the cells at concurrency {', '.join(str(c) for c in only)} (--concurrency)"
                if only is not None else "")
             + (f"; {joined} records joined as one run (--join: a boot's servers pair across them)"
                if joined else "") + ".", "", format_table(summary), "",
             "Latency cells more than 3% worse patched: " + ("; ".join(worse) if worse else "none")]
    if unpaired:
        lines += ["", f"Left out, no partner in the same boot (a boot cut off by --budget): {'; '.join(unpaired)}"]
    cards = card_counts(runs)
    if cards:
        lines += ["", cards]
    servers = server_lines(runs)
    if servers:
        lines += ["", servers]
    if summary.get(ratio_key("upstream")):
        ups = sorted({r.get("sglang") for r in runs if r["variant"] == "upstream"} - {None})
        lines += ["", f"Stock -> upstream (stock SGLang {', '.join(ups) or '?'}, its own site, no plugin; "
                  "x: how much better upstream is):", "", format_table(summary, "upstream")]
    for other, note in MODE_NOTES.items():
        if summary.get(ratio_key(other)):
            lines += ["", f"Stock -> {other} ({note}):", "", format_table(summary, other)]
    for other in [v for v in MODES if v != "stock"]:
        pooled = format_pooled_table(pooled_ttft(runs, other), other)
        if pooled:
            lines += ["", f"TTFT over every request of every boot, stock -> {other} (x: how much better "
                      f"{other} is; [90% bootstrap interval over requests, which leaves out the scatter "
                      "between boots: the boot pairs below count it]):", "", pooled]
        paired = format_pair_table(boot_pair_ratios(runs, other))
        if paired:
            lines += ["", f"Boot pairs, stock -> {other} (a boot's two servers ran {pair_placement(docs)}; x: the geometric "
                      "mean of the pairs' ratios, [95% interval over pairs, which counts the scatter between "
                      "boots]; +-3%: the pairs an interval of +-3% would need at this scatter):", "", paired]
    same = format_same_outputs(same_outputs(runs))
    if same:
        lines += ["", "Outputs: requests whose generated text equals stock's in the same boot, over every "
                  "boot (same prompts on both sides):", "", same]
    if plot is not None:
        plot.write_text(plot_svg(summary, f"{env['gpu']}, backend {env['config']['backend']}"))
    for pair in sched_pairs(summary):
        # stock -> patched keeps the headings of the records before; any other pair names itself.
        of = "" if pair == ("stock", "patched") else f", {pair[0]} -> {pair[1]}"
        sched = format_sched_table(summary, SCHED_COLS, pair)
        if sched:
            lines += ["", f"Inside the scheduler{of} (`--timeline`; ms, median over requests, then over boots; a "
                      "prefill's first tokens leave at the end of its result processing):", "", sched]
        outside = format_sched_table(summary, API_COLS, pair)
        if outside:
            lines += ["", f"Outside the scheduler{of} (`--timeline`, the API server's own timestamps of each "
                      "request; ms, median over requests, then over boots):", "", outside]
        gpu = format_sched_table(summary, GPU_COLS, pair)
        if gpu:
            lines += ["", f"The GPU side of prefill launches{of} (`--timeline` on CUDA: CUDA events on the forward "
                      "stream; median or share over launches, then median over boots):", "", gpu]
    return "\n".join(lines) + "\n"


def sched_pairs(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The pairs of variants the ``--timeline`` tables compare: stock against every other variant
    the summary has, in ``MODES`` order; without stock, patched against every other one (a record
    of the plugin against one of its switches)."""
    have = [v for v in MODES if summary["variants"].get(v)]
    base = "stock" if "stock" in have else "patched" if "patched" in have else None
    return [(base, v) for v in have if base is not None and v != base]


#: What the summary's first line says of a record (``environment`` keys; ``config.`` ones inside
#: its config), in that line's words, for ``record_differences``.
HEADER_FIELDS = (("date", "date"), ("gpu", "GPU"), ("sglang", "SGLang"), ("config.backend", "backend"),
                 ("config.server_args", "server arguments"), ("config.dataset", "dataset"),
                 ("config.gpus", "GPUs"), ("config.freeze_gc", "--freeze-gc"), ("config.probe_env", "probe settings"),
                 ("config.pin_cpus", "--pin-cpus"), ("config.pin_scheduler", "--pin-scheduler"))


def record_differences(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Where the merged records differ in what the summary's first line says (that line is the
    first record's): one sentence and a blank line, or nothing when they agree (or one record)."""
    def value(doc: dict[str, Any], key: str) -> str:
        node: Any = doc["environment"]
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key == "config.pin_cpus":  # as the first line writes it
            return ", ".join(f"{('GPU ' + k) if k else 'servers'} {v}" for k, v in node.items()) or "-"
        if isinstance(node, dict):
            return ", ".join(f"{k} {v}" for k, v in node.items()) or "-"
        if isinstance(node, list):
            return " ".join(map(str, node)) or "-"
        return "-" if node in (None, False, "") else str(node)

    parts = []
    for key, name in HEADER_FIELDS:
        seen = list(dict.fromkeys(value(d, key) for d in docs))
        if len(seen) > 1:
            parts.append(f"{name} {' / '.join(seen)}")
    if not parts:
        return []
    return [f"The records differ in (the line above is the first record's): {'; '.join(parts)}.", ""]


def record_model(doc: dict[str, Any]) -> str:
    """The ``--model`` a record ran (records from before ``--model``: ``8b``)."""
    return doc["environment"]["config"].get("model_name", "8b")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", type=Path, help="folder for serve-bench.json, serve-bench.md, logs/ and bench/")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="default")
    p.add_argument("--model", choices=sorted(MODELS), default="8b",
                   help="8b: 8B-shaped Llama, dummy weights, 1-layer STANDALONE draft (default); deepseek: the tiny "
                        "DeepSeek-V3 (MLA) with seeded weights, --speculative-algorithm NEXTN and no draft path")
    p.add_argument("--spec", choices=sorted(SPECS), default="chain",
                   help="draft shape: chain 3/1/4 (default) or tree 5/4/8 (steps/topk/draft tokens; "
                        "with --backend fa3 or triton stock runs the tree on spec v1, the plugin on spec v2; with "
                        "no backend named SGLang picks FlashInfer for it on Hopper, spec v1 on both sides)")
    p.add_argument("--variants", default="stock,patched",
                   help="comma-separated from " + ", ".join(MODES) + " (upstream: stock SGLang of --upstream-site; "
                        "patched-mla-mirror: the plugin with SGLANG_FUTUREMAP_FA3_MLA=0, for --model deepseek)")
    p.add_argument("--upstream-site", default=child_env.upstream_site(None),
                   help="site folder of the upstream variant (default: where .gpu-0513/activate.sh unpacks)")
    p.add_argument("--boots", type=int, default=3, help="fresh servers per variant")
    p.add_argument("--concurrency", type=parse_int_list, default=None,
                   help="the cells to run (default 1,4,8,13,16,32,45,48); with --merge, the cells to summarise "
                        "(default: every cell of the records)")
    p.add_argument("--dataset", choices=("random-ids", "generated-shared-prefix"), default="random-ids")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--range-ratio", type=float, default=1.0,
                   help="random-ids: bench_serving's --random-range-ratio (1.0: every request exactly --input-len / "
                        "--output-len, so requests that start together finish together and share their next "
                        "prefill; below 1, lengths drawn from [ratio x len, len])")
    p.add_argument("--rounds", type=int, default=4, help="requests per cell = rounds x concurrency ...")
    p.add_argument("--min-prompts", type=int, default=12, help="... but at least this many")
    p.add_argument("--warmup", choices=("wave", "one"), default="wave",
                   help="bench_serving's warm-up per cell: a wave of <concurrency> requests (default) or "
                        "one request (its own default; the records before 2026-11-24)")
    p.add_argument("--server-arg", action="append", default=[], help="one more launch_server flag (repeatable)")
    p.add_argument("--first-boot", type=int, default=0, help="index of the first boot (to alternate across calls)")
    p.add_argument("--gpus", type=int, default=1,
                   help="run a boot's variants at the same time, one per GPU (2: stock and patched side by side "
                        "on a two-GPU machine; the GPU each side gets alternates with the boot); default 1: one "
                        "server after another")
    p.add_argument("--pin-cpus", action="store_true",
                   help="give each server (and its bench client) its own equal set of whole physical cores, near "
                        "its GPU first (sched_setaffinity): side-by-side servers never share a core and the "
                        "scheduler cannot land on a busy or far one; off: placed by the kernel, as users run")
    p.add_argument("--pin-scheduler", action="store_true",
                   help="with --pin-cpus: once each server is ready, its scheduler process gets the first physical "
                        "core of the server's set alone (both hyperthreads), and the API server, detokenizer and "
                        "bench client the rest: nothing else on the scheduler thread's core or its SMT sibling "
                        "(both sides alike)")
    p.add_argument("--budget", type=float, default=540, help="seconds for the whole run; a cut-off is recorded")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=31200)
    p.add_argument("--freeze-gc", action="store_true",
                   help="once each server is ready, call SGLang's /freeze_gc (both sides alike): full garbage "
                        "collections in its processes then scan only what came after (the 330-455 ms API-server "
                        "stall of results/serve-bench/h200x2-final); off: the server as users start it")
    p.add_argument("--timeline", action="store_true",
                   help="record the scheduler timeline (scripts/gpu_probe/sched_timeline.py) and split each "
                        "cell's TTFT inside the scheduler (cells' 'sched'; on CUDA also the GPU side of prefill "
                        "launches, from CUDA events); both sides alike")
    p.add_argument("--merge", nargs="+", type=Path, help="print the summary of these records instead")
    p.add_argument("--plot", type=Path, help="with --merge: also write an SVG of the ratios there")
    p.add_argument("--join", action="store_true",
                   help="with --merge: the records are one run of one machine in consecutive calls (a later call "
                        "finishing a boot that --budget cut off): pair a boot's servers across them; the records "
                        "must agree in date, GPU, SGLang and configuration but for boots and concurrencies")
    p.add_argument("--logs", nargs="+", type=Path, default=[],
                   help="with --merge: each record's serve-logs.tar.gz, in the same order, to compare the "
                        "outputs of records that kept no digests (from the bench_serving files there) and to say "
                        "what the servers ran in records that did not keep it (from the server logs there)")
    args = p.parse_args(argv)
    if args.logs and not args.merge:
        p.error("--logs goes with --merge")
    if args.join and len(args.merge or ()) < 2:
        p.error("--join goes with --merge and two records or more")
    if args.merge:
        missing = [str(m) for m in args.merge if not m.is_file()]
        if missing:
            print(f"error: no such record: {', '.join(missing)}", file=sys.stderr)
            return 2
        try:
            sys.stdout.write(merge(args.merge, args.plot, args.logs, args.concurrency, args.join))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.out is None:
        p.error("--out is required (or --merge)")
    if args.concurrency is None:
        args.concurrency = parse_int_list("1,4,8,13,16,32,45,48")
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in MODES]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {sorted(set(MODES) - set(RETIRED_MODES))}")
    retired = [v for v in variants if v in RETIRED_MODES]
    if retired:
        p.error(f"variant {retired[0]} is retired: {RETIRED_MODES[retired[0]]}")
    if args.pin_scheduler and not args.pin_cpus:
        p.error("--pin-scheduler goes with --pin-cpus (it splits each server's own CPU set)")
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    target, draft = make_models(args.out / "models", args.model)
    doc = {"environment": environment(args), "runs": []}
    record = args.out / "serve-bench.json"
    gpus = child_env.visible_gpus(args.gpus) if args.gpus > 1 else []
    if args.gpus > 1 and len(gpus) < args.gpus:
        print(f"error: --gpus {args.gpus} but only {len(gpus)} GPU(s) visible ({','.join(gpus)})", file=sys.stderr)
        return 2
    doc["environment"]["config"]["gpus"] = gpus or None
    if args.pin_cpus:
        try:
            args.cpu_sets = plan_cpus(gpus)
        except ValueError as exc:
            print(f"error: --pin-cpus: {exc}", file=sys.stderr)
            return 2
        doc["environment"]["config"]["pin_cpus"] = {s: format_cpulist(c) for s, c in args.cpu_sets.items()}
        doc["environment"]["config"]["pin_scheduler"] = bool(args.pin_scheduler)
        print("CPUs: " + "; ".join(f"{('GPU ' + s) if s else 'servers'} {format_cpulist(c)}"
                                   for s, c in args.cpu_sets.items()), flush=True)
    for boot in range(args.first_boot, args.first_boot + args.boots):
        for wave in placements(variants, boot, gpus):
            for variant, gpu, _ in wave:
                print(f"== {variant}, boot {boot}" + (f", GPU {gpu}" if gpu is not None else ""), flush=True)
            with ThreadPoolExecutor(max_workers=len(wave)) as pool:
                futures = [pool.submit(run_server, variant, boot, target, draft, args, deadline,
                                       args.port + 10 * boot + offset, gpu) for variant, gpu, offset in wave]
                wave_runs = [f.result() for f in futures]
            for run in wave_runs:
                doc["runs"].append(run)
                if run["error"]:
                    print(f"   {run['variant']} boot {boot}: {run['error']}", flush=True)
            record.write_text(json.dumps(doc, indent=1) + "\n")
    summary = summarize([r for r in doc["runs"] if r["cells"]])
    doc["summary"] = summary
    record.write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "serve-bench.md").write_text(merge([record], args.out / "serve-bench.svg"))
    print(format_table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
