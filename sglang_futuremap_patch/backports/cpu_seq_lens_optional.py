"""Back-port 4: the spec-v2 ``seq_lens`` host mirror is optional, per attention backend.

Upstream: sgl-project/sglang#26128 ("make spec_v2 seq_lens_cpu optional via per-backend
needs_cpu_seq_lens; Triton opts out"), with the lesson of #31364 (never hand a kernel the
stale pinned ``seq_lens_cpu`` graph buffer of an earlier batch). Applies to: SGLang 0.5.12
and 0.5.12.post1. Delete when users are on 0.5.13+. Depends on back-ports 2 and 3.

Why: after publish/stash the one host wait left per spec-v2 iteration is the ``.cpu()`` in
``FutureMap.resolve_seq_lens_cpu``, which blocks the scheduler until verify has finished.
Triton's CUDA-graph replay rebuilds its metadata from device tensors and never reads
``seq_lens_cpu`` / ``seq_lens_sum``, so when every backend a spec-v2 forward touches is
Triton that wait buys nothing.

How: ``AttentionBackend.needs_cpu_seq_lens`` (True) is a per-backend declaration; the two
Triton backends declare False. Two more declarations on ``AttentionBackend`` tell the draft
what a backend still reads without the mirror, with what every backend does in 0.5.12.x as
their defaults: ``draft_extend_needs_cpu_seq_lens`` (False: its eager draft extend needs no
exact host lengths) and ``reads_verify_tree_mask`` (True: its verify reads the draft's tree
mask); no backend overrides them here (back-port 8 does for FA3). The spec workers list the backends they may use
(``spec_v2_attn_backends``; the adaptive EAGLE worker includes every pre-built runtime
state), ``Scheduler.init_overlap`` asks ``decide_needs_cpu_seq_lens`` and hands the answer to
the FutureMap. Two-batch overlap and piecewise CUDA graph read the mirror outside the
backends, so either forces it on (piecewise CUDA graph is on by default: the mirror is only
dropped with ``--disable-piecewise-cuda-graph`` or a setting that disables it, e.g. DP
attention); so does an mrope or n-gram-embedding model (their draft-extend inputs are built
from the host prefix lengths). With the flag off ``resolve_seq_lens_cpu`` keeps the device
gather and sets ``seq_lens_cpu`` and ``seq_lens_sum`` to None, and every reader on the
spec-v2 path copes (the plugin module's docstring has the table).

=============================================  ================================================
Reader (0.5.12.post1)                          With no mirror (``seq_lens_cpu``/sum None)
=============================================  ================================================
ScheduleBatch.filter_batch                     slices the mirror only if there is one
ScheduleBatch.merge_batch                      mirror None if either side has none
ScheduleBatch.get_model_worker_batch, copy()   unchanged: None is copied through
EagleVerifyInputV2Mixin.prepare_for_v2_verify  unchanged: copies None onto the verify input;
                                               its only reader is TBO (forces the mirror on)
EagleDraftWorker.draft,                        at the start, when the draft-extend backend
MultiLayerEagleDraftWorker.draft               declares ``draft_extend_needs_cpu_seq_lens``
(``BaseDraftWorker.                            (FA3, back-port 8: its eager metadata wants the
copy_seq_lens_for_draft_extend``)              exact maximum) and no draft-extend CUDA graph
                                               will replay the batch (EAGLE on FA3 has none in
                                               0.5.12.x; MTP has one up to its largest batch),
                                               a non-blocking copy of the lengths, queued
                                               behind the previous forward only
EagleDraftWorker.draft,                        tree-mask sizing: 0 with a preallocated mask
MultiLayerEagleDraftWorker.draft               (CUDA graph); the small QLEN_ONLY layout when
                                               the verify backend declares
                                               ``reads_verify_tree_mask = False`` (FA3 with
                                               topk 1, back-port 8); else bs * pool row width
ForwardBatch.init_new                          unchanged: copies None through (its extend
                                               block is fed host lists, see next row)
ForwardBatch._pad_inputs_to_size (DP)          sum stays None
EagleDraftInputV2Mixin.                        GPU-only branch: extend lengths are host-known
prepare_for_extend_to_fill_draft_kvcache       (num_draft_tokens each); with the copy above
                                               it waits for it and builds what it builds with
                                               the mirror; otherwise the prefix lengths and
                                               positions are set on the device after init_new
                                               (a placeholder list goes in: init_new, a
                                               classmethod, is left as it is)
CudaGraphRunner.replay_prepare                 sum None passed through; seq_lens_cpu=None, not
                                               the stale pinned buffer (#31364)
EAGLEDraftExtendCudaGraphRunner.replay,        same as replay_prepare
MultiLayerEagleDraftExtendCudaGraphRunner.
replay
EAGLEDraftCudaGraphRunner.replay               unchanged: already guards None
TritonAttnBackend.init_forward_metadata        eager decode without spec_info, target verify
                                               and extend (DRAFT_EXTEND_V2) size kv_indices by
                                               bs * pool row width (an upper bound; written
                                               by kv_indptr); with a mirror: as before
TritonMultiStepDraftBackend.common_template    slice bound num_seqs * pool row width
TritonAttnBackend replay (graph)               unchanged: ignores both arguments
scheduler metrics: _build_scheduled_request_   sum(req.seqlen) / per-request req.seqlen
metrics, _estimate_decode_perf,                (host values, lag the device by the in-flight
report_decode_stats                            verify: fine for metrics)
=============================================  ================================================

Not reached on this path: TBO splitting and piecewise CUDA graph (both force the mirror on),
non-spec decode (``alloc_for_decode``; not spec v2), spec v1 (no overlap, no FutureMap), the
disaggregation bootstrap (a prebuilt batch builds its own host mirror), the other backends
(they keep ``needs_cpu_seq_lens = True``).

The copied SGLang functions differ from the originals only where a comment mentions the
missing mirror; with a mirror every one of them behaves exactly as before.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import ABSENT, Backport, Target


# --------------------------------------------------------------------------- the decision


def decide_needs_cpu_seq_lens(server_args, backends):
    """Whether spec-v2 batches must carry the ``seq_lens`` host mirror and its sum.

    ``backends``: every attention backend a spec-v2 forward may use (``None`` slots, e.g. a
    worker without a draft-extend backend, are skipped). A backend that does not declare
    ``needs_cpu_seq_lens`` is assumed to need the mirror.
    """
    if getattr(server_args, "enable_two_batch_overlap", False):
        # TBO splits the batch (and the verify mask) using the host mirror.
        return True
    if not getattr(server_args, "disable_piecewise_cuda_graph", False):
        # Piecewise CUDA graph builds its static batch from the host mirror.
        return True
    return any(getattr(b, "needs_cpu_seq_lens", True) for b in backends if b is not None)


# --------------------------------------------------------------------------- FutureMap


def init_spec_relay(self, req_to_token_pool, forward_stream, needs_cpu_seq_lens=True):
    """Index the speculative relay by request-pool slot (the scheduler calls this once).

    ``needs_cpu_seq_lens`` False: ``resolve_seq_lens_cpu`` refreshes only the device lengths.
    """
    self.req_pool_size = req_to_token_pool.req_to_token.shape[0]
    self.forward_stream = forward_stream
    self.needs_cpu_seq_lens = needs_cpu_seq_lens
    self.new_seq_lens_buf = torch.zeros(
        (self.req_pool_size,), dtype=torch.int64, device=self.device
    )
    # Created on first publish, on whatever device this map lives on.
    self.publish_ready = None
    # Lets the scheduler tell whether a worker published during its forward.
    self.publish_count = 0
    self.buf_initialized = False


def resolve_seq_lens_cpu(self, batch):
    """Schedule stream: refresh ``seq_lens`` from the last publish, and its host mirror and
    sum when some backend needs them.

    The stream waits on ``publish_ready`` instead of the host. With the mirror, the
    ``.cpu()`` below is the one host wait left per iteration (it ends when verify ends);
    without it there is none: both host values are None and the readers use the device
    lengths.
    """
    draft_input = batch.spec_info
    future_indices = draft_input.future_indices if draft_input is not None else None
    if future_indices is None:
        return
    if self.publish_ready is not None:
        self.publish_ready.wait()
    # The batch must advance every iteration, mirror or not.
    batch.seq_lens = self.new_seq_lens_buf[future_indices.indices]
    if not self.needs_cpu_seq_lens:
        batch.seq_lens_cpu = None
        batch.seq_lens_sum = None
        return
    batch.seq_lens_cpu = batch.seq_lens.cpu()
    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())


# --------------------------------------------------------------------------- Scheduler


def init_overlap(self):
    self.device_module = torch.get_device_module(self.device)

    if use_mlx():
        # MLX overlap scheduling uses mx.async_eval / mx.eval for
        # synchronisation so no CUDA/MPS streams or FutureMap needed.
        self.future_map = None
        # Empty result_queue is needed because idle-check references it
        # when enable_overlap is True.
        self.result_queue: Deque = deque()
        return

    self.forward_stream_ctx: CudaStreamContext = self.device_module.stream(
        self.forward_stream
    )
    self.copy_stream: CudaStream = self.device_module.Stream()
    self.copy_stream_ctx: CudaStreamContext = self.device_module.stream(
        self.copy_stream
    )

    if not self.enable_overlap:
        self.future_map = None
        return

    self.future_map = FutureMap(
        self.max_running_requests,
        self.chunked_prefill_size,
        self.model_config.context_len,
        self.device,
        self.spec_algorithm,
    )
    if not self.spec_algorithm.is_none():
        from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

        # Every attention backend a spec-v2 forward may use votes on the host mirror;
        # a worker that does not list them is judged by the target backend alone.
        target_runner = self.tp_worker.model_runner
        backends = getattr(
            self.draft_worker, "spec_v2_attn_backends", (target_runner.attn_backend,)
        )
        needs_cpu_seq_lens = decide_needs_cpu_seq_lens(self.server_args, backends)
        draft = getattr(self.draft_worker, "draft_worker", None)
        runners = [target_runner, getattr(draft, "draft_runner", None)]
        runners += list(getattr(draft, "draft_runner_list", None) or [])
        if any(
            getattr(r, "model_is_mrope", False) or getattr(r, "use_ngram_embedding", False)
            for r in runners
            if r is not None
        ):
            # Their draft-extend inputs (mrope positions, n-gram columns) are built
            # from the host prefix lengths.
            needs_cpu_seq_lens = True
        self.future_map.init_spec_relay(
            self.req_to_token_pool,
            self.forward_stream,
            needs_cpu_seq_lens=needs_cpu_seq_lens,
        )
    self.batch_record_buf = [None] * 2
    self.batch_record_ct = 0


# --------------------------------------------------------------------------- workers


@property
def base_spec_v2_attn_backends(self):
    """Attention backends a spec-v2 forward of this worker may use (default: the target's)."""
    return (self.target_worker.model_runner.attn_backend,)


@property
def eagle_spec_v2_attn_backends(self):
    """Target, draft-decode and draft-extend backends, of every adaptive runtime state too.

    ``apply_runtime_state`` swaps these for a pre-built state's at run time; every state
    is built before ``__init__`` returns (``AdaptiveController.init_states``).
    """
    dw = self._draft_worker
    backends = [
        self._target_worker.model_runner.attn_backend,
        dw.draft_attn_backend,
        dw.draft_extend_attn_backend,
    ]
    if self.adaptive_controller is not None:
        for state in self.adaptive_controller._states.values():
            backends.append(state.target_attn_backend)
            backends.append(state.draft_attn_backend)
            backends.append(state.draft_extend_attn_backend)
    return tuple(backends)


@property
def multi_layer_spec_v2_attn_backends(self):
    """Target backend and the per-step draft-extend backends (drafting runs through them)."""
    return (
        self._target_worker.model_runner.attn_backend,
        *self._draft_worker.draft_extend_attn_backend_list,
    )


# --------------------------------------------------------------------------- SGLang's readers
# SGLang's functions (filter/merge: back-port 3's versions), edited where a comment
# mentions the missing mirror.


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
    if self.seq_lens_cpu is not None:  # None: spec v2 without the host mirror
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
    if self.seq_lens_cpu is None or other.seq_lens_cpu is None:
        # Spec v2 without the host mirror: a partial mirror would be wrong;
        # resolve_seq_lens_cpu sets it (or None) before the next forward.
        self.seq_lens_cpu = None
    else:
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


def triton_init_forward_metadata(self, forward_batch: ForwardBatch):
    """Init auxiliary variables for triton attention backend."""

    bs = forward_batch.batch_size
    kv_indptr = self.kv_indptr
    window_kv_indptr = self.window_kv_indptr
    window_kv_indices = None
    window_num_kv_splits = None
    window_kv_offsets = None
    swa_attn_logits = None
    spec_info = forward_batch.spec_info

    if forward_batch.forward_mode.is_decode_or_idle():
        if spec_info is None:
            kv_indptr[1 : bs + 1] = torch.cumsum(forward_batch.seq_lens, dim=0)
            kv_indptr = kv_indptr[: bs + 1]
            # No host mirror (needs_cpu_seq_lens False): size by the pool row
            # width, an upper bound of every length; the kernel writes by kv_indptr.
            seq_lens_sum = forward_batch.seq_lens_sum
            if seq_lens_sum is None:
                seq_lens_sum = bs * self.req_to_token.shape[1]
            kv_indices = torch.empty(
                seq_lens_sum, dtype=torch.int64, device=self.device
            )
            create_flashinfer_kv_indices_triton[(bs,)](
                self.req_to_token,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                kv_indptr,
                None,
                kv_indices,
                self.req_to_token.stride(0),
            )
            # Sliding window
            if (
                self.sliding_window_size is not None
                and self.sliding_window_size > 0
            ):
                window_kv_indptr, window_kv_indices, window_kv_lens, _ = (
                    update_sliding_window_buffer(
                        self.window_kv_indptr,
                        self.req_to_token,
                        self.sliding_window_size,
                        forward_batch.seq_lens,
                        forward_batch.req_pool_indices,
                        bs,
                        self.device,
                        self.token_to_kv_pool_allocator,
                    )
                )
                window_num_kv_splits = torch.empty(
                    (bs,), dtype=torch.int32, device=self.device
                )
                self.get_num_kv_splits(window_num_kv_splits, window_kv_lens)
        else:
            kv_indptr, kv_indices = spec_info.kv_indptr, spec_info.kv_indices
            bs = kv_indptr.shape[0] - 1

        attn_logits = torch.empty(
            (bs, self.num_head, self.max_kv_splits, self.v_head_dim),
            dtype=torch.float32,
            device=self.device,
        )
        if self.swa_v_head_dim is not None:
            swa_attn_logits = torch.empty(
                (bs, self.num_head, self.max_kv_splits, self.swa_v_head_dim),
                dtype=torch.float32,
                device=self.device,
            )
        else:
            swa_attn_logits = None
        attn_lse = torch.empty(
            (bs, self.num_head, self.max_kv_splits),
            dtype=torch.float32,
            device=self.device,
        )
        num_kv_splits = torch.empty((bs,), dtype=torch.int32, device=self.device)
        self.get_num_kv_splits(num_kv_splits, forward_batch.seq_lens)

        qo_indptr = None
        custom_mask = None
        mask_indptr = None
        max_extend_len = None
    elif forward_batch.forward_mode.is_target_verify():
        bs = len(forward_batch.req_pool_indices)
        qo_indptr = torch.arange(
            0,
            (1 + bs) * self.num_draft_tokens,
            step=self.num_draft_tokens,
            dtype=torch.int32,
            device=self.device,
        )
        # Different with flashinfer kv_indptr and kv_indices construction
        kv_indptr[1 : bs + 1] = torch.cumsum(forward_batch.seq_lens, dim=0)
        kv_indptr = kv_indptr[: bs + 1]
        # Sizing by kv_indptr[-1] waits for the GPU; without the host mirror take
        # the upper bound instead (the kernel writes by kv_indptr).
        kv_indices = torch.empty(
            (
                kv_indptr[-1]
                if forward_batch.seq_lens_sum is not None
                else bs * self.req_to_token.shape[1]
            ),
            dtype=torch.int64,
            device=self.device,
        )
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            kv_indptr,
            None,
            kv_indices,
            self.req_to_token.stride(0),
        )

        if self.sliding_window_size is not None and self.sliding_window_size > 0:
            # window_kv_offsets is used to calculate the start position in custom mask
            (
                window_kv_indptr,
                window_kv_indices,
                window_kv_lens,
                window_kv_offsets,
            ) = update_sliding_window_buffer(
                self.window_kv_indptr,
                self.req_to_token,
                self.sliding_window_size,
                forward_batch.seq_lens,
                forward_batch.req_pool_indices,
                bs,
                self.device,
                self.token_to_kv_pool_allocator,
            )

        custom_mask = spec_info.custom_mask
        seq_mask_len = self.num_draft_tokens * (
            forward_batch.seq_lens + self.num_draft_tokens
        )
        mask_indptr = self.mask_indptr
        mask_indptr[1 : bs + 1] = torch.cumsum(seq_mask_len[:bs], dim=0)
        mask_indptr = mask_indptr[: bs + 1]
        max_extend_len = self.num_draft_tokens
        num_kv_splits = None
        attn_logits = None
        attn_lse = None

    elif forward_batch.forward_mode.is_draft_extend():
        kv_indices, kv_indptr, qo_indptr, custom_mask = (
            spec_info.generate_attn_arg_prefill(
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                None,
                self.req_to_token,
            )
        )
        kv_indices = kv_indices.to(torch.int64)
        mask_indptr = None
        # TODO(FIXME): This will trigger an invalid Eagle tree when using
        # `max(spec_info.num_accept_tokens_cpu)`.
        # It might have been forgotten to update somewhere.
        max_extend_len = torch.max(spec_info.num_accept_tokens).item()
        num_kv_splits = None
        attn_logits = None
        attn_lse = None
    else:
        kv_indptr[1 : bs + 1] = torch.cumsum(
            forward_batch.extend_prefix_lens, dim=0
        )
        kv_indptr = kv_indptr[: bs + 1]
        # DRAFT_EXTEND_V2 without the host mirror has device-only prefix lengths.
        kv_indices = torch.empty(
            (
                sum(forward_batch.extend_prefix_lens_cpu)
                if forward_batch.extend_prefix_lens_cpu is not None
                else bs * self.req_to_token.shape[1]
            ),
            dtype=torch.int64,
            device=self.device,
        )
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.extend_prefix_lens,
            kv_indptr,
            None,
            kv_indices,
            self.req_to_token.stride(0),
        )
        # Sliding window
        if self.sliding_window_size is not None and self.sliding_window_size > 0:
            (
                window_kv_indptr,
                window_kv_indices,
                window_kv_lens,
                window_kv_offsets,
            ) = update_sliding_window_buffer(
                self.window_kv_indptr,
                self.req_to_token,
                self.sliding_window_size,
                forward_batch.extend_prefix_lens,
                forward_batch.req_pool_indices,
                bs,
                self.device,
                self.token_to_kv_pool_allocator,
            )

        qo_indptr = self.qo_indptr
        qo_indptr[1 : bs + 1] = torch.cumsum(forward_batch.extend_seq_lens, dim=0)
        qo_indptr = qo_indptr[: bs + 1]
        custom_mask = None
        mask_indptr = None
        attn_logits = None
        attn_lse = None
        max_extend_len = max(forward_batch.extend_seq_lens_cpu)
        num_kv_splits = None

    self.forward_metadata = ForwardMetadata(
        attn_logits,
        attn_lse,
        max_extend_len,
        num_kv_splits,
        kv_indptr,
        kv_indices,
        qo_indptr,
        custom_mask,
        mask_indptr,
        window_kv_indptr,
        window_kv_indices,
        window_num_kv_splits,
        window_kv_offsets,
        swa_attn_logits=swa_attn_logits,
    )


def multi_step_common_template(
    self,
    forward_batch: ForwardBatch,
    kv_indices_buffer: Optional[torch.Tensor],
    call_fn: int,
):
    if kv_indices_buffer is None:
        kv_indices_buffer = self.cuda_graph_kv_indices

    num_seqs = forward_batch.batch_size
    bs = self.topk * num_seqs
    seq_lens_sum = forward_batch.seq_lens_sum
    if seq_lens_sum is None:
        # Only clamps a slice of a buffer sized for the longest rows: the upper
        # bound is safe and needs no host mirror.
        seq_lens_sum = num_seqs * self.pool_len

    generate_draft_decode_kv_indices[
        (self.speculative_num_steps, num_seqs, self.topk)
    ](
        forward_batch.req_pool_indices,
        forward_batch.req_to_token_pool.req_to_token,
        forward_batch.seq_lens,
        kv_indices_buffer,
        self.kv_indptr,
        forward_batch.positions,
        self.pool_len,
        kv_indices_buffer.shape[1],
        self.kv_indptr.shape[1],
        next_power_of_2(num_seqs),
        next_power_of_2(self.speculative_num_steps),
        next_power_of_2(bs),
        self.page_size,
    )

    if call_fn is None:
        return

    for i in range(self.speculative_num_steps - 1):
        forward_batch.spec_info.kv_indptr = self.kv_indptr[i, : bs + 1]
        forward_batch.spec_info.kv_indices = kv_indices_buffer[i][
            : seq_lens_sum * self.topk + bs * (i + 1)
        ]
        call_fn(i, forward_batch)




def _pad_inputs_to_size(self, model_runner: ModelRunner, num_tokens, bs):
    # padding
    self.input_ids = self._pad_tensor_to_size(self.input_ids, num_tokens)
    self.req_pool_indices = self._pad_tensor_to_size(self.req_pool_indices, bs)
    self.lora_ids.extend((bs - len(self.lora_ids)) * [None])

    seq_len_fill_value = (
        model_runner.attn_backend.get_cuda_graph_seq_len_fill_value()
    )
    if self.seq_lens_sum is not None:  # None: no host mirror (spec v2)
        self.seq_lens_sum = self.seq_lens_sum + seq_len_fill_value * (
            bs - self.seq_lens.shape[0]
        )
    self.seq_lens = self._pad_tensor_to_size(
        self.seq_lens, bs, value=seq_len_fill_value
    )
    if self.seq_lens_cpu is not None:
        self.seq_lens_cpu = self._pad_tensor_to_size(
            self.seq_lens_cpu, bs, value=seq_len_fill_value
        )

    self.out_cache_loc = self._pad_tensor_to_size(self.out_cache_loc, num_tokens)
    if self.out_cache_loc_swa is not None:
        self.out_cache_loc_swa = self._pad_tensor_to_size(
            self.out_cache_loc_swa, num_tokens
        )
    if self.encoder_lens is not None:
        self.encoder_lens = self._pad_tensor_to_size(self.encoder_lens, bs)
    self.positions = self._pad_tensor_to_size(self.positions, num_tokens)
    if self.mamba_track_indices is not None:
        self.mamba_track_indices = self._pad_tensor_to_size(
            self.mamba_track_indices, bs
        )
    if self.mamba_track_mask is not None:
        self.mamba_track_mask = self._pad_tensor_to_size(self.mamba_track_mask, bs)
    if self.mamba_track_seqlens is not None:
        self.mamba_track_seqlens = self._pad_tensor_to_size(
            self.mamba_track_seqlens, bs
        )

    if self.mrope_positions is not None:
        self.mrope_positions = torch.cat(
            [
                self.mrope_positions,
                self.mrope_positions.new_zeros(
                    3, num_tokens - self.mrope_positions.shape[1]
                ),
            ],
            dim=1,
        )

    # TODO: check if we need to pad other tensors
    if self.extend_seq_lens is not None:
        self.extend_seq_lens = self._pad_tensor_to_size(self.extend_seq_lens, bs)

    if self.spec_info is not None and self.spec_info.is_draft_input():
        spec_info = self.spec_info
        self.output_cache_loc_backup = self.out_cache_loc
        self.hidden_states_backup = spec_info.hidden_states
        # spec_info is EagleDraftInput | EagleDraftExtendInput; each carries
        # a disjoint subset of the fields below, so getattr-guard each one.
        if getattr(spec_info, "topk_p", None) is not None:
            spec_info.topk_p = self._pad_tensor_to_size(spec_info.topk_p, bs)
        if getattr(spec_info, "topk_index", None) is not None:
            spec_info.topk_index = self._pad_tensor_to_size(
                spec_info.topk_index, bs
            )
        if getattr(spec_info, "num_correct_drafts", None) is not None:
            spec_info.num_correct_drafts = self._pad_tensor_to_size(
                spec_info.num_correct_drafts, bs
            )
            spec_info.num_accept_tokens = self._pad_tensor_to_size(
                spec_info.num_accept_tokens, bs
            )
        spec_info.hidden_states = self._pad_tensor_to_size(
            spec_info.hidden_states, num_tokens
        )


def replay_prepare(
    self,
    forward_batch: ForwardBatch,
    pp_proxy_tensors: Optional[PPProxyTensors] = None,
):
    buffers = self.buffers
    self.recapture_if_needed(forward_batch)

    raw_bs = forward_batch.batch_size
    raw_num_token = raw_bs * self.num_tokens_per_bs

    # Pad
    if self.require_mlp_tp_gather:
        max_num_tokens = max(forward_batch.global_num_tokens_cpu)
        max_batch_size = (
            max_num_tokens / self.num_tokens_per_bs
            if self.model_runner.spec_algorithm.is_eagle()
            or self.model_runner.spec_algorithm.is_standalone()
            or self.model_runner.spec_algorithm.is_dflash()
            else max_num_tokens
        )
        index = bisect.bisect_left(self.capture_bs, max_batch_size)
    else:
        index = bisect.bisect_left(self.capture_bs, raw_bs)
    bs = self.capture_bs[index]

    buffers.populate_from_forward_batch(
        forward_batch=forward_batch,
        raw_bs=raw_bs,
        raw_num_token=raw_num_token,
        bs=bs,
        seq_len_fill_value=self.seq_len_fill_value,
        require_gathered_buffer=self.require_gathered_buffer,
        num_tokens_per_bs=self.num_tokens_per_bs,
        nsa_enable_prefill_cp=self.nsa_enable_prefill_cp,
        enable_num_token_non_padded_flag=enable_num_token_non_padded(),
        pp_proxy_tensors=pp_proxy_tensors,
    )

    if (
        self.model_runner.spec_algorithm.is_dflash()
        and self.model_runner.is_draft_worker
        and forward_batch.input_embeds is not None
    ):
        buffers.input_embeds[:raw_num_token].copy_(forward_batch.input_embeds)
        # Padded tokens aren't read, so skip zeroing them.
    if self.enable_two_batch_overlap:
        self.tbo_plugin.replay_prepare(
            forward_mode=self.capture_forward_mode,
            bs=bs,
            num_token_non_padded=len(forward_batch.input_ids),
            spec_info=forward_batch.spec_info,
        )
    if forward_batch.forward_mode.is_idle() and forward_batch.spec_info is not None:
        forward_batch.spec_info.custom_mask = buffers.custom_mask
    # Attention backend
    if self.enable_pdmux:
        stream_idx = get_current_stream_idx()
        attn_backend = self.model_runner.decode_attn_backend_group[stream_idx]
    else:
        attn_backend = self.attn_backend
    # FIXME: implicit channel for backends (dsv4) that need forward_batch
    # in replay metadata prep. Should become a real param on the interface.
    attn_backend._replay_forward_batch = forward_batch
    attn_backend.init_forward_metadata_replay_cuda_graph(
        bs,
        buffers.req_pool_indices[:bs],
        buffers.seq_lens[:bs],
        (
            forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
            if forward_batch.seq_lens_sum is not None
            else None
        ),
        buffers.encoder_lens[:bs] if self.is_encoder_decoder else None,
        self.capture_forward_mode,
        forward_batch.spec_info,
        # Without a host mirror the pinned buffer still holds an older batch's
        # lengths: hand the backend None, never those (upstream #31364).
        seq_lens_cpu=(
            buffers.seq_lens_cpu[:bs]
            if forward_batch.seq_lens_cpu is not None
            else None
        ),
    )
    attn_backend._replay_forward_batch = None

    # Store fields
    self.raw_bs = raw_bs
    self.raw_num_token = raw_num_token
    self.bs = bs

    if self.model_runner.hisparse_coordinator is not None:
        self.model_runner.hisparse_coordinator.num_real_reqs.fill_(raw_bs)


def draft_extend_replay(self, forward_batch: ForwardBatch):
    assert forward_batch.out_cache_loc is not None
    self.deepep_adapter.replay()
    buffers = self.buffers

    # batch_size and num_seqs can be different in case there are finished examples
    # in the batch, which will not be counted as num_seqs
    raw_bs = forward_batch.batch_size
    num_tokens = forward_batch.input_ids.shape[0]
    if self.require_mlp_tp_gather:
        max_num_tokens = max(forward_batch.global_num_tokens_cpu)
        max_batch_size = (
            max_num_tokens // self.num_tokens_per_bs
            if self.model_runner.spec_algorithm.is_eagle()
            else max_num_tokens
        )
        index = bisect.bisect_left(self.capture_bs, max_batch_size)
    else:
        index = bisect.bisect_left(self.capture_bs, raw_bs)

    bs = self.capture_bs[index]
    if bs * self.num_tokens_per_bs != num_tokens:
        buffers.seq_lens.fill_(self.seq_len_fill_value)
        buffers.out_cache_loc.zero_()
        buffers.positions.zero_()
        buffers.num_correct_drafts.fill_(self.num_tokens_per_bs)
        buffers.num_accept_tokens.fill_(self.num_tokens_per_bs)
        buffers.extend_seq_lens.fill_(self.num_tokens_per_bs)

    # Common inputs
    buffers.input_ids[:num_tokens].copy_(forward_batch.input_ids)
    buffers.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
    if forward_batch.extend_seq_lens is not None:
        buffers.extend_seq_lens[:raw_bs].copy_(forward_batch.extend_seq_lens)
    else:
        buffers.extend_seq_lens[:raw_bs].fill_(self.num_tokens_per_bs)
    buffers.out_cache_loc[:num_tokens].copy_(forward_batch.out_cache_loc)
    buffers.positions[:num_tokens].copy_(forward_batch.positions)
    if (
        buffers.hidden_states is not None
        and forward_batch.spec_info.hidden_states is not None
        and forward_batch.spec_info.hidden_states.shape[1]
        == buffers.hidden_states.shape[1]
    ):
        buffers.hidden_states[:num_tokens].copy_(
            forward_batch.spec_info.hidden_states
        )
    if forward_batch.spec_info.num_correct_drafts is not None:
        buffers.num_correct_drafts[:raw_bs].copy_(
            forward_batch.spec_info.num_correct_drafts
        )
        buffers.num_accept_tokens[:raw_bs].copy_(
            forward_batch.spec_info.num_accept_tokens
        )
    buffers.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)

    # TODO(ch-wan): support num_token_non_padded
    if self.require_gathered_buffer:
        buffers.global_num_tokens_gpu.fill_(bs * self.num_tokens_per_bs)
        # V1: pruned_states = bs; V2: pruned_states = num_tokens
        if self.forward_mode.is_draft_extend_v2():
            buffers.global_num_tokens_for_logprob_gpu.fill_(
                bs * self.num_tokens_per_bs
            )
        else:
            buffers.global_num_tokens_for_logprob_gpu.fill_(bs)

    if forward_batch.seq_lens_cpu is not None:
        if bs != raw_bs:
            buffers.seq_lens_cpu.fill_(self.seq_len_fill_value)
        buffers.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)

    if forward_batch.extend_seq_lens_cpu is not None:
        self.extend_seq_lens_cpu[:raw_bs] = forward_batch.extend_seq_lens_cpu
    else:
        self.extend_seq_lens_cpu[:raw_bs] = [self.num_tokens_per_bs] * raw_bs
    if bs > raw_bs:
        self.extend_seq_lens_cpu[raw_bs:bs] = [self.num_tokens_per_bs] * (
            bs - raw_bs
        )
    forward_batch.spec_info.extend_seq_lens_cpu = list(
        self.extend_seq_lens_cpu[:bs]
    )
    forward_batch.spec_info.extend_seq_lens_tensor = buffers.extend_seq_lens[:bs]

    if bs != raw_bs:
        forward_batch.spec_info.positions = buffers.positions[:num_tokens]
        forward_batch.spec_info.num_correct_drafts = buffers.num_correct_drafts[:bs]
        forward_batch.spec_info.num_accept_tokens = buffers.num_accept_tokens[:bs]

    self.draft_extend_attn_backend.init_forward_metadata_replay_cuda_graph(
        bs=bs,
        req_pool_indices=buffers.req_pool_indices,
        seq_lens=buffers.seq_lens,
        seq_lens_sum=(
            forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
            if forward_batch.seq_lens_sum is not None
            else None
        ),
        encoder_lens=None,
        forward_mode=self.forward_mode,
        spec_info=forward_batch.spec_info,
        # No host mirror: None, not the stale pinned buffer (upstream #31364).
        seq_lens_cpu=(
            buffers.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else None
        ),
    )

    # Replay
    self.raw_bs = raw_bs
    self.bs = bs
    self._replay(forward_batch)
    out = self.output_buffers[bs]

    if self.forward_mode == ForwardMode.DRAFT_EXTEND_V2:
        # DRAFT_EXTEND_V2: all tokens calculations whether accepted or not.
        unpadding_bs = num_tokens
    elif bs != raw_bs:
        forward_batch.spec_info.num_correct_drafts = buffers.num_correct_drafts[
            :raw_bs
        ]
        forward_batch.spec_info.num_accept_tokens = buffers.num_accept_tokens[
            :raw_bs
        ]
        unpadding_bs = raw_bs
    else:
        unpadding_bs = None

    if unpadding_bs is not None:
        out_copy = out
        out = LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:unpadding_bs],
            hidden_states=out.hidden_states[:unpadding_bs],
        )
        out.topk_p = out_copy.topk_p[:unpadding_bs]
        out.topk_index = out_copy.topk_index[:unpadding_bs]
    return out


def multi_layer_draft_extend_replay(self, forward_batch: ForwardBatch, init_state: bool = True):
    assert forward_batch.out_cache_loc is not None
    self.deepep_adapter.replay()
    buffers = self.buffers

    # batch_size and num_seqs can be different in case there are finished examples
    # in the batch, which will not be counted as num_seqs
    raw_bs = forward_batch.batch_size
    num_tokens = raw_bs * self.num_tokens_per_bs
    # num_tokens = forward_batch.input_ids.shape[0]
    if self.require_mlp_tp_gather:
        max_batch_size = max(forward_batch.original_global_num_tokens_cpu)
        index = bisect.bisect_left(self.capture_bs, max_batch_size)
    else:
        index = bisect.bisect_left(self.capture_bs, raw_bs)

    bs = self.capture_bs[index]

    if init_state:
        self.init_replay_state(forward_batch, bs, raw_bs, num_tokens)

    if self.require_gathered_buffer:
        buffers.global_num_tokens_gpu.fill_(bs * self.num_tokens_per_bs)
        buffers.global_num_tokens_for_logprob_gpu.fill_(bs * self.num_tokens_per_bs)

    forward_batch.spec_info.hidden_states = buffers.hidden_states[:num_tokens]
    forward_batch.spec_info.num_correct_drafts = buffers.num_correct_drafts[:bs]
    forward_batch.spec_info.num_accept_tokens = buffers.num_accept_tokens[:bs]
    forward_batch.spec_info.num_tokens_per_req = self.num_tokens_per_bs
    forward_batch.spec_info.num_tokens_for_logprob_per_req = 1
    forward_batch.spec_info.positions = buffers.positions[:num_tokens]
    forward_batch.spec_info.extend_seq_lens_tensor = buffers.extend_seq_lens[:bs]

    self.eagle_worker.draft_extend_attn_backend_list[
        self.step
    ].init_forward_metadata_replay_cuda_graph(
        bs=bs,
        req_pool_indices=buffers.req_pool_indices,
        seq_lens=buffers.seq_lens,
        seq_lens_sum=(
            forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
            if forward_batch.seq_lens_sum is not None
            else None
        ),
        encoder_lens=None,
        forward_mode=self.forward_mode,
        spec_info=forward_batch.spec_info,
        # No host mirror: None, not the stale pinned buffer (upstream #31364).
        seq_lens_cpu=(
            buffers.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else None
        ),
    )

    # Replay
    self.raw_bs = raw_bs
    self.bs = bs
    self._replay(forward_batch)
    out = self.output_buffers[bs]

    if self.forward_mode == ForwardMode.DRAFT_EXTEND_V2:
        # DRAFT_EXTEND_V2: all tokens calculations whether accepted or not.
        unpadding_bs = num_tokens
    elif bs != raw_bs:
        forward_batch.spec_info.num_correct_drafts = buffers.num_correct_drafts[
            :raw_bs
        ]
        forward_batch.spec_info.num_accept_tokens = buffers.num_accept_tokens[
            :raw_bs
        ]
        unpadding_bs = raw_bs
    else:
        unpadding_bs = None

    if unpadding_bs is not None:
        out_copy = out
        out = LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:unpadding_bs],
            hidden_states=out.hidden_states[:unpadding_bs],
        )
        out.topk_p = out_copy.topk_p[:raw_bs]
        out.topk_index = out_copy.topk_index[:raw_bs]
    return out


def prepare_for_extend_to_fill_draft_kvcache(
    self,
    batch: ModelWorkerBatch,
    predict: torch.Tensor,
    num_draft_tokens: int,
    draft_model_runner: Any,
    cuda_graph_runner: Any,
):
    seq_lens_cpu_ = batch.seq_lens_cpu
    pending = getattr(batch, "seq_lens_cpu_pending", None)
    if seq_lens_cpu_ is None and pending is not None:
        # The host lengths copied at the start of this forward (EagleDraftWorker.draft):
        # from here on the batch is one with a mirror.
        seq_lens_cpu_, copied = pending
        if copied is not None:
            copied.synchronize()
        batch.seq_lens_cpu = seq_lens_cpu_
        batch.seq_lens_sum = int(seq_lens_cpu_.sum())
    extend_num_tokens = len(batch.seq_lens) * num_draft_tokens
    # Without the host mirror (needs_cpu_seq_lens False) the prefix lengths exist only
    # on the device: no .tolist(), no sum (see below).
    gpu_only = seq_lens_cpu_ is None
    prefix_lens = batch.seq_lens

    batch.spec_info = self
    batch.input_ids = predict
    batch.seq_lens = batch.seq_lens + num_draft_tokens
    batch.extend_seq_lens = [num_draft_tokens for _ in range(len(batch.seq_lens))]
    if gpu_only:
        # A placeholder for ForwardBatch.init_new, which wants host lists; the
        # device prefix lengths and the positions replace what it derives from it.
        batch.extend_prefix_lens = [0] * len(batch.seq_lens)
    else:
        batch.seq_lens_cpu = batch.seq_lens_cpu + num_draft_tokens
        batch.seq_lens_sum += extend_num_tokens
        batch.extend_prefix_lens = seq_lens_cpu_.tolist()
    batch.extend_num_tokens = extend_num_tokens
    capture_mode = (
        CaptureHiddenMode.NULL
        if draft_model_runner.spec_algorithm.is_standalone()
        else CaptureHiddenMode.FULL
    )
    batch.capture_hidden_mode = capture_mode
    batch.forward_mode = (
        ForwardMode.IDLE
        if batch.forward_mode.is_idle()
        else ForwardMode.DRAFT_EXTEND_V2
    )
    forward_batch = ForwardBatch.init_new(batch, draft_model_runner)
    if gpu_only:
        batch.extend_prefix_lens = None
        if not batch.forward_mode.is_idle():
            # Request i extends positions prefix_i .. prefix_i + num_draft_tokens - 1
            # (what compute_position gives for these lengths; extend_start_loc
            # depends on the extend lengths only, so init_new got it right).
            forward_batch.extend_prefix_lens = prefix_lens.to(torch.int32)
            forward_batch.extend_prefix_lens_cpu = None
            # One broadcast add: every op here is host time on a CPU-bound decode loop.
            forward_batch.positions = (
                prefix_lens.unsqueeze(1)
                + torch.arange(
                    num_draft_tokens, dtype=torch.int64, device=prefix_lens.device
                )
            ).view(-1)
    can_cuda_graph = cuda_graph_runner and cuda_graph_runner.can_run(forward_batch)
    if not batch.forward_mode.is_idle() and not can_cuda_graph:
        draft_model_runner.attn_backend.init_forward_metadata(forward_batch)
    return forward_batch


def copy_seq_lens_for_draft_extend(self, model_worker_batch, attn_backend, graph_runner):
    """Without the host mirror, a draft-extend backend that still reads the host lengths
    when it runs eagerly (``draft_extend_needs_cpu_seq_lens``) gets them from a copy
    started here, at the start of the draft: it queues behind the previous forward only,
    not behind this verify. A batch the draft-extend CUDA graph will replay needs none."""
    if (
        model_worker_batch.seq_lens_cpu is not None
        or model_worker_batch.forward_mode.is_idle()
        or not attn_backend.draft_extend_needs_cpu_seq_lens
    ):
        return
    seq_lens = model_worker_batch.seq_lens
    if graph_runner is not None and len(seq_lens) <= graph_runner.max_bs:
        return
    import torch

    seq_lens_cpu = seq_lens.to("cpu", non_blocking=True, copy=True)
    copied = None
    if seq_lens.device.type != "cpu":  # any accelerator: the copy is asynchronous
        copied = torch.get_device_module(seq_lens.device).Event()
        copied.record()
    model_worker_batch.seq_lens_cpu_pending = (seq_lens_cpu, copied)


def eagle_draft(self, model_worker_batch: ModelWorkerBatch):
    self.copy_seq_lens_for_draft_extend(
        model_worker_batch,
        self.draft_runner.attn_backend,
        self.cuda_graph_runner_for_draft_extend,
    )
    draft_input: EagleDraftInput = model_worker_batch.spec_info
    forward_batch, can_cuda_graph = draft_input.prepare_for_v2_draft(
        self.req_to_token_pool,
        model_worker_batch,
        self.cuda_graph_runner,
        self.draft_runner,
        self.topk,
        self.speculative_num_steps,
    )

    # Run draft
    if can_cuda_graph:
        parent_list, top_scores_index, draft_tokens = self.cuda_graph_runner.replay(
            forward_batch,
        )
    else:
        if (
            not forward_batch.forward_mode.is_idle()
            and self.speculative_num_steps > 1
        ):
            # Skip attention backend init for 1-step draft,
            # `draft_forward` only does sample in this case.
            self.draft_attn_backend.init_forward_metadata(forward_batch)
        parent_list, top_scores_index, draft_tokens = self.draft_forward(
            forward_batch
        )

    if model_worker_batch.forward_mode.is_idle():
        return EagleVerifyInput.create_idle_input(
            self.topk,
            self.speculative_num_steps,
            self.speculative_num_draft_tokens,
        )

    # Build tree mask
    # Directly write to cuda graph buffers for verify attn
    verify_backend = self.target_worker.model_runner.attn_backend
    tree_mask_buf, position_buf = verify_backend.get_verify_buffers_to_fill_after_draft()
    # seq_lens_sum only sizes a tree mask that is not preallocated; without the
    # host mirror it is None.
    tree_mask_mode = self.tree_mask_mode
    seq_lens_sum = model_worker_batch.seq_lens_sum
    if seq_lens_sum is None and tree_mask_buf is not None:
        seq_lens_sum = 0
    elif seq_lens_sum is None and not verify_backend.reads_verify_tree_mask:
        # The verify never reads the mask: its small layout, not sized by the lengths.
        seq_lens_sum, tree_mask_mode = 0, TreeMaskMode.QLEN_ONLY
    elif seq_lens_sum is None:
        # A pool row per request is an upper bound.
        seq_lens_sum = (
            len(model_worker_batch.seq_lens) * self.req_to_token_pool.req_to_token.shape[1]
        )

    (
        tree_mask,
        position,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        draft_tokens,
    ) = build_tree_kernel_efficient(
        draft_input.bonus_tokens,
        parent_list,
        top_scores_index,
        draft_tokens,
        model_worker_batch.seq_lens,
        seq_lens_sum,
        self.topk,
        self.speculative_num_steps,
        self.speculative_num_draft_tokens,
        tree_mask_mode,
        tree_mask_buf,
        position_buf,
    )

    return EagleVerifyInput(
        draft_token=draft_tokens,
        custom_mask=tree_mask,
        positions=position,
        retrieve_index=retrieve_index,
        retrieve_next_token=retrieve_next_token,
        retrieve_next_sibling=retrieve_next_sibling,
        retrieve_cum_len=None,
        spec_steps=self.speculative_num_steps,
        topk=self.topk,
        draft_token_num=self.speculative_num_draft_tokens,
        capture_hidden_mode=None,
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )


def multi_layer_draft(self, model_worker_batch: ModelWorkerBatch):
    self.copy_seq_lens_for_draft_extend(
        model_worker_batch,
        self.draft_runner_list[0].attn_backend,
        self.cuda_graph_runner_for_draft_extend,
    )
    draft_input: EagleDraftInput = model_worker_batch.spec_info
    forward_batch, can_cuda_graph = draft_input.prepare_for_v2_draft(
        self.req_to_token_pool,
        model_worker_batch,
        self.cuda_graph_runner,
        self.draft_runner_list[0],
        self.topk,
        self.speculative_num_steps,
    )

    # Run draft
    parent_list, top_scores_index, draft_tokens = self.draft_forward(forward_batch)

    if model_worker_batch.forward_mode.is_idle():
        return EagleVerifyInput.create_idle_input(
            self.topk,
            self.speculative_num_steps,
            self.speculative_num_draft_tokens,
        )

    # Build tree mask
    # Directly write to cuda graph buffers for verify attn
    verify_backend = self.target_worker.model_runner.attn_backend
    tree_mask_buf, position_buf = verify_backend.get_verify_buffers_to_fill_after_draft()
    # seq_lens_sum only sizes a tree mask that is not preallocated; without the
    # host mirror it is None.
    tree_mask_mode = self.tree_mask_mode
    seq_lens_sum = model_worker_batch.seq_lens_sum
    if seq_lens_sum is None and tree_mask_buf is not None:
        seq_lens_sum = 0
    elif seq_lens_sum is None and not verify_backend.reads_verify_tree_mask:
        # The verify never reads the mask: its small layout, not sized by the lengths.
        seq_lens_sum, tree_mask_mode = 0, TreeMaskMode.QLEN_ONLY
    elif seq_lens_sum is None:
        # A pool row per request is an upper bound.
        seq_lens_sum = (
            len(model_worker_batch.seq_lens) * self.req_to_token_pool.req_to_token.shape[1]
        )
    (
        tree_mask,
        position,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        draft_tokens,
    ) = build_tree_kernel_efficient(
        draft_input.bonus_tokens,
        parent_list,
        top_scores_index,
        draft_tokens,
        model_worker_batch.seq_lens,
        seq_lens_sum,
        self.topk,
        self.speculative_num_steps,
        self.speculative_num_draft_tokens,
        tree_mask_mode,
        tree_mask_buf,
        position_buf,
    )

    return EagleVerifyInput(
        draft_token=draft_tokens,
        custom_mask=tree_mask,
        positions=position,
        retrieve_index=retrieve_index,
        retrieve_next_token=retrieve_next_token,
        retrieve_next_sibling=retrieve_next_sibling,
        retrieve_cum_len=None,
        spec_steps=self.speculative_num_steps,
        topk=self.topk,
        draft_token_num=self.speculative_num_draft_tokens,
        capture_hidden_mode=None,
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )


def _build_scheduled_request_metrics(self: Scheduler, batch: ScheduleBatch):
    from sglang.srt.observability.forward_pass_metrics import (
        ScheduledRequestMetrics,
        WelfordAccumulator,
    )

    num_prefill_requests = 0
    sum_prefill_tokens = 0
    sum_prefill_kv_tokens = 0
    prefill_lengths = WelfordAccumulator()

    if batch.forward_mode.is_mixed():
        decode_req_ids = {id(req) for req in batch.decoding_reqs or []}
        prefill_reqs = [req for req in batch.reqs if id(req) not in decode_req_ids]
    elif batch.forward_mode.is_extend():
        prefill_reqs = batch.reqs
    else:
        prefill_reqs = []

    if prefill_reqs:
        stats = batch.prefill_stats
        for req in prefill_reqs:
            prefill_lengths.add(len(req.origin_input_ids))
        num_prefill_requests = stats.num_new_seqs if stats else len(prefill_reqs)
        sum_prefill_tokens = stats.log_input_tokens if stats else 0
        sum_prefill_kv_tokens = sum(len(req.prefix_indices) for req in prefill_reqs)

    decode_kv = WelfordAccumulator()
    if batch.forward_mode.is_mixed():
        for req in batch.decoding_reqs or []:
            decode_kv.add(req.seqlen)
    elif batch.forward_mode.is_decode():
        if batch.seq_lens_cpu is None:  # spec v2 without the host mirror
            for req in batch.reqs:
                decode_kv.add(req.seqlen)
        else:
            for sl in batch.seq_lens_cpu:
                decode_kv.add(int(sl))

    return ScheduledRequestMetrics(
        num_prefill_requests=num_prefill_requests,
        sum_prefill_tokens=sum_prefill_tokens,
        var_prefill_length=prefill_lengths.variance(),
        sum_prefill_kv_tokens=sum_prefill_kv_tokens,
        num_decode_requests=decode_kv.count,
        sum_decode_kv_tokens=decode_kv.total,
        var_decode_kv_tokens=decode_kv.variance(),
    )


def _estimate_decode_perf(
    self: Scheduler, batch: ScheduleBatch, num_tokens: int
) -> Tuple[float, float, float]:
    tokens = max(0, int(num_tokens))
    if tokens == 0:
        return 0.0, 0.0, 0.0

    if batch.seq_lens_cpu is None:  # spec v2 without the host mirror
        total_context = float(sum(req.seqlen for req in batch.reqs))
    else:
        total_context = float(batch.seq_lens_cpu.sum().item())
    flops = (
        tokens * self._linear_flops_per_token
        + self._attn_dot_flops_coeff * total_context
    )
    read_bytes = (
        tokens * self._weight_read_bytes_per_token
        + tokens * self._qkv_act_bytes_per_token
        + tokens * self._decode_q_read_bytes_per_token
        + total_context * self._kv_cache_bytes_per_token
    )
    write_bytes = (
        tokens * self._kv_cache_bytes_per_token
        + tokens * self._qkv_act_bytes_per_token
        + tokens * self._ffn_act_bytes_per_token
    )
    return flops, read_bytes, write_bytes


def report_decode_stats(
    self: Scheduler,
    can_run_cuda_graph: bool,
    running_batch: ScheduleBatch = None,
    num_correct_drafts: int = 0,
):
    batch = running_batch or self.running_batch

    # Every-iteration work: realtime token counting + status logger
    if self.current_scheduler_metrics_enabled:
        decode_tokens = batch.batch_size() + num_correct_drafts
        self.metrics_collector.increment_realtime_tokens(
            # TODO unify this w/ the bumping logic in `Scheduler.num_generated_tokens` accumulator
            decode_tokens=decode_tokens,
            dp_cooperation_info=batch.dp_cooperation_info,
        )
        if self.enable_mfu_metrics:
            flops, read_bytes, write_bytes = self._estimate_decode_perf(
                batch, decode_tokens
            )
            self.metrics_collector.increment_estimated_perf(
                num_flops_per_gpu=flops,
                num_read_bytes_per_gpu=read_bytes,
                num_write_bytes_per_gpu=write_bytes,
            )
            self._mfu_log_flops += flops
            self._mfu_log_read_bytes += read_bytes
            self._mfu_log_write_bytes += write_bytes

        if x := self.scheduler_status_logger:
            x.maybe_dump(batch, self.waiting_queue)

    # Periodic work: log + heavy metrics at decode_log_interval
    if self.forward_ct_decode % self.server_args.decode_log_interval != 0:
        return
    if (
        not self.is_stats_logging_rank
        and not self.current_scheduler_metrics_enabled
    ):
        return

    gap_latency = time.perf_counter() - self.last_decode_stats_tic
    self.last_decode_stats_tic = time.perf_counter()
    self.last_gen_throughput = self.num_generated_tokens / gap_latency

    self.num_generated_tokens = 0
    num_running_reqs = len(batch.reqs)

    pool_stats = self.get_pool_stats()
    token_usage_msg = ", ".join(pool_stats.get_decode_usage_msg_parts()) + ", "

    if RECORD_STEP_TIME:
        self.step_time_dict[num_running_reqs].append(
            gap_latency / self.server_args.decode_log_interval
        )

    batch_iter = (
        batch.forward_iter
        if batch is not None and batch.forward_iter is not None
        else self.forward_ct
    )
    iter_msg = f" [{batch_iter}]" if LOG_FORWARD_ITERS else ""
    msg = f"Decode batch{iter_msg}, #running-req: {num_running_reqs}, {token_usage_msg}"

    if self.spec_algorithm.is_none():
        spec_accept_length = 0
        spec_accept_rate = 0
    else:
        spec_accept_length = self.spec_num_accept_tokens / self.spec_num_forward_ct
        num_correct_drafts = self.spec_num_accept_tokens - self.spec_num_forward_ct
        if self.server_args.speculative_num_draft_tokens:
            draft_per_round = self.server_args.speculative_num_draft_tokens - 1
        else:
            draft_per_round = self.server_args.speculative_num_steps or 0
        total_draft_tokens = self.spec_num_forward_ct * draft_per_round
        spec_accept_rate = (
            num_correct_drafts / total_draft_tokens if total_draft_tokens > 0 else 0
        )
        self.spec_total_num_accept_tokens += self.spec_num_accept_tokens
        self.spec_total_num_forward_ct += self.spec_num_forward_ct
        self.spec_num_accept_tokens = self.spec_num_forward_ct = 0
        msg += f"accept len: {spec_accept_length:.2f}, accept rate: {spec_accept_rate:.2f}, "
    cache_hit_rate = 0.0

    if self.disaggregation_mode == DisaggregationMode.DECODE:
        msg += f"pre-allocated usage: {self.disagg_decode_prealloc_queue.num_tokens_pre_allocated / self.max_total_num_tokens:.2f}, "
        msg += f"#prealloc-req: {len(self.disagg_decode_prealloc_queue.queue)}, "
        msg += f"#transfer-req: {len(self.disagg_decode_transfer_queue.queue)}, "
        msg += f"#retracted-req: {len(self.disagg_decode_prealloc_queue.retracted_queue)}, "

    if (
        self.server_args.language_only
        and self.server_args.encoder_transfer_backend == "zmq_to_scheduler"
    ):
        msg += f"waiting-image-req: {len(self.mm_receiver.waiting_list)}, "

    msg += (
        f"{self._graph_backend_label}: {can_run_cuda_graph}, "
        f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "
        f"#queue-req: {len(self.waiting_queue)}"
    )

    if self.enable_mfu_metrics and gap_latency > 0:
        flops_per_s = self._mfu_log_flops / gap_latency
        read_bytes_per_s = self._mfu_log_read_bytes / gap_latency
        write_bytes_per_s = self._mfu_log_write_bytes / gap_latency
        tflops_per_s = flops_per_s / 1e12
        read_gb_per_s = read_bytes_per_s / 1e9
        write_gb_per_s = write_bytes_per_s / 1e9
        msg += (
            f", est. decode TFLOPS/s (per GPU): {tflops_per_s:.2f}, "
            f"est. read BW (GB/s per GPU): {read_gb_per_s:.2f}, "
            f"est. write BW (GB/s per GPU): {write_gb_per_s:.2f}"
        )
        self._mfu_log_flops = 0.0
        self._mfu_log_read_bytes = 0.0
        self._mfu_log_write_bytes = 0.0

    if ENABLE_METRICS_DEVICE_TIMER:
        msg += f", fwd occupancy: {self.fwd_occupancy:.2f}%"

    if self.is_stats_logging_rank:
        logger.info(msg)
    if self.current_scheduler_metrics_enabled:
        priority_enabled = self.enable_priority_scheduling

        # Basics
        self.stats.num_running_reqs = QueueCount.from_reqs(
            batch.reqs, priority_enabled
        )
        self.stats.num_queue_reqs = QueueCount.from_reqs(
            self.waiting_queue, priority_enabled
        )
        self.stats.num_grammar_queue_reqs = len(self.grammar_manager)
        self.stats.gen_throughput = self.last_gen_throughput
        self.stats.cache_hit_rate = cache_hit_rate
        if batch.seq_lens_cpu is None:  # spec v2 without the host mirror
            self.stats.decode_sum_seq_lens = sum(req.seqlen for req in batch.reqs)
        else:
            self.stats.decode_sum_seq_lens = batch.seq_lens_cpu.sum().item()

        # Memory pool usage ratios / Absolute token counts
        pool_stats.update_scheduler_stats(self.stats)

        # Speculative decoding
        self.stats.spec_accept_length = spec_accept_length
        self.stats.spec_accept_rate = spec_accept_rate

        # Retract
        self.stats.num_retracted_reqs = self.num_retracted_reqs
        self.stats.num_paused_reqs = self.num_paused_reqs
        self.num_retracted_reqs = self.num_paused_reqs = 0

        # PD disaggregation
        if self.disaggregation_mode == DisaggregationMode.PREFILL:
            self.stats.num_prefill_bootstrap_queue_reqs = QueueCount.from_reqs(
                self.disagg_prefill_bootstrap_queue.queue, priority_enabled
            )
            self.stats.num_prefill_inflight_queue_reqs = QueueCount.from_reqs(
                self.disagg_prefill_inflight_queue, priority_enabled
            )
        elif self.disaggregation_mode == DisaggregationMode.DECODE:
            self.stats.num_decode_prealloc_queue_reqs = QueueCount.from_reqs(
                self.disagg_decode_prealloc_queue.queue, priority_enabled
            )
            self.stats.num_decode_transfer_queue_reqs = QueueCount.from_reqs(
                self.disagg_decode_transfer_queue.queue, priority_enabled
            )

        # Streaming session metrics
        self.stats.num_streaming_sessions = self._streaming_session_count()
        self.stats.streaming_session_held_tokens = self._session_held_tokens()

        # Routing key metrics
        # (to reduce the overhead, we only compute this when all requests have routing_key)
        if all(r.routing_key is not None for r in batch.reqs):
            running_routing_keys = [r.routing_key for r in batch.reqs]
            waiting_routing_keys = [r.routing_key for r in self.waiting_queue]
            (
                self.stats.num_unique_running_routing_keys,
                self.stats.routing_key_running_req_counts,
            ) = compute_routing_key_stats(running_routing_keys)
            _, self.stats.routing_key_all_req_counts = compute_routing_key_stats(
                running_routing_keys + waiting_routing_keys
            )

        # Utilization / LoRA / HiCache
        self.calculate_utilization()
        self.stats.fwd_occupancy = self.fwd_occupancy
        self.update_lora_metrics()
        self._log_hicache_stats()
        self.metrics_collector.log_stats(self.stats)
        self._emit_kv_metrics()
    self._publish_kv_events()


_BASE_ATTN = "sglang.srt.layers.attention.base_attn_backend"
_TRITON = "sglang.srt.layers.attention.triton_backend"
_OVERLAP = "sglang.srt.managers.overlap_utils"
_SCHEDULER = "sglang.srt.managers.scheduler"
_BATCH = "sglang.srt.managers.schedule_batch"
_FWD = "sglang.srt.model_executor.forward_batch_info"
_GRAPH = "sglang.srt.model_executor.cuda_graph_runner"
_DRAFT_EXTEND_GRAPH = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"
_ML_DRAFT_EXTEND_GRAPH = "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner"
_EAGLE_INFO_V2 = "sglang.srt.speculative.eagle_info_v2"
_BASE_SPEC = "sglang.srt.speculative.base_spec_worker"
_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
_MULTI_LAYER = "sglang.srt.speculative.multi_layer_eagle_worker_v2"
_METRICS = "sglang.srt.observability.scheduler_metrics_mixin"

BACKPORT = Backport(
    id="cpu-seq-lens-optional",
    title="[Spec] Make the spec-v2 seq_lens host mirror optional per backend (Triton opts out)",
    upstream_prs=(26128,),
    patch_file="0004-Spec-Make-the-spec-v2-seq_lens-host-mirror-optional-per-backend.patch",
    summary="needs_cpu_seq_lens per backend; no seq_lens D2H when every backend is Triton",
    targets=(
        Target(_BASE_ATTN, "AttentionBackend.needs_cpu_seq_lens", True, expected=ABSENT,
               kind="value"),
        # Two more declarations, with what every backend does in 0.5.12.x; FA3 overrides
        # both (back-port 8).
        Target(_BASE_ATTN, "AttentionBackend.draft_extend_needs_cpu_seq_lens", False,
               expected=ABSENT, kind="value"),
        Target(_BASE_ATTN, "AttentionBackend.reads_verify_tree_mask", True, expected=ABSENT,
               kind="value"),
        Target(_TRITON, "TritonAttnBackend.needs_cpu_seq_lens", False, expected=ABSENT,
               kind="value"),
        Target(_TRITON, "TritonMultiStepDraftBackend.needs_cpu_seq_lens", False,
               expected=ABSENT, kind="value"),
        Target(_TRITON, "TritonAttnBackend.init_forward_metadata", triton_init_forward_metadata,
               expected="ed2f4483bf96f022"),
        Target(_TRITON, "TritonMultiStepDraftBackend.common_template",
               multi_step_common_template,
               expected="56e85c0ee4bd710d"),
        Target(_OVERLAP, "decide_needs_cpu_seq_lens", decide_needs_cpu_seq_lens,
               expected=ABSENT),
        Target(_OVERLAP, "FutureMap.init_spec_relay", init_spec_relay,
               expected="2b649e42807ea5ee"),
        Target(_OVERLAP, "FutureMap.resolve_seq_lens_cpu", resolve_seq_lens_cpu,
               expected="55ba4e309cf85610"),
        Target(_SCHEDULER, "Scheduler.init_overlap", init_overlap,
               expected="899f1df74a68214c"),
        Target(_BATCH, "ScheduleBatch.filter_batch", filter_batch,
               expected="7ac24146077681dc"),
        Target(_BATCH, "ScheduleBatch.merge_batch", merge_batch,
               expected="6012f69a1d6e16fb"),
        Target(_FWD, "ForwardBatch._pad_inputs_to_size", _pad_inputs_to_size,
               expected="b1ed5fcac19e7026"),
        Target(_GRAPH, "CudaGraphRunner.replay_prepare", replay_prepare,
               expected="395e8edf7f45702f"),
        Target(_DRAFT_EXTEND_GRAPH, "EAGLEDraftExtendCudaGraphRunner.replay",
               draft_extend_replay, expected="c30a9f940a4b9d09"),
        Target(_ML_DRAFT_EXTEND_GRAPH, "MultiLayerEagleDraftExtendCudaGraphRunner.replay",
               multi_layer_draft_extend_replay,
               expected="7c163844112a870b"),
        Target(_EAGLE_INFO_V2, "EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache",
               prepare_for_extend_to_fill_draft_kvcache,
               expected="04a29a2d22d6ab36"),
        Target(_EAGLE, "EagleDraftWorker.draft", eagle_draft,
               expected="a634c7caf739cec4"),
        Target(_MULTI_LAYER, "MultiLayerEagleDraftWorker.draft", multi_layer_draft,
               expected="4fbab52aae461a50"),
        Target(_BASE_SPEC, "BaseSpecWorker.spec_v2_attn_backends", base_spec_v2_attn_backends,
               expected=ABSENT),
        Target(_BASE_SPEC, "BaseDraftWorker.copy_seq_lens_for_draft_extend",
               copy_seq_lens_for_draft_extend, expected=ABSENT),
        Target(_EAGLE, "EAGLEWorkerV2.spec_v2_attn_backends", eagle_spec_v2_attn_backends,
               expected=ABSENT),
        Target(_MULTI_LAYER, "MultiLayerEagleWorkerV2.spec_v2_attn_backends",
               multi_layer_spec_v2_attn_backends, expected=ABSENT),
        Target(_METRICS, "SchedulerMetricsMixin._build_scheduled_request_metrics",
               _build_scheduled_request_metrics,
               expected="9923a669dad55199"),
        Target(_METRICS, "SchedulerMetricsMixin._estimate_decode_perf", _estimate_decode_perf,
               expected="84abfedd24e59439"),
        Target(_METRICS, "SchedulerMetricsMixin.report_decode_stats", report_decode_stats,
               expected="74d802cdd98348d6"),
    ),
)
