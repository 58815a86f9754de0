#!/usr/bin/env python3
"""Which logical CPUs share a physical core, measured rather than read from sysfs.

A virtual machine's sysfs can report every vCPU as a core of its own (``Thread(s) per core:
1``) while the hypervisor runs vCPUs on the hyperthreads of shared host cores. Then two
servers pinned to "their own" CPUs (``gpu_serve_bench.py --pin-cpus``) can still share host
cores, and a host-bound launch on one of them reads the other's load. This probe times a fixed
piece of pure-Python work (the serving probe's ``core_us`` work) on each CPU while one spinning
process holds each other CPU in turn, and compares it with the work with nothing spinning. A
sibling hyperthread reads far slower (x1.5-x2); any other CPU about x1.0. Run it two or three
times: a fixed pairing reads the same pairs every time; vCPUs that the hypervisor moves between
host threads read different ones (and pairs that are slow one way only).

    python3 scripts/gpu/cpu_siblings_probe.py --out cpu-siblings.json
    python3 scripts/gpu/cpu_siblings_probe.py --summarize run-1.json run-2.json   # stored runs, side by side

Prints each CPU's slowest partner and the CPUs grouped by measured physical core; the JSON holds
``cores`` (null when the reading is not a fixed pairing), ``problems``, every ratio and sysfs's
own view. Exit 0 on a fixed pairing; 1 when the reading is not one (a ratio between --clear and
--threshold, or a pair slow one way only); 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_harness import child_env  # noqa: E402

#: The serving probe's fixed piece of work (``SMOKE_CORE_SPEED``'s ``core_us``): the same
#: reading that the serving records carry around each prefill launch.
sched_timeline = child_env.probe_module("sched_timeline")
work_us = sched_timeline.core_us
#: A spinner on a sibling hyperthread slows the work by at least this much.
THRESHOLD = 1.15
#: Ratios at or below this are clearly not a sibling; between the two is ambiguous.
CLEAR = 1.08


def reading(samples: int) -> float:
    """The median of ``samples`` readings of ``work_us`` on the calling thread's CPU."""
    for _ in range(5):
        work_us()
    return statistics.median(work_us() for _ in range(samples))


def spin(on: Any) -> None:
    """Spin while ``on`` is set (the parent moves this process between CPUs); idle otherwise."""
    x = 0
    while True:
        if on.value:
            for i in range(5000):
                x = (x + i) & 0xFFFF
        else:
            time.sleep(0.001)


def group_cores(cpus: Sequence[int], ratio: dict[int, dict[int, float]],
                threshold: float = THRESHOLD, clear: float = CLEAR) -> tuple[list[list[int]] | None, list[str]]:
    """Physical cores from measured ratios (``ratio[c][o]``: the work on ``c`` with a spinner on
    ``o``, over the work with none). ``c`` and ``o`` are siblings when both directions read above
    ``threshold``; returns the cores (CPUs grouped, each group sorted, groups in the order of their
    first CPU) and no problems, or None and what makes the reading something other than a fixed
    pairing: a ratio between ``clear`` and ``threshold``, or a pair above ``threshold`` one way
    only."""
    problems: list[str] = []
    parent = {c: c for c in cpus}

    def root(c: int) -> int:
        while parent[c] != c:
            c = parent[c]
        return c

    for c in cpus:
        for o in cpus:
            if o <= c:
                continue
            a, b = ratio[c][o], ratio[o][c]
            for x, (p, q) in ((a, (c, o)), (b, (o, c))):
                if clear < x <= threshold:
                    problems.append(f"CPU {p} with a spinner on CPU {q} reads x{x:.3f}, between x{clear} and x{threshold}")
            if (a > threshold) != (b > threshold):
                problems.append(f"CPUs {c} and {o} read x{a:.3f} / x{b:.3f}: a sibling one way only")
            elif a > threshold:
                parent[root(o)] = root(c)
    if problems:
        return None, problems
    groups: dict[int, list[int]] = {}
    for c in cpus:
        groups.setdefault(root(c), []).append(c)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0]), []


def measure_all(cpus: Sequence[int], samples: int) -> tuple[dict[int, float], dict[int, dict[int, float]]]:
    """Each CPU's work time alone (``base``) and its ratio with the spinner on every other CPU."""
    on = mp.Value("b", 0)
    proc = mp.Process(target=spin, args=(on,), daemon=True)
    proc.start()
    base: dict[int, float] = {}
    ratio: dict[int, dict[int, float]] = {}
    allowed = os.sched_getaffinity(0)
    try:
        for c in cpus:
            os.sched_setaffinity(0, {c})
            on.value = 0
            time.sleep(0.005)
            base[c] = reading(samples)
            ratio[c] = {}
            for o in cpus:
                if o == c:
                    continue
                os.sched_setaffinity(proc.pid, {o})
                on.value = 1
                time.sleep(0.005)
                ratio[c][o] = round(reading(samples) / base[c], 3)
                on.value = 0
    finally:
        proc.kill()
        proc.join(5)
        os.sched_setaffinity(0, allowed)
    return base, ratio


def summarize(docs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Markdown: per stored run (name, the probe's JSON) the work alone (median and range over
    the CPUs), how many ordered pairs read slower than the run's threshold and than x1.5, how
    many of those pairs were slow both ways and one way only, and the largest ratio; then how
    many slowed pairs each two runs share (a fixed pairing shares them all)."""
    slowed: dict[str, set[tuple[str, str]]] = {}
    out = ["| run | work alone, us: median (min - max over CPUs) | pairs slowed > threshold | of them > x1.5 | "
           "slowed both ways (pairs) | slowed one way only | largest |", "|---|---|---|---|---|---|---|"]
    for name, doc in docs:
        ratios = [(c, o, v) for c, row in doc["ratio"].items() for o, v in row.items()]
        slow = {(c, o) for c, o, v in ratios if v > doc["threshold"]}
        slowed[name] = slow
        both = {frozenset(p) for p in slow if (p[1], p[0]) in slow}
        base = list(doc["base_us"].values())
        out.append(f"| {name} | {statistics.median(base):.1f} ({min(base):.1f} - {max(base):.1f}) | {len(slow)} | "
                   f"{sum(v > 1.5 for _, _, v in ratios)} | {len(both)} | "
                   f"{sum((o, c) not in slow for c, o in slow)} | x{max(v for _, _, v in ratios):.3f} |")
    names = [name for name, _ in docs]
    shared = [f"{a} / {b}: {len(slowed[a] & slowed[b])}" for i, a in enumerate(names) for b in names[i + 1:]]
    if shared:
        out += ["", "Slowed pairs two runs share: " + ", ".join(shared) + "."]
    return "\n".join(out)


def sysfs_view(cpus: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            out[str(c)] = {"core_id": (topo / "core_id").read_text().strip(),
                           "thread_siblings_list": (topo / "thread_siblings_list").read_text().strip()}
        except OSError:
            out[str(c)] = None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--samples", type=int, default=60, help="readings per measurement, median taken (default 60)")
    p.add_argument("--threshold", type=float, default=THRESHOLD,
                   help=f"a sibling slows the work by more than this (default {THRESHOLD})")
    p.add_argument("--clear", type=float, default=CLEAR,
                   help=f"not a sibling at or below this; between the two is ambiguous (default {CLEAR})")
    p.add_argument("--out", type=Path, help="write the JSON here")
    p.add_argument("--summarize", nargs="+", type=Path, metavar="JSON",
                   help="instead of measuring: a Markdown table of these stored runs (their --out files)")
    args = p.parse_args(argv)
    if args.summarize:
        try:
            docs = [(path.stem, json.loads(path.read_text())) for path in args.summarize]
            print(summarize(docs))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            print(f"error: --summarize: not a probe run: {exc}", file=sys.stderr)
            return 2
        return 0
    if not hasattr(os, "sched_setaffinity"):
        print("error: needs Linux (os.sched_setaffinity)", file=sys.stderr)
        return 2
    if args.samples < 1:
        print("error: --samples must be at least 1", file=sys.stderr)
        return 2
    if not 1.0 <= args.clear < args.threshold:
        print("error: needs 1 <= --clear < --threshold", file=sys.stderr)
        return 2
    if args.out and not args.out.parent.is_dir():  # before the measurement, not after it
        print(f"error: cannot write {args.out}: no such directory", file=sys.stderr)
        return 2
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("error: one CPU available: nothing to compare", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    base, ratio = measure_all(cpus, args.samples)
    cores, problems = group_cores(cpus, ratio, args.threshold, args.clear)
    doc = {"cpus": cpus, "samples": args.samples, "loops": sched_timeline.CORE_SPEED_LOOPS, "threshold": args.threshold, "clear": args.clear,
           "cores": cores, "problems": problems, "base_us": {str(c): round(v, 2) for c, v in base.items()},
           "ratio": {str(c): {str(o): v for o, v in r.items()} for c, r in ratio.items()},
           "sysfs": sysfs_view(cpus), "seconds": round(time.monotonic() - t0, 1)}
    if args.out:
        try:
            args.out.write_text(json.dumps(doc, indent=1))
        except OSError as exc:
            print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    top = {c: max(r.items(), key=lambda kv: kv[1]) for c, r in ratio.items()}
    print("slowest partner per CPU: " + ", ".join(f"{c}:{o} x{v}" for c, (o, v) in top.items()))
    if cores is None:
        print(f"not a fixed pairing ({len(problems)} readings): " + "; ".join(problems[:5])
              + (" ..." if len(problems) > 5 else ""))
        return 1
    shared = [g for g in cores if len(g) > 1]
    print(f"{len(cpus)} CPUs, {len(cores)} physical cores measured"
          + (": " + " ".join(",".join(map(str, g)) for g in shared) if shared else " (no CPU shares its core)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
