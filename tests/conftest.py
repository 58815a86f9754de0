"""Shared fixtures. SGLang is imported once per session (about 10 s on 2 cores)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIMS = ROOT / "tests" / "cpu_shims"


#: "plugin": installed SGLang + the plugin (default). "patched-tree": a pristine SGLang tree with
#: patches/ applied is first on sys.path and the plugin must find nothing to do
#: (tests/test_flavours.py runs the behaviour tests that way in a subprocess).
FLAVOUR = os.environ.get("SGLANG_FUTUREMAP_TEST_FLAVOUR", "plugin")
#: Set by scripts/hunk_revert.py: the patched tree is a prefix of the series, or has one hunk
#: reverted, so the gate cannot recognise it; activate_backport() then neither asks the gate nor
#: installs anything, and the code under test is exactly that tree's source.
MUTANT = os.environ.get("SGLANG_FUTUREMAP_TEST_MUTANT") == "1"
if MUTANT and FLAVOUR != "patched-tree":
    raise RuntimeError("SGLANG_FUTUREMAP_TEST_MUTANT=1 needs SGLANG_FUTUREMAP_TEST_FLAVOUR=patched-tree")

plugin_only = pytest.mark.skipif(
    FLAVOUR != "plugin", reason="exercises the plugin's install/revert, not the patched source")


def pytest_configure(config: pytest.Config) -> None:
    if MUTANT:
        os.environ["SGLANG_FUTUREMAP_PATCH"] = "off"  # if SGLang loads its plugins, nothing changes
    os.environ.setdefault("SGLANG_FUTUREMAP_PATCH", "safe")


def activate_backport():
    """Make the back-port active for a behaviour test, in either flavour.

    Plugin flavour: apply it (strict). Patched-tree flavour: the source already carries it,
    which the gate must recognise -- so the code under test is the patched SGLang source.
    Mutant mode (patched-tree flavour on a prefix of the series or with one hunk reverted):
    nothing is asked or installed; returns None.
    """
    import sglang_futuremap_patch as plugin

    plugin.revert()
    if MUTANT:
        import sglang

        assert os.environ["SGLANG_FUTUREMAP_TREE"] in sglang.__file__
        return None
    report = plugin.apply(mode="strict")
    if FLAVOUR == "plugin":
        from sglang_futuremap_patch.backports import load_series

        assert report.applied == [bp.id for bp in load_series()]
    else:
        import sglang

        assert report.verdict.decision == "upstream", report.verdict.reason
        assert "already carries this back-port" in report.verdict.reason
        assert os.environ["SGLANG_FUTUREMAP_TREE"] in sglang.__file__
    return report


@pytest.fixture(scope="session")
def sglang_loaded():
    """Import every SGLang module the back-ports target."""
    from sglang_futuremap_patch.backports import load_series

    return load_series()


@pytest.fixture
def clean_state(sglang_loaded):
    """Each test starts and ends with SGLang unpatched."""
    import sglang_futuremap_patch as plugin

    plugin.revert()
    yield sglang_loaded
    plugin.revert()


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIMS), str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def resolve(path: str):
    module, name = path.split(":")
    obj = importlib.import_module(module)
    *parents, attr = name.split(".")
    for p in parents:
        obj = getattr(obj, p)
    return obj, attr


__all__ = ["ROOT", "subprocess_env", "resolve", "sys"]


@pytest.fixture
def spec_future_map(clean_state):
    """A function building SGLang's ``FutureMap`` (as patched) for EAGLE on CPU with its spec
    relay (8 pool slots); keyword arguments go to ``init_spec_relay``. The global server
    arguments it needs are put back afterwards."""
    import torch
    from types import SimpleNamespace

    from sglang.srt import server_args as sa

    activate_backport()
    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(
        SimpleNamespace(speculative_algorithm="EAGLE", enable_multi_layer_eagle=False,
                        speculative_eagle_topk=1))

    def build(**relay_kwargs):
        from sglang.srt.managers.overlap_utils import FutureMap
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        m = FutureMap(8, 0, 64, torch.device("cpu"), SpeculativeAlgorithm.from_string("EAGLE"))
        m.init_spec_relay(SimpleNamespace(req_to_token=torch.zeros((8, 4))),
                          torch.get_device_module("cpu").Stream(), **relay_kwargs)
        return m

    yield build
    sa._global_server_args = previous


@pytest.fixture
def server_args():
    """Sets SGLang's global server arguments: ``server_args(**overrides)`` puts a real
    ``ServerArgs`` for EAGLE3 (``sim_support.make_server_args``) with ``overrides`` in place; the
    previous ones are put back afterwards."""
    from sglang.srt import server_args as sa
    from sim_support import make_server_args

    previous = sa._global_server_args

    def use(**overrides):
        args = make_server_args("EAGLE3")
        for k, v in overrides.items():
            setattr(args, k, v)
        sa.set_global_server_args_for_scheduler(args)

    yield use
    sa._global_server_args = previous


def relay_batch(slots):
    """A spec-v2 schedule batch as the relay sees it: requests in pool ``slots``, its future
    indices, no lengths yet."""
    import torch
    from types import SimpleNamespace

    from sglang.srt.managers.overlap_utils import FutureIndices

    return SimpleNamespace(
        spec_info=SimpleNamespace(future_indices=FutureIndices(indices=torch.tensor(slots))),
        reqs=[SimpleNamespace(req_pool_idx=s) for s in slots],
        seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None)


#: The start-up warm-ups that back-ports 24-26 add to ``Scheduler.init_overlap`` for a tree, as
#: (module, function); each launches GPU kernels.
TREE_WARMUPS = (("sglang.srt.mem_cache.memory_pool", "warm_move_kv_cache"),
                ("sglang.srt.speculative.eagle_worker_v2", "warm_accepted_kv_move"),
                ("sglang.srt.speculative.spec_utils", "warm_assign_req_to_token_pool"),
                ("sglang.srt.mem_cache.common", "warm_write_cache_indices"))


def quiet_tree_warmups(monkeypatch) -> None:
    """Replace every tree warm-up of ``init_overlap`` (``TREE_WARMUPS``) with a no-op, so that a
    test of one of them on CPU can set its own recorder for it and run ``init_overlap``. A
    prefix of the series lacks the later ones: those are skipped."""
    for module, name in TREE_WARMUPS:
        monkeypatch.setattr(importlib.import_module(module), name, lambda *a: [], raising=False)


def overlap_init_scheduler(backend, *, target_graph=None, draft_runner=None, draft_graph=None,
                           algorithm="EAGLE", **server_args):
    """A ``Scheduler`` without ``__init__``, ready for the real (patched) ``init_overlap`` on
    CPU: an overlap scheduler with 8 request slots, speculative ``algorithm``, ``backend`` the
    attention backend of the target and of every spec-v2 forward, the target's and the draft's
    CUDA-graph runners and the draft's model runner as given (None: none); ``server_args`` are
    added to the few fields ``init_overlap`` reads."""
    import torch
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    s = object.__new__(Scheduler)
    s.device = "cpu"
    s.enable_overlap = True
    s.max_running_requests = 8
    s.chunked_prefill_size = None
    s.model_config = SimpleNamespace(context_len=64)
    s.spec_algorithm = SpeculativeAlgorithm.from_string(algorithm)
    s.req_to_token_pool = ReqToTokenPool(8, 64, "cpu", enable_memory_saver=False)
    s.forward_stream = torch.get_device_module("cpu").Stream()
    s.server_args = SimpleNamespace(enable_dp_attention=False, elastic_ep_backend=None, enable_two_batch_overlap=False,
                                    disable_piecewise_cuda_graph=False, **server_args)
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(
        attn_backend=backend, model_is_mrope=False, use_ngram_embedding=False, graph_runner=target_graph))
    s.draft_worker = SimpleNamespace(
        spec_v2_attn_backends=(backend,),
        draft_worker=SimpleNamespace(draft_runner=draft_runner, draft_runner_list=None, cuda_graph_runner=draft_graph))
    return s


def loop_scheduler():
    """A ``Scheduler`` without ``__init__`` for driving SGLang's real ``event_loop_overlap`` (and
    ``get_next_batch_to_run``) on CPU: stand-ins for what they read besides the collaborators a
    test sets itself (receiving requests, building prefills, the running batch, launching,
    processing results): a single-rank speculative overlap scheduler, nothing running, idle hooks
    that do nothing, a schedule stream whose barrier does nothing."""
    from types import SimpleNamespace

    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler

    sched = object.__new__(Scheduler)
    sched.launch_batch_sample_if_needed = lambda result: None
    sched.on_idle = sched.self_check_during_busy = lambda: None
    sched._abort_on_waiting_timeout = sched._abort_on_running_timeout = lambda: None
    sched.maybe_prepare_mlp_sync_batch = lambda batch, need_sync=False: batch
    sched._maybe_prepare_ngram_embedding = lambda batch: batch
    sched.dllm_config = sched.chunked_req = None
    sched.enable_hisparse = sched.enable_fpm = False
    sched.forward_stream = "forward"
    sched.schedule_stream = SimpleNamespace(wait_stream=lambda stream: None)
    sched._engine_paused = False
    sched.is_generation = sched.enable_overlap = True
    sched.require_mlp_sync = False
    sched.spec_algorithm = SimpleNamespace(is_none=lambda: False)
    sched.tp_size = sched.pp_size = sched.attn_cp_size = 1
    sched.server_args = SimpleNamespace(enable_dp_attention=False, speculative_skip_dp_mlp_sync=False,
                                        speculative_eagle_topk=1)
    sched.recv_skipper = sched.input_blocker = None
    sched.last_batch = sched.cur_batch = None
    sched.forward_ct = 0  # run_batch's launch count, as __init__ sets it
    sched.disaggregation_mode = DisaggregationMode.NULL
    return sched


@pytest.fixture
def probe():
    """The host-sync probe (``sim_support.HostSyncProbe``) installed for one test: what
    ``relay_forward`` arms around ``resolve_seq_lens_cpu``."""
    from sim_support import HostSyncProbe

    p = HostSyncProbe().install()
    yield p
    p.uninstall()


def relay_forward(fmap, probe, mode, slots, published, lens=None, asks=True):
    """One spec-v2 forward in ``forward_spec_v2_overlap``'s order: resolve (a decode; probed),
    the worker batch, lend, the forward's publish, keep. A graph-size decode's draft extend asks
    for host lengths unless ``asks`` is False (e.g. a batch its draft-extend graph replays).
    Returns (host lengths the batch was launched with, whether resolve copied the device
    lengths to the host: the mirror)."""
    from types import SimpleNamespace

    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = relay_batch(slots)
    batch.forward_mode = getattr(ForwardMode, mode)
    copied = False
    if mode == "DECODE":
        with probe.armed():
            fmap.resolve_seq_lens_cpu(batch)
        copied = "Tensor.cpu" in [name for name, _ in probe.take()]
    else:
        batch.seq_lens_cpu = torch.tensor(lens)  # a prefill is built on the host
    mwb = SimpleNamespace(seq_lens_cpu=batch.seq_lens_cpu)
    fmap.lend_draft_extend_lens(batch, mwb)
    fmap.publish(torch.tensor(slots), torch.tensor(published))
    if mode == "DECODE" and mwb.seq_lens_cpu is None and asks:
        # a graph-size decode on FA3: its draft extend asks for host lengths (back-port 14)
        mwb.seq_lens_cpu_pending = getattr(mwb, "relayed_seq_lens_cpu", None) or "the late copy"
    fmap.keep_draft_extend_lens(batch, mwb)
    host = None if batch.seq_lens_cpu is None else batch.seq_lens_cpu.tolist()
    if host is not None and mode == "DECODE":
        assert batch.seq_lens_sum == sum(host)
    return host, copied
