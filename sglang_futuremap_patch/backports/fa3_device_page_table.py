"""Back-port 8: FA3 builds its spec-v2 page tables on the device and drops the host mirror.

Upstream: sgl-project/sglang#28106 (a Triton kernel builds trtllm_mha's page table from the
device lengths, sized by a static bound), #29343 (the same for FA3/FA4) and #29589 (EAGLE,
MTP and STANDALONE on FA3 opt out: the verify tree mask is no longer sized from host
lengths). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.16+ (the
first release whose FA3 backend opts out for EAGLE/STANDALONE; 0.5.14 has #28106, 0.5.15 the
FA3 opt-out for DFlash only).
Depends on back-port 7 (which itself needs 4).

Why: FA3 with piecewise CUDA graph is what SGLang 0.5.12.x picks on H100/H200 for
Llama/Qwen-style models with spec topk 1, and FA3 reads the ``seq_lens`` host mirror in every
spec-v2 metadata build: ``seq_lens_cpu.max().item()`` sizes the page table of draft decode,
target verify and draft extend, in CUDA-graph replay and eagerly. So the scheduler still
blocked on the mirror's ``.cpu()`` every iteration, and the default configuration got almost
none of the gain.

How: in CUDA-graph replay, ``replay_spec_metadata_from_device`` fills the captured buffers
with one Triton launch (``fill_page_table_from_lens``): the lengths FA3 reads
(``cache_seqlens``, ``cu_seqlens_k``) and, per request, exactly the pages its length covers,
read from ``req_to_token`` on the device; the grid spans the captured table width (a static
bound) and masks by each row's length. This is exact: a graph replays the FA3 launch
recorded at capture, with the full-width table, so the host maximum never reached the
kernel; it only bounded stock's copy, and FA3 reads no column past a row's length. The
draft extend has no CUDA graph on FA3 in 0.5.12.x (SGLang captures it for Triton and
TRTLLM-MLA only), so it is eager in every iteration: FA3 overrides back-port 4's
``draft_extend_needs_cpu_seq_lens`` and the draft worker (back-port 4) copies the lengths
without blocking at the start of the forward (multi-layer EAGLE does too for batches its
draft-extend CUDA graph cannot replay); the draft extend waits for that copy, which
queues behind the previous forward only, and then runs SGLang's code with exact host
lengths. Other eager forwards (a batch above ``cuda_graph_max_bs``, or no CUDA graph) keep
SGLang's code and get a host stand-in for the mirror (``host_seq_lens_stand_in``). FA3 sizes
its split-KV heuristic from the page-table width, so a static width is exact only with
``num_splits`` pinned to 1 (deterministic inference); otherwise the stand-in is the device
lengths copied on demand, a host read confined to eager batches. Hence the declaration: with
CUDA graph disabled and ``num_splits`` 0 every forward is eager, and FA3 keeps the mirror
(one copy per iteration, off the forward's critical path, beats one per forward). The verify
of topk 1 never reads the tree mask, so ``reads_verify_tree_mask`` is False and the draft
builds the mask's small layout (back-port 4 declares both hooks for every backend, with
SGLang's behaviour as the default, and reads them). Outside what is covered
here (``builds_spec_metadata_on_device``: topk > 1, MLA (back-port 18 adds it), sliding-window
or local attention, encoder-decoder, context parallel, FA4) FA3 keeps
``needs_cpu_seq_lens = True`` and runs exactly as before.

The two entry points, ``init_forward_metadata`` and ``init_forward_metadata_replay_cuda_graph``,
are SGLang's methods with a check inserted at the top (a text edit, the same in the plugin and
in the patch); everything after it runs as before. The draft-extend query lengths in ``replay_spec_metadata_from_device`` repeat SGLang's
``is_draft_extend_v2`` branch; the rest is new.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: Columns of the page table one program fills.
PAGE_TABLE_BLOCK = 512


# --------------------------------------------------------------------------- the kernel


def _page_table_from_lens_kernel(
    seq_lens,
    req_pool_indices,
    req_to_token,
    req_to_token_stride,
    page_table,
    page_table_stride,
    cache_seqlens,
    cu_seqlens_k,
    batch_size,
    seq_len_delta,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # A plain function: fill_page_table_from_lens jits it with triton.jit (so the patched
    # source and the plugin are the same text). Program (row, chunk) fills BLOCK columns of
    # one row, masked by that row's own length; program (0, 0) also writes the lengths.
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    if row == 0 and chunk == 0:
        total = 0
        for i in range(batch_size):
            length_i = (tl.load(seq_lens + i) + seq_len_delta).to(tl.int32)
            tl.store(cache_seqlens + i, length_i)
            tl.store(cu_seqlens_k + i, total)
            total += length_i
        tl.store(cu_seqlens_k + batch_size, total)
    length = tl.load(seq_lens + row).to(tl.int64) + seq_len_delta
    num_pages = (length + PAGE_SIZE - 1) // PAGE_SIZE
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < num_pages
    slot = tl.load(req_pool_indices + row).to(tl.int64)
    tokens = tl.load(
        req_to_token + slot * req_to_token_stride + cols.to(tl.int64) * PAGE_SIZE,
        mask=mask,
        other=0,
    )
    tl.store(
        page_table + row.to(tl.int64) * page_table_stride + cols, tokens // PAGE_SIZE, mask=mask
    )


def fill_page_table_from_lens(
    cache_seqlens,
    cu_seqlens_k,
    page_table,
    req_to_token,
    req_pool_indices,
    seq_lens,
    seq_len_delta,
    page_size,
    kernel,
):
    """FA3 decode metadata from the device lengths alone, in one launch.

    Writes ``cache_seqlens = seq_lens + seq_len_delta`` (int32), ``cu_seqlens_k`` (its
    exclusive prefix sum, ``batch + 1`` entries) and, for row ``b``, the first
    ``ceil(cache_seqlens[b] / page_size)`` columns of ``page_table`` with
    ``req_to_token[req_pool_indices[b], col * page_size] // page_size``. Columns past a
    row's length are left as they are: FA3 does not read them. ``kernel`` is
    ``_page_table_from_lens_kernel`` jitted.
    """
    batch_size = seq_lens.shape[0]
    if batch_size == 0:
        return
    grid = (batch_size, triton.cdiv(page_table.shape[1], PAGE_TABLE_BLOCK))
    kernel[grid](
        seq_lens,
        req_pool_indices,
        req_to_token,
        req_to_token.stride(0),
        page_table,
        page_table.stride(0),
        cache_seqlens,
        cu_seqlens_k,
        batch_size,
        seq_len_delta,
        PAGE_SIZE=page_size,
        BLOCK=PAGE_TABLE_BLOCK,
    )


# --------------------------------------------------------------------------- declarations


def builds_spec_metadata_on_device(self) -> bool:
    """Whether this backend's spec-v2 metadata is built from the device lengths: the
    configurations covered, as listed here; any other keeps the host mirror."""
    return (
        self.fa_impl_ver == 3
        and self.topk <= 1
        and not self.use_mla
        and not self.has_swa
        and not self.use_sliding_window_kv_pool
        and not self.has_local_attention
        and not self.is_encoder_decoder
        and self.attn_cp_size == 1
    )


@property
def needs_cpu_seq_lens(self):
    """Whether this FA3 backend needs the spec-v2 ``seq_lens`` host mirror."""
    if not self.builds_spec_metadata_on_device():
        return True
    # Eager forwards need the exact host maximum unless num_splits is pinned to 1; without
    # CUDA graph every forward is eager.
    return self.num_splits != 1 and get_global_server_args().disable_cuda_graph


@property
def draft_extend_needs_cpu_seq_lens(self):
    """Whether the eager draft extend wants the exact host lengths without the mirror.

    SGLang 0.5.12.x captures no draft-extend CUDA graph for FA3, so that forward is eager
    in every iteration; the exact maximum decides FA3's split-KV heuristic unless
    ``num_splits`` is pinned to 1. The draft worker then copies the lengths at the start
    of the forward (back-port 4), and only the draft extend waits for that copy.
    """
    return self.num_splits != 1


@property
def reads_verify_tree_mask(self):
    """Target verify reads the draft's tree mask only with topk > 1."""
    return self.topk > 1


@property
def multi_step_needs_cpu_seq_lens(self):
    """The per-step FA3 backends of the draft decode decide."""
    return any(b.needs_cpu_seq_lens for b in self.attn_backends)


# --------------------------------------------------------------------------- eager


def host_seq_lens_stand_in(self, forward_batch: ForwardBatch):
    """What ``init_forward_metadata`` reads as ``seq_lens_cpu`` when the batch has none.

    It only ever reads the maximum, to size the page table. FA3 takes the table's width as
    its ``seqlen_k`` and sizes the split-KV work from it; with ``num_splits`` pinned to 1
    that is unused, so the static bound gives the same attention. Otherwise the width must
    be the true maximum: the lengths are copied to the host here, on this eager path only.
    """
    if self.num_splits == 1:
        return torch.tensor([self.max_context_len], dtype=torch.int64)
    return forward_batch.seq_lens.cpu()


# --------------------------------------------------------------------------- CUDA graph


def replay_spec_metadata_from_device(
    self,
    bs: int,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_sum: Optional[int],
    encoder_lens: Optional[torch.Tensor],
    forward_mode: ForwardMode,
    spec_info: Optional[SpecInput],
    out_cache_loc: Optional[torch.Tensor] = None,
):
    """CUDA-graph replay metadata of a spec-v2 batch without the host mirror.

    Draft decode, target verify and draft extend with topk 1 are built on the device; any
    other batch (none reaches here while ``needs_cpu_seq_lens`` is False) gets the host
    lengths copied on demand and SGLang's own replay.
    """
    seq_lens = seq_lens[:bs]
    req_pool_indices = req_pool_indices[:bs]
    on_device = self.topk <= 1 and encoder_lens is None and spec_info is not None
    if on_device and forward_mode.is_decode_or_idle():
        metadata = self.decode_cuda_graph_metadata[bs]
        seq_len_delta = self.speculative_step_id + 1
    elif on_device and forward_mode.is_target_verify():
        metadata = self.target_verify_metadata[bs]
        seq_len_delta = self.speculative_num_draft_tokens
    elif on_device and forward_mode.is_draft_extend_v2():
        metadata = self.draft_extend_metadata[bs]
        seq_len_delta = 0
        # The query lengths, as SGLang's draft-extend-v2 replay sets them.
        per_req = getattr(spec_info, "num_tokens_per_req", self.speculative_num_steps + 1)
        extend_lens = getattr(spec_info, "extend_seq_lens_tensor", None)
        extend_lens_cpu = getattr(spec_info, "extend_seq_lens_cpu", None)
        if extend_lens is not None:
            extend_lens = extend_lens.to(torch.int32)
        elif extend_lens_cpu is not None:
            extend_lens = torch.as_tensor(
                extend_lens_cpu, dtype=torch.int32, device=seq_lens.device
            )
        else:
            extend_lens = torch.full(
                (bs,), per_req, dtype=torch.int32, device=seq_lens.device
            )
            extend_lens_cpu = [per_req] * bs
        metadata.max_seq_len_q = int(max(extend_lens_cpu)) if extend_lens_cpu else per_req
        metadata.cu_seqlens_q[1:].copy_(torch.cumsum(extend_lens, dim=0, dtype=torch.int32))
    else:
        return self.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode,
            spec_info, seq_lens.cpu(), out_cache_loc,
        )
    kernel = self.__dict__.get("page_table_kernel")
    if kernel is None:
        kernel = self.page_table_kernel = triton.jit(_page_table_from_lens_kernel)
    fill_page_table_from_lens(
        metadata.cache_seqlens_int32,
        metadata.cu_seqlens_k,
        metadata.page_table,
        self.req_to_token,
        req_pool_indices,
        seq_lens,
        seq_len_delta,
        self.page_size,
        kernel,
    )
    # The graph replays the launch recorded at capture, over the whole table.
    metadata.max_seq_len_k = metadata.page_table.shape[1] * self.page_size
    self.forward_metadata = metadata
    self.forward_metadata_spec_decode_expand = None


_FA = "sglang.srt.layers.attention.flashattention_backend"

# FA3's two metadata entry points: a check at the top of SGLang's method; the rest of it
# runs as it is (for a batch without the mirror, with the stand-in, by calling itself).
INIT_EDITS = (
    TextEdit(
        old="""\
    \"""Initialize forward metadata hence all layers in the forward pass can reuse it.\"""
    metadata = FlashAttentionMetadata()
""",
        new="""\
    \"""Initialize forward metadata hence all layers in the forward pass can reuse it.\"""
    if forward_batch.seq_lens_cpu is None:
        # No host mirror (needs_cpu_seq_lens is False): the metadata below reads the host
        # maximum only to size the page table; give it a stand-in. A draft extend without
        # the mirror has no host prefix lengths either (back-port 4); SGLang tests them
        # only for "any nonzero?", ahead of "or is_draft_extend", which is true here, so
        # an empty list takes the same branch.
        no_prefix_lens = forward_batch.extend_prefix_lens_cpu is None
        forward_batch.seq_lens_cpu = self.host_seq_lens_stand_in(forward_batch)
        if no_prefix_lens:
            forward_batch.extend_prefix_lens_cpu = []
        try:
            return self.init_forward_metadata(forward_batch)
        finally:
            forward_batch.seq_lens_cpu = None
            if no_prefix_lens:
                forward_batch.extend_prefix_lens_cpu = None
    metadata = FlashAttentionMetadata()
""",
    ),
)
REPLAY_EDITS = (
    TextEdit(
        old="""\
    \"""Initialize forward metadata for replaying CUDA graph.\"""
    seq_lens = seq_lens[:bs]
""",
        new="""\
    \"""Initialize forward metadata for replaying CUDA graph.\"""
    if seq_lens_cpu is None:
        # No host mirror (needs_cpu_seq_lens is False): build it on the device.
        return self.replay_spec_metadata_from_device(
            bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode,
            spec_info, out_cache_loc,
        )
    seq_lens = seq_lens[:bs]
""",
    ),
)


BACKPORT = Backport(
    id="fa3-device-page-table",
    title="[Spec] FA3 builds spec-v2 page tables on the device and drops the seq_lens mirror",
    upstream_prs=(28106, 29343, 29589),
    patch_file="0008-Spec-FA3-builds-spec-v2-page-tables-on-the-device.patch",
    summary="FlashAttentionBackend (topk 1) replays from device lengths; needs_cpu_seq_lens False",
    applied_upstream="0.5.16",
    targets=(
        Target(_FA, "PAGE_TABLE_BLOCK", PAGE_TABLE_BLOCK, expected=ABSENT, kind="value",
               import_line=f"PAGE_TABLE_BLOCK = {PAGE_TABLE_BLOCK}"),
        Target(_FA, "_page_table_from_lens_kernel", _page_table_from_lens_kernel,
               expected=ABSENT),
        Target(_FA, "fill_page_table_from_lens", fill_page_table_from_lens, expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.builds_spec_metadata_on_device",
               builds_spec_metadata_on_device, expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.needs_cpu_seq_lens", needs_cpu_seq_lens,
               expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.draft_extend_needs_cpu_seq_lens",
               draft_extend_needs_cpu_seq_lens, expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.reads_verify_tree_mask", reads_verify_tree_mask,
               expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.host_seq_lens_stand_in", host_seq_lens_stand_in,
               expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.replay_spec_metadata_from_device",
               replay_spec_metadata_from_device, expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.init_forward_metadata", None,
               expected="397c5f4a9b6b1f2e", kind="edit", edits=INIT_EDITS),
        Target(_FA, "FlashAttentionBackend.init_forward_metadata_replay_cuda_graph", None,
               expected="359046ba3c547e2b", kind="edit", edits=REPLAY_EDITS),
        Target(_FA, "FlashAttentionMultiStepBackend.needs_cpu_seq_lens",
               multi_step_needs_cpu_seq_lens, expected=ABSENT),
    ),
)
