"""Back-port prefill-before-next-batch: a tree's small spec-v2 prefill is processed before the
next batch is built.

SGLang's real ``event_loop_overlap``, ``get_next_batch_to_run``, ``update_running_batch`` and
``process_batch_result`` run here on a scheduler whose collaborators only record what they are
asked (as in ``test_prefill_result_first``): receiving requests, building the prefill, the
running batch's ``prepare_for_decode`` (where the next decode is built), launching, and the
per-mode result processing. The one thing stood in for is the GPU event of a result.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from conftest import activate_backport, loop_scheduler
from test_prefill_result_first import _Batch, _Event, _polls, _StopLoop

ENV = "SGLANG_FUTUREMAP_PREFILL_BEFORE_NEXT_BATCH"


class _LoggedBatch(_Batch):
    """``_Batch`` that logs where SGLang builds the next decode out of it."""

    log: list[str]

    def prepare_for_decode(self) -> None:
        super().prepare_for_decode()
        self.log.append(f"build {self.name}")

    def is_dllm(self) -> bool:
        return False

    def copy(self) -> "_LoggedBatch":
        snap = _LoggedBatch(self.name, self.reqs[:])
        snap.forward_mode, snap.log = self.forward_mode, self.log
        return snap


def _req(prompt_tokens: int, *, one_token: bool = False, grammar=None) -> SimpleNamespace:
    """A request; ``one_token``: it finishes at its prefill (``max_new_tokens`` 1), which its
    result processing finds out."""
    req = SimpleNamespace(is_retracted=False, extend_input_len=prompt_tokens, grammar=grammar,
                          done=False)
    req.finished = lambda: req.done and one_token
    return req


def _serve(reqs: list, *, topk: int = 4, mlp_sync: bool = False, chunked: bool = False,
           done: bool = False) -> tuple[list[str], object, list]:
    """One prefill of ``reqs`` reaches an idle server, then the loop runs three more iterations.
    Returns the log (launches, builds, result processing by mode), the running batch and the
    results processed."""
    sched = loop_scheduler()
    log: list[str] = []
    processed: list = []
    waiting: list = []

    def get_new_batch_prefill():
        if not waiting:
            return None
        waiting.clear()
        batch = _LoggedBatch("P", list(reqs), new_tokens=sum(r.extend_input_len for r in reqs))
        batch.log = log
        return batch

    def run_batch(batch):
        log.append(f"launch {batch.name}")
        return SimpleNamespace(copy_done=_Event(done))

    def process_prefill(batch, result):
        log.append(f"process {batch.name}")
        processed.append(result)
        for req in batch.reqs:
            req.done = True

    sched.recv_requests = _polls(deque([["A"], [], [], []]))
    sched.process_input_requests = lambda r: waiting.extend(r)
    sched.get_new_batch_prefill = get_new_batch_prefill
    sched.running_batch = _LoggedBatch("-", [])
    sched.running_batch.log = log
    sched.run_batch = run_batch
    # SGLang's real process_batch_result dispatches to these by the batch's mode.
    sched.process_batch_result_prefill = process_prefill
    sched.process_batch_result_decode = lambda batch, result: log.append(f"process {batch.name}")
    sched.disaggregation_mode = None
    sched.log_batch_result_stats = sched._maybe_clear_mm_inputs = lambda *a: None
    sched.maybe_send_health_check_signal = sched.update_device_timer = lambda: None
    sched.enable_hierarchical_cache = False
    sched.new_token_ratio, sched.new_token_ratio_decay, sched.min_new_token_ratio = 0.7, 0.001, 0.1
    sched.require_mlp_sync = mlp_sync
    sched.server_args.speculative_eagle_topk = topk
    if chunked:
        sched.chunked_req = object()  # a request being chunked (hashable, as a Req is)
        sched.stash_chunked_request = lambda req: None
        sched._chunked_req_scheduled_last_iter = False
    with pytest.raises(_StopLoop):
        sched.event_loop_overlap()
    return log, sched.running_batch, processed


#: Back-port 16's order (and this one's when it does not apply): the loop builds the decode,
#: then processes the prefill, then launches the decode.
AFTER_BUILD = ["launch P", "build D1", "process P", "launch D1"]
#: This back-port: the prefill's result before the decode is built, as stock's spec v1 loop.
BEFORE_BUILD = ["launch P", "process P", "build D1", "launch D1"]


@pytest.fixture
def on(clean_state, monkeypatch):
    monkeypatch.setenv(ENV, "1")
    monkeypatch.delenv("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", raising=False)
    activate_backport()


@pytest.mark.parametrize("done", [False, True])
def test_tree_prefill_is_processed_before_the_decode_is_built(on, done):
    """Concurrency 1 on a tree: the first tokens leave before the next decode is built, whether
    or not the GPU has finished the prefill when the loop gets there (processing waits for it)."""
    log, running, processed = _serve([_req(256)], done=done)
    assert log[:4] == BEFORE_BUILD
    assert log.count("process P") == 1 and len(processed) == 1
    assert processed[0].processed_before_next_batch is True
    assert running.decodes == 3  # the decodes go on as before


def test_back_port_16_alone_builds_the_decode_first(clean_state, monkeypatch):
    """The control: switched off, back-port 16 processes the prefill before the decode's launch
    but after its build."""
    monkeypatch.delenv(ENV, raising=False)
    activate_backport()
    assert _serve([_req(256)])[0][:4] == AFTER_BUILD


def test_the_loop_does_not_process_it_twice(on):
    """The loop still pops the result later (its own ``pop_and_process``); SGLang's
    ``process_batch_result`` returns at once for a result processed before the next batch."""
    log, _, processed = _serve([_req(64), _req(64)])
    assert [e for e in log if e.startswith("process P")] == ["process P"]
    assert len(processed) == 1


def test_a_request_finished_at_its_prefill_is_not_in_the_next_decode(on):
    """A one-token request is done at its prefill. Processed before the build, it is filtered
    out of the batch before the decode is built (stock spec v1's order); after the build it would
    be a finished row of that decode."""
    log, running, _ = _serve([_req(256, one_token=True), _req(256)])
    assert log[:4] == BEFORE_BUILD
    assert len(running.reqs) == 1 and not running.reqs[0].finished()
    log, running, _ = _serve([_req(256, one_token=True)])
    assert log == ["launch P", "process P"] and running.is_empty()


def test_back_port_16_alone_decodes_the_finished_request_once(clean_state, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    activate_backport()
    log, running, _ = _serve([_req(256, one_token=True)])
    assert log[:4] == AFTER_BUILD


@pytest.mark.parametrize("case", ["chain", "large", "grammar", "chunked", "dp_attention"])
def test_where_it_does_not_apply(on, case):
    """A chain keeps the overlap loop's order (stock's own for chains); a large prefill's GPU
    time covers the build; a grammar, a request being chunked and DP attention keep SGLang's
    handling of them."""
    from sglang_futuremap_patch.backports.prefill_result_first import SMALL_PREFILL_TOKENS

    reqs = [_req(SMALL_PREFILL_TOKENS + 1 if case == "large" else 256,
                 grammar=object() if case == "grammar" else None)]
    log, _, processed = _serve(reqs, topk=1 if case == "chain" else 4, done=True,
                               mlp_sync=case == "dp_attention", chunked=case == "chunked")
    assert "process P" in log and log.index("process P") > log.index("build D1")
    assert not getattr(processed[0], "processed_before_next_batch", False)


def test_small_means_back_port_16s_bound(on):
    from sglang_futuremap_patch.backports.prefill_result_first import SMALL_PREFILL_TOKENS

    assert _serve([_req(SMALL_PREFILL_TOKENS - 1), _req(1)])[0][:4] == BEFORE_BUILD


@pytest.mark.parametrize("setting", [None, "0", "true"])
def test_opt_in(clean_state, monkeypatch, setting):
    """Off unless the switch is exactly 1: not measured on a GPU yet."""
    if setting is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, setting)
    activate_backport()
    assert _serve([_req(256)], done=True)[0][:4] == AFTER_BUILD
