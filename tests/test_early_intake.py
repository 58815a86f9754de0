"""Back-port early-intake: requests that arrive while a finished request's lookahead decode runs
are launched before the loop waits on that lookahead's result.

SGLang's real ``Scheduler.event_loop_overlap`` and ``get_next_batch_to_run`` run here for a few
iterations on a scheduler object whose collaborators only record what they are asked.
Receiving requests answers from a script, one answer per poll; SGLang's prefill builder turns
the requests received so far into a prefill, its decode updater gives the next scripted decode;
launching and processing results are logged. The
one thing stood in for is the GPU event a result carries: ``copy_done.query()`` turns true after
as many queries as the test says, and waiting on it is a defect here.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from conftest import activate_backport, loop_scheduler


class _StopLoop(Exception):
    pass


class _Event:
    """``copy_done`` of a result: completes after ``polls`` queries (0: done at once)."""

    def __init__(self, polls: int):
        self.polls = polls
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.queries > self.polls

    def synchronize(self) -> None:  # pragma: no cover - a wait would be a defect
        raise AssertionError("the loop waited on a result event")


def _req(finished: bool):
    return SimpleNamespace(finished=lambda: finished, is_retracted=False)


def _batch(name: str, mode: str, reqs: list, spec_v2: bool = True):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fm = ForwardMode.EXTEND if mode == "prefill" else ForwardMode.DECODE
    b = SimpleNamespace(name=name, forward_mode=fm, is_spec_v2=spec_v2, has_grammar=False,
                        is_extend_in_batch=fm.is_extend(), extend_num_tokens=256 if fm.is_extend() else None,
                        reqs=reqs, is_prefill_only=False, chunked_req=None, is_empty=lambda: not reqs,
                        batch_size=lambda: len(reqs), filter_batch=lambda **kw: None)
    b.copy = lambda: b
    return b


def _decode(name: str, finished: bool, spec_v2: bool = True):
    return _batch(name, "decode", [_req(finished)], spec_v2)


#: What ``update_running_batch`` leaves once no request runs.
_NOTHING_RUNS = _batch("-", "decode", [])


def _run_loop(decodes, polls, arrivals, **attrs):
    """Drive the real overlap loop and SGLang's real ``get_next_batch_to_run`` (as back-port 17
    and this back-port leave it when installed). ``decodes``: the decode batch SGLang's
    ``update_running_batch`` gives each time it is asked, in order (then no running request);
    ``polls[name]``: how many queries that batch's ``copy_done`` needs to complete;
    ``arrivals``: what each ``recv_requests`` call returns, in order (the loop stops once they
    run out). Waiting requests become one prefill (``get_new_batch_prefill``). Returns the log of
    receipts, schedule-stream barriers, launches and result processing, and the scheduler."""
    sched = loop_scheduler()
    log: list[str] = []
    todo, answers, waiting = deque(decodes), deque(arrivals), []

    def recv_requests():
        if not answers:
            raise _StopLoop
        return answers.popleft()

    def process_input_requests(reqs):
        for rid in reqs:
            if rid == "pause":
                sched._engine_paused = True
            else:
                log.append(f"receive {rid}")
                waiting.append(rid)

    def get_new_batch_prefill():
        if not waiting:
            return None
        batch = _batch("P(" + ",".join(waiting) + ")", "prefill", [_req(False) for _ in waiting])
        waiting.clear()
        return batch

    def run_batch(batch):
        sched.forward_ct += 1  # SGLang's run_batch counts its launches first
        log.append(f"launch {batch.name}")
        return SimpleNamespace(copy_done=_Event(polls.get(batch.name, 0)))

    sched.recv_requests = recv_requests
    sched.process_input_requests = process_input_requests
    sched.get_new_batch_prefill = get_new_batch_prefill
    sched.update_running_batch = lambda running: todo.popleft() if todo else _NOTHING_RUNS
    sched.running_batch = _batch("A", "decode", [_req(False)]) if decodes else _NOTHING_RUNS  # request A runs
    sched.run_batch = run_batch
    sched.process_batch_result = lambda batch, result: log.append(f"process {batch.name}")
    sched.schedule_stream = SimpleNamespace(wait_stream=lambda stream: log.append(f"barrier behind {stream}"))
    for name, value in attrs.items():
        setattr(sched, name, value)
    with pytest.raises(_StopLoop):
        sched.event_loop_overlap()
    return log, sched


def _order(log: list[str]) -> list[str]:
    """The log without the schedule-stream barriers (one per batch asked for)."""
    return [line for line in log if not line.startswith("barrier")]


@pytest.fixture
def patched(clean_state, monkeypatch):
    """The back-port installed (on by default: the switch unset), with back-port 17's barrier in
    effect on this CPU host (on by default on CUDA only)."""
    monkeypatch.delenv("SGLANG_FUTUREMAP_EARLY_INTAKE", raising=False)
    monkeypatch.setenv("SGLANG_FUTUREMAP_WAR_BARRIER", "1")
    activate_backport()


def _lookahead_case():
    """Request A runs in D1; D2 is launched before D1's result (which finishes A) is processed:
    D2 is A's lookahead, still on the GPU for 3 queries. B reaches the scheduler's socket on
    the loop's fourth poll."""
    return [_decode("D1", finished=True), _decode("D2", finished=True)], {"D2": 3}, [[], [], [], ["B"], []]


STOCK_ORDER = ["launch D1", "launch D2", "process D1", "process D2", "receive B", "launch P(B)", "process P(B)"]
EARLY_INTAKE = ["launch D1", "launch D2", "process D1", "receive B", "launch P(B)", "process D2", "process P(B)"]


def test_stock_loop_waits_on_the_lookahead_before_it_polls_again(clean_state):
    """The control: unpatched, the iteration with nothing to launch processes the lookahead's
    result (SGLang's ``process_batch_result_decode`` waits for it there) and takes B in only
    at the next iteration."""
    decodes, polls, arrivals = _lookahead_case()
    assert _order(_run_loop(decodes, polls, arrivals)[0]) == STOCK_ORDER


@pytest.mark.parametrize("skip_idle", [None, "0"])
def test_a_request_arriving_during_the_lookahead_is_launched_before_its_result(patched, monkeypatch, skip_idle):
    if skip_idle is None:
        monkeypatch.delenv("SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE", raising=False)
    else:
        monkeypatch.setenv("SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE", skip_idle)
    decodes, polls, arrivals = _lookahead_case()
    log, sched = _run_loop(decodes, polls, arrivals)
    assert _order(log) == EARLY_INTAKE
    # B's prefill was prepared behind the forward in flight (back-port 17's barrier): a pool
    # slot A freed is not written while D2 reads it.
    launch_d2, launch_b = log.index("launch D2"), log.index("launch P(B)")
    assert "barrier behind forward" in log[launch_d2:launch_b]
    if skip_idle == "0":  # asked for again when the intake builds it
        assert log[log.index("receive B") + 1] == "barrier behind forward"
    else:  # the one queued after D2's launch still holds: nothing ran on the forward stream since
        assert log[launch_d2:launch_b].count("barrier behind forward") == 1
    # The loop went on as after any prefill: the next iteration found nothing to launch.
    assert sched.last_batch is None and sched.cur_batch is None and not sched.taking_in


def test_the_lookahead_ending_first_leaves_the_stock_order(patched):
    """Nothing arrives before the lookahead's event completes: the loop polled, found nothing
    and goes on as stock (processes it, then takes B in at the next iteration)."""
    decodes, polls, _ = _lookahead_case()
    assert _order(_run_loop(decodes, polls, [[], [], [], [], [], ["B"], []])[0]) == STOCK_ORDER


def test_a_pause_while_polling_stops_the_intake(patched):
    decodes, polls, _ = _lookahead_case()
    log, sched = _run_loop(decodes, polls, [[], [], [], ["pause"]])
    assert _order(log) == ["launch D1", "launch D2", "process D1", "process D2"] and sched._engine_paused


def test_a_lookahead_with_a_running_request_is_not_waited_around(patched):
    """The oldest result holds a request that still runs: the loop keeps its own order (such a
    result is needed before that request's next decode)."""
    decodes = [_decode("D1", finished=True), _decode("D2", finished=False)]
    assert _order(_run_loop(decodes, {"D2": 3}, [[], [], [], ["B"], []])[0]) == STOCK_ORDER


@pytest.mark.parametrize("case", ["env_off", "tp2", "pp2", "dp_attention", "mlp_sync", "cp2",
                                  "recv_skipper", "input_blocker", "no_war_barrier", "not_spec_v2"])
def test_stock_order_where_it_does_not_apply(patched, monkeypatch, case):
    """Switched off, on ranks that must poll in step, with SGLang's receive skipper or
    input blocker, without back-port 17's barrier, or for non-speculative batches the loop keeps
    its own order."""
    if case == "env_off":
        monkeypatch.setenv("SGLANG_FUTUREMAP_EARLY_INTAKE", "0")
    if case == "no_war_barrier":
        monkeypatch.setenv("SGLANG_FUTUREMAP_WAR_BARRIER", "0")
    attrs = {"tp2": {"tp_size": 2}, "pp2": {"pp_size": 2},
             "dp_attention": {"server_args": SimpleNamespace(enable_dp_attention=True, speculative_skip_dp_mlp_sync=False)},
             "mlp_sync": {"require_mlp_sync": True}, "cp2": {"attn_cp_size": 2},
             "recv_skipper": {"recv_skipper": object()}, "input_blocker": {"input_blocker": object()}}.get(case, {})
    decodes, polls, arrivals = _lookahead_case()
    if case == "not_spec_v2":
        decodes = [_decode("D1", finished=True, spec_v2=False), _decode("D2", finished=True, spec_v2=False)]
    assert _order(_run_loop(decodes, polls, arrivals, **attrs)[0]) == STOCK_ORDER
