"""GPU smoke test (stock vs. patched SGLang, token for token): runs scripts/gpu_smoke.py, with
Triton and, where FA3 imports, in SGLang's default configuration (FA3 + piecewise CUDA graph).

Skipped unless a CUDA GPU, SGLang and the installed plugin (its ``sglang.srt.plugins``
entry point) are all present. It starts two SGLang engines (a few minutes).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def gpu_skip_reason(why_gpu: str = "the smoke test starts real SGLang engines", *,
                    installed_plugin: bool = True) -> str | None:
    """Why a GPU test cannot run here (None: it can). ``installed_plugin``: SGLang must find
    this package through its ``sglang.srt.plugins`` entry point (tests that start Engines)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA GPU: {why_gpu}"
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed"
    if installed_plugin and not any(
            ep.value.startswith("sglang_futuremap_patch") for ep in entry_points(group="sglang.srt.plugins")):
        return "sglang_futuremap_patch is not installed (no sglang.srt.plugins entry point)"
    return None


_REASON = gpu_skip_reason()


def import_script(name: str) -> Any:
    """A module of ``scripts/`` (they import each other as top-level modules)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_gpu_smoke(tmp_path: Path) -> None:
    gpu_smoke = import_script("gpu_smoke")
    rc = gpu_smoke.main(["--log-dir", str(tmp_path / "logs"), "--out-json", str(tmp_path / "smoke.json")])
    assert rc == 0, f"GPU smoke failed: see {tmp_path / 'smoke.json'} and the logs in {tmp_path / 'logs'}"


def _fa3_missing() -> str | None:
    if _REASON is not None:
        return _REASON
    if not import_script("gpu_harness.child_env").fa3_available():
        return "skipped (no FA3): sgl_kernel.flash_ops does not import here"
    return None


@pytest.mark.skipif(_fa3_missing() is not None, reason=_fa3_missing() or "")
def test_gpu_smoke_default_configuration(tmp_path: Path) -> None:
    """SGLang's own configuration on H100/H200 (no attention backend given: FA3, piecewise CUDA
    graph on), with the host-sync probe."""
    gpu_smoke = import_script("gpu_smoke")
    out = tmp_path / "smoke.json"
    rc = gpu_smoke.main(["--attention-backend", "default", "--sync-probe", "--log-dir", str(tmp_path / "logs"),
                         "--out-json", str(out)])
    assert rc == 0, f"GPU smoke (default configuration) failed: see {out} and the logs in {tmp_path / 'logs'}"
