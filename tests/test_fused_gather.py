"""Back-port fused-gather: one launch for the spec-v2 relay gather, and its debug invariant.

The PyTorch path (every non-CUDA device) must equal indexing each buffer; the Triton kernel
runs here in Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors) and must give the
same rows; ``FutureMap.resolve_future`` must hand the worker the same draft state as the
publish/stash version it replaces. With ``SGLANG_FUTUREMAP_DEBUG_RELAY`` on, a slot read
twice without a stash in between trips ``torch._assert_async`` (a ``RuntimeError`` on CPU),
and the whole overlap simulation runs without tripping it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport

POOL = 12
DTYPES_BONUS = [torch.int32, torch.int64]
DTYPES_HIDDEN = [torch.bfloat16, torch.float16, None]  # None: a draft without hidden states


@pytest.fixture
def ou(clean_state):
    """``overlap_utils`` with the series active (plugin, or the patched source)."""
    import sglang.srt.managers.overlap_utils as overlap_utils

    activate_backport()
    return overlap_utils


@pytest.fixture
def interpret(monkeypatch):
    """The kernel, jitted for Triton's CPU interpreter."""
    import triton
    from sglang.srt.managers import overlap_utils

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    try:
        return triton.jit(overlap_utils._gather_spec_extras_kernel)
    except Exception as exc:  # pragma: no cover - depends on the Triton build
        pytest.skip(f"Triton's interpreter is unavailable here ({exc}); GPU-only")


def _buffers(topk, hidden, bonus_dtype, hidden_dtype, gen):
    bufs = (
        torch.rand((POOL, topk), generator=gen, dtype=torch.float32),
        torch.randint(0, 32000, (POOL, topk), generator=gen, dtype=torch.int64),
        torch.randint(0, 32000, (POOL,), generator=gen).to(bonus_dtype),
        None if hidden_dtype is None
        else torch.randn((POOL, hidden), generator=gen).to(hidden_dtype),
    )
    return bufs


def _indices(kind, gen):
    if kind == "empty":
        return torch.empty((0,), dtype=torch.int64)
    if kind == "duplicates":
        return torch.tensor([3, 7, 3, 0, 11, 7, 7])
    return torch.randint(0, POOL, (9,), generator=gen)


def _expect_rows(got, bufs, indices):
    assert len(got) == 4
    for out, buf in zip(got, bufs):
        if buf is None:
            assert out is None
            continue
        want = buf[indices]
        assert out.dtype == buf.dtype and out.shape == want.shape and out.device == buf.device
        assert torch.equal(out, want)


# --------------------------------------------------------------------------- gather


@pytest.mark.parametrize("kind", ["random", "duplicates", "empty"])
@pytest.mark.parametrize("topk", [1, 4])
@pytest.mark.parametrize("bonus_dtype", DTYPES_BONUS)
@pytest.mark.parametrize("hidden_dtype", DTYPES_HIDDEN)
def test_torch_path_equals_per_field_indexing(ou, kind, topk, bonus_dtype, hidden_dtype):
    gen = torch.Generator().manual_seed(topk * 31 + len(kind))
    bufs = _buffers(topk, 40, bonus_dtype, hidden_dtype, gen)
    indices = _indices(kind, gen)
    _expect_rows(ou.gather_spec_extras(indices, *bufs), bufs, indices)


@pytest.mark.parametrize("kind", ["random", "duplicates"])
@pytest.mark.parametrize("topk,hidden", [(1, 4096), (4, 4096), (8, 2500), (3, 7)])
@pytest.mark.parametrize("bonus_dtype", DTYPES_BONUS)
@pytest.mark.parametrize("hidden_dtype", DTYPES_HIDDEN)
def test_kernel_equals_per_field_indexing(ou, interpret, kind, topk, hidden, bonus_dtype,
                                          hidden_dtype):
    # hidden 4096 and 2500 take several BLOCK_HIDDEN (1024) passes; 2500 ends in a partial one.
    gen = torch.Generator().manual_seed(topk * 7 + hidden)
    bufs = _buffers(topk, hidden, bonus_dtype, hidden_dtype, gen)
    indices = _indices(kind, gen)
    _expect_rows(ou.gather_spec_extras(indices, *bufs, kernel=interpret), bufs, indices)


def test_kernel_takes_int32_indices_and_multi_dim_rows(ou, interpret):
    gen = torch.Generator().manual_seed(5)
    bufs = (torch.rand((POOL, 2, 3), generator=gen),
            torch.randint(0, 9, (POOL, 6), generator=gen),
            torch.randint(0, 9, (POOL,), generator=gen),
            torch.randn((POOL, 33), generator=gen).to(torch.bfloat16))
    indices = torch.tensor([9, 1, 1, 4], dtype=torch.int32)
    grids = []

    class Spy:  # the kernel, recording each launch's grid
        def __getitem__(self, grid):
            grids.append(grid)
            return interpret[grid]

    _expect_rows(ou.gather_spec_extras(indices, *bufs, kernel=Spy()), bufs, indices.long())
    assert grids == [(4,)]  # one launch, one program per gathered row


def test_empty_indices_launch_nothing(ou):
    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError(f"launched with grid {grid}")

    gen = torch.Generator().manual_seed(0)
    bufs = _buffers(4, 16, torch.int32, torch.bfloat16, gen)
    empty = torch.empty((0,), dtype=torch.int64)
    _expect_rows(ou.gather_spec_extras(empty, *bufs, kernel=NoLaunch()), bufs, empty)


def test_kernel_only_on_cuda(ou, fmap_factory):
    fmap = fmap_factory("EAGLE3")
    fmap.stash(torch.tensor([2]), _draft(torch.tensor([2]), 2, 5))
    assert fmap.gather_kernel is None  # CPU: PyTorch indexes the buffers


# --------------------------------------------------------------------------- resolve_future


@pytest.fixture
def fmap_factory(ou):
    from sglang.srt import server_args as sa
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    previous = sa._global_server_args

    def make(algorithm):
        sa.set_global_server_args_for_scheduler(
            SimpleNamespace(speculative_algorithm=algorithm, enable_multi_layer_eagle=False,
                            speculative_eagle_topk=1))
        fmap = ou.FutureMap(POOL, 0, 64, torch.device("cpu"),
                            SpeculativeAlgorithm.from_string(algorithm))
        fmap.init_spec_relay(SimpleNamespace(req_to_token=torch.zeros((POOL, 4))),
                             torch.get_device_module("cpu").Stream())
        return fmap

    yield make
    sa._global_server_args = previous


def _draft(rows, topk, hidden, hidden_dtype=torch.bfloat16):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    r = rows.to(torch.float32)
    return EagleDraftInput(
        topk_p=(r[:, None] + torch.arange(topk)) / 100,
        topk_index=rows[:, None] * 10 + torch.arange(topk),
        hidden_states=(r[:, None] + torch.arange(hidden) / 8).to(hidden_dtype),
        bonus_tokens=(rows * 7 + 1).to(torch.int32),
    )


def _worker_batch(indices):
    from sglang.srt.managers.overlap_utils import FutureIndices
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return SimpleNamespace(
        spec_info=EagleDraftInput(future_indices=FutureIndices(indices=indices)))


FIELDS = ("topk_p", "topk_index", "bonus_tokens", "hidden_states")


@pytest.mark.parametrize("algorithm", ["EAGLE3", "STANDALONE"])
@pytest.mark.parametrize("use_kernel", [False, True], ids=["torch", "kernel"])
def test_resolve_future_gives_what_indexing_each_buffer_gives(
    fmap_factory, algorithm, use_kernel, request
):
    """The fused gather hands the worker what back-port 2's ``resolve_future`` (SGLang's
    per-buffer indexing) did: the same values, dtypes and shapes."""
    from sglang.srt.speculative.spec_utils import spec_need_hidden_states

    def index_each_buffer(fmap, batch):
        draft_input = batch.spec_info
        indices = draft_input.future_indices.indices
        for name in FIELDS:
            if name != "hidden_states" or spec_need_hidden_states():
                setattr(draft_input, name, getattr(fmap, f"{name}_buf")[indices])

    fmap = fmap_factory(algorithm)
    for rows, topk in ((torch.tensor([3, 5, 9]), 4), (torch.tensor([11, 1]), 4)):
        fmap.stash(rows, _draft(rows, topk, 64))
    if use_kernel:
        fmap.gather_kernel = request.getfixturevalue("interpret")
    for indices in (torch.tensor([9, 1, 3, 11, 5]), torch.tensor([5]),
                    torch.empty((0,), dtype=torch.int64)):
        fused, before = _worker_batch(indices), _worker_batch(indices)
        fmap.resolve_future(fused)
        index_each_buffer(fmap, before)
        for name in FIELDS:
            got, want = getattr(fused.spec_info, name), getattr(before.spec_info, name)
            if want is None:
                assert got is None, name
            else:
                assert got.dtype == want.dtype and torch.equal(got, want), name
        assert (fused.spec_info.hidden_states is not None) == (algorithm == "EAGLE3")


def test_prefill_batch_is_left_alone(fmap_factory):
    fmap = fmap_factory("EAGLE3")
    batch = SimpleNamespace(spec_info=None)
    fmap.resolve_future(batch)
    assert batch.spec_info is None


# --------------------------------------------------------------------------- debug invariant


def test_debug_switch_is_read_once_from_the_environment(monkeypatch):
    from sglang.srt.utils import get_bool_env_var

    from sglang_futuremap_patch.backports import fused_gather

    for value, expected in (("1", True), ("true", True), ("0", False)):
        monkeypatch.setenv("SGLANG_FUTUREMAP_DEBUG_RELAY", value)
        ns = {"get_bool_env_var": get_bool_env_var}
        exec(fused_gather.DEBUG_RELAY_LINE, ns)  # the line the patch series pastes
        assert ns["_FUTUREMAP_DEBUG_RELAY"] is expected
    monkeypatch.delenv("SGLANG_FUTUREMAP_DEBUG_RELAY")
    exec(fused_gather.DEBUG_RELAY_LINE, ns)
    assert ns["_FUTUREMAP_DEBUG_RELAY"] is False  # off by default
    # The plugin's copy (installed into overlap_utils) was read when it was imported.
    assert isinstance(fused_gather._FUTUREMAP_DEBUG_RELAY, bool)


@pytest.fixture
def debug(ou, monkeypatch):
    monkeypatch.setattr(ou, "_FUTUREMAP_DEBUG_RELAY", True)


def test_debug_buffer_starts_invalid(fmap_factory, debug):
    fmap = fmap_factory("EAGLE3")
    fmap.stash(torch.tensor([4, 6]), _draft(torch.tensor([4, 6]), 2, 8))
    assert fmap.bonus_tokens_buf.tolist() == [-1] * 4 + [29, -1, 43] + [-1] * 5


@pytest.mark.parametrize("use_kernel", [False, True], ids=["torch", "kernel"])
def test_debug_catches_a_second_read_without_a_stash(fmap_factory, debug, use_kernel,
                                                     request):
    fmap = fmap_factory("EAGLE3")
    rows = torch.tensor([2, 7])
    fmap.stash(rows, _draft(rows, 2, 8))
    if use_kernel:
        fmap.gather_kernel = request.getfixturevalue("interpret")
    fmap.resolve_future(_worker_batch(rows))  # the first read is fine
    assert fmap.bonus_tokens_buf[rows].tolist() == [-1, -1]  # consumed
    with pytest.raises(RuntimeError, match="read twice without a stash"):
        fmap.resolve_future(_worker_batch(torch.tensor([7])))
    fmap.stash(rows, _draft(rows, 2, 8))  # a stash makes the slots readable again
    wb = _worker_batch(torch.tensor([7, 2]))
    fmap.resolve_future(wb)
    assert wb.spec_info.bonus_tokens.tolist() == [50, 15]


def test_debug_catches_a_read_before_any_stash(fmap_factory, debug):
    fmap = fmap_factory("EAGLE3")
    fmap.stash(torch.tensor([2]), _draft(torch.tensor([2]), 2, 8))
    with pytest.raises(RuntimeError, match="read twice without a stash"):
        fmap.resolve_future(_worker_batch(torch.tensor([2, 3])))


def test_debug_off_reads_as_often_as_asked(fmap_factory, ou, monkeypatch):
    monkeypatch.setattr(ou, "_FUTUREMAP_DEBUG_RELAY", False)
    fmap = fmap_factory("EAGLE3")
    rows = torch.tensor([2, 7])
    fmap.stash(rows, _draft(rows, 2, 8))
    for _ in range(3):
        wb = _worker_batch(rows)
        fmap.resolve_future(wb)
        assert wb.spec_info.bonus_tokens.tolist() == [15, 50]


@pytest.mark.parametrize("algorithm", ["EAGLE3", "STANDALONE"])
def test_debug_never_fires_in_the_overlap_simulation(ou, debug, monkeypatch, algorithm):
    """The full publish -> stash -> resolve cycle, with filter/merge/slot reuse, keeps the
    invariant: every gathered slot was stashed since its last read."""
    from sglang.srt import server_args as sa
    from sglang.srt.speculative import spec_utils
    from sim_support import ContractWorker, HostSyncProbe, make_server_args, \
        torch_assign_req_to_token_pool_func
    from test_overlap_simulation import Simulation, _all_done

    monkeypatch.setattr(spec_utils, "assign_req_to_token_pool_func",
                        torch_assign_req_to_token_pool_func)
    reads = []
    real_resolve = ou.FutureMap.resolve_future

    def counting(self, model_worker_batch):
        if model_worker_batch.spec_info is not None:
            reads.append(model_worker_batch.spec_info.future_indices.indices.tolist())
        return real_resolve(self, model_worker_batch)

    monkeypatch.setattr(ou.FutureMap, "resolve_future", counting)
    previous = sa._global_server_args
    probe = HostSyncProbe().install()
    try:
        sa.set_global_server_args_for_scheduler(make_server_args(algorithm))
        sim = Simulation(algorithm, ContractWorker, probe).run()
    finally:
        probe.uninstall()
        sa._global_server_args = previous
    _all_done(sim)
    assert len(reads) >= 15  # the decode forwards really gathered (and checked)
    assert (sim.sched.future_map.bonus_tokens_buf == -1).any()  # slots were consumed
