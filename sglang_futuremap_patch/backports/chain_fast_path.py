"""Back-port 15: a topk-1 draft (a chain) skips the full-vocabulary softmax and the tree sort.

Upstream: sgl-project/sglang#26235 (argmax instead of softmax + max when topk is 1; reverted by
#26358 for a ROCm tie-break problem, relanded as #26397 gated to CUDA) and #26424 (the chain's
parents and kept positions are constants; no cat / topk / sort / gather per draft). Applies to:
SGLang 0.5.12 and 0.5.12.post1. Delete when users are on 0.5.13+ (which has both).

Why: with ``--speculative-eagle-topk 1`` (SGLang's choice for every chain, and what most spec-v2
users run) the draft "tree" is one path, yet 0.5.12.x draws each draft token through a softmax
over the whole vocabulary and a max of the probabilities: in every draft step inside the draft
CUDA graph, in the draft extend after each verify (once inside its CUDA graph, once more on the
rows it keeps), and then sorts the chain's scores to find the positions it keeps, which for a
chain are all of them in order. That is GPU time every decode iteration for values nothing
reads: with one candidate per step the scores never choose anything.

How: when topk is 1 the draft steps, the draft extend after a verify (eager and CUDA graph) take
``argmax`` of the logits with a constant probability of 1, and ``draft_forward`` returns the
chain's parents and kept positions from two constant tensors with the step tokens concatenated.
The draft worker builds them in ``init_cuda_graphs``, which every EAGLE v2 draft worker runs
before capturing (EAGLE/EAGLE3's and STANDALONE's, whose ``__init__`` is its own) and runs again
when graphs are rebuilt for another step count; rows for the largest batch, and a larger batch, a
single-step draft or a step count that no longer matches takes SGLang's own path. The draft
tokens are the same wherever the largest logits are above about 1e-5 in magnitude (a trained
model's are far above): the logits are the lm_head's bfloat16 products in float32, two distinct
bfloat16 values that large stay two float32 probabilities, so the first index of the largest
logit is the first index of the largest probability (equal logits tie in both, and both
reductions return the first index). Nearer zero two adjacent bfloat16 logits can round to one
probability: stock's max then takes the first of them, argmax the larger, which is also what
the target's greedy verify takes (its own argmax), as in 0.5.13; a greedy target's tokens do
not change, the draft accepts more. The probabilities only fed the chain's scores, and with one
candidate per step the kept positions are every position in order, whatever the scores. The
prefill's draft extend keeps the softmax (its probability goes to a PD decode instance). Multi-layer EAGLE keeps its own path (as in 0.5.13). On ROCm the argmax
stays off, as upstream gates it (#26358: a different tie-break there on FP8 logits). Each change is a text
edit of SGLang's function, the same in the plugin and in the patch; the draft extend's edit
sits on top of back-port 10's.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import Backport, Target, TextEdit

_GRAPHS_EDITS = (
    TextEdit(
        old="""\
    self.cuda_graph_runner_for_draft_extend = None

    if self.server_args.disable_cuda_graph:
""",
        new="""\
    self.cuda_graph_runner_for_draft_extend = None

    # topk 1 makes the draft tree a chain: its parents and the positions draft_forward
    # keeps are the same for every request and iteration. Built here, before the draft
    # graph captures draft_forward, by every draft worker (StandaloneDraftWorker has its
    # own __init__) and again whenever the graphs are rebuilt for another step count.
    self.chain_parents = self.chain_positions = None
    if self.topk == 1 and self.speculative_num_steps > 1:
        args = self.server_args
        rows = max(args.cuda_graph_max_bs or 0, args.max_running_requests or 0, 1)
        steps = self.speculative_num_steps
        self.chain_parents = torch.arange(
            -1, steps - 1, dtype=torch.long, device=self.device
        ).repeat(rows, 1)
        self.chain_positions = torch.arange(
            steps, dtype=torch.long, device=self.device
        ).repeat(rows, 1)

    if self.server_args.disable_cuda_graph:
""",
    ),
)

_DRAFT_FORWARD_EDITS = (
    TextEdit(
        old="""\
        probs = torch.softmax(logits_output.next_token_logits, dim=-1)
        topk_p, topk_index = fast_topk(probs, self.topk, dim=-1)
""",
        new="""\
        if self.topk == 1 and not _is_hip:
            # One candidate per step: the largest logit, no softmax over the vocabulary.
            topk_index = torch.argmax(
                logits_output.next_token_logits, dim=-1, keepdim=True
            )
            topk_p = torch.ones_like(topk_index, dtype=torch.float32)
        else:
            probs = torch.softmax(logits_output.next_token_logits, dim=-1)
            topk_p, topk_index = fast_topk(probs, self.topk, dim=-1)
""",
    ),
    TextEdit(
        old="""\
    # Organize the results
    score_list = torch.cat(score_list, dim=1).flatten(
""",
        new="""\
    # Organize the results
    chain = getattr(self, "chain_parents", None)
    if (
        chain is not None
        and token_list[0].shape[0] <= chain.shape[0]
        and chain.shape[1] == self.speculative_num_steps
    ):
        # A chain keeps every step's token in order.
        bs = token_list[0].shape[0]
        return chain[:bs], self.chain_positions[:bs], torch.cat(token_list, dim=1)
    score_list = torch.cat(score_list, dim=1).flatten(
""",
    ),
)

_DRAFT_EXTEND_EDITS = (
    TextEdit(
        old="""\
    probs = torch.softmax(draft_logits_output.next_token_logits, dim=-1)
    ret_topk_p, ret_topk_index = fast_topk(probs, self.topk, dim=-1)
""",
        new="""\
    if self.topk == 1 and not _is_hip:
        ret_topk_index = torch.argmax(
            draft_logits_output.next_token_logits, dim=-1, keepdim=True
        )
        ret_topk_p = torch.ones_like(ret_topk_index, dtype=torch.float32)
    else:
        probs = torch.softmax(draft_logits_output.next_token_logits, dim=-1)
        ret_topk_p, ret_topk_index = fast_topk(probs, self.topk, dim=-1)
""",
    ),
)

_CAPTURE_EDITS = (
    TextEdit(
        old="""\
        probs = torch.softmax(ret.next_token_logits, dim=-1)
        ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
""",
        new="""\
        if self.topk == 1 and torch.version.hip is None:
            ret.topk_index = torch.argmax(ret.next_token_logits, dim=-1, keepdim=True)
            ret.topk_p = torch.ones_like(ret.topk_index, dtype=torch.float32)
        else:
            probs = torch.softmax(ret.next_token_logits, dim=-1)
            ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
""",
    ),
)

_WORKER = "sglang.srt.speculative.eagle_worker_v2"

BACKPORT = Backport(
    id="chain-fast-path",
    title="[Spec] topk-1 drafts: argmax instead of a vocabulary softmax, no tree sort",
    upstream_prs=(26235, 26397, 26424),
    patch_file="0015-Spec-topk-1-drafts-argmax-instead-of-a-vocabulary-softmax-no-tree-sort.patch",
    summary="a chain draft takes argmax of the logits and returns constant parents and "
            "positions (no full-vocabulary softmax, no cat/topk/sort/gather per draft)",
    applied_upstream="0.5.13",
    targets=(
        Target(_WORKER, "EagleDraftWorker.init_cuda_graphs", None, expected="99c0cd9eb7407151",
               kind="edit", edits=_GRAPHS_EDITS),
        Target(_WORKER, "EagleDraftWorker.draft_forward", None, expected="f1c2aef37c03ac0b", kind="edit",
               edits=_DRAFT_FORWARD_EDITS),
        # On top of back-port 10's edit of the same function (its fingerprint).
        Target(_WORKER, "EagleDraftWorker._draft_extend_for_decode", None, expected="cc3a475584664b67",
               kind="edit", edits=_DRAFT_EXTEND_EDITS),
        Target("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
               "EAGLEDraftExtendCudaGraphRunner.capture_one_batch_size", None, expected="574544fe68d4487c",
               kind="edit", edits=_CAPTURE_EDITS),
    ),
)
