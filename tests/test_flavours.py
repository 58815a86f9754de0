"""The same behaviour tests against the patched source: a pristine SGLang tree + patches/.

The plugin flavour of these tests runs in this session; here they run again in a subprocess
with the patched tree first on ``sys.path`` and the plugin finding nothing to do. Both must
pass: the plugin behaves like the source-level change, and the source-level change works.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FLAVOUR, ROOT, subprocess_env

BEHAVIOUR_TESTS = ["tests/test_overlap_simulation.py", "tests/test_future_map.py",
                   "tests/test_worker_on_publish.py",
                   "tests/test_private_d2h.py", "tests/test_fused_gather.py",
                   "tests/test_cpu_seq_lens_optional.py", "tests/test_pcg_no_mirror.py",
                   "tests/test_fa3_device_page_table.py", "tests/test_fa3_mla_device_metadata.py",
                   "tests/test_auto_tree_spec_v1.py",
                   "tests/test_tree_draft_extend_width.py", "tests/test_eager_mirror.py",
                   "tests/test_draft_extend_lens.py", "tests/test_chain_fast_path.py",
                   "tests/test_prefill_result_first.py", "tests/test_war_barrier.py",
                   "tests/test_selfcheck.py", "tests/test_spec_v2_tree.py",
                   "tests/test_paged_tree_spec_v2.py", "tests/test_early_intake.py",
                   "tests/test_flashinfer_host_prefix_sum.py", "tests/test_eager_relay_lens.py",
                   "tests/test_mirror_relay_lens.py", "tests/test_flashinfer_host_indptr.py",
                   "tests/test_tree_kv_move_warmup.py", "tests/test_decode_assign_warmup.py",
                   "tests/test_prefill_write_warmup.py", "tests/test_war_barrier_after_launch.py"]

pytestmark = pytest.mark.skipif(FLAVOUR != "plugin", reason="this file starts the other flavour")


@pytest.mark.parametrize("version", ["0.5.12.post1"])
def test_behaviour_tests_pass_on_the_patched_tree(tmp_path: Path, version: str):
    from sglang_futuremap_patch import series_tools

    tree = tmp_path / "sglang"
    series_tools.make_pristine_tree(tree, version=version, installed=True)
    ok, message = series_tools.apply(tree)
    assert ok, message
    python_dir = tree / "python"
    env = subprocess_env(SGLANG_FUTUREMAP_TEST_FLAVOUR="patched-tree",
                         SGLANG_FUTUREMAP_TREE=str(python_dir))
    env["PYTHONPATH"] = f"{python_dir}:{env['PYTHONPATH']}"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *BEHAVIOUR_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    summary = out.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 10 and "failed" not in summary, summary
