"""Back-port 9: an EAGLE tree that SGLang chooses by itself runs on spec v1, not on spec v2.

Upstream: none as such. SGLang 0.5.13 runs trees on spec v2 (sgl-project/sglang#26866, with
#26972, #27545 and #31364 after it), so the crash this change avoids does not exist there.
Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+, or when this
series gains spec-v2 tree support.

Why: with no ``--speculative-num-steps`` / ``--speculative-eagle-topk`` /
``--speculative-num-draft-tokens``, 0.5.12.x decides between spec v1 and spec v2 while topk is
still unset (spec v2 handles topk 1 only, so an explicit topk > 1 goes to v1), and only then
lets ``auto_choose_speculative_params`` fill in the three values. For ``LlamaForCausalLM``
with EAGLE or EAGLE3 it picks a tree (5 steps, topk 4, 8 draft tokens), and the spec-v2
worker then fails at the first decode: a device-side assert on FA3 (the backend SGLang chose
on Hopper while topk was unset), a tensor size mismatch in the draft-extend CUDA graph on
Triton. Stock SGLang crashes the same way; SGLang's default launch for Llama + EAGLE3
(``--speculative-algorithm EAGLE3 --speculative-draft-model-path ...``) never serves a
request.

How: right after the auto choice, a tree (topk > 1) that would run on spec v2 goes to spec
v1 instead, the way an explicit tree does: ``disable_overlap_schedule`` is set, and one
WARNING says so, why, and how to get spec v2 (a chain: topk 1). Every later server-argument
step then sees spec v1, as with an explicit tree. The attention backend stays what SGLang
chose (it ran earlier, on both paths). Auto choices of topk 1 (STANDALONE, and every other
architecture but Llama and Grok), explicit settings and ``--disable-overlap-schedule`` are
left alone.

Plugin and patch differ in form only: the plugin wraps
``ServerArgs._handle_speculative_decoding`` and makes the switch after the stock method has
returned; the patch makes it inside the stock method, right after the auto choice. Nothing in
between reads ``disable_overlap_schedule``.
"""

from __future__ import annotations

import logging

from sglang_futuremap_patch._api import PREFIX
from sglang_futuremap_patch._engine import Backport, Target, TextEdit, announce

#: The WARNING's text (the patch logs the same words through SGLang's own logger).
MESSAGE = (
    "Spec v1 is used for %s speculative decoding because the auto-chosen tree "
    "(num_steps=%d, eagle_topk=%d, num_draft_tokens=%d) needs topk > 1 and spec v2 in this "
    "SGLang release supports topk = 1 only (it would crash at the first decode). "
    "For spec v2, pass --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4."
)

_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")


def _handle_speculative_decoding(self, *, _stock_handle_speculative_decoding=None):
    """SGLang's method, then an auto-chosen tree goes to spec v1 (see the module docstring).

    Differs from 0.5.12.post1: after the stock method, an auto-chosen EAGLE / EAGLE3 /
    STANDALONE tree (topk > 1) on the overlap scheduler turns it off (spec v1), with one
    WARNING; everything else is the stock method's doing.
    """
    auto = self.speculative_algorithm is not None and self.speculative_num_steps is None
    _stock_handle_speculative_decoding(self)
    if (
        auto
        and self.speculative_algorithm in _EAGLE_FAMILY
        and self.speculative_eagle_topk > 1
        and not self.disable_overlap_schedule
    ):
        self.disable_overlap_schedule = True
        announce(logging.WARNING, f"{PREFIX} " + MESSAGE % (
            self.speculative_algorithm,
            self.speculative_num_steps,
            self.speculative_eagle_topk,
            self.speculative_num_draft_tokens,
        ))


_AUTO_CHOICE_EDITS = (
    TextEdit(
        old="""\
                ) = auto_choose_speculative_params(self)

""",
        new="""\
                ) = auto_choose_speculative_params(self)
                # The spec v1/v2 decision above ran while topk was unset; spec v2 in this
                # release supports topk = 1 only, so an auto-chosen tree goes to spec v1.
                if self.speculative_eagle_topk > 1 and not self.disable_overlap_schedule:
                    self.disable_overlap_schedule = True
                    logger.warning(
                        "Spec v1 is used for %s speculative decoding because the auto-chosen tree "
                        "(num_steps=%d, eagle_topk=%d, num_draft_tokens=%d) needs topk > 1 and spec v2 in this "
                        "SGLang release supports topk = 1 only (it would crash at the first decode). "
                        "For spec v2, pass --speculative-num-steps 3 --speculative-eagle-topk 1 "
                        "--speculative-num-draft-tokens 4.",
                        self.speculative_algorithm,
                        self.speculative_num_steps,
                        self.speculative_eagle_topk,
                        self.speculative_num_draft_tokens,
                    )

""",
    ),
)

BACKPORT = Backport(
    id="auto-tree-spec-v1",
    title="[Spec] Run an auto-chosen EAGLE tree (topk > 1) on spec v1",
    upstream_prs=(26866,),
    patch_file="0009-Spec-Run-an-auto-chosen-EAGLE-tree-on-spec-v1.patch",
    summary="SGLang's auto-chosen topk-4 tree (Llama + EAGLE/EAGLE3) no longer reaches the "
            "topk-1-only spec v2 worker",
    applied_upstream="0.5.13",
    targets=(
        Target("sglang.srt.server_args", "ServerArgs._handle_speculative_decoding",
               _handle_speculative_decoding, expected="016ca0673d3d8ca4", kind="wrap",
               original_arg="_stock_handle_speculative_decoding", edits=_AUTO_CHOICE_EDITS,
               edit_note=(
                   "The plugin wraps ServerArgs._handle_speculative_decoding and switches an "
                   "auto-chosen tree to spec v1 after the stock method returns; this patch "
                   "makes the same switch inside the method, right after the auto choice "
                   "(nothing in between reads disable_overlap_schedule)."
               )),
    ),
)
