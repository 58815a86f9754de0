"""CPU tests of the serving benchmark's harness (scripts/gpu_serve_bench.py): the launch and
bench_serving command lines go through SGLang's own parsers, and the summary math."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_serve_bench as sb  # noqa: E402
from gpu_harness import child_env, launch, model_factory, records  # noqa: E402


def test_boots_alternate_and_cells_get_enough_requests() -> None:
    assert [sb.boot_order(["stock", "patched"], b) for b in range(3)] == [
        ["stock", "patched"], ["patched", "stock"], ["stock", "patched"]]
    assert sb.num_prompts(1, 3, 12) == 12 and sb.num_prompts(48, 3, 12) == 144
    assert [sb.requests_sent("generated-shared-prefix", n) for n in (12, 52, 64, 3)] == [8, 48, 64, 8]
    assert sb.requests_sent("random-ids", 52) == 52
    seeds = {sb.cell_seed(1, c) for c in (1, 4, 8, 13, 16, 32, 45, 48)}
    assert len(seeds) == 8  # every cell its own prompts: no radix-cache hits across cells


def test_server_command_is_a_users_launch_that_sglang_parses(sglang_loaded) -> None:
    from sglang.srt.server_args import ServerArgs

    argv = sb.server_argv("/m/target", "/m/draft", "default", 31200)
    assert argv[1:3] == ["-m", "sglang.launch_server"] and "--attention-backend" not in argv
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv[3:])
    assert (ns.speculative_algorithm, ns.speculative_num_steps, ns.speculative_eagle_topk,
            ns.speculative_num_draft_tokens) == ("STANDALONE", 3, 1, 4)
    assert ns.attention_backend is None and ns.enable_metrics and ns.port == 31200
    triton = parser.parse_args(sb.server_argv("/m/t", "/m/d", "triton", 1, ["--cuda-graph-max-bs", "8"])[3:])
    assert triton.attention_backend == "triton" and triton.cuda_graph_max_bs == 8
    tree = parser.parse_args(sb.server_argv("/m/t", "/m/d", "default", 1, spec="tree")[3:])
    assert (tree.speculative_num_steps, tree.speculative_eagle_topk, tree.speculative_num_draft_tokens) == (5, 4, 8)


def test_tree_row_is_the_tree_sglang_picks_for_a_llama_target(sglang_loaded) -> None:
    """``--spec tree`` gives the tree SGLang 0.5.12.post1 chooses by itself for a Llama target with
    an EAGLE draft (its own auto_choose_speculative_params), given explicitly."""
    from types import SimpleNamespace

    from sglang.srt.server_args import auto_choose_speculative_params

    llama = SimpleNamespace(speculative_algorithm="EAGLE", get_model_config=lambda: SimpleNamespace(
        hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"])))
    assert auto_choose_speculative_params(llama) == sb.SPECS["tree"]
    standalone = SimpleNamespace(speculative_algorithm="STANDALONE", get_model_config=llama.get_model_config)
    assert auto_choose_speculative_params(standalone) == sb.SPECS["chain"]


def test_bench_command_goes_through_bench_servings_parser(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(child_env.DATASETS_STAND_IN))  # as the benchmark runs it
    import sglang.bench_serving as bs

    args = argparse.Namespace(dataset="random-ids", input_len=256, output_len=256, range_ratio=1.0, seed=1, warmup="wave")
    argv = sb.bench_argv("/m/target", 31200, 13, 39, tmp_path / "o.jsonl", args)
    captured = {}
    monkeypatch.setattr(bs, "run_benchmark", lambda ns: captured.setdefault("ns", ns))
    monkeypatch.setattr(sys, "argv", ["bench_serving", *argv[3:]])
    src = Path(bs.__file__).read_text()
    main = src[src.index('if __name__ == "__main__":'):]
    exec(compile(main.replace('if __name__ == "__main__":', "if True:"), bs.__file__, "exec"), vars(bs))
    ns = captured["ns"]
    assert (ns.dataset_name, ns.max_concurrency, ns.num_prompts, ns.random_input_len, ns.random_range_ratio) == (
        "random-ids", 13, 39, 256, 1.0)
    # A warm-up wave at the cell's concurrency, and the per-request TTFTs in the output file.
    assert ns.warmup_requests == 13 and ns.output_details
    assert sb.warmup_requests("one", 13) == 1 and sb.warmup_requests("wave", 48) == 48
    # Lengths drawn: --range-ratio reaches bench_serving's parser
    args.range_ratio = 0.5
    monkeypatch.setattr(sys, "argv", ["bench_serving", *sb.bench_argv("/m/target", 31200, 13, 39, tmp_path / "o.jsonl",
                                                                      args)[3:]])
    captured.clear()
    exec(compile(main.replace('if __name__ == "__main__":', "if True:"), bs.__file__, "exec"), vars(bs))
    assert captured["ns"].random_range_ratio == 0.5
    # generated-shared-prefix: whole groups of 8, as many as requests_sent counts
    args.dataset = "generated-shared-prefix"
    monkeypatch.setattr(sys, "argv", ["bench_serving", *sb.bench_argv("/m/target", 31200, 13, 52, tmp_path / "o.jsonl",
                                                                      args)[3:]])
    captured.clear()
    exec(compile(main.replace('if __name__ == "__main__":', "if True:"), bs.__file__, "exec"), vars(bs))
    ns = captured["ns"]
    assert ns.dataset_name == "generated-shared-prefix"
    assert ns.gsp_num_groups * ns.gsp_prompts_per_group == sb.requests_sent(args.dataset, 52) == 48


def _pooled_run(variant: str, boot: int, ttfts: list[float]) -> dict:
    cell = {k: None for k in (*sb.LATENCY_KEYS, *sb.OTHER_KEYS)}
    cell.update(median_ttft_ms=sorted(ttfts)[len(ttfts) // 2], ttfts_ms=ttfts)
    return {"variant": variant, "boot": boot, "cells": {"8": cell}, "error": None}


def test_cells_keep_each_requests_ttft_and_the_summary_pools_them(tmp_path: Path) -> None:
    bench = {"median_ttft_ms": 50.0, "ttfts": [0.0501234, 0.0612, 0.0, None]}
    vals = sb.cell_values(bench, 97.0)
    assert vals["ttfts_ms"] == [50.1, 61.2]  # failed requests (no TTFT) dropped
    assert "ttfts_ms" not in sb.flat_cell(vals)  # not a per-boot statistic
    # Two boots per side; pooled, patched is 10% faster at every quantile.
    stock = [_pooled_run("stock", b, [float(v) for v in range(100 + b, 300, 2)]) for b in (0, 1)]
    patched = [_pooled_run("patched", b, [v / 1.1 for v in r["cells"]["8"]["ttfts_ms"]]) for b, r in enumerate(stock)]
    pooled = sb.pooled_ttft(stock + patched)
    row = pooled[8]
    assert row["n"] == [200, 200]
    assert row["p50"]["stock"] == pytest.approx(records.quantile(
        stock[0]["cells"]["8"]["ttfts_ms"] + stock[1]["cells"]["8"]["ttfts_ms"], 0.5))
    for q in ("p50", "p99"):
        assert row[q]["ratio"] == pytest.approx(1.1)
        lo, hi = row[q]["ci90"]
        assert lo <= row[q]["ratio"] <= hi and hi - lo < 0.3
    assert pooled == sb.pooled_ttft(stock + patched)  # seeded: the record is reproducible
    # A slower side reads below parity, and the merged record prints the pooled table.
    slower = [_pooled_run("patched", b, [v * 1.2 for v in r["cells"]["8"]["ttfts_ms"]]) for b, r in enumerate(stock)]
    assert sb.pooled_ttft(stock + slower)[8]["p50"]["ratio"] == pytest.approx(1 / 1.2)
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": stock + patched}))
    text = sb.merge([doc])
    assert "TTFT over every request of every boot, stock -> patched" in text
    assert "| 8 | 200 / 200 | " in text and "(x1.100 [" in text
    assert records.quantile([1, 2, 3, 4], 0.5) == 2.5 and records.quantile([5], 0.99) == 5


def test_prefill_first_variant_is_the_plugin_with_back_port_16_on() -> None:
    mode, env = sb.MODES["patched-prefill-first"]
    assert mode == "strict" and env == {"SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST": "1"}
    from sglang_futuremap_patch.backports import prefill_result_first

    assert prefill_result_first.PREFILL_RESULT_FIRST_ENV in env
    assert sb.PATCHED_VARIANTS == {"patched", "patched-prefill-first", "patched-no-war", "patched-mla-mirror",
                                   "patched-early-intake", "patched-fi-host-sum", "patched-no-early-intake",
                                   "patched-no-fi-host-sum", "patched-mirror-relay",
                                   "patched-relay-prefill-first", "patched-tree-switches-off",
                                   "patched-serial-prefills", "patched-mirror-relay-check",
                                   "patched-mirror-relay-device-indptr", "patched-prefill-before-next-batch",
                                   "patched-war-after-launch", "patched-skip-idle", "patched-poll-barrier"}
    runs = [_run("stock", 0, 100, 10, 1000), _run("patched", 0, 90, 8, 1250),
            _run("patched-prefill-first", 0, 120, 8, 1250)]
    summary = sb.summarize(runs)
    assert summary["ratio_patched-prefill-first"][32]["median_ttft_ms"] == pytest.approx(100 / 120)


def test_the_check_variants_set_the_switches_they_name() -> None:
    """The variants that found back-port 23's crash: both checks on, or back-port 23 off, each
    with back-port 22 switched on (the switch names are the back-ports' own)."""
    from sglang_futuremap_patch.backports import flashinfer_host_indptr, mirror_relay_lens

    mode, env = sb.MODES["patched-mirror-relay-check"]
    assert mode == "strict" and env == {mirror_relay_lens.MIRROR_RELAY_ENV: "1",
                                        mirror_relay_lens.RELAY_CHECK_ENV: "1",
                                        flashinfer_host_indptr.HOST_INDPTR_CHECK_ENV: "1"}
    mode, env = sb.MODES["patched-mirror-relay-device-indptr"]
    assert mode == "strict" and env == {mirror_relay_lens.MIRROR_RELAY_ENV: "1",
                                        flashinfer_host_indptr.HOST_INDPTR_ENV: "0"}
    assert {"patched-mirror-relay-check", "patched-mirror-relay-device-indptr"} <= set(sb.MODE_NOTES)


def _run(variant: str, boot: int, ttft: float, tpot: float, tput: float) -> dict:
    cell = {k: None for k in (*sb.LATENCY_KEYS, *sb.OTHER_KEYS)}
    cell.update(median_ttft_ms=ttft, p99_ttft_ms=2 * ttft, median_tpot_ms=tpot, output_throughput=tput)
    return {"variant": variant, "boot": boot, "cells": {"32": cell}, "error": None}


def test_summary_is_the_median_of_boots_and_flags_worse_latency(tmp_path: Path) -> None:
    runs = [_run("stock", 0, 100, 10, 1000), _run("stock", 1, 120, 12, 900), _run("stock", 2, 300, 11, 950),
            _run("patched", 0, 110, 8, 1200), _run("patched", 1, 118, 9, 1100), _run("patched", 2, 119, 9, 1150)]
    s = sb.summarize(runs)
    assert s["variants"]["stock"][32]["median_ttft_ms"] == {"median": 120, "min": 100, "max": 300, "n": 3}
    ratio = s["ratio"][32]
    assert ratio["median_ttft_ms"] == pytest.approx(120 / 118) and ratio["median_tpot_ms"] == pytest.approx(11 / 9)
    assert ratio["output_throughput"] == pytest.approx(1150 / 950)
    assert sb.worse_cells(s) == []
    worse = sb.summarize(runs[:3] + [_run("patched", b, 150, 9, 1100) for b in range(3)])
    assert sb.worse_cells(worse) == ["conc 32 median_ttft_ms: x0.800", "conc 32 p99_ttft_ms: x0.800"]
    table = sb.format_table(s)
    assert "| 32 | 120.0 -> 118.0 (x1.017)" in table
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": runs}))
    assert "Latency cells more than 3% worse patched: none" in sb.merge([doc])


def test_merge_plots_the_ratios_above_parity_when_patched_is_better(tmp_path: Path) -> None:
    runs = []
    for conc, (s_ttft, p_ttft) in {"1": (30, 20), "16": (100, 150)}.items():
        for variant, ttft in (("stock", s_ttft), ("patched", p_ttft)):
            run = _run(variant, 0, ttft, 10 if variant == "stock" else 8, 1000)
            run["cells"] = {conc: run["cells"]["32"]}
            runs.append(run)
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "triton", "server_args": []}}, "runs": runs}))
    svg_path = tmp_path / "r.svg"
    sb.main(["--merge", str(doc), "--plot", str(svg_path)])
    svg = svg_path.read_text()
    assert svg.startswith("<svg") and "backend triton" in svg
    parity = float(svg.split('<line x1="56" x2="530" y1="')[1].split('"')[0])

    def ys(metric: str) -> list[float]:
        pts = svg.split(f'data-metric="{metric}"')[1].split('points="')[1].split('"')[0].split()
        return [float(p.split(",")[1]) for p in pts]

    # TTFT p50: x1.5 better at concurrency 1 (above parity: smaller y), x0.67 at 16 (below).
    ttft = ys("median_ttft_ms")
    assert len(ttft) == 2 and ttft[0] < parity < ttft[1]
    tpot = ys("median_tpot_ms")
    assert all(y < parity for y in tpot) and tpot[0] == tpot[1]  # x1.25 at both
    assert 'data-metric="median_itl_ms"' not in svg  # in PLOT_KEYS but no values: no line


def test_plot_of_a_record_without_patched_draws_its_variant_against_stock() -> None:
    runs = [_run("stock", 0, 30, 10, 1000), _run("patched-prefill-first", 0, 20, 8, 1250)]
    summary = sb.summarize(runs)
    svg = sb.plot_svg(summary, "t")
    assert "(patched-prefill-first vs stock, above 1 = better)" in svg
    assert 'data-metric="median_ttft_ms"' in svg
    assert sb.plot_svg(sb.summarize([_run("patched", 0, 20, 8, 1250)]), "t") == ""  # no stock: nothing


def test_upstream_runs_its_own_sglang_and_gets_its_own_table(tmp_path: Path) -> None:
    current, upstream = tmp_path / "site312", tmp_path / "site312-0.5.13"
    for site, version in ((current, "0.5.12.post1"), (upstream, "0.5.13")):
        (site / "sglang").mkdir(parents=True)
        (site / "sglang" / "__init__.py").write_text("")
        (site / "sglang" / "_version.py").write_text(f'__version__ = "{version}"\n')
    env = sb.upstream_env({"PYTHONPATH": os.pathsep.join([str(child_env.DATASETS_STAND_IN), str(current)])}, str(upstream))
    # The upstream SGLang first, the current one gone, the datasets stand-in kept.
    assert env["PYTHONPATH"].split(os.pathsep) == [str(upstream), str(child_env.DATASETS_STAND_IN)]
    runs = [_run("stock", 0, 100, 10, 1000), _run("patched", 0, 120, 8, 1250), _run("upstream", 0, 80, 9, 1100)]
    runs[2]["sglang"] = "0.5.13"
    summary = sb.summarize(runs)
    assert summary["ratio"][32]["median_ttft_ms"] == pytest.approx(100 / 120)
    assert summary["ratio_upstream"][32]["median_ttft_ms"] == pytest.approx(100 / 80)
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "triton", "server_args": []}}, "runs": runs}))
    text = sb.merge([doc])
    assert "| 32 | 100.0 -> 120.0 (x0.833)" in text  # stock -> patched
    assert "stock SGLang 0.5.13" in text and "| 32 | 100.0 -> 80.0 (x1.250)" in text  # stock -> upstream
    assert "conc 32 median_ttft_ms: x0.833" in text  # the worse-cells line is about patched only
    # Without an upstream run there is no upstream table.
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "triton", "server_args": []}}, "runs": runs[:2]}))
    assert "upstream" not in sb.merge([doc])
    # An upstream site without SGLang: the run says so instead of starting a server.
    args = argparse.Namespace(out=tmp_path / "out", timeline=False, upstream_site=str(tmp_path / "none"),
                              backend="triton", server_arg=[], concurrency=[1], spec="chain", model="8b")
    run = sb.run_server("upstream", 0, "t", "d", args, deadline=0.0, port=1)
    assert run["error"].startswith("upstream site") and not run["cells"]


def test_occupancy_is_read_from_sglangs_decode_lines() -> None:
    log = ("Decode batch, #running-req: 32, fwd occupancy: nan%\n"
           "Decode batch, #running-req: 32, fwd occupancy: 91.50%\nDecode batch, fwd occupancy: 95.50%\n")
    assert sb.occupancy(log) == pytest.approx(93.5) and sb.occupancy("nothing") is None


def test_wait_until_ready_says_why_a_server_never_answered(tmp_path: Path) -> None:
    """The readiness wait both harnesses use: ready, exited, or out of time."""
    import http.server
    import socket
    import socketserver
    import subprocess
    import threading
    import time

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    with socketserver.TCPServer(("127.0.0.1", 0), Ok) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            url = f"http://127.0.0.1:{httpd.server_address[1]}/health_generate"
            assert launch.wait_until_ready(alive, url, time.monotonic() + 10, poll_s=0.1) is None
            with socket.socket() as probe:  # a port nobody listens on
                probe.bind(("127.0.0.1", 0))
                free = probe.getsockname()[1]
            dead_url = f"http://127.0.0.1:{free}/health"
            assert launch.wait_until_ready(alive, dead_url, time.monotonic() + 0.3, poll_s=0.1) == "not ready in time"
        finally:
            alive.kill()
            alive.wait()
            httpd.shutdown()
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    gone.wait()
    assert launch.wait_until_ready(gone, "http://127.0.0.1:1/", time.monotonic() + 10) == (
        "exited with 3 before it was ready")


# ----------------------------------------------------------------------------- the scheduler timeline

st = child_env.probe_module("sched_timeline")
REAL_WATCH_GC = st.Timeline.watch_gc
REAL_WATCH_COMPILES = st.Timeline.watch_compiles


@pytest.fixture(autouse=True)
def _compile_watch_off(monkeypatch) -> list:
    """The probe's install wraps Triton's compile for the rest of the process: the tests that
    install it get a stand-in that only records who asked; the compile tests call the real one
    on their own class."""
    asked: list = []
    monkeypatch.setattr(st.Timeline, "watch_compiles", lambda self, jit_cls=None: asked.append(self))
    return asked


@pytest.fixture(autouse=True)
def _gc_watch_recorded(monkeypatch) -> list:
    """The probe's garbage-collection hook would stay in this test process and add ``gc`` events
    whenever pytest collects: every test gets a stand-in that only records who asked for it."""
    asked: list = []
    monkeypatch.setattr(st.Timeline, "watch_gc", lambda self, where: asked.append((self, where)))
    return asked


def test_timeline_probe_records_full_and_long_garbage_collections(tmp_path: Path, _gc_watch_recorded,
                                                                   _compile_watch_off) -> None:
    """A full collection gives a ``gc`` event (start, end, generation 2, objects collected); a
    young one that was quick gives none. Both processes' probes watch: the scheduler's install
    and the API server's."""
    import gc

    tl = st.Timeline(str(tmp_path))
    REAL_WATCH_GC(tl, "api")
    gc.disable()  # no automatic collection takes the cycles first
    try:
        junk = [[i] for i in range(1000)]
        for x in junk:
            x.append(x)  # cycles only the collector frees
        del junk
        gc.collect()
        full = [e for e in tl.events if e["kind"] == "gc"]
        assert len(full) == 1 and full[0]["gen"] == 2 and full[0]["collected"] >= 1000 and full[0]["where"] == "api"
        assert full[0]["t"] <= full[0]["t1"]
        before = len(tl.events)
        gc.collect(0)
        assert all(e["gen"] == 2 or e["t1"] - e["t"] >= st.GC_MIN_S for e in tl.events[before:])
    finally:
        gc.enable()
        gc.callbacks.remove(tl.gc_hook)
    sched_tl, api_tl = st.Timeline(str(tmp_path)), st.Timeline(str(tmp_path))

    class Scheduler:
        def process_input_requests(self, recv_reqs): ...
        def run_batch(self, batch): ...
        def process_batch_result(self, batch, result): ...

    class TokenizerManager:
        async def _handle_batch_output(self, recv_obj): ...

    sched_tl.install(Scheduler)
    api_tl.install_api(TokenizerManager)
    assert _gc_watch_recorded == [(sched_tl, "scheduler"), (api_tl, "api")]
    assert _compile_watch_off == [sched_tl]  # Triton compiles: the scheduler's process only


def test_timeline_probe_wraps_the_methods_sglangs_scheduler_has(sglang_loaded, tmp_path: Path) -> None:
    """The probe wraps three Scheduler methods by name: SGLang 0.5.12.post1's Scheduler has them,
    and on a stand-in class the wrappers record recv / run / proc events with the batch's
    forward mode and a prefill's request ids, then write them to disk."""
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler import Scheduler as Real
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    for name in ("process_input_requests", "run_batch", "process_batch_result"):
        assert callable(getattr(Real, name)), name

    calls = []

    class Scheduler:
        def process_input_requests(self, recv_reqs):
            calls.append(("in", len(recv_reqs)))

        def run_batch(self, batch):
            calls.append(("run", batch.forward_mode.name))
            if batch.forward_mode.name == "DECODE":
                time.sleep(0.03)  # waits: wall time, no CPU time
            else:
                end = time.thread_time() + 0.03
                while time.thread_time() < end:  # host work: CPU time
                    pass
            return "result"

        def process_batch_result(self, batch, result):
            calls.append(("proc", result))

    tl = st.Timeline(str(tmp_path))
    sched = Scheduler()
    tl.on_run_batch(SimpleNamespace(f_locals={"self": object()}))  # not a Scheduler: nothing
    assert not tl.installed
    tl.on_run_batch(SimpleNamespace(f_locals={"self": sched}))
    assert tl.installed
    prefill = SimpleNamespace(forward_mode=ForwardMode.EXTEND, reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, reqs=prefill.reqs)
    sched.process_input_requests([SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])
    assert sched.run_batch(prefill) == "result"
    sched.run_batch(decode)
    sched.process_batch_result(prefill, "r")
    assert calls == [("in", 2), ("run", "EXTEND"), ("run", "DECODE"), ("proc", "r")]  # delegated
    # (The 30 ms prefill launch also gets the sampler's ``sample`` events.)
    own = [e for e in tl.events if e["kind"] != "sample"]
    assert [e["kind"] for e in own] == ["recv", "recv", "run", "run", "proc"]
    assert own[2]["rids"] == ["a", "b"] and "rids" not in own[3]
    assert [e["extend"] for e in own[2:]] == [True, False, True]  # SGLang's is_extend()
    busy, idle = own[2], own[3]
    assert busy["cpu_ms"] >= 30 and (busy["t1"] - busy["t"]) * 1000 >= busy["cpu_ms"] - 1
    assert idle["cpu_ms"] < 15 and (idle["t1"] - idle["t"]) * 1000 >= 30
    # Where each launch ended (the CPU, one this process may use) and how often the OS
    # preempted the thread in it (Linux tells both).
    assert all(e["core"] in os.sched_getaffinity(0) and e["preempted"] >= 0 for e in (busy, idle))
    tl.flush()
    events = st.load_events([str(p) for p in tmp_path.glob("timeline-*.jsonl")])
    split = st.ttft_breakdown(events)
    assert split["requests"] == 2 and split["total_ms"] >= split["between_ms"] >= split["next_launch_ms"] >= 0
    # No CUDA here (and the stand-in batches name no device): no GPU fields, no GPU figures.
    assert st.launch_stream(sched, SimpleNamespace(device="cuda")) is None
    assert not any(k in e or e["kind"] == "gpu" for e in events for k in GPU_FIELDS) and "prefill_gpu_ms" not in split


class StandInMode:
    """A forward mode by name, with SGLang's ``is_extend()`` for ``EXTEND`` (the probe reads
    only these two)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def is_extend(self) -> bool:
        return self.name == "EXTEND"


def test_timeline_probe_reads_the_cores_speed_around_each_prefill_launch(tmp_path: Path, monkeypatch) -> None:
    """With ``SMOKE_CORE_SPEED=1`` a prefill launch's ``run`` event carries the fixed Python
    work's time right before and right after it (``core_us``), outside the launch's own window
    and CPU time, the driver's and kernel launches' readings when there are any, and the garbage
    collections inside the launch only; a decode launch carries none. ``core_us`` grows with the
    work; ``driver_us`` and ``kernel_us`` make exactly their number of calls; off CUDA
    ``core_speed`` reads the core only."""
    from types import SimpleNamespace

    assert st.core_us(200_000) > st.core_us(10) > 0
    queried, launched = [], []
    assert st.driver_us(SimpleNamespace(query=lambda: queried.append(1)), calls=7) >= 0 and len(queried) == 7
    assert st.kernel_us(lambda: launched.append(1), calls=5) >= 0 and len(launched) == 5
    cpu_batch = SimpleNamespace(device="cpu")
    assert st.core_speed(SimpleNamespace(enable_overlap=False), cpu_batch)[1:] == (None, None)

    collections: list = []

    class Scheduler:
        def process_input_requests(self, recv_reqs): ...
        def run_batch(self, batch):
            for gen, seconds in collections:  # what the collector reports inside the launch
                hook("start", {"generation": gen})
                time.sleep(seconds)
                hook("stop", {"generation": gen, "collected": 0})
            time.sleep(0.005)
        def process_batch_result(self, batch, result): ...

    readings = iter([(10.0, None, 4.0), (30.0, None, 6.0)])
    monkeypatch.setattr(st, "core_speed", lambda sched, batch: next(readings))
    monkeypatch.setattr(st, "CORE_SPEED", True)
    tl = st.Timeline(str(tmp_path))
    tl.install(Scheduler)
    REAL_WATCH_GC(tl, "scheduler")
    hook = tl.gc_hook
    import gc

    gc.callbacks.remove(hook)  # only the stand-in collections above reach it
    sched = Scheduler()
    collections[:] = [(0, 0.001), (0, 0.001), (1, 0.003)]
    sched.run_batch(SimpleNamespace(forward_mode=StandInMode("EXTEND"), reqs=[SimpleNamespace(rid="a")]))
    sched.run_batch(SimpleNamespace(forward_mode=StandInMode("DECODE"), reqs=[SimpleNamespace(rid="a")]))
    prefill, decode = [e for e in tl.events if e["kind"] == "run"]
    assert prefill["core_us"] == [10.0, 30.0] and "driver_us" not in prefill  # no driver reading given
    assert prefill["kernel_us"] == [4.0, 6.0]
    assert prefill["gc"][:3] == [2, 1, 0] and 5.0 <= prefill["gc"][3] < 50.0  # two young, one middle, ms
    assert "core_us" not in decode and "gc" not in decode and tl.launch_gc is None
    monkeypatch.setattr(st, "CORE_SPEED", False)
    sched.run_batch(SimpleNamespace(forward_mode=StandInMode("EXTEND"), reqs=[SimpleNamespace(rid="b")]))
    assert not {"core_us", "gc"} & set([e for e in tl.events if e["kind"] == "run"][-1])  # off: not read


def _census_leaf(n: int) -> int:
    """A Python function a stand-in launch calls (the census counts it by name)."""
    return sum(abs(-i) for i in range(n))  # one C call (sum) and n more (abs) per call


def test_timeline_probe_counts_every_call_inside_the_census_prefill_launches(tmp_path: Path, monkeypatch) -> None:
    """With ``SMOKE_CALL_CENSUS=N`` the N one-request prefill launches after the first
    ``CENSUS_SKIP`` carry ``census``: every Python call (by file and qualified name) and C call
    (by qualified name) made inside the launch, the probe's own wrappers left out, and the
    launch's token count; the thread's profiler is off again once the launch returns. Other
    launches (earlier or later prefills, larger prefills, decodes) carry none."""
    class Scheduler:
        def process_input_requests(self, recv_reqs): ...
        def run_batch(self, batch):
            for _ in range(batch.calls):
                _census_leaf(3)
        def process_batch_result(self, batch, result): ...

    from types import SimpleNamespace

    monkeypatch.setattr(st, "CALL_CENSUS", 2)
    monkeypatch.setattr(st, "CORE_SPEED", False)
    monkeypatch.setattr(st.Timeline, "watch_gc", lambda self, where: None)
    tl = st.Timeline(str(tmp_path))
    tl.install(Scheduler)
    sched = Scheduler()

    def batch(mode: str, reqs: int, calls: int, tokens: int = 7):
        return SimpleNamespace(forward_mode=StandInMode(mode), reqs=[SimpleNamespace(rid=f"r{i}") for i in range(reqs)],
                               calls=calls, extend_num_tokens=tokens)

    for b in (batch("EXTEND", 1, 1), batch("EXTEND", 1, 1),  # the first CENSUS_SKIP: skipped
              batch("EXTEND", 2, 1), batch("DECODE", 1, 1),  # not one-request prefills
              batch("EXTEND", 1, 2, tokens=11), batch("EXTEND", 1, 3), batch("EXTEND", 1, 1)):
        sched.run_batch(b)
    assert sys.getprofile() is None
    runs = [e for e in tl.events if e["kind"] == "run"]
    counted = [e for e in runs if "census" in e]
    assert [runs.index(e) for e in counted] == [4, 5]  # the 3rd and 4th one-request prefills
    first, second = (e["census"] for e in counted)
    leaf = f"py {Path(__file__).name}:_census_leaf"
    runner = f"py {Path(__file__).name}:test_timeline_probe_counts_every_call_inside_the_census_prefill_launches.<locals>.Scheduler.run_batch"
    assert (first[leaf], second[leaf]) == (2, 3)
    assert first[runner] == 1 and first["c sum"] == 2 and first["c abs"] == 6
    assert not [k for k in first if "sched_timeline" in k]  # the probe's own wrappers left out
    assert counted[0]["tokens"] == 11 and counted[1]["tokens"] == 7
    assert st.census_key(None, "return", None) is None
    assert st.batch_tokens(SimpleNamespace(extend_num_tokens=None)) is None
    assert not [e for e in runs if "census_ms" in e]  # no times unless asked

    # SMOKE_CALL_CENSUS_TIMES: each C call's time from call to return, added up by name.
    monkeypatch.setattr(st, "CENSUS_TIMES", True)
    monkeypatch.setattr(st, "CENSUS_SKIP", 0)
    tl.prefills_seen = 0

    class Slow(Scheduler):
        def run_batch(self, batch):
            time.sleep(0.02)  # one C call of 20 ms
            _census_leaf(2)

    tl.install(Slow)
    Slow().run_batch(batch("EXTEND", 1, 0))
    assert sys.getprofile() is None
    timed = [e for e in tl.events if "census_ms" in e][-1]
    assert 20.0 <= timed["census_ms"]["c sleep"] < 200.0 and timed["census"]["c sleep"] == 1
    assert timed["census_ms"]["c abs"] < 5.0 and timed["census"]["c abs"] == 2


GPU_FIELDS = ("host_bound", "prev_prefill_done")


class FakeGpu:
    """One CUDA stream in ms: ``now`` is how far the GPU has got, ``tail`` where the work queued
    so far ends; beside it the probe's idle side stream (``"side"``), where an event completes at
    ``now``. Its events complete when the GPU passes them; nothing here can wait, and only the
    scheduler thread may touch them (``thread``)."""

    def __init__(self) -> None:
        import threading

        self.now = 0.0
        self.tail = 0.0
        self.thread = threading.get_ident()

    def queue(self, ms: float) -> None:
        self.tail = max(self.tail, self.now) + ms

    def event(self) -> "FakeEvent":
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu, self.t = gpu, None

    def _on_scheduler_thread(self) -> None:
        import threading

        assert threading.get_ident() == self.gpu.thread, "a CUDA call off the scheduler thread"

    def record(self, stream=None) -> None:
        self._on_scheduler_thread()
        if stream == "side":  # the probe's own stream: nothing queued there
            self.t = self.gpu.now
            return
        assert stream == "forward"  # the scheduler's forward stream, not the current one
        self.t = self.gpu.tail = max(self.gpu.tail, self.gpu.now)  # an idle stream reaches it at once

    def query(self) -> bool:
        self._on_scheduler_thread()
        return self.t is not None and self.t <= self.gpu.now

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.query() and end.query(), "CUDA refuses the time of an event still in flight"
        return end.t - self.t

    def synchronize(self) -> None:
        raise AssertionError("the probe must never wait on the GPU")


def test_timeline_probe_times_prefills_on_the_gpu_without_waiting(sglang_loaded, tmp_path: Path, monkeypatch) -> None:
    """On CUDA the probe records events on the forward stream around a prefill and the launch after
    it, and an end event after every launch. Before a later launch it turns those whose end event
    is done (never before, never by waiting) into ``gpu`` events: GPU ms, the stream's idle
    time before the launch and the GPU work queued ahead of it (a side-stream event at the host's
    launch start -> the start event); ``host_bound`` and ``prev_prefill_done`` are the GPU's
    progress when the host's launch ended. A prefill's result processing gets a ``ready`` event:
    its end event -> a side-stream event when the processing began."""
    import inspect
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler import Scheduler as Real
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang_futuremap_patch.backports import publish_stash

    # Where the forward and its result copy (copy_done) go: stock's overlap branch and the plugin's.
    for launch in (Real.run_batch, publish_stash.forward_spec_v2_overlap):
        src = inspect.getsource(launch)
        assert "with self.forward_stream_ctx:" in src and "batch_result.copy_done = " in src

    gpu = FakeGpu()
    monkeypatch.setattr(st, "_has_cuda", lambda: True)
    monkeypatch.setattr(st, "gpu_event", gpu.event)
    monkeypatch.setattr(st, "side_stream", lambda: "side")

    class Scheduler:
        enable_overlap, forward_stream = True, "forward"

        def process_input_requests(self, recv_reqs):
            pass

        def run_batch(self, batch):
            """The batch's GPU work is queued; the GPU runs on to ``batch.gpu_at`` meanwhile."""
            gpu.queue(batch.gpu_ms)
            copy_done = gpu.event()
            if batch.copied:
                copy_done.record("forward")
            else:  # torch's unrecorded event: no handle, and it reads as done
                copy_done = SimpleNamespace(cuda_event=0, query=lambda: True)
            gpu.now = batch.gpu_at
            return SimpleNamespace(copy_done=copy_done)

        def process_batch_result(self, batch, result):
            pass

    def batch(mode, gpu_ms: float, gpu_at: float, copied: bool = True):
        return SimpleNamespace(forward_mode=mode, reqs=[SimpleNamespace(rid="a")], device="cuda",
                               gpu_ms=gpu_ms, gpu_at=gpu_at, copied=copied)

    tl = st.Timeline(str(tmp_path))
    sched = Scheduler()
    tl.on_run_batch(SimpleNamespace(f_locals={"self": sched}))
    E, D = ForwardMode.EXTEND, ForwardMode.DECODE

    def timed() -> dict[float, dict]:
        return {e["t"]: e for e in tl.events if e["kind"] == "gpu"}

    def runs() -> list[dict]:
        return [e for e in tl.events if e["kind"] == "run"]

    sched.run_batch(batch(D, 5, 0))  # a steady decode: GPU 0-5 ms, an end event only
    gpu.now = 7  # the stream idles 5-7 ms
    first_prefill = batch(E, 20, 10)
    sched.run_batch(first_prefill)  # prefill: GPU 7-27; the GPU started it before the host was done
    sched.run_batch(batch(D, 6, 10))  # first decode: GPU 27-33, queued while the prefill still ran
    sched.process_batch_result(first_prefill, None)  # at 10: the host is there 17 ms before the tokens
    steady, prefill, first, _ = tl.events
    assert not any(k in steady for k in GPU_FIELDS)
    assert prefill["host_bound"] is True and "prev_prefill_done" not in prefill
    assert first["host_bound"] is False and first["prev_prefill_done"] is False  # hidden behind the prefill
    assert timed() == {} and len(tl.pending) == 2  # nothing done yet: nothing resolved
    gpu.now = 30
    sched.run_batch(batch(D, 2, 30))  # a steady decode (GPU 33-35) resolves the prefill, not the decode
    assert timed() == {prefill["t"]: {"kind": "gpu", "t": prefill["t"], "gpu_ms": 20, "gpu_gap_ms": 2,
                                      "gpu_queue_ms": 0}}
    ready = [e for e in tl.events if e["kind"] == "ready"]
    assert ready == [{"kind": "ready", "t": prefill["t"], "ready_wait_ms": -17}] and not tl.prefill_ends
    # The stream idles 35-42 before the next prefill, and from the end of its 10 ms (52) to the
    # host's end of launch (60): a host-bound launch's gpu_ms runs to its host end. The decode
    # after it ended its launch with the prefill's result on the host: exposed.
    gpu.now = 42
    second_prefill = batch(E, 10, 60)
    sched.run_batch(second_prefill)
    sched.run_batch(batch(D, 5, 62))
    prefill2, first2 = runs()[-2:]
    assert prefill2["host_bound"] is True and first2["prev_prefill_done"] is True
    # The first decode met the prefill's 17 ms still queued (GPU 10 -> 27), then ran 6.
    assert timed()[first["t"]] == {"kind": "gpu", "t": first["t"], "gpu_ms": 6, "gpu_gap_ms": 0, "gpu_queue_ms": 17}
    assert timed()[prefill2["t"]]["gpu_ms"] == 18 and timed()[prefill2["t"]]["gpu_gap_ms"] == 7
    gpu.now = 70  # the tokens (on the host at 60) wait 10 ms for the host
    sched.process_batch_result(second_prefill, None)
    # A result whose copy_done was never recorded gives no exposure.
    gpu.now = 65
    sched.run_batch(batch(E, 1, 70, copied=False))
    sched.run_batch(batch(D, 1, 75))
    sched.run_batch(batch(D, 1, 80))
    assert "prev_prefill_done" not in runs()[-2] and not tl.pending
    tl.flush()
    assert [e["ready_wait_ms"] for e in tl.events if e["kind"] == "ready"] == [-17, 10]
    split = st.ttft_breakdown(st.load_events([str(p) for p in tmp_path.glob("timeline-*.jsonl")]))
    assert split["gpu_prefills"] == 3 and split["prefill_gpu_ms"] == 18 and split["prefill_gpu_gap_ms"] == 2
    assert split["prefill_gpu_queue_ms"] == 0 and split["prefill_ready_wait_ms"] == -3.5  # median of -17, 10
    assert split["next_gpu_ms"] == 5 and split["prefill_host_bound"] == 1.0 and split["first_decode_exposed"] == 0.5
    # A failing GPU call turns GPU timing off and says so; the launches go on being recorded.
    monkeypatch.setattr(st, "gpu_event", lambda: 1 / 0)
    sched.run_batch(batch(E, 1, 80))
    sched.run_batch(batch(D, 1, 80))
    assert tl.gpu_off and not tl.pending and not tl.pending_ready and any("ZeroDivisionError" in e for e in tl.errors)
    assert tl.events[-2:] == runs()[-2:] and not any(k in e for e in runs()[-2:] for k in GPU_FIELDS)


def test_gpu_breakdown_gives_medians_and_shares_and_old_records_read_as_before(tmp_path: Path) -> None:
    """Three prefills (20, 10, 30 GPU ms; the third launched right after the second), two first
    decodes, one of them exposed; the same events without the GPU side summarise exactly as
    before."""
    ms = 1e-3
    old = [
        {"kind": "recv", "t": 0.0, "rid": "a"},
        {"kind": "run", "t": 1 * ms, "t1": 3 * ms, "mode": "EXTEND", "extend": True, "bs": 1, "rids": ["a"]},
        {"kind": "run", "t": 3 * ms, "t1": 9 * ms, "mode": "DECODE", "extend": False, "bs": 1},
        {"kind": "proc", "t": 9 * ms, "t1": 10 * ms, "mode": "EXTEND", "extend": True, "bs": 1},
        {"kind": "recv", "t": 11 * ms, "rid": "b"},
        {"kind": "run", "t": 12 * ms, "t1": 14 * ms, "mode": "EXTEND", "extend": True, "bs": 1, "rids": ["b"]},
        {"kind": "run", "t": 14 * ms, "t1": 16 * ms, "mode": "EXTEND", "extend": True, "bs": 1, "rids": ["c"]},
        {"kind": "run", "t": 16 * ms, "t1": 20 * ms, "mode": "DECODE", "extend": False, "bs": 1},
        {"kind": "proc", "t": 20 * ms, "t1": 21 * ms, "mode": "EXTEND", "extend": True, "bs": 1},
        {"kind": "proc", "t": 21 * ms, "t1": 22 * ms, "mode": "EXTEND", "extend": True, "bs": 1},
    ]
    # Per launch (by start): GPU ms, idle before it, queued behind earlier work, host_bound,
    # prev_prefill_done; per prefill, its tokens ready -> processed.
    side = {1 * ms: (20.0, 2.0, 0.5, True, None), 3 * ms: (6.0, 0.0, 14.0, False, False),
            12 * ms: (10.0, 7.0, 1.5, True, None), 14 * ms: (30.0, 0.0, 9.0, False, True),
            16 * ms: (4.0, 0.0, 25.0, False, True)}
    ready = {1 * ms: -2.0, 12 * ms: 4.0, 14 * ms: 6.0}
    events = []
    for e in old:
        if e["t"] in side and e["kind"] == "run":
            gpu_ms, gap, queue, host_bound, done = side[e["t"]]
            e = dict(e, host_bound=host_bound, **({} if done is None else {"prev_prefill_done": done}))
            events.append({"kind": "gpu", "t": e["t"], "gpu_ms": gpu_ms, "gpu_gap_ms": gap, "gpu_queue_ms": queue})
            if e["t"] in ready:
                events.append({"kind": "ready", "t": e["t"], "ready_wait_ms": ready[e["t"]]})
        events.append(e)
    events.sort(key=lambda e: e["t"])
    split = st.ttft_breakdown(events)
    assert {k: split[k] for k in ("gpu_prefills", "prefill_gpu_ms", "prefill_gpu_gap_ms", "next_gpu_ms")} == {
        "gpu_prefills": 3, "prefill_gpu_ms": 20.0, "prefill_gpu_gap_ms": 2.0, "next_gpu_ms": 6.0}  # next: 6, 30, 4
    assert split["prefill_gpu_queue_ms"] == 1.5 and split["prefill_ready_wait_ms"] == 4.0  # prefills' only
    assert split["prefill_host_bound"] == pytest.approx(2 / 3, abs=5e-4)
    assert split["first_decode_exposed"] == 0.5 and split["next_prefill_exposed"] == 1.0
    first_cell = st.ttft_breakdown(events, 0.0, 11 * ms)
    assert first_cell["gpu_prefills"] == 1 and first_cell["next_prefill_exposed"] is None
    before = st.ttft_breakdown(old)
    assert before == {k: v for k, v in split.items() if k in before}  # the GPU side moves no old figure
    assert set(split) - set(before) == set(st.gpu_breakdown(events)) and st.gpu_breakdown(old) == {}
    # The record's summary: a GPU table only where runs have the GPU side.
    summary = sb.summarize([{"variant": v, "cells": {"16": {"median_ttft_ms": 14.0, "sched": split}}}
                            for v in ("stock", "patched")])
    table = sb.format_sched_table(summary, sb.GPU_COLS)
    assert ("| 16 | 1.50 -> 1.50 | 20.00 -> 20.00 | 4.00 -> 4.00 | 2.00 -> 2.00 | 0.67 -> 0.67 | 6.00 -> 6.00 "
            "| 0.50 -> 0.50 | 1.00 -> 1.00 |") in table
    old_summary = sb.summarize([{"variant": v, "cells": {"16": {"median_ttft_ms": 14.0, "sched": before}}}
                                for v in ("stock", "patched")])
    assert sb.format_sched_table(old_summary, sb.GPU_COLS) == ""
    assert sb.format_sched_table(old_summary) == sb.format_sched_table(summary)
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": [
            {"variant": v, "boot": 0, "cells": {"16": {"median_ttft_ms": 14.0, "sched": split}}}
            for v in ("stock", "patched")]}))
    assert table in sb.merge([doc])


def test_ttft_breakdown_splits_the_schedulers_part_of_ttft() -> None:
    """Two requests arrive at t=0; their prefill is launched at 1 ms (1 ms to launch), the next
    decode's launch takes 5 ms, then the prefill's result is processed (0.5 ms): queue 1, launch
    1, between 5.x, total 7.5 ms. A request outside the window is left out."""
    ms = 1e-3
    events = [
        {"kind": "recv", "t": 0.0, "rid": "a"}, {"kind": "recv", "t": 0.0, "rid": "b"},
        {"kind": "run", "t": 1 * ms, "t1": 2 * ms, "mode": "EXTEND", "extend": True, "bs": 2, "rids": ["a", "b"]},
        {"kind": "run", "t": 2 * ms, "t1": 7 * ms, "mode": "DECODE", "extend": False, "bs": 2},
        {"kind": "proc", "t": 7 * ms, "t1": 7.5 * ms, "mode": "EXTEND", "extend": True, "bs": 2},
        {"kind": "recv", "t": 10.0, "rid": "late"},
        {"kind": "run", "t": 10.001, "t1": 10.002, "mode": "EXTEND", "extend": True, "bs": 1, "rids": ["late"]},
        {"kind": "proc", "t": 10.003, "t1": 10.004, "mode": "EXTEND", "extend": True, "bs": 1},
    ]
    split = st.ttft_breakdown(events, 0.0, 1.0)
    assert split["requests"] == 2
    assert split["queue_ms"] == pytest.approx(1.0) and split["launch_ms"] == pytest.approx(1.0)
    assert split["between_ms"] == pytest.approx(5.0) and split["next_launch_ms"] == pytest.approx(5.0)
    assert split["process_ms"] == pytest.approx(0.5) and split["total_ms"] == pytest.approx(7.5)
    assert split["decode_launch_ms"] == pytest.approx(5.0)
    assert split["prefill_bs_mean"] == 2.0  # both shared one prefill
    whole = st.ttft_breakdown(events)
    assert whole["requests"] == 3 and whole["prefill_bs_mean"] == pytest.approx(5 / 3, abs=0.005)  # 2, 2, 1
    # A chunked prompt: "late" in a second prefill of 3 too; its shared prefill is its first one.
    chunked = events + [
        {"kind": "recv", "t": 10.005, "rid": "x"}, {"kind": "recv", "t": 10.005, "rid": "y"},
        {"kind": "run", "t": 10.006, "t1": 10.007, "mode": "EXTEND", "extend": True, "bs": 3, "rids": ["late", "x", "y"]},
        {"kind": "proc", "t": 10.008, "t1": 10.009, "mode": "EXTEND", "extend": True, "bs": 3}]
    assert st.ttft_breakdown(chunked)["prefill_bs_mean"] == pytest.approx((2 + 2 + 1 + 3 + 3) / 5, abs=0.005)


def test_timeline_probe_records_the_api_servers_timestamps(sglang_loaded, tmp_path: Path) -> None:
    """In the API server the probe wraps TokenizerManager._handle_batch_output (SGLang's coroutine):
    a request's first output gives one ``api`` event with SGLang's own APIServerReqTimeStats
    (received, dispatched, first output) on the time.time() clock; a later output of the same
    request, a request without state and a non-TokenizerManager owner give none."""
    import asyncio
    import inspect
    import time
    from types import SimpleNamespace

    from sglang.srt.managers.tokenizer_manager import TokenizerManager as Real
    from sglang.srt.observability.req_time_stats import APIServerReqTimeStats

    assert inspect.iscoroutinefunction(Real._handle_batch_output)
    handled = []

    class TokenizerManager:
        def __init__(self) -> None:
            self.rid_to_state = {}

        async def _handle_batch_output(self, recv_obj):
            for rid in recv_obj.rids:  # SGLang's single write point of first_token_time
                state = self.rid_to_state.get(rid)
                if state is not None and not state.time_stats.first_token_time:
                    state.time_stats.set_first_token_time()
            handled.append(list(recv_obj.rids))
            return "done"

    tl = st.Timeline(str(tmp_path))
    tm = TokenizerManager()
    tl.on_api_output(SimpleNamespace(f_locals={"self": object()}))
    assert not tl.installed
    tl.on_api_output(SimpleNamespace(f_locals={"self": tm}))
    assert tl.installed
    stats = APIServerReqTimeStats()
    stats.set_created_time()
    stats.set_api_server_dispatch_time()
    tm.rid_to_state["a"] = SimpleNamespace(time_stats=stats)
    before = time.time()
    assert asyncio.run(tm._handle_batch_output(SimpleNamespace(rids=["a", "gone"]))) == "done"
    asyncio.run(tm._handle_batch_output(SimpleNamespace(rids=["a"])))
    after = time.time()
    assert handled == [["a", "gone"], ["a"]]
    assert [e["kind"] for e in tl.events] == ["api"]
    ev = tl.events[0]
    assert ev["rid"] == "a" and ev["received"] <= ev["dispatch"] <= ev["first"]
    assert before - 1.0 < ev["first"] <= after + 1e-3  # moved to the wall clock
    assert tl.lag_started  # the loop-lag sampler was scheduled on the running loop


def test_loop_lag_sampler_reports_a_blocked_event_loop() -> None:
    """The sampler's windows: a loop blocked for 30 ms shows up as lateness of about that."""
    import asyncio
    import time

    tl = st.Timeline("/nonexistent")

    async def main() -> None:
        task = asyncio.ensure_future(tl._loop_lag())
        await asyncio.sleep(0.01)
        time.sleep(0.03)  # the loop is blocked
        await asyncio.sleep(st.LAG_WINDOW_S + 0.05)
        task.cancel()

    asyncio.run(main())
    lag = [e for e in tl.events if e["kind"] == "lag"]
    assert lag and lag[0]["n"] > 1 and lag[0]["max"] >= 0.02 and lag[0]["sum"] >= 0.02
    split = st.ttft_breakdown(tl.events)
    # the breakdown rounds to 0.001 ms
    assert split["api_loop_lag_ms"] == pytest.approx(lag[0]["sum"] / lag[0]["n"] * 1e3, abs=5e-4)


def test_ttft_breakdown_splits_the_part_outside_the_scheduler() -> None:
    """Request a: received by the API server at 0, sent at 1 ms, received by the scheduler at 3 ms,
    first tokens sent at 10.5 ms, first output in the API server at 12 ms."""
    ms = 1e-3
    events = [
        {"kind": "api", "t": 0.0, "rid": "a", "received": 0.0, "dispatch": 1 * ms, "first": 12 * ms},
        {"kind": "recv", "t": 3 * ms, "rid": "a"},
        {"kind": "run", "t": 4 * ms, "t1": 5 * ms, "mode": "EXTEND", "extend": True, "bs": 1, "rids": ["a"]},
        {"kind": "run", "t": 5 * ms, "t1": 10 * ms, "mode": "DECODE", "extend": False, "bs": 1},
        {"kind": "proc", "t": 10 * ms, "t1": 10.5 * ms, "mode": "EXTEND", "extend": True, "bs": 1},
    ]
    split = st.ttft_breakdown(events)
    assert split["total_ms"] == pytest.approx(7.5)
    assert split["api_before_dispatch_ms"] == pytest.approx(1.0)
    assert split["dispatch_to_sched_ms"] == pytest.approx(2.0)
    assert split["sched_to_api_ms"] == pytest.approx(1.5)
    assert split["api_total_ms"] == pytest.approx(12.0)
    assert st.ttft_breakdown(events[1:])["api_total_ms"] is None  # no API-server events
    summary = sb.summarize([{"variant": v, "cells": {"4": {"median_ttft_ms": 14.0, "sched": split}}}
                            for v in ("stock", "patched")])
    table = sb.format_sched_table(summary, sb.API_COLS)
    assert "| 4 | 14.00 -> 14.00 | 12.00 -> 12.00 | 1.00 -> 1.00 | 2.00 -> 2.00 | 7.50 -> 7.50 | 1.50 -> 1.50 | - |" in table
    # A record with the scheduler's split but without the API server's events: no such table.
    old = sb.summarize([{"variant": v, "cells": {"4": {"median_ttft_ms": 14.0, "sched": st.ttft_breakdown(events[1:])}}}
                        for v in ("stock", "patched")])
    assert sb.format_sched_table(old) and sb.format_sched_table(old, sb.API_COLS) == ""


def test_summary_carries_the_schedulers_split_per_cell() -> None:
    def run(variant: str, total: float) -> dict:
        return {"variant": variant, "cells": {"1": {"median_ttft_ms": total, "sched": {"total_ms": total, "between_ms": 1.0}}}}

    summary = sb.summarize([run("stock", 10.0), run("patched", 12.0)])
    assert summary["variants"]["patched"][1]["sched_total_ms"]["median"] == 12.0
    table = sb.format_sched_table(summary)
    assert "| 1 | 10.00 -> 12.00 |" in table
    assert sb.format_sched_table(sb.summarize([{"variant": "stock", "cells": {"1": {"median_ttft_ms": 1.0}}},
                                               {"variant": "patched", "cells": {"1": {"median_ttft_ms": 1.0}}}])) == ""
    env = {"PYTHONPATH": "x"}
    assert sb.server_env(env, None) is env
    probe = sb.server_env(env, Path("/tmp/tl"))
    assert probe["SMOKE_SCHED_TIMELINE"] == "1" and probe["PYTHONPATH"].startswith(str(child_env.PROBE_DIR))


def test_timeline_tables_compare_stock_or_patched_with_each_variant() -> None:
    def run(variant: str, total: float) -> dict:
        return {"variant": variant, "cells": {"1": {"median_ttft_ms": total, "sched": {"total_ms": total}}}}

    both = sb.summarize([run("stock", 10.0), run("patched", 12.0), run("patched-prefill-first", 11.0)])
    assert sb.sched_pairs(both) == [("stock", "patched"), ("stock", "patched-prefill-first")]
    assert "| 1 | 10.00 -> 11.00 |" in sb.format_sched_table(both, sb.SCHED_COLS, ("stock", "patched-prefill-first"))
    # A record of the plugin against one of its switches (no stock): patched is the base.
    switch = sb.summarize([run("patched", 12.0), run("patched-prefill-first", 11.0)])
    assert sb.sched_pairs(switch) == [("patched", "patched-prefill-first")]
    assert "| 1 | 12.00 -> 11.00 |" in sb.format_sched_table(switch, sb.SCHED_COLS, ("patched", "patched-prefill-first"))
    assert sb.format_sched_table(switch) == ""  # the default pair needs stock
    assert sb.sched_pairs(sb.summarize([run("stock", 10.0)])) == []


def test_ttft_breakdown_names_where_the_launch_after_a_prefill_waited() -> None:
    ms = 1e-3
    events = [
        {"kind": "recv", "t": 0.0, "rid": "a"},
        {"kind": "run", "t": 1 * ms, "t1": 2 * ms, "mode": "EXTEND", "extend": True, "bs": 1, "rids": ["a"]},
        {"kind": "run", "t": 2 * ms, "t1": 9 * ms, "mode": "DECODE", "extend": False, "bs": 1},
        {"kind": "sync", "t": 3 * ms, "t1": 7 * ms, "what": "synchronize", "where": "w.py:1 f"},
        {"kind": "sync", "t": 9.5 * ms, "t1": 9.9 * ms, "what": "item", "where": "x.py:2 g"},
        {"kind": "sync", "t": 1.2 * ms, "t1": 1.8 * ms, "what": "cpu", "where": "y.py:3 h"},
        {"kind": "sample", "t": 1.5 * ms, "dt": 1 * ms, "phase": "prefill", "stack": ["a.py:1 f", "b.py:2 g"]},
        {"kind": "sample", "t": 4.0 * ms, "dt": 1 * ms, "phase": "next", "stack": ["c.py:5 k"]},
        {"kind": "sample", "t": 5.0 * ms, "dt": 2 * ms, "phase": "next", "stack": ["c.py:5 k"]},
        {"kind": "proc", "t": 9 * ms, "t1": 10 * ms, "mode": "EXTEND", "extend": True, "bs": 1},
    ]
    split = st.ttft_breakdown(events)
    assert split["next_launch_waits_ms"] == {"synchronize @ w.py:1 f": pytest.approx(4.0)}  # the one inside the decode's launch
    assert split["launch_waits_ms"] == {"cpu @ y.py:3 h": pytest.approx(0.6)}  # inside the prefill's own
    # Stack samples: host time per innermost frames, per prefill.
    assert split["launch_samples_ms"] == {"a.py:1 f < b.py:2 g": pytest.approx(1.0)}
    assert split["next_launch_samples_ms"] == {"c.py:5 k": pytest.approx(3.0)}


def test_bench_client_runs_bench_servings_own_command_line(monkeypatch, capsys) -> None:
    """The client runs the real module as ``python -m`` would: its parser rejects a bad flag
    (rc 2 from argparse) and answers --help (rc 0), printing to stderr, never to the reply
    stream; a bad request line gets its own answer."""
    import io

    import serve_bench_client as sc

    monkeypatch.syspath_prepend(str(child_env.DATASETS_STAND_IN))
    out = io.StringIO()
    lines = io.StringIO('["--no-such-flag"]\n\n["--help"]\n{"not": "a list"}\n')
    assert sc.serve(lines, out) == 2
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["rc"] for r in replies] == [2, 0, 2]
    assert "bad request line" in replies[2]["error"]
    err = capsys.readouterr().err
    assert "--max-concurrency" in err and "--no-such-flag" in err  # help text and argparse's error
    assert sys.argv[0] != sc.MODULE  # restored

    calls = []

    def fake_run(name, run_name, alter_sys):
        calls.append((name, run_name, list(sys.argv)))
        print("results table")  # bench_serving prints its table to stdout
        raise RuntimeError("server went away")

    out = io.StringIO()
    assert sc.serve(io.StringIO('["--port", "1"]\n'), out, run=fake_run) == 1
    assert calls == [("sglang.bench_serving", "__main__", ["sglang.bench_serving", "--port", "1"])]
    assert json.loads(out.getvalue()) == {"rc": 1, "error": "RuntimeError: server went away"}
    assert "results table" in capsys.readouterr().err


def test_bench_client_samples_its_own_event_loop_when_asked(monkeypatch) -> None:
    """With SERVE_BENCH_CLIENT_LAG=1 every ``asyncio.run`` of a call gets a sampler beside it and
    the reply says how late the client's loop woke: a coroutine that blocks its loop for 50 ms
    shows as one wake-up at least 40 ms late. Without the switch the reply is as before, and
    ``asyncio.run`` is the real one again after each call."""
    import asyncio
    import io
    import time as _time

    import serve_bench_client as sc

    real_run = asyncio.run

    def fake_run(name, run_name, alter_sys):
        async def bench():
            await asyncio.sleep(0.02)
            end = _time.perf_counter() + 0.05
            while _time.perf_counter() < end:  # the loop is busy: a late wake-up
                pass
            await asyncio.sleep(0.02)
            _time.sleep(0.3)  # bench_serving's own pause between warm-up and measurement: not lag
            await asyncio.sleep(0.02)
            return "done"

        assert asyncio.run(bench()) == "done"

    monkeypatch.setenv("SERVE_BENCH_CLIENT_LAG", "1")
    out = io.StringIO()
    assert sc.serve(io.StringIO('["--port", "1"]\n'), out, run=fake_run) == 0
    reply = json.loads(out.getvalue())
    lag = reply["client_lag"]
    assert reply["rc"] == 0 and lag["samples"] >= 3 and lag["max_ms"] >= 40 and lag["late_10ms"] >= 1
    assert lag["max_ms"] < 200 and 295 <= lag["slept_ms"] < 400
    assert _time.sleep.__module__ == "time"  # put back
    assert asyncio.run is real_run
    monkeypatch.delenv("SERVE_BENCH_CLIENT_LAG")
    out = io.StringIO()
    assert sc.serve(io.StringIO('["--port", "1"]\n'), out, run=fake_run) == 0
    assert json.loads(out.getvalue()) == {"rc": 0}


def test_bench_client_process_answers_each_call_and_times_out(tmp_path: Path) -> None:
    echo = ("import sys, json, time\n"
            "for line in sys.stdin:\n"
            "    a = json.loads(line)\n"
            "    if a == ['slow']: time.sleep(30)\n"
            "    print(json.dumps({'rc': 0, 'argv': a}), flush=True)\n")
    client = sb.BenchClient(dict(os.environ), tmp_path / "logs" / "c.log", [sys.executable, "-c", echo])
    try:
        assert client.call(["--port", "1"], 20) == {"rc": 0, "argv": ["--port", "1"]}
        assert client.call(["x"], 20)["argv"] == ["x"]
        with pytest.raises(TimeoutError):
            client.call(["slow"], 0.5)
    finally:
        client.close()
    assert client.proc.poll() is not None
    dead = sb.BenchClient(dict(os.environ), tmp_path / "logs" / "d.log", [sys.executable, "-c", "pass"])
    dead.proc.wait()
    assert dead.call(["--port", "1"], 5)["rc"] == 1
    dead.close()


def test_no_war_variant_is_the_plugin_with_back_port_17_off() -> None:
    from sglang_futuremap_patch.backports import war_barrier

    mode, env = sb.MODES["patched-no-war"]
    assert mode == "strict" and env == {war_barrier.WAR_BARRIER_ENV: "0"}


def test_early_intake_and_host_prefix_sum_variants_switch_back_ports_19_and_20() -> None:
    from sglang_futuremap_patch.backports import early_intake, flashinfer_host_prefix_sum as fihost

    for variant, env_name, value in (("patched-early-intake", early_intake.EARLY_INTAKE_ENV, "1"),
                                     ("patched-no-early-intake", early_intake.EARLY_INTAKE_ENV, "0"),
                                     ("patched-fi-host-sum", fihost.HOST_PREFIX_SUM_ENV, "1"),
                                     ("patched-no-fi-host-sum", fihost.HOST_PREFIX_SUM_ENV, "0")):
        mode, env = sb.MODES[variant]
        assert mode == "strict" and env == {env_name: value}, variant
        assert ("back-port 19" if "intake" in variant else "back-port 20") in sb.MODE_NOTES[variant]
    # What the back-port reads: 0 turns it off, unset leaves it on (back-port 19's own tests check
    # its switch on the scheduler).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(fihost.HOST_PREFIX_SUM_ENV, "0")
        assert fihost.flashinfer_host_prefix_sum_on() is False
        mp.delenv(fihost.HOST_PREFIX_SUM_ENV)
        assert fihost.flashinfer_host_prefix_sum_on() is True


def test_mirror_relay_variant_switches_back_port_22_on() -> None:
    from sglang_futuremap_patch.backports import mirror_relay_lens

    mode, env = sb.MODES["patched-mirror-relay"]
    assert mode == "strict" and env == {mirror_relay_lens.MIRROR_RELAY_ENV: "1"}
    assert "back-port 22" in sb.MODE_NOTES["patched-mirror-relay"]
    from sglang_futuremap_patch.backports import prefill_result_first

    mode, env = sb.MODES["patched-relay-prefill-first"]
    assert mode == "strict" and env == {mirror_relay_lens.MIRROR_RELAY_ENV: "1",
                                        prefill_result_first.PREFILL_RESULT_FIRST_ENV: "1"}
    assert "back-ports 22 and 16" in sb.MODE_NOTES["patched-relay-prefill-first"]


def test_tree_switches_off_variant_gives_a_tree_the_mirror_again(spec_future_map, probe,
                                                                  monkeypatch) -> None:
    """Both tree defaults off: a tree's decode after a prefill copies the mirror, as before."""
    from conftest import relay_forward
    from sglang.srt.server_args import get_global_server_args

    from sglang_futuremap_patch.backports import mirror_relay_lens, prefill_result_first

    mode, env = sb.MODES["patched-tree-switches-off"]
    assert mode == "strict" and env == {mirror_relay_lens.MIRROR_RELAY_ENV: "0",
                                        prefill_result_first.PREFILL_RESULT_FIRST_ENV: "0"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    m = spec_future_map(needs_cpu_seq_lens=True)
    get_global_server_args().speculative_eagle_topk = 4
    relay_forward(m, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    assert relay_forward(m, probe, "DECODE", [1, 2], [8, 9]) == ([5, 7], True)


def test_serial_prefills_variant_is_sglangs_own_switch(monkeypatch) -> None:
    from sglang.srt.environ import envs

    mode, env = sb.MODES["patched-serial-prefills"]
    assert mode == "strict" and list(env) == ["SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP"]
    monkeypatch.setenv(*next(iter(env.items())))
    assert envs.SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP.get() is True


def test_war_after_launch_variant_is_the_plugin_with_back_port_27_on() -> None:
    """The opt-in back-port's serving variant: the plugin as it ships plus its one switch, and
    its own line in the summary."""
    from sglang_futuremap_patch.backports import war_barrier_after_launch

    mode, env = sb.MODES["patched-war-after-launch"]
    assert mode == "strict" and env == {war_barrier_after_launch.WAR_BARRIER_AFTER_LAUNCH_ENV: "1"}
    assert "patched-war-after-launch" in sb.MODE_NOTES and "patched-war-after-launch" not in sb.RETIRED_MODES
    runs = [_run("stock", 0, 100, 10, 1000), _run("patched-war-after-launch", 0, 90, 8, 1250)]
    assert "patched-war-after-launch" in sb.summarize(runs)["variants"]


@pytest.mark.parametrize("variant, setting", [("patched-skip-idle", "1"), ("patched-poll-barrier", "0")])
def test_idle_poll_barrier_variants_set_back_port_17s_switch(variant, setting) -> None:
    """The idle-poll skip (on by default since 2026-11-29) named explicitly, and the way back to a
    barrier at every poll: the plugin as it ships plus that one switch (back-port 17's own name
    for it), each with its own line in the summary."""
    from sglang_futuremap_patch.backports import war_barrier

    mode, env = sb.MODES[variant]
    assert mode == "strict" and env == {war_barrier.WAR_BARRIER_SKIP_IDLE_ENV: setting}
    assert variant in sb.MODE_NOTES and variant not in sb.RETIRED_MODES
    runs = [_run("stock", 0, 100, 10, 1000), _run(variant, 0, 90, 8, 1250)]
    assert variant in sb.summarize(runs)["variants"]


# ----------------------------------------------------------------------------- DeepSeek MTP (MLA)


def test_deepseek_server_is_launched_as_the_e2e_mla_cases_and_sglang_takes_it(sglang_loaded, tmp_path: Path,
                                                                               monkeypatch) -> None:
    """``--model deepseek``: the factory's DeepSeek checkpoint with its own tokenizer and seeded
    weights, ``NEXTN`` and no draft path, no backend named: the e2e ``mla`` cases' launch, which
    SGLang turns into EAGLE with the target's NextN layer, FA3 + PCG on Hopper."""
    import dataclasses

    import gpu_e2e as e2e
    import sglang.srt.server_args as sa_mod
    from sglang.srt.server_args import ServerArgs
    from sglang_cpu_support import server_args

    target, draft = sb.make_models(tmp_path / "models", "deepseek")
    assert draft is None and Path(target).name == "deepseek"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in Path(target).iterdir()}
    argv = sb.server_argv(target, draft, "default", 31200, served="deepseek")
    assert "--speculative-draft-model-path" not in argv and "--load-format" not in argv
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv[3:])
    mla = next(c for c in e2e.mla_cases() if c.name == "mla-default-graph")
    e2e_ns = parser.parse_args(e2e.server_argv(e2e.engine_kwargs(mla, Path(target).parent), 1))
    keys = ("model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
            "speculative_eagle_topk", "speculative_num_draft_tokens", "attention_backend",
            "disable_piecewise_cuda_graph", "load_format")
    assert {k: getattr(ns, k) for k in keys} == {k: getattr(e2e_ns, k) for k in keys}
    assert (ns.speculative_algorithm, ns.speculative_draft_model_path, ns.load_format) == ("NEXTN", None, "auto")
    monkeypatch.setattr(sa_mod, "is_hopper_with_cuda_12_3", lambda: True)
    fields = {f.name for f in dataclasses.fields(ServerArgs)} - {"device"}
    sa = server_args({k: v for k, v in vars(ns).items() if k in fields}, device="cuda")
    assert sa.speculative_algorithm == "EAGLE" and sa.speculative_draft_model_path == target
    assert (sa.attention_backend, sa.disable_piecewise_cuda_graph) == ("fa3", False) and sa.use_mla_backend()
    # the 8B rows keep their launch
    eight = parser.parse_args(sb.server_argv("/m/t", "/m/d", "default", 1)[3:])
    assert (eight.load_format, eight.speculative_algorithm, eight.speculative_draft_model_path) == (
        "dummy", "STANDALONE", "/m/d")


def test_mirror_variant_is_the_plugin_with_back_port_18_off_and_only_it_gets_the_switch() -> None:
    from sglang_futuremap_patch.backports import fa3_mla_device_metadata

    assert sb.MODES["patched-mla-mirror"] == ("strict", {fa3_mla_device_metadata.FA3_MLA_ENV: "0"})
    shell = {"SGLANG_FUTUREMAP_FA3_MLA": "0", "SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST": "1", "PYTHONPATH": "/x"}
    patched = sb.variant_env("patched", shell)
    assert "SGLANG_FUTUREMAP_FA3_MLA" not in patched and "SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST" not in patched
    assert patched["SGLANG_FUTUREMAP_PATCH"] == "strict"
    assert patched["PYTHONPATH"].split(os.pathsep) == [str(child_env.DATASETS_STAND_IN), "/x"]
    fa3_mla = sb.variant_env("patched-mla-mirror", shell)
    assert fa3_mla["SGLANG_FUTUREMAP_FA3_MLA"] == "0" and "SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST" not in fa3_mla
    assert sb.variant_env("stock", shell)["SGLANG_FUTUREMAP_PATCH"] == "off"


def _no_processes(monkeypatch) -> list[tuple[list[str], dict[str, str]]]:
    """``run_server`` without processes: every server and bench client it starts has already
    exited; returns the (argv, environment) of each start, in order."""
    launched: list[tuple[list[str], dict[str, str]]] = []

    class Exited:
        """A process that has already exited (no server, no client)."""

        def __init__(self, argv, env=None, **kw):
            launched.append((list(argv), dict(env or {})))
            self.pid, self.returncode = -1, 1

        def poll(self) -> int:
            return 1

        def wait(self, timeout=None) -> int:
            return 1

    monkeypatch.setattr(sb.subprocess, "Popen", Exited)
    monkeypatch.setattr(sb, "stop_group", lambda proc: None)
    return launched


def test_run_server_starts_the_model_it_is_told_with_its_variants_environment(tmp_path: Path, monkeypatch) -> None:
    import time

    launched = _no_processes(monkeypatch)
    monkeypatch.setenv("SGLANG_FUTUREMAP_FA3_MLA", "0")  # the caller's shell holds it
    args = argparse.Namespace(out=tmp_path, timeline=False, upstream_site="none", backend="default", server_arg=[],
                              concurrency=[1], spec="chain", model="deepseek")
    for variant in ("patched", "patched-mla-mirror"):
        run = sb.run_server(variant, 0, "/m/deepseek", None, args, deadline=time.monotonic() + 5, port=1)
        assert run["error"] == "server exited with 1 before it was ready"
    (server_p, env_p), _client, (server_m, env_m), _client2 = launched
    for argv in (server_p, server_m):
        assert argv[argv.index("--speculative-algorithm") + 1] == "NEXTN" and "--load-format" not in argv
        assert "--speculative-draft-model-path" not in argv and argv[argv.index("--model-path") + 1] == "/m/deepseek"
    assert "SGLANG_FUTUREMAP_FA3_MLA" not in env_p and env_m["SGLANG_FUTUREMAP_FA3_MLA"] == "0"


def test_freeze_gc_posts_sglangs_endpoint_once_the_server_is_ready(tmp_path: Path, monkeypatch) -> None:
    """``--freeze-gc``: a ready server gets one POST /freeze_gc before its first cell (the
    record keeps the answer and says so); without it none; an endpoint that answers with an
    error or not at all is recorded, not raised."""
    import http.server
    import threading
    import time

    asked: list[tuple[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            asked.append(("POST", self.path))
            self.send_response(200 if self.path == "/freeze_gc" else 404)
            self.end_headers()

        def log_message(self, *a):  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert sb.freeze_gc(port) == "ok" and asked == [("POST", "/freeze_gc")]
    finally:
        server.shutdown()
        server.server_close()
    assert sb.freeze_gc(port).startswith("failed: ")  # nobody listens there now
    # In run_server: after the server is ready (here: at once) and before the first cell.
    _no_processes(monkeypatch)
    monkeypatch.setattr(sb.launch, "wait_until_ready", lambda *a, **k: None)
    called: list[int] = []
    monkeypatch.setattr(sb, "freeze_gc", lambda p: called.append(p) or "ok")
    for freeze in (True, False):
        args = argparse.Namespace(out=tmp_path, timeline=False, upstream_site="none", backend="default", server_arg=[],
                                  concurrency=[], spec="chain", model="8b", freeze_gc=freeze)
        run = sb.run_server("stock", 0, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=7)
        assert run["error"] is None and run.get("freeze_gc") == ("ok" if freeze else None)
    assert called == [7]
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": [], "freeze_gc": True}}, "runs": [
            {"variant": v, "boot": 0, "cells": {"16": {"median_ttft_ms": 14.0}}} for v in ("stock", "patched")]}))
    assert "SGLang's /freeze_gc called once each server was ready" in sb.merge([doc])


def test_timeline_runs_have_the_client_sample_its_loop_and_cells_keep_it(tmp_path: Path, monkeypatch) -> None:
    """``--timeline``: the bench client gets SERVE_BENCH_CLIENT_LAG=1 (without it, not), and the
    lag its reply carries lands in the cell and in the summary's outside-the-scheduler table."""
    import time

    launched = _no_processes(monkeypatch)
    monkeypatch.setattr(sb.launch, "wait_until_ready", lambda *a, **k: None)
    monkeypatch.setattr(sb, "add_sched_breakdown", lambda run, d, w: None)
    monkeypatch.setattr(sb.time, "sleep", lambda s: None)

    def call(self, argv, timeout):
        out = Path(argv[argv.index("--output-file") + 1])
        out.write_text(json.dumps({"median_ttft_ms": 10.0, "median_tpot_ms": 2.0, "output_throughput": 100.0,
                                   "completed": 4}) + "\n")
        return {"rc": 0, "client_lag": {"samples": 9, "mean_ms": 0.25, "max_ms": 12.5, "late_10ms": 1}}

    monkeypatch.setattr(sb.BenchClient, "call", call)
    runs = []
    for timeline in (True, False):
        args = argparse.Namespace(out=tmp_path, timeline=timeline, upstream_site="none", backend="default",
                                  server_arg=[], concurrency=[16], spec="chain", model="8b", rounds=4, min_prompts=12,
                                  dataset="random-ids", input_len=256, output_len=256, range_ratio=1.0,
                                  warmup="wave", seed=1)
        runs.append(sb.run_server("stock", 0, "/m/t", "/m/d", args, deadline=time.monotonic() + 60, port=7))
    (_, _), (_, client_env), (_, _), (_, client_env_off) = launched
    assert client_env["SERVE_BENCH_CLIENT_LAG"] == "1" and "SERVE_BENCH_CLIENT_LAG" not in client_env_off
    assert runs[0]["error"] is None, runs[0]["error"]
    cell = runs[0]["cells"][16]
    assert cell["client_loop_lag_mean_ms"] == 0.25 and cell["client_loop_lag_max_ms"] == 12.5
    summary = sb.summarize([dict(runs[0], variant=v, cells={16: dict(cell, sched={"total_ms": 5.0, "api_total_ms": 9.0})})
                            for v in ("stock", "patched")])
    table = sb.format_sched_table(summary, sb.API_COLS)
    assert "client loop lag (max)" in table and "12.50 -> 12.50" in table


def _model_record(path: Path, runs: list, model_name: str | None) -> Path:
    config = {"backend": "default", "server_args": [], "model": "x; its own NextN layer as draft, 3/1/4"}
    if model_name:
        config["model_name"] = model_name
    path.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": config},
                                "runs": runs}))
    return path


def test_deepseek_record_names_its_model_and_gets_the_mirror_table(tmp_path: Path, capsys) -> None:
    runs = [_run("stock", 0, 100, 10, 1000), _run("patched", 0, 95, 9, 1100), _run("patched-mla-mirror", 0, 90, 8, 1250)]
    doc = _model_record(tmp_path / "ds.json", runs, "deepseek")
    text = sb.merge([doc])
    assert text.splitlines()[0].endswith(", model deepseek, its own NextN layer as draft, 3/1/4")
    assert "Stock -> patched-mla-mirror (the plugin with back-port 18 off" in text
    table = text.split("Stock -> patched-mla-mirror")[1]
    assert "| 32 | 100.0 -> 90.0 (x1.111) | 200.0 -> 180.0 (x1.111) | 10.0 -> 8.0 (x1.250) |" in table
    # records of two models never make one table (an older record ran the 8B model)
    old = _model_record(tmp_path / "old.json", runs[:2], None)
    assert sb.main(["--merge", str(doc), str(old)]) == 2
    assert "different models (8b, deepseek)" in capsys.readouterr().err


def test_main_builds_and_records_the_model_it_is_told(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def fake_run_server(variant, boot, target, draft, args, deadline, port, gpu=None):
        calls.append((variant, target, draft, args.model))
        assert gpu is None  # one GPU: no pinning
        return _run(variant, boot, 100, 10 if variant == "stock" else 8, 1000)

    monkeypatch.setattr(sb, "run_server", fake_run_server)
    out = tmp_path / "out"
    assert sb.main(["--out", str(out), "--model", "deepseek", "--variants", "stock,patched-mla-mirror", "--boots", "1",
                    "--concurrency", "32"]) == 0
    target = str(out / "models" / "deepseek")
    assert calls == [("stock", target, None, "deepseek"), ("patched-mla-mirror", target, None, "deepseek")]
    config = json.loads((out / "serve-bench.json").read_text())["environment"]["config"]
    assert config["model_name"] == "deepseek" and config["model"].startswith("tiny DeepSeek-V3 (MLA")
    assert config["range_ratio"] == 1.0  # fixed lengths unless --range-ratio says otherwise
    md = (out / "serve-bench.md").read_text()
    assert ", model deepseek, " in md and "Stock -> patched-mla-mirror" in md


def test_two_gpus_run_each_boots_pair_at_once_and_alternate_the_cards(tmp_path: Path, monkeypatch) -> None:
    # placement: one wave per boot with two GPUs, the card of each side moving on with the boot
    assert sb.placements(["stock", "patched"], 0, []) == [[("stock", None, 0)], [("patched", None, 0)]]
    assert sb.placements(["stock", "patched"], 0, ["0", "1"]) == [[("stock", "0", 0), ("patched", "1", sb.SLOT_PORT_STRIDE)]]
    assert sb.placements(["stock", "patched"], 1, ["0", "1"]) == [[("patched", "0", 0), ("stock", "1", sb.SLOT_PORT_STRIDE)]]
    # Over as many boots as GPUs, every variant runs once on every GPU, and a wave never
    # puts two servers on one GPU.
    for variants, gpus in ((["stock", "patched"], ["0", "1"]),
                           (["stock", "patched", "patched-prefill-first"], ["0", "1", "2"]),
                           (["stock", "patched", "upstream"], ["0", "1"])):
        seen = {v: [] for v in variants}
        for boot in range(len(variants) * len(gpus)):
            for wave in sb.placements(variants, boot, gpus):
                assert len({g for _, g, _ in wave}) == len(wave)
                for v, g, _ in wave:
                    seen[v].append(g)
        assert all(sorted(set(g)) == gpus and len(set(g.count(x) for x in gpus)) == 1 for g in seen.values())
    three = sb.placements(["stock", "patched", "upstream"], 0, ["0", "1"])
    assert [[v for v, _, _ in w] for w in three] == [["stock", "patched"], ["upstream"]]
    import threading

    started, overlap, lock = [], [], threading.Lock()
    barrier = threading.Barrier(2, timeout=5)

    def fake_run_server(variant, boot, target, draft, args, deadline, port, gpu=None):
        with lock:
            started.append((boot, variant, gpu, port))
        barrier.wait()  # both servers of a boot are up at the same time, or this times out
        overlap.append(boot)
        return _run(variant, boot, 100, 10 if variant == "stock" else 8, 1000)

    monkeypatch.setattr(sb, "run_server", fake_run_server)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    out = tmp_path / "out"
    assert sb.main(["--out", str(out), "--variants", "stock,patched", "--boots", "2", "--gpus", "2",
                    "--concurrency", "32", "--port", "30000"]) == 0
    assert sorted(started) == [(0, "patched", "1", 30500), (0, "stock", "0", 30000),
                               (1, "patched", "0", 30010), (1, "stock", "1", 30510)]
    doc = json.loads((out / "serve-bench.json").read_text())
    assert doc["environment"]["config"]["gpus"] == ["0", "1"] and len(doc["runs"]) == 4
    assert "ran at the same time on GPUs 0,1" in (out / "serve-bench.md").read_text().splitlines()[0]
    # more GPUs asked for than visible: one line, no run
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert sb.main(["--out", str(tmp_path / "o2"), "--gpus", "2", "--concurrency", "1"]) == 2


def test_run_server_pins_its_gpu_and_records_it(tmp_path: Path, monkeypatch) -> None:
    import time

    launched = _no_processes(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    args = argparse.Namespace(out=tmp_path, timeline=False, upstream_site="none", backend="default", server_arg=[],
                              concurrency=[1], spec="chain", model="8b")
    run = sb.run_server("patched", 1, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=1, gpu="1")
    assert run["gpu"] == "1" and launched[0][1]["CUDA_VISIBLE_DEVICES"] == "1"
    run = sb.run_server("stock", 1, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=1)
    assert "gpu" not in run and launched[2][1]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_client_stamps_each_request_of_the_bench_serving_run(monkeypatch) -> None:
    import asyncio
    import io
    import textwrap

    import serve_bench_client as sc

    # A stand-in for bench_serving's namespace: its request functions live in the run's own globals.
    ns: dict = {}
    exec(textwrap.dedent('''
        import asyncio

        class Out:
            def __init__(self, ok):
                self.success, self.ttft = ok, 0.01 if ok else 0.0

        async def request(request_func_input=None, pbar=None):
            await asyncio.sleep(0.01)
            return Out(request_func_input != 2)

        ASYNC_REQUEST_FUNCS = {"sglang": request}

        async def benchmark():
            f = ASYNC_REQUEST_FUNCS["sglang"]
            return [await f(request_func_input=i) for i in range(3)]
    '''), ns)

    def fake_run(name, run_name, alter_sys):
        asyncio.run(ns["benchmark"]())
        asyncio.run(ns["benchmark"]())  # a second asyncio.run in the same call: stamped once each

    monkeypatch.setenv("SERVE_BENCH_CLIENT_LAG", "1")
    out = io.StringIO()
    assert sc.serve(io.StringIO('["--port", "1"]\n'), out, run=fake_run) == 0
    stamps = json.loads(out.getvalue())["requests"]
    assert len(stamps) == 6 and [t for _, t in stamps] == [0.01, 0.01, None] * 2
    assert [s for s, _ in stamps] == sorted(s for s, _ in stamps) and stamps[-1][0] - stamps[0][0] >= 0.04


def test_client_split_pairs_the_measured_requests_with_the_api_servers_own_stamps() -> None:
    t = 1_000.0
    # warm-up request w, then three measured ones; the API server takes each in 2 ms after the
    # client's call, its first output comes 20 ms later and reaches the client 3 ms after that.
    requests = [[t, 0.025], [t + 1.0, 0.025], [t + 1.1, 0.025], [t + 1.2, None], [t + 1.3, 0.025]]
    api = [{"kind": "api", "rid": f"r{i}", "received": s + 0.002, "first": s + 0.022, "dispatch": s + 0.003}
           for i, (s, ttft) in enumerate(requests) if ttft is not None]
    api.append({"kind": "api", "rid": "x", "received": t + 5.0, "first": None, "dispatch": t + 5.0})  # no output yet
    got = sb.client_split(requests, api, t - 1, t + 9, measured=3)
    assert got == {"client_to_api_ms": 2.0, "api_to_client_ms": 3.0, "client_pairs": 3}
    # Counts that do not match, or a pairing that goes back in time: no figure rather than a wrong one.
    none = {"client_to_api_ms": None, "api_to_client_ms": None, "client_pairs": 0}
    assert sb.client_split(requests, api, t - 1, t + 9, measured=9) == none
    assert sb.client_split(requests, api, t - 1, t + 9, measured=None) == none
    early = [dict(a, received=a["received"] - 0.01) for a in api]
    assert sb.client_split(requests, early, t - 1, t + 9, measured=3) == none
    # Window: events outside [lo, hi) are not this cell's.
    assert sb.client_split(requests, api, t + 1.05, t + 9, measured=3) == none
    # A window that reaches into the next cell holds that cell's first receipts after the measured
    # ones; they are not paired with this cell's calls.
    nxt = [{"kind": "api", "rid": f"n{i}", "received": t + 2.0 + i / 10, "first": t + 2.1 + i / 10,
            "dispatch": t + 2.0} for i in range(2)]
    assert sb.client_split(requests, api + nxt, t - 1, t + 9, measured=3) == got
    assert sb.client_api_pairs(requests, api + nxt, float("-inf"), t + 9, 3) == [
        (r, a) for r, a in zip([requests[1], requests[2], requests[4]], api[1:4])]


def test_bench_servings_own_names_are_what_the_client_stamps(monkeypatch) -> None:
    # serve_bench_client finds the request functions in the run's globals by this name, and reads
    # each output's success and ttft: SGLang's bench_serving must still have them.
    import dataclasses

    monkeypatch.syspath_prepend(str(child_env.DATASETS_STAND_IN))
    import sglang.bench_serving as bs

    assert "sglang" in bs.ASYNC_REQUEST_FUNCS and bs.benchmark.__globals__ is vars(bs)
    fields = {f.name for f in dataclasses.fields(bs.RequestFuncOutput)}
    assert {"success", "ttft"} <= fields


def _bench_result(texts: list[str], errors: list[str] | None = None) -> dict:
    return {"median_ttft_ms": 10.0, "generated_texts": texts, "errors": errors or [""] * len(texts)}


def test_cells_keep_output_digests_and_the_summary_counts_outputs_equal_to_stocks(tmp_path: Path) -> None:
    same, other = ["w1 w2", "w3 w4", "w5"], ["w1 w2", "w3 w9", "w5"]
    vals = sb.cell_values(_bench_result(same, ["", "", "boom"]), 90.0)
    assert len(vals["output_digests"]) == 3 and vals["output_digests"][2] is None  # a failed request
    assert vals["output_digests"][0] == sb.cell_values(_bench_result(same), None)["output_digests"][0]
    assert "output_digests" not in sb.flat_cell(vals)  # not a per-boot statistic

    def run(variant: str, boot: int, texts: list[str]) -> dict:
        return {"variant": variant, "boot": boot, "error": None,
                "cells": {"8": sb.cell_values(_bench_result(texts), 90.0)}}

    # Boot 0 equal; boot 1 differs in one request; a failed stock request is not compared.
    runs = [run("stock", 0, same), run("patched", 0, same), run("stock", 1, same), run("patched", 1, other)]
    assert sb.same_outputs(runs) == {"patched": {8: [5, 6]}}
    runs[2]["cells"]["8"]["output_digests"][1] = None
    assert sb.same_outputs(runs) == {"patched": {8: [5, 5]}}
    assert sb.same_outputs([runs[0]]) == {}
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": runs}))
    text = sb.merge([doc])
    assert "Outputs: requests whose generated text equals stock's" in text and "| 8 | 5 / 5 |" in text


def test_merge_reads_older_records_outputs_from_their_logs(tmp_path: Path, capsys) -> None:
    import tarfile

    runs = [{"variant": v, "boot": 0, "error": None, "cells": {"4": {"median_ttft_ms": 10.0}}}
            for v in ("stock", "patched")]
    doc = tmp_path / "serve-bench.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": runs}))
    bench = tmp_path / "bench"
    bench.mkdir()
    for v, texts in (("stock", ["a b", "c d"]), ("patched", ["a b", "c x"])):
        (bench / f"{v}-boot0-c4.jsonl").write_text(json.dumps({"other": 1}) + "\n" + json.dumps(_bench_result(texts)) + "\n")
    logs = tmp_path / "serve-logs.tar.gz"
    with tarfile.open(logs, "w:gz") as tar:
        tar.add(bench, arcname="bench")
    assert "Outputs:" not in sb.merge([doc])  # no digests in the record itself
    assert "| 4 | 1 / 2 |" in sb.merge([doc], logs=[logs])
    with pytest.raises(ValueError, match="one per record"):
        sb.merge([doc], logs=[logs, logs])
    assert sb.main(["--merge", str(doc), "--logs", str(logs)]) == 0
    assert "| 4 | 1 / 2 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        sb.main(["--logs", str(logs)])


_GSP_CHILD = r"""
import os, sys, time, hashlib, importlib
sys.path.insert(0, sys.argv[1])
import serve_bench_client as sc
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[2])
decode = tok.decode
def slow_decode(*a, **k):  # widen the window between the cache check and the cache write
    time.sleep(0.05)
    return decode(*a, **k)
tok.decode = slow_decode
mod = importlib.import_module(sc.GSP_MODULE)
if sys.argv[4] == "lock":
    sc.install_dataset_lock()
open(sys.argv[5], "w").close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.001)
rows = mod.GeneratedSharedPrefixDataset(num_groups=2, prompts_per_group=2, system_prompt_len=64, question_len=16,
    output_len=8, range_ratio=1.0, seed=7, fast_prepare=False, send_routing_key=False, num_turns=1,
    ordered=False).load(tok)
print(hashlib.sha1("\n".join(r.prompt for r in rows).encode()).hexdigest())
"""


def gsp_prompts_of_two_clients(tmp_path: Path, mode: str, homes: list[Path]) -> list[str]:
    """Two processes that generate one ``generated-shared-prefix`` cell the way ``bench_serving``
    does (its dataset class, a word-level tokenizer), started at the same instant (``mode``
    ``lock``: through the client's lock); the digest of each one's prompts."""
    import subprocess

    tok = tmp_path / "tok"
    if not tok.exists():
        tok.mkdir()
        model_factory.write_tokenizer(tok, 4000)
    script = tmp_path / "child.py"
    script.write_text(_GSP_CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(child_env.DATASETS_STAND_IN), os.environ.get("PYTHONPATH", "")]))
    tag = f"{mode}-{len(list(tmp_path.glob('go-*')))}"
    go, ready = tmp_path / f"go-{tag}", [tmp_path / f"ready-{tag}-{i}" for i in range(len(homes))]
    procs = [subprocess.Popen([sys.executable, str(script), str(sb.HERE), str(tok), str(go), mode, str(r)],
                              env=dict(env, HOME=str(h)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for h, r in zip(homes, ready)]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
        outs.append(out.strip().splitlines()[-1])
    return outs


def test_bench_clients_that_start_one_generated_shared_prefix_cell_at_once_get_one_set_of_prompts(tmp_path: Path) -> None:
    # bench_serving draws these prompts from get_vocab(), whose order changes with the process:
    # two clients that each generate a cell get different prompts (separate homes, no cache to
    # share). Two that start the same cell at once (one home) must get one set: the client
    # locks the generation, the second waits and loads the first one's cache file.
    apart = gsp_prompts_of_two_clients(tmp_path, "lock", [tmp_path / "home-a", tmp_path / "home-b"])
    assert apart[0] != apart[1]
    together = gsp_prompts_of_two_clients(tmp_path, "lock", [tmp_path / "home-c", tmp_path / "home-c"])
    assert together[0] == together[1]


def test_dataset_lock_wraps_once_and_names_a_missing_function(tmp_path: Path) -> None:
    import types

    import serve_bench_client as sc

    mod = types.SimpleNamespace(gen=lambda x: x + 1)
    sc.serialize_dataset_generation(mod, "gen", tmp_path / "locks" / "l.lock")
    first = mod.gen
    sc.serialize_dataset_generation(mod, "gen", tmp_path / "locks" / "l.lock")
    assert mod.gen is first and mod.gen(1) == 2 and (tmp_path / "locks" / "l.lock").exists()
    with pytest.raises(AttributeError):
        sc.serialize_dataset_generation(mod, "renamed", tmp_path / "l.lock")


def test_merge_says_how_often_each_side_had_each_card() -> None:
    def run(variant: str, boot: int, gpu: str | None) -> dict:
        return {"variant": variant, "boot": boot, "gpu": gpu, "error": None, "cells": {}}

    three = [run("stock", b, str(b % 2)) for b in range(3)] + [run("patched", b, str(1 - b % 2)) for b in range(3)]
    line = sb.card_counts(three)
    assert line.startswith("Cards (server runs per variant): stock: GPU 0 x2, GPU 1 x1; patched: GPU 0 x1, GPU 1 x2")
    assert "compare with care" in line
    four = [run("stock", b, str(b % 2)) for b in range(4)] + [run("patched", b, str(1 - b % 2)) for b in range(4)]
    assert "compare with care" not in sb.card_counts(four)
    assert sb.card_counts([run("stock", 0, None), run("patched", 0, None)]) == ""


def test_merge_leaves_out_a_cell_whose_boot_has_no_partner_on_the_other_side(tmp_path: Path) -> None:
    # A boot cut off by --budget: stock ran concurrency 32 once more (boot 2, ttft 10), patched
    # never did. Counted, it would pull stock's median to 100 and make patched look worse.
    runs = [_run("stock", 0, 100, 10, 1000), _run("stock", 1, 120, 10, 1000), _run("stock", 2, 10, 10, 1000),
            _run("patched", 0, 110, 10, 1000), _run("patched", 1, 130, 10, 1000),
            {"variant": "patched", "boot": 2, "cells": {}, "error": "cut off by --budget"}]
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": runs}))
    kept, dropped = sb.paired_runs([json.loads(doc.read_text())])
    assert dropped == ["stock boot 2 conc 32"]
    assert sorted((r["variant"], r["boot"]) for r in kept) == [("patched", 0), ("patched", 1), ("stock", 0), ("stock", 1)]
    md = sb.merge([doc])
    assert "| 32 | 110.0 -> 120.0 (x0.917)" in md
    assert "Left out, no partner in the same boot (a boot cut off by --budget): stock boot 2 conc 32" in md
    assert "4 server runs from 1 record(s)" in md
    # The same boot number in another record is another boot: it pairs only within its record.
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": [_run("patched", 2, 50, 10, 1000),
                                                              _run("stock", 5, 50, 10, 1000)]}))
    kept, dropped = sb.paired_runs([json.loads(doc.read_text()), json.loads(other.read_text())])
    assert dropped == ["stock boot 2 conc 32", "patched boot 2 conc 32", "stock boot 5 conc 32"]
    assert len(kept) == 4


def test_merge_keeps_only_the_concurrencies_asked_for(tmp_path: Path, capsys) -> None:
    """``--merge ... --concurrency 32``: the other cells are left out of every table (two builds
    pooled where they run the same code, apart where they do not); without it every cell."""
    def both(variant: str, boot: int, ttft32: float, ttft48: float) -> dict:
        run = _run(variant, boot, ttft32, 10, 1000)
        run["cells"]["48"] = _run(variant, boot, ttft48, 10, 1000)["cells"]["32"]
        return run
    runs = [both("stock", 0, 100, 100), both("patched", 0, 90, 200), both("stock", 1, 100, 100),
            both("patched", 1, 90, 200)]
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": runs}))
    every = sb.merge([doc])
    assert "| 32 | 100.0 -> 90.0 (x1.111)" in every and "| 48 | 100.0 -> 200.0 (x0.500)" in every
    assert "conc 48 median_ttft_ms: x0.500" in every
    assert sb.main(["--merge", str(doc), "--concurrency", "32"]) == 0
    only = capsys.readouterr().out
    assert "| 32 | 100.0 -> 90.0 (x1.111)" in only and "| 48 |" not in only
    assert "only the cells at concurrency 32 (--concurrency)" in only
    assert "Latency cells more than 3% worse patched: none" in only
    assert sb.main(["--merge", str(doc), "--concurrency", "16"]) == 2
    assert "no cell at concurrency 16 in these records" in capsys.readouterr().err


def test_merge_sets_out_boot_pairs_with_an_interval_that_counts_the_scatter_between_boots(tmp_path: Path) -> None:
    """Each boot's stock / patched is one pair; the table gives their geometric mean, a 95%
    Student-t interval over the pairs and the pairs a +-3% interval would take at that scatter.
    Pairs form within a record only (the same boot number in two records is two boots), and one
    pair gives no interval."""
    import math

    def doc(name: str, boots: list[tuple[int, float, float]]) -> Path:
        runs = [r for b, st_ttft, p_ttft in boots
                for r in (_run("stock", b, st_ttft, 10, 1000), _run("patched", b, p_ttft, 8, 1000))]
        for r in runs:
            r["cells"]["32"]["ttfts_ms"] = [r["cells"]["32"]["median_ttft_ms"]] * 4
        path = tmp_path / name
        path.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
            "backend": "default", "server_args": []}}, "runs": runs}))
        return path

    # Three pairs whose TTFT ratios are 1.1, 1.0 and 0.9 (stock / patched), two of them boot 0.
    a, b = doc("a.json", [(0, 110, 100), (1, 100, 100)]), doc("b.json", [(0, 90, 100)])
    runs, _ = sb.paired_runs([json.loads(a.read_text()), json.loads(b.read_text())])
    pairs = sb.boot_pair_ratios(runs)[32]
    logs = [math.log(1.1), 0.0, math.log(0.9)]
    mean, sd = sum(logs) / 3, statistics.stdev(logs)
    ttft = pairs["median_ttft_ms"]
    assert ttft["pairs"] == 3 and ttft["ratio"] == pytest.approx(math.exp(mean))
    half = 4.303 * sd / math.sqrt(3)  # Student's t, 2 degrees of freedom
    assert ttft["ci95"] == pytest.approx([math.exp(mean - half), math.exp(mean + half)])
    assert ttft["pairs_for_3pct"] == math.ceil((1.96 * sd / math.log(1.03)) ** 2)
    assert pairs["median_tpot_ms"]["ratio"] == pytest.approx(10 / 8) and pairs["median_tpot_ms"]["pairs_for_3pct"] == 0
    md = sb.merge([a, b])
    # Neither record ran its servers on two GPUs at once: one after the other.
    assert "Boot pairs, stock -> patched (a boot's two servers ran one after the other;" in md
    side = json.loads(b.read_text())
    side["environment"]["config"]["gpus"] = ["0", "1"]
    b.write_text(json.dumps(side))
    assert "(a boot's two servers ran side by side;" in sb.merge([b])
    assert "(a boot's two servers ran side by side in some records, one after the other in the others;" in sb.merge([a, b])
    # The pooled table says what its interval leaves out, and points here.
    assert "[90% bootstrap interval over requests, which leaves out the scatter between boots" in md
    row = next(line for line in md.splitlines() if line.startswith("| 32 | 3 | x"))
    assert f"x{math.exp(mean):.3f} [{math.exp(mean - half):.3f}, {math.exp(mean + half):.3f}]" in row
    assert row.endswith("; +-3%: 0 pairs |")  # TPOT: the same ratio in every pair
    assert "; +-3%: 1 pair |" in sb.format_pair_table({8: {"median_tpot_ms": {
        "pairs": 2, "ratio": 1.1, "ci95": [1.0, 1.2], "pairs_for_3pct": 1}}})
    # Read as one record, boot 0 of b would pair nothing new: the pairs are per record.
    assert sb.boot_pair_ratios(sb.paired_runs([json.loads(a.read_text())])[0])[32]["median_ttft_ms"]["pairs"] == 2
    one = sb.boot_pair_ratios(sb.paired_runs([json.loads(b.read_text())])[0])[32]["median_ttft_ms"]
    assert one["ci95"] is None and one["pairs_for_3pct"] is None and one["ratio"] == pytest.approx(0.9)
    assert "x0.900 (one pair)" in sb.merge([b])
    assert (sb.t95(1), sb.t95(11), sb.t95(40)) == (12.706, 2.228, 1.96)


def test_timeline_probe_records_each_triton_compile_with_its_kernel_and_caller(tmp_path: Path) -> None:
    """A kernel met with a new specialization compiles inside the launch that meets it (in the
    Triton row, patched first decodes at each new batch size held the scheduler 0.2-0.8 s).
    The probe wraps Triton's per-specialization compile: one ``compile`` event naming the kernel,
    its key and the code outside Triton that launched it; a launch that compiles nothing (the
    key cached by Triton itself) gives none. Wrapped once, however often it installs."""
    compiled: list = []

    class JIT:  # the two attributes of triton.runtime.jit.JITFunction the probe reads
        def __init__(self, fn):
            self.fn = fn
            self.cache: dict = {}

        def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
            compiled.append(key)
            time.sleep(0.01)
            return f"binary-{key}"

        def run(self, key):
            if key not in self.cache:
                self.cache[key] = self._do_compile(key, None, 0, {"BLOCK": key}, None, None, False)
            return self.cache[key]

    def my_kernel():
        pass

    tl = st.Timeline(str(tmp_path))
    REAL_WATCH_COMPILES(tl, JIT)
    REAL_WATCH_COMPILES(tl, JIT)
    kernel = JIT(my_kernel)

    def launch_from_sglang(key):
        return kernel.run(key)

    assert launch_from_sglang(4) == "binary-4" and launch_from_sglang(4) == "binary-4"
    launch_from_sglang(16)
    events = [e for e in tl.events if e["kind"] == "compile"]
    assert compiled == [4, 16] and [e["key"] for e in events] == ["4", "16"]
    first = events[0]
    assert first["kernel"] == "my_kernel" and first["t1"] - first["t"] >= 0.01
    assert first["where"][0].startswith("test_gpu_serve_bench_logic.py:") and first["where"][0].endswith(" run")
    assert any(w.endswith(" launch_from_sglang") for w in first["where"])
    assert len(first["where"]) <= st.COMPILE_CALLERS


def test_timeline_probe_wraps_tritons_own_compile_when_triton_is_there(tmp_path: Path) -> None:
    jit = pytest.importorskip("triton.runtime.jit")
    orig = jit.JITFunction._do_compile
    try:
        REAL_WATCH_COMPILES(st.Timeline(str(tmp_path)))
        assert jit.JITFunction._do_compile.__wrapped__ is orig
    finally:
        jit.JITFunction._do_compile = orig


def test_timeline_flush_appends_only_the_new_events_and_a_cut_line_is_left_out(tmp_path: Path) -> None:
    """Each flush writes one JSON line with the events since the last (rewriting the whole list
    held the scheduler thread 100-160 ms every 0.6 s at concurrency 45-48); the reader joins the
    lines and leaves out a last one cut off by SGLang's SIGKILL. Old one-document files read as
    before."""
    tl = st.Timeline(str(tmp_path))
    tl.add({"kind": "recv", "t": 2.0, "rid": "b"})
    tl.add({"kind": "recv", "t": 1.0, "rid": "a"})
    tl.flush()
    tl.flush()  # nothing new: no line
    tl.errors.append("gpu timing: boom")
    tl.add({"kind": "recv", "t": 3.0, "rid": "c"})
    tl.flush()
    (path,) = tmp_path.glob("timeline-*.jsonl")
    lines = path.read_text().splitlines()
    assert [[e["rid"] for e in json.loads(x)["events"]] for x in lines] == [["b", "a"], ["c"]]
    assert [json.loads(x)["errors"] for x in lines] == [[], ["gpu timing: boom"]]
    with path.open("a") as f:
        f.write('{"events": [{"kind": "recv", "t": 4.0, "ri')  # SIGKILL mid-write
    assert [e["rid"] for e in st.load_events([str(path)])] == ["a", "b", "c"]
    old = tmp_path / "timeline-7.json"
    old.write_text(json.dumps({"pid": 7, "errors": [], "events": [{"kind": "recv", "t": 0.5, "rid": "z"}]}))
    assert [e["rid"] for e in st.load_events([str(path), str(old)])] == ["z", "a", "b", "c"]
    assert st.is_timeline_file(path.name) and st.is_timeline_file(old.name) and not st.is_timeline_file("probe-1.json")


def test_serve_bench_script_leaves_four_files_per_run(tmp_path: Path) -> None:
    """A device call brings back eight files: run_serve_bench.sh packs its setup log with the
    server logs, so two runs fit in one call (triton6 of h200x2-tf-2026-11-26 lost its logs)."""
    import subprocess
    import tarfile

    script = (SCRIPTS / "gpu" / "run_serve_bench.sh").read_text()
    start = script.index('(cd "$OUT" && tar czf serve-logs.tar.gz')
    archive = script[start:script.index("\nexit $rc", start)]
    out = tmp_path / "out"
    for d in ("logs", "bench", "timeline", "models"):
        (out / d).mkdir(parents=True)
        (out / d / "x").write_text(d)
    for f in ("setup.log", "serve-bench.json", "serve-bench.md", "serve-bench.svg"):
        (out / f).write_text(f)
    subprocess.run(["bash", "-c", archive], env={**os.environ, "OUT": str(out)}, check=True)
    assert sorted(p.name for p in out.iterdir()) == ["serve-bench.json", "serve-bench.md", "serve-bench.svg",
                                                     "serve-logs.tar.gz"]
    with tarfile.open(out / "serve-logs.tar.gz") as tar:
        names = tar.getnames()
    assert "setup.log" in names and "timeline/x" in names and "logs/x" in names and "bench/x" in names


def test_timeline_probe_samples_one_steady_decode_in_eight(tmp_path: Path) -> None:
    """Steady decodes (not right after a prefill) were never sampled, so a decode's host time
    could not be split (FlashInfer at 1, h200x2-tf-2026-11-26). One in ``STEADY_SAMPLE_EVERY``
    is now: its samples carry phase "steady" and its run event ``sampled``; the TTFT split
    leaves them out."""
    from types import SimpleNamespace

    class Scheduler:
        def process_input_requests(self, recv_reqs): ...

        def run_batch(self, batch):
            # 20 ms of CPU; a sampled launch goes on until the sampler thread has caught it
            # (up to 5 s: on a loaded 2-core host the thread may not run within 20 ms).
            phase, end = tl.launching, time.thread_time() + 0.02
            deadline = time.monotonic() + 5.0

            def caught() -> bool:
                return any(e["kind"] == "sample" and e["phase"] == phase for e in tl.events[seen:])

            seen = len(tl.events)
            while time.thread_time() < end or (phase is not None and not caught()
                                               and time.monotonic() < deadline):
                pass

        def process_batch_result(self, batch, result): ...

    tl = st.Timeline(str(tmp_path))
    sched = Scheduler()
    tl.on_run_batch(SimpleNamespace(f_locals={"self": sched}))
    reqs = [SimpleNamespace(rid="a")]
    sched.run_batch(SimpleNamespace(forward_mode=StandInMode("EXTEND"), reqs=reqs))
    for _ in range(1 + 2 * st.STEADY_SAMPLE_EVERY):  # the first is the decode right after the prefill
        sched.run_batch(SimpleNamespace(forward_mode=StandInMode("DECODE"), reqs=reqs))
    runs = [e for e in tl.events if e["kind"] == "run"]
    assert [i for i, r in enumerate(runs) if r.get("sampled")] == [1 + st.STEADY_SAMPLE_EVERY, 1 + 2 * st.STEADY_SAMPLE_EVERY]
    phases = {e["phase"] for e in tl.events if e["kind"] == "sample"}
    assert phases == {"prefill", "next", "steady"}
    steady = [e for e in tl.events if e["kind"] == "sample" and e["phase"] == "steady"]
    sampled = [r for r in runs if r.get("sampled")]
    assert all(any(r["t"] <= e["t"] <= r["t1"] + 0.002 for r in sampled) for e in steady)
    # The TTFT split reads prefill and next-launch samples only.
    events = [{"kind": "recv", "t": 0.0, "rid": "a"},
              {"kind": "run", "t": 1.0, "t1": 2.0, "mode": "EXTEND", "extend": True, "bs": 1, "rids": ["a"]},
              {"kind": "run", "t": 2.0, "t1": 3.0, "mode": "DECODE", "extend": False, "bs": 1},
              {"kind": "sample", "t": 2.5, "dt": 1e-3, "phase": "next", "stack": ["y.py:1 next_only"]},
              {"kind": "sample", "t": 2.6, "dt": 1e-3, "phase": "steady", "stack": ["x.py:1 steady_only"]},
              {"kind": "proc", "t": 3.0, "t1": 3.5, "mode": "EXTEND", "extend": True, "bs": 1}]
    split = st.ttft_breakdown(events)
    assert list(split["next_launch_samples_ms"]) == ["y.py:1 next_only"]


def _fake_sysfs(root: Path, topology: dict[int, tuple[int, int]]) -> Path:
    """A ``/sys/devices/system/cpu`` with ``topology`` (CPU -> package, core id)."""
    for cpu, (package, core) in topology.items():
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
    return root


def test_cpu_lists_read_and_write_the_kernels_format() -> None:
    assert sb.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert sb.format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert sb.format_cpulist(sb.parse_cpulist("5")) == "5" and sb.parse_cpulist("") == []


def test_physical_cores_keep_a_cores_hyperthreads_together(tmp_path: Path) -> None:
    # 2 packages x 2 cores x 2 threads, numbered as Linux does (siblings n and n + 4)
    topo = {c: (c // 2 % 2, c % 2) for c in range(8)}
    sysfs = _fake_sysfs(tmp_path, topo)
    assert sb.physical_cores(range(8), sysfs) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sb.physical_cores([9], sysfs) == [[9]]  # no topology files: a core of its own


def test_cpu_sets_give_each_server_equal_disjoint_cores_near_its_gpu_first() -> None:
    cores = [[c, c + 8] for c in range(8)]  # 8 cores, hyperthreads c and c + 8
    node0, node1 = {0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}
    # GPUs on different nodes: each its own node
    sets = sb.cpu_sets(["0", "1"], cores, {"0": node0, "1": node1})
    assert sets == {"0": sorted(node0), "1": sorted(node1)}
    assert sb.cpu_sets(["1", "0"], cores, {"0": node0, "1": node1}) == sets
    # Both on node 0: each takes half of it and tops up from node 1, equal counts, disjoint
    same = sb.cpu_sets(["0", "1"], cores, {"0": node0, "1": node0})
    assert [len(same[g]) for g in "01"] == [8, 8] and not set(same["0"]) & set(same["1"])
    assert [len(set(same[g]) & node0) for g in "01"] == [4, 4]
    # Node unknown: the cores in order, halves
    assert sb.cpu_sets(["0", "1"], cores, {"0": None, "1": None}) == {
        "0": [0, 1, 2, 3, 8, 9, 10, 11], "1": [4, 5, 6, 7, 12, 13, 14, 15]}
    # One server at a time: its node's cores and the rest
    assert sb.cpu_sets([""], cores, {"": node1}) == {"": list(range(16))}
    with pytest.raises(ValueError, match="1 physical core"):
        sb.cpu_sets(["0", "1"], [[0, 1]], {})


def test_gpu_local_cpus_read_the_gpus_pci_device(tmp_path: Path, monkeypatch) -> None:
    dev = tmp_path / "0000:1b:00.0"
    dev.mkdir()
    (dev / "local_cpulist").write_text("0-3,8-11\n")
    asked = []

    def fake_run(argv, **kw):
        asked.append(argv)
        return argparse.Namespace(stdout="00000000:1B:00.0\n")

    monkeypatch.setattr(sb.subprocess, "run", fake_run)
    assert sb.gpu_local_cpus("1", tmp_path) == {0, 1, 2, 3, 8, 9, 10, 11}
    assert asked[0][-2:] == ["-i", "1"]
    monkeypatch.setattr(sb.subprocess, "run", lambda argv, **kw: argparse.Namespace(stdout="No devices were found\n"))
    assert sb.gpu_local_cpus("1", tmp_path) is None


def test_pin_process_restricts_a_running_process_and_what_it_starts_later(tmp_path: Path) -> None:
    import subprocess

    cpu = min(os.sched_getaffinity(0))
    script = ("import os, subprocess, sys, time; time.sleep(0.5); "
              "print(sorted(os.sched_getaffinity(0)), subprocess.run([sys.executable, '-c', "
              "'import os; print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True).stdout.strip())")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert sb.pin_process(proc.pid, [cpu]) == str(cpu)
    out, _ = proc.communicate(timeout=30)
    assert out.split() == [f"[{cpu}]", f"[{cpu}]"]
    assert sb.pin_process(proc.pid, [cpu]) is None  # gone
    assert sb.pin_process(os.getpid(), None) is None


def test_run_server_pins_the_server_and_its_client_to_its_slots_cpus(tmp_path: Path, monkeypatch) -> None:
    _no_processes(monkeypatch)
    pinned = []
    monkeypatch.setattr(sb, "pin_process", lambda pid, cpus: pinned.append(cpus) or (sb.format_cpulist(cpus) if cpus else None))
    args = argparse.Namespace(out=tmp_path, timeline=False, upstream_site="none", backend="default", server_arg=[],
                              concurrency=[1], spec="chain", model="8b", cpu_sets={"0": [0, 1], "1": [2, 3]})
    run = sb.run_server("patched", 1, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=1, gpu="1")
    assert pinned == [[2, 3], [2, 3]] and run["cpus"] == "2-3"
    pinned.clear()
    args.cpu_sets = None
    run = sb.run_server("stock", 1, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=1, gpu="1")
    assert pinned == [None, None] and "cpus" not in run


def test_pin_cpus_plans_a_set_per_gpu_records_it_and_says_when_it_cannot(tmp_path: Path, monkeypatch) -> None:
    seen = []

    def fake_run_server(variant, boot, target, draft, args, deadline, port, gpu=None):
        seen.append((gpu, args.cpu_sets[gpu]))
        return _run(variant, boot, 100, 10, 1000)

    monkeypatch.setattr(sb, "run_server", fake_run_server)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(sb, "gpu_local_cpus", lambda gpu, *a: None)
    monkeypatch.setattr(sb, "physical_cores", lambda cpus, *a: [[0, 4], [1, 5], [2, 6], [3, 7]])
    out = tmp_path / "out"
    assert sb.main(["--out", str(out), "--boots", "1", "--gpus", "2", "--concurrency", "8", "--pin-cpus"]) == 0
    assert sorted(seen) == [("0", [0, 1, 4, 5]), ("1", [2, 3, 6, 7])]
    doc = json.loads((out / "serve-bench.json").read_text())
    assert doc["environment"]["config"]["pin_cpus"] == {"0": "0-1,4-5", "1": "2-3,6-7"}
    assert "pinned to its own physical cores (--pin-cpus: GPU 0 0-1,4-5, GPU 1 2-3,6-7)" in \
        (out / "serve-bench.md").read_text().splitlines()[0]
    assert doc["environment"]["config"]["pin_scheduler"] is False
    assert sb.main(["--out", str(tmp_path / "o3"), "--boots", "1", "--gpus", "2", "--concurrency", "8", "--pin-cpus",
                    "--pin-scheduler"]) == 0
    doc = json.loads((tmp_path / "o3" / "serve-bench.json").read_text())
    assert doc["environment"]["config"]["pin_scheduler"] is True
    assert "each scheduler process on a physical core of its own" in (tmp_path / "o3" / "serve-bench.md").read_text()
    monkeypatch.setattr(sb, "physical_cores", lambda cpus, *a: [[0, 1]])
    assert sb.main(["--out", str(tmp_path / "o2"), "--boots", "1", "--gpus", "2", "--concurrency", "8", "--pin-cpus"]) == 2


_ARGS_LINE = ("[2026-11-27 10:30:00] server_args=ServerArgs(model_path='/m/t', attention_backend='{backend}', "
              "decode_attention_backend=None, prefill_attention_backend=None, speculative_eagle_topk={topk}, "
              "speculative_num_draft_tokens=8, disable_overlap_schedule={no_overlap}, enable_mixed_chunk=False)\n")


def test_servers_record_the_attention_backend_and_overlap_sglang_resolved(tmp_path: Path, monkeypatch) -> None:
    """``--spec tree`` without ``--backend`` leaves the backend to SGLang, which picks
    FlashInfer for an explicit tree on Hopper and falls back to spec v1 (overlap off) on both
    sides: each run keeps what its server's ``server_args`` line says, and the summary says it,
    with a warning when the two sides ran different attention backends."""
    import time

    line = _ARGS_LINE.format(backend="flashinfer", topk=4, no_overlap=True)
    assert sb.server_config("log start\n" + line + "more") == {"attention_backend": "flashinfer", "overlap": False,
                                                                "topk": 4}
    assert sb.server_config(_ARGS_LINE.format(backend="fa3", topk=1, no_overlap=False)) == {
        "attention_backend": "fa3", "overlap": True, "topk": 1}
    assert sb.server_config("no server_args line") is None
    # run_server keeps it once the server is ready
    _no_processes(monkeypatch)
    written = sb.subprocess.Popen

    def popen(argv, stdout=None, **kw):
        if stdout is not None and "launch_server" in " ".join(argv):
            stdout.write(line)
            stdout.flush()
        return written(argv, stdout=stdout, **kw)

    monkeypatch.setattr(sb.subprocess, "Popen", popen)
    monkeypatch.setattr(sb.launch, "wait_until_ready", lambda *a, **k: None)
    args = argparse.Namespace(out=tmp_path, timeline=False, upstream_site="none", backend="default", server_arg=[],
                              concurrency=[], spec="tree", model="8b")
    run = sb.run_server("stock", 0, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=7)
    assert run["error"] is None and run["server"] == {"attention_backend": "flashinfer", "overlap": False, "topk": 4}
    # the summary
    runs = [{"variant": v, "boot": b, "cells": {"16": {"median_ttft_ms": 14.0}}, "error": None,
             "server": dict(run["server"])} for v in ("stock", "patched") for b in (0, 1)]
    text = sb.server_lines(runs)
    assert text == ("Servers as SGLang resolved them (attention backend, overlap scheduler, draft topk): "
                    "stock: flashinfer, overlap off, topk 4 (x2); patched: flashinfer, overlap off, topk 4 (x2)")
    runs[2]["server"] = {"attention_backend": "fa3", "overlap": True, "topk": 4}
    assert "**The attention backends differ between stock and patched**" in sb.server_lines(runs)
    assert sb.server_lines([{"variant": "stock", "boot": 0, "cells": {}}]) == ""  # records before the field
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": runs}))
    assert "patched: fa3, overlap on, topk 4 (x1); flashinfer, overlap off, topk 4 (x1)" in sb.merge([doc])


def test_merge_reads_what_older_records_servers_ran_from_their_logs(tmp_path: Path) -> None:
    import io
    import tarfile

    runs = [{"variant": v, "boot": 0, "cells": {"16": {"median_ttft_ms": 14.0}}, "error": None}
            for v in ("stock", "patched")]
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": {
        "backend": "default", "server_args": []}}, "runs": runs}))
    logs = tmp_path / "serve-logs.tar.gz"
    with tarfile.open(logs, "w:gz") as tar:
        for name, text in (("logs/stock-boot0.log", _ARGS_LINE.format(backend="flashinfer", topk=4, no_overlap=True)),
                           ("logs/patched-boot0.log", _ARGS_LINE.format(backend="fa3", topk=4, no_overlap=False)),
                           ("logs/stock-boot0-bench.log", "a bench client's log: not a server's")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert "Servers as SGLang resolved them" not in sb.merge([doc])
    text = sb.merge([doc], logs=[logs])
    assert ("stock: flashinfer, overlap off, topk 4 (x1); patched: fa3, overlap on, topk 4 (x1). "
            "**The attention backends differ between stock and patched**") in text


def test_timeline_probe_times_named_functions_exactly_and_hands_each_launch_its_share(
        tmp_path: Path, monkeypatch) -> None:
    """``SMOKE_TIME_FUNCS``: a class's own method and a module's function are wrapped where they
    are defined; calls on the scheduler thread add to the next ``run`` event's ``ftimes``
    (calls since the previous launch ended), calls on other threads are not counted, and names
    not found are listed once. ``relay`` names SGLang's and the plugin's relay functions."""
    import threading
    import types
    from types import SimpleNamespace

    mod = types.ModuleType("ftimes_stand_in")

    class FutureMap:
        def publish(self, n):
            time.sleep(0.002 * n)
            return n

    def helper():
        return FutureMap().publish(1)

    mod.FutureMap, mod.helper = FutureMap, helper
    monkeypatch.setitem(sys.modules, "ftimes_stand_in", mod)

    class Scheduler:
        def process_input_requests(self, recv_reqs): ...

        def run_batch(self, batch):
            return mod.FutureMap().publish(batch.n)

        def process_batch_result(self, batch, result): ...

    monkeypatch.setattr(st, "TIME_FUNCS", ("ftimes_stand_in:FutureMap.publish", "ftimes_stand_in:helper",
                                           "ftimes_stand_in:FutureMap.store_to_map", "no_such_module:f"))
    tl = st.Timeline(str(tmp_path))
    sched = Scheduler()
    tl.on_run_batch(SimpleNamespace(f_locals={"self": sched}))
    assert mod.FutureMap.publish.__wrapped__ is not None  # wrapped where it is defined
    assert mod.helper() == 1  # between launches, on the scheduler thread: the next launch's share
    other = threading.Thread(target=lambda: mod.FutureMap().publish(5))  # not the scheduler thread
    other.start()
    other.join()
    assert sched.run_batch(SimpleNamespace(forward_mode=StandInMode("DECODE"), reqs=[], n=2)) == 2  # delegated
    sched.run_batch(SimpleNamespace(forward_mode=StandInMode("DECODE"), reqs=[], n=1))
    runs = [e for e in tl.events if e["kind"] == "run"]
    first, second = runs[0]["ftimes"], runs[1]["ftimes"]
    assert first["helper"][0] == 1 and first["FutureMap.publish"][0] == 2
    assert first["FutureMap.publish"][1] >= 6.0 > first["helper"][1] - 0.5 >= 1.5  # 2 + 4 ms, helper's 2 ms
    assert second == {"FutureMap.publish": [1, second["FutureMap.publish"][1]]} and 2.0 <= second["FutureMap.publish"][1] < 6.0
    missing = [e for e in tl.events if e["kind"] == "ftime_missing"]
    assert [e["names"] for e in missing] == [["ftimes_stand_in:FutureMap.store_to_map", "no_such_module:f"]]
    assert st.timed_function_names(" relay, a:b ,a:b") == (*st.RELAY_FUNCS, "a:b")
    assert "sglang.srt.managers.overlap_utils:FutureMap.publish" in st.RELAY_FUNCS
    assert st.timed_function_names(None) == ()


def test_timeline_probe_reads_its_sampling_and_timers_from_the_servers_environment(tmp_path: Path, monkeypatch) -> None:
    """``SMOKE_SAMPLE_DEPTH``, ``SMOKE_STEADY_SAMPLE_EVERY`` and ``SMOKE_TIME_FUNCS`` in the
    server's environment set the probe's stack depth, steady-decode sampling and timed functions
    (as the probe loads in SGLang's processes: from its file, at import); unset, the defaults; and
    the record's config keeps what the caller set."""
    import importlib.util

    def load():
        spec = importlib.util.spec_from_file_location("sched_timeline_env", child_env.PROBE_DIR / "sched_timeline.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    for name in sb.PROBE_ENV:
        monkeypatch.delenv(name, raising=False)
    plain = load()
    assert (plain.SAMPLE_DEPTH, plain.STEADY_SAMPLE_EVERY, plain.TIME_FUNCS, plain.CORE_SPEED) == (3, 8, (), False)
    monkeypatch.setenv("SMOKE_SAMPLE_DEPTH", "40")
    monkeypatch.setenv("SMOKE_STEADY_SAMPLE_EVERY", "1")
    monkeypatch.setenv("SMOKE_TIME_FUNCS", "relay")
    monkeypatch.setenv("SMOKE_CORE_SPEED", "1")
    deep = load()
    assert (deep.SAMPLE_DEPTH, deep.STEADY_SAMPLE_EVERY, deep.TIME_FUNCS, deep.CORE_SPEED) == (40, 1, deep.RELAY_FUNCS, True)
    args = argparse.Namespace(backend="default", server_arg=[], dataset="random-ids", input_len=256, output_len=256,
                              range_ratio=1.0, rounds=4, min_prompts=0, concurrency=[16], boots=1, warmup=1,
                              model="8b", spec="chain", freeze_gc=False, out=tmp_path)
    config = sb.environment(args)["config"]
    assert config["probe_env"] == {"SMOKE_SAMPLE_DEPTH": "40", "SMOKE_STEADY_SAMPLE_EVERY": "1",
                                   "SMOKE_TIME_FUNCS": "relay", "SMOKE_CORE_SPEED": "1"}
    monkeypatch.delenv("SMOKE_CORE_SPEED")
    config = sb.environment(args)["config"]
    doc = tmp_path / "r.json"
    doc.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "config": config}, "runs": [
        {"variant": v, "boot": 0, "cells": {"16": {"median_ttft_ms": 14.0}}} for v in ("stock", "patched")]}))
    assert ("timeline probe SMOKE_SAMPLE_DEPTH=40, SMOKE_STEADY_SAMPLE_EVERY=1, SMOKE_TIME_FUNCS=relay"
            in sb.merge([doc]))
    monkeypatch.delenv("SMOKE_TIME_FUNCS")
    monkeypatch.delenv("SMOKE_SAMPLE_DEPTH")
    monkeypatch.delenv("SMOKE_STEADY_SAMPLE_EVERY")
    assert sb.environment(args)["config"]["probe_env"] == {}
    # The record keeps the host's CPUs by physical core, to read each launch's ``core`` against.
    assert sb.environment(args)["cpu_cores"] == sb.physical_cores(sorted(os.sched_getaffinity(0)))


def test_timeline_probe_names_the_caller_of_a_host_sync_on_the_scheduler_thread_only(tmp_path: Path, monkeypatch) -> None:
    """The probe's sync wrappers (``Tensor.item`` / ``tolist`` / ``cpu``, CUDA synchronizes)
    record a wait as long as ``SYNC_MIN_S`` with the file, line and function that called it,
    on the scheduler thread only; the wrapped call returns what it returned."""
    import threading

    import torch

    for name in ("item", "tolist", "cpu"):  # put back after the test
        monkeypatch.setattr(torch.Tensor, name, getattr(torch.Tensor, name))
    monkeypatch.setattr(st, "SYNC_MIN_S", 0.0)
    tl = st.Timeline(str(tmp_path))
    tl._wrap_syncs(threading.get_ident())
    t = torch.tensor([3, 4])

    def reads_lengths():
        return t.tolist()

    assert reads_lengths() == [3, 4]
    other = threading.Thread(target=lambda: t.cpu())
    other.start()
    other.join()
    syncs = [e for e in tl.events if e["kind"] == "sync"]
    assert [e["what"] for e in syncs] == ["tolist"]
    assert syncs[0]["where"].startswith("test_gpu_serve_bench_logic.py:") and syncs[0]["where"].endswith(" reads_lengths")
    assert syncs[0]["t1"] >= syncs[0]["t"]


def test_pin_scheduler_gives_the_scheduler_a_core_alone_and_the_rest_of_the_set_to_everything_else(tmp_path: Path) -> None:
    """Real processes: a stand-in server with a scheduler child (named as SGLang's setproctitle
    names it, and with a second thread) and another child, and a client. Every thread of the
    scheduler ends up on the first core of the set, every other process on the rest."""
    import subprocess

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    a, b = cpus[0], cpus[1]
    threaded = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    server = subprocess.Popen(["bash", "-c", f"(exec -a sglang::scheduler_TP0 {sys.executable} -c '{threaded}') & "
                               "sleep 60 & wait"], start_new_session=True)
    client = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            tree = sb.process_tree(server.pid)
            scheds = [p for p in tree if sb.is_scheduler(p)]
            if len(tree) == 3 and scheds and len(os.listdir(f"/proc/{scheds[0]}/task")) >= 2:
                break
            time.sleep(0.05)
        assert len(tree) == 3 and len(scheds) == 1
        got = sb.pin_scheduler_apart(server.pid, client.pid, [a, b], cores=[[a], [b]])
        assert got == {"scheduler": str(a), "others": str(b), "schedulers": 1}
        (sched,) = scheds
        for tid in os.listdir(f"/proc/{sched}/task"):
            assert os.sched_getaffinity(int(tid)) == {a}
        for pid in [p for p in tree if p != sched] + [client.pid]:
            assert os.sched_getaffinity(pid) == {b}
        assert sb.pin_scheduler_apart(server.pid, client.pid, [a], cores=[[a]])["error"].startswith(
            "--pin-scheduler needs 2 physical cores")
        assert sb.pin_scheduler_apart(client.pid, client.pid, [a, b], cores=[[a], [b]]) == {
            "error": "no SGLang scheduler process under the server"}
    finally:
        os.killpg(server.pid, 9)
        client.kill()
        server.wait()
        client.wait()


def test_a_scheduler_is_told_by_its_title_or_its_truncated_comm(tmp_path: Path) -> None:
    for pid, cmdline, comm, expected in ((1, b"sglang::scheduler_TP0\0", "sglang::schedul", True),
                                         (2, b"python\0-m\0x\0", "sglang::schedul", True),  # title lost, comm kept
                                         (3, b"sglang::detokenizer\0", "sglang::detoken", False),
                                         (4, b"python\0", "python", False)):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(cmdline)
        (d / "comm").write_text(comm + "\n")
        assert sb.is_scheduler(pid, tmp_path) is expected
    assert sb.is_scheduler(9, tmp_path) is False  # gone


def test_run_server_pins_the_scheduler_apart_once_ready_and_stops_when_it_cannot(tmp_path: Path, monkeypatch) -> None:
    _no_processes(monkeypatch)
    monkeypatch.setattr(sb, "pin_process", lambda pid, cpus: sb.format_cpulist(cpus) if cpus else None)
    monkeypatch.setattr(sb.launch, "wait_until_ready", lambda *a, **k: None)
    calls = []
    monkeypatch.setattr(sb, "pin_scheduler_apart", lambda server, client, slot: calls.append(slot) or {"error": "none"})
    args = argparse.Namespace(out=tmp_path, timeline=False, upstream_site="none", backend="default", server_arg=[],
                              concurrency=[], spec="chain", model="8b", cpu_sets={"0": [0, 1, 4, 5]},
                              pin_scheduler=True)
    run = sb.run_server("patched", 0, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=1, gpu="0")
    assert calls == [[0, 1, 4, 5]] and run["error"] == "none" and run["cells"] == {}
    monkeypatch.setattr(sb, "pin_scheduler_apart", lambda server, client, slot: {"scheduler": "0,4", "others": "1,5"})
    run = sb.run_server("stock", 0, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=1, gpu="0")
    assert run["pin_scheduler"] == {"scheduler": "0,4", "others": "1,5"}
    args.pin_scheduler = False
    run = sb.run_server("stock", 0, "/m/t", "/m/d", args, deadline=time.monotonic() + 5, port=1, gpu="0")
    assert "pin_scheduler" not in run
    with pytest.raises(SystemExit):
        sb.main(["--out", str(tmp_path / "o"), "--pin-scheduler"])



def test_a_retired_variant_still_merges_but_never_runs(tmp_path: Path, capsys) -> None:
    """Back-port 27 left the plugin after its record: that record's variant still has its table,
    and a run under its name (which would start the plugin as it ships) is refused."""
    from sglang_futuremap_patch.backports import SERIES

    assert "prefill_before_next_batch" not in SERIES
    assert set(sb.RETIRED_MODES) <= set(sb.MODES)
    runs = [_run("stock", 0, 100, 10, 1000), _run("patched-prefill-before-next-batch", 0, 90, 8, 1250)]
    assert sb.summarize(runs)["ratio_patched-prefill-before-next-batch"]
    with pytest.raises(SystemExit):
        sb.main(["--out", str(tmp_path / "o"), "--variants", "stock,patched-prefill-before-next-batch"])
    assert "variant patched-prefill-before-next-batch is retired: back-port 27" in capsys.readouterr().err


def test_the_prefill_preset_names_functions_stock_sglang_has() -> None:
    """``SMOKE_TIME_FUNCS=prefill`` expands to ``PREFILL_FUNCS``, and each of them is a function
    of the SGLang this project patches, or one the plugin adds (a misspelt name would only be
    listed as missing on the GPU box, on both sides, and time nothing)."""
    from sglang_futuremap_patch.backports import publish_stash

    assert st.timed_function_names("prefill, relay") == tuple(dict.fromkeys((*st.PREFILL_FUNCS, *st.RELAY_FUNCS)))
    # looked up as the probe looks them up: what stock lacks is the FutureMap's publish / stash,
    # which back-port 2 installs
    stock_lacks = [name.partition(":")[2] for name in st.PREFILL_FUNCS if st.find_timed_function(name) is None]
    assert stock_lacks == ["FutureMap.publish", "FutureMap.stash"]
    assert callable(publish_stash.publish) and callable(publish_stash.stash)


def test_probe_times_class_and_static_methods_and_keeps_them_so(tmp_path: Path, monkeypatch) -> None:
    """``ForwardBatch.init_new`` is a classmethod: the probe times it and it stays one (called
    on the class and on an instance alike), as does a staticmethod; other threads' calls are
    not counted."""
    import threading
    import types

    mod = types.ModuleType("ftimes_kinds")

    class Batch:
        @classmethod
        def init_new(cls, n):
            return (cls, n)

        @staticmethod
        def size(n):
            return n * 2

    mod.Batch = Batch
    monkeypatch.setitem(sys.modules, "ftimes_kinds", mod)
    tl = st.Timeline(str(tmp_path))
    tl.time_functions(("ftimes_kinds:Batch.init_new", "ftimes_kinds:Batch.size"), threading.get_ident())
    assert isinstance(vars(Batch)["init_new"], classmethod) and isinstance(vars(Batch)["size"], staticmethod)
    assert Batch.init_new(3) == (Batch, 3) and Batch().init_new(4) == (Batch, 4)
    assert Batch.size(5) == 10 and Batch().size(1) == 2
    other = threading.Thread(target=lambda: Batch.init_new(9))
    other.start()
    other.join()
    assert tl.ftimes["Batch.init_new"][0] == 2 and tl.ftimes["Batch.size"][0] == 2
    assert [e["names"] for e in tl.events if e["kind"] == "ftime_missing"] == [[]]


def test_merge_says_where_its_records_differ_from_the_first_ones_line(tmp_path: Path) -> None:
    """The summary's first line is the first record's; records from another day or another core
    split get one sentence naming each difference, and records that agree get none."""
    def record(name: str, date: str, pin: dict[str, str]) -> Path:
        runs = [_run("stock", 0, 100, 10, 1000), _run("patched", 0, 90, 8, 1250)]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"environment": {"date": date, "gpu": "g", "sglang": "v", "config": {
            "backend": "fa3", "server_args": [], "pin_cpus": pin}}, "runs": runs}))
        return path

    a = record("a", "2026-11-27", {"0": "0-15", "1": "16-31"})
    b = record("b", "2026-11-28", {"0": "0-31", "1": "32-63"})
    c = record("c", "2026-11-27", {"0": "0-15", "1": "16-31"})
    text = sb.merge([a, b])
    assert text.splitlines()[2] == ("The records differ in (the line above is the first record's): date 2026-11-27 / "
                                    "2026-11-28; --pin-cpus GPU 0 0-15, GPU 1 16-31 / GPU 0 0-31, GPU 1 32-63.")
    assert "differ in" not in sb.merge([a, c]) and "differ in" not in sb.merge([a])


def test_merge_join_pairs_a_boot_that_the_next_call_finished(tmp_path: Path, capsys) -> None:
    """``--merge A B --join``: call A's ``--budget`` cut stock's boot 1 off before any cell, and
    call B, on the same machine right after, ran it. Read apart, A's patched boot 1 has no partner
    and is left out; joined, boot 1 pairs across the records. Records that differ in what the
    servers or the client ran with, or that both hold cells of one server run, are refused in one
    line; ``--join`` goes with ``--merge`` only."""
    def doc(name: str, runs: list[dict], **config: object) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"environment": {"date": "d", "gpu": "g", "sglang": "v", "command": name,
                                                    "config": {"backend": "triton", "server_args": [],
                                                               "rounds": 4, **config}}, "runs": runs}))
        return path

    cut = {"variant": "stock", "boot": 1, "cells": {}, "error": "server not ready in time (--budget)"}
    a = doc("a.json", [_run("stock", 0, 100, 10, 1000), _run("patched", 0, 125, 8, 1000),
                       _run("patched", 1, 90, 8, 1000), cut], boots=2)
    b = doc("b.json", [_run("stock", 1, 120, 10, 1000)], boots=1)
    apart = sb.merge([a, b])
    assert "Left out, no partner in the same boot (a boot cut off by --budget): patched boot 1 conc 32" in apart
    assert "| 32 | 110.0 -> 125.0 (x0.880)" in apart
    assert sb.main(["--merge", str(a), str(b), "--join"]) == 0
    joined = capsys.readouterr().out
    assert "Left out" not in joined and "2 records joined as one run (--join" in joined
    assert "| 32 | 110.0 -> 107.5 (x1.023)" in joined
    assert "| 32 | 2 | x1.033 [" in joined  # the pairs 100 / 125 and 120 / 90: (0.8 x 4 / 3) ** 0.5
    c = doc("c.json", [_run("stock", 1, 120, 10, 1000)], boots=1, rounds=8)
    d = doc("d.json", [_run("patched", 0, 90, 8, 1000)], boots=1)
    for other, why in ((c, "differ in rounds"), (d, "patched boot 0 has cells in two records")):
        assert sb.main(["--merge", str(a), str(other), "--join"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err
    for alone in (["--join", "--out", str(tmp_path / "o")], ["--merge", str(a), "--join"]):
        with pytest.raises(SystemExit):
            sb.main(alone)
        assert "--join goes with --merge and two records or more" in capsys.readouterr().err
