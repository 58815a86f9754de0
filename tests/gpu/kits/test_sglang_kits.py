"""SGLang's own regression kits on SGLang's own server fixtures, one job per pytest process.

``scripts/gpu_kits.py`` (``scripts/gpu/run_kits.sh``) writes a job file (kit case, models,
port, attention backend, thresholds) and runs pytest on this module with ``SGLANG_KITS_JOB``
naming it; the module then holds one class: the case's kit mixins on a subclass of the real
fixture class (``gpu_kits_cases.build_test_class``). The fixture's ``setUpClass`` launches
``sglang serve`` in the environment of the flavour under test (stock, plugin or patched tree).

Anywhere else (CI's plain ``pytest``, a machine without a GPU) the module is skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import gpu_kits_cases as kc  # noqa: E402  (stdlib only at import)

_REASON = kc.job_skip_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

# One name only: pytest collects every TestCase subclass bound in the module, whatever its name.
globals().update({cls.__name__: cls for cls in [kc.build_test_class(*kc.read_job())]})
