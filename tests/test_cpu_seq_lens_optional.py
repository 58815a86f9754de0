"""Back-port 4 (#26128): the spec-v2 seq_lens host mirror is optional per attention backend.

The multi-iteration run without the mirror (filter/merge/prepare_for_decode with
``seq_lens_cpu`` None, no D2H in ``resolve_seq_lens_cpu``) is
``test_overlap_simulation.py::test_spec_v2_overlap_simulation[...-no_mirror]``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport
from sim_support import HostSyncProbe


@pytest.fixture(scope="module")
def patched(sglang_loaded):
    import sglang_futuremap_patch as plugin

    activate_backport()
    yield
    plugin.revert()


def _args(tbo=False, pcg_disabled=True):
    return SimpleNamespace(enable_two_batch_overlap=tbo, disable_piecewise_cuda_graph=pcg_disabled)


def _triton():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return object.__new__(TritonAttnBackend)


def _triton_multi_step():
    from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend

    return object.__new__(TritonMultiStepDraftBackend)


def _flashinfer():
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    return object.__new__(FlashInferAttnBackend)


# --------------------------------------------------------------------------- declarations


def test_backend_flags(patched):
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    assert AttentionBackend.needs_cpu_seq_lens is True
    assert _triton().needs_cpu_seq_lens is False
    assert _triton_multi_step().needs_cpu_seq_lens is False
    assert _flashinfer().needs_cpu_seq_lens is True  # inherited: reads the mirror


def test_decision(patched):
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens as decide

    all_triton = (_triton(), _triton_multi_step(), _triton())
    assert decide(_args(), all_triton) is False
    assert decide(_args(), (_triton(), None, None)) is False  # None slots are skipped
    assert decide(_args(tbo=True), all_triton) is True
    # Piecewise CUDA graph no longer forces it once back-port 7 is in: test_pcg_no_mirror.py.
    assert decide(_args(), (_triton(), _flashinfer(), _triton())) is True
    assert decide(_args(), (_triton(), object())) is True  # undeclared: needs it


def _eagle_worker(adaptive_states=()):
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    w = object.__new__(EAGLEWorkerV2)
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=_triton()))
    w._draft_worker = SimpleNamespace(draft_attn_backend=_triton_multi_step(),
                                      draft_extend_attn_backend=_triton())
    w.adaptive_controller = None
    if adaptive_states:
        w.adaptive_controller = SimpleNamespace(_states=dict(enumerate(adaptive_states)))
    return w


def test_worker_backend_lists(patched):
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens as decide
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

    w = _eagle_worker()
    t, d, e = (w._target_worker.model_runner.attn_backend, w._draft_worker.draft_attn_backend,
               w._draft_worker.draft_extend_attn_backend)
    assert w.spec_v2_attn_backends == (t, d, e)
    assert decide(_args(), w.spec_v2_attn_backends) is False
    assert issubclass(StandaloneWorkerV2, type(w))  # STANDALONE inherits the EAGLE list

    ml = object.__new__(MultiLayerEagleWorkerV2)
    ml._target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=t))
    steps = [_triton(), _flashinfer()]
    ml._draft_worker = SimpleNamespace(draft_extend_attn_backend_list=steps)
    assert ml.spec_v2_attn_backends == (t, *steps)
    assert decide(_args(), ml.spec_v2_attn_backends) is True


def test_adaptive_worker_lists_every_runtime_state(patched):
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens as decide

    triton_state = SimpleNamespace(target_attn_backend=_triton(),
                                   draft_attn_backend=_triton_multi_step(),
                                   draft_extend_attn_backend=None)
    other_state = SimpleNamespace(target_attn_backend=_flashinfer(),
                                  draft_attn_backend=_triton_multi_step(),
                                  draft_extend_attn_backend=_triton())
    assert decide(_args(), _eagle_worker([triton_state]).spec_v2_attn_backends) is False
    w = _eagle_worker([triton_state, other_state])
    assert other_state.target_attn_backend in w.spec_v2_attn_backends
    assert decide(_args(), w.spec_v2_attn_backends) is True


def test_base_spec_worker_default_is_the_target(patched):
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

    class Worker(BaseSpecWorker):
        target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend="target"))
        draft_worker = None

        def clear_cache_pool(self):
            pass

    assert Worker().spec_v2_attn_backends == ("target",)


# --------------------------------------------------------------------------- FutureMap


@pytest.fixture
def spec_server_args(patched):
    from sglang.srt import server_args as sa

    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(
        SimpleNamespace(speculative_algorithm="EAGLE", enable_multi_layer_eagle=False))
    yield
    sa._global_server_args = previous


@pytest.mark.parametrize("needs", [True, False])
def test_resolve_without_the_mirror_keeps_the_gather(spec_server_args, needs):
    from sglang.srt.managers.overlap_utils import FutureIndices, FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    m = FutureMap(8, 0, 64, torch.device("cpu"), SpeculativeAlgorithm.from_string("EAGLE"))
    m.init_spec_relay(SimpleNamespace(req_to_token=torch.zeros((8, 4))),
                      torch.get_device_module("cpu").Stream(), needs_cpu_seq_lens=needs)
    assert m.needs_cpu_seq_lens is needs
    m.publish(torch.tensor([3, 5]), torch.tensor([30, 50]))
    batch = SimpleNamespace(
        spec_info=SimpleNamespace(future_indices=FutureIndices(indices=torch.tensor([5, 3]))),
        seq_lens=torch.tensor([1, 1]), seq_lens_cpu=torch.tensor([1, 1]), seq_lens_sum=2)
    probe = HostSyncProbe().install()
    try:
        with probe.armed():
            m.resolve_seq_lens_cpu(batch)
        hits = [h for h in probe.take() if h[0].startswith("Tensor.")]
    finally:
        probe.uninstall()
    assert batch.seq_lens.tolist() == [50, 30]  # the device lengths advance either way
    if needs:
        assert batch.seq_lens_cpu.tolist() == [50, 30] and batch.seq_lens_sum == 80
        assert ("Tensor.cpu", False) in hits
    else:
        assert batch.seq_lens_cpu is None and batch.seq_lens_sum is None
        assert hits == []


def test_init_spec_relay_default_keeps_the_mirror(spec_server_args):
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    m = FutureMap(8, 0, 64, torch.device("cpu"), SpeculativeAlgorithm.from_string("EAGLE"))
    m.init_spec_relay(SimpleNamespace(req_to_token=torch.zeros((8, 4))),
                      torch.get_device_module("cpu").Stream())
    assert m.needs_cpu_seq_lens is True


# --------------------------------------------------------------------------- draft extend


class _FakeForwardBatch:
    @classmethod
    def init_new(cls, batch, model_runner):
        # What ForwardBatch.init_new derives from the worker batch's extend lists.
        fb = SimpleNamespace(
            seq_lens=batch.seq_lens, seq_lens_cpu=batch.seq_lens_cpu,
            seq_lens_sum=batch.seq_lens_sum, forward_mode=batch.forward_mode)
        if not batch.forward_mode.is_idle():
            assert isinstance(batch.extend_seq_lens, list)
            assert isinstance(batch.extend_prefix_lens, list)
            fb.extend_seq_lens = torch.tensor(batch.extend_seq_lens, dtype=torch.int32)
            fb.extend_prefix_lens = torch.tensor(batch.extend_prefix_lens, dtype=torch.int32)
            fb.extend_seq_lens_cpu = batch.extend_seq_lens
            fb.extend_prefix_lens_cpu = batch.extend_prefix_lens
            fb.positions = torch.cat([
                torch.arange(p, p + n) for p, n in
                zip(batch.extend_prefix_lens, batch.extend_seq_lens)])
        return fb


@pytest.mark.parametrize("mirror", ["mirror", "none", "late"])
def test_draft_extend_inputs_without_the_mirror(patched, monkeypatch, mirror):
    """"late": no mirror, but the lengths were copied at the start of the forward (the
    draft-extend backend asked for them): the draft extend waits for that copy and then
    builds exactly what it builds with the mirror."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative import eagle_info_v2
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    monkeypatch.setattr(eagle_info_v2, "ForwardBatch", _FakeForwardBatch)
    seq_lens = torch.tensor([7, 12, 9])
    waited = []
    mwb = SimpleNamespace(
        seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone() if mirror == "mirror" else None,
        seq_lens_sum=28 if mirror == "mirror" else None, forward_mode=ForwardMode.DECODE,
        spec_info=None, input_ids=None)
    if mirror == "late":
        mwb.seq_lens_cpu_pending = (seq_lens.clone(),
                                    SimpleNamespace(synchronize=lambda: waited.append(1)))
    backend = SimpleNamespace(calls=[])
    runner = SimpleNamespace(
        spec_algorithm=SimpleNamespace(is_standalone=lambda: False),
        attn_backend=SimpleNamespace(init_forward_metadata=backend.calls.append))
    draft_input = EagleDraftInput(hidden_states=None, num_tokens_per_req=4,
                                  num_tokens_for_logprob_per_req=4)
    probe = HostSyncProbe().install()
    try:
        with probe.armed(seq_lens):
            fb = draft_input.prepare_for_extend_to_fill_draft_kvcache(
                mwb, torch.arange(12), 4, runner, None)
        hits = probe.take()
    finally:
        probe.uninstall()

    # Identical inputs for the draft extend with or without the mirror.
    assert fb.forward_mode == ForwardMode.DRAFT_EXTEND_V2 and backend.calls == [fb]
    assert fb.seq_lens.tolist() == [11, 16, 13]
    assert fb.extend_prefix_lens.tolist() == [7, 12, 9]
    assert fb.extend_seq_lens.tolist() == [4, 4, 4] and fb.extend_seq_lens_cpu == [4, 4, 4]
    assert fb.positions.tolist() == (list(range(7, 11)) + list(range(12, 16))
                                     + list(range(9, 13)))
    assert waited == ([1] if mirror == "late" else [])
    if mirror != "none":
        assert fb.seq_lens_cpu.tolist() == [11, 16, 13] and fb.seq_lens_sum == 40
        assert fb.extend_prefix_lens_cpu == [7, 12, 9]
    else:
        assert fb.seq_lens_cpu is None and fb.seq_lens_sum is None
        assert fb.extend_prefix_lens_cpu is None and mwb.extend_prefix_lens is None
        assert [h for h in hits if h[0].startswith("Tensor.")] == [], hits


class _DraftStarted(Exception):
    pass


def _draft_worker(kind, declared, graph_max_bs):
    """An EAGLE or multi-layer (MTP) draft worker with just what the start of ``draft``
    reads: its draft-extend backend's declaration and its draft-extend CUDA graph."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleDraftWorker

    runner = SimpleNamespace(
        attn_backend=SimpleNamespace(draft_extend_needs_cpu_seq_lens=declared))
    if kind == "eagle":
        worker = object.__new__(EagleDraftWorker)
        worker.draft_runner = runner
    else:
        worker = object.__new__(MultiLayerEagleDraftWorker)
        worker.draft_runner_list = [runner]
    worker.cuda_graph_runner_for_draft_extend = (
        None if graph_max_bs is None else SimpleNamespace(max_bs=graph_max_bs))
    for attr in ("req_to_token_pool", "cuda_graph_runner", "topk", "speculative_num_steps"):
        setattr(worker, attr, None)
    return worker


@pytest.mark.parametrize("kind", ["eagle", "multi_layer"])
@pytest.mark.parametrize("graph_max_bs", [None, 2, 3])
@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("mirror", [True, False])
def test_draft_starts_the_late_copy_only_where_the_draft_extend_asks(patched, kind, declared,
                                                                     mirror, graph_max_bs):
    """Both draft workers copy the lengths first thing: without the mirror, for a
    draft-extend backend that declares ``draft_extend_needs_cpu_seq_lens``, and only for a
    batch its draft-extend CUDA graph cannot replay (none, or more requests than its
    largest captured batch: 3 here)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def prepare_for_v2_draft(*args):
        raise _DraftStarted  # what follows is the draft itself, tested elsewhere

    seq_lens = torch.tensor([7, 12, 9])
    mwb = SimpleNamespace(
        seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone() if mirror else None,
        forward_mode=ForwardMode.DECODE,
        spec_info=SimpleNamespace(prepare_for_v2_draft=prepare_for_v2_draft))
    worker = _draft_worker(kind, declared, graph_max_bs)
    with pytest.raises(_DraftStarted):
        worker.draft(mwb)
    pending = getattr(mwb, "seq_lens_cpu_pending", None)
    eager = graph_max_bs is None or graph_max_bs < 3
    if declared and not mirror and eager:
        host, copied = pending
        assert copied is None  # a CPU tensor: the copy is already done
        assert host.tolist() == [7, 12, 9] and host.data_ptr() != seq_lens.data_ptr()
    else:
        assert pending is None


# --------------------------------------------------------------------------- metrics


def _metrics_batch(mirror):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    reqs = [SimpleNamespace(seqlen=n) for n in (10, 20, 35)]
    return SimpleNamespace(
        reqs=reqs, forward_mode=ForwardMode.DECODE, decoding_reqs=None,
        seq_lens_cpu=torch.tensor([10, 20, 35]) if mirror else None)


def test_metrics_fall_back_to_request_lengths(patched):
    from sglang.srt.observability.scheduler_metrics_mixin import SchedulerMetricsMixin

    consts = SimpleNamespace(
        _linear_flops_per_token=3.0, _attn_dot_flops_coeff=5.0,
        _weight_read_bytes_per_token=7.0, _qkv_act_bytes_per_token=11.0,
        _decode_q_read_bytes_per_token=13.0, _kv_cache_bytes_per_token=17.0,
        _ffn_act_bytes_per_token=19.0)
    with_mirror = SchedulerMetricsMixin._estimate_decode_perf(consts, _metrics_batch(True), 4)
    without = SchedulerMetricsMixin._estimate_decode_perf(consts, _metrics_batch(False), 4)
    assert without == with_mirror and with_mirror[0] == 4 * 3.0 + 5.0 * 65

    a = SchedulerMetricsMixin._build_scheduled_request_metrics(None, _metrics_batch(True))
    b = SchedulerMetricsMixin._build_scheduled_request_metrics(None, _metrics_batch(False))
    assert (b.num_decode_requests, b.sum_decode_kv_tokens) == (3, 65)
    assert (a.num_decode_requests, a.sum_decode_kv_tokens, a.var_decode_kv_tokens) == (
        b.num_decode_requests, b.sum_decode_kv_tokens, b.var_decode_kv_tokens)
