"""Back-port tree-kv-move-warmup: a spec-v2 tree compiles its accepted-KV move for every size first.

Runs SGLang's real ``MHATokenToKVPool.move_kv_cache`` (how it hands a move to the Triton
kernel: the chunking, ``num_locs_upper``), the real ``EAGLEWorkerV2.move_accepted_tokens_to_target_kvcache``
(as back-port 11 makes it) and the real ``Scheduler.init_overlap`` (as patched) on CPU. Only
the Triton kernels, which need a GPU, are replaced: by recorders of the specialization each
launch would compile (Triton compiles once per ``constexpr`` value, pointer dtype and integer
argument's divisibility by 16).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport, overlap_init_scheduler, quiet_tree_warmups

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


class MoveKernels:
    """Stands in for the two Triton kernels ``move_accepted_tokens_to_target_kvcache`` launches
    before the move (``assign_extend_cache_locs``, ``fill_accepted_out_cache_loc``): each launch
    records its compile key, the ``constexpr`` values and the pointer dtypes."""

    def __init__(self) -> None:
        self.keys: list[tuple] = []

    def assign(self, grid):
        def launch(req_pool_indices, req_to_token, start, end, out, pool_len, bs_upper):
            self.keys.append(("assign", pool_len, bs_upper, req_pool_indices.dtype, req_to_token.dtype,
                              start.dtype, end.dtype, out.dtype))
        return launch

    def fill(self, grid):
        def launch(accept_index, out_cache_loc, accepted_out_cache_loc, size_upper):
            self.keys.append(("fill", size_upper, accept_index.dtype, out_cache_loc.dtype,
                              accepted_out_cache_loc.dtype))
        return launch


class _Indexable:
    """``kernel[grid](...)`` for a launch function taking the grid."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn(grid)


STEPS, DRAFT_TOKENS = 5, 8  # SGLang's auto-chosen tree for Llama: 5 / 4 / 8


@pytest.fixture
def move_kernels(kernel, monkeypatch):
    from sglang.srt.speculative import eagle_worker_v2

    kernels = MoveKernels()
    monkeypatch.setattr(eagle_worker_v2, "assign_extend_cache_locs", _Indexable(kernels.assign))
    monkeypatch.setattr(eagle_worker_v2, "fill_accepted_out_cache_loc", _Indexable(kernels.fill))
    return kernels


def _tree_worker():
    """SGLang's ``EAGLEWorkerV2`` without ``__init__``: what its accepted-KV move reads."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    w = object.__new__(EAGLEWorkerV2)
    w.device, w.speculative_num_steps, w.speculative_num_draft_tokens = "cpu", STEPS, DRAFT_TOKENS
    w.req_to_token_pool = ReqToTokenPool(64, 512, "cpu", enable_memory_saver=False)
    pool = _pool()
    w.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: pool)
    return w


def _served_move(worker, bs: int, accepted: list[int]) -> None:
    """A tree's move after verify, as ``compact_accepted_tree_path`` calls it: the verify's
    dtypes (``accept_index`` and the accept lengths int32), requests in slots 1..bs."""
    width = STEPS + 1
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    for i, n in enumerate(accepted):
        accept_index[i, :n] = torch.arange(i * DRAFT_TOKENS, i * DRAFT_TOKENS + n, dtype=torch.int32)
    accept_lens = torch.tensor(accepted, dtype=torch.int32)
    batch = SimpleNamespace(req_pool_indices=torch.arange(1, bs + 1, dtype=torch.int64),
                            seq_lens=torch.full((bs,), 100, dtype=torch.int64),
                            out_cache_loc=torch.arange(bs * DRAFT_TOKENS, dtype=torch.int64))
    worker.move_accepted_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1)


def test_the_accepted_move_s_kernels_compile_for_every_batch_size_before_serving(move_kernels, kernel):
    from sglang.srt.speculative.eagle_worker_v2 import warm_accepted_kv_move

    worker = _tree_worker()
    sizes = warm_accepted_kv_move(worker, 48)
    warmed = set(move_kernels.keys)
    # the first batch size of each (next_power_of_2(bs), next_power_of_2(bs * 6)) pair
    assert sizes == [1, 2, 3, 5, 6, 9, 11, 17, 22, 33, 43]
    assert len(move_kernels.keys) == 2 * len(sizes)  # one run per class pair
    assert all(tgt == src and set(tgt) == {0} for tgt, src in kernel.slots)  # the padding slot only
    move_kernels.keys.clear()
    for bs in range(1, 49):  # every batch a server of 48 requests can verify
        _served_move(worker, bs, [(i % (STEPS + 1)) + 1 for i in range(bs)])
    assert set(move_kernels.keys) == warmed
    assert warm_accepted_kv_move(SimpleNamespace(), 48) == []  # a worker without the move


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
    from sglang.srt.speculative import eagle_worker_v2

    moved, workers = [], []
    real = memory_pool.warm_move_kv_cache
    quiet_tree_warmups(monkeypatch)
    monkeypatch.setattr(memory_pool, "warm_move_kv_cache", lambda pool: moved.append(pool) or real(pool))
    monkeypatch.setattr(eagle_worker_v2, "warm_accepted_kv_move",
                        lambda worker, max_bs: workers.append((worker, max_bs)))
    s = _scheduler(topk=4, page_size=16)
    assert [int(p.data_ptrs[0]) for p in moved] == [1, 0]  # the target's pool, then the draft's
    assert s.future_map is not None and len(set(kernel.keys)) == len(kernel.keys) // 2  # same classes twice
    assert workers == [(s.draft_worker, s.max_running_requests)]  # the move's kernels, up to the largest batch
    moved.clear()
    workers.clear()
    _scheduler(topk=4)  # page size 1: only the accepted path's move, on the target's pool
    assert [int(p.data_ptrs[0]) for p in moved] == [1] and len(workers) == 1
    for topk in (1, None):  # a chain moves no KV; a scheduler without the field is no tree
        moved.clear()
        workers.clear()
        _scheduler(topk=topk)
        assert moved == [] and workers == []
