"""CPU checks of the kits harness (scripts/gpu_kits.py, scripts/gpu_kits_cases.py) against the
real installed SGLang: every kit and fixture it ships is run or listed not applicable, the
fixture subclasses launch our server (arguments parsed by SGLang's own parser), the patched
tree carries the series, the kits' tokenizer and data, thresholds, the record. No server starts.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
import unittest
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_kits as gk  # noqa: E402
import gpu_kits_cases as kc  # noqa: E402
from gpu_harness import child_env, launch, logs, port_blocks  # noqa: E402

SGLANG_DIR = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])  # not imported
KITS_DIR = SGLANG_DIR / "test" / "kits"
FIXTURES_DIR = SGLANG_DIR / "test" / "server_fixtures"


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}


def _defs(path: Path) -> dict[str, set[str]]:
    """Top-level classes (with the methods they define) and functions of a module, by AST."""
    tree = ast.parse(path.read_text())
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = set()
    return out


@pytest.fixture(scope="module")
def datasets_importable():
    """The fixtures import ``datasets`` through sglang.test.test_utils: the stand-in, where it
    is missing (as on the GPU machine and here)."""
    added = importlib.util.find_spec("datasets") is None
    if added:
        sys.path.append(str(child_env.DATASETS_STAND_IN))
    yield
    if added:
        sys.path.remove(str(child_env.DATASETS_STAND_IN))


# ----------------------------------------------------------------------------- discovery


def test_every_kit_module_is_run_or_not_applicable():
    shipped = _modules(KITS_DIR)
    run = {m for c in kc.KIT_CASES for m in c.kit_modules}
    assert not run & set(kc.NOT_APPLICABLE_KITS)
    new = sorted(shipped - run - set(kc.NOT_APPLICABLE_KITS))
    assert not new, f"SGLang ships kits the harness neither runs nor lists as not applicable: {new}"
    stale = sorted((run | set(kc.NOT_APPLICABLE_KITS)) - shipped)
    assert not stale, f"the catalogue names kits SGLang does not ship: {stale}"


def test_every_fixture_module_is_used_or_not_applicable():
    shipped = _modules(FIXTURES_DIR)
    used = {f.module for f in kc.FIXTURES.values()}
    assert {c.fixture for c in kc.KIT_CASES} == set(kc.FIXTURES), "a fixture no case uses, or a case without one"
    assert not used & set(kc.NOT_APPLICABLE_FIXTURES)
    assert shipped == used | set(kc.NOT_APPLICABLE_FIXTURES), sorted(shipped ^ (used | set(kc.NOT_APPLICABLE_FIXTURES)))


def test_kit_members_and_not_applicable_tests_exist():
    for case in kc.KIT_CASES:
        methods: set[str] = set()
        for kit in case.kits:
            module, name = kit.split(".")
            defs = _defs(KITS_DIR / f"{module}.py")
            assert name in defs, f"{case.name}: {kit} is not defined by SGLang"
            if kit in kc.FUNCTION_KITS:
                assert not defs[name], f"{kit} is a class: run it as a mixin"
                methods |= {m for m in vars(kc.FUNCTION_KITS[kit]) if m.startswith("test_")}
            else:
                methods |= defs[name]
        fx = kc.FIXTURES[case.fixture]
        fixture_methods = _defs(FIXTURES_DIR / f"{fx.module}.py")[fx.cls]
        assert any(m.startswith("test_") for m in methods), f"{case.name}: no test methods"
        for test, _ in case.not_applicable:
            assert test in methods, f"{case.name}: {test} is no test of its kits"
        for test, _ in fx.not_applicable:
            assert test in fixture_methods, f"{fx.cls} defines no {test}"
        for attr in case.thresholds + tuple(k for k, _ in case.knobs):
            assert any(attr in (KITS_DIR / f"{m}.py").read_text() for m in case.kit_modules), f"{case.name}: {attr}"


def test_reasons_are_one_line():
    reasons = [*kc.NOT_APPLICABLE_KITS.values(), *kc.NOT_APPLICABLE_FIXTURES.values()]
    reasons += [r for c in kc.KIT_CASES for _, r in c.not_applicable]
    reasons += [r for f in kc.FIXTURES.values() for _, r in f.not_applicable]
    assert all(r.strip() and "\n" not in r and len(r) < 220 for r in reasons)


def test_select_cases_by_name_and_kit_module():
    assert [c.name for c in gk.select_cases(["spec-*"])] == ["spec-eagle3", "spec-standalone"]
    by_module = [c.name for c in gk.select_cases(["abort_timeout_kit", "abort-all"])]
    assert by_module == ["abort-all", "waiting-timeout", "running-timeout"]
    assert gk.select_cases(None) == list(kc.KIT_CASES)
    with pytest.raises(gk.UsageError, match="not applicable"):
        gk.select_cases(["lm_eval_kit"])
    with pytest.raises(gk.UsageError):
        gk.parse_flavours("stock,plugins")
    assert gk.parse_flavours("tree, stock,tree") == ["tree", "stock"]
    assert [c.name for c in gk.shard(kc.KIT_CASES, "2/8")] == [kc.KIT_CASES[1].name, kc.KIT_CASES[9].name]
    assert sum(len(gk.shard(kc.KIT_CASES, f"{i}/3")) for i in (1, 2, 3)) == len(kc.KIT_CASES)
    with pytest.raises(gk.UsageError, match="I/N"):
        gk.shard(kc.KIT_CASES, "3/2")


# ----------------------------------------------------------------------------- fixtures


PLAN = kc.ServerPlan(model="/models/kits-target", draft="/models/draft", port=24000, nccl_port=24002,
                     backend="triton", data_dir="/data", thresholds={})


def _launch(case: kc.KitCase, plan: kc.ServerPlan, monkeypatch) -> tuple[type, dict[str, Any]]:
    """Build the case's class on the real fixture and run its setUpClass with
    popen_launch_server recorded instead of called."""
    cls = kc.build_test_class(case, plan, kits=())
    module = sys.modules[cls.kits_fixture_module]
    seen: dict[str, Any] = {}

    def popen_launch_server(model, base_url, timeout, api_key=None, other_args=None, env=None, **kw):
        seen.update(model=model, url=base_url, args=[str(a) for a in other_args or []], env=env,
                    url_global=getattr(module, "DEFAULT_URL_FOR_TEST", None))
        return type("Process", (), {"pid": -1, "poll": lambda self: None})()

    monkeypatch.setattr(module, "popen_launch_server", popen_launch_server)
    if hasattr(module, "get_tokenizer"):
        monkeypatch.setattr(module, "get_tokenizer", lambda path: None)
    saved = dict(os.environ)
    url_before = getattr(module, "DEFAULT_URL_FOR_TEST", None)
    try:
        cls.setUpClass()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert getattr(module, "DEFAULT_URL_FOR_TEST", None) == url_before, "the fixture's URL was not restored"
    return cls, seen


@pytest.mark.parametrize("backend", ["triton", "fa3"])
def test_fixture_subclasses_launch_our_server(datasets_importable, monkeypatch, backend):
    from sglang.srt.server_args import ServerArgs
    from sglang.test import test_utils

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    upstream_models = {v for k, v in vars(test_utils).items() if k.startswith("DEFAULT_") and "MODEL" in k
                       and isinstance(v, str)}
    for case in kc.KIT_CASES:
        plan = kc.ServerPlan(**dict(vars(PLAN), backend=backend, thresholds=kc.case_thresholds(case, {})[0]))
        cls, seen = _launch(case, plan, monkeypatch)
        assert seen["model"] == plan.model and seen["url"] == plan.url == cls.base_url, case.name
        args = seen["args"]
        flags = [a.split("=")[0] for a in args if a.startswith("--")]
        assert len(flags) == len(set(flags)), f"{case.name}: a flag given twice: {args}"
        assert not upstream_models & set(args) and not any(a.split("=")[-1] in upstream_models for a in args), args
        ns = parser.parse_args(["--model-path", plan.model, *args])
        assert (ns.speculative_algorithm, ns.speculative_draft_model_path) == (case.algorithm, plan.draft), case.name
        assert (ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens) == (3, 1, 4)
        assert ns.attention_backend == backend and ns.nccl_port == plan.nccl_port
        assert ns.mem_fraction_static == kc.MEM_FRACTION_STATIC and ns.max_total_tokens == kc.MAX_TOTAL_TOKENS
        assert ns.disable_piecewise_cuda_graph is (not case.pcg) and ns.cuda_graph_max_bs == kc.CUDA_GRAPH_MAX_BS
        for flag, value in kc.arg_pairs(case.server_args):  # a switch (value None) is on
            assert str(getattr(ns, flag[2:].replace("-", "_"))) == str(True if value is None else value), flag
        if case.fixture == "streaming_session":
            assert ns.enable_streaming_session
        for test, _ in kc.FIXTURES[case.fixture].not_applicable + case.not_applicable:
            assert getattr(getattr(cls, test), "__unittest_skip__", False), (case.name, test)
        for attr, value in case.knobs + tuple(plan.thresholds.items()):
            assert getattr(cls, attr) == value
        assert issubclass(cls, unittest.TestCase) and cls.__name__ == case.class_name


def test_kit_mixins_resolve(datasets_importable):
    importable = [c for c in kc.KIT_CASES if all(importlib.util.find_spec(m) for m in ("tabulate",))
                  or "spec_decoding_kit" not in c.kit_modules]
    for case in importable:
        kits = kc.resolve_kits(case)
        assert len(kits) == len(case.kits)
        assert all(any(n.startswith("test_") for n in dir(k)) for k in kits), case.name


def test_merge_args_gives_each_flag_our_value():
    base = ["--trust-remote-code", "--cuda-graph-max-bs", "8", "--mem-fraction-static", 0.7,
            "--speculative-draft-model-path=upstream/draft"]
    merged = kc.merge_args(base, ["--mem-fraction-static", 0.2, "--speculative-draft-model-path", "ours",
                                  "--disable-piecewise-cuda-graph"])
    assert merged == ["--trust-remote-code", "--cuda-graph-max-bs", "8", "--mem-fraction-static", 0.2,
                      "--speculative-draft-model-path", "ours", "--disable-piecewise-cuda-graph"]
    with pytest.raises(ValueError):
        kc.arg_pairs(["value-without-flag"])


# ----------------------------------------------------------------------------- flavours and the tree


def _setup(tmp_path: Path, tree: str | None, stand_in: bool = False) -> gk.Setup:
    variants = {f: child_env.make_variants([gk.FLAVOURS[f]], tree=tree)[0] for f in gk.FLAVOURS if f != "tree" or tree}
    return gk.Setup(work=tmp_path, models={}, kits_model=tmp_path, data_dir=tmp_path, bin_dir=tmp_path / "bin",
                    log_config=tmp_path / "logging.json", backend="triton", fa3=False, variants=variants,
                    stand_in={"stock": stand_in})


def test_flavour_environments(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/bundle/site312")  # a site holding SGLang: kept, behind the tree
    setup = _setup(tmp_path, "/trees/python", stand_in=True)
    case = kc.CASES_BY_NAME["waiting-timeout"]
    block = port_blocks.PortBlock(24016)
    envs = {f: gk.flavour_env(setup, f, tmp_path / "probe", case=case, ports=block) for f in gk.FLAVOURS}
    assert {f: e[child_env.ENV_MODE] for f, e in envs.items()} == {"stock": "off", "plugin": "strict", "tree": "off"}
    for f, env in envs.items():
        path = env["PYTHONPATH"].split(os.pathsep)
        assert path[0] == str(child_env.PROBE_DIR) and "/bundle/site312" in path
        assert path[1] == "/trees/python" if f == "tree" else "/trees/python" not in path
        assert (str(child_env.DATASETS_STAND_IN) in path) is (f == "stock") and path[-1 if f == "stock" else 0] != ""
        assert env["PATH"].split(os.pathsep)[0] == str(setup.bin_dir)
        assert env["SGLANG_SPEC_NAN_DETECTION"] == env["SGLANG_SPEC_OOB_DETECTION"] == "1"
        assert env["SGLANG_REQ_WAITING_TIMEOUT"] == "0.001" and env["SGLANG_PORT"] == str(block.sglang_port)
        assert env["SGLANG_ENABLE_SPEC_V2"] == "1" and env["SGLANG_TEST_MAX_RETRY"] == "0"
    assert [v.plugin_expected for v in setup.variants.values()] == ["disabled", "applied", "disabled"]
    assert gk.sglang_source_problem(setup, "tree", "/trees/python/sglang/__init__.py") is None
    assert "not from the tree" in gk.sglang_source_problem(setup, "tree", "/bundle/site312/sglang/__init__.py")
    assert "from the tree" in gk.sglang_source_problem(setup, "stock", "/trees/python/sglang/__init__.py")
    with pytest.raises(ValueError, match="tree variant needs its site"):
        child_env.make_variants(["tree"])


@pytest.fixture(scope="module")
def tree_site(tmp_path_factory) -> Path:
    return child_env.build_tree_site(tmp_path_factory.mktemp("kits-tree"))


def test_tree_variant_carries_the_series(tree_site, sglang_loaded, tmp_path):
    """The tree's functions are the plugin's replacements (as tests/test_drift.py checks on a
    pristine git tree), and the installed SGLang's are not: the patches were applied."""
    from sglang_futuremap_patch import series_tools
    from sglang_futuremap_patch._engine import ABSENT, normalized_source

    series = sglang_loaded
    assert (tree_site / "sglang" / "__init__.py").is_file() and not list(tree_site.rglob("__pycache__"))
    pristine = tmp_path / "installed"
    (pristine / "python").mkdir(parents=True)
    (pristine / "python" / "sglang").symlink_to(SGLANG_DIR)
    patched = series_tools.patched_function_sources(tree_site.parent, series)
    installed = series_tools.patched_function_sources(pristine, series)
    last = {t.path: t for bp in series for t in bp.targets}
    spliced = [t for t in last.values() if t.kind == "splice"]
    assert spliced
    for t in spliced:
        want = normalized_source(t.replacement.fget if isinstance(t.replacement, property) else t.replacement)
        assert patched[t.path] is not None and series_tools.normalized_text(patched[t.path]) == want, t.path
        if t.expected == ABSENT:
            assert installed[t.path] is None, t.path
        else:
            assert series_tools.normalized_text(installed[t.path] or "") != want, t.path
    for t in last.values():
        for edit in t.edits:
            text = series_tools.module_file(tree_site.parent, t.owner).read_text()
            # an edit target's edits are written against the dedented function
            assert edit.new in text or (t.kind == "edit" and all(
                line.strip() in text for line in edit.new.splitlines()))


def test_tree_site_falls_back_to_patch(tmp_path, monkeypatch):
    patch = subprocess.run(["which", "patch"], capture_output=True, text=True).stdout.strip()
    if not patch:
        pytest.skip("no patch program here")
    only_patch = tmp_path / "bin"
    only_patch.mkdir()
    (only_patch / "patch").symlink_to(patch)
    monkeypatch.setenv("PATH", str(only_patch))  # no git
    site = child_env.build_tree_site(tmp_path / "t")
    assert "forward_spec_v2_overlap" in (site / "sglang/srt/managers/scheduler.py").read_text()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match="neither git nor patch"):
        child_env.build_tree_site(tmp_path / "u")


# ----------------------------------------------------------------------------- the kits' model and data


@pytest.fixture(scope="module")
def kits_model(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("target")
    (target / "config.json").write_text(json.dumps({"vocab_size": 4096, "eos_token_id": 2}))
    (target / "model.safetensors").write_bytes(b"weights")
    (target / "tokenizer.json").write_text("{}")  # the word-level one: not copied
    return kc.write_kits_model(target, tmp_path_factory.mktemp("kits") / "kits-target")


def test_kits_tokenizer_spells_the_kits_text(kits_model):
    from transformers import AutoTokenizer

    assert (kits_model / "model.safetensors").read_bytes() == b"weights"
    tok = AutoTokenizer.from_pretrained(str(kits_model))
    assert len(tok) == 4096 and (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    matched_stop = (KITS_DIR / "matched_stop_kit.py").read_text()
    for text in ("user@example.com", "(555) 123-4567", '{"name": "Paris", "population": 2}', "\n", ",",
                 "[2024-01-01T12:00:00Z] INFO: System.process", matched_stop[:600], "Héllo wörld"):
        ids = tok.encode(text)
        assert ids and 0 not in ids and tok.decode(ids) == text
    assert len(tok.encode("hi" * 257)) > 256
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "user: What is 2 + 2?\nassistant:"


def test_kits_data_is_what_the_kits_read(kits_model, tmp_path, monkeypatch, datasets_importable):
    """The KL kit's own loader and the cache-hit kit's own sampler take our files, offline."""
    from transformers import AutoTokenizer

    import sglang.test.kl_test_utils as kl
    from sglang.benchmark.datasets.random import sample_random_requests

    assert (kl.DEFAULT_PROMPT_TOKENS, kl.DEFAULT_NUM_SAMPLES) == (kc.KL_PROMPT_TOKENS, kc.KL_SAMPLES)
    kc.write_kits_data(tmp_path, str(kits_model), 4096)
    monkeypatch.setattr(kl, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kl, "_cached_input_ids", {})
    prompts = kl.get_input_ids(tokenizer_path=str(kits_model), num_samples=kl.DEFAULT_NUM_SAMPLES)
    assert len(prompts) == kc.KL_SAMPLES and all(300 <= len(p) <= 1200 and min(p) >= 3 for p in prompts)
    rows = sample_random_requests(input_len=256, output_len=32, num_prompts=8, range_ratio=1.0,
                                  tokenizer=AutoTokenizer.from_pretrained(str(kits_model)),
                                  dataset_path=str(tmp_path / kc.SHAREGPT_FILE), return_text=False)
    assert len(rows) == 8 and all(len(r.prompt) == 256 for r in rows)


# ----------------------------------------------------------------------------- thresholds


def test_the_repo_thresholds_file_says_not_fitted_or_covers_every_case():
    doc = kc.load_thresholds(kc.THRESHOLDS_FILE)
    needs = {c.name: list(c.thresholds) for c in kc.KIT_CASES if c.thresholds}
    assert doc["rules"] == {a: rule for a, (_, rule) in kc.FIT_RULES.items()}
    if not doc["fitted"]:
        assert "not fitted" in doc["note"] and not doc["cases"]
        assert doc["needs"] == needs
        for case in kc.KIT_CASES:
            values, fitted = kc.case_thresholds(case, doc)
            assert fitted is (not case.thresholds) and values == {a: kc.UNFITTED[a] for a in case.thresholds}
    else:
        assert all(kc.case_thresholds(kc.CASES_BY_NAME[c], doc)[1] for c in needs)


def test_fit_and_thresholds_roundtrip(tmp_path):
    log = "\n".join([
        "[CI Test Method] TestSpecEagle3.test_bs_1_speed",
        "[2026-11-23 10:00:00 INFO pid=7] Decode batch. #running-req: 1",
        "acc_length=2.50 speed=800.00",
        "[CI Test Method] TestKlDivergence.test_input_output_logprobs_match_decode_cache_hit",
        "avg_kl_div=0.002",
        "[CI Test Method] TestKlDivergence.test_input_output_logprobs_match_prefill_cache_hit",
        "avg_kl_div=0.0001",
    ])
    m = kc.measured_values(log)
    assert m == {"accept_length": 2.5, "speed": 800.0, "kl_decode": 0.002, "kl_prefill": 0.0001}
    cases = [kc.CASES_BY_NAME[n] for n in ("spec-eagle3", "kl-divergence")]
    doc = kc.fitted_document({"spec-eagle3": m, "kl-divergence": m}, {"gpu": "H100"}, cases)
    assert doc["cases"] == {"spec-eagle3": {"accept_length_thres": 2.25, "bs_1_speed_thres": 240.0},
                            "kl-divergence": {"kl_div_thres_prefill": 0.0011, "kl_div_thres_decode": 0.006}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    loaded = kc.load_thresholds(path)
    assert kc.case_thresholds(cases[0], loaded) == ({"accept_length_thres": 2.25, "bs_1_speed_thres": 240.0}, True)
    assert kc.case_thresholds(kc.CASES_BY_NAME["pcg-spec"], loaded)[1] is False  # not in this fit
    with pytest.raises(kc.ThresholdsError, match="spec-standalone.accept_length"):
        kc.fitted_document({"spec-eagle3": m}, {}, [cases[0], kc.CASES_BY_NAME["spec-standalone"]])
    path.write_text("{not json")
    with pytest.raises(kc.ThresholdsError, match="not valid JSON"):
        kc.load_thresholds(path)
    path.write_text("[]")
    with pytest.raises(kc.ThresholdsError, match="not a kits thresholds file"):
        kc.load_thresholds(path)


def test_fit_writes_the_file_and_keeps_other_cases_fitted(tmp_path):
    kl = kc.CASES_BY_NAME["kl-divergence"]
    earlier = kc.fitted_document({"kl-divergence": {"kl_prefill": 0.001, "kl_decode": 0.002}}, {}, [kl])
    repo_file = tmp_path / "thresholds.json"
    repo_file.write_text(json.dumps(earlier))
    args = argparse.Namespace(thresholds=repo_file)
    record = {"cases": [{"name": "spec-eagle3"}], "environment": {"gpu": "H100", "backend": "fa3"}}
    results = [{"case": "spec-eagle3", "flavour": "stock", "measured": {"accept_length": 3.0, "speed": 1000.0}}]
    assert gk.write_fit(args, tmp_path, record, results) == 0
    written = json.loads((tmp_path / "kits-thresholds.json").read_text())
    assert written == json.loads(repo_file.read_text()) and written["fitted_on"]["backend"] == "fa3"
    assert set(written["cases"]) == {"kl-divergence", "spec-eagle3"}
    assert written["cases"]["spec-eagle3"] == {"accept_length_thres": 2.7, "bs_1_speed_thres": 300.0}
    before = repo_file.read_text()
    assert gk.write_fit(args, tmp_path, record, [dict(results[0], measured={})]) == 1  # nothing measured
    assert repo_file.read_text() == before


# ----------------------------------------------------------------------------- jobs, checks, record


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="test_sglang_kits.TestSanity" name="test_health" time="0.5"/>
<testcase classname="test_sglang_kits.TestSanity" name="test_max_token_one" time="1.2">
  <failure message="AssertionError: 0 not greater than 0">trace</failure></testcase>
<testcase classname="test_sglang_kits.TestSanity" name="test_long_prompt" time="0.0">
  <skipped type="pytest.skip" message="not applicable: context"/></testcase>
<testcase classname="test_sglang_kits.TestSanity" name="test_health_generate" time="0.1">
  <failure message="f"/><error message="teardown failed"/></testcase>
</testsuite></testsuites>"""


def test_junit_and_job_status(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text(JUNIT)
    tests = gk.parse_junit(path)
    assert [(t["name"], t["status"]) for t in tests] == [
        ("test_health", "passed"), ("test_max_token_one", "failed"), ("test_long_prompt", "skipped"),
        ("test_health_generate", "error")]
    assert tests[1]["message"] == "AssertionError: 0 not greater than 0" and tests[1]["seconds"] == 1.2
    assert gk.job_status(0, tests, "") == ("failed", None)
    assert gk.job_status(0, tests[:1] + tests[2:3], "") == ("passed", None)
    assert gk.job_status(0, tests[2:3], "") == ("skipped", None)
    killed = f"[gpu_kits] regex-plugin {launch.KILLED_AT_LIMIT} 118 s\n"  # what run_worker writes
    assert gk.job_status(-9, [], killed) == ("error", "no test results (killed at the time limit)")
    assert gk.job_status(-9, [], "")[1].startswith("no test results (killed by SIGKILL before the time limit")
    assert gk.job_status(2, [], "") == ("error", "no test results (exit status 2)")
    assert gk.job_status(0, tests[3:], "") == ("error", "teardown failed")
    assert gk.parse_junit(tmp_path / "missing.xml") == []


def test_a_job_cut_off_by_the_budget_is_not_read_as_a_hang():
    """On the H100 two regex jobs were killed when the run's --budget ran out, 118 s in; the
    record said "killed at the time limit", which reads like a server that hung."""
    status, error = gk.job_status(-9, [], f"[gpu_kits] regex-plugin {launch.KILLED_AT_LIMIT} 118 s\n")
    killed = {"status": status, "error": error, "returncode": -9}
    cut = gk.budget_cut(killed, 118.4, 360)
    assert cut["status"] == "error" and cut["error"].startswith("cut off when the run's --budget ran out (118 s")
    assert gk.budget_cut(killed, None, 360) is killed  # no budget: its own --timeout killed it
    assert gk.budget_cut(killed, 500, 360) is killed  # the budget left more than its timeout
    done = {"status": "failed", "error": None, "returncode": 1}
    assert gk.budget_cut(done, 118.4, 360) is done  # it finished inside the cut-down limit


def _log(applied: int = 0, disabled: int = 0, pids: tuple[int, ...] = (), bad: tuple[str, ...] = ()):
    return logs.LogFindings(applied_pids=list(pids), applied_lines=applied, disabled_lines=disabled,
                             bad_lines=list(bad))


def _probe(scheduler_calls: int, pids: tuple[int, ...] = (11,)):
    return logs.ProbeSummary(processes=[], scheduler_pids=list(pids), scheduler_calls=scheduler_calls,
                              total_calls=scheduler_calls, mechanisms=[])


def test_flavour_checks():
    assert gk.flavour_check("stock", _log(disabled=2), _probe(40), True)[0]
    assert not gk.flavour_check("stock", _log(disabled=2), _probe(0), True)[0]
    assert not gk.flavour_check("stock", _log(applied=1, disabled=1, pids=(11,)), _probe(3), True)[0]
    assert gk.flavour_check("plugin", _log(applied=2, pids=(10, 11)), _probe(0), True)[0]
    ok, why = gk.flavour_check("plugin", _log(applied=1, pids=(10,)), _probe(0), True)
    assert not ok and "schedulers [11]" in why
    assert not gk.flavour_check("plugin", _log(applied=2, pids=(10, 11)), _probe(5), True)[0]
    assert gk.flavour_check("tree", _log(disabled=2), _probe(0), True)[0]
    assert not gk.flavour_check("tree", _log(disabled=2), _probe(7), True)[0]
    assert not gk.flavour_check("tree", _log(disabled=2, bad=("WARNING sglang_futuremap_patch: x",)), _probe(0), True)[0]
    assert not gk.flavour_check("stock", _log(disabled=1), _probe(0, pids=()), True)[0]
    assert gk.flavour_check("stock", _log(disabled=1), _probe(0, pids=()), False)[0]  # nothing ran


def _job(case: str, flavour: str, statuses: dict[str, str], *, check: bool = True, status: str | None = None,
         measured: dict[str, float] | None = None, fitted: bool | None = None) -> dict[str, Any]:
    tests = [{"name": n, "status": s, "seconds": 1.0, "message": "" if s == "passed" else f"{n} {s}"}
             for n, s in statuses.items()]
    job = {"case": case, "flavour": flavour, "status": status or gk.job_status(0, tests, "")[0], "error": None,
           "wall_s": 40.0, "tests": tests, "check": {"ok": check, "detail": "plugin lines"},
           "measured": measured or {}, "thresholds": None}
    if fitted is not None:
        job["thresholds"] = {"fitted": fitted, "values": {"accept_length_thres": 2.0 if fitted else -math.inf}}
    return job


def _record(results, fitted_doc=None, cases=("sanity", "spec-eagle3")):
    env = {"date": "2026-11-24T10:00:00+00:00", "gpu": "NVIDIA H100 80GB HBM3", "sglang": "0.5.12.post1",
           "torch": "2.11.0", "backend": "triton", "fa3": False, "command": "scripts/gpu_kits.py", "wall_s": 300}
    return gk.build_record([kc.CASES_BY_NAME[c] for c in cases], list(gk.FLAVOURS), results, env,
                           fitted_doc or {"fitted": False, "note": kc.NOT_FITTED_NOTE}, fit=False)


def test_record_verdicts_and_markdown():
    sanity = {"test_health": "passed", "test_max_token_one": "passed", "test_long_prompt": "skipped"}
    spec = {"test_bs_1_speed": "passed"}
    results = [_job("sanity", f, sanity) for f in gk.FLAVOURS]
    results += [_job("spec-eagle3", f, spec, measured={"accept_length": 2.4, "speed": 900.0}, fitted=False)
                for f in gk.FLAVOURS]
    record = _record(results)
    json.loads(json.dumps(record, default=str))  # JSON-able (inf thresholds included)
    assert record["verdict"]["outcome"] == "parity" and record["verdict"]["unfitted"] == ["spec-eagle3"]
    md = gk.merge_docs([json.loads(json.dumps(record))])
    assert "| outcome | **parity** |" in md and "not fitted yet: spec-eagle3" in md
    assert "| sanity | server_sanity_kit.ServerSanityMixin | DefaultServerBase | EAGLE3 | passed 2/2 (40 s) |" in md
    assert "passed 1/1 (40 s) unfitted" in md and "| spec-eagle3 | stock | 2.4 | 900.0 |" in md
    assert "`lm_eval_kit`" in md and "`ngram_fixture`" in md and "`test_capital_france`" in md

    # A test that passes on stock and fails on the tree is a regression; one failing on stock is not.
    broken = dict(sanity, test_max_token_one="failed")
    results[2] = _job("sanity", "tree", broken)
    results[0] = _job("sanity", "stock", dict(sanity, test_health="failed"))
    v = _record(results)["verdict"]
    assert v["outcome"] == "regression" and v["regressions"] == [
        "sanity.test_max_token_one on tree: failed test_max_token_one failed"]
    assert v["stock_failures"] == ["sanity.test_health"]

    # An errored job or a failed flavour check leaves the run incomplete.
    results[2] = _job("sanity", "tree", sanity, check=False)
    results[0] = _job("sanity", "stock", sanity)
    assert _record(results)["verdict"]["outcome"] == "incomplete"
    results[2] = dict(gk.not_run(gk.Job(kc.CASES_BY_NAME["sanity"], "tree"), "budget spent"))
    v = _record(results)["verdict"]
    assert v["outcome"] == "incomplete" and "not run (budget spent)" in v["incomplete"][0]
    assert "flavour check failed" in gk.job_cell(_job("sanity", "tree", sanity, check=False))


def test_merge_of_two_runs_and_bad_inputs(tmp_path):
    sanity = {"test_health": "passed"}
    a = _record([_job("sanity", f, sanity) for f in gk.FLAVOURS], cases=("sanity",))
    b = _record([_job("spec-eagle3", f, {"test_bs_1_speed": "passed"}, fitted=True) for f in gk.FLAVOURS],
                cases=("spec-eagle3",), fitted_doc={"fitted": True, "note": ""})
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a, default=str))
    pb.write_text(json.dumps(b, default=str))
    md = gk.merge_files([pb, pa])
    assert md.index("| spec-eagle3 |") < md.index("| sanity |")  # catalogue order, not file order
    assert "| outcome | **parity** |" in md and "| thresholds | fitted |" in md
    with pytest.raises(gk.UsageError, match="no kits record at"):
        gk.merge_files([tmp_path / "none.json"])
    (tmp_path / "e2e.json").write_text(json.dumps({"cases": []}))
    with pytest.raises(gk.UsageError, match="not a kits record"):
        gk.merge_files([tmp_path / "e2e.json"])


# ----------------------------------------------------------------------------- command line


def test_cli_usage_errors_are_one_line(capsys):
    assert gk.main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert "pcg-spec" in listing and "reasoning_kit:" in listing and "tree (tree)" in listing
    for argv, text in ((["--kits", "nothing-*"], "matches no kit case"), (["--flavours", "plugins"], "choose from"),
                       (["--fit", "--kits", "sanity"], "has thresholds"), (["--merge", "/nonexistent.json"], "no kits record at"),
                       (["--thresholds", "/nonexistent.json"], "no thresholds file"), (["--jobs", "0"], "positive")):
        assert gk.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err and "Traceback" not in err, (argv, err)
    with pytest.raises(SystemExit) as exc:
        gk.main(["--help"])
    assert exc.value.code == 0 and "--fit" in capsys.readouterr().out


def test_portable_command_and_launcher(tmp_path):
    cmd = gk.recorded_command(["--models", "/tmp/m", "--out", "/x/out", "--kits", "sanity"])
    assert cmd == "scripts/gpu_kits.py --models MODELS --out OUT --kits sanity"
    launcher = gk.write_launcher(tmp_path / "bin")
    text = launcher.read_text()
    assert os.access(launcher, os.X_OK) and text.startswith(f"#!{sys.executable}\n")
    assert 'if __name__ == "__main__":\n    sys.exit(main())' in text  # not again in SGLang's spawned processes
    assert gk.choose_backend("auto", False) == "triton" and gk.choose_backend("auto", True) == "fa3"
    with pytest.raises(gk.UsageError, match="no FA3"):
        gk.choose_backend("fa3", False)


def test_kits_test_module_skips_without_a_job(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != kc.JOB_ENV}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           str(kc.KITS_TEST_MODULE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    # 5: pytest's "no tests collected" for a module skipped as a whole, run on its own
    assert proc.returncode in (0, 5) and "1 skipped" in proc.stdout and "run_kits.sh" in proc.stdout, proc.stdout[-800:]
    assert "no such job file" in (kc.job_skip_reason() or "") if os.environ.get(kc.JOB_ENV) else kc.job_skip_reason()


def test_run_kits_entry_point():
    script = ROOT / "scripts" / "gpu" / "run_kits.sh"
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    for needed in ("common.sh", "gpu_enter_repo", "gpu_use_bundle", "gpu_setup_models", "scripts/gpu_kits.py",
                   '--models "$MODELS" --out "$OUT"', "bash scripts/gpu/run_kits.sh --fit"):
        assert needed in text, needed
    common = (ROOT / "scripts" / "gpu" / "common.sh").read_text()
    setup = common[common.index("gpu_setup_models() {"):]
    for needed in ("gpu_install_plugin", "gpu_require_plugin", "gpu_fa3_status", "make_tiny_models.py"):
        assert needed in setup, needed
