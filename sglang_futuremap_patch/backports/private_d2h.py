"""Back-port 5: the seq_lens host mirror is copied on a private stream, gated on the publish alone.

Upstream: sgl-project/sglang#26380 (pinned buffer + private D2H stream) and #26463 (why the copy
runs there). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+.
Depends on the back-ports before it (it edits their ``resolve_seq_lens_cpu`` and
``init_spec_relay``).

Why: for attention backends that still need ``seq_lens_cpu`` (FlashInfer, FA3, MLA, ...),
``resolve_seq_lens_cpu`` ends with one device-to-host copy per iteration. Done as
``seq_lens.cpu()`` on the schedule stream, the host also waits for everything queued on that
stream since the last iteration (the KV-slot writes of ``prepare_for_decode``, the gather right
before it), and the copy goes through pageable memory. Here a private stream waits for the
``publish_ready`` event only and copies the whole length buffer into a pinned host buffer, so
the host wakes up as soon as verify has published. (Upstream needed this to step around its WAR
barrier on the schedule stream; 0.5.12.x has no such barrier, so what is left is the smaller
gain described above.)

How: ``init_spec_relay`` allocates the pinned buffer and the stream when the mirror is needed
and the relay lives on CUDA; ``resolve_seq_lens_cpu`` picks the batch's rows from the host copy
by each request's pool slot, which the host already knows (``FutureMap.batch_pool_slots``).
Without CUDA, or before the first publish, it falls back to the plain ``.cpu()``.

Upstream keeps the slots on the host beside the batch (``ScheduleBatch.req_pool_indices_cpu``,
0.5.13), which 0.5.12.x lacks; the requests carry them too, except one released after the batch
was built: SGLang processes the last result before launching a spec-v2 decode with a grammar
(``is_disable_overlap_for_batch``), and so does back-port 16, and a request that result finishes
is freed (``req_pool_idx`` None) while it is still a row of that decode. For such a batch
``batch_pool_slots`` reads the batch's device indices back instead, what stock's ``.cpu()`` of the
lengths costs every iteration.
"""

from __future__ import annotations

import torch

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit


def batch_pool_slots(self, batch):
    """The request-pool slot of each row of ``batch``: a CPU int64 tensor.

    From the requests, with no device read, unless one of them was released after the batch
    was built (a result processed before this launch finished it: SGLang's grammar sync on
    spec v2, back-port 16). That request is still a row of the batch, but only the device
    indices keep its slot, so they are read back. Its slot is not handed out again before the
    launch: new requests get slots only when the next batch is built.
    """
    slots = [req.req_pool_idx for req in batch.reqs]
    if None in slots:
        return batch.req_pool_indices.cpu()
    return torch.tensor(slots, dtype=torch.int64)


#: ``FutureMap.init_spec_relay`` (as back-port 4 leaves it): the pinned buffer and the stream.
_INIT_RELAY_EDITS = (
    TextEdit(
        old="""\
    self.new_seq_lens_buf = torch.zeros(
        (self.req_pool_size,), dtype=torch.int64, device=self.device
    )
""",
        new="""\
    self.new_seq_lens_buf = torch.zeros(
        (self.req_pool_size,), dtype=torch.int64, device=self.device
    )
    # Host mirror of the whole length buffer, filled on a private stream (CUDA only).
    if needs_cpu_seq_lens and self.new_seq_lens_buf.is_cuda:
        self.new_seq_lens_cpu_pinned = torch.empty(
            (self.req_pool_size,), dtype=torch.int64, pin_memory=True
        )
        self.seq_lens_d2h_stream = torch.get_device_module(self.device).Stream()
    else:
        self.new_seq_lens_cpu_pinned = None
        self.seq_lens_d2h_stream = None
""",
    ),
)

#: ``FutureMap.resolve_seq_lens_cpu`` (as back-port 4 leaves it): the copy waits for the
#: publish alone, and the batch's rows are picked on the host.
_RESOLVE_EDITS = (
    TextEdit(
        old="""\
    batch.seq_lens_cpu = batch.seq_lens.cpu()
    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
""",
        new="""\
    if self.seq_lens_d2h_stream is None or self.publish_ready is None:
        batch.seq_lens_cpu = batch.seq_lens.cpu()  # not CUDA, or nothing published yet
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        return
    # A .cpu() here would sync the schedule stream and so also wait for the work queued on
    # it since the last iteration; the private stream waits for the publish and nothing else.
    stream = self.seq_lens_d2h_stream
    stream.wait_event(self.publish_ready)
    with torch.get_device_module(self.device).stream(stream):
        self.new_seq_lens_cpu_pinned.copy_(self.new_seq_lens_buf, non_blocking=True)
    stream.synchronize()
    # The rows of the batch are its requests' pool slots, known on the host.
    batch.seq_lens_cpu = self.new_seq_lens_cpu_pinned[self.batch_pool_slots(batch)]
    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
""",
    ),
)


_OVERLAP = "sglang.srt.managers.overlap_utils"

BACKPORT = Backport(
    id="private-d2h",
    title="[Spec] Copy the spec-v2 seq_lens mirror on a private stream",
    upstream_prs=(26380, 26463),
    patch_file="0005-Spec-Copy-the-spec-v2-seq_lens-mirror-on-a-private-stream.patch",
    summary="seq_lens_cpu D2H on a private stream gated on publish_ready, into a pinned buffer",
    targets=(
        Target(_OVERLAP, "FutureMap.batch_pool_slots", batch_pool_slots, expected=ABSENT),
        # Edits of the relay as back-ports 2 and 4 leave it (fingerprints of that).
        Target(_OVERLAP, "FutureMap.init_spec_relay", None, expected="67c0868d899de19b",
               kind="edit", edits=_INIT_RELAY_EDITS),
        Target(_OVERLAP, "FutureMap.resolve_seq_lens_cpu", None, expected="fbee35e79f1429fc",
               kind="edit", edits=_RESOLVE_EDITS),
    ),
)
