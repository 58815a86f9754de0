"""Back-port pcg-no-mirror (#28633): piecewise CUDA graph no longer forces the host mirror.

The decision, and the three facts it rests on, each checked on SGLang's real functions (the
back-port declares them as guards, so a changed source stops the whole series): a draft
model runner never gets a piecewise runner, and neither piecewise runner accepts a target
verify. The multi-iteration run with piecewise CUDA graph on and no mirror is
``test_overlap_simulation.py::test_spec_v2_overlap_simulation[...-no_mirror_pcg]``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import activate_backport, plugin_only


@pytest.fixture
def patched(clean_state):
    activate_backport()


def _args(tbo=False, pcg_disabled=False):
    return SimpleNamespace(enable_two_batch_overlap=tbo, disable_piecewise_cuda_graph=pcg_disabled)


def _backend(module: str, cls: str):
    import importlib

    return object.__new__(getattr(importlib.import_module(module), cls))


TRITON = "sglang.srt.layers.attention.triton_backend"
FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend"


def test_piecewise_cuda_graph_leaves_the_decision_to_the_backends(patched):
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    triton = (_backend(TRITON, "TritonAttnBackend"), _backend(TRITON, "TritonMultiStepDraftBackend"),
              None)
    flashinfer = (_backend(FLASHINFER, "FlashInferAttnBackend"),)
    for pcg_disabled in (False, True):
        assert decide_needs_cpu_seq_lens(_args(pcg_disabled=pcg_disabled), triton) is False
        assert decide_needs_cpu_seq_lens(_args(pcg_disabled=pcg_disabled), flashinfer) is True
        mixed = triton + flashinfer
        assert decide_needs_cpu_seq_lens(_args(pcg_disabled=pcg_disabled), mixed) is True
    # Two-batch overlap still splits with the mirror.
    assert decide_needs_cpu_seq_lens(_args(tbo=True), triton) is True


def test_draft_model_runners_never_get_a_piecewise_runner(patched):
    from sglang.srt.model_executor.model_runner import ModelRunner

    runner = object.__new__(ModelRunner)
    runner.server_args = SimpleNamespace(disable_piecewise_cuda_graph=False)
    runner.is_draft_worker = True
    runner.init_piecewise_cuda_graphs()
    assert runner.piecewise_cuda_graph_runner is None


@pytest.mark.parametrize("runner_cls", [
    ("sglang.srt.model_executor.piecewise_cuda_graph_runner", "PiecewiseCudaGraphRunner"),
    ("sglang.srt.model_executor.breakable_cuda_graph_runner", "BreakableCudaGraphRunner"),
], ids=["piecewise", "breakable"])
def test_piecewise_runners_refuse_target_verify(patched, runner_cls):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    runner = _backend(*runner_cls)
    runner.layer_model = object()
    runner.capture_hidden_mode = CaptureHiddenMode.NULL
    runner.max_num_tokens = 4096

    def batch(mode):
        return SimpleNamespace(forward_mode=mode, input_embeds=None, replace_embeds=None,
                               capture_hidden_mode=CaptureHiddenMode.NULL,
                               input_ids=[0] * 16, return_logprob=False)

    # The target's prefill (host-built, with its own mirror) may run piecewise ...
    assert runner.can_run(batch(ForwardMode.EXTEND)) is True
    # ... a verify (relayed lengths, possibly without a mirror) never does.
    assert runner.can_run(batch(ForwardMode.TARGET_VERIFY)) is False


@plugin_only
def test_guards_are_checked_not_replaced(clean_state, monkeypatch):
    """A guard is never installed; a guard whose source changed refuses the whole series."""
    import sglang_futuremap_patch as plugin
    from sglang.srt.model_executor.piecewise_cuda_graph_runner import PiecewiseCudaGraphRunner

    original = PiecewiseCudaGraphRunner.__dict__["can_run"]
    report = plugin.apply(mode="safe")
    assert report.verdict.decision == "patch", report.verdict.reason
    assert PiecewiseCudaGraphRunner.__dict__["can_run"] is original
    assert not any("can_run" in p for p in plugin._engine.installed_paths())
    plugin.revert()

    def can_run(self, forward_batch):  # an edited SGLang: verify would now run piecewise
        return True

    monkeypatch.setattr(PiecewiseCudaGraphRunner, "can_run", can_run)
    report = plugin.apply(mode="safe")
    assert report.applied == []
    assert report.verdict.decision == "mismatch"
    assert "PiecewiseCudaGraphRunner.can_run" in report.verdict.reason
