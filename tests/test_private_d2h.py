"""The seq_lens mirror copied on a private stream: order of operations and rows picked."""

from __future__ import annotations

import pytest
import torch

from conftest import relay_batch


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
def fmap(spec_future_map):
    return spec_future_map()




def test_without_cuda_the_plain_copy_is_used(fmap):
    assert fmap.seq_lens_d2h_stream is None and fmap.new_seq_lens_cpu_pinned is None
    fmap.publish(torch.tensor([3, 6]), torch.tensor([30, 60]))
    batch = relay_batch([6, 3])
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
    batch = relay_batch([7, 2])
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
    batch = relay_batch([1])
    fmap.resolve_seq_lens_cpu(batch)
    assert log == [] and batch.seq_lens_cpu.tolist() == [0]


def test_no_mirror_means_no_copy_at_all(fmap):
    log: list = []
    fmap.needs_cpu_seq_lens = False
    fmap.seq_lens_d2h_stream = RecordingStream(log)
    fmap.publish(torch.tensor([4]), torch.tensor([44]))
    batch = relay_batch([4])
    fmap.resolve_seq_lens_cpu(batch)
    assert log == [] and batch.seq_lens_cpu is None and batch.seq_lens_sum is None
    assert batch.seq_lens.tolist() == [44]


def test_a_released_request_keeps_its_row_through_the_batch_indices(fmap):
    """A request freed after its batch was built (its result processed before this launch:
    SGLang's grammar sync on spec v2, back-port 16) has ``req_pool_idx`` None but is still a row:
    the rows come from the batch's own indices then, and stay exact."""
    log: list = []
    fmap.seq_lens_d2h_stream = RecordingStream(log)
    fmap.new_seq_lens_cpu_pinned = torch.full((8,), -1, dtype=torch.int64)
    fmap.publish(torch.tensor([2, 5, 7]), torch.tensor([20, 50, 70]))
    batch = relay_batch([7, 2, 5])
    batch.req_pool_indices = torch.tensor([7, 2, 5])
    batch.reqs[1].req_pool_idx = None  # released
    fmap.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu.tolist() == [70, 20, 50] and batch.seq_lens_sum == 140
    assert fmap.batch_pool_slots(batch).tolist() == [7, 2, 5]
    # Otherwise the requests say it, and the device indices are not read.
    batch.reqs[1].req_pool_idx = 2
    batch.req_pool_indices = None
    assert fmap.batch_pool_slots(batch).tolist() == [7, 2, 5]
