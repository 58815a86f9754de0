"""Multi-iteration spec-v2 overlap simulation through SGLang's real scheduling code, on CPU.

The loop mirrors ``Scheduler.event_loop_overlap``: each iteration picks the next batch the
way ``get_next_batch_to_run`` does (the last prefill batch is filtered and merged into the
running batch; new requests prefill first; otherwise the real ``update_running_batch`` runs
``filter_batch`` -> ``check_decode_mem`` -> ``prepare_for_decode``), launches it with the
real (patched) ``Scheduler.run_batch``, then processes the *previous* batch's result, so
finishes are seen one iteration late exactly as under overlap. Requests join at different
iterations and finish at different lengths (``max_new_tokens``) or by abort (``to_finish``),
so ``filter_batch`` / ``merge_batch`` run on batches whose request-pool slots get freed and
handed to newcomers.

Every iteration checks ``seq_lens``, ``seq_lens_cpu`` and ``seq_lens_sum`` against an
independent per-request model (Python ints; see ``sim_support.ContractWorker``), both as the
worker receives them and on the batch after ``run_batch``; and that nothing on the schedule
path (filter/merge/update_running_batch) synchronises with the host. A control test shows
the same probe catches the stock 0.5.12.post1 waits and ``seq_lens`` syncs.

See ``sim_support.py`` for exactly what is not SGLang's own code, and why.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport, plugin_only
from sim_support import (
    HIDDEN,
    SPEC_TOPK,
    VOCAB,
    ContractWorker,
    HostSyncProbe,
    NoCallbackWorker,
    make_pools,
    make_scheduler,
    make_server_args,
    torch_assign_req_to_token_pool_func,
)

ALGORITHMS = ["EAGLE3", "STANDALONE"]
CONTEXT_LEN = 96
POOL_SIZE = 5  # request slots 1..5: small, so finished requests' slots are reused

# iteration -> [(rid number, prompt length, max_new_tokens)]
ARRIVALS = {
    0: [(0, 5, 9), (1, 7, 14), (2, 4, 3)],
    2: [(3, 6, 30)],
    3: [(4, 3, 6)],
    6: [(5, 8, 12), (6, 5, 34)],
    9: [(7, 9, 7)],
    13: [(8, 4, 26), (9, 6, 5)],
    17: [(10, 7, 9), (11, 5, 1)],  # r-11 finishes at its prefill
}
ABORT_AT = {11: 3}  # iteration -> rid number aborted (req.to_finish) before that iteration
MAX_ITERS = 60

#: config -> (mirror expected, attention backends declared, piecewise CUDA graph on). Piecewise
#: CUDA graph is SGLang's default; back-port 7 stops it from forcing the mirror on.
CONFIGS = {
    "mirror": (True, "flashinfer", True),
    "no_mirror": (False, "triton", False),
    "no_mirror_pcg": (False, "triton", True),
    "fa3_pcg": (False, "fa3", True),
    "fa3_pcg_eager": (False, "fa3", True),
    # The mirror with back-port 22's switch on: decodes read host lengths from the relay.
    "mirror_relay": (True, "flashinfer", True),
}
#: config -> the largest batch the target's CUDA graph captured; decode batches above it run
#: eagerly and, on FA3, read exact host lengths (back-port 13), from the relay (back-port 21).
GRAPH_MAX_BS = {"fa3_pcg_eager": 3}


def declared_backends(kind):
    """Target, draft-decode and draft-extend backends of one kind, as a worker lists them."""
    from sglang.srt.layers.attention import flashattention_backend as fa
    from sglang.srt.layers.attention.flashinfer_backend import (
        FlashInferAttnBackend,
        FlashInferMultiStepDraftBackend,
    )
    from sglang.srt.layers.attention.triton_backend import (
        TritonAttnBackend,
        TritonMultiStepDraftBackend,
    )

    if kind == "triton":
        return (object.__new__(TritonAttnBackend), object.__new__(TritonMultiStepDraftBackend),
                object.__new__(TritonAttnBackend))
    if kind == "flashinfer":
        return (object.__new__(FlashInferAttnBackend),
                object.__new__(FlashInferMultiStepDraftBackend),
                object.__new__(FlashInferAttnBackend))

    def fa3(step_id=0):  # what FlashAttentionBackend.__init__ sets for a Llama-style model
        b = object.__new__(fa.FlashAttentionBackend)
        b.__dict__.update(fa_impl_ver=3, topk=SPEC_TOPK, use_mla=False, has_swa=False,
                          use_sliding_window_kv_pool=False, has_local_attention=False,
                          is_encoder_decoder=False, attn_cp_size=1, num_splits=0,
                          speculative_step_id=step_id)
        return b

    multi = object.__new__(fa.FlashAttentionMultiStepBackend)
    multi.attn_backends = [fa3(i) for i in range(2)]
    return (fa3(), multi, fa3())


@pytest.fixture(scope="module")
def patched(sglang_loaded):
    import sglang_futuremap_patch as plugin

    activate_backport()
    yield
    plugin.revert()


@pytest.fixture
def rig(patched, monkeypatch):
    """Global server args, the Triton seam and the host-sync probe, all undone afterwards."""
    from sglang.srt import server_args as sa
    from sglang.srt.speculative import spec_utils

    # The single Triton kernel on the decode path (see sim_support for why it is swapped).
    monkeypatch.setattr(spec_utils, "assign_req_to_token_pool_func",
                        torch_assign_req_to_token_pool_func)
    previous = sa._global_server_args
    probe = HostSyncProbe().install()

    def use(algorithm):
        sa.set_global_server_args_for_scheduler(make_server_args(algorithm))

    try:
        yield SimpleNamespace(probe=probe, use=use)
    finally:
        probe.uninstall()
        sa._global_server_args = previous


# --------------------------------------------------------------------------- the simulation


class Simulation:
    def __init__(self, algorithm, worker_cls, probe, config="mirror"):
        """``config`` (see ``CONFIGS``): which attention backends the worker declares and
        whether piecewise CUDA graph is on; ``init_overlap`` must keep the seq_lens host
        mirror exactly when one of those backends needs it (back-ports 4, 7 and 8)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_utils import spec_need_hidden_states

        mirror, backends, pcg = CONFIGS[config]
        self.algorithm = algorithm
        self.probe = probe
        self.mirror = mirror
        self.truth: dict[str, int] = {}
        self.worker = worker_cls(self.truth, relay_hidden=spec_need_hidden_states())
        self.worker.mirror = mirror
        self.req_to_token_pool, self.allocator, self.tree_cache = make_pools(
            POOL_SIZE, CONTEXT_LEN, kv_tokens=4096)
        self.model_config = SimpleNamespace(
            vocab_size=VOCAB, is_encoder_decoder=False, is_matryoshka=False,
            hidden_size=HIDDEN, context_len=CONTEXT_LEN)
        server_args = SimpleNamespace(
            enable_dp_attention=False, elastic_ep_backend=None,
            enable_two_batch_overlap=False, disable_piecewise_cuda_graph=not pcg)
        # Real backend classes (no __init__: their declarations are all that is read).
        self.worker.spec_v2_attn_backends = declared_backends(backends)
        self.worker.draft_extend_backend = self.worker.spec_v2_attn_backends[-1]
        self.sched = make_scheduler(self.worker, algorithm, self.req_to_token_pool,
                                    self.allocator, self.tree_cache, self.model_config,
                                    server_args=server_args,
                                    graph_max_bs=GRAPH_MAX_BS.get(config))
        # Which batches run eagerly: what the real init_overlap told the FutureMap (13).
        self.eager_above_bs = getattr(self.sched.future_map, "eager_mirror_above_bs", None)
        self.worker.eager_above_bs = self.eager_above_bs
        # Before back-port 4 the relay always keeps the mirror (no needs_cpu_seq_lens yet).
        assert getattr(self.sched.future_map, "needs_cpu_seq_lens", True) == mirror
        # Every host read inside resolve_seq_lens_cpu (the one place the mirror is made).
        self.resolve_hits: list[list[tuple[str, bool]]] = []
        fm = self.sched.future_map
        resolve = fm.resolve_seq_lens_cpu

        def probed_resolve(batch):
            with self.probe.armed():
                resolve(batch)
            self.resolve_hits.append(
                [h for h in self.probe.take() if h[0].startswith("Tensor.")])

        fm.resolve_seq_lens_cpu = probed_resolve
        # As Scheduler.__init__ creates it.
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_batch = None
        self.result_queue = []
        self.waiting = []
        self.reqs: dict[str, object] = {}
        self.finished: list[str] = []
        self.stats = dict(prefill=0, decode=0, filtered=0, merged=0, slot_reuse=0,
                          slot_shared_in_batch=0, decode_after_prefill=0,
                          decode_after_prefill_mixed=0, eager=0, eager_after_eager=0,
                          eager_after_prefill_mixed=0, released_before_launch=0)
        self._prev_extend = None  # the requests of the last batch launched, if a prefill
        self._prev_eager = False  # whether the last batch launched ran eagerly
        self._slots_seen: dict[int, str] = {}

    # -- requests
    def _new_req(self, num, prompt_len, max_new):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        rid = f"r-{num}"
        params = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
        params.normalize(None)
        req = Req(rid, "", [11 + (num * 13 + i) % 500 for i in range(prompt_len)], params,
                  vocab_size=VOCAB)
        # What the PrefillAdder does for a request without a cached prefix.
        req.init_next_round_input(self.tree_cache)
        req.set_extend_input_len(len(req.fill_ids) - len(req.prefix_indices))
        self.reqs[rid] = req
        self.truth[rid] = prompt_len
        return req

    def _prefill_batch(self, arrivals):
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        reqs = [self._new_req(*a) for a in arrivals]
        batch = ScheduleBatch.init_new(
            reqs, self.req_to_token_pool, self.allocator, self.tree_cache,
            self.model_config, True, self.sched.spec_algorithm)
        batch.prepare_for_extend()
        for r in reqs:
            prev = self._slots_seen.get(r.req_pool_idx)
            if prev is not None and prev != r.rid:
                self.stats["slot_reuse"] += 1
            self._slots_seen[r.req_pool_idx] = r.rid
        return batch

    # -- checks
    def _assert_consistent(self, batch, where):
        """Launched (or resolved) lengths: mirror and sum agree, rows line up."""
        n = len(batch.reqs)
        if batch.seq_lens_cpu is None:
            # Only without the mirror; a prefill batch always has one.
            assert not self.mirror and batch.forward_mode.is_decode(), where
            assert batch.seq_lens.shape == (n,), where
        else:
            assert batch.seq_lens.shape == (n,) and batch.seq_lens_cpu.shape == (n,), where
            assert batch.seq_lens_cpu.device.type == "cpu", where
            assert batch.seq_lens.tolist() == batch.seq_lens_cpu.tolist(), where
        # A request released by the previous result's processing keeps its row (and slot
        # number) until the next filter_batch; every other row must match its request.
        for idx, r in zip(batch.req_pool_indices.tolist(), batch.reqs):
            assert r.req_pool_idx in (idx, None) and (r.req_pool_idx or r.finished()), where
        if batch.spec_info is not None and batch.spec_info.future_indices is not None:
            assert torch.equal(batch.spec_info.future_indices.indices,
                               batch.req_pool_indices), where

    def _probe_clean(self, where):
        hits = self.probe.take()
        assert hits == [], f"host sync on the schedule path during {where}: {hits}"

    # -- get_next_batch_to_run, mirrored
    def next_batch(self, it):
        if self.last_batch is not None and self.last_batch.forward_mode.is_extend():
            lb = self.last_batch
            before = len(lb.reqs)
            with self.probe.armed(lb.seq_lens, self.running.seq_lens):
                lb.filter_batch(chunked_req_to_exclude=[])
            self._probe_clean("filter_batch of the last prefill batch")
            if len(lb.reqs) < before:
                self.stats["filtered"] += 1
                if lb.reqs:
                    assert lb.seq_lens_sum is None, "spec v2 filter must defer seq_lens_sum"
            if not lb.is_empty():
                self._assert_consistent(lb, "filtered prefill batch")
                if self.running.is_empty():
                    self.running = lb
                else:
                    sums = (self.running.seq_lens_sum, lb.seq_lens_sum)
                    with self.probe.armed(lb.seq_lens, self.running.seq_lens):
                        self.running.merge_batch(lb)
                    self._probe_clean("merge_batch")
                    self.stats["merged"] += 1
                    idx = self.running.req_pool_indices.tolist()
                    if len(set(idx)) < len(idx):
                        # A newcomer got the slot of a finished request that is still a row
                        # of the running batch (filtered out before the next forward).
                        self.stats["slot_shared_in_batch"] += 1
                    if None in sums:
                        assert self.running.seq_lens_sum is None
                    else:
                        assert self.running.seq_lens_sum == sum(sums)
                self._assert_consistent(self.running, "merged running batch")

        if it in ABORT_AT:
            from sglang.srt.managers.schedule_batch import FINISH_ABORT

            req = self.reqs[f"r-{ABORT_AT[it]}"]
            if not req.finished():
                req.to_finish = FINISH_ABORT("aborted by the test")

        # get_new_batch_prefill: new requests prefill first, as many as there are free
        # request slots (a slot freed by a finish is reusable at once, even while the
        # finished request's row still sits in the running batch until the next filter).
        self.waiting.extend(ARRIVALS.get(it, []))
        admit = min(len(self.waiting), self.req_to_token_pool.available_size())
        if admit:
            arrivals, self.waiting = self.waiting[:admit], self.waiting[admit:]
            return self._prefill_batch(arrivals)

        if self.running.is_empty():
            return None
        before = len(self.running.reqs)
        launched = self.running.seq_lens.tolist()  # outside the probe
        kept = [i for i, r in enumerate(self.running.reqs) if not r.finished()]
        with self.probe.armed(self.running.seq_lens):
            self.running = self.sched.update_running_batch(self.running)
        self._probe_clean("update_running_batch (filter_batch, check_decode_mem, "
                          "prepare_for_decode)")
        if self.running.is_empty():
            return None
        self._assert_consistent(self.running, "prepared decode batch")
        # prepare_for_decode keeps the launched lengths (the forward resolves them).
        assert self.running.seq_lens.tolist() == [launched[i] for i in kept]
        if len(self.running.reqs) < before:
            self.stats["filtered"] += 1
            assert self.running.seq_lens_sum is None, "spec v2 filter must defer seq_lens_sum"
        return self.running

    # -- process_batch_result, mirrored (only what the next iterations depend on)
    def process(self, batch, result):
        from sglang.srt.mem_cache.common import release_kv_cache

        result.copy_done.synchronize()
        if batch.forward_mode.is_extend():
            tokens = result.next_token_ids.tolist()
            for req, tok in zip(batch.reqs, tokens):
                if req.finished() or req.is_retracted:
                    continue
                req.output_ids.append(tok)
                req.check_finished()
                if req.finished():
                    release_kv_cache(req, self.tree_cache)
                    self.finished.append(req.rid)
            return
        # _resolve_spec_overlap_tokens + process_batch_result_decode
        tokens = result.next_token_ids.tolist()
        accept = result.accept_lens.tolist()
        stride = result.speculative_num_draft_tokens
        for i, req in enumerate(batch.reqs):
            if req.finished():
                req.kv_committed_len -= 1  # prepare_for_decode pre-claimed the bonus slot
                continue
            req.kv_committed_len += accept[i] - 1
            new = tokens[i * stride: i * stride + accept[i]]
            req.output_ids.extend(new)
            req.check_finished(len(new))
            if req.finished():
                release_kv_cache(req, self.tree_cache)
                self.finished.append(req.rid)

    # -- the loop
    def run(self, process_first=False):
        """``process_first``: before launching a decode, process the last result first, as
        SGLang's loop does when ``is_disable_overlap_for_batch`` says so (a decode with a
        grammar on spec v2, back-port 16's finished or small prefill). Requests that result
        finishes are then released (their ``req_pool_idx`` is None) but still rows of the
        decode launched next, which was built before."""
        fm = self.sched.future_map
        for it in range(MAX_ITERS):
            batch = self.next_batch(it)
            processed = False
            if (process_first and batch is not None and batch.forward_mode.is_decode()
                    and self.result_queue):
                unfinished = {r.rid for r in batch.reqs if not r.finished()}
                self.process(*self.result_queue.pop(0))
                processed = True
                self.stats["released_before_launch"] += any(
                    r.rid in unfinished and r.finished() for r in batch.reqs)
            if batch is not None:
                rids = [r.rid for r in batch.reqs]
                expected = [self.truth[r] for r in rids]
                calls = len(self.worker.calls)
                publishes = fm.publish_count
                result = self.sched.run_batch(batch)
                assert len(self.worker.calls) == calls + 1
                assert fm.publish_count == publishes + 1, "exactly one publish per forward"
                seen = self.worker.calls[-1]
                assert seen["rids"] == rids and seen["seq_lens"] == expected
                # After run_batch the batch holds what it launched with (resolved lengths).
                assert batch.seq_lens.tolist() == expected, (it, rids)
                eager = (not batch.forward_mode.is_extend() and self.eager_above_bs is not None
                         and len(rids) > self.eager_above_bs)
                if self.mirror or batch.forward_mode.is_extend() or eager:
                    assert batch.seq_lens_cpu.tolist() == expected, (it, rids)
                    assert batch.seq_lens_sum == sum(expected), (it, rids)
                else:
                    assert batch.seq_lens_cpu is None and batch.seq_lens_sum is None, it
                self._assert_consistent(batch, f"iteration {it} after run_batch")
                # What the next resolve will read: the lengths after this forward.
                assert fm.new_seq_lens_buf[batch.req_pool_indices].tolist() == [
                    self.truth[r] for r in rids]
                self.stats["prefill" if batch.forward_mode.is_extend() else "decode"] += 1
                if not batch.forward_mode.is_extend() and self._prev_extend is not None:
                    # The decode right after a prefill, and its requests that decoded before.
                    self.stats["decode_after_prefill"] += 1
                    if set(rids) - self._prev_extend:
                        self.stats["decode_after_prefill_mixed"] += 1
                        self.stats["eager_after_prefill_mixed"] += eager
                self.stats["eager"] += eager
                self.stats["eager_after_eager"] += eager and self._prev_eager
                self._prev_eager = eager
                self._prev_extend = set(rids) if batch.forward_mode.is_extend() else None
                self.result_queue.append((batch.copy(), result))
            if self.last_batch is not None and not processed:
                self.process(*self.result_queue.pop(0))
            self.last_batch = batch
            if (batch is None and not self.result_queue and not self.waiting
                    and it > max(ARRIVALS)):
                break
        return self


def _switch_mirror_relay(monkeypatch, config):
    """Back-port 22's switch on for the ``mirror_relay`` configuration, unset for the others."""
    if config == "mirror_relay":
        monkeypatch.setenv("SGLANG_FUTUREMAP_MIRROR_RELAY", "1")
    else:
        monkeypatch.delenv("SGLANG_FUTUREMAP_MIRROR_RELAY", raising=False)


def _all_done(sim):
    assert sorted(sim.finished) == sorted(sim.reqs), (sim.finished, list(sim.reqs))
    for rid, req in sim.reqs.items():
        assert req.finished(), rid
        assert req.req_pool_idx is None, f"{rid} still holds a request slot"
    # Every KV slot came back: nothing leaked across filter/merge/finish.
    assert sim.allocator.available_size() == 4096
    assert sorted(sim.req_to_token_pool.free_slots) == list(range(1, POOL_SIZE + 1))


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("worker_cls", [ContractWorker, NoCallbackWorker],
                         ids=["on_publish", "safety_net"])
def test_spec_v2_overlap_simulation(rig, algorithm, worker_cls, config, monkeypatch):
    rig.use(algorithm)
    _switch_mirror_relay(monkeypatch, config)
    sim = Simulation(algorithm, worker_cls, rig.probe, config).run()
    mirror = sim.mirror
    _all_done(sim)
    # resolve_seq_lens_cpu ran before every decode; it reads the device lengths back
    # exactly when the mirror is on (back-port 4: never without it).
    assert len(sim.resolve_hits) == len(sim.worker.calls)
    with_d2h = [hits for hits in sim.resolve_hits if hits]
    if config == "mirror_relay":
        # Every decode's exact host lengths (checked in run) came from a prefill's host values
        # or the previous decode's copy (back-port 22): none from a read-back in resolve, which
        # would wait for the last publish (a prefill's, after a prefill).
        copies = [hits for hits in sim.resolve_hits if any(h[0] == "Tensor.cpu" for h in hits)]
        assert copies == [], f"a mirrored decode read seq_lens back: {copies}"
    elif mirror:
        assert len(with_d2h) == sum(not c["extend"] for c in sim.worker.calls), with_d2h
        assert all(("Tensor.cpu", False) in hits for hits in with_d2h), with_d2h
    elif sim.eager_above_bs is not None:
        # Eager batches take exact host lengths from the relay (back-port 21): a prefill's
        # host values and the previous decode's copy, so no device read-back in resolve (the
        # mirror's copy would wait for the last publish: a prefill's, after a prefill).
        assert sim.eager_above_bs == GRAPH_MAX_BS[config]
        copies = [hits for hits in sim.resolve_hits if any(h[0] == "Tensor.cpu" for h in hits)]
        assert copies == [], f"an eager batch read seq_lens back: {copies}"
    else:
        assert with_d2h == [], f"seq_lens read back to the host without a mirror: {with_d2h}"
    st = sim.stats
    # The scenario really exercised what it claims to.
    assert sum(len(c["rids"]) for c in sim.worker.calls if c["extend"]) == len(sim.reqs)
    for rid, req in sim.reqs.items():
        if rid != f"r-{ABORT_AT[11]}":
            assert type(req.finished_reason).__name__ == "FINISH_LENGTH", rid
            assert len(req.output_ids) >= req.sampling_params.max_new_tokens, rid
    assert st["decode"] >= 15 and st["filtered"] >= 5 and st["merged"] >= 5, st
    assert st["slot_reuse"] >= 3 and st["slot_shared_in_batch"] >= 1, st
    assert st["decode_after_prefill"] >= 4 and st["decode_after_prefill_mixed"] >= 3, st
    # The draft extend's host lengths (checked against the truth by the worker): FA3
    # without the mirror asks in every decode, and the relay serves every one of them, the
    # decodes right after a prefill included, so none waits for a copy queued behind the
    # forward before it (back-port 14). Where the mirror is on, or Triton, nothing asks.
    if config == "fa3_pcg":
        assert sim.worker.draft_extend_sources == ["relay"] * st["decode"]
    elif config == "fa3_pcg_eager":
        # An eager batch has exact host lengths already; the others ask, as above.
        assert sim.worker.draft_extend_sources == ["relay"] * (st["decode"] - st["eager"])
        assert st["eager"] >= 8 and st["eager_after_prefill_mixed"] >= 3, st
        assert st["eager_after_eager"] >= 3 and st["decode"] - st["eager"] >= 8, st
    else:
        assert sim.worker.draft_extend_sources == []
    aborted = sim.reqs[f"r-{ABORT_AT[11]}"]
    assert type(aborted.finished_reason).__name__ == "FINISH_ABORT"
    assert len(aborted.output_ids) < aborted.sampling_params.max_new_tokens
    # Who published: the worker through on_publish, or the scheduler's safety net.
    expected_cb = len(sim.worker.calls) if worker_cls.accepts_on_publish else 0
    assert sim.worker.published_during_forward == expected_cb
    # Draft relay: STANDALONE relays no hidden states, EAGLE3 does.
    assert hasattr(sim.sched.future_map, "hidden_states_buf") == (algorithm == "EAGLE3")
    # Every request's accepted tokens add up: truth = prompt + everything accepted.
    for rid, req in sim.reqs.items():
        accepted = sum(sum(c["accept"][i] for i, r in enumerate(c["rids"]) if r == rid)
                       for c in sim.worker.calls if not c["extend"])
        assert sim.truth[rid] == len(req.origin_input_ids) + accepted


@plugin_only
def test_probe_detects_the_stock_schedule_path(rig, patched):
    """Control: the same probe, on stock 0.5.12.post1 code, counts the waits and syncs."""
    import sglang_futuremap_patch as plugin
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    rig.use("EAGLE3")
    sim = Simulation("EAGLE3", ContractWorker, rig.probe)
    for it in (0, 100, 101):  # prefill (ARRIVALS[0]), then two decodes (nothing arrives)
        batch = sim.next_batch(it)
        sim.sched.run_batch(batch)
        sim.last_batch = batch
    running = sim.running
    assert len(running.reqs) == 3 and running.forward_mode.is_decode()

    plugin.revert()
    try:
        # What stock run_batch leaves behind for spec v2: seq_lens being produced by the
        # forward, fenced by verify_done.
        verify_done = torch.cpu.Event()
        verify_done.record()
        running.spec_info.verify_done = verify_done
        running.reqs[1].finished_reason = FINISH_ABORT("control")
        with rig.probe.armed(running.seq_lens):
            running.filter_batch(v1_spec_info_filtered=True)
        filter_hits = rig.probe.take()
        with rig.probe.armed(running.seq_lens):
            running.prepare_for_decode()
        decode_hits = rig.probe.take()
    finally:
        plugin.apply(mode="strict")

    assert ("Event.synchronize", False) in filter_hits, filter_hits  # verify_done wait
    assert ("Tensor.item", False) in filter_hits, filter_hits  # seq_lens.sum().item()
    assert ("Event.synchronize", False) in decode_hits, decode_hits  # verify_done wait
    assert ("Tensor.cpu", True) in decode_hits, decode_hits  # batch.seq_lens.cpu()
    assert ("Tensor.item", False) in decode_hits, decode_hits  # seq_lens_cpu.sum().item()


def test_a_request_left_out_of_the_last_prefill_leaves_the_sum_to_the_relay(rig):
    """``get_next_batch_to_run`` filters the last prefill batch (a chunked request stays out)
    and merges it into the running batch: neither step may sum the lengths on the host, so
    the merged sum stays deferred and ``resolve_seq_lens_cpu`` fills it in before the next
    forward."""
    rig.use("EAGLE3")
    sim = Simulation("EAGLE3", ContractWorker, rig.probe)
    running = sim._prefill_batch([(0, 5, 9), (1, 7, 14)])
    sim.sched.run_batch(running)
    last = sim._prefill_batch([(2, 4, 3), (3, 6, 30)])
    sim.sched.run_batch(last)
    assert running.seq_lens_sum == 12 and last.seq_lens_sum == 10

    chunked = last.reqs[1]
    with rig.probe.armed(last.seq_lens, running.seq_lens):
        last.filter_batch(chunked_req_to_exclude=[chunked])
        running.merge_batch(last)
    assert rig.probe.take() == []
    assert [r.rid for r in running.reqs] == ["r-0", "r-1", "r-2"]
    assert running.seq_lens.tolist() == [5, 7, 4] and running.seq_lens_sum is None

    sim.sched.future_map.resolve_seq_lens_cpu(running)
    assert running.seq_lens_sum == 16 and running.seq_lens_cpu.tolist() == [5, 7, 4]


@pytest.mark.parametrize("config", ["mirror", "mirror_relay", "fa3_pcg", "fa3_pcg_eager", "no_mirror"])
def test_a_request_released_before_its_decode_is_launched(rig, config, monkeypatch):
    """SGLang processes the last result before launching a decode when
    ``is_disable_overlap_for_batch`` says so: a spec-v2 decode with a grammar (stock), or
    back-port 16's finished or small prefill. A request that result finishes is released
    (``req_pool_idx`` None) yet stays a row of the decode built before it, and the host
    lengths must still be exact for every row (stock reads them from the device). The
    scenario's r-11 finishes at its prefill and others at their length, so both kinds of
    result do it here."""
    rig.use("EAGLE3")
    _switch_mirror_relay(monkeypatch, config)
    sim = Simulation("EAGLE3", ContractWorker, rig.probe, config).run(process_first=True)
    _all_done(sim)
    assert sim.stats["released_before_launch"] >= 3, sim.stats
    if config == "fa3_pcg":
        assert sim.worker.draft_extend_sources == ["relay"] * sim.stats["decode"]
