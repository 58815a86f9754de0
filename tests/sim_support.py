"""Support for ``test_overlap_simulation.py``: a CPU-only spec-v2 overlap rig.

Everything the simulation drives is SGLang's own code (patched by the plugin where the
plugin patches it): ``Scheduler.init_overlap`` / ``run_batch`` / ``update_running_batch`` /
``record_batch_in_overlap`` / ``_profile_batch_predicate``, ``FutureMap``, ``ScheduleBatch``
(``init_new``, ``prepare_for_extend``, ``filter_batch``, ``merge_batch``,
``prepare_for_decode``, ``check_decode_mem``, ``get_model_worker_batch``, ``copy``), the
EAGLE v2 ``prepare_for_decode`` mixin, ``EagleDraftInput``, ``Req``, ``ReqToTokenPool``,
``TokenToKVPoolAllocator``, ``ChunkCache``, ``release_kv_cache``, ``SamplingBatchInfo``,
``GenerationBatchResult.copy_to_cpu``.

What is *not* SGLang's code, and why:

* the model worker (``ContractWorker``): there is no model on a CPU test host. It honours
  the EAGLE v2 worker contract and checks everything it is handed;
* ``Scheduler`` is created with ``object.__new__`` and given only the attributes the code
  paths above read (its ``__init__`` loads a model and opens ZMQ sockets);
* ``ServerArgs`` is created without ``__post_init__`` (which resolves a model path and
  probes the hardware); every field keeps its dataclass default except the ones set here;
* ``model_config`` is a ``SimpleNamespace`` with the five fields the batch reads (a real
  ``ModelConfig`` loads a Hugging Face config from disk);
* ``assign_req_to_token_pool_func`` (see ``torch_assign_req_to_token_pool_func``): the one
  Triton kernel on this path. Triton cannot launch on a CPU host and its interpreter cannot
  run this kernel stand-alone (it calls the ``@jit`` ``tl.sum``), so the test swaps in a
  plain-torch transcription of the kernel. It only fills ``req_to_token`` rows; it reads no
  sequence lengths and the probe below does not exempt it.
* the output processing between iterations (``process_batch_result``) is mirrored in the
  test with the few lines that matter here (``_resolve_spec_overlap_tokens``' KV
  bookkeeping, ``Req.check_finished`` and ``release_kv_cache``, both real); the real method
  needs a tokenizer channel, metrics and grammar machinery.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from types import SimpleNamespace

import torch

SPEC_STEPS = 3
SPEC_TOPK = 1
SPEC_DRAFT_TOKENS = 4  # the most tokens one verify can accept (drafts + bonus)
HIDDEN = 6
VOCAB = 32000  # above every payload code, so prefill tokens (= bonus tokens) are in-vocab


# --------------------------------------------------------------------------- server args


def make_server_args(algorithm: str):
    """A real ``ServerArgs`` (every default), minus ``__post_init__``'s model/hardware probing."""
    from sglang.srt.server_args import ServerArgs

    args = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            setattr(args, f.name, f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            setattr(args, f.name, f.default_factory())  # type: ignore[misc]
    overrides = dict(
        model_path="unused-on-cpu",
        device="cpu",
        page_size=1,
        attention_backend="torch_native",  # write_cache_indices takes its torch path
        speculative_algorithm=algorithm,
        speculative_num_steps=SPEC_STEPS,
        speculative_eagle_topk=SPEC_TOPK,
        speculative_num_draft_tokens=SPEC_DRAFT_TOKENS,
        enable_multi_layer_eagle=False,
        disable_overlap_schedule=False,
        enable_dp_attention=False,
        elastic_ep_backend=None,
    )
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


# --------------------------------------------------------------------------- triton seam


def torch_assign_req_to_token_pool_func(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size
):
    """Plain-torch transcription of ``spec_utils.assign_req_to_token_pool`` (Triton).

    Row ``i`` gets ``out_cache_loc[sum(end[:i]-start[:i]) : ...]`` written into
    ``req_to_token[req_pool_indices[i], start[i]:end[i]]``. Only torch indexing ops: no
    host reads of any tensor, so it cannot hide (or cause) a probe hit.
    """
    if batch_size == 0:
        return
    lens = (end_offset - start_offset).to(torch.int64)
    total = out_cache_loc.shape[0]
    rows = torch.repeat_interleave(req_pool_indices.to(torch.int64), lens, output_size=total)
    first = torch.cumsum(lens, 0) - lens
    within = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(
        first, lens, output_size=total
    )
    cols = torch.repeat_interleave(start_offset.to(torch.int64), lens, output_size=total) + within
    req_to_token[rows, cols] = out_cache_loc.to(req_to_token.dtype)


# --------------------------------------------------------------------------- host-sync probe


class HostSyncProbe:
    """Counts host synchronisations while armed.

    Wraps every way the schedule code could pull a tensor value to the host (``item``,
    ``tolist``, ``cpu``, ``numpy``, ``__int__``/``__float__``/``__bool__``/``__index__``)
    and every host wait on an event or stream (``torch.cpu.Event.synchronize/query/wait``,
    ``torch.cpu.synchronize``). On CUDA each of these blocks the CPU until the producing
    stream catches up; on CPU they are the same calls, so counting them is exact.

    Each hit records the call and whether its tensor shares storage with one of the
    ``watch``-ed tensors (``batch.seq_lens``).
    """

    TENSOR_METHODS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__",
                      "__index__")
    EVENT_METHODS = ("synchronize", "query", "wait")

    def __init__(self):
        self.hits: list[tuple[str, bool]] = []
        self._watched_ptrs: set[int] = set()
        self._armed = False
        self._saved: list[tuple[object, str, object]] = []

    # -- patching
    def install(self):
        for name in self.TENSOR_METHODS:
            self._wrap(torch.Tensor, name, tensor=True)
        for name in self.EVENT_METHODS:
            self._wrap(torch.cpu.Event, name, tensor=False)
        self._wrap(torch.cpu, "synchronize", tensor=False, plain=True)
        return self

    def uninstall(self):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def _wrap(self, owner, name, tensor, plain=False):
        original = getattr(owner, name)
        probe = self

        if plain:
            def wrapper(*args, **kwargs):
                if probe._armed:
                    probe.hits.append((f"torch.cpu.{name}", False))
                return original(*args, **kwargs)
        else:
            def wrapper(self_, *args, **kwargs):
                if probe._armed:
                    probe._armed = False  # storage lookups below must not recurse
                    try:
                        shares = tensor and probe._shares(self_)
                        label = f"Tensor.{name}" if tensor else f"Event.{name}"
                        probe.hits.append((label, shares))
                    finally:
                        probe._armed = True
                return original(self_, *args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def _shares(self, t) -> bool:
        try:
            return t.untyped_storage().data_ptr() in self._watched_ptrs
        except Exception:
            return False

    # -- use
    @contextmanager
    def armed(self, *watch):
        self._watched_ptrs = {
            t.untyped_storage().data_ptr() for t in watch if isinstance(t, torch.Tensor)
        }
        self._armed = True
        try:
            yield self
        finally:
            self._armed = False

    def take(self) -> list[tuple[str, bool]]:
        hits, self.hits = self.hits, []
        return hits


# --------------------------------------------------------------------------- fake workers


def payload_code(rid_num: int, step: int) -> int:
    """What a request's draft state encodes after its ``step``-th forward (exact in fp32)."""
    return rid_num * 1000 + step


def accept_len(rid_num: int, step: int) -> int:
    """Deterministic, request-dependent number of tokens one verify accepts (1..4)."""
    return 1 + (rid_num * 7 + step * 3) % SPEC_DRAFT_TOKENS


class ContractWorker:
    """A model-free EAGLE v2 worker that honours (and checks) the worker contract.

    ``truth`` maps rid -> the request's real sequence length, kept with Python ints: the
    test seeds it with the prompt length, this worker adds what each verify accepts. Every
    forward checks that ``seq_lens`` / ``seq_lens_cpu`` / ``seq_lens_sum`` it is handed
    match ``truth`` and, on decode, that the relayed draft state (topk_p, topk_index,
    bonus_tokens, hidden_states) is exactly what it produced for those requests last time.
    """

    accepts_on_publish = True
    #: Whether decode forwards get the seq_lens host mirror (``needs_cpu_seq_lens``);
    #: a prefill always has one (its lengths are built on the host).
    mirror = True
    #: The draft-extend attention backend, when it declares that its eager metadata reads
    #: the host lengths (FA3): then every decode without the mirror asks for them as the
    #: EAGLE v2 draft worker does (SGLang's ``copy_seq_lens_for_draft_extend`` at the start
    #: of the draft, no draft-extend CUDA graph) and reads them where
    #: ``prepare_for_extend_to_fill_draft_kvcache`` does, after the publish.
    draft_extend_backend = None
    #: Decode batches larger than this run eagerly (above the captured CUDA-graph sizes) and,
    #: on a backend whose eager forward reads the host lengths, get exact ones without the
    #: mirror (back-port 13). None: no batch runs eagerly.
    eager_above_bs = None

    def __init__(self, truth: dict[str, int], relay_hidden: bool):
        self.truth = truth
        self.relay_hidden = relay_hidden
        self.steps: dict[str, int] = {}  # rid -> forwards run for it
        self.calls: list[dict] = []  # one record per forward, for the test
        self.published_during_forward = 0
        #: Per decode that asked for draft-extend host lengths: where they came from
        #: ("relay": FutureMap.lend_draft_extend_lens; "copy": the late copy).
        self.draft_extend_sources: list[str] = []

    # The scheduler calls this when a (non-adaptive) verify result reaches the host.
    def on_verify_complete_cpu(self, *_):
        return None

    def _payload(self, rid_num: int, step: int):
        code = payload_code(rid_num, step)
        topk_p = torch.tensor([[float(code) + 0.5 * j for j in range(SPEC_TOPK)]],
                              dtype=torch.float32)
        topk_index = torch.tensor([[code * 10 + j for j in range(SPEC_TOPK)]], dtype=torch.int64)
        hidden = (
            torch.tensor([[float(code) + 0.25 * j for j in range(HIDDEN)]], dtype=torch.float32)
            if self.relay_hidden else None
        )
        bonus = torch.tensor([code], dtype=torch.int32)
        return topk_p, topk_index, hidden, bonus

    def _check_lengths(self, mwb, rids):
        expected = [self.truth[r] for r in rids]
        got = mwb.seq_lens.tolist()
        assert got == expected, f"worker got seq_lens {got}, truth {expected} for {rids}"
        eager = self.eager_above_bs is not None and len(rids) > self.eager_above_bs
        if not self.mirror and not mwb.forward_mode.is_extend() and not eager:
            assert mwb.seq_lens_cpu is None and mwb.seq_lens_sum is None, (
                "needs_cpu_seq_lens is off but the worker got a host mirror "
                f"{mwb.seq_lens_cpu} / {mwb.seq_lens_sum}")
            return expected
        assert mwb.seq_lens_cpu.device.type == "cpu"
        assert mwb.seq_lens_cpu.tolist() == expected, (
            f"worker got seq_lens_cpu {mwb.seq_lens_cpu.tolist()}, truth {expected}")
        assert mwb.seq_lens_sum == sum(expected), (
            f"worker got seq_lens_sum {mwb.seq_lens_sum}, truth {sum(expected)}")
        return expected

    def _check_relayed(self, spec_info, rids, rid_nums):
        for name, idx in (("topk_p", 0), ("topk_index", 1), ("bonus_tokens", 3)):
            got = getattr(spec_info, name)
            want = torch.cat([self._payload(n, self.steps[r] - 1)[idx]
                              for r, n in zip(rids, rid_nums)])
            assert got is not None and got.shape == want.shape and torch.equal(
                got.to(want.dtype), want), f"relayed {name} {got} != produced {want} ({rids})"
        if self.relay_hidden:
            want = torch.cat([self._payload(n, self.steps[r] - 1)[2]
                              for r, n in zip(rids, rid_nums)])
            got = spec_info.hidden_states
            assert got is not None and torch.equal(got, want), (
                f"relayed hidden_states {got} != produced {want} ({rids})")

    def forward_batch_generation(self, model_worker_batch, on_publish=None):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        mwb = model_worker_batch
        assert (on_publish is not None) == self.accepts_on_publish, (
            "scheduler passed on_publish to a worker that does not accept it (or vice versa)")
        rids = [r.rid for r in mwb.reqs]
        rid_nums = [int(r.rid.split("-")[1]) for r in mwb.reqs]
        bs = len(rids)
        is_extend = mwb.forward_mode.is_extend()
        before = self._check_lengths(mwb, rids)
        # A request released by a result processed before this launch (SGLang's grammar sync,
        # back-port 16) keeps its row, and its slot number only on the device.
        assert all(r.req_pool_idx == i or (r.req_pool_idx is None and r.finished())
                   for i, r in zip(mwb.req_pool_indices.tolist(), mwb.reqs))

        if is_extend:
            assert mwb.spec_info is None, "a prefill has nothing relayed"
            accept = [0] * bs
            new_lens = list(before)
        else:
            self._check_relayed(mwb.spec_info, rids, rid_nums)
            accept = [accept_len(n, self.steps[r]) for r, n in zip(rids, rid_nums)]
            new_lens = [s + a for s, a in zip(before, accept)]

        asks = (not is_extend and mwb.seq_lens_cpu is None
                and getattr(self.draft_extend_backend, "draft_extend_needs_cpu_seq_lens", False))
        if asks:  # the start of the draft
            from sglang.srt.speculative.base_spec_worker import BaseDraftWorker

            BaseDraftWorker.copy_seq_lens_for_draft_extend(
                self, mwb, self.draft_extend_backend, None)

        # Verify (or the target prefill) has fixed the lengths: publish before the draft.
        new_seq_lens = (mwb.seq_lens if is_extend
                        else mwb.seq_lens + torch.tensor(accept, dtype=mwb.seq_lens.dtype))
        if on_publish is not None:
            on_publish(new_seq_lens)
            self.published_during_forward += 1
        if asks:  # the draft extend, after the publish
            pending = mwb.seq_lens_cpu_pending
            self.draft_extend_sources.append("relay" if callable(pending) else "copy")
            host, copied = pending() if callable(pending) else pending
            if copied is not None:
                copied.synchronize()
            assert host.tolist() == before, (
                f"draft extend got host lengths {host.tolist()}, truth {before} for {rids}")

        payloads = []
        for r, n in zip(rids, rid_nums):
            step = self.steps.get(r, 0)
            payloads.append(self._payload(n, step))
            self.steps[r] = step + 1
        for r, a in zip(rids, accept):
            self.truth[r] += a

        topk_p = torch.cat([p[0] for p in payloads])
        topk_index = torch.cat([p[1] for p in payloads])
        hidden = torch.cat([p[2] for p in payloads]) if self.relay_hidden else None
        bonus = torch.cat([p[3] for p in payloads])
        # Record verify_done as 0.5.12.post1's workers did (the patched ones no longer do):
        # any wait on it left on the schedule path then shows up in the probe.
        verify_done = torch.get_device_module("cpu").Event()
        verify_done.record()
        next_draft_input = EagleDraftInput(
            topk_p=topk_p,
            topk_index=topk_index,
            hidden_states=hidden,
            bonus_tokens=bonus,
            new_seq_lens=new_seq_lens,
            verify_done=verify_done,
        )
        if is_extend:
            next_token_ids = bonus.to(torch.int64)
            accept_lens = None
        else:
            # Verify's layout: SPEC_DRAFT_TOKENS predictions per request, first `accept` valid.
            next_token_ids = torch.arange(bs * SPEC_DRAFT_TOKENS, dtype=torch.int64) % VOCAB
            accept_lens = torch.tensor(accept, dtype=torch.int32)
        self.calls.append(dict(extend=is_extend, rids=rids, seq_lens=before, accept=accept,
                               indices=mwb.req_pool_indices.tolist()))
        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(
                next_token_logits=torch.zeros((bs, 4), dtype=torch.float32),
                hidden_states=hidden,
            ),
            next_token_ids=next_token_ids,
            accept_lens=accept_lens,
            speculative_num_draft_tokens=None if is_extend else SPEC_DRAFT_TOKENS,
            next_draft_input=next_draft_input,
        )


class NoCallbackWorker(ContractWorker):
    """A worker that predates ``on_publish`` (e.g. a plugin algorithm): never publishes."""

    accepts_on_publish = False


# --------------------------------------------------------------------------- scheduler


def make_pools(pool_size: int, context_len: int, kv_tokens: int):
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.chunk_cache import ChunkCache
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    req_to_token_pool = ReqToTokenPool(pool_size, context_len, "cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(kv_tokens, torch.float16, "cpu", kvcache=None,
                                       need_sort=False)
    tree_cache = ChunkCache(CacheInitParams(
        disable=True, req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator, page_size=1))
    return req_to_token_pool, allocator, tree_cache


def make_scheduler(worker, algorithm: str, req_to_token_pool, allocator, tree_cache,
                   model_config, server_args=None, target_attn_backend=None,
                   graph_max_bs=None):
    """A ``Scheduler`` without ``__init__``, set up by the real (patched) ``init_overlap``.

    ``server_args``: what ``init_overlap`` and ``run_batch`` read (default: piecewise CUDA
    graph on, as in a default server, so the seq_lens host mirror is kept).
    ``graph_max_bs``: the largest batch the target's CUDA graph captured (None: no graph
    runner); larger decode batches run eagerly.
    """
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    device_module = torch.get_device_module("cpu")
    s = object.__new__(Scheduler)
    # What init_overlap reads.
    s.device = "cpu"
    s.enable_overlap = True
    s.max_running_requests = req_to_token_pool.size
    s.chunked_prefill_size = None
    s.model_config = model_config
    s.spec_algorithm = SpeculativeAlgorithm.from_string(algorithm)
    s.req_to_token_pool = req_to_token_pool
    s.forward_stream = device_module.Stream()  # from tp_worker.get_worker_info() on a GPU
    s.server_args = server_args or SimpleNamespace(
        enable_dp_attention=False, elastic_ep_backend=None, enable_two_batch_overlap=False,
        disable_piecewise_cuda_graph=False)
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(
        attn_backend=target_attn_backend, model_is_mrope=False, use_ngram_embedding=False,
        graph_runner=None if graph_max_bs is None else SimpleNamespace(max_bs=graph_max_bs)))
    s.draft_worker = worker
    # What run_event_loop sets up (it uses this very no-op for CPU).
    s.schedule_stream = device_module.Stream(priority=0)
    s.schedule_stream.synchronize = lambda: None
    s.init_overlap()
    # What run_batch / forward_spec_v2_overlap read.
    s.is_generation = True
    s.forward_ct = 0
    s.forward_sleep_time = None
    s.disaggregation_mode = DisaggregationMode.NULL  # what apply_war_barrier reads
    s.model_worker = worker
    # What _profile_batch_predicate reads (profiler off, as in a default server).
    s.profile_by_stage = False
    s.profiler_target_forward_ct = None
    s.profiler_start_forward_ct = None
    # What update_running_batch reads.
    s.enable_hierarchical_cache = False
    s.token_to_kv_pool_allocator = allocator
    s.tree_cache = tree_cache
    s.new_token_ratio = 0.5
    s.new_token_ratio_decay = 0.01
    s.min_new_token_ratio = 0.1
    return s


def contract_scheduler(algorithm: str = "EAGLE3"):
    """A spec-v2 overlap scheduler (``make_scheduler``) on the contract worker, with a pool of 4
    requests, 64 tokens of context and 512 KV slots, and a target backend that declares nothing
    (so it keeps the host mirror on every prefix of the series). Returns the scheduler and what
    ``prefill`` needs: ``(sched, worker, pools, model_config, truth)``. The caller sets SGLang's
    global server arguments for the algorithm (``make_server_args``) around it."""
    from sglang.srt.speculative.spec_utils import spec_need_hidden_states

    truth: dict[str, int] = {}
    worker = ContractWorker(truth, relay_hidden=spec_need_hidden_states())
    pools = make_pools(4, 64, kv_tokens=512)
    model_config = SimpleNamespace(vocab_size=VOCAB, is_encoder_decoder=False,
                                   is_matryoshka=False, hidden_size=HIDDEN, context_len=64)
    sched = make_scheduler(worker, algorithm, *pools, model_config, target_attn_backend=object())
    return sched, worker, pools, model_config, truth


def prefill(sched, pools, model_config, truth, prompts):
    """A spec-v2 prefill batch of requests ``r-<num>`` with prompts of the given lengths
    (``prompts``: (num, length) pairs), as the PrefillAdder leaves it: ``prepare_for_extend``
    done, each prompt length recorded in ``truth`` for the contract worker."""
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for num, prompt_len in prompts:
        params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        params.normalize(None)
        req = Req(f"r-{num}", "", list(range(11, 11 + prompt_len)), params, vocab_size=VOCAB)
        req.init_next_round_input(pools[2])
        req.set_extend_input_len(len(req.fill_ids) - len(req.prefix_indices))
        truth[req.rid] = prompt_len
        reqs.append(req)
    batch = ScheduleBatch.init_new(reqs, *pools, model_config, True, sched.spec_algorithm)
    batch.prepare_for_extend()
    return batch


class PagedSlots:
    """The paged KV allocator's slot assignment (a Triton kernel in SGLang) stood in for:
    fresh slots in order, every call recorded with the tensors it was given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []
        self.next = 1

    def __call__(self, *args, **kwargs):
        names = ("tree_cache", "prefix_lens", "prefix_lens_cpu", "seq_lens", "seq_lens_cpu",
                 "last_loc", "extend_num_tokens")
        call = dict(zip(names, args), **kwargs)
        self.calls.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in call.items()})
        n = int(call["extend_num_tokens"])
        out = torch.arange(self.next, self.next + n, dtype=torch.int64)
        self.next += n
        return out


def spec_v2_decode_batch(page_size: int, monkeypatch, device=None, taken: int = 0):
    """A spec-v2 decode batch of three requests, as the running batch holds them after their
    prefill (KV allocated for the prompt by SGLang's ``alloc_for_extend``, lengths committed).
    Returns the batch and the paged-slot recorder (page size > 1). ``device``: the
    ``torch.device`` the batch and the pools live on (default the CPU; a test that tells
    uploads from host tensors passes its own ``torch.device`` object). ``taken``: slots the
    token allocator hands out before the prefill, so its free list then starts that far on."""
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.mem_cache import common
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative import eagle_info_v2
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    slots = PagedSlots()
    device = device if device is not None else torch.device("cpu")
    monkeypatch.setattr(common, "alloc_paged_token_slots_extend", slots)
    monkeypatch.setattr(eagle_info_v2, "alloc_paged_token_slots_extend", slots)
    pool, allocator, tree_cache = make_pools(4, 96, kv_tokens=2048)
    tree_cache.page_size = allocator.page_size = page_size
    pool.device = device
    if taken:
        allocator.alloc(taken)
    reqs = []
    for i, n in enumerate((5, 9, 17)):
        params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
        params.normalize(None)
        req = Req(f"r-{i}", "", [11 + k for k in range(n)], params, vocab_size=512)
        req.init_next_round_input(tree_cache)
        req.set_extend_input_len(len(req.fill_ids) - len(req.prefix_indices))
        reqs.append(req)
    model_config = SimpleNamespace(vocab_size=512, is_encoder_decoder=False, is_matryoshka=False,
                                   hidden_size=16, context_len=96)
    batch = ScheduleBatch.init_new(reqs, pool, allocator, tree_cache, model_config, True,
                                   SpeculativeAlgorithm.from_string("EAGLE3"))
    batch.device = device
    batch.prepare_for_extend()
    for r in reqs:
        r.kv_committed_len = r.kv_allocated_len = len(r.origin_input_ids)
    batch.forward_mode = type(batch.forward_mode).DECODE
    batch.spec_info = EagleDraftInput(
        topk_p=torch.ones(3, 1), topk_index=torch.zeros(3, 1, dtype=torch.int64),
        hidden_states=torch.zeros(3, 16), bonus_tokens=torch.zeros(3, dtype=torch.int64))
    return batch, slots
