"""scripts/serve_prefill_batches.py: each request's shared prefill, read back from the timelines a
``--timeline`` serving run leaves in its logs, split into the record's cells."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Callable

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


# ----------------------------------------------------------------------------- --launches

def _ms(t: float) -> float:
    return t / 1e3


def _run(t: float, t1: float, mode: str, bs: int) -> dict:
    return {"kind": "run", "t": _ms(t), "t1": _ms(t1), "mode": mode, "extend": mode == "EXTEND", "bs": bs}


def _proc(t: float, t1: float, mode: str, bs: int) -> dict:
    return {"kind": "proc", "t": _ms(t), "t1": _ms(t1), "mode": mode, "extend": mode == "EXTEND", "bs": bs}


def _sync(t: float, t1: float, where: str) -> dict:
    return {"kind": "sync", "t": _ms(t), "t1": _ms(t1), "what": "synchronize", "where": where}


def _sample(t: float, leaf: str) -> dict:
    return {"kind": "sample", "t": _ms(t), "dt": 1e-3, "phase": "next", "stack": [leaf, "jit.py:1 run"]}


def _overlap_loop() -> list[dict]:
    """One server, times in ms, in the overlap loop's order: launch i, then process result i - 1."""
    D, P = "DECODE", "EXTEND"
    ev = [
        _run(2, 8, D, 4), _proc(8.5, 9, P, 1),  # a result of a launch before the probe: skipped
        _run(10, 16, D, 4), _sync(11, 13, "relay"), _sync(14, 14.5, "item"), _proc(16.5, 17, D, 4), _sync(17, 20, "verify"),  # steady
        _run(21, 25, D, 4), _proc(25, 26, D, 4),  # steady, no wait
        _run(30, 55, P, 5), _proc(55, 56, D, 4),
        _run(58, 64, D, 4), _sample(60, "compiler.py:9 launch_metadata"),  # first decode: every launch runs that
        _proc(65, 70, P, 5), _sync(65, 68, "copy_done"),  # the prefill's result waited: its first decode was hidden
        _run(72, 92, P, 2), _proc(92, 93, D, 4),
        _run(94, 124, P, 20), _proc(124, 125, P, 2),  # a prefill right after a prefill
        _run(126, 131, D, 4), _sync(127, 128, "x"),  # first decode, 1 ms wait inside
        _proc(132, 133, P, 20),  # no wait: that first decode stood in the way
        _run(140, 160, P, 9), _proc(160, 161, D, 4),
        _run(162, 200, D, 4), _sample(170, "compiler.py:3 make_llir"),  # Triton compiled: left out
        _proc(201, 202, P, 9),
        _run(300, 320, P, 3),  # after the window
    ]
    return sorted(ev, key=lambda e: e["t"])


def test_launch_parts_split_steady_and_first_decodes_prefills_and_the_way_to_the_result() -> None:
    parts = spb.launch_parts(_overlap_loop(), _ms(5), _ms(250))
    ms = lambda x: round(x * 1e3, 6)  # noqa: E731
    assert [(ms(x["launch"]), {k: ms(v) for k, v in x["waits"].items()}, {k: ms(v) for k, v in x["between"].items()},
             ms(x["period"])) for x in parts["steady"]] == [
        (6, {"synchronize @ relay": 2, "synchronize @ item": 0.5}, {"synchronize @ verify": 3}, 11), (4, {}, {}, 9)]
    assert [(ms(x["launch"]), {k: ms(v) for k, v in x["waits"].items()}, x["exposed"]) for x in parts["first"]] == [
        (6, {}, False), (5, {"synchronize @ x": 1}, True)]
    assert parts["compiled"] == {"first": 1, "prefill": 0}
    assert [(bs, ms(s), c) for bs, s, c in parts["prefill"]] == [(5, 25, None), (2, 20, None), (20, 30, None), (9, 20, None)]
    # the prefill of 9 is left out: the launch before its result compiled
    assert [(ms(x["gap"]), ms(x["launches"]), x["next_prefill"]) for x in parts["to_result"]] == [
        (10, 6, False), (32, 30, True), (8, 5, False)]


def test_summarise_pools_servers_into_medians() -> None:
    s = spb.summarise([spb.launch_parts(_overlap_loop(), _ms(5), _ms(250))])
    assert s["steady"] == {"launches": 2, "launch_ms": 5.0, "cpu_ms": None, "waits_ms": 1.25, "waits_top": "synchronize @ relay",
                           "waits_top_ms_per_launch": 1.0, "net_ms": 3.75, "between_ms": 1.5,
                           "between_top": "synchronize @ verify", "between_top_ms_per_launch": 1.5, "period_ms": 10.0}
    assert s["first"] == {"launches": 2, "compiled": 1, "launch_ms": 5.5, "waits_ms": 0.5, "waits_top": "synchronize @ x",
                          "waits_top_ms_per_launch": 0.5, "net_ms": 5.0, "exposed": 1, "exposed_of": 2}
    assert s["prefill"] == {"1-3": {"launches": 1, "launch_ms": 20.0, "cpu_ms": None},
                            "4-8": {"launches": 1, "launch_ms": 25.0, "cpu_ms": None},
                            "9-16": {"launches": 1, "launch_ms": 20.0, "cpu_ms": None},
                            "17+": {"launches": 1, "launch_ms": 30.0, "cpu_ms": None}}
    assert (s["to_result_ms"], s["to_result_launches_ms"], s["next_is_prefill"], s["to_result_prefills"]) == (10.0, 6.0, 1, 3)
    edges = {"steady": [], "first": [], "to_result": [], "compiled": {"first": 0, "prefill": 2},
             "prefill": [(3, 0.01, None), (4, 0.02, None), (8, 0.04, None), (9, 0.03, None), (16, 0.05, None),
                         (17, 0.06, None)]}
    b = spb.summarise([edges, edges])
    assert {k: v["launches"] for k, v in b["prefill"].items()} == {"1-3": 2, "4-8": 4, "9-16": 4, "17+": 2}
    assert b["prefill"]["4-8"]["launch_ms"] == 30.0 and b["prefill_compiled"] == 4
    assert b["steady"]["launch_ms"] is None and b["first"]["exposed_of"] == 0 and b["to_result_ms"] is None


def test_launches_mode_reads_only_measured_requests_per_cell(tmp_path: Path, capsys) -> None:
    # cell 2: warm-up [w1, w2], then prefills of 1 and 3; cell 4: warm-up of 4, then one of 8
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("stock", 0, {"2": 10.0, "4": 40.0})])))
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events(
        [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]])}})
    assert spb.main(["--launches", "--json", str(rec), str(logs)]) == 0
    rows = json.loads(capsys.readouterr().out)["launches"]
    assert [(r["concurrency"], r["variant"], r["runs"]) for r in rows] == [
        (2, "stock", [f"{tmp_path} stock 0"]), (4, "stock", [f"{tmp_path} stock 0"])]
    assert {k: v["launches"] for k, v in rows[0]["prefill"].items()} == {"1-3": 2, "4-8": 0, "9-16": 0, "17+": 0}
    assert {k: v["launches"] for k, v in rows[1]["prefill"].items()} == {"1-3": 0, "4-8": 1, "9-16": 0, "17+": 0}
    assert rows[0]["first"]["launches"] == 2 and rows[0]["first"]["exposed_of"] == 0  # no result processing recorded
    assert spb.main(["--launches", str(rec), str(logs)]) == 0
    out = capsys.readouterr().out
    assert "| 2 | stock | 1 | 0 | - |" in out and "| 2 | stock | 2 (0) | 1.00 |" in out and "| 4 | stock | 0, - | 1, 1.00 |" in out


def test_default_output_is_unchanged_by_the_launches_mode(tmp_path: Path, capsys) -> None:
    # The expected text is what the script printed before --launches existed, on the same input.
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("stock", 0, {"2": 10.0, "4": 40.0}), ("patched", 1, {"2": 11.0, "4": 30.0}),
                                       ("stock", 2, {"2": 12.0, "4": 35.0})])))
    logs = _tar(tmp_path / "l.tar.gz", {
        "timeline/stock-boot0/timeline-1.json": {"events": _events(
            [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]])},
        "timeline/patched-boot1/timeline-2.json": {"events": _events(
            [["w1", "w2"], ["a", "b"], ["c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(4)], [f"t{i}" for i in range(4)]])},
        "timeline/stock-boot2/timeline-3.json": {"events": _events(
            [["w1", "w2"], ["a", "b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(2)], [f"t{i}" for i in range(6)]])},
    })
    assert spb.main([str(rec), str(logs)]) == 0
    assert capsys.readouterr().out == "\n".join([
        "| concurrency | variant, boot | requests | mean prefill batch (requests) | TTFT p50 ms |",
        "|---|---|---|---|---|",
        "| 2 | patched 1 | 4 | 2.0 | 11.0 |",
        "| 2 | stock 0 | 4 | 2.5 | 10.0 |",
        "| 2 | stock 2 | 4 | 4.0 | 12.0 |",
        "| 4 | patched 1 | 8 | 4.0 | 30.0 |",
        "| 4 | stock 2 | 8 | 5.0 | 35.0 |",
        "| 4 | stock 0 | 8 | 8.0 | 40.0 |",
        "",
        "| concurrency | cells | TTFT p50 = a + b x batch: b (ms per request) | a (ms) | r | mean residual per variant (ms) "
        "| mean prefill batch per variant |",
        "|---|---|---|---|---|---|---|",
        "| 2 | 3 | 0.7 | 9.0 | 0.721 | patched +0.6, stock -0.3 | patched 2.0, stock 3.2 |",
        "| 4 | 3 | 2.3 | 21.9 | 0.961 | patched -1.2, stock +0.6 | patched 4.0, stock 6.5 |",
        ""])
    cell = lambda v, b, c, n, m, t: {"variant": v, "boot": b, "concurrency": c, "requests": n,  # noqa: E731
                                     "prefill_bs_mean": m, "ttft_p50_ms": t}
    fit = lambda c, b, a, r, res, bs: {"concurrency": c, "cells": 3, "ms_per_request_in_batch": b, "intercept_ms": a,  # noqa: E731
                                       "r": r, "mean_residual_ms": res, "mean_prefill_bs": bs}
    assert spb.main(["--json", str(rec), str(logs)]) == 0
    assert capsys.readouterr().out == json.dumps({
        "cells": [cell("stock", 0, 2, 4, 2.5, 10.0), cell("stock", 0, 4, 8, 8.0, 40.0), cell("patched", 1, 2, 4, 2.0, 11.0),
                  cell("patched", 1, 4, 8, 4.0, 30.0), cell("stock", 2, 2, 4, 4.0, 12.0), cell("stock", 2, 4, 8, 5.0, 35.0)],
        "fits": [fit(2, 0.7, 9.0, 0.721, {"patched": 0.6, "stock": -0.3}, {"patched": 2.0, "stock": 3.2}),
                 fit(4, 2.3, 21.9, 0.961, {"patched": -1.2, "stock": 0.6}, {"patched": 4.0, "stock": 6.5})]}, indent=1) + "\n"


def _api(events: list[dict], ttft_ms: dict[str, float], lags: list[tuple[float, float]]) -> list[dict]:
    """The API server's side of ``events``: one ``api`` event per request (received at its
    scheduler arrival, first output ``ttft_ms`` later) and the event-loop ``lag`` windows
    (start, longest late wake-up in s), as the probe writes them."""
    api = [{"kind": "api", "t": e["t"], "rid": e["rid"], "received": e["t"], "dispatch": e["t"],
            "first": e["t"] + ttft_ms.get(e["rid"], 5.0) / 1e3} for e in events if e["kind"] == "recv"]
    return api + [{"kind": "lag", "t": t, "n": 10, "sum": m, "max": m} for t, m in lags]


def test_stalls_mode_finds_the_api_servers_pauses_and_the_requests_they_hit(tmp_path: Path, capsys) -> None:
    """One stall (a 400 ms late wake-up) in the patched server's second cell: it hits the two
    requests whose way to their first output overlaps it, and the TTFT without them is the
    other requests'; a 50 ms late wake-up is no stall; the stock server has none."""
    prefills = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]]
    stock, patched = _events(prefills), _events(prefills)
    arrival = {e["rid"]: e["t"] for e in patched if e["kind"] == "recv"}
    slow = {"s0": 420.0, "s1": 410.0}  # s0..s7 arrive together; s0 and s1 wait out the stall
    stall_at = arrival["s0"] + 0.006  # after the others' first output (5 and 5.5 ms)
    stock += _api(stock, {}, [(0.0, 0.05), (0.5, 0.001)])
    patched += _api(patched, {**slow, "s2": 5.5}, [(0.0, 0.05), (stall_at, 0.4), (stall_at + 0.9, 0.001)])
    patched += [{"kind": "gc", "t": stall_at, "t1": stall_at + 0.38, "gen": 2, "collected": 9, "where": "api"},
                {"kind": "gc", "t": stall_at, "t1": stall_at + 0.2, "gen": 2, "collected": 9, "where": "scheduler"},
                {"kind": "gc", "t": stall_at, "t1": stall_at + 0.01, "gen": 1, "collected": 9, "where": "api"},
                # between the cells (after d's first output, before x1 arrives): in no cell's span
                {"kind": "gc", "t": arrival["x1"] - 0.001, "t1": arrival["x1"] - 0.0005, "gen": 2, "collected": 9,
                 "where": "api"}]
    patched.sort(key=lambda e: e["t"])
    assert spb.api_stalls(patched) == [(stall_at, stall_at + 0.9, 400.0)]  # to the next window's start
    assert spb.api_stalls(stock) == []
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps({"environment": {"config": {"concurrency": [2, 4], "rounds": 2, "min_prompts": 0,
                                                          "warmup": "wave"}},
                               "runs": [{"variant": v, "boot": 0, "cells": {c: {"median_ttft_ms": 6.0, "p99_ttft_ms": p99}
                                                                            for c in ("2", "4")}}
                                        for v, p99 in (("stock", 5.0), ("patched", 400.0))]}))
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": stock},
                                        "timeline/patched-boot0/timeline-2.json": {"events": patched}})
    assert spb.main(["--stalls", "--json", str(rec), str(logs)]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(r["variant"], r["concurrency"]): r for r in doc["stalls"]}
    # Per server, where its API server's full collections fell in requests received (the health
    # check and the warm-ups count): the one between the cells too, which no cell holds.
    assert doc["full_gcs"] == [
        {"record": tmp_path.name, "variant": "stock", "boot": 0, "requests": 19, "full_gcs": []},
        {"record": tmp_path.name, "variant": "patched", "boot": 0, "requests": 19,
         "full_gcs": [{"at_request": 7, "ms": 0.5}, {"at_request": 19, "ms": 380.0}]}]
    first, second = rows["patched", 2], rows["patched", 4]
    assert first["stalls"] == [] and first["hit"] == 0 and first["requests"] == 4 and first["api_gc_ms"] == []
    assert second["api_gc_ms"] == [380.0]  # the API server's full collection only
    assert second["stalls"] == [400.0] and second["hit"] == 2 and second["requests"] == 8
    assert second["api_p50_ms"] == 5.0 and second["clean_p50_ms"] == 5.0  # five 5 ms requests and one 5.5 ms stay
    assert second["api_p99_ms"] == pytest.approx(419.3) and second["clean_p99_ms"] == pytest.approx(5.5)
    assert rows["stock", 4]["stalls"] == [] and rows["stock", 4]["api_p99_ms"] == 5.0
    assert spb.main(["--stalls", str(rec), str(logs)]) == 0
    out = capsys.readouterr().out
    assert "| 4 | 0 of 1 / 1 of 1 | 0 / 2 | 0 / 1 (longest 380 ms) | 6.0 -> 6.0 (x1.000) | 5.0 -> 400.0 (x0.013) | 5.0 -> 5.0 (x1.000) " \
           "| 5.0 -> 5.0 (x1.000) | 5.0 -> 419.3 (x0.012) | 5.0 -> 5.5 (x0.909) |" in out
    assert f"| {tmp_path.name} | patched | 0 | 19 | 7 (0 ms), 19 (380 ms) |" in out
    assert f"| {tmp_path.name} | stock | 0 | 19 | none |" in out
    assert "| stock | 1 | 0 | - | 19-19 |\n| patched | 1 | 1 | 7; 7-7 | - |" in out
    # A timeline without lag events (records before the lag probe) has no stall data, not no stall.
    no_lag = _tar(tmp_path / "n.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": [
        e for e in stock if e["kind"] != "lag"]}, "timeline/patched-boot0/timeline-2.json": {"events": patched}})
    assert all(r["stalls"] is None for r in spb.stall_rows(json.loads(rec.read_text()), spb.timelines(no_lag))
               if r["variant"] == "stock")
    assert spb.main(["--stalls", str(rec), str(no_lag)]) == 0
    assert "| 4 | 0 of 0 / 1 of 1 |" in capsys.readouterr().out
    assert spb.main(["--stalls", "--launches", str(rec), str(logs)]) == 2
    assert "one of --launches, --stalls, --strata" in capsys.readouterr().err


def test_generated_shared_prefix_cells_hold_whole_groups(tmp_path: Path) -> None:
    # bench_serving's generated-shared-prefix sends groups x 8 prompts and ignores --num-prompts: a cell
    # of concurrency 1 asked for 12 measures 8, and concurrency 13 asked for 52 measures 48.
    config = {"concurrency": [1, 13], "rounds": 4, "min_prompts": 12, "warmup": "wave",
              "dataset": "generated-shared-prefix"}
    assert spb.cell_sizes(config) == [("1", 1, 8), ("13", 13, 48)]
    assert spb.cell_sizes(dict(config, dataset="random-ids")) == [("1", 1, 12), ("13", 13, 52)]
    # A timeline of exactly those arrivals (health check, then 1 + 8 and 13 + 48) splits into both cells.
    one = [[f"w{i}"] for i in range(1)] + [[f"a{i}"] for i in range(8)]
    thirteen = [[f"v{i}" for i in range(13)]] + [[f"b{i}" for i in range(8)] for _ in range(6)]
    logs = _tar(tmp_path / "logs.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events(one + thirteen)}})
    record = {"environment": {"config": config},
              "runs": [{"variant": "stock", "boot": 0, "cells": {"1": {"median_ttft_ms": 20.0},
                                                               "13": {"median_ttft_ms": 50.0}}}]}
    rows = spb.prefill_batch_sizes(record, spb.timelines(logs))
    assert [(r["concurrency"], r["requests"]) for r in rows] == [(1, 8), (13, 48)]


def _strata_cell(tmp_path: Path, variant: str = "patched", slow: float | None = None) -> tuple[Path, Path]:
    """Cell 4 of a record and its logs: stock launches its 8 requests as 1 + 7, ``variant`` as
    3 + 5 (1-2 ms faster at each size; its last request takes ``slow`` ms if given). Cell 2 has
    the same 4 requests on both sides."""
    head = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"]]
    stock = _events(head + [["s0"], [f"s{i}" for i in range(1, 8)]])
    other = _events(head + [["s0", "s1", "s2"], [f"s{i}" for i in range(3, 8)]])
    stock += _api(stock, {"s0": 10.0, **{f"s{i}": 30.0 for i in range(1, 8)}}, [])
    other += _api(other, {**{f"s{i}": 9.0 for i in range(3)}, **{f"s{i}": 28.0 for i in range(3, 8)},
                          **({"s7": slow} if slow is not None else {})}, [])
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("stock", 0, {"2": 5.0, "4": 30.0}), (variant, 0, {"2": 5.0, "4": 28.0})])))
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": sorted(stock, key=lambda e: e["t"])},
                                        f"timeline/{variant}-boot0/timeline-2.json": {"events": sorted(other, key=lambda e: e["t"])}})
    return rec, logs


def test_strata_compare_both_sides_at_the_same_mix_of_shared_prefills(tmp_path: Path, capsys) -> None:
    """Cell 4: stock launches its 8 requests as 1 + 7, patched as 3 + 5. Each side's requests are
    faster in small prefills; patched is 1-2 ms faster at each size. Weighted by both sides'
    requests per size (4 in 1-3, 12 in 4-8), stock 25.0 ms and patched 23.25 ms."""
    rec, logs = _strata_cell(tmp_path)
    head = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"]]
    stock = _events(head + [["s0"], [f"s{i}" for i in range(1, 8)]])
    stock += _api(stock, {"s0": 10.0, **{f"s{i}": 30.0 for i in range(1, 8)}}, [])
    assert spb.main(["--strata", "--json", str(rec), str(logs)]) == 0
    rows = {r["concurrency"]: r for r in json.loads(capsys.readouterr().out)["strata"]}
    assert rows[2]["groups"][0] == {"prefill": "1-3", "requests": [4, 4], "p50_ms": [5.0, 5.0],
                                    "mean_ms": [5.0, 5.0]}
    assert rows[2]["adjusted_p50_ms"] == [5.0, 5.0] and rows[2]["covered"] == 1.0
    four = rows[4]
    assert [g["requests"] for g in four["groups"]] == [[1, 3], [7, 5], [0, 0], [0, 0]]
    assert [g["p50_ms"] for g in four["groups"]][:2] == [[10.0, 9.0], [30.0, 28.0]]
    assert four["adjusted_p50_ms"][0] == pytest.approx(25.0) and four["adjusted_p50_ms"][1] == pytest.approx(23.2, abs=0.06)
    assert spb.main(["--strata", str(rec), str(logs)]) == 0
    out = capsys.readouterr().out
    assert "| 4 | 1 / 3: 10.00 -> 9.00 | 7 / 5: 30.00 -> 28.00 | - | - | 25.0 -> 23." in out and "| 100% |" in out
    assert four["adjusted_mean_ms"] == four["adjusted_p50_ms"]  # no spread within a group here
    # A size only one side has is left out of the comparison, and the share left in is said.
    patched_only = _events(head + [[f"s{i}" for i in range(8)]])
    patched_only += _api(patched_only, {f"s{i}": 28.0 for i in range(8)}, [])
    logs2 = _tar(tmp_path / "m.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": sorted(stock, key=lambda e: e["t"])},
                                         "timeline/patched-boot0/timeline-2.json": {"events": sorted(patched_only, key=lambda e: e["t"])}})
    (row,) = [r for r in spb.strata_rows([(json.loads(rec.read_text()), spb.timelines(logs2))]) if r["concurrency"] == 4]
    assert row["adjusted_p50_ms"] == [30.0, 28.0] and row["covered"] == pytest.approx(15 / 16, abs=0.001)


def test_strata_also_standardise_the_mean(tmp_path: Path, capsys) -> None:
    """The same cell with one slow patched request in the 4-8 group (48 ms): its p50 stays 28, its
    mean is 32, so at equal shared prefills patched reads 23.25 ms at p50 and 26.25 ms as a mean
    (stock 25.0 for both)."""
    rec, logs = _strata_cell(tmp_path, slow=48.0)
    (four,) = [r for r in spb.strata_rows([(json.loads(rec.read_text()), spb.timelines(logs))]) if r["concurrency"] == 4]
    assert [g["mean_ms"] for g in four["groups"]][:2] == [[10.0, 9.0], [30.0, 32.0]]
    assert four["adjusted_p50_ms"][1] == pytest.approx(23.2, abs=0.06)
    assert four["adjusted_mean_ms"] == [25.0, pytest.approx(26.2, abs=0.06)]
    assert spb.main(["--strata", str(rec), str(logs)]) == 0
    assert "| 25.0 -> 26.2 (x0.95" in capsys.readouterr().out


def test_strata_set_another_variant_beside_stock(tmp_path: Path, capsys) -> None:
    """``--variant``: the same standardisation against another variant of the record (here the
    patched run's requests relabelled as ``patched-x``; a plain ``patched`` is then absent)."""
    rec, logs = _strata_cell(tmp_path, variant="patched-x")
    assert spb.main(["--strata", "--variant", "patched-x", str(rec), str(logs)]) == 0
    out = capsys.readouterr().out
    assert "stock -> patched-x (x)" in out and "| 4 | 1 / 3: 10.00 -> 9.00 | 7 / 5: 30.00 -> 28.00 | - | - | 25.0 -> 23." in out
    # Without it the record has no patched run: nothing to set beside stock.
    assert spb.main(["--strata", str(rec), str(logs)]) == 1
    capsys.readouterr()
    assert spb.main(["--variant", "patched-x", str(rec), str(logs)]) == 2
    assert "--variant goes with --strata" in capsys.readouterr().err


def test_compiles_are_listed_per_variant_kernel_and_caller_with_the_launch_they_fell_in(tmp_path: Path, capsys) -> None:
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"runs": []}))

    def compile_at(t: float, kernel: str, where: str) -> dict:
        return {"kind": "compile", "t": t, "t1": t + 0.2, "kernel": kernel, "key": "k", "where": [where, "x.py:1 y"]}

    patched = [{"kind": "run", "t": 10.0, "t1": 11.0, "mode": "DECODE", "extend": False, "bs": 4},
               compile_at(10.1, "assign_kernel", "eagle_worker_v2.py:1219 move"),
               {"kind": "run", "t": 12.0, "t1": 12.5, "mode": "DECODE", "extend": False, "bs": 13},
               compile_at(12.1, "assign_kernel", "eagle_worker_v2.py:1219 move"),
               compile_at(13.0, "other", "schedule_batch.py:9 prepare")]
    stock = [{"kind": "run", "t": 10.0, "t1": 10.01, "mode": "DECODE", "extend": False, "bs": 4}]
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/patched-boot1/timeline-2.json": {"events": patched},
                                        "timeline/patched-boot2/timeline-3.json": {"events": patched},
                                        "timeline/stock-boot1/timeline-1.json": {"events": stock}})
    assert spb.main(["--compiles", "--json", str(record), str(logs)]) == 0
    rows = json.loads(capsys.readouterr().out)["compiles"]
    assert [(r["variant"], r["kernel"], r["servers"], r["compiles"], r["launches"]) for r in rows] == [
        ("patched", "assign_kernel", 2, 4, ["DECODE 13", "DECODE 4"]),
        ("patched", "other", 2, 2, ["between launches"])]
    assert rows[0]["where"] == "eagle_worker_v2.py:1219 move" and rows[0]["ms"] == pytest.approx(800, abs=0.5)
    assert spb.main(["--compiles", str(record), str(logs)]) == 0
    assert "| patched | assign_kernel | eagle_worker_v2.py:1219 move | 2 | 4 | 800.0 | DECODE 13, DECODE 4 |" in capsys.readouterr().out
    none = _tar(tmp_path / "n.tar.gz", {"timeline/stock-boot1/timeline-1.json": {"events": stock}})
    assert spb.main(["--compiles", str(record), str(none)]) == 1
    assert "no compile events" in capsys.readouterr().err


def test_timelines_read_the_line_per_flush_files_and_leave_out_a_cut_last_line(tmp_path: Path) -> None:
    stock = [{"kind": "recv", "t": 1.0, "rid": "a"}, {"kind": "recv", "t": 2.0, "rid": "b"}]
    lines = (json.dumps({"events": stock[:1]}) + "\n" + json.dumps({"events": stock[1:]}) + "\n"
             + '{"events": [{"kind": "recv", "t"').encode()
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.jsonl": lines,
                                        "timeline/patched-boot0/timeline-2.json": {"events": [stock[0]]}})
    by_run = spb.timelines(logs)
    assert [e["rid"] for e in by_run["stock-boot0"]] == ["a", "b"] and len(by_run["patched-boot0"]) == 1


def test_launches_keep_the_scheduler_threads_cpu_time_and_leave_out_launches_that_compiled(capsys) -> None:
    """Timelines from 2026-11-26 on: ``run`` events carry ``cpu_ms`` (host work against waiting
    in a long launch) and ``compile`` events mark a Triton compile inside any launch, a steady
    decode too (the stack sampler never looks at those)."""
    D, P = "DECODE", "EXTEND"
    ev = [dict(_run(0, 20, P, 2), cpu_ms=18.0), _proc(20, 21, D, 4),
          dict(_run(22, 28, D, 4), cpu_ms=2.0), _proc(28, 29, P, 2),  # first decode after the prefill
          dict(_run(30, 36, D, 4), cpu_ms=5.0), _proc(36, 37, D, 4),  # steady
          dict(_run(40, 440, D, 4), cpu_ms=390.0),  # steady, but Triton compiled in it
          {"kind": "compile", "t": _ms(41), "t1": _ms(439), "kernel": "k", "key": "", "where": []},
          _proc(441, 442, D, 4), dict(_run(443, 449, D, 4), cpu_ms=3.0), _proc(449, 450, D, 4)]
    parts = spb.launch_parts(ev, 0, 1)
    assert [round(x["launch"] * 1e3, 6) for x in parts["steady"]] == [6, 6]  # the 400 ms one left out
    assert [round(x["cpu"] * 1e3, 6) for x in parts["steady"]] == [5, 3]
    assert [(bs, round(s * 1e3, 6), round(c * 1e3, 6)) for bs, s, c in parts["prefill"]] == [(2, 20, 18)]
    s = spb.summarise([parts])
    assert s["steady"]["cpu_ms"] == 4.0 and s["prefill"]["1-3"]["cpu_ms"] == 18.0
    table = spb.launch_tables([{"concurrency": 4, "variant": "stock", "runs": ["x"], **s}])
    assert "| 1 | 2 | 6.00 (cpu 4.00) |" in table  # steady: servers, launches, launch (cpu)
    assert "| 1, 20.00 (cpu 18.00) |" in table  # prefills of 1-3
    assert "(cpu" not in spb.launch_tables([{"concurrency": 4, "variant": "stock", "runs": ["x"],
                                             **spb.summarise([spb.launch_parts(_overlap_loop(), _ms(5), _ms(250))])}])


def test_frames_split_sampled_steady_decodes_by_leaf_frame_stock_beside_patched(tmp_path: Path, capsys) -> None:
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("stock", 0, {"2": 10.0, "4": 40.0}), ("patched", 0, {"2": 10.0, "4": 40.0})])))
    cells = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]]

    def side(extra_leaf: str | None) -> list[dict]:
        ev = _events(cells)
        for k in range(2):  # two sampled steady decodes in cell 4's measured window (from t = 0.05)
            t = 0.1 + k * 0.1
            ev.append({"kind": "run", "t": t, "t1": t + 0.010, "mode": "DECODE", "extend": False, "bs": 8,
                       "sampled": True, "cpu_ms": 6.0})
            ev += [{"kind": "sample", "t": t + 0.001 * (i + 1), "dt": 1e-3, "phase": "steady",
                    "stack": ["graphs.py:139 replay", "x.py:1 y"]} for i in range(4)]
            if extra_leaf:
                ev += [{"kind": "sample", "t": t + 0.006 + 0.001 * i, "dt": 1e-3, "phase": "steady",
                        "stack": [extra_leaf]} for i in range(2)]
        ev.append({"kind": "run", "t": 0.5, "t1": 0.6, "mode": "DECODE", "extend": False, "bs": 8})  # not sampled
        return sorted(ev, key=lambda e: e["t"])

    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": side(None)},
                                        "timeline/patched-boot0/timeline-2.json": {"events": side("publish_stash.py:76 publish")}})
    assert spb.main(["--frames", "--json", str(rec), str(logs)]) == 0
    rows = json.loads(capsys.readouterr().out)["frames"]
    assert [(r["concurrency"], r["variant"], r["launches"], r["launch_ms"], r["cpu_ms"]) for r in rows] == [
        (4, "stock", 2, 10.0, 6.0), (4, "patched", 2, 10.0, 6.0)]
    assert rows[1]["frames_ms"] == {"graphs.py replay": 4.0, "publish_stash.py publish": 2.0}
    assert spb.main(["--frames", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    first = [line for line in table.splitlines() if line.startswith("| 4 | patched | 2 / 2")][0]
    assert first.endswith("| publish_stash.py publish | 0.000 | 2.000 |")  # the largest difference first
    old = _tar(tmp_path / "o.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events(cells)}})
    assert spb.main(["--frames", str(rec), str(old)]) == 1
    assert "no sampled steady decodes" in capsys.readouterr().err


def _host_speed_logs(tmp_path: Path, sides: dict[str, list[float | None]], extra: float) -> tuple[Path, Path]:
    """Servers whose small prefill launches took ``h`` ms of CPU (None: a timeline without
    ``cpu_ms``), each cell 2's TTFT p50 20 + 2 h ms, the other side ``extra`` ms more."""
    cells = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]]
    runs, files = [], {}
    for variant, hosts in sides.items():
        for boot, h in enumerate(hosts):
            ev = _events(cells)
            for e in ev:
                if e["kind"] == "run" and h is not None:
                    e["cpu_ms"] = h if e["extend"] else 0.5
            ttft = 20 + 2 * (h if h is not None else 1.0) + (extra if variant != "stock" else 0.0)
            runs.append((variant, boot, {"2": ttft, "4": 99.0}))
            files[f"timeline/{variant}-boot{boot}/timeline-{boot}.json"] = {"events": ev}
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record(runs)))
    return rec, _tar(tmp_path / "l.tar.gz", files)


def test_host_speed_compares_both_sides_at_the_same_host_speed(tmp_path: Path, capsys) -> None:
    rec, logs = _host_speed_logs(tmp_path, {"stock": [10.0, 12.0, 14.0], "patched": [12.0, 14.0, 16.0]}, extra=3.0)
    assert spb.main(["--host-speed", "--json", str(rec), str(logs)]) == 0
    doc = json.loads(capsys.readouterr().out)
    two = [r for r in doc["cells"] if r["concurrency"] == 2]
    assert sorted((r["variant"], r["host_ms"], r["prefills"], r["host_is_cpu"]) for r in two) == [
        ("patched", 12.0, 2, True), ("patched", 14.0, 2, True), ("patched", 16.0, 2, True),
        ("stock", 10.0, 2, True), ("stock", 12.0, 2, True), ("stock", 14.0, 2, True)]
    # cell 4 has no prefill of 1-3 requests: no index, no fit
    assert all(r["host_ms"] is None for r in doc["cells"] if r["concurrency"] == 4)
    [fit] = doc["fits"]
    assert fit["concurrency"] == 2 and fit["ms_ttft_per_host_ms"] == 2.0 and fit["r2"] == 1.0
    # plain medians: patched drew the slower hosts (51 against 44 ms); at stock's median host
    # index (12 ms) it is its own 3 ms slower: 44 -> 47
    assert fit["ttft_p50_ms"] == {"stock": 44.0, "patched": 51.0} and fit["ratio"] == round(44 / 51, 3)
    assert fit["at_stock_host_ms"] == {"stock": 44.0, "patched": 47.0} and fit["at_stock_host_ratio"] == round(44 / 47, 3)
    assert spb.main(["--host-speed", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    assert "| 2 | 3 / 3 | 12.00 -> 14.00 | 44.0 -> 51.0 (x0.863) | 2.00 | 1.00 | 44.0 -> 47.0 (x0.936) |" in table


def test_host_speed_reads_old_timelines_by_launch_time_and_checks_its_flags(tmp_path: Path, capsys) -> None:
    rec, logs = _host_speed_logs(tmp_path, {"stock": [None, None], "patched": [None, None]}, extra=0.0)
    assert spb.main(["--host-speed", "--json", str(rec), str(logs)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {(r["host_ms"], r["host_is_cpu"]) for r in doc["cells"] if r["concurrency"] == 2} == {(1.0, False)}
    assert doc["fits"] == []  # one index on both sides: nothing to fit
    assert spb.main(["--host-speed", str(rec), str(logs)]) == 0
    assert "| 2 | 1.00 (wall) | 22.0 |" in capsys.readouterr().out  # launch time stands in, and says so
    assert spb.main(["--host-speed", "--launches", str(rec), str(logs)]) == 2
    assert "one of --launches" in capsys.readouterr().err
    assert spb.main(["--variant", "patched-no-war", "--launches", str(rec), str(logs)]) == 2
    assert "--strata, --host-speed, --host-states or --token-times" in capsys.readouterr().err


def test_host_speed_plot_draws_every_cell_and_each_sides_line(tmp_path: Path, capsys) -> None:
    import xml.etree.ElementTree as ET

    rec, logs = _host_speed_logs(tmp_path, {"stock": [10.0, 12.0, 14.0], "patched": [12.0, 14.0, 16.0]}, extra=3.0)
    plot = tmp_path / "hs.svg"
    assert spb.main(["--host-speed", "--plot", str(plot), str(rec), str(logs)]) == 0
    svg = ET.fromstring(plot.read_text())  # well-formed
    ns = "{http://www.w3.org/2000/svg}"
    assert len(svg.findall(f"{ns}rect")) == 1  # one fitted concurrency, one panel
    dots = [(c.get("data-side"), float(c.get("cx")), float(c.get("cy"))) for c in svg.findall(f"{ns}circle")]
    assert sorted(d[0] for d in dots) == ["patched"] * 3 + ["stock"] * 3
    lines = {ln.get("data-side"): ln for ln in svg.findall(f"{ns}line") if ln.get("data-side")}
    assert set(lines) == {"stock", "patched"}
    # every cell lies on its side's line (TTFT = 20 + 2 h exactly): the same slope in pixels
    for side, line in lines.items():
        x1, y1, x2, y2 = (float(line.get(k)) for k in ("x1", "y1", "x2", "y2"))
        for s, cx, cy in dots:
            if s == side:
                assert abs(y1 + (y2 - y1) * (cx - x1) / (x2 - x1) - cy) < 0.2
    assert "x0.936 at equal host speed" in plot.read_text()
    capsys.readouterr()
    assert spb.main(["--launches", "--plot", str(plot), str(rec), str(logs)]) == 2
    assert "--plot goes with --host-speed" in capsys.readouterr().err


def test_intake_measures_how_the_api_server_took_in_a_wave_of_requests(tmp_path: Path, capsys) -> None:
    """A closed loop re-sends finished requests in a chain (sends 1 ms apart: one wave). The API
    server takes them in one by one: 1 ms apart on stock, 2 ms on patched, where it also sent the
    first outputs of the wave's two earliest requests before it had taken the last one in. The
    client-to-API median grows with that spacing."""
    prefills = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]]
    rec = {"environment": {"config": {"concurrency": [2, 4], "rounds": 2, "min_prompts": 0, "warmup": "wave"}},
           "runs": []}
    files = {}
    for variant, spacing, early in (("stock", 0.001, 0), ("patched", 0.002, 2)):
        ev = _events(prefills)
        t_s = next(e["t"] for e in ev if e.get("rid") == "s0")
        sends = [t_s - 0.05 + 0.001 * i for i in range(8)]
        received = [send + 0.004 + (spacing - 0.001) * i for i, send in enumerate(sends)]
        last = received[-1]
        for i in range(8):
            first = received[i] + 0.002 if i < early else last + 0.01
            ev.append({"kind": "api", "t": received[i], "rid": f"s{i}", "received": received[i], "first": first})
        ev.sort(key=lambda e: e["t"])
        files[f"timeline/{variant}-boot0/timeline-1.json"] = {"events": ev}
        rec["runs"].append({"variant": variant, "boot": 0, "cells": {
            "2": {"median_ttft_ms": 5.0},
            "4": {"median_ttft_ms": 5.0, "completed": 8, "client_requests": [[s, 0.02] for s in sends]}}})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    logs = _tar(tmp_path / "l.tar.gz", files)
    assert spb.main(["--intake", "--json", str(path), str(logs)]) == 0
    rows = {r["variant"]: r for r in json.loads(capsys.readouterr().out)["intake"]}
    assert set(rows) == {"stock", "patched"}  # cell 2 has no client stamps: no row
    stock, patched = rows["stock"], rows["patched"]
    assert stock["concurrency"] == 4 and stock["large_waves"] == 1 and stock["in_large_waves"] == 1.0
    assert stock["spacing_ms"] == pytest.approx(1.0) and patched["spacing_ms"] == pytest.approx(2.0)
    assert stock["firsts_during_intake"] == 0 and patched["firsts_during_intake"] == 2
    assert stock["client_to_api_p50_ms"] == pytest.approx(4.0) and patched["client_to_api_p50_ms"] == pytest.approx(7.5)
    assert spb.main(["--intake", str(path), str(logs)]) == 0
    out = capsys.readouterr().out
    assert "| 4 | stock | 0 | 8 | 1 | 100% | 1.00 | 0.0 | 4.0 |" in out
    assert "| 4 | patched | 0 | 8 | 1 | 100% | 2.00 | 2.0 | 7.5 |" in out
    assert spb.main(["--intake", "--stalls", str(path), str(logs)]) == 2


def _bench(ttfts: list[float], itls: list[list[float]], errors: list[str] | None = None) -> bytes:
    # bench_serving's --output-details file: one JSON line per run, the last one is the cell's.
    doc = {"ttfts": ttfts, "itls": itls, "errors": errors or [""] * len(ttfts)}
    return (json.dumps({"ttfts": [], "itls": []}) + "\n" + json.dumps(doc) + "\n").encode()


def test_token_times_tell_a_sooner_first_token_from_a_later_decode(tmp_path: Path, capsys) -> None:
    # Both sides' requests get their first decode output (4 tokens, spread evenly by bench_serving)
    # 100 ms after the send, then one 4-token output every 8 ms. Patched sends the first token at
    # 20 ms, stock at 80 ms: patched's first gap is longer, its ITL p99 worse, no token later.
    def side(first: float, n: int = 20) -> tuple[list[float], list[list[float]]]:
        gap = (0.100 - first) / 4
        itls = [gap] * 4 + [0.002] * 60 + [0.003]  # 66 tokens; the last output alone
        return [first] * n, [list(itls) for _ in range(n)]

    st_t, st_i = side(0.080)
    pa_t, pa_i = side(0.020)
    pa_t.append(0.5)
    pa_i.append([0.01])  # a failed request: left out
    record = {"runs": [{"variant": "stock", "boot": 0, "cells": {"8": {}}},
                       {"variant": "patched", "boot": 0, "cells": {"8": {}}},
                       {"variant": "patched", "boot": 1, "cells": {"8": {}}}]}  # no bench file: left out
    path = tmp_path / "serve-bench.json"
    path.write_text(json.dumps(record))
    logs = _tar(tmp_path / "serve-logs.tar.gz", {
        "bench/stock-boot0-c8.jsonl": _bench(st_t, st_i),
        "bench/patched-boot0-c8.jsonl": _bench(pa_t, pa_i, [""] * 20 + ["boom"]),
        "bench/notes.txt": b"not a bench file"})
    assert spb.main(["--token-times", "--json", str(path), str(logs)]) == 0
    rows = {r["variant"]: r for r in json.loads(capsys.readouterr().out)["token_times"]}
    st, pa = rows["stock"], rows["patched"]
    assert st["requests"] == pa["requests"] == 20
    assert (st["first_p50_ms"], pa["first_p50_ms"]) == (80.0, 20.0)
    assert st["decode_p50_ms"] == pytest.approx(100.0) and pa["decode_p50_ms"] == pytest.approx(100.0)
    assert st["token64_p50_ms"] == pytest.approx(pa["token64_p50_ms"]) == pytest.approx(218.0)
    assert st["last_p50_ms"] == pytest.approx(pa["last_p50_ms"]) == pytest.approx(223.0)
    assert (st["itl_p99_ms"], pa["itl_p99_ms"]) == (5.0, 20.0)
    assert st["later_itl_p99_ms"] == pa["later_itl_p99_ms"] == 3.0
    assert spb.main(["--token-times", str(path), str(logs)]) == 0
    table = capsys.readouterr().out
    assert "| 8 | 20 / 20 | 80.0 -> 20.0 (x4.000) |" in table and "5.0 -> 20.0 (x0.250) | 3.0 -> 3.0 (x1.000) |" in table


def test_token_times_need_both_sides(tmp_path: Path, capsys) -> None:
    record = {"runs": [{"variant": "stock", "boot": 0, "cells": {"8": {}}}]}
    path = tmp_path / "serve-bench.json"
    path.write_text(json.dumps(record))
    logs = _tar(tmp_path / "serve-logs.tar.gz", {"bench/stock-boot0-c8.jsonl": _bench([0.1], [[0.01]])})
    assert spb.main(["--token-times", str(path), str(logs)]) == 1
    assert "no cell with bench_serving files on both sides" in capsys.readouterr().err


# ----------------------------------------------------------------------------- --poll-wait

def _poll_server(slow: float) -> list[dict]:
    """One server, times in ms: a health check, a warm-up request, then eight measured requests,
    each sent to the scheduler while its thread was in a known state and received ``slow`` x
    the base wait later; the last one has no ``dispatch`` stamp (a timeline before the field)."""
    D, P = "DECODE", "EXTEND"
    ev = [{"kind": "recv", "t": _ms(0), "rid": "health"}, {"kind": "recv", "t": _ms(10), "rid": "warm"},
          _run(100, 104, D, 4), _sync(101, 102, "relay"), _proc(104, 105, D, 4), _sync(106, 108, "verify"),
          _sync(106.2, 106.5, "item"),  # nested in the verify wait, over before m4 is sent: m4 is still in it
          _run(110, 130, P, 2), _proc(131, 133, P, 2), _sync(131.5, 132, "copy_done")]
    sends = [("m0", 101.5, 4.0), ("m1", 115, 16), ("m2", 104.5, 1), ("m3", 132, 2),
             ("m4", 107, 1.5), ("m5", 108.5, 1), ("m6", 135, 2), ("m7", 136, 1)]
    for i, (rid, at, wait) in enumerate(sends):
        received = at + slow * wait
        ev.append({"kind": "recv", "t": _ms(received), "rid": rid})
        api = {"kind": "api", "t": _ms(at - 0.5), "rid": rid, "received": _ms(at - 0.5), "first": _ms(received + 20)}
        if i < 7:
            api["dispatch"] = _ms(at)
        ev.append(api)
    return sorted(ev, key=lambda e: e["t"])


def test_poll_wait_splits_each_requests_wait_by_the_schedulers_state_when_it_was_sent(tmp_path: Path, capsys) -> None:
    rec = {"environment": {"config": {"concurrency": [2], "rounds": 4, "min_prompts": 0, "warmup": "one"}},
           "runs": [{"variant": "stock", "boot": 0, "cells": {"2": {"median_ttft_ms": 30.0}}},
                    {"variant": "patched", "boot": 1, "cells": {"2": {"median_ttft_ms": 40.0}}}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/patched-boot1/timeline-2.json": {"events": _poll_server(2.0)},
                                        "timeline/stock-boot0/timeline-1.json": {"events": _poll_server(1.0)}})
    assert spb.main(["--poll-wait", "--json", str(path), str(logs)]) == 0
    stock, patched = json.loads(capsys.readouterr().out)["poll_wait"]
    assert (stock["variant"], patched["variant"]) == ("stock", "patched")  # stock first
    assert stock["requests"] == patched["requests"] == 7  # the one without a dispatch stamp is left out
    # decode launch (a host wait inside it counts as the launch), prefill launch, a decode's and a
    # prefill's result, the wait between launches, the rest of the loop (two requests)
    assert {s: (v["share"], v["mean_ms"]) for s, v in stock["states"].items()} == {
        "decode launch": (0.143, 4.0), "prefill launch": (0.143, 16.0), "decode result": (0.143, 1.0),
        "prefill result": (0.143, 2.0), "host wait": (0.143, 1.5), "loop": (0.286, 1.5)}
    assert stock["wait_p50_ms"] == pytest.approx(2.0) and stock["wait_mean_ms"] == pytest.approx(27.5 / 7, abs=0.01)
    assert patched["wait_mean_ms"] == pytest.approx(2 * 27.5 / 7, abs=0.01)
    assert patched["states"]["prefill launch"]["adds_ms"] == pytest.approx(32 / 7, abs=0.01)
    assert spb.main(["--poll-wait", str(path), str(logs)]) == 0
    out = capsys.readouterr().out
    assert "| 2 | stock | 7 | 2.00 | 3.93 | 14% / 4.00 / 0.57 | 14% / 16.00 / 2.29 |" in out
    assert spb.main(["--poll-wait", "--intake", str(path), str(logs)]) == 2


def _wave_server(solo_ms: float, groups: list[list[str]]) -> list[dict]:
    """One server, times in ms: a health check, a warm-up request prefilled alone, then two
    returning waves of four measured requests. Wave A's first request finds the scheduler idle
    and is prefilled alone for ``solo_ms``; the rest arrive 3, 5 and 7 ms after it and go in
    ``groups``, each received by the poll after the launch before it. Wave B goes in one prefill.
    Every request's first output comes 10 ms after its prefill's launch ends."""
    D, P = "DECODE", "EXTEND"
    ev = [{"kind": "recv", "t": _ms(0), "rid": "health"}, {"kind": "recv", "t": _ms(10), "rid": "warm"},
          dict(_run(11, 20, P, 1), rids=["warm"]), _run(21, 30, D, 1)]

    def prefill(t: float, length: float, rids: list[str], sent: dict[str, float]) -> float:
        ev.append({"kind": "recv", "t": _ms(t - 1), "rid": rids[0]})
        ev.extend({"kind": "recv", "t": _ms(t - 1), "rid": r} for r in rids[1:])
        ev.append(dict(_run(t, t + length, P, len(rids)), rids=rids))
        ev.extend({"kind": "api", "t": _ms(sent[r]), "rid": r, "received": _ms(sent[r]),
                   "first": _ms(t + length + 10)} for r in rids)
        return t + length + 1

    sent = {"m0": 100, "m1": 103, "m2": 105, "m3": 107}
    t = prefill(102, solo_ms, ["m0"], sent)
    for group in groups:
        t = prefill(t + 1, 20, group, sent)
    ev.append(_run(t + 1, t + 10, D, 4))
    sent = {f"m{i}": 300 + i for i in range(4, 8)}
    t = prefill(310, 30, ["m4", "m5", "m6", "m7"], sent)
    ev.append(_run(t + 1, t + 10, D, 4))
    return sorted(ev, key=lambda e: e["t"])


def test_waves_show_how_each_returning_wave_was_split_into_prefills(tmp_path: Path, capsys) -> None:
    rec = {"environment": {"config": {"concurrency": [4], "rounds": 2, "min_prompts": 0, "warmup": "one"}},
           "runs": [{"variant": "stock", "boot": 0, "cells": {"4": {"median_ttft_ms": 30.0}}},
                    {"variant": "patched", "boot": 1, "cells": {"4": {"median_ttft_ms": 40.0}}}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    logs = _tar(tmp_path / "l.tar.gz", {
        "timeline/stock-boot0/timeline-1.json": {"events": _wave_server(15, [["m1", "m2"], ["m3"]])},
        "timeline/patched-boot1/timeline-2.json": {"events": _wave_server(20, [["m1", "m2", "m3"]])}})
    (stock_row,) = [r for r in spb.wave_rows(rec, spb.timelines(logs)) if r["variant"] == "stock"]
    assert [w["sizes"] for w in stock_row["waves"]] == [[1, 2, 1], [4]]  # the warm-up's prefill is not a wave
    # m0 received at 100; the solo launch ends at 117, the poll that takes m1 and m2 comes at 118
    assert stock_row["waves"][0]["second_poll_ms"] == pytest.approx(18.0)
    assert stock_row["waves"][1]["second_poll_ms"] is None
    assert spb.main(["--waves", "--json", str(path), str(logs)]) == 0
    stock, patched = json.loads(capsys.readouterr().out)["waves"]
    assert (stock["variant"], patched["variant"]) == ("stock", "patched")  # stock first
    assert (stock["waves"], stock["solo_first"], patched["solo_first"]) == (2, 1, 1)
    assert (stock["rest_in_one"], patched["rest_in_one"]) == (0.0, 1.0)
    assert (stock["solo_launch_ms"], patched["solo_launch_ms"]) == (pytest.approx(15), pytest.approx(20))
    assert patched["second_poll_ms"] == pytest.approx(23.0) and patched["second_size"] == 3
    # wave A's TTFT p50: stock m0 27, m1 / m2 46 / 44 (first output at 149), m3 64 -> 45.0
    assert stock["solo_first_ttft_p50_ms"] == pytest.approx(45.0)
    assert stock["ttft_p50_ms"] == pytest.approx((45.0 + 44.5) / 2)  # wave B: 350 - 304..307
    assert spb.main(["--waves", str(path), str(logs)]) == 0
    assert "| 4 | stock | 2 | 1 | 0% | 15.00 | 18.00 | 2.0 | 45.00 | 44.75 |" in capsys.readouterr().out
    assert spb.main(["--waves", "--intake", str(path), str(logs)]) == 2


def test_functions_count_every_function_on_a_samples_stack_and_match_edited_frames_to_sglangs(
        tmp_path: Path, capsys) -> None:
    """A plugin-edited function (its code object named after the edit) counts under SGLang's own
    file and name, so both sides meet in one row; a sample counts toward each function on its
    stack once, however deep; the largest difference comes first."""
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("stock", 0, {"2": 10.0, "4": 40.0}), ("patched", 0, {"2": 10.0, "4": 40.0})])))
    cells = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]]
    edited = ("<__sglang_futuremap_patch__ edit of sglang.srt.speculative.eagle_info_v2:"
              "EagleDraftInputV2Mixin.prepare_for_decode 4f6fb617036f>:77 prepare_for_decode")

    def side(patched: bool) -> list[dict]:
        ev = _events(cells)
        t = 0.1  # one sampled steady decode in cell 4's measured window (from t = 0.05)
        ev.append({"kind": "run", "t": t, "t1": t + 0.010, "mode": "DECODE", "extend": False, "bs": 8,
                   "sampled": True, "cpu_ms": 6.0})
        prepare = edited if patched else "eagle_info_v2.py:2300 prepare_for_decode"
        stacks = [["graphs.py:139 replay", prepare, "scheduler.py:9 run_batch"]] * 3
        if patched:  # two more samples: a wait inside the plugin's own function, under the same caller
            stacks += [["streams.py:254 synchronize", "publish_stash.py:130 resolve_seq_lens_cpu", prepare]] * 2
        ev += [{"kind": "sample", "t": t + 0.001 * (i + 1), "dt": 1e-3, "phase": "steady", "stack": st}
               for i, st in enumerate(stacks)]
        # recursion: a function twice on one stack counts once
        ev.append({"kind": "sample", "t": t + 0.009, "dt": 1e-3, "phase": "steady",
                   "stack": ["x.py:1 f", "x.py:2 f", "scheduler.py:9 run_batch"]})
        return sorted(ev, key=lambda e: e["t"])

    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": side(False)},
                                        "timeline/patched-boot0/timeline-2.json": {"events": side(True)}})
    assert spb.main(["--functions", "--json", str(rec), str(logs)]) == 0
    stock, patched = json.loads(capsys.readouterr().out)["functions"]
    assert (stock["variant"], stock["launches"], stock["sampled_ms"]) == ("stock", 1, 4.0)
    assert (patched["variant"], patched["launches"], patched["sampled_ms"]) == ("patched", 1, 6.0)
    assert stock["functions_ms"] == {"graphs.py replay": 3.0, "eagle_info_v2.py prepare_for_decode": 3.0,
                                     "scheduler.py run_batch": 4.0, "x.py f": 1.0}
    assert patched["functions_ms"]["eagle_info_v2.py prepare_for_decode"] == 5.0
    assert patched["functions_ms"]["publish_stash.py resolve_seq_lens_cpu"] == 2.0
    assert patched["functions_ms"]["x.py f"] == 1.0
    assert spb.main(["--functions", str(rec), str(logs)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| patched |")]
    assert lines[0] == ("| patched | 1 / 1 | 4.000 -> 6.000 | eagle_info_v2.py prepare_for_decode | 3.000 | 5.000 | +2.000 |")
    assert any(line.endswith("| graphs.py replay | 3.000 | 3.000 | +0.000 |") for line in lines)
    assert spb.main(["--functions", "--frames", str(rec), str(logs)]) == 2


def _ftimes_case(tmp_path: Path, launches: Callable[[bool, float], list[dict]]) -> tuple[Path, Path, list[list[str]]]:
    """A record of one stock and one patched server over ``_events``' cells, each timeline with
    ``launches(patched, t)`` added from ``t`` on (inside cell 4's measured window, which starts
    at 0.05): the record, the logs and the cells."""
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("stock", 0, {"2": 10.0, "4": 40.0}), ("patched", 0, {"2": 10.0, "4": 40.0})])))
    cells = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]]
    sides = {v: sorted(_events(cells) + launches(v == "patched", 0.1), key=lambda e: e["t"]) for v in ("stock", "patched")}
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": sides["stock"]},
                                        "timeline/patched-boot0/timeline-2.json": {"events": sides["patched"]}})
    return rec, logs, cells


def test_ftimes_pool_whole_steady_iterations_per_concurrency_stock_beside_patched(tmp_path: Path, capsys) -> None:
    """``--ftimes`` takes a decode launch whose previous launch was a decode too (its ``ftimes``
    then cover one whole iteration), averages each timed function's ms and calls over those
    iterations, and leaves out the decode right after a prefill and launches outside the cell."""
    def launches(patched: bool, t: float) -> list[dict]:
        ev = []
        ev.append({"kind": "run", "t": t, "t1": t + 0.01, "mode": "EXTEND", "extend": True, "bs": 2,
                   "rids": ["z1", "z2"], "ftimes": {"FutureMap.publish": [1, 50.0]}})
        for k in range(1, 5):  # k = 1 is the decode right after the prefill: left out
            own = {"FutureMap.resolve_future": [1, 0.05]}
            own.update({"FutureMap.publish": [1, 0.02 * k], "FutureMap.stash": [2, 0.1]} if patched
                       else {"FutureMap.store_to_map": [1, 0.04]})
            if k == 1:
                own["FutureMap.resolve_future"] = [1, 99.0]
            ev.append({"kind": "run", "t": t + 0.02 * k, "t1": t + 0.02 * k + 0.015, "mode": "DECODE",
                       "extend": False, "bs": 8, "ftimes": own})
        return ev

    rec, logs, cells = _ftimes_case(tmp_path, launches)
    assert spb.main(["--ftimes", "--json", str(rec), str(logs)]) == 0
    rows = json.loads(capsys.readouterr().out)["ftimes"]
    stock, patched = [r for r in rows if r["concurrency"] == 4]
    # k = 2 and 3 have a next launch to measure the period against; k = 4 is the last launch.
    assert (stock["variant"], stock["iterations"], stock["period_ms"]) == ("stock", 2, 20.0)
    assert stock["functions"] == {"FutureMap.resolve_future": {"calls": 1.0, "ms": 0.05},
                                  "FutureMap.store_to_map": {"calls": 1.0, "ms": 0.04}}
    assert patched["functions"]["FutureMap.publish"] == {"calls": 1.0, "ms": 0.05}  # (0.04 + 0.06) / 2
    assert patched["functions"]["FutureMap.stash"] == {"calls": 2.0, "ms": 0.1}
    assert spb.main(["--ftimes", str(rec), str(logs)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 4 | patched |")]
    assert lines[0] == "| 4 | patched | 2 / 2 | 20.00 -> 20.00 | FutureMap.stash | - | 0.100 (2) | +0.100 |"
    assert any(line.endswith("| FutureMap.store_to_map | 0.040 (1) | - | -0.040 |") for line in lines)
    assert spb.main(["--ftimes", "--functions", str(rec), str(logs)]) == 2
    capsys.readouterr()
    plain = _tar(tmp_path / "p.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events(cells)}})
    assert spb.main(["--ftimes", str(rec), str(plain)]) == 1
    assert "no timed functions" in capsys.readouterr().err


def test_core_speed_sets_one_request_prefill_launches_beside_the_cores_speed(tmp_path: Path, capsys) -> None:
    """``--core-speed`` takes the one-request prefill launches that carry ``core_us`` (not larger
    prefills, not decodes), and per side the medians of the launch, its CPU time, the core's
    reading (mean of before and after), the driver's and CPU time per core microsecond; the
    table sets patched against stock. A side whose launch is longer on a core slower by the same
    share reads the same CPU per core unit."""
    def launches(patched: bool, t: float) -> list[dict]:
        slow = 1.2 if patched else 1.0
        ev = []
        for k, (cpu, core) in enumerate(((10.0, 50.0), (12.0, 60.0), (14.0, 70.0))):
            ev.append({"kind": "run", "t": t + 0.05 * k, "t1": t + 0.05 * k + cpu * slow / 1e3, "mode": "EXTEND",
                       "extend": True, "bs": 1, "rids": [f"z{k}"], "cpu_ms": cpu * slow,
                       "core_us": [core * slow - 2, core * slow + 2], "driver_us": [20.0, 22.0],
                       **({"kernel_us": [30.0 + k, 32.0 + k], "gc": [k, int(k == 2), 0, 0.3 * k]} if patched else {})})
        ev.append({"kind": "run", "t": t + 0.2, "t1": t + 0.23, "mode": "EXTEND", "extend": True, "bs": 2,
                   "rids": ["y1", "y2"], "cpu_ms": 99.0, "core_us": [999.0, 999.0]})
        ev.append({"kind": "run", "t": t + 0.3, "t1": t + 0.31, "mode": "DECODE", "extend": False, "bs": 3,
                   "cpu_ms": 5.0, "core_us": [999.0, 999.0]})
        return ev

    rec, logs, _ = _ftimes_case(tmp_path, launches)
    assert spb.main(["--core-speed", "--json", str(rec), str(logs)]) == 0
    stock, patched = [r for r in json.loads(capsys.readouterr().out)["core_speed"] if r["concurrency"] == 4]
    assert stock == {"concurrency": 4, "variant": "stock", "launches": 3, "launch_ms": 12.0, "cpu_ms": 12.0,
                     "core_us": 60.0, "driver_us": 21.0, "cpu_per_core": 0.2, "kernel_us": None, "gc_ms": None,
                     "gc_old_share": None}  # a record from before the kernel and GC readings
    assert (patched["cpu_ms"], patched["core_us"], patched["cpu_per_core"]) == (14.4, 72.0, 0.2)
    assert (patched["kernel_us"], patched["gc_ms"], patched["gc_old_share"]) == (32.0, 0.3, 0.333)
    assert spb.main(["--core-speed", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("One-request prefill launches and the core's speed around them")
    assert ("| 4 | patched | 3 | 14.40 (x1.200) | 14.40 (x1.200) | 72.0 (x1.200) | 21.0 (x1.000) | 0.2000 (x1.000) "
            "| 32.0 | 0.300 | 33% |") in table
    assert "| 4 | stock | 3 | 12.00 | 12.00 | 60.0 | 21.0 | 0.2000 | - | - | - |" in table
    plain = _tar(tmp_path / "p.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events([["a"]])}})
    assert spb.main(["--core-speed", str(rec), str(plain)]) == 1
    assert "SMOKE_CORE_SPEED=1" in capsys.readouterr().err
    assert spb.main(["--core-speed", "--launches", str(rec), str(logs)]) == 2


def test_core_pairs_set_each_boot_pairs_ttft_beside_its_cores_and_compare_at_equal_core_speed(
        tmp_path: Path, capsys) -> None:
    """``--core-pairs``: per boot pair, stock / patched TTFT p50 beside stock / patched of the
    servers' median core reading over their one-request prefill launches in the cell (larger
    prefills and launches without a reading left out). Pairs whose TTFT ratio is 0.95 x core
    ratio ^ 0.5 fit slope 0.5 and read x0.95 at equal core speed, with no scatter left; as
    measured they scatter with the cores. A given --slope is used instead of the fit. Each pair
    also sets its two servers' launch CPU time per core microsecond side by side (other / stock),
    summed up per concurrency as the median pair and the pairs above, within and below 1%."""
    cells = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]]
    core_ratios = (0.8, 1.0, 1.25, 1.5625)
    runs, files = [], {}
    for boot, cr in enumerate(core_ratios):
        ttft_ratio = 0.95 * cr ** 0.5
        for variant, core, ttft in (("stock", 100.0 * cr, 40.0), ("patched", 100.0, 40.0 / ttft_ratio)):
            ev = [{"kind": "run", "t": 0.1 + 0.05 * k, "t1": 0.11 + 0.05 * k, "mode": "EXTEND", "extend": True,
                   "bs": 1, "rids": [f"z{k}"], "cpu_ms": 10.0, "core_us": [core - d, core + d]}
                  for k, d in enumerate((1.0, 0.0, 3.0))]  # the median of the means: core
            ev += [{"kind": "run", "t": 0.3 + 0.02 * k, "t1": 0.31 + 0.02 * k, "mode": "EXTEND", "extend": True,
                    "bs": 2, "rids": [f"y{k}", f"v{k}"], "cpu_ms": 9.0, "core_us": [999.0, 999.0]}
                   for k in range(3)]  # larger prefills: as many readings, left out
            ev.append({"kind": "run", "t": 0.37, "t1": 0.38, "mode": "EXTEND", "extend": True, "bs": 1,
                       "rids": ["y3"]})  # no reading
            files[f"timeline/{variant}-boot{boot}/timeline-{boot}.json"] = {
                "events": sorted(_events(cells) + ev, key=lambda e: e["t"])}
            runs.append((variant, boot, {"2": 10.0, "4": ttft}))
    rec = tmp_path / "pairs" / "serve-bench.json"
    rec.parent.mkdir()
    rec.write_text(json.dumps(_record(runs)))
    logs = _tar(tmp_path / "pairs" / "serve-logs.tar.gz", files)

    assert spb.main(["--core-pairs", "--json", str(rec), str(logs)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["record"], r["boot"], r["concurrency"]) for r in out["core_pairs"]] == [("pairs", b, 4) for b in range(4)]
    assert [round(r["core_ratio"], 4) for r in out["core_pairs"]] == list(core_ratios)
    assert [round(r["ttft_ratio"], 4) for r in out["core_pairs"]] == [round(0.95 * c ** 0.5, 4) for c in core_ratios]
    (summary,) = out["summary"]
    assert (summary["concurrency"], summary["variant"], summary["pairs"]) == (4, "patched", 4)
    assert summary["slope"] == pytest.approx(0.5) and summary["correlation"] == pytest.approx(1.0)
    assert summary["equal_core"]["ratio"] == pytest.approx(0.95)
    assert summary["equal_core"]["ci95"] == pytest.approx([0.95, 0.95])
    low, high = summary["measured"]["ci95"]
    assert low < 0.95 < high and high - low > 0.1  # the cores' scatter, as measured
    assert spb.main(["--core-pairs", "--slope", "0", "--json", str(rec), str(logs)]) == 0
    (given,) = json.loads(capsys.readouterr().out)["summary"]
    assert given["slope_given"] and given["equal_core"] == given["measured"]
    assert spb.main(["--core-pairs", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    # Equal CPU times on cores of the pair's ratio: the launch's CPU per core us follows the cores.
    assert [round(r["cpu_per_core_ratio"], 4) for r in out["core_pairs"]] == list(core_ratios)
    assert "| pairs | 0 | 4 | patched | x0.850 | x0.800 | x0.800 |" in table
    assert "| 4 | patched | 4 | x1.125 | x0.800 - x1.562 | 2 / 1 / 1 |" in table
    no_cpu = dict(out["core_pairs"][0], cpu_per_core_ratio=None)
    assert "| pairs | 0 | 4 | patched | x0.850 | x0.800 | - |" in spb.core_pair_table([no_cpu], [])
    assert "| 4 | patched | 4 | x1.118 | 0.50 | 1.00 | x" in table and "| x0.950 [0.950, 0.950] |" in table
    plain = _tar(tmp_path / "p.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events(cells)}})
    assert spb.main(["--core-pairs", str(rec), str(plain)]) == 1
    assert "SMOKE_CORE_SPEED=1" in capsys.readouterr().err
    # --rename: the record's patched pairs counted under another name (and only that record's).
    assert spb.main(["--core-pairs", "--json", "--rename", "pairs:patched=patched-skip-idle",
                     "--rename", "other:patched=x", str(rec), str(logs)]) == 0
    renamed = json.loads(capsys.readouterr().out)
    assert {r["variant"] for r in renamed["core_pairs"]} == {"patched-skip-idle"}
    assert [(s["variant"], s["pairs"]) for s in renamed["summary"]] == [("patched-skip-idle", 4)]
    for bad in (["--core-pairs", "--rename", "patched=x"], ["--core-pairs", "--rename", "pairs:patched"],
                ["--launches", "--rename", "pairs:patched=x"]):
        assert spb.main([*bad, str(rec), str(logs)]) == 2
        assert capsys.readouterr().err.count("\n") == 1  # one line, no traceback
    assert spb.main(["--slope", "0.5", "--core-speed", str(rec), str(logs)]) == 2
    assert spb.main(["--core-pairs", "--core-speed", str(rec), str(logs)]) == 2


def test_ftimes_prefill_pools_one_request_prefill_launches_stock_beside_patched(tmp_path: Path, capsys) -> None:
    """``--ftimes --prefill`` takes the one-request prefill launches of each cell's window (not
    larger prefills, not decodes, not launches outside the cell), their mean launch time and
    each timed function's ms and calls per launch."""
    def launches(patched: bool, t: float) -> list[dict]:
        ev = []
        for k, launch in enumerate((0.010, 0.014)):
            own = {"ScheduleBatch.prepare_for_extend": [1, 1.0 + k], "ModelRunner.forward": [2, 5.0]}
            if patched:
                own["FutureMap.publish"] = [1, 0.5]
            ev.append({"kind": "run", "t": t + 0.05 * k, "t1": t + 0.05 * k + launch, "mode": "EXTEND",
                       "extend": True, "bs": 1, "rids": [f"z{k}"], "ftimes": own})
        ev.append({"kind": "run", "t": t + 0.2, "t1": t + 0.23, "mode": "EXTEND", "extend": True, "bs": 2,
                   "rids": ["y1", "y2"], "ftimes": {"ModelRunner.forward": [2, 99.0]}})
        ev.append({"kind": "run", "t": t + 0.3, "t1": t + 0.31, "mode": "DECODE", "extend": False, "bs": 3,
                   "ftimes": {"ModelRunner.forward": [1, 77.0]}})
        return ev

    rec, logs, _ = _ftimes_case(tmp_path, launches)
    assert spb.main(["--ftimes", "--prefill", "--json", str(rec), str(logs)]) == 0
    rows = json.loads(capsys.readouterr().out)["ftimes"]
    stock, patched = [r for r in rows if r["concurrency"] == 4]
    assert (stock["variant"], stock["iterations"], stock["period_ms"]) == ("stock", 2, 12.0)
    assert stock["functions"] == {"ModelRunner.forward": {"calls": 2.0, "ms": 5.0},
                                  "ScheduleBatch.prepare_for_extend": {"calls": 1.0, "ms": 1.5}}
    assert patched["functions"]["FutureMap.publish"] == {"calls": 1.0, "ms": 0.5}
    assert spb.main(["--ftimes", "--prefill", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("Exact host time per one-request prefill launch, by timed function")
    assert "mean over launches; ms, calls per launch in brackets" in table
    assert "| 4 | patched | 2 / 2 | 12.00 -> 12.00 | FutureMap.publish | - | 0.500 (1) | +0.500 |" in table
    assert spb.main(["--prefill", str(rec), str(logs)]) == 2
    assert "--prefill goes with --ftimes" in capsys.readouterr().err


def test_profile_relay_host_times_each_relay_function_of_an_eager_decode(spec_future_map) -> None:
    """``scripts/profile_relay_host.py``'s relay part on CPU: SGLang's FutureMap as patched, an
    eager decode batch (above ``--graph-bs``) through the six relay functions in the scheduler's
    order, every iteration's host lengths exact (it raises otherwise), a time for each."""
    import profile_relay_host as prh

    args = prh.parse_args(["--iters", "5", "--rounds", "3", "--pool", "64", "--graph-bs", "2"])
    costs = prh.relay_costs(args, 4, device="cpu")
    assert list(costs) == [*prh.RELAY_ORDER, "sum"]
    assert all(v > 0 for v in costs.values())
    assert costs["sum"] == pytest.approx(sum(costs[k] for k in prh.RELAY_ORDER), abs=0.05)
    # A batch a graph replays has no host lengths to check: the script refuses to call that a relay.
    args = prh.parse_args(["--iters", "2", "--rounds", "1", "--pool", "64", "--graph-bs", "8"])
    with pytest.raises(AssertionError, match="lost the lengths"):
        prh.relay_costs(args, 4, device="cpu")


def _state_server(cpu_ms: list[float], compile_at: int | None = None) -> list[dict]:
    """One server's timeline for ``_record``'s cells with every request prefilled alone: the
    ``k``-th prefill took ``cpu_ms[k]`` of scheduler-thread CPU, and its request's API TTFT is
    5 + 2 x that; ``compile_at``: that prefill compiled a Triton kernel (its request then 500 ms)."""
    rids = ["w1", "w2", "a", "b", "c", "d", "x1", "x2", "x3", "x4", *[f"s{i}" for i in range(8)]]
    ev = _events([[r] for r in rids])
    runs = [e for e in ev if e["kind"] == "run" and e["extend"]]
    ttft = {}
    for k, (run, cpu) in enumerate(zip(runs, cpu_ms, strict=True)):
        run["cpu_ms"] = cpu
        ttft[run["rids"][0]] = 500.0 if k == compile_at else 5 + 2 * cpu
        if k == compile_at:
            ev.append({"kind": "compile", "t": run["t"], "t1": run["t1"], "kernel": "k", "key": "", "where": []})
    return ev + _api(ev, ttft, [])


def test_host_states_split_each_servers_prefills_into_its_fast_and_slow_state(tmp_path: Path, capsys) -> None:
    # stock fast throughout (10 ms); patched as fast, but slow (18 ms: 1.8x) for cell 2's four requests
    stock = [10.0] * 18
    patched = [10.0, 10.0, 18.0, 18.0, 18.0, 18.0] + [10.0] * 12
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("stock", 0, {"2": 25.0, "4": 25.0}), ("patched", 1, {"2": 41.0, "4": 25.0})])))
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _state_server(stock, 10)},
                                        "timeline/patched-boot1/timeline-2.json": {"events": _state_server(patched)}})
    assert spb.main(["--host-states", "--json", str(rec), str(logs)]) == 0
    doc = json.loads(capsys.readouterr().out)
    servers = {s["variant"]: s for s in doc["servers"]}
    assert servers["stock"]["launches"] == 17  # the one that compiled is left out
    assert (servers["stock"]["fast_ms"], servers["stock"]["slow_share"]) == (10.0, 0.0)
    assert (servers["patched"]["fast_ms"], servers["patched"]["slow_share"]) == (10.0, round(4 / 18, 3))
    two, four = doc["cells"]
    assert two["requests"] == [4, 4] and two["slow_share"] == [0.0, 1.0]
    # the cell reads 25 -> 41 ms, and at equal host state stock's fast requests have no slow counterpart
    assert two["p50_all_ms"] == [25.0, 41.0] and two["ratio_all"] == round(25 / 41, 3)
    assert two["p50_fast_ms"] == [25.0, None] and two["ratio_fast"] is None
    assert two["p50_slow_ms"] == [None, 41.0] and two["ratio_slow"] is None
    # cell 4: s0 compiled on stock and is left out; the rest is fast on both sides and equal
    assert four["requests"] == [7, 8] and four["ratio_fast"] == 1.0 and four["p50_slow_ms"] == [None, None]
    [st, pa] = doc["variants"]
    assert (st["variant"], st["servers"], st["slow_share"]) == ("stock", 1, [0.0, 0.0, 0.0])
    assert pa["slow_share"] == [round(4 / 18, 3)] * 3 and pa["fast_ms"] == 10.0
    # the first cell (cell 2 with its warm-up: 6 prefills, 4 slow) against the later one (none)
    assert (servers["patched"]["first_cell_slow_share"], servers["patched"]["later_slow_share"]) == (round(4 / 6, 3), 0.0)
    assert (pa["first_cell_slow_share"], pa["later_slow_share"]) == (round(4 / 6, 3), 0.0)
    assert spb.main(["--host-states", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    assert "| patched | 1 | 18 | 10.00 | 22% (22 - 22%) | 67% / 0% |" in table
    assert "| 2 | 4 / 4 | 0% -> 100% | 25.0 -> 41.0 (x0.610) | 25.00 -> - | - -> 41.00 |" in table
    assert "| 4 | 7 / 8 | 0% -> 0% | 25.0 -> 25.0 (x1.000) | 25.0 -> 25.0 (x1.000) | - -> - |" in table
    # timelines without cpu_ms (before 2026-11-26) have nothing to tell; the flags are exclusive
    old = _tar(tmp_path / "o.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events([[r] for r in (
        "w1", "w2", "a", "b", "c", "d", "x1", "x2", "x3", "x4", *[f"s{i}" for i in range(8)])])}})
    assert spb.main(["--host-states", str(rec), str(old)]) == 1
    assert "no one-request prefill with its CPU time" in capsys.readouterr().err
    assert spb.main(["--host-states", "--host-speed", str(rec), str(logs)]) == 2
    capsys.readouterr()
    # a side the records do not have is named, not an empty table
    assert spb.main(["--host-states", "--variant", "patched-x", str(rec), str(logs)]) == 2
    assert ("no patched-x servers in these records (they have: patched, stock); name the sides with --variant "
            "/ --base") in capsys.readouterr().err
    assert json.loads(json.dumps(spb.host_state_summary(spb.host_state_rows([("r", json.loads(rec.read_text()),
                                                                              spb.timelines(logs))]), "patched-x")))["cells"] == []


def test_host_states_set_a_switch_against_patched_with_base(tmp_path: Path, capsys) -> None:
    """A record of the plugin against one of its switches has no stock: ``--base patched``."""
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(_record([("patched", 0, {"2": 25.0, "4": 25.0}), ("patched-x", 1, {"2": 41.0, "4": 25.0})])))
    fast, slow = [10.0] * 18, [10.0, 10.0, 18.0, 18.0, 18.0, 18.0] + [10.0] * 12
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/patched-boot0/timeline-1.json": {"events": _state_server(fast)},
                                        "timeline/patched-x-boot1/timeline-2.json": {"events": _state_server(slow)}})
    assert spb.main(["--host-states", "--variant", "patched-x", str(rec), str(logs)]) == 2  # no stock here
    assert "no stock servers in these records (they have: patched, patched-x)" in capsys.readouterr().err
    assert spb.main(["--host-states", "--base", "patched", "--variant", "patched-x", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    assert "| conc | requests in one-request prefills (patched / patched-x) |" in table
    assert "| 2 | 4 / 4 | 0% -> 100% | 25.0 -> 41.0 (x0.610) | 25.00 -> - | - -> 41.00 |" in table
    assert spb.main(["--strata", "--base", "patched", str(rec), str(logs)]) == 2
    assert "--base goes with --host-states" in capsys.readouterr().err


def test_host_states_say_on_which_physical_core_each_server_ran_slow_and_whether_it_was_preempted(
        tmp_path: Path, capsys) -> None:
    # patched's four slow prefills (cell 2) ended on CPU 5, the sibling of CPU 1 (one physical
    # core), three of them preempted; its fast ones on CPU 2, one preempted
    patched = [10.0, 10.0, 18.0, 18.0, 18.0, 18.0] + [10.0] * 12
    ev = _state_server(patched)
    for k, run in enumerate(e for e in ev if e["kind"] == "run" and e["extend"]):
        run["core"], run["preempted"] = (5, int(k < 5)) if 2 <= k < 6 else (2, int(k == 0))
    stock = _state_server([10.0] * 18)  # a timeline from before 2026-11-27: no core, no preempted
    doc = _record([("stock", 0, {"2": 25.0, "4": 25.0}), ("patched", 1, {"2": 41.0, "4": 25.0})])
    doc["environment"]["cpu_cores"] = [[0, 4], [1, 5], [2, 6], [3, 7]]
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(doc))
    logs = _tar(tmp_path / "l.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": stock},
                                        "timeline/patched-boot1/timeline-2.json": {"events": ev}})
    assert spb.main(["--host-states", "--json", str(rec), str(logs)]) == 0
    servers = {s["variant"]: s for s in json.loads(capsys.readouterr().out)["servers"]}
    assert servers["patched"]["cores"] == {"2,6": [14, 0], "1,5": [4, 4]}
    assert servers["patched"]["preempted"] == [0.75, round(1 / 14, 3)]
    assert "cores" not in servers["stock"] and "preempted" not in servers["stock"]
    assert spb.main(["--host-states", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    assert "| patched | . | 1 | 18 | 10.00 | 22% | 2,6: 14 (0); 1,5: 4 (4) | 75% / 7% |" in table.replace(str(tmp_path), ".")
    assert "| stock | . | 0 | 18 | 10.00 | 0% | - | - |" in table.replace(str(tmp_path), ".")
    # without the record's cpu_cores each CPU stands for itself
    assert spb.where_slow([{"cpu_ms": 20.0, "core": 5, "preempted": 0}], 10.0, None) == {
        "cores": {"5": [1, 1]}, "preempted": [0.0, None]}


def test_census_matches_each_sides_launches_prompt_by_prompt_and_lists_the_calls_that_differ(
        tmp_path: Path, capsys) -> None:
    """``--census``: per boot, each stock census launch meets the other side's first unmatched
    launch of the same token count (a health check's launch before them on one side only shifts
    nothing; launches without a partner are counted apart); per matched launch, both sides' Python
    and C calls and every call whose count differs (this side less stock), largest first. A
    function the plugin edited by text (compiled under its own file name) counts as SGLang's."""
    edited = ("py <__sglang_futuremap_patch__ edit of sglang.srt.managers.schedule_batch:"
              "ScheduleBatch.prepare_for_extend 0123456789ab>:prepare_for_extend")  # compiled at module level

    def launch(t: float, tokens: int, extra: dict[str, int]) -> dict:
        census = {"py model_runner.py:ModelRunner.forward": 2, "c TensorBase.copy_": 10,
                  "py schedule_batch.py:ScheduleBatch.prepare_for_extend": 1, **extra}
        return {"kind": "run", "t": t, "t1": t + 0.01, "mode": "EXTEND", "extend": True, "bs": 1, "rids": [f"r{t}"],
                "census": census, "tokens": tokens}

    files = {}
    for boot in (0, 1):
        stock = [launch(1.0, 5, {}), launch(2.0, 9, {}), launch(3.0, 4, {})]
        patched = [launch(0.5, 1, {"c TensorBase.copy_": 50}),  # a health check's prefill, this side only
                   launch(1.0, 5, {"c TensorBase.copy_": 13, "py publish_stash.py:publish": 1}),
                   launch(2.0, 9, {"c TensorBase.copy_": 11, "py publish_stash.py:publish": 1}),
                   launch(3.0, 6, {"c TensorBase.copy_": 99})]  # another prompt: not matched
        # The plugin's edit of prepare_for_extend, under its own file name: the same function.
        for ev in patched:
            ev["census"][edited] = ev["census"].pop("py schedule_batch.py:ScheduleBatch.prepare_for_extend")
        for variant, evs in (("stock", stock), ("patched", patched)):
            files[f"timeline/{variant}-boot{boot}/timeline-{boot}.json"] = {"events": evs}
    rec = tmp_path / "serve-bench.json"
    rec.write_text(json.dumps(_record([(v, b, {"2": 10.0}) for b in (0, 1) for v in ("stock", "patched")])))
    logs = _tar(tmp_path / "serve-logs.tar.gz", files)

    assert spb.main(["--census", "--json", str(rec), str(logs)]) == 0
    (row,) = json.loads(capsys.readouterr().out)["census"]
    assert (row["variant"], row["matched"], row["unmatched"]) == ("patched", 4, 6)  # per boot: 4, 6, 1
    assert row["py_calls"] == [3.0, 4.0] and row["c_calls"] == [10.0, 12.0]
    assert row["differ"] == 2
    assert row["top"] == [{"call": "c TensorBase.copy_", "stock": 10.0, "difference": 2.0},
                          {"call": "py publish_stash.py:publish", "stock": 0.0, "difference": 1.0}]
    assert spb.census_name(edited) == "py schedule_batch.py:ScheduleBatch.prepare_for_extend"
    assert spb.main(["--census", str(rec), str(logs)]) == 0
    table = capsys.readouterr().out
    assert "| patched | 4 (6) | 3.0 -> 4.0 (+1.0) | 10.0 -> 12.0 (+2.0) | 2 |" in table
    assert "| `c TensorBase.copy_` | 10.0 | +2.0 |" in table
    plain = _tar(tmp_path / "p.tar.gz", {"timeline/stock-boot0/timeline-1.json": {"events": _events([["a"]])}})
    assert spb.main(["--census", str(rec), str(plain)]) == 1
    assert "SMOKE_CALL_CENSUS" in capsys.readouterr().err
    assert spb.main(["--census", "--core-speed", str(rec), str(logs)]) == 2
    assert "time inside C calls" not in table and "timed" not in row  # a run without the times

    # With SMOKE_CALL_CENSUS_TIMES: both sides' C-call time per matched launch, and the C calls
    # whose time differs most (an edited function's name as SGLang's, as the counts).
    for name in list(files):
        for ev in files[name]["events"]:
            patched = name.startswith("timeline/patched")
            ev["census_ms"] = {"c CUDAGraph.replay": 4.0 if patched else 3.0, "c TensorBase.copy_": 1.0}
    timed_logs = _tar(tmp_path / "timed.tar.gz", files)
    assert spb.main(["--census", "--json", str(rec), str(timed_logs)]) == 0
    (timed,) = json.loads(capsys.readouterr().out)["census"]
    assert timed["timed"] == 4 and timed["c_ms"] == [4.0, 5.0]
    assert timed["top_ms"][0] == {"call": "c CUDAGraph.replay", "stock_ms": 3.0, "this_ms": 4.0, "difference_ms": 1.0}
    assert spb.main(["--census", str(rec), str(timed_logs)]) == 0
    table = capsys.readouterr().out
    assert "4.00 -> 5.00 ms (x1.250)" in table and "| `c CUDAGraph.replay` | 3.000 | 4.000 | +1.000 |" in table


def test_join_reads_a_boot_finished_in_the_next_call_as_one_record(tmp_path: Path, capsys) -> None:
    """``--join``: a call whose ``--budget`` cut stock's boot 1 off before its server was ready
    (its timeline holds a few events under ``stock-boot1``), and the next call on the same machine
    that ran that server: read as one record, boot 1 pairs across them and the cut-off run's
    timeline is not used; read apart, boot 1 has no pair. Records that differ in configuration
    are refused in one line."""
    cells = [["w1", "w2"], ["a"], ["b", "c", "d"], ["x1", "x2", "x3", "x4"], [f"s{i}" for i in range(8)]]

    def timeline(core: float) -> dict:
        ev = [{"kind": "run", "t": 0.1 + 0.05 * k, "t1": 0.11 + 0.05 * k, "mode": "EXTEND", "extend": True,
               "bs": 1, "rids": [f"z{k}"], "cpu_ms": 10.0, "core_us": [core, core]} for k in range(3)]
        return {"events": sorted(_events(cells) + ev, key=lambda e: e["t"])}

    def call(name: str, runs: list[tuple[str, int, dict[str, float], float]], cut: bool) -> tuple[Path, Path]:
        doc = _record([(v, b, c) for v, b, c, _ in runs])
        files = {f"timeline/{v}-boot{b}/timeline-{b}.json": timeline(core) for v, b, _, core in runs}
        if cut:
            doc["runs"].append({"variant": "stock", "boot": 1, "cells": {}, "error": "server not ready in time"})
            files["timeline/stock-boot1/timeline-9.json"] = {"events": _events([["w1"]])}
        rec = tmp_path / name / "serve-bench.json"
        rec.parent.mkdir()
        rec.write_text(json.dumps(doc))
        return rec, _tar(tmp_path / name / "serve-logs.tar.gz", files)

    first = call("t0", [("stock", 0, {"2": 10.0, "4": 40.0}, 100.0), ("patched", 0, {"2": 10.0, "4": 50.0}, 100.0),
                        ("patched", 1, {"2": 10.0, "4": 30.0}, 100.0)], cut=True)
    second = call("t1", [("stock", 1, {"2": 10.0, "4": 36.0}, 120.0)], cut=False)
    args = ["--core-pairs", "--json", *map(str, first), *map(str, second)]
    assert spb.main(args) == 0
    apart = json.loads(capsys.readouterr().out)["core_pairs"]
    assert [(r["record"], r["boot"]) for r in apart] == [("t0", 0)]
    assert spb.main(["--join", *args]) == 0
    joined = json.loads(capsys.readouterr().out)["core_pairs"]
    assert [(r["record"], r["boot"]) for r in joined] == [("t0", 0), ("t0", 1)]
    assert [round(r["ttft_ratio"], 3) for r in joined] == [0.8, 1.2]
    assert round(joined[1]["core_ratio"], 3) == 1.2  # stock's 120 us from the later call, not the cut-off run
    # In either order: the cut-off run's timeline never stands in for the run that has the cells.
    assert spb.main(["--join", "--core-pairs", "--json", *map(str, second), *map(str, first)]) == 0
    assert json.loads(capsys.readouterr().out)["core_pairs"] == [dict(r, record="t1") for r in joined]
    # One record is nothing to join (gpu_serve_bench.py --join says the same).
    assert spb.main(["--join", "--core-pairs", *map(str, first)]) == 2
    assert capsys.readouterr().err.strip() == "serve_prefill_batches: --join reads two records or more (each with its logs)"
    other = json.loads(second[0].read_text())
    other["environment"]["config"]["rounds"] = 3
    second[0].write_text(json.dumps(other))
    assert spb.main(["--join", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differ in rounds" in err
    assert spb.main(["--join", "--token-times", *map(str, first), *map(str, second)]) == 2
    assert capsys.readouterr().err.strip() == "serve_prefill_batches: --join does not go with --token-times"
