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
