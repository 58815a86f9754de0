"""SGLang finds the plugin through its own entry-point group, in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from conftest import ROOT, subprocess_env


def test_entry_point_is_registered_in_sglangs_group():
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "futuremap_patch"]
    assert len(eps) == 1
    assert eps[0].value == "sglang_futuremap_patch._plugin:register"
    assert eps[0].load().__name__ == "register"


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=subprocess_env(**env), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


LOAD = (
    "from sglang.srt.plugins import load_plugins\n"
    "load_plugins(); load_plugins()\n"
    "from sglang.srt.managers.overlap_utils import FutureMap\n"
    "print('patched' if hasattr(FutureMap, 'publish') else 'stock')\n"
)


def test_load_plugins_applies_once_and_logs_one_line():
    out = _run(LOAD, SGLANG_FUTUREMAP_PATCH="safe")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "patched"
    lines = [l for l in out.stderr.splitlines() if "sglang_futuremap_patch:" in l]
    assert len(lines) == 1, lines
    from sglang_futuremap_patch.backports import SERIES

    assert f"applied {len(SERIES)} back-ports" in lines[0] and "SGLang 0.5.12" in lines[0]


def test_sglang_plugins_whitelist_is_honoured():
    out = _run(LOAD, SGLANG_PLUGINS="someone_else")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "stock"


def test_off_leaves_sglang_stock():
    out = _run(LOAD, SGLANG_FUTUREMAP_PATCH="off")
    assert out.stdout.strip().splitlines()[-1] == "stock"
    assert "sglang_futuremap_patch: disabled by SGLANG_FUTUREMAP_PATCH=off" in out.stderr


def test_invalid_mode_is_an_error_line_and_nothing_is_patched():
    out = _run(LOAD, SGLANG_FUTUREMAP_PATCH="on")
    assert out.returncode == 0
    assert out.stdout.strip().splitlines()[-1] == "stock"
    assert "SGLANG_FUTUREMAP_PATCH='on' is not one of off, safe, strict" in out.stderr


def test_strict_failure_stops_the_process_even_though_sglang_swallows_plugin_errors():
    code = (
        "import sglang\n"
        "sglang.__version__ = '0.5.11'\n"  # pretend another release
        + LOAD
    )
    out = _run(code, SGLANG_FUTUREMAP_PATCH="strict")
    assert out.returncode != 0
    assert "skipped, SGLang 0.5.11 left untouched" in out.stderr
    assert "patched" not in out.stdout and "stock" not in out.stdout


def test_cli_status_and_verify():
    status = subprocess.run([sys.executable, "-m", "sglang_futuremap_patch", "status"],
                            env=subprocess_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0, status.stderr[-2000:]
    assert "verdict:  patch" in status.stdout
    from sglang_futuremap_patch.backports import load_series

    assert status.stdout.count("    ready ") == sum(len(bp.targets) for bp in load_series())
    verify = subprocess.run([sys.executable, "-m", "sglang_futuremap_patch", "verify"],
                            env=subprocess_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert verify.stdout.rstrip().endswith("verify: OK")
    bad = subprocess.run([sys.executable, "-m", "sglang_futuremap_patch", "verify"],
                         env=subprocess_env(SGLANG_FUTUREMAP_PATCH="bogus"), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "is not one of" in bad.stderr


def test_a_broken_sglang_install_is_one_warning_that_says_why():
    """A scheduler process whose SGLang modules fail to import (here: sgl_kernel)."""
    out = _run("import sys\nsys.modules['sgl_kernel'] = None\n" + LOAD, SGLANG_FUTUREMAP_PATCH="safe")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "stock"
    lines = [l for l in out.stderr.splitlines() if "sglang_futuremap_patch:" in l]
    assert len(lines) == 1, lines
    assert "left untouched" in lines[0] and "ModuleNotFoundError" in lines[0] and "sgl_kernel" in lines[0]


def test_apply_when_sglang_itself_does_not_import(monkeypatch, caplog):
    from sglang_futuremap_patch import PatchError, _engine, apply

    monkeypatch.setattr(_engine, "sglang_import_error",
                        lambda: "ModuleNotFoundError: No module named 'torchvision'")
    report = apply(mode="safe")
    assert report.verdict.decision == "unavailable" and not report.applied
    assert ("left untouched: SGLang cannot be imported "
            "(ModuleNotFoundError: No module named 'torchvision')") in caplog.text
    with pytest.raises(PatchError, match="torchvision"):
        apply(mode="strict")
