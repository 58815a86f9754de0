"""Back-port 26: a spec-v2 tree compiles its prefill's req-to-token write for both slot alignments.

Upstream: none (beyond upstream); SGLang's prefill preparation (``alloc_for_extend`` ->
``write_cache_indices``) compiles this kernel on first use in 0.5.12 and 0.5.13 alike (read in
the wheels). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete once users are on a release
that compiles it at start-up. Depends on back-port 25 (its ``Scheduler.init_overlap`` edit is
the anchor).

Why: every prefill writes its new KV slots into the request rows with the Triton kernel
``write_req_to_token_pool_triton``. Triton specializes each pointer on 16-byte alignment, and
with a page size of 1 the slot tensor is a slice of the token allocator's free list, which
starts at any offset. SGLang's own start-up compiles the aligned case only. A spec-v2 server
reaches the other case while serving, and compiles it while it builds a prefill, before the
launch. On the serving benchmark's FA3 tree row (4 x H200, 2 boots per side,
results/serve-bench/h200x4-tree-b25-2026-11-27) that took 141 and 144 ms in the first cell of
each patched server. Two returning waves of requests at concurrency 16 then read TTFT p50
201 and 211 ms, against 65-110 ms for the other waves, and the cell's TTFT p99 read x0.47 of
stock's. Stock SGLang runs an explicit tree on spec v1, whose prefills never reached that case
in any record. Stock spec-v2 chains compile it the same way (the Triton row's records).

How: ``warm_write_cache_indices`` runs SGLang's ``write_cache_indices`` once for each
alignment of the slot tensor (one 16-byte aligned, one 8 bytes off), for one request with an
empty prefix and an empty extend (row 0, prefix = sequence = 0): the kernel stores nothing.
The dtypes are those ``alloc_for_extend`` passes (int64 lengths, slots and request rows).
``Scheduler.init_overlap`` calls it for a tree (``speculative_eagle_topk > 1``), after back-port
25's warm-up. Chains are compared with stock spec v2, which compiles it the same way, and are
left as they are. On the GPU (2 x H100, a fresh machine with an empty Triton cache, the tree
at 16 and 4, 2 boots per side; same record) no patched server compiled it while serving, and
the outputs were identical to stock's.
"""

from __future__ import annotations

import torch

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit


def warm_write_cache_indices(req_to_token_pool) -> list[bool]:
    """Compile the prefill's req-to-token write for both alignments of its slot tensor;
    returns the alignments run (True: 16-byte aligned).

    One request in row 0 with an empty prefix and an empty extend: nothing is stored.
    """
    device = req_to_token_pool.device
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    zero_cpu = torch.zeros(1, dtype=torch.int64)
    slots = torch.zeros(2, dtype=torch.int64, device=device)
    runs = []
    for aligned in (True, False):
        # An int64 tensor's storage is 16-byte aligned; one element on, it is 8 bytes off.
        write_cache_indices(
            slots[:1] if aligned else slots[1:],
            zero,
            zero_cpu,
            zero,
            zero_cpu,
            zero,
            zero_cpu,
            zero,
            zero_cpu,
            [torch.empty(0, dtype=torch.int64, device=device)],
            req_to_token_pool,
        )
        runs.append(aligned)
    return runs


_INIT_OVERLAP_EDITS = (
    TextEdit(
        old="""\
        warm_assign_req_to_token_pool(
            self.req_to_token_pool.req_to_token, self.max_running_requests
        )
    self.batch_record_buf = [None] * 2
""",
        new="""\
        warm_assign_req_to_token_pool(
            self.req_to_token_pool.req_to_token, self.max_running_requests
        )
        from sglang.srt.mem_cache.common import warm_write_cache_indices

        # A prefill writes its KV slots into the request rows with a kernel compiled
        # per slot alignment: compile both now, not while a prefill is built.
        warm_write_cache_indices(self.req_to_token_pool)
    self.batch_record_buf = [None] * 2
""",
    ),
)

_SCHEDULER = "sglang.srt.managers.scheduler"
_MEM_COMMON = "sglang.srt.mem_cache.common"

BACKPORT = Backport(
    id="prefill-write-warmup",
    title="[Spec] Compile the spec-v2 tree prefill's req-to-token write for both alignments before serving",
    upstream_prs=(),
    patch_file="0026-Spec-Compile-the-spec-v2-tree-prefill-s-req-to-token-write-before-serving.patch",
    summary="a spec-v2 tree compiles write_req_to_token_pool_triton for both alignments of the "
            "slot tensor at start-up instead of while it builds a prefill, while serving",
    applied_upstream=None,
    targets=(
        Target(_MEM_COMMON, "warm_write_cache_indices", warm_write_cache_indices, expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.init_overlap", None, expected="e44202c1578facdb", kind="edit",
               edits=_INIT_OVERLAP_EDITS),
    ),
)
