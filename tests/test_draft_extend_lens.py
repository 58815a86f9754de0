"""Back-port draft-extend-lens: the draft extend reads its host lengths from the relay.

SGLang's real ``FutureMap`` (as patched) on CPU, where the private-stream copy is a plain
copy; the whole scheduling loop with requests joining, finishing and reusing slots is
``test_overlap_simulation.py::test_spec_v2_overlap_simulation[...-fa3_pcg]`` (every decode's
draft-extend lengths served by the relay, checked against the truth). What needs CUDA (the
pinned buffers, the private stream, the next decode's wait for the copy) is covered by the
GPU runs only.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport


@pytest.fixture
def fmap(spec_future_map):
    return spec_future_map(needs_cpu_seq_lens=False)


def _batch(mode, slots, lens=None):
    """A schedule batch and its worker batch as lend/keep see them; ``lens``: the host lengths
    a prefill is built with."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = SimpleNamespace(forward_mode=getattr(ForwardMode, mode),
                            reqs=[SimpleNamespace(req_pool_idx=s) for s in slots])
    mwb = SimpleNamespace(seq_lens_cpu=None if lens is None else torch.tensor(lens))
    return batch, mwb


def _launch(fmap, mode, slots, published, lens=None, asks=True):
    """One spec-v2 forward as forward_spec_v2_overlap runs it: lend, the forward (its
    publish; a decode whose draft extend asks gets ``seq_lens_cpu_pending``), keep.
    Returns what was lent (None: nothing)."""
    batch, mwb = _batch(mode, slots, lens)
    fmap.lend_draft_extend_lens(batch, mwb)
    lent = getattr(mwb, "relayed_seq_lens_cpu", None)
    fmap.publish(torch.tensor(slots), torch.tensor(published))
    if mode == "DECODE" and asks:
        mwb.seq_lens_cpu_pending = lent or "the late copy"
    fmap.keep_draft_extend_lens(batch, mwb)
    return lent


def _read(lent):
    host, copied = lent()
    assert copied is None
    return host.tolist()


def test_the_decode_after_a_prefill_reads_the_previous_decode_and_the_prefill(fmap):
    assert _launch(fmap, "EXTEND", [1, 2], [5, 7], lens=[5, 7]) is None
    lent = _launch(fmap, "DECODE", [1, 2], [8, 9])
    assert _read(lent) == [5, 7]  # both rows from the prefill's host lengths
    _launch(fmap, "EXTEND", [3], [4], lens=[4])
    lent = _launch(fmap, "DECODE", [1, 2, 3], [10, 12, 6])
    # Rows 1, 2 from the copy taken after the first decode, row 3 from the prefill; the
    # live buffer has moved on since (this decode's own publish), the copy has not.
    assert fmap.new_seq_lens_buf[[1, 2, 3]].tolist() == [10, 12, 6]
    assert _read(lent) == [8, 9, 4]
    lent = _launch(fmap, "DECODE", [3, 1], [7, 11])
    assert _read(lent) == [6, 10]


def test_lengths_published_elsewhere_are_not_lent(fmap):
    _launch(fmap, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    _launch(fmap, "DECODE", [1, 2], [8, 9])
    # A PD-decode bootstrap publishes outside a forward: nothing the relay knew holds.
    fmap.publish(torch.tensor([4]), torch.tensor([30]))
    assert _launch(fmap, "DECODE", [1, 2], [10, 11]) is None
    # From the next decode on, the copy of the one before serves again.
    assert _read(_launch(fmap, "DECODE", [1, 2], [12, 13])) == [10, 11]


def test_a_decode_whose_draft_extend_did_not_ask_takes_no_copy(fmap):
    _launch(fmap, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    # e.g. a multi-layer EAGLE batch its draft-extend CUDA graph replayed
    _launch(fmap, "DECODE", [1, 2], [8, 9], asks=False)
    assert fmap.dx_copy_id == -1
    _launch(fmap, "EXTEND", [3], [4], lens=[4])
    assert _launch(fmap, "DECODE", [1, 2, 3], [10, 12, 6]) is None  # rows 1, 2: device only
    assert _read(_launch(fmap, "DECODE", [1, 2, 3], [11, 13, 7])) == [10, 12, 6]


def test_rows_a_later_decode_rewrote_without_a_copy_are_not_lent(fmap):
    _launch(fmap, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    _launch(fmap, "DECODE", [1, 2], [8, 9])  # copy 0 holds 8, 9
    _launch(fmap, "DECODE", [1, 2], [10, 11], asks=False)  # 10, 11: no copy
    assert fmap.dx_copy_id == 0
    assert _launch(fmap, "DECODE", [1, 2], [12, 13]) is None  # not the stale 8, 9


@pytest.mark.parametrize("mode", ["MIXED", "EXTEND"])
def test_a_prefill_without_plain_host_lengths_is_not_trusted(fmap, mode):
    """A mixed batch (decode rows in a prefill) or an extend built without host lengths:
    the rows it publishes are not taken as host-known."""
    lens = [5, 7] if mode == "MIXED" else None
    _launch(fmap, mode, [1, 2], [5, 7], lens=lens)
    assert _launch(fmap, "DECODE", [1, 2], [8, 9]) is None


def test_a_batch_with_the_mirror_is_lent_nothing(fmap, spec_future_map):
    _launch(fmap, "EXTEND", [1], [5], lens=[5])
    batch, mwb = _batch("DECODE", [1])
    mwb.seq_lens_cpu = torch.tensor([5])  # an eager batch (back-port 13's mirror)
    fmap.lend_draft_extend_lens(batch, mwb)
    assert not hasattr(mwb, "relayed_seq_lens_cpu")
    mirrored = spec_future_map(needs_cpu_seq_lens=True)
    _launch(mirrored, "EXTEND", [1], [5], lens=[5])
    assert _launch(mirrored, "DECODE", [1], [6]) is None
    assert not hasattr(mirrored, "dx_copies")


def test_the_late_copy_hands_on_what_the_relay_lent(clean_state):
    """The worker's late copy (back-port 4) takes the relay's callable instead of queueing a
    copy on the forward stream; a batch its draft-extend graph replays takes neither."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.base_spec_worker import BaseDraftWorker

    activate_backport()
    backend = SimpleNamespace(draft_extend_needs_cpu_seq_lens=True)

    def lent():
        return torch.tensor([7, 12]), None

    mwb = SimpleNamespace(seq_lens=torch.tensor([7, 12]), seq_lens_cpu=None,
                          forward_mode=ForwardMode.DECODE, relayed_seq_lens_cpu=lent)
    BaseDraftWorker.copy_seq_lens_for_draft_extend(None, mwb, backend, None)
    assert mwb.seq_lens_cpu_pending is lent
    mwb = SimpleNamespace(seq_lens=torch.tensor([7, 12]), seq_lens_cpu=None,
                          forward_mode=ForwardMode.DECODE, relayed_seq_lens_cpu=lent)
    BaseDraftWorker.copy_seq_lens_for_draft_extend(None, mwb, backend, SimpleNamespace(max_bs=2))
    assert not hasattr(mwb, "seq_lens_cpu_pending")


def test_the_draft_extend_calls_what_was_lent(clean_state, monkeypatch):
    """``prepare_for_extend_to_fill_draft_kvcache`` calls the relay's callable and then builds
    exactly what it builds with the mirror."""
    from test_cpu_seq_lens_optional import _FakeForwardBatch

    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative import eagle_info_v2
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    activate_backport()
    monkeypatch.setattr(eagle_info_v2, "ForwardBatch", _FakeForwardBatch)
    calls = []

    def lent():
        calls.append(1)
        return torch.tensor([7, 12, 9]), None

    mwb = SimpleNamespace(seq_lens=torch.tensor([7, 12, 9]), seq_lens_cpu=None,
                          seq_lens_sum=None, forward_mode=ForwardMode.DECODE, spec_info=None,
                          input_ids=None, seq_lens_cpu_pending=lent)
    runner = SimpleNamespace(
        spec_algorithm=SimpleNamespace(is_standalone=lambda: False),
        attn_backend=SimpleNamespace(init_forward_metadata=lambda fb: None))
    draft_input = EagleDraftInput(hidden_states=None, num_tokens_per_req=4,
                                  num_tokens_for_logprob_per_req=4)
    fb = draft_input.prepare_for_extend_to_fill_draft_kvcache(mwb, torch.arange(12), 4, runner, None)
    assert calls == [1]
    assert fb.seq_lens_cpu.tolist() == [11, 16, 13] and fb.seq_lens_sum == 40
    assert fb.extend_prefix_lens_cpu == [7, 12, 9]
