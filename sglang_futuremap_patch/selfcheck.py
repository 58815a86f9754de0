"""A CPU self-check of the patched FutureMap, run by ``sglang-futuremap-patch verify``.

It drives SGLang's own (patched) ``FutureMap`` and ``EagleDraftInput`` on CPU tensors through
the relay's life cycle -- prefill publish and stash, decode, requests finishing (filter) and
joining (merge) -- and checks every value read back. Each check returns a line for the CLI;
a failure raises ``AssertionError`` naming what differed.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch


def _server_args_for(algorithm: str, topk: int) -> SimpleNamespace:
    # spec_need_hidden_states() reads the first two fields; the relay's tree default
    # (FutureMap.relays_host_lens) reads the draft's topk.
    return SimpleNamespace(speculative_algorithm=algorithm, enable_multi_layer_eagle=False,
                           speculative_eagle_topk=topk)


def run(algorithm: str = "EAGLE3", pool_size: int = 16, topk: int = 2, hidden: int = 8) -> list[str]:
    """Round-trip publish -> stash -> resolve across filter/merge; returns what was checked."""
    from sglang.srt import server_args as sa
    from sglang.srt.managers.overlap_utils import FutureIndices, FutureMap
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if not hasattr(FutureMap, "publish"):
        raise AssertionError("FutureMap has no publish(): the back-port is not applied")
    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(_server_args_for(algorithm, topk))
    try:
        return _round_trips(FutureMap, FutureIndices, EagleDraftInput,
                            SpeculativeAlgorithm.from_string(algorithm), pool_size, topk, hidden)
    finally:
        sa._global_server_args = previous


def _draft_input(cls, rows: torch.Tensor, topk: int, hidden: int):
    """A draft payload whose every value encodes its request slot, so mix-ups show."""
    r = rows.to(torch.float32)
    return cls(
        topk_p=r[:, None].repeat(1, topk) / 100,
        topk_index=rows[:, None].repeat(1, topk) * 10,
        hidden_states=r[:, None].repeat(1, hidden),
        bonus_tokens=(rows * 7).to(torch.int32),
        new_seq_lens=rows * 3 + 5,
    )


def _round_trips(FutureMap, FutureIndices, EagleDraftInput, algo, pool_size, topk, hidden):
    checks: list[str] = []
    fmap = FutureMap(pool_size, 0, 64, torch.device("cpu"), algo)
    pool = SimpleNamespace(req_to_token=torch.zeros((pool_size, 64), dtype=torch.int32))
    fmap.init_spec_relay(pool, torch.get_device_module("cpu").current_stream())

    # Prefill of requests in pool slots 3, 5, 9: publish the lengths, stash the draft state.
    slots = torch.tensor([3, 5, 9])
    payload = _draft_input(EagleDraftInput, slots, topk, hidden)
    fmap.publish(slots, payload.new_seq_lens)
    fmap.stash(slots, payload)
    assert fmap.publish_ready is not None, "publish() recorded no publish_ready event"
    checks.append("publish records publish_ready; stash sizes its buffers from the payload")

    batch = SimpleNamespace(spec_info=EagleDraftInput(future_indices=FutureIndices(indices=slots)),
                            seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)
    fmap.resolve_seq_lens_cpu(batch)
    _expect(batch.seq_lens, slots * 3 + 5, "resolved seq_lens")
    _expect(batch.seq_lens_cpu, slots * 3 + 5, "resolved seq_lens_cpu")
    assert batch.seq_lens_sum == int((slots * 3 + 5).sum()), "resolved seq_lens_sum"
    checks.append("resolve_seq_lens_cpu returns the published lengths, mirror and sum")

    # Request in slot 5 finishes: the scheduler filters rows [0, 2].
    batch.spec_info.filter_batch(new_indices=torch.tensor([0, 2]), has_been_filtered=False)
    # A new request (slot 12) joins after its own prefill: merge.
    joined = torch.tensor([12])
    fmap.publish(joined, joined * 3 + 5)
    fmap.stash(joined, _draft_input(EagleDraftInput, joined, topk, hidden))
    batch.spec_info.merge_batch(EagleDraftInput(future_indices=FutureIndices(indices=joined)))
    expected_slots = torch.tensor([3, 9, 12])
    _expect(batch.spec_info.future_indices.indices, expected_slots, "indices after filter+merge")

    worker_batch = SimpleNamespace(spec_info=batch.spec_info)
    fmap.resolve_future(worker_batch)
    relayed = _draft_input(EagleDraftInput, expected_slots, topk, hidden)
    from sglang.srt.speculative.spec_utils import spec_need_hidden_states

    relays_hidden = spec_need_hidden_states()
    names = ("topk_p", "topk_index", "bonus_tokens") + (("hidden_states",) if relays_hidden else ())
    for name in names:
        _expect(getattr(worker_batch.spec_info, name), getattr(relayed, name), f"stashed {name}")
    if not relays_hidden:
        assert worker_batch.spec_info.hidden_states is None, "hidden states relayed for a draft without them"
    checks.append(f"resolve_future reads back what stash wrote ({', '.join(names)}), across filter and merge")

    # Decode: the forward publishes new lengths for the surviving rows; resolve sees them.
    fmap.publish(expected_slots, expected_slots + 100)
    fmap.resolve_seq_lens_cpu(batch)
    _expect(batch.seq_lens_cpu, expected_slots + 100, "seq_lens after a decode publish")
    checks.append("a later publish supersedes the earlier one for the same slots")

    # An idle DP rank publishes and stashes nothing (and must not fail).
    empty = torch.empty((0,), dtype=torch.int64)
    fmap.publish(empty, empty)
    fmap.stash(empty, EagleDraftInput.create_idle_input(
        device="cpu", hidden_size=hidden, dtype=torch.float32, topk=topk,
        capture_hidden_mode=None))
    checks.append("an idle rank's empty publish/stash is a no-op")
    return checks


def _expect(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got is None or got.shape != want.shape or not torch.equal(got.to(want.dtype), want):
        raise AssertionError(f"{what}: got {got}, expected {want}")
