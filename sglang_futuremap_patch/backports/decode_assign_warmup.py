"""Back-port 25: a spec-v2 tree compiles its decode's req-to-token assignment for every size first.

Upstream: none (beyond upstream); SGLang's spec-v2 decode (``EagleDraftInputV2Mixin.prepare_for_decode``)
compiles this kernel on first use in 0.5.12 and 0.5.13 alike (read in the wheels). Applies to:
SGLang 0.5.12 and 0.5.12.post1. Delete once users are on a release that compiles these sizes at
start-up. Depends on back-port 24 (its ``Scheduler.init_overlap`` edit is the anchor) and on
back-port 11 (trees on spec v2).

Why: every spec-v2 decode batch reserves its KV slots and writes them into the request rows
with the Triton kernel ``assign_req_to_token_pool``, which takes ``next_power_of_2(bs)`` as a
``constexpr``; Triton also specializes the slot tensor's pointer on 16-byte alignment, and the
token allocator hands out slices of its free list at any offset, so each batch size class
compiles twice, the first time a batch of that class and alignment is built. The build runs
in ``update_running_batch``, between a prefill's launch and the processing of its result: on
the serving benchmark's FA3 tree row (4 x H200, 2 boots per side,
results/serve-bench/h200x4-tree-eager-2026-11-27) the patched servers compiled it 23 times
(2.0 s over 2 servers, about 90 ms each) in their first cells, and a prefill of 3 requests at
concurrency 4 waited 97 ms for its result to be processed. TTFT p99 read x0.26 of stock's
there. Stock SGLang runs an explicit tree on spec v1, whose kernels compile inside decode
launches (12 compiles, 1.1 s).

How: ``warm_assign_req_to_token_pool`` runs SGLang's ``assign_req_to_token_pool_func`` once
for each batch size class up to ``max_running_requests`` and each alignment of the slot
tensor (one 16-byte aligned, one 8 bytes off), with the dtypes of ``prepare_for_decode``
(request slots and slot locations int64, lengths int32) and an empty span for every request
(start = end = 0): nothing is written. ``Scheduler.init_overlap`` calls it for a tree
(``speculative_eagle_topk > 1``) on the overlap scheduler, next to back-port 24's warm-up.
Chains compile the same kernel the same way in stock SGLang's spec v2, which the plugin is
compared with there; they are left as they are. On the GPU (the FA3 tree row at 1-48, 4 x
H200, results/serve-bench/h200x4-tree-b25-2026-11-27) the patched servers no longer compiled
it while serving, and TTFT p99 at concurrency 4 read x1.08 of stock's (x0.26 before).
"""

from __future__ import annotations

import torch

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit


def warm_assign_req_to_token_pool(req_to_token: torch.Tensor, max_bs: int) -> list[tuple[int, bool]]:
    """Compile ``assign_req_to_token_pool`` for every batch size class up to ``max_bs`` and both
    alignments of the slot tensor; returns the (batch size, aligned) pairs run.

    Each run gives ``bs`` requests an empty span in row 0 (start = end = 0), so the kernel
    stores nothing. ``bs`` is the smallest batch size of its class (``next_power_of_2(bs)``).
    """
    sizes, upper = [], 1
    while upper <= next_power_of_2(max_bs):
        sizes.append(upper // 2 + 1 if upper > 2 else upper)
        upper *= 2
    device = req_to_token.device
    runs = []
    for bs in sizes:
        span = torch.zeros(bs, dtype=torch.int32, device=device)
        slots = torch.zeros(bs + 1, dtype=torch.int64, device=device)
        for aligned in (True, False):
            # An int64 tensor's storage is 16-byte aligned; one element on, it is 8 bytes off.
            out_cache_loc = slots[:bs] if aligned else slots[1:]
            assign_req_to_token_pool_func(
                torch.zeros(bs, dtype=torch.int64, device=device),
                req_to_token,
                span,
                span,
                out_cache_loc,
                bs,
            )
            runs.append((bs, aligned))
    return runs


_INIT_OVERLAP_EDITS = (
    TextEdit(
        old="""\
            if draft_pool is not None:
                warm_move_kv_cache(draft_pool)
    self.batch_record_buf = [None] * 2
""",
        new="""\
            if draft_pool is not None:
                warm_move_kv_cache(draft_pool)
        from sglang.srt.speculative.spec_utils import warm_assign_req_to_token_pool

        # Each decode assigns its requests' KV slots with a kernel compiled per batch
        # size class and slot alignment: compile them now, not between a prefill and
        # its result.
        warm_assign_req_to_token_pool(
            self.req_to_token_pool.req_to_token, self.max_running_requests
        )
    self.batch_record_buf = [None] * 2
""",
    ),
)

_SCHEDULER = "sglang.srt.managers.scheduler"
_SPEC_UTILS = "sglang.srt.speculative.spec_utils"

BACKPORT = Backport(
    id="decode-assign-warmup",
    title="[Spec] Compile the spec-v2 tree decode's req-to-token assignment for every size before serving",
    upstream_prs=(),
    patch_file="0025-Spec-Compile-the-spec-v2-tree-decode-s-req-to-token-assignment-before-serving.patch",
    summary="a spec-v2 tree compiles assign_req_to_token_pool for every batch size class and "
            "slot alignment at start-up instead of between a prefill and its result, while serving",
    applied_upstream=None,
    targets=(
        Target(_SPEC_UTILS, "warm_assign_req_to_token_pool", warm_assign_req_to_token_pool,
               expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.init_overlap", None, expected="172f5b1e5441b772", kind="edit",
               edits=_INIT_OVERLAP_EDITS),
    ),
)
