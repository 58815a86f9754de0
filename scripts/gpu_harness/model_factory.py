"""Write a tiny Llama target, a correlated STANDALONE draft, an EAGLE3 draft, an EAGLE-1 draft,
a tiny MiMoV2 target with its multi-layer MTP draft and a tiny DeepSeek-V3 (MLA) target with its
NextN (MTP) layer as real checkpoints, plus offline word-level tokenizers for the targets.

Offline model factory for the GPU tests. Every model directory holds ``config.json`` +
``model.safetensors`` generated from a fixed seed, so every machine builds bit-identical
weights without any download:

* ``target/``: ``LlamaForCausalLM`` with ``tokenizer.json`` (token ``i`` is the word
  ``w<i>``, ids 0..2 are pad/bos/eos), so text prompts, stop strings and the HTTP server work;
* ``draft/``: ``LlamaForCausalLM``, the STANDALONE draft (see below);
* ``eagle3/``: ``LlamaForCausalLMEagle3``, one decoder layer over the target's three captured
  hidden states (random: its drafts are mostly rejected, which exercises the reject paths;
  the STANDALONE and EAGLE drafts cover partial acceptance);
* ``eagle/``: ``LlamaForCausalLMEagle`` (EAGLE-1), no random draw: the target's embedding and
  first two layers (SGLang runs layer 0 without its input norm and has no final norm) behind
  an ``fc`` (with a zero bias) that passes the next token's embedding through and adds 0.1 of
  the target's hidden state. Tensor names without ``model.`` (SGLang's loader adds it) and no
  ``lm_head`` (the loader drops it; the draft worker gives the draft the target's embedding
  and lm_head). On CPU (``--check``) its first step names the target's next token about half
  the time (the target's token is in its top 4 about 83% of the time) and a plain-torch walk of
  SGLang's auto tree (5 steps, topk 4, 8 draft tokens) accepts about 2.1 tokens a step;
  ``tests/test_tiny_models_eagle.py`` checks the draft against SGLang's own modules.

Why not ``load_format="dummy"``: SGLang's dummy weights (uniform +-1e-3) make greedy
decoding collapse into a period-2 cycle, which is a weak oracle for token-exact
comparisons. Here the linear layers use a normal init large enough (std ~0.05) for
attention and MLP to move the residual stream, so the greedy continuation depends on
the whole prompt and wanders over the vocabulary.

The draft reuses the target's embedding, final norm, lm_head and first layers, and the
target's later layers are scaled down, so draft and target agree often but not always:
speculative decoding then sees both accepted and rejected draft tokens.

Multi-layer EAGLE (MTP): SGLang 0.5.12.post1 runs ``MultiLayerEagleWorkerV2`` for MiMoV2 (and
Step3p5) targets with ``--speculative-algorithm EAGLE``; ``ServerArgs`` switches
``enable_multi_layer_eagle`` on by itself for ``MiMoV2ForCausalLM``. MiMoV2 allows a dense model
(no ``moe_layer_freq``: every layer a plain MLP), so the family is MiMoV2:

* ``mimov2/``: ``MiMoV2ForCausalLM`` (model type ``mimo_v2``), 4 layers, hidden 256, MLP 512,
  4 query heads / 2 KV heads of 64, vocabulary 4096 (a tokenizer as the Llama target's, ids
  0..2 pad/bos/eos), bf16, ``hybrid_layer_pattern`` [1, 0, 1, 0] (layers 0 and 2 sliding-window,
  window 128; 1 and 3 full attention), RoPE theta 10000 on the full head, no attention sinks, no
  value scale, ``n_routed_experts`` 1 (read by the loader's expert name map; 1 is not MoE);
* ``mimov2-mtp/``: the same ``config.json`` plus ``num_nextn_predict_layers`` 3, and tensors
  ``model.mtp.layers.<k>.*`` for k = 0..2 (``enorm``, ``hnorm``, ``eh_proj``, one decoder
  block, ``final_layernorm``) plus the embedding and lm_head. SGLang's ``ModelConfig`` turns
  the draft's architecture into ``MiMoV2MTP`` and its loader gives draft step ``k`` the tensors
  of MTP layer ``k`` (so ``--speculative-num-steps`` <= 3). Each MTP layer is the target's
  layer 0 behind an ``eh_proj`` that passes the next token's embedding through and mixes in a
  little of the target's hidden state: on CPU each layer names the target's next token about
  45% of the time (``tests/test_tiny_models_mtp.py`` measures it with SGLang's own modules).
  The target's linear layers use std 0.08 (0.05 at twice the width for the Llama pair), so a
  token 200 positions back changes as many later predictions as in the Llama target.

Why hybrid sliding-window attention: SGLang treats every MiMoV2 model as hybrid SWA (separate
SWA and full KV pools; the MTP layers are SWA layers), so a MiMoV2 without SWA layers does not
exist for it; the window of 128 is shorter than most e2e prompts (up to 1800 tokens), so it
matters, and SGLang may drop out-of-window KV from the SWA pool. Sliding-window and full layers have the same head shapes, which SGLang's Triton and
FA3 backends both run (Triton needs a second buffer only when the value widths differ), and no
attention sinks. transformers 5.6 has no ``mimo_v2`` model type, so each directory carries
``configuration_mimo_v2.py`` (named in ``auto_map``), as the published MiMo-V2 checkpoints do,
and the Engine needs ``trust_remote_code=True``.

On the GPU box: TP 1 (TP 2 also fits: 2 KV heads; no fused-qkv layout, so SGLang imposes no
attention-TP size); FA3 staged for the ``default`` and ``fa3`` cases (on Hopper SGLang picks
FA3 for this model by itself; Triton needs nothing); hybrid SWA memory on (SGLang's default).
Engine kwargs of the e2e cases (``gpu_e2e.py --group mtp``; ``default``: no attention backend
and no piecewise-CUDA-graph switch)::

    sglang.Engine(model_path=".../mimov2", speculative_draft_model_path=".../mimov2-mtp",
                  speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
                  speculative_num_draft_tokens=4, trust_remote_code=True,
                  attention_backend="triton",            # or "fa3", or not given (default)
                  disable_piecewise_cuda_graph=True,     # or False; not given with default
                  disable_cuda_graph=False, cuda_graph_max_bs=64,  # CUDA graph off: True, no max bs
                  piecewise_cuda_graph_max_tokens=512,   # with piecewise CUDA graph on (and default)
                  sampling_backend="pytorch", grammar_backend="none", skip_tokenizer_init=True,
                  mem_fraction_static=0.06, chunked_prefill_size=512, max_running_requests=56,
                  max_total_tokens=65536, random_seed=0, log_level="info")

DeepSeek MTP (MLA): SGLang 0.5.12.post1 runs a ``DeepseekV3ForCausalLM`` target with
``--speculative-algorithm EAGLE`` (or ``NEXTN``, the same) on ``EAGLEWorkerV2``, and its draft is
``DeepseekV3ForCausalLMNextN`` (``ModelConfig`` renames the draft's architecture): one NextN layer
read from ``model.layers.<num_hidden_layers>.*``. DeepSeek ships that layer inside the target's
checkpoint, and SGLang's ``ServerArgs`` sets the draft path to the target's own when none is
given, so the simplest real layout is one directory:

* ``deepseek/``: ``DeepseekV3ForCausalLM`` (model type ``deepseek_v3``, transformers' own config
  class), 4 layers (0..2 dense, 3 MoE), hidden 256, 8 heads, MLA with DeepSeek-V3's per-head
  shapes (``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64, ``qk_nope_head_dim`` 128,
  ``v_head_dim`` 128: FA3 MLA decodes a 576-wide latent with 512-wide values, the MHA prefill
  runs 192 / 128 heads, as for V3/R1), ``q_lora_rank`` 256 (V3's fused ``q_a`` + ``kv_a``
  projection), interleaved RoPE, no RoPE scaling; MoE: 8 routed experts in 2 groups, 2 per token
  (``noaux_tc`` sigmoid gate, V3's routing), 1 shared expert, routed scaling 2.5; vocabulary
  4096 with the Llama target's tokenizer (ids 0..2 pad/bos/eos), bf16. ``num_nextn_predict_layers``
  1, and the NextN layer ``model.layers.4.*``: ``enorm``, ``hnorm``, ``eh_proj``,
  ``shared_head.norm``, a decoder layer (always MoE for SGLang) and DeepSeek's own copies of the
  embedding and lm_head (``embed_tokens``, ``shared_head.head``), which SGLang's NextN loader skips
  (the draft worker hands the draft the target's); the target's loader skips the whole layer.
  The NextN layer is the target's layer 0 (its dense MLP as the shared expert, small random
  routed experts) behind an ``eh_proj`` that passes the next token's embedding through and mixes
  in a little of the target's hidden state: on CPU its first draft step names the target's next
  token about 40% of the time and a chain of 3 steps accepts about 1.7 tokens a step
  (``deepseek_greedy_probe``; ``tests/test_tiny_models_mla.py`` checks it with SGLang's modules).
  The EOS row of lm_head gets the upper-quartile norm (the draw put it among the shortest, and
  the ``eos`` churn needs greedy outputs that meet EOS; the other targets' draws put theirs there).
  The CPU reference (``deepseek_reference``) computes MLA the plain way (per-head keys and values
  from the latent); SGLang's MHA prefill and its absorbed decode path both match it.

Launched as a DeepSeek user does (``gpu_e2e.py --group mla``): ``sglang.Engine(model_path=
".../deepseek", speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
speculative_num_draft_tokens=4, ...)`` with no draft path, no attention backend and no piecewise
CUDA graph switch (SGLang picks FA3 for MLA on Hopper; 3 / 1 / 4 is its own choice for DeepSeek).

Command line: ``scripts/make_tiny_models.py --out DIR [--check]``; the harnesses call
:func:`build_tiny_models`, the benchmarks :func:`write_model_dirs` (config-only models, and the
DeepSeek one with its seeded weights).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TARGET_DIRNAME = "target"
DRAFT_DIRNAME = "draft"
EAGLE3_DIRNAME = "eagle3"
EAGLE_DIRNAME = "eagle"
EAGLE_ARCH = "LlamaForCausalLMEagle"
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2 (pad, bos, eos in llama_config)


# ----------------------------------------------------------------------------- config


def llama_config(
    *,
    num_layers: int = 4,
    hidden_size: int = 512,
    intermediate_size: int = 1024,
    num_heads: int = 8,
    num_kv_heads: int = 4,
    head_dim: int = 64,
    vocab_size: int = 4096,
    max_position_embeddings: int = 4096,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-5,
) -> dict[str, Any]:
    """A HF ``config.json`` dict for a ``LlamaForCausalLM`` stored in bf16."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def _widths(config: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """hidden, intermediate, query width, key/value width, vocabulary."""
    hd = config["head_dim"]
    return (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"] * hd,
            config["num_key_value_heads"] * hd, config["vocab_size"])


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, as SGLang's ``LlamaForCausalLM.load_weights`` expects them.

    The loader maps ``q/k/v_proj`` onto ``qkv_proj`` and ``gate/up_proj`` onto
    ``gate_up_proj`` itself, so the checkpoint uses the plain HF names.
    """
    h, inter, nq, nkv, v = _widths(config)
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (nq, h)
        shapes[p + "self_attn.k_proj.weight"] = (nkv, h)
        shapes[p + "self_attn.v_proj.weight"] = (nkv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, nq)
        shapes[p + "mlp.gate_proj.weight"] = (inter, h)
        shapes[p + "mlp.up_proj.weight"] = (inter, h)
        shapes[p + "mlp.down_proj.weight"] = (h, inter)
    return shapes


def eagle3_config(target: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` of a one-layer EAGLE3 draft for ``target`` (same widths and vocab)."""
    cfg = dict(target, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1)
    cfg["draft_vocab_size"] = target["vocab_size"]  # no hot-token map: full vocabulary
    # Three captured target layers (SGLang's default list for a 4-layer target repeats one).
    layers = target["num_hidden_layers"]
    cfg["eagle_config"] = {"use_aux_hidden_state": True,
                           "eagle_aux_hidden_state_layer_ids": [0, max(1, layers // 2 - 1), max(2, layers - 2)]}
    return cfg


def expected_eagle3_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor names of an EAGLE3 checkpoint as ``LlamaForCausalLMEagle3.load_weights`` maps
    them: one ``midlayer`` whose attention reads [embedding, hidden] (2x wide) and an ``fc``
    that folds the target's three captured hidden states into one."""
    h, inter, nq, nkv, v = _widths(config)
    p = "midlayer."
    return {
        "embed_tokens.weight": (v, h),
        "fc.weight": (h, 3 * h),
        "norm.weight": (h,),
        "lm_head.weight": (config["draft_vocab_size"], h),
        p + "input_layernorm.weight": (h,),
        p + "hidden_norm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (nq, 2 * h),
        p + "self_attn.k_proj.weight": (nkv, 2 * h),
        p + "self_attn.v_proj.weight": (nkv, 2 * h),
        p + "self_attn.o_proj.weight": (h, nq),
        p + "mlp.gate_proj.weight": (inter, h),
        p + "mlp.up_proj.weight": (inter, h),
        p + "mlp.down_proj.weight": (h, inter),
    }


def eagle_config(target: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """``config.json`` of an EAGLE-1 draft for ``target``: ``num_layers`` decoder layers of the
    target's widths and vocabulary."""
    return dict(target, architectures=[EAGLE_ARCH], num_hidden_layers=num_layers)


def expected_eagle_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor names of an EAGLE-1 checkpoint as ``LlamaForCausalLMEagle.load_weights`` takes
    them: without the ``model.`` prefix (it adds one), an ``fc`` with bias that folds
    [embedding, target hidden state] into one, decoder layers whose layer 0 has no
    ``input_layernorm`` (SGLang replaces it with the identity), no final norm. No ``lm_head``:
    the loader drops every ``lm_head`` tensor, and the draft worker gives the draft the target's
    embedding and lm_head at start-up (the embedding is loaded all the same)."""
    h = config["hidden_size"]
    skip = {"model.norm.weight", "model.layers.0.input_layernorm.weight"}
    shapes = {name.removeprefix("model."): shape for name, shape in expected_shapes(config).items()
              if name.startswith("model.") and name not in skip}
    shapes.update({"fc.weight": (h, 2 * h), "fc.bias": (h,)})
    return shapes


def shapes_for(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    if config["architectures"] == ["LlamaForCausalLMEagle3"]:
        return expected_eagle3_shapes(config)
    if config["architectures"] == [EAGLE_ARCH]:
        return expected_eagle_shapes(config)
    if is_mtp_config(config):
        return expected_mtp_shapes(config)
    if is_deepseek_config(config):
        return expected_deepseek_shapes(config)
    return expected_shapes(config)  # Llama, and the MiMoV2 target (the same tensor names)


# ----------------------------------------------------------------------------- weights


def make_target_weights(
    config: dict[str, Any],
    *,
    seed: int = 1234,
    linear_std: float = 0.05,
    embed_std: float = 1.0,
    lm_head_std: float = 0.2,
    late_layer_scale: float = 0.5,
    draft_layers: int = 2,
) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """Deterministic random weights (bf16) for the target model.

    ``late_layer_scale`` multiplies the std of the layers the draft does not copy, so the
    draft's prediction stays close to (but not identical with) the target's.
    """
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            # Near-one RMSNorm gains with a little spread (as in trained models).
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name == "model.embed_tokens.weight":
            t = embed_std * torch.randn(shape, generator=gen)
        elif name == "lm_head.weight":
            t = lm_head_std * torch.randn(shape, generator=gen)
        else:
            layer = int(name.split(".")[2])
            std = linear_std * (late_layer_scale if layer >= draft_layers else 1.0)
            t = std * torch.randn(shape, generator=gen)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def make_draft_weights(
    target: dict[str, "torch.Tensor"],  # noqa: F821
    draft_config: dict[str, Any],
) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """The draft: the target's embedding, norm, lm_head and first layers (copied)."""
    out = {}
    for name in expected_shapes(draft_config):
        out[name] = target[name].clone()
    return out


def make_eagle3_weights(
    target: dict[str, "torch.Tensor"],  # noqa: F821
    config: dict[str, Any],
    *,
    seed: int = 1234,
    linear_std: float = 0.05,
) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """EAGLE3 draft: the target's embedding, final norm and lm_head; random midlayer and fc."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed + 3)
    shared = {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "lm_head.weight": "lm_head.weight"}
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected_eagle3_shapes(config).items():
        if name in shared:
            t = target[shared[name]].clone()
        elif name.endswith("norm.weight"):
            t = (1.0 + 0.1 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        else:
            t = (linear_std * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        out[name] = t.contiguous()
    return out


def make_eagle_weights(
    target: dict[str, "torch.Tensor"],  # noqa: F821
    config: dict[str, Any],
    *,
    mix: float = 0.1,
) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """EAGLE-1 draft correlated with the target, no random draw: the target's embedding and
    first ``num_hidden_layers`` layers (layer 0 without its input norm, as SGLang runs it; its
    gains are about 1, so that is a small change), behind an ``fc`` that passes the token's
    embedding through and adds ``mix`` times the target's hidden state (zero bias). A draft step
    is thus about the target's prediction without its later (scaled-down) layers and final norm
    (argmax is nearly scale invariant): often right, not always."""
    import torch

    h = config["hidden_size"]
    eye = torch.eye(h)
    out: dict[str, torch.Tensor] = {
        "embed_tokens.weight": target["model.embed_tokens.weight"].clone(),
        "fc.weight": torch.cat([eye, mix * eye], dim=1).to(torch.bfloat16).contiguous(),
        "fc.bias": torch.zeros(h, dtype=torch.bfloat16),
    }
    for name in expected_eagle_shapes(config):
        if name.startswith("layers."):
            out[name] = target["model." + name].clone()
    return out


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer: id ``i`` is the word ``w<i>`` (0..2 are the special tokens).

    Built offline with ``tokenizers``; ``transformers.AutoTokenizer`` (and so SGLang) loads
    it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    pad, bos, eos = SPECIAL_TOKENS
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
        "pad_token": pad, "bos_token": bos, "eos_token": eos, "add_bos_token": False,
    }, indent=2) + "\n")


def write_model(directory: Path, config: dict[str, Any], weights: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})


def make_models(
    out: Path,
    *,
    seed: int = 1234,
    target_layers: int = 4,
    draft_layers: int = 2,
    linear_std: float = 0.05,
    embed_std: float = 1.0,
    lm_head_std: float = 0.2,
    late_layer_scale: float = 0.5,
    eagle_mix: float = 0.1,
    mtp: bool = True,
    mla: bool = True,
    **shape: Any,
) -> tuple[Path, Path]:
    """Write ``out/target`` (with its tokenizer), ``out/draft``, ``out/eagle3``, ``out/eagle``
    (EAGLE-1: the target's first ``draft_layers`` layers behind an ``fc`` that mixes in
    ``eagle_mix`` of the target's hidden state), (``mtp``) ``out/mimov2`` + ``out/mimov2-mtp`` and
    (``mla``) ``out/deepseek`` (target and NextN layer in one checkpoint); the MiMoV2 and DeepSeek
    models have their own fixed shapes (``shape`` is the Llama pair's). Returns the target and
    STANDALONE draft paths."""
    if not 1 <= draft_layers <= target_layers:
        raise ValueError(f"draft_layers must be in 1..{target_layers}, got {draft_layers}")
    tcfg = llama_config(num_layers=target_layers, **shape)
    dcfg = llama_config(num_layers=draft_layers, **shape)
    tw = make_target_weights(
        tcfg,
        seed=seed,
        linear_std=linear_std,
        embed_std=embed_std,
        lm_head_std=lm_head_std,
        late_layer_scale=late_layer_scale,
        draft_layers=draft_layers,
    )
    dw = make_draft_weights(tw, dcfg)
    tdir, ddir = out / TARGET_DIRNAME, out / DRAFT_DIRNAME
    write_model(tdir, tcfg, tw)
    write_tokenizer(tdir, tcfg["vocab_size"])
    write_model(ddir, dcfg, dw)
    ecfg = eagle3_config(tcfg)
    write_model(out / EAGLE3_DIRNAME, ecfg, make_eagle3_weights(tw, ecfg, seed=seed, linear_std=linear_std))
    ecfg = eagle_config(tcfg, draft_layers)
    write_model(out / EAGLE_DIRNAME, ecfg, make_eagle_weights(tw, ecfg, mix=eagle_mix))
    if mtp:
        make_mimov2_models(out, seed=seed)
    if mla:
        make_deepseek_models(out, seed=seed)
    return tdir, ddir


# ----------------------------------------------------------------------------- MiMoV2 + MTP

MIMOV2_DIRNAME = "mimov2"
MIMOV2_MTP_DIRNAME = "mimov2-mtp"
MIMOV2_ARCH = "MiMoV2ForCausalLM"
MIMOV2_MODEL_TYPE = "mimo_v2"
#: transformers 5.6 has no MiMoV2 config class: the checkpoint carries one (``auto_map``),
#: as the published MiMo-V2 checkpoints do, and SGLang reads it with ``trust_remote_code``.
MIMOV2_CONFIG_MODULE = "configuration_mimo_v2"
MIMOV2_CONFIG_CLASS = "TinyMiMoV2Config"
MIMOV2_CONFIG_SOURCE = f'''"""Config class of the tiny MiMoV2 test model (written by make_tiny_models.py).

transformers has no ``{MIMOV2_MODEL_TYPE}`` model type, so this checkpoint names this class in
``auto_map``; every field comes from config.json."""

from transformers import PretrainedConfig


class {MIMOV2_CONFIG_CLASS}(PretrainedConfig):
    model_type = "{MIMOV2_MODEL_TYPE}"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
'''
#: One MTP layer per draft step: SGLang's multi-layer EAGLE gives step k its own draft model,
#: loaded from ``model.mtp.layers.<k>.*`` (``--speculative-num-steps`` <= this).
MTP_LAYERS = 3


def mimov2_config(
    *,
    num_layers: int = 4,
    hybrid_layer_pattern: tuple[int, ...] = (1, 0, 1, 0),
    sliding_window: int = 128,
    hidden_size: int = 256,
    intermediate_size: int = 512,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    vocab_size: int = 4096,
    max_position_embeddings: int = 4096,
    rope_theta: float = 10000.0,
    layernorm_epsilon: float = 1e-5,
    mtp_layers: int | None = None,
) -> dict[str, Any]:
    """``config.json`` of a dense ``MiMoV2ForCausalLM`` (no MoE layer: no ``moe_layer_freq``)
    with hybrid sliding-window attention, stored in bf16. ``mtp_layers``: the MTP draft's
    config (``num_nextn_predict_layers``), else the target's.

    ``hybrid_layer_pattern[i]`` is 1 for a sliding-window layer, 0 for a full-attention one.
    Sliding-window and full layers have the same head shapes (SGLang reads them from
    ``swa_*`` and the plain keys), so the MTP layers, which are sliding-window layers, can copy
    the target's layer 0, and one KV width serves both pools. No attention sinks, no value
    scale, full rotary dimension: the plainest MiMoV2 that SGLang runs.
    ``n_routed_experts`` is 1 because ``MiMoV2ForCausalLM.load_weights`` builds its expert
    name map from it even when no layer is MoE (1 is not MoE for SGLang's loader)."""
    if len(hybrid_layer_pattern) != num_layers or set(hybrid_layer_pattern) - {0, 1}:
        raise ValueError(f"hybrid_layer_pattern must hold {num_layers} values of 0/1, got {hybrid_layer_pattern}")
    if 0 not in hybrid_layer_pattern:
        raise ValueError("hybrid_layer_pattern needs at least one full-attention layer (0)")
    cfg: dict[str, Any] = {
        "architectures": [MIMOV2_ARCH],
        "model_type": MIMOV2_MODEL_TYPE,
        "auto_map": {"AutoConfig": f"{MIMOV2_CONFIG_MODULE}.{MIMOV2_CONFIG_CLASS}"},
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "v_head_dim": head_dim,
        "swa_num_attention_heads": num_heads,
        "swa_num_key_value_heads": num_kv_heads,
        "swa_head_dim": head_dim,
        "swa_v_head_dim": head_dim,
        "hybrid_layer_pattern": list(hybrid_layer_pattern),
        "sliding_window_size": sliding_window,
        "add_swa_attention_sink_bias": False,
        "add_full_attention_sink_bias": False,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": rope_theta,
        "swa_rope_theta": rope_theta,
        "layernorm_epsilon": layernorm_epsilon,
        "hidden_act": "silu",
        "attention_bias": False,
        "n_routed_experts": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    if mtp_layers is not None:
        cfg["num_nextn_predict_layers"] = mtp_layers
    return cfg


def is_mtp_config(config: dict[str, Any]) -> bool:
    return config["architectures"] == [MIMOV2_ARCH] and bool(config.get("num_nextn_predict_layers"))


_MTP_BLOCK = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
              "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
              "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def expected_mtp_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor names of the MTP draft checkpoint, as ``MiMoV2MTP.load_weights`` maps them after
    SGLang's loader keeps only layer ``k`` of ``model.mtp.layers.<k>.*`` for draft step ``k``:
    ``enorm`` / ``hnorm`` (the embedding and the target's hidden state, each normalised),
    ``eh_proj`` (their concatenation -> hidden), one decoder block, ``final_layernorm``; plus the
    embedding and lm_head, which the draft worker replaces with the target's at start-up."""
    target = expected_shapes(config)
    h = config["hidden_size"]
    shapes = {"model.embed_tokens.weight": target["model.embed_tokens.weight"], "lm_head.weight": target["lm_head.weight"]}
    for k in range(config["num_nextn_predict_layers"]):
        p = f"model.mtp.layers.{k}."
        shapes.update({p + "enorm.weight": (h,), p + "hnorm.weight": (h,), p + "eh_proj.weight": (h, 2 * h),
                       p + "final_layernorm.weight": (h,)})
        shapes.update({p + name: target["model.layers.0." + name] for name in _MTP_BLOCK})
    return shapes


def make_mtp_weights(
    target: dict[str, "torch.Tensor"],  # noqa: F821
    config: dict[str, Any],
    *,
    seed: int = 1234,
    link_std: float = 0.01,
) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """MTP layers correlated with the target: each is the target's layer 0 behind an
    ``eh_proj`` that passes the (normalised) next-token embedding through unchanged and mixes in
    the target's hidden state with small random weights (``link_std``, a different draw per
    layer), then the target's final norm. A step's guess is thus about the target's own
    prediction without its later (scaled-down) layers: often right, not always."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed + 5)
    h = config["hidden_size"]
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": target["model.embed_tokens.weight"].clone(),
                                    "lm_head.weight": target["lm_head.weight"].clone()}
    for k in range(config["num_nextn_predict_layers"]):
        p = f"model.mtp.layers.{k}."
        link = link_std * torch.randn((h, h), generator=gen)
        out[p + "eh_proj.weight"] = torch.cat([torch.eye(h), link], dim=1).to(torch.bfloat16).contiguous()
        out[p + "enorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        out[p + "hnorm.weight"] = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(torch.bfloat16)
        out[p + "final_layernorm.weight"] = target["model.norm.weight"].clone()
        for name in _MTP_BLOCK:
            out[p + name] = target["model.layers.0." + name].clone()
    return out


def make_mimov2_models(out: Path, *, seed: int = 1234, mtp_layers: int = MTP_LAYERS, linear_std: float = 0.08,
                       link_std: float = 0.01, **shape: Any) -> tuple[Path, Path]:
    """Write ``out/mimov2`` (the target, with its tokenizer) and ``out/mimov2-mtp`` (its MTP
    draft); returns both paths. The target's layers after the first are scaled down, as for the
    Llama pair, so the MTP layers (copies of layer 0) agree with it often but not always.

    ``linear_std`` 0.08 (the Llama pair: 0.05 at twice the width) gives the narrower model the
    same dependence on context: one token changed 200 positions back changes about 1% of the
    later greedy predictions, as for the Llama target (0.3% at 0.05)."""
    tcfg = mimov2_config(**shape)
    dcfg = mimov2_config(mtp_layers=mtp_layers, **shape)
    tw = make_target_weights(tcfg, seed=seed + 100, linear_std=linear_std, draft_layers=1)
    tdir, ddir = out / MIMOV2_DIRNAME, out / MIMOV2_MTP_DIRNAME
    for directory, cfg, weights in ((tdir, tcfg, tw), (ddir, dcfg, make_mtp_weights(tw, dcfg, seed=seed, link_std=link_std))):
        write_model(directory, cfg, weights)
        (directory / f"{MIMOV2_CONFIG_MODULE}.py").write_text(MIMOV2_CONFIG_SOURCE)
    write_tokenizer(tdir, tcfg["vocab_size"])
    return tdir, ddir


# ----------------------------------------------------------------------------- DeepSeek-V3 (MLA) + NextN

DEEPSEEK_DIRNAME = "deepseek"
DEEPSEEK_ARCH = "DeepseekV3ForCausalLM"
#: The tensors of the NextN layer that are not a decoder layer's (SGLang maps them to
#: ``model.<name>``; every other ``model.layers.<L>.*`` tensor goes to ``model.decoder``).
NEXTN_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
#: Tensors of the NextN layer that SGLang's NextN loader skips: the draft worker hands the
#: draft the target's embedding and lm_head (DeepSeek-V3's checkpoint carries both all the same).
NEXTN_SHARED = ("embed_tokens.weight", "shared_head.head.weight")


def deepseek_config(
    *,
    num_layers: int = 4,
    first_k_dense_replace: int = 3,
    hidden_size: int = 256,
    intermediate_size: int = 512,
    num_heads: int = 8,
    q_lora_rank: int | None = 256,
    kv_lora_rank: int = 512,
    qk_nope_head_dim: int = 128,
    qk_rope_head_dim: int = 64,
    v_head_dim: int = 128,
    n_routed_experts: int = 8,
    num_experts_per_tok: int = 2,
    n_group: int = 2,
    topk_group: int = 1,
    moe_intermediate_size: int = 512,
    n_shared_experts: int = 1,
    routed_scaling_factor: float = 2.5,
    vocab_size: int = 4096,
    max_position_embeddings: int = 4096,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-6,
) -> dict[str, Any]:
    """``config.json`` of a tiny ``DeepseekV3ForCausalLM`` with its NextN (MTP) layer, in bf16.

    MLA with DeepSeek-V3's per-head shapes: a compressed KV of ``kv_lora_rank`` 512 plus a
    shared rotary key of ``qk_rope_head_dim`` 64 (the 576 / 512 latent that SGLang's FA3 MLA
    decode and its KV pool are built for), 128 + 64 query dims and 128 value dims per head (the
    MHA prefill's 192 / 128), a query LoRA (``q_lora_rank``: the fused ``q_a`` + ``kv_a``
    projection V3 has), interleaved rotary embedding, no RoPE scaling. Layers below
    ``first_k_dense_replace`` are dense, the others (and always the NextN layer: SGLang builds
    it as MoE) route ``num_experts_per_tok`` of ``n_routed_experts`` experts with V3's
    ``noaux_tc`` sigmoid gate in ``n_group`` groups, plus shared experts. The token ids are the
    other tiny models' (vocabulary 4096, ids 0..2 pad/bos/eos)."""
    if not 0 <= first_k_dense_replace <= num_layers:
        raise ValueError(f"first_k_dense_replace must be in 0..{num_layers}, got {first_k_dense_replace}")
    if n_routed_experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"{n_routed_experts} experts in {n_group} groups, {topk_group} of them taken: not a grouping")
    return {
        "architectures": [DEEPSEEK_ARCH],
        "model_type": "deepseek_v3",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "q_lora_rank": q_lora_rank,
        "kv_lora_rank": kv_lora_rank,
        "qk_nope_head_dim": qk_nope_head_dim,
        "qk_rope_head_dim": qk_rope_head_dim,
        "v_head_dim": v_head_dim,
        "first_k_dense_replace": first_k_dense_replace,
        "moe_layer_freq": 1,
        "n_routed_experts": n_routed_experts,
        "num_experts_per_tok": num_experts_per_tok,
        "n_group": n_group,
        "topk_group": topk_group,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": routed_scaling_factor,
        "moe_intermediate_size": moe_intermediate_size,
        "n_shared_experts": n_shared_experts,
        "hidden_act": "silu",
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "rope_interleave": True,
        "rms_norm_eps": rms_norm_eps,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def is_deepseek_config(config: dict[str, Any]) -> bool:
    return config["architectures"] == [DEEPSEEK_ARCH]


def is_moe_layer(config: dict[str, Any], layer: int) -> bool:
    """Whether SGLang builds layer ``layer`` as MoE (the NextN layer, ``num_hidden_layers``,
    always is)."""
    return layer >= config["first_k_dense_replace"] and layer % config["moe_layer_freq"] == 0


def _deepseek_layer_shapes(config: dict[str, Any], layer: int) -> dict[str, tuple[int, ...]]:
    """The checkpoint tensors of decoder layer ``layer`` (names after ``model.layers.<layer>.``)."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    rank, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    qk, v = config["qk_nope_head_dim"] + rope, config["v_head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "self_attn.kv_a_proj_with_mqa.weight": (rank + rope, h),
        "self_attn.kv_a_layernorm.weight": (rank,),
        "self_attn.kv_b_proj.weight": (heads * (config["qk_nope_head_dim"] + v), rank),
        "self_attn.o_proj.weight": (h, heads * v),
    }
    if config["q_lora_rank"] is None:
        shapes["self_attn.q_proj.weight"] = (heads * qk, h)
    else:
        shapes["self_attn.q_a_proj.weight"] = (config["q_lora_rank"], h)
        shapes["self_attn.q_a_layernorm.weight"] = (config["q_lora_rank"],)
        shapes["self_attn.q_b_proj.weight"] = (heads * qk, config["q_lora_rank"])

    def mlp(prefix: str, inter: int) -> None:
        shapes.update({prefix + "gate_proj.weight": (inter, h), prefix + "up_proj.weight": (inter, h),
                       prefix + "down_proj.weight": (h, inter)})

    if layer < config["num_hidden_layers"] and not is_moe_layer(config, layer):
        mlp("mlp.", config["intermediate_size"])
        return shapes
    experts, inter = config["n_routed_experts"], config["moe_intermediate_size"]
    shapes["mlp.gate.weight"] = (experts, h)
    shapes["mlp.gate.e_score_correction_bias"] = (experts,)
    for e in range(experts):
        mlp(f"mlp.experts.{e}.", inter)
    if config["n_shared_experts"]:
        mlp("mlp.shared_experts.", inter * config["n_shared_experts"])
    return shapes


def expected_deepseek_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the DeepSeek checkpoint: the target's layers
    ``0..num_hidden_layers-1`` as ``DeepseekV2ForCausalLM.load_weights`` takes them (it fuses
    ``q_a_proj`` and ``kv_a_proj_with_mqa`` into one parameter, ``gate/up_proj`` into
    ``gate_up_proj``, and stacks the routed experts itself), and the NextN layer
    ``model.layers.<num_hidden_layers>.*`` as DeepSeek-V3 ships it: ``enorm``, ``hnorm``,
    ``eh_proj``, ``shared_head.norm``, one decoder layer (MoE), and its own copy of the
    embedding and lm_head (``shared_head.head``), which SGLang's NextN loader skips. The target's
    loader skips every ``model.layers.<num_hidden_layers>.*`` tensor."""
    h, vocab, n = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
                                          "lm_head.weight": (vocab, h)}
    for i in range(n + config["num_nextn_predict_layers"]):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in _deepseek_layer_shapes(config, i).items()})
    p = f"model.layers.{n}."
    shapes.update({p + "enorm.weight": (h,), p + "hnorm.weight": (h,), p + "eh_proj.weight": (h, 2 * h),
                   p + "shared_head.norm.weight": (h,), p + "embed_tokens.weight": (vocab, h),
                   p + "shared_head.head.weight": (vocab, h)})
    return shapes


def make_deepseek_weights(
    config: dict[str, Any],
    *,
    seed: int = 1234,
    linear_std: float = 0.05,
    embed_std: float = 1.0,
    lm_head_std: float = 0.2,
    late_layer_scale: float = 0.5,
    expert_std: float = 0.02,
    link_std: float = 0.01,
    eos_norm_quantile: float = 0.75,
) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """Deterministic weights (bf16) of the target and its NextN layer.

    The target: near-one norm gains, normal linear layers (``linear_std``; the layers after
    the first ``late_layer_scale`` times that); an MoE layer's routed experts are small
    (``expert_std``) next to its shared expert, and its gate has no correction bias (zeros), so
    routing shifts the output a little and a near-tie in the gate changes little.

    The NextN layer, correlated with the target as the MiMoV2 MTP layers are: the target's
    layer 0 (attention and norms; its dense MLP becomes the shared expert, with small random
    routed experts beside it) behind an ``eh_proj`` that passes the normalised next-token
    embedding through and mixes in the target's hidden state with small random weights
    (``link_std``), then the target's final norm. Its guess is about the target's prediction
    without the later layers: often right, not always."""
    import torch

    if config["first_k_dense_replace"] < 1:
        raise ValueError("the NextN layer copies layer 0, which must be dense (first_k_dense_replace >= 1)")
    if config["moe_intermediate_size"] * config["n_shared_experts"] != config["intermediate_size"]:
        raise ValueError("the NextN layer's shared expert copies layer 0's MLP: moe_intermediate_size x "
                         "n_shared_experts must equal intermediate_size")
    gen = torch.Generator(device="cpu").manual_seed(seed + 200)
    n, h = config["num_hidden_layers"], config["hidden_size"]
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected_deepseek_shapes(config).items():
        if name.startswith(f"model.layers.{n}."):
            continue  # the NextN layer: below, from the target's
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name == "model.embed_tokens.weight":
            t = embed_std * torch.randn(shape, generator=gen)
        elif name == "lm_head.weight":
            t = lm_head_std * torch.randn(shape, generator=gen)
        elif name.endswith("e_score_correction_bias"):
            t = torch.zeros(shape)
        elif ".mlp.experts." in name:
            t = expert_std * torch.randn(shape, generator=gen)
        else:
            layer = int(name.split(".")[2])
            t = linear_std * (late_layer_scale if layer > 0 else 1.0) * torch.randn(shape, generator=gen)
        out[name] = t.to(torch.bfloat16).contiguous()
    p, first = f"model.layers.{n}.", "model.layers.0."
    for name, shape in _deepseek_layer_shapes(config, n).items():
        if name.startswith("mlp.shared_experts."):
            t = out[first + name.replace("shared_experts.", "")].clone()
        elif name.startswith("mlp.experts."):
            t = (expert_std * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        elif name == "mlp.gate.weight":
            t = (linear_std * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        elif name == "mlp.gate.e_score_correction_bias":
            t = torch.zeros(shape, dtype=torch.bfloat16)
        else:
            t = out[first + name].clone()
        out[p + name] = t.contiguous()
    link = link_std * torch.randn((h, h), generator=gen)
    out[p + "eh_proj.weight"] = torch.cat([torch.eye(h), link], dim=1).to(torch.bfloat16).contiguous()
    out[p + "enorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    out[p + "hnorm.weight"] = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(torch.bfloat16)
    out[p + "shared_head.norm.weight"] = out["model.norm.weight"].clone()
    # The eos churn needs greedy outputs that meet EOS: this draw puts the EOS row of lm_head
    # among the shortest (EOS next to never wins), so it gets the upper-quartile norm, where the
    # Llama and MiMoV2 targets' draws put theirs.
    head = out["lm_head.weight"].float()
    norms = head.norm(dim=-1)
    eos = config["eos_token_id"]
    head[eos] *= norms.quantile(eos_norm_quantile) / norms[eos]
    out["lm_head.weight"] = head.to(torch.bfloat16).contiguous()
    out[p + "embed_tokens.weight"] = out["model.embed_tokens.weight"].clone()
    out[p + "shared_head.head.weight"] = out["lm_head.weight"].clone()
    return out


def make_deepseek_models(out: Path, *, seed: int = 1234, **shape: Any) -> Path:
    """Write ``out/deepseek``: the target, its NextN layer in the same checkpoint (as DeepSeek-V3
    ships it, and as SGLang loads DeepSeek MTP: with no draft path it uses the target's own
    directory, ``DeepseekV3ForCausalLMNextN`` reading ``model.layers.<num_hidden_layers>.*``)
    and the word-level tokenizer; returns the path."""
    cfg = deepseek_config(**shape)
    directory = out / DEEPSEEK_DIRNAME
    write_model(directory, cfg, make_deepseek_weights(cfg, seed=seed))
    write_tokenizer(directory, cfg["vocab_size"])
    return directory


# ----------------------------------------------------------------------------- checks


def check_model_dir(directory: Path) -> list[str]:
    """Problems with a model directory (empty list: names and shapes are as SGLang expects)."""
    from safetensors import safe_open

    problems: list[str] = []
    config = json.loads((directory / "config.json").read_text())
    want = shapes_for(config)
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        have = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    for name in sorted(set(want) - set(have)):
        problems.append(f"{directory.name}: missing {name}")
    for name in sorted(set(have) - set(want)):
        problems.append(f"{directory.name}: unexpected {name}")
    for name in sorted(set(want) & set(have)):
        if want[name] != have[name]:
            problems.append(f"{directory.name}: {name} has shape {have[name]}, want {want[name]}")
    if dtypes != {"BF16"}:
        problems.append(f"{directory.name}: dtypes {sorted(dtypes)}, want BF16 only")
    return problems


def hf_greedy_probe(target: Path, draft: Path, prompts: int = 4, new_tokens: int = 48) -> dict[str, Any]:
    """Greedy-decode a few prompts with HF transformers on CPU (fp32) and report
    output variety and how often the draft's next-token argmax matches the target's."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    tm = LlamaForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    dm = LlamaForCausalLM.from_pretrained(str(draft), dtype=torch.float32).eval()
    vocab = tm.config.vocab_size
    gen = torch.Generator().manual_seed(7)
    distinct: list[int] = []
    agree = total = 0
    outputs: list[list[int]] = []
    with torch.no_grad():
        for i in range(prompts):
            ids = torch.randint(3, vocab, (1, 8 + 17 * i), generator=gen)
            out = tm.generate(ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
            new = out[0, ids.shape[1]:].tolist()
            outputs.append(new)
            distinct.append(len(set(new)))
            # Draft agreement under teacher forcing along the target's own continuation.
            full = out[:, :-1]
            t_next = tm(full).logits[0, ids.shape[1] - 1:].argmax(-1)
            d_next = dm(full).logits[0, ids.shape[1] - 1:].argmax(-1)
            agree += int((t_next == d_next).sum())
            total += int(t_next.numel())
    return {"distinct_per_output": distinct, "draft_agreement": agree / max(total, 1), "outputs": outputs}


def load_fp32(directory: Path) -> tuple[dict[str, Any], dict[str, "torch.Tensor"]]:  # noqa: F821
    """A model directory's config and its tensors in fp32."""
    from safetensors.torch import load_file

    config = json.loads((directory / "config.json").read_text())
    return config, {k: v.float() for k, v in load_file(str(directory / "model.safetensors")).items()}


def _rms_norm(x: "torch.Tensor", weight: "torch.Tensor", eps: float) -> "torch.Tensor":  # noqa: F821
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _norm_eps(cfg: dict[str, Any]) -> float:
    """RMSNorm epsilon: MiMoV2 names it ``layernorm_epsilon``, Llama ``rms_norm_eps``."""
    return cfg["layernorm_epsilon"] if "layernorm_epsilon" in cfg else cfg["rms_norm_eps"]


def _decoder_block(x: "torch.Tensor", w: dict[str, "torch.Tensor"], prefix: str, cfg: dict[str, Any],  # noqa: F821
                   window: int | None, input_norm: bool = True) -> "torch.Tensor":  # noqa: F821
    """One pre-norm block over a whole sequence (causal, optionally the last ``window`` keys
    only), rotary embedding in the rotate-half layout SGLang's ``get_rope`` uses by default.
    ``input_norm`` False: attention reads ``x`` itself (EAGLE-1's first draft layer)."""
    import torch

    n, nh, nkv, hd = x.shape[0], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = _norm_eps(cfg)
    a = _rms_norm(x, w[prefix + "input_layernorm.weight"], eps) if input_norm else x
    q = (a @ w[prefix + "self_attn.q_proj.weight"].T).view(n, nh, hd)
    k = (a @ w[prefix + "self_attn.k_proj.weight"].T).view(n, nkv, hd)
    v = (a @ w[prefix + "self_attn.v_proj.weight"].T).view(n, nkv, hd)
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]

    def rope(t: torch.Tensor) -> torch.Tensor:
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    attn = torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)
    x = x + attn.reshape(n, nh * hd) @ w[prefix + "self_attn.o_proj.weight"].T
    m = _rms_norm(x, w[prefix + "post_attention_layernorm.weight"], eps)
    gate, up = m @ w[prefix + "mlp.gate_proj.weight"].T, m @ w[prefix + "mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(gate) * up) @ w[prefix + "mlp.down_proj.weight"].T


def llama_reference(cfg: dict[str, Any], w: dict[str, "torch.Tensor"], ids: list[int]  # noqa: F821
                    ) -> tuple["torch.Tensor", "torch.Tensor"]:  # noqa: F821
    """The tiny Llama target in plain torch (fp32): logits and final (normalised) hidden states
    of every position, the hidden states SGLang hands an EAGLE draft."""
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        x = _decoder_block(x, w, f"model.layers.{i}.", cfg, None)
    hidden = _rms_norm(x, w["model.norm.weight"], cfg["rms_norm_eps"])
    return hidden @ w["lm_head.weight"].T, hidden


def eagle_reference(cfg: dict[str, Any], w: dict[str, "torch.Tensor"], target: dict[str, "torch.Tensor"],  # noqa: F821
                    ids: list[int], hidden: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:  # noqa: F821
    """The EAGLE-1 draft in plain torch with the target's embedding and lm_head (``target``'s
    tensors: SGLang's draft worker shares them). Position ``p`` reads token ``ids[p]`` and the
    hidden state ``hidden[p]`` (SGLang's draft extend: the target's state one position earlier;
    a later draft step: the draft's own output). Returns its logits and its output hidden
    states (``hidden + residual``, no final norm, as SGLang's ``LlamaForCausalLMEagle``)."""
    import torch

    e = target["model.embed_tokens.weight"][ids]
    x = torch.cat([e, hidden], dim=-1) @ w["fc.weight"].T + w["fc.bias"]
    for i in range(cfg["num_hidden_layers"]):
        x = _decoder_block(x, w, f"layers.{i}.", cfg, None, input_norm=i > 0)
    return x @ target["lm_head.weight"].T, x


def mimov2_reference(cfg: dict[str, Any], w: dict[str, "torch.Tensor"], ids: list[int]  # noqa: F821
                     ) -> tuple["torch.Tensor", "torch.Tensor"]:  # noqa: F821
    """The tiny MiMoV2 target in plain torch (fp32): logits and final (normalised) hidden
    states of every position. A probe of the weights, not SGLang's numerics."""
    x = w["model.embed_tokens.weight"][ids]
    for i, swa in enumerate(cfg["hybrid_layer_pattern"]):
        x = _decoder_block(x, w, f"model.layers.{i}.", cfg, cfg["sliding_window_size"] if swa else None)
    hidden = _rms_norm(x, w["model.norm.weight"], cfg["layernorm_epsilon"])
    return hidden @ w["lm_head.weight"].T, hidden


def mtp_reference(cfg: dict[str, Any], w: dict[str, "torch.Tensor"], layer: int, ids: list[int],  # noqa: F821
                  hidden: "torch.Tensor") -> "torch.Tensor":  # noqa: F821
    """MTP layer ``layer`` in plain torch: position ``p`` reads token ``ids[p]`` and the target's
    hidden state ``hidden[p]``; returns its logits (a guess at the token after ``ids[p]``)."""
    import torch

    p, eps = f"model.mtp.layers.{layer}.", cfg["layernorm_epsilon"]
    e = _rms_norm(w["model.embed_tokens.weight"][ids], w[p + "enorm.weight"], eps)
    x = torch.cat([e, _rms_norm(hidden, w[p + "hnorm.weight"], eps)], dim=-1) @ w[p + "eh_proj.weight"].T
    x = _decoder_block(x, w, p, cfg, cfg["sliding_window_size"])
    return _rms_norm(x, w[p + "final_layernorm.weight"], eps) @ w["lm_head.weight"].T


def _mlp(m: "torch.Tensor", w: dict[str, "torch.Tensor"], prefix: str) -> "torch.Tensor":  # noqa: F821
    """A SwiGLU MLP (``gate_proj``, ``up_proj``, ``down_proj`` under ``prefix``)."""
    import torch

    gate, up = m @ w[prefix + "gate_proj.weight"].T, m @ w[prefix + "up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[prefix + "down_proj.weight"].T


def _rope_interleaved(t: "torch.Tensor", theta: float, start: int = 0) -> "torch.Tensor":  # noqa: F821
    """Rotary embedding of ``t`` (positions ``start``.. along dim 0, features last) in the
    interleaved (GPT-J) layout DeepSeek uses (``rope_interleave``): pairs (2i, 2i+1) rotate."""
    import torch

    n, d = t.shape[0], t.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(start, start + n, dtype=torch.float32)[:, None] * inv[None, :]
    shape = (n,) + (1,) * (t.dim() - 2) + (d // 2,)
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    even, odd = t[..., 0::2], t[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def deepseek_moe_reference(m: "torch.Tensor", w: dict[str, "torch.Tensor"], prefix: str,  # noqa: F821
                           cfg: dict[str, Any], shared: bool = True) -> "torch.Tensor":  # noqa: F821
    """DeepSeek-V3's MoE (the MLP under ``prefix``) in plain torch: sigmoid gate scores, the
    ``topk_group`` best groups (a group's score: its two best experts, correction bias included),
    the ``num_experts_per_tok`` best experts in them; their scores (no bias), normalised and times
    ``routed_scaling_factor``, weight the routed experts; the shared experts add on (unless not
    ``shared``)."""
    import torch

    n, experts, groups = m.shape[0], cfg["n_routed_experts"], cfg["n_group"]
    scores = (m @ w[prefix + "gate.weight"].T).sigmoid()
    choice = scores + w[prefix + "gate.e_score_correction_bias"]
    group_scores = choice.view(n, groups, -1).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros(n, groups).scatter(1, group_scores.topk(cfg["topk_group"], dim=-1).indices, 1.0).bool()
    masked = choice.masked_fill(~keep.repeat_interleave(experts // groups, dim=1), float("-inf"))
    ids = masked.topk(cfg["num_experts_per_tok"], dim=-1).indices
    weights = scores.gather(1, ids)
    if cfg["norm_topk_prob"]:
        weights = weights / weights.sum(-1, keepdim=True)
    weights = weights * cfg["routed_scaling_factor"]
    out = _mlp(m, w, prefix + "shared_experts.") if shared and cfg["n_shared_experts"] else torch.zeros_like(m)
    for e in range(experts):
        rows, slot = (ids == e).nonzero(as_tuple=True)
        if rows.numel():
            out[rows] += weights[rows, slot, None] * _mlp(m[rows], w, f"{prefix}experts.{e}.")
    return out


#: A decoder layer's keys and values of earlier positions in the plain-torch reference:
#: per-head ``k_nope`` and ``v`` and the shared rotary key, position first.
KV = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]  # noqa: F821


def _deepseek_block(x: "torch.Tensor", w: dict[str, "torch.Tensor"], layer: int, cfg: dict[str, Any],  # noqa: F821
                    past: KV | None = None) -> tuple["torch.Tensor", KV]:  # noqa: F821
    """Decoder layer ``layer`` (``num_hidden_layers``: the NextN layer's) over the positions
    after ``past`` (the layer's keys and values of the positions before), causal: MLA computed
    the plain way (keys and values per head from the normalised latent, one rotary key shared
    by every head), then the dense MLP or the MoE. Returns the output and the keys and values
    of every position so far."""
    import torch

    prefix, eps = f"model.layers.{layer}.", cfg["rms_norm_eps"]
    n, heads, rank = x.shape[0], cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    start = 0 if past is None else past[0].shape[0]
    a = _rms_norm(x, w[prefix + "input_layernorm.weight"], eps)
    if cfg["q_lora_rank"] is None:
        q = a @ w[prefix + "self_attn.q_proj.weight"].T
    else:
        q_latent = _rms_norm(a @ w[prefix + "self_attn.q_a_proj.weight"].T,
                             w[prefix + "self_attn.q_a_layernorm.weight"], eps)
        q = q_latent @ w[prefix + "self_attn.q_b_proj.weight"].T
    q = q.view(n, heads, nope + rope)
    latent = a @ w[prefix + "self_attn.kv_a_proj_with_mqa.weight"].T
    kv = _rms_norm(latent[:, :rank], w[prefix + "self_attn.kv_a_layernorm.weight"], eps)
    kv = (kv @ w[prefix + "self_attn.kv_b_proj.weight"].T).view(n, heads, nope + vd)
    present: KV = (kv[..., :nope], kv[..., nope:], _rope_interleaved(latent[:, rank:], cfg["rope_theta"], start))
    if past is not None:
        present = tuple(torch.cat([old, new]) for old, new in zip(past, present))  # type: ignore[assignment]
    k_nope, v, k_pe = present
    q_pe = _rope_interleaved(q[..., nope:], cfg["rope_theta"], start)
    scores = (torch.einsum("qhd,khd->hqk", q[..., :nope], k_nope)
              + torch.einsum("qhd,kd->hqk", q_pe, k_pe)) / (nope + rope) ** 0.5
    causal = torch.arange(start + n)[None, :] <= torch.arange(start, start + n)[:, None]
    attn = torch.einsum("hqk,khd->qhd", scores.masked_fill(~causal, float("-inf")).softmax(-1), v)
    x = x + attn.reshape(n, heads * vd) @ w[prefix + "self_attn.o_proj.weight"].T
    m = _rms_norm(x, w[prefix + "post_attention_layernorm.weight"], eps)
    moe = layer == cfg["num_hidden_layers"] or is_moe_layer(cfg, layer)
    return x + (deepseek_moe_reference(m, w, prefix + "mlp.", cfg) if moe else _mlp(m, w, prefix + "mlp.")), present


def deepseek_reference(cfg: dict[str, Any], w: dict[str, "torch.Tensor"], ids: list[int],  # noqa: F821
                       past: dict[int, KV] | None = None) -> tuple["torch.Tensor", "torch.Tensor"]:  # noqa: F821
    """The tiny DeepSeek target in plain torch (fp32): logits and final (normalised) hidden
    states of ``ids``, the hidden states SGLang hands the NextN draft. ``past``: every layer's
    keys and values of the positions before ``ids``, extended in place (greedy decoding one
    token at a time). A probe of the weights, not SGLang's numerics."""
    past = {} if past is None else past
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        x, past[i] = _deepseek_block(x, w, i, cfg, past.get(i))
    hidden = _rms_norm(x, w["model.norm.weight"], cfg["rms_norm_eps"])
    return hidden @ w["lm_head.weight"].T, hidden


def nextn_reference(cfg: dict[str, Any], w: dict[str, "torch.Tensor"], ids: list[int],  # noqa: F821
                    hidden: "torch.Tensor", past: KV | None = None  # noqa: F821
                    ) -> tuple["torch.Tensor", "torch.Tensor", KV]:  # noqa: F821
    """The NextN layer in plain torch with the target's embedding and lm_head (SGLang's draft
    worker shares them): position ``p`` reads token ``ids[p]`` and the hidden state
    ``hidden[p]`` (the target's one position earlier, or the draft's own output at a later draft
    step), after the positions of ``past``. Returns its logits, its output hidden states (after
    ``shared_head.norm``, what the next draft step reads) and its keys and values so far."""
    import torch

    p, eps = f"model.layers.{cfg['num_hidden_layers']}.", cfg["rms_norm_eps"]
    e = _rms_norm(w["model.embed_tokens.weight"][ids], w[p + "enorm.weight"], eps)
    x = torch.cat([e, _rms_norm(hidden, w[p + "hnorm.weight"], eps)], dim=-1) @ w[p + "eh_proj.weight"].T
    x, present = _deepseek_block(x, w, cfg["num_hidden_layers"], cfg, past)
    out = _rms_norm(x, w[p + "shared_head.norm.weight"], eps)
    return out @ w["lm_head.weight"].T, out, present


def deepseek_greedy_probe(directory: Path, prompts: int = 4, new_tokens: int = 48, steps: int = 3
                          ) -> dict[str, Any]:
    """Greedy-decode a few prompts with the plain-torch DeepSeek target (one token at a time,
    its keys and values kept), then score its NextN layer along the target's own continuation:
    under teacher forcing (position ``p`` reads token ``p + 1`` and the target's hidden state of
    ``p`` and should name token ``p + 2``: the first draft step), and as SGLang's chain (topk 1,
    ``steps`` draft steps, a later step reading the draft's own token and output hidden state)
    after every generated token: its accept length (accepted draft tokens + 1, greedy
    verification). Reports output variety, the first step's agreement, the mean accept length
    and how often each length occurred."""
    import torch

    cfg, w = load_fp32(directory)
    outputs: list[list[int]] = []
    agree = total = 0
    lengths: dict[int, int] = {}
    with torch.no_grad():
        for prompt in _probe_prompts(cfg["vocab_size"], prompts):
            ids, past = list(prompt), {}
            logits, _ = deepseek_reference(cfg, w, ids, past)
            for _ in range(new_tokens):
                ids.append(int(logits[-1].argmax()))
                logits, _ = deepseek_reference(cfg, w, ids[-1:], past)
            start = len(prompt)
            outputs.append(ids[start:])
            _, hidden = deepseek_reference(cfg, w, ids)
            draft_logits, draft_out, draft_kv = nextn_reference(cfg, w, ids[1:], hidden[:-1])
            guess = draft_logits.argmax(-1)  # guess[q]: token q + 2
            agree += int((guess[start - 2:-1] == torch.tensor(ids[start:])).sum())
            total += len(ids) - start
            for p in range(start, len(ids) - steps):  # ids[p]: the last verified token
                accepted, token, state = 0, int(guess[p - 1]), draft_out[p - 1:p]
                kv = tuple(t[:p] for t in draft_kv)
                while token == ids[p + 1 + accepted]:
                    accepted += 1
                    if accepted == steps:
                        break
                    step_logits, state, kv = nextn_reference(cfg, w, [token], state, kv)
                    token = int(step_logits[-1].argmax())
                lengths[accepted + 1] = lengths.get(accepted + 1, 0) + 1
    n = sum(lengths.values())
    return {"distinct_per_output": [len(set(o)) for o in outputs], "outputs": outputs,
            "nextn_agreement": agree / max(total, 1),
            "mean_accept_length": sum(k * v for k, v in lengths.items()) / max(n, 1),
            "accept_lengths": dict(sorted(lengths.items()))}


def mtp_greedy_probe(target: Path, mtp: Path, prompts: int = 4, new_tokens: int = 48) -> dict[str, Any]:
    """Greedy-decode a few prompts with the plain-torch MiMoV2 target, then score each MTP layer
    under teacher forcing along the target's own continuation: layer ``k`` at position ``p``
    reads token ``p + k + 1`` and the hidden state of ``p`` and should name token ``p + k + 2``
    (what multi-layer EAGLE's step ``k`` drafts). Reports output variety and per-layer agreement."""
    import torch

    tcfg, tw = load_fp32(target)
    dcfg, dw = load_fp32(mtp)
    distinct: list[int] = []
    outputs: list[list[int]] = []
    agree = [0] * dcfg["num_nextn_predict_layers"]
    total = [0] * dcfg["num_nextn_predict_layers"]
    with torch.no_grad():
        for ids, start in _greedy(mimov2_reference, tcfg, tw, prompts, new_tokens):
            outputs.append(ids[start:])
            distinct.append(len(set(ids[start:])))
            _, hidden = mimov2_reference(tcfg, tw, ids)
            for k in range(len(agree)):
                guess = mtp_reference(dcfg, dw, k, ids[k + 1:], hidden[: len(ids) - k - 1]).argmax(-1)
                # positions whose guessed token is a generated one
                lo = start - k - 2
                agree[k] += int((guess[lo:-1] == torch.tensor(ids[start:])).sum())
                total[k] += len(ids) - start
    return {"distinct_per_output": distinct, "outputs": outputs,
            "mtp_agreement": [a / max(t, 1) for a, t in zip(agree, total)]}


def _probe_prompts(vocab: int, prompts: int) -> list[list[int]]:
    """The greedy probes' prompts: ``prompts`` random prompts of 8, 25, 42, ... tokens (fixed seed)."""
    import torch

    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (8 + 17 * i,), generator=gen).tolist() for i in range(prompts)]


def _greedy(reference: Any, cfg: dict[str, Any], w: dict[str, "torch.Tensor"], prompts: int,  # noqa: F821
            new_tokens: int) -> list[tuple[list[int], int]]:
    """Greedy continuations of a plain-torch target (``reference``: ``llama_reference`` or
    ``mimov2_reference``): (prompt + output ids, prompt length) for :func:`_probe_prompts`."""
    import torch

    out = []
    with torch.no_grad():
        for ids in _probe_prompts(cfg["vocab_size"], prompts):
            start = len(ids)
            for _ in range(new_tokens):
                ids.append(int(reference(cfg, w, ids)[0][-1].argmax()))
            out.append((ids, start))
    return out


def eagle_greedy_probe(target: Path, eagle: Path, prompts: int = 4, new_tokens: int = 48) -> dict[str, Any]:
    """Greedy-decode a few prompts with the plain-torch Llama target, then score the EAGLE-1
    draft under teacher forcing along the target's own continuation, as SGLang's draft extend
    feeds it: position ``p`` reads token ``p + 1`` and the target's hidden state of ``p`` and
    should name token ``p + 2`` (the draft's first step). Reports output variety, that step's
    agreement, and how often the target's token is among the draft's top 4 (SGLang's auto
    tree takes 4 candidates a step)."""
    import torch

    tcfg, tw = load_fp32(target)
    dcfg, dw = load_fp32(eagle)
    runs = _greedy(llama_reference, tcfg, tw, prompts, new_tokens)
    agree = top4 = total = 0
    with torch.no_grad():
        for ids, start in runs:
            _, hidden = llama_reference(tcfg, tw, ids)
            logits, _ = eagle_reference(dcfg, dw, tw, ids[1:], hidden[:-1])
            want = torch.tensor(ids[start:])
            guess = logits[start - 2:-1]  # the guesses of the generated tokens
            agree += int((guess.argmax(-1) == want).sum())
            top4 += int((guess.topk(4, dim=-1).indices == want[:, None]).any(-1).sum())
            total += len(want)
    return {"distinct_per_output": [len(set(ids[start:])) for ids, start in runs],
            "outputs": [ids[start:] for ids, start in runs],
            "eagle_agreement": agree / max(total, 1), "eagle_top4": top4 / max(total, 1)}


def eagle_tree_probe(target: Path, eagle: Path, *, steps: int = 5, topk: int = 4, draft_tokens: int = 8,
                     prompts: int = 4, new_tokens: int = 48, every: int = 1) -> dict[str, Any]:
    """The accept length of SGLang's EAGLE tree with greedy verification, walked in plain torch
    along the target's greedy continuation (every ``every``-th position). The tree as SGLang
    0.5.12.post1 builds it: the draft's top ``topk`` tokens, then ``steps - 1`` times each of
    the ``topk`` kept paths grows its ``topk`` best children and the ``topk`` paths of highest
    probability product are kept; the ``draft_tokens - 1`` best of all those candidates are
    verified. A later step reads the draft's own output hidden state. Returns the mean accept
    length (accepted draft tokens + 1) and how often each length occurred."""
    import torch

    tcfg, tw = load_fp32(target)
    dcfg, dw = load_fp32(eagle)
    lengths: dict[int, int] = {}
    with torch.no_grad():
        for ids, start in _greedy(llama_reference, tcfg, tw, prompts, new_tokens):
            _, target_hidden = llama_reference(tcfg, tw, ids)
            for p in range(start - 1, len(ids) - steps - 1, every):  # ids[p]: the last verified token
                tokens, hidden = ids[1:p + 1], target_hidden[:p]
                paths: list[tuple[tuple[int, ...], list[torch.Tensor], float]] = [((), [], 1.0)]
                candidates: list[tuple[float, tuple[int, ...]]] = []
                for _ in range(steps):
                    grown = []
                    for path, path_hidden, score in paths:
                        logits, out = eagle_reference(dcfg, dw, tw, tokens + list(path),
                                                      torch.cat([hidden, *[h[None] for h in path_hidden]]))
                        probs, best = logits[-1].softmax(-1).topk(topk)
                        grown += [(score * float(q), path + (int(t),), path_hidden + [out[-1]])
                                  for q, t in zip(probs, best)]
                    candidates += [(score, path) for score, path, _ in grown]
                    paths = [(path, ph, score) for score, path, ph in sorted(grown, key=lambda g: -g[0])[:topk]]
                tree = {path for _, path in sorted(candidates, key=lambda c: -c[0])[:draft_tokens - 1]}
                accepted = 0
                while tuple(ids[p + 1:p + 2 + accepted]) in tree:
                    accepted += 1
                lengths[accepted + 1] = lengths.get(accepted + 1, 0) + 1
    n = sum(lengths.values())
    return {"mean_accept_length": sum(k * v for k, v in lengths.items()) / max(n, 1),
            "accept_lengths": dict(sorted(lengths.items()))}


# ----------------------------------------------------------------------------- for the harnesses


def build_tiny_models(out: Path) -> dict[str, Path]:
    """The offline tiny models (:func:`make_models`): ``target`` (with a tokenizer),
    ``draft`` (STANDALONE), ``eagle3``, ``eagle`` (EAGLE-1), for multi-layer EAGLE ``mimov2`` (a
    MiMoV2 target with a tokenizer) and ``mimov2-mtp`` (its MTP draft), and for DeepSeek MTP
    ``deepseek`` (an MLA target with its NextN layer and a tokenizer)."""
    make_models(out)
    return {"target": out / TARGET_DIRNAME, "draft": out / DRAFT_DIRNAME, "eagle3": out / EAGLE3_DIRNAME,
            "eagle": out / EAGLE_DIRNAME, "mimov2": out / MIMOV2_DIRNAME, "mimov2-mtp": out / MIMOV2_MTP_DIRNAME,
            "deepseek": out / DEEPSEEK_DIRNAME}


def model_config(model_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(model_dir) / "config.json").read_text())


def eos_token_ids(model_dir: str | Path) -> list[int]:
    """The EOS ids SGLang takes from a model's ``config.json`` (an id or a list)."""
    eos = model_config(model_dir).get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def model_configs(model: str, max_positions: int = 4096) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The benchmarks' models (dummy weights): ``tiny`` -- the tiny target, draft = target;
    ``8b`` -- an 8B-shaped Llama target and a 1-layer draft of the same width. (target config.json, draft config.json or None for draft = target); ``max_positions``:
    the context length the Engine may serve (prompt + new tokens)."""
    if model == "tiny":
        return llama_config(max_position_embeddings=max_positions), None
    if model == "8b":
        shape = dict(hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, head_dim=128,
                     vocab_size=32000, max_position_embeddings=max_positions, rope_theta=500000.0)
        return llama_config(num_layers=32, **shape), llama_config(num_layers=1, **shape)
    raise ValueError(f"unknown model {model!r}")


#: The benchmarks' models with this factory's seeded weights (the others: config.json only, dummy
#: weights): the DeepSeek-V3 target whose checkpoint holds its NextN layer.
SEEDED_BENCH_MODELS = ("deepseek",)


def write_model_dirs(model: str, root: Path, max_positions: int = 4096) -> tuple[str, str | None]:
    """The benchmarks' model directories under ``root``; returns (target, draft) paths.
    ``tiny`` and ``8b`` (:func:`model_configs`): config.json only, for dummy weights; ``deepseek``:
    :func:`make_deepseek_models` (seeded weights, NextN layer, tokenizer) with ``max_positions``
    as its context, and no draft directory (None): SGLang reads the NextN layer from the target's."""
    if model == "deepseek":
        return str(make_deepseek_models(root, max_position_embeddings=max_positions)), None
    tcfg, dcfg = model_configs(model, max_positions)
    tdir = root / model / "target"
    tdir.mkdir(parents=True, exist_ok=True)
    (tdir / "config.json").write_text(json.dumps(tcfg, indent=1) + "\n")
    if dcfg is None:
        return str(tdir), str(tdir)
    ddir = root / model / "draft"
    ddir.mkdir(parents=True, exist_ok=True)
    (ddir / "config.json").write_text(json.dumps(dcfg, indent=1) + "\n")
    return str(tdir), str(ddir)
