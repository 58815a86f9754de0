"""Back-port auto-tree-spec-v1: SGLang's auto-chosen EAGLE tree runs on spec v1.

Each case builds SGLang's real ``ServerArgs`` (the whole ``__post_init__``, ``device="cpu"``)
for a tiny model directory holding only ``config.json``, the way ``launch_server`` would for
the same flags, and asks SGLang's own ``create_worker`` which speculative worker it starts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from conftest import ROOT, activate_backport, plugin_only

SPEC_V1_LINE = "Spec v1 is used for {algo} speculative decoding because the auto-chosen tree"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """A Llama target, an EAGLE3 head and a STANDALONE draft (configs only: no weights)."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gpu_harness.model_factory import eagle3_config, llama_config
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    out = tmp_path_factory.mktemp("models")
    target = llama_config()
    configs = {"target": target, "eagle3": eagle3_config(target), "draft": target}
    for name, config in configs.items():
        (out / name).mkdir()
        (out / name / "config.json").write_text(json.dumps(config))
    return {name: str(out / name) for name in configs}


def server_args(models, algorithm: str, draft: str, **extra):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=models["target"], speculative_algorithm=algorithm,
                      speculative_draft_model_path=models[draft], device="cpu",
                      load_format="dummy", skip_tokenizer_init=True, **extra)


def worker_class(args) -> str:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.from_string(args.speculative_algorithm).create_worker(args).__name__


def spec_v1_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "auto-chosen tree" in r.getMessage()]


@pytest.fixture
def patched(clean_state):
    activate_backport()


@plugin_only
def test_stock_sends_the_auto_chosen_tree_to_spec_v2(clean_state, models):
    """The bug: topk 4 on the worker that supports topk 1 only (it crashes on a GPU)."""
    args = server_args(models, "EAGLE3", "eagle3")
    assert (args.speculative_num_steps, args.speculative_eagle_topk,
            args.speculative_num_draft_tokens) == (5, 4, 8)
    assert args.disable_overlap_schedule is False
    assert worker_class(args) == "EAGLEWorkerV2"


@pytest.mark.parametrize("algorithm,draft", [("EAGLE3", "eagle3"), ("EAGLE", "draft")])
def test_auto_chosen_tree_runs_on_spec_v1(patched, models, caplog, algorithm, draft):
    caplog.set_level(logging.WARNING)
    args = server_args(models, algorithm, draft)
    assert (args.speculative_num_steps, args.speculative_eagle_topk,
            args.speculative_num_draft_tokens) == (5, 4, 8)
    assert args.disable_overlap_schedule is True
    assert worker_class(args) == "EAGLEWorker"
    (line,) = spec_v1_lines(caplog)
    assert line.count(SPEC_V1_LINE.format(algo=algorithm)) == 1
    assert "num_steps=5, eagle_topk=4, num_draft_tokens=8" in line
    # This back-port alone points to a chain; with back-port 11 (spec-v2-tree) later in the
    # series the line says why spec v2 does not run this tree (here: the CPU's backend).
    assert "--speculative-eagle-topk 1" in line or "does not run on spec v2 here: attention backend" in line


def test_auto_chosen_tree_gets_what_the_same_explicit_tree_gets(patched, models, caplog):
    """Every server argument, not just the worker, is what SGLang makes of an explicit
    5 / 4 / 8 (SGLang's own path for a tree on 0.5.12.x)."""
    caplog.set_level(logging.WARNING)
    auto = server_args(models, "EAGLE3", "eagle3", random_seed=1)
    explicit = server_args(models, "EAGLE3", "eagle3", random_seed=1, speculative_num_steps=5,
                           speculative_eagle_topk=4, speculative_num_draft_tokens=8)
    assert dataclasses.asdict(auto) == dataclasses.asdict(explicit)
    assert len(spec_v1_lines(caplog)) == 1  # the explicit tree needs no word from us


@pytest.mark.parametrize("case", ["standalone-auto", "explicit-chain", "overlap-off"])
def test_chains_and_explicit_choices_are_left_alone(patched, models, caplog, case):
    caplog.set_level(logging.WARNING)
    if case == "standalone-auto":  # SGLang auto-picks a chain (3 / 1 / 4): spec v2
        args = server_args(models, "STANDALONE", "draft")
        expected = ((3, 1, 4), False, "StandaloneWorkerV2")
    elif case == "explicit-chain":
        args = server_args(models, "EAGLE3", "eagle3", speculative_num_steps=3,
                           speculative_eagle_topk=1, speculative_num_draft_tokens=4)
        expected = ((3, 1, 4), False, "EAGLEWorkerV2")
    else:  # the user chose spec v1 already
        args = server_args(models, "EAGLE3", "eagle3", disable_overlap_schedule=True)
        expected = ((5, 4, 8), True, "EAGLEWorker")
    found = ((args.speculative_num_steps, args.speculative_eagle_topk,
              args.speculative_num_draft_tokens), args.disable_overlap_schedule, worker_class(args))
    assert found == expected
    assert spec_v1_lines(caplog) == []


def test_the_patch_logs_the_plugins_words():
    """The text the patch inserts logs exactly the plugin's message."""
    import ast

    from sglang_futuremap_patch.backports import auto_tree_spec_v1 as mod

    (target,) = mod.BACKPORT.targets
    (edit,) = target.edits
    call = next(n for n in ast.walk(ast.parse("if True:\n" + edit.new.split("\n", 1)[1]))
                if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "warning")
    assert ast.literal_eval(call.args[0]) == mod.MESSAGE
    assert [ast.unparse(a) for a in call.args[1:]] == [
        "self.speculative_algorithm", "self.speculative_num_steps",
        "self.speculative_eagle_topk", "self.speculative_num_draft_tokens"]
