#!/usr/bin/env python3
"""CPU self-test of the GPU smoke harness (no GPU, no SGLang needed).

Checks the pure analysis functions of ``gpu_smoke.py``, the call-count probe in
``gpu_probe/`` (including a SIGKILLed spawned child), the host-sync probe
(``gpu_probe/smoke_sync_probe.py``: attribution, wrappers, iteration counting, report
aggregation), the model factory's names/shapes, and the whole two-run orchestration against
a fake ``sglang`` package whose "scheduler" is a spawned subprocess::

    python3 scripts/gpu_smoke_selftest.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_smoke as gs  # noqa: E402
from gpu_harness import child_env, logs, model_factory  # noqa: E402

ssp = child_env.probe_module("smoke_sync_probe")  # the module only; nothing is installed by importing it

FAILURES: list[str] = []


def expect(cond: bool, what: str) -> None:
    print(f"  [{'ok' if cond else 'FAIL'}] {what}")
    if not cond:
        FAILURES.append(what)


def test_pure() -> None:
    print("pure functions")
    expect(gs.tail_period([1, 2, 1, 2, 1, 2, 1, 2]) == 2, "tail_period period 2")
    expect(gs.tail_period([5] * 10) == 1, "tail_period constant")
    expect(gs.tail_period(list(range(40))) is None, "tail_period aperiodic")
    expect(gs.tail_period(list(range(40)) + [7, 8, 9] * 12) == 3, "tail_period only looks at the tail")

    w = gs.make_workload(16, 4096)
    expect(len(w) == 16 and w == gs.make_workload(16, 4096), "workload is deterministic")
    expect(all(3 <= t < 4096 for p in w for t in p.input_ids), "workload ids in range")
    expect(len({len(p.input_ids) for p in w}) == 16 and {p.max_new_tokens for p in w} >= {16, 128},
           "workload lengths vary, budgets span 16..128")

    prompts = [gs.Prompt([3, 4], 4), gs.Prompt([5], 4)]
    r = gs.compare_outputs(prompts, [[1, 2, 3, 4], [9, 9, 9, 9]], [[1, 2, 3, 4], [9, 9, 8, 9]])
    expect(r[0].match and not r[1].match and r[1].first_mismatch == 2, "compare_outputs finds first mismatch")
    r = gs.compare_outputs(prompts, [[1, 2, 3, 4]], [[1, 2, 3]])
    expect(not r[0].match and r[0].first_mismatch == 3 and not r[1].match, "compare_outputs: length / missing")

    log = textwrap.dedent("""\
        [2026-01-01 00:00:00 INFO pid=10] sglang_futuremap_patch: applied 3 back-ports (9 targets) to SGLang 0.5.12.post1 [pid 10]: a (#1)
        [2026-01-01 00:00:01] sglang_futuremap_patch: applied 3 back-ports (9 targets) to SGLang 0.5.12.post1 [pid 11]: a (#1)
        [2026-01-01 00:00:01 INFO pid=10] Available plugins for group sglang.srt.plugins:
        [2026-01-01 00:00:01 INFO pid=10]   - futuremap -> sglang_futuremap_patch._plugin:register
        [2026-01-01 00:00:02 INFO pid=11] Executed general plugin: futuremap
        """)
    f = logs.scan_log(log)
    expect(f.applied_pids == [10, 11] and f.applied_lines == 2 and not f.bad_lines, "scan_log: applied lines, pids")
    bad = log + textwrap.dedent("""\
        [2026-01-01 00:00:03 WARNING pid=11] sglang_futuremap_patch: skipped, SGLang x left untouched: y
        Failed to execute general plugin: futuremap
          File "/site/sglang_futuremap_patch/_api.py", line 3, in apply
        /site/sglang_futuremap_patch/_engine.py:12: UserWarning: careful
        [2026-01-01 00:00:04] sglang_futuremap_patch: skipped, SGLang x left untouched: y
        [2026-01-01 00:00:05 ERROR pid=11] hook sglang_futuremap_patch.backports.x raised
        """)
    f = logs.scan_log(bad)
    expect(len(f.bad_lines) == 6, f"scan_log: 6 bad lines (got {len(f.bad_lines)})")
    f = logs.scan_log("[t INFO pid=3] sglang_futuremap_patch: disabled by SGLANG_FUTUREMAP_PATCH=off; x\n")
    expect(f.disabled_lines == 1 and f.applied_lines == 0 and not f.bad_lines, "scan_log: disabled line")

    probe = logs.summarize_probe([
        {"pid": 2, "proctitle": "sglang::scheduler_TP0", "total": 5, "mechanism": "m"},
        {"pid": 1, "proctitle": None, "total": 1, "mechanism": "m"},
        {"pid": 3, "proctitle": "sglang::detokenizer", "total": 0, "mechanism": "m"},
    ])
    expect(probe.scheduler_pids == [2] and probe.scheduler_calls == 5 and probe.total_calls == 6, "summarize_probe")

    # evaluate(): a passing pair and single-fault variants.
    prompts = gs.make_workload(4, 4096)
    outs = [list(range(p.max_new_tokens)) for p in prompts]

    def run(mode: str, outputs: list[list[int]], calls: int, applied: bool = True) -> dict:
        if mode == "off":
            text = "[t INFO pid=1] sglang_futuremap_patch: disabled by X=off\n"
        else:
            text = "".join(f"[t INFO pid={p}] sglang_futuremap_patch: applied 3 [pid {p}]\n" for p in ((1, 2) if applied else (1,)))
        return {
            "returncode": 0,
            "result": {"pid": 1, "outputs": outputs},
            "log": logs.scan_log(text),
            "probe": logs.summarize_probe([{"pid": 2, "proctitle": "sglang::scheduler_TP0", "total": calls}]),
        }

    checks, _ = gs.evaluate(prompts, run("off", outs, 10), run("strict", outs, 0))
    expect(all(c.ok for c in checks), "evaluate: good pair passes")
    changed = [o[:] for o in outs]
    changed[1][3] += 1
    for label, stock, patched, failing in [
        ("mismatch", run("off", outs, 10), run("strict", changed, 0), "outputs identical"),
        ("patched calls", run("off", outs, 10), run("strict", outs, 3), f"patched run never calls {child_env.PROBE_FUNC}"),
        ("stock no calls", run("off", outs, 0), run("strict", outs, 0), f"stock scheduler calls {child_env.PROBE_FUNC}"),
        ("scheduler not applied", run("off", outs, 10), run("strict", outs, 0, applied=False),
         "patched log: applied in every process"),
        ("cyclic", run("off", [[1, 2] * (p.max_new_tokens // 2) for p in prompts], 10),
         run("strict", [[1, 2] * (p.max_new_tokens // 2) for p in prompts], 0), "outputs not trivially cyclic"),
    ]:
        checks, _ = gs.evaluate(prompts, stock, patched)
        failed = [c.name for c in checks if not c.ok]
        expect(failed == [failing], f"evaluate: {label} -> only '{failing}' fails (got {failed})")

    a = gs.build_parser().parse_args(["--models", "m", "--no-cuda-graph", "--log-dir", "l", "--out-json", "o.json"])
    expect(a.cuda_graph is False and a.models == Path("m") and a.patched_mode == "strict", "argument parsing")
    expect(a.attention_backend == "triton" and a.piecewise_cuda_graph is False and not a.sync_probe
           and a.batch_concurrency == 0 and a.max_new_tokens is None and not a.expect_zero_seq_lens_syncs,
           "new options default to today's behaviour")
    a = gs.build_parser().parse_args(["--attention-backend", "flashinfer", "--piecewise-cuda-graph", "--sync-probe",
                                      "--expect-zero-seq-lens-syncs", "--batch-concurrency", "4"])
    cfg = gs.run_config(a, None)
    expect(cfg["attention_backend"] == "flashinfer" and cfg["piecewise_cuda_graph"] and cfg["sync_probe"]
           and cfg["batch_concurrency"] == 4 and cfg["cuda_graph"], "new options parse; run_config records them")
    kw = gs.engine_kwargs("t", "d", cuda_graph=True, mem_fraction=0.3, seed=0)
    expect(kw["disable_cuda_graph"] is False and kw["speculative_algorithm"] == "STANDALONE"
           and kw["disable_piecewise_cuda_graph"] is True and kw["attention_backend"] == "triton", "engine kwargs")
    kw2 = gs.engine_kwargs("t", "d", cuda_graph=True, mem_fraction=0.3, seed=0, attention_backend="flashinfer",
                           piecewise_cuda_graph=True)
    expect(kw2["attention_backend"] == "flashinfer" and kw2["disable_piecewise_cuda_graph"] is False
           and {k: v for k, v in kw2.items() if k not in ("attention_backend", "disable_piecewise_cuda_graph")}
           == {k: v for k, v in kw.items() if k not in ("attention_backend", "disable_piecewise_cuda_graph")},
           "engine kwargs: backend and piecewise CUDA graph only change their own keys")
    w2 = gs.make_workload(16, 4096, max_new_tokens=200)
    expect([p.input_ids for p in w2] == [p.input_ids for p in w] and {p.max_new_tokens for p in w2} == {200},
           "make_workload: --max-new-tokens keeps the prompts, overrides the budgets")
    env = child_env.subprocess_env("off", Path("/x"), None)
    env_on = child_env.subprocess_env("off", Path("/x"), None, sync_probe=True, seq_lens_sites=["a", "b"])
    expect("SMOKE_SYNC_PROBE" not in env and env_on["SMOKE_SYNC_PROBE"] == "1"
           and env_on["SMOKE_SYNC_SEQ_LENS_SITES"] == "a,b", "sync probe env only with --sync-probe")

    log = "\n".join([f"[t INFO pid=1] line {i}" for i in range(200)]
                    + ["[t INFO pid=1] sglang_futuremap_patch: applied x", "Traceback (most recent call last):",
                       '  File "/x/y.py", line 3, in f', "ValueError: boom"]
                    + [f"[t INFO pid=1] tail {i}" for i in range(30)])
    t = logs.trim_log(log, max_lines=10, tail=5)
    tl = t.splitlines()
    expect("sglang_futuremap_patch: applied x" in t and "ValueError: boom" in t and '  File "/x/y.py"' in t
           and "line 7" not in t and tl[-1].endswith("tail 29") and len(tl) == 4 + 1 + 5, "trim_log")


def test_sync_pure() -> None:
    print("sync probe: pure functions")
    from types import SimpleNamespace as NS

    def code(name, fn, qn=None):
        return NS(co_name=name, co_filename=fn, co_qualname=qn or name)

    sg = "/site/sglang/srt/managers/schedule_batch.py"
    pl = "/site/sglang_futuremap_patch/backports/publish_stash.py"
    th = "/site/torch/_tensor.py"
    stack = [code("__bool__", th), code("helper", sg, "helper"), code("filter_batch", sg, "ScheduleBatch.filter_batch"),
             code("event_loop", sg, "Scheduler.event_loop")]
    expect(ssp.attribute(stack) == ("helper", "filter_batch"), f"attribute: innermost SGLang site, seq_lens anchor "
           f"{ssp.attribute(stack)}")
    expect(ssp.site_key("helper", "filter_batch") == "filter_batch > helper"
           and ssp.site_key("ScheduleBatch.filter_batch", "filter_batch") == "ScheduleBatch.filter_batch"
           and ssp.site_key("x", None) == "x", "site_key")
    stack = [code("resolve_seq_lens_cpu", pl, "resolve_seq_lens_cpu"), code("forward_spec_v2_overlap", pl)]
    expect(ssp.attribute(stack) == ("resolve_seq_lens_cpu", "resolve_seq_lens_cpu"), "attribute: plugin frames count")
    stack = [code("f", "/home/me/x.py"), code("g", "/usr/lib/python3/threading.py")]
    expect(ssp.attribute(stack) == ("<other>:f", None), "attribute: no SGLang frame")
    stack = [code("process_batch_result_decode", sg, "Scheduler.process_batch_result_decode")]
    expect(ssp.attribute(stack) == ("Scheduler.process_batch_result_decode", None), "attribute: not a seq_lens site")
    expect(ssp.attribute([code("merge_batch", sg)], ["other"]) == ("merge_batch", None), "attribute: custom sites")
    expect(ssp.is_ours("C:\\py\\sglang\\srt\\x.py") and not ssp.is_ours("/x/sglang_router/y.py")
           and not ssp.is_ours("/x/mysglang/y.py"), "is_ours")

    class Dev:
        def __init__(self, t):
            self.type = t
    Dev.__name__ = "device"

    class T:
        def __init__(self, cuda=True):
            self.is_cuda = cuda
            self.device = Dev("cuda" if cuda else "cpu")

    g, c = T(), T(False)
    for args, kwargs, want in [((g, "cpu"), {}, "sync"), ((g, "cuda:0"), {}, None), ((g, "cpu"), {"non_blocking": True}, "async"),
                               ((g, "cpu", None, True), {}, "async"), ((g,), {"device": "cpu"}, "sync"),
                               ((g, Dev("cpu")), {}, "sync"), ((g, c), {}, "sync"), ((g, "float"), {}, None),
                               ((c, "cpu"), {}, None), ((g,), {"dtype": "x"}, None)]:
        got = ssp.to_verdict(args, kwargs)
        expect(got == want, f"to_verdict {args[1:]} {kwargs} -> {want} (got {got})")
    expect(ssp.to_verdict((c, "cpu"), {}, all_devices=True) == "sync", "to_verdict: all_devices")

    # A "sync" wrapper on a stand-in class, in this process, without installing anything on torch.
    class Stand:
        def synchronize(self):
            return "done"

    probe = ssp.Probe("/nonexistent")
    import threading

    probe.tid = threading.get_ident()
    probe._wrap(Stand, "synchronize", "Stand.synchronize", "sync")  # noqa: SLF001

    def maybe_wait_verify_done():
        return Stand().synchronize()

    other = []
    th_ = threading.Thread(target=lambda: other.append(Stand().synchronize()))
    r1 = maybe_wait_verify_done()
    th_.start()
    th_.join()
    Stand().synchronize()
    snap = probe.snapshot()
    rows = {(x["site"], x["seq_lens"]): x["count"] for x in snap["syncs"]}
    expect(r1 == "done" and other == ["done"] and sum(rows.values()) == 2, f"sync wrapper: result kept, other thread "
           f"not counted ({rows})")
    expect(any(k[1] and k[0].endswith("maybe_wait_verify_done") for k in rows), "sync wrapper: seq_lens anchor")
    probe.uninstall()
    expect(Stand.synchronize.__name__ == "synchronize" and not hasattr(Stand.synchronize, "__wrapped__"),
           "uninstall restores the original")

    # Report aggregation.
    def rec(pid, iters, syncs, installed=True, bs=None):
        return {"kind": "sync-probe", "pid": pid, "installed": installed, "iterations": iters, "proctitle": "t",
                "batch_size_sum": bs or {}, "syncs": syncs, "wrapped": ["Tensor.item"], "errors": [], "async_d2h": {}}

    def row(mode, site, op, seq, count, blocked, hit=0):
        return {"mode": mode, "site": site, "op": op, "seq_lens": seq, "count": count, "blocked_s": blocked,
                "seq_lens_tensor": hit}

    stock = logs.summarize_sync([
        rec(7, {"DECODE": 10, "EXTEND": 2}, [
            row("DECODE", "ScheduleBatch.maybe_wait_verify_done", "cuda.Event.synchronize", True, 20, 0.010),
            row("DECODE", "prepare_for_decode", "Tensor.cpu", True, 10, 0.002, 10),
            row("DECODE", "Scheduler.process_batch_result_decode", "cuda.Event.synchronize", False, 10, 0.030),
            row("EXTEND", "Scheduler.process_batch_result_prefill", "cuda.Event.synchronize", False, 2, 0.004),
        ], bs={"DECODE": 40}),
        rec(8, {}, [], installed=False),
        {"pid": 9, "total": 3},  # a call-count record: ignored
    ])
    d = stock["decode"]
    expect(stock["decode_iterations"] == 10 and stock["pids"] == [7] and stock["mean_decode_batch_size"] == 4.0,
           "summarize_sync: decode iterations, installed pids only, batch size")
    expect(d["syncs"] == 40 and d["seq_lens_syncs"] == 30 and abs(d["per_iteration"]["syncs"] - 4.0) < 1e-9
           and abs(d["per_iteration"]["seq_lens_syncs"] - 3.0) < 1e-9
           and abs(d["per_iteration"]["blocked_ms"] - 4.2) < 1e-9
           and abs(d["per_iteration"]["seq_lens_blocked_ms"] - 1.2) < 1e-9
           and d["per_iteration"]["seq_lens_tensor_syncs"] == 1.0, f"summarize_sync: decode per-iteration {d['per_iteration']}")
    expect([x["count"] for x in d["sites"]] == [20, 10, 10] and d["sites"][0]["mean_us"] == 500.0
           and abs(d["sites"][0]["blocked_ms_per_iteration"] - 1.0) < 1e-9, "summarize_sync: site breakdown sorted")
    expect(stock["all"]["syncs"] == 42 and stock["all"]["iterations"] == 12, "summarize_sync: all modes")
    two = logs.summarize_sync([rec(1, {"DECODE": 2}, [row("DECODE", "s", "Tensor.item", False, 2, 0.0)]),
                             rec(2, {"DECODE": 2}, [row("DECODE", "s", "Tensor.item", False, 6, 0.0)])])
    expect(two["decode"]["per_iteration"]["syncs"] == 2.0 and len(two["decode"]["sites"]) == 1,
           "summarize_sync: two schedulers merge by site")
    empty = logs.summarize_sync([])
    expect(empty["decode_iterations"] == 0 and empty["decode"]["per_iteration"]["syncs"] is None, "summarize_sync: empty")
    patched = logs.summarize_sync([rec(7, {"DECODE": 5}, [
        row("DECODE", "resolve_seq_lens_cpu", "Tensor.cpu", True, 5, 0.001),
        row("DECODE", "Scheduler.process_batch_result_decode", "cuda.Event.synchronize", False, 5, 0.010)])])
    zero = logs.summarize_sync([rec(7, {"DECODE": 5}, [
        row("DECODE", "Scheduler.process_batch_result_decode", "cuda.Event.synchronize", False, 5, 0.010)])])
    text = "\n".join(gs.format_sync_report({"stock": {"sync": stock}, "patched": {"sync": patched}, "x": {}}))
    expect("stock: 10 decode iterations" in text and "4.00 syncs, 3.00 seq_lens syncs, 4.200 ms blocked" in text
           and "x: no sync-probe data" in text and "resolve_seq_lens_cpu" in text, "format_sync_report")

    prompts = gs.make_workload(4, 4096)
    outs = [list(range(p.max_new_tokens)) for p in prompts]

    def run(mode, calls, sync):
        text = ("[t INFO pid=1] sglang_futuremap_patch: disabled by X=off\n" if mode == "off" else
                "".join(f"[t INFO pid={p}] sglang_futuremap_patch: applied 3 [pid {p}]\n" for p in (1, 2)))
        return {"returncode": 0, "result": {"pid": 1, "outputs": outs}, "log": logs.scan_log(text), "sync": sync,
                "probe": logs.summarize_probe([{"pid": 2, "proctitle": "sglang::scheduler_TP0", "total": calls}])}

    for label, p_sync, s_sync, flags, failing in [
        ("probe on, report only", patched, stock, {"sync_probe": True}, []),
        ("expect zero, seq_lens syncs left", patched, stock, {"sync_probe": True, "expect_zero_seq_lens_syncs": True},
         ["patched: 0 seq_lens syncs per decode iteration"]),
        ("expect zero, none left", zero, stock, {"sync_probe": True, "expect_zero_seq_lens_syncs": True}, []),
        ("probe saw nothing", empty, stock, {"sync_probe": True, "expect_zero_seq_lens_syncs": True},
         ["sync probe: patched decode iterations counted", "patched: 0 seq_lens syncs per decode iteration"]),
        ("probe off", None, None, {}, []),
    ]:
        checks, _ = gs.evaluate(prompts, run("off", 10, s_sync), run("strict", 0, p_sync), **flags)
        failed = [c.name for c in checks if not c.ok]
        expect(failed == failing, f"evaluate with sync probe: {label} -> {failing} (got {failed})")
    try:
        gs.main(["--expect-zero-seq-lens-syncs"])
        expect(False, "--expect-zero-seq-lens-syncs without --sync-probe is refused")
    except SystemExit as exc:
        expect(exc.code == 2, "--expect-zero-seq-lens-syncs without --sync-probe is refused")


DUMMY = textwrap.dedent("""\
    import os, time, threading, multiprocessing as mp
    class ScheduleBatch:
        def maybe_wait_verify_done(self): pass
    def maybe_wait_verify_done(): pass
    def child(n):
        b = ScheduleBatch()
        for _ in range(n): b.maybe_wait_verify_done()
        time.sleep(1.5)
        os.kill(os.getpid(), 9)  # like SGLang's shutdown: SIGKILL, no atexit
    if __name__ == "__main__":
        mp.set_start_method("spawn")
        p = mp.Process(target=child, args=(7,)); p.start(); p.join()
        t = threading.Thread(target=lambda: [maybe_wait_verify_done() for _ in range(3)]); t.start(); t.join()
        for _ in range(1000): len([])
        maybe_wait_verify_done()
    """)


def test_probe(tmp: Path) -> None:
    print("probe")
    script = tmp / "dummy.py"
    script.write_text(DUMMY)
    out = tmp / "probe-out"
    env = dict(os.environ, SMOKE_PROBE_DIR=str(out), PYTHONPATH=str(child_env.PROBE_DIR))
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    recs = logs.read_probe_dir(out)
    totals = sorted(r["total"] for r in recs)
    expect(4 in totals and 7 in totals, f"probe counts main (4) and SIGKILLed spawned child (7): {totals}")
    expect(all(r["mechanism"] != "none" for r in recs), f"probe mechanism {sorted({r['mechanism'] for r in recs})}")
    env.pop("SMOKE_PROBE_DIR")
    out2 = tmp / "probe-off"
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    expect(not out2.exists(), "probe inactive without SMOKE_PROBE_DIR")


FAKE_MONITORING = textwrap.dedent("""\
    # Drives the probe's sys.monitoring branch through a stand-in namespace (for Pythons < 3.12).
    import runpy, sys, types
    calls = {}
    class Events: PY_START = 1
    class FakeMonitoring:
        PROFILER_ID, OPTIMIZER_ID, DISABLE, events = 2, 5, object(), Events
        used = {4}  # taken by someone else; PROFILER_ID (2) is left for cProfile
        def use_tool_id(self, i, name):
            if i in self.used: raise ValueError(i)
            self.used.add(i); calls["tool"] = i
        def register_callback(self, i, ev, fn): calls["cb"] = fn
        def set_events(self, i, ev): calls["events"] = ev
    sys.monitoring = FakeMonitoring()
    g = runpy.run_path(sys.argv[1])
    def maybe_wait_verify_done(): pass
    def other(): pass
    cb = calls["cb"]
    assert calls["tool"] == 3 and calls["events"] == 1, calls
    assert cb(other.__code__, 0) is sys.monitoring.DISABLE
    for _ in range(3): assert cb(maybe_wait_verify_done.__code__, 0) is None
    """)


def test_probe_monitoring_branch(tmp: Path) -> None:
    if sys.version_info >= (3, 12):
        return  # test_probe already ran the real sys.monitoring branch
    print("probe (sys.monitoring branch, stand-in namespace)")
    script = tmp / "fake_monitoring.py"
    script.write_text(FAKE_MONITORING)
    out = tmp / "probe-mon"
    env = dict(os.environ, SMOKE_PROBE_DIR=str(out))
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, str(script), str(child_env.PROBE_DIR / "sitecustomize.py")], env=env, timeout=60,
                       capture_output=True, text=True)
    recs = logs.read_probe_dir(out)
    expect(r.returncode == 0 and [x["total"] for x in recs] == [3] and recs[0]["mechanism"] == "sys.monitoring:3",
           "monitoring branch counts 3 calls with tool id 3 (4 taken, 2 left for cProfile)"
           + ("" if r.returncode == 0 and recs else f" (rc {r.returncode}, {recs}, {r.stderr[-300:]})"))


SYNC_SCHED = textwrap.dedent("""\
    # Stand-in for sglang/srt/managers/scheduler.py (its path makes its frames "SGLang" frames).
    import os, time
    try:
        import torch
        if os.environ.get("SYNC_NO_TORCH") == "1":
            torch = None
    except ImportError:
        torch = None

    class Mode:
        def __init__(self, name):
            self.name = name

    class ScheduleBatch:
        def __init__(self, n, mode):
            self.reqs = [0] * n
            self.forward_mode = Mode(mode)
            self.seq_lens = torch.arange(n) if torch is not None else None

        def filter_batch(self):
            return helper_cpu(self.seq_lens)

        def prepare_for_decode(self):
            return self.seq_lens.sum().item()

    def helper_cpu(t):
        return t.cpu()

    class Scheduler:
        def run_batch(self, batch):
            if torch is None:
                return None
            x = torch.ones(3)
            x.tolist(); bool(x[0]); int(x[0]); float(x[0]); x.numpy()
            x.to("cpu"); x.to("cpu", non_blocking=True); x.to(torch.float64)
            return None

    class NotAScheduler:
        def run_batch(self, batch):
            return None
    """)

SYNC_PLUGIN = textwrap.dedent("""\
    # Stand-in for the plugin's Scheduler.run_batch wrapper (delegates to the stock method).
    def run_batch(self, batch, *, _stock_run_batch=None):
        return _stock_run_batch(self, batch)
    """)

SYNC_MAIN = textwrap.dedent("""\
    import functools, os, sys, threading, time, multiprocessing as mp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sglang.srt.managers import scheduler as S
    from sglang_futuremap_patch.backports import fake as P

    def run_scheduler_process(n):
        stock = S.Scheduler.run_batch
        S.Scheduler.run_batch = functools.partialmethod(P.run_batch, _stock_run_batch=stock)  # like load_plugins()
        s = S.Scheduler()
        if S.torch is not None:
            S.torch.ones(2).tolist()  # before the first run_batch: start-up, not counted
        S.NotAScheduler().run_batch(None)
        for _ in range(n):
            b = S.ScheduleBatch(4, "DECODE")
            s.run_batch(b)
            if S.torch is not None:
                b.filter_batch()
                b.prepare_for_decode()
        s.run_batch(S.ScheduleBatch(2, "EXTEND"))
        if S.torch is not None:
            S.torch.ones(2).tolist()
            t = threading.Thread(target=lambda: S.torch.ones(2).tolist())  # another thread: not counted
            t.start(); t.join()
        time.sleep(1.5)
        os.kill(os.getpid(), 9)  # SIGKILL, like SGLang's shutdown

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        p = mp.Process(target=run_scheduler_process, args=(5,)); p.start(); p.join()
        if S.torch is not None:
            S.torch.ones(2).tolist()  # the parent never installs anything
    """)


def _sync_tree(tmp: Path) -> Path:
    root = tmp / "synctree"
    files = {
        "sglang/__init__.py": "", "sglang/srt/__init__.py": "", "sglang/srt/managers/__init__.py": "",
        "sglang/srt/managers/scheduler.py": SYNC_SCHED, "sglang_futuremap_patch/__init__.py": "",
        "sglang_futuremap_patch/backports/__init__.py": "", "sglang_futuremap_patch/backports/fake.py": SYNC_PLUGIN,
        "main.py": SYNC_MAIN,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _other_python() -> str | None:
    """A Python 3.12+ (sys.monitoring) when this one is older, to run the hook test there too."""
    if sys.version_info >= (3, 12):
        return None
    import glob
    import shutil

    cands = [shutil.which("python3.12"), shutil.which("python3.13")]
    cands += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python3")))
    for c in cands:
        if c and os.path.exists(c):
            r = subprocess.run([c, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True,
                               text=True, timeout=30)
            if r.returncode == 0 and r.stdout.strip() == "True":
                return c
    return None


def test_sync_probe(tmp: Path) -> None:
    print("sync probe: spawned stand-in scheduler, SIGKILLed")
    root = _sync_tree(tmp)
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    pythons = [(sys.executable, have_torch)]
    other = _other_python()
    if other:
        pythons.append((other, None))
    for py, torch_ok in pythons:
        out = tmp / f"sync-out-{len(os.listdir(tmp))}"
        env = dict(os.environ, SMOKE_PROBE_DIR=str(out), SMOKE_SYNC_PROBE="1", SMOKE_SYNC_PROBE_ALL_DEVICES="1",
                   PYTHONPATH=str(child_env.PROBE_DIR), SMOKE_PROBE_FLUSH_S="0.2")
        r = subprocess.run([py, str(root / "main.py")], env=env, timeout=120, capture_output=True, text=True)
        recs = logs.read_sync_records(out)
        tag = f"[{os.path.basename(py)} {'sys.monitoring' if 'sys.monitoring' in json.dumps(logs.read_probe_dir(out)) else 'setprofile'}]"
        if torch_ok is None:
            torch_ok = not any("torch not importable" in e for rec in recs for e in rec.get("errors", []))
        expect(r.returncode == 0 and len(recs) == 1, f"{tag} one sync record, from the scheduler child only "
               f"(rc {r.returncode}, {len(recs)} records) {r.stderr[-300:] if r.returncode else ''}")
        if not recs:
            continue
        rec = recs[0]
        expect(rec["iterations"] == {"DECODE": 5, "EXTEND": 1} and rec["batch_size_sum"] == {"DECODE": 20, "EXTEND": 2},
               f"{tag} iterations: plugin wrapper + stock run_batch count once; non-Scheduler run_batch ignored "
               f"({rec['iterations']})")
        if not torch_ok:
            print(f"  ({tag} no torch there: wrappers not checked)")
            continue
        sy = logs.summarize_sync(recs)
        d = sy["decode"]
        sites = {(x["site"], x["op"]): x["count"] for x in d["sites"]}
        want = {("Scheduler.run_batch", op): 5 for op in ("Tensor.tolist", "Tensor.__bool__", "Tensor.__int__",
                                                        "Tensor.__float__", "Tensor.numpy", "Tensor.to(cpu)")}
        want[("filter_batch > helper_cpu", "Tensor.cpu")] = 5
        want[("ScheduleBatch.prepare_for_decode", "Tensor.item")] = 5
        expect(sites == want, f"{tag} decode syncs by site and op: {sites}")
        expect(d["per_iteration"]["syncs"] == 8.0 and d["per_iteration"]["seq_lens_syncs"] == 2.0
               and d["seq_lens_tensor_syncs"] == 5, f"{tag} per decode iteration: 8 syncs, 2 seq_lens, "
               f"5 on batch.seq_lens itself ({d['per_iteration']}, {d['seq_lens_tensor_syncs']})")
        expect(sy["all"]["syncs"] == 40 + 6 + 1 and sy["iterations"]["EXTEND"] == 1,
               f"{tag} EXTEND iteration: its own 6 run_batch syncs + 1 after; start-up and other threads not counted "
               f"({sy['all']['syncs']})")
        expect(sum(sy["async_d2h"].values()) == 6 and all(v >= 0 for x in d["sites"] for v in [x["blocked_s"]]),
               f"{tag} non_blocking D2H counted apart ({sy['async_d2h']})")
        expect(not sy["errors"] and "cuda.Event.synchronize" in sy["wrapped"] and "Tensor.item" in sy["wrapped"],
               f"{tag} wrapped {sy['wrapped']}, errors {sy['errors']}")
    out = tmp / "sync-off"
    env = dict(os.environ, SMOKE_PROBE_DIR=str(out), PYTHONPATH=str(child_env.PROBE_DIR), SYNC_NO_TORCH="1")
    env.pop("SMOKE_SYNC_PROBE", None)
    subprocess.run([sys.executable, str(root / "main.py")], env=env, timeout=120, check=True, capture_output=True)
    expect(not logs.read_sync_records(out) and "smoke_sync_probe" not in json.dumps(logs.read_probe_dir(out)),
           "sync probe inactive without SMOKE_SYNC_PROBE=1")


def test_models(tmp: Path) -> None:
    print("model factory")
    try:
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        print("  (skipped: torch/safetensors not installed)")
        return
    t, d = model_factory.make_models(tmp / "models", hidden_size=64, intermediate_size=128, num_heads=4,
                                     num_kv_heads=2, head_dim=16, vocab_size=256)
    expect(not model_factory.check_model_dir(t) and not model_factory.check_model_dir(d),
           "small models: names/shapes/dtype")
    from safetensors.torch import load_file

    tw, dw = load_file(str(t / "model.safetensors")), load_file(str(d / "model.safetensors"))
    expect(len(tw) == 3 + 9 * 4 and len(dw) == 3 + 9 * 2, "target has 4 layers, draft 2")
    expect(all(bool((tw[k] == dw[k]).all()) for k in dw), "draft tensors are copies of the target's")
    cfg = json.loads((d / "config.json").read_text())
    expect(cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 2, "draft config")


FAKE_SGLANG = textwrap.dedent('''\
    """Fake sglang for the harness self-test: a spawned "scheduler" that counts like the real one."""
    import json, logging, multiprocessing as mp, os, time
    __version__ = "0.0-fake"
    logger = logging.getLogger("sglang_futuremap_patch")

    def _configure():
        path = os.environ.get("SGLANG_LOGGING_CONFIG_PATH")
        if path:
            import logging.config
            logging.config.dictConfig(json.load(open(path)))

    def _announce():
        if os.environ.get("SGLANG_FUTUREMAP_PATCH") == "off":
            logger.info("sglang_futuremap_patch: disabled by SGLANG_FUTUREMAP_PATCH=off; SGLang fake left untouched")
        else:
            logger.info(f"sglang_futuremap_patch: applied 3 back-ports (9 targets) to SGLang fake [pid {os.getpid()}]: x")

    _torch = None

    class _Mode:
        name = "DECODE"

    class ScheduleBatch:
        forward_mode = _Mode()
        reqs = [0]

        def maybe_wait_verify_done(self):
            if _torch is not None:
                _torch.ones(1).item()  # a "seq_lens sync" for the sync probe

    class Scheduler:
        def run_batch(self, batch):
            if _torch is not None:
                _torch.ones(1).tolist()  # a non-seq_lens sync

    def _scheduler(conn):
        global _torch
        if os.environ.get("SMOKE_SYNC_PROBE") == "1":
            import torch as _torch
        import setproctitle
        _announce()
        _configure()
        setproctitle.setproctitle("sglang::scheduler_TP0")
        logging.getLogger("sglang.scheduler").info("scheduler up")
        stock = os.environ.get("SGLANG_FUTUREMAP_PATCH") == "off"
        bad = os.environ.get("FAKE_BAD") == "1"
        b = ScheduleBatch()
        s = Scheduler()
        while True:
            reqs = conn.recv()
            outs = []
            for ids, n in reqs:
                for _ in range(n):
                    s.run_batch(b)
                    if stock or bad:
                        b.maybe_wait_verify_done()
                out = [(sum(ids) * 31 + k * k * 17 + k) % 4093 + 3 for k in range(n)]
                if bad and not stock:
                    out[-1] += 1
                outs.append(out)
            conn.send(outs)

    class Engine:
        def __init__(self, **kw):
            _configure()
            _announce()
            ctx = mp.get_context("spawn")
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(target=_scheduler, args=(child,), daemon=True)
            self._proc.start()

        def generate(self, input_ids, sampling_params):
            self._conn.send([(ids, sp["max_new_tokens"]) for ids, sp in zip(input_ids, sampling_params)])
            outs = self._conn.recv()
            return [{"output_ids": o, "meta_info": {"spec_accept_length": 2.5, "spec_verify_ct": len(o)}} for o in outs]

        def shutdown(self):
            self._proc.kill()  # SGLang SIGKILLs its children too
            self._proc.join()
    ''')


def test_orchestration(tmp: Path) -> None:
    print("orchestration with a fake sglang")
    fake = tmp / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text(FAKE_SGLANG)
    model = tmp / "fake-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 4096}))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(fake) + (os.pathsep + old if old else "")
    os.environ["SMOKE_PROBE_SETTLE_S"] = "1.0"  # the probe flushes every 0.5 s
    try:
        for bad in (False, True):
            os.environ["FAKE_BAD"] = "1" if bad else "0"
            log_dir = tmp / f"logs-{int(bad)}"
            out_json = log_dir / "smoke.json"
            rc = gs.main(["--target", str(model), "--draft", str(model), "--log-dir", str(log_dir),
                          "--out-json", str(out_json), "--timeout", "60"])
            doc = json.loads(out_json.read_text())
            failed = sorted(c["name"] for c in doc["checks"] if not c["ok"])
            if not bad:
                expect(rc == 0 and doc["passed"], f"good fake run passes (rc {rc}, failed {failed})")
                expect(sorted(p.name for p in log_dir.iterdir()) == ["patched.log", "smoke.json", "stock.log"],
                       "files written: patched.log, smoke.json, stock.log")
            else:
                want = sorted(["outputs identical", f"patched run never calls {child_env.PROBE_FUNC}"])
                expect(rc == 1 and failed == want, f"bad fake run fails exactly {want} (rc {rc}, failed {failed})")
        try:
            import torch  # noqa: F401
        except ImportError:
            print("  (sync-probe orchestration skipped: torch not installed)")
            return
        os.environ["SMOKE_SYNC_PROBE_ALL_DEVICES"] = "1"  # the fake "syncs" are on CPU tensors
        for bad in (False, True):
            os.environ["FAKE_BAD"] = "1" if bad else "0"
            log_dir = tmp / f"logs-sync-{int(bad)}"
            out_json = log_dir / "smoke.json"
            rc = gs.main(["--target", str(model), "--draft", str(model), "--log-dir", str(log_dir), "--num-prompts", "4",
                          "--batch-concurrency", "3", "--out-json", str(out_json), "--timeout", "60", "--sync-probe",
                          "--expect-zero-seq-lens-syncs"])
            doc = json.loads(out_json.read_text())
            failed = sorted(c["name"] for c in doc["checks"] if not c["ok"])
            st, pa = doc["runs"]["stock"]["sync"], doc["runs"]["patched"]["sync"]
            n_tok = sum(p.max_new_tokens for p in gs.make_workload(4, 4096)) + 16  # + the warm-up request
            if not bad:
                expect(rc == 0 and doc["passed"] and doc["config"]["sync_probe"] and doc["config"]["batch_concurrency"] == 3,
                       f"sync-probe fake run passes, config recorded (rc {rc}, failed {failed})")
                expect(st["decode_iterations"] == n_tok == pa["decode_iterations"]
                       and st["decode"]["per_iteration"]["syncs"] == 2.0
                       and st["decode"]["per_iteration"]["seq_lens_syncs"] == 1.0
                       and pa["decode"]["per_iteration"]["syncs"] == 1.0
                       and pa["decode"]["per_iteration"]["seq_lens_syncs"] == 0.0,
                       f"sync-probe fake run: stock 2 syncs (1 seq_lens) per decode iteration, patched 1 (0) "
                       f"({st['decode']['per_iteration']}, {pa['decode']['per_iteration']}, {st['decode_iterations']} it)")
                summary = (log_dir / "stock.log").read_text()
                expect("smoke-probe" not in summary, "no probe errors in the worker log")
            else:
                want = sorted(["outputs identical", f"patched run never calls {child_env.PROBE_FUNC}",
                               "patched: 0 seq_lens syncs per decode iteration"])
                expect(rc == 1 and failed == want, f"bad sync-probe fake run fails exactly {want} (failed {failed})")
    finally:
        os.environ.pop("SMOKE_SYNC_PROBE_ALL_DEVICES", None)
        os.environ.pop("SMOKE_PROBE_SETTLE_S", None)
        os.environ.pop("FAKE_BAD", None)
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="smoke-selftest-") as d:
        tmp = Path(d)
        test_pure()
        test_probe(tmp)
        test_probe_monitoring_branch(tmp)
        test_sync_pure()
        test_sync_probe(tmp)
        test_models(tmp)
        test_orchestration(tmp)
    print(f"{len(FAILURES)} failure(s)" if FAILURES else "all self-tests passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
