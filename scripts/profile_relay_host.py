#!/usr/bin/env python3
"""Host time of the spec-v2 relay per decode iteration, function by function, on a GPU.

On an eager decode batch (above ``cuda_graph_max_bs``) every launch is host-bound, so each
microsecond the plugin's relay adds per iteration lies on the critical path. The serving
benchmark's exact timers (``SMOKE_TIME_FUNCS=relay``, ``serve_prefill_batches.py --ftimes``)
give each relay function's time in a live server; this script splits that time into its
parts on the same kind of host, with nothing else running:

1. ``ops``: the CUDA runtime and PyTorch calls the relay functions are made of (an event
   record, a synchronize on a finished event, a stream wait, a stream switch, a pinned D2H
   copy, an index gather, an index put, a slice copy, an empty tensor, a tensor from a list,
   the fused Triton gather, three index gathers), and the relay's host-only bookkeeping (NumPy);
2. ``relay``: the plugin's own FutureMap functions as one eager steady decode calls them, in
   the scheduler's order (``resolve_seq_lens_cpu``, ``lend_draft_extend_lens``,
   ``resolve_future``, ``publish``, ``stash``, ``keep_draft_extend_lens``), on a FutureMap
   set up as the scheduler sets it up for FA3 + piecewise CUDA graph (no mirror; the eager
   mirror above ``--graph-bs``).

Each figure is the median over ``--rounds`` of the mean over ``--iters`` calls, in
microseconds. No model and no network: torch, triton, SGLang 0.5.12.x and the plugin.

    python scripts/profile_relay_host.py --out relay-host.json      # bs 16, STANDALONE
    python scripts/profile_relay_host.py --bs 16,24 --algorithm EAGLE3
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The relay functions in the order one eager steady decode calls them.
RELAY_ORDER = ("resolve_seq_lens_cpu", "lend_draft_extend_lens", "resolve_future", "publish", "stash",
               "keep_draft_extend_lens")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--bs", default="16", help="decode batch sizes, comma separated (default 16)")
    p.add_argument("--graph-bs", type=int, default=8,
                   help="largest captured batch: larger batches get the eager mirror (default 8)")
    p.add_argument("--algorithm", default="STANDALONE", choices=["STANDALONE", "EAGLE", "EAGLE3"])
    p.add_argument("--hidden", type=int, default=4096, help="hidden size of EAGLE's relayed states")
    p.add_argument("--pool", type=int, default=4096, help="request-pool slots (default 4096)")
    p.add_argument("--iters", type=int, default=300, help="calls per round (default 300)")
    p.add_argument("--rounds", type=int, default=7, help="rounds; the median is reported (default 7)")
    p.add_argument("--out", type=Path, default=Path("relay-host.json"), help="JSON output")
    return p.parse_args(argv)


def median_us(fn: Callable[[], Any], iters: int, rounds: int, sync: Callable[[], None] | None = None) -> float:
    """Median over ``rounds`` of the mean host time of ``iters`` back-to-back ``fn()`` (us)."""
    for _ in range(20):
        fn()
    per = []
    for _ in range(rounds):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per.append((time.perf_counter() - t0) / iters * 1e6)
    return round(statistics.median(per), 2)


def op_costs(args: argparse.Namespace, bs: int) -> dict[str, float]:
    """Host us per call of the calls the relay is made of (``bs`` rows, ``args.pool`` slots)."""
    import numpy as np
    import torch
    import triton

    from sglang_futuremap_patch.backports.fused_gather import _gather_spec_extras_kernel, gather_spec_extras

    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    slots = list(range(1, bs + 1))
    idx = torch.tensor(slots, device=dev)
    buf = torch.zeros((args.pool,), dtype=torch.int64, device=dev)
    vals = torch.ones((bs,), dtype=torch.int64, device=dev)
    pinned = torch.empty((args.pool,), dtype=torch.int64, pin_memory=True)
    side = torch.cuda.Stream()
    done = torch.cuda.Event()
    done.record()
    sync()
    topk_p = torch.zeros((args.pool, 1), dtype=torch.float32, device=dev)
    topk_i = torch.zeros((args.pool, 1), dtype=torch.int64, device=dev)
    bonus = torch.zeros((args.pool,), dtype=torch.int64, device=dev)
    hidden = (torch.zeros((args.pool, args.hidden), dtype=torch.bfloat16, device=dev)
              if args.algorithm != "STANDALONE" else None)
    kernel = triton.jit(_gather_spec_extras_kernel)
    known = np.zeros(args.pool, dtype=bool)
    lens = np.zeros(args.pool, dtype=np.int64)
    copy_of = np.full(args.pool, -1, dtype=np.int64)
    copy_of[1:bs + 1] = 3
    reqs = [SimpleNamespace(req_pool_idx=s) for s in slots]

    def host_bookkeeping():
        s = [r.req_pool_idx for r in reqs]
        rows = torch.tensor(s, dtype=torch.int64).numpy()
        from_host = known[rows]
        if not (from_host | (copy_of[rows] == 3)).all():
            raise AssertionError("not covered")
        out = torch.from_numpy(np.where(from_host, lens[rows], pinned.numpy()[rows]))
        return int(out.sum())

    def stream_switch():
        with torch.cuda.stream(side):
            pass

    def d2h_async():
        pinned.copy_(buf, non_blocking=True)

    def slice_copy():
        buf[1:bs + 1] = vals

    def index_put():
        buf[idx] = vals

    cases: dict[str, Callable[[], Any]] = {
        "event record": done.record,
        "event synchronize (finished)": done.synchronize,
        "stream wait_event": lambda: side.wait_event(done),
        "stream switch (with torch.cuda.stream)": stream_switch,
        "pinned D2H copy, non_blocking (pool)": d2h_async,
        "index gather buf[idx]": lambda: buf[idx],
        "index put buf[idx] = v": index_put,
        "slice copy buf[a:b] = v": slice_copy,
        "torch.empty on the GPU": lambda: torch.empty((bs, 1), dtype=torch.float32, device=dev),
        "torch.tensor(list) on the host": lambda: torch.tensor(slots, dtype=torch.int64),
        "small .cpu() (sync)": lambda: vals.cpu(),
        "fused Triton gather (gather_spec_extras)": lambda: gather_spec_extras(idx, topk_p, topk_i, bonus, hidden,
                                                                             kernel),
        "PyTorch gathers (one per buffer)": lambda: gather_spec_extras(idx, topk_p, topk_i, bonus, hidden, None),
        "relay bookkeeping on the host (NumPy, no CUDA)": host_bookkeeping,
    }
    return {name: median_us(fn, args.iters, args.rounds, sync) for name, fn in cases.items()}


def relay_costs(args: argparse.Namespace, bs: int, device: str = "cuda") -> dict[str, float]:
    """Host us per call of each plugin relay function, called as one eager steady decode does
    (on ``device``; off CUDA the streams are left out, so the tests can run it)."""
    import contextlib

    import torch
    from sglang.srt.managers.overlap_utils import FutureIndices, FutureMap
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    fmap = FutureMap(args.pool, 0, 64, dev, SpeculativeAlgorithm.from_string(args.algorithm))
    pool = SimpleNamespace(req_to_token=torch.zeros((args.pool, 1), dtype=torch.int32, device=dev))
    schedule_stream = torch.cuda.current_stream() if cuda else None
    forward_stream = torch.cuda.Stream() if cuda else None

    def on_forward_stream() -> Any:
        return torch.cuda.stream(forward_stream) if cuda else contextlib.nullcontext()
    fmap.init_spec_relay(pool, forward_stream, needs_cpu_seq_lens=False)
    fmap.eager_mirror_above_bs = args.graph_bs
    slots = list(range(1, bs + 1))
    indices = torch.tensor(slots, device=dev)
    new_lens = torch.full((bs,), 300, dtype=torch.int64, device=dev)

    g = torch.Generator(device=dev).manual_seed(bs)
    payload = EagleDraftInput(
        topk_p=torch.rand((bs, 1), generator=g, device=dev),
        topk_index=torch.zeros((bs, 1), dtype=torch.int64, device=dev),
        bonus_tokens=torch.zeros((bs,), dtype=torch.int64, device=dev),
        hidden_states=torch.zeros((bs, args.hidden), dtype=torch.bfloat16, device=dev))
    batch = SimpleNamespace(reqs=[SimpleNamespace(req_pool_idx=s) for s in slots], forward_mode=ForwardMode.DECODE,
                            req_pool_indices=indices, seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None,
                            spec_info=EagleDraftInput(future_indices=FutureIndices(indices=indices)))
    # The first decode: published and stashed as a prefill would have left it.
    with on_forward_stream():
        fmap.publish(indices, new_lens)
        fmap.stash(indices, payload)
    times: dict[str, list[float]] = {name: [] for name in RELAY_ORDER}

    def timed(name: str, fn: Callable[..., Any], *a: Any) -> None:
        t0 = time.perf_counter()
        fn(*a)
        times[name].append(time.perf_counter() - t0)

    def iteration() -> None:
        timed("resolve_seq_lens_cpu", fmap.resolve_seq_lens_cpu, batch)
        mwb = SimpleNamespace(seq_lens_cpu=batch.seq_lens_cpu, seq_lens_cpu_pending=None,
                              spec_info=EagleDraftInput(future_indices=FutureIndices(indices=indices)))
        timed("lend_draft_extend_lens", fmap.lend_draft_extend_lens, batch, mwb)
        with on_forward_stream():
            if cuda:
                forward_stream.wait_stream(schedule_stream)
            timed("resolve_future", fmap.resolve_future, mwb)
            timed("publish", fmap.publish, indices, new_lens)
            timed("stash", fmap.stash, indices, payload)
            timed("keep_draft_extend_lens", fmap.keep_draft_extend_lens, batch, mwb)
        batch.spec_info = EagleDraftInput(future_indices=FutureIndices(indices=indices))

    for _ in range(20):
        iteration()
    per_round: dict[str, list[float]] = {name: [] for name in RELAY_ORDER}
    for _ in range(args.rounds):
        if cuda:
            torch.cuda.synchronize()
        for v in times.values():
            v.clear()
        for _ in range(args.iters):
            iteration()
        for name, v in times.items():
            per_round[name].append(statistics.fmean(v) * 1e6)
    out = {name: round(statistics.median(v), 2) for name, v in per_round.items()}
    out["sum"] = round(sum(out.values()), 2)
    if batch.seq_lens_cpu is None or batch.seq_lens_cpu.tolist() != [300] * bs:
        raise AssertionError(f"the relay lost the lengths: {batch.seq_lens_cpu}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("profile_relay_host: no CUDA device (this script times CUDA calls)", file=sys.stderr)
        return 2
    import sglang
    import sglang.srt.managers.scheduler  # noqa: F401  (as in a server process)
    import sglang_futuremap_patch as plugin
    from sglang.srt import server_args as sa

    report = plugin.apply(mode="strict")
    sa.set_global_server_args_for_scheduler(
        SimpleNamespace(speculative_algorithm=args.algorithm, enable_multi_layer_eagle=False))
    result: dict[str, Any] = {
        "env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sglang": sglang.__version__,
                "python": platform.python_version(), "plugin_applied": report.applied},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cases": [],
    }
    for bs in [int(x) for x in args.bs.split(",") if x.strip()]:
        case = {"bs": bs, "ops_us": op_costs(args, bs), "relay_us": relay_costs(args, bs)}
        result["cases"].append(case)
        for group in ("ops_us", "relay_us"):
            for name, us in case[group].items():
                print(f"bs={bs:>3} {group[:-3]:>5}  {us:9.2f} us  {name}")
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
