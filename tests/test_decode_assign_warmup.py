"""Back-port decode-assign-warmup: a spec-v2 tree compiles its decode's slot assignment first.

Runs SGLang's real ``assign_req_to_token_pool_func``, the real spec-v2
``EagleDraftInputV2Mixin.prepare_for_decode`` (as patched, on a real ``ScheduleBatch`` and
SGLang's token allocator) and the real ``Scheduler.init_overlap`` on CPU. Only the Triton
kernel ``assign_req_to_token_pool``, which needs a GPU, is replaced: by a recorder of the
specialization each launch would compile (Triton compiles once per ``constexpr`` value,
pointer dtype and pointer alignment to 16 bytes).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport, overlap_init_scheduler, quiet_tree_warmups
from sim_support import spec_v2_decode_batch


class AssignKernel:
    """Stands in for ``assign_req_to_token_pool``: ``kernel[grid](...)`` records the launch's
    compile key and the spans it would write."""

    def __init__(self) -> None:
        self.keys: list[tuple] = []
        self.spans: list[list[tuple[int, int]]] = []

    def __getitem__(self, grid):
        def launch(req_pool_indices, req_to_token, start, end, out_cache_loc, pool_len, bs_upper):
            pointers = (req_pool_indices, req_to_token, start, end, out_cache_loc)
            self.keys.append(tuple((t.dtype, t.data_ptr() % 16 == 0) for t in pointers) + (pool_len, bs_upper))
            self.spans.append(list(zip(start.tolist(), end.tolist())))

        return launch


@pytest.fixture
def kernel(clean_state, monkeypatch):
    from sglang.srt.speculative import spec_utils

    activate_backport()
    recorder = AssignKernel()
    monkeypatch.setattr(spec_utils, "assign_req_to_token_pool", recorder)
    return recorder


def test_the_warm_up_covers_every_batch_size_class_and_alignment(kernel):
    from sglang.srt.speculative.spec_utils import warm_assign_req_to_token_pool

    req_to_token = torch.zeros((8, 4108), dtype=torch.int32)
    runs = warm_assign_req_to_token_pool(req_to_token, 48)
    assert runs == [(bs, aligned) for bs in (1, 2, 3, 5, 9, 17, 33) for aligned in (True, False)]
    warmed = set(kernel.keys)
    assert len(warmed) == len(kernel.keys) == 14  # 7 classes up to 64, two alignments each
    assert all(start == end == 0 for spans in kernel.spans for start, end in spans)  # no store
    assert {k[-1] for k in warmed} == {1, 2, 4, 8, 16, 32, 64}
    assert {k[4][1] for k in warmed} == {True, False}


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_served_decode_compiles_nothing_the_warm_up_did_not(kernel, monkeypatch, server_args, page_size):
    """SGLang's real spec-v2 ``prepare_for_decode``: its launch is one of the warmed keys, for a
    slot tensor at either alignment (the allocator hands out its free list at any offset)."""
    from sglang.srt.speculative.spec_utils import warm_assign_req_to_token_pool

    server_args()
    served = set()
    for offset in (0, 1):
        batch, _ = spec_v2_decode_batch(page_size, monkeypatch)
        batch.token_to_kv_pool_allocator.alloc(offset)  # the next slots start one further on
        kernel.keys.clear()
        batch.spec_info.prepare_for_decode(batch)
        assert len(kernel.keys) == 1
        served |= set(kernel.keys)
    if page_size == 1:  # a slice of the free list: aligned or not, by where it starts
        assert {key[4][1] for key in served} == {True, False}
    kernel.keys.clear()
    warm_assign_req_to_token_pool(batch.req_to_token_pool.req_to_token, 3)
    assert served <= set(kernel.keys)


def test_init_overlap_warms_it_for_a_tree_only(kernel, monkeypatch):
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend
    from sglang.srt.speculative import spec_utils

    quiet_tree_warmups(monkeypatch)
    calls = []
    monkeypatch.setattr(spec_utils, "warm_assign_req_to_token_pool",
                        lambda req_to_token, max_bs: calls.append((req_to_token, max_bs)))
    fa3 = object.__new__(FlashAttentionBackend)
    fa3.num_splits = 0
    for topk, warmed in ((4, True), (1, False), (None, False)):
        calls.clear()
        s = overlap_init_scheduler(fa3, speculative_eagle_topk=topk, page_size=1)
        s.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: None)
        s.init_overlap()
        assert calls == ([(s.req_to_token_pool.req_to_token, s.max_running_requests)] if warmed else [])
