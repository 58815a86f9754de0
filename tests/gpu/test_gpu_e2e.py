"""GPU end-to-end suite (stock vs. patched SGLang over the spec-v2 matrix): scripts/gpu_e2e.py.

Skipped unless a CUDA GPU, SGLang and the installed plugin are all present (the reason comes
from the smoke test's check). By default the ``base`` group: 44 SGLang Engines (the two TP=2
cases are reported as skipped on a one-GPU machine), 12 at a time, about 5-10 minutes on one
H100/H200. ``SGLANG_FUTUREMAP_E2E_GROUPS`` (space-separated: base, matrix, fa3) and
``SGLANG_FUTUREMAP_E2E_CASES`` (space-separated patterns) choose others; without FA3 the cases
that need it are reported as skipped, and the report's first line says whether FA3 was there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from test_gpu_smoke import _REASON, import_script


@pytest.mark.gpu
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_gpu_e2e(tmp_path: Path) -> None:
    gpu_e2e = import_script("gpu_e2e")
    cases = os.environ.get("SGLANG_FUTUREMAP_E2E_CASES", "").split()
    groups = os.environ.get("SGLANG_FUTUREMAP_E2E_GROUPS", "" if cases else "base").split()
    argv = ["--out", str(tmp_path), "--jobs", "12", "--timeout", "300", "--tag", "pytest"]
    argv += (["--cases", *cases] if cases else []) + (["--group", *groups] if groups else [])
    rc = gpu_e2e.main(argv)
    report = tmp_path / "e2e-pytest.txt"
    assert rc == 0, report.read_text() if report.exists() else "(no report)"
