"""CPU tests of scripts/gpu/cpu_siblings_probe.py: how measured slowdowns become physical cores
(or a reading that is not a fixed pairing), and one real run on this host."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))

import cpu_siblings_probe as probe  # noqa: E402


def matrix(cpus: list[int], slow: dict[tuple[int, int], float]) -> dict[int, dict[int, float]]:
    """Every ratio 1.0 except ``slow[(c, o)]``: the work on c with a spinner on o."""
    return {c: {o: slow.get((c, o), 1.0) for o in cpus if o != c} for c in cpus}


def test_mutual_slowdowns_group_cpus_into_cores() -> None:
    cpus = [0, 1, 2, 3, 4]
    ratio = matrix(cpus, {(0, 2): 1.7, (2, 0): 1.6, (1, 3): 1.9, (3, 1): 1.8})
    cores, problems = probe.group_cores(cpus, ratio)
    assert problems == []
    assert cores == [[0, 2], [1, 3], [4]]


def test_no_slowdown_is_one_core_per_cpu() -> None:
    cpus = [0, 1, 2]
    assert probe.group_cores(cpus, matrix(cpus, {})) == ([[0], [1], [2]], [])


def test_a_pair_slow_one_way_only_is_not_a_fixed_pairing() -> None:
    # What the 2 x H200 machine read: vCPUs the hypervisor moves between host threads.
    cpus = [0, 1, 2]
    cores, problems = probe.group_cores(cpus, matrix(cpus, {(0, 2): 1.85, (2, 0): 1.0}))
    assert cores is None
    assert problems == ["CPUs 0 and 2 read x1.850 / x1.000: a sibling one way only"]


def test_a_ratio_between_clear_and_threshold_is_not_decided() -> None:
    cpus = [0, 1]
    cores, problems = probe.group_cores(cpus, matrix(cpus, {(1, 0): 1.12}))
    assert cores is None
    assert problems == ["CPU 1 with a spinner on CPU 0 reads x1.120, between x1.08 and x1.15"]
    # The same reading under a lower threshold is a one-way sibling instead.
    cores, problems = probe.group_cores(cpus, matrix(cpus, {(1, 0): 1.12}), threshold=1.10, clear=1.05)
    assert cores is None and problems == ["CPUs 0 and 1 read x1.000 / x1.120: a sibling one way only"]


def test_main_measures_every_pair_on_this_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs Linux and two CPUs")
    before = os.sched_getaffinity(0)
    out = tmp_path / "siblings.json"
    rc = probe.main(["--samples", "10", "--out", str(out)])
    assert os.sched_getaffinity(0) == before  # the probe gives the process its CPUs back
    doc = json.loads(out.read_text())
    cpus = doc["cpus"]
    assert cpus == sorted(before)
    assert set(doc["ratio"]) == {str(c) for c in cpus}
    assert all(set(doc["ratio"][str(c)]) == {str(o) for o in cpus if o != c} for c in cpus)
    assert all(v > 0 for row in doc["ratio"].values() for v in row.values())
    assert all(doc["base_us"][str(c)] > 0 for c in cpus)
    # The exit code says which reading it was, and the JSON agrees with it.
    if rc == 0:
        assert sorted(c for core in doc["cores"] for c in core) == cpus and doc["problems"] == []
        assert "physical cores measured" in capsys.readouterr().out
    else:
        assert rc == 1 and doc["cores"] is None and doc["problems"]
        assert "not a fixed pairing" in capsys.readouterr().out


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe.main(["--clear", "1.2", "--threshold", "1.1"]) == 2
    assert "--clear < --threshold" in capsys.readouterr().err
    assert probe.main(["--samples", "0"]) == 2
    assert "--samples must be at least 1" in capsys.readouterr().err
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        # A missing directory is refused before the measurement; a path that cannot be written
        # (here a directory) after it.
        rc = probe.main(["--samples", "2", "--out", str(tmp_path / "no-such-dir" / "x.json")])
        assert rc == 2 and "no such directory" in capsys.readouterr().err
        rc = probe.main(["--samples", "2", "--out", str(tmp_path)])
        assert rc == 2 and "cannot write" in capsys.readouterr().err


def test_summarize_sets_stored_runs_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--summarize``: per stored run the work alone, the slowed pairs (both ways, one way),
    those above x1.5 and the largest ratio; then the slowed pairs each two runs share."""
    def run(name: str, slow: dict[tuple[int, int], float]) -> Path:
        cpus = [0, 1, 2]
        doc = {"threshold": 1.15, "base_us": {"0": 100.0, "1": 120.0, "2": 200.0},
               "ratio": {str(c): {str(o): v for o, v in row.items()} for c, row in matrix(cpus, slow).items()}}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        return path

    a = run("a", {(0, 1): 1.6, (1, 0): 1.7, (2, 0): 1.2})
    b = run("b", {(0, 1): 1.3, (1, 2): 2.0})
    assert probe.main(["--summarize", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| a | 120.0 (100.0 - 200.0) | 3 | 2 | 1 | 1 | x1.700 |"
    assert lines[3] == "| b | 120.0 (100.0 - 200.0) | 2 | 1 | 0 | 2 | x2.000 |"
    assert lines[-1] == "Slowed pairs two runs share: a / b: 1."
    (tmp_path / "bad.json").write_text("{}")
    assert probe.main(["--summarize", str(tmp_path / "bad.json")]) == 2
    assert "not a probe run" in capsys.readouterr().err
