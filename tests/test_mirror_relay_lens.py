"""Back-port mirror-relay-lens (on for trees, a switch for chains): a decode on a mirrored
backend reads its host lengths from the relay.

SGLang's real ``FutureMap`` (as patched) on CPU, built as a backend that keeps the host mirror
builds it (``needs_cpu_seq_lens=True``: FA3 with a tree, FlashInfer). The private-stream copies
are plain copies, and the mirror's copy is a ``Tensor.cpu`` (the host-sync probe counts it).
The whole scheduling loop with the switch on is
``test_overlap_simulation.py::test_spec_v2_overlap_simulation[...-mirror_relay]``. What needs
CUDA (the private stream, the host's wait for the copy's event) is covered by GPU runs only.
"""

from __future__ import annotations

import pytest
import torch

from conftest import relay_forward as _forward


@pytest.fixture
def mirrored(spec_future_map, monkeypatch):
    """A mirrored backend's map with the switch on."""
    monkeypatch.setenv("SGLANG_FUTUREMAP_MIRROR_RELAY", "1")
    return spec_future_map(needs_cpu_seq_lens=True)


def test_the_decode_after_a_prefill_reads_no_lengths_back(mirrored, probe):
    _forward(mirrored, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    # The first decode: both lengths are the prefill's host values.
    assert _forward(mirrored, probe, "DECODE", [1, 2], [8, 9]) == ([5, 7], False)
    # A prefill joins: rows 1-2 come from the copy kept after the decode's publish, row 3 from
    # the prefill's host lengths. The mirror copied the buffer after the *prefill's* publish,
    # so the host waited for the prefill's target forward.
    _forward(mirrored, probe, "EXTEND", [3], [4], lens=[4])
    assert _forward(mirrored, probe, "DECODE", [2, 3, 1], [11, 6, 10]) == ([9, 4, 8], False)
    # Decodes in a row: each one reads the copy the one before it kept.
    assert _forward(mirrored, probe, "DECODE", [1, 2, 3], [12, 13, 7]) == ([10, 11, 6], False)
    assert _forward(mirrored, probe, "DECODE", [3, 1], [9, 14]) == ([7, 12], False)


def test_lengths_the_relay_does_not_hold_come_from_the_mirror(mirrored, probe):
    _forward(mirrored, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    _forward(mirrored, probe, "DECODE", [1, 2], [8, 9])
    # A PD-decode bootstrap publishes outside a forward: the mirror copies, exact lengths.
    mirrored.publish(torch.tensor([4]), torch.tensor([30]))
    assert _forward(mirrored, probe, "DECODE", [1, 2, 4], [9, 10, 31]) == ([8, 9, 30], True)
    # That decode kept its copy: the relay serves again from the next decode on.
    _forward(mirrored, probe, "EXTEND", [5], [2], lens=[2])
    assert _forward(mirrored, probe, "DECODE", [1, 2, 4, 5], [10, 11, 32, 3]) == (
        [9, 10, 31, 2], False)


@pytest.mark.parametrize("switch", [None, "0", "yes"])
def test_without_the_switch_the_mirror_copies_for_every_decode(spec_future_map, probe,
                                                              monkeypatch, switch):
    """A chain on a mirrored backend (FlashInfer), unset or anything but 1: the mirror path as
    before, and no relay bookkeeping."""
    if switch is None:
        monkeypatch.delenv("SGLANG_FUTUREMAP_MIRROR_RELAY", raising=False)
    else:
        monkeypatch.setenv("SGLANG_FUTUREMAP_MIRROR_RELAY", switch)
    m = spec_future_map(needs_cpu_seq_lens=True)
    _forward(m, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    assert _forward(m, probe, "DECODE", [1, 2], [8, 9]) == ([5, 7], True)
    _forward(m, probe, "EXTEND", [3], [4], lens=[4])
    assert _forward(m, probe, "DECODE", [1, 2, 3], [9, 10, 5]) == ([8, 9, 4], True)
    assert not hasattr(m, "dx_copies")


@pytest.mark.parametrize("switch, relayed", [(None, True), ("0", False), ("1", True)])
def test_unset_a_tree_reads_its_lengths_from_the_relay(spec_future_map, probe, monkeypatch,
                                                     switch, relayed):
    """With an EAGLE tree (topk > 1: FA3 keeps the mirror) the relay is on unless switched off."""
    from sglang.srt.server_args import get_global_server_args

    if switch is None:
        monkeypatch.delenv("SGLANG_FUTUREMAP_MIRROR_RELAY", raising=False)
    else:
        monkeypatch.setenv("SGLANG_FUTUREMAP_MIRROR_RELAY", switch)
    m = spec_future_map(needs_cpu_seq_lens=True)
    get_global_server_args().speculative_eagle_topk = 4
    _forward(m, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    _forward(m, probe, "DECODE", [1, 2], [8, 9])
    _forward(m, probe, "EXTEND", [3], [4], lens=[4])
    assert _forward(m, probe, "DECODE", [1, 2, 3], [9, 10, 5]) == ([8, 9, 4], not relayed)


def test_without_the_mirror_the_switch_changes_nothing(spec_future_map, probe, monkeypatch):
    """FA3 with a chain (no mirror): back-port 14's relay as before; a graph-size decode gets no
    host lengths, whatever the switch says."""
    monkeypatch.setenv("SGLANG_FUTUREMAP_MIRROR_RELAY", "1")
    m = spec_future_map(needs_cpu_seq_lens=False)
    _forward(m, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    assert _forward(m, probe, "DECODE", [1, 2], [8, 9]) == (None, False)
    assert _forward(m, probe, "DECODE", [1, 2], [10, 11], asks=False) == (None, False)
    assert m.dx_copy_of[[1, 2]].tolist() == [-1, -1]  # no copy kept for a decode that asked nothing


def test_the_check_passes_the_relay_and_catches_a_stale_length(mirrored, probe, monkeypatch):
    """``SGLANG_FUTUREMAP_RELAY_CHECK=1`` (test runs on a GPU): every relayed length is compared
    with the published device lengths; a relay that would hand a decode a stale length raises
    before the launch instead of sizing the backend's buffers with it."""
    monkeypatch.setenv("SGLANG_FUTUREMAP_RELAY_CHECK", "1")
    # (The check's own read-back is a device copy: only the lengths are compared here.)
    _forward(mirrored, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    assert _forward(mirrored, probe, "DECODE", [1, 2], [8, 9])[0] == [5, 7]
    _forward(mirrored, probe, "EXTEND", [3], [4], lens=[4])
    assert _forward(mirrored, probe, "DECODE", [2, 3, 1], [11, 6, 10])[0] == [9, 4, 8]
    # The relay's row for slot 3 goes stale (as if a publish had not been seen).
    mirrored.dx_copies[mirrored.dx_copy_id % 2][3] = 5
    with pytest.raises(RuntimeError, match=r"relayed host lengths \[10, 11, 5\] differ from the "
                                           r"published \[10, 11, 6\]"):
        _forward(mirrored, probe, "DECODE", [1, 2, 3], [12, 13, 7])


def test_without_the_check_a_stale_relay_is_not_read_back(mirrored, probe, monkeypatch):
    """Unset, the relayed lengths are used as they are (no device read): the check costs
    nothing in serving."""
    monkeypatch.delenv("SGLANG_FUTUREMAP_RELAY_CHECK", raising=False)
    _forward(mirrored, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    _forward(mirrored, probe, "DECODE", [1, 2], [8, 9])
    mirrored.dx_copies[mirrored.dx_copy_id % 2][2] = 3
    assert _forward(mirrored, probe, "DECODE", [1, 2], [10, 11]) == ([8, 3], False)
