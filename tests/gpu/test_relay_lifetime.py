"""GPU regression test: the relay's index tensor must outlive its last host reference.

``FutureMap.resolve_future`` gathers the stashed draft state on the forward stream with an
index tensor that the schedule stream made (``filter_batch``/``merge_batch`` build a new one
every time the batch changes). Right after the launch nothing on the host holds that tensor
any more, so unless it is marked with ``record_stream`` for the forward stream, PyTorch's
caching allocator gives its block to the next tensor made on the schedule stream, which may
be written before a busy forward stream has run the gather. The gather then reads the wrong
slots: wrong bonus tokens, or (out-of-range slots) a device-side assert in the draft model's
embedding. That is the intermittent failure the e2e suite once saw on the mirror-free Triton
path, where the host never waits for the forward.

The test makes the forward stream lag on purpose (``torch.cuda._sleep``), drops every host
reference to the index tensor, refills the schedule stream's small blocks with another slot
number, and checks the gathered values. A control run with ``record_stream`` turned into a
no-op must show the corruption, so the test is known to detect what it guards against.

Runs on any CUDA GPU with SGLang and this package importable (no engine, a few seconds):
``python -m pytest tests/gpu/test_relay_lifetime.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from test_gpu_smoke import gpu_skip_reason

SLOTS = 64
WANTED = [3, 5, 7]
DECOY_SLOT = 1
TRIALS = 8


_REASON = gpu_skip_reason("the race needs two CUDA streams", installed_plugin=False)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.fixture
def relay():
    import torch

    import sglang_futuremap_patch as plugin
    from sglang.srt import server_args as sa
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    plugin.revert()
    report = plugin.apply(mode="strict")
    assert report.applied, report
    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(
        SimpleNamespace(speculative_algorithm="EAGLE", enable_multi_layer_eagle=False))
    device = torch.device("cuda")
    fmap = FutureMap(SLOTS, 0, 64, device, SpeculativeAlgorithm.from_string("EAGLE"))
    forward_stream = torch.cuda.Stream()
    fmap.init_spec_relay(SimpleNamespace(req_to_token=torch.zeros((SLOTS, 8), device=device)),
                         forward_stream)
    slots = torch.arange(1, SLOTS, device=device)
    with torch.cuda.stream(forward_stream):
        fmap.stash(slots, _draft(slots))
    torch.cuda.synchronize()
    yield fmap, forward_stream
    torch.cuda.synchronize()
    sa._global_server_args = previous
    plugin.revert()


def _draft(rows):
    import torch

    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return EagleDraftInput(topk_p=rows[:, None].float(), topk_index=rows[:, None],
                           hidden_states=rows[:, None].float().repeat(1, 4),
                           bonus_tokens=rows.to(torch.int32) + 1000)


def _gathered_bonus_tokens(fmap, forward_stream) -> list[list[int]]:
    """One resolve per trial under a lagging forward stream; the bonus tokens each read."""
    import torch

    from sglang.srt.managers.overlap_utils import FutureIndices

    seen = []
    for _ in range(TRIALS):
        indices = torch.tensor(WANTED, dtype=torch.int64, device="cuda")  # schedule stream
        worker_batch = SimpleNamespace(spec_info=_draft(torch.zeros(len(WANTED), dtype=torch.int64,
                                                                    device="cuda")))
        worker_batch.spec_info.future_indices = FutureIndices(indices=indices)
        forward_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(forward_stream):
            torch.cuda._sleep(50_000_000)  # a forward still busy with the previous batch
            fmap.resolve_future(worker_batch)
        # The scheduler drops its references (batch.spec_info and the worker batch's
        # spec_info are replaced), then builds the next batch on the schedule stream.
        out = worker_batch.spec_info.bonus_tokens
        worker_batch.spec_info.future_indices = None
        del indices
        decoys = [torch.full((len(WANTED),), DECOY_SLOT, dtype=torch.int64, device="cuda")
                  for _ in range(256)]
        torch.cuda.synchronize()
        seen.append([int(x) for x in out.tolist()])
        del decoys
    return seen


def test_resolve_future_reads_the_slots_it_was_given(relay):
    fmap, forward_stream = relay
    expected = [1000 + s for s in WANTED]
    seen = _gathered_bonus_tokens(fmap, forward_stream)
    assert all(row == expected for row in seen), seen


def test_control_without_record_stream_the_gather_reads_reused_memory(relay, monkeypatch):
    """Proves the test above can fail: with ``record_stream`` a no-op the race shows."""
    import torch

    fmap, forward_stream = relay
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    seen = _gathered_bonus_tokens(fmap, forward_stream)
    assert any(row == [1000 + DECOY_SLOT] * len(WANTED) for row in seen), seen
