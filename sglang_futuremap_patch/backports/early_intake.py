"""Back-port 19: requests that arrive while a finished request's lookahead decode runs are taken in.

Upstream: none (beyond upstream). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when a
release stops its overlap loop from blocking on a result that no running request needs before
it polls for new requests. It relies on back-port 17 (the schedule stream waits for the
forward in flight before a batch is prepared) and edits back-port 17's version of
``get_next_batch_to_run``.

Why: the overlap loop launches decode k+1 before it processes decode k's result. When that
result finishes the last running request, k+1 is a lookahead nobody needs. The loop's next
iteration has nothing to launch, so it processes k+1's result: ``process_batch_result_decode``
waits for it (``copy_done.synchronize()``). Only then does the loop poll for new requests. Stock
0.5.12.x waited for verify k before it launched k+1 (``maybe_wait_verify_done``), so little of
k+1 is left by then: a median 0.36 ms of waiting. With back-port 3 nothing paces the host on
Triton, and k+1 is queued behind all of k. In the serving record (results/serve-bench/
h200x2-final, Triton, concurrency 1) the loop waits a median 6.15 ms there, a request that
arrives meanwhile reaches the scheduler 2.50 ms after the API server sent it (0.93 ms stock),
and TTFT p50 is 8% above stock.

How: ``get_next_batch_to_run``, when it has built nothing and the loop has a launch in flight,
asks ``take_in_during_lookahead`` (SGLang's overlap loop itself carries a decorator, so the
change sits where the loop asks for its next batch). That method acts only when the oldest
result waiting is a spec-v2 decode in which every request has finished (or was retracted).
While that result's ``copy_done`` event has not completed (``query()``: no wait), it polls for
requests as the idle loop does. The first time the scheduler can build a batch from what came
in, it returns that batch, and the loop launches it before it processes the lookahead's result.
Single-rank schedulers only, with back-port 17's barrier in effect; on by default
(``SGLANG_FUTUREMAP_EARLY_INTAKE=0`` turns it off).

That order is one stock SGLang already takes: a request that reaches the scheduler one poll
earlier is launched before the lookahead's result is processed in every release. The new
batch's preparation waits for the lookahead on the GPU (back-port 17's barrier at the start of
``get_next_batch_to_run``), so a request pool slot that the finished request freed is not
written while the lookahead still reads it. Tokens are those of stock: a prefill does not read
the lookahead's results.

Scope: single-rank schedulers only (no tensor, pipeline or context parallelism, no DP
attention, no receive skipper or input blocker): their ranks must poll in step, and one rank
polling more often than another would split them. Only with back-port 17's barrier in effect.
**On by default** since the serving benchmark measured it (Triton, concurrency 1: dispatch ->
scheduler 0.46 ms against stock's 0.52, TTFT p50 x1.10; results/serve-bench/h200x4-2026-11-26)
and the e2e suite matched stock token for token with it on: the ``intake`` group (Triton, 2/2)
and the FA3 set (17/17) on the build that made it the default (results/serve-bench/h200x4-final).
``SGLANG_FUTUREMAP_EARLY_INTAKE=0`` keeps the loop's own order.
"""

from __future__ import annotations

import os

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: Set to 0 to turn the early intake off (on by default: module docstring).
EARLY_INTAKE_ENV = "SGLANG_FUTUREMAP_EARLY_INTAKE"


def lookahead_in_flight(self):
    """The ``copy_done`` event of the oldest result waiting in the overlap loop when that
    result is a spec-v2 decode whose requests have all finished (or been retracted) and the
    event has not completed yet; None when the early intake does not apply (module docstring)."""
    if os.environ.get("SGLANG_FUTUREMAP_EARLY_INTAKE", "").strip() == "0":
        return None
    if (
        self.tp_size != 1
        or self.pp_size != 1
        or self.server_args.enable_dp_attention
        or self.require_mlp_sync
        or getattr(self, "attn_cp_size", 1) != 1
        or self.recv_skipper is not None
        or self.input_blocker is not None
        or not getattr(self, "result_queue", None)
        # Back-port 17's decision, made by its apply_war_barrier at the start of the same
        # get_next_batch_to_run that asks here.
        or not self.__dict__.get("war_barrier")
    ):
        return None
    batch, result = self.result_queue[0]
    if not batch.is_spec_v2 or not batch.forward_mode.is_decode():
        return None
    if not all(req.finished() or req.is_retracted for req in batch.reqs):
        return None
    copy_done = result.copy_done
    if copy_done is None or copy_done.query():
        return None
    return copy_done


def take_in_during_lookahead(self):
    """While a finished request's lookahead decode is still running (``lookahead_in_flight``),
    poll for new requests as the idle loop does; the first batch SGLang builds from them is
    returned for the loop to launch before it processes the lookahead's result. None when the
    lookahead ends first, the server pauses, or the early intake does not apply."""
    copy_done = self.lookahead_in_flight()
    if copy_done is None:
        return None
    self.taking_in = True  # get_next_batch_to_run below must not poll again
    try:
        while not copy_done.query():
            recv_reqs = self.recv_requests()
            if not recv_reqs:
                continue
            self.process_input_requests(recv_reqs)
            if self._engine_paused:
                return None
            batch = self.get_next_batch_to_run()
            if batch is not None:
                return batch
        return None
    finally:
        self.taking_in = False


_SCHEDULER = "sglang.srt.managers.scheduler"

_NEXT_BATCH_EDITS = (
    TextEdit(
        old="""\
    return ret
""",
        new="""\
    if ret is None and self.last_batch is not None and not getattr(self, "taking_in", False):
        # Nothing to launch: requests that arrive while a finished request's lookahead
        # decode runs are launched before its result is waited on (take_in_during_lookahead).
        ret = self.take_in_during_lookahead()
    return ret
""",
    ),
)

BACKPORT = Backport(
    id="early-intake",
    title="[Sched] Take in requests while a finished request's lookahead decode runs",
    upstream_prs=(),
    patch_file="0019-Sched-Take-in-requests-while-a-finished-request-s-lookahead-decode-runs.patch",
    summary="when the overlap loop has nothing to launch and the oldest result is a spec-v2 "
            "decode of finished requests still on the GPU, it polls for new requests and "
            "launches them before it waits on that result",
    applied_upstream=None,
    targets=(
        Target(_SCHEDULER, "Scheduler.lookahead_in_flight", lookahead_in_flight, expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.take_in_during_lookahead", take_in_during_lookahead,
               expected=ABSENT),
        # As back-port 17 leaves it (its barrier is the function's first statement).
        Target(_SCHEDULER, "Scheduler.get_next_batch_to_run", None, expected="5f36ecf7bc30c871",
               kind="edit", edits=_NEXT_BATCH_EDITS),
    ),
)
