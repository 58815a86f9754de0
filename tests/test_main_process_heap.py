"""scripts/main_process_heap.py: objects, modules and a full collection's time before and after
the plugin is installed, measured in this process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import main_process_heap as mph  # noqa: E402

_kept: list = []


def test_measure_counts_what_the_install_adds_and_times_full_collections() -> None:
    loaded: list[str] = []
    out = mph.measure(2, lambda: loaded.append("sglang"), lambda: _kept.append([[i] for i in range(5000)]))
    assert loaded == ["sglang"]
    assert out["plugin"]["objects"] - out["stock"]["objects"] >= 5000  # the lists the "install" kept
    assert out["plugin"]["modules"] == out["stock"]["modules"]
    assert all(side["full_collection_ms"] > 0 for side in out.values())


def test_main_prints_both_sides(monkeypatch, capsys) -> None:
    monkeypatch.setattr(mph, "_load", lambda: None)
    monkeypatch.setattr(mph, "_install", lambda: _kept.append({"x": [1]}))
    assert mph.main(["--repeat", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"stock", "plugin"} and set(out["stock"]) == {"objects", "modules", "full_collection_ms"}
    assert mph.main(["--repeat", "1"]) == 0
    text = capsys.readouterr().out
    assert "full collection" in text and "(median of 1)" in text


def test_requests_until_full_stops_at_the_collectors_own_full_collection() -> None:
    import gc

    calls: list[str] = []
    before = list(gc.callbacks)
    n = mph.requests_until_full(lambda: calls.append("load"), lambda: calls.append("install"), limit=100_000)
    assert calls == ["load", "install"] and 1 <= n < 100_000  # a full collection came by itself
    assert gc.callbacks == before  # its watcher is gone
    assert mph.requests_until_full(lambda: None, None, limit=3) <= 3


def test_until_full_prints_both_sides(monkeypatch, capsys) -> None:
    monkeypatch.setattr(mph, "until_full_sides", lambda: {"stock": 17845, "plugin": 16502})
    assert mph.main(["--until-full"]) == 0
    assert "stock 17845, plugin installed 16502" in capsys.readouterr().out
    assert mph.main(["--until-full", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"requests_until_full": {"stock": 17845, "plugin": 16502}}

    def failing():
        raise RuntimeError("the plugin process failed: boom")

    monkeypatch.setattr(mph, "until_full_sides", failing)
    assert mph.main(["--until-full"]) == 1
    assert "error: the plugin process failed: boom" in capsys.readouterr().err
