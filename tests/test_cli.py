"""The command line: ``status --json``, one line instead of a traceback, ``patches export``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sglang_futuremap_patch as plugin
from sglang_futuremap_patch import _engine, cli, series_tools

from conftest import ROOT, plugin_only, subprocess_env

PATCHES = ROOT / "patches"


def _status_json(capsys) -> tuple[int, dict]:
    rc = cli.main(["status", "--json"])
    return rc, json.loads(capsys.readouterr().out)


@plugin_only
def test_status_json_names_every_target_and_its_state(clean_state, capsys):
    rc, report = _status_json(capsys)
    assert rc == 0
    assert report["plugin_version"] == plugin.__version__
    assert report["sglang_version"] == _engine.sglang_version()
    assert (report["mode"], report["verdict"]) == ("safe", "patch")
    assert [bp["id"] for bp in report["backports"]] == [bp.id for bp in clean_state]
    for found, declared in zip(report["backports"], clean_state):
        assert found["upstream_prs"] == list(declared.upstream_prs)
        assert found["patch"] == declared.patch_file
        assert [t["path"] for t in found["targets"]] == [t.path for t in declared.targets]
        assert {t["state"] for t in found["targets"]} == {"ready"}

    plugin.apply(mode="strict")
    rc, report = _status_json(capsys)
    assert rc == 0 and report["verdict"] == "applied"
    states = {t["state"] for bp in report["backports"] for t in bp["targets"]}
    assert states == {"applied", "ready"}  # guards are checked, never replaced


def test_status_json_exit_codes(clean_state, capsys, monkeypatch):
    import sglang

    monkeypatch.setattr(sglang, "__version__", "0.5.11")
    rc, report = _status_json(capsys)
    assert rc == 1 and report["verdict"] == "unsupported" and report["backports"] == []
    monkeypatch.setattr(sglang, "__version__", "0.5.13")
    rc, report = _status_json(capsys)
    assert rc == 0 and report["verdict"] == "upstream"
    monkeypatch.setenv("SGLANG_FUTUREMAP_PATCH", "bogus")
    rc, report = _status_json(capsys)
    assert rc == 2 and report["mode"] == "invalid"


#: A broken SGLang install: its module-level ``from torchvision.io import ...`` fails.
BROKEN = (
    "import sys\n"
    "sys.modules['torchvision'] = None\n"
    "from sglang_futuremap_patch.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("argv", [["status"], ["status", "--json"], ["verify"]])
def test_no_traceback_when_sglang_does_not_import(argv):
    out = subprocess.run([sys.executable, "-c", BROKEN, *argv], env=subprocess_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == cli.EXIT_NO_SGLANG, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr[-2000:]
    assert "SGLang cannot be imported (ModuleNotFoundError" in errors[0] and "torchvision" in errors[0]
    assert "scripts/cpu-env.sh" in errors[0]
    if "--json" in argv:
        report = json.loads(out.stdout)
        assert report["verdict"] == "unavailable" and "torchvision" in report["reason"]
    else:
        assert out.stdout == ""


def test_no_sglang_at_all_says_to_install_it(monkeypatch, capsys):
    monkeypatch.setattr(_engine, "sglang_import_error",
                        lambda: "ModuleNotFoundError: No module named 'sglang'")
    assert cli.main(["verify"]) == cli.EXIT_NO_SGLANG
    assert "install SGLang 0.5.12.x" in capsys.readouterr().err


def test_an_unexpected_error_is_one_line(monkeypatch, capsys):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "status", broken)
    assert cli.main(["status"]) == 1
    assert capsys.readouterr().err == (
        "error: unexpected RuntimeError: boom (rerun with --traceback for details)\n")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["--traceback", "status"])


def test_patches_export_writes_the_series(tmp_path, capsys):
    out = tmp_path / "series-out"
    assert cli.main(["patches", "export", "--out", str(out)]) == 0
    assert "git am -k --3way" in capsys.readouterr().out
    listed = [p.name for p in series_tools.series_patches(PATCHES)]
    expected = [series_tools.COVER_LETTER, *listed, series_tools.SERIES_FILE]
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    for path in out.iterdir():
        assert path.read_bytes() == (PATCHES / path.name).read_bytes(), path.name
    assert cli.main(["patches", "export", "--out", str(out)]) == 2  # never overwrites
    assert "not an empty folder" in capsys.readouterr().err


def test_the_readme_lists_every_switch_the_plugin_reads() -> None:
    # Each SGLANG_FUTUREMAP_* variable the package reads has a row in the README's switch tables.
    import re

    package = ROOT / "sglang_futuremap_patch"
    used = {m for f in package.rglob("*.py") for m in re.findall(r"SGLANG_FUTUREMAP_[A-Z0-9_]+", f.read_text())}
    readme = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^\| `(SGLANG_FUTUREMAP_[A-Z0-9_]+)` \|", readme, re.M))
    assert used - {"SGLANG_FUTUREMAP_PATCH"} <= rows, sorted(used - rows)
    assert "| `SGLANG_FUTUREMAP_PATCH` | effect |" in readme


@pytest.mark.parametrize("env, expected", [
    ({}, "back-port 16 on (SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST=unset); "
         "back-port 22 on (SGLANG_FUTUREMAP_MIRROR_RELAY=unset)"),
    ({"SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST": "0", "SGLANG_FUTUREMAP_MIRROR_RELAY": "1"},
     "back-port 16 off (SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST=0); "
     "back-port 22 on, chains too (SGLANG_FUTUREMAP_MIRROR_RELAY=1)"),
])
def test_status_says_what_trees_get_from_back_ports_16_and_22(clean_state, capsys, monkeypatch,
                                                               env, expected):
    for name in ("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", "SGLANG_FUTUREMAP_MIRROR_RELAY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cli.main(["status"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("on trees:")]
    assert line == f"on trees: {expected}; unset: on for trees, off for chains; 0: off"


@pytest.mark.parametrize("setting, skip, expected", [
    (None, None, "back-port 27 off (SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH=unset; 1: on); back-port 17's "
                 "barrier none after an idle poll (SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=unset; 0: at every poll)"),
    ("1", None, "back-port 27 on: the barrier after each launch (SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH=1; 1: on); "
                "back-port 17's barrier none after an idle poll (SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=unset; "
                "0: at every poll)"),
    ("yes", "0", "back-port 27 off (SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH=yes; 1: on); back-port 17's "
                 "barrier one every loop iteration (SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=0; 0: at every poll)"),
    (None, "1", "back-port 27 off (SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH=unset; 1: on); back-port 17's "
                "barrier none after an idle poll (SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=1; 0: at every poll)"),
])
def test_status_says_where_back_port_17s_barrier_runs(clean_state, capsys, monkeypatch,
                                                      setting, skip, expected):
    for name, value in (("SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH", setting),
                        ("SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE", skip)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    cli.main(["status"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("barrier:")]
    assert line == f"barrier:  {expected}"
