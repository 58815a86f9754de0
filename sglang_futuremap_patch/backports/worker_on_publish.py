"""Back-port 1: EAGLE v2 workers publish ``seq_lens`` through an ``on_publish`` callback.

Upstream: sgl-project/sglang#25879 (worker half; callback named ``on_publish`` by #25962).
Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+.

Why: in 0.5.12.x the scheduler learns the post-verify sequence lengths only by waiting on the
``verify_done`` event. With this change the worker hands them to the scheduler's FutureMap the
moment they are final -- after the target forward on prefill, right after verify on decode --
so the scheduler can prepare the next batch while the draft extend still runs.

How: both workers' forward_batch_generation take an optional on_publish callback
(STANDALONE inherits the EAGLE worker's), and the workers declare accepts_on_publish so the
scheduler knows it may pass one: wrappers hide signatures, so nothing inspects them. Without
a callback the workers behave exactly as before, which keeps this change bisectable on its
own. Both functions are SGLang's own with the same three text edits (the parameter and the
two calls), in the plugin and in the patch alike.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: The same three edits for both workers' ``forward_batch_generation``.
_PUBLISH_EDITS = (
    # The scheduler passes the callback only to a worker that declares accepts_on_publish.
    TextEdit(
        old="""\
def forward_batch_generation(self, model_worker_batch: ModelWorkerBatch):
""",
        new="""\
def forward_batch_generation(
    self, model_worker_batch: ModelWorkerBatch, on_publish=None
):
""",
    ),
    # Prefill: the lengths are final once the target has run.
    TextEdit(
        old="""\
        batch_output = self.target_worker.forward_batch_generation(
            model_worker_batch
        )
""",
        new="""\
        batch_output = self.target_worker.forward_batch_generation(
            model_worker_batch
        )
        # The prefill's sequence lengths are final once the target has run: publish
        # them so the scheduler can prepare the next batch during the draft prefill.
        if on_publish is not None:
            on_publish(model_worker_batch.seq_lens)
""",
    ),
    # Decode: verify fixed the accepted lengths; the draft extend comes after.
    TextEdit(
        old="""\
        batch_output = self.verify(model_worker_batch)
""",
        new="""\
        batch_output = self.verify(model_worker_batch)
        # Verify fixed the accepted lengths: publish them before the draft extend.
        if on_publish is not None:
            on_publish(batch_output.next_draft_input.new_seq_lens)
""",
    ),
)


_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
_MULTI_LAYER = "sglang.srt.speculative.multi_layer_eagle_worker_v2"

BACKPORT = Backport(
    id="worker-on-publish",
    title="[Spec] EAGLE v2 workers: publish seq_lens through on_publish",
    upstream_prs=(25879, 25962),
    patch_file="0001-Spec-EAGLE-v2-workers-publish-seq_lens-through-on_publish.patch",
    summary="forward_batch_generation(..., on_publish=None) fires after target prefill / verify",
    targets=(
        Target(_EAGLE, "EAGLEWorkerV2.forward_batch_generation", None,
               expected="2d327020f22afe7d", kind="edit", edits=_PUBLISH_EDITS),
        Target(_EAGLE, "EAGLEWorkerV2.accepts_on_publish", True, expected=ABSENT, kind="value"),
        Target(_MULTI_LAYER, "MultiLayerEagleWorkerV2.forward_batch_generation", None,
               expected="eb9e3f58597e8252", kind="edit", edits=_PUBLISH_EDITS),
        Target(_MULTI_LAYER, "MultiLayerEagleWorkerV2.accepts_on_publish", True, expected=ABSENT,
               kind="value"),
    ),
)
