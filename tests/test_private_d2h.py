"""The seq_lens mirror copied on a private stream: order of operations and rows picked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport


class RecordingStream(torch.cpu.Stream):
    """A CPU stream that logs what the relay asks of it (CUDA streams cannot run here)."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def wait_event(self, event) -> None:
        self.log.append(("wait_event", event))

    def synchronize(self) -> None:
        self.log.append(("synchronize",))


@pytest.fixture
def fmap(clean_state):
    from sglang.srt import server_args as sa
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    activate_backport()
    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(
        SimpleNamespace(speculative_algorithm="EAGLE", enable_multi_layer_eagle=False))
    m = FutureMap(8, 0, 64, torch.device("cpu"), SpeculativeAlgorithm.from_string("EAGLE"))
    m.init_spec_relay(SimpleNamespace(req_to_token=torch.zeros((8, 4))),
                      torch.get_device_module("cpu").Stream())
    yield m
    sa._global_server_args = previous


def _batch(slots: list[int]):
    from sglang.srt.managers.overlap_utils import FutureIndices

    return SimpleNamespace(
        spec_info=SimpleNamespace(future_indices=FutureIndices(indices=torch.tensor(slots))),
        reqs=[SimpleNamespace(req_pool_idx=s) for s in slots],
        seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)


def test_without_cuda_the_plain_copy_is_used(fmap):
    assert fmap.seq_lens_d2h_stream is None and fmap.new_seq_lens_cpu_pinned is None
    fmap.publish(torch.tensor([3, 6]), torch.tensor([30, 60]))
    batch = _batch([6, 3])
    fmap.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu.tolist() == [60, 30] and batch.seq_lens_sum == 90


def test_private_stream_waits_for_the_publish_only_then_picks_the_batch_rows(fmap, monkeypatch):
    log: list = []
    fmap.seq_lens_d2h_stream = RecordingStream(log)
    fmap.new_seq_lens_cpu_pinned = torch.full((8,), -1, dtype=torch.int64)
    real_copy = torch.Tensor.copy_

    def logged_copy(self, src, non_blocking=False):
        if self is fmap.new_seq_lens_cpu_pinned:
            log.append(("copy", non_blocking, torch.get_device_module("cpu").current_stream()))
        return real_copy(self, src, non_blocking=non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", logged_copy)
    fmap.publish(torch.tensor([2, 5, 7]), torch.tensor([20, 50, 70]))
    batch = _batch([7, 2])
    fmap.resolve_seq_lens_cpu(batch)

    assert [entry[0] for entry in log] == ["wait_event", "copy", "synchronize"]
    assert log[0][1] is fmap.publish_ready
    assert log[1][1] is True and log[1][2] is fmap.seq_lens_d2h_stream
    assert batch.seq_lens_cpu.tolist() == [70, 20] and batch.seq_lens_sum == 90
    assert batch.seq_lens.tolist() == [70, 20]
    # the host copy is taken from the whole buffer; the batch gets its own tensor
    assert batch.seq_lens_cpu.data_ptr() != fmap.new_seq_lens_cpu_pinned.data_ptr()


def test_before_the_first_publish_the_plain_copy_is_used(fmap):
    log: list = []
    fmap.seq_lens_d2h_stream = RecordingStream(log)
    fmap.new_seq_lens_cpu_pinned = torch.zeros((8,), dtype=torch.int64)
    batch = _batch([1])
    fmap.resolve_seq_lens_cpu(batch)
    assert log == [] and batch.seq_lens_cpu.tolist() == [0]


def test_no_mirror_means_no_copy_at_all(fmap):
    log: list = []
    fmap.needs_cpu_seq_lens = False
    fmap.seq_lens_d2h_stream = RecordingStream(log)
    fmap.publish(torch.tensor([4]), torch.tensor([44]))
    batch = _batch([4])
    fmap.resolve_seq_lens_cpu(batch)
    assert log == [] and batch.seq_lens_cpu is None and batch.seq_lens_sum is None
    assert batch.seq_lens.tolist() == [44]
