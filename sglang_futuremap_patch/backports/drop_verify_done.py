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
that pass it keep working). The functions are SGLang's own minus the waits; under spec v2
``seq_lens_sum`` is ``None`` between ``filter_batch`` and the next forward. Non-speculative
batches behave exactly as before.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import Backport, Target


def maybe_wait_verify_done(self):
    """No-op: publish/stash fences the spec-v2 seq_lens on the GPU (kept for callers)."""
    return None


def filter_batch(
    self,
    chunked_req_to_exclude: Optional[Union[Req, List[Req]]] = None,
    keep_indices: Optional[List[int]] = None,
    # FIXME(lsyin): deprecate this API after spec v1 is deprecated
    v1_spec_info_filtered: Optional[bool] = False,
):
    if keep_indices is None:
        if isinstance(chunked_req_to_exclude, Req):
            chunked_req_to_exclude = [chunked_req_to_exclude]
        elif chunked_req_to_exclude is None:
            chunked_req_to_exclude = []
        keep_indices = [
            i
            for i in range(len(self.reqs))
            if not self.reqs[i].finished()
            and self.reqs[i] not in chunked_req_to_exclude
        ]

    if keep_indices is None or len(keep_indices) == 0:
        # Filter out all requests
        self.reqs = []
        return

    if len(keep_indices) == len(self.reqs):
        # No need to filter
        return

    keep_indices_device = torch.tensor(
        keep_indices,
        dtype=torch.int64,
        pin_memory=is_pin_memory_available(self.device),
    ).to(self.device, non_blocking=True)

    if self.model_config.is_encoder_decoder:
        self.encoder_lens = self.encoder_lens[keep_indices_device]
        self.encoder_lens_cpu = [self.encoder_lens_cpu[i] for i in keep_indices]

    self.reqs = [self.reqs[i] for i in keep_indices]
    if self.multimodal_inputs is not None:
        self.multimodal_inputs = [self.multimodal_inputs[i] for i in keep_indices]
    self.req_pool_indices = self.req_pool_indices[keep_indices_device]
    self.seq_lens = self.seq_lens[keep_indices_device]
    self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]
    self.orig_seq_lens = self.orig_seq_lens[keep_indices_device]
    self.out_cache_loc = None
    # Spec v2 overlap: seq_lens is refreshed from the FutureMap right before the next
    # forward (resolve_seq_lens_cpu), which also recomputes the sum; summing here
    # would be a host sync on every decode iteration.
    self.seq_lens_sum = None if self.is_spec_v2 else self.seq_lens.sum().item()

    if self.output_ids is not None:
        self.output_ids = self.output_ids[keep_indices_device]

    self.mamba_track_indices = None
    self.mamba_track_mask = None
    self.mamba_track_seqlens = None
    self.return_logprob = any(req.return_logprob for req in self.reqs)
    if self.return_logprob:
        self.top_logprobs_nums = [self.top_logprobs_nums[i] for i in keep_indices]
        self.token_ids_logprobs = [self.token_ids_logprobs[i] for i in keep_indices]
    else:
        self.top_logprobs_nums = None
        self.token_ids_logprobs = None

    self.has_stream = any(req.stream for req in self.reqs)
    self.has_grammar = any(req.grammar for req in self.reqs)

    self.sampling_info.filter_batch(keep_indices, keep_indices_device)
    # NOTE: spec_info filtered before batch filtering only happens in:
    # - Spec v1's verify phase
    # - Only for decode batch (running_batch)
    has_been_filtered = v1_spec_info_filtered and not self.is_spec_v2

    if self.spec_info:
        self.spec_info.filter_batch(
            new_indices=keep_indices_device,
            has_been_filtered=has_been_filtered,
        )


def merge_batch(self, other: "ScheduleBatch"):
    # Penalizer orchestrator must be merged before Batch.reqs is merged. This is because
    # orchestrator.merge() depends on Batch.reqs during preparation of each penalizers, so it
    # needs to be called with pre-merged Batch.reqs.
    self.sampling_info.merge_batch(other.sampling_info)

    # Encoder-decoder infos
    if self.model_config.is_encoder_decoder:
        self.encoder_lens = torch.cat([self.encoder_lens, other.encoder_lens])
        self.encoder_lens_cpu.extend(other.encoder_lens_cpu)
    self.req_pool_indices = torch.cat(
        [self.req_pool_indices, other.req_pool_indices]
    )
    self.seq_lens = torch.cat([self.seq_lens, other.seq_lens])
    self.seq_lens_cpu = torch.cat([self.seq_lens_cpu, other.seq_lens_cpu])
    self.orig_seq_lens = torch.cat([self.orig_seq_lens, other.orig_seq_lens])
    self.out_cache_loc = None
    if self.seq_lens_sum is None or other.seq_lens_sum is None:
        # Deferred by filter_batch under spec v2; resolve_seq_lens_cpu recomputes it.
        self.seq_lens_sum = None
    else:
        self.seq_lens_sum += other.seq_lens_sum
    if self.output_ids is not None:
        self.output_ids = torch.cat([self.output_ids, other.output_ids])
    self.mamba_track_indices = None
    self.mamba_track_mask = None
    self.mamba_track_seqlens = None
    if self.return_logprob and other.return_logprob:
        self.top_logprobs_nums.extend(other.top_logprobs_nums)
        self.token_ids_logprobs.extend(other.token_ids_logprobs)
    elif self.return_logprob:
        self.top_logprobs_nums.extend([0] * len(other.reqs))
        self.token_ids_logprobs.extend([None] * len(other.reqs))
    elif other.return_logprob:
        self.top_logprobs_nums = [0] * len(self.reqs) + other.top_logprobs_nums
        self.token_ids_logprobs = [None] * len(self.reqs) + other.token_ids_logprobs
    self.reqs.extend(other.reqs)
    if self.multimodal_inputs is not None:
        self.multimodal_inputs.extend(other.multimodal_inputs)

    self.return_logprob |= other.return_logprob
    self.has_stream |= other.has_stream
    self.has_grammar |= other.has_grammar
    self.return_hidden_states |= other.return_hidden_states
    self.is_prefill_only = self.is_prefill_only and other.is_prefill_only

    if self.spec_info:
        self.spec_info.merge_batch(other.spec_info)


def prepare_for_decode(self: EagleDraftInput, batch: ScheduleBatch):
    batch.maybe_evict_swa()

    from sglang.srt.speculative.spec_utils import assign_req_to_token_pool_func

    bs = batch.batch_size()

    # Accumulate penalty
    # This is a relaxed version of penalties for speculative decoding.
    if batch.sampling_info.penalizer_orchestrator.is_required:
        output_ids = torch.tensor(
            [
                (
                    req.output_ids[-1]
                    if len(req.output_ids)
                    else req.origin_input_ids[-1]
                )
                for req in batch.reqs
            ],
            dtype=torch.int64,
            device=batch.device,
        )
        batch.sampling_info.penalizer_orchestrator.cumulate_output_tokens(
            output_ids
        )

    page_size = batch.token_to_kv_pool_allocator.page_size
    alloc_len_per_decode = get_alloc_len_per_decode()
    double_alloc = alloc_len_per_decode + alloc_len_per_decode

    cur_kv_lens = [0] * bs
    nxt_kv_lens = [0] * bs
    num_needed_tokens = 0
    for i, r in enumerate(batch.reqs):
        cur = r.kv_allocated_len
        # max(cur, ...) clamps so adaptive downswitch (smaller alloc_len_per_decode)
        # cannot make nxt < cur and corrupt allocator state. kv_committed_len lags
        # batch.seq_lens by ~1 verify in overlap mode, so we react to adaptive
        # switches one batch later than a seq_lens-based baseline; the 2*alloc
        # over-allocation buffer absorbs that lag.
        nxt = max(cur, r.kv_committed_len + double_alloc)
        cur_kv_lens[i] = cur
        nxt_kv_lens[i] = nxt
        num_needed_tokens += nxt - cur
        r.kv_allocated_len = nxt
        r.decode_batch_idx += 1
        # Pre-claim bonus slot here (like normal decode); resolve subtracts 1.
        r.kv_committed_len += 1

    cur_kv_lens_cpu = torch.tensor(cur_kv_lens, dtype=torch.int32, device="cpu")
    nxt_kv_lens_cpu = torch.tensor(nxt_kv_lens, dtype=torch.int32, device="cpu")

    if page_size == 1:
        out_cache_loc = alloc_token_slots(batch.tree_cache, num_needed_tokens)
    else:
        cur_kv_lens = cur_kv_lens_cpu.to(device=batch.device)
        nxt_kv_lens = nxt_kv_lens_cpu.to(device=batch.device)
        last_loc = get_last_loc(
            batch.req_to_token_pool.req_to_token,
            batch.req_pool_indices,
            cur_kv_lens,
        )
        out_cache_loc = alloc_paged_token_slots_extend(
            batch.tree_cache,
            cur_kv_lens,
            cur_kv_lens_cpu,
            nxt_kv_lens,
            nxt_kv_lens_cpu,
            last_loc,
            num_needed_tokens,
        )

    assign_req_to_token_pool_func(
        batch.req_pool_indices,
        batch.req_to_token_pool.req_to_token,
        cur_kv_lens_cpu.to(device=batch.device),
        nxt_kv_lens_cpu.to(device=batch.device),
        out_cache_loc,
        bs,
    )


def eagle_verify(self, batch: ModelWorkerBatch):
    # Since batch.seq_lens is allocated in another stream, we need
    # record_stream() to prevent pytorch gc and reuse the gpu memory
    # while forward_stream is still running.
    batch.seq_lens.record_stream(
        torch.get_device_module(self.device).current_stream()
    )

    # Parse args
    verify_input: EagleVerifyInput = batch.spec_info
    verify_input.num_tokens_per_req = self.speculative_num_steps + 1
    bs = len(batch.seq_lens)

    # Batch 1: Target verify
    # Prepare for target verify in a separate stream
    with self.plan_stream_ctx:
        # Wait for the draft CUDA graph to finish before plan_stream
        # begins its work. Using an event is more targeted than
        # wait_stream(main_stream) — it only waits for draft GPU
        # work, not all queued main_stream operations.
        if self.plan_stream and hasattr(self, "_draft_done_event"):
            self.plan_stream.wait_event(self._draft_done_event)
        verify_forward_batch, can_run_cuda_graph = (
            verify_input.prepare_for_v2_verify(
                self.req_to_token_pool,
                batch,
                self.target_worker,
            )
        )

    # Correct some buffers due to the overlap plan
    if self.plan_stream:
        torch.get_device_module(self.device).current_stream().wait_stream(
            self.plan_stream
        )
        if (
            _is_npu
            and self._target_worker.model_runner.model_is_mrope
            and batch.spec_info is not None
            and getattr(batch.spec_info, "positions", None) is not None
            and not batch.forward_mode.is_idle()
        ):
            # mrope_position depends on draft output in default stream and is computed in plan stream,
            # causing errors. Compute it here for correct values.
            verify_forward_batch.compute_spec_mrope_positions(
                self._target_worker.model_runner, batch
            )

        # Some values such as custom_mask and position depend on the output of draft,
        # so the previous plan step used the wrong values. Here, we need to run the related
        # computation again to update them to the correct values.
        self.target_worker.model_runner.attn_backend.update_verify_buffers_to_fill_after_draft(
            verify_input,
            (
                self.target_worker.model_runner.graph_runner.bs
                if can_run_cuda_graph
                else None
            ),
        )

    # Prepare grammar data on CPU if needed
    if batch.has_grammar:
        retrieve_next_token_cpu = verify_input.retrieve_next_token.cpu()
        retrieve_next_sibling_cpu = verify_input.retrieve_next_sibling.cpu()
        draft_tokens_cpu = verify_input.draft_token.view(
            verify_input.retrieve_next_token.shape
        ).cpu()

    # Run target verify batch in the main compute stream (GPU compute)
    forward_batch_output = self.target_worker.forward_batch_generation(
        model_worker_batch=None,
        forward_batch=verify_forward_batch,
        is_verify=True,
        skip_attn_backend_init=True,
    )
    logits_output = forward_batch_output.logits_output

    # Generate vocab mask for constrained decoding
    vocab_mask = None
    if batch.has_grammar:
        # Generate the logit mask for structured output.
        vocab_mask = generate_token_bitmask(
            batch.reqs,
            verify_input,
            retrieve_next_token_cpu,
            retrieve_next_sibling_cpu,
            draft_tokens_cpu,
            batch.sampling_info.vocab_size,
        )

        if vocab_mask is not None:
            assert verify_input.grammar is not None
            vocab_mask = vocab_mask.to(verify_input.retrieve_next_token.device)
            # NOTE: otherwise, this vocab mask will be the one from the previous extend stage
            # and will be applied to produce wrong results
            batch.sampling_info.vocab_mask = None

    # Sample
    maybe_detect_nan(logits_output.next_token_logits, "verify: target model logits")
    (
        predict,
        accept_lens,
        accept_index,
    ) = verify_input.sample(batch, logits_output, vocab_mask)
    new_seq_lens = batch.seq_lens + accept_lens

    # Update mamba state for hybrid GDN models after verification
    if (
        self.target_worker.model_runner.hybrid_gdn_config is not None
        or self.target_worker.model_runner.mamba2_config is not None
    ):
        self._mamba_verify_update(
            batch, verify_input, accept_lens, accept_index, bs
        )

    if not batch.forward_mode.is_idle():
        accept_tokens = predict[accept_index]
        bonus_tokens = torch.empty_like(accept_lens, dtype=torch.int32)
        fill_bonus_tokens[(bs,)](
            accept_tokens,
            accept_lens,
            bonus_tokens,
            self.speculative_num_draft_tokens,
        )
    else:
        bonus_tokens = torch.empty((0,), device=self.device, dtype=torch.int32)

    if batch.return_logprob and not batch.forward_mode.is_idle():
        compute_spec_v2_logprobs(
            batch, logits_output, predict, accept_index, self.speculative_num_steps
        )

    # Construct the next draft input
    next_draft_input = EagleDraftInput(
        bonus_tokens=bonus_tokens,
        new_seq_lens=new_seq_lens,
    )

    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=predict,
        can_run_cuda_graph=can_run_cuda_graph,
        speculative_num_draft_tokens=self.speculative_num_draft_tokens,
        next_draft_input=next_draft_input,
        accept_lens=accept_lens,
        routed_experts_output=forward_batch_output.routed_experts_output,
        indexer_topk_output=forward_batch_output.indexer_topk_output,
    )


def multi_layer_verify(
    self,
    batch: ModelWorkerBatch,
):
    # Since batch.seq_lens is allocated in another stream, we need
    # record_stream() to prevent pytorch gc and reuse the gpu memory
    # while forward_stream is still running.
    batch.seq_lens.record_stream(
        torch.get_device_module(self.device).current_stream()
    )

    # Parse args
    verify_input: EagleVerifyInput = batch.spec_info
    bs = len(batch.seq_lens)

    # Batch 1: Target verify
    # Prepare for target verify in a separate stream
    with self.plan_stream_ctx:
        # Wait for the draft CUDA graph to finish before plan_stream
        # begins its work.
        if self.plan_stream and hasattr(self, "_draft_done_event"):
            self.plan_stream.wait_event(self._draft_done_event)
        verify_forward_batch, can_run_cuda_graph = (
            verify_input.prepare_for_v2_verify(
                self.req_to_token_pool,
                batch,
                self.target_worker,
            )
        )

    # Correct some buffers due to the overlap plan
    if self.plan_stream:
        torch.get_device_module(self.device).current_stream().wait_stream(
            self.plan_stream
        )

        # Some values such as custom_mask and position depend on the output of draft,
        # so the previous plan step used the wrong values. Here, we need to run the related
        # computation again to update them to the correct values.
        self.target_worker.model_runner.attn_backend.update_verify_buffers_to_fill_after_draft(
            verify_input,
            (
                self.target_worker.model_runner.graph_runner.bs
                if can_run_cuda_graph
                else None
            ),
        )
    # Run target verify batch in the main compute stream
    forward_batch_output = self.target_worker.forward_batch_generation(
        model_worker_batch=None,
        forward_batch=verify_forward_batch,
        is_verify=True,
        skip_attn_backend_init=True,
    )
    logits_output = forward_batch_output.logits_output

    # Sample
    maybe_detect_nan(logits_output.next_token_logits, "verify: target model logits")
    (
        predict,
        accept_lens,
        accept_index,
    ) = verify_input.sample(batch, logits_output)
    new_seq_lens = batch.seq_lens + accept_lens
    if not batch.forward_mode.is_idle():
        accept_tokens = predict[accept_index]
        bonus_tokens = torch.empty_like(accept_lens, dtype=torch.int32)
        fill_bonus_tokens[(bs,)](
            accept_tokens,
            accept_lens,
            bonus_tokens,
            self.speculative_num_draft_tokens,
        )
    else:
        bonus_tokens = torch.empty((0,), device=self.device, dtype=torch.int32)

    if batch.return_logprob and not batch.forward_mode.is_idle():
        compute_spec_v2_logprobs(
            batch, logits_output, predict, accept_index, self.speculative_num_steps
        )

    # Construct the next draft input
    next_draft_input = EagleDraftInput(
        bonus_tokens=bonus_tokens,
        new_seq_lens=new_seq_lens,
    )
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=predict,
        can_run_cuda_graph=can_run_cuda_graph,
        speculative_num_draft_tokens=self.speculative_num_draft_tokens,
        next_draft_input=next_draft_input,
        accept_lens=accept_lens,
        routed_experts_output=forward_batch_output.routed_experts_output,
        indexer_topk_output=forward_batch_output.indexer_topk_output,
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
        Target(_BATCH, "ScheduleBatch.maybe_wait_verify_done", maybe_wait_verify_done,
               expected="dde4ba88b742904e"),
        Target(_BATCH, "ScheduleBatch.filter_batch", filter_batch, expected="927eb9a095b52446"),
        Target(_BATCH, "ScheduleBatch.merge_batch", merge_batch, expected="72e002bc8dad97fa"),
        Target(_EAGLE_INFO_V2, "EagleDraftInputV2Mixin.prepare_for_decode", prepare_for_decode,
               expected="709934ae80bc13ab"),
        Target(_EAGLE, "EAGLEWorkerV2.verify", eagle_verify, expected="1ab702a0b4fe27e9"),
        Target(_MULTI_LAYER, "MultiLayerEagleWorkerV2.verify", multi_layer_verify,
               expected="689d3e57591d20c8"),
    ),
)
