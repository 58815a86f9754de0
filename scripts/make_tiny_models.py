#!/usr/bin/env python3
"""Write a tiny Llama target, a correlated STANDALONE draft and an EAGLE3 draft as real
checkpoints, plus an offline word-level tokenizer for the target.

Offline model factory for the GPU tests. Every model directory holds ``config.json`` +
``model.safetensors`` generated from a fixed seed, so every machine builds bit-identical
weights without any download:

* ``target/``: ``LlamaForCausalLM`` with ``tokenizer.json`` (token ``i`` is the word
  ``w<i>``, ids 0..2 are pad/bos/eos), so text prompts, stop strings and the HTTP server work;
* ``draft/``: ``LlamaForCausalLM``, the STANDALONE draft (see below);
* ``eagle3/``: ``LlamaForCausalLMEagle3``, one decoder layer over the target's three captured
  hidden states (random: its drafts are mostly rejected, which exercises the reject paths;
  the STANDALONE draft covers partial acceptance).

Why not ``load_format="dummy"``: SGLang's dummy weights (uniform +-1e-3) make greedy
decoding collapse into a period-2 cycle, which is a weak oracle for token-exact
comparisons. Here the linear layers use a normal init large enough (std ~0.05) for
attention and MLP to move the residual stream, so the greedy continuation depends on
the whole prompt and wanders over the vocabulary.

The draft reuses the target's embedding, final norm, lm_head and first layers, and the
target's later layers are scaled down, so draft and target agree often but not always:
speculative decoding then sees both accepted and rejected draft tokens.

Usage::

    python3 scripts/make_tiny_models.py --out /tmp/models          # -> /tmp/models/{target,draft}
    python3 scripts/make_tiny_models.py --out /tmp/models --check  # + verify names/shapes (+ HF greedy probe)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TARGET_DIRNAME = "target"
DRAFT_DIRNAME = "draft"
EAGLE3_DIRNAME = "eagle3"
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


def shapes_for(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    if config["architectures"] == ["LlamaForCausalLMEagle3"]:
        return expected_eagle3_shapes(config)
    return expected_shapes(config)


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
    **shape: Any,
) -> tuple[Path, Path]:
    """Write ``out/target`` (with its tokenizer), ``out/draft`` and ``out/eagle3``;
    returns the target and STANDALONE draft paths."""
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
    return tdir, ddir


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


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="output directory; gets target/, draft/ and eagle3/")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--target-layers", type=int, default=4)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--intermediate-size", type=int, default=1024)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--max-position-embeddings", type=int, default=4096)
    p.add_argument("--linear-std", type=float, default=0.05)
    p.add_argument("--embed-std", type=float, default=1.0)
    p.add_argument("--lm-head-std", type=float, default=0.2)
    p.add_argument("--late-layer-scale", type=float, default=0.5, help="std multiplier for target layers the draft lacks")
    p.add_argument("--check", action="store_true", help="verify tensor names/shapes; with transformers installed also greedy-probe on CPU")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tdir, ddir = make_models(
        args.out,
        seed=args.seed,
        target_layers=args.target_layers,
        draft_layers=args.draft_layers,
        linear_std=args.linear_std,
        embed_std=args.embed_std,
        lm_head_std=args.lm_head_std,
        late_layer_scale=args.late_layer_scale,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
    )
    print(f"wrote {tdir}, {ddir} and {args.out / EAGLE3_DIRNAME}")
    if not args.check:
        return 0
    problems = check_model_dir(tdir) + check_model_dir(ddir) + check_model_dir(args.out / EAGLE3_DIRNAME)
    for p in problems:
        print("PROBLEM:", p)
    if problems:
        return 1
    print("tensor names/shapes/dtypes OK")
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers not installed: skipping the greedy probe")
        return 0
    report = hf_greedy_probe(tdir, ddir)
    print(f"HF greedy probe: distinct tokens per output {report['distinct_per_output']}, "
          f"draft/target argmax agreement {report['draft_agreement']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
