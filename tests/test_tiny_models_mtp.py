"""The tiny MiMoV2 target and its MTP draft (``scripts/make_tiny_models.py``), checked on a CPU
host against SGLang 0.5.12.post1's own code, for the multi-layer EAGLE e2e cases.

* the factory: bit-identical on every build, names/shapes/dtypes as SGLang's loaders expect;
* SGLang's ``ServerArgs`` takes the e2e launch of every ``mtp-*`` case: multi-layer EAGLE is
  switched on, spec v2 picks ``MultiLayerEagleWorkerV2``, the draft config resolves to
  ``MiMoV2MTP``, the model is hybrid sliding-window, FA3 is SGLang's choice on Hopper;
* SGLang's loader (``get_model``, the draft-step filter included) on a single-rank gloo group
  fills every parameter of ``MiMoV2ForCausalLM`` and of the three ``MiMoV2MTP`` drafts with the
  checkpoint's values, and uses every checkpoint tensor;
* SGLang's own modules run the forward pass on CPU with a plain-torch stand-in for the GPU
  attention kernels (the one piece that cannot run here): they agree with the factory's
  plain-torch reference, greedy output varies with the prompt, and each MTP layer names the
  target's next token often but not always (speculative decoding sees accepted and rejected
  drafts). The real attention kernels, KV pools and CUDA graphs run on the GPU only
  (``bash scripts/gpu/run_e2e.sh --group mtp``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

from sglang_cpu_support import (assert_close, assert_loaded, checkpoint, expected_params, server_args,
                                sglang_loader, sglang_logits)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_e2e as e2e  # noqa: E402
from gpu_harness import engine_config, model_factory  # noqa: E402

MTP_OWN = ("enorm", "hnorm", "eh_proj", "final_layernorm")


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return model_factory.build_tiny_models(tmp_path_factory.mktemp("tiny-models"))


# ----------------------------------------------------------------------------- the factory


def test_factory_builds_the_mimov2_pair_bit_identically(models: dict[str, Path], tmp_path: Path) -> None:
    assert {"target", "draft", "eagle3", "mimov2", "mimov2-mtp"} <= set(models)
    again = model_factory.make_mimov2_models(tmp_path)
    for built, rebuilt in zip((models["mimov2"], models["mimov2-mtp"]), again):
        for name in ("config.json", "model.safetensors", f"{model_factory.MIMOV2_CONFIG_MODULE}.py"):
            assert (built / name).read_bytes() == (rebuilt / name).read_bytes(), (built.name, name)
        assert model_factory.check_model_dir(built) == []
    assert (models["mimov2"] / "tokenizer.json").exists()
    tcfg, dcfg = (model_factory.model_config(models[k]) for k in ("mimov2", "mimov2-mtp"))
    assert "moe_layer_freq" not in tcfg and {0, 1} == set(tcfg["hybrid_layer_pattern"])  # dense, hybrid SWA
    assert dcfg["num_nextn_predict_layers"] >= engine_config.SPEC_STEPS["speculative_num_steps"]
    assert (tcfg["vocab_size"], model_factory.eos_token_ids(models["mimov2"])) == (4096, [2])  # as the Llama target's
    target, draft = checkpoint(models["mimov2"]), checkpoint(models["mimov2-mtp"])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert torch.equal(target[name], draft[name])


# ----------------------------------------------------------------------------- SGLang's view


def _server_args(case: e2e.Case, models: dict[str, Path]) -> Any:
    return server_args(e2e.engine_kwargs(case, models["mimov2"].parent))


@pytest.fixture(scope="module")
def sglang_cpu(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The global server args of the proposed launch (Triton, CUDA graph off), the MiMoV2
    target and its three MTP draft steps as SGLang's loader builds them."""
    case = next(c for c in e2e.multilayer_cases() if c.name == "mtp-triton-nograph-nopcg")
    args = _server_args(case, models)
    with sglang_loader(args, tmp_path_factory.mktemp("gloo") / "store") as load:
        steps = args.speculative_num_steps
        yield SimpleNamespace(server_args=args, target=load(models["mimov2"]),
                              drafts=[load(models["mimov2-mtp"], draft_step=k) for k in range(steps)])


def test_server_args_take_every_mtp_launch(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang.srt.server_args as sa_mod
    from sglang.srt.configs.model_config import ModelConfig, get_mimo_v2_fused_qkv_expected_tp_size
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for case in e2e.multilayer_cases():
        sa = _server_args(case, models)
        assert sa.enable_multi_layer_eagle, case.name  # SGLang turns it on for MiMoV2 + EAGLE
        assert not sa.disable_overlap_schedule and (sa.speculative_num_steps, sa.speculative_eagle_topk,
                                                    sa.speculative_num_draft_tokens) == (3, 1, 4)
        assert SpeculativeAlgorithm.from_string(sa.speculative_algorithm).create_worker(sa) is MultiLayerEagleWorkerV2
        assert sa.disable_piecewise_cuda_graph is not case.pcg, case.name
        target = ModelConfig.from_server_args(sa)
        draft = ModelConfig.from_server_args(sa, model_path=sa.speculative_draft_model_path, is_draft_model=True)
        assert target.hf_config.architectures == ["MiMoV2ForCausalLM"], case.name
        assert draft.hf_config.architectures == ["MiMoV2MTP"], case.name  # SGLang's draft override
    assert (target.is_hybrid_swa, target.swa_attention_layer_ids, target.full_attention_layer_ids) == (True, [0, 2], [1, 3])
    assert (draft.is_hybrid_swa, draft.swa_attention_layer_ids, draft.full_attention_layer_ids) == (True, [0], [])
    assert target.sliding_window_size == draft.sliding_window_size == 128
    assert not target.is_multimodal and not target.has_attention_sinks
    assert get_mimo_v2_fused_qkv_expected_tp_size(target.hf_config) is None  # no TP size is imposed
    # On Hopper SGLang picks FA3 itself for this model (MHA, topk 1): the mtp-default cases.
    monkeypatch.setattr(sa_mod, "is_hopper_with_cuda_12_3", lambda: True)
    assert sa._get_default_attn_backend(use_mla_backend=False, model_config=target) == "fa3"


def test_sglang_loads_every_tensor_into_every_parameter(sglang_cpu: SimpleNamespace, models: dict[str, Path]) -> None:
    target = checkpoint(models["mimov2"])
    used = assert_loaded(sglang_cpu.target, expected_params(target, {n: n for n, _ in sglang_cpu.target.named_parameters()}))
    assert used == set(target)

    draft = checkpoint(models["mimov2-mtp"])
    used = set()
    for step, model in enumerate(sglang_cpu.drafts):
        assert type(model).__name__ == "MiMoV2MTP"
        layer = f"model.mtp.layers.{step}."
        source_of = {}
        for name, _ in model.named_parameters():
            own = next((o for o in MTP_OWN if name == f"model.{o}.weight"), None)
            source_of[name] = (layer + f"{own}.weight" if own
                               else name.replace("model.mtp_block.", layer) if name.startswith("model.mtp_block.")
                               else name)
        used |= assert_loaded(model, expected_params(draft, source_of))
    assert used == set(draft)  # every MTP layer went to its own draft step


# ----------------------------------------------------------------------------- forward pass


def test_sglang_forward_matches_the_reference_and_the_mtp_layers_agree_in_part(
        sglang_cpu: SimpleNamespace, models: dict[str, Path]) -> None:
    probe = model_factory.mtp_greedy_probe(models["mimov2"], models["mimov2-mtp"])
    outputs = probe["outputs"]
    assert min(probe["distinct_per_output"]) >= 36 and len({tuple(o) for o in outputs}) == len(outputs)
    tcfg, tw = model_factory.load_fp32(models["mimov2"])
    dcfg, dw = model_factory.load_fp32(models["mimov2-mtp"])
    agree = [0] * len(sglang_cpu.drafts)
    total = 0
    for out in outputs:
        # a fixed prompt longer than the sliding window, then a continuation of the target's
        ids = list(range(3, 3 + 7 * 160, 7)) + out
        logits, hidden = sglang_logits(sglang_cpu.target, ids)
        ref_logits, ref_hidden = model_factory.mimov2_reference(tcfg, tw, ids)
        assert_close(logits, ref_logits)
        predicted = logits.argmax(-1)
        total += len(ids) - 40
        for step, draft in enumerate(sglang_cpu.drafts):
            # step k at position p reads token p + k + 1 and the target's hidden state at p and
            # guesses the target's prediction at p + k + 1
            shifted = ids[step + 1:]
            mtp_logits, _ = sglang_logits(draft, shifted, hidden[: len(shifted)])
            ref_mtp = model_factory.mtp_reference(dcfg, dw, step, shifted, ref_hidden[: len(shifted)])
            assert_close(mtp_logits, ref_mtp)
            guess = mtp_logits.argmax(-1)
            agree[step] += int((guess[40 - step - 1: len(ids) - step - 1] == predicted[40:]).sum())
    rates = [a / total for a in agree]
    assert all(0.2 <= r <= 0.8 for r in rates), rates
