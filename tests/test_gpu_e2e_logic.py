"""CPU tests of the GPU end-to-end suite's harness (scripts/gpu_e2e.py).

No GPU and no SGLang Engine: the case list, the workloads, the stock-vs-patched comparison
and the scenario driver (run against a small stand-in engine that answers like
``sglang.Engine``: greedy output = a function of the prompt, streaming, aborts)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_e2e as e2e  # noqa: E402
import gpu_smoke as smoke  # noqa: E402


# ----------------------------------------------------------------------------- cases, workloads


def test_matrix_covers_every_combination_once() -> None:
    matrix = [c for c in e2e.all_cases() if c.profile == "matrix" and c.gpus == 1]
    combos = {(c.algorithm, c.backend, c.cuda_graph, c.pcg) for c in matrix}
    assert len(matrix) == len(combos) == 16
    assert {c.profile for c in e2e.all_cases()} == {"matrix", "retract", "soak", "text", "http"}
    tp2 = [c for c in e2e.all_cases() if c.gpus == 2]
    assert {(c.algorithm, c.backend, c.pcg) for c in tp2} == {("EAGLE3", "triton", False),
                                                              ("STANDALONE", "flashinfer", True)}
    assert [c.name for c in e2e.all_cases() if c.server] == ["http-eagle3-triton-graph-nopcg"]
    assert len({c.name for c in e2e.all_cases()}) == len(e2e.all_cases())


def test_select_and_shard() -> None:
    triton = e2e.select_cases(["*-triton-*"])
    assert triton and all("-triton-" in c.name for c in triton)
    names = [c.name for c in e2e.all_cases()]
    halves = [c.name for s in ("1/2", "2/2") for c in e2e.select_cases(None, s)]
    assert sorted(halves) == sorted(names)
    assert not set(c.name for c in e2e.select_cases(None, "1/2")) & set(c.name for c in e2e.select_cases(None, "2/2"))


def test_engine_kwargs_follow_the_case(tmp_path: Path) -> None:
    case = next(c for c in e2e.all_cases() if c.name == "eagle3-flashinfer-nograph-pcg")
    kw = e2e.engine_kwargs(case, tmp_path)
    assert kw["speculative_algorithm"] == "EAGLE3" and kw["speculative_draft_model_path"].endswith("eagle3")
    assert kw["attention_backend"] == "flashinfer"
    assert kw["disable_cuda_graph"] is True and kw["disable_piecewise_cuda_graph"] is False
    assert "cuda_graph_max_bs" not in kw
    retract = next(c for c in e2e.all_cases() if c.profile == "retract")
    assert e2e.engine_kwargs(retract, tmp_path)["max_total_tokens"] == 8192
    soak = next(c for c in e2e.all_cases() if c.profile == "soak")
    assert e2e.engine_kwargs(soak, tmp_path)["enable_deterministic_inference"] is True


def test_workloads_are_deterministic_and_shaped_as_promised() -> None:
    a, b = e2e.scenarios("matrix", 4096), e2e.scenarios("matrix", 4096)
    assert a == b
    by = {s["name"]: s for s in a}
    assert [len(by[n]["input_ids"]) for n in ("bs1", "bs7", "bs48")] == [1, 7, 48]
    churn = by["churn"]
    assert max(len(p) for p in churn["input_ids"]) == 1800  # longer than chunked_prefill_size 512
    assert len({p["max_new_tokens"] for p in churn["sampling_params"]}) > 20
    assert all(3 <= t < 4096 for p in churn["input_ids"] for t in p)
    soak = {s["name"]: s for s in e2e.scenarios("soak", 4096, soak_requests=2000)}["soak"]
    assert len(soak["input_ids"]) == 2000 and soak["concurrency"] == 64
    assert 0.03 < len(soak["abort_after_chunks"]) / 2000 < 0.07


def test_stop_choices() -> None:
    out = list(range(100, 160))
    assert e2e.stop_token_choice(out, 0) == 104 and e2e.stop_token_choice(out, 3) == 119
    assert e2e.stop_token_choice([1, 2, 3], 0) is None
    assert e2e.stop_string_choice("w1 w2 w3 w4 w5 w6 w7 w8", 0) == " w4"
    assert e2e.stop_string_choice("w1 w2", 0) is None


# ----------------------------------------------------------------------------- comparison


def _rec(ids, **kw):
    return dict({"output_ids": list(ids), "finish": "length"}, **kw)


def test_compare_scenario_exact_prefix_logprob_and_errors() -> None:
    sc = {"name": "s", "kind": "batch", "sampling_params": [{"max_new_tokens": 3, "ignore_eos": True}] * 2}
    same = {"outputs": [_rec([1, 2, 3]), _rec([4, 5, 6])]}
    assert all(c.ok for c in e2e.compare_scenario(sc, same, same))
    diff = {"outputs": [_rec([1, 2, 3]), _rec([4, 9, 6])]}
    bad = [c for c in e2e.compare_scenario(sc, same, diff) if not c.ok]
    assert [c.name for c in bad] == ["s: outputs identical"] and "(1, 1)" in bad[0].detail
    short = {"outputs": [_rec([1, 2, 3]), _rec([4, 5])]}
    assert {c.name for c in e2e.compare_scenario(sc, short, short) if not c.ok} == {"s: lengths as requested"}

    asc = {"name": "a", "kind": "async", "sampling_params": [{"max_new_tokens": 5, "ignore_eos": True}] * 2}
    s = {"outputs": [_rec([1, 2, 3], abort_requested=True), _rec([1, 1, 1, 1, 1])]}
    p_ok = {"outputs": [_rec([1, 2], abort_requested=True), _rec([1, 1, 1, 1, 1])]}
    p_bad = {"outputs": [_rec([1, 7], abort_requested=True), _rec([1, 1, 1, 1, 1])]}
    assert all(c.ok for c in e2e.compare_scenario(asc, s, p_ok))
    assert not all(c.ok for c in e2e.compare_scenario(asc, s, p_bad))

    lsc = dict(sc, return_logprob=True)
    lp = {"outputs": [_rec([1, 2, 3], logprobs=[[-0.5, 1]]), _rec([4, 5, 6], logprobs=[[-0.1, 4]])]}
    lp2 = {"outputs": [_rec([1, 2, 3], logprobs=[[-0.5, 1]]), _rec([4, 5, 6], logprobs=[[-0.2, 4]])]}
    assert not next(c for c in e2e.compare_scenario(lsc, lp, lp2) if "logprobs" in c.name).ok

    err = e2e.compare_scenario(sc, {"error": "X"}, {"error": "X"})
    assert not err[0].ok and "fails alike in stock" in err[0].detail
    assert not e2e.compare_scenario(sc, None, same)[0].ok


def test_memory_growth() -> None:
    assert e2e.memory_growth([[200, 1000], [400, 1010], [600, 1004]])[0] == 10
    assert e2e.memory_growth([[200, 1000]])[0] is None
    assert e2e.memory_growth([[200, None], [400, None]])[0] is None


def _fake_run(result: dict[str, Any] | None, *, applied=(), disabled=0, sched=(11,), calls=0, rc=0, retract=0):
    log = smoke.LogFindings(applied_pids=list(applied), applied_lines=len(applied), disabled_lines=disabled)
    probe = smoke.ProbeSummary([], list(sched), calls, calls, ["settrace"])
    return {"returncode": rc, "wall_s": 1.0, "result": result, "log": log, "probe": probe, "retract_lines": retract}


def test_evaluate_case_requires_plugin_lines_probe_and_retraction() -> None:
    case = next(c for c in e2e.all_cases() if c.profile == "retract")
    scs = [{"name": "r", "kind": "batch", "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}]}]
    res = {"pid": 10, "scenarios": {"r": {"outputs": [_rec([1, 2])]}}}
    stock = _fake_run(res, disabled=2, calls=5, retract=1)
    good = _fake_run(res, applied=(10, 11), retract=3)
    assert all(c.ok for c in e2e.evaluate_case(case, scs, stock, good))
    no_retract = _fake_run(res, applied=(10, 11), retract=0)
    assert not all(c.ok for c in e2e.evaluate_case(case, scs, stock, no_retract))
    waited = _fake_run(res, applied=(10, 11), calls=1, retract=3)
    assert not all(c.ok for c in e2e.evaluate_case(case, scs, stock, waited))
    not_in_scheduler = _fake_run(res, applied=(10,), retract=3)
    assert not all(c.ok for c in e2e.evaluate_case(case, scs, stock, not_in_scheduler))


# ----------------------------------------------------------------------------- scenario driver


class FakeEngine:
    """Answers like sglang.Engine for the calls the suite makes: greedy output is a function
    of the prompt; streaming yields cumulative output_ids; abort ends a stream early."""

    def __init__(self) -> None:
        self.aborted: set[str] = set()
        self.tokenizer_manager = self

    def abort_request(self, rid: str) -> None:
        self.aborted.add(rid)

    @staticmethod
    def _continue(prompt: list[int], params: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
        out, finish = [], {"type": "length", "length": params["max_new_tokens"]}
        x = sum(prompt) % 97
        for _ in range(params["max_new_tokens"]):
            x = (x * 31 + 7) % 4093 + 3
            out.append(x)
            if not params.get("ignore_eos") and x in params.get("stop_token_ids", []):
                finish = {"type": "stop", "matched": x}
                break
        return out, finish

    def generate(self, input_ids=None, prompt=None, sampling_params=None, return_logprob=False, top_logprobs_num=0):
        outs = []
        prompts = input_ids if input_ids is not None else [[int(w[1:]) for w in t.split()] for t in prompt]
        for ids, params in zip(prompts, sampling_params):
            out, finish = self._continue(ids, params)
            text = " ".join(f"w{t}" for t in out)
            for s in params.get("stop", []):
                if s in text:
                    text = text[: text.index(s)]
                    out = [int(w[1:]) for w in text.split()]
                    finish = {"type": "stop", "matched": s}
            meta = {"finish_reason": finish, "spec_accept_length": 2.0}
            if return_logprob:
                meta["output_token_logprobs"] = [(-0.25, t, None) for t in out]
                meta["output_top_logprobs"] = [[(-0.25, t, None)] * top_logprobs_num for t in out]
            o = {"output_ids": out, "meta_info": meta}
            if prompt is not None:
                o["text"] = text
            outs.append(o)
        return outs

    async def async_generate(self, input_ids, sampling_params, stream=False, rid=None):
        out, finish = self._continue(input_ids, sampling_params)
        if not stream:
            await asyncio.sleep(0)
            return {"output_ids": out, "meta_info": {"finish_reason": finish}}

        async def gen():
            for k in range(1, len(out) + 1):
                await asyncio.sleep(0)
                if rid in self.aborted:
                    yield {"output_ids": out[: k - 1], "meta_info": {"finish_reason": {"type": "abort"}}}
                    return
                yield {"output_ids": out[:k], "meta_info": {"finish_reason": finish if k == len(out) else None}}

        return gen()


@pytest.mark.parametrize("profile", ["matrix", "soak", "text"])
def test_scenario_driver_against_a_stand_in_engine(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(e2e, "_gpu_memory_mib", lambda pids: 1000)
    asyncio.set_event_loop(asyncio.new_event_loop())
    runs = []
    for _ in range(2):  # "stock" and "patched": the same engine behaviour must compare equal
        engine, done, results = FakeEngine(), {}, {}
        for sc in e2e.scenarios(profile, 4096, soak_requests=400):
            res = e2e.run_scenario(engine, sc, done, [1])
            res["scenario"] = sc
            done[sc["name"]] = res
            results[sc["name"]] = {k: v for k, v in res.items() if k != "scenario"}
        runs.append(results)
    for sc in e2e.scenarios(profile, 4096, soak_requests=400):
        checks = e2e.compare_scenario(sc, runs[0][sc["name"]], runs[1][sc["name"]])
        assert checks and all(c.ok for c in checks), [c for c in checks if not c.ok]
    if profile == "matrix":
        stop = runs[1]["stop"]
        assert stop["stops"] and all(o["finish"] == "stop" for o in stop["outputs"])
        assert all(o["top_logprobs"] for o in runs[1]["logprob"]["outputs"])
    if profile == "soak":
        soak = runs[1]["soak"]
        aborted = [o for o in soak["outputs"] if o.get("abort_requested")]
        assert aborted and any(o["finish"] == "abort" for o in aborted)
        assert [n for n, _ in soak["memory_mib"]] == [200, 400]
    if profile == "text":
        assert all(o["finish"] == "stop" for o in runs[1]["text_stop"]["outputs"])


def test_repeat_makes_named_copies() -> None:
    cases = e2e.select_cases(["soak-*"], repeat=3)
    assert [c.name for c in cases] == ["soak-eagle3-triton-det", "soak-eagle3-triton-det~2", "soak-eagle3-triton-det~3"]
    assert len({(c.algorithm, c.backend, c.profile, c.extra) for c in cases}) == 1


def test_run_cases_shares_one_workload_per_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text('{"vocab_size": 4096}')
    seen: dict[str, Any] = {}

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config):
        seen[(case.name, mode_name)] = spec["scenarios"]
        res = {"pid": 10, "scenarios": {sc["name"]: {"outputs": []} for sc in spec["scenarios"]}}
        return _fake_run(res, applied=() if mode == "off" else (10, 11), disabled=2 if mode == "off" else 0,
                         calls=3 if mode == "off" else 0, retract=1)

    monkeypatch.setattr(e2e, "run_engine", fake_run_engine)
    cases = e2e.select_cases(["retract-*"], repeat=2)
    results = e2e.run_cases(cases, tmp_path, tmp_path, jobs=2, timeout=1, stagger_s=0, soak_requests=10)
    assert len(seen) == 4 and len({id(v) for v in seen.values()}) == 1
    assert [r.case.name for r in results] == [c.name for c in cases]
    assert all(r.passed for r in results), [c for r in results for c in r.checks if not c.ok]


# ----------------------------------------------------------------------------- GPUs, TP=2, HTTP


def test_tp2_cases_are_skipped_on_one_gpu_and_engines_spread_over_several(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text('{"vocab_size": 4096}')
    placed: dict[tuple[str, str], str] = {}

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config):
        placed[(case.name, mode_name)] = spec["cuda_visible_devices"]
        assert spec["server"] is case.server
        res = {"pid": 10, "scenarios": {sc["name"]: {"outputs": []} for sc in spec["scenarios"]}}
        return _fake_run(res, applied=() if mode == "off" else (10, 11), disabled=2 if mode == "off" else 0,
                         calls=3 if mode == "off" else 0)

    monkeypatch.setattr(e2e, "run_engine", fake_run_engine)
    cases = e2e.select_cases(["tp2-eagle3-*", "eagle3-triton-graph-nopcg"])
    one = e2e.run_cases(cases, tmp_path, tmp_path, jobs=2, timeout=1, stagger_s=0, soak_requests=10, gpu_ids=["0"])
    by = {r.case.name: r for r in one}
    assert by["tp2-eagle3-triton-graph-nopcg"].skipped == "needs 2 GPUs, 1 available"
    assert by["eagle3-triton-graph-nopcg"].passed and not by["eagle3-triton-graph-nopcg"].skipped
    assert set(placed) == {("eagle3-triton-graph-nopcg", "stock"), ("eagle3-triton-graph-nopcg", "patched")}
    report = e2e.format_report([e2e.case_summary(r) for r in one])
    assert "SKIPPED tp2-eagle3-triton-graph-nopcg" in report and report.endswith("1/1 cases, 1 skipped")

    placed.clear()
    two = e2e.run_cases(cases, tmp_path, tmp_path, jobs=4, timeout=1, stagger_s=0, soak_requests=10,
                        gpu_ids=["2", "5"])
    assert not any(r.skipped for r in two)
    assert placed[("tp2-eagle3-triton-graph-nopcg", "stock")] == "2,5"
    single = sorted(v for (name, _), v in placed.items() if not name.startswith("tp2"))
    assert single == ["2", "5"]  # stock and patched of the 1-GPU case on different GPUs


def test_server_argv_turns_engine_kwargs_into_flags(tmp_path: Path) -> None:
    case = next(c for c in e2e.all_cases() if c.server)
    argv = e2e.server_argv(e2e.engine_kwargs(case, tmp_path), 31000)
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert "--disable-piecewise-cuda-graph" in argv and "--disable-cuda-graph" not in argv
    assert "--skip-tokenizer-init" not in argv  # the http case needs the tokenizer
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "31000"]


class _StandInServer:
    """A loopback HTTP server answering /v1/completions (plain and SSE) and /generate the
    way sglang.launch_server does, with FakeEngine's greedy continuation."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        engine = FakeEngine()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/generate":
                    ids = req.get("input_ids") or [int(w[1:]) for w in req["text"].split()]
                    o = engine.generate(input_ids=[ids], sampling_params=[req["sampling_params"]],
                                        return_logprob=req.get("return_logprob", False),
                                        top_logprobs_num=req.get("top_logprobs_num", 0))[0]
                    self._send(json.dumps(o).encode())
                    return
                params = {"max_new_tokens": req["max_tokens"], "ignore_eos": req["ignore_eos"],
                          "stop": req.get("stop", [])}
                o = engine.generate(prompt=[req["prompt"]], sampling_params=[params])[0]
                finish = "length" if o["meta_info"]["finish_reason"]["type"] == "length" else "stop"
                usage = {"completion_tokens": len(o["output_ids"])}
                if not req["stream"]:
                    self._send(json.dumps({"choices": [{"text": o["text"], "finish_reason": finish}],
                                           "usage": usage}).encode())
                    return
                words = o["text"].split(" ")
                events = [{"choices": [{"text": (" " if k else "") + w, "finish_reason": None}]}
                          for k, w in enumerate(words)]
                events[-1]["choices"][0]["finish_reason"] = finish
                events.append({"choices": [], "usage": usage})
                body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                self._send(body.encode(), "text/event-stream")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_http_scenarios_against_a_stand_in_server() -> None:
    server = _StandInServer()
    try:
        runs = []
        for _ in range(2):
            done, results = {}, {}
            for sc in e2e.scenarios("http", 4096):
                res = e2e.run_http_scenario(server.base, "tiny", sc, done)
                res["scenario"] = sc
                done[sc["name"]] = res
                results[sc["name"]] = {k: v for k, v in res.items() if k != "scenario"}
            runs.append(results)
    finally:
        server.close()
    for sc in e2e.scenarios("http", 4096):
        checks = e2e.compare_scenario(sc, runs[0][sc["name"]], runs[1][sc["name"]])
        assert checks and all(c.ok for c in checks), [c for c in checks if not c.ok]
    patched = runs[1]
    assert all(o["n_tokens"] == p["max_new_tokens"] and o["text"] for o, p in
               zip(patched["completions"]["outputs"], e2e.scenarios("http", 4096)[0]["sampling_params"]))
    assert all(o["chunks"] > 1 for o in patched["completions_stream"]["outputs"])
    assert patched["completions_stop"]["stops"] and all(
        o["finish"] == "stop" for o in patched["completions_stop"]["outputs"])
    assert all(o["logprobs"] and o["output_ids"] for o in patched["generate_ids"]["outputs"])
    # A difference in one streamed text is caught.
    bad = {k: (dict(v, outputs=[dict(o) for o in v["outputs"]]) if k == "completions_stream" else v)
           for k, v in patched.items()}
    bad["completions_stream"]["outputs"][0]["text"] += " w9"
    sc = e2e.scenarios("http", 4096)[1]
    assert not all(c.ok for c in e2e.compare_scenario(sc, runs[0]["completions_stream"], bad["completions_stream"]))


def test_a_mismatch_counts_only_where_stock_reproduces_itself() -> None:
    sc = {"name": "bs7", "kind": "batch", "sampling_params": [e2e._greedy(3)] * 3}
    s1 = [_rec([5, 6, 7]), _rec([8, 9, 10]), _rec([1, 2, 3])]
    s2 = [_rec([5, 6, 7]), _rec([8, 9, 11]), _rec([1, 2, 3])]  # stock flips request 1 by itself

    def run(outs):
        return {"returncode": 0, "result": {"scenarios": {"bs7": {"outputs": outs}}}}

    def verdict(patched_outs):
        checks = e2e.compare_scenario(sc, {"outputs": s1}, {"outputs": patched_outs})
        return e2e.adjudicate([sc], checks, run(s1), run(s2), run(patched_outs))

    # patched = the second stock run's output for the unstable request: pass, with a note
    ok = verdict([_rec([5, 6, 7]), _rec([8, 9, 11]), _rec([1, 2, 3])])
    assert all(c.ok for c in ok) and any(c.name == "bs7: patched outputs match a stock run" for c in ok)
    assert ok[0].detail.startswith("[stock itself not reproducible")
    # patched differs where stock reproduces itself (request 2): a failure
    bad = verdict([_rec([5, 6, 7]), _rec([8, 9, 10]), _rec([1, 2, 4])])
    assert not all(c.ok for c in bad)
    assert "matches neither on [2]" in next(c.detail for c in bad if c.name.endswith("match a stock run"))
    # stock reproducible everywhere: a patched difference stays a failure
    stable = e2e.adjudicate([sc], e2e.compare_scenario(sc, {"outputs": s1}, {"outputs": s2}), run(s1), run(s1),
                            run(s2))
    assert not all(c.ok for c in stable)
    # the detail names the first differing request and shows the tokens around the split
    detail = e2e.compare_scenario(sc, {"outputs": s1}, {"outputs": s2})[0].detail
    assert "request 1: stock 3 tokens" in detail and "[8, 9, 10]" in detail and "[8, 9, 11]" in detail


def test_run_cases_reruns_stock_once_on_a_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text('{"vocab_size": 4096}')
    calls: list[str] = []

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config):
        calls.append(mode_name)
        sc = spec["scenarios"][0]
        n = len(sc["input_ids"])
        outs = [_rec([7] * 300) for _ in range(n)]
        if mode_name in ("patched", "stock-rerun"):
            outs[3] = _rec([7] * 299 + [8])  # the second stock run agrees with patched
        res = {"pid": 10, "scenarios": {sc["name"]: {"outputs": outs}}}
        return _fake_run(res, applied=() if mode == "off" else (10, 11), disabled=2 if mode == "off" else 0,
                         calls=3 if mode == "off" else 0, retract=1)

    monkeypatch.setattr(e2e, "run_engine", fake_run_engine)
    (r,) = e2e.run_cases(e2e.select_cases(["retract-*"]), tmp_path, tmp_path, jobs=2, timeout=1, stagger_s=0,
                         soak_requests=10)
    assert sorted(calls) == ["patched", "stock", "stock-rerun"]
    assert r.passed and "stock-rerun" in r.runs
    record = e2e.merge_record_from_docs([{"environment": {"date": "2026-11-22", "command": "x", "wall_s": 1},
                                          "cases": [e2e.case_summary(r)]}])
    assert "passed on a second stock run" in record


def test_server_port_leaves_room_for_sglangs_derived_grpc_port() -> None:
    import random

    rng = random.Random(3)
    ports = {e2e._free_port(rng) for _ in range(20)}
    assert all(20000 <= p < 45000 and p + 10000 <= 65535 for p in ports) and len(ports) > 1
