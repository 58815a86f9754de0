"""The CPU self-check behind ``verify`` passes on the patched FutureMap and catches a broken one."""

from __future__ import annotations

import pytest
import torch

import sglang_futuremap_patch as plugin
from sglang_futuremap_patch import selfcheck

from conftest import activate_backport, plugin_only


@pytest.mark.parametrize("algorithm", ["EAGLE3", "EAGLE", "STANDALONE"])
def test_selfcheck_passes_on_the_patched_future_map(clean_state, algorithm):
    activate_backport()
    assert len(selfcheck.run(algorithm)) == 5


@plugin_only
def test_selfcheck_refuses_an_unpatched_future_map(clean_state):
    with pytest.raises(AssertionError, match="not applied"):
        selfcheck.run("EAGLE3")


def test_selfcheck_detects_a_stash_that_writes_the_wrong_rows(clean_state, monkeypatch):
    activate_backport()
    from sglang.srt.managers.overlap_utils import FutureMap

    real_stash = FutureMap.stash

    def off_by_one(self, indices, draft_input):
        real_stash(self, torch.clamp(indices + 1, max=self.req_pool_size - 1), draft_input)

    monkeypatch.setattr(FutureMap, "stash", off_by_one)
    with pytest.raises(AssertionError, match="stashed topk_p"):
        selfcheck.run("EAGLE3")
