"""CPU tests of the GPU end-to-end suite's harness (scripts/gpu_e2e.py).

No GPU and no SGLang Engine: the case list, the workloads, the stock-vs-patched comparison
and the scenario driver (run against a small stand-in engine that answers like
``sglang.Engine``: greedy output = a function of the prompt, streaming, aborts)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_e2e as e2e  # noqa: E402
from gpu_harness import child_env, launch, logs, model_factory, port_blocks  # noqa: E402


@pytest.fixture(autouse=True)
def _no_fa3_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_cases asks whether FA3 imports unless told: here it is told, or finds "no"."""
    monkeypatch.setenv(child_env.FA3_ENV, "0")


# ----------------------------------------------------------------------------- cases, workloads


def test_matrix_covers_every_combination_once() -> None:
    matrix = e2e.select_cases(None, groups=["matrix"])
    combos = {(c.algorithm, c.backend, c.cuda_graph, c.pcg) for c in matrix}
    assert len(matrix) == len(combos) == 16 and all(c.profile == "matrix" and c.gpus == 1 for c in matrix)
    assert {"matrix", "retract", "soak", "text", "http", "eos", "radix", "seeded", "pd"} <= {
        c.profile for c in e2e.all_cases()}
    tp2 = [c for c in e2e.all_cases() if dict(c.extra).get("tp_size") == 2]
    assert {(c.algorithm, c.backend, c.pcg) for c in tp2} == {("EAGLE3", "triton", False),
                                                              ("STANDALONE", "flashinfer", True),
                                                              ("STANDALONE", "default", True)}
    assert [c.name for c in e2e.all_cases() if c.server] == ["http-eagle3-triton-graph-nopcg",
                                                               "intake-http-eagle3-triton-graph-nopcg",
                                                               "tree-auto-eagle3-http-default"]
    assert len({c.name for c in e2e.all_cases()}) == len(e2e.all_cases())


def test_intake_group_runs_back_port_19_on_against_stock() -> None:
    """The ``intake`` group: back-port 19 switched on explicitly in both runs (stock ignores it), on the
    matrix workload and on HTTP arrivals under deterministic inference, judged token for token."""
    from sglang_futuremap_patch.backports import early_intake

    cases = e2e.select_cases(None, groups=["intake"])
    assert [c.name for c in cases] == ["intake-eagle3-triton-graph-nopcg", "intake-http-eagle3-triton-graph-nopcg"]
    assert all(dict(c.env) == {early_intake.EARLY_INTAKE_ENV: "1"} and not c.batch_variant for c in cases)
    assert [c.profile for c in cases] == ["matrix", "http"]
    env = e2e.with_case_env({"SGLANG_FUTUREMAP_PATCH": "off"}, cases[0])
    assert env == {"SGLANG_FUTUREMAP_PATCH": "off", early_intake.EARLY_INTAKE_ENV: "1"}


def test_fihost_group_runs_back_port_20_on_against_stock() -> None:
    """The ``fihost`` group: back-port 20 switched on explicitly in both runs (stock ignores it), the matrix
    workload on FlashInfer with and without piecewise CUDA graph, judged token for token."""
    from sglang_futuremap_patch.backports import flashinfer_host_prefix_sum as fihost

    cases = e2e.select_cases(None, groups=["fihost"])
    assert [(c.name, c.backend, c.pcg, c.profile) for c in cases] == [
        ("fihost-eagle3-flashinfer-graph-nopcg", "flashinfer", False, "matrix"),
        ("fihost-standalone-flashinfer-graph-pcg", "flashinfer", True, "matrix")]
    assert all(dict(c.env) == {fihost.HOST_PREFIX_SUM_ENV: "1"} and not c.batch_variant for c in cases)
    assert not any(c.needs_fa3 for c in cases)


def test_fiplan_group_runs_back_port_23_with_its_check_on_flashinfer() -> None:
    """The ``fiplan`` group: back-port 23 switched on with its check (the device indptrs read back and
    compared at every plan; a difference stops the patched Engine) on FlashInfer, judged token for token."""
    from sglang_futuremap_patch.backports import flashinfer_host_indptr as fiplan

    cases = e2e.select_cases(None, groups=["fiplan"])
    assert [(c.name, c.cuda_graph, c.pcg, c.profile) for c in cases] == [
        ("fiplan-matrix-eagle3-flashinfer-graph-nopcg", True, False, "matrix"),
        ("fiplan-matrix-standalone-flashinfer-graph-pcg", True, True, "matrix"),
        ("fiplan-matrix-standalone-flashinfer-nograph-nopcg", False, False, "matrix"),
        ("fiplan-radix-eagle3-flashinfer-graph-nopcg", True, False, "radix"),
        ("fiplan-eos-standalone-flashinfer-graph-pcg", True, True, "eos")]
    assert all(dict(c.env) == {fiplan.HOST_INDPTR_ENV: "1", fiplan.HOST_INDPTR_CHECK_ENV: "1"}
               and c.backend == "flashinfer" and not c.needs_fa3 for c in cases)


def test_mrelay_group_runs_back_port_22_on_mirrored_backends() -> None:
    """The ``mrelay`` group: back-port 22 switched on (stock ignores it). FlashInfer chains are judged
    token for token against stock; the FA3 tree on spec v2 as the ``treev2`` cases are, with the tree
    switch as they have it."""
    from sglang_futuremap_patch.backports import mirror_relay_lens

    cases = e2e.select_cases(None, groups=["mrelay"])
    assert [(c.name, c.backend, c.pcg, c.profile, c.tree_v2) for c in cases] == [
        ("mrelay-eagle3-flashinfer-graph-nopcg", "flashinfer", False, "matrix", False),
        ("mrelay-standalone-flashinfer-graph-pcg", "flashinfer", True, "matrix", False),
        ("mrelay-treev2-standalone-fa3-5x4x8-graph-pcg", "fa3", True, "tree", True),
        ("mrelay-treev2-auto-eagle3-default", "default", True, "tree", True)]
    for c in cases:
        assert dict(c.env)[mirror_relay_lens.MIRROR_RELAY_ENV] == "1"
    assert [dict(c.env) for c in cases[2:]] == [
        dict(e2e._TREE_V2["env"]) | {mirror_relay_lens.MIRROR_RELAY_ENV: "1"}] * 2
    assert [c.needs_fa3 for c in cases] == [False, False, True, True]


def test_released_group_launches_decodes_holding_released_requests() -> None:
    """The ``released`` group: grammar requests (SGLang processes the last result before each
    such spec-v2 decode), on the default configuration, FlashInfer and Triton, and back-port 16's
    opt-in, which does the same after a small prefill; the tokenizer is on (grammars need it)."""
    from sglang_futuremap_patch.backports import mirror_relay_lens, prefill_result_first

    cases = e2e.select_cases(None, groups=["released"])
    assert [(c.name, c.backend, c.profile) for c in cases] == [
        ("grammar-eagle3-default", "default", "grammar"),
        ("grammar-standalone-flashinfer-graph-pcg", "flashinfer", "grammar"),
        ("grammar-eagle3-triton-graph-nopcg", "triton", "grammar"),
        ("pfirst-eagle3-default", "default", "grammar"),
        ("pfirst-standalone-flashinfer-graph-pcg", "flashinfer", "grammar"),
        ("pfirst-treev2-standalone-fa3-5x4x8-graph-pcg", "fa3", "tree")]
    assert all(dict(c.extra)["skip_tokenizer_init"] is False and dict(c.extra)["grammar_backend"] == "xgrammar"
               for c in cases[:5])
    both = {prefill_result_first.PREFILL_RESULT_FIRST_ENV: "1", mirror_relay_lens.MIRROR_RELAY_ENV: "1"}
    assert [dict(c.env) for c in cases] == [{}, {}, {}, {prefill_result_first.PREFILL_RESULT_FIRST_ENV: "1"}, both,
                                            dict(e2e._TREE_V2["env"]) | both]
    assert cases[5].tree_v2 and not any(c.tree_v2 for c in cases[:5])
    scs = {sc["name"]: sc for sc in e2e.scenarios("grammar", 1000)}
    mixed = scs["grammar_mixed"]["sampling_params"]
    # Half under the grammar, some finishing at their prefill, the rest at different steps.
    assert sum("regex" in p for p in mixed) == 20 and sum(p["max_new_tokens"] == 1 for p in mixed) == 5
    assert len({p["max_new_tokens"] for p in mixed}) > 10
    assert all(p["regex"] == e2e.ANY_TEXT_REGEX for p in scs["grammar_all"]["sampling_params"])
    assert scs["one_token_idle"]["sampling_params"] == [e2e._greedy(1)]
    import re

    assert re.fullmatch(e2e.ANY_TEXT_REGEX, "w5 w7\n w9") is not None


def test_groups_split_the_suite_and_the_fa3_set_covers_what_was_asked() -> None:
    base, fa3 = e2e.select_cases(None, groups=["base"]), e2e.select_cases(None, groups=["fa3"])
    every = {c.name for c in e2e.select_cases(None, groups=sorted(e2e.GROUPS))}
    assert every == {c.name for c in e2e.all_cases()}  # every case is in some group
    assert not {c.name for c in base} & {c.name for c in fa3}
    assert not any(c.needs_fa3 for c in base)
    by = {c.name: c for c in fa3}
    assert {n for n in by if n.startswith("default-")} == {"default-standalone", "default-eagle3"}
    assert all(by[n].backend == "default" and by[n].pcg for n in ("default-standalone", "default-eagle3"))
    fa3_matrix = {(c.algorithm, c.cuda_graph, c.pcg) for c in fa3 if c.name.startswith("fa3-")}
    assert {("STANDALONE", g, p) for g in (True, False) for p in (True, False)} | {("EAGLE3", True, True)} == fa3_matrix
    assert {by[n].backend for n in by if n.startswith("page16-")} == {"triton", "fa3"}
    assert all(dict(by[n].extra)["page_size"] == 16 for n in by if n.startswith("page16-"))
    assert {by[n].profile for n in by if n[:n.index("-")] in ("eos", "radix", "seeded")} == {"eos", "radix", "seeded"}
    assert all(dict(by[n].extra)["enable_deterministic_inference"] for n in by if n.startswith("seeded-"))
    # patterns and groups together: their union, in suite order
    both = e2e.select_cases(["retract-*"], groups=["fa3"])
    assert [c.name for c in both] == ["retract-standalone-triton"] + [c.name for c in fa3]
    with pytest.raises(ValueError):
        e2e.select_cases(None, groups=["nope"])


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
    assert "cuda_graph_max_bs" not in kw and kw["piecewise_cuda_graph_max_tokens"] == 512
    retract = next(c for c in e2e.all_cases() if c.profile == "retract")
    kw = e2e.engine_kwargs(retract, tmp_path)
    assert kw["max_total_tokens"] == 8192 and kw["max_running_requests"] == 64 and kw["chunked_prefill_size"] == 512
    soak = next(c for c in e2e.all_cases() if c.profile == "soak")
    assert e2e.engine_kwargs(soak, tmp_path)["enable_deterministic_inference"] is True
    # SGLang's own configuration: neither an attention backend nor a piecewise CUDA graph switch
    default = e2e.engine_kwargs(next(c for c in e2e.all_cases() if c.name == "default-eagle3"), tmp_path)
    assert "attention_backend" not in default and "disable_piecewise_cuda_graph" not in default
    assert default["cuda_graph_max_bs"] == 64 and default["piecewise_cuda_graph_max_tokens"] == 512
    fa3 = e2e.engine_kwargs(next(c for c in e2e.all_cases() if c.name == "fa3-standalone-graph-nopcg"), tmp_path)
    assert fa3["attention_backend"] == "fa3" and fa3["disable_piecewise_cuda_graph"] is True
    assert e2e.engine_kwargs(next(c for c in e2e.all_cases() if c.name == "page16-standalone-fa3"),
                             tmp_path)["page_size"] == 16


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


def _fake_run(result: dict[str, Any] | None, *, applied=(), disabled=0, sched=(11,), calls=0, rc=0, retract=0,
              error=None):
    log = logs.LogFindings(applied_pids=list(applied), applied_lines=len(applied), disabled_lines=disabled)
    probe = logs.ProbeSummary([], list(sched), calls, calls, ["settrace"])
    return {"returncode": rc, "wall_s": 1.0, "result": result, "log": log, "probe": probe, "retract_lines": retract,
            "error": error, "log_tail": "boom" if error else None}


def _side(mode: str, res: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
    """A stand-in run_engine's answer for a healthy stock (off) or patched Engine."""
    off = mode == "off"
    return _fake_run(res, applied=() if off else (10, 11), disabled=2 if off else 0, calls=3 if off else 0, **kw)


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

    EOS = 2

    def __init__(self) -> None:
        self.aborted: set[str] = set()
        self.tokenizer_manager = self
        self.cache: list[list[int]] = []  # prompts seen: the "radix cache"

    def abort_request(self, rid: str) -> None:
        self.aborted.add(rid)

    @staticmethod
    def _continue(prompt: list[int], params: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
        out, finish = [], {"type": "length", "length": params["max_new_tokens"]}
        x = sum(prompt) % 97
        for _ in range(params["max_new_tokens"]):
            x = (x * 31 + 7) % 4093 + 3
            t = FakeEngine.EOS if x % 211 == 7 else x  # EOS now and then, as the tiny models emit it
            out.append(t)
            if len(out) < params["max_new_tokens"] and not params.get("ignore_eos") and (
                    t == FakeEngine.EOS or t in params.get("stop_token_ids", [])):
                finish = {"type": "stop", "matched": t}
                break
        return out, finish

    def _cached(self, prompt: list[int]) -> int:
        best = 0
        for seen in self.cache:
            n = next((k for k, (a, b) in enumerate(zip(seen, prompt)) if a != b), min(len(seen), len(prompt)))
            best = max(best, min(n, len(prompt) - 1))
        return best

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
            meta = {"finish_reason": finish, "spec_accept_length": 2.0, "cached_tokens": self._cached(ids)}
            if return_logprob:
                meta["output_token_logprobs"] = [(-0.25, t, None) for t in out]
                meta["output_top_logprobs"] = [[(-0.25, t, None)] * top_logprobs_num for t in out]
            o = {"output_ids": out, "meta_info": meta}
            if prompt is not None:
                o["text"] = text
            outs.append(o)
        self.cache.extend(prompts)
        return outs

    async def async_generate(self, input_ids, sampling_params, stream=False, rid=None, return_logprob=False,
                             top_logprobs_num=0):
        out, finish = self._continue(input_ids, sampling_params)
        if not stream:
            await asyncio.sleep(0)
            meta = {"finish_reason": finish}
            if return_logprob:
                meta["output_token_logprobs"] = [(-0.25, t, None) for t in out]
                meta["output_top_logprobs"] = [[(-0.25, t, None)] * top_logprobs_num for t in out]
            return {"output_ids": out, "meta_info": meta}

        async def gen():
            for k in range(1, len(out) + 1):
                await asyncio.sleep(0)
                if rid in self.aborted:
                    yield {"output_ids": out[: k - 1], "meta_info": {"finish_reason": {"type": "abort"}}}
                    return
                yield {"output_ids": out[:k], "meta_info": {"finish_reason": finish if k == len(out) else None}}

        return gen()


@pytest.mark.parametrize("profile", ["matrix", "soak", "soak-ties", "text", "eos", "radix", "seeded"])
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
    if profile == "soak-ties":  # the logprobs are asked for and come back
        done = [o for o in runs[1]["soak"]["outputs"] if not o.get("abort_requested")]
        assert done and all(len(o["top_logprobs"]) == len(o["output_ids"]) for o in done)
    if profile in e2e.SOAK_PROFILES:
        soak = runs[1]["soak"]
        aborted = [o for o in soak["outputs"] if o.get("abort_requested")]
        assert aborted and any(o["finish"] == "abort" for o in aborted)
        assert [n for n, _ in soak["memory_mib"]] == [200, 400]
    if profile == "text":
        assert all(o["finish"] == "stop" for o in runs[1]["text_stop"]["outputs"])
    if profile == "eos":
        search, churn = runs[1]["eos_search"], runs[1]["eos_churn"]
        assert len(search["found"]) >= e2e.EOS_WANTED and len(search["outputs"]) < e2e.EOS_ROUND * e2e.EOS_MAX_ROUNDS
        fc = churn["finish_counts"]
        assert fc["eos"] == len(search["found"]) and fc["stop"] > 0 and fc["length"] > 0
        assert sum(fc.values()) > 56  # more than may run at once: requests join as others finish
        assert sum(fc.values()) == len(churn["outputs"]) == len(churn["stops"])
    if profile == "radix":
        assert all(o["cached"] >= e2e.RADIX_PREFIX for o in runs[1]["radix_round2"]["outputs"])
    if profile == "seeded":
        params = [p for sc in e2e.scenarios("seeded", 4096) for p in sc["sampling_params"]]
        assert all(p["temperature"] == 0.8 and p["top_p"] == 0.9 for p in params)
        assert len({p["sampling_seed"] for p in params if p["max_new_tokens"] == 64}) == 7


def test_repeat_makes_named_copies() -> None:
    cases = e2e.select_cases(["soak-*"], repeat=3)
    assert [c.name for c in cases] == ["soak-eagle3-triton-det", "soak-eagle3-triton-det~2", "soak-eagle3-triton-det~3"]
    assert len({(c.algorithm, c.backend, c.profile, c.extra) for c in cases}) == 1


def test_run_cases_shares_one_workload_per_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text('{"vocab_size": 4096}')
    seen: dict[str, Any] = {}

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config, site=None):
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

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config, site=None):
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
    assert "SKIPPED tp2-eagle3-triton-graph-nopcg" in report and report.endswith("1/1 cases passed, 1 skipped")

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
    greedy = {"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True}
    sc = {"name": "bs7", "kind": "batch", "sampling_params": [greedy] * 3}
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

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config, site=None):
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


# ----------------------------------------------------------------------------- ports, harness errors, FA3


def _models(tmp_path: Path) -> Path:
    (tmp_path / "target").mkdir(parents=True, exist_ok=True)
    (tmp_path / "target" / "config.json").write_text('{"vocab_size": 4096, "eos_token_id": 2}')
    return tmp_path


def test_every_engine_of_a_run_gets_ports_no_other_engine_uses(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config, site=None):
        seen[(case.name, mode_name)] = (spec["engine_kwargs"], spec["ports"])
        res = {"pid": 10, "scenarios": {sc["name"]: {"outputs": []} for sc in spec["scenarios"]}}
        if case.profile == "retract":
            outs = [_rec([7] * 300) for _ in spec["scenarios"][0]["input_ids"]]
            if mode_name == "patched":
                outs[0] = _rec([7] * 299 + [8])  # a mismatch: the stock rerun needs ports of its own too
            res["scenarios"]["retract"]["outputs"] = outs
        return _side(mode, res, retract=1)

    monkeypatch.setattr(e2e, "run_engine", fake_run_engine)
    cases = e2e.select_cases(["retract-*", "eagle3-triton-*", "http-*"])
    e2e.run_cases(cases, _models(tmp_path), tmp_path, jobs=6, timeout=1, stagger_s=0, soak_requests=10, fa3=True)
    assert ("retract-standalone-triton", "stock-rerun") in seen and len(seen) == 2 * len(cases) + 1
    blocks = []
    for (name, mode), (kw, ports) in seen.items():
        assert (kw["port"], kw["nccl_port"]) == (ports["port"], ports["nccl_port"]), (name, mode)
        blocks.append(set(range(ports["base"], ports["base"] + port_blocks.PORT_BLOCK)))
        assert {kw["port"], kw["nccl_port"], ports["sglang_port"]} <= blocks[-1]
    assert sum(len(b) for b in blocks) == len(set().union(*blocks))  # pairwise disjoint
    http = seen[("http-eagle3-triton-graph-nopcg", "stock")][0]
    argv = e2e.server_argv(http, http["port"])
    assert argv.count("--port") == 1 and argv[-1] == str(http["port"]) and "--nccl-port" in argv
    assert http["port"] + port_blocks.GRPC_OFFSET <= 65535  # SGLang checks its derived gRPC port at start-up


def test_an_engine_that_did_not_start_is_a_harness_error_not_a_mismatch(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The real run_engine, with a stand-in for the worker process: the patched Engine of one
    case dies at start (EADDRINUSE), that of another after its first scenario."""
    def fake_worker(script, spec, work, name, log_path, env, timeout, **kw):
        names = [sc["name"] for sc in spec["scenarios"]]
        full = {"pid": 10, "startup_s": 1.0, "scenarios": {n: {"outputs": [_rec([5, 6])]} for n in names}}
        if name == "retract-standalone-triton-patched":
            return 1, 3.0, None, "Traceback...\ntorch.distributed.DistStoreError: EADDRINUSE\n"
        if name == "eagle3-triton-graph-nopcg-patched":
            part = dict(full, scenarios={names[0]: full["scenarios"][names[0]]})
            return -9, 30.0, part, f"scenario bs1: ok\n[gpu_e2e] {name} {launch.KILLED_AT_LIMIT} 30 s\n"
        return 0, 5.0, full, ""

    monkeypatch.setattr(launch, "run_worker", fake_worker)
    cases = e2e.select_cases(["retract-*", "eagle3-triton-graph-nopcg", "eagle3-triton-graph-pcg"])
    results = e2e.run_cases(cases, _models(tmp_path), tmp_path, jobs=4, timeout=1, stagger_s=0, soak_requests=10,
                            fa3=True)
    by = {r.case.name: r for r in results}
    dead, killed = by["retract-standalone-triton"], by["eagle3-triton-graph-nopcg"]
    assert dead.status == "error" and not dead.checks and "stock-rerun" not in dead.runs
    assert dead.errors == {"patched": "exit status 1; no result"}
    assert killed.status == "error" and killed.errors["patched"].startswith("killed at the time limit; stopped before 'bs7'")
    assert by["eagle3-triton-graph-pcg"].status != "error"  # both ran to the end: judged on its checks
    summaries = [e2e.case_summary(r) for r in results]
    report = e2e.format_report(summaries, fa3=False)
    assert report.startswith(child_env.fa3_line(False))
    assert "ERROR   retract-standalone-triton: harness error, no comparison made" in report
    assert "      | torch.distributed.DistStoreError: EADDRINUSE" in report
    assert "outputs identical" not in report.split("ERROR   eagle3-triton-graph-nopcg")[1].split("\n")[1]
    assert "2 harness errors (an Engine did not run to the end)" in report.splitlines()[-1]
    record = e2e.merge_record_from_docs([{"environment": {"date": "2026-11-23", "command": "x", "wall_s": 1,
                                                          "fa3": False}, "cases": summaries}])
    assert "| retract-standalone-triton | **ERROR** |" in record and "harness error: patched: exit status 1" in record
    assert "2 harness errors" in record and "| FA3 | no |" in record


def test_cases_that_need_fa3_are_skipped_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config, site=None):
        ran.append(case.name)
        res = {"pid": 10, "scenarios": {sc["name"]: {"outputs": []} for sc in spec["scenarios"]}}
        return _side(mode, res)

    monkeypatch.setattr(e2e, "run_engine", fake_run_engine)
    cases = e2e.select_cases(["default-*", "page16-*", "fa3-eagle3-*"])
    results = e2e.run_cases(cases, _models(tmp_path), tmp_path, jobs=2, timeout=1, stagger_s=0, soak_requests=10,
                            fa3=False)
    assert set(ran) == {"page16-eagle3-triton"}
    skipped = {r.case.name: r.skipped for r in results if r.status == "skipped"}
    assert set(skipped) == {"default-standalone", "default-eagle3", "page16-standalone-fa3", "fa3-eagle3-graph-pcg"}
    assert all(why.startswith(child_env.NO_FA3) for why in skipped.values())
    report = e2e.format_report([e2e.case_summary(r) for r in results], fa3=False)
    assert report.endswith("1/1 cases passed, 4 skipped (4 for no FA3)")
    monkeypatch.setenv(child_env.FA3_ENV, "1")
    assert child_env.fa3_available() is True
    monkeypatch.setenv(child_env.FA3_ENV, "0")
    assert child_env.fa3_available() is False


def test_finish_kinds_and_the_eos_churn_request_mix() -> None:
    assert e2e.finish_kind({"finish": "stop", "matched": 2}, [2]) == "eos"
    assert e2e.finish_kind({"finish": "stop", "matched": 77}, [2]) == "stop"
    assert e2e.finish_kind({"finish": "length"}, [2]) == "length"
    assert e2e.finish_counts([_rec([1]), {"output_ids": [2], "finish": "stop", "matched": 2}, None], [2]) == {
        "length": 1, "eos": 1}
    sc = {"name": "eos_churn", "kind": "eos_churn", "source": "eos_search", "stop_requests": 3, "length_requests": 4,
          "seed": 1}
    outs = [list(range(10 + k, 90 + k)) for k in range(10)]
    outs[4][30] = 2
    search = {"scenario": {"max_new_tokens": 80, "eos_ids": [2]}, "found": [4], "prompts": [[k] for k in range(10)],
              "outputs": [{"output_ids": o} for o in outs]}
    prompts, params, stops = e2e.eos_churn_requests(sc, search)
    assert sorted(p[0] for p in prompts) == list(range(8))  # the EOS one, 3 stop, 4 length
    by = {p[0]: (q, st) for p, q, st in zip(prompts, params, stops)}
    assert by[4] == ({"temperature": 0.0, "max_new_tokens": 80, "ignore_eos": False}, None)
    assert [by[k][1] for k in (0, 1, 2)] == [outs[0][4], outs[1][9], outs[2][14]]
    assert all(by[k][0]["max_new_tokens"] < 80 and by[k][1] is None for k in (3, 5, 6, 7))
    assert prompts == e2e.eos_churn_requests(sc, search)[0]  # a fixed order


def test_radix_and_eos_checks() -> None:
    r2 = next(sc for sc in e2e.scenarios("radix", 4096) if sc["name"] == "radix_round2")
    assert all(len(p) > e2e.RADIX_PREFIX for p in r2["input_ids"]) and r2["expect_cached"]
    assert len({tuple(p[:e2e.RADIX_PREFIX]) for p in r2["input_ids"]}) == 1
    hit = {"outputs": [dict(_rec([1, 2]), cached=1500)] * len(r2["input_ids"])}
    miss = {"outputs": [dict(_rec([1, 2]), cached=0)] + hit["outputs"][1:]}
    r2 = dict(r2, sampling_params=[{"max_new_tokens": 2, "ignore_eos": True}] * len(r2["input_ids"]))
    assert all(c.ok for c in e2e.compare_scenario(r2, hit, hit))
    bad = [c for c in e2e.compare_scenario(r2, hit, miss) if not c.ok]
    assert [c.name for c in bad] == ["radix_round2: prefix served from the radix cache"]
    search = next(sc for sc in e2e.scenarios("eos", 4096) if sc["kind"] == "eos_search")
    none = {"outputs": [_rec([5])], "found": []}
    (check,) = [c for c in e2e.compare_scenario(search, none, none) if "EOS" in c.name]
    assert not check.ok and "outputs holding EOS [2]: {'stock': 0, 'patched': 0} of 1 requests" in check.detail


def test_main_writes_the_record_after_every_case_and_says_whether_fa3_was_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_worker(script, spec, work, name, log_path, env, timeout, **kw):
        log_path.write_text("engine log\n")
        sc = spec["scenarios"][0]
        outs = [_rec([7] * p["max_new_tokens"]) for p in sc["sampling_params"]]
        return 0, 1.0, {"pid": 10, "startup_s": 1.0, "scenarios": {sc["name"]: {"outputs": outs}}}, ""

    monkeypatch.setattr(launch, "run_worker", fake_worker)
    models, out = _models(tmp_path / "m"), tmp_path / "out"
    seen: list[int] = []
    cases = e2e.select_cases(["retract-*", "default-*"])
    e2e.run_cases(cases, models, tmp_path, jobs=1, timeout=1, stagger_s=0, soak_requests=10, fa3=False,
                  on_result=lambda rs: seen.append(len(rs)))
    assert seen == [1, 2, 3]
    rc = e2e.main(["--models", str(models), "--cases", "retract-*", "default-*", "--out", str(out), "--jobs", "2",
                   "--stagger", "0"])
    doc = json.loads((out / "e2e-all.json").read_text())
    assert doc["fa3"] is False and doc["environment"]["fa3"] is False and doc["partial"] is False
    assert [c["status"] for c in doc["cases"]] == ["failed", "skipped", "skipped"]  # the stand-in logs no plugin lines
    report = (out / "e2e-all.txt").read_text()
    assert report.startswith("FA3: not installed") and "2 skipped (2 for no FA3)" in report and rc == 1
    assert (out / "logs-all.tar.gz").exists()
    assert doc["environment"]["command"] == (
        "python3 scripts/gpu_e2e.py --models MODELS --cases 'retract-*' 'default-*' --out OUT --jobs 2 --stagger 0")


# ----------------------------------------------------------------------------- deployments


def test_deployment_cases_tp2_default_dp2_and_pd_decode(tmp_path: Path) -> None:
    by = {c.name: c for c in e2e.select_cases(None, groups=["multi", "pd"])}
    assert {n for n in by if n.startswith("dp2-")} == {"dp2-standalone-triton-graph-nopcg", "dp2-default-eagle3"}
    assert "tp2-default-standalone" in by and by["tp2-default-standalone"].needs_fa3
    assert all(by[n].gpus == 2 for n in by if n.startswith(("tp2-", "dp2-")))
    pd = [c for c in by.values() if c.pd_decode]
    assert {c.name for c in pd} == {n for n in by if n.startswith("pd-")} and len(pd) == 4
    assert {(c.algorithm, c.backend, c.cuda_graph) for c in pd} == {
        ("EAGLE3", "triton", True), ("EAGLE3", "fa3", True), ("EAGLE3", "fa3", False), ("EAGLE", "fa3", True)}
    base = {c.name for c in e2e.select_cases(None, groups=["base"])}
    assert "tp2-default-standalone" not in base and not any(c.needs_fa3 for c in e2e.all_cases() if c.name in base)
    for c in pd:
        kw = e2e.engine_kwargs(c, tmp_path)
        assert (kw["disaggregation_mode"], kw["disaggregation_transfer_backend"]) == ("decode", "fake")
        assert kw["enable_deterministic_inference"] is True and c.algorithm in ("EAGLE3", "EAGLE")
    dp = e2e.engine_kwargs(by["dp2-default-eagle3"], tmp_path)
    assert dp["dp_size"] == 2 and "attention_backend" not in dp and "disable_piecewise_cuda_graph" not in dp


def test_pd_decode_cases_rest_on_sglangs_own_behaviour() -> None:
    """What the PD-decode cases assume of SGLang 0.5.12.post1, checked against it: only the
    EAGLE family is seeded by process_prebuilt (so the cases are EAGLE3), and the pool never
    hands out a freed KV slot again in a run (the workload fits the pool, so every prefix is
    zeroed KV whatever ran before it)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert SpeculativeAlgorithm.EAGLE3.is_eagle() and SpeculativeAlgorithm.EAGLE.is_eagle()
    assert not SpeculativeAlgorithm.STANDALONE.is_eagle()
    slack = 16  # draft tokens past the last accepted one, per request
    for c in (c for c in e2e.all_cases() if c.pd_decode):
        sc = e2e.scenarios(c.profile, 4096)
        need = sum(len(ids) + p["max_new_tokens"] + slack for s in sc
                   for ids, p in zip(s["input_ids"], s["sampling_params"]))
        assert need < dict(c.extra)["max_total_tokens"], (c.name, need)
    arrivals = {s["name"]: s for s in e2e.scenarios("pd", 4096)}["pd_arrivals"]
    assert arrivals["concurrency"] == 8 and arrivals["abort_after_chunks"]


def test_the_pd_probe_counts_functions_by_the_names_both_runs_give_them(clean_state: Any) -> None:
    """The probe counts calls by code name: SGLang's functions and the plugin's replacements
    of them must carry the names the PD cases count (a renamed replacement would read 0)."""
    import sglang_futuremap_patch as plugin
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    stock = {name: getattr(ScheduleBatch, name).__code__ for name in e2e.PD_PROBE_FUNCS}
    plugin.apply(mode="strict")
    patched = {name: getattr(ScheduleBatch, name).__code__ for name in e2e.PD_PROBE_FUNCS}
    for name in e2e.PD_PROBE_FUNCS:
        assert stock[name].co_name == patched[name].co_name == name
        assert patched[name] is not stock[name]  # the patched run counts the plugin's function


def test_pd_decode_requests_name_sglangs_fake_prefill_peer() -> None:
    """0.5.12.post1's decode scheduler builds every request's bootstrap address (a
    ``NetworkAddress`` of its host) before it looks for the fake backend: a request with no
    host stops it. The PD-decode worker's Engine adds SGLang's fake peer to every request."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
    from sglang.srt.utils.network import NetworkAddress

    with pytest.raises(AttributeError):
        NetworkAddress(None, None).to_host_port_str()  # what a bare request hit on the GPU

    class Engine:
        tokenizer_manager = "tm"

        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []

        def generate(self, **kw: Any) -> str:
            self.calls.append(kw)
            return "sync"

        async def async_generate(self, **kw: Any) -> str:
            self.calls.append(kw)
            return "async"

    inner = Engine()
    engine = e2e.FakePrefillPeer(inner)
    assert engine.generate(input_ids=[[1, 2]], sampling_params=[{}]) == "sync"
    assert asyncio.run(engine.async_generate(input_ids=[1], stream=True, rid="r")) == "async"
    assert engine.tokenizer_manager == "tm"
    for kw in inner.calls:
        assert (kw["bootstrap_host"], kw["bootstrap_room"]) == (FAKE_BOOTSTRAP_HOST, 0)
        NetworkAddress(kw["bootstrap_host"], kw.get("bootstrap_port")).to_host_port_str()
    assert inner.calls[1]["rid"] == "r" and inner.calls[0]["input_ids"] == [[1, 2]]


def test_pd_checks_need_prebuilt_batches_merged_and_one_scheduler_per_gpu() -> None:
    case = next(c for c in e2e.all_cases() if c.pd_decode)
    scs = [{"name": "r", "kind": "batch", "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}]}]
    res = {"pid": 10, "scenarios": {"r": {"outputs": [_rec([1, 2])]}}}

    def run(mode: str, prebuilt: int, merges: int) -> dict[str, Any]:
        r = _side(mode, res)
        r["probe"].scheduler_calls_by_name.update(process_prebuilt=prebuilt, merge_batch=merges)
        return r

    assert all(c.ok for c in e2e.evaluate_case(case, scs, run("off", 5, 3), run("strict", 5, 3)))
    bad = [c.name for c in e2e.evaluate_case(case, scs, run("off", 5, 3), run("strict", 1, 0))]
    failing = [c.name for c in e2e.evaluate_case(case, scs, run("off", 5, 3), run("strict", 1, 0)) if not c.ok]
    assert failing == ["patched: prebuilt batches joined a running batch"] and len(bad) > len(failing)

    dp = next(c for c in e2e.all_cases() if c.name == "dp2-default-eagle3")
    stock = _fake_run(res, disabled=2, calls=5, sched=(11, 12))
    two = _fake_run(res, applied=(10, 11, 12), sched=(11, 12))
    one = _fake_run(res, applied=(10, 11), sched=(11,))
    assert all(c.ok for c in e2e.evaluate_case(dp, scs, stock, two))
    assert [c.name for c in e2e.evaluate_case(dp, scs, stock, one) if not c.ok] == ["patched: 2 scheduler processes"]


def test_probe_summary_counts_the_verify_wait_apart_from_other_probed_functions() -> None:
    probe = logs.summarize_probe([
        {"pid": 2, "proctitle": "sglang::scheduler_DP0_TP0", "total": 9, "mechanism": "m",
         "by_name": {child_env.PROBE_FUNC: 0, "process_prebuilt": 6, "merge_batch": 3}},
        {"pid": 3, "proctitle": "sglang::scheduler_DP1_TP0", "total": 5, "mechanism": "m",
         "by_name": {child_env.PROBE_FUNC: 1, "process_prebuilt": 4, "merge_batch": 0}},
        {"pid": 1, "proctitle": None, "total": 0, "mechanism": "m", "by_name": {child_env.PROBE_FUNC: 0}},
    ])
    assert probe.scheduler_pids == [2, 3] and probe.scheduler_calls == 1 and probe.total_calls == 1
    assert probe.scheduler_calls_by_name == {child_env.PROBE_FUNC: 1, "process_prebuilt": 10, "merge_batch": 3}
    env = child_env.subprocess_env("strict", Path("/nonexistent"), None, base={}, probe_funcs=e2e.PD_PROBE_FUNCS)
    assert env["SMOKE_PROBE_FUNCS"] == ",".join((child_env.PROBE_FUNC,) + e2e.PD_PROBE_FUNCS)


def test_data_parallel_engines_leave_the_nccl_ports_to_sglang(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's DP controller makes a ``PortArgs`` per DP rank: with a fixed ``nccl_port`` every
    rank gets that same port (their torch.distributed stores would collide), without one each
    gets a free port of its own. So a DP Engine gets ``port`` only."""
    import tempfile
    from types import SimpleNamespace

    from sglang.srt.server_args import PortArgs

    block = port_blocks.PortAllocator().allocate("dp")
    kw = port_blocks.with_ports({"model_path": "m", "dp_size": 2}, block)
    assert kw["port"] == block.port and "nccl_port" not in kw
    assert port_blocks.with_ports({"model_path": "m", "dp_size": 1}, block)["nccl_port"] == block.nccl_port

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # PortArgs names IPC files there

    def rank_ports(nccl_port: int | None) -> list[int]:
        args = SimpleNamespace(nccl_port=nccl_port, tokenizer_worker_num=1, enable_dp_attention=False)
        held = []  # the controller holds each rank's port until every rank has one
        try:
            for _ in range(2):
                port = PortArgs.init_new(args).nccl_port
                held.append(socket.create_server(("127.0.0.1", port)))
            return [h.getsockname()[1] for h in held]
        except OSError:
            return []
        finally:
            for h in held:
                h.close()

    assert len(set(rank_ports(kw.get("nccl_port")))) == 2
    assert rank_ports(block.nccl_port) == []  # the same port twice: the second rank cannot have it


# ----------------------------------------------------------------------------- multi-layer EAGLE


def test_mtp_cases_run_the_mimov2_pair_with_and_without_cuda_graph(tmp_path: Path) -> None:
    mtp = e2e.select_cases(None, groups=["mtp"])
    assert [c.name for c in mtp] == [c.name for c in e2e.multilayer_cases()]
    assert all(c.algorithm == "EAGLE" for c in mtp) and {c.profile for c in mtp} == {"matrix", "eos-ties"}
    matrix = {(c.backend, c.cuda_graph, c.pcg) for c in mtp if c.profile == "matrix"}
    assert {("default", g, True) for g in (True, False)} | {("fa3", True, False), ("triton", False, False)} == matrix
    # stock 0.5.12.post1 cannot capture the MTP draft-extend CUDA graphs on Triton
    assert not any(c.backend == "triton" and c.cuda_graph for c in mtp)
    assert {b for b, _, _ in matrix} == {"default", "fa3", "triton"}
    assert [c.backend for c in mtp if c.profile == "eos-ties"] == ["default"]
    assert all(c.batch_variant for c in mtp if c.profile == "eos-ties")  # judged by near-ties (top logprobs asked)
    assert all(sc.get("top_logprobs_num") for sc in e2e.scenarios("eos-ties", 512, eos_ids=(2,)))
    others = sorted(g for g in e2e.GROUPS if g != "mtp")
    assert not any(c.name.startswith("mtp-") for c in e2e.select_cases(None, groups=others))
    for c in mtp:
        kw = e2e.engine_kwargs(c, tmp_path)
        assert (kw["model_path"], kw["speculative_draft_model_path"]) == (str(tmp_path / "mimov2"),
                                                                          str(tmp_path / "mimov2-mtp"))
        assert kw["speculative_algorithm"] == "EAGLE" and kw["trust_remote_code"] is True
        assert (kw["speculative_num_steps"], kw["speculative_eagle_topk"], kw["speculative_num_draft_tokens"]) == (3, 1, 4)
        assert kw["disable_cuda_graph"] is (not c.cuda_graph)
        if c.backend == "default":  # SGLang's own choices: no backend, no piecewise CUDA graph switch
            assert "attention_backend" not in kw and "disable_piecewise_cuda_graph" not in kw
        else:
            assert kw["attention_backend"] == c.backend and kw["disable_piecewise_cuda_graph"] is (not c.pcg)
    # the directories the kwargs name are the ones the model factory writes
    assert e2e.MODEL_DIRS["EAGLE"] == (model_factory.MIMOV2_DIRNAME, model_factory.MIMOV2_MTP_DIRNAME)


# ----------------------------------------------------------------------------- DeepSeek MTP (MLA)


def test_mla_cases_launch_deepseek_as_sglang_runs_it(tmp_path: Path) -> None:
    """The DeepSeek target with its own NextN layer, SGLang's defaults: no attention backend, no
    piecewise CUDA graph switch, no draft path; CUDA graph on and off, EOS / stop-token churn,
    radix cache, logprobs (the matrix profile's ``logprob`` scenario); the sync probe in each."""
    mla = e2e.select_cases(None, groups=["mla"])
    assert [c.name for c in mla] == [c.name for c in e2e.mla_cases()]
    assert {(c.profile, c.cuda_graph) for c in mla} == {("matrix", True), ("matrix", False), ("eos-ties", True),
                                                          ("radix", True)}
    # the EOS churn, as mtp-eos-default, is judged at near-ties; the rest token for token
    assert [c.name for c in mla if c.batch_variant] == ["mla-eos-default", "mla-mirror-eos-default"]
    # the mirror rows turn back-port 18 off; the others run the plugin as it ships
    assert {c.name for c in mla if ("SGLANG_FUTUREMAP_FA3_MLA", "0") in c.env} == {"mla-mirror-default-graph",
                                                                                   "mla-mirror-eos-default"}
    assert all(not c.env for c in mla if not c.name.startswith("mla-mirror-"))
    assert all(c.algorithm == "NEXTN" and c.backend == "default" and c.pcg and c.sync_probe and c.needs_fa3
               and c.models is None and c.gpus == 1 for c in mla)
    assert "logprob" in {sc["name"] for sc in e2e.scenarios("matrix", 4096)}
    others = sorted(g for g in e2e.GROUPS if g != "mla")
    assert not any(c.name.startswith("mla-") for c in e2e.select_cases(None, groups=others))
    assert not any(c.sync_probe for c in e2e.all_cases() if not c.name.startswith("mla-"))
    for c in mla:
        kw = e2e.engine_kwargs(c, tmp_path)
        assert kw["model_path"] == str(tmp_path / model_factory.DEEPSEEK_DIRNAME)
        assert kw["speculative_algorithm"] == "NEXTN" and "speculative_draft_model_path" not in kw
        assert "attention_backend" not in kw and "disable_piecewise_cuda_graph" not in kw
        assert [kw[k] for k in e2e.SPEC_TREE_KEYS] == [3, 1, 4]
        assert kw["disable_cuda_graph"] is (not c.cuda_graph) and ("cuda_graph_max_bs" in kw) is c.cuda_graph
        assert "--speculative-draft-model-path" not in e2e.server_argv(kw, 30000)
    assert e2e.MODEL_DIRS["NEXTN"] == (model_factory.DEEPSEEK_DIRNAME, None)


def _sync_record(pid: int, decode: int, seq_lens_per_decode: int, other_per_decode: int = 1) -> dict[str, Any]:
    """A ``sync-<pid>.json`` record of the host-sync probe (``gpu_probe/smoke_sync_probe.py``)."""
    rows = [{"mode": "DECODE", "site": "Scheduler.process_batch_result_decode", "op": "cuda.Event.synchronize",
             "seq_lens": False, "count": other_per_decode * decode, "blocked_s": 0.01, "seq_lens_tensor": 0}]
    if seq_lens_per_decode:
        rows.append({"mode": "DECODE", "site": "ScheduleBatch.maybe_wait_verify_done", "op": "cuda.Event.synchronize",
                     "seq_lens": True, "count": seq_lens_per_decode * decode, "blocked_s": 0.02, "seq_lens_tensor": 0})
    return {"kind": "sync-probe", "pid": pid, "installed": True, "iterations": {"DECODE": decode, "EXTEND": 3},
            "proctitle": "sglang::scheduler", "batch_size_sum": {"DECODE": 4 * decode}, "syncs": rows,
            "wrapped": ["Tensor.item"], "errors": [], "async_d2h": {}}


def test_run_engine_counts_host_syncs_only_where_the_case_asks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs: dict[str, dict[str, str]] = {}

    def fake_worker(script, spec, work, name, log_path, env, timeout, **kw):
        envs[name] = env
        if env.get("SMOKE_SYNC_PROBE") == "1":
            Path(env["SMOKE_PROBE_DIR"], "sync-77.json").write_text(json.dumps(_sync_record(77, 40, 3)))
        return 0, 1.0, {"pid": 10, "startup_s": 1.0, "scenarios": {}}, ""

    monkeypatch.setattr(launch, "run_worker", fake_worker)
    spec = {"scenarios": [], "engine_kwargs": {}}
    mla = next(c for c in e2e.mla_cases() if c.profile == "matrix")
    run = e2e.run_engine(mla, "stock", "off", spec, tmp_path, 1, tmp_path / "log.json")
    assert envs[f"{mla.name}-stock"]["SMOKE_SYNC_PROBE"] == "1"
    assert run["sync"]["decode_iterations"] == 40 and run["sync"]["pids"] == [77]
    assert e2e.sync_digest(run["sync"]) == {"decode_iterations": 40, "syncs_per_decode": 4.0,
                                            "seq_lens_syncs_per_decode": 3.0,
                                            "seq_lens_sites": ["ScheduleBatch.maybe_wait_verify_done"], "errors": []}
    other = next(c for c in e2e.all_cases() if c.name == "default-eagle3")
    run = e2e.run_engine(other, "stock", "off", spec, tmp_path, 1, tmp_path / "log.json")
    assert "SMOKE_SYNC_PROBE" not in envs["default-eagle3-stock"] and run["sync"] is None


def test_sync_checks_need_counted_decode_iterations_and_no_more_seq_lens_syncs_than_stock() -> None:
    case = next(c for c in e2e.mla_cases() if c.profile == "matrix")
    scs = [{"name": "r", "kind": "batch", "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}]}]
    res = {"pid": 10, "scenarios": {"r": {"outputs": [_rec([1, 2])]}}}

    def runs(stock_seq: int, patched_seq: int, patched_decode: int = 50) -> list[Any]:
        stock = dict(_side("off", res), sync=logs.summarize_sync([_sync_record(11, 50, stock_seq)]))
        patched = dict(_side("strict", res), sync=logs.summarize_sync([_sync_record(11, patched_decode, patched_seq)]))
        return e2e.evaluate_case(case, scs, stock, patched)

    ok = runs(3, 1)
    assert all(c.ok for c in ok), [c for c in ok if not c.ok]
    assert {c.name for c in ok} >= {"sync probe: stock decode iterations counted",
                                    "sync probe: patched decode iterations counted",
                                    "patched: seq_lens syncs per decode iteration <= stock's"}
    assert all(c.ok for c in runs(0, 0))
    assert [c.name for c in runs(1, 2) if not c.ok] == ["patched: seq_lens syncs per decode iteration <= stock's"]
    assert [c.name for c in runs(3, 1, patched_decode=0) if not c.ok] == [
        "sync probe: patched decode iterations counted", "patched: seq_lens syncs per decode iteration <= stock's"]
    # a case without the probe has none of these checks
    plain = next(c for c in e2e.all_cases() if c.name == "default-eagle3")
    assert not any("sync" in c.name for c in e2e.evaluate_case(plain, scs, _side("off", res), _side("strict", res)))


def test_the_report_and_the_record_carry_the_host_syncs(tmp_path: Path) -> None:
    case = next(c for c in e2e.mla_cases() if c.profile == "matrix")
    scs = [{"name": "r", "kind": "batch", "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}]}]
    res = {"pid": 10, "scenarios": {"r": {"outputs": [_rec([1, 2])]}}}
    runs = {"stock": dict(_side("off", res), sync=logs.summarize_sync([_sync_record(11, 50, 3)])),
            "patched": dict(_side("strict", res), sync=logs.summarize_sync([_sync_record(11, 48, 1)]))}
    checks = e2e.evaluate_case(case, scs, runs["stock"], runs["patched"])
    summary = e2e.case_summary(e2e.CaseResult(case, all(c.ok for c in checks), checks, 1.0, runs))
    assert summary["runs"]["patched"]["sync"]["seq_lens_syncs_per_decode"] == 1.0
    line = ("host syncs per decode iteration, stock / patched: seq_lens 3.0 / 1.0, all 4.0 / 2.0 "
            "(50 / 48 decode iterations)")
    assert line in e2e.format_report([summary])
    doc = {"cases": [summary], "environment": {"date": "2026-11-25", "command": "x", "wall_s": 1.0, "fa3": True}}
    record = e2e.merge_record_from_docs([doc])
    assert f"Sync probe ({case.name}): {line}" in record


def test_a_case_naming_its_models_runs_them_in_every_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``EAGLE`` alone is the MiMoV2 pair; the auto-tree EAGLE cases name the Llama target and
    its EAGLE-1 draft (``Case.models``), and every run of them (stock, patched, 0.5.13) gets
    those directories."""
    assert e2e.LLAMA_EAGLE == (model_factory.TARGET_DIRNAME, model_factory.EAGLE_DIRNAME)
    named = {c.name: c for c in e2e.all_cases() if c.models}
    assert sorted(named) == ["tree-auto-eagle-default", "treev2-auto-eagle-default"]
    assert all(c.models == e2e.LLAMA_EAGLE and c.algorithm == "EAGLE" for c in named.values())
    assert all(e2e.model_dirs(c) == e2e.MODEL_DIRS[c.algorithm] for c in e2e.all_cases() if c.name not in named)
    seen: dict[str, tuple[str, str, str]] = {}

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config, site=None):
        kw = spec["engine_kwargs"]
        seen[mode_name] = (kw["model_path"], kw["speculative_draft_model_path"], kw["speculative_algorithm"])
        return {"error": "stand-in", "log": logs.scan_log("")}

    monkeypatch.setattr(e2e, "run_engine", fake_run_engine)
    monkeypatch.setattr(model_factory, "model_config", lambda path: {"vocab_size": 4096})
    monkeypatch.setattr(model_factory, "eos_token_ids", lambda path: [2])
    e2e.run_cases([named["treev2-auto-eagle-default"]], tmp_path, tmp_path, jobs=3, timeout=1, stagger_s=0,
                  soak_requests=1, fa3=True, upstream_site="/site-0.5.13", upstream_fa3=True)
    want = (str(tmp_path / "target"), str(tmp_path / "eagle"), "EAGLE")
    assert seen == {"stock": want, "patched": want, "upstream": want}


def test_a_mistyped_shard_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--shard", "3/2", "--list"], ["--shard", "x", "--list"]):
        assert e2e.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("gpu_e2e.py: ") and err.count("\n") == 1 and "Traceback" not in err


def test_tree_cases_launch_the_auto_tree_against_stock_given_it_explicitly(tmp_path: Path) -> None:
    """The patched run names no steps / topk / draft tokens (SGLang auto-picks its tree); its
    stock oracle names the same tree, and the backend the auto launch ends up with."""
    cases = e2e.select_cases(None, groups=["tree"])
    assert [c.name for c in cases] == ["tree-auto-eagle3-default", "tree-auto-eagle-default",
                                       "tree-auto-eagle3-triton-graph-nopcg", "tree-auto-eagle3-triton-eos",
                                       "tree-auto-eagle3-http-default"]
    spec_keys = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    for case in cases:
        eagle1 = case.name == "tree-auto-eagle-default"
        assert case.spec_v1 and case.algorithm == ("EAGLE" if eagle1 else "EAGLE3")
        patched = e2e.engine_kwargs(case, tmp_path)
        stock = e2e.engine_kwargs(case, tmp_path, stock=True)
        # the Llama target on both sides; the EAGLE-1 case's draft is eagle/, not the MiMoV2 pair
        draft = tmp_path / ("eagle" if eagle1 else "eagle3")
        for kw in (patched, stock):
            assert (kw["model_path"], kw["speculative_draft_model_path"]) == (str(tmp_path / "target"), str(draft))
        assert [patched[k] for k in spec_keys] == [None, None, None]
        assert [stock[k] for k in spec_keys] == [5, 4, 8]
        differ = {k for k in set(patched) | set(stock) if patched.get(k) != stock.get(k)}
        if case.backend == "default":
            assert "attention_backend" not in patched and stock["attention_backend"] == "fa3"
            assert case.needs_fa3 and differ == set(spec_keys) | {"attention_backend"}
        else:
            assert differ == set(spec_keys)
    http = cases[-1]
    argv = e2e.server_argv(e2e.engine_kwargs(http, tmp_path), 31000)
    assert "--speculative-eagle-topk" not in argv and "--attention-backend" not in argv  # as a user launches it
    stock_argv = e2e.server_argv(e2e.engine_kwargs(http, tmp_path, stock=True), 31000)
    assert stock_argv[stock_argv.index("--speculative-eagle-topk") + 1] == "4"


def test_spec_v1_cases_check_the_resolved_arguments_and_the_line_not_verify_done() -> None:
    case = e2e.select_cases(["tree-auto-eagle3-default"])[0]
    scs = [{"name": "r", "kind": "batch", "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}]}]
    eff = {"attention_backend": "fa3", "disable_overlap_schedule": True, "disable_piecewise_cuda_graph": False,
           "speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}

    def run(mode: str, effective: dict[str, Any], lines: int = 1) -> dict[str, Any]:
        res = {"pid": 10, "effective": effective, "scenarios": {"r": {"outputs": [_rec([1, 2])]}}}
        side = _fake_run(res, applied=() if mode == "off" else (10, 11), disabled=2 if mode == "off" else 0)
        side["log"].auto_tree_lines = 0 if mode == "off" else lines
        return side

    # Spec v1 on both sides: neither scheduler waits on verify_done, and that is right.
    assert all(c.ok for c in e2e.evaluate_case(case, scs, run("off", eff), run("strict", eff)))
    bad = {
        "still on spec v2": dict(eff, disable_overlap_schedule=False),
        "another backend": dict(eff, attention_backend="flashinfer"),
        "another tree": dict(eff, speculative_num_draft_tokens=16),
    }
    for why, effective in bad.items():
        checks = e2e.evaluate_case(case, scs, run("off", eff), run("strict", effective))
        assert not all(c.ok for c in checks), why
    for lines in (0, 2):
        assert not all(c.ok for c in e2e.evaluate_case(case, scs, run("off", eff), run("strict", eff, lines)))


def test_the_auto_tree_line_is_counted_not_reported_as_a_plugin_warning() -> None:
    from sglang_futuremap_patch.backports.auto_tree_spec_v1 import MESSAGE

    line = ("[2026-11-23 22:26:30 WARNING pid=746] sglang_futuremap_patch: "
            + MESSAGE % ("EAGLE3", 5, 4, 8))
    found = logs.scan_log(line + "\n[2026-11-23 22:26:31 WARNING pid=746] sglang_futuremap_patch: other\n")
    assert found.auto_tree_lines == 1 and len(found.bad_lines) == 1 and "other" in found.bad_lines[0]


# ----------------------------------------------------------------------------- trees on spec v2


TREE_KEYS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def _tree(kw: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(kw[k] for k in TREE_KEYS)


def test_the_tree_v2_group_selects_exactly_the_new_cases() -> None:
    cases = e2e.select_cases(None, groups=["tree-v2"])
    assert [c.name for c in cases] == [c.name for c in e2e.tree_v2_cases()]
    assert len(cases) == 18
    assert [c.name for c in cases] == [c.name for c in e2e.all_cases() if c.name.startswith("treev2-")]
    assert all(c.tree_v2 and not c.spec_v1 and c.logprob_tol == e2e.TREE_V2_LOGPROB_TOL for c in cases)
    # besides them, only back-port 22's tree cases (with back-port 16's in ``released``) and back-port
    # 27's and back-port 17's idle-poll skip's are judged as trees on spec v2 (their own groups)
    assert {c.name for c in e2e.all_cases() if c.tree_v2 and not c.name.startswith("treev2")} == {
        c.name for c in e2e.mirror_relay_cases() + e2e.released_row_cases()
        + e2e.war_barrier_after_launch_cases() + e2e.war_barrier_skip_idle_cases() if c.tree_v2}
    assert all(c.tree_v2 for c in e2e.tree_v2_det_cases())
    # the old group keeps its own cases; no other group takes a treev2 case
    assert [c.name for c in e2e.select_cases(None, groups=["tree"])] == [c.name for c in e2e.tree_cases()]
    others = sorted(g for g in e2e.GROUPS if g not in ("tree-v2", "tree-v2-det", "mrelay", "released", "wal", "sidle"))
    assert not any(c.tree_v2 for c in e2e.select_cases(None, groups=others))
    # run_e2e.sh hands its arguments to gpu_e2e.py, whose --group choices are GROUPS
    assert e2e.build_parser().parse_args(["--group", "tree-v2"]).group == ["tree-v2"]
    sh = (SCRIPTS / "gpu" / "run_e2e.sh").read_text()
    assert 'python3 scripts/gpu_e2e.py --models "$MODELS" --out "$OUT" "$@"' in sh and "--group tree-v2" in sh


def test_tree_v2_list_prints_the_eighteen_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert e2e.main(["--group", "tree-v2", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 18 and all(ln.startswith("treev2-") for ln in lines)


def test_tree_v2_cases_launch_the_intended_trees(tmp_path: Path) -> None:
    cases = {c.name: c for c in e2e.tree_v2_cases()}
    for name, case in cases.items():
        patched, stock = e2e.engine_kwargs(case, tmp_path), e2e.engine_kwargs(case, tmp_path, stock=True)
        if "-page16-" in name:  # FlashInfer / FA3 only: the backends of a tree in pages
            assert patched["page_size"] == stock["page_size"] == 16
            assert case.backend in ("flashinfer", "fa3") and patched["attention_backend"] == case.backend
        else:
            assert "page_size" not in patched and "page_size" not in stock  # SGLang's default: 1
        assert patched["disable_cuda_graph"] is stock["disable_cuda_graph"] is (not case.cuda_graph)
        assert patched["speculative_algorithm"] == case.algorithm
        if name in ("treev2-auto-eagle3-default", "treev2-auto-eagle-default"):
            # as tree-auto-eagle3-default: SGLang picks the tree (and FA3 + PCG); stock is given both
            want = ("EAGLE3", "eagle3") if name.endswith("eagle3-default") else ("EAGLE", "eagle")
            assert (case.algorithm, e2e.model_dirs(case)) == (want[0], ("target", want[1]))
            assert case.backend == "default" and case.pcg and case.needs_fa3
            assert patched["speculative_draft_model_path"] == stock["speculative_draft_model_path"] == str(
                tmp_path / want[1])
            assert _tree(patched) == (None, None, None) and _tree(stock) == (5, 4, 8)
            assert "attention_backend" not in patched and stock["attention_backend"] == "fa3"
            assert "disable_piecewise_cuda_graph" not in patched and "disable_piecewise_cuda_graph" not in stock
            continue
        assert patched == stock  # an explicit tree: the same launch; stock sends it to spec v1 itself
        assert not case.stock_extra and patched["attention_backend"] == case.backend
        assert patched["disable_piecewise_cuda_graph"] is (not case.pcg)
        assert _tree(patched) in ((3, 4, 16), (5, 4, 8)) and "x".join(map(str, _tree(patched))) in name
        assert case.needs_fa3 is (case.backend == "fa3")
    paged = [c for c in cases.values() if "-page16-" in c.name]
    assert {(c.backend, _tree(dict(c.extra)), c.cuda_graph, c.profile) for c in paged} == {
        ("flashinfer", (3, 4, 16), True, "tree"), ("flashinfer", (5, 4, 8), False, "tree"),
        ("fa3", (5, 4, 8), True, "tree"), ("fa3", (3, 4, 16), False, "tree"),
        ("fa3", (3, 4, 16), True, "tree-eos")}
    explicit = [c for c in cases.values() if not c.stock_extra and c not in paged]
    standalone = {(c.backend, _tree(dict(c.extra)), c.cuda_graph, c.pcg) for c in explicit
                  if c.algorithm == "STANDALONE" and c.profile == "tree"}
    assert {(b, t) for b, t, g, _ in standalone if g} == {(b, t) for b in ("flashinfer", "fa3", "triton")
                                                          for t in ((3, 4, 16), (5, 4, 8))}
    assert {(b, t) for b, t, g, _ in standalone if not g} >= {("flashinfer", (5, 4, 8)), ("triton", (3, 4, 16))}
    assert [(b, t) for b, t, _, p in standalone if p] == [("fa3", (5, 4, 8))]  # PCG on one FA3 case only
    (eagle3,) = [c for c in explicit if c.algorithm == "EAGLE3"]
    assert (eagle3.backend, _tree(dict(eagle3.extra)), eagle3.cuda_graph, eagle3.pcg) == (
        "triton", (5, 4, 8), True, False)
    churn = {c.profile: c for c in explicit if c.profile != "tree"}
    assert set(churn) == {"tree-eos", "tree-radix"} and all(c.algorithm == "STANDALONE" for c in churn.values())
    assert (churn["tree-eos"].backend, _tree(dict(churn["tree-eos"].extra))) == ("triton", (3, 4, 16))
    assert churn["tree-radix"].backend in ("fa3", "flashinfer")
    for prof, base in (("tree-radix", "radix"), ("tree-eos", "eos")):  # the same workloads, with logprobs
        lp, plain = e2e.scenarios(prof, 4096), e2e.scenarios(base, 4096)
        assert [{k: v for k, v in x.items() if k not in ("return_logprob", "top_logprobs_num")} for x in lp] == plain
        assert all(x["top_logprobs_num"] == e2e.TREE_TOP_LOGPROBS for x in lp)
    # the tree profile: the matrix workload (same prompts), every scenario with top-2 logprobs
    tree, matrix = e2e.scenarios("tree", 4096), e2e.scenarios("matrix", 4096)
    assert [sc["name"] for sc in tree] == [sc["name"] for sc in matrix]
    assert all(sc.get("input_ids") == m.get("input_ids") for sc, m in zip(tree, matrix))
    assert all(sc["return_logprob"] and sc["top_logprobs_num"] >= 2 for sc in tree)
    assert sum(c.profile == "tree" for c in cases.values()) == 15  # 11 at page size 1, 4 at page size 16
    assert all(c.upstream for c in cases.values()) and all(c.upstream for c in e2e.tree_v2_det_cases())


def test_old_tree_cases_keep_spec_v1_through_the_env_variable(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``Case.env`` reaches both worker processes (the real run_engine, a stand-in worker):
    ``tree-*`` set SGLANG_FUTUREMAP_TREE_SPEC_V2=0 (spec v1), ``treev2-*`` drop it (the default)."""
    for case in e2e.tree_cases():
        assert case.env == ((e2e.TREE_SPEC_V2_ENV, "0"),) and case.spec_v1 and not case.tree_v2
    assert e2e.TREE_SPEC_V2_ENV == "SGLANG_FUTUREMAP_TREE_SPEC_V2"
    # treev2: the default (variable unset), but FlashInfer, where the plugin runs a tree on spec
    # v2 only when asked for (=1)
    for c in e2e.tree_v2_cases() + e2e.tree_v2_det_cases():
        assert c.env == ((e2e.TREE_SPEC_V2_ENV, "1" if c.backend == "flashinfer" else None),), c.name
    assert {c.backend for c in e2e.tree_v2_cases()} >= {"flashinfer", "fa3", "triton", "default"}
    assert not any(c.env for c in e2e.all_cases()
                   if not c.name.startswith(("tree-", "treev2-", "treev2det-", "mla-mirror-", "intake-", "fihost-", "fiplan-",
                                             "mrelay-", "pfirst-", "wal-", "sidle-")))
    seen: dict[str, dict[str, str]] = {}

    def fake_worker(script, spec, work, name, log_path, env, timeout, **kw):
        seen[name] = env
        return 0, 1.0, {"pid": 10, "startup_s": 1.0, "scenarios": {}}, ""

    monkeypatch.setattr(launch, "run_worker", fake_worker)
    monkeypatch.setenv(e2e.TREE_SPEC_V2_ENV, "1")  # as if the GPU host had it set: treev2 drops it
    log_config = logs.write_logging_config(tmp_path / "logging.json")
    for case in e2e.select_cases(["tree-auto-eagle3-default", "treev2-auto-eagle3-default"]):
        for mode_name, mode in e2e.RUNS:
            e2e.run_engine(case, mode_name, mode, {"scenarios": []}, tmp_path, 1, log_config)
    for mode_name, mode in e2e.RUNS:
        assert seen[f"tree-auto-eagle3-default-{mode_name}"][e2e.TREE_SPEC_V2_ENV] == "0"
        assert seen[f"tree-auto-eagle3-default-{mode_name}"][child_env.ENV_MODE] == mode
        assert e2e.TREE_SPEC_V2_ENV not in seen[f"treev2-auto-eagle3-default-{mode_name}"]
    plain = e2e.select_cases(["retract-*"])[0]
    assert e2e.with_case_env({"A": "1"}, plain) == {"A": "1"}


STOCK_V1_LINE = ("Spec v1 is used for eagle/eagle3/standalone speculative decoding because spec v2 currently only "
                 "supports topk = 1.")
TREE_V2_LINE = ("[2026-11-24 10:00:01 INFO pid=10] sglang_futuremap_patch: spec v2 runs the EAGLE tree "
                "(num_steps=3, eagle_topk=4, num_draft_tokens=16) on the overlap scheduler")


def _decode_line(pid: int, accept: float) -> str:
    return (f"[2026-11-24 10:00:05 INFO pid={pid}] Decode batch, #running-req: 7, #token: 1285, token usage: 0.00, "
            f"accept len: {accept:.2f}, accept rate: 0.41, cuda graph: True, gen throughput (token/s): 113.87, "
            f"#queue-req: 0")


def _tree_log(mode: str, *, tree_line: bool = True, stock_line: bool = True, accepts=(2.4, 2.1)) -> str:
    """A synthetic Engine log: the plugin's lines of its mode, the tree lines, decode lines."""
    if mode == "off":
        lines = [f"[2026-11-24 10:00:00 INFO pid={p}] sglang_futuremap_patch: disabled by SGLANG_FUTUREMAP_PATCH=off"
                 for p in (10, 11)]
        lines += [STOCK_V1_LINE] if stock_line else []
    else:
        lines = [f"[2026-11-24 10:00:00 INFO pid={p}] sglang_futuremap_patch: applied 10 back-ports (70 targets) to "
                 f"SGLang 0.5.12.post1 [pid {p}]: worker-on-publish" for p in (10, 11)]
        lines += [TREE_V2_LINE] if tree_line else []
    return "\n".join(lines + [_decode_line(11, a) for a in accepts]) + "\n"


def _tree_run(mode: str, effective: dict[str, Any], text: str) -> dict[str, Any]:
    res = {"pid": 10, "effective": effective, "scenarios": {"r": {"outputs": [_rec([1, 2], accept=1.05)]}}}
    side = _side(mode, res)
    side["log"] = logs.scan_log(text)
    return side


def _tree_eff(tree: tuple[int, int, int], spec_v2: bool, backend: str = "triton") -> dict[str, Any]:
    return dict({"attention_backend": backend, "page_size": 1, "disable_piecewise_cuda_graph": True,
                 "disable_cuda_graph": False, "cuda_graph_bs": [1, 2, 4, 8],
                 "disable_overlap_schedule": not spec_v2}, **dict(zip(TREE_KEYS, tree)))


def _failing(case: e2e.Case, stock: dict[str, Any], patched: dict[str, Any]) -> list[str]:
    scs = [{"name": "r", "kind": "batch", "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}]}]
    return [c.name for c in e2e.evaluate_case(case, scs, stock, patched) if not c.ok]


def test_tree_v2_checks_need_the_plugin_line_the_stock_line_and_the_same_tree() -> None:
    case = e2e.select_cases(["treev2-standalone-triton-3x4x16-graph-nopcg"])[0]
    s_eff, p_eff = _tree_eff((3, 4, 16), False), _tree_eff((3, 4, 16), True)
    stock, patched = _tree_run("off", s_eff, _tree_log("off")), _tree_run("strict", p_eff, _tree_log("strict"))
    assert not stock["log"].bad_lines and not patched["log"].bad_lines  # the INFO line is no plugin warning
    checks = {c.name: c for c in e2e.evaluate_case(case, [], stock, patched)}
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert {"patched and stock resolve to the same server args", "resolved tree (steps, topk, draft tokens) as asked "
            "on both sides", "patched on spec v2, stock on spec v1", "patched log: one 'spec v2 runs the EAGLE tree' "
            "line", "stock log: SGLang's spec v1 line for the tree", "patched mean accept length > 1.3",
            "patched never waits on verify_done"} <= set(checks)
    assert "stock scheduler waits on verify_done" not in checks  # stock is spec v1
    assert checks["patched mean accept length > 1.3"].detail == "2.25 (2 decode log lines)"
    assert _failing(case, stock, _tree_run("strict", p_eff, _tree_log("strict", tree_line=False))) == [
        "patched log: one 'spec v2 runs the EAGLE tree' line"]
    twice = _tree_log("strict") + TREE_V2_LINE + "\n"
    assert _failing(case, stock, _tree_run("strict", p_eff, twice)) == [
        "patched log: one 'spec v2 runs the EAGLE tree' line"]
    assert _failing(case, _tree_run("off", s_eff, _tree_log("off", stock_line=False)), patched) == [
        "stock log: SGLang's spec v1 line for the tree"]
    assert _failing(case, stock, _tree_run("strict", _tree_eff((3, 4, 16), False), _tree_log("strict"))) == [
        "patched on spec v2, stock on spec v1"]
    assert set(_failing(case, stock, _tree_run("strict", _tree_eff((5, 4, 8), True), _tree_log("strict")))) == {
        "patched and stock resolve to the same server args", "resolved tree (steps, topk, draft tokens) as asked on "
        "both sides"}
    other_backend = _tree_run("strict", dict(p_eff, attention_backend="flashinfer"), _tree_log("strict"))
    assert _failing(case, stock, other_backend) == ["patched and stock resolve to the same server args"]
    assert _failing(case, stock, _tree_run("strict", p_eff, _tree_log("strict", accepts=(1.1, 1.2)))) == [
        "patched mean accept length > 1.3"]
    # no decode line: the requests' own spec_accept_length (1.05 here) stands in
    no_lines = _tree_run("strict", p_eff, _tree_log("strict", accepts=()))
    assert e2e.accept_length(no_lines) == (1.05, "requests' spec_accept_length (no decode log line)")
    assert _failing(case, stock, no_lines) == ["patched mean accept length > 1.3"]
    waited = _tree_run("strict", p_eff, _tree_log("strict"))
    waited["probe"] = logs.ProbeSummary([], [11], 2, 2, ["settrace"])
    assert _failing(case, stock, waited) == ["patched never waits on verify_done"]


def test_tree_v2_auto_cases_must_resolve_to_sglangs_tree_and_eagle3_has_no_accept_floor() -> None:
    auto = e2e.select_cases(["treev2-auto-eagle3-default"])[0]
    stock = _tree_run("off", _tree_eff((5, 4, 8), False, "fa3"), _tree_log("off", accepts=(1.02,)))
    good = _tree_run("strict", _tree_eff((5, 4, 8), True, "fa3"), _tree_log("strict", accepts=(1.02,)))
    assert _failing(auto, stock, good) == []  # EAGLE3's ~1 token a step is fine: no accept check
    # the EAGLE-1 draft gets part of the tree accepted: the same floor as the STANDALONE draft
    eagle1 = e2e.select_cases(["treev2-auto-eagle-default"])[0]
    assert _failing(eagle1, stock, good) == ["patched mean accept length > 1.3"]
    accepted = _tree_run("strict", _tree_eff((5, 4, 8), True, "fa3"), _tree_log("strict", accepts=(2.1, 1.9)))
    assert _failing(eagle1, stock, accepted) == []
    assert "resolved tree (steps, topk, draft tokens) as asked on both sides" in _failing(
        auto, _tree_run("off", _tree_eff((3, 4, 16), False, "fa3"), _tree_log("off")),
        _tree_run("strict", _tree_eff((3, 4, 16), True, "fa3"), _tree_log("strict")))
    # the old tree-* cases: spec v1 on both sides, the auto-tree WARNING, no spec-v2 tree line
    old = e2e.select_cases(["tree-auto-eagle3-default"])[0]
    from sglang_futuremap_patch.backports.auto_tree_spec_v1 import MESSAGE

    warn = ("[2026-11-24 10:00:01 WARNING pid=10] sglang_futuremap_patch: " + MESSAGE % ("EAGLE3", 5, 4, 8))
    v1 = _tree_eff((5, 4, 8), False, "fa3")
    stock_v1 = _tree_run("off", v1, _tree_log("off"))
    kept = _tree_run("strict", v1, _tree_log("strict", tree_line=False) + warn + "\n")
    assert _failing(old, stock_v1, kept) == []
    went_v2 = _tree_run("strict", v1, _tree_log("strict") + warn + "\n")
    assert _failing(old, stock_v1, went_v2) == ["patched log: no 'spec v2 runs the EAGLE tree' line "
                                                "(SGLANG_FUTUREMAP_TREE_SPEC_V2=0)"]


def test_accept_length_parser_on_sglang_decode_lines() -> None:
    line = ("[2026-11-22 03:22:19 INFO pid=2564] Decode batch, #running-req: 5, #token: 1285, token usage: 0.00, "
            "accept len: 2.13, accept rate: 0.59, cuda graph: False, gen throughput (token/s): 113.87, #queue-req: 0")
    assert logs.scan_log(line).accept_lengths == [2.13]
    text = "\n".join([
        line,
        "Decode batch, #running-req: 1, #token: 50, token usage: 0.00, accept len: 3.00, accept rate: 0.67, "
        "cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0",  # no log format
        "[2026-11-22 03:22:20 INFO pid=2564] Decode batch, #running-req: 5, #token: 1285, token usage: 0.00, "
        "cuda graph: False, gen throughput (token/s): 113.87, #queue-req: 0",  # no speculative decoding
        "[2026-11-22 03:22:18 INFO pid=2564] Prefill batch, #new-seq: 1, #new-token: 18, accept len: 9.99",
    ])
    found = logs.scan_log(text)
    assert found.accept_lengths == [2.13, 3.0] and found.mean_accept_length == pytest.approx(2.565)
    assert logs.scan_log("no decode here").mean_accept_length is None
    # recorded per run in the case summary and shown in the report
    case = e2e.select_cases(["treev2-standalone-triton-3x4x16-graph-nopcg"])[0]
    stock = _tree_run("off", _tree_eff((3, 4, 16), False), _tree_log("off", accepts=(2.0, 2.5)))
    patched = _tree_run("strict", _tree_eff((3, 4, 16), True), _tree_log("strict", accepts=(2.4, 2.1)))
    for run in (stock, patched):
        run.update(config_label="triton, PCG off, page 1", ports=None)
    checks = e2e.evaluate_case(case, [], stock, patched)
    summary = e2e.case_summary(e2e.CaseResult(case, all(c.ok for c in checks), checks, 1.0,
                                              {"stock": stock, "patched": patched}))
    runs = summary["runs"]
    assert runs["stock"]["log_accept_length"] == runs["patched"]["log_accept_length"] == 2.25
    assert runs["patched"]["decode_log_lines"] == 2 and runs["patched"]["mean_accept_length"] == 1.05
    assert summary["case"]["tree_v2"] is True and json.loads(json.dumps(summary))["case"]["env"] == [
        ["SGLANG_FUTUREMAP_TREE_SPEC_V2", None]]
    report = e2e.format_report([summary])
    assert "accept 1.05 / 1.05 (decode log 2.25 / 2.25)" in report and report.startswith("PASSED  treev2-")
    record = e2e.merge_record_from_docs([{"environment": {"date": "2026-11-24", "command": "x", "wall_s": 1,
                                                          "fa3": True}, "cases": [summary]}])
    assert "| 1.05 / 1.05 (decode log 2.25 / 2.25) |" in record


def test_tree_v2_logprobs_compare_within_a_tolerance_and_ids_exactly() -> None:
    sc = {"name": "logprob", "kind": "batch", "return_logprob": True,
          "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}]}

    def out(ids, lp, top):
        return {"outputs": [_rec(ids, logprobs=[[lp, ids[0]], [lp, ids[1]]],
                                 top_logprobs=[[[top, ids[0]], [top - 1.0, 9]], None])]}

    stock = out([5, 6], -0.5, -0.5)
    tol = e2e.TREE_V2_LOGPROB_TOL
    # bf16 logits: spec v1 and v2 differ by a unit in the last place or two (1/16, 1/8)
    assert tol == e2e.NEAR_TIE_NATS == 0.25 and ": logprobs within 0.25" in e2e.MISMATCH_CHECKS
    names = {c.name: c.ok for c in e2e.compare_scenario(sc, stock, out([5, 6], -0.625, -0.375), tol)}
    assert names == {"logprob: outputs identical": True, "logprob: lengths as requested": True,
                     "logprob: logprobs within 0.25": True}
    assert not dict((c.name, c.ok) for c in e2e.compare_scenario(sc, stock, out([5, 6], -0.5004, -0.5)))[
        "logprob: logprobs identical"]  # the other cases: bit for bit
    far = {c.name: c.ok for c in e2e.compare_scenario(sc, stock, out([5, 6], -0.9, -0.5), tol)}
    assert far["logprob: logprobs within 0.25"] is False and far["logprob: outputs identical"] is True
    ids = [c for c in e2e.compare_scenario(sc, stock, out([5, 7], -0.5, -0.5), tol) if not c.ok]
    assert ids[0].name == "logprob: outputs identical" and "(0, 1)" in ids[0].detail  # first differing token kept
    assert not e2e.close_logprobs([[-0.5, 5]], [[-0.5, 6]], tol)
    assert not e2e.close_logprobs([[-0.5, 5]], [[-0.5, 5], [0.0, 1]], tol)
    # a second stock run judges a logprob mismatch with the same tolerance
    far_run = out([5, 6], -0.9, -0.5)
    bad = e2e.compare_scenario(sc, stock, far_run, tol)
    rerun = {"returncode": 0, "result": {"scenarios": {"logprob": out([5, 6], -0.8, -0.5)}}}
    adj = e2e.adjudicate([sc], bad, {"result": {"scenarios": {"logprob": stock}}}, rerun,
                         {"result": {"scenarios": {"logprob": far_run}}}, tol)
    assert all(c.ok for c in adj) and any(c.name == "logprob: patched logprobs match a stock run" for c in adj)


# ----------------------------------------------------------------------------- near-ties


def _lp_rec(ids: list[int], tops: list[list[tuple[float, int]]], **kw: Any) -> dict[str, Any]:
    """A greedy output with its logprobs: ``tops[k]`` the top-2 (logprob, id) of position k."""
    return _rec(ids, logprobs=[[t[0][0], i] for t, i in zip(tops, ids)],
                top_logprobs=[[[lp, tid] for lp, tid in t] for t in tops], **kw)


def test_first_difference_is_a_near_tie_only_when_each_side_rates_the_other_token_close() -> None:
    common = [[(-0.1, 7), (-3.0, 8)]]
    # an exact bf16 tie on one side (greedy takes the lower id), one ulp on the other
    stock = _lp_rec([7, 11, 12], common + [[(-0.70, 11), (-0.70, 21)], [(-0.2, 12), (-2.0, 1)]])
    patched = _lp_rec([7, 21, 30], common + [[(-0.64, 21), (-0.7025, 11)], [(-0.3, 30), (-1.0, 2)]])
    d = e2e.first_difference(stock, patched)
    assert d["position"] == 1 and d["tokens"] == [11, 21] and d["near_tie"]
    assert d["margins"] == [pytest.approx(0.0), pytest.approx(0.0625)]
    # the other token third in a three-way near-tie still counts (found among the top logprobs)
    three = _lp_rec([7, 21, 30], common + [[(-0.64, 21), (-0.66, 5), (-0.70, 11)], [(-0.3, 30), (-1.0, 2)]])
    assert e2e.first_difference(stock, three)["near_tie"]
    # a wide margin on one side is not a near-tie
    wide = _lp_rec([7, 21, 30], common + [[(-0.1, 21), (-0.9, 11)], [(-0.3, 30), (-1.0, 2)]])
    d = e2e.first_difference(stock, wide)
    assert d["margins"][1] == pytest.approx(0.8) and not d["near_tie"]
    assert e2e.NEAR_TIE_NATS < 0.8
    # the other side's token missing from the top logprobs: unexplained
    other = _lp_rec([7, 21, 30], common + [[(-0.69, 21), (-0.70, 99)], [(-0.3, 30), (-1.0, 2)]])
    d = e2e.first_difference(stock, other)
    assert d["margins"][1] is None and not d["near_tie"]
    # no logprobs, or one output a prefix of the other: unexplained
    assert not e2e.first_difference(_rec([7, 11]), _rec([7, 21]))["near_tie"]
    short = _lp_rec([7, 11], common + stock["top_logprobs"][1:2])
    d = e2e.first_difference(stock, {**short, "finish": "stop", "matched": 11})
    assert not d["near_tie"] and d["why"] == "one output is a prefix of the other"
    # the prefix case says how each side ended, so a missed stop is told from a budget
    assert d["lengths"] == [3, 2] and d["finish"][1] == ["stop", 11] and d["last"] == [11, 11]
    assert d["next"] == [stock["output_ids"][2], None]


def test_near_tie_checks_mark_explained_differences_and_keep_real_ones_failing() -> None:
    sc = {"name": "bs7", "kind": "batch", "top_logprobs_num": 2, "return_logprob": True,
          "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}] * 2}
    same = _lp_rec([7, 11], [[(-0.1, 7), (-3.0, 8)], [(-0.5, 11), (-0.9, 3)]])
    s_tie = _lp_rec([7, 11], [[(-0.1, 7), (-3.0, 8)], [(-0.700, 11), (-0.702, 21)]])
    p_tie = _lp_rec([7, 21], [[(-0.1001, 7), (-3.0, 8)], [(-0.699, 21), (-0.701, 11)]])
    stock, patched = {"outputs": [same, s_tie]}, {"outputs": [same, p_tie]}
    checks = e2e.compare_scenario(sc, stock, patched, e2e.TREE_V2_LOGPROB_TOL)
    assert [c.name for c in checks if not c.ok] == ["bs7: outputs identical"]  # logprobs: same-id requests only
    ties = e2e.near_tie_checks(sc, stock, patched)
    assert len(ties) == 1 and ties[0].ok and "1 differing requests, 0 not near-ties" in ties[0].detail
    assert "noise where the outputs agree 0.0001" in ties[0].detail
    explained = e2e.explain_by_near_ties(checks, ties)
    assert all(c.ok for c in explained) and "near-tie" in explained[0].detail
    # a wide margin: the difference stays a failure
    p_bad = _lp_rec([7, 21], [[(-0.1, 7), (-3.0, 8)], [(-0.1, 21), (-2.0, 11)]])  # 1.9 nats apart
    ties = e2e.near_tie_checks(sc, stock, {"outputs": [same, p_bad]})
    assert not ties[0].ok and "request 1" in ties[0].detail
    assert not all(c.ok for c in e2e.explain_by_near_ties(
        e2e.compare_scenario(sc, stock, {"outputs": [same, p_bad]}, e2e.TREE_V2_LOGPROB_TOL), ties))
    # without top logprobs in the scenario there is nothing to judge by
    assert e2e.near_tie_checks(dict(sc, top_logprobs_num=None), stock, patched) == []
    # a stop_from scenario: requests whose runs took other stop tokens are not compared
    stopped = e2e.near_tie_checks(sc, dict(stock, stops=[5, 6]), {"outputs": [same, p_bad], "stops": [5, 9]})
    assert stopped[0].ok and "1 requests with other stop tokens not compared" in stopped[0].detail


def test_tree_v2_cases_pass_on_near_ties_and_compare_with_0513(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """run_cases with a stand-in worker: a tree case runs stock, patched and 0.5.13 (its own
    site, the patched launch); a near-tie difference passes, no stock rerun is made."""
    case = e2e.select_cases(["treev2-standalone-triton-3x4x16-graph-nopcg"])[0]
    tie_s = _lp_rec([7, 11], [[(-0.1, 7), (-3.0, 8)], [(-0.700, 11), (-0.702, 21)]])
    tie_p = _lp_rec([7, 21], [[(-0.1, 7), (-3.0, 8)], [(-0.699, 21), (-0.701, 11)]])
    calls: list[tuple[str, str | None]] = []
    workload = [{"name": "bs1", "kind": "batch", "input_ids": [[5]], "return_logprob": True, "top_logprobs_num": 2,
                 "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True, "temperature": 0.0}]}]
    monkeypatch.setattr(e2e, "scenarios", lambda *a, **k: workload)

    def fake_run_engine(case, mode_name, mode, spec, work, timeout, log_config, site=None):
        calls.append((mode_name, site))
        rec = tie_s if mode_name == "stock" else tie_p
        eff = _tree_eff((3, 4, 16), mode_name != "stock")
        text = _tree_log("strict" if mode_name == "patched" else "off", accepts=(3.1,))
        run = _tree_run("strict" if mode_name == "patched" else "off", eff, text)
        run["result"]["scenarios"] = {"bs1": {"outputs": [rec]}}
        run["result"]["sglang_version"] = "0.5.13" if site else "0.5.12.post1"
        assert spec["engine_kwargs"]["speculative_eagle_topk"] == 4
        return run

    monkeypatch.setattr(e2e, "run_engine", fake_run_engine)
    monkeypatch.setattr(model_factory, "model_config", lambda path: {"vocab_size": 4096})
    monkeypatch.setattr(model_factory, "eos_token_ids", lambda path: [2])
    (r,) = e2e.run_cases([case], tmp_path, tmp_path, jobs=3, timeout=1, stagger_s=0, soak_requests=1,
                         fa3=True, upstream_site="/site-0.5.13")
    assert sorted(calls) == [("patched", None), ("stock", None), ("upstream", "/site-0.5.13")]
    assert "stock-rerun" not in r.runs
    names = {c.name: c for c in r.checks}
    assert names["bs1: outputs identical"].ok and "near-tie" in names["bs1: outputs identical"].detail
    assert names["0.5.13 run finished"].ok and names["0.5.13 vs patched: bs1: outputs identical"].ok
    assert r.notes and "0.5.13 (spec v2) vs stock spec v1, bs1: 0/1 identical" in r.notes[0], r.notes
    # a case that needs FA3 runs 0.5.13 only where 0.5.13's FA3 is installed
    fa3_case = e2e.select_cases(["treev2-standalone-fa3-3x4x16-graph-nopcg"])[0]
    for have, want in ((False, ["patched", "stock"]), (True, ["patched", "stock", "upstream"])):
        calls.clear()
        (r,) = e2e.run_cases([fa3_case], tmp_path, tmp_path, jobs=3, timeout=1, stagger_s=0, soak_requests=1,
                             fa3=True, upstream_site="/site-0.5.13", upstream_fa3=have)
        assert sorted(m for m, _ in calls) == want
        assert any("0.5.13 not run" in n for n in r.notes) is (not have)
    # without the site: two runs only
    calls.clear()
    e2e.run_cases([case], tmp_path, tmp_path, jobs=2, timeout=1, stagger_s=0, soak_requests=1, fa3=True)
    assert sorted(m for m, _ in calls) == ["patched", "stock"]


def test_tree_top_logprobs_compare_as_candidates_within_the_tolerance() -> None:
    tol = e2e.TREE_V2_LOGPROB_TOL
    a = _rec([5], logprobs=[[-1.0, 5]], top_logprobs=[[[-1.0, 5], [-1.0, 9], [-2.0, 4]]])
    reordered = _rec([5], logprobs=[[-0.9375, 5]], top_logprobs=[[[-0.9375, 9], [-0.9375, 5], [-2.0, 4]]])
    assert e2e.same_logprobs(a, reordered, tol) and not e2e.same_logprobs(a, reordered)
    # a candidate at the cut-off in one list only: close to the other list's last
    cutoff = _rec([5], logprobs=[[-1.0, 5]], top_logprobs=[[[-1.0, 5], [-1.0, 9], [-2.1, 7]]])
    assert e2e.same_logprobs(a, cutoff, tol)
    # one far off, or a list of another length: not close
    far = _rec([5], logprobs=[[-1.0, 5]], top_logprobs=[[[-1.0, 5], [-1.6, 9], [-2.0, 4]]])
    assert not e2e.same_logprobs(a, far, tol)
    assert not e2e.same_logprobs(a, _rec([5], logprobs=[[-1.0, 5]], top_logprobs=[[[-1.0, 5]]]), tol)
    assert not e2e.same_logprobs(a, _rec([5], logprobs=[[-1.5, 5]], top_logprobs=a["top_logprobs"]), tol)


def test_judge_outputs_rejudges_saved_tree_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--judge: the tree checks again from --save-outputs files; a later file supersedes an
    earlier one for the same case; a wide difference fails."""
    import gzip

    sc_list = [{"name": "bs7", "kind": "batch", "input_ids": [[5]] * 3, "return_logprob": True,
                "top_logprobs_num": 5, "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True}] * 3}]
    monkeypatch.setattr(e2e, "scenarios", lambda *a, **k: sc_list)

    def runs(patched_second: list[tuple[float, int]]) -> dict[str, Any]:
        def side(second):
            out = {}
            for sc in sc_list:
                if sc["kind"] == "stop_from":
                    out[sc["name"]] = {"outputs": [], "stops": []}
                    continue
                n = len(sc["input_ids"])
                recs = [_lp_rec([7, 11], [[(-0.1, 7), (-3.0, 8)], [(-0.70, 11), (-0.70, 21)]]) for _ in range(n)]
                recs[0] = _lp_rec([7, second[0][1]], [[(-0.1, 7), (-3.0, 8)], second])
                out[sc["name"]] = {"outputs": recs}
            return out
        stock = side([(-0.70, 11), (-0.70, 21)])
        return {"stock": stock, "patched": side(patched_second)}

    name = "treev2-standalone-triton-3x4x16-graph-nopcg"
    tie, wide = [(-0.64, 21), (-0.7025, 11)], [(-0.1, 21), (-1.5, 11)]
    for fname, second in (("early.json.gz", wide), ("late.json.gz", tie)):
        with gzip.open(tmp_path / fname, "wt") as fh:
            json.dump({name: runs(second)}, fh)
    ok, report = e2e.judge_outputs([tmp_path / "early.json.gz"])
    assert not ok and "FAILED" in report
    ok, report = e2e.judge_outputs([tmp_path / "early.json.gz", tmp_path / "late.json.gz"])
    assert ok and report.count(name) == 1 and "late.json.gz" in report and "JUDGED PASSED" in report


def test_tree_runs_compare_the_requests_both_sent_in_adaptive_scenarios() -> None:
    """eos_search / eos_churn pick their requests from their own outputs: where two tree runs
    part at a near-tie they send other requests, and only the shared ones are compared."""
    search = {"name": "eos_search", "kind": "eos_search", "eos_ids": [2], "top_logprobs_num": 5,
              "rounds": [[[1]] * 2] * 2}
    churn = {"name": "eos_churn", "kind": "eos_churn", "top_logprobs_num": 5}
    outs = {i: _rec([10 + i, 20 + i, 30 + i]) for i in range(6)}
    outs[5]["finish"] = "stop"  # k5 ends on its stop token (8) in both runs
    a = {"eos_search": {"outputs": [outs[0], outs[1], outs[2], outs[3]], "found": [1]},
         "eos_churn": {"outputs": [outs[1], outs[4], outs[5]], "stops": [None, 7, 8],
                       "keys": ["k1", "k4", "k5"]}}
    b = {"eos_search": {"outputs": [outs[0], outs[1]], "found": [1]},
         "eos_churn": {"outputs": [outs[5], outs[2], outs[1]], "stops": [8, 9, None],
                       "keys": ["k5", "k2", "k1"]}}
    checks = e2e.output_checks([search, churn], a, b, e2e.TREE_V2_LOGPROB_TOL, near_ties=True)
    by_name = {c.name: c for c in checks}
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert "2 requests sent by both runs" in by_name["eos_churn: requests compared"].detail
    assert "first 2 requests" in by_name["eos_search: requests compared"].detail
    assert by_name["eos_churn: outputs identical"].detail.startswith("2/2")
    # A real difference among the shared requests still fails.
    b["eos_churn"]["outputs"][2] = _rec([11, 99, 31])
    failed = [c for c in e2e.output_checks([search, churn], a, b, e2e.TREE_V2_LOGPROB_TOL, near_ties=True)
              if not c.ok]
    assert failed and all(c.name.startswith("eos_churn") for c in failed)
    # Chains (no tolerance, no near-tie judging) are compared request for request, as before.
    plain = e2e.output_checks([search, churn], a, b, 0.0, near_ties=False)
    assert not next(c for c in plain if c.name == "eos_search: ran").ok


def test_request_key_is_the_prompt_and_its_parameters() -> None:
    k = e2e.request_key([1, 2, 3], {"max_new_tokens": 8, "stop_token_ids": [7]})
    assert k == e2e.request_key([1, 2, 3], {"stop_token_ids": [7], "max_new_tokens": 8})
    assert k != e2e.request_key([1, 2, 3], {"max_new_tokens": 8, "stop_token_ids": [9]})
    assert k != e2e.request_key([1, 2, 4], {"max_new_tokens": 8, "stop_token_ids": [7]})


def test_align_adaptive_pairs_the_churn_requests_both_runs_sent() -> None:
    sc = {"name": "eos_churn", "kind": "eos_churn"}
    a = {"outputs": [_rec([1]), _rec([2]), _rec([3])], "keys": ["x", "y", "z"], "stops": [None, 5, None]}
    b = {"outputs": [_rec([3]), _rec([9]), _rec([1])], "keys": ["z", "w", "x"], "stops": [None, None, None]}
    x, y, note = e2e.align_adaptive(sc, a, b)
    assert [r["output_ids"] for r in x["outputs"]] == [[1], [3]] == [r["output_ids"] for r in y["outputs"]]
    assert x["stops"] == [None, None] and "2 requests sent by both runs compared (3 / 3 sent" in note
    # same requests in the same order: nothing cut
    assert e2e.align_adaptive(sc, a, a) == (a, a, "")


def test_upstream_notes_compare_the_churn_requests_both_runs_sent() -> None:
    """0.5.13 against stock spec v1 in an adaptive scenario: the note compares requests by key,
    as the checks do (it compared them by position, so every request looked different)."""
    sc = {"name": "eos_churn", "kind": "eos_churn", "top_logprobs_num": 2}
    tops = [[(-0.1, 1), (-3.0, 2)]]
    r1, r3 = _lp_rec([1], tops), _lp_rec([3], [[(-0.1, 3), (-3.0, 2)]])
    stock = {"result": {"scenarios": {"eos_churn": {"outputs": [r1, r3], "keys": ["x", "z"]}}}}
    upstream = {"returncode": 0, "result": {"scenarios": {"eos_churn": {"outputs": [r3, r1], "keys": ["z", "x"]}}}}
    patched = {"result": {"scenarios": {"eos_churn": {"outputs": [r1, r3], "keys": ["x", "z"]}}}}
    checks, notes = e2e.upstream_checks([sc], stock, upstream, patched, e2e.TREE_V2_LOGPROB_TOL)
    assert all(c.ok for c in checks), checks
    assert notes == ["0.5.13 (spec v2) vs stock spec v1, eos_churn: 2/2 identical"]


def test_sglang_checks_the_length_budget_before_stop_tokens_in_an_accept_step() -> None:
    """The premise of ``budget_hides_stop``, on SGLang's own ``Req``: an EOS inside the accept
    step that reaches ``max_new_tokens`` is ignored (the request ends by length with the tokens
    after it); the same EOS in a step that ends before the budget stops the request."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    def run(steps: list[list[int]]) -> tuple[int, dict[str, Any]]:
        sp = SamplingParams(max_new_tokens=12, ignore_eos=False)
        sp.normalize(None)
        req = Req("r", "", [1, 3, 4], sp, eos_token_ids={2}, vocab_size=4096)
        for step in steps:
            req.output_ids.extend(step)
            req.check_finished(len(step))
            if req.finished():
                break
        return len(req.output_ids_through_stop), req.finished_reason.to_json()

    assert run([[5, 6, 7, 8], [5, 6, 7, 8], [2, 9, 10, 11]]) == (12, {"type": "length", "length": 12})
    assert run([[5, 6, 7, 8], [5, 6, 7], [8, 2, 9]]) == (9, {"type": "stop", "matched": 2})


def test_a_stop_hidden_by_the_length_budget_is_explained_only_in_that_shape() -> None:
    sc = {"name": "eos_churn", "kind": "eos_churn", "top_logprobs_num": 2}
    ids = [5, 6, 7, 8, 2]
    stopped = _rec(ids, finish="stop", matched=2)
    budget = _rec(ids + [9, 10, 11], finish="length")  # the step [2, 9, 10, 11] reached the budget
    d = e2e.first_difference(stopped, budget, max_accept=4)
    assert not d["near_tie"] and "max_new_tokens" in d["explained"]
    ties = e2e.near_tie_checks(sc, {"outputs": [stopped]}, {"outputs": [budget]}, max_accept=4)
    assert ties[0].ok and "1 requests part where SGLang's length check hid" in ties[0].detail
    # a longer tail than one step holds, another token at the stop's position, the longer side
    # not ending by length, or no step bound: a failure
    for other, bound in ((_rec(ids + [9, 10, 11, 12], finish="length"), 4),
                         (_rec([5, 6, 7, 8, 3, 9, 10], finish="length"), 4),
                         (_rec(ids + [9, 10, 11], finish="stop", matched=11), 4),
                         (budget, None)):
        assert not e2e.first_difference(stopped, other, max_accept=bound).get("explained")
        assert not e2e.near_tie_checks(sc, {"outputs": [stopped]}, {"outputs": [other]}, max_accept=bound)[0].ok
    # either order
    assert e2e.first_difference(budget, stopped, max_accept=4).get("explained")


def test_case_max_accept_is_the_case_steps_plus_one() -> None:
    cases = {c.name: c for c in e2e.all_cases()}
    assert e2e.case_max_accept(cases["treev2-eos-page16-standalone-fa3-3x4x16"]) == 4
    assert e2e.case_max_accept(cases["treev2-standalone-flashinfer-5x4x8-graph-nopcg"]) == 6
    assert e2e.case_max_accept(cases["treev2-auto-eagle3-default"]) == 6
    assert e2e.case_max_accept(cases["treev2-auto-eagle-default"]) == 6


def test_judge_rebuilds_the_adaptive_scenarios_of_an_older_saved_file() -> None:
    """A file saved before keys and ``found`` were kept: the judge rebuilds them as the run
    built them, so the churn requests are paired by key, not by position."""
    search = {"name": "eos_search", "kind": "eos_search", "rounds": [[[11, 12], [13]], [[14, 15, 16], [17]]],
              "max_new_tokens": 12, "want": 1, "eos_ids": [2]}
    churn = {"name": "eos_churn", "kind": "eos_churn", "source": "eos_search", "stop_requests": 1,
             "length_requests": 2, "seed": 3}
    outs = [_rec([5, 2, 6]), _rec([7, 8, 9, 10]), _rec([3, 4, 3, 4]), _rec([6, 6, 6, 6])]
    live = {"outputs": outs, "prompts": [[11, 12], [13], [14, 15, 16], [17]], "found": [0], "scenario": search}
    prompts, params, _ = e2e.eos_churn_requests(churn, live)
    keys = [e2e.request_key(x, q) for x, q in zip(prompts, params)]
    run = {"eos_search": {"outputs": outs}, "eos_churn": {"outputs": [_rec([1])] * len(prompts)}}
    e2e.rebuild_adaptive([search, churn], {"stock": run})
    assert run["eos_search"]["found"] == [0] and run["eos_search"]["prompts"] == live["prompts"]
    assert run["eos_churn"]["keys"] == keys and len(set(keys)) == len(keys) >= 3


def test_soak_group_covers_fa3_pcg_and_multilayer_eagle(tmp_path: Path) -> None:
    """The soak runs beyond Triton: FA3 and MTP token for token under deterministic inference,
    and SGLang's default configuration (piecewise CUDA graph on) batch-variant, with top
    logprobs on every request so that a difference can be judged a near-tie."""
    soak = {c.name: c for c in e2e.select_cases(None, groups=["soak"])}
    assert set(soak) == {"soak-eagle3-triton-det", "fa3soak-eagle3-det", "fa3soak-eagle3-default",
                         "mtpsoak-fa3-det"}
    assert all(c.profile in e2e.SOAK_PROFILES for c in soak.values())
    default = soak["fa3soak-eagle3-default"]
    kw = e2e.engine_kwargs(default, tmp_path)
    assert "attention_backend" not in kw and "disable_piecewise_cuda_graph" not in kw
    assert not kw.get("enable_deterministic_inference") and default.batch_variant
    assert default.logprob_tol == e2e.TREE_V2_LOGPROB_TOL
    for name in ("fa3soak-eagle3-det", "mtpsoak-fa3-det"):
        c = soak[name]
        assert c.batch_variant and c.profile == "soak-ties"
        assert e2e.engine_kwargs(c, tmp_path)["enable_deterministic_inference"] is True
    assert not soak["soak-eagle3-triton-det"].batch_variant  # Triton's soak: token for token
    assert soak["mtpsoak-fa3-det"].algorithm == "EAGLE"
    ties = {s["name"]: s for s in e2e.scenarios("soak-ties", 4096, soak_requests=200)}
    plain = {s["name"]: s for s in e2e.scenarios("soak", 4096, soak_requests=200)}
    assert ties.keys() == plain.keys()
    for name, sc in ties.items():
        assert sc["top_logprobs_num"] == e2e.TREE_TOP_LOGPROBS and sc["return_logprob"]
        assert sc["input_ids"] == plain[name]["input_ids"]
    # the near-tie check judges a batch-variant case's differences (and only then)
    a = {"outputs": [{"output_ids": [5, 6], "top_logprobs": [[[-0.1, 5], [-0.2, 9]], [[-0.1, 6], [-3.0, 7]]]}]}
    b = {"outputs": [{"output_ids": [9, 6], "top_logprobs": [[[-0.1, 9], [-0.2, 5]], [[-0.1, 6], [-3.0, 7]]]}]}
    sc = dict(ties["arrivals"], input_ids=[[3, 4]], sampling_params=[{"max_new_tokens": 2}])
    checks = e2e.output_checks([sc], {"arrivals": a}, {"arrivals": b}, default.logprob_tol,
                               near_ties=default.batch_variant)
    assert any("near-tie" in c.name and c.ok for c in checks)
    assert all(c.ok for c in checks if c.name.endswith("outputs identical")), checks


def test_stock_scatter_notes_count_what_two_stock_runs_disagree_on() -> None:
    def run(outputs):
        return {"returncode": 0, "result": {"scenarios": {"soak": {"outputs": outputs}}}}

    o = lambda *ids, **kw: dict({"output_ids": list(ids)}, **kw)  # noqa: E731
    sc = [{"name": "soak"}]
    s1 = run([o(1, 2), o(3, 4), o(5, 6), o(7, abort_requested=True)])
    s2 = run([o(1, 2), o(3, 9), o(5, 6), o(8, abort_requested=True)])
    pp = run([o(1, 2), o(3, 9), o(5, 7), o(7)])
    (note,) = e2e.stock_scatter_notes(sc, s1, s2, pp)
    assert note == ("soak: stock run 1 vs stock run 2 differ on 1/3 finished requests; "
                    "stock run 1 vs patched on 2/3; aborted ones parting as prefixes: stock vs stock 1/1, "
                    "stock vs patched 0/1")
    assert e2e.stock_scatter_notes(sc, s1, {"returncode": 1}, pp) == ["second stock run did not finish"]


def test_a_near_tie_scenario_explains_its_aborted_outputs_too() -> None:
    tie = [e2e.Check("soak: every difference a near-tie (margin <= 0.25 on both sides)", True, "")]
    checks = [e2e.Check("soak: aborted outputs agree as prefixes", False, "1 disagree"),
              e2e.Check("soak: lengths as requested", False, "x"),
              e2e.Check("arrivals: aborted outputs agree as prefixes", False, "1 disagree")]
    out = {c.name: c for c in e2e.explain_by_near_ties(checks, tie)}
    assert out["soak: aborted outputs agree as prefixes"].ok
    assert not out["soak: lengths as requested"].ok  # only the output comparisons
    assert not out["arrivals: aborted outputs agree as prefixes"].ok  # no near-tie check there


def test_the_sidle_group_runs_the_wal_cases_with_the_idle_poll_skip_on_instead() -> None:
    """Back-port 17's idle-poll skip (named, though the default since 2026-11-29): its group runs
    the eleven cases of ``wal`` with its own switch in place of back-port 27's, each judged as its
    twin."""
    from sglang_futuremap_patch.backports import war_barrier

    cases = e2e.select_cases(None, groups=["sidle"])
    assert [c.name for c in cases] == [c.name for c in e2e.war_barrier_skip_idle_cases()]
    wal = {c.name.removeprefix("wal-"): c for c in e2e.war_barrier_after_launch_cases()}
    assert [c.name.removeprefix("sidle-") for c in cases] == list(wal)
    twins = {c.name: c for c in e2e.all_cases()}
    on = (war_barrier.WAR_BARRIER_SKIP_IDLE_ENV, "1")
    for case in cases:
        twin = twins[case.name.removeprefix("sidle-")]
        assert case.env == twin.env + (on,)
        assert dataclasses.replace(case, name=twin.name, env=twin.env) == twin


def test_the_wal_group_runs_cases_of_other_groups_with_back_port_27_on() -> None:
    """Back-port 27 is opt-in: its group runs eleven cases of the FA3 set, the intake, tree-v2 and
    released groups with its switch on, each judged as its twin (same launch, same oracle) and
    nothing else changed; the default configuration on both algorithms, FA3 and Triton with EOS
    churn and radix hits, pages of 16, eager batches above the graph sizes, a tree and grammar."""
    cases = e2e.select_cases(None, groups=["wal"])
    assert [c.name for c in cases] == [c.name for c in e2e.war_barrier_after_launch_cases()]
    assert len(cases) == 11 and len({c.name for c in e2e.all_cases()}) == len(e2e.all_cases())
    twins = {c.name: c for c in e2e.all_cases() if not c.name.startswith("wal-")}
    on = ("SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH", "1")
    for case in cases:
        twin = twins[case.name.removeprefix("wal-")]
        assert case.env == twin.env + (on,)
        assert dataclasses.replace(case, name=twin.name, env=twin.env) == twin
    assert {c.backend for c in cases} == {"default", "fa3", "triton"}
    assert {c.profile for c in cases} >= {"matrix", "eos", "radix", "tree-eos"}
    assert any(c.tree_v2 for c in cases) and any(dict(c.extra).get("cuda_graph_max_bs") == 8 for c in cases)
