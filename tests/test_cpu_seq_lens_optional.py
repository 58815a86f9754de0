"""Back-port 4 (#26128): the spec-v2 seq_lens host mirror is optional per attention backend.

The multi-iteration run without the mirror (filter/merge/prepare_for_decode with
``seq_lens_cpu`` None, no D2H in ``resolve_seq_lens_cpu``) is
``test_overlap_simulation.py::test_spec_v2_overlap_simulation[...-no_mirror]``. Here each
reader the back-port edits runs once with and once without the mirror: ``filter_batch`` /
``merge_batch``, ``ForwardBatch._pad_inputs_to_size``, the three CUDA-graph replays (#31364:
never the stale pinned lengths of an earlier batch), the Triton metadata, the draft's tree mask
and the decode stats.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest
import torch

from conftest import activate_backport, plugin_only
from sim_support import HostSyncProbe

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


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
        SimpleNamespace(speculative_algorithm="EAGLE", enable_multi_layer_eagle=False,
                        speculative_eagle_topk=1))
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


# --------------------------------------------------------------------------- schedule batch

#: Request-pool row width (``req_to_token.shape[1]``): the no-mirror upper bound per request.
WIDTH = 32


@pytest.fixture
def schedule_server_args(patched) -> Iterator[None]:
    """SGLang's real ``ServerArgs`` (defaults, EAGLE) as the global args: building a batch's
    ``SamplingBatchInfo`` reads them."""
    from sglang.srt import server_args as sa
    from sim_support import make_server_args

    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(make_server_args("EAGLE"))
    yield
    sa._global_server_args = previous


def _spec_v2_batch(lens: list[int], slots: list[int], mirror: bool) -> ScheduleBatch:
    """A spec-v2 running batch (overlap on, EAGLE) of real ``Req``s, its real
    ``SamplingBatchInfo`` and draft input (future indices = pool slots), with or without the
    ``seq_lens`` host mirror and sum."""
    from sglang.srt.managers.overlap_utils import FutureIndices
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    reqs = []
    for slot, n in zip(slots, lens):
        params = SamplingParams(max_new_tokens=8, temperature=0.0)
        params.normalize(None)
        reqs.append(Req(f"r{slot}", "", list(range(n)), params, vocab_size=100))
    batch = ScheduleBatch(
        reqs=reqs, model_config=SimpleNamespace(is_encoder_decoder=False, vocab_size=100),
        device="cpu", enable_overlap=True, spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"),
        req_pool_indices=torch.tensor(slots), seq_lens=torch.tensor(lens),
        orig_seq_lens=torch.tensor(lens, dtype=torch.int32),
        seq_lens_cpu=torch.tensor(lens) if mirror else None,
        seq_lens_sum=sum(lens) if mirror else None)
    batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, 100)
    batch.spec_info = EagleDraftInput(future_indices=FutureIndices(indices=torch.tensor(slots)))
    assert batch.is_spec_v2
    return batch


@pytest.mark.parametrize("mirror", [True, False])
def test_filter_batch_slices_the_mirror_only_if_there_is_one(schedule_server_args,
                                                             mirror: bool) -> None:
    batch = _spec_v2_batch([5, 7, 9], [1, 2, 3], mirror)
    batch.filter_batch(keep_indices=[0, 2])
    assert [r.rid for r in batch.reqs] == ["r1", "r3"]
    assert batch.seq_lens.tolist() == [5, 9] and batch.req_pool_indices.tolist() == [1, 3]
    assert batch.spec_info.future_indices.indices.tolist() == [1, 3]
    assert batch.seq_lens_sum is None  # spec v2: resolve_seq_lens_cpu recomputes it
    if mirror:
        assert batch.seq_lens_cpu.tolist() == [5, 9]
    else:
        assert batch.seq_lens_cpu is None


@pytest.mark.parametrize("left,right", [(True, True), (True, False), (False, True),
                                        (False, False)])
def test_merge_batch_keeps_a_mirror_only_when_both_have_one(schedule_server_args, left: bool,
                                                            right: bool) -> None:
    """A partial mirror would be wrong: either side without one leaves the merge without
    one (and without a sum); with both, the lengths and sums add up."""
    batch = _spec_v2_batch([5, 7], [1, 2], left)
    batch.merge_batch(_spec_v2_batch([9], [3], right))
    assert [r.rid for r in batch.reqs] == ["r1", "r2", "r3"]
    assert batch.seq_lens.tolist() == [5, 7, 9]
    assert batch.spec_info.future_indices.indices.tolist() == [1, 2, 3]
    if left and right:
        assert batch.seq_lens_cpu.tolist() == [5, 7, 9] and batch.seq_lens_sum == 21
    else:
        assert batch.seq_lens_cpu is None and batch.seq_lens_sum is None


# --------------------------------------------------------------------------- forward batch


@pytest.mark.parametrize("mirror", [True, False])
def test_pad_inputs_keeps_the_missing_mirror_missing(patched, mirror: bool) -> None:
    """``ForwardBatch._pad_inputs_to_size`` (DP padding) pads the device lengths with the
    backend's fill value; the host mirror and sum are padded only where they exist."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=2, input_ids=torch.tensor([3, 4]),
        req_pool_indices=torch.tensor([1, 2]), seq_lens=torch.tensor([7, 9]),
        out_cache_loc=torch.tensor([70, 90]), positions=torch.tensor([6, 8]),
        seq_lens_sum=16 if mirror else None,
        seq_lens_cpu=torch.tensor([7, 9]) if mirror else None, lora_ids=[None, None])
    fb._pad_inputs_to_size(SimpleNamespace(attn_backend=_triton()), 4, 4)
    fill = _triton().get_cuda_graph_seq_len_fill_value()
    assert fb.seq_lens.tolist() == [7, 9, fill, fill]
    assert fb.req_pool_indices.tolist() == [1, 2, 0, 0] and fb.positions.tolist() == [6, 8, 0, 0]
    if mirror:
        assert fb.seq_lens_sum == 16 + 2 * fill
        assert fb.seq_lens_cpu.tolist() == [7, 9, fill, fill]
    else:
        assert fb.seq_lens_sum is None and fb.seq_lens_cpu is None


# --------------------------------------------------------------------------- CUDA-graph replay
# The graph runners' real replay code on CPU tensors; only the captured graph's own replay
# (a GPU call) is a no-op stand-in. The backend records what it is handed.

#: Tokens per request in the target-verify / draft-extend graphs (3 steps, topk 1).
NUM_TOKENS = 4
CAPTURE_BS = [1, 2, 4]


class _ReplayRecorder:
    """An attention backend that records its ``init_forward_metadata_replay_cuda_graph``
    arguments (copies: the graph buffers are reused by the next replay)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def init_forward_metadata_replay_cuda_graph(self, *args: Any, **kwargs: Any) -> None:
        names = ("bs", "req_pool_indices", "seq_lens", "seq_lens_sum", "encoder_lens",
                 "forward_mode", "spec_info")
        seen = {**dict(zip(names, args)), **kwargs}
        self.calls.append({k: v.clone() if isinstance(v, torch.Tensor) else v
                           for k, v in seen.items()})


@pytest.fixture
def single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank, no expert parallelism (what ``enable_num_token_non_padded`` asks)."""
    from sglang.srt.distributed import parallel_state

    monkeypatch.setattr(parallel_state, "_MOE_EP", SimpleNamespace(world_size=1))


def _replay_batch(mode: ForwardMode, lens: list[int], mirror: bool,
                  spec_info: Any = None) -> ForwardBatch:
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

    bs = len(lens)
    n = bs * NUM_TOKENS
    return ForwardBatch(
        forward_mode=mode, batch_size=bs, input_ids=torch.arange(n),
        req_pool_indices=torch.arange(1, bs + 1), seq_lens=torch.tensor(lens),
        out_cache_loc=torch.arange(n), positions=torch.arange(n),
        seq_lens_sum=sum(lens) if mirror else None,
        seq_lens_cpu=torch.tensor(lens) if mirror else None,
        extend_seq_lens=torch.full((bs,), NUM_TOKENS, dtype=torch.int32),
        extend_seq_lens_cpu=[NUM_TOKENS] * bs, extend_start_loc=torch.arange(0, n, NUM_TOKENS),
        spec_info=spec_info, capture_hidden_mode=CaptureHiddenMode.FULL)


def _assert_no_stale_host_lengths(calls: list[dict[str, Any]], fill: int) -> None:
    """A batch with the mirror (3 requests, padded to 4), then one without (2 requests):
    the second replay gets None for both host values, never the pinned buffer's lengths of
    the first batch."""
    first, second = calls
    assert first["bs"] == 4 and first["seq_lens_cpu"].tolist() == [30, 50, 40, fill]
    assert first["seq_lens_sum"] == 120 + fill
    assert second["bs"] == 2 and second["seq_lens"][:2].tolist() == [7, 9]
    assert second["seq_lens_cpu"] is None, second["seq_lens_cpu"]
    assert second["seq_lens_sum"] is None


def test_target_graph_replay_hands_no_stale_host_lengths(patched, single_rank) -> None:
    """``CudaGraphRunner.replay_prepare`` (target verify): upstream #31364."""
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner, DecodeInputBuffers
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = object.__new__(CudaGraphRunner)
    runner.buffers = DecodeInputBuffers.create(
        device="cpu", max_bs=4, max_num_token=4 * NUM_TOKENS, hidden_size=8, vocab_size=16,
        dtype=torch.float32, dp_size=1, pp_size=1, is_encoder_decoder=False,
        require_mlp_tp_gather=False, seq_len_fill_value=1, encoder_len_fill_value=0,
        num_tokens_per_bs=NUM_TOKENS, cache_loc_dtype=torch.int64, enable_mamba_track=False)
    runner.model_runner = SimpleNamespace(
        server_args=SimpleNamespace(enable_return_hidden_states=False),
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"), is_draft_worker=False,
        hisparse_coordinator=None)
    runner.attn_backend = _ReplayRecorder()
    for name, value in dict(
            capture_hidden_mode=CaptureHiddenMode.FULL, capture_bs=CAPTURE_BS,
            capture_forward_mode=ForwardMode.TARGET_VERIFY, num_tokens_per_bs=NUM_TOKENS,
            seq_len_fill_value=1, require_mlp_tp_gather=False, require_gathered_buffer=False,
            nsa_enable_prefill_cp=False, enable_two_batch_overlap=False, enable_pdmux=False,
            is_encoder_decoder=False).items():
        setattr(runner, name, value)
    verify = SimpleNamespace(capture_hidden_mode=CaptureHiddenMode.FULL)

    runner.replay_prepare(_replay_batch(ForwardMode.TARGET_VERIFY, [30, 50, 40], True, verify))
    runner.replay_prepare(_replay_batch(ForwardMode.TARGET_VERIFY, [7, 9], False, verify))
    _assert_no_stale_host_lengths(runner.attn_backend.calls, 1)
    assert runner.attn_backend.calls[1]["spec_info"] is verify
    # What the backend would have read otherwise: the first batch's lengths.
    assert runner.buffers.seq_lens_cpu[:2].tolist() == [30, 50]


def _draft_extend_runner(cls: type) -> tuple[Any, _ReplayRecorder]:
    """A draft-extend graph runner (EAGLE or multi-layer) with CPU graph buffers of 4
    requests, one captured graph per size in ``CAPTURE_BS``."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor.cuda_graph_runner import DeepEPCudaGraphRunnerAdapter
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
        EAGLEDraftExtendCudaGraphRunner, EagleDraftExtendInputBuffers)
    from sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner import (
        MultiLayerEagleDraftExtendInputBuffers)

    max_bs, hidden = 4, 8
    tokens = max_bs * NUM_TOKENS

    def outputs() -> LogitsProcessorOutput:
        out = LogitsProcessorOutput(next_token_logits=torch.zeros(tokens, 16),
                                    hidden_states=torch.zeros(tokens, hidden))
        out.topk_p = torch.zeros(tokens, 1)
        out.topk_index = torch.zeros(tokens, 1, dtype=torch.int64)
        return out

    def lens(value: int) -> torch.Tensor:
        return torch.full((max_bs,), value, dtype=torch.int32)

    runner = object.__new__(cls)
    runner.deepep_adapter = DeepEPCudaGraphRunnerAdapter()
    runner.require_mlp_tp_gather = runner.require_gathered_buffer = False
    runner.capture_bs, runner.num_tokens_per_bs = CAPTURE_BS, NUM_TOKENS
    runner.seq_len_fill_value = 1
    runner.forward_mode = ForwardMode.DRAFT_EXTEND_V2
    runner.extend_seq_lens_cpu = [NUM_TOKENS] * max_bs
    runner.graphs = {bs: SimpleNamespace(replay=lambda: None) for bs in CAPTURE_BS}
    runner.output_buffers = {bs: outputs() for bs in CAPTURE_BS}
    runner.model_runner = SimpleNamespace(device_timer=None)
    backend = _ReplayRecorder()
    common = dict(
        input_ids=torch.zeros(tokens, dtype=torch.int64),
        req_pool_indices=torch.zeros(max_bs, dtype=torch.int64),
        out_cache_loc=torch.zeros(tokens, dtype=torch.int64),
        positions=torch.zeros(tokens, dtype=torch.int64),
        mrope_positions=torch.zeros(3, tokens, dtype=torch.int64),
        hidden_states=torch.zeros(tokens, hidden), seq_lens=lens(1), seq_lens_cpu=lens(1),
        extend_seq_lens=lens(NUM_TOKENS), num_correct_drafts=lens(NUM_TOKENS),
        num_accept_tokens=lens(NUM_TOKENS), next_token_logits_buffer=torch.zeros(tokens, 16),
        global_num_tokens_gpu=None, global_num_tokens_for_logprob_gpu=None)
    if cls is EAGLEDraftExtendCudaGraphRunner:
        runner.buffers = EagleDraftExtendInputBuffers(**common)
        runner.draft_extend_attn_backend = backend
    else:
        runner.buffers = MultiLayerEagleDraftExtendInputBuffers(
            **common, swa_out_cache_loc=torch.zeros(tokens, dtype=torch.int64),
            extend_start_loc=lens(0))
        runner.step = 0
        runner.eagle_worker = SimpleNamespace(draft_extend_attn_backend_list=[backend])
    return runner, backend


@pytest.mark.parametrize("kind", ["eagle", "multi_layer"])
def test_draft_extend_graph_replay_hands_no_stale_host_lengths(patched, kind: str) -> None:
    """``EAGLEDraftExtendCudaGraphRunner.replay`` and
    ``MultiLayerEagleDraftExtendCudaGraphRunner.replay``: upstream #31364."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
        EAGLEDraftExtendCudaGraphRunner)
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner import (
        MultiLayerEagleDraftExtendCudaGraphRunner)

    cls = (EAGLEDraftExtendCudaGraphRunner if kind == "eagle"
           else MultiLayerEagleDraftExtendCudaGraphRunner)
    runner, backend = _draft_extend_runner(cls)

    def batch(lens: list[int], mirror: bool) -> ForwardBatch:
        n = len(lens)
        draft = EagleDraftInput(hidden_states=torch.ones(n * NUM_TOKENS, 8),
                                num_correct_drafts=torch.ones(n, dtype=torch.int32),
                                num_accept_tokens=torch.full((n,), 2, dtype=torch.int32))
        return _replay_batch(ForwardMode.DRAFT_EXTEND_V2, lens, mirror, draft)

    runner.replay(batch([30, 50, 40], True))
    out = runner.replay(batch([7, 9], False))
    _assert_no_stale_host_lengths(backend.calls, 1)
    assert out.next_token_logits.shape[0] == 2 * NUM_TOKENS  # the replay went on
    assert runner.buffers.seq_lens_cpu[:2].tolist() == [30, 50]


# --------------------------------------------------------------------------- Triton metadata


class _RowCopy:
    """``create_flashinfer_kv_indices_triton[(bs,)](...)`` in torch (Triton cannot launch on
    a CPU host): request ``i``'s first ``kv_lens[i]`` pool slots go to
    ``kv_indices[kv_indptr[i]:]``."""

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def launch(req_to_token: torch.Tensor, pool: torch.Tensor, kv_lens: torch.Tensor,
                   kv_indptr: torch.Tensor, kv_start: None, kv_indices: torch.Tensor,
                   stride: int) -> None:
            assert kv_start is None and stride == req_to_token.shape[1]
            for i in range(grid[0]):
                n, at = int(kv_lens[i]), int(kv_indptr[i])
                kv_indices[at: at + n] = req_to_token[int(pool[i]), :n]
        return launch


class _DraftDecodeIndices:
    """``generate_draft_decode_kv_indices[(steps, num_seqs, topk)](...)`` in torch, page size 1
    (a transcription of the kernel: per step, each request's cached slots then its draft
    slots, and the step's ``kv_indptr`` from the positions)."""

    def __getitem__(self, grid: tuple[int, int, int]) -> Callable[..., None]:
        steps, num_seqs, topk = grid

        def launch(pool: torch.Tensor, req_to_token: torch.Tensor, lens: torch.Tensor,
                   kv_indices: torch.Tensor, kv_indptr: torch.Tensor, positions: torch.Tensor,
                   pool_len: int, kv_indices_stride: int, kv_indptr_stride: int,
                   bs_upper: int, iter_upper: int, num_tokens_upper: int,
                   page_size: int) -> None:
            assert page_size == 1 and kv_indices_stride == kv_indices.shape[1]
            for step in range(steps):
                iters = step + 1
                for b in range(num_seqs):
                    seq_len, cum = int(lens[b]), int(lens[:b].sum())
                    row = req_to_token[int(pool[b])]
                    for t in range(topk):
                        at = cum * topk + b * iters * topk + t * (seq_len + iters)
                        kv_indices[step, at: at + seq_len] = row[:seq_len]
                        first = seq_len + t * steps
                        kv_indices[step, at + seq_len: at + seq_len + iters] = row[
                            first: first + iters]
                        zid = b * topk + t or num_seqs * topk
                        kv_indptr[step, zid] = int(positions[:zid].sum()) + zid * iters
        return launch


@pytest.fixture
def triton_kernels(patched, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    from sglang.srt.layers.attention import triton_backend as tb

    monkeypatch.setattr(tb, "create_flashinfer_kv_indices_triton", _RowCopy())
    monkeypatch.setattr(tb, "generate_draft_decode_kv_indices", _DraftDecodeIndices())
    return tb


def _pool_rows(rows: int) -> torch.Tensor:
    """``req_to_token``: row ``r`` holds the KV slots ``r * 1000 + 0 .. WIDTH - 1``."""
    return (torch.arange(rows).unsqueeze(1) * 1000 + torch.arange(WIDTH)).to(torch.int32)


def _triton_backend(max_bs: int = 4) -> Any:
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = object.__new__(TritonAttnBackend)
    for name, value in dict(
            device="cpu", req_to_token=_pool_rows(8), num_head=2, v_head_dim=4,
            max_kv_splits=2, swa_v_head_dim=None, sliding_window_size=None,
            static_kv_splits=True, device_core_count=0, enable_deterministic=False,
            num_draft_tokens=NUM_TOKENS, token_to_kv_pool_allocator=None,
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32),
            window_kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32),
            qo_indptr=torch.zeros(max_bs + 1, dtype=torch.int32),
            mask_indptr=torch.zeros(max_bs + 1, dtype=torch.int64)).items():
        setattr(backend, name, value)
    return backend


PREFIX = [5, 12, 3]  # cached lengths of three requests
POOL = [2, 6, 4]  # their request-pool rows


def _cached_slots(lens: list[int]) -> list[int]:
    rows = _pool_rows(8)
    return [s for p, n in zip(POOL, lens) for s in rows[p, :n].tolist()]


@pytest.mark.parametrize("mode", ["decode", "target_verify"])
@pytest.mark.parametrize("mirror", [True, False])
def test_triton_metadata_without_the_mirror(triton_kernels, mode: str, mirror: bool) -> None:
    """Eager decode (no spec info) and target verify: ``kv_indices`` is sized by the host sum
    with the mirror, by the pool-row bound without (no wait on the device lengths); the
    attention reads the same indices either way (``kv_indptr``)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    backend = _triton_backend()
    verify = mode == "target_verify"
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY if verify else ForwardMode.DECODE,
        batch_size=3, input_ids=torch.zeros(3, dtype=torch.int64),
        req_pool_indices=torch.tensor(POOL), seq_lens=torch.tensor(PREFIX),
        out_cache_loc=torch.zeros(3, dtype=torch.int64),
        seq_lens_sum=sum(PREFIX) if mirror else None,
        seq_lens_cpu=torch.tensor(PREFIX) if mirror else None,
        spec_info=SimpleNamespace(custom_mask=torch.ones(8, dtype=torch.bool)) if verify else None)
    type(backend).init_forward_metadata(backend, fb)
    meta = backend.forward_metadata
    assert meta.kv_indptr.tolist() == [0, 5, 17, 20]
    assert meta.kv_indices.numel() == (sum(PREFIX) if mirror else 3 * WIDTH)
    assert meta.kv_indices[:20].tolist() == _cached_slots(PREFIX)
    if verify:
        assert meta.qo_indptr.tolist() == [0, 4, 8, 12]
        assert meta.mask_indptr.tolist() == [0, 36, 100, 128]  # 4 * (len + 4) each
    else:
        assert meta.num_kv_splits.tolist() == [2, 2, 2]


@pytest.mark.parametrize("mirror", [True, False])
def test_triton_draft_extend_v2_metadata_without_host_prefix_lengths(triton_kernels,
                                                                    mirror: bool) -> None:
    """DRAFT_EXTEND_V2 without the mirror has device-only prefix lengths
    (``extend_prefix_lens_cpu`` None): sized by the bound, the same indices."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    backend = _triton_backend()
    fb = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=3,
        input_ids=torch.zeros(12, dtype=torch.int64), req_pool_indices=torch.tensor(POOL),
        seq_lens=torch.tensor(PREFIX) + NUM_TOKENS,
        out_cache_loc=torch.zeros(12, dtype=torch.int64),
        seq_lens_sum=sum(PREFIX) + 12 if mirror else None,
        extend_prefix_lens=torch.tensor(PREFIX, dtype=torch.int32),
        extend_prefix_lens_cpu=list(PREFIX) if mirror else None,
        extend_seq_lens=torch.full((3,), NUM_TOKENS, dtype=torch.int32),
        extend_seq_lens_cpu=[NUM_TOKENS] * 3)
    type(backend).init_forward_metadata(backend, fb)
    meta = backend.forward_metadata
    assert meta.kv_indptr.tolist() == [0, 5, 17, 20]
    assert meta.kv_indices.numel() == (20 if mirror else 3 * WIDTH)
    assert meta.kv_indices[:20].tolist() == _cached_slots(PREFIX)
    assert meta.qo_indptr.tolist() == [0, 4, 8, 12] and meta.max_extend_len == NUM_TOKENS


def test_triton_multi_step_draft_slices_without_the_mirror(triton_kernels) -> None:
    """``TritonMultiStepDraftBackend.common_template`` (draft decode, 3 steps, topk 1): each
    step's backend gets the same ``kv_indptr`` and indices with or without the mirror; the
    slice is bounded by the pool rows when there is no host sum."""
    from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    steps, bs = 3, len(PREFIX)
    seen: dict[bool, list[tuple[list[int], list[int]]]] = {}
    for mirror in (True, False):
        backend = object.__new__(TritonMultiStepDraftBackend)
        backend.topk, backend.speculative_num_steps = 1, steps
        backend.pool_len, backend.page_size = WIDTH, 1
        backend.kv_indptr = torch.zeros((steps, 5), dtype=torch.int32)
        buffer = torch.full((steps, 4 * WIDTH), -1, dtype=torch.int64)
        fb = SimpleNamespace(
            batch_size=bs, req_pool_indices=torch.tensor(POOL),
            req_to_token_pool=SimpleNamespace(req_to_token=_pool_rows(8)),
            seq_lens=torch.tensor(PREFIX), positions=torch.tensor(PREFIX),
            seq_lens_sum=sum(PREFIX) if mirror else None, spec_info=EagleDraftInput())
        calls: list[tuple[list[int], list[int]]] = []

        def call(step: int, forward_batch: Any) -> None:
            indptr = forward_batch.spec_info.kv_indptr.tolist()
            indices = forward_batch.spec_info.kv_indices
            assert indices.numel() >= indptr[-1]
            assert indices.numel() == (
                sum(PREFIX) + bs * (step + 1) if mirror else bs * WIDTH + bs * (step + 1))
            calls.append((indptr, indices[: indptr[-1]].tolist()))

        TritonMultiStepDraftBackend.common_template(backend, fb, buffer, call)
        seen[mirror] = calls
    assert seen[True] == seen[False] and len(seen[False]) == steps - 1
    indptr, indices = seen[False][1]  # step 1: each request's prefix and 2 draft slots
    assert indptr == [0, 7, 21, 26]
    rows = _pool_rows(8)
    assert indices == [s for p, n in zip(POOL, PREFIX) for s in rows[p, : n + 2].tolist()]


# --------------------------------------------------------------------------- draft tree mask


def _verify_backend(kind: str) -> Any:
    """The target's (verify) backend: Triton with its CUDA-graph mask buffer, Triton eager
    (no buffer), or FA3 with topk 1 (back-port 8: it never reads the tree mask)."""
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    if kind == "fa3_chain":
        backend = object.__new__(FlashAttentionBackend)
        backend.topk = 1
        assert backend.reads_verify_tree_mask is False
        return backend
    backend = object.__new__(TritonAttnBackend)
    backend.cuda_graph_custom_mask = (
        torch.zeros(4 * WIDTH * NUM_TOKENS, dtype=torch.bool) if kind == "triton_graph" else None)
    return backend


@pytest.fixture
def tree_kernel(patched, tree_modes: list[Any]) -> list[Any]:
    """``tree_modes`` with the whole series applied."""
    return tree_modes


@pytest.fixture
def tree_modes(sglang_loaded, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """SGLang's ``build_tree_kernel_efficient`` (it sizes the mask) with its native kernel
    (``sgl_kernel``, absent on a CPU host) replaced by one that records the mask layout it
    is asked to write; the mask contents are the kernel's business, not tested here."""
    from sglang.srt.speculative import eagle_utils

    modes: list[Any] = []

    def kernel(*args: Any) -> None:
        # (parent_list, top_scores_index, seq_lens, tree_mask, positions, retrieve_index,
        #  retrieve_next_token, retrieve_next_sibling, topk, spec_steps, num_verify_tokens,
        #  tree_mask_mode)
        tree_mask_mode = args[11]
        modes.append(tree_mask_mode)

    monkeypatch.setattr(eagle_utils, "sgl_build_tree_kernel_efficient", kernel, raising=False)
    return modes


def _drafting_worker(kind: str, verify_backend: Any) -> Any:
    """An EAGLE or multi-layer draft worker whose draft (CUDA graph or forward) yields a
    chain of 3 draft tokens per request; what follows it (the tree mask) is SGLang's."""
    from sglang.srt.speculative.eagle_utils import TreeMaskMode
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleDraftWorker

    bs = len(PREFIX)
    drafted = (torch.zeros((bs, 2), dtype=torch.int64), torch.arange(3).repeat(bs, 1),
               torch.arange(bs * 3).view(bs, 3) + 100)
    runner = SimpleNamespace(
        attn_backend=SimpleNamespace(draft_extend_needs_cpu_seq_lens=False))
    if kind == "eagle":
        worker = object.__new__(EagleDraftWorker)
        worker.draft_runner = runner
        worker.cuda_graph_runner = SimpleNamespace(replay=lambda forward_batch: drafted)
    else:
        worker = object.__new__(MultiLayerEagleDraftWorker)
        worker.draft_runner_list = [runner]
        worker.cuda_graph_runner = None
        worker.draft_forward = lambda forward_batch: drafted
    worker.cuda_graph_runner_for_draft_extend = None
    worker.req_to_token_pool = SimpleNamespace(req_to_token=_pool_rows(8))
    worker.topk, worker.speculative_num_steps, worker.speculative_num_draft_tokens = 1, 3, 4
    worker.tree_mask_mode = TreeMaskMode.FULL_MASK
    worker.target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(attn_backend=verify_backend))
    return worker


@pytest.mark.parametrize("kind", ["eagle", "multi_layer"])
@pytest.mark.parametrize("verify", ["triton_graph", "triton_eager", "fa3_chain"])
@pytest.mark.parametrize("mirror", [True, False])
def test_draft_sizes_the_tree_mask_without_the_mirror(tree_kernel: list[Any], kind: str,
                                                      verify: str, mirror: bool) -> None:
    """The verify's tree mask after the draft (``EagleDraftWorker.draft``,
    ``MultiLayerEagleDraftWorker.draft``): the CUDA-graph buffer when the verify backend has
    one; else with the mirror sized by the host sum, without it the small QLEN_ONLY layout
    for a backend that never reads it (FA3 chain), a pool row per request otherwise."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    bs, nv = len(PREFIX), NUM_TOKENS
    backend = _verify_backend(verify)
    worker = _drafting_worker(kind, backend)
    forward_batch = SimpleNamespace(forward_mode=ForwardMode.DECODE)
    mwb = SimpleNamespace(
        seq_lens=torch.tensor(PREFIX), forward_mode=ForwardMode.DECODE,
        seq_lens_cpu=torch.tensor(PREFIX) if mirror else None,
        seq_lens_sum=sum(PREFIX) if mirror else None,
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor([7, 8, 9]),
                                  prepare_for_v2_draft=lambda *a: (forward_batch, True)))
    verify_input = worker.draft(mwb)

    assert verify_input.draft_token.tolist() == [7, 100, 101, 102, 8, 103, 104, 105,
                                                 9, 106, 107, 108]
    assert verify_input.seq_lens_cpu is None and verify_input.seq_lens_sum is None
    mask = verify_input.custom_mask
    if verify == "triton_graph":
        assert mask is backend.cuda_graph_custom_mask
        assert tree_kernel == [TreeMaskMode.FULL_MASK]
    elif verify == "fa3_chain" and not mirror:
        assert mask.numel() == nv * bs * nv and tree_kernel == [TreeMaskMode.QLEN_ONLY]
    else:
        cached = sum(PREFIX) if mirror else bs * WIDTH
        assert mask.numel() == cached * nv + nv * nv * bs
        assert tree_kernel == [TreeMaskMode.FULL_MASK]


@pytest.fixture
def unpatched(sglang_loaded) -> Iterator[tuple[Any, ...]]:
    """SGLang unpatched for one test; the series is applied again afterwards if it was (the
    module's ``patched`` fixture keeps it applied for the tests that follow)."""
    import sglang_futuremap_patch as plugin
    from sglang_futuremap_patch import _engine

    was_applied = bool(_engine.applied_backports())
    plugin.revert()
    yield sglang_loaded
    plugin.revert()
    if was_applied:
        activate_backport()


@pytest.fixture
def through_back_port_4(unpatched) -> Iterator[None]:
    """Back-ports 1-4 installed (4 with the ones it depends on), none of the later ones."""
    from sglang_futuremap_patch import _engine

    series = list(unpatched[:4])
    assert series[-1].id == "cpu-seq-lens-optional"
    verdict = _engine.gate(series)
    assert verdict.decision == "patch", verdict.reason
    _engine.install(series, verdict)
    yield


@plugin_only
def test_back_port_4_declares_the_draft_hooks_it_reads(through_back_port_4) -> None:
    """Back-port 4 introduces both hooks its draft reads, on every attention backend, with
    what 0.5.12.x does as their value; before back-port 8, FA3 has those too."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    assert AttentionBackend.draft_extend_needs_cpu_seq_lens is False
    assert AttentionBackend.reads_verify_tree_mask is True
    fa3 = object.__new__(FlashAttentionBackend)
    fa3.topk, fa3.num_splits = 1, 0
    assert fa3.draft_extend_needs_cpu_seq_lens is False and fa3.reads_verify_tree_mask is True
    for backend in (_triton(), _flashinfer()):
        assert backend.draft_extend_needs_cpu_seq_lens is False
        assert backend.reads_verify_tree_mask is True


@plugin_only
def test_reverting_takes_the_draft_hooks_away(unpatched) -> None:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    activate_backport()
    assert AttentionBackend.reads_verify_tree_mask is True
    import sglang_futuremap_patch as plugin

    plugin.revert()
    for hook in ("needs_cpu_seq_lens", "draft_extend_needs_cpu_seq_lens",
                 "reads_verify_tree_mask"):
        assert hook not in vars(AttentionBackend), hook


@plugin_only
@pytest.mark.parametrize("kind", ["eagle", "multi_layer"])
@pytest.mark.parametrize("declares", [True, False])
def test_the_draft_honours_a_backend_that_declares_the_hooks(
    through_back_port_4, tree_modes: list[Any], kind: str, declares: bool
) -> None:
    """With back-ports 1-4 only (no FA3 override yet), the draft reads both hooks from the
    backends it is given: a draft-extend backend that declares
    ``draft_extend_needs_cpu_seq_lens`` gets the early copy of the lengths, a verify backend
    that declares ``reads_verify_tree_mask = False`` the small mask; a backend that keeps the
    defaults gets neither."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    declared = type("DeclaringBackend", (TritonAttnBackend,), {
        "draft_extend_needs_cpu_seq_lens": True, "reads_verify_tree_mask": False})
    backend_class = declared if declares else TritonAttnBackend
    verify_backend = object.__new__(backend_class)
    verify_backend.cuda_graph_custom_mask = None
    worker = _drafting_worker(kind, verify_backend)
    runner = worker.draft_runner if kind == "eagle" else worker.draft_runner_list[0]
    runner.attn_backend = object.__new__(backend_class)
    bs, nv = len(PREFIX), NUM_TOKENS
    mwb = SimpleNamespace(
        seq_lens=torch.tensor(PREFIX), forward_mode=ForwardMode.DECODE,
        seq_lens_cpu=None, seq_lens_sum=None,
        spec_info=SimpleNamespace(
            bonus_tokens=torch.tensor([7, 8, 9]),
            prepare_for_v2_draft=lambda *a: (SimpleNamespace(forward_mode=ForwardMode.DECODE), True)))
    verify_input = worker.draft(mwb)

    pending = getattr(mwb, "seq_lens_cpu_pending", None)
    mask = verify_input.custom_mask
    if declares:
        assert pending is not None and pending[0].tolist() == PREFIX
        assert mask.numel() == nv * bs * nv and tree_modes == [TreeMaskMode.QLEN_ONLY]
    else:
        assert pending is None
        assert mask.numel() == bs * WIDTH * nv + nv * nv * bs
        assert tree_modes == [TreeMaskMode.FULL_MASK]


# --------------------------------------------------------------------------- decode stats


@pytest.mark.parametrize("mirror", [True, False])
def test_decode_stats_sum_the_request_lengths_without_the_mirror(patched, mirror: bool) -> None:
    """``report_decode_stats`` at a logging interval: the scheduler stats' decode KV total is
    the mirror's sum, or the requests' own lengths without it (the same numbers here)."""
    import time

    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.observability.metrics_collector import SchedulerStats
    from sglang.srt.observability.scheduler_metrics_mixin import SchedulerMetricsMixin
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    logged: list[Any] = []
    batch = _metrics_batch(mirror)
    batch.forward_iter, batch.dp_cooperation_info = None, None
    batch.batch_size = lambda: len(batch.reqs)
    for req in batch.reqs:
        req.priority, req.routing_key = None, None

    def noop(*args: Any, **kwargs: Any) -> None:
        pass

    scheduler = SimpleNamespace(
        current_scheduler_metrics_enabled=True, enable_mfu_metrics=False,
        scheduler_status_logger=None, is_stats_logging_rank=False,
        metrics_collector=SimpleNamespace(increment_realtime_tokens=noop,
                                          log_stats=logged.append),
        forward_ct_decode=10, forward_ct=10, last_decode_stats_tic=time.perf_counter(),
        num_generated_tokens=12, spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"),
        spec_num_accept_tokens=6, spec_num_forward_ct=2, spec_total_num_accept_tokens=0,
        spec_total_num_forward_ct=0,
        server_args=SimpleNamespace(decode_log_interval=5, speculative_num_draft_tokens=4,
                                    speculative_num_steps=3, language_only=False),
        get_pool_stats=lambda: SimpleNamespace(get_decode_usage_msg_parts=lambda: [],
                                               update_scheduler_stats=noop),
        disaggregation_mode=DisaggregationMode.NULL, _graph_backend_label="cuda graph",
        waiting_queue=[], enable_priority_scheduling=False, grammar_manager=[],
        stats=SchedulerStats(), num_retracted_reqs=0, num_paused_reqs=0,
        _streaming_session_count=lambda: 0, _session_held_tokens=lambda: 0,
        calculate_utilization=noop, fwd_occupancy=0.0, update_lora_metrics=noop,
        _log_hicache_stats=noop, _emit_kv_metrics=noop, _publish_kv_events=noop)
    SchedulerMetricsMixin.report_decode_stats(scheduler, True, running_batch=batch)
    assert logged == [scheduler.stats]
    assert scheduler.stats.decode_sum_seq_lens == 65
    assert scheduler.stats.num_running_reqs.total == 3 and scheduler.stats.spec_accept_length == 3
