"""Back-port chain-fast-path (#26235, #26397, #26424): a topk-1 draft takes argmax of the logits
and returns the chain's constant parents and positions.

SGLang's real ``EagleDraftWorker.draft_forward``, ``_draft_extend_for_decode``, ``init_cuda_graphs``,
``StandaloneDraftWorker.__init__`` and
``EAGLEDraftExtendCudaGraphRunner.capture_one_batch_size`` (as the series leaves them) run on
CPU; the draft model is a stand-in that returns fixed logits per input token (bfloat16 values in
float32, as SGLang's logits processor hands them over, with planted ties), the CUDA-graph
machinery records instead of capturing. ``_select_top_k_tokens_later`` runs without
``torch.compile`` (no compiler on a CPU host); its code is SGLang's.
"""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport, plugin_only

VOCAB = 64


def _logits_for(ids: torch.Tensor) -> torch.Tensor:
    """Deterministic logits per input token, rounded to bfloat16; token ``t``'s row has its
    largest value twice (at ``(3t) % V`` and ``(3t + 5) % V``) when ``t`` is even: a tie that both
    argmax and softmax-max must break to the first index."""
    g = torch.Generator().manual_seed(7)
    table = torch.randn(VOCAB, VOCAB, generator=g) * 4
    for t in range(0, VOCAB, 2):
        a, b = (3 * t) % VOCAB, (3 * t + 5) % VOCAB
        table[t, a] = table[t, b] = table[t].max() + 1
    return table.to(torch.bfloat16).float()[ids]


def _greedy(t: int) -> int:
    return int(torch.argmax(_logits_for(torch.tensor([t]))[0]))


class _Softmaxes:
    """Counts full-vocabulary softmaxes (``torch.softmax`` over the last dimension)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = torch.softmax

        def counting(x, dim=None, **kw):
            self.calls += 1
            return real(x, dim=dim, **kw)

        monkeypatch.setattr(torch, "softmax", counting)


@pytest.fixture
def eager_compile():
    config = torch._dynamo.config
    saved = config.disable
    config.disable = True
    yield
    config.disable = saved


def _worker(topk: int, steps: int, rows: int | None):
    calls = []

    def forward(forward_batch, skip_attn_backend_init=False):
        calls.append(forward_batch.input_ids.clone())
        return SimpleNamespace(logits_output=SimpleNamespace(
            next_token_logits=_logits_for(forward_batch.input_ids), hidden_states=None))

    w = SimpleNamespace(
        topk=topk, speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1,
        hot_token_id=None, draft_runner=SimpleNamespace(forward=forward),
        draft_attn_backend=SimpleNamespace(attn_backends=[object()] * steps),
        chain_parents=None, chain_positions=None, calls=calls)
    if rows is not None:  # as the patched init_cuda_graphs builds them
        w.chain_parents = torch.arange(-1, steps - 1).repeat(rows, 1)
        w.chain_positions = torch.arange(steps).repeat(rows, 1)
    return w


def _forward_batch(first_tokens: list[int], topk: int, steps: int):
    bs = len(first_tokens)
    idx = torch.tensor(first_tokens).view(bs, 1)
    return SimpleNamespace(
        spec_info=SimpleNamespace(topk_p=torch.full((bs, 1), 0.5), topk_index=idx, hidden_states=None),
        out_cache_loc=torch.arange(bs * topk * steps), batch_size=bs,
        positions=torch.zeros(bs, dtype=torch.long), input_ids=None, attn_backend=None)


FIRST = [2, 9, 40, 17, 4, 63]


def _run(fn, worker, first, steps):
    return fn(worker, _forward_batch(first, 1, steps))


def test_chain_draft_is_the_greedy_chain_without_a_softmax(clean_state, eager_compile, monkeypatch):
    activate_backport()
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    softmaxes = _Softmaxes(monkeypatch)
    steps = 4
    w = _worker(1, steps, rows=8)
    parents, positions, tokens = _run(EagleDraftWorker.draft_forward, w, FIRST, steps)
    expect = []
    for t in FIRST:
        chain = [t]
        for _ in range(steps - 1):
            chain.append(_greedy(chain[-1]))
        expect.append(chain)
    assert tokens.tolist() == expect and tokens.dtype == torch.long
    assert parents.tolist() == [[-1, 0, 1, 2]] * len(FIRST)
    assert positions.tolist() == [[0, 1, 2, 3]] * len(FIRST)
    # The constants are the worker's (no cat/topk/sort/gather per draft), and no softmax ran.
    assert parents.data_ptr() == w.chain_parents.data_ptr()
    assert positions.data_ptr() == w.chain_positions.data_ptr()
    assert softmaxes.calls == 0 and len(w.calls) == steps - 1
    # A batch larger than the constants' rows takes SGLang's own organisation: same result.
    small = _worker(1, steps, rows=2)
    again = _run(EagleDraftWorker.draft_forward, small, FIRST, steps)
    assert [x.tolist() for x in again] == [parents.tolist(), positions.tolist(), tokens.tolist()]
    assert again[0].data_ptr() != small.chain_parents.data_ptr()


def test_rocm_draft_steps_keep_the_softmax(clean_state, eager_compile, monkeypatch):
    activate_backport()
    from sglang.srt.speculative import eagle_worker_v2 as ew

    monkeypatch.setattr(ew, "_is_hip", True)
    softmaxes = _Softmaxes(monkeypatch)
    w = _worker(1, 4, rows=8)
    parents, _, tokens = _run(ew.EagleDraftWorker.draft_forward, w, FIRST, 4)
    assert softmaxes.calls == 3 and len(w.calls) == 3
    assert tokens[:, 1].tolist() == [_greedy(t) for t in FIRST]
    assert parents.data_ptr() == w.chain_parents.data_ptr()  # the constants are not ROCm-gated


@plugin_only
@pytest.mark.parametrize("steps", [1, 2, 3, 5])
@pytest.mark.parametrize("rows", [None, 2, 16])
def test_chain_draft_returns_exactly_what_stock_returns(clean_state, eager_compile, steps, rows):
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    stock = EagleDraftWorker.draft_forward
    want = _run(stock, _worker(1, steps, None), FIRST, steps)
    activate_backport()
    w = _worker(1, steps, rows if steps > 1 else None)
    got = _run(EagleDraftWorker.draft_forward, w, FIRST, steps)
    for g, s in zip(got, want):
        assert g.dtype == s.dtype and g.shape == s.shape and torch.equal(g, s)


def _near_zero_logits_for(ids: torch.Tensor) -> torch.Tensor:
    """Logits near zero: every row's two largest are adjacent bfloat16 values around 4e-6 (one
    bfloat16 step, 2**-25, apart), the smaller at an earlier index. Their softmax numerators
    ``exp(0)`` and ``exp(-2**-25)`` round to the same float32."""
    g = torch.Generator().manual_seed(11)
    table = torch.rand(VOCAB, VOCAB, generator=g) * 2e-6
    top = torch.tensor(4e-6).to(torch.bfloat16)
    above = (top.view(torch.int16) + 1).view(torch.bfloat16)
    for t in range(VOCAB):
        table[t, (t + 1) % 20] = top.float()
        table[t, 30 + t % 30] = above.float()
    return table.to(torch.bfloat16).float()[ids]


@plugin_only
def test_near_zero_logits_argmax_takes_the_larger_where_stocks_softmax_ties(clean_state, eager_compile,
                                                                             monkeypatch):
    # Where the docstring's "the draft tokens are the same" stops: two distinct bfloat16 logits
    # this close to zero are one float32 probability, so stock's softmax + max takes the first
    # of them and argmax the larger one, which is what the target's greedy verify takes
    # (torch.argmax of its logits). Above about 1e-5 they stay apart (the test above).
    from sglang.srt.speculative import eagle_worker_v2 as ew

    rows = _near_zero_logits_for(torch.arange(VOCAB))
    probs = torch.softmax(rows, dim=-1)
    assert torch.equal(probs.max(dim=-1).values, probs[torch.arange(VOCAB), (torch.arange(VOCAB) + 1) % 20])
    monkeypatch.setattr(sys.modules[__name__], "_logits_for", _near_zero_logits_for)
    stock = _run(ew.EagleDraftWorker.draft_forward, _worker(1, 2, None), FIRST, 2)[2]
    activate_backport()
    patched = _run(ew.EagleDraftWorker.draft_forward, _worker(1, 2, 8), FIRST, 2)[2]
    assert stock[:, 1].tolist() == [(t + 1) % 20 for t in FIRST]
    assert patched[:, 1].tolist() == [30 + t % 30 for t in FIRST] == [
        int(torch.argmax(_near_zero_logits_for(torch.tensor([t]))[0])) for t in FIRST]


@plugin_only
def test_a_tree_keeps_the_softmax(clean_state, eager_compile, monkeypatch):
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    def tree_batch():
        fb = _forward_batch([2, 9], 2, 3)
        fb.spec_info.topk_p = torch.tensor([[0.6, 0.3], [0.7, 0.2]])
        fb.spec_info.topk_index = torch.tensor([[2, 5], [9, 11]])
        return fb

    w = _worker(2, 3, None)
    w.speculative_num_draft_tokens = 5
    want = EagleDraftWorker.draft_forward(w, tree_batch())
    activate_backport()
    softmaxes = _Softmaxes(monkeypatch)
    got = EagleDraftWorker.draft_forward(w, tree_batch())
    assert softmaxes.calls == 2
    assert all(torch.equal(g, s) for g, s in zip(got, want))


def _graph_worker(topk, steps, graph_bs, running, disable_graph=False):
    args = SimpleNamespace(
        device="cpu", speculative_eagle_topk=topk, speculative_num_steps=steps,
        speculative_num_draft_tokens=steps + 1, speculative_algorithm="STANDALONE",
        disable_cuda_graph=disable_graph, enable_dp_attention=False, model_impl="auto",
        cuda_graph_max_bs=graph_bs, max_running_requests=running)
    return SimpleNamespace(
        server_args=args, device="cpu", gpu_id=0, topk=topk, speculative_num_steps=steps,
        target_worker=SimpleNamespace(device="cuda"), draft_extend_attn_backend=None)


def test_init_cuda_graphs_builds_the_chain_before_capturing(clean_state, monkeypatch):
    activate_backport()
    from sglang.srt.speculative import eagle_worker_v2 as ew

    seen = []
    monkeypatch.setattr(ew, "EAGLEDraftCudaGraphRunner",
                        lambda worker: seen.append(worker.chain_parents) or "runner")
    monkeypatch.setattr(ew, "get_available_gpu_memory", lambda *a, **k: 0.0)
    monkeypatch.setattr(ew, "log_info_on_rank0", lambda *a, **k: None)

    w = _graph_worker(1, 3, 8, 48)
    ew.EagleDraftWorker.init_cuda_graphs(w)
    assert w.cuda_graph_runner == "runner" and seen == [w.chain_parents]
    assert w.chain_parents.tolist() == [[-1, 0, 1]] * 48
    assert w.chain_positions.tolist() == [[0, 1, 2]] * 48
    w.speculative_num_steps = 5  # graphs rebuilt for another step count: new constants
    ew.EagleDraftWorker.init_cuda_graphs(w)
    assert w.chain_parents.tolist() == [[-1, 0, 1, 2, 3]] * 48
    w = _graph_worker(1, 3, 64, None, disable_graph=True)  # eager draft: built all the same
    ew.EagleDraftWorker.init_cuda_graphs(w)
    assert w.cuda_graph_runner is None and w.chain_parents.shape == (64, 3)
    for topk, steps in ((1, 1), (4, 3)):  # one step: nothing to organise; a tree
        w = _graph_worker(topk, steps, 8, 48, disable_graph=True)
        ew.EagleDraftWorker.init_cuda_graphs(w)
        assert w.chain_parents is None and w.chain_positions is None


def test_the_standalone_draft_worker_gets_the_chain(clean_state, monkeypatch):
    """StandaloneDraftWorker has its own ``__init__`` (found on the GPU: the constants were first
    built in EagleDraftWorker.__init__ and every STANDALONE launch failed in graph capture)."""
    activate_backport()
    from sglang.srt.speculative import standalone_worker_v2 as sw

    args = _graph_worker(1, 3, 8, 48, disable_graph=True).server_args
    runner = SimpleNamespace(server_args=args, tp_group=None)
    monkeypatch.setattr(sw, "TpModelWorker", lambda **kw: SimpleNamespace(model_runner=runner))
    monkeypatch.setattr(sw, "_get_plan_stream", lambda device: (None, contextlib.nullcontext()))
    for name in ("init_token_map", "init_lm_head", "init_attention_backend"):
        monkeypatch.setattr(sw.StandaloneDraftWorker, name, lambda self: None)
    target = SimpleNamespace(get_memory_pool=lambda: (None, None),
                             model_runner=SimpleNamespace(memory_pool_config=None))
    w = sw.StandaloneDraftWorker(args, 0, 0, 0, 0, 0, 0, 0, target)
    assert w.chain_parents.tolist() == [[-1, 0, 1]] * 48
    assert w.chain_positions.tolist() == [[0, 1, 2]] * 48


@pytest.mark.parametrize("rocm", [False, True])
def test_draft_extend_after_verify_takes_argmax(clean_state, monkeypatch, rocm):
    activate_backport()
    from sglang.srt.speculative import eagle_worker_v2 as ew

    monkeypatch.setattr(ew, "_is_hip", rocm)  # upstream keeps the softmax on ROCm (#26358)

    steps, bs = 3, 3
    tokens = torch.tensor([2, 9, 40, 17, 4, 63, 8, 30, 1, 6, 12, 50])  # bs x (steps + 1)
    accept = torch.tensor([1, 4, 2])
    fb = SimpleNamespace(input_ids=tokens, spec_info=SimpleNamespace(num_correct_drafts=None))
    monkeypatch.setattr(ew.EagleDraftInput, "prepare_for_extend_to_fill_draft_kvcache",
                        lambda self, *a: fb)
    w = _worker(1, steps, None)
    w.device, w.plan_stream, w.plan_stream_ctx = "cpu", None, contextlib.nullcontext()
    w.cuda_graph_runner_for_draft_extend = None
    result = SimpleNamespace(logits_output=SimpleNamespace(hidden_states=None), accept_lens=accept,
                             next_token_ids=tokens, next_draft_input=SimpleNamespace())
    softmaxes = _Softmaxes(monkeypatch)
    ew.EagleDraftWorker._draft_extend_for_decode(w, SimpleNamespace(seq_lens=torch.ones(bs)), result)
    kept = tokens.view(bs, steps + 1)[torch.arange(bs), accept - 1]
    assert result.next_draft_input.topk_index.tolist() == [[_greedy(int(t))] for t in kept]
    assert result.next_draft_input.topk_p.dtype == torch.float32
    if rocm:
        assert softmaxes.calls == 1 and (result.next_draft_input.topk_p < 1).all()
    else:
        assert result.next_draft_input.topk_p.tolist() == [[1.0]] * bs and softmaxes.calls == 0


@pytest.mark.parametrize("rocm", [False, True])
def test_draft_extend_graph_captures_argmax(clean_state, monkeypatch, rocm):
    activate_backport()
    from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as gr

    monkeypatch.setattr(torch.version, "hip", "6.4" if rocm else None)

    monkeypatch.setattr(gr, "set_global_graph_memory_pool", lambda pool: None)
    monkeypatch.setattr(gr, "get_global_graph_memory_pool", lambda: None)
    bs, per = 2, 4
    n = bs * per
    ids = torch.tensor([2, 9, 40, 17, 4, 63, 8, 30])

    def model_forward(input_ids, positions, forward_batch):
        return SimpleNamespace(next_token_logits=_logits_for(input_ids))

    buffers = SimpleNamespace(
        input_ids=ids.clone(), req_pool_indices=torch.zeros(bs, dtype=torch.long),
        seq_lens=torch.full((bs,), 10), seq_lens_cpu=torch.full((bs,), 10),
        extend_seq_lens=torch.full((bs,), per), out_cache_loc=torch.arange(n),
        positions=torch.arange(n), mrope_positions=torch.zeros(3, n, dtype=torch.long),
        hidden_states=None, num_correct_drafts=torch.zeros(bs, dtype=torch.long),
        num_accept_tokens=torch.ones(bs, dtype=torch.long),
        next_token_logits_buffer=torch.zeros(n, VOCAB), global_num_tokens_gpu=None,
        global_num_tokens_for_logprob_gpu=None)
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    runs = []
    runner = SimpleNamespace(
        buffers=buffers, stream=None, num_tokens_per_bs=per, extend_seq_lens_cpu=[per] * bs,
        forward_mode=ForwardMode.DRAFT_EXTEND_V2, require_mlp_tp_gather=False,
        require_attn_tp_gather=False, deepep_adapter=SimpleNamespace(capture=lambda **kw: None),
        model_runner=SimpleNamespace(req_to_token_pool=None, token_to_kv_pool=None, spec_algorithm=None,
                                     model=SimpleNamespace(forward=model_forward)),
        draft_extend_attn_backend=SimpleNamespace(init_forward_metadata_capture_cuda_graph=lambda **kw: None),
        padded_static_len=-1, topk=1,
        _create_graph=lambda: SimpleNamespace(pool=lambda: None),
        _capture_init=lambda run_once: None,
        _capture_graph=lambda graph, pool, stream, run_once: runs.append(run_once()) or runs[-1])
    softmaxes = _Softmaxes(monkeypatch)
    _, out = gr.EAGLEDraftExtendCudaGraphRunner.capture_one_batch_size(runner, bs, None)
    assert out.topk_index.tolist() == [[_greedy(int(t))] for t in ids]
    if rocm:
        assert softmaxes.calls == 1 and (out.topk_p < 1).all()
    else:
        assert out.topk_p.tolist() == [[1.0]] * n and softmaxes.calls == 0
