"""CPU tests of the decode benchmark's logic (scripts/bench_spec_v2.py, scripts/plot_bench.py).

No GPU, no SGLang: the pure functions directly, and one end-to-end run of the orchestration
against a fake ``sglang`` (an in-process "scheduler" that calls ``run_batch``) and a fake
``torch`` (CUDA tensors and events that take a little time to "sync")."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_spec_v2 as bench  # noqa: E402
import plot_bench  # noqa: E402
from gpu_harness import child_env, launch, model_factory  # noqa: E402


# ----------------------------------------------------------------------------- helpers


def _trial(bs, tok_s, tpot=1.0, acc=4.0):
    return {"bs": bs, "decode_tok_s": tok_s, "tpot_ms": tpot, "accept_length": acc, "e2e_tok_s": tok_s * 0.9}


def _run(variant, rep, per_bs, *, valid=True, pass_="timed"):
    return {
        "variant": variant, "rep": rep, "pass": pass_, "valid": valid, "returncode": 0,
        "validity": "ok" if valid else "plugin not applied",
        "result": {"batches": {str(bs): {"trials": [_trial(bs, v) for v in vals]} for bs, vals in per_bs.items()}},
    }


def _case(model="tiny", backend="triton-nopcg", runs=(), probe=None, profile=None):
    return {"model": model, "backend": backend, "engine_kwargs": {}, "runs": list(runs),
            "probe": probe or {}, "profile": profile or {}}


def _doc(cases, **kw):
    d = bench.new_doc("bench_spec_v2.py --x", {"max_new_tokens": 256, "prompt_len": 64, "trials": 3})
    d["env"] = {"gpu": "NVIDIA H200", "sglang_version": "0.5.12.post1", "torch_version": "2.11.0"}
    d["cases"] = list(cases)
    d.update(kw)
    return d


# ----------------------------------------------------------------------------- pure functions


def test_parse_lists():
    assert bench.parse_int_list("1, 4,16,48") == [1, 4, 16, 48]
    with pytest.raises(ValueError):
        bench.parse_int_list("0,1")
    assert bench.parse_name_list("tiny,8b", bench.MODELS) == ["tiny", "8b"]
    with pytest.raises(ValueError):
        bench.parse_name_list("70b", bench.MODELS)


def test_spread_quantiles():
    s = bench.spread([4.0, None, 1.0, 3.0, 2.0])
    assert s["n"] == 4 and s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 4.0
    assert s["q1"] == pytest.approx(1.75) and s["q3"] == pytest.approx(3.25)
    assert bench.spread([None]) is None
    assert bench.spread([7.0])["q1"] == 7.0


def test_decode_metrics_subtracts_prefill():
    metas = [{"completion_tokens": 257, "spec_verify_ct": 64, "cached_tokens": 0}] * 4
    m = bench.decode_metrics(4, 257, t_prefill_s=0.05, t_total_s=0.55, metas=metas)
    assert m["decode_s"] == pytest.approx(0.5)
    assert m["decode_tok_s"] == pytest.approx(4 * 256 / 0.5)
    assert m["tpot_ms"] == pytest.approx(1000 * 0.5 / 256)
    assert m["accept_length"] == pytest.approx(257 / 64)
    assert m["short_outputs"] == 0
    bad = bench.decode_metrics(1, 10, t_prefill_s=0.2, t_total_s=0.1, metas=[])
    assert bad["decode_tok_s"] is None and bad["tpot_ms"] is None


def test_accept_length_fallback():
    assert bench.accept_length([{"spec_accept_length": 3.0}, {"spec_accept_length": 4.0}]) == 3.5
    assert bench.accept_length([{"completion_tokens": 8, "spec_verify_ct": 2}, {"completion_tokens": 4,
                                                                             "spec_verify_ct": 2}]) == 3.0
    assert bench.accept_length([]) is None


def test_prompts_fixed_and_fresh():
    a = bench.make_prompts(4, 64, 4096, tag="decode-0")
    assert a == bench.make_prompts(4, 64, 4096, tag="decode-0")
    assert a != bench.make_prompts(4, 64, 4096, tag="decode-1")
    assert all(len(p) == 64 and min(p) >= 3 and max(p) < 4096 for p in a)
    assert len({tuple(p) for p in a}) == 4


def test_engine_kwargs_backends(tmp_path):
    t, d = model_factory.write_model_dirs("8b", tmp_path)
    tc = json.loads(Path(t, "config.json").read_text())
    dc = json.loads(Path(d, "config.json").read_text())
    assert (tc["hidden_size"], tc["intermediate_size"], tc["num_hidden_layers"]) == (4096, 14336, 32)
    assert (tc["num_attention_heads"], tc["num_key_value_heads"], tc["vocab_size"]) == (32, 8, 32000)
    assert dc["num_hidden_layers"] == 1 and dc["hidden_size"] == 4096
    t2, d2 = model_factory.write_model_dirs("tiny", tmp_path)
    assert t2 == d2  # draft = target
    nopcg = bench.engine_kwargs("8b", "triton-nopcg", t, d, [48, 1, 4, 16])
    pcg = bench.engine_kwargs("8b", "triton-pcg", t, d, [1, 4], pcg_max_tokens=512)
    fi = bench.engine_kwargs("tiny", "flashinfer", t2, d2, [1])
    assert nopcg["disable_piecewise_cuda_graph"] is True and nopcg["attention_backend"] == "triton"
    assert nopcg["cuda_graph_bs"] == [1, 4, 16, 48] and nopcg["cuda_graph_max_bs"] == 48
    assert nopcg["load_format"] == "dummy" and nopcg["speculative_algorithm"] == "STANDALONE"
    assert (nopcg["speculative_num_steps"], nopcg["speculative_eagle_topk"], nopcg["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert pcg["disable_piecewise_cuda_graph"] is False and pcg["piecewise_cuda_graph_max_tokens"] == 512
    assert fi["attention_backend"] == "flashinfer" and fi["disable_piecewise_cuda_graph"] is True


def test_plan_alternates():
    plan = bench.plan_runs(3, probe=True, profile=False)
    assert [(p, r) for p, r, _ in plan] == [("timed", 0), ("timed", 1), ("timed", 2), ("probe", 0)]
    assert all([(v.name, v.mode) for v in group] == [("stock", "off"), ("patched", "strict")] for _, _, group in plan)
    assert bench.plan_runs(0, probe=False, profile=True) == [("timed", 0, [child_env.STOCK, child_env.PATCHED])]
    three = child_env.make_variants(["stock", "patched", "upstream"], upstream="/x/site-0513")
    plan = bench.plan_runs(1, probe=True, profile=False, variants=three)
    assert all([v.name for v in group] == ["stock", "patched", "upstream"] for _, _, group in plan)
    assert plan[0][2][2] == child_env.Variant("upstream", "off", "/x/site-0513")


def test_new_backends_and_the_long_context_model(tmp_path):
    t, d = model_factory.write_model_dirs("8b", tmp_path, bench.context_needed(8192, 256, 32, 128))
    assert json.loads(Path(t, "config.json").read_text())["max_position_embeddings"] == 16384
    assert json.loads(Path(d, "config.json").read_text())["max_position_embeddings"] == 16384
    assert bench.context_needed(64, 256, 32, 128) == 4096  # the usual rows keep the model as it was
    default = bench.engine_kwargs("8b", "default", t, d, [1, 4, 16, 48])
    assert "attention_backend" not in default and "disable_piecewise_cuda_graph" not in default
    assert default["piecewise_cuda_graph_max_tokens"] == 512 and default["cuda_graph_bs"] == [1, 4, 16, 48]
    fa3 = bench.engine_kwargs("8b", "fa3-pcg", t, d, [8], pcg_max_tokens=256)
    assert fa3["attention_backend"] == "fa3" and fa3["disable_piecewise_cuda_graph"] is False
    assert fa3["piecewise_cuda_graph_max_tokens"] == 256 and fa3["cuda_graph_max_bs"] == 8
    nopcg = bench.engine_kwargs("8b", "fa3-nopcg", t, d, [8])
    assert nopcg["disable_piecewise_cuda_graph"] is True and "piecewise_cuda_graph_max_tokens" not in nopcg
    assert "piecewise_cuda_graph_max_tokens" not in bench.engine_kwargs("8b", "triton-pcg", t, d, [8])
    assert [b for b in bench.BACKENDS if bench.backend_needs_fa3(b)] == ["default", "fa3-pcg", "fa3-nopcg"]
    long_case = bench.get_case(bench.new_doc("x", {}), "8b", "default", 8192)
    assert bench.case_name(long_case) == "8b/default prompt 8192"


def test_summarize_case_medians_ratios_pairs():
    runs = [
        _run("stock", 0, {1: [100, 110, 90]}), _run("patched", 0, {1: [120, 130, 125]}),
        _run("stock", 1, {1: [80, 80, 80]}), _run("patched", 1, {1: [100, 100, 100]}),
        _run("stock", 2, {1: [300]}, valid=False),  # left out
        _run("patched", 0, {1: [999]}, pass_="probe"),  # untimed: left out
    ]
    s = bench.summarize_case(_case(runs=runs))
    row = s["by_bs"]["1"]
    assert s["n_runs"] == {"stock": 2, "patched": 2} and s["invalid_runs"] == 1
    assert row["stock"]["decode_tok_s"]["values"] == [80.0, 100.0]
    assert row["patched"]["decode_tok_s"]["values"] == [100.0, 125.0]
    assert row["ratio"] == pytest.approx(112.5 / 90.0)
    assert row["paired_ratio"]["values"] == pytest.approx([1.25, 1.25])
    assert row["blocked_reduction"] is None


def test_summarize_probe_and_targets():
    probe = {
        "stock": {"by_bs": {"1": {"blocked_ms_per_iter": 2.0, "verify_done_ms_per_iter": 1.9, "syncs_per_iter": 3}}},
        "patched": {"by_bs": {"1": {"blocked_ms_per_iter": 0.1, "verify_done_ms_per_iter": 0.0, "syncs_per_iter": 1}}},
    }
    c1 = _case(runs=[_run("stock", 0, {1: [100]}), _run("patched", 0, {1: [111]})], probe=probe)
    c2 = _case(backend="triton-pcg", runs=[_run("stock", 0, {1: [100]}), _run("patched", 0, {1: [98]})])
    s = bench.summarize_case(c1)
    assert s["by_bs"]["1"]["blocked_reduction"] == pytest.approx(0.95)
    t = {(x["case"], x["target"]): x for x in bench.evaluate_targets([c1, c2])}
    assert t[("tiny/triton-nopcg bs 1", "decode tok/s ratio >= 1.10")]["met"] is True
    assert t[("tiny/triton-nopcg bs 1", "blocked ms/iter down >= 90%")]["met"] is True
    assert t[("tiny/triton-pcg bs 1", "decode tok/s ratio >= 0.99")]["met"] is False
    assert ("tiny/triton-pcg bs 1", "blocked ms/iter down >= 90%") not in t  # no probe data, no target line


def test_union_and_idle_fraction_on_synthetic_trace(tmp_path):
    assert bench.union_length([(0, 10), (5, 15), (20, 30)]) == 25
    assert bench.union_length([(0, 10), (5, 15), (20, 30)], lo=8, hi=25) == 12
    assert bench.union_length([]) == 0
    # 100 "iterations" of 10 us: kernels busy 0-6 us (two overlapping streams), idle 6-10 us.
    events = [{"ph": "M", "name": "process_name"}, {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1000}]
    for i in range(100):
        t0 = 1000.0 + 10 * i
        events.append({"ph": "X", "cat": "kernel", "ts": t0, "dur": 4.0, "name": "k1"})
        events.append({"ph": "X", "cat": "kernel", "ts": t0 + 2, "dur": 3.0, "name": "k2"})
        events.append({"ph": "X", "cat": "gpu_memcpy", "ts": t0 + 5, "dur": 1.0, "name": "Memcpy DtoH"})
    path = tmp_path / "x.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    ivs = bench.gpu_intervals(bench.load_trace(path))
    assert len(ivs) == 300  # the CPU op and the metadata event are not GPU work
    res = bench.idle_fraction(ivs, trim_head=0.0, trim_tail=0.0)
    # Span 1000..1996 us; busy 6 us of each 10 (the last period ends at 1996).
    assert res["idle_fraction"] == pytest.approx(1 - 600 / 996)
    trimmed = bench.idle_fraction(ivs, trim_head=0.1, trim_tail=0.1)
    assert 0.35 < trimmed["idle_fraction"] < 0.45
    assert bench.idle_fraction([]) is None
    kernels_only = bench.idle_fraction(bench.gpu_intervals({"traceEvents": events}, cats=("kernel",)), 0.0, 0.0)
    assert kernels_only["idle_fraction"] > res["idle_fraction"]


def test_summarize_sync_records():
    site_vd = "Event.synchronize @ sglang/srt/managers/schedule_batch.py:2404 (maybe_wait_verify_done)"
    site_cp = "Event.synchronize @ sglang/srt/managers/scheduler.py:10 (process_batch_result)"
    rec = {
        "pid": 7,
        "iterations": {"warmup": {"DECODE": 50}, "bs=1": {"EXTEND": 2, "DECODE": 10}, "bs=4": {"DECODE": 5}},
        "blocked": {
            "warmup": {"DECODE": {site_vd: [100, 1.0]}},
            "bs=1": {"DECODE": {site_vd: [20, 0.020], site_cp: [10, 0.005]}, "EXTEND": {site_cp: [2, 0.5]}},
            "bs=4": {"DECODE": {site_cp: [5, 0.010]}},
        },
    }
    s = bench.summarize_sync_records([rec, {"pid": 8, "iterations": {}}])
    b1 = s["by_bs"]["1"]
    assert b1["decode_iters"] == 10
    assert b1["blocked_ms_per_iter"] == pytest.approx(2.5)
    assert b1["verify_done_ms_per_iter"] == pytest.approx(2.0)
    assert b1["syncs_per_iter"] == pytest.approx(3.0)
    assert b1["top_sites"][0]["site"] == site_vd
    assert s["by_bs"]["4"]["blocked_ms_per_iter"] == pytest.approx(2.0)
    assert "warmup" not in s["by_bs"] and s["pids"] == [7]
    assert bench.summarize_sync_records([]) is None


def test_run_validity():
    log = {"applied_pids": [10, 11], "applied_lines": 2, "disabled_lines": 0, "bad_lines": []}
    assert bench.run_validity("patched", log, [11], 10)[0] is True
    assert bench.run_validity("patched", log, [12], 10)[0] is False
    assert bench.run_validity("patched", log, [], 10)[0] is False
    off = {"applied_pids": [], "applied_lines": 0, "disabled_lines": 2, "bad_lines": []}
    assert bench.run_validity("stock", off, [11], 10)[0] is True
    assert bench.run_validity("stock", log, [11], 10)[0] is False


def test_merge_docs_and_readme(tmp_path):
    a = _doc([_case(runs=[_run("stock", 0, {1: [100], 4: [300]}), _run("patched", 0, {1: [120], 4: [290]})])])
    b = _doc([
        _case(runs=[_run("stock", 0, {1: [90], 4: [310]}), _run("patched", 0, {1: [99], 4: [305]})],
              probe={"stock": {"by_bs": {"1": {"blocked_ms_per_iter": 2.0, "verify_done_ms_per_iter": 1.5,
                                               "syncs_per_iter": 2.0, "top_sites": [
                                                   {"site": "Event.synchronize @ x.py:1 (maybe_wait_verify_done)",
                                                    "calls_per_iter": 2.0, "ms_per_iter": 1.5}]}}},
                     "patched": {"by_bs": {"1": {"blocked_ms_per_iter": 0.5, "verify_done_ms_per_iter": 0.0,
                                                 "syncs_per_iter": 1.0, "top_sites": []}}}},
              profile={"stock": [{"bs": 1, "idle_fraction": 0.4, "busy_us_per_iter": 600.0}],
                       "patched": [{"bs": 1, "idle_fraction": 0.1, "busy_us_per_iter": 590.0}]}),
        _case(model="8b", runs=[_run("stock", 0, {1: [50]}), _run("patched", 0, {1: [60]})]),
    ], skipped=["skipped probe rep 0 of 8b/triton-nopcg: 10 s left"])
    host = {v: {"by_bs": {"1": {"decode_iterations": 100, "wall_us_per_iter": w, "gc_us_per_iter": 1.0,
                                "loop_us_per_iter": {"run_batch": w - 500},
                                "functions": {"x.py:1(f)": {"calls": 1.0, "tottime_us": f, "cumtime_us": f}}}}}
            for v, w, f in (("stock", 3000.0, 40.0), ("patched", 2900.0, 75.0))}
    b["cases"][0]["host"] = host
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    merged = bench.merge_docs(bench.load_docs([pa, pb]))
    assert [(c["model"], c["backend"], len(c["runs"])) for c in merged["cases"]] == [
        ("tiny", "triton-nopcg", 4), ("8b", "triton-nopcg", 2)]
    row = merged["cases"][0]["summary"]["by_bs"]["1"]
    assert row["stock"]["decode_tok_s"]["values"] == [90.0, 100.0]
    assert row["ratio"] == pytest.approx(109.5 / 95.0)
    assert sorted(row["paired_ratio"]["values"]) == pytest.approx([1.1, 1.2])  # pairs within each file
    assert row["blocked_reduction"] == pytest.approx(0.75)
    assert row["idle_fraction"] == {"stock": 0.4, "patched": 0.1}

    out = tmp_path / "out"
    out.mkdir()
    (out / plot_bench.READING).write_text("## Reading\n\nHand-written words.\n")
    merged2, targets = plot_bench.build([pa, pb], out, merged_path=out / "merged.json", command="plot cmd",
                                        do_plot=False)
    text = (out / "README.md").read_text()
    assert text.rstrip().endswith("## Reading\n\nHand-written words.")
    assert "- tiny triton-nopcg, bs 1: GPU busy 600 / 590 us per decode iteration, idle 40.0% / 10.0%" in text
    assert ("- tiny triton-nopcg, bs 1: 3000 / 2900 us per decode iteration (100 / 100 iterations, GC 1.0 / 1.0 us); "
            "largest differences in own time (us/iter): `x.py:1(f)` +35") in text
    # no server args and no spec path in these runs: "?"; the accept length beside each tok/s
    assert ("| tiny triton-nopcg | - | ? / ? | 1 | 2/2 | 95.0 [90.0-100.0] (acc 4.00) | 109.5 [99.0-120.0] (acc 4.00) "
            "| 1.153 (1.100-1.200) |") in text
    assert "| config | STANDALONE, steps / topk / draft tokens 3/1/4 (chain);" in text
    assert "| dummy weights | the draft accepts (almost) every token" in text
    assert "## Trees against chains" not in text  # no tree here
    assert "2.000 / 0.500 (-75.0%)" in text and "40.0% / 10.0%" in text
    assert "NVIDIA H200" in text and "0.5.12.post1" in text and "bench_spec_v2.py --x" in text
    assert "plot cmd" in text and "skipped probe rep 0" in text
    assert "maybe_wait_verify_done" in text
    assert "**not met**" in text  # 8b bs 1 triton-nopcg: 60/50 = 1.2 met; tiny bs 4 ratio < 0.99 not met
    t = {(x["case"], x["target"]): x["met"] for x in targets}
    assert t[("8b/triton-nopcg bs 1", "decode tok/s ratio >= 1.10")] is True
    assert t[("tiny/triton-nopcg bs 4", "decode tok/s ratio >= 0.99")] is False
    assert t[("tiny/triton-nopcg bs 1", "blocked ms/iter down >= 90%")] is False
    assert json.loads((out / "merged.json").read_text())["targets"]
    with pytest.raises(ValueError):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"schema": "other"}))
        bench.load_docs([bad])


def test_upstream_column_and_configuration_in_the_readme_and_plot(tmp_path):
    eff = {"attention_backend": "fa3", "disable_piecewise_cuda_graph": False, "page_size": 1,
           "disable_overlap_schedule": False}

    def run(variant, rep, vals, version):
        r = _run(variant, rep, vals)
        r["result"].update(effective=eff, sglang_version=version, gpu="NVIDIA H100 80GB HBM3")
        return r

    case = _case(model="8b", backend="default", runs=[
        run("stock", 0, {1: [100], 16: [1000]}, "0.5.12.post1"), run("patched", 0, {1: [110], 16: [1030]}, "0.5.12.post1"),
        run("upstream", 0, {1: [120], 16: [1050]}, "0.5.13")])
    long_case = dict(_case(model="8b", backend="default", runs=[
        run("stock", 0, {8: [400]}, "0.5.12.post1"), run("patched", 0, {8: [420]}, "0.5.12.post1")]), prompt_len=8192)
    doc = _doc([case, long_case], fa3=True)
    doc["env"]["sglang_versions"] = {"stock": "0.5.12.post1", "patched": "0.5.12.post1", "upstream": "0.5.13"}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    merged, _ = plot_bench.build([path], tmp_path / "out", do_plot=False)
    text = (tmp_path / "out" / "README.md").read_text()
    assert "| SGLang | stock/patched 0.5.12.post1; upstream 0.5.13 (torch 2.11.0) |" in text and "| FA3 | yes |" in text
    assert "upstream tok/s (accept len) (ratio u/s)" in text and "runs s/p/u" in text and "spec path s / p / u" in text
    # spec path of every variant (from the server args of these older-style runs), accept beside every tok/s
    assert ("| 8b default | fa3 (SGLang's default), PCG on, page 1 | v2 / v2 / v2 | 1 | 1/1/1 | 100.0 (acc 4.00) | "
            "110.0 (acc 4.00) | 1.100 | 120.0 (acc 4.00) (x1.200) |") in text
    assert ("| 8b default prompt 8192 | fa3 (SGLang's default), PCG on, page 1 | v2 / v2 / - | 8 | 1/1/0 | "
            "400.0 (acc 4.00) | 420.0 (acc 4.00) | 1.050 | - |") in text
    series = plot_bench.ratio_series(merged)
    assert [(label, v, xs, [round(y, 3) for y in ys]) for label, v, xs, ys, _, _ in series] == [
        ("8b default [fa3 (SGLang's default), PCG on, page 1]", "patched", [1, 16], [1.1, 1.03]),
        ("8b default [fa3 (SGLang's default), PCG on, page 1] — upstream 0.5.13", "upstream", [1, 16], [1.2, 1.05]),
        ("8b default prompt 8192 [fa3 (SGLang's default), PCG on, page 1]", "patched", [8], [1.05])]


def test_markdown_table_shape():
    t = plot_bench.markdown_table(["a", "b"], [["1", "2"], ["3", "4"]])
    assert t.splitlines() == ["| a | b |", "|---|---|", "| 1 | 2 |", "| 3 | 4 |"]


# ----------------------------------------------------------------------------- end to end, fake SGLang

FAKE_TORCH = '''
import time
__version__ = "0.0-fake"
class _Version: cuda = "13.0-fake"
version = _Version()
class Tensor:
    def __init__(self, v=1.0, is_cuda=True): self.v, self.is_cuda = v, is_cuda
    def item(self):
        if self.is_cuda: time.sleep(0.002 if _mode() == "off" else 0.0001)
        return self.v
    def tolist(self): return [self.v]
    def cpu(self): return Tensor(self.v, False)
    def to(self, *a, **k): return Tensor(self.v, not (a and a[0] == "cpu"))
    def copy_(self, src, non_blocking=False): self.v = src.v; return self
    def __bool__(self): return bool(self.v)
    def __int__(self): return int(self.v)
    def __float__(self): return float(self.v)
def _mode():
    import os
    return os.environ.get("SGLANG_FUTUREMAP_PATCH")
class _Cuda:
    class Event:
        def synchronize(self): time.sleep(0.001)
    class Stream:
        def synchronize(self): pass
    @staticmethod
    def synchronize(): pass
    @staticmethod
    def is_available(): return True
    @staticmethod
    def get_device_name(i=0): return "Fake GPU"
cuda = _Cuda()
class compiler:
    @staticmethod
    def is_compiling(): return False
'''

FAKE_SCHEDULER = '''
import os, sys, time
def load_plugins():
    pid = os.getpid()
    mode = os.environ.get("SGLANG_FUTUREMAP_PATCH")
    if mode == "off":
        msg = "sglang_futuremap_patch: disabled by SGLANG_FUTUREMAP_PATCH=off; SGLang fake left untouched"
    else:
        msg = f"sglang_futuremap_patch: applied 2 back-ports (5 targets) to SGLang fake [pid {pid}]: a, b"
    print(f"[2026-01-01 00:00:00 INFO pid={pid}] {msg}", file=sys.stderr, flush=True)
def _patched_extra():
    t = time.perf_counter()
    while time.perf_counter() - t < 0.0003:
        pass
class Scheduler:
    def get_next_batch_to_run(self):
        return None
    def run_batch(self, batch):
        import torch
        if batch.forward_mode.name == "DECODE":
            torch.Tensor(1.0, True).item()   # the stock verify_done-like sync (2 ms), 0.1 ms patched
            torch.Tensor(1.0, False).item()  # a CPU tensor: not a sync
            time.sleep(0.0002)
            if os.environ.get("SGLANG_FUTUREMAP_PATCH") != "off":
                _patched_extra()  # host work only the "patched" fake does
        return None
'''

FAKE_SGLANG = '''
import gzip, json, math, os, time
__version__ = "0.5.12.post1-fake"
class _FM:
    def __init__(self, name): self.name = name
class _Batch:
    def __init__(self, name): self.forward_mode = _FM(name)
def _log(level, msg):
    import sys
    print(f"[2026-01-01 00:00:00 {level} pid={os.getpid()}] {msg}", file=sys.stderr, flush=True)
def _spec_path(kw):
    """As SGLang 0.5.12.post1's server args: a tree goes to spec v1; the plugin (on, and not
    told SGLANG_FUTUREMAP_TREE_SPEC_V2=0) then sends it back to spec v2. True: overlap off."""
    topk = kw.get("speculative_eagle_topk", 1)
    if topk == 1:
        _log("WARNING", "Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.")
        return False
    _log("WARNING", "Spec v1 is used for eagle/eagle3/standalone speculative decoding because spec v2 "
                    "currently only supports topk = 1.")
    if os.environ.get("SGLANG_FUTUREMAP_PATCH") == "off" or os.environ.get("SGLANG_FUTUREMAP_TREE_SPEC_V2") == "0":
        return True
    tree = (kw["speculative_num_steps"], topk, kw["speculative_num_draft_tokens"])
    _log("INFO", "sglang_futuremap_patch: spec v2 runs the EAGLE tree (num_steps=%s, eagle_topk=%s, "
                 "num_draft_tokens=%s) with the overlap scheduler; SGLANG_FUTUREMAP_TREE_SPEC_V2=0 keeps spec v1." % tree)
    return False
class Engine:
    def __init__(self, **kw):
        import setproctitle
        setproctitle.setproctitle("sglang::scheduler")
        self.overlap_off = _spec_path(kw)
        from sglang.srt.managers import scheduler as sm
        sm.load_plugins()
        self.sched = sm.Scheduler()
        self.kw = kw
        self.prof = None
    def get_server_info(self):
        info = dict(self.kw, version=__version__)  # what SGLang resolves on Hopper when nothing is said
        info.setdefault("attention_backend", "fa3")
        info.setdefault("disable_piecewise_cuda_graph", False)
        return dict(info, page_size=1, disable_overlap_schedule=self.overlap_off)
    def generate(self, input_ids, sampling_params):
        n = sampling_params[0]["max_new_tokens"]
        self.sched.get_next_batch_to_run()  # the scheduler loop: one tick per batch
        self.sched.run_batch(_Batch("EXTEND"))
        time.sleep(0.002)
        iters = math.ceil((n - 1) / (self.kw.get("speculative_num_steps", 3) + 1))
        per = 0.0006 if os.environ.get("SGLANG_FUTUREMAP_PATCH") == "off" else 0.0005
        per *= 1.5 if self.kw.get("speculative_eagle_topk", 1) > 1 else 1.0
        for _ in range(iters):
            self.sched.get_next_batch_to_run()
            self.sched.run_batch(_Batch("DECODE"))
            time.sleep(per)
        return [{"output_ids": [5] * n, "meta_info": {"completion_tokens": n, "spec_verify_ct": iters or 1,
                 "cached_tokens": 0, "prompt_tokens": len(p)}} for p in input_ids]
    def start_profile(self, output_dir=None, **kw):
        self.prof = output_dir
    def stop_profile(self):
        ev = [{"ph": "X", "cat": "kernel", "ts": 10.0 * i, "dur": 7.0} for i in range(100)]
        with gzip.open(os.path.join(self.prof, "1-TP-0.trace.json.gz"), "wt") as f:
            json.dump({"traceEvents": ev}, f)
    def shutdown(self):
        self.sched.get_next_batch_to_run()  # an idle loop tick, as SGLang's loop spins
'''


@pytest.fixture()
def fake_site(tmp_path):
    root = tmp_path / "fake"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(FAKE_TORCH)
    pkg = root / "sglang"
    (pkg / "srt" / "managers").mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_SGLANG)
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "managers" / "__init__.py").write_text("")
    (pkg / "srt" / "managers" / "scheduler.py").write_text(FAKE_SCHEDULER)
    return root


def _fake_bench(tmp_path, fake_site, *extra, rc=0, env_extra=None):
    pytest.importorskip("setproctitle")
    out = tmp_path / "res" / "bench.json"
    env = dict(os.environ, **(env_extra or {}))
    env.setdefault(child_env.FA3_ENV, "0")
    env["PYTHONPATH"] = os.pathsep.join([str(fake_site)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, str(SCRIPTS / "bench_spec_v2.py"), "--model", "tiny", "--backend", "triton-nopcg",
           "--batch-sizes", "1,4", "--max-new-tokens", "33", "--warmup-new-tokens", "5", "--out", str(out),
           "--settle-s", "0.1", "--phase-settle-s", "0.12", "--gpu-release-s", "0", "--run-timeout", "60", *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode == rc, p.stdout + p.stderr
    return p, out, json.loads(out.read_text())


def test_end_to_end_own_sync_probe(tmp_path, fake_site):
    p, out, doc = _fake_bench(tmp_path, fake_site, "--reps", "0", "--sync-probe-impl", "own")
    case = doc["cases"][0]
    assert [(r["pass"], r["variant"], r["valid"]) for r in case["runs"]] == [
        ("probe", "stock", True), ("probe", "patched", True)]
    ps, pp = case["probe"]["stock"]["by_bs"], case["probe"]["patched"]["by_bs"]
    assert ps["1"]["decode_iters"] == 8 and ps["4"]["decode_iters"] == 8  # ceil(32 / 4) per decode request
    assert ps["1"]["syncs_per_iter"] == pytest.approx(1.0)
    assert ps["1"]["top_sites"][0]["site"].startswith("Tensor.item @ sglang/srt/managers/scheduler.py")
    assert ps["1"]["blocked_ms_per_iter"] > 1.5 and pp["1"]["blocked_ms_per_iter"] < 0.6


def test_end_to_end_with_fake_sglang(tmp_path, fake_site):
    p, out, doc = _fake_bench(tmp_path, fake_site, "--reps", "1", "--trials", "2", "--profile",
                              "--profile-batch-sizes", "1", "--profile-trim-head", "0", "--profile-trim-tail", "0")
    assert doc["config"]["sync_probe_impl"] == ("smoke" if (SCRIPTS / "gpu_probe" / "smoke_sync_probe.py").exists()
                                                else "own")
    case = doc["cases"][0]
    order = [(r["pass"], r["variant"]) for r in case["runs"]]
    assert order == [("timed", "stock"), ("timed", "patched"), ("probe", "stock"), ("probe", "patched")]
    assert all(r["valid"] for r in case["runs"]), [r["validity"] for r in case["runs"]]
    assert doc["env"]["gpu"] == "Fake GPU" and doc["env"]["sglang_version"] == "0.5.12.post1-fake"
    assert "--reps 1" in doc["command"]
    # the record's command holds no interpreter and no folder of the machine it ran on
    assert doc["command"].startswith("scripts/bench_spec_v2.py --model tiny"), doc["command"]
    assert "--out OUT/bench.json" in doc["command"] and str(tmp_path) not in doc["command"]
    assert sys.executable not in doc["command"]
    row = case["summary"]["by_bs"]["1"]
    assert row["stock"]["accept_length"]["median"] == pytest.approx(33 / 8)
    assert row["ratio"] is not None and row["stock"]["tpot_ms"]["median"] > 0
    # the sync probe saw the fake scheduler's decode iterations and their CUDA .item() syncs
    ps, pp = case["probe"]["stock"]["by_bs"], case["probe"]["patched"]["by_bs"]
    assert ps["1"]["decode_iters"] >= 8 and ps["1"]["syncs_per_iter"] == pytest.approx(1.0)
    assert "Tensor.item @ " in ps["1"]["top_sites"][0]["site"] and "run_batch" in ps["1"]["top_sites"][0]["site"]
    assert ps["1"]["blocked_ms_per_iter"] > 1.5 and pp["1"]["blocked_ms_per_iter"] < 0.6
    assert row["blocked_reduction"] > 0.7
    prof = case["profile"]
    assert prof["stock"][0]["idle_fraction"] == pytest.approx(1 - 700 / 997)
    assert "bs   1:" in p.stdout and "blocked ms/iter" in p.stdout
    logs = sorted(x.name for x in (out.parent / "bench-logs").iterdir())
    assert len(logs) == 4 and logs[0].startswith("tiny-triton-nopcg-")
    # every Engine got a port block of its own, and its kwargs carried it
    blocks = [r["ports"] for r in case["runs"]]
    assert len({b["base"] for b in blocks}) == 4 and all(
        r["result"]["effective"]["port"] == r["ports"]["port"]
        and r["result"]["effective"]["nccl_port"] == r["ports"]["nccl_port"] for r in case["runs"])
    assert doc["fa3"] is False and case["summary"]["config"]["stock"]["config"] == "triton, PCG off, page 1"
    assert "FA3: not installed" in p.stdout and "stock: triton, PCG off, page 1; SGLang 0.5.12.post1-fake" in p.stdout


def _upstream_site(fake_site, root):
    """A second fake site, as the 0.5.13 bundle unpacks: its own SGLang (and torch)."""
    import shutil

    site = root / "site-0513"
    shutil.copytree(fake_site, site)
    init = site / "sglang" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.5.12.post1-fake"', "from sglang._version import __version__"))
    (site / "sglang" / "_version.py").write_text("__version__ = version = '0.5.13'\n")
    return site


def test_end_to_end_upstream_variant_and_default_backend(tmp_path, fake_site, monkeypatch):
    monkeypatch.setenv(child_env.FA3_ENV, "1")
    site = _upstream_site(fake_site, tmp_path)
    p, out, doc = _fake_bench(tmp_path, fake_site, "--backend", "default", "--reps", "1", "--no-probe",
                              "--variants", "stock,patched,upstream", "--upstream-site", str(site))
    case = doc["cases"][0]
    assert [(r["variant"], r["valid"]) for r in case["runs"]] == [("stock", True), ("patched", True),
                                                                   ("upstream", True)], case["runs"]
    up = case["runs"][2]
    assert up["site"] == str(site) and up["result"]["sglang_version"] == "0.5.13" and "0.5.13" in up["validity"]
    assert "attention_backend" not in up["result"]["effective"] or up["result"]["effective"]["attention_backend"] == "fa3"
    summ = case["summary"]
    assert summ["variants"] == ["stock", "patched", "upstream"] and summ["n_runs"]["upstream"] == 1
    assert summ["config"]["upstream"]["sglang_version"] == "0.5.13"
    assert summ["config"]["stock"]["config"] == "fa3 (SGLang's default), PCG on, page 1"
    row = summ["by_bs"]["1"]
    assert set(row["ratios"]) == {"patched", "upstream"} and row["ratios"]["upstream"] > 0
    assert doc["env"]["sglang_versions"] == {"stock": "0.5.12.post1-fake", "patched": "0.5.12.post1-fake",
                                             "upstream": "0.5.13"}
    assert doc["env"]["sglang_version"] == "0.5.12.post1-fake" and doc["fa3"] is True
    assert "upstream 1" in p.stdout and "upstream: fa3 (SGLang's default), PCG on, page 1; SGLang 0.5.13" in p.stdout
    assert "bs   1: stock" in p.stdout and ", upstream " in p.stdout


def test_end_to_end_skips_missing_upstream_and_fa3_rows(tmp_path, fake_site):
    p, out, doc = _fake_bench(tmp_path, fake_site, "--backend", "triton-nopcg,default", "--reps", "1", "--no-probe",
                              "--batch-sizes", "1", "--variants", "stock,patched,upstream", "--upstream-site",
                              str(tmp_path / "nothing-here"))
    assert [(c["backend"], len(c["runs"])) for c in doc["cases"]] == [("triton-nopcg", 2), ("default", 0)]
    assert any(m.startswith("upstream variant skipped: upstream site") for m in doc["skipped"])
    (fa3_skip,) = doc["cases"][1]["skipped"]
    assert fa3_skip.startswith("skipped (no FA3): tiny/default for stock, patched: backend default needs FA3")
    assert "!! upstream variant skipped" in p.stdout and "skipped (no FA3)" in p.stdout


def test_an_engine_that_did_not_start_is_a_harness_error(tmp_path, monkeypatch):
    def fake_worker(script, spec, work, name, log_path, env, timeout, **kw):
        log_path.write_text("Traceback (most recent call last):\nRuntimeError: EADDRINUSE\n")
        return 1, 2.0, None, log_path.read_text()

    monkeypatch.setattr(launch, "run_worker", fake_worker)
    case = bench.get_case(bench.new_doc("x", {}), "tiny", "default")
    spec = {"engine_kwargs": {"model_path": "m"}, "profile_batch_sizes": [], "gpu_release_s": 0}
    run = bench.run_engine(case=case, variant=child_env.STOCK, pass_="timed", rep=0, spec=spec, work=tmp_path,
                           log_dir=tmp_path, timeout=5, log_config=tmp_path / "log.json")
    assert run["error"] == "exit status 1; no result" and not run["valid"] and "EADDRINUSE" in run["log_tail"]
    assert run["ports"]["nccl_port"] == run["ports"]["base"] + 2
    case["runs"].append(run)
    doc = dict(bench.new_doc("x", {}), cases=[case], fa3=False)
    summary = bench.summarize_case(case)
    assert summary["error_runs"] == 1 and summary["invalid_runs"] == 1
    text = bench.format_summary(doc)
    assert "harness errors 1" in text and "HARNESS ERROR timed stock rep 0: exit status 1; no result" in text
    assert "    | RuntimeError: EADDRINUSE" in text and text.startswith("FA3: not installed")


def test_end_to_end_host_profile(tmp_path, fake_site):
    p, out, doc = _fake_bench(tmp_path, fake_site, "--reps", "0", "--no-probe", "--host-profile",
                              "--host-trials", "2")
    case = doc["cases"][0]
    assert [(r["pass"], r["variant"], r["valid"]) for r in case["runs"]] == [
        ("host", "stock", True), ("host", "patched", True)]
    assert case["summary"]["n_runs"] == {"stock": 0, "patched": 0}  # never in the timed medians
    hs = case["host"]["stock"]["by_bs"]
    assert set(hs) == {"1", "4"}
    # 2 decode request sets per batch size, ceil(32 / 4) = 8 decode iterations each, and the
    # profile covers them only (one EXTEND each, no warm-up, no prefill-only request)
    assert hs["4"]["decode_iterations"] == 16 and hs["4"]["iterations"] == {"EXTEND": 2, "DECODE": 16}
    assert hs["4"]["stretches"] == 2 and hs["4"]["wall_us_per_iter"] > 200
    row = case["summary"]["by_bs"]["4"]["host"]
    assert row["decode_iterations"] == {"stock": 16, "patched": 16}
    top = row["top_tottime_delta"]
    extra = next(r for r in top if "_patched_extra" in r["func"])
    assert extra["stock"] == 0 and extra["patched"] > 150 and extra["calls_patched"] == pytest.approx(1.0)
    # run_batch per decode iteration: 2 ms "sync" + 0.2 ms stock; 0.1 + 0.2 + 0.3 ms patched
    rb = row["loop_us_per_iter"]["run_batch"]
    assert rb["stock"] > 1800 and 500 < rb["patched"] < 1500
    assert "host (cProfile) us/iter" in p.stdout and "_patched_extra" in p.stdout


def test_host_profile_diff_and_per_iteration():
    hp = child_env.probe_module("host_profile")
    rows = [{"func": "a.py:1(f)", "name": "f", "calls": 20, "tottime_s": 0.002, "cumtime_s": 0.004},
            {"func": "a.py:9(g)", "name": "g", "calls": 10, "tottime_s": 0.001, "cumtime_s": 0.001}]
    per = hp.per_iteration(rows, 10)
    assert per["a.py:1(f)"] == {"calls": 2.0, "tottime_us": 200.0, "cumtime_us": 400.0, "callers": []}
    assert hp.per_iteration(rows, 0) == {}
    # callers: who spent the time in a function (pstats' fifth field), largest first, per iteration
    stats = {("~", 0, "<method 'item' of 'torch._C.TensorBase' objects>"):
             (3, 3, 0.03, 0.03, {("/x/site-packages/sglang/a.py", 5, "f"): (1, 1, 0.005, 0.005),
                                 ("/x/site-packages/sglang/b.py", 7, "g"): (2, 2, 0.025, 0.025)})}
    (row,) = hp.profile_rows(stats)
    assert row["callers"] == [["sglang/b.py:7(g)", 2, 0.025], ["sglang/a.py:5(f)", 1, 0.005]]
    item = hp.per_iteration([row], 10)["<method 'item' of 'torch._C.TensorBase' objects>"]
    assert item["callers"][0] == ["sglang/b.py:7(g)", 0.2, pytest.approx(2500.0)]
    other = {"a.py:1(f)": {"calls": 2.0, "tottime_us": 210.0, "cumtime_us": 400.0},
             "b.py:5(h)": {"calls": 1.0, "tottime_us": 50.0, "cumtime_us": 50.0}}
    d = hp.diff_rows(per, other, top=2)
    # deltas: g -100 (gone), h +50 (new), f +10
    assert [r["func"] for r in d] == ["a.py:9(g)", "b.py:5(h)"]
    assert d[0]["delta"] == -100.0 and d[1]["delta"] == 50.0 and d[1]["calls_stock"] == 0.0
    assert hp.func_label(("~", 0, "<built-in method time.sleep>")) == "<built-in method time.sleep>"
    assert hp.func_label(("/x/site-packages/sglang/srt/a.py", 3, "f")) == "sglang/srt/a.py:3(f)"
    assert hp.decode_iterations({"DECODE": 3, "TARGET_VERIFY": 2, "EXTEND": 9}) == 5


def test_host_profiler_in_process(tmp_path):
    """The profiler itself on a stand-in scheduler loop: phases, iterations, functions, gc."""
    import gc
    import time

    hp = child_env.probe_module("host_profile")

    class FM:
        def __init__(self, name):
            self.name = name

    class Batch:
        def __init__(self, name):
            self.forward_mode = FM(name)

    def hot():
        return sum(range(2000))

    class Scheduler:
        def get_next_batch_to_run(self):
            return None

        def run_batch(self, batch):
            hot()
            if batch.forward_mode.name == "DECODE":
                gc.collect(0)

    prof = hp.HostProfiler(str(tmp_path), poll_s=0.002)
    prof.install(Scheduler)
    try:
        sched = Scheduler()

        def loop(n, mode="DECODE"):
            for _ in range(n):
                sched.get_next_batch_to_run()
                sched.run_batch(Batch(mode))

        loop(3)  # idle phase: not profiled
        hp.set_phase(str(tmp_path), "bs=8")
        time.sleep(0.05)
        loop(1, "EXTEND")
        loop(5)
        hp.set_phase(str(tmp_path), "idle")
        time.sleep(0.05)
        loop(2)  # the first tick stops the profile
        assert prof.active is None
    finally:
        gc.callbacks.remove(prof._on_gc)
    docs = hp.read_profiles(str(tmp_path))
    assert len(docs) == 1 and docs[0]["installed"] and not docs[0]["errors"]
    rec = docs[0]["phases"]["bs=8"]
    assert rec["iterations"] == {"EXTEND": 1, "DECODE": 5} and rec["stretches"] == 1
    hot_row = next(f for f in rec["functions"] if f["name"] == "hot")
    assert hot_row["calls"] == 6  # the idle-phase calls are not in it
    assert rec["gc"]["0"][0] == 5 and rec["gc"]["0"][1] > 0
    assert "run_batch" in rec["loop_cumtime_s"] or rec["functions_total"] > 0
    summary = bench.summarize_host_docs(docs)
    assert summary["by_bs"]["8"]["decode_iterations"] == 5
    assert summary["by_bs"]["8"]["functions"][hot_row["func"]]["calls"] == pytest.approx(6 / 5)


def test_kernel_table_and_iterations():
    events = [{"ph": "X", "cat": "kernel", "ts": 10.0 * i, "dur": 4.0,
               "name": "void at::native::vectorized_elementwise_kernel<4, Foo>(int, Foo)"} for i in range(10)]
    events += [{"ph": "X", "cat": "gpu_memset", "ts": 10.0 * i + 5, "dur": 1.0, "name": "Memset (Device)"}
               for i in range(10)]
    events.append({"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 100, "name": "aten::add"})
    rows = bench.kernel_table({"traceEvents": events}, 20.0, 80.0)
    assert rows[0] == {"name": "at::native::vectorized_elementwise_kernel", "count": 6, "total_us": 24.0}
    assert bench.kernel_name("void (anonymous namespace)::softmax_warp<float>(float*)") == "softmax_warp"
    assert rows[1] == {"name": "Memset (Device)", "count": 6, "total_us": 6.0}
    res = bench.idle_fraction(bench.gpu_intervals({"traceEvents": events}), 0.1, 0.0)
    it = bench.iterations_in_window([{"spec_verify_ct": 40}, {"spec_verify_ct": 40}], res)
    assert it == pytest.approx(40 * res["window_us"] / res["span_us"])
    assert bench.iterations_in_window([{}], res) is None


def test_cpu_pinning_plan(tmp_path):
    assert bench.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    root = tmp_path / "cpu"
    for cpu, sib in {0: "0,4", 1: "1,5", 2: "2,6", 3: "3,7", 4: "0,4", 5: "1,5", 6: "2,6", 7: "3,7"}.items():
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(sib + "\n")
    # hyper-threads: CPU 7 for the scheduler, its sibling 3 left idle
    assert bench.plan_pinning(range(8), str(root)) == (7, [0, 1, 2, 4, 5, 6])
    assert bench.core_siblings(9, str(root)) == {9}  # no topology: itself
    assert bench.plan_pinning([0, 4, 1, 5], str(root)) is None  # too few CPUs to spare
    assert bench.plan_pinning([], str(root)) is None


def test_recorded_command_hides_machine_folders():
    cmd = bench.recorded_command(["--model", "8b", "--out", "/somewhere/out/bench-8b.json", "--log-dir",
                                  "/tmp/bench-logs-x1", "--upstream-site", "/tmp/site-0.5.13", "--reps", "1"])
    assert cmd == ("scripts/bench_spec_v2.py --model 8b --out OUT/bench-8b.json --log-dir LOGS "
                   "--upstream-site UPSTREAM_SITE --reps 1")


# ----------------------------------------------------------------------------- spec: EAGLE trees and chains

STOCK_TREE_V1 = ("[2026-01-01 00:00:00 WARNING pid=7] Spec v1 is used for eagle/eagle3/standalone speculative "
                 "decoding because spec v2 currently only supports topk = 1.")
SPEC_V2_CHAIN = "[2026-01-01 00:00:00 WARNING pid=7] Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding."
PLUGIN_TREE_V2 = ("[2026-01-01 00:00:01 INFO pid=7] sglang_futuremap_patch: spec v2 runs the EAGLE tree (num_steps=3, "
                  "eagle_topk=4, num_draft_tokens=16) with the overlap scheduler; SGLANG_FUTUREMAP_TREE_SPEC_V2=0 keeps "
                  "spec v1.")
APPLIED = "[2026-01-01 00:00:02 INFO pid={pid}] sglang_futuremap_patch: applied 11 back-ports to SGLang 0.5.12.post1 [pid {pid}]: a"
DISABLED = "[2026-01-01 00:00:02 INFO pid=7] sglang_futuremap_patch: disabled by SGLANG_FUTUREMAP_PATCH=off"


def test_parse_spec_and_its_errors():
    assert bench.parse_spec("3,4,16") == (3, 4, 16) and bench.parse_spec(" 5/4/8 ") == (5, 4, 8)
    assert bench.DEFAULT_SPEC == (3, 1, 4) and bench.parse_spec("3,1,4") == bench.DEFAULT_SPEC
    assert bench.parse_specs(["3,4,16;3,1,4", "5,4,8", "3/4/16"]) == [(3, 4, 16), (3, 1, 4), (5, 4, 8)]
    for bad, words in (("3,4", "three positive integers"), ("3,x,4", "three positive integers"),
                       ("0,1,1", "must be positive"), ("3,1,5", "DRAFT_TOKENS = STEPS + 1 = 4"),
                       ("3,4,40", "has 2 to 37 DRAFT_TOKENS"), ("2,4,1", "has 2 to 21 DRAFT_TOKENS")):
        with pytest.raises(ValueError, match=re.escape(words)):
            bench.parse_spec(bad)
    with pytest.raises(ValueError, match="no spec"):
        bench.parse_specs([" ; "])


@pytest.mark.parametrize("bad, words", [("3,4", "three positive integers"), ("3,1,5", "STEPS + 1 = 4"),
                                        ("3,4,16;4,1,4", "STEPS + 1 = 5")])
def test_a_bad_spec_is_a_usage_error_not_a_traceback(bad, words, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--dry-run", "--spec", "3,4,16", "--spec", bad])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "error: argument --spec: spec " in err and words in err
    assert "Traceback" not in err


def test_spec_cases_labels_kwargs_and_merging(tmp_path):
    # the default spec's case keeps its old name (and an old file's case, without a spec, is that case)
    assert bench.case_name({"model": "8b", "backend": "flashinfer"}) == "8b/flashinfer"
    assert bench.case_name({"model": "8b", "backend": "flashinfer", "spec": [3, 1, 4]}) == "8b/flashinfer"
    assert bench.case_name({"model": "8b", "backend": "flashinfer", "spec": [3, 4, 16]}) == "8b/flashinfer spec 3/4/16"
    assert bench.case_name({"model": "8b", "backend": "default", "prompt_len": 8192, "spec": (5, 4, 8)}) == (
        "8b/default prompt 8192 spec 5/4/8")
    assert plot_bench.case_label({"model": "8b", "backend": "fa3-pcg", "spec": [3, 4, 16]}) == "8b fa3-pcg spec 3/4/16"
    doc = bench.new_doc("x", {})
    tree = bench.get_case(doc, "8b", "flashinfer", 64, (3, 4, 16))
    chain = bench.get_case(doc, "8b", "flashinfer", 64)
    assert tree is not chain and tree["spec"] == [3, 4, 16] and chain["spec"] == [3, 1, 4]
    assert bench.get_case(doc, "8b", "flashinfer", 64, [3, 4, 16]) is tree and len(doc["cases"]) == 2
    t, d = model_factory.write_model_dirs("8b", tmp_path)
    kw = bench.engine_kwargs("8b", "flashinfer", t, d, [1, 48], spec=(5, 4, 8))
    assert (kw["speculative_num_steps"], kw["speculative_eagle_topk"], kw["speculative_num_draft_tokens"]) == (5, 4, 8)
    assert kw["attention_backend"] == "flashinfer" and kw["speculative_algorithm"] == "STANDALONE"
    # an old file's 3/1/4 case and a new file's merge; the tree stays a case of its own
    old = _doc([_case(model="8b", backend="flashinfer", runs=[_run("stock", 0, {1: [100]}), _run("patched", 0, {1: [110]})])])
    new = _doc([dict(_case(model="8b", backend="flashinfer", runs=[_run("stock", 0, {1: [90]}),
                                                                   _run("patched", 0, {1: [100]})]), spec=[3, 1, 4]),
                dict(_case(model="8b", backend="flashinfer", runs=[_run("stock", 0, {1: [50]})]), spec=[3, 4, 16])])
    pa, pb = tmp_path / "old.json", tmp_path / "new.json"
    pa.write_text(json.dumps(old))
    pb.write_text(json.dumps(new))
    merged = bench.merge_docs(bench.load_docs([pa, pb]))
    assert [(bench.case_name(c), len(c["runs"])) for c in merged["cases"]] == [
        ("8b/flashinfer", 4), ("8b/flashinfer spec 3/4/16", 1)]


def test_a_cuda_graph_limit_makes_an_eager_case_of_its_own(tmp_path, capsys):
    # --cuda-graph-max-bs 8 with batch sizes 16 / 24: SGLang's own capture list up to 8, so the
    # measured batches decode eagerly, and the case never merges with the all-graph case
    t, d = model_factory.write_model_dirs("8b", tmp_path)
    kw = bench.engine_kwargs("8b", "default", t, d, [16, 24], graph_max_bs=8)
    assert kw["cuda_graph_max_bs"] == 8 and "cuda_graph_bs" not in kw
    graphs = bench.engine_kwargs("8b", "default", t, d, [16, 24])
    assert graphs["cuda_graph_max_bs"] == 24 and graphs["cuda_graph_bs"] == [16, 24]
    doc = bench.new_doc("x", {})
    eager = bench.get_case(doc, "8b", "default", 64, None, 8)
    assert eager is not bench.get_case(doc, "8b", "default", 64) and len(doc["cases"]) == 2
    assert bench.get_case(doc, "8b", "default", 64, (3, 1, 4), 8) is eager
    assert bench.case_name(eager) == "8b/default graphs <= 8"
    a = _doc([dict(_case(model="8b", backend="default", runs=[_run("stock", 0, {16: [100]})]), graph_max_bs=8),
              _case(model="8b", backend="default", runs=[_run("stock", 0, {16: [200]})])])
    b = _doc([dict(_case(model="8b", backend="default", runs=[_run("patched", 0, {16: [101]})]), graph_max_bs=8)])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    merged = bench.merge_docs(bench.load_docs([pa, pb]))
    assert [(bench.case_name(c), len(c["runs"])) for c in merged["cases"]] == [
        ("8b/default graphs <= 8", 2), ("8b/default", 1)]
    assert bench.main(["--dry-run", "--model", "8b", "--backend", "default", "--reps", "1", "--no-probe",
                       "--batch-sizes", "16,24", "--cuda-graph-max-bs", "8"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("8b/default graphs <= 8: ")
    assert json.loads(head.split("context 4096: ", 1)[1])["cuda_graph_max_bs"] == 8


def test_dry_run_prints_the_spec_of_every_case(capsys):
    assert bench.main(["--dry-run", "--model", "8b", "--backend", "flashinfer,fa3-pcg", "--reps", "1", "--no-probe",
                       "--spec", "3,4,16;3,1,4", "--spec", "5,4,8"]) == 0
    heads = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith(" ")]
    assert [ln.split(":", 1)[0] for ln in heads] == [
        "8b/flashinfer spec 3/4/16", "8b/flashinfer", "8b/flashinfer spec 5/4/8",
        "8b/fa3-pcg spec 3/4/16", "8b/fa3-pcg", "8b/fa3-pcg spec 5/4/8"]
    assert "spec 3/1/4 (steps/topk/draft tokens; chain, expected: spec v2)" in heads[1]
    assert "spec 5/4/8 (steps/topk/draft tokens; tree, expected: stock spec v1" in heads[2]
    kw = json.loads(heads[0].split("context 4096: ", 1)[1])
    assert (kw["speculative_num_steps"], kw["speculative_eagle_topk"], kw["speculative_num_draft_tokens"]) == (3, 4, 16)


def test_spec_path_from_the_log_and_the_server_args():
    # stock 0.5.12.post1 with a tree: SGLang's own spec v1 line
    assert bench.spec_path_from_log(STOCK_TREE_V1)[0] == "spec v1"
    # the plugin lets SGLang send the tree to spec v1 first, then says it runs on spec v2: that wins
    path, why = bench.spec_path_from_log("\n".join([STOCK_TREE_V1, PLUGIN_TREE_V2]))
    assert path == "spec v2" and why.startswith("log: sglang_futuremap_patch: spec v2 runs the EAGLE tree")
    # a chain: SGLang's spec v2 line; the last of SGLang's lines counts
    assert bench.spec_path_from_log(SPEC_V2_CHAIN)[0] == "spec v2"
    assert bench.spec_path_from_log("\n".join([SPEC_V2_CHAIN, STOCK_TREE_V1]))[0] == "spec v1"
    # the plugin kept on spec v1 (SGLANG_FUTUREMAP_TREE_SPEC_V2=0), or its auto-tree WARNING
    assert bench.spec_path_from_log(STOCK_TREE_V1 + "\nsglang_futuremap_patch: applied")[0] == "spec v1"
    auto = ("[x WARNING pid=7] sglang_futuremap_patch: Spec v1 is used for EAGLE3 speculative decoding because the "
            "auto-chosen tree (num_steps=5, eagle_topk=4, num_draft_tokens=8) does not run on spec v2 here: x.")
    assert bench.spec_path_from_log(auto)[0] == "spec v1"
    assert bench.spec_path_from_log("nothing here") == (None, "no spec v1 / spec v2 line in the log")
    # no line: the server args say it (overlap scheduler off = spec v1); a disagreement is said
    assert bench.classify_spec_path("", {"disable_overlap_schedule": True}) == (
        "spec v1", "server args: disable_overlap_schedule True")
    assert bench.classify_spec_path("", {}) == (None, "no spec v1 / spec v2 line in the log")
    path, why = bench.classify_spec_path(PLUGIN_TREE_V2, {"disable_overlap_schedule": True})
    assert path == "spec v2" and why.endswith("but its server args say spec v1")
    # a run of an older file (no spec_path): its server args
    assert bench.run_spec_path({"result": {"effective": {"disable_overlap_schedule": False}}}) == "spec v2"
    assert bench.run_spec_path({"spec_path": "spec v1", "result": {}}) == "spec v1"
    assert bench.run_spec_path({"result": None}) is None


def test_a_patched_tree_without_its_spec_v2_line_is_left_out():
    patched_v2 = bench.scan_plugin_log("\n".join([STOCK_TREE_V1, PLUGIN_TREE_V2, APPLIED.format(pid=10),
                                                  APPLIED.format(pid=11)]))
    patched_v1 = bench.scan_plugin_log("\n".join([STOCK_TREE_V1, APPLIED.format(pid=10), APPLIED.format(pid=11)]))
    assert patched_v2["tree_v2_lines"] == 1 and patched_v1["tree_v2_lines"] == 0
    assert bench.run_validity("patched", patched_v2, [11], 10, tree=True)[0] is True
    ok, why = bench.run_validity("patched", patched_v1, [11], 10, tree=True)
    assert ok is False and "no 'spec v2 runs the EAGLE tree' line: the tree did not run on spec v2" in why
    assert bench.run_validity("patched", patched_v1, [11], 10)[0] is True  # a chain needs no tree line
    stock = bench.scan_plugin_log("\n".join([STOCK_TREE_V1, DISABLED]))
    assert bench.run_validity("stock", stock, [11], 10, tree=True)[0] is True
    ok, why = bench.run_validity("stock", dict(stock, tree_v2_lines=1), [11], 10, tree=True)
    assert ok is False and "with the plugin off" in why
    # and the invalid run is out of the medians, with its reason in the summary
    case = dict(_case(model="8b", backend="flashinfer", runs=[
        _run("stock", 0, {1: [100]}), dict(_run("patched", 0, {1: [300]}, valid=False), validity=why)]), spec=[3, 4, 16])
    assert bench.summarize_case(case)["n_runs"] == {"stock": 1, "patched": 0}
    assert f"  left out: timed patched rep 0: {why}" in bench.format_summary(_doc([case]))


def _spec_run(variant, rep, per_bs, path, acc):
    r = _run(variant, rep, per_bs)
    for b in r["result"]["batches"].values():
        for t in b["trials"]:
            t["accept_length"] = acc
    return dict(r, spec_path=path)


def test_tree_against_chain_table_summary_and_readme(tmp_path):
    def case(spec, backend, stock, patched, stock_path, acc):
        return dict(_case(model="8b", backend=backend, runs=[
            _spec_run("stock", 0, stock, stock_path, acc), _spec_run("patched", 0, patched, "spec v2", acc)]), spec=spec)

    chain = case([3, 1, 4], "flashinfer", {1: [300], 16: [4000]}, {1: [330], 16: [4100]}, "spec v2", 4.0)
    tree = case([3, 4, 16], "flashinfer", {1: [200], 16: [2000]}, {1: [264], 16: [3075]}, "spec v1", 3.99)
    deep = case([5, 4, 8], "flashinfer", {1: [250]}, {1: [396]}, "spec v1", 5.9)
    lone = case([3, 4, 16], "fa3-pcg", {1: [200]}, {1: [260]}, "spec v1", 4.0)  # no fa3-pcg chain: no table
    chain5 = case([5, 1, 6], "triton-nopcg", {1: [1]}, {1: [1]}, "spec v2", 6.0)  # another backend: never used
    cases = [tree, chain, deep, lone, chain5]
    assert bench.chain_case_for(tree, cases) is chain and bench.chain_case_for(lone, cases) is None
    items = bench.tree_vs_chain(cases)
    assert [(it["tree"], it["chain"]) for it in items] == [("8b/flashinfer spec 3/4/16", "8b/flashinfer"),
                                                           ("8b/flashinfer spec 5/4/8", "8b/flashinfer")]
    first = items[0]
    assert bench.tree_vs_chain_title(first) == "spec v2 topk 4 vs spec v2 topk 1"
    assert [(r["bs"], r["ratio"], r["tree_accept"], r["chain_accept"]) for r in first["rows"]] == [
        (1, pytest.approx(0.8), 3.99, 4.0), (16, pytest.approx(0.75), 3.99, 4.0)]
    assert [r["bs"] for r in items[1]["rows"]] == [1] and items[1]["rows"][0]["ratio"] == pytest.approx(1.2)
    # a chain of the tree's own depth is preferred to the default one
    chain5fi = case([5, 1, 6], "flashinfer", {1: [360]}, {1: [360]}, "spec v2", 6.0)
    assert bench.chain_case_for(deep, cases + [chain5fi]) is chain5fi
    # the summary: header note, spec path and accept beside each tok/s, the tree/chain table
    doc = _doc(cases)
    text = bench.format_summary(doc)
    assert text.splitlines()[0].startswith("dummy weights: the draft accepts (almost) every token")
    assert ("  bs   1: stock 200.0 tok/s (accept 3.99, spec v1), patched 264.0 tok/s (accept 3.99, spec v2), "
            "ratio 1.320") in text
    assert "8b/flashinfer (spec 3/1/4): runs stock 1, patched 1" in text
    assert ("spec v2 topk 4 vs spec v2 topk 1, patched (tree / chain): 8b/flashinfer spec 3/4/16 vs 8b/flashinfer "
            "(3/4/16 vs 3/1/4)") in text
    assert ("  bs  16: tree 3075.0 tok/s (accept 3.99), chain 4100.0 tok/s (accept 4.00), tree / chain 0.750"
            in text)
    # the targets are about chains: no tree case among them
    assert {t["case"].split(" bs ")[0] for t in bench.evaluate_targets(cases)} == {"8b/flashinfer", "8b/triton-nopcg spec 5/1/6"}
    # the README: a section with one table per tree that has its chain
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    plot_bench.build([path], tmp_path / "out", do_plot=False)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "## Trees against chains (patched: tree / chain decode tok/s)" in readme
    assert "### spec v2 topk 4 vs spec v2 topk 1: 8b/flashinfer spec 3/4/16 vs 8b/flashinfer (patched)" in readme
    assert "| bs | tree 3/4/16 tok/s (accept len) | chain 3/1/4 tok/s (accept len) | tree / chain |" in readme
    assert "| 16 | 3075.0 (acc 3.99) | 4100.0 (acc 4.00) | 0.750 |" in readme
    assert "8b fa3-pcg spec 3/4/16 vs" not in readme
    assert "| 8b flashinfer spec 3/4/16 | - | v1 / v2 | 1 | 1/1 | 200.0 (acc 3.99) | 264.0 (acc 3.99) | 1.320 |" in readme
    assert "3/1/4 (chain), 5/1/6 (chain), 3/4/16 (tree), 5/4/8 (tree)" in readme


def test_end_to_end_tree_and_chain_with_fake_sglang(tmp_path, fake_site):
    p, out, doc = _fake_bench(tmp_path, fake_site, "--spec", "3,4,16", "--spec", "3,1,4", "--reps", "1",
                              "--no-probe", "--batch-sizes", "1")
    assert [bench.case_name(c) for c in doc["cases"]] == ["tiny/triton-nopcg spec 3/4/16", "tiny/triton-nopcg"]
    assert doc["config"]["specs"] == [[3, 4, 16], [3, 1, 4]] and doc["config"]["spec"]["speculative_eagle_topk"] == 4
    tree, chain = doc["cases"]
    assert tree["engine_kwargs"]["speculative_num_draft_tokens"] == 16
    assert [(r["variant"], r["spec_path"], r["valid"]) for r in tree["runs"]] == [
        ("stock", "spec v1", True), ("patched", "spec v2", True)], [r["validity"] for r in tree["runs"]]
    assert [(r["variant"], r["spec_path"], r["valid"]) for r in chain["runs"]] == [
        ("stock", "spec v2", True), ("patched", "spec v2", True)]
    assert "spec v2 runs the EAGLE tree" in tree["runs"][1]["spec_path_from"]
    assert "1 'spec v2 runs the EAGLE tree' lines" in tree["runs"][1]["validity"]
    assert tree["summary"]["spec_paths"] == {"stock": "spec v1", "patched": "spec v2"}
    logs = sorted(x.name for x in (out.parent / "bench-logs").iterdir())
    assert sum(x.startswith("tiny-triton-nopcg-s3_4_16-timed-") for x in logs) == 2 and len(logs) == 4
    assert "patched 0" not in p.stdout and "stock: triton, PCG off, page 1; SGLang 0.5.12.post1-fake; Fake GPU; spec v1" in p.stdout
    assert "spec v2 topk 4 vs spec v2 topk 1, patched (tree / chain)" in p.stdout and "tree / chain " in p.stdout


def test_end_to_end_patched_tree_kept_on_spec_v1_is_left_out(tmp_path, fake_site):
    p, out, doc = _fake_bench(tmp_path, fake_site, "--spec", "3,4,16", "--reps", "1", "--no-probe", "--batch-sizes",
                              "1", rc=1, env_extra={"SGLANG_FUTUREMAP_TREE_SPEC_V2": "0"})
    (case,) = doc["cases"]
    stock, patched = case["runs"]
    assert stock["valid"] and stock["spec_path"] == "spec v1"
    assert not patched["valid"] and patched["spec_path"] == "spec v1" and patched["error"] is None
    assert "no 'spec v2 runs the EAGLE tree' line" in patched["validity"]
    assert case["summary"]["n_runs"] == {"stock": 1, "patched": 0} and case["summary"]["invalid_runs"] == 1
    assert "left out: timed patched rep 0: " in p.stdout


def test_first_guess_of_a_tree_engine():
    assert bench.first_guess_s("8b", "flashinfer") == 120.0 and bench.first_guess_s("8b", "triton-pcg") == 240.0
    assert bench.first_guess_s("8b", "fa3-pcg") == 180.0 and bench.first_guess_s("8b", "default") == 180.0
    assert bench.first_guess_s("8b", "triton-pcg", pcg_max_tokens=512) == 180.0
    assert bench.first_guess_s("8b", "fa3-pcg", pcg_max_tokens=4096) == 240.0
    # an fa3-pcg tree pair fits a chunk's deadline (~500 s) on the first guess
    assert 2 * (bench.first_guess_s("8b", "fa3-pcg") + bench.TREE_EXTRA_S["8b"]) < 500


def test_end_to_end_the_next_case_starts_from_the_walls_seen(tmp_path, fake_site):
    """A chain pair (first guess 2 x 75 s) fits a 160 s deadline; the tree pair after it would
    not on its first guess (2 x 90 s), but the Engines took seconds, and that is its guess."""
    p, out, doc = _fake_bench(tmp_path, fake_site, "--spec", "3,1,4;3,4,16", "--reps", "1", "--no-probe",
                              "--batch-sizes", "1", "--deadline-s", "160")
    assert [(bench.case_name(c), len(c["runs"]), c["skipped"]) for c in doc["cases"]] == [
        ("tiny/triton-nopcg", 2, []), ("tiny/triton-nopcg spec 3/4/16", 2, [])]


def test_flashinfer_trees_are_measured_on_spec_v2_as_asked_for():
    """The plugin keeps a FlashInfer tree on spec v1 unless SGLANG_FUTUREMAP_TREE_SPEC_V2=1:
    the bench sets it there (chains and other backends: nothing)."""
    tree = {"model": "8b", "backend": "flashinfer", "spec": [3, 4, 16]}
    assert bench.tree_env(tree) == {"SGLANG_FUTUREMAP_TREE_SPEC_V2": "1"}
    assert bench.tree_env({**tree, "backend": "fa3-pcg"}) == {}
    assert bench.tree_env({**tree, "spec": [3, 1, 4]}) == {}
    assert bench.tree_env({"model": "8b", "backend": "flashinfer"}) == {}


# ----------------------------------------------------------------------------- DeepSeek MTP (MLA)


def test_deepseek_model_runs_deepseek_mtp_on_its_seeded_checkpoint(sglang_loaded, tmp_path, monkeypatch):
    """``--model deepseek``: the factory's DeepSeek-V3 checkpoint (seeded weights, context as the
    case needs), launched as the e2e ``mla`` cases are (NEXTN, no draft path, no backend named);
    SGLang turns it into EAGLE on the target's own NextN layer, FA3 + PCG on Hopper."""
    import gpu_e2e as e2e
    import sglang.srt.server_args as sa_mod
    from sglang_cpu_support import server_args

    target, draft = model_factory.write_model_dirs("deepseek", tmp_path / "a", 8192)
    assert draft is None and model_factory.model_config(target)["max_position_embeddings"] == 8192
    again = model_factory.make_deepseek_models(tmp_path / "b")  # the context leaves the weights alone
    assert Path(target, "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()
    assert Path(target, "tokenizer.json").exists()
    kw = bench.engine_kwargs("deepseek", "default", target, "<ignored>", [48, 1, 4, 16])
    mla = e2e.engine_kwargs(next(c for c in e2e.mla_cases() if c.name == "mla-default-graph"), Path(target).parent)
    launch_keys = ("model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                   "speculative_eagle_topk", "speculative_num_draft_tokens", "attention_backend",
                   "disable_piecewise_cuda_graph", "load_format")
    assert {k: kw.get(k) for k in launch_keys} == {k: mla.get(k) for k in launch_keys}
    assert kw["speculative_algorithm"] == "NEXTN" and "speculative_draft_model_path" not in kw
    assert "load_format" not in kw and kw["mem_fraction_static"] == bench.MEM_FRACTION["deepseek"]
    assert kw["piecewise_cuda_graph_max_tokens"] == 512 and kw["cuda_graph_bs"] == [1, 4, 16, 48]
    five = bench.engine_kwargs("deepseek", "default", target, None, [1], spec=(5, 1, 6))
    assert [five[k] for k in bench.SPEC_KEYS] == [5, 1, 6]
    assert bench.engine_kwargs("tiny", "default", target, target, [1])["load_format"] == "dummy"
    monkeypatch.setattr(sa_mod, "is_hopper_with_cuda_12_3", lambda: True)
    sa = server_args(kw, device="cuda")
    assert sa.speculative_algorithm == "EAGLE" and sa.speculative_draft_model_path == target
    assert (sa.attention_backend, sa.disable_piecewise_cuda_graph, sa.load_format) == ("fa3", False, "auto")
    assert sa.use_mla_backend() and not sa.disable_overlap_schedule
    # a chunk of three Engines (stock, patched, patched-mla-mirror) fits the ~490 s deadline on the first guess
    assert bench.first_guess_s("deepseek", "default") == 150.0 and 3 * 150.0 < 490
    assert bench.first_guess_s("deepseek", "triton-nopcg") == 75.0


def test_dry_run_of_the_deepseek_rows_with_the_mirror_variant(capsys):
    assert bench.main(["--dry-run", "--model", "deepseek", "--backend", "default", "--reps", "1", "--no-probe",
                       "--variants", "stock,patched,patched-mla-mirror"]) == 0
    head, *passes = capsys.readouterr().out.splitlines()
    assert head.startswith("deepseek/default: spec 3/1/4")
    kw = json.loads(head.split("context 4096: ", 1)[1])
    assert kw["speculative_algorithm"] == "NEXTN" and "speculative_draft_model_path" not in kw
    assert "load_format" not in kw and "attention_backend" not in kw
    assert passes == ["   timed rep 0: stock (SGLANG_FUTUREMAP_PATCH=off), patched (SGLANG_FUTUREMAP_PATCH=strict), "
                      "patched-mla-mirror (SGLANG_FUTUREMAP_PATCH=strict, SGLANG_FUTUREMAP_FA3_MLA=0)"]


def test_deepseek_chunk_builds_its_model_and_only_the_mirror_variant_gets_the_switch(tmp_path, monkeypatch, capsys):
    seen = []

    def fake_worker(script, spec, work, name, log_path, env, timeout, **kw):
        model = Path(spec["engine_kwargs"]["model_path"])
        seen.append((name, env.get(child_env.FA3_MLA_ENV), env[child_env.ENV_MODE],
                     (model / "model.safetensors").exists(), spec["engine_kwargs"]))
        log_path.write_text("no Engine here\n")
        return 1, 1.0, None, log_path.read_text()

    monkeypatch.setattr(launch, "run_worker", fake_worker)
    monkeypatch.setenv(child_env.FA3_ENV, "1")
    monkeypatch.setenv(child_env.FA3_MLA_ENV, "0")  # in the caller's shell: stock and patched must run without it
    out = tmp_path / "bench.json"
    bench.main(["--model", "deepseek", "--backend", "default", "--variants", "stock,patched,patched-mla-mirror",
                "--reps", "1", "--no-probe", "--batch-sizes", "1", "--gpu-release-s", "0", "--out", str(out)])
    assert [(n.rsplit("-r", 1)[0], switch, mode, built) for n, switch, mode, built, _ in seen] == [
        ("deepseek-default-timed-stock", None, "off", True), ("deepseek-default-timed-patched", None, "strict", True),
        ("deepseek-default-timed-patched-mla-mirror", "0", "strict", True)]
    assert all(kw["speculative_algorithm"] == "NEXTN" and "speculative_draft_model_path" not in kw
               and "load_format" not in kw for *_, kw in seen)
    doc = json.loads(out.read_text())
    assert doc["config"]["algorithms"] == {"deepseek": "NEXTN"}
    assert doc["config"]["spec"]["speculative_algorithm"] == "NEXTN"
    assert doc["config"]["variant_env"] == {"patched-mla-mirror": {child_env.FA3_MLA_ENV: "0"}}
    text = capsys.readouterr().out
    assert bench.SEEDED_NOTE in text and bench.DUMMY_NOTE not in text
    assert "SGLANG_FUTUREMAP_PATCH=strict, SGLANG_FUTUREMAP_FA3_MLA=0" in text  # the log line of that Engine


def test_the_mirror_variant_has_its_column_and_each_model_its_weights_note():
    runs = [_run("stock", 0, {1: [100]}), _run("patched", 0, {1: [110]}), _run("patched-mla-mirror", 0, {1: [125]})]
    case = dict(_case(model="deepseek", backend="default", runs=runs), spec=[3, 1, 4])
    s = bench.summarize_case(case)
    assert s["variants"] == ["stock", "patched", "patched-mla-mirror"]
    assert s["by_bs"]["1"]["ratios"] == {"patched": pytest.approx(1.1), "patched-mla-mirror": pytest.approx(1.25)}
    case["summary"] = s
    text = bench.format_summary(_doc([case]))
    assert ", patched-mla-mirror 125.0 tok/s (accept 4.00, spec path ?; x1.250)" in text
    assert bench.weights_notes(["tiny", "8b"]) == [bench.DUMMY_NOTE] and bench.weights_notes([]) == [bench.DUMMY_NOTE]
    assert bench.weights_notes(["deepseek"]) == [bench.SEEDED_NOTE]
    assert bench.weights_notes(["deepseek", "tiny"]) == [bench.DUMMY_NOTE, bench.SEEDED_NOTE]
