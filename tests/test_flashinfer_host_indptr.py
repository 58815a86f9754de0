"""Back-port flashinfer-host-indptr: FlashInfer's extend plans take host indptrs.

SGLang's real ``FlashInferIndicesUpdaterPrefill.update_single_wrapper`` and
``call_begin_forward`` run here. What stands in: FlashInfer's two wrappers (GPU planners; here
they record what ``plan()`` is handed) and SGLang's Triton kernel that gathers the KV indices
(a GPU kernel; here a Python loop over ``req_to_token`` that records the device indptr it reads).
The GPU's tensors are ``meta`` tensors where a test asks whether ``plan()`` was handed device
tensors (FlashInfer reads those back, a host wait behind the queued work on CUDA), and CPU
tensors where it compares values.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from conftest import activate_backport

FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend"
ENV = "SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR"
CHECK_ENV = "SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR_CHECK"


@pytest.fixture
def patched(clean_state, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(CHECK_ENV, raising=False)
    activate_backport()


class Wrapper:
    """Records what each ``begin_forward`` (FlashInfer's ``plan``) call is handed."""

    def __init__(self):
        self.plans: list[dict] = []

    def begin_forward(self, qo_indptr, kv_indptr, *rest, **kwargs):
        paged = len(rest) >= 2 and isinstance(rest[1], torch.Tensor)
        self.plans.append({"qo_indptr": qo_indptr, "kv_indptr": kv_indptr,
                           "kv_indices": rest[0] if paged else None,
                           "last_page_len": rest[1] if paged else None})


@pytest.fixture
def kv_kernel(monkeypatch):
    """SGLang's ``create_flashinfer_kv_indices_triton``, as a Python loop (GPU kernel)."""
    fb = importlib.import_module(FLASHINFER)
    seen: list[torch.Tensor] = []

    class Kernel:
        def __getitem__(self, grid):
            def launch(req_to_token, req_pool_indices, lens, indptr, start, out, stride):
                seen.append(indptr)
                if indptr.device.type == "meta":
                    return
                for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), lens.tolist())):
                    out[indptr[i]:indptr[i] + n] = req_to_token[row, :n]
            return launch

    monkeypatch.setattr(fb, "create_flashinfer_kv_indices_triton", Kernel())
    return seen


def _updater(device: str):
    fb = importlib.import_module(FLASHINFER)
    updater = object.__new__(fb.FlashInferIndicesUpdaterPrefill)
    updater.prefill_wrapper_ragged = Wrapper()
    updater.kv_indptr = [torch.zeros(9, dtype=torch.int32, device=device)]
    updater.qo_indptr = [torch.zeros(9, dtype=torch.int32, device=device)]
    updater.kv_last_page_len = torch.ones(8, dtype=torch.int32, device=device)
    updater.req_to_token = torch.arange(4 * 32, dtype=torch.int32, device=device).reshape(4, 32)
    updater.num_qo_heads, updater.num_kv_heads, updater.head_dim = 4, 2, 8
    updater.q_data_type = updater.data_type = torch.bfloat16
    return updater


SEQ, PREFIX = [9, 4, 17], [6, 0, 13]  # a prefill batch: cached prefixes and new tokens


def _extend(updater, device, use_ragged, seq_cpu=SEQ, prefix_cpu=PREFIX, **kwargs):
    paged = Wrapper()
    seq = torch.tensor(SEQ, dtype=torch.int64, device=device)
    prefix = torch.tensor(PREFIX, dtype=torch.int64, device=device)
    updater.update_single_wrapper(
        torch.tensor([2, 0, 3], device=device), seq,
        None if seq_cpu is None else torch.tensor(seq_cpu), sum(SEQ), prefix, [paged],
        use_ragged, None, kwargs.pop("spec_info", None), extend_prefix_lens_cpu=prefix_cpu, **kwargs)
    return paged.plans, updater.prefill_wrapper_ragged.plans


def _values(t):
    return t.tolist() if t.device.type == "cpu" else t.device.type


@pytest.mark.parametrize("use_ragged", [True, False])
def test_an_extend_plans_from_host_indptrs_not_device_ones(patched, kv_kernel, use_ragged):
    # Stock hands plan() the device indptrs, which FlashInfer copies back to the host.
    paged, ragged = _extend(_updater("meta"), "meta", use_ragged)
    kv = [0, 6, 6, 19] if use_ragged else [0, 9, 13, 30]  # prefixes (ragged) or whole sequences
    assert len(paged) == 1
    assert _values(paged[0]["qo_indptr"]) == [0, 3, 7, 11]
    assert _values(paged[0]["kv_indptr"]) == kv
    assert _values(paged[0]["last_page_len"]) == [1, 1, 1]
    assert paged[0]["kv_indices"].device.type == "meta"  # the KV indices stay on the device
    assert kv_kernel[0].device.type == "meta"  # ... gathered with the device indptr
    if use_ragged:
        assert [_values(ragged[0]["qo_indptr"]), _values(ragged[0]["kv_indptr"])] == [[0, 3, 7, 11]] * 2
    else:
        assert ragged == []


@pytest.mark.parametrize("use_ragged", [True, False])
def test_the_host_indptrs_are_the_device_values_and_the_kv_indices_unchanged(patched, kv_kernel,
                                                                            monkeypatch, use_ragged):
    runs = {}
    for switch in ("0", "1"):
        monkeypatch.setenv(ENV, switch)
        kv_kernel.clear()
        paged, ragged = _extend(_updater("cpu"), "cpu", use_ragged)
        # kv_indices: the gathered part (the buffer has 256 spare entries, never written).
        runs[switch] = [{k: (v[:kv_kernel[0][-1]] if k == "kv_indices" else v).tolist()
                         for k, v in p.items() if v is not None} for p in paged + ragged]
        runs[switch].append(kv_kernel[0].tolist())
    assert runs["1"] == runs["0"]  # the same integers and indices as stock's device tensors
    assert runs["0"][-1] == ([0, 6, 6, 19] if use_ragged else [0, 9, 13, 30])


def test_the_check_mode_raises_where_host_and_device_differ(patched, kv_kernel, monkeypatch):
    stale = [9, 4, 16]  # one host length off by one
    paged, _ = _extend(_updater("cpu"), "cpu", False, seq_cpu=stale)
    assert paged[0]["qo_indptr"].tolist() == [0, 3, 7, 10]  # unchecked: the host's values
    assert paged[0]["kv_indptr"].tolist() == [0, 9, 13, 29]
    monkeypatch.setenv(CHECK_ENV, "1")
    with pytest.raises(RuntimeError, match=r"host qo_indptr \[0, 3, 7, 10\] differs from the device's"):
        _extend(_updater("cpu"), "cpu", False, seq_cpu=stale)
    paged, _ = _extend(_updater("cpu"), "cpu", False)  # equal: planned as usual
    assert paged[0]["kv_indptr"].tolist() == [0, 9, 13, 30]


def test_off_switch_spec_inputs_and_missing_host_lengths_keep_the_device_indptrs(patched, kv_kernel,
                                                                                 monkeypatch):
    fb = importlib.import_module(FLASHINFER)
    build = fb.flashinfer_extend_host_indptrs
    seq = torch.tensor(SEQ)
    assert build(seq, PREFIX, True, 3, None, None) is not None
    assert build(seq, PREFIX, True, 3, object(), None) is None  # verify / spec extend: own plan
    assert build(None, PREFIX, True, 3, None, None) is None
    assert build(seq, None, True, 3, None, None) is None
    assert build(seq, PREFIX, True, 4, None, None) is None  # host lengths of another size
    assert build(seq, PREFIX, True, 3, None, fb.MultiItemScoringParams()) is not None
    enabled = fb.MultiItemScoringParams(prefix_len_ptr=torch.zeros(3))
    assert enabled.is_enabled() and build(seq, PREFIX, True, 3, None, enabled) is None
    monkeypatch.setenv(ENV, "0")
    assert build(seq, PREFIX, True, 3, None, None) is None
    paged, _ = _extend(_updater("meta"), "meta", True)
    assert _values(paged[0]["qo_indptr"]) == "meta"  # switched off: stock's device indptrs


@pytest.fixture
def plan_log(monkeypatch):
    """The order of plans and plan-copy events, by wrapper name: a ``torch.cpu.Event`` stand-in
    (on a GPU: ``torch.cuda.Event``) logs each record / synchronize under the name of the
    wrapper that holds it."""
    log: list[tuple[str, str]] = []
    wrappers: list[_NamedWrapper] = []

    class Event:
        def _owner(self):
            return next(w.name for w in wrappers
                        if getattr(w, "_sglang_futuremap_plan_copied", None) is self)

        def record(self):
            log.append(("record", self._owner()))

        def synchronize(self):
            log.append(("sync", self._owner()))

    monkeypatch.setattr(torch.cpu, "Event", Event)

    def named(name):
        w = _NamedWrapper(name, log)
        wrappers.append(w)
        return w

    return log, named


class _NamedWrapper(Wrapper):
    def __init__(self, name, log):
        super().__init__()
        self.name, self.log = name, log

    def begin_forward(self, *args, **kwargs):
        super().begin_forward(*args, **kwargs)
        self.log.append(("plan", self.name))


def test_a_host_plan_waits_for_the_previous_plan_copy_of_its_wrapper(patched, kv_kernel, plan_log):
    """FlashInfer's plan() queues a copy of its pinned host buffer to the device without waiting.
    Stock's device indptrs made the next plan() wait for the queue first; with host indptrs,
    two plans of one wrapper in a row (consecutive prefills) must not rewrite that buffer before
    the first copy ran (on a GPU the first forward then ran with the second's plan: an illegal
    memory access). Each host plan waits for the event recorded after its wrapper's last plan."""
    log, named = plan_log
    updater = _updater("cpu")
    updater.prefill_wrapper_ragged = named("ragged")
    paged = named("paged")
    for _ in range(2):
        updater.update_single_wrapper(
            torch.tensor([2, 0, 3]), torch.tensor(SEQ), torch.tensor(SEQ), sum(SEQ),
            torch.tensor(PREFIX), [paged], True, None, None, extend_prefix_lens_cpu=PREFIX)
    assert log == [
        ("plan", "ragged"), ("plan", "paged"), ("record", "ragged"), ("record", "paged"),
        # the second extend: both buffers' earlier copies have run before either is rewritten
        ("sync", "ragged"), ("sync", "paged"), ("plan", "ragged"), ("plan", "paged"),
        ("record", "ragged"), ("record", "paged"),
    ]


def test_device_plans_record_and_the_off_switch_records_nothing(patched, kv_kernel, plan_log,
                                                                monkeypatch):
    """A plan handed device indptrs (here: no host lengths) waits for the queue inside plan()
    itself, so it needs no fence, but it marks its copy: a host plan of the same wrapper may
    follow. Switched off (=0) the path is stock's: no events at all."""
    log, named = plan_log
    updater = _updater("cpu")
    updater.prefill_wrapper_ragged = named("ragged")
    paged = named("paged")

    def extend(seq_cpu):
        updater.update_single_wrapper(
            torch.tensor([2, 0, 3]), torch.tensor(SEQ), seq_cpu, sum(SEQ),
            torch.tensor(PREFIX), [paged], False, None, None, extend_prefix_lens_cpu=PREFIX)

    extend(None)  # device indptrs
    extend(torch.tensor(SEQ))  # host indptrs: waits for the device plan's copy
    assert log == [("plan", "paged"), ("record", "paged"),
                   ("sync", "paged"), ("plan", "paged"), ("record", "paged")]
    log.clear()
    monkeypatch.setenv(ENV, "0")
    fresh = named("fresh")
    for _ in range(2):
        updater.update_single_wrapper(
            torch.tensor([2, 0, 3]), torch.tensor(SEQ), torch.tensor(SEQ), sum(SEQ),
            torch.tensor(PREFIX), [fresh], False, None, None, extend_prefix_lens_cpu=PREFIX)
    assert log == [("plan", "fresh"), ("plan", "fresh")]
