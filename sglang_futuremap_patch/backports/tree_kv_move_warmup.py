"""Back-port 24: a spec-v2 tree compiles its accepted-KV move for every size before serving.

Upstream: none (beyond upstream); it completes back-port 11 (#26866), whose accepted-path
compaction moves KV with SGLang's ``move_kv_cache``, as 0.5.13 to 0.5.17 do. Applies to:
SGLang 0.5.12 and 0.5.12.post1. Delete with back-port 11 once users are on a release that
compiles these sizes at start-up (none up to 0.5.17). Depends on back-ports 2, 4 and 13
(the ``Scheduler.init_overlap`` it edits is theirs).

Why: after verify, a tree moves the target's KV of each request's accepted path to the front
of its slots, ``bs * (steps + 1)`` rows a batch, through the Triton kernel
``copy_all_layer_kv_cache_tiled``. ``move_kv_cache`` passes ``next_power_of_2(rows)`` as a
``constexpr`` and Triton specializes the row count on divisibility by 16, so every size class
is a compile of its own: 12 for the 128-row chunks an 8B-shaped target gets. SGLang
warms one of them when the pool is built (``_init_kv_copy_and_warmup``), the others compile
the first time a batch of that size decodes, each stopping every request of the server. On
the serving benchmark's FA3 tree row (2 x H200, pinned cores, 2 boots per side) the
patched servers spent 11.5 s in 22 such compiles, inside the measured cells: TTFT p99 was
x0.21 of stock's at concurrency 32 (1.15 s against 0.24 s) and x0.32-0.46 at 4 and 8, and
output tok/s x0.81 at 32 (results/serve-bench/h200-eager-tree-2026-11-27). Stock SGLang runs
an explicit tree on spec v1, which never moves KV. The move first finds its rows with two
more Triton kernels, ``assign_extend_cache_locs`` (``next_power_of_2(bs)``) and
``fill_accepted_out_cache_loc`` (``next_power_of_2(bs * (steps + 1))``), and those compiled 14
times each (1.8 s over 2 servers) in the first cells of each server in the same record, where the
tree's TTFT p99 read x0.25 / 0.68 at concurrency 4 / 8 after the move itself was warmed.

How: ``warm_move_kv_cache`` moves the pool's padding slot 0 onto itself (what SGLang's own
warm-up moves) once for each size class the kernel can meet: for every power of two up to
the pool's chunk size the smallest row count it bounds, and from 16 on the power itself (the
one count of its class that is a multiple of 16). ``Scheduler.init_overlap`` calls it for
the target's KV pool (and, with a page size above 1, for the draft model's, which back-port 12
moves with the same kernel; with page size 1 nothing moves the draft's KV) when the draft is
a tree (``speculative_eagle_topk > 1``) on the overlap scheduler, the only way a tree reaches
the spec-v2 worker. Before that it calls
``warm_accepted_kv_move``: the worker's own move, once for each pair of the two kernels'
classes up to ``max_running_requests``, on requests whose spans are empty (nothing is copied
but the padding slot onto itself). The kernels, their arguments and every move while serving
are SGLang's, unchanged; the KV the warm-up touches is the padding slot's, which no request
reads. The cost is at start-up: on the same benchmark a tree server was ready 4-8 s later
than stock's with the move kernel warmed, where both were ready together before. With the two
row-finding kernels warmed as well (4 x H200, results/serve-bench/h200x4-tree-eager-2026-11-27),
none of the three compiled while serving, and e2e ``tree-v2`` is 18/18.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit


def warm_move_kv_cache(pool: Any) -> list[int]:
    """Compile ``pool.move_kv_cache``'s Triton kernel for every size class; returns the row
    counts moved (empty when the pool has no Triton KV copy: SGLang sets its configuration
    only where it built the copy and launched it once, ``_init_kv_copy_and_warmup``).

    Each move copies the padding slot 0 onto itself. The classes: ``num_locs_upper`` (the
    next power of two, a ``constexpr``) times whether the row count is a multiple of 16;
    larger moves are made of chunks of at most the configured ``num_locs_upper`` rows.
    """
    config = getattr(pool, "_kv_copy_config", None)
    data_ptrs = getattr(pool, "data_ptrs", None)
    if config is None or data_ptrs is None:
        return []
    cap = int(config.get("num_locs_upper", 256))
    counts = []
    upper = 1
    while upper <= cap:
        # The first count of the class (1, 2, then odd), and from 16 on the power itself,
        # the one count of the class that is a multiple of 16.
        counts.append(upper // 2 + 1 if upper > 2 else upper)
        if upper % 16 == 0:
            counts.append(upper)
        upper *= 2
    slots = torch.zeros(cap, dtype=torch.int64, device=data_ptrs.device)
    for n in counts:
        pool.move_kv_cache(slots[:n], slots[:n])
    return counts


def warm_accepted_kv_move(worker: object, max_bs: int) -> list[int]:
    """Compile the Triton kernels that ``worker.move_accepted_tokens_to_target_kvcache``
    launches before the KV move, for every batch size up to ``max_bs``; returns the batch sizes
    run (empty for a worker without that method).

    ``assign_extend_cache_locs`` takes ``next_power_of_2(bs)`` and ``fill_accepted_out_cache_loc``
    ``next_power_of_2(bs * (steps + 1))`` as ``constexpr``: one run per pair of the two. Each
    run is SGLang's method on a batch of ``bs`` requests in slot 0 whose spans are empty
    (``seq_lens`` 0, -1 correct drafts, ``accept_index`` -1): the first kernel copies no
    location, the second stores none, and the move then copies the padding slot 0 onto itself,
    as ``warm_move_kv_cache`` does. The dtypes are the verify's (``accept_index`` and the
    correct-draft counts int32, lengths and locations int64).
    """
    move = getattr(worker, "move_accepted_tokens_to_target_kvcache", None)
    if move is None:
        return []
    width = worker.speculative_num_steps + 1
    draft_tokens = worker.speculative_num_draft_tokens
    device = worker.device
    sizes, classes = [], set()
    for bs in range(1, max_bs + 1):
        key = (next_power_of_2(bs), next_power_of_2(bs * width))
        if key not in classes:
            classes.add(key)
            sizes.append(bs)
    for bs in sizes:
        batch = SimpleNamespace(
            req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=device),
            seq_lens=torch.zeros(bs, dtype=torch.int64, device=device),
            out_cache_loc=torch.zeros(bs * draft_tokens, dtype=torch.int64, device=device),
        )
        accept_index = torch.full((bs, width), -1, dtype=torch.int32, device=device)
        num_correct_drafts = torch.full((bs,), -1, dtype=torch.int32, device=device)
        move(batch, accept_index, num_correct_drafts)
    return sizes


_INIT_OVERLAP_EDITS = (
    TextEdit(
        old="""\
    self.batch_record_buf = [None] * 2
    self.batch_record_ct = 0
""",
        new="""\
    topk = getattr(self.server_args, "speculative_eagle_topk", None)
    if not self.spec_algorithm.is_none() and topk is not None and topk > 1:
        from sglang.srt.mem_cache.memory_pool import warm_move_kv_cache
        from sglang.srt.speculative.eagle_worker_v2 import warm_accepted_kv_move

        # A spec-v2 tree moves its accepted path's KV in sizes that follow the
        # batch: compile each size class now, not while serving.
        warm_accepted_kv_move(self.draft_worker, self.max_running_requests)
        warm_move_kv_cache(self.token_to_kv_pool_allocator.get_kvcache())
        if self.server_args.page_size > 1:
            # In pages, the draft also copies a prefix's partial page into its branches.
            draft = getattr(self.draft_worker, "draft_worker", None)
            draft_pool = getattr(getattr(draft, "draft_runner", None), "token_to_kv_pool", None)
            if draft_pool is not None:
                warm_move_kv_cache(draft_pool)
    self.batch_record_buf = [None] * 2
    self.batch_record_ct = 0
""",
    ),
)

_SCHEDULER = "sglang.srt.managers.scheduler"
_POOL = "sglang.srt.mem_cache.memory_pool"
_EAGLE_V2 = "sglang.srt.speculative.eagle_worker_v2"

BACKPORT = Backport(
    id="tree-kv-move-warmup",
    title="[Spec] Compile the spec-v2 tree's accepted-KV move for every size before serving",
    upstream_prs=(),
    patch_file="0024-Spec-Compile-the-spec-v2-tree-s-accepted-KV-move-for-every-size-before-serving.patch",
    summary="a spec-v2 tree compiles the Triton kernels of its accepted-KV move (move_kv_cache "
            "and the two that find its rows) for every size class at start-up instead of at the "
            "first batch of each size, while serving",
    applied_upstream=None,
    targets=(
        Target(_POOL, "warm_move_kv_cache", warm_move_kv_cache, expected=ABSENT),
        Target(_EAGLE_V2, "SimpleNamespace", SimpleNamespace, expected=ABSENT, kind="value",
               import_line="from types import SimpleNamespace"),
        Target(_EAGLE_V2, "warm_accepted_kv_move", warm_accepted_kv_move, expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.init_overlap", None, expected="02d6e99f98dd4761", kind="edit",
               edits=_INIT_OVERLAP_EDITS),
    ),
)
