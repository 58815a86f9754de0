"""Back-port 12: EAGLE trees on spec v2 with a page size above 1 (FlashInfer and FA3).

Upstream: sgl-project/sglang#26972 (spec-v2 tree drafting with ``page_size > 1``: each draft
branch gets page-aligned slots of its own with the prefix's partial last page copied in,
the decode reserve counts those pages, and the ``req_to_token`` row is wide enough to hold
the reserve). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+.
Depends on back-port 11 (trees on spec v2), whose routing it widens.

Why: after back-port 11 a tree runs on spec v2 with page size 1 only; with page size 16 (or
any page size above 1) it stays on spec v1, because the v2 draft cannot lay a tree out in
pages: ``get_alloc_len_per_decode`` raises ``NotImplementedError`` for page size > 1 with
topk > 1, and the v2 draft writes branch after branch into consecutive slots from
``seq_lens`` on, while the paged draft-decode attention of FlashInfer and FA3 (the one spec
v1 uses, ``generate_draft_decode_kv_indices`` and FA3's two-pass draft decode) reads each
branch from page-aligned slots of its own: branch ``t`` starts at the prefix's last page
boundary plus ``t`` times the pages one branch needs, and its first ``seq_lens % page_size``
slots are expected to hold the prefix's partial last page.

How: ``get_alloc_len_per_decode`` counts, for page size > 1 with topk > 1, every branch's
pages in the worst case (a partial last page of ``page_size - 1`` tokens before the draft):
``ceil((page_size - 1 + steps) / page_size) * page_size * topk`` slots. The ``req_to_token``
row grows to hold a request's committed length plus the decode reserve (twice that), where
0.5.12.x leaves room for ``4 + num_draft_tokens`` only: a request near the context length
would write past its row and leak the slots on release. ``prepare_for_v2_draft`` picks the
draft's slots with the paged layout (``assign_paged_tree_draft_cache_locs``): for each
branch, the ``steps`` slots after its start plus the prefix's partial-page length, the
slots spec v1's ``assign_draft_cache_locs`` hands the draft and the attention backends
read; and it copies the draft model's KV of the prefix's partial last page into the first
slots of branches 1 .. topk-1 (branch 0's first page is the prefix's own). The copy has a
fixed size per batch: a position past the partial page copies its slot onto itself, so
nothing waits for the device (upstream selects the slots with a mask, a host sync per
draft). ``spec_v2_tree_unsupported`` lets a tree with page size > 1 run on spec v2 where
every attention backend is FlashInfer or FA3, the backends with the paged tree draft
decode and the only ones SGLang 0.5.12.x accepts for topk > 1 with page size > 1.

Verify, the accepted-path compaction and the draft extend are untouched: their slots are the
``num_draft_tokens`` consecutive positions from ``seq_lens``, which the decode allocation
already lays out in pages. Every change is a text edit of SGLang's function (or of back-port
11's ``spec_v2_tree_unsupported``), the same in the plugin and in the patch, plus the new
helper.
"""

from __future__ import annotations

import torch

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit


def assign_paged_tree_draft_cache_locs(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    draft_kv_pool,
    topk: int,
    num_steps: int,
    page_size: int,
) -> torch.Tensor:
    """The draft's KV slots for a tree with page size > 1; returns ``out_cache_loc``.

    Per request, with ``tail = seq_len % page_size`` (the prefix's partial last page),
    ``base = seq_len - tail`` and ``pages = ceil((tail + num_steps) / page_size)``, branch
    ``t`` owns the positions ``base + t * pages * page_size`` onwards and drafts into the
    ``num_steps`` of them after its first ``tail``. The result lists, request by request and
    branch by branch, those slots (``bs * topk * num_steps``, int64), the order spec v1's
    ``assign_draft_cache_locs`` produces. The draft model's KV of the partial page is copied
    into the first ``tail`` slots of branches 1 .. topk-1, where the paged draft decode reads
    a branch's first page.
    """
    device = req_to_token.device
    pool = req_pool_indices.long()[:, None]
    bs = pool.shape[0]

    def slots(pos: torch.Tensor) -> torch.Tensor:
        """The slots of the requests' positions ``pos`` ``[bs, n]``, as int64 (only those
        entries of their rows are read)."""
        return req_to_token[pool, pos].to(torch.int64)

    seq = seq_lens.to(device=device, dtype=torch.int64)
    tail = seq % page_size
    base = seq - tail
    pages = (tail + num_steps + page_size - 1) // page_size
    branch = torch.arange(topk, device=device, dtype=torch.int64)
    starts = base[:, None] + branch[None, :] * (pages * page_size)[:, None]  # [bs, topk]

    step = torch.arange(num_steps, device=device, dtype=torch.int64)
    draft_pos = starts[:, :, None] + tail[:, None, None] + step[None, None, :]
    out_cache_loc = slots(draft_pos.reshape(bs, -1)).reshape(-1)

    if topk > 1:
        offset = torch.arange(page_size, device=device, dtype=torch.int64)
        hole_pos = starts[:, 1:, None] + offset[None, None, :]  # [bs, topk - 1, page]
        src_pos = (base[:, None, None] + offset[None, None, :]).expand_as(hole_pos)
        in_tail = (offset[None, None, :] < tail[:, None, None]).expand_as(hole_pos)
        tgt = slots(hole_pos.reshape(bs, -1))
        src = slots(src_pos.reshape(bs, -1))
        # Past the partial page a slot copies onto itself: a fixed-size copy, no host sync.
        src = torch.where(in_tail.reshape(bs, -1), src, tgt)
        draft_kv_pool.move_kv_cache(tgt.reshape(-1), src.reshape(-1))
    return out_cache_loc


_ALLOC_EDITS = (
    TextEdit(
        old="""\
    else:
        raise NotImplementedError(
            "get_alloc_len_per_decode not implemented for page_size > 1 and spec_topk > 1"
        )
""",
        new="""\
    else:
        # A spec-v2 tree in pages: every branch drafts into pages of its own, after a
        # copy of the prefix's partial last page (up to page_size - 1 tokens).
        pages_per_branch = (page_size - 1 + spec_steps + page_size - 1) // page_size
        return max(pages_per_branch * page_size * spec_topk, spec_tokens)
""",
    ),
)

_POOL_EDITS = (
    TextEdit(
        old="""\
        if self.server_args.speculative_num_draft_tokens is not None:
            extra_max_context_len += self.server_args.speculative_num_draft_tokens
""",
        new="""\
        if self.server_args.speculative_num_draft_tokens is not None:
            extra_max_context_len += self.server_args.speculative_num_draft_tokens
        if (
            self.server_args.speculative_algorithm is not None
            and self.server_args.page_size > 1
            and (self.server_args.speculative_eagle_topk or 1) > 1
        ):
            # A tree in pages reserves more than num_draft_tokens past the committed
            # length (spec v2 decode): the row must hold the whole reserve.
            from sglang.srt.managers.utils import get_alloc_len_per_decode

            extra_max_context_len = max(
                extra_max_context_len, 2 * get_alloc_len_per_decode(self.server_args)
            )
""",
    ),
)

_DRAFT_EDITS = (
    TextEdit(
        old="""\
        # Assign cache locations
        batch.out_cache_loc = torch.empty(
            (bs * topk * num_steps,),
            dtype=torch.int64,
            device=batch.input_ids.device,
        )
        # FIXME(lsyin): align with the default code path
        assign_draft_cache_locs_page_size_1[(bs,)](
            batch.req_pool_indices,
            req_to_token_pool.req_to_token,
            batch.seq_lens,
            batch.out_cache_loc,
            req_to_token_pool.req_to_token.shape[1],
            topk,
            num_steps,
        )
""",
        new="""\
        # Assign cache locations
        if draft_model_runner.page_size > 1 and topk > 1:
            # A tree in pages: each branch drafts into page-aligned slots of its own.
            batch.out_cache_loc = assign_paged_tree_draft_cache_locs(
                req_to_token_pool.req_to_token,
                batch.req_pool_indices,
                batch.seq_lens,
                draft_model_runner.token_to_kv_pool,
                topk,
                num_steps,
                draft_model_runner.page_size,
            )
        else:
            batch.out_cache_loc = torch.empty(
                (bs * topk * num_steps,),
                dtype=torch.int64,
                device=batch.input_ids.device,
            )
            # FIXME(lsyin): align with the default code path
            assign_draft_cache_locs_page_size_1[(bs,)](
                batch.req_pool_indices,
                req_to_token_pool.req_to_token,
                batch.seq_lens,
                batch.out_cache_loc,
                req_to_token_pool.req_to_token.shape[1],
                topk,
                num_steps,
            )
""",
    ),
)

_ROUTING_EDITS = (
    TextEdit(
        old="""\
    if (server_args.page_size or 1) != 1:
        return f"page size {server_args.page_size} (spec v2 trees need page size 1 here)"
""",
        new="",
    ),
    TextEdit(
        old="""\
        return f"attention backend {sorted(backends) or None} (spec v2 trees: triton, flashinfer, fa3)"
""",
        new="""\
        return f"attention backend {sorted(backends) or None} (spec v2 trees: triton, flashinfer, fa3)"
    if (server_args.page_size or 1) != 1 and not backends <= {"flashinfer", "fa3"}:
        return (
            f"page size {server_args.page_size} with attention backend {sorted(backends)} "
            f"(spec v2 trees in pages: flashinfer, fa3)"
        )
""",
    ),
)

_EAGLE_INFO_V2 = "sglang.srt.speculative.eagle_info_v2"

BACKPORT = Backport(
    id="paged-tree-spec-v2",
    title="[Spec] Run EAGLE trees on spec v2 with page size > 1",
    upstream_prs=(26972,),
    patch_file="0012-Spec-Run-EAGLE-trees-on-spec-v2-with-page-size-1.patch",
    summary="trees with page size > 1 on FlashInfer/FA3 run on spec v2: paged per-branch "
            "draft slots with the prefix's partial page copied in; reserve and row sized",
    targets=(
        Target("sglang.srt.managers.utils", "get_alloc_len_per_decode", None,
               expected="156ab041ccd8af9c", kind="edit", edits=_ALLOC_EDITS),
        Target("sglang.srt.model_executor.model_runner_kv_cache_mixin",
               "ModelRunnerKVCacheMixin._init_pools", None, expected="73d2c4ef36f4c64b", kind="edit",
               edits=_POOL_EDITS),
        Target(_EAGLE_INFO_V2, "assign_paged_tree_draft_cache_locs",
               assign_paged_tree_draft_cache_locs, expected=ABSENT),
        Target(_EAGLE_INFO_V2, "EagleDraftInputV2Mixin.prepare_for_v2_draft", None,
               expected="7a80520604568c32", kind="edit", edits=_DRAFT_EDITS),
        Target("sglang.srt.server_args", "spec_v2_tree_unsupported", None, expected="81fbb21e23c52a27",
               kind="edit", edits=_ROUTING_EDITS),
    ),
)
