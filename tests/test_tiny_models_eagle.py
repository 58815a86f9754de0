"""The tiny Llama target's EAGLE-1 draft (``eagle/`` from ``scripts/make_tiny_models.py``),
checked on a CPU host against SGLang 0.5.12.post1's own code, for the auto-tree EAGLE e2e cases
(``tree-auto-eagle-default``, ``treev2-auto-eagle-default``).

* the factory: bit-identical on every build, names/shapes/dtypes as ``LlamaForCausalLMEagle``
  loads them, built from the target's tensors;
* SGLang's ``ServerArgs`` of both cases' launches (no spec flags) resolve to SGLang's auto tree
  5 / 4 / 8, as their stock oracles' explicit trees do, with a Llama target and an EAGLE-1
  draft (not multi-layer EAGLE, which ``EAGLE`` means for the MiMoV2 pair);
* SGLang's loader on a single-rank gloo group fills every parameter of the target and of
  ``LlamaForCausalLMEagle`` but its lm_head with the checkpoint's values and uses every
  checkpoint tensor; the lm_head and embedding are the target's once the draft worker's
  ``set_embed_and_head`` has run, as on the GPU;
* SGLang's own modules (a plain-torch stand-in for the attention kernels) agree with the
  factory's plain-torch references; the draft names the target's next token often but not
  always, and a plain-torch walk of SGLang's auto tree accepts part of it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import torch

from conftest import activate_backport
from sglang_cpu_support import (assert_close, assert_loaded, checkpoint, expected_params, server_args,
                                sglang_loader, sglang_logits)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_e2e as e2e  # noqa: E402
from gpu_harness import model_factory  # noqa: E402

CASES = ("tree-auto-eagle-default", "treev2-auto-eagle-default")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return model_factory.build_tiny_models(tmp_path_factory.mktemp("tiny-models"))


def _case(name: str) -> e2e.Case:
    (case,) = e2e.select_cases([name])
    return case


# ----------------------------------------------------------------------------- the factory


def test_factory_builds_the_eagle_draft_bit_identically_from_the_target(models: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    assert models["eagle"] == models["target"].parent / model_factory.EAGLE_DIRNAME
    model_factory.make_models(tmp_path, mtp=False)
    for name in (model_factory.TARGET_DIRNAME, model_factory.EAGLE_DIRNAME):
        for file in ("config.json", "model.safetensors"):
            assert (models[name] / file).read_bytes() == (tmp_path / name / file).read_bytes(), (name, file)
    assert model_factory.check_model_dir(models["eagle"]) == []
    tcfg, dcfg = model_factory.model_config(models["target"]), model_factory.model_config(models["eagle"])
    assert dcfg["architectures"] == ["LlamaForCausalLMEagle"] and dcfg["num_hidden_layers"] == 2
    assert {k: v for k, v in dcfg.items() if k not in ("architectures", "num_hidden_layers")} == {
        k: v for k, v in tcfg.items() if k not in ("architectures", "num_hidden_layers")}
    target, draft = checkpoint(models["target"]), checkpoint(models["eagle"])
    # no lm_head (SGLang's loader drops it), no final norm, no input norm in layer 0
    assert not any(n.startswith(("lm_head", "norm", "model.")) for n in draft)
    assert "layers.0.input_layernorm.weight" not in draft and "layers.1.input_layernorm.weight" in draft
    for name, value in draft.items():
        if not name.startswith("fc."):
            assert torch.equal(value, target["model." + name]), name
    h = tcfg["hidden_size"]
    eye = torch.eye(h, dtype=torch.bfloat16)
    assert torch.equal(draft["fc.weight"], torch.cat([eye, eye * 0.1], dim=1))
    assert torch.equal(draft["fc.bias"], torch.zeros(h, dtype=torch.bfloat16))


# ----------------------------------------------------------------------------- SGLang's view


def test_server_args_resolve_both_launches_to_sglangs_auto_tree(models: dict[str, Path], clean_state: object,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    activate_backport()
    root = models["target"].parent
    for name in CASES:
        case = _case(name)
        with monkeypatch.context() as mp:
            for key, value in case.env:
                mp.delenv(key, raising=False) if value is None else mp.setenv(key, value)
            auto = server_args(e2e.engine_kwargs(case, root))
            oracle = server_args(e2e.engine_kwargs(case, root, stock=True))
        for sa in (auto, oracle):
            assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (5, 4, 8)
            assert sa.speculative_algorithm == "EAGLE" and not sa.enable_multi_layer_eagle, name
            assert SpeculativeAlgorithm.from_string(sa.speculative_algorithm).create_worker(sa).__name__ in (
                "EAGLEWorker", "EAGLEWorkerV2")
        assert [e2e.engine_kwargs(case, root)[k] for k in e2e.SPEC_TREE_KEYS] == [None, None, None]  # no flags
        target = ModelConfig.from_server_args(auto)
        draft = ModelConfig.from_server_args(auto, model_path=auto.speculative_draft_model_path, is_draft_model=True)
        assert target.hf_config.architectures == ["LlamaForCausalLM"]
        assert draft.hf_config.architectures == ["LlamaForCausalLMEagle"]


@pytest.fixture(scope="module")
def sglang_cpu(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The target and the EAGLE-1 draft as SGLang's loader builds them (``draft_loaded``), and
    the draft again, given the target's embedding and lm_head as SGLang's draft worker does
    (``init_lm_head``)."""
    args = server_args(e2e.engine_kwargs(_case("treev2-auto-eagle-default"), models["target"].parent, stock=True))
    with sglang_loader(args, tmp_path_factory.mktemp("gloo") / "store") as load:
        target, draft = load(models["target"]), load(models["eagle"], draft=True)
        loaded = load(models["eagle"], draft=True)
        with pytest.MonkeyPatch.context() as mp:  # set_embed_and_head frees the CUDA cache
            mp.setattr(torch.cuda, "empty_cache", lambda: None)
            mp.setattr(torch.cuda, "synchronize", lambda: None)
            draft.set_embed_and_head(*target.get_embed_and_head())
        yield SimpleNamespace(target=target, draft=draft, draft_loaded=loaded)


def test_sglang_loads_every_tensor_and_the_worker_shares_the_targets_head(sglang_cpu: SimpleNamespace,
                                                                           models: dict[str, Path]) -> None:
    target = checkpoint(models["target"])
    used = assert_loaded(sglang_cpu.target,
                         expected_params(target, {n: n for n, _ in sglang_cpu.target.named_parameters()}))
    assert used == set(target)

    draft = checkpoint(models["eagle"])
    assert type(sglang_cpu.draft).__name__ == "LlamaForCausalLMEagle"
    loaded = sglang_cpu.draft_loaded
    params = [n for n, _ in loaded.named_parameters()]
    source_of = {n: n.removeprefix("model.") for n in params if n != "lm_head.weight"}
    used = assert_loaded(loaded, expected_params(draft, source_of), unloaded=frozenset({"lm_head.weight"}))
    assert used == set(draft)
    assert "model.layers.0.input_layernorm.weight" not in params and not hasattr(loaded.model, "norm")
    embed, head = sglang_cpu.target.get_embed_and_head()
    assert sglang_cpu.draft.model.embed_tokens.weight is embed and sglang_cpu.draft.lm_head.weight is head


# ----------------------------------------------------------------------------- forward pass


def test_sglang_forward_matches_the_reference_and_the_draft_agrees_in_part(sglang_cpu: SimpleNamespace,
                                                                           models: dict[str, Path]) -> None:
    probe = model_factory.eagle_greedy_probe(models["target"], models["eagle"])
    outputs = probe["outputs"]
    assert min(probe["distinct_per_output"]) >= 36 and len({tuple(o) for o in outputs}) == len(outputs)
    assert 0.4 <= probe["eagle_agreement"] <= 0.7 and probe["eagle_top4"] >= probe["eagle_agreement"] + 0.2, probe
    tcfg, tw = model_factory.load_fp32(models["target"])
    dcfg, dw = model_factory.load_fp32(models["eagle"])
    agree = total = 0
    for out in outputs:
        ids = list(range(3, 3 + 7 * 60, 7)) + out  # a fixed prompt, then a continuation of the target's
        logits, hidden = sglang_logits(sglang_cpu.target, ids)
        ref_logits, ref_hidden = model_factory.llama_reference(tcfg, tw, ids)
        assert_close(logits, ref_logits)
        # SGLang's draft extend: position p reads token p + 1 and the target's hidden state at p
        # and guesses the target's prediction at p + 1
        draft_logits, _ = sglang_logits(sglang_cpu.draft, ids[1:], hidden[:-1])
        ref_draft, _ = model_factory.eagle_reference(dcfg, dw, tw, ids[1:], ref_hidden[:-1])
        assert_close(draft_logits, ref_draft)
        predicted = logits.argmax(-1)
        agree += int((draft_logits.argmax(-1)[20:] == predicted[21:]).sum())
        total += len(ids) - 21
    assert 0.3 <= agree / total <= 0.8, agree / total


def test_sglangs_auto_tree_accepts_part_of_the_eagle_draft(models: dict[str, Path]) -> None:
    """SGLang's auto tree (5 / 4 / 8) walked in plain torch on a sample of positions: more than
    the first token and less than the whole path is accepted on average."""
    tree = model_factory.eagle_tree_probe(models["target"], models["eagle"], prompts=2, new_tokens=24, every=2)
    assert 1.5 <= tree["mean_accept_length"] <= 3.5, tree
    assert len(tree["accept_lengths"]) >= 3, tree  # rejected at once, in part and further along
