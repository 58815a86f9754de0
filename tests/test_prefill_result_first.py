"""Back-port prefill-result-first: a finished prefill's result is processed before the next launch.

SGLang's real ``Scheduler.event_loop_overlap`` runs here for a few iterations on a scheduler
object whose collaborators (receiving requests, building batches, launching them, processing
results) only record what the loop asks of them: the order of launches and result processing
is the loop's own, decided by the real ``is_disable_overlap_for_batch``. The GPU event a
result carries is the one thing stood in for: ``copy_done.query()`` answers what the test says.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from conftest import activate_backport, loop_scheduler


class _StopLoop(Exception):
    pass


class _Event:
    """``copy_done`` of a result: done or not; the loop must never wait on it here."""

    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:  # pragma: no cover - a wait would be a defect
        raise AssertionError("the loop waited on a result event")


def _batch(name: str, mode: str, spec_v2: bool = True, new_tokens: int = 256):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fm = ForwardMode.EXTEND if mode == "prefill" else ForwardMode.DECODE
    b = SimpleNamespace(name=name, forward_mode=fm, is_spec_v2=spec_v2, has_grammar=False,
                        is_extend_in_batch=fm.is_extend(),
                        reqs=[SimpleNamespace(extend_input_len=new_tokens if fm.is_extend() else 0)])
    b.copy = lambda: b
    return b


def _run_loop(batches, done, *, mlp_sync: bool = False, topk: int = 1):
    """Drive the real overlap loop over ``batches`` (one per iteration; None: idle) and return
    the order of launches and result processing. ``done[name]``: whether that batch's result
    has finished on the GPU when the loop looks at it."""
    sched = loop_scheduler()
    log: list[str] = []
    todo = deque(batches)

    def recv_requests():
        if not todo:
            raise _StopLoop
        return []

    def get_next_batch_to_run():
        return todo.popleft()

    def run_batch(batch):
        log.append(f"launch {batch.name}")
        return SimpleNamespace(copy_done=_Event(done.get(batch.name, False)))

    def process_batch_result(batch, result):
        log.append(f"process {batch.name}")

    sched.recv_requests = recv_requests
    sched.process_input_requests = lambda reqs: None
    sched.get_next_batch_to_run = get_next_batch_to_run
    sched.run_batch = run_batch
    sched.process_batch_result = process_batch_result
    sched.require_mlp_sync = mlp_sync
    sched.server_args.speculative_eagle_topk = topk
    with pytest.raises(_StopLoop):
        sched.event_loop_overlap()
    return log


@pytest.fixture
def patched(clean_state, monkeypatch):
    """The back-port installed and switched on (for the chains these batches stand for it is off
    by default)."""
    monkeypatch.setenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", "1")
    activate_backport()


OVERLAP_ORDER = ["launch P", "launch D1", "process P", "launch D2", "process D1"]
RESULT_FIRST = ["launch P", "process P", "launch D1", "launch D2", "process D1"]


def _prefill_then_decodes(new_tokens: int = 256, **kw):
    return [_batch("P", "prefill", new_tokens=new_tokens, **kw), _batch("D1", "decode", **kw),
            _batch("D2", "decode", **kw)]


def test_stock_loop_launches_before_it_processes_a_finished_prefill(clean_state):
    """The control: unpatched, a finished prefill still waits for the next launch."""
    assert _run_loop(_prefill_then_decodes(), {"P": True, "D1": True}) == OVERLAP_ORDER


def test_finished_prefill_is_processed_before_the_next_launch(patched):
    # Only the prefill's result jumps the queue; a finished decode keeps the overlap order.
    assert _run_loop(_prefill_then_decodes(), {"P": True, "D1": True}) == RESULT_FIRST


def test_small_prefill_still_running_goes_first_before_a_decode(patched):
    """The loop waits for a small prefill rather than launch the decode first: its first
    tokens would otherwise wait for the whole decode launch."""
    from sglang_futuremap_patch.backports.prefill_result_first import SMALL_PREFILL_TOKENS

    assert SMALL_PREFILL_TOKENS == 1024
    for new_tokens in (1, SMALL_PREFILL_TOKENS):
        assert _run_loop(_prefill_then_decodes(new_tokens), {"P": False}) == RESULT_FIRST


def test_large_prefill_still_running_keeps_the_overlap_order(patched):
    """Its GPU time covers the next launch: launching first costs its first tokens nothing."""
    assert _run_loop(_prefill_then_decodes(1025), {"P": False}) == OVERLAP_ORDER
    assert _run_loop(_prefill_then_decodes(4096), {"P": True}) == RESULT_FIRST


def test_consecutive_prefills_only_a_finished_one_goes_first(patched):
    """Before another prefill the loop never waits (that prefill's requests would)."""
    batches = [_batch("P1", "prefill"), _batch("P2", "prefill"), _batch("P3", "prefill"),
               _batch("D", "decode", new_tokens=0)]
    assert _run_loop(batches, {"P1": True, "P2": False, "P3": False}) == [
        "launch P1", "process P1", "launch P2", "launch P3", "process P2", "process P3", "launch D"]


@pytest.mark.parametrize("switch", [None, "1"])
def test_consecutive_prefills_of_a_tree_go_first_as_stock_spec_v1_orders_them(clean_state, monkeypatch,
                                                                              switch):
    """A tree runs on spec v1 in stock SGLang: each prefill's result before the next launch.
    Still running and large, a tree's prefill goes first before another prefill; before a
    decode the size rule holds as for a chain."""
    if switch is None:
        monkeypatch.delenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", raising=False)
    else:
        monkeypatch.setenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", switch)
    activate_backport()
    batches = [_batch("P1", "prefill", new_tokens=4096), _batch("P2", "prefill", new_tokens=4096),
               _batch("P3", "prefill", new_tokens=4096), _batch("D", "decode", new_tokens=0)]
    assert _run_loop(batches, {}, topk=4) == [
        "launch P1", "process P1", "launch P2", "process P2", "launch P3", "launch D", "process P3"]


@pytest.mark.parametrize("case", ["not_spec_v2", "dp_attention", "env_off", "env_unset"])
def test_stock_order_where_it_does_not_apply(patched, monkeypatch, case):
    """Non-speculative batches are untouched, DP attention ranks decide with synchronised
    flags (a per-rank event query could split them), and for a chain without the switch (unset,
    or anything but 1) the loop keeps the stock order."""
    if case == "env_off":
        monkeypatch.setenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", "0")
    if case == "env_unset":
        monkeypatch.delenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST")
    batches = _prefill_then_decodes(spec_v2=case != "not_spec_v2")
    assert _run_loop(batches, {"P": True}, mlp_sync=case == "dp_attention") == OVERLAP_ORDER


@pytest.mark.parametrize("switch, topk, expected", [
    (None, 4, RESULT_FIRST),   # unset: on for a tree
    (None, 1, OVERLAP_ORDER),  # unset: off for a chain
    ("0", 4, OVERLAP_ORDER),   # switched off for a tree too
    ("1", 1, RESULT_FIRST),    # switched on for a chain too
])
def test_unset_it_is_on_for_a_tree_only(clean_state, monkeypatch, switch, topk, expected):
    """The default follows the measurement: on for EAGLE trees (topk > 1), where it brings the
    FA3 tree's TTFT to stock's; off for chains, where it was not shown to pay off."""
    if switch is None:
        monkeypatch.delenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", raising=False)
    else:
        monkeypatch.setenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", switch)
    activate_backport()
    assert _run_loop(_prefill_then_decodes(), {"P": True}, topk=topk) == expected


def test_idle_iteration_after_a_prefill_processes_it(patched):
    """No next batch: the loop processes the prefill as before (nothing to reorder)."""
    assert _run_loop([_batch("P", "prefill"), None], {"P": True}) == ["launch P", "process P"]


class _Batch:
    """A batch as SGLang's scheduler handles it, reduced to what the loop, the real
    ``get_next_batch_to_run`` and the real ``update_running_batch`` touch. As in SGLang,
    ``copy()`` is a snapshot taken at launch (``ScheduleBatch.copy``: a new batch with the
    forward mode and a copy of the request list, no ``extend_num_tokens``) and
    ``prepare_for_decode`` turns the batch itself into a decode (``ScheduleBatch.prepare_for_decode``
    sets ``self.forward_mode`` first)."""

    def __init__(self, name: str, reqs: list, new_tokens: int | None = None):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.name, self.reqs, self.decodes = name, reqs, 0
        self.forward_mode = ForwardMode.EXTEND
        self.extend_num_tokens = new_tokens
        self.is_spec_v2, self.has_grammar, self.is_prefill_only = True, False, False
        self.chunked_req, self.batch_is_full = None, False

    @property
    def is_extend_in_batch(self) -> bool:
        return self.forward_mode.is_extend()

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)

    def filter_batch(self, **kwargs) -> None:
        self.reqs = [r for r in self.reqs if not r.finished()]

    def merge_batch(self, other: "_Batch") -> None:
        self.reqs = self.reqs + other.reqs

    def check_decode_mem(self) -> bool:
        return True

    def prepare_for_decode(self) -> None:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.forward_mode = ForwardMode.DECODE
        self.decodes += 1
        self.name = f"D{self.decodes}"

    def copy(self) -> "_Batch":
        snap = _Batch(self.name, self.reqs[:])
        snap.forward_mode = self.forward_mode
        return snap


def _run_from_idle(prompt_tokens: int, done: bool) -> list[str]:
    """One request reaches an idle server (nothing running): SGLang's real overlap loop,
    ``get_next_batch_to_run`` and ``update_running_batch`` make its prefill batch the running
    batch and turn that same object into the decode. Returns the launches and result processing
    (the prefill ``P``, then decodes ``D1``, ``D2``); ``done``: whether the prefill's
    ``copy_done`` has completed when the loop asks."""
    sched = loop_scheduler()
    log: list[str] = []
    answers, waiting = deque([["A"], [], [], []]), []

    def recv_requests():
        if not answers:
            raise _StopLoop
        return answers.popleft()

    def get_new_batch_prefill():
        if not waiting:
            return None
        req = SimpleNamespace(finished=lambda: False, is_retracted=False,
                              extend_input_len=prompt_tokens)
        waiting.clear()
        return _Batch("P", [req], new_tokens=prompt_tokens)

    def run_batch(batch):
        log.append(f"launch {batch.name}")
        return SimpleNamespace(copy_done=_Event(done if batch.name == "P" else False))

    sched.recv_requests = recv_requests
    sched.process_input_requests = lambda reqs: waiting.extend(reqs)
    sched.get_new_batch_prefill = get_new_batch_prefill
    sched.running_batch = _Batch("-", [])
    sched.run_batch = run_batch
    sched.process_batch_result = lambda batch, result: log.append(f"process {batch.name}")
    # What SGLang's real update_running_batch reads besides the batch.
    sched.enable_hierarchical_cache = False
    sched.new_token_ratio, sched.new_token_ratio_decay, sched.min_new_token_ratio = 0.7, 0.001, 0.1
    with pytest.raises(_StopLoop):
        sched.event_loop_overlap()
    assert sched.running_batch.reqs and sched.running_batch.decodes == 3  # one object throughout
    return log


FROM_IDLE_RESULT_FIRST = ["launch P", "process P", "launch D1", "launch D2", "process D1", "launch D3",
                          "process D2"]


@pytest.mark.parametrize("done", [True, False])
def test_prefill_on_an_idle_server_goes_first(patched, done):
    """Concurrency 1: by the time the loop decides, ``self.last_batch`` *is* the running decode
    (SGLang reused the prefill batch), so only the snapshot queued with the result still says
    prefill. Finished, or small and still running: its first tokens leave before D1's launch."""
    assert _run_from_idle(256, done) == FROM_IDLE_RESULT_FIRST


def test_large_prefill_on_an_idle_server_keeps_the_overlap_order(patched):
    """The size comes from the snapshot's requests (``copy()`` drops ``extend_num_tokens``)."""
    assert _run_from_idle(1025, False)[:3] == ["launch P", "launch D1", "process P"]
    assert _run_from_idle(1025, True) == FROM_IDLE_RESULT_FIRST


def test_prefill_on_an_idle_server_stock_order_without_the_switch(patched, monkeypatch):
    monkeypatch.delenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST")
    assert _run_from_idle(256, True)[:3] == ["launch P", "launch D1", "process P"]
