"""Back-port eager-relay-lens: an eager spec-v2 batch reads its host lengths from the relay.

SGLang's real ``FutureMap`` (as patched) on CPU, where the private-stream copies are plain
copies and the mirror's copy is a ``Tensor.cpu`` (the host-sync probe counts it); the whole
scheduling loop with eager batches after prefills and after each other is
``test_overlap_simulation.py::test_spec_v2_overlap_simulation[...-fa3_pcg_eager]``. What
needs CUDA (the private stream, the host's wait for the copy's event) is covered by the GPU
runs only.
"""

from __future__ import annotations

import pytest
import torch

from conftest import relay_forward as _forward

EAGER_ABOVE = 2  # batches of 3 or more requests run eagerly


@pytest.fixture
def fmap(spec_future_map):
    m = spec_future_map(needs_cpu_seq_lens=False)
    m.eager_mirror_above_bs = EAGER_ABOVE
    return m


def test_the_eager_decode_after_a_prefill_reads_no_lengths_back(fmap, probe):
    assert _forward(fmap, probe, "EXTEND", [1, 2, 3], [5, 7, 4], lens=[5, 7, 4])[0] == [5, 7, 4]
    # All three from the prefill's host lengths.
    assert _forward(fmap, probe, "DECODE", [1, 2, 3], [8, 9, 6]) == ([5, 7, 4], False)
    # A prefill, then an eager decode of the running requests and the new one: rows 1-3 from
    # the copy taken after the decode's publish, row 4 from the prefill's host lengths; the
    # mirror would have copied the buffer after the prefill's publish (waiting for it).
    _forward(fmap, probe, "EXTEND", [4], [3], lens=[3])
    host, copied = _forward(fmap, probe, "DECODE", [3, 1, 4, 2], [7, 10, 5, 12])
    assert host == [6, 8, 3, 9] and not copied
    # Eager decodes in a row: each keeps its own copy for the next.
    assert _forward(fmap, probe, "DECODE", [1, 2, 3, 4], [11, 13, 8, 6])[0] == [10, 12, 7, 5]
    assert _forward(fmap, probe, "DECODE", [4, 3, 2], [7, 9, 14]) == ([6, 8, 13], False)


def test_an_eager_decode_after_a_graph_decode_reads_its_copy(fmap, probe):
    _forward(fmap, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    assert _forward(fmap, probe, "DECODE", [1, 2], [8, 9]) == (None, False)  # a graph replays it
    _forward(fmap, probe, "EXTEND", [3], [4], lens=[4])
    assert _forward(fmap, probe, "DECODE", [1, 2, 3], [10, 11, 6]) == ([8, 9, 4], False)


def test_lengths_the_relay_does_not_hold_come_from_the_mirror(fmap, probe):
    _forward(fmap, probe, "EXTEND", [1, 2, 3], [5, 7, 4], lens=[5, 7, 4])
    _forward(fmap, probe, "DECODE", [1, 2, 3], [8, 9, 6])
    # A PD-decode bootstrap publishes outside a forward: the mirror copies, exact lengths.
    fmap.publish(torch.tensor([4]), torch.tensor([30]))
    host, copied = _forward(fmap, probe, "DECODE", [1, 2, 3, 4], [9, 10, 7, 31])
    assert host == [8, 9, 6, 30] and copied
    # That eager decode kept its own copy: from the next decode on the relay serves again.
    _forward(fmap, probe, "EXTEND", [5], [2], lens=[2])
    host, copied = _forward(fmap, probe, "DECODE", [1, 2, 3, 4, 5], [10, 11, 8, 32, 3])
    assert host == [9, 10, 7, 31, 2] and not copied


def test_rows_no_copy_covers_are_not_taken_from_a_stale_copy(fmap, probe):
    _forward(fmap, probe, "EXTEND", [1, 2], [5, 7], lens=[5, 7])
    _forward(fmap, probe, "DECODE", [1, 2], [8, 9])  # copy 0 holds 8, 9
    # A graph-size decode whose draft extend asked nothing: rows 1, 2 are no longer covered.
    assert _forward(fmap, probe, "DECODE", [1, 2], [10, 11], asks=False) == (None, False)
    _forward(fmap, probe, "EXTEND", [3], [4], lens=[4])
    host, copied = _forward(fmap, probe, "DECODE", [1, 2, 3], [12, 13, 5])
    assert host == [10, 11, 4] and copied  # the mirror, not the stale 8, 9


def test_with_the_mirror_on_every_batch_the_relay_is_not_asked(spec_future_map, probe):
    mirrored = spec_future_map(needs_cpu_seq_lens=True)
    mirrored.publish(torch.tensor([1, 2, 3]), torch.tensor([5, 7, 4]))
    assert _forward(mirrored, probe, "DECODE", [1, 2, 3], [6, 8, 5]) == ([5, 7, 4], True)
    assert not hasattr(mirrored, "dx_copies")
