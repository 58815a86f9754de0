"""Back-port tree-kv-move-warmup: a spec-v2 tree compiles its accepted-KV move for every size first.

Runs SGLang's real ``MHATokenToKVPool.move_kv_cache`` (how it hands a move to the Triton
kernel: the chunking, ``num_locs_upper``) and the real ``Scheduler.init_overlap`` (as patched)
on CPU. Only the Triton kernel itself, which needs a GPU, is replaced: by a recorder of the
specialization each launch would compile (Triton compiles once per ``constexpr`` value and
per integer argument's divisibility by 16).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport, overlap_init_scheduler

CHUNK = 128  # the pool's num_locs_upper for an 8B-shaped target (512-byte tiles)


class KernelRecorder:
    """Stands in for ``copy_all_layer_kv_cache_tiled``: ``kernel[grid](...)`` records the
    launch's compile key and the slots it moves."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, str, int]] = []
        self.slots: list[tuple[list[int], list[int]]] = []

    def __getitem__(self, grid):
        def launch(data_ptrs, strides, tgt, src, num_locs, num_locs_upper, BYTES_PER_TILE, **_):
            spec = "1" if num_locs == 1 else ("D" if num_locs % 16 == 0 else "")
            self.keys.append((num_locs_upper, spec, BYTES_PER_TILE))
            self.slots.append((tgt.tolist(), src.tolist()))

        return launch


@pytest.fixture
def kernel(clean_state, monkeypatch):
    from sglang.srt.mem_cache import memory_pool

    activate_backport()
    recorder = KernelRecorder()
    monkeypatch.setattr(memory_pool, "copy_all_layer_kv_cache_tiled", recorder)
    return recorder


def _pool(chunk: int = CHUNK):
    """SGLang's KV pool with the copy configuration its ``_init_kv_copy_and_warmup`` sets
    (that method launches the kernel, so it is set here by hand)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = object.__new__(MHATokenToKVPool)
    pool.data_ptrs = torch.zeros(4, dtype=torch.int64)
    pool.data_strides = torch.full((4,), 1024, dtype=torch.int64)
    pool._kv_copy_config = {"bytes_per_tile": 512, "byte_tiles": 2, "num_warps": 8, "num_locs_upper": chunk}
    return pool


@pytest.mark.parametrize("chunk", [CHUNK, 256])
def test_the_warm_up_compiles_every_size_class_a_served_move_can_meet(kernel, chunk):
    from sglang.srt.mem_cache.memory_pool import warm_move_kv_cache

    pool = _pool(chunk)
    counts = warm_move_kv_cache(pool)
    warmed = set(kernel.keys)
    assert counts[:6] == [1, 2, 3, 5, 9, 16] and counts[-2:] == [chunk // 2 + 1, chunk]
    assert len(warmed) == len(counts) == len(kernel.keys)  # one move per class, none twice
    assert all(tgt == src and set(tgt) == {0} for tgt, src in kernel.slots)  # the padding slot
    kernel.keys.clear()
    for rows in range(1, 4 * chunk + 1):  # every move a tree's compaction can ask for
        loc = torch.arange(rows, dtype=torch.int64)
        pool.move_kv_cache(loc, loc)
    assert set(kernel.keys) <= warmed
    assert set(kernel.keys) == warmed - {(1, "1", 512)} | ({(1, "1", 512)} & set(kernel.keys))


def test_a_pool_without_the_triton_copy_is_left_alone(kernel):
    from sglang.srt.mem_cache.memory_pool import warm_move_kv_cache

    pool = _pool()
    pool._kv_copy_config = None  # enable_kv_cache_copy=False
    assert warm_move_kv_cache(pool) == [] and kernel.keys == []


def _scheduler(topk, page_size: int = 1):
    """A ``Scheduler`` without ``__init__``, set up by the real (patched) ``init_overlap``; its
    target and draft KV pools are ``_pool()`` each (the target's ``data_ptrs`` are 1s)."""
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    fa3 = object.__new__(FlashAttentionBackend)
    fa3.num_splits = 0
    target_pool, draft_pool = _pool(), _pool()
    target_pool.data_ptrs = torch.ones(4, dtype=torch.int64)  # tell the two apart
    s = overlap_init_scheduler(fa3, draft_runner=SimpleNamespace(token_to_kv_pool=draft_pool),
                               speculative_eagle_topk=topk, page_size=page_size)
    s.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: target_pool)
    s.init_overlap()
    return s


def test_init_overlap_warms_the_target_and_draft_pools_of_a_tree_only(kernel, monkeypatch):
    from sglang.srt.mem_cache import memory_pool

    moved = []
    real = memory_pool.warm_move_kv_cache
    monkeypatch.setattr(memory_pool, "warm_move_kv_cache", lambda pool: moved.append(pool) or real(pool))
    s = _scheduler(topk=4, page_size=16)
    assert [int(p.data_ptrs[0]) for p in moved] == [1, 0]  # the target's pool, then the draft's
    assert s.future_map is not None and len(set(kernel.keys)) == len(kernel.keys) // 2  # same classes twice
    moved.clear()
    _scheduler(topk=4)  # page size 1: only the accepted path's move, on the target's pool
    assert [int(p.data_ptrs[0]) for p in moved] == [1]
    for topk in (1, None):  # a chain moves no KV; a scheduler without the field is no tree
        moved.clear()
        _scheduler(topk=topk)
        assert moved == []
