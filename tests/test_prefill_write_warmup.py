"""Back-port prefill-write-warmup: a spec-v2 tree compiles its prefill's req-to-token write first.

Runs SGLang's real ``write_cache_indices`` (as patched), the real prefill preparation
(``ScheduleBatch.prepare_for_extend`` -> ``alloc_for_extend``, on SGLang's token allocator)
and the real ``Scheduler.init_overlap`` on CPU. Only the Triton kernel
``write_req_to_token_pool_triton``, which needs a GPU, is replaced: by a recorder of the
specialization each launch would compile (Triton compiles once per ``constexpr`` value,
pointer dtype and pointer alignment to 16 bytes) and of the lengths it would write.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport, overlap_init_scheduler, quiet_tree_warmups
from sim_support import make_pools, spec_v2_decode_batch


class WriteKernel:
    """Stands in for ``write_req_to_token_pool_triton``: ``kernel[grid](...)`` records the
    launch's compile key and, per request, the prefix and sequence lengths it would write."""

    def __init__(self) -> None:
        self.keys: list[tuple] = []
        self.lens: list[list[tuple[int, int]]] = []

    def __getitem__(self, grid):
        def launch(req_to_token, req_pool_indices, prefix_pointers, pre_lens, seq_lens, extend_lens,
                   out_cache_loc, stride):
            pointers = (req_to_token, req_pool_indices, prefix_pointers, pre_lens, seq_lens, extend_lens,
                        out_cache_loc)
            self.keys.append(tuple((t.dtype, t.data_ptr() % 16 == 0) for t in pointers) + (stride,))
            self.lens.append(list(zip(pre_lens.tolist(), seq_lens.tolist())))

        return launch


@pytest.fixture
def kernel(clean_state, monkeypatch):
    from sglang.srt.mem_cache import common

    activate_backport()
    recorder = WriteKernel()
    monkeypatch.setattr(common, "write_req_to_token_pool_triton", recorder)
    return recorder


def test_the_warm_up_runs_both_alignments_and_writes_nothing(kernel, server_args):
    from sglang.srt.mem_cache.common import warm_write_cache_indices

    server_args(attention_backend="triton")  # the Triton write, as on every GPU backend
    pool, _, _ = make_pools(4, 96, kv_tokens=64)
    before = pool.req_to_token.clone()
    assert warm_write_cache_indices(pool) == [True, False]
    assert len(set(kernel.keys)) == len(kernel.keys) == 2
    assert {key[6][1] for key in kernel.keys} == {True, False}  # the slot tensor, both ways
    assert all(key[:6] == kernel.keys[0][:6] for key in kernel.keys)  # every other pointer aligned
    assert kernel.lens == [[(0, 0)], [(0, 0)]]  # an empty prefix and sequence: no store
    assert torch.equal(pool.req_to_token, before)


def test_a_served_prefill_compiles_nothing_the_warm_up_did_not(kernel, monkeypatch, server_args):
    """SGLang's real prefill preparation: its write is one of the warmed keys, whichever offset
    of the allocator's free list its slots start at (page size 1: a slice of that list)."""
    from sglang.srt.mem_cache.common import warm_write_cache_indices

    server_args(attention_backend="triton")
    served = set()
    for taken in (0, 1):
        kernel.keys.clear()
        batch, _ = spec_v2_decode_batch(1, monkeypatch, taken=taken)
        assert len(kernel.keys) == 1
        served |= set(kernel.keys)
    assert {key[6][1] for key in served} == {True, False}
    kernel.keys.clear()
    warm_write_cache_indices(batch.req_to_token_pool)
    assert served <= set(kernel.keys)


def test_init_overlap_warms_it_for_a_tree_only(kernel, monkeypatch):
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend
    from sglang.srt.mem_cache import common

    quiet_tree_warmups(monkeypatch)
    calls = []
    monkeypatch.setattr(common, "warm_write_cache_indices", calls.append)
    fa3 = object.__new__(FlashAttentionBackend)
    fa3.num_splits = 0
    for topk, warmed in ((4, True), (1, False), (None, False)):
        calls.clear()
        s = overlap_init_scheduler(fa3, speculative_eagle_topk=topk, page_size=1)
        s.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: None)
        s.init_overlap()
        assert calls == ([s.req_to_token_pool] if warmed else [])
