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


@pytest.mark.parametrize("overlap", [True, False])
def test_process_prebuilt_seeds_the_relay_by_pool_slot(clean_state, monkeypatch, overlap):
    """A PD-decode batch whose prefill ran elsewhere (``process_prebuilt``) enters the relay
    at its requests' pool slots through ``seed_prebuilt``; without the overlap scheduler it
    gets no future indices, as before."""
    from conftest import activate_backport
    from sglang.srt.disaggregation import decode_schedule_batch_mixin as mixin
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    activate_backport()
    monkeypatch.setattr(mixin, "maybe_cache_unfinished_req", lambda req, tree_cache: None)
    reqs = [SimpleNamespace(output_ids=[5, 40 + i], grammar=None, output_topk_p=[0.5],
                            output_topk_index=[7 + i], hidden_states_tensor=torch.ones(3) * i)
            for i in range(2)]
    batch = SimpleNamespace(
        reqs=reqs, tree_cache=None, device="cpu", forward_mode=ForwardMode.EXTEND,
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"), enable_overlap=overlap,
        extend_lens=[2, 3], input_ids=torch.arange(5), seq_lens=torch.tensor([2, 3]),
        req_pool_indices=torch.tensor([6, 3]))
    seeded = []
    future_map = SimpleNamespace(seed_prebuilt=lambda *args: seeded.append(args))
    server_args = SimpleNamespace(speculative_eagle_topk=1, enable_multi_layer_eagle=False)
    mixin.ScheduleBatchDisaggregationDecodeMixin.process_prebuilt(batch, server_args, future_map)

    spec_info = batch.spec_info
    assert spec_info.bonus_tokens.tolist() == [40, 41]
    assert batch.input_ids.tolist() == [1, 40, 3, 4, 41]  # SGLang's own prepare_for_extend
    if overlap:
        assert spec_info.future_indices.indices is batch.req_pool_indices
        ((indices, seq_lens, seeded_info),) = seeded
        assert indices is batch.req_pool_indices and seq_lens is batch.seq_lens
        assert seeded_info is spec_info
    else:
        assert spec_info.future_indices is None and seeded == []


# --------------------------------------------------------------------------- callers


def test_pd_decode_prebuilt_batch_seeds_the_relay_at_its_pool_slots(fmap):
    """``process_prebuilt`` (PD decode: the prefill ran on another server) hands the relay
    the request-pool slots, the lengths and the draft state it built from the requests."""
    from sglang.srt.disaggregation.decode_schedule_batch_mixin import (
        ScheduleBatchDisaggregationDecodeMixin,
    )
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    slots = torch.tensor([6, 3])
    reqs = [SimpleNamespace(output_ids=[100 + s], grammar=None,
                            skip_radix_cache_insert=True,  # no prefix cache in this test
                            output_topk_p=[0.5 + s], output_topk_index=[10 * s],
                            hidden_states_tensor=torch.full((3,), float(s)))
            for s in slots.tolist()]
    batch = SimpleNamespace(
        reqs=reqs, tree_cache=None, device="cpu", enable_overlap=True,
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"),
        forward_mode=ForwardMode.EXTEND, extend_lens=[2, 3],
        input_ids=torch.arange(5), seq_lens=torch.tensor([21, 32]), req_pool_indices=slots)
    server_args = SimpleNamespace(speculative_eagle_topk=1, enable_multi_layer_eagle=False,
                                  speculative_num_steps=3)
    ScheduleBatchDisaggregationDecodeMixin.process_prebuilt(batch, server_args, fmap)

    assert torch.equal(batch.spec_info.future_indices.indices, slots)
    decode = SimpleNamespace(spec_info=SimpleNamespace(future_indices=batch.spec_info.future_indices),
                             seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)
    fmap.resolve_seq_lens_cpu(decode)
    assert decode.seq_lens.tolist() == [21, 32] and decode.seq_lens_sum == 53
    worker_batch = SimpleNamespace(spec_info=_draft(torch.tensor([0, 0])))
    worker_batch.spec_info.future_indices = batch.spec_info.future_indices
    fmap.resolve_future(worker_batch)
    assert worker_batch.spec_info.bonus_tokens.tolist() == [106, 103]
    assert worker_batch.spec_info.topk_index.tolist() == [[60], [30]]
    assert worker_batch.spec_info.hidden_states.tolist() == [[6.0] * 3, [3.0] * 3]


def test_run_batch_relays_a_spec_v2_prefill_through_its_pool_slots(clean_state):
    """SGLang's ``Scheduler`` (``init_overlap`` and ``run_batch`` as patched) on one EAGLE3
    prefill: the worker publishes the lengths during the forward, the relay holds them and the
    draft state at the requests' pool slots, and the batch carries those slots as its future."""
    from sglang.srt import server_args as sa

    from conftest import activate_backport
    from sim_support import contract_scheduler, make_server_args, payload_code, prefill

    activate_backport()
    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(make_server_args("EAGLE3"))
    try:
        sched, worker, pools, model_config, truth = contract_scheduler()
        batch = prefill(sched, pools, model_config, truth, ((4, 5), (7, 9)))
        slots = batch.req_pool_indices.clone()

        result = sched.run_batch(batch)

        fmap = sched.future_map
        assert worker.published_during_forward == 1  # through on_publish, not after the forward
        assert fmap.new_seq_lens_buf[slots].tolist() == [5, 9]
        assert batch.spec_info is result.next_draft_input
        assert torch.equal(batch.spec_info.future_indices.indices, slots)
        worker_batch = SimpleNamespace(spec_info=_draft(torch.tensor([0, 0])))
        worker_batch.spec_info.future_indices = batch.spec_info.future_indices
        fmap.resolve_future(worker_batch)
        assert worker_batch.spec_info.bonus_tokens.tolist() == [
            payload_code(4, 0), payload_code(7, 0)]
    finally:
        sa._global_server_args = previous
