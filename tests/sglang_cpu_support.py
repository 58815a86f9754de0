"""SGLang 0.5.12.post1's own model code on a CPU host, for the tiny-model tests
(``test_tiny_models_mtp.py``, ``test_tiny_models_eagle.py``, ``test_tiny_models_mla.py``): its ``ServerArgs`` of an e2e
launch, its loader (``get_model``) on a single-rank gloo group, and its modules' forward pass
with a plain-torch stand-in for the GPU attention kernels (the one piece that cannot run here).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest
import torch

#: SGLang fuses these checkpoint tensors into one parameter, in this order.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def server_args(kwargs: dict[str, Any], device: str = "cpu") -> Any:
    """SGLang's ``ServerArgs`` of Engine kwargs, on the CPU device unless told (its post-init
    writes a few ``SGLANG_*`` variables into the environment: put back). ``cuda``: the choices
    SGLang makes for a GPU, as far as they need no CUDA call (the attention backend, PCG)."""
    from sglang.srt.server_args import ServerArgs

    saved = dict(os.environ)
    try:
        return ServerArgs(**kwargs, device=device)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def sglang_loader(args: Any, store: Path) -> Iterator[Callable[..., torch.nn.Module]]:
    """SGLang's model-parallel state on a single-rank gloo group (``store``: its rendezvous
    file) with ``args`` as the global server args; yields ``load(path, draft=False,
    draft_step=None)``, SGLang's loader for a model directory (a draft: ``is_draft_model``;
    ``draft_step``: multi-layer EAGLE's step filter). Everything is put back on exit."""
    import sglang.srt.layers.dp_attention as dp_attention
    import sglang.srt.layers.rotary_embedding.base as rope_base
    import sglang.srt.server_args as sa_mod
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import (destroy_distributed_environment, destroy_model_parallel,
                                        init_distributed_environment, initialize_model_parallel)
    from sglang.srt.model_loader import get_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sa_mod, "_global_server_args", args)
        # RotaryEmbedding wants a native kernel on a host that is neither CUDA nor SGLang's CPU
        # engine; the CPU engine's choice is the plain-torch forward.
        mp.setattr(rope_base, "_is_cpu", True)
        # initialize_dp_attention sets these; put them back afterwards
        for name in ("_ATTN_DP_RANK", "_ATTN_DP_SIZE", "_LOCAL_ATTN_DP_SIZE", "_LOCAL_ATTN_DP_RANK",
                     "_ENABLE_DP_ATTENTION_FLAG"):
            mp.setattr(dp_attention, name, getattr(dp_attention, name))
        for name in ("_hidden_size", "_dtype", "_device"):
            mp.setattr(dp_attention._DpGatheredBufferWrapper, name,
                       getattr(dp_attention._DpGatheredBufferWrapper, name, None), raising=False)
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{store}")
        try:
            initialize_model_parallel(1)
            dp_attention.initialize_dp_attention(args, ModelConfig.from_server_args(args))

            def load(path: Path, draft: bool = False, draft_step: int | None = None) -> torch.nn.Module:
                config = ModelConfig.from_server_args(args, model_path=str(path),
                                                      is_draft_model=draft or draft_step is not None)
                return get_model(model_config=config, device_config=DeviceConfig("cpu"),
                                 load_config=LoadConfig(load_format=args.load_format, draft_model_idx=draft_step))

            yield load
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


def expected_params(ckpt: dict[str, torch.Tensor], source_of: dict[str, str]
                    ) -> dict[str, tuple[torch.Tensor, list[str]]]:
    """Parameter -> (the value the checkpoint gives it, the checkpoint tensors it comes from).
    ``source_of`` maps a parameter name to its unfused checkpoint name."""
    out = {}
    for param, src in source_of.items():
        fused = next((f for f in FUSED if f".{f}." in src), None)
        names = [src.replace(f".{fused}.", f".{part}.") for part in FUSED[fused]] if fused else [src]
        out[param] = (torch.cat([ckpt[n] for n in names]), names)
    return out


def assert_loaded(model: torch.nn.Module, expected: dict[str, tuple[torch.Tensor, list[str]]],
                  unloaded: frozenset[str] = frozenset()) -> set[str]:
    """Every parameter of ``model`` but ``unloaded`` holds its checkpoint value (bf16); returns
    the checkpoint tensors used."""
    params = dict(model.named_parameters())
    assert set(params) == set(expected) | unloaded
    for name, (value, _) in expected.items():
        assert params[name].dtype == torch.bfloat16 and torch.equal(params[name].detach(), value), name
    # the only buffers are the rotary tables SGLang computes itself
    assert all(n.endswith("rotary_emb.cos_sin_cache") for n, _ in model.named_buffers())
    return {n for _, names in expected.values() for n in names}


class StandInAttention:
    """Causal attention over one sequence in plain torch, in place of the GPU attention backends
    (sliding-window layers see their last ``sliding_window_size`` keys, as SGLang's Triton
    backend does). Everything around it is SGLang's own module code. ``layers`` records the
    attention layers it served (DeepSeek's MLA: ``attn_mha`` for the MHA prefill, ``attn_mqa``
    with the 576-wide latent for the absorbed path)."""

    def __init__(self) -> None:
        self.layers: list[Any] = []

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, forward_batch: Any,
                save_kv_cache: bool = True, sinks: torch.Tensor | None = None) -> torch.Tensor:
        assert sinks is None  # the tiny models have no attention sinks
        self.layers.append(layer)
        n, hq, hk = q.shape[0], layer.tp_q_head_num, layer.tp_k_head_num
        q = q.view(n, hq, -1).float()
        k = k.view(n, hk, -1).float().repeat_interleave(hq // hk, dim=1)
        v = v.view(n, hk, -1).float().repeat_interleave(hq // hk, dim=1)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        allowed = j <= i
        if layer.sliding_window_size and layer.sliding_window_size > 0:
            allowed &= i - j < layer.sliding_window_size
        scores = torch.einsum("qhd,khd->hqk", q, k) * layer.scaling
        out = torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)
        return out.reshape(n, -1).to(torch.bfloat16)


class StandInKVPool:
    """The KV pool of one prefilled sequence: keeps what a layer saves itself (DeepSeek's MHA
    prefill writes its latent, ``[normalised kv_a | roped k_pe]``, before attending)."""

    def __init__(self) -> None:
        self.saved: dict[int, torch.Tensor] = {}

    def set_kv_buffer(self, layer: Any, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor | None) -> None:
        self.saved[layer.layer_id] = cache_k.detach().clone()


def sglang_logits(model: torch.nn.Module, ids: list[int], target_hidden: torch.Tensor | None = None,
                  attn: StandInAttention | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and final hidden states of SGLang's model over one prefilled sequence, no prefix
    cached (a draft: with the target's hidden states, ``spec_info.hidden_states``); ``attn``:
    the stand-in attention to use (to see which layers it served)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    n = len(ids)
    batch = SimpleNamespace(input_ids=torch.tensor(ids), forward_mode=ForwardMode.EXTEND,
                            attn_backend=attn or StandInAttention(), can_run_tbo=False,
                            return_hidden_states_before_norm=False, attn_cp_metadata=None,
                            # what DeepSeek's MLA reads of a prefill batch
                            extend_prefix_lens_cpu=[0], seq_lens_cpu=torch.tensor([n]), mha_one_shot=False,
                            token_to_kv_pool=StandInKVPool(), out_cache_loc=torch.arange(n))
    if target_hidden is not None:
        batch.spec_info = SimpleNamespace(hidden_states=target_hidden)
    with torch.no_grad():
        out = model.model(batch.input_ids, torch.arange(len(ids)), batch)
    hidden = out[0] if isinstance(out, tuple) else out  # MiMoV2 also returns its residual
    return hidden.float() @ model.lm_head.weight.float().T, hidden


def assert_close(sglang: torch.Tensor, reference: torch.Tensor) -> None:
    """SGLang's bf16 logits against the fp32 reference: close, and mostly the same argmax."""
    assert (sglang - reference).abs().max() <= 0.05 * reference.abs().max()
    assert (sglang.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
