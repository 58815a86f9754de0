"""Back-port tree-draft-extend-width (#27545, #26651, #26866): the Triton metadata of the
spec-v2 draft-extend CUDA graph for a tree.

SGLang's real ``TritonAttnBackend.init_forward_metadata_replay_cuda_graph`` (as the series
leaves it) fills its graph buffers for a ``DRAFT_EXTEND_V2`` batch. Its row-copy kernel
(``create_flashinfer_kv_indices_triton``, which calls jitted helpers that Triton's CPU
interpreter cannot run once imported) is replaced by the same copy in torch; what is tested is
the lengths and offsets the backend hands it. The backend object carries only the buffers
that path reads.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport

#: Per request: the prefix already cached, before the draft extend's tokens.
PREFIX = [5, 12, 3]
WIDTH = 64


class _RowCopy:
    """``create_flashinfer_kv_indices_triton[(bs,)](...)`` in torch: request ``i``'s first
    ``kv_lens[i]`` slots of its row go to ``kv_indices[kv_indptr[i]:]``."""

    def __getitem__(self, grid):
        def launch(req_to_token, pool, kv_lens, kv_indptr, kv_start, kv_indices, stride):
            assert kv_start is None and stride == req_to_token.shape[1]
            for i in range(grid[0]):
                n, at = int(kv_lens[i]), int(kv_indptr[i])
                kv_indices[at : at + n] = req_to_token[int(pool[i]), :n]
        return launch


@pytest.fixture
def triton_backend(clean_state, monkeypatch):
    from sglang.srt.layers.attention import triton_backend as tb

    activate_backport()
    monkeypatch.setattr(tb, "create_flashinfer_kv_indices_triton", _RowCopy())
    return tb


def _replay(tb, steps: int, draft_tokens: int, bs_padded: int):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = len(PREFIX)
    rows = torch.arange(1, (bs_padded + 1) * WIDTH + 1, dtype=torch.int32).view(bs_padded + 1, WIDTH)
    backend = SimpleNamespace(
        speculative_num_steps=steps, num_draft_tokens=draft_tokens, device="cpu",
        qo_indptr=torch.zeros(bs_padded + 1, dtype=torch.int32),
        kv_indptr=torch.zeros(bs_padded + 1, dtype=torch.int32),
        cuda_graph_kv_indices=torch.zeros(bs_padded * WIDTH, dtype=torch.int64),
        req_to_token=rows)
    # As the draft-extend graph runner hands them over: seq_lens = prefix + extended tokens,
    # padded rows at the fill value 1 on request slot 0.
    per_req = draft_tokens
    seq_lens = torch.tensor([p + per_req for p in PREFIX] + [1] * (bs_padded - bs), dtype=torch.int64)
    pool = torch.tensor(list(range(1, bs + 1)) + [0] * (bs_padded - bs), dtype=torch.int64)
    tb.TritonAttnBackend.init_forward_metadata_replay_cuda_graph(
        backend, bs_padded, pool, seq_lens, int(seq_lens.sum()), None,
        ForwardMode.DRAFT_EXTEND_V2, None, None)
    return backend, rows


def test_tree_queries_step_by_the_draft_tokens_and_cache_the_prefix_only(triton_backend):
    backend, rows = _replay(triton_backend, steps=3, draft_tokens=16, bs_padded=4)
    assert backend.qo_indptr.tolist() == [0, 16, 32, 48, 64]
    kv_lens = PREFIX + [0]  # the padded row's fill value (1) is below its 16 tokens: empty
    expected_indptr = [0]
    for n in kv_lens:
        expected_indptr.append(expected_indptr[-1] + n)
    assert backend.kv_indptr.tolist() == expected_indptr
    got = backend.cuda_graph_kv_indices[: expected_indptr[-1]].tolist()
    want = [s for r, n in enumerate(PREFIX) for s in rows[r + 1, :n].tolist()]
    assert got == want  # each request's cached prefix, none of its extended tokens


def test_chain_keeps_stock_metadata(triton_backend):
    """topk 1 (steps + 1 draft tokens): SGLang 0.5.12.x's stride and cached range as they were."""
    backend, rows = _replay(triton_backend, steps=3, draft_tokens=4, bs_padded=3)
    assert backend.qo_indptr.tolist() == [0, 4, 8, 12]
    lens = [p + 4 for p in PREFIX]
    assert backend.kv_indptr.tolist() == [0, lens[0], lens[0] + lens[1], sum(lens)]


def _capture(tb, steps: int, draft_tokens: int, bs: int):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    rows = torch.arange(1, (bs + 1) * WIDTH + 1, dtype=torch.int32).view(bs + 1, WIDTH)
    backend = SimpleNamespace(
        speculative_num_steps=steps, num_draft_tokens=draft_tokens, device="cpu",
        qo_indptr=torch.zeros(bs + 1, dtype=torch.int32),
        kv_indptr=torch.zeros(bs + 1, dtype=torch.int32), window_kv_indptr=None,
        cuda_graph_kv_indices=torch.zeros(bs * WIDTH, dtype=torch.int64), req_to_token=rows)
    # What the draft-extend graph runner captures with: lengths = prefix + extended tokens.
    seq_lens = torch.tensor([p + draft_tokens for p in PREFIX[:bs]], dtype=torch.int64)
    pool = torch.arange(1, bs + 1, dtype=torch.int64)
    tb.TritonAttnBackend.init_forward_metadata_capture_cuda_graph(
        backend, bs, bs * draft_tokens, pool, seq_lens, None, ForwardMode.DRAFT_EXTEND_V2, None)
    return backend, rows


@pytest.mark.parametrize("steps,draft_tokens", [(3, 16), (3, 4)], ids=["tree", "chain"])
def test_capture_lays_out_what_replay_fills(triton_backend, steps, draft_tokens):
    """The graph is captured with the same query stride and cached range as its replays fill
    in (a tree: every draft token per request, the prefix only cached)."""
    bs = len(PREFIX)
    captured, rows = _capture(triton_backend, steps, draft_tokens, bs)
    replayed, _ = _replay(triton_backend, steps, draft_tokens, bs_padded=bs)
    meta = captured.forward_metadata
    assert meta.max_extend_len == draft_tokens
    assert meta.qo_indptr.tolist() == replayed.qo_indptr.tolist() == [
        draft_tokens * i for i in range(bs + 1)]
    assert meta.kv_indptr.tolist() == replayed.kv_indptr.tolist()
    kv_lens = PREFIX if draft_tokens > steps + 1 else [p + draft_tokens for p in PREFIX]
    assert meta.kv_indptr.tolist()[-1] == sum(kv_lens)


def test_draft_extend_graph_runner_holds_every_draft_token_of_a_tree(clean_state, monkeypatch):
    """SGLang's ``EAGLEDraftExtendCudaGraphRunner.__init__`` for a spec-v2 draft worker sizes
    its attention state and input buffers for ``num_draft_tokens`` per request (the capture
    itself, CUDA only, is left out)."""
    activate_backport()
    from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as gr

    from sim_support import make_server_args

    monkeypatch.setattr(gr.EAGLEDraftExtendCudaGraphRunner, "capture", lambda self: None)
    monkeypatch.setattr(gr, "get_batch_sizes_to_capture", lambda runner: ([1, 2, 4], []))
    args = make_server_args("STANDALONE")
    args.speculative_num_steps, args.speculative_eagle_topk = 3, 4
    args.speculative_num_draft_tokens = 16
    states = []
    attn = SimpleNamespace(init_cuda_graph_state=lambda bs, tokens: states.append((bs, tokens)),
                           get_cuda_graph_seq_len_fill_value=lambda: 1)
    draft_runner = SimpleNamespace(
        server_args=args, tp_size=1, dp_size=1, device="cpu", attn_backend=attn,
        model_config=SimpleNamespace(hf_config=SimpleNamespace(), vocab_size=32,
                                     spec_hidden_size=8, dtype=torch.float32))
    # STANDALONE: the draft has no hidden states to relay (one buffer fewer to stand in for).
    worker = SimpleNamespace(draft_runner=draft_runner, draft_extend_attn_backend=attn,
                             speculative_algorithm=SimpleNamespace(is_standalone=lambda: True))
    runner = gr.EAGLEDraftExtendCudaGraphRunner(worker)
    assert runner.num_tokens_per_bs == 16
    assert states == [(4, 4 * 16)]
    assert runner.buffers.input_ids.shape == (4 * 16,)
    assert runner.buffers.extend_seq_lens.tolist() == [16] * 4
    assert runner.buffers.next_token_logits_buffer.shape[0] == 4 * 16


def test_draft_extend_after_a_tree_verify_extends_and_keeps_every_draft_slot(
        clean_state, monkeypatch):
    """SGLang's ``EagleDraftWorker._draft_extend_for_decode`` after a tree's verify: the draft
    extend runs every verified slot (``num_draft_tokens`` per request), picks each request's
    last accepted slot at that stride, and its spec info counts that many tokens per request,
    which is what SGLang trims the padded logits to (``post_forward_mlp_sync_batch``)."""
    import contextlib

    activate_backport()
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative import eagle_info_v2
    from sglang.srt.speculative import eagle_worker_v2 as ew

    class _ForwardBatch:  # what ForwardBatch.init_new keeps of a draft-extend batch
        @classmethod
        def init_new(cls, batch, runner):
            return SimpleNamespace(
                input_ids=batch.input_ids, spec_info=batch.spec_info, batch_size=len(batch.seq_lens),
                forward_mode=batch.forward_mode,
                extend_seq_lens=torch.tensor(batch.extend_seq_lens, dtype=torch.int32))

    monkeypatch.setattr(eagle_info_v2, "ForwardBatch", _ForwardBatch)
    steps, topk, draft, vocab = 3, 4, 16, 64
    seq_lens = torch.tensor([7, 12])
    bs = len(seq_lens)
    tokens = (torch.arange(bs * draft) * 5 + 3) % vocab  # verify's ids, compacted per request
    accept = torch.tensor([3, 1])
    forwards = []

    def forward(fb, skip_attn_backend_init=False):
        forwards.append(fb)
        logits = torch.nn.functional.one_hot(fb.input_ids, vocab).float()
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits,
                                                             hidden_states=None))

    worker = SimpleNamespace(
        topk=topk, speculative_num_steps=steps, speculative_num_draft_tokens=draft, device="cpu",
        plan_stream=None, plan_stream_ctx=contextlib.nullcontext(),
        cuda_graph_runner_for_draft_extend=None,
        draft_runner=SimpleNamespace(forward=forward,
                                     spec_algorithm=SimpleNamespace(is_standalone=lambda: False),
                                     attn_backend=SimpleNamespace(init_forward_metadata=lambda fb: None)))
    mwb = SimpleNamespace(seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(), seq_lens_sum=19,
                          forward_mode=ForwardMode.DECODE, spec_info=None, input_ids=None)
    result = SimpleNamespace(logits_output=SimpleNamespace(hidden_states=None), accept_lens=accept,
                             next_token_ids=tokens, next_draft_input=SimpleNamespace())
    ew.EagleDraftWorker._draft_extend_for_decode(worker, mwb, result)

    (fb,) = forwards
    assert fb.forward_mode == ForwardMode.DRAFT_EXTEND_V2
    assert fb.extend_seq_lens.tolist() == [draft] * bs and torch.equal(fb.input_ids, tokens)
    # The next draft starts from each request's last accepted slot: rows 2 and 16 + 0.
    last = [int(tokens[r * draft + int(a) - 1]) for r, a in enumerate(accept)]
    assert result.next_draft_input.topk_index[:, 0].tolist() == last
    # Padded logits (e.g. DP attention) are cut back to what the spec info counts per request.
    padded = SimpleNamespace(next_token_logits=torch.zeros(bs * draft + 8, vocab),
                             hidden_states=torch.zeros(bs * draft + 8, 2))
    ForwardBatch.post_forward_mlp_sync_batch(
        SimpleNamespace(forward_mode=fb.forward_mode, batch_size=bs, spec_info=fb.spec_info),
        padded)
    assert padded.next_token_logits.shape[0] == bs * draft
