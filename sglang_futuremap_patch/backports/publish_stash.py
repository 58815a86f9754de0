"""Back-port 2: relay spec-v2 state through a request-pool-indexed FutureMap (publish/stash).

Upstream: sgl-project/sglang#25879 and #25962 (publish/stash, lazy device-agnostic event),
#25862 (index the relay by request-pool slot), #26020 (no sentinel: the schedule batch keeps
a valid ``seq_lens`` mirror), #30435 (keep the forward fence when the PD-decode bootstrap
publishes). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+.

Why: 0.5.12.x hands the next iteration a ``seq_lens`` tensor still being produced by the
forward stream, so every reader must first wait on ``verify_done``. Here the forward writes
its results into the FutureMap instead: ``publish`` the new lengths (the schedule stream
consumes them, fenced by the ``publish_ready`` event) and ``stash`` the forward-only draft
state (topk, bonus tokens, hidden states; read back on the same forward stream, so stream
order is the fence). Between iterations the schedule batch keeps the lengths it launched
with; ``resolve_seq_lens_cpu`` refreshes them right before the next forward.

How: the FutureMap keeps its 0.5.12 ring for non-speculative token ids (that path has no
host sync to remove, so it stays untouched) and gains a relay indexed by ``req_pool_idx``
for speculative decoding. Slot 0 of the request pool is never handed to a request, so padded
rows read harmless values. ``Scheduler.run_batch`` routes spec-v2 overlap batches through
``forward_spec_v2_overlap``; every other batch takes the stock path.
"""

from __future__ import annotations

import logging
import time
from functools import partial

import torch

from sglang.srt.managers.overlap_utils import FutureIndices
from sglang.srt.speculative.spec_utils import spec_need_hidden_states

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

logger = logging.getLogger("sglang_futuremap_patch")


# --------------------------------------------------------------------------- FutureMap


def init_spec_relay(self, req_to_token_pool, forward_stream):
    """Index the speculative relay by request-pool slot (the scheduler calls this once)."""
    self.req_pool_size = req_to_token_pool.req_to_token.shape[0]
    self.forward_stream = forward_stream
    self.new_seq_lens_buf = torch.zeros(
        (self.req_pool_size,), dtype=torch.int64, device=self.device
    )
    # Created on first publish, on whatever device this map lives on.
    self.publish_ready = None
    # Lets the scheduler tell whether a worker published during its forward.
    self.publish_count = 0
    self.buf_initialized = False


def _init_stash_bufs(self, draft_input):
    # Shapes and dtypes come from the first payload, as the workers define them.
    def like(t):
        return torch.zeros(
            (self.req_pool_size, *t.shape[1:]), dtype=t.dtype, device=self.device
        )

    self.topk_p_buf = like(draft_input.topk_p)
    self.topk_index_buf = like(draft_input.topk_index)
    self.bonus_tokens_buf = like(draft_input.bonus_tokens)
    if spec_need_hidden_states():
        self.hidden_states_buf = like(draft_input.hidden_states)
    self.buf_initialized = True


def publish(self, indices, new_seq_lens):
    """Forward stream: make the new sequence lengths visible to the schedule stream."""
    self.publish_count += 1
    if indices.shape[0] == 0:
        return  # idle DP rank
    self.new_seq_lens_buf[indices] = new_seq_lens.to(self.new_seq_lens_buf.dtype)
    if self.publish_ready is None:
        self.publish_ready = torch.get_device_module(self.device).Event()
    self.publish_ready.record()


def stash(self, indices, draft_input):
    """Forward stream: keep the draft state that only the next forward reads."""
    if indices.shape[0] == 0:
        return  # idle DP rank: the payload is an empty stub
    if not self.buf_initialized:
        self._init_stash_bufs(draft_input)
    self.topk_p_buf[indices] = draft_input.topk_p.to(self.topk_p_buf.dtype)
    self.topk_index_buf[indices] = draft_input.topk_index.to(self.topk_index_buf.dtype)
    self.bonus_tokens_buf[indices] = draft_input.bonus_tokens.to(
        self.bonus_tokens_buf.dtype
    )
    if spec_need_hidden_states():
        self.hidden_states_buf[indices] = draft_input.hidden_states.to(
            self.hidden_states_buf.dtype
        )


#: ``FutureMap.resolve_future``: the relayed lengths are no longer read back here.
_RESOLVE_FUTURE_EDITS = (
    # The relay (and these tests) may live on the CPU, whose tensors have no stream.
    TextEdit(
        old="""\
        indices.record_stream(torch.get_device_module(self.device).current_stream())
""",
        new="""\
        if indices.device.type != "cpu":
            indices.record_stream(torch.get_device_module(self.device).current_stream())
""",
    ),
    # The workers read batch.seq_lens, refreshed by resolve_seq_lens_cpu before the forward.
    TextEdit(
        old="""\
        draft_input.new_seq_lens = self.new_seq_lens_buf[indices]
""",
        new="""\
        # new_seq_lens is not relayed here: the workers read batch.seq_lens, which
        # resolve_seq_lens_cpu refreshed from the publish before this forward.
""",
    ),
)


def resolve_seq_lens_cpu(self, batch):
    """Schedule stream: refresh ``seq_lens`` from the last publish, and the host mirror and
    sum the batch carries.

    The stream waits on ``publish_ready`` instead of the host; the host waits at most for
    the copy of the mirror, which ends when verify ends, not the whole forward.
    """
    draft_input = batch.spec_info
    future_indices = draft_input.future_indices if draft_input is not None else None
    if future_indices is None:
        return
    if self.publish_ready is not None:
        self.publish_ready.wait()
    batch.seq_lens = self.new_seq_lens_buf[future_indices.indices]
    batch.seq_lens_cpu = batch.seq_lens.cpu()
    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())


def seed_prebuilt(self, indices, seq_lens, draft_input):
    """Relay requests whose prefill ran on a PD-prefill instance (decode bootstrap).

    Called on the schedule stream while a forward may be in flight. The writes are queued
    on the forward stream, behind that forward: it may still stash into a pool slot that
    was freed and handed to one of these requests, and ``publish_ready`` recorded there
    still fences what that forward publishes (one event has one capture point).
    """
    device_module = torch.get_device_module(self.device)
    self.forward_stream.wait_stream(device_module.current_stream())
    with device_module.stream(self.forward_stream):
        for t in (indices, seq_lens, draft_input.topk_p, draft_input.topk_index,
                  draft_input.bonus_tokens, draft_input.hidden_states):
            if t is not None and t.is_cuda:
                # Made on the schedule stream, read on the forward stream.
                t.record_stream(self.forward_stream)
        self.publish(indices, seq_lens)
        self.stash(indices, draft_input)


# --------------------------------------------------------------------------- Scheduler


#: ``Scheduler.init_overlap``: a speculative FutureMap gets its pool-indexed relay.
_INIT_OVERLAP_EDITS = (
    TextEdit(
        old="""\
    self.batch_record_buf = [None] * 2
""",
        new="""\
    if not self.spec_algorithm.is_none():
        self.future_map.init_spec_relay(self.req_to_token_pool, self.forward_stream)
    self.batch_record_buf = [None] * 2
""",
    ),
)


def forward_spec_v2_overlap(self, batch):
    """Run one spec-v2 batch on the forward stream, relaying its results via the FutureMap."""
    # The only host wait on seq_lens per iteration: refresh them (and the host mirror)
    # from the previous forward before the worker batch copies them.
    self.future_map.resolve_seq_lens_cpu(batch)
    model_worker_batch = batch.get_model_worker_batch()
    self.record_batch_in_overlap(model_worker_batch)
    # Sampling info is modified during the forward, so the worker gets a copy.
    model_worker_batch.sampling_info = model_worker_batch.sampling_info.copy_for_forward()
    # A plain tensor: FutureIndices objects are edited in place by filter_batch.
    indices = batch.req_pool_indices
    if indices.device.type != "cpu":
        # publish and stash index with it on the forward stream, after this call returns.
        indices.record_stream(self.forward_stream)
    worker = self.model_worker
    fwd_kwargs = {}
    if getattr(worker, "accepts_on_publish", False):
        fwd_kwargs["on_publish"] = partial(self.future_map.publish, indices)
    publish_count = self.future_map.publish_count

    with self.forward_stream_ctx:
        self.forward_stream.wait_stream(self.schedule_stream)
        self.future_map.resolve_future(model_worker_batch)
        batch_result = worker.forward_batch_generation(model_worker_batch, **fwd_kwargs)
        if self.future_map.publish_count == publish_count:
            # A worker without on_publish (e.g. a plugin algorithm): publish after the
            # forward, later than it could have been but never stale.
            self.future_map.publish(indices, batch_result.next_draft_input.new_seq_lens)
        batch_result.copy_done = self.device_module.Event()
        self.future_map.stash(indices, batch_result.next_draft_input)
        batch_result.copy_to_cpu(
            return_logprob=batch.return_logprob,
            return_hidden_states=batch.return_hidden_states,
        )

    # batch.seq_lens stays the launched value until resolve_seq_lens_cpu refreshes it.
    batch.spec_info = batch_result.next_draft_input
    batch.spec_info.future_indices = FutureIndices(indices=indices)
    # Spec v2 never resolves output_ids; filter/merge still slice it like other batches.
    batch.output_ids = -indices
    return batch_result


def run_batch(self, batch, pp_proxy_tensors=None, *, _stock_run_batch=None):
    """Spec-v2 overlap batches go through publish/stash; everything else is stock.

    Differs from 0.5.12.post1:

    * a spec-v2 overlap batch (never a prebuilt one) runs ``forward_spec_v2_overlap``, which
      builds the worker batch once ``seq_lens`` are fresh and relays the results through the
      FutureMap; the stock overlap branch built it first and left ``batch.seq_lens`` the
      forward's future (hence the ``verify_done`` waits);
    * around that forward, the stock method's own bookkeeping (iteration count, profiler,
      sleep, logprob lengths, elastic-EP rank report) is repeated here, unchanged;
    * every other batch runs the stock method itself.
    """
    if (
        not (self.is_generation and self.enable_overlap and batch.is_spec_v2)
        or batch.forward_mode.is_prebuilt()
    ):
        return _stock_run_batch(self, batch, pp_proxy_tensors)

    # The stock method's bookkeeping around the forward, unchanged.
    self.forward_ct += 1
    batch.forward_iter = self.forward_ct
    self._profile_batch_predicate(batch)
    if self.forward_sleep_time is not None:
        logger.info(f"Scheduler.run_batch sleep {self.forward_sleep_time}s")
        time.sleep(self.forward_sleep_time)

    batch_result = self.forward_spec_v2_overlap(batch)

    if batch.return_logprob:
        batch_result.extend_input_len_per_req = [r.extend_input_len for r in batch.reqs]
        batch_result.extend_logprob_start_len_per_req = [
            r.extend_logprob_start_len for r in batch.reqs
        ]
    else:
        batch_result.extend_input_len_per_req = None
        batch_result.extend_logprob_start_len_per_req = None

    if (
        self.server_args.enable_dp_attention
        and self.server_args.elastic_ep_backend is not None
    ):
        from sglang.srt.managers.io_struct import ActiveRanksOutput

        tp_active_ranks = self.tp_group.active_ranks.detach().cpu().numpy()
        tp_active_ranks &= self.tp_group.active_ranks_cpu.detach().numpy()
        dp_active_ranks = tp_active_ranks.reshape(self.dp_size, -1).prod(axis=1)
        self.send_to_tokenizer.send_output(
            ActiveRanksOutput(status=dp_active_ranks.tolist())
        )
    return batch_result


# --------------------------------------------------------------------------- PD decode


#: ``process_prebuilt``: requests prefilled on a PD-prefill instance enter the relay by pool
#: slot, written on the forward stream (``seed_prebuilt``), instead of the ring.
_PREBUILT_EDITS = (
    TextEdit(
        old="""\
            spec_info.future_indices = future_map.alloc_future_indices(
                len(self.seq_lens)
            )
            future_map.store_to_map_for_new_batch(
                spec_info.future_indices, spec_info
            )
""",
        new="""\
            # local import to avoid circular import
            from sglang.srt.managers.overlap_utils import FutureIndices

            spec_info.future_indices = FutureIndices(indices=self.req_pool_indices)
            future_map.seed_prebuilt(self.req_pool_indices, self.seq_lens, spec_info)
""",
    ),
)


_OVERLAP = "sglang.srt.managers.overlap_utils"
_SCHEDULER = "sglang.srt.managers.scheduler"
_DISAGG = "sglang.srt.disaggregation.decode_schedule_batch_mixin"

#: ``Scheduler.run_batch`` as a source change. The plugin's wrapper (publish_stash.run_batch)
#: does the stock head bookkeeping (forward_ct, profiler, sleep), runs
#: ``forward_spec_v2_overlap`` for spec-v2 overlap batches (never prebuilt ones: the stock
#: method returns for those before it gets here) and then the stock tail (logprob lengths,
#: elastic-EP rank report). Inside the stock method that is: skip building a worker batch
#: (forward_spec_v2_overlap builds it once seq_lens are fresh), dispatch, and drop the
#: spec-v2 lines of the overlap branch, which no batch reaches any more. Every other path
#: is left byte for byte as it was. ``batch.output_ids`` is already set by
#: forward_spec_v2_overlap; the stock tail assigns the same object again.
RUN_BATCH_EDITS = (
    TextEdit(
        old="""\
        if self.is_generation:
            if self.spec_algorithm.is_none() or self.enable_overlap:
                # In most cases, we use the model worker batch to run the forward.
""",
        new="""\
        if self.is_generation:
            # Spec v2 overlap relays seq_lens and the draft state through the FutureMap
            # (publish/stash) and builds its worker batch once seq_lens are fresh.
            spec_v2_overlap = self.enable_overlap and batch.is_spec_v2
            if spec_v2_overlap:
                worker_batch_or_batch = None
            elif self.spec_algorithm.is_none() or self.enable_overlap:
                # In most cases, we use the model worker batch to run the forward.
""",
    ),
    TextEdit(
        old="""\
                worker_batch_or_batch = batch

            if self.enable_overlap:
                model_worker_batch = worker_batch_or_batch
""",
        new="""\
                worker_batch_or_batch = batch

            if spec_v2_overlap:
                # Also sets batch.spec_info and batch.output_ids.
                batch_result = self.forward_spec_v2_overlap(batch)
                future_indices_or_next_token_ids = batch.output_ids
            elif self.enable_overlap:
                model_worker_batch = worker_batch_or_batch
""",
    ),
    TextEdit(
        old="""\
                future_indices_or_next_token_ids = -future_indices.indices

                if batch.is_spec_v2:
                    # FIXME(lsyin): tmp code for spec v2
                    # We only keep future indices for next draft input

                    batch.spec_info = batch_result.next_draft_input
                    batch.spec_info.future_indices = future_indices

                    # The future value, usually for next batch preparation
                    # Current implementation strictly synchronizes the seq_lens
                    batch.seq_lens = batch_result.next_draft_input.new_seq_lens
            elif self.enable_pdmux and batch.forward_mode.is_split_prefill():
""",
        new="""\
                future_indices_or_next_token_ids = -future_indices.indices
            elif self.enable_pdmux and batch.forward_mode.is_split_prefill():
""",
    ),
)


BACKPORT = Backport(
    id="publish-stash",
    title="[Spec] Relay spec-v2 state through a pool-indexed FutureMap (publish/stash)",
    upstream_prs=(25879, 25962, 25862, 26020, 30435),
    patch_file="0002-Spec-Relay-spec-v2-state-through-a-pool-indexed-FutureMap.patch",
    summary="FutureMap.publish/stash/resolve_seq_lens_cpu; run_batch passes on_publish",
    targets=(
        Target(_OVERLAP, "FutureMap.init_spec_relay", init_spec_relay, expected=ABSENT),
        Target(_OVERLAP, "FutureMap._init_stash_bufs", _init_stash_bufs, expected=ABSENT),
        Target(_OVERLAP, "FutureMap.publish", publish, expected=ABSENT),
        Target(_OVERLAP, "FutureMap.stash", stash, expected=ABSENT),
        Target(_OVERLAP, "FutureMap.resolve_future", None, expected="95f23dc95ceba9d9",
               kind="edit", edits=_RESOLVE_FUTURE_EDITS),
        Target(_OVERLAP, "FutureMap.resolve_seq_lens_cpu", resolve_seq_lens_cpu, expected=ABSENT),
        Target(_OVERLAP, "FutureMap.seed_prebuilt", seed_prebuilt, expected=ABSENT),
        Target(_SCHEDULER, "partial", partial, expected=ABSENT, kind="value",
               import_line="from functools import partial"),
        Target(_SCHEDULER, "FutureIndices", FutureIndices, expected=ABSENT, kind="value",
               import_line="from sglang.srt.managers.overlap_utils import FutureIndices"),
        Target(_SCHEDULER, "Scheduler.init_overlap", None, expected="4bb0ddba3989df23",
               kind="edit", edits=_INIT_OVERLAP_EDITS),
        Target(_SCHEDULER, "Scheduler.forward_spec_v2_overlap", forward_spec_v2_overlap,
               expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.run_batch", run_batch, expected="4e38123ed096306f",
               kind="wrap", original_arg="_stock_run_batch", edits=RUN_BATCH_EDITS,
               edit_note=(
        "The plugin wraps Scheduler.run_batch and delegates every other batch to the stock "
        "method; this patch makes the same change inside the stock method: it dispatches "
        "spec-v2 overlap batches to forward_spec_v2_overlap before a worker batch is built, "
        "and drops the spec-v2 lines of the overlap branch, which no batch reaches any more."
               )),
        Target(_DISAGG, "ScheduleBatchDisaggregationDecodeMixin.process_prebuilt", None,
               expected="9228da9a0da63b14", kind="edit", edits=_PREBUILT_EDITS),
    ),
)
