"""Back-port fa3-mla-device-metadata (#29343, #29589): FA3 with MLA without the host mirror.

SGLang's real ``FlashAttentionBackend`` built for an MLA model (DeepSeek V3/R1-shaped: one
latent KV head, a rope part and a ``v_head_dim`` part per query head), its real CUDA-graph
state and capture, and its real MLA branches of ``forward_decode`` / ``forward_extend``. Only
FA3's native ``flash_attn_with_kvcache`` (no CPU build) is stood in for by a reference paged
attention that reads what FA3 reads (per request the first ``cache_seqlens`` keys through the
page table, ``qv`` as FA3's MLA term) and records every launch's arguments. The Triton
kernels run in Triton's CPU interpreter (the fixture of ``test_fa3_device_page_table``).

For draft decode, target verify and draft extend, page sizes 1, 16 and 64, the attention
output with the metadata built from the device lengths alone must equal, bit for bit, the
output with the metadata SGLang builds from the host mirror, and every replayed launch must
see the tensors the capture recorded (a CUDA graph replays the captured launch: its page-table
width, hence FA3's split count, is fixed at capture). Eagerly, with ``num_splits`` 0 the launch
must get SGLang's exact table width (FA3 sizes its split-KV work from it).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sim_support import HostSyncProbe
from test_fa3_device_page_table import (  # noqa: F401  (fa: the fixture)
    DEVICE,
    DRAFT_TOKENS,
    MAX_BS,
    MODES,
    STEPS,
    _batch,
    _covered_equal,
    _eager_batch,
    _spec_info,
    fa,
    make_backend,
)

HEADS = 4  # query heads on this rank
V_DIM = 32  # kv_lora_rank: the latent part, also MLA's v_head_dim
ROPE_DIM = 16  # qk_rope_head_dim
PAGE_SIZES = [1, 16, 64]


@pytest.fixture(autouse=True)
def mla_default(monkeypatch) -> None:
    """Back-port 18 as it ships: on unless ``SGLANG_FUTUREMAP_FA3_MLA=0`` (so not from the shell)."""
    monkeypatch.delenv("SGLANG_FUTUREMAP_FA3_MLA", raising=False)


def test_mla_keeps_the_mirror_only_when_told(fa, monkeypatch):
    """``SGLANG_FUTUREMAP_FA3_MLA=0`` keeps MLA on the host mirror (back-port 8's behaviour);
    unset or any other value MLA builds on the device; MHA builds on the device either way."""
    for setting, on_device in ((None, True), ("1", True), ("yes", True), ("0", False), (" 0 ", False)):
        if setting is None:
            monkeypatch.delenv("SGLANG_FUTUREMAP_FA3_MLA", raising=False)
        else:
            monkeypatch.setenv("SGLANG_FUTUREMAP_FA3_MLA", setting)
        b = mla_backend(fa)
        assert b.builds_spec_metadata_on_device() is on_device, setting
        assert b.needs_cpu_seq_lens is (not on_device), setting
        assert make_backend(fa).needs_cpu_seq_lens is False  # MHA


def mla_backend(fa, **kw: Any) -> Any:
    from sglang.srt.configs.model_config import AttentionArch

    b = make_backend(fa, arch=AttentionArch.MLA, **kw)
    assert b.use_mla
    return b


# --------------------------------------------------------------------------- declarations


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_mla_drops_the_mirror_like_mha(fa, page_size):
    b = mla_backend(fa, page_size=page_size)
    assert b.builds_spec_metadata_on_device() is True
    assert b.needs_cpu_seq_lens is False
    assert b.reads_verify_tree_mask is False
    # The eager draft extend (no draft-extend CUDA graph on FA3) still wants exact lengths,
    # unless num_splits is pinned to 1.
    assert b.draft_extend_needs_cpu_seq_lens is True
    assert mla_backend(fa, page_size=page_size, deterministic=True)\
        .draft_extend_needs_cpu_seq_lens is False


def test_mla_outside_the_covered_configurations_keeps_the_mirror(fa):
    from sglang.srt import server_args as sa

    assert mla_backend(fa, topk=2).needs_cpu_seq_lens is True
    cp = mla_backend(fa)
    cp.attn_cp_size = 2  # context parallel
    assert cp.needs_cpu_seq_lens is True
    fa4 = mla_backend(fa)
    fa4.fa_impl_ver = 4
    assert fa4.needs_cpu_seq_lens is True
    sa.set_global_server_args_for_scheduler(SimpleNamespace(disable_cuda_graph=True))
    # Every forward eager and FA3's split heuristic free: keep the mirror ...
    assert mla_backend(fa).needs_cpu_seq_lens is True
    # ... unless num_splits is pinned to 1 (deterministic inference).
    assert mla_backend(fa, deterministic=True).needs_cpu_seq_lens is False


def test_deepseek_mtp_backends_decide_mirror_free(fa):
    """The target, the NextN draft's per-step backends and its draft-extend backend, all FA3
    with MLA (SGLang's choice on Hopper), under piecewise CUDA graph (its default there)."""
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    draft = object.__new__(fa.FlashAttentionMultiStepBackend)
    draft.attn_backends = [mla_backend(fa, step_id=i) for i in range(STEPS - 1)]
    assert draft.needs_cpu_seq_lens is False
    backends = (mla_backend(fa), draft, mla_backend(fa))
    default = SimpleNamespace(enable_two_batch_overlap=False, disable_piecewise_cuda_graph=False)
    assert decide_needs_cpu_seq_lens(default, backends) is False
    tbo = SimpleNamespace(enable_two_batch_overlap=True, disable_piecewise_cuda_graph=False)
    assert decide_needs_cpu_seq_lens(tbo, backends) is True


def test_deepseek_fa3_dispatch_reads_no_host_lengths_in_spec_v2(fa):
    """DeepSeek's FA3 dispatch picks MLA for verify and draft extend without host lengths."""
    from sglang.srt import server_args as sa
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        handle_attention_fa3,
    )
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import (
        AttnForwardMethod,
    )

    sa.set_global_server_args_for_scheduler(SimpleNamespace(enable_deterministic_inference=False))
    lens = torch.tensor([5, 9])
    probe = HostSyncProbe().install()
    try:
        for mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2, ForwardMode.DECODE):
            batch = SimpleNamespace(forward_mode=mode, seq_lens=lens, seq_lens_cpu=None,
                                    extend_prefix_lens_cpu=None, seq_lens_sum=None)
            with probe.armed(lens):
                assert handle_attention_fa3(SimpleNamespace(), batch) == AttnForwardMethod.MLA
            assert probe.take() == []
    finally:
        probe.uninstall()


# --------------------------------------------------------------------------- MLA forward


class ReferenceFA3:
    """Stands in for FA3's ``flash_attn_with_kvcache`` (native, no CPU build).

    Paged attention reading, for request ``b``, the first ``cache_seqlens[b]`` keys through
    ``page_table`` (FA3 reads no further), scores ``q . k + qv . v`` (FA3's MLA call: rope part
    in ``q``/``k_cache``, latent part in ``qv``/``v_cache``), bottom-right causal. Each call's
    arguments are recorded: the table's width is FA3's ``seqlen_k``, which sizes its split-KV
    work, so a launch is exact only with the same width (or ``num_splits`` 1).
    """

    def __init__(self) -> None:
        self.calls: list[SimpleNamespace] = []

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 qv: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
                 cache_seqlens: torch.Tensor | None = None,
                 cu_seqlens_q: torch.Tensor | None = None, max_seqlen_q: int | None = None,
                 softmax_scale: float | None = None, causal: bool = False, num_splits: int = 0,
                 return_softmax_lse: bool = False, **_unused: Any) -> torch.Tensor:
        assert qv is not None and not return_softmax_lse  # MLA, topk 1: no cascade
        self.calls.append(SimpleNamespace(
            page_table=page_table, cache_seqlens=cache_seqlens, cu_seqlens_q=cu_seqlens_q,
            lens=cache_seqlens.clone(), starts=cu_seqlens_q.clone(), table=page_table.clone(),
            max_seqlen_q=max_seqlen_q, num_splits=num_splits, causal=causal))
        page_size = k_cache.shape[1]
        keys = k_cache.reshape(-1, k_cache.shape[-1])
        values = v_cache.reshape(-1, v_cache.shape[-1])
        out = torch.zeros(q.shape[0], q.shape[1], values.shape[-1], dtype=q.dtype)
        starts = cu_seqlens_q.tolist()
        for b, length in enumerate(cache_seqlens.tolist()):
            q0, q1 = starts[b], starts[b + 1]
            if q1 == q0:
                continue
            cols = torch.arange(length)
            tokens = page_table[b, cols // page_size].long() * page_size + cols % page_size
            k, v = keys[tokens], values[tokens]
            scores = (torch.einsum("qhd,kd->qhk", q[q0:q1], k)
                      + torch.einsum("qhd,kd->qhk", qv[q0:q1], v)) * softmax_scale
            if causal:
                last = length - (q1 - q0) + torch.arange(q1 - q0)
                scores = scores.masked_fill((cols[None, :] > last[:, None])[:, None, :],
                                            float("-inf"))
            out[q0:q1] = torch.einsum("qhk,kd->qhd", scores.softmax(-1), v)
        return out


@pytest.fixture
def reference_fa3(fa, monkeypatch) -> ReferenceFA3:
    kernel = ReferenceFA3()
    monkeypatch.setattr(fa, "flash_attn_with_kvcache", kernel)
    return kernel


def _mla_inputs(b: Any, seed: int) -> tuple[SimpleNamespace, SimpleNamespace, torch.Tensor]:
    """The MLA KV cache (latent + rope, one head) over every token ``req_to_token`` names, a
    RadixAttention-shaped layer, and a query source."""
    from sglang.srt.layers.radix_attention import AttentionType

    gen = torch.Generator().manual_seed(seed)
    tokens = -(-(int(b.req_to_token.max()) + 1) // 64) * 64  # whole pages at every page size
    kv = torch.randn(tokens, 1, V_DIM + ROPE_DIM, generator=gen)
    layer = SimpleNamespace(
        layer_id=0, tp_q_head_num=HEADS, tp_k_head_num=1, tp_v_head_num=1,
        head_dim=V_DIM + ROPE_DIM, v_head_dim=V_DIM, scaling=(V_DIM + ROPE_DIM) ** -0.5,
        logit_cap=0.0, sliding_window_size=None, is_cross_attention=False,
        attn_type=AttentionType.DECODER, k_scale=None, v_scale=None)
    pool = SimpleNamespace(get_key_buffer=lambda layer_id: kv)
    q = torch.randn(MAX_BS * (STEPS + 1) * DRAFT_TOKENS, HEADS * (V_DIM + ROPE_DIM),
                    generator=gen)
    return layer, pool, q


def _forward(b: Any, mode: str, forward_mode: Any, spec_info: Any, layer: SimpleNamespace,
             pool: SimpleNamespace, q: torch.Tensor) -> torch.Tensor:
    """One MLA layer through SGLang's forward, as the model calls it (k/v already cached)."""
    metadata = b.forward_metadata
    num_q = int(metadata.cu_seqlens_q[-1])
    batch = SimpleNamespace(forward_mode=forward_mode, spec_info=spec_info,
                            token_to_kv_pool=pool, batch_size=metadata.cu_seqlens_q.numel() - 1,
                            attn_attend_prefix_cache=None)
    if mode == "draft_decode":
        return b.forward_decode(q[:num_q], None, None, layer, batch, save_kv_cache=False)
    return b.forward_extend(q[:num_q], None, None, layer, batch, save_kv_cache=False)


def _same_tensors(a: SimpleNamespace, b: SimpleNamespace) -> None:
    """Two launches see the same tensors (storage, shape, strides)."""
    for name in ("page_table", "cache_seqlens", "cu_seqlens_q"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x.data_ptr(), x.shape, x.stride()) == (y.data_ptr(), y.shape, y.stride()), name


def _same_scalars(a: SimpleNamespace, b: SimpleNamespace) -> None:
    assert (a.max_seqlen_q, a.num_splits, a.causal) == (b.max_seqlen_q, b.num_splits, b.causal)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("mode", list(MODES))
def test_graph_replay_from_device_lengths_gives_stock_attention(fa, reference_fa3, mode,
                                                                 page_size):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    name, delta, _ = MODES[mode]
    forward_mode = getattr(ForwardMode, name)
    bs = 6
    b = mla_backend(fa, page_size=page_size)
    layer, pool, q = _mla_inputs(b, seed=page_size)
    b.init_cuda_graph_state(MAX_BS, MAX_BS * (STEPS + 1))
    per_req = {"draft_decode": 1, "target_verify": DRAFT_TOKENS, "draft_extend": STEPS + 1}[mode]
    b.init_forward_metadata_capture_cuda_graph(
        bs, bs * per_req, torch.zeros(bs, dtype=torch.int64, device=DEVICE),
        torch.ones(bs, dtype=torch.int64, device=DEVICE), None, forward_mode,
        _spec_info(mode, bs, 0))
    captured_metadata = b.forward_metadata
    _forward(b, mode, forward_mode, _spec_info(mode, bs, 0), layer, pool, q)
    (captured,) = reference_fa3.calls
    probe = HostSyncProbe().install()
    try:
        for it in range(2):  # consecutive replays reuse the buffers
            spec_info = _spec_info(mode, bs, it + 1)
            slots, lens = _batch(bs, seed=100 * it + page_size, delta=max(delta, STEPS + 2))
            pool_idx = torch.cat([slots, torch.zeros(MAX_BS - bs, dtype=torch.int64,
                                                     device=DEVICE)])
            seq_lens = torch.cat([lens, torch.ones(MAX_BS - bs, dtype=torch.int64,
                                                   device=DEVICE)])
            b.init_forward_metadata_replay_cuda_graph(
                bs, pool_idx, seq_lens, int(lens.sum()), None, forward_mode, spec_info,
                seq_lens.cpu())
            stock_out = _forward(b, mode, forward_mode, spec_info, layer, pool, q)
            captured_metadata.page_table.fill_(-5)  # the device path must write its own
            with probe.armed(seq_lens, lens):
                b.init_forward_metadata_replay_cuda_graph(
                    bs, pool_idx, seq_lens, None, None, forward_mode, spec_info, None)
            assert [h for h in probe.take() if h[1]] == []  # no host read of the lengths
            assert b.forward_metadata is captured_metadata
            got_out = _forward(b, mode, forward_mode, spec_info, layer, pool, q)
            stock, got = reference_fa3.calls[-2:]
            assert torch.equal(got_out, stock_out)
            _same_tensors(got, captured)
            _same_tensors(stock, captured)
            _same_scalars(got, stock)
            if mode != "draft_extend":  # SGLang's replay sets the draft extend's query max
                _same_scalars(got, captured)
            assert torch.equal(got.lens, stock.lens)
            assert got.lens.tolist() == (lens + delta).tolist()
            assert torch.equal(got.starts, stock.starts)
            assert _covered_equal(got.table, stock.table, got.lens, page_size)
    finally:
        probe.uninstall()


@pytest.mark.parametrize("deterministic", [False, True], ids=["splits_auto", "splits_1"])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("mode", list(MODES))
def test_eager_mla_forward_without_the_mirror(fa, reference_fa3, mode, page_size,
                                               deterministic):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    name, delta, _ = MODES[mode]
    forward_mode = getattr(ForwardMode, name)
    b = mla_backend(fa, page_size=page_size, deterministic=deterministic)
    layer, pool, q = _mla_inputs(b, seed=3 + page_size)
    bs = 5
    spec_info = _spec_info(mode, bs, 2)
    slots, lens = _batch(bs, seed=page_size + 1, delta=max(delta, STEPS + 2))
    b.init_forward_metadata(_eager_batch(b, mode, slots, lens, forward_mode, spec_info, True))
    stock_out = _forward(b, mode, forward_mode, spec_info, layer, pool, q)
    fb = _eager_batch(b, mode, slots, lens, forward_mode, spec_info, False)
    probe = HostSyncProbe().install()
    try:
        with probe.armed(lens):
            b.init_forward_metadata(fb)
        seq_lens_reads = [h for h in probe.take() if h[1]]
    finally:
        probe.uninstall()
    got_out = _forward(b, mode, forward_mode, spec_info, layer, pool, q)
    stock, got = reference_fa3.calls
    assert torch.equal(got_out, stock_out)
    assert torch.equal(got.lens, stock.lens) and torch.equal(got.starts, stock.starts)
    assert (got.max_seqlen_q, got.num_splits) == (stock.max_seqlen_q, stock.num_splits)
    assert _covered_equal(got.table, stock.table, got.lens, page_size)
    if deterministic:
        # num_splits pinned to 1: the static width is exact and nothing is read on the host.
        assert got.num_splits == 1 and seq_lens_reads == []
        assert got.page_table.shape[1] >= stock.page_table.shape[1]
    else:
        # FA3 sizes its split-KV work from the width: the exact one, read on this eager path.
        assert ("Tensor.cpu", True) in seq_lens_reads
        assert got.page_table.shape == stock.page_table.shape
