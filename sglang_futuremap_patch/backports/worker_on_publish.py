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
own. The two functions are SGLang's own with the publish calls added.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import ABSENT, Backport, Target

def eagle_forward_batch_generation(
    self,
    model_worker_batch: ModelWorkerBatch,
    on_publish=None,
):
    if (
        model_worker_batch.forward_mode.is_extend()
        or model_worker_batch.is_extend_in_batch
    ):
        # Target prefill
        target_capture_mode = (
            CaptureHiddenMode.NULL
            if self.speculative_algorithm.is_standalone()
            else CaptureHiddenMode.FULL
        )
        model_worker_batch.capture_hidden_mode = target_capture_mode
        batch_output = self.target_worker.forward_batch_generation(
            model_worker_batch
        )
        # The prefill's sequence lengths are final once the target has run: publish
        # them so the scheduler can prepare the next batch during the draft prefill.
        if on_publish is not None:
            on_publish(model_worker_batch.seq_lens)

        # Draft prefill
        draft_capture_mode = (
            CaptureHiddenMode.NULL
            if self.speculative_algorithm.is_standalone()
            else CaptureHiddenMode.LAST
        )
        model_worker_batch.capture_hidden_mode = draft_capture_mode
        with (
            self.draft_worker.draft_tp_context(
                self.draft_worker.draft_runner.tp_group
            ),
            speculative_moe_backend_context(),
            speculative_moe_a2a_backend_context(),
        ):
            batch_output.next_draft_input = (
                self.draft_worker._draft_extend_for_prefill(
                    model_worker_batch,
                    batch_output.logits_output.hidden_states,
                    batch_output.next_token_ids,
                    batch_output.logits_output.mm_input_embeds,
                )
            )
            return batch_output
    else:
        if model_worker_batch.spec_info is None:
            capture_mode = (
                CaptureHiddenMode.NULL
                if self.speculative_algorithm.is_standalone()
                else CaptureHiddenMode.LAST
            )
            model_worker_batch.spec_info = EagleDraftInput.create_idle_input(
                device=self.device,
                hidden_size=EagleDraftInput.hidden_size_for(self.draft_worker),
                dtype=EagleDraftInput.dtype_for(self.draft_worker),
                topk=self.topk,
                capture_hidden_mode=capture_mode,
            )
        with (
            self.draft_worker.draft_tp_context(
                self.draft_worker.draft_runner.tp_group
            ),
            speculative_moe_backend_context(),
            speculative_moe_a2a_backend_context(),
        ):
            verify_input: EagleVerifyInput = self.draft_worker.draft(
                model_worker_batch
            )
        assert verify_input.is_verify_input()
        # Record a CUDA event after draft() GPU work is dispatched.
        # This event will be waited on by plan_stream in verify()
        # to ensure draft CUDA graph kernels finish before plan_stream
        # begins metadata preparation.
        if self.plan_stream:
            self._draft_done_event = torch.get_device_module(self.device).Event()
            self._draft_done_event.record()
        model_worker_batch.spec_info = verify_input
        batch_output = self.verify(model_worker_batch)
        # Verify fixed the accepted lengths: publish them before the draft extend.
        if on_publish is not None:
            on_publish(batch_output.next_draft_input.new_seq_lens)
        with (
            self.draft_worker.draft_tp_context(
                self.draft_worker.draft_runner.tp_group
            ),
            speculative_moe_backend_context(),
            speculative_moe_a2a_backend_context(),
        ):
            self.draft_worker._draft_extend_for_decode(
                model_worker_batch, batch_output
            )

        return batch_output


def multi_layer_forward_batch_generation(
    self,
    model_worker_batch: ModelWorkerBatch,
    on_publish=None,
):
    if (
        model_worker_batch.forward_mode.is_extend()
        or model_worker_batch.is_extend_in_batch
    ):
        # Target prefill
        target_capture_mode = (
            CaptureHiddenMode.NULL
            if self.speculative_algorithm.is_standalone()
            else CaptureHiddenMode.FULL
        )
        model_worker_batch.capture_hidden_mode = target_capture_mode
        batch_output = self.target_worker.forward_batch_generation(
            model_worker_batch
        )
        # The prefill's sequence lengths are final once the target has run: publish
        # them so the scheduler can prepare the next batch during the draft prefill.
        if on_publish is not None:
            on_publish(model_worker_batch.seq_lens)

        # Chain-style MTP needs FULL to get all-token hidden states;
        # non-chain only needs LAST (the target model's hidden states).
        model_worker_batch.capture_hidden_mode = (
            CaptureHiddenMode.FULL
            if self.draft_worker.chain_mtp_hidden_states
            else CaptureHiddenMode.LAST
        )
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(
            model_worker_batch,
            batch_output.logits_output.hidden_states,
            batch_output.next_token_ids,
        )
        return batch_output
    else:
        if model_worker_batch.spec_info is None:
            capture_mode = (
                CaptureHiddenMode.NULL
                if self.speculative_algorithm.is_standalone()
                else CaptureHiddenMode.LAST
            )
            model_worker_batch.spec_info = EagleDraftInput.create_idle_input(
                device=self.device,
                hidden_size=EagleDraftInput.hidden_size_for(self.draft_worker),
                dtype=EagleDraftInput.dtype_for(self.draft_worker),
                topk=self.topk * self.speculative_num_steps,
                capture_hidden_mode=capture_mode,
            )
        draft_input: EagleDraftInput = model_worker_batch.spec_info
        verify_input: EagleVerifyInput = self.draft_worker.draft(model_worker_batch)
        assert verify_input.is_verify_input()
        # Record a CUDA event after draft() GPU work is dispatched.
        if self.plan_stream:
            self._draft_done_event = torch.get_device_module(self.device).Event()
            self._draft_done_event.record()
        model_worker_batch.spec_info = verify_input
        batch_output = self.verify(model_worker_batch)
        # Verify fixed the accepted lengths: publish them before the draft extend.
        if on_publish is not None:
            on_publish(batch_output.next_draft_input.new_seq_lens)
        self.draft_worker._draft_extend_for_decode(model_worker_batch, batch_output)
        return batch_output


_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
_MULTI_LAYER = "sglang.srt.speculative.multi_layer_eagle_worker_v2"

BACKPORT = Backport(
    id="worker-on-publish",
    title="[Spec] EAGLE v2 workers: publish seq_lens through on_publish",
    upstream_prs=(25879, 25962),
    patch_file="0001-Spec-EAGLE-v2-workers-publish-seq_lens-through-on_publish.patch",
    summary="forward_batch_generation(..., on_publish=None) fires after target prefill / verify",
    targets=(
        Target(_EAGLE, "EAGLEWorkerV2.forward_batch_generation", eagle_forward_batch_generation,
               expected="2d327020f22afe7d"),
        Target(_EAGLE, "EAGLEWorkerV2.accepts_on_publish", True, expected=ABSENT, kind="value"),
        Target(_MULTI_LAYER, "MultiLayerEagleWorkerV2.forward_batch_generation",
               multi_layer_forward_batch_generation, expected="eb9e3f58597e8252"),
        Target(_MULTI_LAYER, "MultiLayerEagleWorkerV2.accepts_on_publish", True, expected=ABSENT,
               kind="value"),
    ),
)
