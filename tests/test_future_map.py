"""FutureMap pieces the simulation does not reach: the PD-decode bootstrap and idle ranks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch



@pytest.fixture
def fmap(spec_future_map):
    return spec_future_map()


def _draft(rows):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return EagleDraftInput(topk_p=rows[:, None].float(), topk_index=rows[:, None] * 2,
                           hidden_states=rows[:, None].float().repeat(1, 3),
                           bonus_tokens=rows.to(torch.int32) + 40)


def test_relay_is_sized_by_the_request_pool_and_slot_0_is_never_written(fmap):
    assert fmap.new_seq_lens_buf.shape == (8,)
    fmap.publish(torch.tensor([1, 7]), torch.tensor([11, 17]))
    assert fmap.new_seq_lens_buf.tolist() == [0, 11, 0, 0, 0, 0, 0, 17]


def test_seed_prebuilt_publishes_and_stashes_on_the_forward_stream(fmap, monkeypatch):
    from sglang.srt.managers.overlap_utils import FutureIndices

    seen_streams = []
    real_publish = type(fmap).publish

    def spy(self, indices, lens):
        seen_streams.append(torch.get_device_module("cpu").current_stream())
        real_publish(self, indices, lens)

    monkeypatch.setattr(type(fmap), "publish", spy)
    rows = torch.tensor([2, 5])
    fmap.seed_prebuilt(rows, torch.tensor([30, 50]), _draft(rows))
    assert seen_streams == [fmap.forward_stream]
    assert fmap.publish_count == 1 and fmap.publish_ready is not None

    batch = SimpleNamespace(spec_info=SimpleNamespace(future_indices=FutureIndices(indices=rows)),
                            seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)
    fmap.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu.tolist() == [30, 50] and batch.seq_lens_sum == 80
    worker_batch = SimpleNamespace(spec_info=_draft(torch.tensor([0, 0])))
    worker_batch.spec_info.future_indices = FutureIndices(indices=rows)
    fmap.resolve_future(worker_batch)
    assert worker_batch.spec_info.bonus_tokens.tolist() == [42, 45]
    assert worker_batch.spec_info.hidden_states.tolist() == [[2.0] * 3, [5.0] * 3]


def test_prefill_batch_without_relay_is_left_alone(fmap):
    batch = SimpleNamespace(spec_info=None, seq_lens=torch.tensor([3]), seq_lens_cpu=None,
                            seq_lens_sum=3)
    fmap.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [3] and batch.seq_lens_sum == 3
    worker_batch = SimpleNamespace(spec_info=None)
    fmap.resolve_future(worker_batch)
    assert worker_batch.spec_info is None


def test_resolve_waits_on_the_stream_not_the_host(fmap, monkeypatch):
    events = []
    fmap.publish(torch.tensor([1]), torch.tensor([9]))
    ev = fmap.publish_ready
    monkeypatch.setattr(type(ev), "wait", lambda self, stream=None: events.append("wait"))
    monkeypatch.setattr(type(ev), "synchronize", lambda self: events.append("synchronize"))
    from sglang.srt.managers.overlap_utils import FutureIndices

    batch = SimpleNamespace(spec_info=SimpleNamespace(future_indices=FutureIndices(torch.tensor([1]))))
    fmap.resolve_seq_lens_cpu(batch)
    assert events == ["wait"]
