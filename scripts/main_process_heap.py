#!/usr/bin/env python3
"""How much a full Python garbage collection costs in SGLang's main process, with and without
the plugin installed there: ``python3 scripts/main_process_heap.py [--repeat N] [--json]``.

SGLang's main process runs the API server's event loop (``TokenizerManager``); a full
collection there stops that loop, every request's intake and streaming with it. The serving
record results/serve-bench/h200x2-final found one such 330-455 ms pause per server, on both
sides. This imports what that process imports (``sglang.srt.entrypoints.engine`` and the
``TokenizerManager``), counts the objects the collector tracks and the modules, times ``--repeat``
full collections (median), then installs the plugin (``strict``, as every SGLang process does
with the plugin present) and does the same again. CPU only: no GPU, no server.

``--until-full``: when the next full collection comes. CPython collects the oldest generation once
the objects promoted into it since its last full collection exceed a quarter of those that
collection kept. Two fresh processes, one per side, import the same, install the plugin or not,
then serve synthetic requests (each keeps ``KEEP`` objects and drops ``CHURN``) until the collector
runs a full collection by itself; printed: the requests that took. Objects created after the last
import-time full collection (the plugin's install, in the plugin's process) would bring it forward;
``collector_paused`` in ``sglang_futuremap_patch/_api.py`` leaves them out of the count, so the two
sides should read within 1% (``tests/test_lifecycle.py`` holds them to it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable


def heap(repeat: int) -> dict[str, Any]:
    """Objects the collector tracks, modules loaded, and the median of ``repeat`` full
    collections (ms)."""
    gc.collect()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"objects": len(gc.get_objects()), "modules": len(sys.modules),
            "full_collection_ms": round(statistics.median(times), 1)}


def measure(repeat: int, load: Callable[[], None], install: Callable[[], Any]) -> dict[str, Any]:
    """``heap`` after ``load`` (SGLang's main-process imports) and again after ``install``."""
    load()
    before = heap(repeat)
    install()
    return {"stock": before, "plugin": heap(repeat)}


def _load() -> None:
    import sglang.srt.entrypoints.engine  # noqa: F401
    import sglang.srt.managers.tokenizer_manager  # noqa: F401


def _install() -> Any:
    import sglang_futuremap_patch

    return sglang_futuremap_patch.apply(mode="strict")


#: Per synthetic request: objects kept for good, and objects made and dropped.
KEEP, CHURN = 40, 400


def requests_until_full(load: Callable[[], None], install: Callable[[], Any] | None, limit: int = 200_000) -> int:
    """Imports (``load``), ``install`` when given, then synthetic requests until the collector's
    next full collection (generation 2) of its own accord; how many requests that took (``limit``
    when none came)."""
    full: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2:
            full.append(1)

    gc.callbacks.append(seen)
    try:
        load()
        if install is not None:
            install()
        start = len(full)
        kept = []
        for n in range(1, limit + 1):
            kept.append([{"k": i} for i in range(KEEP)])
            dropped = [[i] for i in range(CHURN)]
            del dropped
            if len(full) > start:
                return n
        return limit
    finally:
        gc.callbacks.remove(seen)


def until_full_sides() -> dict[str, int]:
    """``requests_until_full`` in a fresh process per side (``stock``: no install)."""
    out = {}
    for side in ("stock", "plugin"):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", side], capture_output=True,
                              text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"the {side} process failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
        out[side] = int(proc.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="full collections timed per side (median)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--until-full", action="store_true",
                   help="synthetic requests until the next full collection, per side, each in a fresh process")
    p.add_argument("--child", choices=("stock", "plugin"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.child:
        print(requests_until_full(_load, _install if args.child == "plugin" else None))
        return 0
    if args.until_full:
        try:
            sides = until_full_sides()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps({"requests_until_full": sides}))
        else:
            print(f"synthetic requests until the next full collection (each keeps {KEEP} objects, drops {CHURN}): "
                  f"stock {sides['stock']}, plugin installed {sides['plugin']}")
        return 0
    out = measure(args.repeat, _load, _install)
    if args.json:
        print(json.dumps(out))
    else:
        s, q = out["stock"], out["plugin"]
        print(f"objects {s['objects']} -> {q['objects']} ({q['objects'] - s['objects']:+d}), modules {s['modules']} -> "
              f"{q['modules']}, full collection {s['full_collection_ms']} -> {q['full_collection_ms']} ms "
              f"(median of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
