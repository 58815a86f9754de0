"""Back-port 21: an eager spec-v2 batch reads its host lengths from the relay, not behind a prefill.

Upstream: none (beyond upstream); it joins back-port 13's mirror for eager batches to back-port
14's relay of host lengths. Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete with back-port
13 (when users are on a release whose FA3 eager forwards need no host lengths). Depends on
back-ports 5, 13 and 14.

Why: without the host mirror (FA3 + piecewise CUDA graph, SGLang's default on Hopper), a
decode batch above the captured CUDA-graph sizes runs eagerly and gets the mirror (back-port
13): the private stream copies the whole length buffer after the *last* publish and the host
waits for that copy. When the batch before it was a prefill, the last publish is the
prefill's (the target prefill publishes its lengths), so the launch of the eager decode waits
for the prefill's target forward on the GPU, and the prefill's first tokens are processed only
after that launch. On the serving benchmark's eager row (``--cuda-graph-max-bs 8``,
concurrency 16) that wait was 7.0 ms per launch after a prefill (median of 4 boots, host
sampler in ``FutureMap.resolve_seq_lens_cpu``), the launch took 28.9 ms against stock's 19.0
and TTFT p50 was 3% above stock (results/serve-bench/h200x2-final). Yet the decode needs
nothing from the prefill: its other requests' lengths were fixed by the decode before, and
the prefilled ones were built on the host.

How: ``resolve_seq_lens_cpu`` asks ``relayed_eager_seq_lens`` first for such a batch. That
reads the relay's bookkeeping of back-port 14: a request slot whose length is a prefill's host
value, or a row of the private-stream copy taken after the publish of the decode that last
wrote it. When every request of the batch is covered, the host waits for that copy only (the
previous decode's verify, what stock's mirror waits for) and takes exactly the values the
mirror would have copied; otherwise the mirror, as before. An eager decode now also keeps that
copy after its own publish (``keep_draft_extend_lens`` took it only for a decode whose draft
extend asked for host lengths), so eager decodes in a row stay covered. The same integers either
way: token-identical by construction, and on a GPU (the e2e FA3 set's eager case
``fa3-standalone-graph-pcg-maxbs8`` among its 17/17; the serving record's eager row: no host wait
left in the launch after a prefill, 20.6 ms against stock's 21.5; results/serve-bench/h200x4-final).
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

# --------------------------------------------------------------------------- FutureMap


def relayed_eager_seq_lens(self, batch):
    """Host lengths of an eager decode ``batch`` from the relay, or None (use the mirror).

    Covered: every request's slot holds a prefill's host length or a row of the last
    private-stream copy (back-port 14's ``dx_host_known`` / ``dx_copy_of``). The host waits
    for that copy alone, never for a prefill launched since.
    """
    if not hasattr(self, "dx_copies") or not batch.reqs or not batch.forward_mode.is_decode():
        return None
    if self.dx_publish_count != self.publish_count:
        return None  # lengths published outside a forward seen by the relay (PD bootstrap)
    slots = self.batch_pool_slots(batch).numpy()
    from_host = self.dx_host_known[slots]
    copy_id = self.dx_copy_id
    covered = from_host if copy_id < 0 else from_host | (self.dx_copy_of[slots] == copy_id)
    if not covered.all():
        return None
    host_lens = self.dx_host_lens[slots]
    if from_host.all():
        return torch.from_numpy(host_lens)
    copied = self.dx_copied[copy_id % 2]
    if copied is not None:
        copied.synchronize()
    copy = self.dx_copies[copy_id % 2].numpy()[slots]
    return torch.from_numpy(np.where(from_host, host_lens, copy))


# --------------------------------------------------------------------------- text edits

_RESOLVE_EDITS = (
    TextEdit(
        old="""\
        batch.seq_lens_sum = None
        return
    if self.seq_lens_d2h_stream is None or self.publish_ready is None:
""",
        new="""\
        batch.seq_lens_sum = None
        return
    relayed = None if self.needs_cpu_seq_lens else self.relayed_eager_seq_lens(batch)
    if relayed is not None:
        # An eager batch: the relay has its lengths without waiting for a prefill.
        batch.seq_lens_cpu = relayed
        batch.seq_lens_sum = int(relayed.sum())
        return
    if self.seq_lens_d2h_stream is None or self.publish_ready is None:
""",
    ),
)

_KEEP_EDITS = (
    TextEdit(
        old="""\
        if getattr(model_worker_batch, "seq_lens_cpu_pending", None) is None:
""",
        new="""\
        if (
            getattr(model_worker_batch, "seq_lens_cpu_pending", None) is None
            and not self.mirrors_eager_batch(batch)
        ):
""",
    ),
)

_OVERLAP = "sglang.srt.managers.overlap_utils"

BACKPORT = Backport(
    id="eager-relay-lens",
    title="[Spec] Eager spec-v2 batches read host lengths from the relay, not behind a prefill",
    upstream_prs=(),
    patch_file="0021-Spec-Eager-spec-v2-batches-read-host-lengths-from-the-relay.patch",
    summary="a decode batch above the captured CUDA-graph sizes takes its host lengths from a "
            "prefill's host values and the previous decode's private copy instead of a mirror "
            "copy behind the prefill",
    applied_upstream=None,
    targets=(
        Target(_OVERLAP, "FutureMap.relayed_eager_seq_lens", relayed_eager_seq_lens,
               expected=ABSENT),
        Target(_OVERLAP, "FutureMap.resolve_seq_lens_cpu", None, expected="70f0f9a9bb5e1d9e",
               kind="edit", edits=_RESOLVE_EDITS),
        Target(_OVERLAP, "FutureMap.keep_draft_extend_lens", None, expected="b302bf7558071abf",
               kind="edit", edits=_KEEP_EDITS),
    ),
)
