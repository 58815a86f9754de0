"""scripts/gpu/run_jobs.sh: several GPU entry points at once, each pinned to its own GPUs with its
own result folder, after one shared setup; everything packed into one archive at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "run_jobs.sh"


def _run(tmp_path: Path, *jobs: str, **env: str) -> subprocess.CompletedProcess[str]:
    # python3 on PATH is this interpreter (the setup checks the plugin's entry point with it).
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "python3").exists():
        (bindir / "python3").symlink_to(sys.executable)
    # The setup's check looks for the plugin's entry point among the installed distributions; a
    # checkout under test may not be pip-installed, so a distribution record that names it is put
    # on the path (the check itself runs as it does on a GPU box).
    dist = tmp_path / "site" / "sglang_futuremap_patch-0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-futuremap-patch\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[sglang.srt.plugins]\nfuturemap = sglang_futuremap_patch._plugin:register\n")
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")) if p)
    full = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", OUT=str(tmp_path / "out"),
                JOBS_SKIP_INSTALL="1", PYTHONPATH=path, **env)
    full.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(["bash", str(SCRIPT), *jobs], capture_output=True, text=True, env=full, timeout=120,
                          cwd=tmp_path)


@pytest.mark.skipif(not SCRIPT.exists(), reason="no run_jobs.sh")
def test_jobs_run_at_once_on_their_own_gpus_and_the_worst_exit_wins(tmp_path: Path) -> None:
    if (ROOT / ".gpu" / "activate.sh").exists():
        pytest.skip("a GPU bundle is unpacked here: the runner would activate it")
    res = _run(tmp_path,
               'a|0,1|echo "gpus=$CUDA_VISIBLE_DEVICES out=$OUT skip=$SERVE_SKIP_INSTALL/$E2E_SKIP_INSTALL"; '
               'sleep 1; echo done > "$OUT/a.txt"',
               'b|2,3|echo "gpus=$CUDA_VISIBLE_DEVICES"; exit 3')
    assert res.returncode == 3, res.stdout + res.stderr
    out = tmp_path / "out"
    assert "== job a on GPUs 0,1" in res.stdout and "== job b: exit 3" in res.stdout
    with tarfile.open(out / "jobs.tar.gz") as tar:
        names = set(tar.getnames())
        log_a = tar.extractfile("a/job.log").read().decode()  # type: ignore[union-attr]
        log_b = tar.extractfile("b/job.log").read().decode()  # type: ignore[union-attr]
    assert {"setup.log", "a/job.log", "a/a.txt", "b/job.log"} <= names
    assert log_a.strip() == f"gpus=0,1 out={out / 'a'} skip=1/1" and log_b.strip() == "gpus=2,3"
    assert sorted(p.name for p in out.iterdir()) == ["jobs.tar.gz"]  # one file to bring back


def test_each_job_gets_its_own_port_slice(tmp_path: Path) -> None:
    """Harnesses of jobs side by side draw their port blocks from disjoint slices
    (gpu_harness.port_blocks.PORT_SLICE_ENV)."""
    if (ROOT / ".gpu" / "activate.sh").exists():
        pytest.skip("a GPU bundle is unpacked here: the runner would activate it")
    res = _run(tmp_path, 'a|0|echo "slice=$GPU_HARNESS_PORT_SLICE"', 'b|1|echo "slice=$GPU_HARNESS_PORT_SLICE"',
               'c|2|echo "slice=$GPU_HARNESS_PORT_SLICE"', JOBS_ARCHIVE="0")
    assert res.returncode == 0, res.stdout + res.stderr
    logs = [(tmp_path / "out" / n / "job.log").read_text().strip() for n in "abc"]
    assert logs == ["slice=1/3", "slice=2/3", "slice=3/3"]


def test_archive_can_be_left_out(tmp_path: Path) -> None:
    if (ROOT / ".gpu" / "activate.sh").exists():
        pytest.skip("a GPU bundle is unpacked here: the runner would activate it")
    res = _run(tmp_path, "only|0|true", JOBS_ARCHIVE="0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "out" / "only" / "job.log").is_file() and not (tmp_path / "out" / "jobs.tar.gz").exists()


@pytest.mark.parametrize("jobs, says", [
    (("a|0|true", "a|1|true"), "two jobs named a"),
    (("a|0,x|true",), "a job is NAME|GPUS|COMMAND"),
    (("a|0",), "a job is NAME|GPUS|COMMAND"),
    (("setup.log|0|true",), "may not be named setup.log"),
])
def test_malformed_jobs_stop_before_anything_runs(tmp_path: Path, jobs: tuple[str, ...], says: str) -> None:
    res = _run(tmp_path, *jobs)
    assert res.returncode == 2 and says in res.stderr
    assert not (tmp_path / "out").exists()


def test_help_and_no_arguments(tmp_path: Path) -> None:
    helped = _run(tmp_path, "--help")
    assert helped.returncode == 0 and "NAME|GPUS|COMMAND" in helped.stdout
    bare = _run(tmp_path)
    assert bare.returncode == 2 and "NAME|GPUS|COMMAND" in bare.stdout


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "scripts" / "gpu").glob("*.sh") if p.name != "common.sh"))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_gpu_entry_point_answers_help_and_does_nothing_else(tmp_path: Path, name: str, flag: str) -> None:
    """``--help`` prints the script's header and exits 0 before any setup: no install, no result
    folder, no model built (``run_e2e.sh --help`` used to run the whole suite)."""
    script = ROOT / "scripts" / "gpu" / name
    env = dict(os.environ, OUT=str(tmp_path / "out"), PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for tool in ("pip", "python3", "nvidia-smi"):  # anything past the guard would call one of these
        (tmp_path / tool).write_text(f"#!/bin/sh\necho {tool} ran >> {tmp_path / 'ran'}\nexit 1\n")
        (tmp_path / tool).chmod(0o755)
    res = subprocess.run(["bash", str(script), flag], capture_output=True, text=True, env=env, timeout=60,
                         cwd=tmp_path)
    header = script.read_text().splitlines()[1].lstrip("# ").strip()
    assert res.returncode == 0 and res.stdout.splitlines()[0].strip() == header
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "gpu-out").exists()
