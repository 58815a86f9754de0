"""Back-port 23: FlashInfer plans an extend (a prefill, the spec-v2 draft extend) from host indptrs.

Upstream: none as such (beyond upstream). SGLang 0.5.23 plans its FlashInfer draft extend
(captured as a CUDA graph there) from host-known layouts by default, through its own
``fast_prefill_plan``; 0.5.12.x runs that draft extend eagerly through the extend path changed
here. Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on a release whose
FlashInfer extend plans read no device tensor back. Depends on back-port 20 (the prefix lengths'
host copy reaches ``update_single_wrapper``).

Why: FlashInfer's ``plan()`` needs the batch's index pointers on the host and copies them back
(``qo_indptr.to("cpu")``) when it is handed device tensors, which SGLang's prefill updater does.
That copy waits for every kernel queued before it. In spec v2 on FlashInfer the draft extend of
each decode iteration is such an extend (eager: 0.5.12.x captures no draft-extend graph for
FlashInfer), so the host waited there for the whole target verify before it could launch the
draft extend, and every prefill launch waited for the decodes queued before it. The serving
record (results/serve-bench/h200x2-host-2026-11-26, ``--frames``) has that wait as the largest
host frame of the patched FlashInfer decode launch: 4.36 ms at concurrency 1. With the host
blocked there, the iteration was serial, so the plugin's own host work per iteration added to
it (TPOT p50 x0.955 of stock at concurrency 1).

How: the prefill updater's single-wrapper path already has the host copies of the lengths the
device indptrs are built from (``seq_lens_cpu``; ``extend_prefix_lens_cpu``, from back-port 20).
``flashinfer_extend_host_indptrs`` builds the same cumulative sums on the host, and
``call_begin_forward`` hands those, and the host copy of the last-page lengths (all 1: page
size 1), to ``plan()`` instead of the device tensors. The device indptrs are still built, and
still feed the KV-index kernel. ``plan()`` makes the same plan from the same integers and
uploads them (a host-to-device copy, which waits for nothing), so the kernels read the same
values as in stock: token-identical by construction. Only a plain extend takes it (no spec
input, no multi-item scoring, host lengths of the batch's size); verify, sliding-window and
cross-attention plans are unchanged.

The fence: ``plan()`` writes its plan into the wrapper's pinned host buffer and queues the copy
of that buffer to the device without waiting. Stock's read-back made every ``plan()`` wait for
the queue first, so the previous copy had always run before the buffer was rewritten. Without
that wait, two plans of one wrapper in a row (consecutive prefills, which nothing between them
makes the host wait for) let the second plan overwrite the buffer before the first copy read
it, and the first forward ran with the second batch's plan: an illegal memory access in the
serving benchmark at concurrency 45 (results/serve-bench/h200x4-fence-2026-11-27; the same
hazard mini-sglang fixed in its FlashInfer backend). So ``flashinfer_plans_queued`` records an
event per wrapper after its plans, and ``flashinfer_plan_fence`` waits for it before that
wrapper's next host plan: for the previous plan's copy, which is queued before the previous
forward, so the host still waits less than stock. In the decode loop the verify's own plan
(device indptrs, a full wait) lies between two draft-extend plans, so the fence finds the
event done. ``tests/gpu/test_flashinfer_plan_fence.py`` shows both on a GPU: with the fence
the device gets the first plan, without it the second.

**On by default**: on a GPU the e2e ``fiplan`` group
(FlashInfer, five workloads, the check below on) is token-identical to stock, and the serving
FlashInfer row has TPOT p50 x1.36-1.54 and TTFT p50 x1.11-1.31 at concurrency 1-48
(results/serve-bench/h100x2-fiplan-2026-11-27); with the fence, ``fiplan`` and the FlashInfer
cases of ``mrelay`` 7 of 7 (results/serve-bench/h200x4-fence-2026-11-27).
``SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR=0`` keeps the device indptrs;
``SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR_CHECK=1`` reads the device indptrs back and raises
on any difference (a host wait per plan; for test runs).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List, Optional

import torch

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

if TYPE_CHECKING:
    from sglang.srt.layers.attention.flashinfer_backend import MultiItemScoringParams
    from sglang.srt.speculative.spec_info import SpecInput

#: Set to 0 to plan from the device indptrs as stock does (on by default: module docstring).
HOST_INDPTR_ENV = "SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR"
#: Set to 1 to compare the host indptrs with the device ones at every plan (a host wait each).
HOST_INDPTR_CHECK_ENV = "SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR_CHECK"


def flashinfer_extend_host_indptrs(
    seq_lens_cpu: Optional[torch.Tensor],
    extend_prefix_lens_cpu: Optional[List[int]],
    use_ragged: bool,
    batch_size: int,
    spec_info: Optional[SpecInput],
    multi_item_params: Optional[MultiItemScoringParams],
):
    """The host ``(qo_indptr, kv_indptr, kv_last_page_len)`` that ``call_begin_forward`` builds
    on the device for a plain extend, or None where it does not apply.

    ``kv_indptr`` sums the paged part's lengths: the prefixes on the ragged path, the whole
    sequences otherwise (``update_single_wrapper``'s ``paged_kernel_lens``); ``qo_indptr``
    sums the new tokens (sequence minus prefix). int32, as the device buffers are.
    ``SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR=0``: None (plan from the device, as stock).
    """
    if os.environ.get("SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR", "").strip() == "0":
        return None
    if spec_info is not None or seq_lens_cpu is None or extend_prefix_lens_cpu is None:
        return None
    if multi_item_params is not None and multi_item_params.is_enabled():
        return None
    seq_lens = seq_lens_cpu.tolist()
    prefix_lens = list(extend_prefix_lens_cpu)
    if len(seq_lens) != batch_size or len(prefix_lens) != batch_size:
        return None
    qo_indptr, kv_indptr = [0], [0]
    for seq_len, prefix_len in zip(seq_lens, prefix_lens):
        qo_indptr.append(qo_indptr[-1] + seq_len - prefix_len)
        kv_indptr.append(kv_indptr[-1] + (prefix_len if use_ragged else seq_len))
    return (
        torch.tensor(qo_indptr, dtype=torch.int32),
        torch.tensor(kv_indptr, dtype=torch.int32),
        torch.ones(batch_size, dtype=torch.int32),
    )


def flashinfer_plan_indptrs(host_indptrs, qo_indptr, kv_indptr, kv_last_page_len):
    """What ``plan()`` is given: the host indptrs where they were built, else the device ones.

    With ``SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR_CHECK=1`` the device values are read back
    and must equal the host ones (a mismatch raises: the plan would differ from stock's).
    """
    device = (qo_indptr, kv_indptr, kv_last_page_len)
    if host_indptrs is None:
        return device
    if os.environ.get("SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR_CHECK", "").strip() == "1":
        for name, host, dev in zip(("qo_indptr", "kv_indptr", "kv_last_page_len"),
                                   host_indptrs, device):
            if host.tolist() != dev.tolist():
                raise RuntimeError(
                    f"sglang_futuremap_patch flashinfer-host-indptr: host {name} "
                    f"{host.tolist()} differs from the device's {dev.tolist()}")
    return host_indptrs


def flashinfer_plan_fence(wrappers: tuple, host_indptrs: Optional[tuple]) -> None:
    """Before ``plan()`` is handed host indptrs: wait until each wrapper's previous plan has
    been copied to the device.

    ``plan()`` writes its plan into the wrapper's pinned host buffer and queues a copy of that
    buffer to the device (``cudaMemcpyAsync``, no wait). Stock's device indptrs made every
    ``plan()`` wait for the queued work first (``qo_indptr.to("cpu")``), so that copy had run
    before the next plan rewrote the buffer. Host indptrs remove that wait: two plans of one
    wrapper in a row (consecutive prefills) would let the second overwrite the buffer before
    the first copy has read it, and the first forward would run with the second's plan (seen
    on a GPU: an illegal memory access). The wait here is for the previous plan's copy only,
    which is queued before that plan's forward: less than stock waited.
    """
    if host_indptrs is None:
        return  # plan() reads device indptrs back: it waits for everything queued itself
    for wrapper in wrappers:
        copied = getattr(wrapper, "_sglang_futuremap_plan_copied", None)
        if copied is not None:
            copied.synchronize()


def flashinfer_plans_queued(wrappers: tuple, device: torch.device) -> None:
    """After ``plan()``: mark, on the current stream, where each wrapper's plan copy was
    queued (``flashinfer_plan_fence`` waits for it before that wrapper's next host plan).
    Nothing with ``SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR=0`` (stock: every plan waits)."""
    if os.environ.get("SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR", "").strip() == "0":
        return
    if device.type == "meta":
        return
    for wrapper in wrappers:
        if wrapper is None:
            continue
        copied = getattr(wrapper, "_sglang_futuremap_plan_copied", None)
        if copied is None:
            copied = torch.get_device_module(device).Event()
            wrapper._sglang_futuremap_plan_copied = copied
        copied.record()


_SINGLE_WRAPPER_EDITS = (
    TextEdit(
        old="""\
        fixed_split_size=fixed_split_size,
        multi_item_params=multi_item_params,
    )
""",
        new="""\
        fixed_split_size=fixed_split_size,
        multi_item_params=multi_item_params,
        host_indptrs=flashinfer_extend_host_indptrs(
            seq_lens_cpu, extend_prefix_lens_cpu, use_ragged, len(seq_lens),
            spec_info, multi_item_params,
        ),
    )
""",
    ),
)

_CALL_BEGIN_FORWARD_EDITS = (
    TextEdit(
        old="""\
    cross_attention_custom_mask: Optional[torch.Tensor] = None,
):
""",
        new="""\
    cross_attention_custom_mask: Optional[torch.Tensor] = None,
    host_indptrs: Optional[tuple] = None,
):
""",
    ),
    TextEdit(
        old="""\
    # extend part
    if use_ragged:
        wrapper_ragged.begin_forward(
            qo_indptr,
            qo_indptr,
""",
        new="""\
    # plan() reads its indptrs on the host: hand it the host copies where there are some.
    plan_qo_indptr, plan_kv_indptr, plan_last_page_len = flashinfer_plan_indptrs(
        host_indptrs, qo_indptr, kv_indptr, self.kv_last_page_len[:bs]
    )
    planned = (wrapper_ragged if use_ragged else None, wrapper_paged)
    flashinfer_plan_fence(planned, host_indptrs)

    # extend part
    if use_ragged:
        wrapper_ragged.begin_forward(
            plan_qo_indptr,
            plan_qo_indptr,
""",
    ),
    TextEdit(
        old="""\
        max_item_len_ptr=max_item_len_ptr,
    )
""",
        new="""\
        max_item_len_ptr=max_item_len_ptr,
    )
    flashinfer_plans_queued(planned, qo_indptr.device)
""",
    ),
    TextEdit(
        old="""\
    wrapper_paged.begin_forward(
        qo_indptr,
        kv_indptr,
        kv_indices,
        self.kv_last_page_len[:bs],
""",
        new="""\
    wrapper_paged.begin_forward(
        plan_qo_indptr,
        plan_kv_indptr,
        kv_indices,
        plan_last_page_len,
""",
    ),
)

_FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend"

BACKPORT = Backport(
    id="flashinfer-host-indptr",
    title="[Attention] FlashInfer plans extends from host indptrs",
    upstream_prs=(),
    patch_file="0023-Attention-FlashInfer-plans-extends-from-host-indptrs.patch",
    summary="FlashInfer's extend plans (prefills, the spec-v2 draft extend) take the host copies "
            "of their indptrs instead of reading the device ones back behind the queued work",
    applied_upstream=None,
    targets=(
        Target(_FLASHINFER, "flashinfer_extend_host_indptrs", flashinfer_extend_host_indptrs,
               expected=ABSENT),
        Target(_FLASHINFER, "flashinfer_plan_indptrs", flashinfer_plan_indptrs, expected=ABSENT),
        Target(_FLASHINFER, "flashinfer_plan_fence", flashinfer_plan_fence, expected=ABSENT),
        Target(_FLASHINFER, "flashinfer_plans_queued", flashinfer_plans_queued, expected=ABSENT),
        Target(_FLASHINFER, "FlashInferIndicesUpdaterPrefill.update_single_wrapper", None,
               expected="97fc84a611319459", kind="edit", edits=_SINGLE_WRAPPER_EDITS),
        Target(_FLASHINFER, "FlashInferIndicesUpdaterPrefill.call_begin_forward", None,
               expected="9859205030d8c371", kind="edit", edits=_CALL_BEGIN_FORWARD_EDITS),
    ),
)
