"""GPU regression test: a FlashInfer plan handed host indptrs must reach the device intact.

FlashInfer's ``plan()`` writes the plan into the wrapper's pinned host buffer and queues a copy
of that buffer to the device on the current stream, without waiting for it. Handed device
indptrs (SGLang's stock call), ``plan()`` first reads them back, a wait for everything queued,
so the copy of the previous plan has always run before the buffer is rewritten. Back-port
flashinfer-host-indptr hands it host indptrs: nothing waits, and a second plan of the same
wrapper (consecutive prefills) could overwrite the buffer before the first copy has read it.
The first forward then runs with the second batch's plan: in the serving benchmark, an illegal
memory access at concurrency 45 (results/serve-bench/h200x4-fence-2026-11-27).

The test lets the stream lag on purpose (``torch.cuda._sleep``), plans batch A with host
indptrs, snapshots on the stream the device copy of the plan that A's kernels would read, then
plans batch B on the same wrapper. With the back-port's fence (``flashinfer_plan_fence`` /
``flashinfer_plans_queued``, the functions the plugin splices into SGLang's FlashInfer backend)
the snapshot holds A's plan. A control run without the fence must hold B's bytes instead, so
the test is known to detect what it guards against.

Runs on any CUDA GPU with SGLang's FlashInfer (its first plan compiles FlashInfer's prefill
module, a minute or two on a fresh machine): ``python -m pytest tests/gpu/test_flashinfer_plan_fence.py``.
"""

from __future__ import annotations

import importlib.util

import pytest

from test_gpu_smoke import gpu_skip_reason

_REASON = gpu_skip_reason("the race needs a CUDA stream", installed_plugin=False)
if _REASON is None and importlib.util.find_spec("flashinfer") is None:
    _REASON = "FlashInfer is not installed"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

#: Bytes of the plan compared (the plan's own layout starts at the buffer's head).
PLAN_BYTES = 4096
#: How long the stream lags behind the host before plan A (cycles of ``torch.cuda._sleep``).
LAG_CYCLES = 400_000_000


def _plan(kind, wrapper, batch):
    """Plan one batch of ``batch`` requests of 1, 2, ... 64-token prefills with host indptrs."""
    import torch

    lens = [(i % 64) + 1 for i in range(batch)]
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    if kind == "ragged":
        wrapper.begin_forward(indptr, indptr, 32, 8, 128, q_data_type=torch.bfloat16)
    else:
        kv_indices = torch.arange(int(indptr[-1]), dtype=torch.int32, device="cuda")
        wrapper.begin_forward(indptr, indptr, kv_indices, torch.ones(batch, dtype=torch.int32),
                              32, 8, 128, 1, q_data_type=torch.bfloat16,
                              kv_data_type=torch.bfloat16, non_blocking=True)
    return indptr


def _device_plan_of_first(kind, fenced):
    """(host bytes of plan A, device bytes A's kernels would read, host bytes of plan B)."""
    import torch
    from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

    from sglang_futuremap_patch.backports.flashinfer_host_indptr import (
        flashinfer_plan_fence,
        flashinfer_plans_queued,
    )

    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    cls = BatchPrefillWithRaggedKVCacheWrapper if kind == "ragged" else BatchPrefillWithPagedKVCacheWrapper
    wrapper = cls(workspace, "NHD", backend="fa2")
    device = torch.device("cuda")
    # Both buffers start equal (zero), and a warm-up plan of the larger batch fills the compared
    # bytes alike on both sides; the module is compiled / loaded outside the timed part.
    wrapper._pin_memory_int_workspace_buffer.zero_()
    wrapper._int_workspace_buffer.zero_()
    _plan(kind, wrapper, 37)
    torch.cuda.synchronize()

    torch.cuda._sleep(LAG_CYCLES)  # the stream lags: plan A's copy waits behind this
    host_indptrs = _plan(kind, wrapper, 5)
    plan_a = wrapper._pin_memory_int_workspace_buffer[:PLAN_BYTES].clone()
    flashinfer_plans_queued((wrapper,), device)
    # What A's kernels read: the device buffer once the stream has reached them.
    seen_by_a = wrapper._int_workspace_buffer[:PLAN_BYTES].clone()
    if fenced:
        flashinfer_plan_fence((wrapper,), (host_indptrs,))
    _plan(kind, wrapper, 37)
    plan_b = wrapper._pin_memory_int_workspace_buffer[:PLAN_BYTES].clone()
    torch.cuda.synchronize()
    return plan_a, seen_by_a.cpu(), plan_b


@pytest.mark.parametrize("kind", ["ragged", "paged"])
def test_the_first_plan_reaches_the_device_with_the_fence_and_not_without(kind, monkeypatch):
    import torch

    monkeypatch.delenv("SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR", raising=False)
    plan_a, seen, plan_b = _device_plan_of_first(kind, fenced=True)
    assert not torch.equal(plan_a, plan_b)  # the two batches plan differently
    assert torch.equal(seen, plan_a)
    # Control: without the fence the second plan overwrote the buffer before A's copy ran.
    plan_a, seen, plan_b = _device_plan_of_first(kind, fenced=False)
    assert torch.equal(seen, plan_b) and not torch.equal(seen, plan_a)
