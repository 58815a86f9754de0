"""Back-port war-barrier-after-launch: back-port 17's barrier right after each spec-v2 launch.

SGLang's real ``run_batch`` launches a spec-v2 prefill through the (patched)
``forward_spec_v2_overlap`` with the contract worker of the overlap simulation; SGLang's real
``get_next_batch_to_run`` and its PD-disaggregation variants run on the same scheduler and are
stopped at their first statement after the barrier. The schedule stream records what it is
queued behind, and the launch records its forward, its stash and its copy to the host, so the
test sees where the barrier falls: after the launch's last forward-stream work with the switch
on, at the top of ``get_next_batch_to_run`` without it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import activate_backport
from sim_support import contract_scheduler, make_server_args, prefill

ENV = "SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH"


class _Stop(Exception):
    pass


@pytest.fixture
def sched(clean_state, monkeypatch):
    """A spec-v2 overlap scheduler wanting back-port 17's barrier (asked for on this CPU host)
    whose schedule stream, forward, stash and copy to the host log into ``sched.log``."""
    from sglang.srt import server_args as sa

    monkeypatch.setenv("SGLANG_FUTUREMAP_WAR_BARRIER", "1")
    monkeypatch.delenv(ENV, raising=False)
    activate_backport()
    previous = sa._global_server_args
    sa.set_global_server_args_for_scheduler(make_server_args("EAGLE3"))
    s, worker, pools, model_config, truth = contract_scheduler()
    s.log = []
    s.schedule_stream.wait_stream = lambda other: s.log.append(
        "barrier" if other is s.forward_stream else f"waits on {other!r}")
    forward = worker.forward_batch_generation

    def logged_forward(*args, **kwargs):
        result = forward(*args, **kwargs)
        s.log.append("forward")
        copy = result.copy_to_cpu

        def logged_copy(*a, **k):
            copy(*a, **k)
            s.log.append("copy to host")

        result.copy_to_cpu = logged_copy
        return result

    worker.forward_batch_generation = logged_forward
    stash = s.future_map.stash

    def logged_stash(*args, **kwargs):
        stash(*args, **kwargs)
        s.log.append("stash")

    s.future_map.stash = logged_stash
    s.launch_prefill = lambda: s.run_batch(
        prefill(s, pools, model_config, truth, ((len(truth) + 1, 5), (len(truth) + 2, 9))))
    yield s
    sa._global_server_args = previous


def _poll(s):
    """SGLang's ``get_next_batch_to_run``, stopped at its first statement after the barrier."""
    s.enable_fpm = False

    def first_stock_statement():
        raise _Stop

    s._abort_on_waiting_timeout = first_stock_statement
    with pytest.raises(_Stop):
        s.get_next_batch_to_run()


@pytest.mark.parametrize("skip_idle, barriers", [
    (None, ["barrier"]),  # back-port 17's default: none at the idle poll that follows
    ("0", ["barrier", "barrier"]),  # its way back: the barrier again at the idle poll
])
def test_by_default_the_barrier_stays_at_the_top_of_the_poll(sched, monkeypatch, skip_idle, barriers):
    if skip_idle is None:
        monkeypatch.delenv("SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE", raising=False)
    else:
        monkeypatch.setenv("SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE", skip_idle)
    sched.launch_prefill()
    assert sched.log == ["forward", "stash", "copy to host"]  # nothing after the launch
    _poll(sched)
    _poll(sched)  # an idle poll
    assert sched.log == ["forward", "stash", "copy to host"] + barriers


def test_switched_on_each_launch_ends_with_the_barrier_and_a_poll_adds_none(sched, monkeypatch):
    monkeypatch.setenv(ENV, "1")
    sched.launch_prefill()
    # After the launch's last forward-stream work, before run_batch returns (so before the
    # loop processes the previous result).
    assert sched.log == ["forward", "stash", "copy to host", "barrier"]
    _poll(sched)
    _poll(sched)  # idle polls: nothing new ran on the forward stream
    assert sched.log == ["forward", "stash", "copy to host", "barrier"]
    sched.launch_prefill()
    assert sched.log[4:] == ["forward", "stash", "copy to host", "barrier"]
    # Back-port 19 reads back-port 17's decision, made at the first barrier.
    assert sched.__dict__["war_barrier"] is True


def test_the_pd_loops_keep_their_barrier_at_the_top(sched, monkeypatch):
    from sglang.srt.disaggregation.utils import DisaggregationMode

    monkeypatch.setenv(ENV, "1")
    assert sched.war_barrier_after_launch()
    sched.disaggregation_mode = DisaggregationMode.DECODE  # a PD scheduler runs these loops

    def first_decode_statement():
        assert sched.log == ["barrier"]
        raise _Stop

    sched.get_new_prebuilt_batch = first_decode_statement
    with pytest.raises(_Stop):
        sched.get_next_disagg_decode_batch_to_run()
    sched.running_batch = SimpleNamespace(batch_is_full=True)

    def first_prefill_statement():
        assert sched.log == ["barrier", "barrier"]
        raise _Stop

    sched.process_prefill_chunk = first_prefill_statement
    with pytest.raises(_Stop):
        sched.get_next_disagg_prefill_batch_to_run()


@pytest.mark.parametrize("setting, moved", [(None, False), ("1", True), ("0", False), ("yes", False)])
def test_decided_once_per_scheduler(sched, monkeypatch, setting, moved):
    if setting is not None:
        monkeypatch.setenv(ENV, setting)
    assert sched.war_barrier_after_launch() is moved
    monkeypatch.setenv(ENV, "0" if moved else "1")
    assert sched.war_barrier_after_launch() is moved
