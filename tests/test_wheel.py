"""The package as a user gets it: built, installed from the wheel, run from that install.

The rest of the suite imports the package from the checkout (an editable install), so a
packaging mistake -- a module or the patch series left out of the wheel, a wrong entry point --
would show only here. The sdist is built with the setuptools backend (its PEP 517 hooks, as a
build frontend calls them, without build isolation: no network here), the wheel from the
unpacked sdist, and the wheel is installed (not editable) into a fresh virtual environment
with no packages of its own. One ``.pth`` line then puts the test environment's site-packages
(SGLang 0.5.12.post1, torch) behind it; Python does not process the ``.pth`` files of a
directory added that way, so the editable install there stays out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, SHIMS
from test_series import PATCHES, clone, pristine_tree

PACKAGE = ROOT / "sglang_futuremap_patch"


def _checkout_files() -> list[str]:
    """What a clone of this checkout would hold (tracked and new, unignored files)."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], check=True, capture_output=True, text=True).stdout
    return [name for name in out.split("\0") if name and (ROOT / name).is_file()]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra)
    return env


def _build(project: Path, hook: str, out: Path) -> Path:
    """Call one of the setuptools backend's build hooks in ``project``; returns the file."""
    code = f"from setuptools import build_meta\nprint(build_meta.{hook}({str(out)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=project, env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("build")
    src = base / "checkout"
    for name in _checkout_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    sdist = _build(src, "build_sdist", base / "dist")
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python 3.10.12+
    with tarfile.open(sdist) as tf:
        tf.extractall(base / "unpacked", **safe)
    (unpacked,) = (base / "unpacked").iterdir()
    return sdist, _build(unpacked, "build_wheel", base / "dist")


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("wheel-install") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The test environment's pip installs into the new one (before SGLang is made visible,
    # so that pip sees an empty environment).
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--disable-pip-version-check", "--no-deps", "--no-index", str(dists[1])],
                   check=True, env=_clean_env(), timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True, env=_clean_env()).stdout.strip()
    (Path(site) / "sglang-from-the-test-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def _run(venv: Path, *args: str, stand_ins: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed command, away from the checkout (only the CPU stand-ins on the path)."""
    env = _clean_env(PYTHONPATH=str(SHIMS)) if stand_ins else _clean_env()
    return subprocess.run([str(venv / "bin" / "sglang-futuremap-patch"), *args], env=env,
                          cwd=cwd or venv, capture_output=True, text=True, timeout=300)


def test_the_wheel_carries_every_module_and_the_series_byte_for_byte(dists):
    sdist, wheel = dists
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        packaged = {n.rsplit("/", 1)[1]: zf.read(n) for n in names
                    if n.startswith("sglang_futuremap_patch/patches/")}
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert packaged == {p.name: p.read_bytes() for p in PATCHES.iterdir() if p.is_file()}
    modules = {f"sglang_futuremap_patch/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert "futuremap_patch = sglang_futuremap_patch._plugin:register" in entry_points
    with tarfile.open(sdist) as tf:
        assert any(n.endswith("/patches/series") for n in tf.getnames())


def test_the_installed_wheel_reports_verifies_and_checks_the_series(venv, tmp_path, tmp_path_factory):
    from sglang_futuremap_patch.backports import load_series

    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import json, importlib.metadata as md, sglang_futuremap_patch as p\n"
         "from sglang_futuremap_patch import series_tools\n"
         "eps = md.entry_points(group='sglang.srt.plugins')\n"
         "print(json.dumps({'module': p.__file__, 'series': str(series_tools.DEFAULT_PATCHES_DIR),\n"
         "                  'plugin': [e.value for e in eps if e.name == 'futuremap_patch']}))"],
        env=_clean_env(PYTHONPATH=str(SHIMS)), cwd=venv, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout)
    module = Path(found["module"])
    assert module.is_relative_to(venv) and not module.is_relative_to(ROOT), module
    assert Path(found["series"]) == module.parent / "patches"
    assert found["plugin"] == ["sglang_futuremap_patch._plugin:register"]

    status = _run(venv, "status", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    report = json.loads(status.stdout)
    assert (report["sglang_version"], report["verdict"]) == ("0.5.12.post1", "patch")
    series = load_series()
    assert [bp["id"] for bp in report["backports"]] == [bp.id for bp in series]
    assert [t["state"] for bp in report["backports"] for t in bp["targets"]] == [
        "ready" for bp in series for _ in bp.targets]

    verify = _run(venv, "verify")
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert verify.stdout.rstrip().endswith("verify: OK")

    repo = clone(pristine_tree(tmp_path_factory, "0.5.12.post1"), tmp_path / "sglang")
    check = _run(venv, "patches", "check", "--repo", str(repo))
    assert check.returncode == 0, check.stderr[-2000:]
    assert f"all {len(series)} patches apply" in check.stdout

    exported = tmp_path / "exported"
    assert _run(venv, "patches", "export", "--out", str(exported)).returncode == 0
    for path in exported.iterdir():
        assert path.read_bytes() == (PATCHES / path.name).read_bytes(), path.name


def test_the_installed_command_without_stand_ins_gives_a_verdict_or_one_line(venv):
    """What an operator types on a host whose SGLang does not import (on CI: no torchvision)."""
    out = _run(venv, "status", stand_ins=False)
    assert "Traceback" not in out.stderr
    if out.returncode == 3:
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "SGLang cannot be imported" in errors[0], out.stderr[-2000:]
    else:  # this host's SGLang imports without the stand-ins
        assert out.returncode == 0 and "verdict:  patch" in out.stdout, out.stderr[-2000:]
