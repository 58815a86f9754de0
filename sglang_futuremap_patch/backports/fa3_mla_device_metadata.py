"""Back-port 18: FA3 with MLA (DeepSeek V3/R1 with MTP) builds its spec-v2 metadata on the device.

Upstream: sgl-project/sglang#29343 and #29589 (FA3 builds its spec-v2 page tables on the
device and opts out of the host mirror). Upstream never set MLA apart: from 0.5.16 on,
``FlashAttentionBackend.needs_cpu_seq_lens`` is False for the whole class, MHA and MLA alike
(read from the 0.5.16 and 0.5.23 wheels; in 0.5.23 only a sharded KV pool, which 0.5.12.x does
not have, opts back in). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete with back-port 8
(when users are on 0.5.16+). Depends on back-port 8.

Why: on Hopper SGLang 0.5.12.x picks FA3 for MLA models, so DeepSeek V3/R1 with MTP (EAGLE with
the model's NextN layer, topk 1, on spec v2) runs on FA3, and back-port 8 left MLA on the host
mirror: those deployments kept one ``seq_lens`` copy per iteration, the scheduler waiting for
each verify before it could build the next batch.

How: in 0.5.12.x FA3 builds MLA's spec-v2 metadata with the very code that builds MHA's: the
same branches of ``init_forward_metadata``, the same captured buffers
(``decode_cuda_graph_metadata``, ``target_verify_metadata``, ``draft_extend_metadata``) and the
same fields read by the MLA branches of ``forward_decode`` and ``forward_extend`` (page table,
``cache_seqlens``, ``cu_seqlens_q``, ``cu_seqlens_k``, ``max_seqlen_q``). The kernel is FA3's
``flash_attn_with_kvcache`` with ``qv``: no ``max_seqlen_k`` argument, so it takes the page-table
width as its ``seqlen_k`` and sizes its split-KV work from it, exactly as for MHA, and no
scheduler metadata is precomputed for MLA. So back-port 8's paths are exact for MLA for the
same reasons, path by path: a CUDA-graph replay of draft decode or target verify fills the
captured buffers from the device lengths (the replayed launch is the captured one, at full
width); the draft extend, eager in every iteration (0.5.12.x captures no draft-extend graph for
FA3), reads the exact host lengths of the copy the draft worker starts with the draft
(back-ports 4 and 14) unless ``num_splits`` is pinned to 1, where the static width is exact: a
host read kept on purpose, since a static width there would change FA3's split count and so the
numerics (0.5.23 accepts that; this series does not); a batch above the captured sizes gets
the private-stream mirror (back-port 13). The DeepSeek model code reads no host lengths in a
spec-v2 forward (its FA3 dispatch sums ``extend_prefix_lens_cpu`` for a prefill only, and
copes with None). So this back-port only takes MLA out of back-port 8's exclusions (one line
of ``builds_spec_metadata_on_device``); MLA with topk > 1, context parallel, FA4, or every
forward eager with the split heuristic free (CUDA graph off, ``num_splits`` 0) keeps the mirror
as before. On by default since the GPU e2e ``mla`` group (a DeepSeek-V3-shaped model with its
NextN layer, FA3 MLA + piecewise CUDA graph, CUDA graph on and off, EOS churn, radix cache)
matched stock token for token with it; ``SGLANG_FUTUREMAP_FA3_MLA=0`` keeps MLA on the mirror
(back-port 8's behaviour), for comparison or as a way back.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

_FA = "sglang.srt.layers.attention.flashattention_backend"

#: ``0`` keeps FA3 with MLA on the host mirror, as back-port 8 alone does; unset or anything else:
#: MLA builds its spec-v2 metadata on the device like MHA.
FA3_MLA_ENV = "SGLANG_FUTUREMAP_FA3_MLA"


def fa3_mla_device_metadata_wanted() -> bool:
    """Whether MLA joins back-port 8's device-built configurations (yes unless
    ``SGLANG_FUTUREMAP_FA3_MLA=0``)."""
    import os

    # Installed into SGLang's FA3 module and run with its globals: the name is spelled out.
    return os.environ.get("SGLANG_FUTUREMAP_FA3_MLA", "").strip() != "0"


# Back-port 8's coverage check, with MLA covered unless SGLANG_FUTUREMAP_FA3_MLA=0.
_COVERAGE_EDITS = (
    TextEdit(
        old="""\
        and self.topk <= 1
        and not self.use_mla
""",
        new="""\
        and self.topk <= 1
        # MLA reads its spec-v2 metadata from MHA's buffers, built the same way.
        and (not self.use_mla or fa3_mla_device_metadata_wanted())
""",
    ),
)

BACKPORT = Backport(
    id="fa3-mla-device-metadata",
    title="[Spec] FA3 with MLA builds spec-v2 metadata on the device and drops the seq_lens mirror",
    upstream_prs=(29343, 29589),
    patch_file="0018-Spec-FA3-with-MLA-builds-spec-v2-metadata-on-the-device.patch",
    summary="FlashAttentionBackend with MLA (DeepSeek MTP, topk 1) drops the seq_lens mirror "
            "like MHA",
    applied_upstream="0.5.16",
    targets=(
        Target(_FA, "fa3_mla_device_metadata_wanted", fa3_mla_device_metadata_wanted, expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.builds_spec_metadata_on_device", None,
               expected="afd74c79deadedee", kind="edit", edits=_COVERAGE_EDITS),
    ),
)
