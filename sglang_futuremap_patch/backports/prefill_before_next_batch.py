"""Back-port 27: a tree's small spec-v2 prefill is processed before the next batch is built.

Upstream: none (beyond upstream). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when a
release processes a spec-v2 prefill's result before it builds the next batch. It goes one step
past back-port 16 (the same prefills, processed earlier) and edits back-port 19's version of
``get_next_batch_to_run`` (after back-port 17's barrier, its first statement).

Why: stock SGLang runs an explicit tree (topk > 1) on spec v1, whose loop processes a prefill's
result right after its launch: the first tokens leave 0.05-0.08 ms after the launch ends (a
small prefill's launch is host-bound, so the GPU has them by then). The plugin runs the tree on
spec v2, in the overlap loop. There back-port 16 processes a small tree prefill before the *next
launch*, but its decision needs the next batch, so the loop first polls for requests and builds
that batch. In the serving records of the FA3 tree (results/serve-bench/h200x2-2026-11-28,
section 5) that puts 0.44-0.63 ms between a prefill's launch end and its result at concurrency 1,
while the tokens sit ready on the GPU (0.41 ms, stock 0.02): most of the tree's TTFT gap to
stock in the fast host state (x0.96). At 8-48 the next batch is often another prefill, and
building it takes 2.6-5.0 ms first (results/serve-bench/h200x2-final-2026-11-27); 16 is the cell
that reads below stock there.

How: ``get_next_batch_to_run``, before it merges the last prefill into the running batch,
asks ``process_prefill_before_next_batch``. When the one result waiting is a spec-v2 prefill of
a tree, small (at most back-port 16's ``SMALL_PREFILL_TOKENS`` new tokens), with no grammar and
no request being chunked, on a scheduler without DP-attention sync, it processes that result
there (``process_batch_result`` waits for the copy as stock's does) and marks it. The loop's own
``pop_and_process`` still takes it off the queue later; ``process_batch_result`` then returns at
once for a marked result. The merge that follows sees the prefill's requests as the non-overlap
loop does: a request that finished at its prefill is filtered out before the decode is built,
as in stock spec v1, instead of riding in that decode as a finished row. The decision reads
only the queue, the batch and the environment (no event query), so tensor-parallel ranks decide
alike. The kernels then get what stock's spec v1 loop gives them: a request finished at its
prefill is not a row of the next decode, and a prompt that arrives next finds the prefill's
prefix in the radix cache, both as in stock.

Opt-in until a GPU run has shown it token-identical on the e2e tree group and measured it on
the serving benchmark: ``SGLANG_FUTUREMAP_PREFILL_BEFORE_NEXT_BATCH=1`` turns it on (trees only;
a chain's stock order is the overlap loop's, which the plugin keeps).
"""

from __future__ import annotations

import os

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit
# Back-port 16's bound; installed in SGLang's scheduler module, where this function runs.
from sglang_futuremap_patch.backports.prefill_result_first import SMALL_PREFILL_TOKENS

#: 1: on for trees (topk > 1); anything else or unset: off.
PREFILL_BEFORE_NEXT_BATCH_ENV = "SGLANG_FUTUREMAP_PREFILL_BEFORE_NEXT_BATCH"


def process_prefill_before_next_batch(self) -> None:
    """At the start of ``get_next_batch_to_run`` in the overlap loop: process the one result
    waiting when it is a small spec-v2 prefill of a tree (this change's description), and mark
    it so that the loop's later ``process_batch_result`` of it returns at once. Cheap checks
    first; reads the snapshot the loop queued with the result (``ScheduleBatch.copy()``: no
    ``has_grammar``, no ``extend_num_tokens``, so both come from its requests)."""
    if (
        os.environ.get("SGLANG_FUTUREMAP_PREFILL_BEFORE_NEXT_BATCH", "").strip() != "1"
        or (self.server_args.speculative_eagle_topk or 1) <= 1
        or self.require_mlp_sync
        or self.chunked_req is not None
        or len(getattr(self, "result_queue", ())) != 1
    ):
        return
    launched, result = self.result_queue[0]
    if (
        getattr(result, "processed_before_next_batch", False)
        or result.copy_done is None
        or not launched.forward_mode.is_extend()
        or not launched.is_spec_v2
        or any(req.grammar is not None for req in launched.reqs)
        or sum(req.extend_input_len for req in launched.reqs) > SMALL_PREFILL_TOKENS
    ):
        return
    self.process_batch_result(launched, result)
    result.processed_before_next_batch = True


_SCHEDULER = "sglang.srt.managers.scheduler"

_NEXT_BATCH_EDITS = (
    TextEdit(
        old="""\
    self.apply_war_barrier()
""",
        new="""\
    self.apply_war_barrier()
    # A tree's small spec-v2 prefill: its first tokens leave before the next batch is built
    # (process_prefill_before_next_batch).
    self.process_prefill_before_next_batch()
""",
    ),
)

_PROCESS_EDITS = (
    TextEdit(
        old="""\
    if batch.forward_mode.is_decode():
        self.process_batch_result_decode(batch, result)
""",
        new="""\
    if getattr(result, "processed_before_next_batch", False):
        # Processed already, before the next batch was built (process_prefill_before_next_batch).
        return
    if batch.forward_mode.is_decode():
        self.process_batch_result_decode(batch, result)
""",
    ),
)

BACKPORT = Backport(
    id="prefill-before-next-batch",
    title="[Sched] Process a tree's small spec-v2 prefill before the next batch is built",
    upstream_prs=(),
    patch_file="0027-Sched-Process-a-tree-s-small-spec-v2-prefill-before-the-next-batch-is-built.patch",
    summary="opt-in (SGLANG_FUTUREMAP_PREFILL_BEFORE_NEXT_BATCH=1): the overlap loop processes a "
            "tree's small spec-v2 prefill at the start of get_next_batch_to_run, before it builds "
            "the next batch, as stock's spec v1 loop orders it",
    applied_upstream=None,
    targets=(
        Target(_SCHEDULER, "Scheduler.process_prefill_before_next_batch",
               process_prefill_before_next_batch, expected=ABSENT),
        # As back-port 19 leaves it (back-port 17's barrier is the function's first statement).
        Target(_SCHEDULER, "Scheduler.get_next_batch_to_run", None, expected="2ba7b3e4b7e5dcf7",
               kind="edit", edits=_NEXT_BATCH_EDITS),
        Target(_SCHEDULER, "Scheduler.process_batch_result", None, expected="dcb4d8cb3bcdc49d",
               kind="edit", edits=_PROCESS_EDITS),
    ),
)
