#!/usr/bin/env python3
"""Per-call cost of the one delegating replacement, ``Scheduler.run_batch``, against wrapt.

Times a call on the path that delegates to the stock method (every batch that is not a
spec-v2 overlap batch) three ways: the stock method alone; the plugin's replacement, built
the way the engine installs a ``wrap`` target (a plain function, the stock method as a
keyword-only default); and a ``wrapt.FunctionWrapper`` around the stock method doing the same
check. The stock method is a stand-in that returns at once, so only the wrapping is timed.
Needs wrapt (in requirements-cpu.txt; the plugin itself does not use it).

    scripts/cpu-env.sh python scripts/wrapper_overhead.py
"""

from __future__ import annotations

import argparse
import sys
import timeit
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _stock_run_batch(self, batch, pp_proxy_tensors=None):
    return batch


def _wrapt_wrapper(wrapped, instance, args, kwargs):
    batch = args[0]
    if (not (instance.is_generation and instance.enable_overlap and batch.is_spec_v2)
            or batch.forward_mode.is_prebuilt()):
        return wrapped(*args, **kwargs)
    raise AssertionError("only the delegating path is timed")


def _scheduler(run_batch) -> object:
    return type("Scheduler", (), {"run_batch": run_batch, "is_generation": True, "enable_overlap": True})()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=15, help="timings per variant (the minimum is shown)")
    args = parser.parse_args(argv)

    import wrapt

    from sglang_futuremap_patch.backports import publish_stash

    ours = publish_stash.run_batch
    installed = types.FunctionType(ours.__code__, ours.__globals__, "run_batch", ours.__defaults__)
    installed.__kwdefaults__ = {"_stock_run_batch": _stock_run_batch}
    variants = {
        "stock method": _scheduler(_stock_run_batch),
        "plugin (plain function)": _scheduler(installed),
        f"wrapt {wrapt.__version__} FunctionWrapper": _scheduler(wrapt.FunctionWrapper(_stock_run_batch, _wrapt_wrapper)),
    }
    batch = types.SimpleNamespace(is_spec_v2=False,
                                  forward_mode=types.SimpleNamespace(is_prebuilt=lambda: False))
    for name, scheduler in variants.items():
        best = min(timeit.repeat("s.run_batch(b)", globals={"s": scheduler, "b": batch},
                                 number=args.calls, repeat=args.repeat))
        print(f"{name:32} {best / args.calls * 1e9:7.1f} ns per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
