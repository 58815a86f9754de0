"""Back-port 10: the spec-v2 draft extend is as wide as the draft tree.

Upstream: sgl-project/sglang#27545 (the Triton draft-extend CUDA-graph metadata steps its
query offsets by the number of draft tokens), #26651 (that metadata's cached-KV range is the
prefix alone) and the part of #26866 that sizes the v2 draft extend by the tree (the worker's
per-request token count, the draft-extend CUDA-graph runner's buffers). Applies to: SGLang 0.5.12 and 0.5.12.post1. Delete when users are on
0.5.13+ (which has both).

Why: the spec-v2 draft extend runs every verified slot of a request through the draft model,
``speculative_num_draft_tokens`` per request, and 0.5.12.x describes it with
``speculative_num_steps + 1`` in three places: the request's ``num_tokens_per_req`` that the
draft worker hands the backends, the draft-extend CUDA-graph runner's token count per request
(its buffers, its padding, its replay), and the query offsets Triton records for that graph.
The two counts are equal for a chain (topk 1), which is all spec v2 runs in 0.5.12.x. A tree
has more draft tokens than steps + 1 (topk 4 with 5 steps: 8 against 6), and SGLang 0.5.12.x
then fails in the draft-extend CUDA graph (``The size of tensor a (144) must match the size
of tensor b (184)``), and with the buffers sized, Triton's queries of every request but the
first read the wrong rows (NaN at batch size > 1). The same graph metadata also takes the
cached KV of every request as ``seq_lens`` long, which in the v2 draft extend counts the
extended tokens as well: the Triton kernel then sees each of them twice, once causally as
the extend part and once, future tokens included, as cached prefix. The draft's hidden states
come out wrong and it accepts less (on the H100, a STANDALONE draft at 3 / 4 / 16 on Triton with
CUDA graph: 3.37 accepted per step where SGLang 0.5.13 and the eager path get 3.63).

How: the three places count ``speculative_num_draft_tokens`` for the spec-v2 draft extend
(``ForwardMode.DRAFT_EXTEND_V2``); the spec-v1 draft extend keeps ``speculative_num_steps + 1``
(there it is one token per accepted position, at most steps + 1). For a chain both counts are
the same number, so nothing changes for topk 1; this back-port matters once back-port 11
runs trees on spec v2. For a tree (more draft tokens than steps + 1), the Triton graph
metadata also takes the cached range as ``seq_lens - num_draft_tokens``. A chain keeps the
stock range: changing it there would change which draft tokens stock SGLang 0.5.12.x chains
accept on Triton with CUDA graph, and with them the verify batches that the token-exact
comparison with stock relies on. Each change is a text edit of SGLang's function, the same in
the plugin and in the patch.
"""

from __future__ import annotations

from sglang_futuremap_patch._engine import Backport, Target, TextEdit

_WORKER_EDITS = (
    TextEdit(
        old="""\
        num_tokens_per_req=self.speculative_num_steps + 1,
        num_tokens_for_logprob_per_req=self.speculative_num_steps + 1,
""",
        new="""\
        # A draft tree is wider than steps + 1: every verified slot is extended.
        num_tokens_per_req=self.speculative_num_draft_tokens,
        num_tokens_for_logprob_per_req=self.speculative_num_draft_tokens,
""",
    ),
)

_RUNNER_EDITS = (
    TextEdit(
        old="""\
    self.num_tokens_per_bs = self.speculative_num_steps + 1
""",
        new="""\
    # Spec v2 extends every draft slot of the tree, spec v1 the accepted ones only.
    self.num_tokens_per_bs = (
        model_runner.server_args.speculative_num_draft_tokens
        if self.forward_mode == ForwardMode.DRAFT_EXTEND_V2
        else self.speculative_num_steps + 1
    )
""",
    ),
)

_TRITON_EDITS = (
    TextEdit(
        old="""\
        num_tokens_per_bs = self.speculative_num_steps + 1
""",
        new="""\
        # The v2 graph lays out num_draft_tokens queries per request (more than
        # steps + 1 for a tree).
        num_tokens_per_bs = (
            self.num_draft_tokens
            if forward_mode.is_draft_extend_v2()
            else self.speculative_num_steps + 1
        )
        if num_tokens_per_bs != self.speculative_num_steps + 1:
            # A tree's v2 draft extend: seq_lens counts the prefix and the extended
            # tokens, which the kernel also gets as k/v; the cached range is the prefix.
            seq_lens = torch.clamp(seq_lens - num_tokens_per_bs, min=0)
""",
    ),
)

_TRITON = "sglang.srt.layers.attention.triton_backend"

BACKPORT = Backport(
    id="tree-draft-extend-width",
    title="[Spec] Size the spec-v2 draft extend by the draft tree",
    upstream_prs=(27545, 26651, 26866),
    patch_file="0010-Spec-Size-the-spec-v2-draft-extend-by-the-draft-tree.patch",
    summary="v2 draft extend, its CUDA-graph runner and Triton's graph metadata count "
            "num_draft_tokens per request; Triton's cached range for a tree is the prefix",
    targets=(
        Target("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker._draft_extend_for_decode",
               None, expected="d1cafe1ff49af2c0", kind="edit", edits=_WORKER_EDITS),
        Target("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
               "EAGLEDraftExtendCudaGraphRunner.__init__", None, expected="c1422d1b06d40d1f",
               kind="edit", edits=_RUNNER_EDITS),
        Target(_TRITON, "TritonAttnBackend.init_forward_metadata_capture_cuda_graph", None,
               expected="cb74ce6c9a710a31", kind="edit", edits=_TRITON_EDITS),
        Target(_TRITON, "TritonAttnBackend.init_forward_metadata_replay_cuda_graph", None,
               expected="835abea345df31e3", kind="edit", edits=_TRITON_EDITS),
    ),
)
