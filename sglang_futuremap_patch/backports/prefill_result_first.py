"""Back-port 16: a small or finished spec-v2 prefill is processed before the next launch.

Upstream: none (beyond upstream). It extends the overlap loop's own exception, SGLang's
``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP`` ("disable overlap to improve the TTFT of the
first batch"), to the cases where it costs the GPU little more than the result processing: the prefill
has finished, or is small and followed by a decode. Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when a
release takes a prefill's result processing out of the next launch's way. Uses no other back-port's code;
it matters once back-port 3 has removed the verify wait.

Why: in the overlap loop a batch's result is processed after the *next* batch has been
launched, so a prefill's first tokens leave the scheduler one launch later than the GPU has
them, stock and patched alike. A decode launch holds the host for 4-8 ms on an 8B-shaped target on H100 (FA3's eager
draft-extend metadata, the relay) and a prefill launch 15-30 ms (32 eagerly launched attention
layers under piecewise CUDA graph); a small prefill is done on the GPU long before either ends.
Taking that launch out of the first token's path is the margin the plugin needs to keep TTFT
at or below stock (results/serve-bench: TTFT p50 up to 17% above stock at concurrency 4-32
before, in cells whose boots scatter by 20-40%).

How: ``Scheduler.is_disable_overlap_for_batch`` (the loop asks it once per iteration, after it
has built the next batch) also answers yes after a spec-v2 prefill when its result's
``copy_done`` event has completed (``Event.query()``: no wait), or when the next batch is a
decode and the prefill had at most ``SMALL_PREFILL_TOKENS`` new tokens (then the loop waits
for it: a few ms, which the overlap order would have spent launching). The loop processes the
prefill's result first and launches the next batch right after: SGLang's own order for
consecutive prefills. The next batch was built before, so it is the same batch; the GPU idles
for the result processing (about 1.5 ms) once per such prefill, and the first tokens leave one
launch earlier. A large prefill still running keeps the overlap order (its GPU time covers the
next launch), and so does a chain's running prefill followed by another prefill (the second
one's requests would wait; ``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP`` is SGLang's switch for
that). A tree's running prefill goes first before another prefill too: that is the order of
stock SGLang, which runs a tree on spec v1 (no overlap), and the first tokens of the first
prefill otherwise wait for the whole launch of the second (20-50 ms of host time on an
8B-shaped target), while the second prefill's kernels queue behind the first on the GPU either
way. Not under DP attention (its ranks must decide alike; SGLang decides with synchronised
flags there) and not for non-speculative batches (unchanged).

Measured (H100, default configuration, serving benchmark, 2026-11-24, one boot per variant in
one call, results/serve-bench/h100-prf): inside the scheduler it does what it says at
concurrency 4 (a prefill's launch end -> its result processing 0.9 ms against 9.7 stock and
10.0 with the plugin's overlap order); the client's TTFT p50 did not improve beyond the
boot-to-boot scatter (two near-identical builds differed by up to 20% at concurrency 1-8) and
TPOT p50 read 0-9% worse than the overlap order in the same call. So it is **off for chains**
(topk 1) and **on for EAGLE trees** (topk > 1, since 2026-11-26; "Measured after the fix"
below): ``SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST=1`` turns it on for chains too, ``=0`` (or
anything but 1) off for trees too.

Fixed 2026-11-26: until then it never acted on a prefill that
reached an idle server (every prefill at concurrency 1). It read the prefill's mode from
``self.last_batch``, which SGLang by then has made the running batch and turned into the decode
in place. The timelines show it: at concurrency 1 every prefill's next event was the decode
launch, in the h100-prf record (read then as the loop waiting for a running prefill) and in the
FA3 tree runs of results/serve-bench/h200x2-2026-11-26, where that launch is 4-5 ms of the tree's
TTFT gap to stock spec v1. It now reads the snapshot the loop queued with the result.
Measured after the fix (4 x H200, results/serve-bench/h200x4-relay-2026-11-26), on the FA3 tree
with back-port 22's switch as well: a prefill's launch end -> its result processed 0.32 ms at
concurrency 1 (5.04 ms without), TTFT p50 x1.00 against stock spec v1 (x0.77 without); e2e
``pfirst`` cases token for token against stock, with 1-token requests reaching an idle engine.
Those requests finish at their prefill and are freed before the decode that still holds them is
launched; back-port 5's ``batch_pool_slots`` keeps that launch exact (it crashed before).

On by default for trees since then (4 x H200, results/serve-bench/h200x4-treedefault-2026-11-26):
the tree-v2 e2e group 18/18 and ``released`` 6/6 with it on. On a chain (the default
configuration, 3-6 boots per cell) it is x1.34 / 1.15 at concurrency 1 / 4 but x0.92 at 13, 16
and 48 against stock, where the plugin's own order reads x1.14 / 0.92 / 0.95: it stays off there.

A tree's consecutive prefills since 2026-11-27 (4 x H200, FA3 tree row, 2 boots per side,
results/serve-bench/h200x4-tree-eager-2026-11-27): before, 4 of 25 / 8 of 24 / 11 of 40
prefills at concurrency 13 / 16 / 45 were followed by another prefill and their results were
processed 5.1 / 7.9 / 9.2 ms after their launches on average (stock 0.1), with TTFT p99 x0.37 at
13 and x0.83 at 45. After, no prefill waits for another's launch (2.6 / 3.8 ms at 16 / 45), TTFT
p99 is x1.06 / 1.03 at 13 / 45, and e2e ``tree-v2`` is 18/18.
"""

from __future__ import annotations

import os

from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit

#: 1: the reordering on, 0 (or anything but 1): off; unset: on for trees (topk > 1) only.
PREFILL_RESULT_FIRST_ENV = "SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST"
#: A prefill of at most this many new tokens is processed before a following decode launch even
#: if the loop has to wait for it: its launch is host-bound (15-20 ms of host time on an
#: 8B-shaped target on H100, under piecewise CUDA graph), so it finishes on the GPU within a few
#: ms of it. A larger one's GPU time covers the next launch anyway: it keeps the overlap order.
SMALL_PREFILL_TOKENS = 1024


def process_prefill_first(self, batch) -> bool:
    """Whether the overlap loop should process the last batch, a spec-v2 prefill, before it
    launches ``batch``: when the prefill has finished on the GPU (the event query does not
    block), when ``batch`` is a decode and the prefill is small, or, for a tree, when ``batch``
    is another prefill. Cheap checks first.

    The last batch is read from the snapshot the loop queued with its result
    (``result_queue[0][0]``, ``ScheduleBatch.copy()`` at launch), not from ``self.last_batch``:
    when no request was running, ``get_next_batch_to_run`` makes the prefill batch object itself
    the running batch and ``prepare_for_decode`` turns it into the decode in place, so by now
    ``self.last_batch`` says DECODE (the case of every prefill at concurrency 1)."""
    if (
        batch is None
        or not batch.is_spec_v2
        or self.last_batch is None
        or self.require_mlp_sync
        or not self.result_queue
    ):
        return False
    launched, result = self.result_queue[0]
    if not launched.forward_mode.is_extend():
        return False
    setting = os.environ.get("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", "").strip()
    tree = (self.server_args.speculative_eagle_topk or 1) > 1
    # Unset: on for a tree (topk > 1) only, where it was measured to pay off (module docstring).
    if not (setting == "1" if setting else tree):
        return False
    copy_done = result.copy_done
    if copy_done is None:
        return False
    if copy_done.query():
        return True
    if tree and batch.forward_mode.is_extend():
        # Consecutive prefills of a tree: in the order of stock SGLang, which runs a tree on
        # spec v1, one prefill's result before the next prefill's launch.
        return True
    # The snapshot keeps the prefill's requests; each one's extend_input_len is what it
    # prefilled (ScheduleBatch.copy() does not carry extend_num_tokens).
    new_tokens = sum(req.extend_input_len for req in launched.reqs)
    return batch.forward_mode.is_decode() and new_tokens <= SMALL_PREFILL_TOKENS


_SCHEDULER = "sglang.srt.managers.scheduler"

_DECISION_EDITS = (
    TextEdit(
        old="""\
    return disable_overlap_for_batch or need_grammar_sync
""",
        new="""\
    # A finished or small prefill: its first tokens do not wait for the next launch
    # (process_prefill_first).
    return disable_overlap_for_batch or need_grammar_sync or self.process_prefill_first(batch)
""",
    ),
)

BACKPORT = Backport(
    id="prefill-result-first",
    title="[Sched] Process a small or finished spec-v2 prefill before the next launch",
    upstream_prs=(),
    patch_file="0016-Sched-Process-a-small-or-finished-spec-v2-prefill-before-the-next-launch.patch",
    summary="the overlap loop processes a spec-v2 prefill that has finished, or a small one "
            "followed by a decode, before it launches the next batch, so the first tokens do not "
            "wait for that launch; for trees (topk > 1) unless SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST=0 "
            "(=1: chains too)",
    applied_upstream=None,
    targets=(
        Target(_SCHEDULER, "SMALL_PREFILL_TOKENS", SMALL_PREFILL_TOKENS, expected=ABSENT,
               kind="value"),
        Target(_SCHEDULER, "Scheduler.process_prefill_first", process_prefill_first,
               expected=ABSENT),
        Target(_SCHEDULER, "Scheduler.is_disable_overlap_for_batch", None,
               expected="aafb2b339763569a", kind="edit", edits=_DECISION_EDITS),
    ),
)
