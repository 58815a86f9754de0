"""Back-port 3: nothing on the spec-v2 schedule path waits for verify any more.

Upstream: sgl-project/sglang#25879 (drop ``verify_done``), #25818 (defer ``seq_lens_sum``),
#26020 (the schedule batch keeps a valid ``seq_lens`` mirror). Applies to: SGLang 0.5.12 and
0.5.12.post1. Delete when users are on 0.5.13+. Depends on back-port 2.

Why: with publish/stash the schedule batch never holds a tensor the forward is still
writing, so the host waits in ``filter_batch``, ``merge_batch`` and the EAGLE
``prepare_for_decode`` (``verify_done.synchronize()``), the per-iteration ``seq_lens`` D2H in
``prepare_for_decode`` and the ``seq_lens.sum().item()`` in ``filter_batch`` only cost time:
``resolve_seq_lens_cpu`` produces all three values right before the forward that needs them.

How: ``maybe_wait_verify_done`` stays, as a no-op, for code outside SGLang that calls it;
the workers no longer record ``verify_done`` (the dataclass field stays, so constructors
that pass it keep working). Each change is a text edit of SGLang's function, the same in the
plugin and in the patch: the waits, the copy and the event go, and under spec v2
``seq_lens_sum`` is ``None`` between ``filter_batch`` and the next forward. Non-speculative
batches behave exactly as before.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import Backport, Target, TextEdit

#: ``ScheduleBatch.maybe_wait_verify_done``: nothing left to wait for.
_WAIT_EDITS = (
    TextEdit(
        old="""\
    if self.is_spec_v2:
        draft_input: EagleDraftInput = self.spec_info
        if draft_input.verify_done is not None:
            draft_input.verify_done.synchronize()
""",
        new="""\
    # Kept for callers: publish/stash fences the spec-v2 seq_lens on the GPU, so nothing
    # waits for verify any more.
    return None
""",
    ),
)

#: ``ScheduleBatch.filter_batch``: no wait, and the sum would be a host sync every decode
#: iteration.
_FILTER_EDITS = (
    TextEdit(
        old="""\
    # FIXME(lsyin): used here to get the correct seq_lens
    # The batch has been launched but we need it verified to get correct next batch info
    self.maybe_wait_verify_done()
""",
        new="""\
    # seq_lens is the value the batch was launched with (spec v2: publish/stash), valid
    # without waiting for verify.
""",
    ),
    TextEdit(
        old="""\
    self.seq_lens_sum = self.seq_lens.sum().item()
""",
        new="""\
    # Spec v2 overlap: seq_lens is refreshed from the FutureMap right before the next
    # forward (resolve_seq_lens_cpu), which also recomputes the sum; summing here
    # would be a host sync on every decode iteration.
    self.seq_lens_sum = None if self.is_spec_v2 else self.seq_lens.sum().item()
""",
    ),
)

#: ``ScheduleBatch.merge_batch``: no wait, and a sum that filter_batch deferred stays deferred.
_MERGE_EDITS = (
    TextEdit(
        old="""\
    # In the regular scheduler path:
    # 1) self is always prefill, whose seq_lens is not a future
    # 2) other is always decode, which is finished in previous step
    # so verify_done is already synced and this is a no-op.
    # In disagg decode + overlap, merge_batch can be called before
    # filter_batch, so running_batch.seq_lens may still be a forward_stream
    # future. Synchronize here to avoid a cross-stream data race.
    self.maybe_wait_verify_done()
""",
        new="""\
    # Neither batch's seq_lens is a forward-stream future (spec v2: publish/stash), also
    # in disagg decode + overlap: nothing to wait for.
""",
    ),
    TextEdit(
        old="""\
    self.seq_lens_sum += other.seq_lens_sum
""",
        new="""\
    if self.seq_lens_sum is None or other.seq_lens_sum is None:
        # Deferred by filter_batch under spec v2; resolve_seq_lens_cpu recomputes it.
        self.seq_lens_sum = None
    else:
        self.seq_lens_sum += other.seq_lens_sum
""",
    ),
)

#: ``EagleDraftInputV2Mixin.prepare_for_decode``: neither the wait nor the host copy.
_DECODE_EDITS = (
    TextEdit(
        old="""\
    # Now seq_lens is correct
    batch.maybe_wait_verify_done()
""",
        new="""\
    # seq_lens is the value this batch was launched with, refreshed before the forward.
""",
    ),
    TextEdit(
        old="""\
    # FIXME(lsyin): make this sync optional
    batch.seq_lens_cpu = batch.seq_lens.cpu()
    batch.seq_lens_sum = batch.seq_lens_cpu.sum().item()
""",
        new="""\
    # The host mirror and its sum: FutureMap.resolve_seq_lens_cpu, right before the forward.
""",
    ),
)

#: Both workers' ``verify``: no ``verify_done`` event (the field stays, default None).
_VERIFY_EDITS = (
    TextEdit(
        old="""\
    verify_done = torch.get_device_module(self.device).Event()
    verify_done.record()
""",
        new="""\
    # No verify_done event: the worker publishes the new lengths instead (on_publish).
""",
    ),
    TextEdit(
        old="""\
        new_seq_lens=new_seq_lens,
        verify_done=verify_done,
""",
        new="""\
        new_seq_lens=new_seq_lens,
""",
    ),
)


_BATCH = "sglang.srt.managers.schedule_batch"
_EAGLE_INFO_V2 = "sglang.srt.speculative.eagle_info_v2"
_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
_MULTI_LAYER = "sglang.srt.speculative.multi_layer_eagle_worker_v2"

BACKPORT = Backport(
    id="drop-verify-done",
    title="[Spec] Drop the verify_done waits and seq_lens syncs from the schedule path",
    upstream_prs=(25879, 25818, 26020),
    patch_file="0003-Spec-Drop-the-verify_done-waits-and-seq_lens-syncs.patch",
    summary="no verify_done wait in filter/merge/prepare_for_decode; sum deferred",
    targets=(
        Target(_BATCH, "ScheduleBatch.maybe_wait_verify_done", None, expected="dde4ba88b742904e",
               kind="edit", edits=_WAIT_EDITS),
        Target(_BATCH, "ScheduleBatch.filter_batch", None, expected="927eb9a095b52446",
               kind="edit", edits=_FILTER_EDITS),
        Target(_BATCH, "ScheduleBatch.merge_batch", None, expected="72e002bc8dad97fa",
               kind="edit", edits=_MERGE_EDITS),
        Target(_EAGLE_INFO_V2, "EagleDraftInputV2Mixin.prepare_for_decode", None,
               expected="709934ae80bc13ab", kind="edit", edits=_DECODE_EDITS),
        Target(_EAGLE, "EAGLEWorkerV2.verify", None, expected="1ab702a0b4fe27e9", kind="edit",
               edits=_VERIFY_EDITS),
        Target(_MULTI_LAYER, "MultiLayerEagleWorkerV2.verify", None, expected="689d3e57591d20c8",
               kind="edit", edits=_VERIFY_EDITS),
    ),
)
