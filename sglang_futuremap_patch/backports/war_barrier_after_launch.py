"""Back-port 27: the WAR barrier right after each spec-v2 launch instead of at every loop iteration.

Upstream: sgl-project/sglang#31687 ("Move the WAR barrier to right after each ``run_batch``
launch"), first released in 0.5.16. Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when
users are on 0.5.16+. Depends on back-port 17 (it moves that barrier); it edits
``get_next_batch_to_run`` as back-ports 17 and 19 leave it, and back-port 2's
``forward_spec_v2_overlap`` as back-port 14 leaves it.

Why: back-port 17 queues the schedule stream behind the forward stream at the top of
``get_next_batch_to_run``, as 0.5.13 does at the top of its loop. Two things follow from that
place. (1) The result processing that the overlap loop runs right after a launch (the previous
batch's) is not ordered behind the forward just launched: upstream found schedule-stream writes
there (``req_to_token`` rows rewritten on radix-cache insertion) racing that forward's reads, and
moved the barrier to right after each launch in 0.5.16. (2) An idle server runs the barrier on
every poll of its loop: a CUDA event recorded on the forward stream and waited on by the
schedule stream, at every poll between two requests at low concurrency. In the serving
records the patched idle poll took 14.0 us against stock's 6.5 (results/serve-bench/
h200x4-prefill-2026-11-28), and the one-request prefill launched after those polls takes 3-10%
more CPU time per unit of core speed than stock's (results/serve-bench/h200x2-corespeed-2026-11-28;
Triton at concurrency 1 reads TTFT x0.836 over 6 boot pairs). The GPU run of this back-port
(results/serve-bench/h200x2-war-2026-11-28) found (2) is not that cost: on Triton the one-request
prefill launch does stock's work per unit of core speed with the barrier here or off altogether,
and TTFT at 1 / 8 reads x0.901 / x0.885 over 4 boot pairs with it here. Since 2026-11-29
back-port 17 itself leaves its barrier out of an iteration that follows no launch (on by default:
results/serve-bench/h200-skipidle-2026-11-29), so (2) is gone without this back-port.

How: ``forward_spec_v2_overlap`` (the launch of every spec-v2 overlap batch, the only batches
the barrier is wanted for) ends with back-port 17's ``apply_war_barrier``, after the forward's
last launch on the forward stream (publish, stash and the copy to the host included), and
``get_next_batch_to_run`` no longer runs it at its top. Every schedule-stream write after a
launch, in the same iteration or later ones, is then queued behind that launch's forward; an
iteration that launched nothing adds no barrier, since nothing new ran on the forward stream
(spec v2 runs no delayed sample there). The host never waits: the barrier only queues the
dependency, as before. The two PD-disaggregation loops keep their barrier at the top as well
(the decode loop's stands where 0.5.16 later fences its bootstrap staging). Tokens are those of
stock: the barrier orders more, never less (the e2e ``wal`` group, 11 cases with the default
configuration among them, token-identical on 2 x H200: results/gpu-e2e/h200x2-wal-2026-11-28).
Opt-in while no serving cell reads better with it: ``SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH=1``
turns it on (decided once per scheduler); unset, back-port 17's barrier stays where it is.
"""

from __future__ import annotations

import os

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: 1: the barrier after each launch; anything else or unset: at the top of get_next_batch_to_run.
WAR_BARRIER_AFTER_LAUNCH_ENV = "SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH"


def war_barrier_after_launch(self) -> bool:
    """Whether this scheduler queues its schedule stream behind each spec-v2 launch right after
    it, instead of at the top of every ``get_next_batch_to_run``: read from
    ``SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH`` once per scheduler."""
    moved = self.__dict__.get("war_barrier_moved")
    if moved is None:
        moved = self.war_barrier_moved = (
            os.environ.get("SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH", "").strip() == "1"
        )
    return moved


_SCHEDULER = "sglang.srt.managers.scheduler"

#: ``get_next_batch_to_run`` (as back-ports 17 and 19 leave it): no barrier at the top when
#: each launch has queued one behind itself.
_NEXT_BATCH_EDITS = (
    TextEdit(
        old="""\
    # The previous forward's reads of req_to_token / the SWA mapping come before this
    # iteration's schedule-stream writes (apply_war_barrier).
    self.apply_war_barrier()
""",
        new="""\
    # The previous forward's reads of req_to_token / the SWA mapping come before this
    # iteration's schedule-stream writes (apply_war_barrier), unless every launch queued
    # the schedule stream behind itself already (war_barrier_after_launch).
    if not self.war_barrier_after_launch():
        self.apply_war_barrier()
""",
    ),
)

#: ``forward_spec_v2_overlap`` (back-port 2's): the barrier right after the launch.
_LAUNCH_EDITS = (
    TextEdit(
        old="""\
    # batch.seq_lens stays the launched value until resolve_seq_lens_cpu refreshes it.
""",
        new="""\
    if self.war_barrier_after_launch():
        # Everything the schedule stream does from here on (this iteration's result
        # processing, the next batch's build) comes after this forward's reads.
        self.apply_war_barrier()
    # batch.seq_lens stays the launched value until resolve_seq_lens_cpu refreshes it.
""",
    ),
)

BACKPORT = Backport(
    id="war-barrier-after-launch",
    title="[Sched] Queue the schedule stream behind each spec-v2 launch right after it",
    upstream_prs=(31687,),
    patch_file="0027-Sched-Queue-the-schedule-stream-behind-each-spec-v2-launch-right-after-it.patch",
    summary="opt-in (SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH=1): back-port 17's barrier runs "
            "right after each spec-v2 launch instead of at the top of every get_next_batch_to_run, "
            "so the same iteration's result processing is ordered behind that forward and an idle "
            "loop runs none",
    applied_upstream="0.5.16",
    targets=(
        Target(_SCHEDULER, "Scheduler.war_barrier_after_launch", war_barrier_after_launch, expected=ABSENT),
        # As back-port 19 leaves it (back-port 17's barrier is the function's first statement);
        # forward_spec_v2_overlap as back-port 14 leaves it.
        Target(_SCHEDULER, "Scheduler.get_next_batch_to_run", None, expected="2ba7b3e4b7e5dcf7",
               kind="edit", edits=_NEXT_BATCH_EDITS),
        Target(_SCHEDULER, "Scheduler.forward_spec_v2_overlap", None, expected="ee95083eb701b156",
               kind="edit", edits=_LAUNCH_EDITS),
    ),
)
