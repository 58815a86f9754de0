"""Back-port 20: FlashInfer's ragged prefill sums its prefix lengths on the host.

Upstream: the same change is in SGLang 0.5.14's FlashInfer backend (``update_single_wrapper``
takes the host's ``extend_prefix_lens_cpu`` and sums it; the TODO above the old line asked for
exactly that); its pull request number is not recorded here. Applies to: SGLang 0.5.12 and
0.5.12.post1 (0.5.13 still syncs there). Delete when users are on 0.5.14+.

Why: on FlashInfer, every prefill that takes the ragged path (SGLang's default there: no
deterministic inference, no multimodal or multi-item scoring, outside piecewise CUDA graph)
plans its paged part with ``prefix_lens.sum().item()``. That reads a GPU tensor back, so the
scheduler's host waits for all the GPU work queued before it, the decodes in flight included,
before it can launch the prefill. The serving record (results/serve-bench/h200x4-2026-11-26,
FlashInfer rows, ``--timeline``) has the wait at this line as the largest host wait of every
prefill launch on both sides: 32.0 ms stock, 37.4 ms patched at concurrency 32, where TTFT p50
is 7% above stock. Spec v2 without ``maybe_wait_verify_done`` keeps more decode work queued, so
the plugin pays more for that sync at some concurrencies than stock.

How: ``FlashInferAttnBackend.init_forward_metadata`` hands the prefill updater the batch's
host copy of the same lengths (``forward_batch.extend_prefix_lens_cpu``: the list the device
tensor was built from; that branch of the function already reads it). The single-wrapper
updater sums that list instead of reading the device sum back, unless switched off
(``flashinfer_host_prefix_sum_on``); the same integer either way, so the plan is the same. The
sliding-window and cross-attention updaters take the new argument and leave it unused (their
own syncs are a different computation). **On by default**: the same integer as the read-back,
so the same plan: token-identical by construction, and on a GPU (the e2e ``fihost`` group, 2/2,
results/serve-bench/h200x4-final, where the wait is gone from every patched prefill launch).
``SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM=0`` keeps the read-back.
"""

from __future__ import annotations

import os

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: Set to 0 to keep the device-sum read-back (on by default: module docstring).
HOST_PREFIX_SUM_ENV = "SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM"


def flashinfer_host_prefix_sum_on() -> bool:
    """Whether FlashInfer's ragged prefill sums ``extend_prefix_lens_cpu`` on the host instead
    of reading the device sum back (unless ``SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM=0``)."""
    return os.environ.get("SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM", "").strip() != "0"


def _new_keyword(note: str = "") -> tuple[TextEdit, ...]:
    """A prefill updater's signature end with the new keyword after it; ``note``: a comment
    for an updater that takes it and leaves it unused (it also keeps those two hunks apart,
    which would otherwise be the same text)."""
    return (
        TextEdit(
            old="""\
    cross_attention_custom_mask: Optional[torch.Tensor] = None,
):
""",
            new=f"""\
    cross_attention_custom_mask: Optional[torch.Tensor] = None,
    extend_prefix_lens_cpu: Optional[List[int]] = None,{note}
):
""",
        ),
    )


_SINGLE_WRAPPER_EDITS = (
    *_new_keyword(),
    TextEdit(
        old="""\
        # TODO: remove this device sync, we can use forward_batch.extend_prefix_lens_cpu
        # and forward_batch.extend_seq_lens_cpu
        paged_kernel_lens = prefix_lens
        paged_kernel_lens_sum = paged_kernel_lens.sum().item()
""",
        new="""\
        paged_kernel_lens = prefix_lens
        if extend_prefix_lens_cpu is not None and flashinfer_host_prefix_sum_on():
            # The host's copy of the same lengths: no wait for the GPU work queued before.
            paged_kernel_lens_sum = sum(extend_prefix_lens_cpu)
        else:
            paged_kernel_lens_sum = paged_kernel_lens.sum().item()
""",
    ),
)

_INIT_METADATA_EDITS = (
    TextEdit(
        old="""\
            cross_attention_custom_mask=forward_batch.cross_attention_custom_mask,
        )
""",
        new="""\
            cross_attention_custom_mask=forward_batch.cross_attention_custom_mask,
            extend_prefix_lens_cpu=forward_batch.extend_prefix_lens_cpu,
        )
""",
    ),
)

_FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend"

BACKPORT = Backport(
    id="flashinfer-host-prefix-sum",
    title="[Attention] FlashInfer's ragged prefill sums its prefix lengths on the host",
    upstream_prs=(),
    patch_file="0020-Attention-FlashInfer-s-ragged-prefill-sums-its-prefix-lengths-on-the-host.patch",
    summary="FlashInfer's ragged prefill plans from the host's prefix lengths instead of a "
            "device-sum read-back that waits for the decodes in flight",
    applied_upstream="0.5.14",
    targets=(
        Target(_FLASHINFER, "flashinfer_host_prefix_sum_on", flashinfer_host_prefix_sum_on,
               expected=ABSENT),
        Target(_FLASHINFER, "FlashInferAttnBackend.init_forward_metadata", None,
               expected="620c26a565a499b9", kind="edit", edits=_INIT_METADATA_EDITS),
        Target(_FLASHINFER, "FlashInferIndicesUpdaterPrefill.update_single_wrapper", None,
               expected="f3fb1cb49c8023fd", kind="edit", edits=_SINGLE_WRAPPER_EDITS),
        Target(_FLASHINFER, "FlashInferIndicesUpdaterPrefill.update_sliding_window", None,
               expected="93161e06cf435fca", kind="edit",
               edits=_new_keyword("  # unused (sliding window)")),
        Target(_FLASHINFER, "FlashInferIndicesUpdaterPrefill.update_cross_attention", None,
               expected="13b955d3237f5a4f", kind="edit",
               edits=_new_keyword("  # unused (cross attention)")),
    ),
)
