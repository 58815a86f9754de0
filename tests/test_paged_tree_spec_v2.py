"""Back-port paged-tree-spec-v2 (#26972): EAGLE trees on spec v2 with page size > 1.

The oracle for the draft's slots is SGLang's own spec-v1 layout: its ``assign_draft_cache_locs``
kernel (in Triton's CPU interpreter), given the same request rows, names the slots the draft
writes and the KV copies of the prefix's partial page, and the paged draft-decode attention
of FlashInfer and FA3 reads exactly that layout. Everything else runs SGLang's real code:
``get_alloc_len_per_decode``, ``ModelRunnerKVCacheMixin._init_pools`` (up to the
``req_to_token`` pool), ``prepare_for_v2_draft`` (up to the ``ForwardBatch``), a real
``MHATokenToKVPool`` on CPU and the real ``ServerArgs``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport
from test_auto_tree_spec_v1 import models, server_args, worker_class  # noqa: F401 (fixture)

TREE_V2_LINE = "spec v2 runs the EAGLE tree"
EXPLICIT_TREE = dict(speculative_num_steps=3, speculative_eagle_topk=4, speculative_num_draft_tokens=16)
#: One request per partial-page length class: on a boundary, one short of it, in between.
SEQ_LENS = [32, 47, 5, 19]
PAGE, TOPK, STEPS = 16, 4, 3


@pytest.fixture
def patched(clean_state, monkeypatch):
    monkeypatch.delenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", raising=False)
    activate_backport()


def spec_args(page_size=PAGE, topk=TOPK, steps=STEPS, draft_tokens=16, algorithm="EAGLE3"):
    return SimpleNamespace(speculative_algorithm=algorithm, speculative_num_steps=steps,
                           speculative_eagle_topk=topk, speculative_num_draft_tokens=draft_tokens,
                           page_size=page_size)


# --------------------------------------------------------------------------- the reserve


@pytest.mark.parametrize("page_size", [2, 16, 64])
@pytest.mark.parametrize("steps,topk", [(1, 2), (3, 4), (5, 4), (7, 8)])
def test_decode_reserve_holds_every_branch_page(patched, page_size, steps, topk):
    """Whatever the partial page, every branch's pages fit in one decode allocation."""
    from sglang.srt.managers.utils import get_alloc_len_per_decode

    draft_tokens = 16
    alloc = get_alloc_len_per_decode(spec_args(page_size, topk, steps, draft_tokens))
    for tail in range(page_size):
        pages = -(-(tail + steps) // page_size)
        # The draft writes up to base + topk * pages * page_size; verify up to seq + draft_tokens.
        assert topk * pages * page_size - tail <= alloc
    assert draft_tokens <= alloc
    assert alloc % page_size == 0 or alloc == draft_tokens


def test_decode_reserve_is_unchanged_for_chains_and_page_1(patched):
    from sglang.srt.managers.utils import get_alloc_len_per_decode

    assert get_alloc_len_per_decode(spec_args(page_size=1)) == max(STEPS * TOPK, 16)
    assert get_alloc_len_per_decode(spec_args(topk=1, draft_tokens=4)) == 4


def _request_row_width(monkeypatch, spec) -> int:
    """``_init_pools`` of SGLang's model runner up to its ``req_to_token`` pool (CPU)."""
    from sglang.srt.model_executor import model_runner_kv_cache_mixin as mixin

    class Built(Exception):
        pass

    def stop(*args, **kwargs):  # the KV pools after it need a model and a GPU
        raise Built

    monkeypatch.setattr(mixin, "is_deepseek_nsa", stop)
    runner = SimpleNamespace(
        max_running_requests=4, req_to_token_pool=None, device="cpu", mambaish_config=None,
        model_config=SimpleNamespace(context_len=1000, hf_config=None),
        server_args=SimpleNamespace(disaggregation_mode="null", enable_memory_saver=False,
                                    **vars(spec)))
    with pytest.raises(Built):
        mixin.ModelRunnerKVCacheMixin._init_pools(runner)
    return runner.req_to_token_pool.req_to_token.shape[1]


def test_request_row_holds_the_decode_reserve(patched, monkeypatch):
    from sglang.srt.managers.utils import get_alloc_len_per_decode

    tree = spec_args()
    assert _request_row_width(monkeypatch, tree) == 1000 + 2 * get_alloc_len_per_decode(tree)
    # Chains and page size 1 keep SGLang's headroom.
    assert _request_row_width(monkeypatch, spec_args(page_size=1)) == 1000 + 4 + 16
    assert _request_row_width(monkeypatch, spec_args(topk=1, draft_tokens=4)) == 1000 + 4 + 4


# --------------------------------------------------------------------------- the draft's slots


def _rows(seed=3):
    """Request rows as a decode allocation leaves them: page-consistent slots, 1 page = 16."""
    bs = len(SEQ_LENS)
    width = 20 * PAGE  # past the longest request plus its decode reserve (2 * 128)
    pages = torch.randperm(bs * width // PAGE + 8, generator=torch.Generator().manual_seed(seed)) + 1
    req_to_token = torch.zeros((bs + 1, width), dtype=torch.int32)
    for r in range(bs):
        own = pages[r * (width // PAGE) : (r + 1) * (width // PAGE)]
        req_to_token[r + 1] = (own[:, None] * PAGE + torch.arange(PAGE)).reshape(-1)
    return req_to_token, torch.arange(1, bs + 1, dtype=torch.int64)


_SPEC_V1_ORACLE = textwrap.dedent(
    """
    import sys
    from types import SimpleNamespace

    import torch
    from sglang.srt import server_args as sa
    from sglang.srt.speculative import spec_utils
    from sglang.srt.utils.common import next_power_of_2

    data = torch.load(sys.argv[1])
    req_to_token, pool_idx, seq_lens = data["rows"], data["pool_idx"], data["seq_lens"]
    steps, topk, page = data["steps"], data["topk"], data["page"]
    sa._global_server_args = SimpleNamespace(attention_backend="torch_native")
    _, _, _, pages, extend_lens, tail = spec_utils.get_last_loc_large_page_size_large_top_k(
        req_to_token, pool_idx, seq_lens, steps, topk, page)
    rows = req_to_token.clone()
    # The slots spec v1 would allocate: those the v2 decode reserve already holds.
    given = torch.cat([rows[i, s : s + n] for i, s, n in zip(pool_idx, seq_lens, extend_lens)])
    out = given.to(torch.int64)
    copies = int(tail.sum()) * (topk - 1)
    src = torch.zeros(copies, dtype=torch.int32)
    tgt = torch.zeros(copies, dtype=torch.int32)
    bs = len(seq_lens)
    spec_utils.assign_draft_cache_locs[(bs,)](
        pool_idx, rows, seq_lens, extend_lens, pages, out, src, tgt, torch.cumsum(tail, 0),
        copies, rows.shape[1], topk, steps, page, next_power_of_2(bs),
        next_power_of_2(steps + page))
    assert torch.equal(rows, req_to_token)  # spec v1 wrote back the same slots
    torch.save({"slots": out[: bs * topk * steps], "src": src, "tgt": tgt}, sys.argv[2])
    """
)


def _spec_v1_layout(req_to_token, pool_idx, seq_lens, tmp_path):
    """SGLang's spec-v1 draft layout for the same rows: (out_cache_loc, copies tgt -> src).

    Its kernel runs in Triton's CPU interpreter, in a process of its own: the interpreter
    must be on before Triton's reductions are defined, i.e. before SGLang is imported.
    """
    inp, out = tmp_path / "rows.pt", tmp_path / "v1.pt"
    torch.save({"rows": req_to_token, "pool_idx": pool_idx, "seq_lens": seq_lens,
                "steps": STEPS, "topk": TOPK, "page": PAGE}, inp)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", _SPEC_V1_ORACLE, str(inp), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    v1 = torch.load(out)
    return v1["slots"], dict(zip(v1["tgt"].tolist(), v1["src"].tolist()))


class _Pool:
    """A real MHATokenToKVPool on CPU whose every slot's K and V hold the slot's number."""

    def __init__(self, size):
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        self.pool = MHATokenToKVPool(size, page_size=PAGE, dtype=torch.float32, head_num=1,
                                     head_dim=1, layer_num=1, device="cpu",
                                     enable_memory_saver=False, start_layer=0, end_layer=0)
        for buf in self.pool.k_buffer + self.pool.v_buffer:
            buf.copy_(torch.arange(buf.shape[0], dtype=torch.float32)[:, None, None])

    def moved(self) -> dict[int, int]:
        """Slot -> the slot whose KV it now holds, for every slot that changed."""
        k = self.pool.k_buffer[0][:, 0, 0]
        assert torch.equal(k, self.pool.v_buffer[0][:, 0, 0])
        return {i: int(v) for i, v in enumerate(k.tolist()) if int(v) != i}


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("SGLANG_NATIVE_MOVE_KV_CACHE", "1")  # the pool's CPU copy


def _draft(req_to_token, pool_idx, seq_lens, pool):
    """SGLang's ``prepare_for_v2_draft`` as the series leaves it, up to the ForwardBatch."""
    from sglang.srt.model_executor import forward_batch_info
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=seq_lens,
                            req_pool_indices=pool_idx, input_ids=torch.zeros(len(seq_lens)),
                            out_cache_loc=None)
    runner = SimpleNamespace(page_size=PAGE, token_to_kv_pool=pool,
                             spec_algorithm=SimpleNamespace(is_standalone=lambda: False))
    draft_input = object.__new__(EagleDraftInput)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(forward_batch_info.ForwardBatch, "init_new",
                   classmethod(lambda cls, b, r: "forward batch"))
        out = draft_input.prepare_for_v2_draft(
            SimpleNamespace(req_to_token=req_to_token), batch, None, runner, TOPK, STEPS)
    assert out == ("forward batch", None)
    assert torch.equal(draft_input.positions, seq_lens.repeat_interleave(TOPK))
    return batch.out_cache_loc


def test_draft_writes_and_copies_what_spec_v1_does(patched, interpreted, tmp_path):
    req_to_token, pool_idx = _rows()
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int64)
    expected_slots, expected_copies = _spec_v1_layout(req_to_token, pool_idx, seq_lens, tmp_path)
    assert expected_copies  # the layout under test has partial pages to copy

    pool = _Pool(int(req_to_token.max()) + PAGE)
    slots = _draft(req_to_token, pool_idx, seq_lens, pool.pool)

    assert slots.dtype == torch.int64
    assert torch.equal(slots, expected_slots)
    assert pool.moved() == expected_copies
    # The request on a page boundary copies nothing; the others fill TOPK - 1 holes each.
    tails = [s % PAGE for s in SEQ_LENS]
    assert len(expected_copies) == sum(tails) * (TOPK - 1)


def test_draft_layout_does_not_depend_on_the_other_requests(patched, interpreted):
    """Each request's slots come from its own row alone (the gather is per request)."""
    req_to_token, pool_idx = _rows(seed=11)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int64)
    pool = _Pool(int(req_to_token.max()) + PAGE)
    together = _draft(req_to_token, pool_idx, seq_lens, pool.pool).view(len(SEQ_LENS), -1)
    for r in range(len(SEQ_LENS)):
        alone = _draft(req_to_token, pool_idx[r : r + 1], seq_lens[r : r + 1], pool.pool)
        assert torch.equal(alone, together[r])


# --------------------------------------------------------------------------- routing


@pytest.mark.parametrize("backend", ["flashinfer", "fa3"])
def test_tree_with_page_16_runs_on_spec_v2(patched, models, caplog, monkeypatch, backend):
    caplog.set_level(logging.INFO)
    if backend == "flashinfer":  # FlashInfer trees run on spec v2 when asked for (back-port 11)
        monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", "1")
    args = server_args(models, "EAGLE3", "eagle3", attention_backend=backend, page_size=16,
                       **EXPLICIT_TREE)
    assert args.disable_overlap_schedule is False
    assert worker_class(args) == "EAGLEWorkerV2"
    assert [r for r in caplog.records if TREE_V2_LINE in r.getMessage()]


def test_tree_with_page_16_needs_a_paged_tree_backend(patched, models, monkeypatch):
    from sglang.srt.server_args import spec_v2_tree_unsupported

    monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", "1")  # FlashInfer trees on spec v2

    args = server_args(models, "EAGLE3", "eagle3", attention_backend="flashinfer", page_size=16,
                       **EXPLICIT_TREE)
    assert spec_v2_tree_unsupported(args) is None
    mixed = SimpleNamespace(**{**vars(args), "decode_attention_backend": "triton"})
    reason = spec_v2_tree_unsupported(mixed)
    assert reason is not None and "page size 16" in reason and "triton" in reason
    # Page size 1 on Triton stays covered (back-port 11).
    flat = SimpleNamespace(**{**vars(args), "page_size": 1, "attention_backend": "triton"},
                           get_model_config=args.get_model_config)
    assert spec_v2_tree_unsupported(flat) is None


def test_triton_with_a_tree_in_pages_is_refused_as_in_stock(patched, models):
    """SGLang 0.5.12.x rejects topk > 1 with page size > 1 outside FlashInfer/FA3; so do we."""
    with pytest.raises(ValueError, match="page_size > 1"):
        server_args(models, "EAGLE3", "eagle3", attention_backend="triton", page_size=16,
                    **EXPLICIT_TREE)
