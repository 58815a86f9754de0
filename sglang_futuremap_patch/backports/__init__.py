"""One module per upstream change; ``SERIES`` is their order (also the order of ``patches/``)."""

from __future__ import annotations

import importlib

from sglang_futuremap_patch._engine import Backport

#: Module names under this package, in patch order. A later module may replace a function
#: an earlier one already replaced (its Target declares the earlier version's fingerprint).
SERIES: tuple[str, ...] = (
    "worker_on_publish",
    "publish_stash",
    "drop_verify_done",
    "cpu_seq_lens_optional",
    "private_d2h",
    "fused_gather",
    "pcg_no_mirror",
    "fa3_device_page_table",
    "auto_tree_spec_v1",
    "tree_draft_extend_width",
    "spec_v2_tree",
    "paged_tree_spec_v2",
    "eager_mirror",
    "draft_extend_lens",
    "chain_fast_path",
    "prefill_result_first",
    "war_barrier",
    "fa3_mla_device_metadata",
    "early_intake",
    "flashinfer_host_prefix_sum",
    "eager_relay_lens",
    "mirror_relay_lens",
    "flashinfer_host_indptr",
    "tree_kv_move_warmup",
    "decode_assign_warmup",
    "prefill_write_warmup",
    "war_barrier_after_launch",
)


def load_series() -> tuple[Backport, ...]:
    """Import the back-port modules (this imports the SGLang modules they target)."""
    return tuple(importlib.import_module(f"{__name__}.{name}").BACKPORT for name in SERIES)
