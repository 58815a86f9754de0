"""Back-port 7: piecewise CUDA graph no longer forces the spec-v2 ``seq_lens`` host mirror.

Upstream: sgl-project/sglang#28633 ("Don't force seq_lens_cpu publication under piecewise CUDA
graph"). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.14+ (the
first release with #28633; 0.5.13 still carries the "FIXME: support PCG without seq lens cpu
value"). Depends on back-port 4 (it edits that patch's ``decide_needs_cpu_seq_lens``).

Why: piecewise CUDA graph (PCG) is on by default in 0.5.12.x, also for speculative decoding.
Back-port 4 forced the host mirror on whenever PCG was on, so a backend that declares
``needs_cpu_seq_lens = False`` (Triton; FA3 after back-port 8) kept the per-iteration
``.cpu()`` under the default server arguments and was mirror-free only with
``--disable-piecewise-cuda-graph``. The force was a precaution, and nothing in 0.5.12.x needs
it: PCG never sees a batch whose mirror the relay dropped.

How: ``decide_needs_cpu_seq_lens`` forces the mirror only under two-batch overlap (which
splits the verify batch with it); otherwise the backends decide. Where PCG reaches, in
0.5.12.post1 (each of these is declared below as a *guard*: the gate refuses to patch if
its source differs, because the argument depends on it): ``ModelRunner.init_piecewise_cuda_graphs``
returns before building a runner for a draft model runner, so draft decode and draft extend
(the batches that carry the relayed lengths) never meet PCG; the target model runner consults
PCG only in ``forward_extend``, where ``PiecewiseCudaGraphRunner.can_run`` and
``BreakableCudaGraphRunner.can_run`` both refuse ``TARGET_VERIFY`` (a verify without CUDA
graph, e.g. a batch above ``cuda_graph_max_bs``, runs eagerly, where back-port 4 already made
every reader None-safe). What is left for PCG is the target's prefill, an EXTEND batch built
on the host by ``prepare_for_extend``, which sets ``seq_lens_cpu`` and ``seq_lens_sum`` itself
and never passes through the relay (``resolve_seq_lens_cpu`` returns early for a batch
without ``future_indices``). Mixed chunks, which would put decode requests into an EXTEND
batch, are switched off for EAGLE, EAGLE3 and STANDALONE by the server arguments.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import GUARD, Backport, Target, TextEdit

#: ``decide_needs_cpu_seq_lens`` (back-port 4's): only two-batch overlap forces the mirror.
_DECIDE_EDITS = (
    TextEdit(
        old="""\
    if not getattr(server_args, "disable_piecewise_cuda_graph", False):
        # Piecewise CUDA graph builds its static batch from the host mirror.
        return True
""",
        new="""\
    # Piecewise CUDA graph runs only the target's prefill, a batch built on the host with
    # its own mirror; the relayed decode batches never reach it.
""",
    ),
)


_OVERLAP = "sglang.srt.managers.overlap_utils"
_RUNNER = "sglang.srt.model_executor.model_runner"
_PCG = "sglang.srt.model_executor.piecewise_cuda_graph_runner"
_BREAKABLE = "sglang.srt.model_executor.breakable_cuda_graph_runner"

BACKPORT = Backport(
    id="pcg-no-mirror",
    title="[Spec] Do not force the seq_lens host mirror under piecewise CUDA graph",
    upstream_prs=(28633,),
    patch_file="0007-Spec-Do-not-force-the-seq_lens-host-mirror-under-piecewise-CUDA-graph.patch",
    summary="piecewise CUDA graph (on by default) no longer forces the per-iteration seq_lens D2H",
    applied_upstream="0.5.14",
    targets=(
        # Edits cpu_seq_lens_optional's version (its fingerprint).
        Target(_OVERLAP, "decide_needs_cpu_seq_lens", None, expected="49efcad369ac1aca",
               kind="edit", edits=_DECIDE_EDITS),
        Target(_RUNNER, "ModelRunner.init_piecewise_cuda_graphs", None,
               expected="f0073ae03b19d47b", kind=GUARD),
        Target(_RUNNER, "ModelRunner.forward_extend", None,
               expected="21975f8101c34413", kind=GUARD),
        Target(_PCG, "PiecewiseCudaGraphRunner.can_run", None,
               expected="0772319c43d149b8", kind=GUARD),
        Target(_BREAKABLE, "BreakableCudaGraphRunner.can_run", None,
               expected="055e6a2e633187c1", kind=GUARD),
    ),
)
