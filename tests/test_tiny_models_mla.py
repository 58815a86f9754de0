"""The tiny DeepSeek-V3 target and its NextN layer (``scripts/make_tiny_models.py``), checked on a
CPU host against SGLang 0.5.12.post1's own code, for the DeepSeek MTP e2e cases (``--group mla``).

* the factory: bit-identical on every build, names/shapes/dtypes as SGLang's loaders expect, the
  NextN layer in the target's own checkpoint, MLA with DeepSeek-V3's per-head shapes;
* the config: transformers reads it as ``DeepseekV3Config``, SGLang's ``ModelConfig`` as MLA, the
  draft as ``DeepseekV3ForCausalLMNextN``;
* SGLang's ``ServerArgs`` takes the launch of every ``mla-*`` case: the draft path becomes the
  target's own directory, spec v2 picks ``EAGLEWorkerV2``, 3 / 1 / 4 is what SGLang itself picks
  for DeepSeek, piecewise CUDA graph stays on, FA3 is its choice for MLA on Hopper;
* SGLang's loader on a single-rank gloo group fills every parameter of ``DeepseekV3ForCausalLM``
  and of ``DeepseekV3ForCausalLMNextN`` with the checkpoint's values (the fused ``q_a`` / ``kv_a``
  projection, the stacked experts, the ``w_kc`` / ``w_vc`` halves of ``kv_b_proj``), the target
  skipping the NextN layer and the draft taking nothing else;
* SGLang's own modules run the forward pass on CPU with a plain-torch stand-in for the GPU
  attention kernels: the target's MHA prefill and its absorbed MLA path (what decode, verify
  and the draft use on the GPU) and the NextN layer agree with the factory's plain-torch
  reference, greedy output varies, and the NextN layer names the target's next token often but
  not always. The real FA3 kernels, KV pools and CUDA graphs run on the GPU only
  (``bash scripts/gpu/run_e2e.sh --group mla``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

from sglang_cpu_support import StandInAttention, assert_close, checkpoint, server_args, sglang_loader, sglang_logits

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_e2e as e2e  # noqa: E402
from gpu_harness import engine_config, model_factory  # noqa: E402

#: The DeepSeek-V3 attention shapes SGLang's FA3 MLA path serves (the 576-wide latent of 512 + 64,
#: 512-wide values in decode; 192 / 128 per head in the MHA prefill): transformers' own defaults.
V3_HEAD_SHAPES = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


@pytest.fixture(autouse=True)
def _fresh_hf_configs() -> Iterator[None]:
    """SGLang caches each checkpoint's HF config (``get_config``), and a draft's ``ModelConfig``
    renames the cached object's architecture in place (to ``DeepseekV3ForCausalLMNextN``): with
    target and draft in one directory, every later target config of the process would read as
    the draft's. In SGLang's scheduler the draft comes after the target model is built; here
    each test starts from a fresh cache."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    get_config.cache_clear()
    yield
    get_config.cache_clear()


def _draft_model_config(server_args: Any) -> Any:
    """SGLang's ``ModelConfig`` of the draft of ``server_args``, the HF config cache cleared after
    it (see ``_fresh_hf_configs``)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.utils.hf_transformers_utils import get_config

    try:
        return ModelConfig.from_server_args(server_args, model_path=server_args.speculative_draft_model_path,
                                            is_draft_model=True)
    finally:
        get_config.cache_clear()


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return model_factory.build_tiny_models(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="module")
def config(models: dict[str, Path]) -> dict[str, Any]:
    return model_factory.model_config(models["deepseek"])


# ----------------------------------------------------------------------------- the factory


def test_factory_builds_the_deepseek_checkpoint_bit_identically(models: dict[str, Path], config: dict[str, Any],
                                                                tmp_path: Path) -> None:
    again = model_factory.make_deepseek_models(tmp_path)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (models["deepseek"] / name).read_bytes() == (again / name).read_bytes(), name
    assert model_factory.check_model_dir(models["deepseek"]) == []
    # the token ids and EOS of the Llama target, whose config the e2e harness reads for every case
    assert (config["vocab_size"], model_factory.eos_token_ids(models["deepseek"])) == (
        model_factory.model_config(models["target"])["vocab_size"], model_factory.eos_token_ids(models["target"]))
    n = config["num_hidden_layers"]
    assert config["num_nextn_predict_layers"] == 1 and 0 < config["first_k_dense_replace"] < n
    assert [model_factory.is_moe_layer(config, i) for i in range(n)] == [False] * (n - 1) + [True]
    ckpt = checkpoint(models["deepseek"])
    nextn = {k for k in ckpt if k.startswith(f"model.layers.{n}.")}
    assert {f"model.layers.{n}.{k}" for k in model_factory.NEXTN_OWN + model_factory.NEXTN_SHARED} <= nextn
    assert any(".mlp.experts." in k for k in nextn) and f"model.layers.{n}.mlp.shared_experts.down_proj.weight" in nextn
    # DeepSeek's own copies of the embedding and lm_head in the NextN layer: the target's
    assert torch.equal(ckpt[f"model.layers.{n}.embed_tokens.weight"], ckpt["model.embed_tokens.weight"])
    assert torch.equal(ckpt[f"model.layers.{n}.shared_head.head.weight"], ckpt["lm_head.weight"])
    # EOS is not among the tokens greedy decoding next to never picks (the eos churn needs it):
    # its lm_head row has the upper-quartile norm, as the Llama and MiMoV2 targets' draws do
    norms = ckpt["lm_head.weight"].float().norm(dim=-1)
    assert 0.7 <= (norms < norms[config["eos_token_id"]]).float().mean() <= 0.8
    # a wrong shape or a missing tensor is reported
    broken = dict(config, kv_lora_rank=256)
    assert any("kv_a_proj_with_mqa" in p for p in _problems(models["deepseek"], broken, tmp_path))


def _problems(directory: Path, config: dict[str, Any], tmp_path: Path) -> list[str]:
    """``check_model_dir`` of ``directory``'s tensors under another config."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").symlink_to(directory / "model.safetensors")
    (other / "config.json").write_text(json.dumps(config))
    return model_factory.check_model_dir(other)


def test_the_config_is_deepseek_v3_with_mla_and_its_draft_is_the_nextn_layer(models: dict[str, Path],
                                                                            config: dict[str, Any]) -> None:
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from transformers import AutoConfig, DeepseekV3Config

    hf = AutoConfig.from_pretrained(str(models["deepseek"]))
    assert isinstance(hf, DeepseekV3Config) and hf.architectures == ["DeepseekV3ForCausalLM"]
    v3 = DeepseekV3Config()  # DeepSeek-V3's own shapes
    assert all(getattr(hf, k) == getattr(v3, k) == config[k] for k in V3_HEAD_SHAPES)
    assert hf.q_lora_rank == config["q_lora_rank"] < v3.q_lora_rank and hf.rope_interleave is True
    target = ModelConfig(str(models["deepseek"]))
    draft = ModelConfig(str(models["deepseek"]), is_draft_model=True)
    assert draft.hf_config.architectures == ["DeepseekV3ForCausalLMNextN"]
    for mc in (target, draft):
        assert mc.attention_arch == AttentionArch.MLA
        assert (mc.kv_lora_rank, mc.qk_rope_head_dim, mc.qk_nope_head_dim, mc.v_head_dim) == (512, 64, 128, 128)
        assert mc.scaling == pytest.approx((128 + 64) ** -0.5)  # no RoPE scaling: plain 1/sqrt(qk head dim)
        assert not mc.is_hybrid_swa and not mc.is_multimodal
    assert target.num_hidden_layers == 4 and target.hf_config.num_nextn_predict_layers == 1


# ----------------------------------------------------------------------------- SGLang's view


def test_server_args_take_every_mla_launch(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang.srt.server_args as sa_mod
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    root = models["deepseek"].parent
    cases = e2e.mla_cases()
    assert cases
    for case in cases:
        kw = e2e.engine_kwargs(case, root)
        assert "speculative_draft_model_path" not in kw and "attention_backend" not in kw
        assert "disable_piecewise_cuda_graph" not in kw  # SGLang's own choices
        sa = server_args(kw)
        assert sa.speculative_algorithm == "EAGLE"  # NEXTN is SGLang's alias of EAGLE
        assert sa.speculative_draft_model_path == str(models["deepseek"])  # SGLang: DeepSeek MTP reads the target
        assert not sa.enable_multi_layer_eagle and not sa.disable_overlap_schedule  # spec v2, one draft model
        assert SpeculativeAlgorithm.from_string(sa.speculative_algorithm).create_worker(sa) is EAGLEWorkerV2
        assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (3, 1, 4)
        assert sa.disable_piecewise_cuda_graph is False and sa.disable_cuda_graph is (not case.cuda_graph)
        assert sa.use_mla_backend()
        assert _draft_model_config(sa).hf_config.architectures == ["DeepseekV3ForCausalLMNextN"]
    # the explicit 3 / 1 / 4 is what SGLang picks for DeepSeek when no spec flag is given
    auto = server_args(dict(e2e.engine_kwargs(cases[0], root), **dict(e2e.AUTO_SPEC)))
    assert (auto.speculative_num_steps, auto.speculative_eagle_topk, auto.speculative_num_draft_tokens) == (3, 1, 4)
    # The mla-* cases name no backend: on a GPU host SGLang picks FA3 for this MLA model on Hopper
    # (Triton on a GPU that is neither Hopper nor Blackwell), with piecewise CUDA graph on
    for hopper, backend in ((False, "triton"), (True, "fa3")):
        monkeypatch.setattr(sa_mod, "is_hopper_with_cuda_12_3", lambda hopper=hopper: hopper)
        for case in cases:
            gpu = server_args(e2e.engine_kwargs(case, root), device="cuda")
            assert (gpu.attention_backend, gpu.disable_piecewise_cuda_graph, gpu.page_size) == (backend, False, 1)


@pytest.fixture(scope="module")
def sglang_cpu(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The global server args of the default launch, the DeepSeek target and its NextN draft as
    SGLang's loader builds them, the draft holding the target's embedding and lm_head as SGLang's
    draft worker hands them over (``set_embed_and_head``)."""
    import sglang.srt.models.deepseek_v2 as deepseek_v2
    from sglang.srt.layers.rotary_embedding import factory
    from sglang.srt.utils.hf_transformers_utils import get_config

    case = next(c for c in e2e.mla_cases() if c.name == "mla-default-graph")
    args = server_args(e2e.engine_kwargs(case, models["deepseek"].parent))
    with pytest.MonkeyPatch.context() as mp:
        # SGLang's CPU engine builds only DeepSeek's YaRN rotary embedding (get_rope_cpu); on a
        # GPU this model (no RoPE scaling) gets get_rope's plain interleaved one: the same here.
        mp.setattr(deepseek_v2, "get_rope_wrapper",
                   lambda *a, device=None, **k: factory.get_rope_wrapper(*a, device="cuda", **k))
        # set_embed_and_head ends with a CUDA sync, which a CPU-only torch cannot make
        mp.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        with sglang_loader(args, tmp_path_factory.mktemp("gloo") / "store") as load:
            get_config.cache_clear()  # see _fresh_hf_configs: the target first, as SGLang's scheduler
            target = load(models["deepseek"])
            draft = load(models["deepseek"], draft=True)
            draft.set_embed_and_head(*target.get_embed_and_head())
            yield SimpleNamespace(server_args=args, target=target, draft=draft)


def _sources(config: dict[str, Any], param: str, nextn: bool) -> list[str]:
    """The checkpoint tensors SGLang's DeepSeek loader puts into parameter ``param`` (in
    concatenation order; a routed-experts parameter: every expert's, expert by expert)."""
    name = param
    if nextn:
        layer = f"model.layers.{config['num_hidden_layers']}."
        own = next((o for o in model_factory.NEXTN_OWN if param == "model." + o), None)
        name = layer + own if own else param.replace("model.decoder.", layer)
    if name.endswith("fused_qkv_a_proj_with_mqa.weight"):
        return [name.replace("fused_qkv_a_proj_with_mqa", part) for part in ("q_a_proj", "kv_a_proj_with_mqa")]
    if name.endswith("gate_up_proj.weight"):
        return [name.replace("gate_up_proj", part) for part in ("gate_proj", "up_proj")]
    for stacked, parts in (("experts.w13_weight", ("gate_proj", "up_proj")), ("experts.w2_weight", ("down_proj",))):
        if name.endswith(stacked):
            base = name[: -len("w13_weight" if "w13" in stacked else "w2_weight")]
            return [f"{base}{e}.{p}.weight" for e in range(config["n_routed_experts"]) for p in parts]
    return [name]


def _assert_filled(model: torch.nn.Module, ckpt: dict[str, torch.Tensor], config: dict[str, Any], nextn: bool,
                   shared: frozenset[str] = frozenset()) -> set[str]:
    """Every parameter of ``model`` but ``shared`` holds the checkpoint's values (routed experts
    stacked as ``[gate; up]`` per expert); returns the checkpoint tensors used."""
    used: set[str] = set()
    for param, value in model.named_parameters():
        if param in shared:
            continue
        names = _sources(config, param, nextn)
        want = torch.cat([ckpt[n] for n in names])
        if param.endswith(("experts.w13_weight", "experts.w2_weight")):
            want = want.view(value.shape)
        assert value.shape == want.shape and torch.equal(value.detach().float(), want.float()), param
        used |= set(names)
    return used


def test_sglang_loads_every_tensor_into_every_parameter(sglang_cpu: SimpleNamespace, models: dict[str, Path],
                                                        config: dict[str, Any]) -> None:
    ckpt = checkpoint(models["deepseek"])
    n = config["num_hidden_layers"]
    nextn = {k for k in ckpt if k.startswith(f"model.layers.{n}.")}
    target, draft = sglang_cpu.target, sglang_cpu.draft
    assert type(target).__name__ == "DeepseekV3ForCausalLM" and type(draft).__name__ == "DeepseekV3ForCausalLMNextN"
    assert _assert_filled(target, ckpt, config, nextn=False) == set(ckpt) - nextn  # the NextN layer skipped
    head = frozenset({"model.embed_tokens.weight", "lm_head.weight"})
    used = _assert_filled(draft, ckpt, config, nextn=True, shared=head)
    assert used == nextn - {f"model.layers.{n}.{k}" for k in model_factory.NEXTN_SHARED}
    # SGLang's draft worker: the target's embedding and lm_head, the very tensors
    assert draft.model.embed_tokens.weight is target.model.embed_tokens.weight
    assert draft.lm_head.weight is target.lm_head.weight
    # the gate's correction bias is an fp32 parameter (as in V3); the rest bf16
    assert {p.dtype for name, p in target.named_parameters() if not name.endswith("e_score_correction_bias")} == {
        torch.bfloat16}
    # post_load_weights splits kv_b_proj per head into the absorbed path's w_kc (latent -> key,
    # applied to the query: heads x nope x rank) and w_vc (latent -> value: heads x rank x v)
    nope, vd = config["qk_nope_head_dim"], config["v_head_dim"]
    for attn in [layer.self_attn for layer in target.model.layers] + [draft.model.decoder.self_attn]:
        kc, vc = attn.kv_b_proj.weight.unflatten(0, (-1, nope + vd)).split([nope, vd], dim=1)
        assert attn.w_kc.shape == (config["num_attention_heads"], nope, config["kv_lora_rank"])
        assert torch.equal(attn.w_kc, kc) and torch.equal(attn.w_vc, vc.transpose(1, 2))


# ----------------------------------------------------------------------------- forward pass


def _mla_path(model: torch.nn.Module, ids: list[int], hidden: torch.Tensor | None = None, *,
              absorbed: bool, args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's forward over ``ids`` on the MHA prefill path, or (``absorbed``) on the absorbed
    MLA path that decode, verify and the draft take on the GPU: SGLang's own dispatch picks it
    under deterministic inference. Checks which attention layers the stand-in served."""
    attn = StandInAttention()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(args, "enable_deterministic_inference", absorbed)
        out = sglang_logits(model, ids, hidden, attn)
    widths = {(layer.qk_head_dim, layer.v_head_dim) for layer in attn.layers}
    assert widths == ({(576, 512)} if absorbed else {(192, 128)}), widths  # attn_mqa's latent, or attn_mha
    return out


def test_sglang_forward_matches_the_reference_and_the_nextn_layer_agrees_in_part(
        sglang_cpu: SimpleNamespace, models: dict[str, Path]) -> None:
    probe = model_factory.deepseek_greedy_probe(models["deepseek"])
    outputs = probe["outputs"]
    assert min(probe["distinct_per_output"]) >= 36 and len({tuple(o) for o in outputs}) == len(outputs)
    # the NextN layer drafts the target's token often but not always; a 3-step chain is accepted
    # in part: some steps reject the first draft token, some accept all three
    assert 0.2 <= probe["nextn_agreement"] <= 0.8, probe["nextn_agreement"]
    assert 1.2 <= probe["mean_accept_length"] <= 3.0 and {1, 4} <= set(probe["accept_lengths"]), probe
    cfg, w = model_factory.load_fp32(models["deepseek"])
    args, target, draft = sglang_cpu.server_args, sglang_cpu.target, sglang_cpu.draft
    agree = total = 0
    for out in outputs[:2]:
        ids = list(range(3, 3 + 7 * 90, 7)) + out  # a fixed prompt, then a continuation of the target's
        ref_logits, ref_hidden = model_factory.deepseek_reference(cfg, w, ids)
        logits, hidden = _mla_path(target, ids, absorbed=False, args=args)
        assert_close(logits, ref_logits)
        absorbed, _ = _mla_path(target, ids, absorbed=True, args=args)
        assert_close(absorbed, ref_logits)
        # the NextN layer at position p reads token p + 1 and the target's hidden state at p
        draft_logits, _ = _mla_path(draft, ids[1:], hidden[:-1], absorbed=True, args=args)
        ref_draft, _, _ = model_factory.nextn_reference(cfg, w, ids[1:], ref_hidden[:-1])
        assert_close(draft_logits, ref_draft)
        guess, predicted = draft_logits.argmax(-1), logits.argmax(-1)
        agree += int((guess[:-1] == predicted[1:-1]).sum())
        total += len(ids) - 2
    assert 0.2 <= agree / total <= 0.8, agree / total


def test_sglang_moe_routes_as_deepseek_v3(sglang_cpu: SimpleNamespace, models: dict[str, Path]) -> None:
    """The MoE layers (the target's last, the NextN layer's) on their own, shared experts left
    out: SGLang's routed experts (gate, grouped top-k with the correction bias, normalised weights
    times ``routed_scaling_factor``, the stacked experts) against the reference's, token by token
    (a near-tie in the bf16 gate may pick another expert for a few tokens)."""
    cfg, w = model_factory.load_fp32(models["deepseek"])
    m = torch.randn(256, cfg["hidden_size"], generator=torch.Generator().manual_seed(0))
    n = cfg["num_hidden_layers"]
    for module, prefix in ((sglang_cpu.target.model.layers[n - 1].mlp, f"model.layers.{n - 1}.mlp."),
                           (sglang_cpu.draft.model.decoder.mlp, f"model.layers.{n}.mlp.")):
        with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
            mp.setattr(module, "_forward_shared_experts", lambda *a, **k: None)
            routed = module(m.to(torch.bfloat16)).float()
        ref = model_factory.deepseek_moe_reference(m, w, prefix, cfg, shared=False)
        close = (routed - ref).norm(dim=-1) <= 0.05 * ref.norm(dim=-1)
        assert close.float().mean() >= 0.95, (prefix, close.float().mean())
