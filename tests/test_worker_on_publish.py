"""Back-port 1 (#25879, #25962): the EAGLE v2 workers publish ``seq_lens`` through ``on_publish``.

SGLang's own ``forward_batch_generation`` of ``EAGLEWorkerV2`` and ``MultiLayerEagleWorkerV2``
(STANDALONE inherits the first) runs here with stand-ins for the models: the callback gets the
prefill's lengths right after the target forward, and the accepted lengths right after verify,
before the draft extend; without a callback the workers do exactly what they did before. The
scheduler's side (who passes the callback, its safety net) is
``test_overlap_simulation.py``.
"""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

from conftest import activate_backport

WORKERS = {
    "eagle": ("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2"),
    "multi_layer": ("sglang.srt.speculative.multi_layer_eagle_worker_v2", "MultiLayerEagleWorkerV2"),
}


@pytest.fixture(scope="module")
def patched(sglang_loaded) -> Iterator[None]:
    import sglang_futuremap_patch as plugin

    activate_backport()
    yield
    plugin.revert()


@pytest.fixture
def worker(patched, request, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any]]:
    """The worker class's own ``forward_batch_generation`` on a worker whose target, draft and
    verify are stand-ins that record the order they run in."""
    import importlib

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    module_name, class_name = WORKERS[request.param]
    module = importlib.import_module(module_name)
    for name in ("speculative_moe_backend_context", "speculative_moe_a2a_backend_context"):
        if hasattr(module, name):  # global MoE switches: nothing to switch here
            monkeypatch.setattr(module, name, nullcontext)
    events: list[Any] = []

    def target_forward(model_worker_batch: Any) -> Any:
        events.append("target")
        return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=None, mm_input_embeds=None),
                               next_token_ids=None)

    def draft_extend_for_prefill(*args: Any) -> str:
        events.append("draft prefill")
        return "next draft input"

    def draft(model_worker_batch: Any) -> Any:
        events.append("draft")
        return SimpleNamespace(is_verify_input=lambda: True)

    def verify(model_worker_batch: Any) -> Any:
        events.append("verify")
        return SimpleNamespace(next_draft_input=SimpleNamespace(new_seq_lens=torch.tensor([9, 14])))

    w = object.__new__(getattr(module, class_name))
    w._target_worker = SimpleNamespace(forward_batch_generation=target_forward)
    w._draft_worker = SimpleNamespace(
        draft_tp_context=lambda group: nullcontext(), draft_runner=SimpleNamespace(tp_group=None),
        chain_mtp_hidden_states=False, _draft_extend_for_prefill=draft_extend_for_prefill,
        draft=draft, _draft_extend_for_decode=lambda mwb, out: events.append("draft extend"))
    w.speculative_algorithm = SpeculativeAlgorithm.from_string("EAGLE")
    w.plan_stream = None
    w.verify = verify
    return w, events


def _batch(mode: str) -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        forward_mode=ForwardMode.EXTEND if mode == "prefill" else ForwardMode.DECODE,
        is_extend_in_batch=False, seq_lens=torch.tensor([7, 12]), capture_hidden_mode=None,
        spec_info=None if mode == "prefill" else SimpleNamespace())


@pytest.mark.parametrize("worker", sorted(WORKERS), indirect=True)
def test_the_workers_declare_that_they_take_on_publish(worker) -> None:
    w, _ = worker
    assert type(w).accepts_on_publish is True


@pytest.mark.parametrize("worker", sorted(WORKERS), indirect=True)
def test_a_prefill_publishes_its_lengths_after_the_target_forward(worker) -> None:
    w, events = worker
    mwb = _batch("prefill")
    out = w.forward_batch_generation(mwb, on_publish=lambda lens: events.append(("publish", lens)))
    assert events == ["target", ("publish", mwb.seq_lens), "draft prefill"]
    assert out.next_draft_input == "next draft input"


@pytest.mark.parametrize("worker", sorted(WORKERS), indirect=True)
def test_a_decode_publishes_the_accepted_lengths_before_the_draft_extend(worker) -> None:
    w, events = worker
    out = w.forward_batch_generation(_batch("decode"),
                                     on_publish=lambda lens: events.append(("publish", lens)))
    assert events == ["draft", "verify", ("publish", out.next_draft_input.new_seq_lens),
                      "draft extend"]


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("worker", sorted(WORKERS), indirect=True)
def test_without_a_callback_the_worker_runs_as_before(worker, mode: str) -> None:
    w, events = worker
    w.forward_batch_generation(_batch(mode))
    assert events == (["target", "draft prefill"] if mode == "prefill"
                      else ["draft", "verify", "draft extend"])
