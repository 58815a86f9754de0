"""Back-port 11: EAGLE trees (topk > 1) run on spec v2, through the publish/stash relay.

Upstream: sgl-project/sglang#26866 (tree drafting on the spec-v2 worker: the accepted path is
compacted to the front of each request's slots, the accepted-KV move that 0.5.12.x carries
unused is wired up and no longer over-reads ``accept_index``, the bonus token is read with
the accepted path's stride; reverted once as #26981, landed again before 0.5.13).
Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+.
Depends on back-port 10 (the draft extend sized by the tree), which itself needs 4; and on
9, whose auto-tree switch it now decides.

Why: SGLang 0.5.12.x runs an explicit tree (SGLang's EAGLE3 docs use 3 steps / topk 4 / 16
draft tokens) on spec v1, with no overlap scheduler, and its auto-chosen tree for Llama +
EAGLE/EAGLE3 (5/4/8) on a spec-v2 worker that handles chains only and crashes (back-port 9
sends it to spec v1). The v2 worker already drafts and verifies a tree; what it lacks is the
step after: the tree's accepted tokens sit at scattered nodes, while everything after verify
(the bonus token, the draft extend, the scheduler's output reader, the committed KV) reads a
request's first accept-length slots.

How: after sampling, verify moves the accepted path to the front of each request's
``num_draft_tokens`` slots: the target's KV of the accepted nodes into the slots of the
positions they now hold (SGLang's ``move_accepted_tokens_to_target_kvcache``, sized by
``accept_index``'s own shape, ``bs * (steps + 1)``, instead of ``bs * num_draft_tokens``, which
read past it), and the predicted ids and the hidden states by a gather
(``compact_accepted_tree_path``). Slots past the accepted length keep whatever they held; no
reader looks at them. The bonus token is read with the accepted path's stride. Logprobs are
computed before the move (they index the tree by ``accept_index``). For a chain the accepted
path already is the front, so nothing runs for topk 1. The scheduler then sends a tree to
spec v2 where this back-port covers it (``spec_v2_tree_unsupported`` says why not
elsewhere): EAGLE, EAGLE3 and STANDALONE (not multi-layer EAGLE), page size 1, the Triton,
FlashInfer and FA3 backends, no DP attention, and a full-attention target (Llama, Qwen2,
Qwen3); the verify of a hybrid linear-attention target rejects trees. FA3 and FlashInfer
keep the host mirror of ``seq_lens`` for trees (private-stream copy, no ``verify_done``
wait); Triton builds everything on the device. On FlashInfer a tree stays on spec v1 unless
``SGLANG_FUTUREMAP_TREE_SPEC_V2=1``: there every forward plans on the host from device offsets
(a sync each) and the v2 draft extend runs eagerly (no draft-extend CUDA graph for FlashInfer on
spec v2, 0.5.13 alike), so spec v2 decodes slower than spec v1 (H100, 8B-shaped, 3 / 4 / 16:
x0.76-0.92, 0.5.13 x0.84-0.95; results/bench-h100/trees). ``SGLANG_FUTUREMAP_TREE_SPEC_V2=0``
keeps every tree on spec v1 as in stock SGLang (an auto-chosen one too, back-port 9);
``python -m sglang_futuremap_patch status`` shows the choice.

Token identity: on the H100 (results/gpu-e2e/h100-tree-v2) the plugin's spec-v2 tree gives
SGLang 0.5.13's tokens (deterministic batches on FlashInfer with CUDA graph: identical), and
both part from stock 0.5.12.x spec v1 on the same requests at the same positions, each time
at a near-tie of the bf16 logits (the two sides rate each other's token within 1/4 nat, most
often 0 or 1/16): spec v1 and v2 run the verify and draft extend in other shapes.

Plugin and patch differ in form only for the routing: the plugin wraps
``ServerArgs._handle_speculative_decoding`` (back-port 9's wrapper, extended) and turns the
overlap scheduler back on after the stock method turned it off for the tree alone; the patch
changes the stock condition and back-port 9's auto-tree switch in place. Everything else is a
text edit of the function it changes, or new code.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from sglang_futuremap_patch._api import PREFIX
from sglang_futuremap_patch._engine import ABSENT, Backport, Target, TextEdit, announce
from sglang_futuremap_patch.backports.auto_tree_spec_v1 import _AUTO_CHOICE_EDITS, _EAGLE_FAMILY

#: Set to 0 to keep EAGLE trees on spec v1 (stock SGLang 0.5.12.x's path); unset or 1: spec v2
#: where this series covers the tree.
TREE_ENV = "SGLANG_FUTUREMAP_TREE_SPEC_V2"


def tree_spec_v2_wanted() -> bool:
    """False when the user keeps trees on spec v1 (``SGLANG_FUTUREMAP_TREE_SPEC_V2=0``; the
    same test opens ``spec_v2_tree_unsupported``, which the patch puts into server_args.py)."""
    return os.environ.get(TREE_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def tree_spec_v2_forced() -> bool:
    """True when the user asks for spec v2 trees on FlashInfer too (``=1``)."""
    return os.environ.get(TREE_ENV, "").strip().lower() in ("1", "true", "yes", "on")

#: The INFO line for a tree on spec v2 (the patch logs the same words via SGLang's logger).
TREE_V2_MESSAGE = (
    "spec v2 runs the EAGLE tree (num_steps=%s, eagle_topk=%s, num_draft_tokens=%s) with the "
    "overlap scheduler; SGLANG_FUTUREMAP_TREE_SPEC_V2=0 keeps spec v1."
)
#: The WARNING for an auto-chosen tree that stays on spec v1 (stock would crash).
AUTO_TREE_V1_MESSAGE = (
    "Spec v1 is used for %s speculative decoding because the auto-chosen tree "
    "(num_steps=%s, eagle_topk=%s, num_draft_tokens=%s) does not run on spec v2 here: %s."
)


def spec_v2_tree_unsupported(server_args) -> Optional[str]:
    """Why an EAGLE tree (topk > 1) stays on spec v1, or None when spec v2 runs it."""
    if os.environ.get("SGLANG_FUTUREMAP_TREE_SPEC_V2", "").strip().lower() in ("0", "false", "no", "off"):
        return "SGLANG_FUTUREMAP_TREE_SPEC_V2=0 keeps trees on spec v1"
    if server_args.speculative_algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
        return f"spec v2 trees cover EAGLE, EAGLE3 and STANDALONE, not {server_args.speculative_algorithm}"
    if server_args.enable_multi_layer_eagle:
        return "multi-layer EAGLE runs chains only on spec v2"
    if (server_args.page_size or 1) != 1:
        return f"page size {server_args.page_size} (spec v2 trees need page size 1 here)"
    if server_args.enable_dp_attention:
        return "DP attention"
    backends = {
        server_args.attention_backend,
        server_args.prefill_attention_backend,
        server_args.decode_attention_backend,
    } - {None}
    if not backends or not backends <= {"triton", "flashinfer", "fa3"}:
        return f"attention backend {sorted(backends) or None} (spec v2 trees: triton, flashinfer, fa3)"
    arch = server_args.get_model_config().hf_config.architectures[0]
    if arch not in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        return f"target {arch} (spec v2 trees: full-attention Llama, Qwen2, Qwen3)"
    if "flashinfer" in backends and os.environ.get(
        "SGLANG_FUTUREMAP_TREE_SPEC_V2", ""
    ).strip().lower() not in ("1", "true", "yes", "on"):
        # FlashInfer plans every forward on the host from device offsets (a sync each), and
        # the v2 draft extend runs eagerly there: a spec-v2 tree decodes slower than spec v1
        # (0.5.13 too). Spec v1 unless the user asks.
        return (
            "FlashInfer decodes a tree slower on spec v2 than on spec v1; "
            "SGLANG_FUTUREMAP_TREE_SPEC_V2=1 runs it on spec v2"
        )
    return None


def _handle_speculative_decoding(self, *, _stock_handle_speculative_decoding=None):
    """SGLang's method, then a tree goes to spec v2 where this series covers it, and an
    auto-chosen one that it does not cover to spec v1 (back-port 9).

    Differs from 0.5.12.post1: after the stock method, for an EAGLE-family tree (topk > 1)
    that ``spec_v2_tree_unsupported`` accepts, the overlap scheduler the stock method turned
    off for the tree alone is turned back on (one INFO line); an auto-chosen tree it does not
    accept goes to spec v1 as in back-port 9 (one WARNING naming the reason). Chains and
    everything else are the stock method's doing.
    """
    auto = self.speculative_algorithm is not None and self.speculative_num_steps is None
    overlap_was_off = self.disable_overlap_schedule
    _stock_handle_speculative_decoding(self)
    if self.speculative_algorithm not in _EAGLE_FAMILY or (self.speculative_eagle_topk or 1) <= 1:
        return
    tree = (self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens)
    # SGLang's copy (server_args.py), as later back-ports leave it.
    from sglang.srt import server_args as _server_args

    why_v1 = _server_args.spec_v2_tree_unsupported(self)
    if why_v1 is None:
        # Stock turned the overlap scheduler off for an explicit tree alone; not when the
        # user did, or asked for spec v1 with SGLANG_ENABLE_SPEC_V2=0.
        if not overlap_was_off and _spec_v2_enabled():
            self.disable_overlap_schedule = False
        if not self.disable_overlap_schedule:
            announce(logging.INFO, f"{PREFIX} " + TREE_V2_MESSAGE % tree)
    elif auto and not self.disable_overlap_schedule:
        self.disable_overlap_schedule = True
        announce(logging.WARNING, f"{PREFIX} " + AUTO_TREE_V1_MESSAGE % (
            self.speculative_algorithm, *tree, why_v1))


def _spec_v2_enabled() -> bool:
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_ENABLE_SPEC_V2.get())


_SERVER_ARGS_EDITS = (
    TextEdit(
        old="""\
            if (
                self.speculative_eagle_topk is not None
                and self.speculative_eagle_topk > 1
                and not self.disable_overlap_schedule
            ):
                self.disable_overlap_schedule = True
                spec_v1_reason = "spec v2 currently only supports topk = 1"
""",
        new="""\
            tree_v1_reason = (
                spec_v2_tree_unsupported(self)
                if self.speculative_eagle_topk is not None
                and self.speculative_eagle_topk > 1
                else None
            )
            if tree_v1_reason is not None and not self.disable_overlap_schedule:
                self.disable_overlap_schedule = True
                spec_v1_reason = tree_v1_reason
""",
    ),
    TextEdit(
        # Back-port 9's auto-tree switch as its edit inserted it (after the auto choice).
        old=_AUTO_CHOICE_EDITS[0].new.split("\n", 1)[1][:-1],
        new="""\
                # The spec v1/v2 decision above ran while topk was unset: an auto-chosen
                # tree that spec v2 does not run here goes to spec v1.
                tree_v1_reason = (
                    spec_v2_tree_unsupported(self)
                    if self.speculative_eagle_topk > 1
                    else None
                )
                if tree_v1_reason is not None and not self.disable_overlap_schedule:
                    self.disable_overlap_schedule = True
                    logger.warning(
                        "Spec v1 is used for %s speculative decoding because the auto-chosen tree "
                        "(num_steps=%s, eagle_topk=%s, num_draft_tokens=%s) does not run on spec v2 here: %s.",
                        self.speculative_algorithm,
                        self.speculative_num_steps,
                        self.speculative_eagle_topk,
                        self.speculative_num_draft_tokens,
                        tree_v1_reason,
                    )

            if self.speculative_eagle_topk > 1 and not self.disable_overlap_schedule:
                logger.info(
                    "spec v2 runs the EAGLE tree (num_steps=%s, eagle_topk=%s, num_draft_tokens=%s) with the "
                    "overlap scheduler; SGLANG_FUTUREMAP_TREE_SPEC_V2=0 keeps spec v1.",
                    self.speculative_num_steps,
                    self.speculative_eagle_topk,
                    self.speculative_num_draft_tokens,
                )
""",
    ),
)

_VERIFY_EDITS = (
    TextEdit(
        old="""\
            accept_lens,
            bonus_tokens,
            self.speculative_num_draft_tokens,
        )
""",
        new="""\
            accept_lens,
            bonus_tokens,
            # The accepted path's stride (steps + 1), not the tree's.
            accept_index.shape[1],
        )
""",
    ),
    TextEdit(
        old="""\
        compute_spec_v2_logprobs(
            batch, logits_output, predict, accept_index, self.speculative_num_steps
        )
""",
        new="""\
        compute_spec_v2_logprobs(
            batch, logits_output, predict, accept_index, self.speculative_num_steps
        )

    if self.topk > 1 and not batch.forward_mode.is_idle():
        # A tree accepts a path of nodes: move it to the front of each request's slots,
        # where the draft extend, the scheduler and the committed KV read it.
        predict = self.compact_accepted_tree_path(
            batch, logits_output, predict, accept_index, accept_lens
        )
""",
    ),
)

_MOVE_EDITS = (
    TextEdit(
        old="""\
    size = bs * self.speculative_num_draft_tokens
""",
        new="""\
    # One program per accept_index element (bs * (steps + 1)): the tree is wider.
    size = bs * accept_index.shape[1]
""",
    ),
)


def compact_accepted_tree_path(self, batch, logits_output, predict, accept_index, accept_lens):
    """Move a tree's accepted path to the front of each request's ``num_draft_tokens`` slots.

    ``accept_index`` is ``[bs, steps + 1]``: the accepted nodes (global rows of ``predict``),
    -1 past the accepted length. The target KV of those nodes moves to the slots of the
    positions ``seq_lens .. seq_lens + accept_len``; ``predict`` and the hidden states (when
    the target captured them) are gathered likewise. Padding gathers node 0 into slots past
    the accepted length, which nothing reads. Returns the compacted ``predict``.
    """
    self.move_accepted_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1)
    bs, width = accept_index.shape
    nodes = accept_index.clamp(min=0).to(torch.int64).reshape(-1)
    compacted = []
    for x in (predict, logits_output.hidden_states):
        if x is None:
            compacted.append(None)
            continue
        out = x.clone()
        out.view(bs, self.speculative_num_draft_tokens, *x.shape[1:])[:, :width] = x[nodes].view(
            bs, width, *x.shape[1:]
        )
        compacted.append(out)
    logits_output.hidden_states = compacted[1]
    return compacted[0]


_SERVER_ARGS = "sglang.srt.server_args"
_WORKER = "sglang.srt.speculative.eagle_worker_v2"

BACKPORT = Backport(
    id="spec-v2-tree",
    title="[Spec] Run EAGLE trees (topk > 1) on spec v2",
    upstream_prs=(26866,),
    patch_file="0011-Spec-Run-EAGLE-trees-topk-1-on-spec-v2.patch",
    summary="the v2 worker compacts a tree's accepted path (KV, ids, hidden states); trees "
            "with page size 1 on Triton/FlashInfer/FA3 run on spec v2",
    targets=(
        Target(_SERVER_ARGS, "spec_v2_tree_unsupported", spec_v2_tree_unsupported,
               expected=ABSENT),
        Target(_SERVER_ARGS, "ServerArgs._handle_speculative_decoding",
               _handle_speculative_decoding, expected="b243b1c49361c519", kind="wrap",
               original_arg="_stock_handle_speculative_decoding", edits=_SERVER_ARGS_EDITS,
               edit_note=(
                   "The plugin wraps ServerArgs._handle_speculative_decoding and turns the "
                   "overlap scheduler back on after the stock method turned it off for a tree "
                   "that spec v2 now runs; this patch changes the stock condition and the "
                   "auto-tree switch of patch 9 in place."
               )),
        Target(_WORKER, "EAGLEWorkerV2.verify", None, expected="c1ff2631262adbb0", kind="edit",
               edits=_VERIFY_EDITS),
        Target(_WORKER, "EAGLEWorkerV2.move_accepted_tokens_to_target_kvcache", None,
               expected="27b8fb355ee7f685", kind="edit", edits=_MOVE_EDITS),
        Target(_WORKER, "EAGLEWorkerV2.compact_accepted_tree_path", compact_accepted_tree_path,
               expected=ABSENT),
    ),
)
