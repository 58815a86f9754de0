"""Back-port fa3-device-page-table (#28106, #29343, #29589): FA3 without the host mirror.

Everything runs SGLang's real ``FlashAttentionBackend`` (built by its own ``__init__`` on CPU
tensors) and its real CUDA-graph state (``init_cuda_graph_state`` and the capture for each
batch size). The Triton kernels, SGLang's ``normal_decode_set_metadata`` ones included, run in
Triton's CPU interpreter. For draft decode, target verify and draft extend, page sizes 1
and 16, the metadata built from the device lengths alone must equal what SGLang builds with
the host mirror wherever FA3 reads it: ``cache_seqlens``, ``cu_seqlens_k``, the query
lengths and, per request, every page-table column its length covers. Eagerly, with
``num_splits`` 0 the page table must be SGLang's exactly (FA3's split heuristic reads its
width) and with ``num_splits`` 1 it may be wider but must not read ``seq_lens`` on the host.

On a machine with CUDA (and FA3 installed) the same tests run on the GPU with the compiled
kernels: ``python -m pytest tests/test_fa3_device_page_table.py`` on the GPU box.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport
from sim_support import HostSyncProbe

CTX = 1100  # page size 1: three kernel chunks per row
POOL = 9
MAX_BS = 8
STEPS = 3
DRAFT_TOKENS = 4
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def fa(clean_state, monkeypatch):
    """``flashattention_backend`` with the series active and its kernels interpreted."""
    import triton
    from sglang.srt import server_args as sa
    from sglang.srt.layers.attention import flashattention_backend as fa

    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(SimpleNamespace(disable_cuda_graph=False))
    activate_backport()
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        for name in ("_fused_metadata_kernel_ps1_no_swa", "_fused_metadata_kernel_general"):
            monkeypatch.setattr(fa, name, triton.jit(getattr(fa, name).fn))
    yield fa
    sa._global_server_args = previous


def make_backend(fa, *, page_size=1, step_id=0, topk=1, deterministic=False,
                 disable_cuda_graph=False, **model):
    from sglang.srt.configs.model_config import AttentionArch

    gen = torch.Generator().manual_seed(7 + page_size)
    width = CTX + 16
    req_to_token = torch.randperm(POOL * width * 4, generator=gen)[: POOL * width]
    req_to_token = req_to_token.to(torch.int32).reshape(POOL, width).to(DEVICE)
    model_config = SimpleNamespace(
        is_encoder_decoder=model.get("is_encoder_decoder", False), context_len=CTX,
        attention_arch=model.get("arch", AttentionArch.MHA),
        is_local_attention_model=False, head_dim=64,
        hf_text_config=SimpleNamespace(num_attention_heads=8),
        get_num_kv_heads=lambda tp: 4)
    server_args = SimpleNamespace(
        kv_cache_dtype="auto", speculative_eagle_topk=topk,
        speculative_num_draft_tokens=DRAFT_TOKENS,
        enable_deterministic_inference=deterministic, disable_cuda_graph=disable_cuda_graph,
        is_embedding=False, chunked_prefill_size=512, disable_radix_cache=False,
        enable_dp_attention=False)
    runner = SimpleNamespace(
        sliding_window_size=model.get("sliding_window_size"), model_config=model_config,
        device=DEVICE, req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        kv_cache_dtype=torch.bfloat16, server_args=server_args, page_size=page_size,
        attn_cp_size=1, token_to_kv_pool=None, tp_size=1, attention_chunk_size=None)
    try:
        return fa.FlashAttentionBackend(
            runner, speculative_step_id=step_id, topk=topk, speculative_num_steps=STEPS,
            fa_impl_ver=model.get("fa_impl_ver", 3))
    except ImportError as exc:  # a GPU machine without FA3 (sgl_kernel.flash_ops)
        pytest.skip(f"FA3 is not installed here: {exc}")


def _batch(bs, seed, delta):
    rng = random.Random(seed)
    slots = torch.tensor(rng.sample(range(POOL), bs), dtype=torch.int64, device=DEVICE)
    lens = torch.tensor([rng.randrange(1, CTX - delta) for _ in range(bs)], dtype=torch.int64,
                        device=DEVICE)
    return slots, lens


MODES = {
    # mode: (ForwardMode name, seq_len delta FA3 adds, metadata dict name)
    "draft_decode": ("DECODE", 1, "decode_cuda_graph_metadata"),
    "target_verify": ("TARGET_VERIFY", DRAFT_TOKENS, "target_verify_metadata"),
    "draft_extend": ("DRAFT_EXTEND_V2", 0, "draft_extend_metadata"),
}


def _spec_info(mode, bs, seed):
    if mode != "draft_extend":
        return SimpleNamespace()
    rng = random.Random(seed)
    lens = [rng.randrange(1, STEPS + 2) for _ in range(bs)]
    return SimpleNamespace(num_tokens_per_req=STEPS + 1, extend_seq_lens_cpu=lens,
                           extend_seq_lens_tensor=torch.tensor(lens, dtype=torch.int32,
                                                               device=DEVICE))


def _snapshot(metadata):
    return {
        "cache_seqlens": metadata.cache_seqlens_int32.clone(),
        "cu_seqlens_k": metadata.cu_seqlens_k.clone(),
        "cu_seqlens_q": metadata.cu_seqlens_q.clone(),
        "max_seq_len_q": metadata.max_seq_len_q,
        "page_table": metadata.page_table.clone(),
    }


def _covered_equal(a, b, cache_seqlens, page_size):
    """Page tables agree on every column a request's length covers."""
    for row, length in enumerate(cache_seqlens.tolist()):
        pages = -(-length // page_size)
        if not torch.equal(a[row, :pages], b[row, :pages]):
            return False
    return True


# --------------------------------------------------------------------------- the kernel


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("delta", [0, 1, DRAFT_TOKENS])
def test_kernel_fills_exactly_the_covered_pages(fa, page_size, delta):
    import triton

    gen = torch.Generator().manual_seed(page_size * 10 + delta)
    req_to_token = torch.randint(0, 1 << 20, (POOL, CTX + 16), generator=gen,
                                 dtype=torch.int32).to(DEVICE)
    slots, lens = _batch(6, seed=delta + page_size, delta=delta)
    width = -(-(CTX + 16) // page_size)
    page_table = torch.full((6, width), -7, dtype=torch.int32, device=DEVICE)
    cache_seqlens = torch.zeros(6, dtype=torch.int32, device=DEVICE)
    cu_seqlens_k = torch.full((7,), -1, dtype=torch.int32, device=DEVICE)
    fa.fill_page_table_from_lens(cache_seqlens, cu_seqlens_k, page_table, req_to_token, slots,
                                 lens, delta, page_size,
                                 triton.jit(fa._page_table_from_lens_kernel))
    assert cache_seqlens.tolist() == (lens + delta).tolist()
    assert cu_seqlens_k.tolist() == [0] + torch.cumsum(lens + delta, 0).tolist()
    cols = torch.arange(width, device=DEVICE)
    for row in range(6):
        pages = -(-int(lens[row] + delta) // page_size)
        want = req_to_token[slots[row], cols[:pages] * page_size] // page_size
        assert torch.equal(page_table[row, :pages], want)
        assert (page_table[row, pages:] == -7).all()  # not written: FA3 never reads them


def test_kernel_with_an_empty_batch_launches_nothing(fa):
    def never(*_a, **_k):
        raise AssertionError("launched")

    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    fa.fill_page_table_from_lens(empty, empty, torch.empty((0, 4), dtype=torch.int32),
                                 torch.zeros((2, 4), dtype=torch.int32), empty, empty, 0, 1,
                                 SimpleNamespace(__getitem__=never))


# --------------------------------------------------------------------------- declarations


def test_declarations(fa):
    assert make_backend(fa).needs_cpu_seq_lens is False
    assert make_backend(fa).reads_verify_tree_mask is False
    # No draft-extend CUDA graph for FA3 in 0.5.12.x: its eager metadata wants the exact
    # host lengths (the split heuristic) unless num_splits is pinned to 1.
    assert make_backend(fa).draft_extend_needs_cpu_seq_lens is True
    assert make_backend(fa, deterministic=True).draft_extend_needs_cpu_seq_lens is False
    assert make_backend(fa, page_size=16).needs_cpu_seq_lens is False
    topk2 = make_backend(fa, topk=2)
    assert topk2.needs_cpu_seq_lens is True and topk2.reads_verify_tree_mask is True
    # MLA: back-port 18 (tests/test_fa3_mla_device_metadata.py).
    assert make_backend(fa, sliding_window_size=128).needs_cpu_seq_lens is True
    assert make_backend(fa, is_encoder_decoder=True).needs_cpu_seq_lens is True
    multi = object.__new__(fa.FlashAttentionMultiStepBackend)
    multi.attn_backends = [make_backend(fa, step_id=i) for i in range(STEPS - 1)]
    assert multi.needs_cpu_seq_lens is False
    multi.attn_backends.append(topk2)
    assert multi.needs_cpu_seq_lens is True


def test_without_cuda_graph_the_mirror_stays_unless_splits_are_pinned(fa):
    from sglang.srt import server_args as sa

    sa.set_global_server_args_for_scheduler(SimpleNamespace(disable_cuda_graph=True))
    # Every forward eager, FA3's split heuristic reads the exact width: keep the mirror.
    assert make_backend(fa).needs_cpu_seq_lens is True
    # num_splits pinned to 1 (deterministic inference): the width does not matter.
    assert make_backend(fa, deterministic=True).needs_cpu_seq_lens is False


def test_default_configuration_decides_mirror_free(fa):
    """FA3 with piecewise CUDA graph (SGLang's choice on Hopper) drops the mirror."""
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    multi = object.__new__(fa.FlashAttentionMultiStepBackend)
    multi.attn_backends = [make_backend(fa, step_id=i) for i in range(STEPS - 1)]
    backends = (make_backend(fa), multi, make_backend(fa))
    default = SimpleNamespace(enable_two_batch_overlap=False, disable_piecewise_cuda_graph=False)
    assert decide_needs_cpu_seq_lens(default, backends) is False
    tbo = SimpleNamespace(enable_two_batch_overlap=True, disable_piecewise_cuda_graph=False)
    assert decide_needs_cpu_seq_lens(tbo, backends) is True


# --------------------------------------------------------------------------- graph replay


def _captured(fa, mode, page_size, bs):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    name, delta, _ = MODES[mode]
    b = make_backend(fa, page_size=page_size)
    b.init_cuda_graph_state(MAX_BS, MAX_BS * (STEPS + 1))
    num_tokens = bs * {"draft_decode": 1, "target_verify": DRAFT_TOKENS,
                       "draft_extend": STEPS + 1}[mode]
    b.init_forward_metadata_capture_cuda_graph(
        bs, num_tokens, torch.zeros(bs, dtype=torch.int64, device=DEVICE),
        torch.ones(bs, dtype=torch.int64, device=DEVICE), None, getattr(ForwardMode, name),
        _spec_info(mode, bs, 0))
    return b, getattr(ForwardMode, name), delta


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("mode", list(MODES))
def test_replay_from_device_lengths_equals_replay_with_the_mirror(fa, mode, page_size):
    bs = 6
    b, forward_mode, delta = _captured(fa, mode, page_size, bs)
    spec_info = _spec_info(mode, bs, 1)
    for it in range(3):  # consecutive replays reuse the buffers
        slots, lens = _batch(bs, seed=100 * it + page_size, delta=max(delta, 1))
        # Buffers of the graph's padded size, as the graph runners pass them.
        pool_idx = torch.cat([slots, torch.zeros(MAX_BS - bs, dtype=torch.int64, device=DEVICE)])
        seq_lens = torch.cat([lens, torch.ones(MAX_BS - bs, dtype=torch.int64, device=DEVICE)])
        b.init_forward_metadata_replay_cuda_graph(
            bs, pool_idx, seq_lens, int(lens.sum()), None, forward_mode, spec_info,
            seq_lens.cpu())
        stock = _snapshot(b.forward_metadata)
        b.forward_metadata.page_table.fill_(-5)  # what the device path writes must be its own
        b.init_forward_metadata_replay_cuda_graph(
            bs, pool_idx, seq_lens, None, None, forward_mode, spec_info, None)
        got = _snapshot(b.forward_metadata)
        assert b.forward_metadata_spec_decode_expand is None
        assert torch.equal(got["cache_seqlens"], stock["cache_seqlens"])
        assert got["cache_seqlens"].tolist() == (lens + delta).tolist()
        assert torch.equal(got["cu_seqlens_k"], stock["cu_seqlens_k"])
        assert torch.equal(got["cu_seqlens_q"], stock["cu_seqlens_q"])
        assert got["max_seq_len_q"] == stock["max_seq_len_q"]
        assert _covered_equal(got["page_table"], stock["page_table"], got["cache_seqlens"],
                              page_size)


def test_replay_jits_the_kernel_once_per_backend(fa):
    b, forward_mode, _ = _captured(fa, "target_verify", 1, 2)
    slots, lens = _batch(2, seed=3, delta=DRAFT_TOKENS)
    for _ in range(2):
        b.init_forward_metadata_replay_cuda_graph(
            2, slots, lens, None, None, forward_mode, SimpleNamespace(), None)
        kernel = b.page_table_kernel
    assert b.page_table_kernel is kernel


def test_replay_of_another_batch_falls_back_to_the_lengths_on_the_host(fa):
    """Normal decode (no spec_info) never comes without a mirror; if it did, the lengths are
    copied and SGLang's own replay runs."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    b = make_backend(fa)
    b.init_cuda_graph_state(MAX_BS, MAX_BS)
    b._get_scheduler_metadata = None  # FA3's scheduler-metadata op is native
    b.init_forward_metadata_capture_cuda_graph(
        2, 2, torch.zeros(2, dtype=torch.int64, device=DEVICE),
        torch.ones(2, dtype=torch.int64, device=DEVICE), None, ForwardMode.DECODE, None)
    slots, lens = _batch(2, seed=5, delta=1)
    b.init_forward_metadata_replay_cuda_graph(2, slots, lens, None, None, ForwardMode.DECODE,
                                              None, None)
    assert b.forward_metadata.max_seq_len_k == int(lens.max())
    assert b.forward_metadata.cache_seqlens_int32.tolist() == lens.tolist()


# --------------------------------------------------------------------------- eager


def _eager_batch(b, mode, slots, lens, forward_mode, spec_info, mirror):
    extend = mode == "draft_extend"
    return SimpleNamespace(
        forward_mode=forward_mode, batch_size=len(lens), seq_lens=lens,
        seq_lens_cpu=lens.cpu() if mirror else None, req_pool_indices=slots,
        req_to_token_pool=SimpleNamespace(req_to_token=b.req_to_token), spec_info=spec_info,
        encoder_lens=None, out_cache_loc=None,
        extend_seq_lens=spec_info.extend_seq_lens_tensor if extend else None,
        extend_seq_lens_cpu=spec_info.extend_seq_lens_cpu if extend else None,
        # Without the mirror, back-port 4's draft extend has no host prefix lengths either.
        extend_prefix_lens_cpu=(lens - spec_info.extend_seq_lens_tensor).tolist()
        if extend and mirror else None)


@pytest.mark.parametrize("deterministic", [False, True], ids=["splits_auto", "splits_1"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("mode", list(MODES))
def test_eager_metadata_without_the_mirror(fa, mode, page_size, deterministic):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    name, delta, _ = MODES[mode]
    forward_mode = getattr(ForwardMode, name)
    b = make_backend(fa, page_size=page_size, deterministic=deterministic)
    assert b.num_splits == (1 if deterministic else 0)
    bs = 5
    spec_info = _spec_info(mode, bs, 2)
    slots, lens = _batch(bs, seed=page_size, delta=max(delta, STEPS + 2))
    b.init_forward_metadata(_eager_batch(b, mode, slots, lens, forward_mode, spec_info, True))
    stock = b.forward_metadata
    fb = _eager_batch(b, mode, slots, lens, forward_mode, spec_info, False)
    probe = HostSyncProbe().install()
    try:
        with probe.armed(lens):
            b.init_forward_metadata(fb)
        hits = probe.take()
    finally:
        probe.uninstall()
    got = b.forward_metadata
    # The stand-ins do not outlive the call.
    assert fb.seq_lens_cpu is None and fb.extend_prefix_lens_cpu is None
    assert torch.equal(got.cache_seqlens_int32, stock.cache_seqlens_int32)
    assert torch.equal(got.cu_seqlens_k, stock.cu_seqlens_k)
    assert torch.equal(got.cu_seqlens_q, stock.cu_seqlens_q)
    assert got.max_seq_len_q == stock.max_seq_len_q
    seq_lens_reads = [h for h in hits if h[1]]
    if deterministic:
        # The static width: no host read of the lengths, same pages where FA3 reads.
        assert seq_lens_reads == []
        assert got.page_table.shape[1] >= stock.page_table.shape[1]
        assert _covered_equal(got.page_table, stock.page_table, got.cache_seqlens_int32,
                              page_size)
    else:
        # The exact width, read back on this eager path only.
        assert ("Tensor.cpu", True) in seq_lens_reads
        assert torch.equal(got.page_table, stock.page_table)
        assert got.max_seq_len_k == stock.max_seq_len_k
