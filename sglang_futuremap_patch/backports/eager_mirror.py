"""Back-port 13: a spec-v2 batch that will run eagerly gets the private-stream host mirror.

Upstream: none as such; it completes sgl-project/sglang#29343 (FA3 builds its spec-v2 page
tables on the device, back-port 8) for the batches that do not replay a CUDA graph, with the
private-stream copy of #26380 (back-port 5). Applies to: SGLang 0.5.12 and 0.5.12.post1.
Delete with back-port 8 (when users are on 0.5.16+). Depends on back-port 8 (and on 5, whose mirror it lends).

Why: without the host mirror (FA3 + piecewise CUDA graph, SGLang's default on Hopper), a
decode batch above the largest captured CUDA-graph batch (``cuda_graph_max_bs``) runs its
draft decode and target verify eagerly, and FA3's eager metadata then asks for the exact host
maximum of the lengths (back-port 8's ``host_seq_lens_stand_in``): a ``seq_lens.cpu()`` on the
forward stream, once before the draft (it waits for the previous forward) and once before the
verify (it waits for this batch's own draft). The host stops twice per iteration and the GPU
idles while the verify is launched: such batches decoded slower than stock, which copies the
lengths once per iteration, after the previous verify.

How: the host knows before launching a batch whether it fits a captured graph. At start-up
the scheduler reads the largest captured batch size of the target's and the draft's
CUDA-graph runners and, when an attention backend says its eager forwards need the host
lengths (``eager_needs_cpu_seq_lens``: FA3 unless ``num_splits`` is pinned to 1, where the
static bound is exact), tells the FutureMap (``eager_mirror_above_bs``). ``resolve_seq_lens_cpu``
then gives a larger batch the mirror exactly as a mirror backend gets it (back-port 5: the
private stream waits for the last publish only, the host for that copy), so every eager
metadata build of that batch reads exact host lengths, as in stock SGLang, and none copies on
demand. Batches a graph replays keep running without the mirror.

Plugin and patch are the same text: three small edits of the relay's ``init_spec_relay``
(the pinned buffer and the private stream are allocated on CUDA whether or not every batch
needs the mirror), ``resolve_seq_lens_cpu`` and ``Scheduler.init_overlap``.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

# --------------------------------------------------------------------------- the decision


def eager_mirror_above_bs(target_runner, draft_worker, backends):
    """The batch size above which a spec-v2 batch runs eagerly and needs the host mirror.

    ``None`` when no attention backend's eager forward reads the host lengths (Triton) or
    when nothing is captured (CUDA graph off: the mirror is then on for every batch, or not
    needed). Otherwise the smaller of the target's and the draft's largest captured batch.
    """
    if not any(getattr(b, "eager_needs_cpu_seq_lens", False) for b in backends if b is not None):
        return None
    runners = [getattr(target_runner, "graph_runner", None), getattr(draft_worker, "cuda_graph_runner", None)]
    sizes = [getattr(r, "max_bs", None) for r in runners if r is not None]
    sizes = [s for s in sizes if isinstance(s, int)]
    return min(sizes) if sizes else None


@property
def eager_needs_cpu_seq_lens(self):
    """FA3's eager metadata sizes its split-KV work from the exact host maximum, unless
    ``num_splits`` is pinned to 1 (then a static bound gives the same attention)."""
    return self.num_splits != 1


# --------------------------------------------------------------------------- FutureMap


def mirrors_eager_batch(self, batch):
    """Whether ``batch`` runs eagerly on a backend that then reads the host lengths."""
    above = getattr(self, "eager_mirror_above_bs", None)
    return above is not None and len(batch.reqs) > above


# --------------------------------------------------------------------------- text edits

_INIT_OVERLAP_EDITS = (
    TextEdit(
        old="""\
        self.future_map.init_spec_relay(
            self.req_to_token_pool,
            self.forward_stream,
            needs_cpu_seq_lens=needs_cpu_seq_lens,
        )
""",
        new="""\
        self.future_map.init_spec_relay(
            self.req_to_token_pool,
            self.forward_stream,
            needs_cpu_seq_lens=needs_cpu_seq_lens,
        )
        if not needs_cpu_seq_lens:
            from sglang.srt.managers.overlap_utils import eager_mirror_above_bs

            # A batch above the captured CUDA-graph sizes runs eagerly; backends whose
            # eager forwards read the host lengths then get the mirror for it.
            self.future_map.eager_mirror_above_bs = eager_mirror_above_bs(
                target_runner, draft, backends
            )
""",
    ),
)

_INIT_RELAY_EDITS = (
    TextEdit(
        old="""\
    # Host mirror of the whole length buffer, filled on a private stream (CUDA only).
    if needs_cpu_seq_lens and self.new_seq_lens_buf.is_cuda:
""",
        new="""\
    # Host mirror of the whole length buffer, filled on a private stream (CUDA only);
    # also without the mirror, for the batches that run eagerly (eager_mirror_above_bs).
    self.eager_mirror_above_bs = None
    if self.new_seq_lens_buf.is_cuda:
""",
    ),
)

_RESOLVE_EDITS = (
    TextEdit(
        old="""\
    if not self.needs_cpu_seq_lens:
        batch.seq_lens_cpu = None
""",
        new="""\
    if not self.needs_cpu_seq_lens and not self.mirrors_eager_batch(batch):
        batch.seq_lens_cpu = None
""",
    ),
)

_OVERLAP = "sglang.srt.managers.overlap_utils"
_SCHEDULER = "sglang.srt.managers.scheduler"
_FA = "sglang.srt.layers.attention.flashattention_backend"

BACKPORT = Backport(
    id="eager-mirror",
    title="[Spec] Give spec-v2 batches that run eagerly the private-stream seq_lens mirror",
    upstream_prs=(29343, 26380),
    patch_file="0013-Spec-Give-eager-spec-v2-batches-the-private-stream-seq_lens-mirror.patch",
    summary="a decode batch above the captured CUDA-graph sizes reads the private-stream mirror "
            "instead of two on-demand seq_lens copies",
    applied_upstream=None,
    targets=(
        Target(_OVERLAP, "eager_mirror_above_bs", eager_mirror_above_bs, expected=ABSENT),
        Target(_FA, "FlashAttentionBackend.eager_needs_cpu_seq_lens", eager_needs_cpu_seq_lens,
               expected=ABSENT),
        Target(_OVERLAP, "FutureMap.mirrors_eager_batch", mirrors_eager_batch, expected=ABSENT),
        Target(_OVERLAP, "FutureMap.init_spec_relay", None, expected="31ae4c134893cdf9", kind="edit",
               edits=_INIT_RELAY_EDITS),
        Target(_OVERLAP, "FutureMap.resolve_seq_lens_cpu", None, expected="87c08e019de244c3", kind="edit",
               edits=_RESOLVE_EDITS),
        Target(_SCHEDULER, "Scheduler.init_overlap", None, expected="a825d4f7212c9ff8", kind="edit",
               edits=_INIT_OVERLAP_EDITS),
    ),
)
