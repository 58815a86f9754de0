"""Back-port flashinfer-host-prefix-sum: FlashInfer's ragged prefill plans from the host's prefix
lengths instead of reading their device sum back.

SGLang's real ``FlashInferAttnBackend.init_forward_metadata`` and
``FlashInferIndicesUpdaterPrefill.update_single_wrapper`` run here on CPU tensors. What stands
in: the updater's ``call_begin_forward`` (FlashInfer's planning, a GPU call) records the sum it
is given, and ``torch.Tensor.item`` counts its calls, each of which is a device read-back (a
host wait for the GPU) on CUDA.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport

FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend"
ENV = "SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM"


@pytest.fixture
def patched(clean_state):
    activate_backport()


@pytest.fixture
def item_calls(monkeypatch):
    calls: list[int] = []
    real = torch.Tensor.item

    def item(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(torch.Tensor, "item", item)
    return calls


def _updater():
    import importlib

    fb = importlib.import_module(FLASHINFER)
    updater = object.__new__(fb.FlashInferIndicesUpdaterPrefill)
    planned: list[int] = []
    updater.prefill_wrapper_ragged = None
    updater.kv_indptr, updater.qo_indptr = [None], [None]
    updater.call_begin_forward = lambda *a, **k: planned.append(a[4])  # paged_kernel_lens_sum
    return updater, planned


def _ragged(updater, host):
    prefix = torch.tensor([3, 5, 0, 7], dtype=torch.int32)
    kwargs = {} if host is False else {"extend_prefix_lens_cpu": host}
    updater.update_single_wrapper(torch.arange(4), prefix + 2, None, 25, prefix, [None], True, None, None,
                                  **kwargs)


def test_ragged_prefill_sums_the_host_lengths_without_a_read_back(patched, item_calls, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)  # on by default
    updater, planned = _updater()
    _ragged(updater, [3, 5, 0, 7])
    assert planned == [15] and item_calls == []  # the same sum, no device read-back


def test_switched_off_or_without_host_lengths_it_reads_the_device_sum_as_stock(patched, item_calls,
                                                                               monkeypatch):
    monkeypatch.setenv(ENV, "0")
    updater, planned = _updater()
    _ragged(updater, [3, 5, 0, 7])  # switched off: stock's read-back
    assert planned == [15] and len(item_calls) == 1
    monkeypatch.delenv(ENV)
    _ragged(updater, None)  # no host lengths given: stock's read-back
    assert planned == [15, 15] and len(item_calls) == 2


def test_extend_metadata_hands_the_updater_the_batchs_host_prefix_lengths(patched):
    import importlib

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fb = importlib.import_module(FLASHINFER)
    backend = object.__new__(fb.FlashInferAttnBackend)
    seen: list[dict] = []
    backend.indices_updater_prefill = SimpleNamespace(update=lambda *a, **k: seen.append(k))
    backend.is_multimodal = backend.enable_mis = backend.enable_deterministic = backend.use_paged = False
    backend.prefill_split_tile_size = None
    backend.prefill_wrappers_paged = ["paged"]
    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, req_pool_indices=torch.arange(2),
                            seq_lens=torch.tensor([9, 4]), seq_lens_cpu=torch.tensor([9, 4]), seq_lens_sum=13,
                            extend_prefix_lens=torch.tensor([6, 0]), extend_prefix_lens_cpu=[6, 0],
                            encoder_lens=None, cross_attention_custom_mask=None)
    backend.init_forward_metadata(batch)
    assert len(seen) == 1 and seen[0]["use_ragged"] is True
    assert seen[0]["extend_prefix_lens_cpu"] == [6, 0]


def test_every_prefill_updater_takes_the_host_lengths(patched):
    # init_forward_metadata calls whichever updater the model's attention dispatches to.
    import importlib

    fb = importlib.import_module(FLASHINFER)
    for name in ("update_single_wrapper", "update_sliding_window", "update_cross_attention"):
        func = getattr(fb.FlashInferIndicesUpdaterPrefill, name)
        params = inspect.signature(func, follow_wrapped=False).parameters
        assert "extend_prefix_lens_cpu" in params and params["extend_prefix_lens_cpu"].default is None, name
