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
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="full collections timed per side (median)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
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
