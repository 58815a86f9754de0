"""scripts/serve_prefill_batches.py: each request's shared prefill, read back from the timelines a
``--timeline`` serving run leaves in its logs, split into the record's cells."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import serve_prefill_batches as spb  # noqa: E402


def _events(prefills: list[list[str]], t0: float = 0.0, health: int = 1) -> list[dict]:
    """A health check, then per prefill batch its requests received and launched together."""
    ev, t = [], t0
    for i in range(health):
        ev.append({"kind": "recv", "t": t, "rid": f"health{i}"})
        t += 0.01
    for rids in prefills:
        ev += [{"kind": "recv", "t": t, "rid": r} for r in rids]
        ev.append({"kind": "run", "t": t + 0.001, "t1": t + 0.002, "mode": "EXTEND", "extend": True,
                   "bs": len(rids), "rids": rids})
        ev.append({"kind": "run", "t": t + 0.002, "t1": t + 0.003, "mode": "DECODE", "extend": False, "bs": 4})
        t += 0.01
    return ev


def _record(runs: list[tuple[str, int, dict[str, float]]]) -> dict:
    return {"environment": {"config": {"concurrency": [2, 4], "rounds": 2, "min_prompts": 0, "warmup": "wave"}},
            "runs": [{"variant": v, "boot": b, "cells": {c: {"median_ttft_ms": t} for c, t in cells.items()}}
                     for v, b, cells in runs]}


def _tar(path: Path, files: dict[str, object]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, doc in files.items():
            data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_cells_are_split_by_arrival_order_and_the_warm_up_wave_is_left_out(tmp_path: Path) -> None:
    # cell 2: warm-up wave of 2 (one batch of 2), then 4 requests as 1 + 3; cell 4: warm-up 4, then 8 as 8
    stock = _events([["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]])
    patched = _events([["w1", "w2"], ["a", "b"], ["c", "d"], ["x1", "x2", "x3", "x4"],
                       [f"s{i}" for i in range(4)], [f"t{i}" for i in range(4)]], health=3)
    logs = _tar(tmp_path / "logs.tar.gz", {
        "timeline/stock-boot0/timeline-1.json": {"events": stock},
        "timeline/stock-boot0/probe-1.json": {"events": [{"kind": "recv", "t": 0, "rid": "not a timeline"}]},
        "timeline/patched-boot1/timeline-2.json": {"events": patched},
        "timeline/patched-boot1/timeline-3.json.tmp": b'{"events": [',  # a half-written file
    })
    record = _record([("stock", 0, {"2": 10.0, "4": 40.0}), ("patched", 1, {"2": 11.0, "4": 30.0})])
    rows = spb.prefill_batch_sizes(record, spb.timelines(logs))
    got = {(r["variant"], r["concurrency"]): (r["requests"], r["prefill_bs_mean"], r["ttft_p50_ms"]) for r in rows}
    assert got == {("stock", 2): (4, 2.5, 10.0),  # (1 + 3 x 3) / 4
                   ("stock", 4): (8, 8.0, 40.0),
                   ("patched", 2): (4, 2.0, 11.0),  # three health checks before, ignored
                   ("patched", 4): (8, 4.0, 30.0)}


def test_a_cut_off_run_or_an_unreadable_timeline_is_left_out(tmp_path: Path, capsys) -> None:
    short = _events([["w1", "w2"], ["a"]])  # fewer arrivals than the cells need
    logs = _tar(tmp_path / "logs.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": short},
                                           "timeline/patched-boot0/timeline-2.json": b'{"events": [{"kind"'})
    record = _record([("stock", 0, {"2": 10.0, "4": 40.0}), ("patched", 0, {"2": 10.0, "4": 40.0})])
    by_run = spb.timelines(logs)
    assert "patched-boot0" not in by_run and "unreadable" in capsys.readouterr().err
    assert spb.prefill_batch_sizes(record, by_run) == []
    renamed = _record([("stock", 0, {"2": 10.0, "4": 40.0})])
    renamed["environment"]["variant_note"] = "'patched' here ran as patched-overlap"
    full = {"stock-boot0": _events([["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"],
                                    [f"s{i}" for i in range(8)]])}
    assert len(spb.prefill_batch_sizes(_record([("stock", 0, {"2": 10.0, "4": 40.0})]), full)) == 2
    assert spb.prefill_batch_sizes(renamed, full) == [] and "renamed" in capsys.readouterr().err


def test_fit_gives_each_variant_its_residual_at_equal_shared_prefills() -> None:
    # stock on the line 100 + 10 x batch; patched 3 ms above it
    rows = [{"variant": "stock", "concurrency": 48, "prefill_bs_mean": x, "ttft_p50_ms": 100 + 10 * x} for x in (10, 15, 20)]
    rows += [{"variant": "patched", "concurrency": 48, "prefill_bs_mean": x, "ttft_p50_ms": 103 + 10 * x} for x in (12, 18)]
    rows += [{"variant": "stock", "concurrency": 4, "prefill_bs_mean": 2.0, "ttft_p50_ms": 40.0}]  # too few cells: no fit
    (f,) = spb.fit(rows)
    assert f["concurrency"] == 48 and f["cells"] == 5 and f["r"] > 0.99
    assert f["mean_residual_ms"]["patched"] - f["mean_residual_ms"]["stock"] == pytest.approx(3.0, abs=0.15)
    assert f["mean_prefill_bs"] == {"patched": 15.0, "stock": 15.0}
    assert "| 48 | 5 |" in spb.fit_table([f])


def test_main_pools_pairs_and_says_what_is_wrong(tmp_path: Path, capsys) -> None:
    assert spb.main([str(tmp_path / "a.json")]) == 2  # a record without its logs
    assert "pair by pair" in capsys.readouterr().err
    assert spb.main([str(tmp_path / "a.json"), str(tmp_path / "b.tar.gz")]) == 2
    assert "no such file" in capsys.readouterr().err
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("stock", 0, {"2": 10.0, "4": 40.0})])))
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events(
        [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]])}})
    assert spb.main([str(rec), str(logs), str(rec), str(logs)]) == 0
    out = capsys.readouterr().out
    assert out.count("| 2 | stock 0 | 4 | 2.5 | 10.0 |") == 2  # both pairs pooled
    empty = _tar(tmp_path / "e.tar.gz", {"other.txt": b"x"})
    assert spb.main([str(rec), str(empty)]) == 1
