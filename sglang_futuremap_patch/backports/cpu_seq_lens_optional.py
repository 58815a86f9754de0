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

Every reader is changed by a text edit of SGLang's function (the same in the plugin and in
the patch), each where a comment mentions the missing mirror; with a mirror every one of them
behaves exactly as before.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit


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

#: ``FutureMap.init_spec_relay`` (back-port 2's): the scheduler's decision is kept.
_INIT_RELAY_EDITS = (
    TextEdit(
        old="""\
def init_spec_relay(self, req_to_token_pool, forward_stream):
""",
        new="""\
def init_spec_relay(self, req_to_token_pool, forward_stream, needs_cpu_seq_lens=True):
""",
    ),
    TextEdit(
        old="""\
    self.forward_stream = forward_stream
""",
        new="""\
    self.forward_stream = forward_stream
    # False: resolve_seq_lens_cpu refreshes only the device lengths.
    self.needs_cpu_seq_lens = needs_cpu_seq_lens
""",
    ),
)

#: ``FutureMap.resolve_seq_lens_cpu`` (back-port 2's): no D2H without the mirror.
_RESOLVE_EDITS = (
    TextEdit(
        old="""\
    batch.seq_lens = self.new_seq_lens_buf[future_indices.indices]
""",
        new="""\
    # The batch must advance every iteration, mirror or not.
    batch.seq_lens = self.new_seq_lens_buf[future_indices.indices]
    if not self.needs_cpu_seq_lens:
        batch.seq_lens_cpu = None
        batch.seq_lens_sum = None
        return
""",
    ),
)


# --------------------------------------------------------------------------- Scheduler

#: ``Scheduler.init_overlap`` (as back-port 2 edits it): every backend votes on the mirror.
_INIT_OVERLAP_EDITS = (
    TextEdit(
        old="""\
        self.future_map.init_spec_relay(self.req_to_token_pool, self.forward_stream)
""",
        new="""\
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
""",
    ),
)


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


# --------------------------------------------------------------------------- SGLang's readers
# Text edits of SGLang's functions (filter/merge: as back-port 3 edits them); with a mirror
# each one behaves exactly as before.

#: ``ScheduleBatch.filter_batch``: slices the mirror only if there is one.
_FILTER_EDITS = (
    TextEdit(
        old="""\
    self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]
""",
        new="""\
    if self.seq_lens_cpu is not None:  # None: spec v2 without the host mirror
        self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]
""",
    ),
)

#: ``ScheduleBatch.merge_batch``: no mirror if either side has none.
_MERGE_EDITS = (
    TextEdit(
        old="""\
    self.seq_lens_cpu = torch.cat([self.seq_lens_cpu, other.seq_lens_cpu])
""",
        new="""\
    if self.seq_lens_cpu is None or other.seq_lens_cpu is None:
        # Spec v2 without the host mirror: a partial mirror would be wrong;
        # resolve_seq_lens_cpu sets it (or None) before the next forward.
        self.seq_lens_cpu = None
    else:
        self.seq_lens_cpu = torch.cat([self.seq_lens_cpu, other.seq_lens_cpu])
""",
    ),
)

#: ``TritonAttnBackend.init_forward_metadata``: without the mirror, kv_indices are sized by
#: the pool row width (an upper bound of every length; the kernel writes by kv_indptr).
_TRITON_EDITS = (
    TextEdit(
        old="""\
            kv_indices = torch.empty(
                forward_batch.seq_lens_sum, dtype=torch.int64, device=self.device
            )
""",
        new="""\
            # No host mirror (needs_cpu_seq_lens False): size by the pool row
            # width, an upper bound of every length; the kernel writes by kv_indptr.
            seq_lens_sum = forward_batch.seq_lens_sum
            if seq_lens_sum is None:
                seq_lens_sum = bs * self.req_to_token.shape[1]
            kv_indices = torch.empty(
                seq_lens_sum, dtype=torch.int64, device=self.device
            )
""",
    ),
    TextEdit(
        old="""\
        kv_indices = torch.empty(
            kv_indptr[-1], dtype=torch.int64, device=self.device
        )
""",
        new="""\
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
""",
    ),
    TextEdit(
        old="""\
        kv_indices = torch.empty(
            sum(forward_batch.extend_prefix_lens_cpu),
""",
        new="""\
        # DRAFT_EXTEND_V2 without the host mirror has device-only prefix lengths.
        kv_indices = torch.empty(
            (
                sum(forward_batch.extend_prefix_lens_cpu)
                if forward_batch.extend_prefix_lens_cpu is not None
                else bs * self.req_to_token.shape[1]
            ),
""",
    ),
)

#: ``TritonMultiStepDraftBackend.common_template``: the sum only bounds a buffer slice.
_MULTI_STEP_EDITS = (
    TextEdit(
        old="""\
    seq_lens_sum = forward_batch.seq_lens_sum
""",
        new="""\
    seq_lens_sum = forward_batch.seq_lens_sum
    if seq_lens_sum is None:
        # Only clamps a slice of a buffer sized for the longest rows: the upper
        # bound is safe and needs no host mirror.
        seq_lens_sum = num_seqs * self.pool_len
""",
    ),
)

#: ``ForwardBatch._pad_inputs_to_size`` (DP): a missing sum stays missing.
_PAD_EDITS = (
    TextEdit(
        old="""\
    self.seq_lens_sum = self.seq_lens_sum + seq_len_fill_value * (
        bs - self.seq_lens.shape[0]
    )
""",
        new="""\
    if self.seq_lens_sum is not None:  # None: no host mirror (spec v2)
        self.seq_lens_sum = self.seq_lens_sum + seq_len_fill_value * (
            bs - self.seq_lens.shape[0]
        )
""",
    ),
)

#: ``CudaGraphRunner.replay_prepare``: a missing sum stays missing, and the backend gets no
#: host lengths rather than the stale pinned buffer of an earlier batch (upstream #31364).
_REPLAY_PREPARE_EDITS = (
    TextEdit(
        old="""\
        forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value,
""",
        new="""\
        (
            forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
            if forward_batch.seq_lens_sum is not None
            else None
        ),
""",
    ),
    TextEdit(
        old="""\
        seq_lens_cpu=buffers.seq_lens_cpu[:bs],
""",
        new="""\
        # Without a host mirror the pinned buffer still holds an older batch's
        # lengths: hand the backend None, never those (upstream #31364).
        seq_lens_cpu=(
            buffers.seq_lens_cpu[:bs]
            if forward_batch.seq_lens_cpu is not None
            else None
        ),
""",
    ),
)

#: Both draft-extend CUDA-graph runners' ``replay``: as ``replay_prepare``.
_DRAFT_EXTEND_REPLAY_EDITS = (
    TextEdit(
        old="""\
        seq_lens_sum=forward_batch.seq_lens_sum
        + (bs - raw_bs) * self.seq_len_fill_value,
""",
        new="""\
        seq_lens_sum=(
            forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
            if forward_batch.seq_lens_sum is not None
            else None
        ),
""",
    ),
    TextEdit(
        old="""\
        seq_lens_cpu=buffers.seq_lens_cpu,
""",
        new="""\
        # No host mirror: None, not the stale pinned buffer (upstream #31364).
        seq_lens_cpu=(
            buffers.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else None
        ),
""",
    ),
)

#: ``EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache``: the late copy's
#: host lengths when there are some; otherwise the prefix lengths stay on the device.
_DRAFT_EXTEND_EDITS = (
    TextEdit(
        old="""\
    seq_lens_cpu_ = batch.seq_lens_cpu
    extend_num_tokens = len(batch.seq_lens) * num_draft_tokens
""",
        new="""\
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
""",
    ),
    TextEdit(
        old="""\
    batch.seq_lens_cpu = batch.seq_lens_cpu + num_draft_tokens
    batch.seq_lens_sum += extend_num_tokens
    batch.extend_seq_lens = [num_draft_tokens for _ in range(len(batch.seq_lens))]
    batch.extend_prefix_lens = seq_lens_cpu_.tolist()
""",
        new="""\
    batch.extend_seq_lens = [num_draft_tokens for _ in range(len(batch.seq_lens))]
    if gpu_only:
        # A placeholder for ForwardBatch.init_new, which wants host lists; the
        # device prefix lengths and the positions replace what it derives from it.
        batch.extend_prefix_lens = [0] * len(batch.seq_lens)
    else:
        batch.seq_lens_cpu = batch.seq_lens_cpu + num_draft_tokens
        batch.seq_lens_sum += extend_num_tokens
        batch.extend_prefix_lens = seq_lens_cpu_.tolist()
""",
    ),
    TextEdit(
        old="""\
    forward_batch = ForwardBatch.init_new(batch, draft_model_runner)
""",
        new="""\
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
""",
    ),
)


#: Both draft workers' ``draft``: it starts the late copy (for its draft-extend backend) ...
def _late_copy(draft_extend_backend: str) -> TextEdit:
    return TextEdit(
        old="""\
    draft_input: EagleDraftInput = model_worker_batch.spec_info
""",
        new=f"""\
    self.copy_seq_lens_for_draft_extend(
        model_worker_batch,
        {draft_extend_backend},
        self.cuda_graph_runner_for_draft_extend,
    )
    draft_input: EagleDraftInput = model_worker_batch.spec_info
""",
    )


#: ... and sizes the verify's tree mask without the mirror.
_TREE_MASK_EDITS = (
    TextEdit(
        old="""\
    tree_mask_buf, position_buf = (
        self.target_worker.model_runner.attn_backend.get_verify_buffers_to_fill_after_draft()
    )
""",
        new="""\
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
""",
    ),
    TextEdit(
        old="""\
        model_worker_batch.seq_lens_sum,
        self.topk,
""",
        new="""\
        seq_lens_sum,
        self.topk,
""",
    ),
    TextEdit(
        old="""\
        self.tree_mask_mode,
        tree_mask_buf,
""",
        new="""\
        tree_mask_mode,
        tree_mask_buf,
""",
    ),
)
_EAGLE_DRAFT_EDITS = (_late_copy("self.draft_runner.attn_backend"), *_TREE_MASK_EDITS)
_MULTI_LAYER_DRAFT_EDITS = (_late_copy("self.draft_runner_list[0].attn_backend"), *_TREE_MASK_EDITS)


# --------------------------------------------------------------------------- metrics
# Without the mirror the stats read the requests' own lengths (host values that lag the
# device by the in-flight verify: fine for metrics).

_REQUEST_METRICS_EDITS = (
    TextEdit(
        old="""\
        for sl in batch.seq_lens_cpu:
            decode_kv.add(int(sl))
""",
        new="""\
        if batch.seq_lens_cpu is None:  # spec v2 without the host mirror
            for req in batch.reqs:
                decode_kv.add(req.seqlen)
        else:
            for sl in batch.seq_lens_cpu:
                decode_kv.add(int(sl))
""",
    ),
)
_DECODE_PERF_EDITS = (
    TextEdit(
        old="""\
    total_context = float(batch.seq_lens_cpu.sum().item())
""",
        new="""\
    if batch.seq_lens_cpu is None:  # spec v2 without the host mirror
        total_context = float(sum(req.seqlen for req in batch.reqs))
    else:
        total_context = float(batch.seq_lens_cpu.sum().item())
""",
    ),
)
_DECODE_STATS_EDITS = (
    TextEdit(
        old="""\
        self.stats.decode_sum_seq_lens = batch.seq_lens_cpu.sum().item()
""",
        new="""\
        if batch.seq_lens_cpu is None:  # spec v2 without the host mirror
            self.stats.decode_sum_seq_lens = sum(req.seqlen for req in batch.reqs)
        else:
            self.stats.decode_sum_seq_lens = batch.seq_lens_cpu.sum().item()
""",
    ),
)


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
        Target(_TRITON, "TritonAttnBackend.init_forward_metadata", None,
               expected="ed2f4483bf96f022", kind="edit", edits=_TRITON_EDITS),
        Target(_TRITON, "TritonMultiStepDraftBackend.common_template", None,
               expected="56e85c0ee4bd710d", kind="edit", edits=_MULTI_STEP_EDITS),
        Target(_OVERLAP, "decide_needs_cpu_seq_lens", decide_needs_cpu_seq_lens,
               expected=ABSENT),
        # Back-port 2's relay and init_overlap, edited.
        Target(_OVERLAP, "FutureMap.init_spec_relay", None, expected="2b649e42807ea5ee",
               kind="edit", edits=_INIT_RELAY_EDITS),
        Target(_OVERLAP, "FutureMap.resolve_seq_lens_cpu", None, expected="cea07dd2ab6e9417",
               kind="edit", edits=_RESOLVE_EDITS),
        Target(_SCHEDULER, "Scheduler.init_overlap", None, expected="899f1df74a68214c",
               kind="edit", edits=_INIT_OVERLAP_EDITS),
        # SGLang's readers (filter/merge as back-port 3 edits them).
        Target(_BATCH, "ScheduleBatch.filter_batch", None, expected="7ac24146077681dc",
               kind="edit", edits=_FILTER_EDITS),
        Target(_BATCH, "ScheduleBatch.merge_batch", None, expected="6012f69a1d6e16fb",
               kind="edit", edits=_MERGE_EDITS),
        Target(_FWD, "ForwardBatch._pad_inputs_to_size", None, expected="b1ed5fcac19e7026",
               kind="edit", edits=_PAD_EDITS),
        Target(_GRAPH, "CudaGraphRunner.replay_prepare", None, expected="395e8edf7f45702f",
               kind="edit", edits=_REPLAY_PREPARE_EDITS),
        Target(_DRAFT_EXTEND_GRAPH, "EAGLEDraftExtendCudaGraphRunner.replay", None,
               expected="c30a9f940a4b9d09", kind="edit", edits=_DRAFT_EXTEND_REPLAY_EDITS),
        Target(_ML_DRAFT_EXTEND_GRAPH, "MultiLayerEagleDraftExtendCudaGraphRunner.replay", None,
               expected="7c163844112a870b", kind="edit", edits=_DRAFT_EXTEND_REPLAY_EDITS),
        Target(_EAGLE_INFO_V2, "EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache",
               None, expected="04a29a2d22d6ab36", kind="edit", edits=_DRAFT_EXTEND_EDITS),
        Target(_EAGLE, "EagleDraftWorker.draft", None, expected="a634c7caf739cec4", kind="edit",
               edits=_EAGLE_DRAFT_EDITS),
        Target(_MULTI_LAYER, "MultiLayerEagleDraftWorker.draft", None,
               expected="4fbab52aae461a50", kind="edit", edits=_MULTI_LAYER_DRAFT_EDITS),
        Target(_BASE_SPEC, "BaseSpecWorker.spec_v2_attn_backends", base_spec_v2_attn_backends,
               expected=ABSENT),
        Target(_BASE_SPEC, "BaseDraftWorker.copy_seq_lens_for_draft_extend",
               copy_seq_lens_for_draft_extend, expected=ABSENT),
        Target(_EAGLE, "EAGLEWorkerV2.spec_v2_attn_backends", eagle_spec_v2_attn_backends,
               expected=ABSENT),
        Target(_MULTI_LAYER, "MultiLayerEagleWorkerV2.spec_v2_attn_backends",
               multi_layer_spec_v2_attn_backends, expected=ABSENT),
        Target(_METRICS, "SchedulerMetricsMixin._build_scheduled_request_metrics", None,
               expected="9923a669dad55199", kind="edit", edits=_REQUEST_METRICS_EDITS),
        Target(_METRICS, "SchedulerMetricsMixin._estimate_decode_perf", None,
               expected="84abfedd24e59439", kind="edit", edits=_DECODE_PERF_EDITS),
        Target(_METRICS, "SchedulerMetricsMixin.report_decode_stats", None,
               expected="74d802cdd98348d6", kind="edit", edits=_DECODE_STATS_EDITS),
    ),
)
