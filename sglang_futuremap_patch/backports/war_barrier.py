"""Back-port 17: the schedule stream waits for the previous forward before it writes shared buffers.

Upstream: sgl-project/sglang#26380 (the barrier at the top of each overlap event loop, and the
host copies it would serialise moved off the schedule stream) and #26646 (CUDA only).
Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+ (its loops carry
the barrier). Uses no other back-port's code; its last edit is made to ``prepare_for_decode`` as
back-port 3 leaves it.

Why: under the overlap scheduler, the host prepares batch N+1 on the schedule stream while
forward N still runs on the forward stream. Preparing it writes GPU buffers that forward N may
still read: ``req_to_token`` rows of pool slots freed by a request that finished in batch N-1
and was still part of batch N (the new owner's prefix and KV slots), and, with a sliding-window
target, the SWA index mapping. Stock 0.5.12.x has the same race, but its
``verify_done.synchronize()`` in ``filter_batch`` / ``prepare_for_decode`` held decode
preparation back until verify N had ended; back-port 3 removes that wait, so the window now spans
the whole forward. Upstream saw the race as flaky accuracy once its wait was gone.

How: at the point where the overlap loops ask for the next batch (the first statement of
``get_next_batch_to_run`` and of the two PD-disaggregation variants, which the loops call right
after taking in requests, as 0.5.13 places its barrier), the schedule stream waits for the
forward stream: every schedule-stream write of that iteration is queued behind the forward that
reads the buffers. Beyond 0.5.13, an iteration that follows no launch (``forward_ct`` unchanged
since the last barrier: an idle poll) queues none: nothing new ran on the forward stream, so the
schedule stream already waits for its tail and every launch is ordered as before; the
PD-disaggregation loops, which queue forward-stream work outside ``run_batch``, keep one at
every iteration. The host does not wait: it only queues the dependency. A blocking host copy
on the schedule stream would now hold the host until the whole forward has ended (and the GPU
idle until the host has launched the next batch), so the blocking ones on the way to a launch
become asynchronous: the KV-length uploads of spec-v2 ``prepare_for_decode`` (``non_blocking``,
as 0.5.13 does), and, beyond 0.5.13 (whose prefill preparation still blocks there), the
prefill's: the sampling parameters of ``SamplingBatchInfo.from_schedule_batch`` and the
prefix pointers of ``write_cache_indices`` go up from pinned memory, and an empty prefix's
``last_loc`` (page size > 1) is filled on the device. The seq_lens host mirror already waits
on a private stream (back-port 5). The same values everywhere: token for token as before.

Scope: speculative decoding under the overlap scheduler (what the plugin changes); a
non-speculative server keeps SGLang's loop as it is. CUDA only, as upstream (#26646: other
platforms regressed). ``SGLANG_FUTUREMAP_WAR_BARRIER=0`` turns it off (to measure it),
``=1`` also asks for it off CUDA.

The idle-poll skip is on by default. Without it an idle server records an event and queues a
wait at every poll of its loop between two requests (0.5.16 reaches the same at idle by moving
the barrier after each launch, #31687, back-port 27, which also orders the same iteration's
result processing behind the launch). On the FA3 mixed-length serving row at concurrency 1 the
plugin read TTFT p50 x0.957 at equal core speed with a barrier at every poll (12 pairs) and
x1.072 with the skip (5); token for token in the e2e group ``sidle``
(results/serve-bench/h200-skipidle-2026-11-29). ``SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=0``
keeps a barrier at every iteration.
"""

from __future__ import annotations

import os

from sglang.srt.utils import is_pin_memory_available

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: ``0`` turns the barrier off, ``1`` asks for it on any device with streams; unset: CUDA only.
WAR_BARRIER_ENV = "SGLANG_FUTUREMAP_WAR_BARRIER"
#: ``0``: a barrier at every iteration; unset or ``1``: none at an iteration that follows no launch.
WAR_BARRIER_SKIP_IDLE_ENV = "SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE"


def war_barrier_wanted(scheduler) -> bool:
    """Whether ``scheduler``'s overlap loop should put its schedule stream behind the forward
    stream (at every iteration that follows a launch, ``apply_war_barrier``): speculative
    decoding with the overlap scheduler, on CUDA (or as the environment variable says)."""
    setting = os.environ.get("SGLANG_FUTUREMAP_WAR_BARRIER", "").strip()
    if setting == "0" or not scheduler.enable_overlap or scheduler.spec_algorithm.is_none():
        return False
    if setting == "1":
        return True
    import torch

    return torch.version.cuda is not None and str(scheduler.device).startswith("cuda")


def war_barrier_skips_idle(scheduler) -> bool:
    """Whether ``scheduler`` leaves out the barrier when no batch was launched since the last
    one (on unless ``SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=0``): outside PD disaggregation
    only, whose loops also queue forward-stream work outside ``run_batch``."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    return (
        os.environ.get("SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE", "").strip() != "0"
        and scheduler.disaggregation_mode == DisaggregationMode.NULL
    )


def apply_war_barrier(self) -> None:
    """Queue the schedule stream behind the forward stream (decided once per scheduler by
    ``war_barrier_wanted``): this iteration's writes to ``req_to_token`` and the other shared
    buffers wait for the reads of the forward in flight. The host does not wait.

    With ``war_barrier_skips_idle`` (the default), a barrier is left out when ``run_batch`` has not
    launched anything since the last one (``forward_ct`` unchanged: an idle poll): the forward
    stream's tail is where the last barrier found it, so the schedule stream already waits
    for it."""
    wanted = self.__dict__.get("war_barrier")
    if wanted is None:
        wanted = self.war_barrier = war_barrier_wanted(self)
        self.war_barrier_skip_idle = wanted and war_barrier_skips_idle(self)
    if not wanted:
        return
    if self.war_barrier_skip_idle:
        if self.__dict__.get("war_barrier_forward_ct") == self.forward_ct:
            return
        self.war_barrier_forward_ct = self.forward_ct
    self.schedule_stream.wait_stream(self.forward_stream)


_BARRIER_FIRST = """\
    # The previous forward's reads of req_to_token / the SWA mapping come before this
    # iteration's schedule-stream writes (apply_war_barrier).
    self.apply_war_barrier()
"""

_NEXT_BATCH_EDITS = (
    TextEdit(
        old="""\
    if self.enable_fpm:
        self._fpm_batch_t0 = time.monotonic()
""",
        new=_BARRIER_FIRST + """\
    if self.enable_fpm:
        self._fpm_batch_t0 = time.monotonic()
""",
    ),
)

_DECODE_NEXT_EDITS = (
    TextEdit(
        old="""\
    # Process pending prebuilt batch: output processing + filter + merge
    new_prebuilt_batch = self.get_new_prebuilt_batch()
""",
        new=_BARRIER_FIRST + """\
    # Process pending prebuilt batch: output processing + filter + merge
    new_prebuilt_batch = self.get_new_prebuilt_batch()
""",
    ),
)

_PREFILL_NEXT_EDITS = (
    TextEdit(
        old="""\
    self.running_batch.batch_is_full = False
""",
        new="""\
    self.running_batch.batch_is_full = False
""" + _BARRIER_FIRST,
    ),
)

#: ``EagleDraftInputV2Mixin.prepare_for_decode`` (as back-port 3 leaves it): the KV-length
#: uploads do not sync the schedule stream.
_DECODE_UPLOAD_EDITS = (
    TextEdit(
        old="""\
        cur_kv_lens = cur_kv_lens_cpu.to(device=batch.device)
        nxt_kv_lens = nxt_kv_lens_cpu.to(device=batch.device)
""",
        new="""\
        cur_kv_lens = cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)
        nxt_kv_lens = nxt_kv_lens_cpu.to(device=batch.device, non_blocking=True)
""",
    ),
    TextEdit(
        old="""\
    assign_req_to_token_pool_func(
        batch.req_pool_indices,
        batch.req_to_token_pool.req_to_token,
        cur_kv_lens_cpu.to(device=batch.device),
        nxt_kv_lens_cpu.to(device=batch.device),
""",
        new="""\
    # Asynchronous uploads: a blocking one would wait for the forward the schedule stream
    # is queued behind (apply_war_barrier).
    assign_req_to_token_pool_func(
        batch.req_pool_indices,
        batch.req_to_token_pool.req_to_token,
        cur_kv_lens_cpu.to(device=batch.device, non_blocking=True),
        nxt_kv_lens_cpu.to(device=batch.device, non_blocking=True),
""",
    ),
)

#: ``write_cache_indices``: the prefix pointers go up from pinned memory, asynchronously.
_PREFIX_POINTER_EDITS = (
    TextEdit(
        old="""\
        prefix_pointers = torch.tensor(
            [t.data_ptr() for t in prefix_tensors],
            device=req_to_token_pool.device,
            dtype=torch.uint64,
        )
""",
        new="""\
        # Pinned and asynchronous: a blocking upload would wait for the forward the
        # schedule stream is queued behind (apply_war_barrier).
        prefix_pointers = torch.tensor(
            [t.data_ptr() for t in prefix_tensors],
            dtype=torch.uint64,
            pin_memory=is_pin_memory_available(),
        ).to(req_to_token_pool.device, non_blocking=True)
""",
    ),
)

#: ``SamplingBatchInfo.from_schedule_batch``: the per-request sampling parameters go up from
#: pinned memory, asynchronously (the same values).
_SAMPLING_UPLOAD_EDITS = (
    TextEdit(
        old="""\
    reqs = batch.reqs
    device = batch.device
    temperatures = torch.tensor(
        [r.sampling_params.temperature for r in reqs],
        dtype=torch.float,
        device=device,
    ).view(-1, 1)
    top_ps = torch.tensor(
        [r.sampling_params.top_p for r in reqs], dtype=torch.float, device=device
    )
    top_ks = torch.tensor(
        [r.sampling_params.top_k for r in reqs], dtype=torch.int32, device=device
    )
    min_ps = torch.tensor(
        [r.sampling_params.min_p for r in reqs], dtype=torch.float, device=device
    )
""",
        new="""\
    reqs = batch.reqs
    device = batch.device
    # Pinned, asynchronous uploads: a blocking one would wait for the forward the schedule
    # stream is queued behind (apply_war_barrier).
    pin = is_pin_memory_available(device)
    temperatures = (
        torch.tensor(
            [r.sampling_params.temperature for r in reqs],
            dtype=torch.float,
            pin_memory=pin,
        )
        .to(device, non_blocking=True)
        .view(-1, 1)
    )
    top_ps = torch.tensor(
        [r.sampling_params.top_p for r in reqs], dtype=torch.float, pin_memory=pin
    ).to(device, non_blocking=True)
    top_ks = torch.tensor(
        [r.sampling_params.top_k for r in reqs], dtype=torch.int32, pin_memory=pin
    ).to(device, non_blocking=True)
    min_ps = torch.tensor(
        [r.sampling_params.min_p for r in reqs], dtype=torch.float, pin_memory=pin
    ).to(device, non_blocking=True)
""",
    ),
    TextEdit(
        old="""\
            dtype=torch.int64,
            device=device,
        )
        if enable_deterministic
""",
        new="""\
            dtype=torch.int64,
            pin_memory=pin,
        ).to(device, non_blocking=True)
        if enable_deterministic
""",
    ),
)

#: ``alloc_for_extend``: an empty prefix's last location is filled on the device.
_LAST_LOC_EDITS = (
    TextEdit(
        old="""\
        (t[-1:] if len(t) > 0 else torch.tensor([-1], device=batch.device))
""",
        new="""\
        (
            t[-1:]
            if len(t) > 0
            else torch.full((1,), -1, dtype=torch.int64, device=batch.device)
        )
""",
    ),
)

_SCHEDULER = "sglang.srt.managers.scheduler"
_DECODE = "sglang.srt.disaggregation.decode"
_PREFILL = "sglang.srt.disaggregation.prefill"
_EAGLE_INFO_V2 = "sglang.srt.speculative.eagle_info_v2"
_MEM_COMMON = "sglang.srt.mem_cache.common"
_SAMPLING = "sglang.srt.sampling.sampling_batch_info"

BACKPORT = Backport(
    id="war-barrier",
    title="[Sched] Queue the schedule stream behind the forward in flight",
    upstream_prs=(26380, 26646),
    patch_file="0017-Sched-Queue-the-schedule-stream-behind-the-forward-in-flight.patch",
    summary="the overlap loops' schedule stream waits for the forward stream before it builds "
            "the next batch (spec decoding, CUDA); the decode and prefill uploads on the "
            "schedule stream are asynchronous",
    applied_upstream="0.5.13",
    targets=(
        Target(_SCHEDULER, "war_barrier_wanted", war_barrier_wanted, expected=ABSENT),
        Target(_SCHEDULER, "war_barrier_skips_idle", war_barrier_skips_idle, expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.apply_war_barrier", apply_war_barrier, expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.get_next_batch_to_run", None, expected="e3845363c7dc53f4", kind="edit",
               edits=_NEXT_BATCH_EDITS),
        Target(_DECODE, "SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run",
               None, expected="e3d7d8a7676eb895", kind="edit", edits=_DECODE_NEXT_EDITS),
        Target(_PREFILL, "SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run",
               None, expected="0ace5f655f1375c0", kind="edit", edits=_PREFILL_NEXT_EDITS),
        Target(_EAGLE_INFO_V2, "EagleDraftInputV2Mixin.prepare_for_decode", None, expected="2f7423aa770a64c9",
               kind="edit", edits=_DECODE_UPLOAD_EDITS),
        Target(_SAMPLING, "is_pin_memory_available", is_pin_memory_available, expected=ABSENT,
               kind="value", import_line="from sglang.srt.utils import is_pin_memory_available"),
        Target(_SAMPLING, "SamplingBatchInfo.from_schedule_batch", None, expected="4cea225a714d78b7",
               kind="edit", edits=_SAMPLING_UPLOAD_EDITS),
        Target(_MEM_COMMON, "is_pin_memory_available", is_pin_memory_available, expected=ABSENT,
               kind="value", import_line="from sglang.srt.utils import is_pin_memory_available"),
        Target(_MEM_COMMON, "write_cache_indices", None, expected="abd8a2bd7c7fc3c9", kind="edit",
               edits=_PREFIX_POINTER_EDITS),
        Target(_MEM_COMMON, "alloc_for_extend", None, expected="1bab98ad51df0dc9", kind="edit",
               edits=_LAST_LOC_EDITS),
    ),
)
