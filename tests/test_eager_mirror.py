"""Back-port eager-mirror: a spec-v2 batch above the captured CUDA-graph sizes gets the host mirror.

Runs SGLang's real ``FutureMap`` and ``Scheduler.init_overlap`` (as patched) on CPU; the FA3
backend is SGLang's class with only the attributes its properties read (it cannot be built
without a GPU).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport, overlap_init_scheduler, relay_batch


def _fa3(num_splits: int):
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    backend = object.__new__(FlashAttentionBackend)
    backend.num_splits = num_splits
    return backend


@pytest.fixture
def fmap(spec_future_map):
    return spec_future_map(needs_cpu_seq_lens=False)




def test_a_batch_above_the_graph_sizes_gets_the_mirror_the_others_do_not(fmap):
    assert fmap.eager_mirror_above_bs is None  # nothing captured known yet: no batch gets it
    fmap.publish(torch.tensor([1, 2, 3]), torch.tensor([10, 20, 30]))
    big = relay_batch([3, 1, 2])
    fmap.resolve_seq_lens_cpu(big)
    assert big.seq_lens_cpu is None

    fmap.eager_mirror_above_bs = 2
    big, small = relay_batch([3, 1, 2]), relay_batch([2, 1])
    fmap.resolve_seq_lens_cpu(big)
    fmap.resolve_seq_lens_cpu(small)
    assert big.seq_lens_cpu.tolist() == [30, 10, 20] and big.seq_lens_sum == 60  # eager: exact host lengths
    assert big.seq_lens.tolist() == [30, 10, 20]
    assert small.seq_lens_cpu is None and small.seq_lens_sum is None  # a graph replays it: no copy
    assert small.seq_lens.tolist() == [20, 10]
    assert fmap.needs_cpu_seq_lens is False  # the map itself stays without the mirror


def test_the_bound_is_the_smallest_captured_batch_when_an_eager_forward_reads_host_lengths(clean_state):
    activate_backport()
    from sglang.srt.managers.overlap_utils import eager_mirror_above_bs

    target = SimpleNamespace(graph_runner=SimpleNamespace(max_bs=8))
    draft = SimpleNamespace(cuda_graph_runner=SimpleNamespace(max_bs=4))
    assert eager_mirror_above_bs(target, draft, (_fa3(0), None)) == 4
    assert eager_mirror_above_bs(target, None, (_fa3(0),)) == 8
    # num_splits pinned to 1: FA3's eager forward is exact with the static bound
    assert eager_mirror_above_bs(target, draft, (_fa3(1),)) is None
    # a backend that never reads host lengths (Triton declares nothing)
    assert eager_mirror_above_bs(target, draft, (SimpleNamespace(),)) is None
    # CUDA graph off: nothing captured, the mirror question is decided elsewhere
    assert eager_mirror_above_bs(SimpleNamespace(graph_runner=None), None, (_fa3(0),)) is None


def _scheduler(fa3_backend, target_max_bs: int, draft_max_bs: int):
    """A ``Scheduler`` without ``__init__``, set up by the real (patched) ``init_overlap``."""
    s = overlap_init_scheduler(fa3_backend, target_graph=SimpleNamespace(max_bs=target_max_bs),
                               draft_graph=SimpleNamespace(max_bs=draft_max_bs))
    s.init_overlap()
    return s


def test_init_overlap_tells_the_future_map_which_batches_run_eagerly(clean_state, monkeypatch):
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    activate_backport()
    # FA3 after back-port 8: no mirror for graph-replayed batches
    monkeypatch.setattr(FlashAttentionBackend, "needs_cpu_seq_lens", property(lambda self: False), raising=False)
    s = _scheduler(_fa3(0), target_max_bs=24, draft_max_bs=16)
    assert s.future_map.needs_cpu_seq_lens is False
    assert s.future_map.eager_mirror_above_bs == 16
    assert _scheduler(_fa3(1), 24, 16).future_map.eager_mirror_above_bs is None
    # a backend that needs the mirror everywhere: every batch has it already, no bound
    monkeypatch.setattr(FlashAttentionBackend, "needs_cpu_seq_lens", property(lambda self: True), raising=False)
    s = _scheduler(_fa3(0), 24, 16)
    assert s.future_map.needs_cpu_seq_lens is True and s.future_map.eager_mirror_above_bs is None
