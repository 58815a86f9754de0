"""CPU check of the GPU smoke harness: runs ``scripts/gpu_smoke_selftest.py`` in a subprocess.

No GPU and no real SGLang engine: the self-test drives the pure analysis functions, the
call-count and host-sync probes (``scripts/gpu_probe/``) against stand-in schedulers, and the
whole stock-vs-patched orchestration against a fake ``sglang`` package. About 20-45 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELFTEST = ROOT / "scripts" / "gpu_smoke_selftest.py"


def _missing() -> str | None:
    for mod in ("setproctitle",):
        try:
            __import__(mod)
        except ImportError:
            return f"{mod} is not installed (the fake scheduler sets its process title)"
    return None


@pytest.mark.skipif(_missing() is not None, reason=_missing() or "")
def test_gpu_harness_selftest(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SMOKE_", "SGLANG_FUTUREMAP_PATCH"))}
    env["TMPDIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, str(SELFTEST)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    out = r.stdout + r.stderr
    failures = [line for line in out.splitlines() if line.strip().startswith("[FAIL]") and "] " in line]
    assert r.returncode == 0 and "all self-tests passed" in out, (
        f"self-test rc {r.returncode}\n" + "\n".join(failures[-20:]) + "\n--- tail ---\n" + out[-3000:])
