#!/usr/bin/env python3
"""Kernel launches and time of ``FutureMap.resolve_future`` (spec v2), before and after fusing.

"before" is the publish/stash version (one PyTorch index kernel per relay buffer: topk_p,
topk_index, bonus_tokens and, for EAGLE3, hidden_states); "after" is the fused-gather
back-port (one Triton launch). For every batch size and top-k the script:

1. builds a FutureMap on the GPU the way the scheduler does (pool-indexed relay), stashes an
   EAGLE3-shaped payload (topk_p float32 (bs, topk), topk_index int64 (bs, topk),
   bonus_tokens (bs,), hidden_states (bs, hidden) bf16) into random pool slots;
2. checks that both versions hand the worker identical tensors (values, dtypes, shapes);
3. counts, with torch.profiler, the GPU kernels (and memcpy/memset) launched per call;
4. times calls (median of --rounds): host time per call (what the thread that launches
   them pays), GPU time per call of back-to-back calls (host-bound: equals the host time),
   and GPU time per call with the calls queued behind a sleeping kernel (device-side cost:
   kernels plus the gaps between them).

At the end it runs the debug invariant (``SGLANG_FUTUREMAP_DEBUG_RELAY``) through a normal
stash -> resolve cycle on the GPU (it must not fire); a device-side assert there would abort
the process, so the JSON is written before that step and again after it.

No network, no model: only torch, triton, SGLang 0.5.12.x and this plugin. Usage:

    python scripts/profile_gather.py                      # bs 1,16,48; topk 1,4; hidden 4096
    python scripts/profile_gather.py --out gather.json --iters 500
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--bs", default="1,16,48", help="batch sizes, comma separated (default 1,16,48)")
    p.add_argument("--topk", default="1,4", help="EAGLE top-k values (default 1,4)")
    p.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096)")
    p.add_argument("--hidden-dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--bonus-dtype", default="int64", choices=["int32", "int64"])
    p.add_argument("--algorithm", default="EAGLE3", choices=["EAGLE3", "EAGLE", "STANDALONE"],
                   help="EAGLE/EAGLE3 relay hidden states, STANDALONE does not (default EAGLE3)")
    p.add_argument("--pool", type=int, default=256, help="request-pool slots (default 256)")
    p.add_argument("--iters", type=int, default=200, help="timed calls per round (default 200)")
    p.add_argument("--rounds", type=int, default=5,
                   help="timed rounds per case; the median is reported (default 5)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls first (default 20)")
    p.add_argument("--profile-iters", type=int, default=10,
                   help="calls inside the profiler (default 10)")
    p.add_argument("--device", default="cuda", help="default cuda (cuda:N works too)")
    p.add_argument("--out", type=Path, default=Path("profile_gather.json"),
                   help="JSON output (default ./profile_gather.json)")
    p.add_argument("--no-debug-check", action="store_true",
                   help="skip the debug-invariant cycle at the end")
    return p.parse_args(argv)


def _ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


# --------------------------------------------------------------------------- setup


def setup(args):
    """The plugin applied (or the patched tree recognised) and SGLang's globals set."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("profile_gather: no CUDA device (this script measures GPU launches)")
    # The scheduler first, as in a server process: imported on its own, eagle_worker_v2 can
    # fail on an optional flashinfer.comm dependency (seen on the H200 image: cuda.tile).
    import sglang.srt.managers.scheduler  # noqa: F401
    import sglang_futuremap_patch as plugin

    report = plugin.apply(mode="strict")
    from sglang.srt import server_args as sa

    # spec_need_hidden_states() reads only these two fields.
    sa.set_global_server_args_for_scheduler(
        SimpleNamespace(speculative_algorithm=args.algorithm, enable_multi_layer_eagle=False))
    return report


def make_future_map(args, device):
    import torch
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    fmap = FutureMap(args.pool, 0, 64, device, SpeculativeAlgorithm.from_string(args.algorithm))
    pool = SimpleNamespace(req_to_token=torch.zeros((args.pool, 1), dtype=torch.int32,
                                                    device=device))
    fmap.init_spec_relay(pool, torch.cuda.current_stream(device))
    return fmap


def payload(args, rows, topk, device):
    import torch
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    bs = rows.shape[0]
    g = torch.Generator(device=device).manual_seed(bs * 100 + topk)
    return EagleDraftInput(
        topk_p=torch.rand((bs, topk), generator=g, device=device, dtype=torch.float32),
        topk_index=torch.randint(0, 128000, (bs, topk), generator=g, device=device),
        hidden_states=torch.randn((bs, args.hidden), generator=g, device=device).to(
            getattr(torch, args.hidden_dtype)),
        bonus_tokens=torch.randint(0, 128000, (bs,), generator=g, device=device).to(
            getattr(torch, args.bonus_dtype)),
    )


def worker_batch(indices):
    from sglang.srt.managers.overlap_utils import FutureIndices
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return SimpleNamespace(spec_info=EagleDraftInput(future_indices=FutureIndices(indices=indices)))


def index_each_buffer(fmap, wb):
    """The gather as back-port 2 leaves it (SGLang's own): one PyTorch index per buffer."""
    from sglang.srt.speculative.spec_utils import spec_need_hidden_states

    draft_input = wb.spec_info
    indices = draft_input.future_indices.indices
    draft_input.topk_p = fmap.topk_p_buf[indices]
    draft_input.topk_index = fmap.topk_index_buf[indices]
    draft_input.bonus_tokens = fmap.bonus_tokens_buf[indices]
    if spec_need_hidden_states():
        draft_input.hidden_states = fmap.hidden_states_buf[indices]


def resolvers(fmap):
    return {
        "before": lambda wb: index_each_buffer(fmap, wb),
        "after": lambda wb: fmap.resolve_future(wb),
    }


# --------------------------------------------------------------------------- measurements


FIELDS = ("topk_p", "topk_index", "bonus_tokens", "hidden_states")


def check_equal(run, indices):
    outs = {}
    for name, fn in run.items():
        wb = worker_batch(indices)
        fn(wb)
        outs[name] = wb.spec_info
    problems = []
    for field in FIELDS:
        a, b = getattr(outs["before"], field), getattr(outs["after"], field)
        if (a is None) != (b is None):
            problems.append(f"{field}: present in only one version")
        elif a is not None and (a.dtype != b.dtype or a.shape != b.shape or not bool((a == b).all())):
            problems.append(f"{field}: differs ({a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)})")
    return problems


def count_launches(fn, indices, n):
    import torch
    from torch.profiler import ProfilerActivity, profile

    batches = [worker_batch(indices) for _ in range(n)]  # built outside the profiled region
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for wb in batches:
            fn(wb)
        torch.cuda.synchronize()
    kernels, copies = {}, {}
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = evt.name
        bucket = copies if name.startswith(("Memcpy", "Memset")) else kernels
        bucket[name] = bucket.get(name, 0) + 1
    return {
        "kernels_per_call": sum(kernels.values()) / n,
        "copies_per_call": sum(copies.values()) / n,
        "kernels": {k: v / n for k, v in sorted(kernels.items())},
        "copies": {k: v / n for k, v in sorted(copies.items())},
    }


def time_calls(fn, indices, iters, warmup, rounds):
    """Median (and min) over ``rounds`` runs of ``iters`` back-to-back calls: single runs on
    a shared host showed one-off outliers of 10x (seen on the H200 microVM)."""
    import statistics

    import torch

    for _ in range(warmup):
        fn(worker_batch(indices))
    host, gpu = [], []
    for _ in range(rounds):
        batches = [worker_batch(indices) for _ in range(iters)]
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for wb in batches:
            fn(wb)
        stop.record()
        host.append((time.perf_counter() - t0) / iters * 1e6)
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(stop) / iters * 1e3)
    # The calls above are host-bound (the GPU waits for each launch), so their GPU time is
    # the host time. Queued behind a sleeping kernel, the same calls run back to back on
    # the GPU: that is their device-side cost (kernels plus the gaps between them).
    queued = []
    for _ in range(rounds):
        batches = [worker_batch(indices) for _ in range(iters)]
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(iters * 100e-6 * 2e9))  # ~100 us of host time per call, 2 GHz
        start.record()
        for wb in batches:
            fn(wb)
        stop.record()
        torch.cuda.synchronize()
        queued.append(start.elapsed_time(stop) / iters * 1e3)
    return {
        "host_us_per_call": statistics.median(host), "host_us_per_call_min": min(host),
        "gpu_us_per_call": statistics.median(gpu), "gpu_us_per_call_min": min(gpu),
        "gpu_queued_us_per_call": statistics.median(queued),
        "gpu_queued_us_per_call_min": min(queued),
    }


def one_case(args, device, bs, topk):
    import torch

    fmap = make_future_map(args, device)
    g = torch.Generator().manual_seed(bs)
    rows = (torch.randperm(args.pool - 1, generator=g)[:bs] + 1).to(device)  # slot 0 = padding
    fmap.stash(rows, payload(args, rows, topk, device))
    indices = rows[torch.randperm(bs, generator=g).to(device)]  # a different row order
    run = resolvers(fmap)
    for fn in run.values():  # compile / warm the caching allocator
        fn(worker_batch(indices))
    torch.cuda.synchronize()
    case = {"bs": bs, "topk": topk, "mismatches": check_equal(run, indices)}
    for name, fn in run.items():
        case[name] = count_launches(fn, indices, args.profile_iters)
        case[name].update(time_calls(fn, indices, args.iters, args.warmup, args.rounds))
    case["fused_kernel"] = fmap.gather_kernel is not None
    return case


def debug_cycle(args, device):
    """The #26108 invariant on the GPU: a normal stash -> resolve -> stash -> resolve cycle."""
    import torch
    from sglang.srt.managers import overlap_utils

    overlap_utils._FUTUREMAP_DEBUG_RELAY = True
    try:
        fmap = make_future_map(args, device)
        rows = torch.arange(1, 17, device=device)
        for _ in range(3):
            fmap.stash(rows, payload(args, rows, 4, device))
            wb = worker_batch(rows)
            fmap.resolve_future(wb)
        torch.cuda.synchronize()  # a failed device-side assert surfaces here
        consumed = bool((fmap.bonus_tokens_buf[rows] == -1).all())
        initial = bool((fmap.bonus_tokens_buf[17:] == -1).all())
        return {"ok": consumed and initial, "consumed_slots_are_-1": consumed,
                "unstashed_slots_are_-1": initial}
    finally:
        overlap_utils._FUTUREMAP_DEBUG_RELAY = False


def write(out, result):
    out.write_text(json.dumps(result, indent=2) + "\n")


def summary_line(case):
    b, a = case["before"], case["after"]
    return (f"bs={case['bs']:>3} topk={case['topk']}  kernels/call {b['kernels_per_call']:.0f} -> "
            f"{a['kernels_per_call']:.0f}   host us/call {b['host_us_per_call']:.1f} -> "
            f"{a['host_us_per_call']:.1f}   gpu us/call {b['gpu_us_per_call']:.2f} -> "
            f"{a['gpu_us_per_call']:.2f}   queued gpu us/call {b['gpu_queued_us_per_call']:.2f} -> "
            f"{a['gpu_queued_us_per_call']:.2f}" + ("   MISMATCH" if case["mismatches"] else ""))


def main(argv=None):
    args = parse_args(argv)
    import torch

    report = setup(args)
    device = torch.device(args.device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    import sglang
    import triton

    result = {
        "env": {
            "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
            "triton": triton.__version__, "sglang": sglang.__version__,
            "python": platform.python_version(),
            "plugin": {"decision": report.verdict.decision, "applied": report.applied},
        },
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cases": [],
        "errors": [],
    }
    # A throwaway case first: the first one of a process ran slow (allocator, Triton cache).
    one_case(args, device, _ints(args.bs)[0], _ints(args.topk)[0])
    for bs in _ints(args.bs):
        for topk in _ints(args.topk):
            try:
                case = one_case(args, device, bs, topk)
            except Exception:  # keep going: one broken case should not hide the others
                result["errors"].append({"bs": bs, "topk": topk, "error": traceback.format_exc()})
                print(f"bs={bs} topk={topk}: ERROR\n{result['errors'][-1]['error']}", file=sys.stderr)
                continue
            result["cases"].append(case)
            print(summary_line(case), flush=True)
            write(args.out, result)
    if not args.no_debug_check:
        result["debug_invariant"] = {"ok": False, "note": "did not finish (device assert?)"}
        write(args.out, result)
        try:
            result["debug_invariant"] = debug_cycle(args, device)
        except Exception:
            result["debug_invariant"] = {"ok": False, "error": traceback.format_exc()}
        print(f"debug invariant (normal cycle must not fire): {result['debug_invariant']}")
    ok = (not result["errors"] and result["cases"]
          and all(not c["mismatches"] and c["fused_kernel"] for c in result["cases"])
          and all(c["after"]["kernels_per_call"] == 1 for c in result["cases"])
          and result.get("debug_invariant", {"ok": True})["ok"])
    result["ok"] = bool(ok)
    write(args.out, result)
    print(f"wrote {args.out}; {'OK' if ok else 'CHECK FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("SGLANG_FUTUREMAP_PATCH", "strict")
    sys.exit(main())
