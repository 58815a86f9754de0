"""Back-port 14: the draft extend reads its host lengths from the relay, not from a copy behind a prefill.

Upstream: none as such (beyond upstream); it completes back-port 4's late copy (#26128) for
FA3's eager draft-extend metadata (back-port 8, #29343), with the private D2H stream of
#26380 (back-port 5). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete with back-port 4's
late copy (when users are on a release whose FA3 draft extend needs no host lengths).
Depends on back-ports 2, 4, 5 and 13 (the private stream exists on CUDA from 13 on).

Why: without the host mirror (FA3 + piecewise CUDA graph, SGLang's default on Hopper) the
EAGLE draft extend has no CUDA graph in 0.5.12.x and FA3 builds its eager metadata from the
exact host lengths, so every decode copies ``seq_lens`` to the host at the start of its draft
(back-port 4). That copy is queued on the forward stream, behind everything launched before
it. When the batch before the decode was a prefill, the copy waits for the whole prefill and
the host waits for the copy in ``prepare_for_extend_to_fill_draft_kvcache``, before it has
launched the draft extend; only then does the scheduler turn to the prefill's result. The
first tokens of every prefill go out one draft-extend launch late (5-12 ms on an 8B-shaped
target on H100: TTFT above stock at most concurrencies). Yet the decode needs nothing from the
prefill: the lengths of the requests that were decoding were fixed by the decode before the
prefill, and those of the requests just prefilled were built on the host.

How: the relay keeps, for each request slot, where the host can read its current length: a
prefill's host lengths (recorded when it is launched), or a copy of the whole length buffer
taken on the private stream right after the publish (verify) of the decode that last published
the slot (two pinned buffers, used in turn; only a decode whose draft extend asked for host
lengths takes one).
``lend_draft_extend_lens`` gives a decode batch whose every request is covered a callable
(``relayed_seq_lens_cpu``); the worker's late copy hands it on instead of copying, and the
draft extend calls it: it waits for the copy of the previous decode's verify (what stock SGLang's
mirror waits for), never for a prefill or a draft extend, and returns exactly the lengths the
copy would have returned. Anything else (the first decode, a
decode right after one whose draft extend did not ask, lengths published by a PD-decode
bootstrap) falls back to the copy as before. The next decode's forward stream waits for the
private copy before its verify can overwrite the rows it reads (stream order, no host wait).
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

# --------------------------------------------------------------------------- FutureMap


def init_draft_extend_lens(self):
    """Allocate the per-slot bookkeeping and the two host copies (first spec-v2 forward)."""
    size = self.req_pool_size
    # Slot -> its length is a prefill's host value (dx_host_lens) ...
    self.dx_host_known = np.zeros(size, dtype=bool)
    self.dx_host_lens = np.zeros(size, dtype=np.int64)
    # ... or row of the host copy with this id (-1: neither, only the device has it).
    self.dx_copy_of = np.full(size, -1, dtype=np.int64)
    self.dx_copy_id = -1
    cuda = self.new_seq_lens_buf.is_cuda
    self.dx_copies = [
        torch.empty((size,), dtype=torch.int64, pin_memory=cuda) for _ in range(2)
    ]
    if cuda:
        device_module = torch.get_device_module(self.device)
        self.dx_copied = [device_module.Event(), device_module.Event()]
    else:
        self.dx_copied = [None, None]
    # The copy the next decode's forward must not overtake.
    self.dx_pending_copy = None
    self.dx_publish_count = self.publish_count


def lend_draft_extend_lens(self, batch, model_worker_batch):
    """Schedule stream, before a spec-v2 forward is launched, without the host mirror only.

    A prefill's lengths are recorded. A decode batch whose every request's length is a
    prefill's or a row of the last host copy gets ``relayed_seq_lens_cpu``: a callable that
    returns ``(host lengths, None)`` once that copy has landed.
    """
    if self.needs_cpu_seq_lens:
        return
    if not hasattr(self, "dx_copies"):
        self.init_draft_extend_lens()
    if self.dx_publish_count != self.publish_count:
        # Lengths published outside a forward seen here (a PD-decode bootstrap).
        self.dx_host_known[:] = False
        self.dx_copy_of[:] = -1
    if not batch.reqs:
        return
    slots = self.batch_pool_slots(batch).numpy()
    mode = batch.forward_mode
    if mode.is_extend():
        # A prefill publishes the lengths it was built with, on the host here.
        lens = model_worker_batch.seq_lens_cpu
        known = lens is not None and not mode.is_mixed()
        self.dx_host_known[slots] = known
        if known:
            self.dx_host_lens[slots] = lens.numpy()
        self.dx_copy_of[slots] = -1
        return
    if not mode.is_decode():
        return
    if self.dx_pending_copy is not None:
        # This decode's verify rewrites rows the last copy reads.
        self.forward_stream.wait_event(self.dx_pending_copy)
        self.dx_pending_copy = None
    if model_worker_batch.seq_lens_cpu is not None:
        return  # it has the mirror (an eager batch)
    from_host = self.dx_host_known[slots]
    copy_id = self.dx_copy_id
    covered = from_host if copy_id < 0 else from_host | (self.dx_copy_of[slots] == copy_id)
    if not covered.all():
        return  # the late copy, as before
    host_lens = self.dx_host_lens[slots]
    copy, copied = self.dx_copies[copy_id % 2], self.dx_copied[copy_id % 2]

    def relayed_seq_lens_cpu():
        if from_host.all():
            return torch.from_numpy(host_lens), None
        if copied is not None:
            copied.synchronize()
        return torch.from_numpy(np.where(from_host, host_lens, copy.numpy()[slots])), None

    model_worker_batch.relayed_seq_lens_cpu = relayed_seq_lens_cpu


def keep_draft_extend_lens(self, batch, model_worker_batch):
    """Forward stream, right after a spec-v2 forward was launched: a decode whose draft
    extend asked for host lengths gets the length buffer copied to the host on the private
    stream, behind its own publish only."""
    if self.needs_cpu_seq_lens or not hasattr(self, "dx_copies"):
        return
    if batch.forward_mode.is_decode() and batch.reqs:
        slots = self.batch_pool_slots(batch).numpy()
        self.dx_host_known[slots] = False
        if getattr(model_worker_batch, "seq_lens_cpu_pending", None) is None:
            self.dx_copy_of[slots] = -1  # its draft extend asked for nothing: no copy
        else:
            self.dx_copy_id += 1
            k = self.dx_copy_id % 2
            if self.dx_copied[k] is None:
                self.dx_copies[k].copy_(self.new_seq_lens_buf)
            else:
                stream = self.seq_lens_d2h_stream
                # The lengths are final at this decode's publish (end of its verify), so
                # the copy waits for that, not for the draft extend launched after it.
                stream.wait_event(self.publish_ready)
                with torch.get_device_module(self.device).stream(stream):
                    self.dx_copies[k].copy_(self.new_seq_lens_buf, non_blocking=True)
                    self.dx_copied[k].record()
                self.dx_pending_copy = self.dx_copied[k]
            self.dx_copy_of[slots] = self.dx_copy_id
    self.dx_publish_count = self.publish_count


# --------------------------------------------------------------------------- text edits

_FORWARD_EDITS = (
    TextEdit(
        old="""\
    model_worker_batch = batch.get_model_worker_batch()
""",
        new="""\
    model_worker_batch = batch.get_model_worker_batch()
    # Host lengths for the draft extend that do not wait for the forward stream.
    self.future_map.lend_draft_extend_lens(batch, model_worker_batch)
""",
    ),
    TextEdit(
        old="""\
            self.future_map.publish(indices, batch_result.next_draft_input.new_seq_lens)
""",
        new="""\
            self.future_map.publish(indices, batch_result.next_draft_input.new_seq_lens)
        self.future_map.keep_draft_extend_lens(batch, model_worker_batch)
""",
    ),
)

_LATE_COPY_EDITS = (
    TextEdit(
        old="""\
    if graph_runner is not None and len(seq_lens) <= graph_runner.max_bs:
        return
""",
        new="""\
    if graph_runner is not None and len(seq_lens) <= graph_runner.max_bs:
        return
    relayed = getattr(model_worker_batch, "relayed_seq_lens_cpu", None)
    if relayed is not None:
        # The relay has them without waiting for the forward stream (a prefill may be
        # queued there): FutureMap.lend_draft_extend_lens.
        model_worker_batch.seq_lens_cpu_pending = relayed
        return
""",
    ),
)

_DRAFT_EXTEND_EDITS = (
    TextEdit(
        old="""\
        seq_lens_cpu_, copied = pending
""",
        new="""\
        if callable(pending):
            pending = pending()  # from the relay: FutureMap.lend_draft_extend_lens
        seq_lens_cpu_, copied = pending
""",
    ),
)

_OVERLAP = "sglang.srt.managers.overlap_utils"
_SCHEDULER = "sglang.srt.managers.scheduler"
_EAGLE_INFO_V2 = "sglang.srt.speculative.eagle_info_v2"
_BASE_SPEC = "sglang.srt.speculative.base_spec_worker"

BACKPORT = Backport(
    id="draft-extend-lens",
    title="[Spec] Draft-extend host lengths from the relay, not behind a prefill",
    upstream_prs=(26128, 29343, 26380),
    patch_file="0014-Spec-Draft-extend-host-lengths-from-the-relay-not-behind-a-prefill.patch",
    summary="the decode after a prefill reads its draft-extend lengths from the prefill's host "
            "values and a private-stream copy of the previous decode, instead of a copy "
            "queued behind the prefill",
    applied_upstream=None,
    targets=(
        Target(_OVERLAP, "np", np, expected=ABSENT, kind="value",
               import_line="import numpy as np"),
        Target(_OVERLAP, "FutureMap.init_draft_extend_lens", init_draft_extend_lens,
               expected=ABSENT),
        Target(_OVERLAP, "FutureMap.lend_draft_extend_lens", lend_draft_extend_lens,
               expected=ABSENT),
        Target(_OVERLAP, "FutureMap.keep_draft_extend_lens", keep_draft_extend_lens,
               expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.forward_spec_v2_overlap", None, expected="8b2cf00c26371848",
               kind="edit", edits=_FORWARD_EDITS),
        Target(_BASE_SPEC, "BaseDraftWorker.copy_seq_lens_for_draft_extend", None,
               expected="278f89430d0ba253", kind="edit", edits=_LATE_COPY_EDITS),
        Target(_EAGLE_INFO_V2, "EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache",
               None, expected="a20891d1be2f1298", kind="edit", edits=_DRAFT_EXTEND_EDITS),
    ),
)
