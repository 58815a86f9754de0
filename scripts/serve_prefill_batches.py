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
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tarfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_serve_bench as serve  # noqa: E402


def cell_sizes(config: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(concurrency, warm-up requests, measured requests) per cell, in the order they ran: the
    serving benchmark's own counts."""
    return [(str(c), serve.warmup_requests(config.get("warmup"), c),
             serve.num_prompts(c, config["rounds"], config.get("min_prompts", 0))) for c in config["concurrency"]]


def timelines(tar_path: Path) -> dict[str, list[dict[str, Any]]]:
    """Each server run's scheduler events (``<variant>-boot<n>`` -> events in time order)."""
    by_run: dict[str, list[dict[str, Any]]] = {}
    broken: set[str] = set()
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if len(parts) >= 3 and parts[-3] == "timeline" and parts[-1].startswith("timeline-") and parts[-1].endswith(".json") and m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                try:
                    events = json.load(io.TextIOWrapper(f)).get("events", [])
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


def prefill_batch_sizes(record: dict[str, Any], by_run: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per boot and cell: variant, boot, concurrency, requests, mean prefill batch size,
    TTFT p50 (ms)."""
    if record["environment"].get("variant_note"):
        # Variants renamed after the run: the timeline folders carry the names they ran under.
        print("serve_prefill_batches: a record whose variants were renamed after the run is left out "
              f"({record['environment']['variant_note'][:60]}...)", file=sys.stderr)
        return []
    sizes = cell_sizes(record["environment"]["config"])
    rows = []
    for run in record["runs"]:
        events = by_run.get(f"{run['variant']}-boot{run['boot']}")
        if not events:
            continue
        bs_of: dict[str, int] = {}
        for e in events:
            if e["kind"] == "run" and e["extend"]:
                for rid in e.get("rids") or ():
                    bs_of.setdefault(rid, e["bs"])
        recv = [e["rid"] for e in events if e["kind"] == "recv"]
        ran = [s for s in sizes if s[0] in run["cells"]]
        total = sum(w + n for _, w, n in ran)
        if len(recv) < total:
            continue  # a cut-off run: the arrival order cannot be split into its cells
        rids = recv[len(recv) - total:]
        i = 0
        for c, warm, n in ran:
            measured = [bs_of[r] for r in rids[i + warm:i + warm + n] if r in bs_of]
            i += warm + n
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pairs", nargs="+", type=Path, metavar="RECORD LOGS",
                   help="serve-bench.json of a --timeline run and its serve-logs.tar.gz; several pairs are pooled")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    if len(args.pairs) % 2:
        print("serve_prefill_batches: give a record and its logs, pair by pair", file=sys.stderr)
        return 2
    for path in args.pairs:
        if not path.is_file():
            print(f"serve_prefill_batches: no such file: {path}", file=sys.stderr)
            return 2
    rows = []
    for record, logs in zip(args.pairs[::2], args.pairs[1::2]):
        rows.extend(prefill_batch_sizes(json.loads(record.read_text()), timelines(logs)))
    if not rows:
        print("serve_prefill_batches: no timeline in these logs matches the record's runs (a --timeline run?)",
              file=sys.stderr)
        return 1
    fits = fit(rows)
    print(json.dumps({"cells": rows, "fits": fits}, indent=1) if args.json else table(rows) + "\n\n" + fit_table(fits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
