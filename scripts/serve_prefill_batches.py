#!/usr/bin/env python3
"""How many requests shared each request's prefill, per boot and cell of a serving record, beside
its TTFT: ``python3 scripts/serve_prefill_batches.py RECORD.json LOGS.tar.gz [RECORD LOGS ...]``.

In a closed-loop cell (``--max-concurrency``, fixed 256 / 256 lengths) requests that start
together finish together and come back together, so they share a prefill. A request's TTFT then
depends mostly on how large that shared prefill is, and that size is set by the loop's history
(the warm-up wave, how earlier clumps were split), not by one scheduler iteration. This reads
the scheduler timelines a ``--timeline`` run left in its logs (``timeline/<variant>-boot<n>/``),
takes each cell's requests in arrival order (the last ``sum(warm-up + requests)`` received: the
server's own health checks come first) and prints, per boot and cell, the request-weighted mean
prefill batch size (warm-up wave left out) beside the cell's TTFT p50; then, per concurrency, the
cells of both sides sorted by that size, and per concurrency a straight-line fit of TTFT p50 on
that size over every cell with each variant's mean residual: at equal shared prefills, is one
side slower? Records made before ``prefill_bs_mean`` was part of
``ttft_breakdown`` get it from here.

``--stalls`` prints instead, per concurrency, the API server's event-loop stalls (a ``lag``
window of the probe whose longest late wake-up is ``STALL_MS`` or more: one such pause stops
every request's intake and streaming at once) and which cell each fell in, and the API
server's own TTFT (SGLang's timestamps: received -> first output) of the measured requests,
p50 and p99 per boot, with every request and without those whose way to their first output
overlapped a stall (``stall_rows`` defines each figure); medians over boots, stock -> patched.

``--strata`` prints instead, per concurrency, the API server's TTFT (received -> first output)
of every measured request of every boot, grouped by how many requests shared its prefill
(``PREFILL_BUCKETS``): p50 per group and side, and both sides' p50 and mean weighted by the
groups' pooled counts, the same weights for both (``strata_rows`` defines it): stock -> patched at
equal shared prefills, request by request, where ``fit`` compares whole cells.

``--launches`` prints instead, per concurrency and variant over the same cells (measured
requests only), how long ``run_batch`` holds the scheduler thread: steady decode launches and
the first decode launch after a prefill (the launch, the host waits inside it, the launch less
those waits, and for the first decode how often it stood between the prefill's end and its
first tokens), prefill launches by how many requests they hold, and a prefill's launch end ->
its result's processing (``launch_parts`` defines each figure).

``--host-speed`` prints instead every server's cells with its host index (the scheduler thread's
CPU time for a prefill launch of 1-3 requests: the same model code on both sides, so the host's
speed while that cell ran) beside the cell's TTFT p50, and per concurrency one fit of TTFT p50 on
that index with a common slope and each side's own intercept: both sides' TTFT at stock's median
host speed (``host_speed_fits``). On the GPU machines (2026-11-26) that speed moved by 1.5-2x
within a boot, on both sides, and host-bound cells' TTFT followed it.

``--host-states`` prints instead each server's host states: the fast level of its one-request
prefill launches' CPU time and the share of them that ran ``SLOW_FACTOR`` times slower, pooled
per side (does one side run slow more often?), and per concurrency the API TTFT p50 of requests
prefilled alone, all of them and split by the state their prefill ran in: both sides at equal
host state, request by request, where ``--host-speed`` fits whole cells (``host_state_rows``).
Timelines from 2026-11-27 on also say, per server, on which physical cores those launches
ended and how often the OS preempted the scheduler thread in slow and in fast ones
(``where_slow``).

``--token-times`` prints instead, per concurrency, when each request's tokens reached the client
(``bench_serving``'s own per-request TTFT and inter-token latencies, from the ``bench/`` files of
the logs; no timeline needed): the first token, the first decode output after it, token 64 and
the last token, p50 and p99 over every request of every boot, and ITL p99 over every gap and
without each request's first gap (``token_time_rows`` defines each figure). A side that sends
the first token sooner while the next output waits for the same later batches shows a longer
first gap, so a worse ITL p99, with every token sooner.

``--functions`` prints instead, per variant beside stock over every measured cell, the host time
of sampled steady decode launches by function on the stack, inclusive (each function once per
sample): the functions whose time per launch differs most between the sides
(``steady_functions``). ``--frames`` splits by the leaf frame alone, per concurrency. Stack
samples favour the calls where the scheduler thread lets go of the GIL (a torch or CUDA call);
``--ftimes`` prints instead the exact host time per steady decode iteration of the functions the
probe timed (a run with ``SMOKE_TIME_FUNCS=relay`` or a list of ``module:Qualname``; ``steady_ftimes``;
with ``--prefill``, per one-request prefill launch, for ``SMOKE_TIME_FUNCS=prefill``: ``prefill_ftimes``),
per concurrency, stock beside each variant.

``--core-speed`` prints instead, per concurrency and variant, the one-request prefill launches of
a run with ``SMOKE_CORE_SPEED=1`` beside the probe's reading of the core's speed right before and
after each (``core_speed_rows``): a launch longer on one side with the core slower by the same
share ran on a slower core; with the core as fast, the launch itself took longer.
``--core-pairs`` sets each boot pair's TTFT p50 ratio beside the ratio of its two servers' core
readings and compares the pairs at equal core speed (``core_pair_rows``, ``core_pair_summary``):
on machines whose vCPUs differ in speed from server to server, the pair's ratio less the part
that follows its cores. ``--rename RECORD:VARIANT=NAME`` (repeatable) gives the pairs of one
record's variant another name before they are summed up, so that records whose servers ran the
same code under different variant names pool (``patched`` of one build is ``patched-skip-idle``
of the build before it).

``--census`` prints instead, for a run with ``SMOKE_CALL_CENSUS=N``, the calls made inside the
one-request prefill launches the probe counted, both sides' launches matched prompt by prompt,
and the calls whose count differs (``census_rows``): counts, unlike times, do not move with the
core's speed, so a launch that takes more CPU per core microsecond either makes more calls
(listed there) or makes the same calls more slowly.

``--poll-wait`` prints instead, per concurrency and variant over every boot, how long each measured
request waited between the API server sending it and the scheduler receiving it, split by what
the scheduler thread was doing when it was sent (a decode or prefill launch, a decode's or a
prefill's result, a host wait between launches, the rest of the loop; ``poll_state``): the
overlap loop polls once per iteration, so that wait is the rest of the iteration the request
came in (``poll_wait_summary`` defines each figure).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import functools
import itertools
import json
import math
import re
import statistics
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_serve_bench as serve  # noqa: E402
from gpu_harness import records  # noqa: E402


def cell_sizes(config: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(concurrency, warm-up requests, measured requests) per cell, in the order they ran: the
    serving benchmark's own counts (``generated-shared-prefix`` sends whole groups)."""
    dataset = config.get("dataset", "random-ids")
    return [(str(c), serve.warmup_requests(config.get("warmup"), c),
             serve.requests_sent(dataset, serve.num_prompts(c, config["rounds"], config.get("min_prompts", 0))))
            for c in config["concurrency"]]


def join_pairs(pairs: list[tuple[Path, dict[str, Any], dict[str, list[dict[str, Any]]]]]
               ) -> tuple[Path, dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Records of one machine's consecutive calls (and their timelines) as one record, named
    after the first: ``gpu_serve_bench.join_records`` on the records, and of each record's
    timelines those of the runs it kept cells of (a run cut off before its first cell can leave
    a timeline under the name that the later call's run of that boot has)."""
    record = serve.join_records([rec for _, rec, _ in pairs])
    by_run: dict[str, list[dict[str, Any]]] = {}
    for _, rec, runs in pairs:
        for run in rec["runs"]:
            name = f"{run['variant']}-boot{run['boot']}"
            if run.get("cells") and name in runs:
                by_run[name] = runs[name]
    return pairs[0][0], record, by_run


def timelines(tar_path: Path) -> dict[str, list[dict[str, Any]]]:
    """Each server run's scheduler events (``<variant>-boot<n>`` -> events in time order)."""
    by_run: dict[str, list[dict[str, Any]]] = {}
    broken: set[str] = set()
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if len(parts) >= 3 and parts[-3] == "timeline" and serve.sched_timeline.is_timeline_file(parts[-1]) and m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                try:
                    events = serve.sched_timeline.read_timeline(f.read().decode(), parts[-1])
                except ValueError:  # cut off mid-write (SGLang kills its scheduler at shutdown)
                    print(f"serve_prefill_batches: {m.name}: unreadable, its run left out", file=sys.stderr)
                    broken.add(parts[-2])
                    continue
                by_run.setdefault(parts[-2], []).extend(events)
    for name in broken:
        by_run.pop(name, None)
    for events in by_run.values():
        events.sort(key=lambda e: e["t"])
    return by_run


#: Per cell of one run, in order: concurrency, the recv events of its warm-up, of its measured requests.
Cells = list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]


def split_cells(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]]
                ) -> list[tuple[dict[str, Any], list[dict[str, Any]], Cells]]:
    """Per run of the record whose timeline holds every arrival: the run, its events and, per cell
    it ran (in order), the ``recv`` events of its warm-up and of its measured requests."""
    if record["environment"].get("variant_note"):
        # Variants renamed after the run: the timeline folders carry the names they ran under.
        print("serve_prefill_batches: a record whose variants were renamed after the run is left out "
              f"({record['environment']['variant_note'][:60]}...)", file=sys.stderr)
        return []
    sizes = cell_sizes(record["environment"]["config"])
    out = []
    for run in record["runs"]:
        events = by_run.get(f"{run['variant']}-boot{run['boot']}")
        if not events:
            continue
        recv = [e for e in events if e["kind"] == "recv"]
        ran = [s for s in sizes if s[0] in run["cells"]]
        total = sum(w + n for _, w, n in ran)
        if len(recv) < total:
            continue  # a cut-off run: the arrival order cannot be split into its cells
        recv = recv[len(recv) - total:]
        cells: Cells = []
        i = 0
        for c, warm, n in ran:
            cells.append((c, recv[i:i + warm], recv[i + warm:i + warm + n]))
            i += warm + n
        out.append((run, events, cells))
    return out


def prefill_size_of(events: list[dict[str, Any]]) -> dict[str, int]:
    """Request id -> how many requests its (first) prefill launch held, from one server's timeline."""
    size: dict[str, int] = {}
    for e in events:
        if e["kind"] == "run" and e["extend"]:
            for rid in e.get("rids") or ():
                size.setdefault(rid, e["bs"])
    return size


def prefill_batch_sizes(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per boot and cell: variant, boot, concurrency, requests, mean prefill batch size,
    TTFT p50 (ms)."""
    rows = []
    for run, events, cells in split_cells(record, by_run):
        bs_of = prefill_size_of(events)
        for c, _, arrivals in cells:
            measured = [bs_of[e["rid"]] for e in arrivals if e["rid"] in bs_of]
            if measured:
                rows.append({"variant": run["variant"], "boot": run["boot"], "concurrency": int(c),
                             "requests": len(measured), "prefill_bs_mean": round(statistics.fmean(measured), 2),
                             "ttft_p50_ms": round(run["cells"][c]["median_ttft_ms"], 1)})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| concurrency | variant, boot | requests | mean prefill batch (requests) | TTFT p50 ms |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["prefill_bs_mean"])):
        lines.append(f"| {r['concurrency']} | {r['variant']} {r['boot']} | {r['requests']} | {r['prefill_bs_mean']:.1f} "
                     f"| {r['ttft_p50_ms']:.1f} |")
    return "\n".join(lines)


def fit(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency with at least three cells: the least-squares line TTFT p50 = a + b x mean
    prefill batch over every cell of every variant, and each variant's mean residual against it
    (ms; > 0: slower than the line predicts for the prefill batches it got)."""
    out = []
    for c in sorted({r["concurrency"] for r in rows}):
        cells = [r for r in rows if r["concurrency"] == c]
        xs = [r["prefill_bs_mean"] for r in cells]
        ys = [r["ttft_p50_ms"] for r in cells]
        if len(cells) < 3 or len(set(xs)) < 2:
            continue
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        a = my - b * mx
        r = statistics.correlation(xs, ys)
        resid = {v: round(statistics.fmean(y - (a + b * x) for x, y, cell in zip(xs, ys, cells) if cell["variant"] == v), 1)
                 for v in sorted({cell["variant"] for cell in cells})}
        batch = {v: round(statistics.fmean(cell["prefill_bs_mean"] for cell in cells if cell["variant"] == v), 1)
                 for v in resid}
        out.append({"concurrency": c, "cells": len(cells), "ms_per_request_in_batch": round(b, 1), "intercept_ms": round(a, 1),
                    "r": round(r, 3), "mean_residual_ms": resid, "mean_prefill_bs": batch})
    return out


def fit_table(fits: list[dict[str, Any]]) -> str:
    lines = ["| concurrency | cells | TTFT p50 = a + b x batch: b (ms per request) | a (ms) | r | mean residual per variant (ms) "
             "| mean prefill batch per variant |", "|---|---|---|---|---|---|---|"]
    for f in fits:
        resid = ", ".join(f"{v} {x:+.1f}" for v, x in f["mean_residual_ms"].items())
        batch = ", ".join(f"{v} {x:.1f}" for v, x in f["mean_prefill_bs"].items())
        lines.append(f"| {f['concurrency']} | {f['cells']} | {f['ms_per_request_in_batch']} | {f['intercept_ms']} | {f['r']} "
                     f"| {resid} | {batch} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- --launches


#: A stack sample in one of these frames means Triton was compiling a kernel during that launch,
#: or loading one from its cache for the first time (both run ``compile``): its compiler stages,
#: the code generator, the launcher's C build, or a child process (ptxas). ``compiler.py`` also
#: holds ``launch_metadata``, which runs on every launch: not listed.
COMPILING = re.compile(r"^(?:compiler\.py:\d+ (?:compile|<lambda>|make_\w+)|code_generator\.py:|build\.py:|subprocess\.py:)")
#: Prefill launches by how many requests they hold: (smallest, largest, label).
PREFILL_BUCKETS = ((1, 3, "1-3"), (4, 8, "4-8"), (9, 16, "9-16"), (17, 1 << 30, "17+"))


def _within(kind_events: list[dict[str, Any]], starts: list[float], t0: float, t1: float) -> list[dict[str, Any]]:
    """The events of one kind (sorted by start; ``starts`` their start times) starting in [t0, t1)."""
    return kind_events[bisect.bisect_left(starts, t0):bisect.bisect_left(starts, t1)]


def _results(runs: list[dict[str, Any]], procs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The result processing of each launch (index into ``runs``). SGLang's overlap loop keeps
    launched batches in a queue and processes their results in launch order, so the oldest
    launch not yet processed owns the next ``proc`` of its forward mode and size; a ``proc``
    that does not match it belongs to a launch the timeline did not see (the first one, which
    installs the probe) and is skipped."""
    out: dict[int, dict[str, Any]] = {}
    queue: collections.deque[int] = collections.deque()
    k = 0
    for p in procs:
        while k < len(runs) and runs[k]["t1"] <= p["t"]:
            queue.append(k)
            k += 1
        if queue and (runs[queue[0]]["mode"], runs[queue[0]]["bs"]) == (p["mode"], p["bs"]):
            out[queue.popleft()] = p
    return out


def _cpu_s(run: dict[str, Any]) -> float | None:
    """A ``run`` event's scheduler-thread CPU time in seconds (``cpu_ms``, timelines from
    2026-11-26 on), else None."""
    return None if run.get("cpu_ms") is None else run["cpu_ms"] / 1e3


def _side_order(concurrency: int, variant: str) -> tuple[int, bool, str]:
    """Rows by concurrency, stock first, then the other variants by name."""
    return concurrency, variant != "stock", variant


def _compile_check(events: list[dict[str, Any]]) -> Callable[[dict[str, Any]], bool]:
    """Whether a ``run`` of one server's timeline (``events``) compiled (or first loaded) a Triton
    kernel: a ``compile`` event inside it, or a ``COMPILING`` frame in a stack sample taken
    during it. Such a launch takes up to hundreds of ms more, on either side."""
    samples = [e for e in events if e["kind"] == "sample"]
    compiles = [e for e in events if e["kind"] == "compile"]
    sample_t, compile_t = [e["t"] for e in samples], [e["t"] for e in compiles]

    def compiled(run: dict[str, Any]) -> bool:
        return bool(_within(compiles, compile_t, run["t"], run["t1"])) or any(
            COMPILING.match(f) for e in _within(samples, sample_t, run["t"], run["t1"]) for f in e["stack"])
    return compiled


def launch_parts(events: list[dict[str, Any]], t_lo: float, t_hi: float) -> dict[str, Any]:
    """Per launch of one server's timeline that starts in [t_lo, t_hi), what the ``--launches``
    figures are made of (seconds).

    ``steady``: each decode launch whose previous launch was not a prefill: its ``run_batch``
    time, the host waits inside it (the probe's ``sync`` events starting within it: blocking
    calls of 0.3 ms or more, ``sched_timeline.SYNC_MIN_S``) by site, the waits between its end
    and the next launch, and the time to the next launch's start. ``first``: each decode launch
    right after a prefill, with its waits and ``exposed``, below. ``prefill``: (requests, launch
    time, scheduler-thread CPU time or None) per prefill. ``to_result``: per prefill, its
    launch's end -> the start of its result's processing, the launches in between (in the
    overlap loop, at least the next one) and whether the next launch is another prefill.
    ``compiled``: launches left out because Triton compiled (or first loaded) a kernel during
    them (a ``compile`` event inside, or a ``COMPILING`` stack sample; a prefill's to_result also
    when a launch in between did): they take up to hundreds of ms at the first use of a
    specialization. The probe samples only prefills and the launch after one, so before
    ``compile`` events (2026-11-26) a steady decode was never left out; with them, a steady
    decode that compiled is left out too. Steady decodes also keep their CPU time (``cpu``).

    ``exposed``, a proxy: the prefill's result processing (after the first decode's launch)
    recorded no host wait. Then the prefill's GPU work had finished by the time the host got to
    it, and the first decode's launch time stood between the prefill's end and its first tokens.
    With a wait, the host got there early and the launch was hidden behind the prefill's GPU
    work. Waits under 0.3 ms are not recorded, and ``exposed`` does not say how much of the
    launch stood in the way (that needs the GPU's own end of the prefill): a GPU run should
    record ``copy_done.query()`` at the launch's end to tell it exactly."""
    runs = [e for e in events if e["kind"] == "run"]
    procs = [e for e in events if e["kind"] == "proc"]
    syncs = [e for e in events if e["kind"] == "sync"]
    sync_t = [e["t"] for e in syncs]
    result = _results(runs, procs)

    def waits(t0: float, t1: float) -> dict[str, float]:
        return serve.sched_timeline.add_waits({}, _within(syncs, sync_t, t0, t1))

    compiled = _compile_check(events)

    out: dict[str, Any] = {"steady": [], "first": [], "prefill": [], "to_result": [],
                           "compiled": {"first": 0, "prefill": 0}}
    for i, run in enumerate(runs):
        if not t_lo <= run["t"] < t_hi:
            continue
        nxt = runs[i + 1] if i + 1 < len(runs) else None
        if run["extend"]:
            if compiled(run):
                out["compiled"]["prefill"] += 1
                continue
            out["prefill"].append((run["bs"], run["t1"] - run["t"], _cpu_s(run)))
            proc = result.get(i)
            between = [] if proc is None else list(itertools.takewhile(lambda r: r["t"] < proc["t"], runs[i + 1:]))
            if proc is not None and not any(compiled(r) for r in between):
                out["to_result"].append({"gap": proc["t"] - run["t1"], "launches": sum(r["t1"] - r["t"] for r in between),
                                         "next_prefill": bool(between) and between[0]["extend"]})
        elif run["mode"] == "DECODE" and i > 0 and runs[i - 1]["extend"]:
            if compiled(run):
                out["compiled"]["first"] += 1
                continue
            proc = result.get(i - 1)
            out["first"].append({"launch": run["t1"] - run["t"], "waits": waits(run["t"], run["t1"]),
                                 "exposed": None if proc is None else not waits(proc["t"], proc["t1"])})
        elif run["mode"] == "DECODE" and i > 0:
            if compiled(run):  # a compile event (timelines from 2026-11-26 on): not steady
                continue
            out["steady"].append({"launch": run["t1"] - run["t"], "cpu": _cpu_s(run), "waits": waits(run["t"], run["t1"]),
                                  "between": None if nxt is None else waits(run["t1"], nxt["t"]),
                                  "period": None if nxt is None else nxt["t"] - run["t"]})
    return out


def _ms(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1e3, 2) if values else None


def _wait_figures(launches: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Median of each launch's summed waits under ``key`` and the site that waited longest over
    all of them, with its mean per launch (ms)."""
    have = [x[key] for x in launches if x[key] is not None]
    sites: dict[str, float] = {}
    for w in have:
        for site, s in w.items():
            sites[site] = sites.get(site, 0.0) + s
    top = max(sites, key=sites.__getitem__) if sites else None
    return {f"{key}_ms": _ms([sum(w.values()) for w in have]),
            f"{key}_top": top, f"{key}_top_ms_per_launch": round(sites[top] * 1e3 / len(have), 2) if top else None}


def summarise(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool ``launch_parts`` of several servers (one side, one concurrency) into medians (ms).
    ``net_ms`` is the median over launches of (launch - waits inside it), not the difference of
    the two medians."""
    steady = [x for p in parts for x in p["steady"]]
    first = [x for p in parts for x in p["first"]]
    prefill = [x for p in parts for x in p["prefill"]]
    known = [x["exposed"] for x in first if x["exposed"] is not None]
    to_result = [x for p in parts for x in p["to_result"]]
    return {
        "steady": {"launches": len(steady), "launch_ms": _ms([x["launch"] for x in steady]),
                   "cpu_ms": _ms([x["cpu"] for x in steady if x.get("cpu") is not None]), **_wait_figures(steady, "waits"),
                   "net_ms": _ms([x["launch"] - sum(x["waits"].values()) for x in steady]),
                   **_wait_figures(steady, "between"), "period_ms": _ms([x["period"] for x in steady if x["period"] is not None])},
        "first": {"launches": len(first), "compiled": sum(p["compiled"]["first"] for p in parts),
                  "launch_ms": _ms([x["launch"] for x in first]), **_wait_figures(first, "waits"),
                  "net_ms": _ms([x["launch"] - sum(x["waits"].values()) for x in first]),
                  "exposed": sum(known), "exposed_of": len(known)},
        "prefill": {label: {"launches": len(d), "launch_ms": _ms([s for s, _ in d]),
                            "cpu_ms": _ms([c for _, c in d if c is not None])}
                    for lo, hi, label in PREFILL_BUCKETS for d in [[(s, c) for bs, s, c in prefill if lo <= bs <= hi]]},
        "prefill_compiled": sum(p["compiled"]["prefill"] for p in parts),
        "to_result_ms": _ms([x["gap"] for x in to_result]),
        "to_result_launches_ms": _ms([x["launches"] for x in to_result]),
        "next_is_prefill": sum(x["next_prefill"] for x in to_result), "to_result_prefills": len(to_result),
    }


def measured_windows(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]]
                     ) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], int, float, float]]:
    """Per run of the record with a timeline (``split_cells``) and per cell with measured
    requests: the run, its events, the concurrency and the cell's measured window, first measured
    arrival -> the next cell's first arrival (the warm-up is left out)."""
    for run, events, cells in split_cells(record, by_run):
        starts = [(warm or measured)[0]["t"] for _, warm, measured in cells]
        for k, (c, _, measured) in enumerate(cells):
            if measured:
                yield run, events, int(c), measured[0]["t"], starts[k + 1] if k + 1 < len(starts) else float("inf")


def launch_split(pairs: list[tuple[str, dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Per concurrency and variant over every (label, record, timelines) pair: the servers pooled
    (``runs``: record label, variant, boot) and ``summarise`` of their measured requests' window
    (``measured_windows``)."""
    pooled: dict[tuple[int, str], tuple[list[str], list[dict[str, Any]]]] = {}
    for label, record, by_run in pairs:
        for run, events, c, t_lo, t_hi in measured_windows(record, by_run):
            names, parts = pooled.setdefault((c, run["variant"]), ([], []))
            names.append(f"{label} {run['variant']} {run['boot']}")
            parts.append(launch_parts(events, t_lo, t_hi))
    return [{"concurrency": c, "variant": v, "runs": names, **summarise(parts)}
            for (c, v), (names, parts) in sorted(pooled.items(), key=lambda kv: _side_order(*kv[0]))]


#: A lag window whose longest late wake-up is this long or longer holds a stall (ms).
STALL_MS = 100.0


def api_stalls(events: list[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """The API server's event-loop stalls in one server's timeline: (from, to, longest late
    wake-up in ms) per ``lag`` window holding one. The probe closes a window on its first wake-up
    half a second or more after it opened, and opens the next one then, so the stall lies
    between the window's start and the next window's start (the window's start plus its
    length and the stall, for the last one)."""
    lags = [e for e in events if e["kind"] == "lag"]
    out = []
    for i, e in enumerate(lags):
        if e["max"] * 1e3 >= STALL_MS:
            end = lags[i + 1]["t"] if i + 1 < len(lags) else e["t"] + 0.5 + e["max"]
            out.append((e["t"], end, round(e["max"] * 1e3, 1)))
    return out


def api_full_gcs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The API server's full garbage collections (generation 2) in one server's timeline, in
    time order."""
    return sorted((e for e in events if e["kind"] == "gc" and e.get("where") == "api" and e["gen"] == 2),
                  key=lambda e: e["t"])


def stall_rows(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per boot and cell: variant, boot, concurrency, ``requests`` (measured requests with
    the API server's timestamps), ``stalls`` (the longest late wake-ups, ms, of the stalls that
    overlap the cell: from its first measured arrival to its last first output; None for a
    timeline without ``lag`` events), ``api_gc_ms`` (the API server's full garbage collections in
    that span, ms; records before the probe watched collections have none), ``hit`` (the
    requests whose received -> first output overlaps a stall), the API server's TTFT p50 / p99 of
    every request (``api_p50_ms``, ``api_p99_ms``) and of the others (``clean_p50_ms``,
    ``clean_p99_ms``; ``records.quantile``: numpy's linear percentile, as ``bench_serving``
    reports), and the client's TTFT p50 / p99 of the cell (``bench_serving``'s)."""
    rows = []
    for run, events, cells in split_cells(record, by_run):
        api = {e["rid"]: e for e in events if e["kind"] == "api"}
        stalls = api_stalls(events)
        lagged = any(e["kind"] == "lag" for e in events)  # records before the lag probe have none
        full_gcs = api_full_gcs(events)
        for c, _, arrivals in cells:
            spans = [(api[e["rid"]]["received"], api[e["rid"]]["first"]) for e in arrivals if e["rid"] in api]
            if not spans:
                continue
            lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
            inside = [s for s in stalls if s[0] < hi and s[1] > lo]
            clean = [(b - a) * 1e3 for a, b in spans if not any(s0 < b and s1 > a for s0, s1, _ in inside)]
            every = [(b - a) * 1e3 for a, b in spans]
            cell = run["cells"][c]
            rows.append({"variant": run["variant"], "boot": run["boot"], "concurrency": int(c), "requests": len(spans),
                         "stalls": [ms for *_, ms in inside] if lagged else None, "hit": len(spans) - len(clean),
                         "api_gc_ms": [round((g["t1"] - g["t"]) * 1e3, 1) for g in full_gcs if lo <= g["t"] < hi],
                         "api_p50_ms": round(records.quantile(every, 0.5), 1),
                         "api_p99_ms": round(records.quantile(every, 0.99), 1),
                         "clean_p50_ms": round(records.quantile(clean, 0.5), 1) if clean else None,
                         "clean_p99_ms": round(records.quantile(clean, 0.99), 1) if clean else None,
                         "client_p50_ms": round(cell["median_ttft_ms"], 1), "client_p99_ms": round(cell["p99_ttft_ms"], 1)})
    return rows


def full_gc_points(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]],
                   label: str = "") -> list[dict[str, Any]]:
    """One row per server of the record with a timeline: variant, boot, ``record`` (``label``),
    ``requests`` (the requests its API server received, warm-ups included) and ``full_gcs``: for
    each full collection in the API server, the requests it had received by then and the pause
    (ms). Where a server's first full collection falls, in requests: past its last request it
    lands in no cell, which the cells alone do not tell apart from a server that collected none."""
    rows = []
    for run in record["runs"]:
        events = by_run.get(f"{run['variant']}-boot{run['boot']}")
        if not events:
            continue
        received = sorted(e["received"] for e in events if e["kind"] == "api")
        full = api_full_gcs(events)
        rows.append({"record": label, "variant": run["variant"], "boot": run["boot"], "requests": len(received),
                     "full_gcs": [{"at_request": bisect.bisect_left(received, g["t"]),
                                   "ms": round((g["t1"] - g["t"]) * 1e3, 1)} for g in full]})
    return rows


def full_gc_table(rows: list[dict[str, Any]]) -> str:
    """``full_gc_points`` rows: per server, and per variant the servers that collected and the
    requests of their first collection (median)."""
    lines = ["The API server's full collections, per server (at request: the requests it had received by then, "
             "warm-ups included):", "", "| record | variant | boot | requests received | full collections: at request "
             "(ms) |", "|---|---|---|---|---|"]
    for r in rows:
        at = ", ".join(f"{g['at_request']} ({g['ms']:.0f} ms)" for g in r["full_gcs"]) or "none"
        lines.append(f"| {r['record']} | {r['variant']} | {r['boot']} | {r['requests']} | {at} |")
    lines += ["", "| variant | servers | with a full collection | first at request (median; range) | "
                  "the others received (range) |", "|---|---|---|---|---|"]
    for v in sorted({r["variant"] for r in rows}, key=lambda v: (v != "stock", v)):
        side = [r for r in rows if r["variant"] == v]
        firsts = [r["full_gcs"][0]["at_request"] for r in side if r["full_gcs"]]
        others = [r["requests"] for r in side if not r["full_gcs"]]
        first = f"{statistics.median(firsts):g}; {min(firsts)}-{max(firsts)}" if firsts else "-"
        rest = f"{min(others)}-{max(others)}" if others else "-"
        lines.append(f"| {v} | {len(side)} | {len(firsts)} | {first} | {rest} |")
    return "\n".join(lines)


def stall_table(rows: list[dict[str, Any]]) -> str:
    """Per concurrency: each side's stalls (boots with one in the cell / boots with lag data), the
    requests they hit and the API server's full garbage collections, then stock -> patched
    medians over boots of the client's TTFT p50 / p99 and the API server's, with every request
    and without the stalled ones (x: how much better patched is)."""
    def med(side: list[dict[str, Any]], key: str) -> float | None:
        have = [r[key] for r in side if r[key] is not None]
        return statistics.median(have) if have else None

    def pair(st: list[dict[str, Any]], pa: list[dict[str, Any]], key: str) -> str:
        a, b = med(st, key), med(pa, key)
        if a is None or b is None:
            return "-"
        return f"{a:.1f} -> {b:.1f} (x{a / b:.3f})"

    def gcs(side: list[dict[str, Any]]) -> str:
        ms = [g for r in side for g in r["api_gc_ms"]]
        return f"{len(ms)} (longest {max(ms):.0f} ms)" if ms else "0"

    lines = ["| conc | boots with a stall (stock / patched) | requests hit | API server full GCs (stock / patched) "
             "| client TTFT p50 | client TTFT p99 | API TTFT p50 | API TTFT p50 without the stalled | API TTFT p99 "
             "| API TTFT p99 without the stalled |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted({r["concurrency"] for r in rows}):
        st = [r for r in rows if r["concurrency"] == c and r["variant"] == "stock"]
        pa = [r for r in rows if r["concurrency"] == c and r["variant"] == "patched"]
        if not st or not pa:
            continue
        n = "{} / {}".format(*(f"{sum(1 for r in side if r['stalls'])} of {sum(1 for r in side if r['stalls'] is not None)}"
                               for side in (st, pa)))
        hit = "{} / {}".format(*(sum(r["hit"] for r in side) for side in (st, pa)))
        lines.append(f"| {c} | {n} | {hit} | {gcs(st)} / {gcs(pa)} | " + " | ".join(pair(st, pa, k) for k in (
            "client_p50_ms", "client_p99_ms", "api_p50_ms", "clean_p50_ms", "api_p99_ms", "clean_p99_ms")) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- --strata


def strata_rows(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]],
                variant: str = "patched") -> list[dict[str, Any]]:
    """One row per concurrency, over every measured request of every boot of stock and ``variant``
    (``patched`` unless another variant of the record is named; of every
    record and its timelines in ``pairs``) that has
    the API server's timestamps and a prefill in the timeline: per ``PREFILL_BUCKETS`` group (the
    size of the prefill the request was launched in) the requests and the API server's TTFT p50
    per side (``records.quantile``), and ``adjusted_p50_ms``: each side's group p50s weighted by the
    group's requests of both sides together, over the groups both sides have (direct
    standardisation: what each side's p50 would be had both got the same mix of shared prefills),
    with ``covered``, the share of requests in those groups; ``mean_ms`` and ``adjusted_mean_ms``
    the same for the mean (a mean, unlike a p50, is the sum of its parts' means)."""
    ttft: dict[tuple[int, str, str], list[float]] = collections.defaultdict(list)
    runs = [split for record, by_run in pairs for split in split_cells(record, by_run)]
    for run, events, cells in runs:
        api = {e["rid"]: e for e in events if e["kind"] == "api"}
        bs_of = prefill_size_of(events)
        for c, _, arrivals in cells:
            for e in arrivals:
                rid = e["rid"]
                if rid in api and rid in bs_of:
                    label = next(lab for lo, hi, lab in PREFILL_BUCKETS if lo <= bs_of[rid] <= hi)
                    ttft[(int(c), run["variant"], label)].append((api[rid]["first"] - api[rid]["received"]) * 1e3)
    rows = []
    for c in sorted({k[0] for k in ttft}):
        groups = []
        for *_, label in PREFILL_BUCKETS:
            st, pa = ttft.get((c, "stock", label), []), ttft.get((c, variant, label), [])
            groups.append({"prefill": label, "requests": [len(st), len(pa)],
                           "p50_ms": [round(records.quantile(x, 0.5), 1) if x else None for x in (st, pa)],
                           "mean_ms": [round(statistics.fmean(x), 1) if x else None for x in (st, pa)]})
        both = [g for g in groups if all(g["requests"])]
        if not both:
            continue
        total = sum(sum(g["requests"]) for g in groups)
        weight = sum(sum(g["requests"]) for g in both)
        adjusted = {key: [round(sum(sum(g["requests"]) * g[key][i] for g in both) / weight, 1) for i in (0, 1)]
                    for key in ("p50_ms", "mean_ms")}
        rows.append({"concurrency": c, "variant": variant, "groups": groups, "adjusted_p50_ms": adjusted["p50_ms"],
                     "adjusted_mean_ms": adjusted["mean_ms"], "covered": round(weight / total, 3)})
    return rows


def strata_table(rows: list[dict[str, Any]]) -> str:
    labels = [lab for *_, lab in PREFILL_BUCKETS]
    lines = ["| conc | " + " | ".join(f"prefill of {lab}: requests, API TTFT p50 ms" for lab in labels)
             + f" | at equal shared prefills: stock -> {rows[0]['variant'] if rows else 'patched'} (x) "
             "| the same for the mean "
             "| requests in groups both sides have |",
             "|---|" + "---|" * len(labels) + "---|---|---|"]
    for r in rows:
        cells = []
        for g in r["groups"]:
            (ns, np_), (a, b) = g["requests"], g["p50_ms"]
            cells.append("-" if not ns and not np_ else f"{ns} / {np_}: {_cell(a)} -> {_cell(b)}")
        a, b = r["adjusted_p50_ms"]
        ma, mb = r["adjusted_mean_ms"]
        lines.append(f"| {r['concurrency']} | " + " | ".join(cells) + f" | {a:.1f} -> {b:.1f} (x{a / b:.3f}) "
                     f"| {ma:.1f} -> {mb:.1f} (x{ma / mb:.3f}) | {r['covered'] * 100:.0f}% |")
    return "\n".join(lines)


def _cell(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.2f}"


def _site(site: str | None, ms: float | None) -> str:
    return "-" if site is None else f"{site} ({ms:.2f})"


def _cpu(figures: dict[str, Any]) -> str:
    """A launch time, with the scheduler thread's CPU time in it where the timeline has it
    (``cpu_ms`` of ``run`` events, from 2026-11-26 on): ``22.06 (cpu 20.10)``."""
    cpu = figures.get("cpu_ms")
    return _cell(figures["launch_ms"]) + ("" if cpu is None else f" (cpu {cpu:.2f})")


def launch_tables(rows: list[dict[str, Any]]) -> str:
    """The ``launch_split`` rows as three tables: steady decodes, the first decode after a
    prefill, prefills by size."""
    steady = ["| concurrency | variant | servers | steady decodes | launch ms | waits inside ms | launch - waits ms "
              "| longest wait inside (ms per launch) | waits until the next launch ms | longest wait there (ms per launch) "
              "| launch to next launch ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    first = ["| concurrency | variant | first decodes after a prefill (Triton compile left out) | launch ms | waits inside ms "
             "| launch - waits ms | longest wait inside (ms per launch) | exposed (proxy) |", "|---|---|---|---|---|---|---|---|"]
    prefill = ["| concurrency | variant | " + " | ".join(f"{label} requests: prefills, launch ms" for *_, label in PREFILL_BUCKETS)
               + " | Triton compile left out | prefill launch end -> its result processed ms | launches in between ms "
               "| next launch a prefill |", "|---|---|" + "---|" * len(PREFILL_BUCKETS) + "---|---|---|---|"]
    for r in rows:
        head = f"| {r['concurrency']} | {r['variant']} "
        s, f = r["steady"], r["first"]
        steady.append(head + f"| {len(r['runs'])} | {s['launches']} | {_cpu(s)} | {_cell(s['waits_ms'])} "
                      f"| {_cell(s['net_ms'])} | {_site(s['waits_top'], s['waits_top_ms_per_launch'])} "
                      f"| {_cell(s['between_ms'])} | {_site(s['between_top'], s['between_top_ms_per_launch'])} "
                      f"| {_cell(s['period_ms'])} |")
        first.append(head + f"| {f['launches']} ({f['compiled']}) | {_cell(f['launch_ms'])} | {_cell(f['waits_ms'])} "
                     f"| {_cell(f['net_ms'])} | {_site(f['waits_top'], f['waits_top_ms_per_launch'])} "
                     f"| {f['exposed']} / {f['exposed_of']} |")
        prefill.append(head + "| " + " | ".join(f"{b['launches']}, {_cpu(b)}" for b in r["prefill"].values())
                       + f" | {r['prefill_compiled']} | {_cell(r['to_result_ms'])} | {_cell(r['to_result_launches_ms'])} "
                       f"| {r['next_is_prefill']} / {r['to_result_prefills']} |")
    return "\n".join(steady) + "\n\n" + "\n".join(first) + "\n\n" + "\n".join(prefill)


#: ``--frames``: how many leaf frames per concurrency (largest differences from stock first).
FRAMES_SHOWN = 12


def sampled_steady_launches(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]
                            ) -> Iterator[tuple[int, str, dict[str, Any], list[dict[str, Any]]]]:
    """Over the measured window of every cell (as ``launch_split``): each sampled steady decode
    launch (``run`` events with ``sampled``, timelines from 2026-11-26 on, one steady decode in
    ``sched_timeline.STEADY_SAMPLE_EVERY``) as concurrency, variant, the ``run`` event and the
    stack samples taken during it."""
    for record, by_run in pairs:
        for run, events, c, t_lo, t_hi in measured_windows(record, by_run):
            samples = [e for e in events if e["kind"] == "sample" and e.get("phase") == "steady"]
            sample_t = [e["t"] for e in samples]
            for r in events:
                if r["kind"] == "run" and r.get("sampled") and t_lo <= r["t"] < t_hi:
                    yield c, run["variant"], r, _within(samples, sample_t, r["t"], r["t1"])


def steady_frames(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Per concurrency and variant, the sampled steady decode launches (``sampled_steady_launches``),
    their median launch and CPU time, and the stack samples' time per launch by leaf frame (file
    and function, line numbers dropped): where a decode launch's host time goes."""
    pooled: dict[tuple[int, str], dict[str, Any]] = {}
    for c, variant, r, samples in sampled_steady_launches(pairs):
        acc = pooled.setdefault((c, variant), {"launch": [], "cpu": [], "frames": {}})
        acc["launch"].append(r["t1"] - r["t"])
        if _cpu_s(r) is not None:
            acc["cpu"].append(_cpu_s(r))
        for e in samples:
            leaf = re.sub(r":\d+ ", " ", e["stack"][0]) if e["stack"] else "?"
            acc["frames"][leaf] = acc["frames"].get(leaf, 0.0) + e.get("dt", 1e-3)
    rows = []
    for (c, v), acc in sorted(pooled.items(), key=lambda kv: _side_order(*kv[0])):
        n = len(acc["launch"])
        if not n:
            continue
        rows.append({"concurrency": c, "variant": v, "launches": n, "launch_ms": _ms(acc["launch"]),
                     "cpu_ms": _ms(acc["cpu"]),
                     "frames_ms": {f: round(t * 1e3 / n, 3) for f, t in sorted(acc["frames"].items(), key=lambda kv: -kv[1])}})
    return rows


def frames_table(rows: list[dict[str, Any]]) -> str:
    """Per concurrency, the leaf frames whose time per sampled steady decode launch differs most
    between stock and each other variant (ms per launch, stock -> variant)."""
    out = ["| conc | variant | sampled steady decodes (stock / this) | launch ms | cpu ms | leaf frame | stock ms | this ms |",
           "|---|---|---|---|---|---|---|---|"]
    by_c: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_c.setdefault(r["concurrency"], {})[r["variant"]] = r
    for c, sides in sorted(by_c.items()):
        st = sides.get("stock")
        for v, r in sides.items():
            if v == "stock":
                continue
            base = st["frames_ms"] if st else {}
            frames = set(base) | set(r["frames_ms"])
            top = sorted(frames, key=lambda f: (-abs(r["frames_ms"].get(f, 0.0) - base.get(f, 0.0)), f))[:FRAMES_SHOWN]
            head = (f"| {c} | {v} | {st['launches'] if st else 0} / {r['launches']} | "
                    f"{_cell(st['launch_ms'] if st else None)} -> {_cell(r['launch_ms'])} | "
                    f"{_cell(st['cpu_ms'] if st else None)} -> {_cell(r['cpu_ms'])} ")
            for i, f in enumerate(top):
                out.append((head if i == 0 else f"| {c} | {v} | | | ")
                           + f"| {f} | {base.get(f, 0.0):.3f} | {r['frames_ms'].get(f, 0.0):.3f} |")
    return "\n".join(out)


#: A plugin text edit's code object is named ``<__sglang_futuremap_patch__ edit of MODULE:QUALNAME HASH>``.
EDITED_FRAME = re.compile(r"<__sglang_futuremap_patch__ edit of ([\w.]+):[\w.]+ \w+>:\d+ (\w+)$")

#: Functions ``--functions`` prints (largest difference first).
FUNCTIONS_SHOWN = 20


def frame_function(frame: str) -> str:
    """A stack sample's frame (``file.py:line func``) as ``file.py func``; a function the plugin
    edited is named after SGLang's file, so both sides count it under one name."""
    m = EDITED_FRAME.match(frame)
    if m:
        return f"{m.group(1).rsplit('.', 1)[-1]}.py {m.group(2)}"
    return re.sub(r":\d+ ", " ", frame)


def steady_functions(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Per variant, every concurrency pooled: the sampled steady decode launches
    (``sampled_steady_launches``) and, per function on a sample's stack (``frame_function``; each
    function once per sample, whatever its depth), the samples' time per launch: a function's
    inclusive host time, as deep as the probe's stacks reach."""
    pooled: dict[str, dict[str, Any]] = {}
    for _, variant, _, samples in sampled_steady_launches(pairs):
        acc = pooled.setdefault(variant, {"launches": 0, "sampled": 0.0, "functions": collections.Counter()})
        acc["launches"] += 1
        for e in samples:
            dt = e.get("dt", 1e-3)
            acc["sampled"] += dt
            for f in {frame_function(x) for x in e["stack"]}:
                acc["functions"][f] += dt
    return [{"variant": v, "launches": acc["launches"],
             "sampled_ms": round(acc["sampled"] * 1e3 / acc["launches"], 3),
             "functions_ms": {f: round(t * 1e3 / acc["launches"], 3)
                              for f, t in sorted(acc["functions"].items(), key=lambda kv: (-kv[1], kv[0]))}}
            for v, acc in sorted(pooled.items(), key=lambda kv: _side_order(0, kv[0]))]


def functions_table(rows: list[dict[str, Any]]) -> str:
    """Per variant beside stock, the functions whose inclusive time per sampled steady decode
    launch differs most (ms per launch, stock -> variant, largest difference first)."""
    by_v = {r["variant"]: r for r in rows}
    st = by_v.get("stock", {"launches": 0, "sampled_ms": 0.0, "functions_ms": {}})
    out = ["Where sampled steady decode launches spend their host time, by function on the stack (`--functions`; "
           "a sample counts toward every function on its stack once; every measured cell pooled; ms per launch):", "",
           "| variant | sampled launches (stock / this) | sampled ms per launch | function | stock ms | this ms | difference |",
           "|---|---|---|---|---|---|---|"]
    for v, r in by_v.items():
        if v == "stock":
            continue
        base, this = st["functions_ms"], r["functions_ms"]
        # Ties by name, so the table does not depend on the set's (hash-seeded) order.
        top = sorted(set(base) | set(this), key=lambda f: (-abs(this.get(f, 0.0) - base.get(f, 0.0)), f))[:FUNCTIONS_SHOWN]
        for i, f in enumerate(top):
            head = (f"| {v} | {st['launches']} / {r['launches']} | {st['sampled_ms']:.3f} -> {r['sampled_ms']:.3f} "
                    if i == 0 else f"| {v} | | ")
            out.append(head + f"| {f} | {base.get(f, 0.0):.3f} | {this.get(f, 0.0):.3f} | "
                       f"{this.get(f, 0.0) - base.get(f, 0.0):+.3f} |")
    return "\n".join(out)


def _ftime_rows(picked: Iterator[tuple[int, str, float, dict[str, list[float]]]]) -> list[dict[str, Any]]:
    """``picked`` (concurrency, variant, period in s, ``ftimes`` of one launch) pooled per
    concurrency and variant: how many, the mean period (ms) and each timed function's calls and
    ms per launch, largest first."""
    pooled: dict[tuple[int, str], dict[str, Any]] = {}
    for c, variant, period, ftimes in picked:
        acc = pooled.setdefault((c, variant), {"n": 0, "period": [], "calls": collections.Counter(),
                                               "ms": collections.Counter()})
        acc["n"] += 1
        acc["period"].append(period)
        for name, (calls, ms) in ftimes.items():
            acc["calls"][name] += calls
            acc["ms"][name] += ms
    rows = []
    for (c, v), acc in sorted(pooled.items(), key=lambda kv: _side_order(*kv[0])):
        n = acc["n"]
        rows.append({"concurrency": c, "variant": v, "iterations": n,
                     "period_ms": round(statistics.fmean(acc["period"]) * 1e3, 3),
                     "functions": {f: {"calls": round(acc["calls"][f] / n, 3), "ms": round(acc["ms"][f] / n, 4)}
                                   for f in sorted(acc["ms"], key=lambda f: (-acc["ms"][f], f))}})
    return rows


def steady_ftimes(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Per concurrency and variant (``measured_windows``): the steady decode iterations, a
    decode launch whose previous launch was a decode too (so its ``run`` event's ``ftimes``, the
    probe's exact timers since the previous launch ended, cover one whole iteration), their mean
    launch-to-launch time, and per timed function its calls and ms per iteration."""
    def picked() -> Iterator[tuple[int, str, float, dict[str, list[float]]]]:
        for run, events, c, t_lo, t_hi in (w for record, by_run in pairs for w in measured_windows(record, by_run)):
            runs = [e for e in events if e["kind"] == "run"]
            for prev, r, nxt in zip(runs, runs[1:], runs[2:]):
                if t_lo <= r["t"] < t_hi and "ftimes" in r and r["mode"] == "DECODE" and prev["mode"] == "DECODE":
                    yield c, run["variant"], nxt["t"] - r["t"], r["ftimes"]
    return _ftime_rows(picked())


def one_request_prefills(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]],
                         *fields: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(concurrency, variant, ``run`` event) of every one-request prefill launch (SGLang's extend
    mode, one request) inside a cell's measured window (``measured_windows``) whose event has
    all of ``fields``: the launches ``prefill_ftimes`` and ``core_speed_rows`` read."""
    for record, by_run in pairs:
        for run, c, r in one_request_prefills_by_run(record, by_run, *fields):
            yield c, run["variant"], r


def one_request_prefills_by_run(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]],
                                *fields: str) -> Iterator[tuple[dict[str, Any], int, dict[str, Any]]]:
    """``one_request_prefills`` of one record, with the server run each launch belongs to:
    (run, concurrency, ``run`` event)."""
    for run, events, c, t_lo, t_hi in measured_windows(record, by_run):
        for r in events:
            if (r["kind"] == "run" and t_lo <= r["t"] < t_hi and r["extend"] and r["bs"] == 1
                    and all(f in r for f in fields)):
                yield run, c, r


def prefill_ftimes(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Per concurrency and variant (``measured_windows``): the one-request prefill launches
    (``run`` events of SGLang's extend mode with one request), their mean launch time
    (``period_ms``: the ``run_batch`` itself), and per timed function its calls and ms per
    launch, from the launch's ``ftimes`` (the probe's exact timers since the previous launch
    ended: the poll, the batch's build and this launch). The same rows as ``steady_ftimes``: where
    a longer prefill launch spends its host time, at one request on both sides (no size mix)."""
    return _ftime_rows((c, v, r["t1"] - r["t"], r["ftimes"]) for c, v, r in one_request_prefills(pairs, "ftimes"))


def ftimes_table(rows: list[dict[str, Any]], prefill: bool = False) -> str:
    """Per concurrency, each timed function's ms and calls per steady decode iteration (with
    ``prefill``: per one-request prefill launch, ``prefill_ftimes``), stock beside each other
    variant, largest difference first."""
    what, unit, one, period = (("one-request prefill launch", "launches", "launch", "launch ms") if prefill
                               else ("steady decode iteration", "iterations", "iteration", "launch to launch ms"))
    out = [f"Exact host time per {what}, by timed function (`--ftimes`: the probe's "
           f"`SMOKE_TIME_FUNCS` timers, inclusive; mean over {unit}; ms, calls per {one} in brackets):", "",
           f"| conc | variant | {unit} (stock / this) | {period} | function | stock ms | this ms | difference |",
           "|---|---|---|---|---|---|---|---|"]
    by_c: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_c.setdefault(r["concurrency"], {})[r["variant"]] = r
    for c, sides in sorted(by_c.items()):
        st = sides.get("stock", {"iterations": 0, "period_ms": None, "functions": {}})
        for v, r in sides.items():
            if v == "stock":
                continue
            base, this = st["functions"], r["functions"]
            names = sorted(set(base) | set(this),
                           key=lambda f: (-abs(this.get(f, {}).get("ms", 0.0) - base.get(f, {}).get("ms", 0.0)), f))
            for i, f in enumerate(names):
                b, t = base.get(f), this.get(f)
                head = (f"| {c} | {v} | {st['iterations']} / {r['iterations']} | "
                        f"{_cell(st['period_ms'])} -> {_cell(r['period_ms'])} " if i == 0 else f"| {c} | {v} | | ")
                out.append(head + f"| {f} | " + (f"{b['ms']:.3f} ({b['calls']:g})" if b else "-") + " | "
                           + (f"{t['ms']:.3f} ({t['calls']:g})" if t else "-") + " | "
                           + f"{(t['ms'] if t else 0.0) - (b['ms'] if b else 0.0):+.3f} |")
    return "\n".join(out)


def core_speed_rows(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Per concurrency and variant (``measured_windows``): the one-request prefill launches that
    carry the probe's ``core_us`` (a run with ``SMOKE_CORE_SPEED=1``), with medians of the launch
    (``launch_ms``), its CPU time (``cpu_ms``), the core's speed around it (``core_us``: the mean
    of the readings before and after), the driver calls' (``driver_us``, None off CUDA) and the
    launch's CPU time in core units (``cpu_per_core``: ``cpu_ms`` / ``core_us`` per launch). Is a
    longer launch on one side the core (``core_us`` longer by the same share, ``cpu_per_core``
    equal) or the launch itself (``core_us`` equal)? Launches from 2026-11-28 on also give the
    median of the empty-kernel launches (``kernel_us``: the driver's launch path on the prefill's
    stream) and the mean garbage-collection time inside a launch (``gc_ms``) with the share of
    launches that had a collection of generation 1 or 2 (``gc_old_share``); None before."""
    pooled: dict[tuple[int, str], dict[str, list[float]]] = {}
    for c, variant, r in one_request_prefills(pairs, "core_us", "cpu_ms"):
        acc = pooled.setdefault((c, variant), {"launch": [], "cpu": [], "core": [], "driver": [], "per": [],
                                               "kernel": [], "gc": [], "gc_old": []})
        core = statistics.fmean(r["core_us"])
        acc["launch"].append((r["t1"] - r["t"]) * 1e3)
        acc["cpu"].append(r["cpu_ms"])
        acc["core"].append(core)
        acc["per"].append(r["cpu_ms"] / core if core > 0 else float("nan"))
        if "driver_us" in r:
            acc["driver"].append(statistics.fmean(r["driver_us"]))
        if "kernel_us" in r:
            acc["kernel"].append(statistics.fmean(r["kernel_us"]))
        if "gc" in r:
            acc["gc"].append(r["gc"][3])
            acc["gc_old"].append(1.0 if r["gc"][1] or r["gc"][2] else 0.0)

    def rounded(val: float | None, digits: int) -> float | None:
        return round(val, digits) if val is not None else None

    rows = []
    for (c, v), acc in sorted(pooled.items(), key=lambda kv: _side_order(*kv[0])):
        med = {k: statistics.median(vals) if vals else None for k, vals in acc.items()}
        rows.append({"concurrency": c, "variant": v, "launches": len(acc["launch"]),
                     "launch_ms": round(med["launch"], 3), "cpu_ms": round(med["cpu"], 3),
                     "core_us": round(med["core"], 2), "driver_us": rounded(med["driver"], 2),
                     "cpu_per_core": round(med["per"], 4), "kernel_us": rounded(med["kernel"], 2),
                     "gc_ms": rounded(statistics.fmean(acc["gc"]) if acc["gc"] else None, 3),
                     "gc_old_share": rounded(statistics.fmean(acc["gc_old"]) if acc["gc_old"] else None, 3)})
    return rows


def core_pair_rows(pairs: list[tuple[str, dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Per boot pair (the stock and the other server of one boot of one record) and
    concurrency: the client's TTFT p50 ratio, stock / other (above 1: the other side better),
    and the ratio of the two servers' core readings, stock / other (the median over
    each server's one-request prefill launches in the cell of the probe's ``core_us``, a run with
    ``SMOKE_CORE_SPEED=1``; above 1: the other server's core was the faster one). Pairs with no
    reading on either side are left out. Each pair also gives the ratio of its two servers' launch
    CPU time per core microsecond (``cpu_ms`` / ``core_us`` per launch, median per server), other /
    stock (above 1: the other server's launch took more CPU per unit of core speed; None where a
    side has no CPU times). (label, record, timelines) in; one row per pair."""
    out: list[dict[str, Any]] = []
    for label, record, by_run in pairs:
        core: dict[tuple[str, Any, int], list[float]] = {}
        per_core: dict[tuple[str, Any, int], list[float]] = {}
        for run, c, e in one_request_prefills_by_run(record, by_run, "core_us"):
            reading = statistics.fmean(e["core_us"])
            core.setdefault((run["variant"], run["boot"], c), []).append(reading)
            if "cpu_ms" in e and reading > 0:
                per_core.setdefault((run["variant"], run["boot"], c), []).append(e["cpu_ms"] / reading)
        ttft = {(run["variant"], run["boot"], int(c)): cell.get("median_ttft_ms")
                for run in record["runs"] for c, cell in (run.get("cells") or {}).items()}
        for (variant, boot, c), theirs in sorted(ttft.items(), key=lambda kv: (kv[0][2], str(kv[0][1]), kv[0][0])):
            stock = ttft.get(("stock", boot, c))
            cores = core.get(("stock", boot, c)), core.get((variant, boot, c))
            if variant == "stock" or not stock or not theirs or not all(cores):
                continue
            works = per_core.get(("stock", boot, c)), per_core.get((variant, boot, c))
            out.append({"record": label, "boot": boot, "concurrency": c, "variant": variant,
                        "ttft_ratio": stock / theirs,
                        "core_ratio": statistics.median(cores[0]) / statistics.median(cores[1]),
                        "cpu_per_core_ratio": (statistics.median(works[1]) / statistics.median(works[0])
                                               if all(works) else None)})
    return out


def parse_renames(specs: list[str]) -> dict[tuple[str, str], str]:
    """``--rename RECORD:VARIANT=NAME`` values as {(record, variant): name}; ValueError names a
    malformed one."""
    out: dict[tuple[str, str], str] = {}
    for spec in specs:
        head, eq, name = spec.partition("=")
        record, colon, variant = head.partition(":")
        if not (eq and colon and record and variant and name):
            raise ValueError(f"--rename wants RECORD:VARIANT=NAME, got {spec!r}")
        out[(record, variant)] = name
    return out


def core_pair_summary(rows: list[dict[str, Any]], slope: float | None = None) -> list[dict[str, Any]]:
    """Per concurrency and variant: the boot pairs' TTFT ratio as measured and at equal core
    speed. How much of a pair's TTFT ratio follows its core ratio is one slope per concurrency,
    the least-squares fit of log TTFT ratio on log core ratio over every pair of that
    concurrency (all variants), or ``slope`` as given; a pair at equal core speed is
    ``log TTFT ratio - slope * log core ratio``. Each: the geometric mean with its 95% interval
    over the pairs (Student's t on the logs, as ``--merge``'s boot pairs; the slope's own
    uncertainty left out), the slope, and the correlation of the two logs over the concurrency's
    pairs (None with fewer than 3 pairs or no spread)."""
    by_c: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_c.setdefault(r["concurrency"], []).append(r)

    def geo(xs: list[float]) -> dict[str, Any]:
        mean = statistics.fmean(xs)
        if len(xs) < 2:
            return {"ratio": math.exp(mean), "ci95": None}
        half = serve.t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
        return {"ratio": math.exp(mean), "ci95": [math.exp(mean - half), math.exp(mean + half)]}

    out = []
    for c, group in sorted(by_c.items()):
        lx = [math.log(r["core_ratio"]) for r in group]
        ly = [math.log(r["ttft_ratio"]) for r in group]
        spread = len(group) >= 3 and len(set(lx)) > 1 and len(set(ly)) > 1
        fitted = statistics.linear_regression(lx, ly).slope if spread else 0.0
        b = fitted if slope is None else slope
        corr = statistics.correlation(lx, ly) if spread else None
        for variant in sorted({r["variant"] for r in group}):
            mine = [r for r in group if r["variant"] == variant]
            raw = [math.log(r["ttft_ratio"]) for r in mine]
            adj = [math.log(r["ttft_ratio"]) - b * math.log(r["core_ratio"]) for r in mine]
            out.append({"concurrency": c, "variant": variant, "pairs": len(mine), "slope": b,
                        "slope_given": slope is not None, "correlation": corr,
                        "measured": geo(raw), "equal_core": geo(adj),
                        "core_ratio": math.exp(statistics.fmean(math.log(r["core_ratio"]) for r in mine))})
    return out


def core_pair_table(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> str:
    """Markdown: each boot pair, then ``core_pair_summary`` per concurrency and variant."""
    def x(g: dict[str, Any]) -> str:
        ci = g["ci95"]
        return f"x{g['ratio']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else " (one pair)")

    out = ["Boot pairs by their cores (`--core-pairs`: TTFT p50 stock / other, above 1: the other side better; "
           "core: the two servers' median `core_us` over their one-request prefill launches, stock / other, "
           "above 1: the other side's core was the faster; launch CPU per core us: the two servers' median "
           "over those launches of CPU ms / `core_us`, other / stock, above 1: the other side's launch took more "
           "CPU per unit of core speed):", "",
           "| record | boot | conc | variant | TTFT p50 | core | launch CPU per core us |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {r['record']} | {r['boot']} | {r['concurrency']} | {r['variant']} | x{r['ttft_ratio']:.3f} | "
            f"x{r['core_ratio']:.3f} | "
            + ("-" if r.get("cpu_per_core_ratio") is None else f"x{r['cpu_per_core_ratio']:.3f}") + " |"
            for r in rows]
    by_cv: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        if r.get("cpu_per_core_ratio") is not None:
            by_cv.setdefault((r["concurrency"], r["variant"]), []).append(r["cpu_per_core_ratio"])
    if by_cv:
        out += ["", "Launch CPU per core us over the pairs (other / stock; the median pair, and how many pairs "
                "read above 1.01, within 1.01, below 0.99):", "",
                "| conc | variant | pairs | median pair | range | above / within / below |", "|---|---|---|---|---|---|"]
        for (c, v), xs in sorted(by_cv.items()):
            above, below = sum(x > 1.01 for x in xs), sum(x < 0.99 for x in xs)
            out.append(f"| {c} | {v} | {len(xs)} | x{statistics.median(xs):.3f} | x{min(xs):.3f} - x{max(xs):.3f} | "
                       f"{above} / {len(xs) - above - below} / {below} |")
    out += ["", "At equal core speed (each pair's log TTFT ratio less slope x its log core ratio; slope: fitted "
            "over every pair of the concurrency, or given with --slope; [95% interval over pairs], the slope's "
            "own uncertainty left out):", "",
            "| conc | variant | pairs | core, mean | slope | correlation | TTFT p50 as measured | at equal core speed |",
            "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        corr = "-" if s["correlation"] is None else f"{s['correlation']:.2f}"
        out.append(f"| {s['concurrency']} | {s['variant']} | {s['pairs']} | x{s['core_ratio']:.3f} | "
                   f"{s['slope']:.2f}{' (given)' if s['slope_given'] else ''} | {corr} | {x(s['measured'])} | "
                   f"{x(s['equal_core'])} |")
    return "\n".join(out)


def core_speed_table(rows: list[dict[str, Any]]) -> str:
    """``core_speed_rows`` per concurrency, stock beside each other variant with their ratios
    (this / stock: above 1, longer on this side)."""
    out = ["One-request prefill launches and the core's speed around them (`--core-speed`: the probe's "
           "`SMOKE_CORE_SPEED` readings; medians over launches; ratio: this side / stock, above 1 is longer "
           "here):", "",
           "| conc | variant | launches | launch ms | CPU ms | core us | driver us | CPU ms per core us | "
           "kernel launches us | GC ms per launch (mean) | launches with an older-generation GC |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    stock = {r["concurrency"]: r for r in rows if r["variant"] == "stock"}

    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        val, base = r[key], stock.get(r["concurrency"], {}).get(key)
        if val is None:
            return "-"
        text = format(val, fmt)
        return f"{text} (x{val / base:.3f})" if r["variant"] != "stock" and base else text

    for r in rows:
        out.append(f"| {r['concurrency']} | {r['variant']} | {r['launches']} | {cell(r, 'launch_ms', '.2f')} | "
                   f"{cell(r, 'cpu_ms', '.2f')} | {cell(r, 'core_us', '.1f')} | {cell(r, 'driver_us', '.1f')} | "
                   f"{cell(r, 'cpu_per_core', '.4f')} | {cell(r, 'kernel_us', '.1f')} | {cell(r, 'gc_ms', '.3f')} | "
                   f"{'-' if r['gc_old_share'] is None else format(r['gc_old_share'], '.0%')} |")
    return "\n".join(out)


#: The file name the plugin compiles an edited SGLang function under (``_engine.MARK``), and
#: what it stands for: the module, then the function's qualified name and a digest (the code's
#: own name is the bare function name: the edit is compiled at module level).
_EDITED_FILE = re.compile(r"^py <__sglang_futuremap_patch__ edit of (?:[\w.]+\.)?(\w+):(\S+) \w+>:.+$")
#: Census rows: the calls whose count per launch differs most, at most this many per variant.
CENSUS_TOP = 40


def census_name(key: str) -> str:
    """A census key (``sched_timeline.census_key``) with a function the plugin edited by text
    named as SGLang's own (its module's file), so the two sides' counts of it meet."""
    m = _EDITED_FILE.match(key)
    return f"py {m.group(1)}.py:{m.group(2)}" if m else key


def census_launches(by_run: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Each server run's census launches (``run`` events with ``census``, a run with
    ``SMOKE_CALL_CENSUS``), in launch order."""
    out = {}
    for name, events in by_run.items():
        launches = sorted((e for e in events if e["kind"] == "run" and "census" in e), key=lambda e: e["t"])
        if launches:
            out[name] = launches
    return out


def census_rows(pairs: list[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Per variant beside stock: the census launches of each boot's two servers of one record,
    matched prompt by prompt (each stock launch, in order, with the other side's first unmatched
    launch of the same token count: the same seeded prompts on both sides, whatever health
    checks came before them; launches without a partner are counted apart), and over the
    matches the calls per launch on each side (Python, C) and every call whose count differs, by
    how much per launch (this side less stock), largest first. The counts do not depend on the core's speed:
    a difference is code that ran on one side only, or more often."""
    acc: dict[str, dict[str, Any]] = {}
    for record, by_run in pairs:
        launches = census_launches(by_run)
        for run in record["runs"]:
            variant, boot = run["variant"], run["boot"]
            stock = launches.get(f"stock-boot{boot}")
            theirs = launches.get(f"{variant}-boot{boot}")
            if variant == "stock" or not stock or not theirs:
                continue
            a = acc.setdefault(variant, {"matched": 0, "unmatched": 0, "py": [0, 0], "c": [0, 0],
                                         "diff": collections.Counter(), "stock": collections.Counter(),
                                         "timed": 0, "ms_side": [collections.Counter(), collections.Counter()]})
            free = list(theirs)
            matched = []
            for s_ev in stock:
                t_ev = next((e for e in free if e.get("tokens") is not None and e.get("tokens") == s_ev.get("tokens")), None)
                if t_ev is not None:
                    free.remove(t_ev)
                    matched.append((s_ev, t_ev))
            a["unmatched"] += len(stock) + len(theirs) - 2 * len(matched)
            for s_ev, t_ev in matched:
                a["matched"] += 1
                counts = [collections.Counter(), collections.Counter()]
                for side, ev in enumerate((s_ev, t_ev)):
                    for key, n in ev["census"].items():
                        counts[side][census_name(key)] += n
                        a["py" if key.startswith("py ") else "c"][side] += n
                a["stock"].update(counts[0])
                for key in set(counts[0]) | set(counts[1]):
                    a["diff"][key] += counts[1][key] - counts[0][key]
                if "census_ms" in s_ev and "census_ms" in t_ev:
                    a["timed"] += 1
                    for side, ev in enumerate((s_ev, t_ev)):
                        for key, ms in ev["census_ms"].items():
                            a["ms_side"][side][census_name(key)] += ms
    rows = []
    for variant, a in sorted(acc.items()):
        n = a["matched"]
        if not n:
            rows.append({"variant": variant, "matched": 0, "unmatched": a["unmatched"]})
            continue
        differ = sorted(((k, d / n) for k, d in a["diff"].items() if d), key=lambda kv: (-abs(kv[1]), kv[0]))
        row = {"variant": variant, "matched": n, "unmatched": a["unmatched"],
               "py_calls": [a["py"][0] / n, a["py"][1] / n], "c_calls": [a["c"][0] / n, a["c"][1] / n],
               "differ": len(differ),
               "top": [{"call": k, "stock": a["stock"][k] / n, "difference": d} for k, d in differ[:CENSUS_TOP]]}
        m = a["timed"]
        if m:
            st, th = a["ms_side"]
            slower = sorted(((k, (th[k] - st[k]) / m) for k in set(st) | set(th)), key=lambda kv: (-abs(kv[1]), kv[0]))
            row.update({"timed": m, "c_ms": [sum(st.values()) / m, sum(th.values()) / m],
                        "top_ms": [{"call": k, "stock_ms": st[k] / m, "this_ms": th[k] / m, "difference_ms": d}
                                   for k, d in slower[:CENSUS_TOP]]})
        rows.append(row)
    return rows


def census_table(rows: list[dict[str, Any]]) -> str:
    """``census_rows`` as Markdown: the calls per launch on each side, then the calls whose
    count differs."""
    out = ["Calls inside the one-request prefill launches the probe counted (`--census`: a run with "
           "`SMOKE_CALL_CENSUS`; the two sides' launches matched by prompt, the same token count; "
           "per launch, mean over the matched launches; this side less stock):", "",
           "| variant | launch pairs matched (launches without a partner) | Python calls, stock -> this | C calls, stock -> this | calls whose count differs |",
           "|---|---|---|---|---|"]
    for r in rows:
        if not r["matched"]:
            out.append(f"| {r['variant']} | 0 ({r['unmatched']}) | - | - | - |")
            continue
        out.append(f"| {r['variant']} | {r['matched']} ({r['unmatched']}) | {r['py_calls'][0]:.1f} -> "
                   f"{r['py_calls'][1]:.1f} ({r['py_calls'][1] - r['py_calls'][0]:+.1f}) | {r['c_calls'][0]:.1f} -> "
                   f"{r['c_calls'][1]:.1f} ({r['c_calls'][1] - r['c_calls'][0]:+.1f}) | {r['differ']} |")
    for r in rows:
        if r.get("top"):
            out += ["", f"Stock -> {r['variant']}: the calls whose count per launch differs most "
                    f"(at most {CENSUS_TOP}; `py FILE:FUNCTION`, `c` a C function):", "",
                    "| call | stock per launch | difference per launch |", "|---|---|---|"]
            out += [f"| `{t['call']}` | {t['stock']:.1f} | {t['difference']:+.1f} |" for t in r["top"]]
    for r in rows:
        if r.get("timed"):
            ratio = r["c_ms"][1] / r["c_ms"][0] if r["c_ms"][0] else float("nan")
            out += ["", f"Stock -> {r['variant']}: time inside C calls per launch (a run with "
                    "`SMOKE_CALL_CENSUS_TIMES=1`; from call to return, inclusive, under the profiler, so longer "
                    f"than unprofiled on both sides; {r['timed']} launch pairs): {r['c_ms'][0]:.2f} -> "
                    f"{r['c_ms'][1]:.2f} ms (x{ratio:.3f}). The C functions whose time per launch differs most:", "",
                    "| C call | stock ms | this ms | difference ms |", "|---|---|---|---|"]
            out += [f"| `{t['call']}` | {t['stock_ms']:.3f} | {t['this_ms']:.3f} | {t['difference_ms']:+.3f} |"
                    for t in r["top_ms"]]
    return "\n".join(out)


def compile_rows(by_run: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per variant, kernel and first caller: the Triton JIT compiles of the scheduler's process
    (``compile`` events, timelines from 2026-11-26 on), how many servers had them, how many and
    how long in all, and the launches they fell in (``DECODE 4``: a decode ``run_batch`` of 4
    requests; ``between launches``: outside every ``run_batch``)."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for name, events in by_run.items():
        variant = name.rsplit("-boot", 1)[0]
        runs = [e for e in events if e["kind"] == "run"]
        starts = [e["t"] for e in runs]
        for c in (e for e in events if e["kind"] == "compile"):
            i = bisect.bisect_right(starts, c["t"]) - 1
            launch = (f"{runs[i]['mode']} {runs[i]['bs']}" if i >= 0 and c["t"] <= runs[i]["t1"]
                      else "between launches")
            where = (c.get("where") or ["?"])[0]
            g = groups.setdefault((variant, c.get("kernel", "?"), where),
                                  {"variant": variant, "kernel": c.get("kernel", "?"), "where": where,
                                   "servers": set(), "compiles": 0, "ms": 0.0, "launches": set()})
            g["servers"].add(name)
            g["compiles"] += 1
            g["ms"] += (c["t1"] - c["t"]) * 1000
            g["launches"].add(launch)
    return [{**g, "servers": len(g["servers"]), "ms": round(g["ms"], 1), "launches": sorted(g["launches"])}
            for g in sorted(groups.values(), key=lambda g: (g["variant"] != "stock", g["variant"], -g["ms"]))]


def compile_table(rows: list[dict[str, Any]]) -> str:
    head = ("| variant | kernel | launched from | servers | compiles | ms in all | in launches |\n"
            "|---|---|---|---|---|---|---|")
    return "\n".join([head, *(f"| {r['variant']} | {r['kernel']} | {r['where']} | {r['servers']} | {r['compiles']} | "
                               f"{r['ms']:.1f} | {', '.join(r['launches'])} |" for r in rows)])


# ----------------------------------------------------------------------------- --host-speed


def host_speed_rows(pairs: list[tuple[str, dict[str, Any], dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """One row per server and cell (measured window, as ``launch_split``) of every (label, record,
    timelines) pair: record label, variant, boot, concurrency, the cell's TTFT p50
    (``bench_serving``'s) and its host index ``host_ms``: the median scheduler-thread CPU time of
    the cell's prefill launches of 1-3 requests that compiled nothing (``launch_parts``; their
    launch time in timelines before 2026-11-26, which have no ``cpu_ms``: ``host_is_cpu`` says
    which). A prefill launch is SGLang's model code on both sides (the plugin adds its stash and
    publish), run on the host: its time is the host's speed. None without such a launch."""
    rows = []
    for label, record, by_run in pairs:
        for run, events, c, t_lo, t_hi in measured_windows(record, by_run):
            small = [(s, cpu) for bs, s, cpu in launch_parts(events, t_lo, t_hi)["prefill"] if bs <= 3]
            cpus = [cpu for _, cpu in small if cpu is not None]
            cell = run["cells"].get(str(c)) or run["cells"].get(c)
            rows.append({"record": label, "variant": run["variant"], "boot": run["boot"], "concurrency": c,
                         "ttft_p50_ms": cell["median_ttft_ms"], "prefills": len(small),
                         "host_ms": _ms(cpus) if cpus else _ms([s for s, _ in small]), "host_is_cpu": bool(cpus)})
    return rows


def host_speed_fits(rows: list[dict[str, Any]], variant: str = "patched") -> list[dict[str, Any]]:
    """Per concurrency with at least two cells with a host index on each side (stock and
    ``variant``) and two different indexes on one: the least-squares fit TTFT p50 = a_side + b x
    host index (one slope for both sides, each side its own intercept: a cell's TTFT follows its
    host's speed alike on both sides, and what is left is the side's own), its R^2 over both
    sides' cells, and each side's TTFT p50 from the fit at stock's median index
    (``at_stock_host_ms``); beside the cells' plain medians. Ratios are stock / variant (> 1:
    the variant is faster)."""
    out = []
    for c in sorted({r["concurrency"] for r in rows}):
        sides = {v: [(r["host_ms"], r["ttft_p50_ms"]) for r in rows
                     if r["concurrency"] == c and r["variant"] == v and r["host_ms"] is not None]
                 for v in ("stock", variant)}
        if min(len(cells) for cells in sides.values()) < 2:
            continue
        means = {v: (statistics.fmean(x for x, _ in cells), statistics.fmean(y for _, y in cells)) for v, cells in sides.items()}
        sxx = sum((x - means[v][0]) ** 2 for v, cells in sides.items() for x, _ in cells)
        if sxx == 0:
            continue
        b = sum((x - means[v][0]) * (y - means[v][1]) for v, cells in sides.items() for x, y in cells) / sxx
        a = {v: my - b * mx for v, (mx, my) in means.items()}
        ys = [y for cells in sides.values() for _, y in cells]
        sst = sum((y - statistics.fmean(ys)) ** 2 for y in ys)
        ssr = sum((y - a[v] - b * x) ** 2 for v, cells in sides.items() for x, y in cells)
        ref = statistics.median(x for x, _ in sides["stock"])
        at = {v: a[v] + b * ref for v in sides}
        raw = {v: statistics.median(y for _, y in cells) for v, cells in sides.items()}
        out.append({"concurrency": c, "variant": variant, "cells": {v: len(cells) for v, cells in sides.items()},
                    "host_ms": {v: round(statistics.median(x for x, _ in cells), 2) for v, cells in sides.items()},
                    "ttft_p50_ms": {v: round(y, 1) for v, y in raw.items()}, "ratio": round(raw["stock"] / raw[variant], 3),
                    "ms_ttft_per_host_ms": round(b, 2), "r2": round(1 - ssr / sst, 3) if sst else None,
                    "at_stock_host_ms": {v: round(y, 1) for v, y in at.items()},
                    "at_stock_host_ratio": round(at["stock"] / at[variant], 3)})
    return out


def host_speed_table(rows: list[dict[str, Any]], fits: list[dict[str, Any]]) -> str:
    """Every server's cells (host index, TTFT p50), then the fits."""
    cells = ["| concurrency | variant | record | boot | 1-3-request prefills | host index ms | TTFT p50 ms |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (*_side_order(r["concurrency"], r["variant"]), r["host_ms"] or 0)):
        index = "-" if r["host_ms"] is None else f"{r['host_ms']:.2f}" + ("" if r["host_is_cpu"] else " (wall)")
        cells.append(f"| {r['concurrency']} | {r['variant']} | {r['record']} | {r['boot']} | {r['prefills']} | {index} "
                     f"| {r['ttft_p50_ms']:.1f} |")
    fit_lines = ["| concurrency | cells (stock / other) | host index ms, median | TTFT p50 ms, median of cells "
                 "| slope (ms TTFT per host-index ms) | R^2 | TTFT p50 ms at stock's median host index |",
                 "|---|---|---|---|---|---|---|"]
    for f in fits:
        v = f["variant"]
        fit_lines.append(
            f"| {f['concurrency']} | {f['cells']['stock']} / {f['cells'][v]} | {f['host_ms']['stock']:.2f} -> "
            f"{f['host_ms'][v]:.2f} | {f['ttft_p50_ms']['stock']:.1f} -> {f['ttft_p50_ms'][v]:.1f} (x{f['ratio']:.3f}) "
            f"| {f['ms_ttft_per_host_ms']:.2f} | {'-' if f['r2'] is None else format(f['r2'], '.2f')} "
            f"| {f['at_stock_host_ms']['stock']:.1f} -> {f['at_stock_host_ms'][v]:.1f} (x{f['at_stock_host_ratio']:.3f}) |")
    return "\n".join(cells) + "\n\n" + "\n".join(fit_lines)


#: ``--host-speed --plot``: side colours (stock, the other variant).
HOST_SPEED_COLOURS = ("#1f77b4", "#ff7f0e")


def host_speed_svg(rows: list[dict[str, Any]], fits: list[dict[str, Any]], title: str) -> str:
    """One panel per fitted concurrency: every cell of both sides (host index ms -> TTFT p50 ms;
    stock blue, the other side orange) and each side's fitted line over the panel's index range
    (``host_speed_fits``), the dashed vertical at stock's median index where the two are read."""
    if not fits:
        return ""
    pw, ph, gap, left, top, bottom = 220, 200, 30, 44, 40, 40
    w = left + len(fits) * (pw + gap)
    h = top + ph + bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="16">{title}: TTFT p50 against the host index (1-3-request prefill launch, ms); '
           f'stock <tspan fill="{HOST_SPEED_COLOURS[0]}">blue</tspan>, {fits[0]["variant"]} '
           f'<tspan fill="{HOST_SPEED_COLOURS[1]}">orange</tspan></text>']
    for k, f in enumerate(fits):
        c, sides = f["concurrency"], ("stock", f["variant"])
        cells = [r for r in rows if r["concurrency"] == c and r["variant"] in sides and r["host_ms"] is not None]
        xs, ys = [r["host_ms"] for r in cells], [r["ttft_p50_ms"] for r in cells]
        x0, x1 = min(xs), max(xs)
        fitted = [f["at_stock_host_ms"][v] + f["ms_ttft_per_host_ms"] * (x - f["host_ms"]["stock"])
                  for v in sides for x in (x0, x1)]
        y0, y1 = min(ys + fitted), max(ys + fitted)
        x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
        ox = left + k * (pw + gap)
        px = lambda v: ox + pw * (v - x0) / (x1 - x0)  # noqa: E731
        py = lambda v: top + ph * (y1 - v) / (y1 - y0)  # noqa: E731
        out.append(f'<rect x="{ox}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        out.append(f'<text x="{ox + pw / 2:.0f}" y="{top - 6}" text-anchor="middle">concurrency {c}: '
                   f'x{f["at_stock_host_ratio"]:.3f} at equal host speed</text>')
        out.append(f'<text x="{ox}" y="{top + ph + 14}">{x0:.1f}</text>'
                   f'<text x="{ox + pw}" y="{top + ph + 14}" text-anchor="end">{x1:.1f} ms</text>')
        out.append(f'<text x="{ox - 4}" y="{top + 10}" text-anchor="end">{y1:.0f}</text>'
                   f'<text x="{ox - 4}" y="{top + ph}" text-anchor="end">{y0:.0f}</text>')
        ref = f["host_ms"]["stock"]
        out.append(f'<line x1="{px(ref):.1f}" x2="{px(ref):.1f}" y1="{top}" y2="{top + ph}" stroke="#999" '
                   'stroke-dasharray="4 3"/>')
        for v, colour in zip(sides, HOST_SPEED_COLOURS):
            at, b = f["at_stock_host_ms"][v], f["ms_ttft_per_host_ms"]
            out.append(f'<line data-side="{v}" data-concurrency="{c}" x1="{px(x0):.1f}" y1="{py(at + b * (x0 - ref)):.1f}" '
                       f'x2="{px(x1):.1f}" y2="{py(at + b * (x1 - ref)):.1f}" stroke="{colour}" stroke-width="1.5"/>')
            for r in cells:
                if r["variant"] == v:
                    out.append(f'<circle data-side="{v}" data-concurrency="{c}" cx="{px(r["host_ms"]):.1f}" '
                               f'cy="{py(r["ttft_p50_ms"]):.1f}" r="3.5" fill="{colour}"/>')
    out.append(f'<text x="{left}" y="{h - 6}">host index: the scheduler thread\'s CPU time per 1-3-request prefill '
               'launch; lines: one slope, each side its own intercept (serve_prefill_batches.py --host-speed)</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


# ----------------------------------------------------------------------------- --host-states


#: A one-request prefill launch ran in its server's slow host state when its scheduler-thread CPU
#: time is over this many times the server's fast level (the median of its ``FAST_LAUNCHES``
#: quickest: a server may spend most of a boot in the slow state): on the GPU machines a
#: server's host speed moved in steps of 1.5-2x within a boot, each server on its own
#: (2026-11-27), so the two states lie well apart.
SLOW_FACTOR = 1.3
FAST_LAUNCHES = 3


def ran_slow(cpu_ms: float, fast_ms: float) -> bool:
    """Whether a launch of ``cpu_ms`` ran in the slow state of a server whose fast level is ``fast_ms``."""
    return cpu_ms > SLOW_FACTOR * fast_ms


def host_state_rows(pairs: list[tuple[str, dict[str, Any], dict[str, list[dict[str, Any]]]]]
                    ) -> dict[str, list[dict[str, Any]]]:
    """The host state of every server run with ``cpu_ms`` timelines in ``pairs`` (label, record,
    timelines). ``servers``: one row per run (record label, variant, boot): its one-request
    prefill launches that compiled nothing (warm-ups included), their fast level (the median CPU
    time of the ``FAST_LAUNCHES`` quickest, ms) and the share of them over ``SLOW_FACTOR`` times it.
    ``requests``: one row per measured request launched in such a prefill, with the API server's
    timestamps: concurrency, variant, whether its prefill ran slow, its API TTFT (received ->
    first output, ms). A one-request prefill is the same SGLang model code on both sides (the
    plugin adds its stash and publish), so its CPU time tells the host's speed, and requests
    in the same state compare the code at equal host speed."""
    servers, requests = [], []
    for label, record, by_run in pairs:
        for run, events, cells in split_cells(record, by_run):
            compiled = _compile_check(events)
            solo = {}
            for e in events:
                if (e["kind"] == "run" and e["extend"] and e["bs"] == 1 and e.get("cpu_ms") is not None
                        and e.get("rids") and not compiled(e)):
                    solo.setdefault(e["rids"][0], e)
            if not solo:
                continue
            cpu = [e["cpu_ms"] for e in solo.values()]
            fast = statistics.median(sorted(cpu)[:FAST_LAUNCHES])
            row = {"record": label, "variant": run["variant"], "boot": run["boot"], "launches": len(cpu),
                   "fast_ms": round(fast, 2), "slow_share": round(sum(ran_slow(x, fast) for x in cpu) / len(cpu), 3)}
            row.update(where_slow(list(solo.values()), fast, record["environment"].get("cpu_cores")))
            # The boot's first cell (its warm-up included) against the later ones.
            second = next(((w or m)[0]["t"] for _, w, m in cells[1:] if w or m), float("inf"))
            for key, pick in (("first_cell_slow_share", lambda t: t < second), ("later_slow_share", lambda t: t >= second)):
                part = [e["cpu_ms"] for e in solo.values() if pick(e["t"])]
                row[key] = round(sum(ran_slow(x, fast) for x in part) / len(part), 3) if part else None
            servers.append(row)
            api = {e["rid"]: e for e in events if e["kind"] == "api"}
            for c, _, arrivals in cells:
                for e in arrivals:
                    rid = e["rid"]
                    if rid in solo and rid in api and api[rid].get("first") is not None:
                        requests.append({"concurrency": int(c), "variant": run["variant"],
                                         "slow": ran_slow(solo[rid]["cpu_ms"], fast),
                                         "ttft_ms": (api[rid]["first"] - api[rid]["received"]) * 1e3})
    return {"servers": servers, "requests": requests}


def where_slow(launches: list[dict[str, Any]], fast_ms: float, cpu_cores: list[list[int]] | None) -> dict[str, Any]:
    """Where one server's one-request prefill ``launches`` ran (timelines from 2026-11-27 on:
    ``core``, ``preempted``; ``{}`` without them). ``cores``: per physical core (named by its
    CPUs, from the record's ``cpu_cores``; a CPU of its own without it) the launches that ended
    there and how many ran slow; ``preempted``: the share of slow and of fast launches the OS
    preempted at least once (None where there are none of that state)."""
    out: dict[str, Any] = {}
    core_of = {cpu: ",".join(map(str, core)) for core in cpu_cores or () for cpu in core}
    placed = [e for e in launches if e.get("core") is not None]
    if placed:
        cores: dict[str, list[int]] = {}
        for e in placed:
            n = cores.setdefault(core_of.get(e["core"], str(e["core"])), [0, 0])
            n[0] += 1
            n[1] += ran_slow(e["cpu_ms"], fast_ms)
        out["cores"] = dict(sorted(cores.items(), key=lambda kv: -kv[1][0]))
    counted = [e for e in launches if e.get("preempted") is not None]
    if counted:
        shares = []
        for slow in (True, False):
            mine = [e for e in counted if ran_slow(e["cpu_ms"], fast_ms) == slow]
            shares.append(round(sum(e["preempted"] > 0 for e in mine) / len(mine), 3) if mine else None)
        out["preempted"] = shares
    return out


def host_state_summary(rows: dict[str, list[dict[str, Any]]], variant: str = "patched",
                       base: str = "stock") -> dict[str, list[dict[str, Any]]]:
    """``rows`` (``host_state_rows``) pooled. ``variants``: per variant, its servers, the median
    of their fast levels and their slow shares (mean, min, max): does one side run slow more
    often? ``cells``: per concurrency where both ``base`` (stock unless told; patched for a
    record of the plugin against one of its switches) and ``variant`` have requests, per side
    the requests, the share of them whose prefill ran slow, and the TTFT p50 of all of them, of
    the fast-state ones and of the slow-state ones; ``ratio_*`` base / variant (> 1: the
    variant is faster), None where a side has no request in that state."""
    variants = []
    for v in sorted({s["variant"] for s in rows["servers"]}, key=lambda v: (v != "stock", v)):
        mine = [s for s in rows["servers"] if s["variant"] == v]
        shares = [s["slow_share"] for s in mine]
        by_place = {key: [s[key] for s in mine if s.get(key) is not None] for key in ("first_cell_slow_share", "later_slow_share")}
        variants.append({"variant": v, "servers": len(mine), "launches": sum(s["launches"] for s in mine),
                         "fast_ms": round(statistics.median(s["fast_ms"] for s in mine), 2),
                         "slow_share": [round(statistics.fmean(shares), 3), min(shares), max(shares)],
                         **{key: round(statistics.fmean(x), 3) if x else None for key, x in by_place.items()}})
    cells = []
    for c in sorted({r["concurrency"] for r in rows["requests"]}):
        side = {v: [r for r in rows["requests"] if r["concurrency"] == c and r["variant"] == v] for v in (base, variant)}
        if not all(side.values()):
            continue
        row: dict[str, Any] = {"concurrency": c, "variant": variant, "base": base,
                               "requests": [len(side[base]), len(side[variant])],
                               "slow_share": [round(sum(r["slow"] for r in x) / len(x), 3) for x in side.values()]}
        for key, pick in (("all", lambda r: True), ("fast", lambda r: not r["slow"]), ("slow", lambda r: r["slow"])):
            p50 = [records.quantile(t, 0.5) if t else None
                   for t in ([r["ttft_ms"] for r in x if pick(r)] for x in side.values())]
            row[f"p50_{key}_ms"] = [None if x is None else round(x, 1) for x in p50]
            row[f"ratio_{key}"] = round(p50[0] / p50[1], 3) if None not in p50 else None
        cells.append(row)
    return {"variants": variants, "cells": cells}


def host_state_table(summary: dict[str, list[dict[str, Any]]], rows: dict[str, list[dict[str, Any]]]) -> str:
    """Each server's host state, then per variant, then per concurrency TTFT by state."""
    lines = ["| variant | record | boot | one-request prefills | fast level ms | slow share "
             "| physical cores they ended on: launches (slow) | preempted at least once: slow / fast |",
             "|---|---|---|---|---|---|---|---|"]

    def share(x: float | None) -> str:
        return "-" if x is None else f"{x * 100:.0f}%"
    for s in sorted(rows["servers"], key=lambda s: (s["variant"] != "stock", s["variant"], s["record"], s["boot"])):
        cores = "; ".join(f"{c}: {n} ({k})" for c, (n, k) in s["cores"].items()) if "cores" in s else "-"
        pre = " / ".join(share(x) for x in s["preempted"]) if "preempted" in s else "-"
        lines.append(f"| {s['variant']} | {s['record']} | {s['boot']} | {s['launches']} | {s['fast_ms']:.2f} "
                     f"| {s['slow_share'] * 100:.0f}% | {cores} | {pre} |")
    lines += ["", "| variant | servers | one-request prefills | fast level ms, median | slow share: mean (min - max) "
              "| slow share in the first cell of a boot / in the later ones (mean over servers) |",
              "|---|---|---|---|---|---|"]
    for v in summary["variants"]:
        mean, lo, hi = v["slow_share"]
        lines.append(f"| {v['variant']} | {v['servers']} | {v['launches']} | {v['fast_ms']:.2f} "
                     f"| {mean * 100:.0f}% ({lo * 100:.0f} - {hi * 100:.0f}%) "
                     f"| {share(v['first_cell_slow_share'])} / {share(v['later_slow_share'])} |")
    v = summary["cells"][0]["variant"] if summary["cells"] else "patched"
    b = summary["cells"][0].get("base", "stock") if summary["cells"] else "stock"
    lines += ["", f"| conc | requests in one-request prefills ({b} / {v}) | slow share | TTFT p50 ms, all "
              "| fast state | slow state |", "|---|---|---|---|---|---|"]

    def pair(r: dict[str, Any], key: str) -> str:
        a, b = r[f"p50_{key}_ms"]
        if a is None or b is None:
            return f"{_cell(a)} -> {_cell(b)}"
        return f"{a:.1f} -> {b:.1f} (x{r[f'ratio_{key}']:.3f})"
    for r in summary["cells"]:
        ns, nv = r["requests"]
        ss, sv = r["slow_share"]
        lines.append(f"| {r['concurrency']} | {ns} / {nv} | {ss * 100:.0f}% -> {sv * 100:.0f}% | {pair(r, 'all')} "
                     f"| {pair(r, 'fast')} | {pair(r, 'slow')} |")
    return "\n".join(lines)


#: Client sends less than this apart, one after the other, form one wave: a closed loop sends a
#: new request as each one finishes, and requests that finish together are re-sent in a chain.
WAVE_GAP_S = 0.005


def intake_rows(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per run and cell: how the API server took in the measured requests.

    The client's sends (``client_requests``' start stamps) fall into waves, each send less than
    ``WAVE_GAP_S`` after the one before. The API server's one event loop takes a wave in request
    by request while it also sends the outputs of the requests it serves, so a request's way
    from the client's call to the API server's receipt (``api`` events, paired with the calls by
    ``gpu_serve_bench.client_api_pairs``) grows with the loop's other work. Rows:
    concurrency, variant, boot, requests; the large waves (at least half the concurrency) and
    the share of requests in them; within them, the median gap between consecutive receipts
    (``spacing_ms``) and the mean number of first outputs the API server sent between a wave's
    first and last receipt (``firsts_during_intake``: the wave's own early requests, served
    before its last one was taken in); the client-to-API median."""
    rows = []
    for run, events, c, lo, hi in measured_windows(record, by_run):
        cell = run["cells"].get(str(c)) or run["cells"].get(c) or {}
        n = cell.get("completed") or 0
        pairs = serve.client_api_pairs(cell.get("client_requests") or [], events, float("-inf"), hi, n)
        if n <= 1 or pairs is None:
            continue
        sent, api = [r for r, _ in pairs], [a for _, a in pairs]
        gaps = [a["received"] - r[0] for r, a in pairs]
        waves, cur = [], [0]
        for i in range(1, n):
            if sent[i][0] - sent[i - 1][0] < WAVE_GAP_S:
                cur.append(i)
            else:
                waves.append(cur)
                cur = [i]
        waves.append(cur)
        large = [b for b in waves if 2 * len(b) >= c and len(b) > 1]
        spacing = [api[i]["received"] - api[i - 1]["received"] for b in large for i in b[1:]]
        firsts = sorted(e["first"] for e in events if e["kind"] == "api" and e.get("first") is not None)
        during = [bisect.bisect_left(firsts, api[b[-1]]["received"])
                  - bisect.bisect_right(firsts, api[b[0]]["received"]) for b in large]
        rows.append({"concurrency": c, "variant": run["variant"], "boot": run["boot"], "requests": n,
                     "large_waves": len(large),
                     "in_large_waves": round(sum(len(b) for b in large) / n, 3),
                     "spacing_ms": _ms(spacing),
                     "firsts_during_intake": round(statistics.mean(during), 1) if during else None,
                     "client_to_api_p50_ms": round(statistics.median(gaps) * 1e3, 2)})
    return rows


def intake_table(rows: list[dict[str, Any]]) -> str:
    """Per concurrency, every run's row, stock first."""
    lines = ["The API server's intake of the measured requests (`--intake`): client sends less than "
             f"{WAVE_GAP_S * 1e3:g} ms apart, one after the other, form a wave; large: at least half the concurrency; "
             "spacing: median gap between the API server's receipts within a large wave; first outputs: "
             "requests the API server sent a first output for while taking a large wave in (mean per wave); "
             "client -> API: the client's call to the API server's receipt, median.", "",
             "| conc | variant | boot | requests | large waves | requests in them | spacing ms | "
             "first outputs during the intake | client -> API p50 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: _side_order(r["concurrency"], r["variant"]) + (r["boot"],)):
        firsts = "-" if r["firsts_during_intake"] is None else f"{r['firsts_during_intake']:.1f}"
        lines.append(f"| {r['concurrency']} | {r['variant']} | {r['boot']} | {r['requests']} | {r['large_waves']} | "
                     f"{r['in_large_waves']:.0%} | {_cell(r['spacing_ms'])} | {firsts} | "
                     f"{r['client_to_api_p50_ms']:.1f} |")
    return "\n".join(lines)


#: Where the scheduler thread was when the API server sent it a request (``poll_state``), in table order.
POLL_STATES = ("decode launch", "prefill launch", "decode result", "prefill result", "host wait", "loop")


def poll_state(at: float, spans: list[dict[str, Any]], starts: list[float], wait_starts: list[float],
               wait_reach: list[float]) -> str:
    """The scheduler thread's state at time ``at``: inside a ``run`` (a decode or prefill launch)
    or a ``proc`` (a decode or prefill result processed; ``spans``, both kinds sorted by start,
    ``starts`` their starts: one thread, so they do not overlap), else in a host wait outside
    them (a ``sync`` event, which may nest in another: ``wait_starts`` sorted, ``wait_reach[k]``
    the latest end of the first k + 1; stock's ``maybe_wait_verify_done`` sits between its
    launches), else ``loop``: the rest of the overlap loop (its poll, the next batch built)."""
    i = bisect.bisect_right(starts, at) - 1
    if i >= 0 and at < spans[i]["t1"]:
        e = spans[i]
        return ("prefill " if e["extend"] else "decode ") + ("launch" if e["kind"] == "run" else "result")
    j = bisect.bisect_right(wait_starts, at) - 1
    return "host wait" if j >= 0 and at < wait_reach[j] else "loop"


def poll_wait_rows(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per cell of each run with a timeline: each measured request's wait for the scheduler's
    poll (the API server sent it, ``api`` event's ``dispatch`` -> the scheduler received it,
    ``recv``) and the scheduler thread's state when it was sent (``poll_state``). The overlap loop
    polls once per iteration, so a request waits for whatever the thread is doing when it comes,
    and for the rest of the iteration after it. Rows: concurrency, variant, boot and per request
    ``(state, wait in seconds)``; requests without a ``dispatch`` stamp are left out."""
    rows = []
    for run, events, cells in split_cells(record, by_run):
        api = {e["rid"]: e for e in events if e["kind"] == "api" and e.get("dispatch") is not None}
        spans = sorted((e for e in events if e["kind"] in ("run", "proc") and "t1" in e), key=lambda e: e["t"])
        waits = sorted((e for e in events if e["kind"] == "sync"), key=lambda e: e["t"])
        starts, wait_starts = [e["t"] for e in spans], [e["t"] for e in waits]
        wait_reach = list(itertools.accumulate((e["t1"] for e in waits), max))
        for c, _, measured in cells:
            got = [(poll_state(api[r["rid"]]["dispatch"], spans, starts, wait_starts, wait_reach),
                    r["t"] - api[r["rid"]]["dispatch"]) for r in measured if r["rid"] in api]
            if got:
                rows.append({"concurrency": int(c), "variant": run["variant"], "boot": run["boot"], "requests": got})
    return rows


def poll_wait_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency and variant, every boot's requests pooled: how many, the wait's p50 and
    mean (ms), and per state (``POLL_STATES``) the share of requests sent in it, their mean wait
    and what that adds to the mean wait (share x mean)."""
    pooled: dict[tuple[int, str], tuple[list[int], list[tuple[str, float]]]] = {}
    for r in rows:
        boots, got = pooled.setdefault((r["concurrency"], r["variant"]), ([], []))
        boots.append(r["boot"])
        got.extend(r["requests"])
    out = []
    for (c, v), (boots, got) in sorted(pooled.items(), key=lambda kv: _side_order(*kv[0])):
        waits = [w for _, w in got]
        states = {}
        for state in POLL_STATES:
            ws = [w for s, w in got if s == state]
            if ws:
                states[state] = {"share": round(len(ws) / len(got), 3), "mean_ms": round(statistics.mean(ws) * 1e3, 2),
                                 "adds_ms": round(sum(ws) / len(got) * 1e3, 2)}
        out.append({"concurrency": c, "variant": v, "boots": sorted(boots), "requests": len(got),
                    "wait_p50_ms": round(records.quantile(waits, 0.5) * 1e3, 2),
                    "wait_mean_ms": round(statistics.mean(waits) * 1e3, 2), "states": states})
    return out


def poll_wait_table(rows: list[dict[str, Any]]) -> str:
    """Per concurrency, stock first: the wait and, per state, share / mean wait / what it adds."""
    lines = ["How long each measured request waited for the scheduler's poll (`--poll-wait`; the API server "
             "sent it -> the scheduler received it), by what the scheduler thread was doing when it was sent; "
             "every boot pooled. Per state: share of requests, their mean wait ms, what they add to the mean ms.", "",
             "| conc | variant | requests | wait p50 ms | wait mean ms | " + " | ".join(POLL_STATES) + " |",
             "|" + "---|" * (5 + len(POLL_STATES))]
    for r in rows:
        cells = [f"{r['states'][s]['share']:.0%} / {r['states'][s]['mean_ms']:.2f} / {r['states'][s]['adds_ms']:.2f}"
                 if s in r["states"] else "-" for s in POLL_STATES]
        lines.append(f"| {r['concurrency']} | {r['variant']} | {r['requests']} | {r['wait_p50_ms']:.2f} | "
                     f"{r['wait_mean_ms']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def wave_rows(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per cell of each run with a timeline: how the scheduler split each returning wave of
    measured requests into prefills. A wave is a run of prefill launches (``run`` events with
    ``rids``) holding measured requests with no decode launch between them. Per wave: the
    prefills' sizes, the first launch's length (ms), the API server's receipt of the wave's first
    request -> the scheduler's receipt of the second prefill's first request (``second_poll_ms``:
    the poll that closed the second group; None for a wave of one prefill) and the wave's TTFT
    p50 (ms, the API server's receipt -> its first output). Rows: concurrency, variant, boot,
    waves."""
    rows = []
    for run, events, cells in split_cells(record, by_run):
        api = {e["rid"]: e for e in events if e["kind"] == "api" and e.get("first") is not None}
        got = {e["rid"]: e["t"] for e in events if e["kind"] == "recv"}
        launches = [e for e in events if e["kind"] == "run"]
        for c, _, measured in cells:
            rids = {e["rid"] for e in measured}
            waves, cur = [], []
            for e in launches:
                if e["extend"] and rids.intersection(e.get("rids") or ()):
                    cur.append(e)
                elif not e["extend"] and cur:
                    waves.append(cur)
                    cur = []
            if cur:
                waves.append(cur)
            out = []
            for w in waves:
                ids = [r for e in w for r in e["rids"] if r in api and r in rids]
                if not ids:
                    continue
                first_in = min(api[r]["received"] for r in ids)
                second = w[1]["rids"][0] if len(w) > 1 and w[1]["rids"] else None
                out.append({"sizes": [e["bs"] for e in w],
                            "first_launch_ms": round((w[0]["t1"] - w[0]["t"]) * 1e3, 2),
                            "second_poll_ms": round((got[second] - first_in) * 1e3, 2) if second in got else None,
                            "ttft_p50_ms": round(statistics.median(
                                (api[r]["first"] - api[r]["received"]) * 1e3 for r in ids), 1)})
            if out:
                rows.append({"concurrency": int(c), "variant": run["variant"], "boot": run["boot"], "waves": out})
    return rows


def wave_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency and variant, every boot pooled, over the waves that began with one request
    prefilled alone and went on in more prefills (a returning wave: its first request finds the
    scheduler idle): how many there were of all waves, the share whose rest went in one prefill,
    the means of the solo launch, of the poll that closed the second group and of that group's
    size, and the mean TTFT p50 of those waves and of every wave."""
    pooled: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        pooled.setdefault((r["concurrency"], r["variant"]), []).extend(r["waves"])
    out = []
    for (c, v), waves in sorted(pooled.items(), key=lambda kv: _side_order(*kv[0])):
        solo = [w for w in waves if w["sizes"][0] == 1 and len(w["sizes"]) > 1 and w["second_poll_ms"] is not None]
        mean = lambda key, ws: round(statistics.mean(w[key] for w in ws), 2) if ws else None  # noqa: E731
        out.append({"concurrency": c, "variant": v, "waves": len(waves), "solo_first": len(solo),
                    "rest_in_one": round(sum(len(w["sizes"]) == 2 for w in solo) / len(solo), 3) if solo else None,
                    "solo_launch_ms": mean("first_launch_ms", solo),
                    "second_poll_ms": mean("second_poll_ms", solo),
                    "second_size": round(statistics.mean(w["sizes"][1] for w in solo), 2) if solo else None,
                    "solo_first_ttft_p50_ms": mean("ttft_p50_ms", solo),
                    "ttft_p50_ms": mean("ttft_p50_ms", waves)})
    return out


def wave_table(rows: list[dict[str, Any]]) -> str:
    """Per concurrency, stock first."""
    lines = ["How the scheduler split each returning wave of requests into prefills (`--waves`; a wave: prefill "
             "launches with no decode between them). Waves that open with one request prefilled alone: how many, "
             "the share whose rest went in one prefill, the solo launch, the API server's receipt of the wave's "
             "first request -> the poll that closed the second prefill, that prefill's size, their TTFT p50 (mean "
             "over waves); last, the TTFT p50 of every wave. Every boot pooled; ms.", "",
             "| conc | variant | waves | opened solo | rest in one prefill | solo launch | first receipt -> "
             "second poll | second prefill (requests) | TTFT p50 of those | TTFT p50, every wave |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = "-" if r["rest_in_one"] is None else f"{r['rest_in_one']:.0%}"
        size = "-" if r["second_size"] is None else f"{r['second_size']:.1f}"
        lines.append(f"| {r['concurrency']} | {r['variant']} | {r['waves']} | {r['solo_first']} | {share} | "
                     f"{_cell(r['solo_launch_ms'])} | {_cell(r['second_poll_ms'])} | {size} | "
                     f"{_cell(r['solo_first_ttft_p50_ms'])} | {_cell(r['ttft_p50_ms'])} |")
    return "\n".join(lines)


#: Tokens whose arrival ``--token-times`` reports besides the first, the first decode output and the last.
TOKEN_MARKS = (64,)


def request_token_times(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """Per successful request of a ``bench_serving`` result (``--output-details``): seconds from its
    send to its first token (``first``), to its first decode output (``decode``: the end of its
    first run of equal gaps; ``bench_serving`` spreads an output of several tokens evenly over
    them), to each of ``TOKEN_MARKS`` it reached and to its last token, its gaps and its gaps
    after the first output's (``later_itls``)."""
    out = []
    errors = bench.get("errors") or [""] * len(bench.get("ttfts") or [])
    for ttft, itls, err in zip(bench.get("ttfts") or [], bench.get("itls") or [], errors):
        if err or not ttft or not itls:
            continue
        k = 1
        while k < len(itls) and itls[k] == itls[0]:
            k += 1
        row = {"first": ttft, "decode": ttft + sum(itls[:k]), "last": ttft + sum(itls), "itls": list(itls),
               "later_itls": list(itls[k:])}
        for mark in TOKEN_MARKS:
            if len(itls) >= mark - 1:
                row[f"token{mark}"] = ttft + sum(itls[:mark - 1])
        out.append(row)
    return out


def _pct(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (seconds) in ms (``records.quantile``: numpy's linear
    percentile, as ``bench_serving`` reports its own); None when empty."""
    return round(records.quantile(values, q) * 1e3, 2) if values else None


def token_time_rows(pairs: list[tuple[dict[str, Any], dict[tuple[str, int, int], dict[str, Any]]]],
                    variant: str = "patched") -> list[dict[str, Any]]:
    """Per concurrency with requests on both sides, stock and ``variant`` pooled over every run of
    every record (``(record, gpu_serve_bench.bench_results)`` pairs; a record's run without its
    bench file is left out): requests, then p50 and p99 of each token time of
    ``request_token_times``, ITL p99 over every gap and over the later gaps."""
    pooled: dict[tuple[int, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for record, files in pairs:
        for run in record["runs"]:
            if run["variant"] not in ("stock", variant):
                continue
            for c in run["cells"]:
                bench = files.get((run["variant"], run["boot"], int(c)))
                if bench is not None:
                    pooled[(int(c), run["variant"])].extend(request_token_times(bench))
    rows = []
    for c in sorted({c for c, _ in pooled}):
        if not (pooled.get((c, "stock")) and pooled.get((c, variant))):
            continue
        for side in ("stock", variant):
            reqs = pooled[(c, side)]
            row: dict[str, Any] = {"concurrency": c, "variant": side, "requests": len(reqs)}
            for key in ("first", "decode", *(f"token{m}" for m in TOKEN_MARKS), "last"):
                vals = [r[key] for r in reqs if key in r]
                row[f"{key}_p50_ms"], row[f"{key}_p99_ms"] = _pct(vals, 0.5), _pct(vals, 0.99)
            row["itl_p99_ms"] = _pct([x for r in reqs for x in r["itls"]], 0.99)
            row["later_itl_p99_ms"] = _pct([x for r in reqs for x in r["later_itls"]], 0.99)
            rows.append(row)
    return rows


def token_time_table(rows: list[dict[str, Any]]) -> str:
    """Per concurrency, stock -> the other side, each figure with how much better it is (> 1 better)."""
    keys = [("first", "first token"), ("decode", "first decode output"),
            *((f"token{m}", f"token {m}") for m in TOKEN_MARKS), ("last", "last token")]
    head = ["conc", "requests"] + [f"{name} {q}" for _, name in keys for q in ("p50", "p99")] + [
        "ITL p99", "ITL p99 after the first output's gaps"]
    lines = ["When each request's tokens reached the client (`--token-times`; ms from its send, every "
             "request of every boot pooled; stock -> patched, x: how much better, > 1 better):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(a: float | None, b: float | None) -> str:
        if a is None or b is None:
            return "-"
        return f"{a:.1f} -> {b:.1f} (x{a / b:.3f})" if b else f"{a:.1f} -> {b:.1f}"

    by_c: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        by_c[r["concurrency"]].append(r)
    for c, (st, pa) in sorted((c, sorted(rs, key=lambda r: _side_order(c, r["variant"]))) for c, rs in by_c.items()):
        cells = [str(c), f"{st['requests']} / {pa['requests']}"]
        cells += [cell(st[f"{k}_{q}_ms"], pa[f"{k}_{q}_ms"]) for k, _ in keys for q in ("p50", "p99")]
        cells += [cell(st["itl_p99_ms"], pa["itl_p99_ms"]), cell(st["later_itl_p99_ms"], pa["later_itl_p99_ms"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pairs", nargs="+", type=Path, metavar="RECORD LOGS",
                   help="serve-bench.json of a --timeline run and its serve-logs.tar.gz; several pairs are pooled")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument("--launches", action="store_true",
                   help="instead: per concurrency and variant, how long decode and prefill launches hold the scheduler thread")
    p.add_argument("--stalls", action="store_true",
                   help="instead: the API server's event-loop stalls per cell, and TTFT with and without the requests they hit; "
                        "then per server the requests its API server had received at each full collection")
    p.add_argument("--strata", action="store_true",
                   help="instead: the API server's TTFT per request by the size of its shared prefill, both sides at equal sizes")
    p.add_argument("--frames", action="store_true",
                   help="instead: where sampled steady decode launches spend their host time, by leaf frame, stock beside each variant")
    p.add_argument("--functions", action="store_true",
                   help="instead: where sampled steady decode launches spend their host time, by function on the "
                        "stack (inclusive), every cell pooled, stock beside each variant")
    p.add_argument("--ftimes", action="store_true",
                   help="instead: exact host time per steady decode iteration of the functions the probe timed "
                        "(SMOKE_TIME_FUNCS), per concurrency, stock beside each variant")
    p.add_argument("--prefill", action="store_true",
                   help="with --ftimes: per one-request prefill launch instead of per steady decode iteration "
                        "(a run with SMOKE_TIME_FUNCS=prefill)")
    p.add_argument("--core-speed", action="store_true",
                   help="instead: per concurrency and variant, the one-request prefill launches beside the core's "
                        "speed around them (a run with SMOKE_CORE_SPEED=1): a slower core, or a longer launch?")
    p.add_argument("--core-pairs", action="store_true",
                   help="instead: each boot pair's TTFT p50 ratio beside the ratio of its two servers' core speeds "
                        "(a run with SMOKE_CORE_SPEED=1), and per concurrency and variant the pairs' TTFT ratio "
                        "as measured and at equal core speed")
    p.add_argument("--census", action="store_true",
                   help="instead: the calls inside the one-request prefill launches the probe counted (a run with "
                        "SMOKE_CALL_CENSUS=N), the two sides' launches matched by prompt (token count), and the calls whose "
                        "count differs")
    p.add_argument("--slope", type=float,
                   help="with --core-pairs: how much of a pair's log TTFT ratio follows its log core ratio "
                        "(default: fitted over the pairs of each concurrency)")
    p.add_argument("--join", action="store_true",
                   help="the records are one run of one machine in consecutive calls (a later call finishing a boot "
                        "that --budget cut off): read them as one record, a boot's servers paired across them "
                        "(gpu_serve_bench.py --merge --join)")
    p.add_argument("--rename", action="append", default=[], metavar="RECORD:VARIANT=NAME",
                   help="with --core-pairs: count the pairs of VARIANT in the record whose folder is RECORD as NAME "
                        "(repeatable; records whose servers ran the same code under different variant names pool)")
    p.add_argument("--compiles", action="store_true",
                   help="instead: the Triton JIT compiles in the scheduler's process, per variant, kernel and caller")
    p.add_argument("--host-speed", action="store_true",
                   help="instead: each server's cells by its host's speed (its small prefill launches' CPU time) beside "
                        "their TTFT, and per concurrency both sides compared at the same host speed")
    p.add_argument("--host-states", action="store_true",
                   help="instead: each server's fast and slow host states (its one-request prefill launches' CPU "
                        "time), per side how often it ran slow, and per concurrency TTFT at equal host state")
    p.add_argument("--intake", action="store_true",
                   help="instead: how the API server took in each cell's requests: the client's send waves, the "
                        "API server's time per request within a wave, the client-to-API median")
    p.add_argument("--token-times", action="store_true",
                   help="instead: when each request's tokens reached the client (first token, first decode output, "
                        "token 64, last token) and ITL p99 with and without each request's first gaps")
    p.add_argument("--poll-wait", action="store_true",
                   help="instead: how long each request waited for the scheduler's poll, by what the scheduler "
                        "thread was doing when the API server sent it")
    p.add_argument("--waves", action="store_true",
                   help="instead: how the scheduler split each returning wave of requests into prefills: the "
                        "solo prefill that opens it, the poll that closes the second group, its size, TTFT")
    p.add_argument("--plot", type=Path, help="with --host-speed: also write an SVG of the cells and the fits there")
    p.add_argument("--base", default="stock",
                   help="with --host-states: the side --variant is set against (default stock; patched for a "
                        "record of the plugin against one of its switches)")
    p.add_argument("--variant", default="patched",
                   help="with --strata, --host-speed or --host-states: the variant set beside stock (default "
                        "patched; e.g. patched-mirror-relay)")
    args = p.parse_args(argv)
    if args.variant != "patched" and not (args.strata or args.host_speed or args.host_states or args.token_times):
        print("serve_prefill_batches: --variant goes with --strata, --host-speed, --host-states or --token-times",
              file=sys.stderr)
        return 2
    if args.prefill and not args.ftimes:
        print("serve_prefill_batches: --prefill goes with --ftimes", file=sys.stderr)
        return 2
    if args.base != "stock" and not args.host_states:
        print("serve_prefill_batches: --base goes with --host-states", file=sys.stderr)
        return 2
    if args.slope is not None and not args.core_pairs:
        print("serve_prefill_batches: --slope goes with --core-pairs", file=sys.stderr)
        return 2
    if args.rename and not args.core_pairs:
        print("serve_prefill_batches: --rename goes with --core-pairs", file=sys.stderr)
        return 2
    try:
        renames = parse_renames(args.rename)
    except ValueError as exc:
        print(f"serve_prefill_batches: {exc}", file=sys.stderr)
        return 2
    if args.plot and not args.host_speed:
        print("serve_prefill_batches: --plot goes with --host-speed", file=sys.stderr)
        return 2
    if (args.launches + args.stalls + args.strata + args.compiles + args.frames + args.host_speed + args.intake
            + args.token_times + args.poll_wait + args.functions + args.ftimes + args.waves + args.host_states
            + args.core_speed + args.core_pairs + args.census > 1):
        print("serve_prefill_batches: one of --launches, --stalls, --strata, --compiles, --frames, --functions, --ftimes, "
              "--host-speed, --host-states, --core-speed, --core-pairs, --census, --intake, --token-times, --poll-wait, "
              "--waves",
              file=sys.stderr)
        return 2
    if len(args.pairs) % 2:
        print("serve_prefill_batches: give a record and its logs, pair by pair", file=sys.stderr)
        return 2
    for path in args.pairs:
        if not path.is_file():
            print(f"serve_prefill_batches: no such file: {path}", file=sys.stderr)
            return 2
    if args.join and args.token_times:
        print("serve_prefill_batches: --join does not go with --token-times", file=sys.stderr)
        return 2
    if args.join and len(args.pairs) < 4:
        print("serve_prefill_batches: --join reads two records or more (each with its logs)", file=sys.stderr)
        return 2
    if args.token_times:
        rows = token_time_rows([(json.loads(path.read_text()), serve.bench_results(logs))
                                for path, logs in zip(args.pairs[::2], args.pairs[1::2])], args.variant)
        if not rows:
            print("serve_prefill_batches: no cell with bench_serving files on both sides in these logs", file=sys.stderr)
            return 1
        print(json.dumps({"token_times": rows}, indent=1) if args.json else token_time_table(rows))
        return 0
    # Read pair by pair, as the rows are made (each record's own messages follow its logs').
    pairs = ((path, json.loads(path.read_text()), timelines(logs)) for path, logs in zip(args.pairs[::2], args.pairs[1::2]))
    if args.join:
        try:
            pairs = iter([join_pairs(list(pairs))])
        except ValueError as exc:
            print(f"serve_prefill_batches: {exc}", file=sys.stderr)
            return 2
    if args.frames or args.functions or args.compiles or args.ftimes or args.core_speed:
        # Fields only timelines from 2026-11-26 on have (the core's speed: from 2026-11-28 on).
        since = "2026-11-26"
        if args.core_speed:
            key, table_of, missing = "core_speed", core_speed_table, "core speed readings (a run with SMOKE_CORE_SPEED=1)"
            since = "2026-11-28"
            rows = core_speed_rows([(record, by_run) for _, record, by_run in pairs])
        elif args.frames:
            key, table_of, missing = "frames", frames_table, "sampled steady decodes"
            rows = steady_frames([(record, by_run) for _, record, by_run in pairs])
        elif args.ftimes:
            key, missing = "ftimes", "timed functions (SMOKE_TIME_FUNCS)"
            table_of = functools.partial(ftimes_table, prefill=args.prefill)
            rows = (prefill_ftimes if args.prefill else steady_ftimes)([(record, by_run) for _, record, by_run in pairs])
        elif args.functions:
            key, table_of, missing = "functions", functions_table, "sampled steady decodes"
            rows = steady_functions([(record, by_run) for _, record, by_run in pairs])
        else:
            key, table_of, missing = "compiles", compile_table, "compile events"
            rows = [row for _, _, by_run in pairs for row in compile_rows(by_run)]
        if not rows:
            print(f"serve_prefill_batches: no {missing} in these logs (timelines before {since} have none)",
                  file=sys.stderr)
            return 1
        print(json.dumps({key: rows}, indent=1) if args.json else table_of(rows))
        return 0
    if args.census:
        rows = census_rows([(record, by_run) for _, record, by_run in pairs])
        if not rows:
            print("serve_prefill_batches: no boot with census launches on both sides in these logs "
                  "(a run with SMOKE_CALL_CENSUS=N)", file=sys.stderr)
            return 1
        print(json.dumps({"census": rows}, indent=1) if args.json else census_table(rows))
        return 0
    if args.core_pairs:
        rows = core_pair_rows([(path.parent.name, record, by_run) for path, record, by_run in pairs])
        for r in rows:
            r["variant"] = renames.get((r["record"], r["variant"]), r["variant"])
        if not rows:
            print("serve_prefill_batches: no boot pair with core readings on both sides in these logs "
                  "(a run with SMOKE_CORE_SPEED=1, timelines from 2026-11-28 on)", file=sys.stderr)
            return 1
        summary = core_pair_summary(rows, args.slope)
        print(json.dumps({"core_pairs": rows, "summary": summary}, indent=1) if args.json
              else core_pair_table(rows, summary))
        return 0
    if args.host_states:
        states = host_state_rows([(str(path.parent), record, by_run) for path, record, by_run in pairs])
        if not states["servers"]:
            print("serve_prefill_batches: no one-request prefill with its CPU time in these logs "
                  "(timelines before 2026-11-26 have none)", file=sys.stderr)
            return 1
        sides = sorted({server["variant"] for server in states["servers"]})
        missing_sides = [v for v in (args.base, args.variant) if v not in sides]
        if missing_sides:
            print(f"serve_prefill_batches: no {' or '.join(missing_sides)} servers in these records (they have: "
                  f"{', '.join(sides)}); name the sides with --variant / --base", file=sys.stderr)
            return 2
        summary = host_state_summary(states, args.variant, args.base)
        print(json.dumps({**states, **summary}, indent=1) if args.json else host_state_table(summary, states))
        return 0
    if args.host_speed:
        rows = host_speed_rows([(str(path.parent), record, by_run) for path, record, by_run in pairs])
    elif args.launches:
        rows = launch_split([(str(path.parent), record, by_run) for path, record, by_run in pairs])
    elif args.stalls:
        rows, gcs = [], []
        for path, record, by_run in pairs:
            rows += stall_rows(record, by_run)
            gcs += full_gc_points(record, by_run, path.parent.name)
    elif args.intake:
        rows = [row for _, record, by_run in pairs for row in intake_rows(record, by_run)]
    elif args.waves:
        rows = wave_summary([row for _, record, by_run in pairs for row in wave_rows(record, by_run)])
    elif args.poll_wait:
        rows = poll_wait_summary([row for _, record, by_run in pairs for row in poll_wait_rows(record, by_run)])
    elif args.strata:
        rows = strata_rows([(record, by_run) for _, record, by_run in pairs], args.variant)
    else:
        rows = [row for _, record, by_run in pairs for row in prefill_batch_sizes(record, by_run)]
    if not rows:
        print("serve_prefill_batches: no timeline in these logs matches the record's runs (a --timeline run?)",
              file=sys.stderr)
        return 1
    if args.host_speed:
        fits = host_speed_fits(rows, args.variant)
        if args.plot:
            args.plot.write_text(host_speed_svg(rows, fits, "stock -> " + args.variant))
        print(json.dumps({"cells": rows, "fits": fits}, indent=1) if args.json else host_speed_table(rows, fits))
        return 0
    if args.launches:
        print(json.dumps({"launches": rows}, indent=1) if args.json else launch_tables(rows))
        return 0
    if args.stalls:
        print(json.dumps({"stalls": rows, "full_gcs": gcs}, indent=1) if args.json
              else stall_table(rows) + "\n\n" + full_gc_table(gcs))
        return 0
    if args.intake:
        print(json.dumps({"intake": rows}, indent=1) if args.json else intake_table(rows))
        return 0
    if args.waves:
        print(json.dumps({"waves": rows}, indent=1) if args.json else wave_table(rows))
        return 0
    if args.poll_wait:
        print(json.dumps({"poll_wait": rows}, indent=1) if args.json else poll_wait_table(rows))
        return 0
    if args.strata:
        print(json.dumps({"strata": rows}, indent=1) if args.json else strata_table(rows))
        return 0
    fits = fit(rows)
    print(json.dumps({"cells": rows, "fits": fits}, indent=1) if args.json else table(rows) + "\n\n" + fit_table(fits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
