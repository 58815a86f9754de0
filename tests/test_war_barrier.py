"""Back-port war-barrier: the schedule stream is queued behind the forward in flight.

SGLang's real ``get_next_batch_to_run`` (and its two PD-disaggregation variants) run on a
scheduler object whose schedule stream records what it is asked to wait for; the first thing
each one does after the barrier is stopped, so the test sees whether the barrier came first.
The uploads the barrier would otherwise make blocking run in SGLang's real
``prepare_for_decode`` (page size 1 and 16), ``write_cache_indices`` (its Triton path, the
kernel launch recorded instead of run: it is a GPU kernel) and ``alloc_for_extend``; an upload
probe records every host-to-device upload made from Python data (``torch.tensor(..., device=)``)
and every ``Tensor.to(device)`` with its ``non_blocking`` flag.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport
from sim_support import make_pools, spec_v2_decode_batch


class _Stop(Exception):
    pass


class _RecordingStream:
    """The schedule stream: records the streams it is queued behind."""

    def __init__(self) -> None:
        self.waited: list[object] = []

    def wait_stream(self, other: object) -> None:
        self.waited.append(other)


@pytest.fixture
def patched(clean_state, monkeypatch):
    monkeypatch.delenv("SGLANG_FUTUREMAP_WAR_BARRIER", raising=False)
    activate_backport()
    yield


def _scheduler(*, overlap: bool = True, algorithm: str | None = "EAGLE3", device: str = "cuda"):
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    s = object.__new__(Scheduler)
    s.enable_overlap = overlap
    s.spec_algorithm = SpeculativeAlgorithm.from_string(algorithm)
    s.device = device
    s.schedule_stream = _RecordingStream()
    s.forward_stream = object()
    s.forward_ct = 0  # as __init__ sets them
    s.disaggregation_mode = DisaggregationMode.NULL
    return s


@pytest.fixture
def cuda_build(monkeypatch):
    """A CUDA build of torch, as far as the decision reads it."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")


def test_barrier_comes_first_in_get_next_batch_to_run(patched, cuda_build):
    s = _scheduler()
    s.enable_fpm = False
    calls = []

    def first_stock_statement():
        calls.append(1)
        assert s.schedule_stream.waited == [s.forward_stream] * len(calls)
        raise _Stop

    s._abort_on_waiting_timeout = first_stock_statement
    with pytest.raises(_Stop):
        s.get_next_batch_to_run()
    assert s.schedule_stream.waited == [s.forward_stream]
    s.forward_ct += 1  # a launch in between (run_batch counts it)
    with pytest.raises(_Stop):  # every iteration that follows a launch, not once
        s.get_next_batch_to_run()
    assert s.schedule_stream.waited == [s.forward_stream] * 2


def test_barrier_comes_first_in_the_pd_loops(patched, cuda_build):
    s = _scheduler()

    def first_decode_statement():
        assert s.schedule_stream.waited == [s.forward_stream]
        raise _Stop

    s.get_new_prebuilt_batch = first_decode_statement
    with pytest.raises(_Stop):
        s.get_next_disagg_decode_batch_to_run()

    s = _scheduler()
    s.running_batch = SimpleNamespace(batch_is_full=True)

    def first_prefill_statement():
        assert s.schedule_stream.waited == [s.forward_stream]
        assert s.running_batch.batch_is_full is False
        raise _Stop

    s.process_prefill_chunk = first_prefill_statement
    with pytest.raises(_Stop):
        s.get_next_disagg_prefill_batch_to_run()


SKIP_IDLE = "SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE"


def _loop_scheduler(mode: str = "NULL"):
    """A scheduler whose ``get_next_batch_to_run`` stops right after its barrier, and whose
    ``run_batch`` (the plugin's, which hands non-spec-v2 batches to SGLang's own) stops right
    after counting the launch."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    s = _scheduler()
    s.enable_fpm = False
    s.forward_ct = 0
    s.is_generation = True
    s.disaggregation_mode = DisaggregationMode[mode]

    def stop(*_a, **_k):
        raise _Stop

    s._abort_on_waiting_timeout = stop
    s.get_new_prebuilt_batch = stop
    s._profile_batch_predicate = stop
    return s


def _poll(s, loop: str = "get_next_batch_to_run") -> None:
    with pytest.raises(_Stop):
        getattr(s, loop)()


def _launch(s, spec_v2: bool) -> None:
    batch = SimpleNamespace(is_spec_v2=spec_v2, forward_mode=SimpleNamespace(is_prebuilt=lambda: False))
    with pytest.raises(_Stop):
        s.run_batch(batch)


@pytest.mark.parametrize("setting, barriers", [
    (None, 3),  # unset: the first iteration, then one after each launch
    ("1", 3),
    ("0", 6),  # switched off: a barrier at every iteration, idle or not
])
def test_idle_polls_skip_the_barrier_unless_switched_off(patched, cuda_build, monkeypatch, setting, barriers):
    if setting is None:
        monkeypatch.delenv(SKIP_IDLE, raising=False)
    else:
        monkeypatch.setenv(SKIP_IDLE, setting)
    s = _loop_scheduler()
    for _ in range(3):  # an idle server polls
        _poll(s)
    _launch(s, spec_v2=True)  # the plugin's spec-v2 launch
    _poll(s)
    _launch(s, spec_v2=False)  # SGLang's own run_batch counts it too
    _poll(s)
    _poll(s)
    assert s.forward_ct == 2
    assert s.schedule_stream.waited == [s.forward_stream] * barriers


def test_every_launch_is_followed_by_a_barrier_with_idle_polls_skipped(patched, cuda_build, monkeypatch):
    monkeypatch.delenv(SKIP_IDLE, raising=False)
    s = _loop_scheduler()
    _poll(s)
    for n in range(1, 5):
        _launch(s, spec_v2=n % 2 == 0)
        _poll(s)
        assert len(s.schedule_stream.waited) == 1 + n
        _poll(s)  # idle: nothing new on the forward stream
        assert len(s.schedule_stream.waited) == 1 + n


@pytest.mark.parametrize("mode, loop", [
    ("DECODE", "get_next_disagg_decode_batch_to_run"),
    ("PREFILL", "get_next_disagg_prefill_batch_to_run"),
])
def test_pd_loops_keep_the_barrier_at_every_iteration(patched, cuda_build, monkeypatch, mode, loop):
    monkeypatch.delenv(SKIP_IDLE, raising=False)
    s = _loop_scheduler(mode)
    s.running_batch = SimpleNamespace(batch_is_full=False)
    s.process_prefill_chunk = s.get_new_prebuilt_batch
    for _ in range(3):
        _poll(s, loop)
    assert s.schedule_stream.waited == [s.forward_stream] * 3


@pytest.mark.parametrize("setting, overlap, algorithm, device, cuda, wanted", [
    (None, True, "EAGLE3", "cuda", "12.8", True),
    (None, True, "STANDALONE", "cuda", "12.8", True),
    ("0", True, "EAGLE3", "cuda", "12.8", False),  # turned off
    (None, False, "EAGLE3", "cuda", "12.8", False),  # no overlap loop
    (None, True, None, "cuda", "12.8", False),  # not speculative: SGLang's loop as it is
    (None, True, "EAGLE3", "cuda", None, False),  # a ROCm build (#26646: CUDA only)
    (None, True, "EAGLE3", "cpu", "12.8", False),
    ("1", True, "EAGLE3", "cpu", None, True),  # asked for off CUDA
    ("1", True, None, "cuda", "12.8", False),
])
def test_who_gets_the_barrier(patched, monkeypatch, setting, overlap, algorithm, device, cuda, wanted):
    if setting is not None:
        monkeypatch.setenv("SGLANG_FUTUREMAP_WAR_BARRIER", setting)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    s = _scheduler(overlap=overlap, algorithm=algorithm, device=device)
    s.apply_war_barrier()
    assert s.schedule_stream.waited == ([s.forward_stream] if wanted else [])
    # decided once per scheduler
    monkeypatch.setenv("SGLANG_FUTUREMAP_WAR_BARRIER", "0" if wanted else "1")
    s.forward_ct += 1  # a launch in between, so the next iteration is not an idle poll
    s.apply_war_barrier()
    assert len(s.schedule_stream.waited) == (2 if wanted else 0)


# --------------------------------------------------------------------------- uploads


#: The device the batch and the pools live on: the CPU here, named by a ``torch.device`` (SGLang
#: names its device by a string, "cpu" for host tensors too), so the probe can tell an upload to
#: it from a tensor made on the host on purpose (``device="cpu"``).
ACCEL = torch.device("cpu")


class UploadProbe:
    """Records, while armed, ``torch.tensor(data, device=ACCEL)`` (a blocking upload on a GPU)
    and ``Tensor.to(ACCEL)`` of host tensors with their ``non_blocking`` flag."""

    def __init__(self, monkeypatch) -> None:
        self.blocking: list[str] = []
        self.async_uploads = 0
        self.armed = False
        tensor, to = torch.tensor, torch.Tensor.to
        probe = self

        def tensor_spy(*args, **kwargs):
            if probe.armed and isinstance(kwargs.get("device"), torch.device):
                import traceback
                frame = traceback.extract_stack(limit=2)[0]
                probe.blocking.append(f"torch.tensor(device={kwargs['device']}) at {frame.name}:{frame.lineno}")
            return tensor(*args, **kwargs)

        def to_spy(self_, *args, **kwargs):
            device = kwargs.get("device", args[0] if args else None)
            if probe.armed and self_.device.type == "cpu" and isinstance(device, torch.device):
                if kwargs.get("non_blocking"):
                    probe.async_uploads += 1
                else:
                    probe.blocking.append(f"Tensor.to({device})")
            return to(self_, *args, **kwargs)

        monkeypatch.setattr(torch, "tensor", tensor_spy)
        monkeypatch.setattr(torch.Tensor, "to", to_spy)

    @contextmanager
    def arm(self):
        self.armed = True
        try:
            yield self
        finally:
            self.armed = False


@pytest.mark.parametrize("page_size", [1, 16])
def test_prepare_for_decode_uploads_do_not_block(patched, monkeypatch, server_args, page_size):
    from sglang.srt.speculative import spec_utils

    from sim_support import torch_assign_req_to_token_pool_func

    server_args(page_size=page_size)
    monkeypatch.setattr(spec_utils, "assign_req_to_token_pool_func", torch_assign_req_to_token_pool_func)
    batch, slots = spec_v2_decode_batch(page_size, monkeypatch, ACCEL)
    before = [r.kv_allocated_len for r in batch.reqs]
    probe = UploadProbe(monkeypatch)
    with probe.arm():
        batch.spec_info.prepare_for_decode(batch)
    assert probe.blocking == []
    assert probe.async_uploads == (2 if page_size == 1 else 4)
    if page_size > 1:  # the allocator got the lengths it gets from stock
        call = slots.calls[-1]
        assert call["prefix_lens"].tolist() == call["prefix_lens_cpu"].tolist() == before
        assert call["seq_lens"].tolist() == call["seq_lens_cpu"].tolist() == [r.kv_allocated_len for r in batch.reqs]
    # every request got its next window, written to its req_to_token row
    for r, b in zip(batch.reqs, before):
        assert r.kv_allocated_len > b
        row = batch.req_to_token_pool.req_to_token[r.req_pool_idx, : r.kv_allocated_len]
        assert (row > 0).all() and len(set(row.tolist())) == r.kv_allocated_len


def test_write_cache_indices_uploads_prefix_pointers_asynchronously(patched, monkeypatch, server_args):
    from sglang.srt.mem_cache import common

    launches = []

    class _Kernel:
        def __getitem__(self, grid):
            def launch(req_to_token, req_pool_indices, prefix_pointers, *rest):
                launches.append((grid, prefix_pointers.clone()))
            return launch

    monkeypatch.setattr(common, "write_req_to_token_pool_triton", _Kernel())
    server_args(attention_backend="triton")
    pool, _, _ = make_pools(4, 96, kv_tokens=512)
    pool.device = ACCEL
    prefixes = [torch.arange(3, dtype=torch.int64), torch.arange(5, dtype=torch.int64)]
    lens = torch.tensor([3, 5])
    probe = UploadProbe(monkeypatch)
    with probe.arm():
        common.write_cache_indices(
            torch.arange(8), torch.tensor([1, 2]), torch.tensor([1, 2]), lens, lens,
            lens + 4, lens + 4, torch.tensor([4, 4]), torch.tensor([4, 4]), prefixes, pool)
    assert probe.blocking == [] and probe.async_uploads == 1
    (grid, pointers), = launches
    assert pointers.tolist() == [t.data_ptr() for t in prefixes] and grid == (2,)


@pytest.mark.parametrize("deterministic", [False, True])
def test_prefill_preparation_uploads_do_not_block(patched, monkeypatch, server_args, deterministic):
    """SGLang's whole prefill preparation (``prepare_for_extend``: KV slots, req_to_token,
    the sampling parameters) uploads nothing synchronously; an empty prefix's last location
    (page size > 1) is made on the device; the sampling tensors hold the requests' values."""
    server_args(page_size=16, enable_deterministic_inference=deterministic)
    probe = UploadProbe(monkeypatch)
    with probe.arm():
        batch, slots = spec_v2_decode_batch(16, monkeypatch, ACCEL)
    assert probe.blocking == []
    assert probe.async_uploads >= (5 if deterministic else 4)
    (call,) = slots.calls
    assert call["last_loc"].tolist() == [-1, -1, -1] and call["last_loc"].dtype == torch.int64
    info = batch.sampling_info
    params = [r.sampling_params for r in batch.reqs]
    assert info.temperatures.shape == (3, 1) and info.temperatures.dtype == torch.float
    assert info.temperatures.view(-1).tolist() == [p.temperature for p in params]
    assert info.top_ps.tolist() == pytest.approx([p.top_p for p in params])
    assert info.top_ks.dtype == torch.int32 and info.top_ks.tolist() == [p.top_k for p in params]
    assert info.min_ps.tolist() == [p.min_p for p in params]
    if deterministic:
        assert info.sampling_seed.dtype == torch.int64 and info.sampling_seed.tolist() == [42] * 3
    else:
        assert info.sampling_seed is None
