"""Drift between the plugin and ``patches/``: after ``git am`` on a pristine tree, every
patched function is the plugin's replacement (transformers' ``check_copies``, for us).

Compared as the engine's fingerprints are (``_engine.normalized_source``): comments,
layout and the def name do not count.
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
import textwrap
from pathlib import Path

import pytest

from sglang_futuremap_patch import series_tools
from sglang_futuremap_patch._engine import ABSENT, normalized_source

from test_series import PATCHES, clone, pristine_tree

#: The one target the patches do not paste: see test_run_batch_is_the_declared_exception.
RUN_BATCH = "sglang.srt.managers.scheduler:Scheduler.run_batch"


@pytest.fixture(scope="module")
def series():
    from sglang_futuremap_patch.backports import load_series

    return load_series()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return pristine_tree(tmp_path_factory, "0.5.12.post1")


@pytest.fixture(scope="module")
def patched(pristine, tmp_path_factory) -> Path:
    repo = clone(pristine, tmp_path_factory.mktemp("drift") / "repo")
    ok, message = series_tools.apply(repo, PATCHES)
    assert ok, message
    return repo


def _targets(series, kind: str):
    """Each target path once, as its last link: a function that a later back-port replaces
    again is checked against that later replacement."""
    last = {t.path: t for bp in series for t in bp.targets}
    return [t for t in last.values() if t.kind == kind]


def test_spliced_functions_are_the_plugin_replacements(series, patched):
    found = series_tools.patched_function_sources(patched, series)
    drifted = [
        t.path for t in _targets(series, "splice")
        if found[t.path] is None
        or series_tools.normalized_text(found[t.path]) != normalized_source(
            t.replacement.fget if isinstance(t.replacement, property) else t.replacement)
    ]
    assert not drifted, (
        f"patches/ and the plugin disagree on {drifted}; "
        "run: PYTHONPATH=tests/cpu_shims .venv/bin/python scripts/export_patches.py"
    )


def test_added_values_are_the_plugin_values(series, patched):
    found = series_tools.patched_function_sources(patched, series)
    for t in _targets(series, "value"):
        stmt = found[t.path]
        assert stmt is not None, f"{t.path} is missing from the patched tree"
        node = ast.parse(textwrap.dedent(stmt)).body[0]
        if t.import_line:
            assert ast.dump(node) == ast.dump(ast.parse(t.import_line).body[0]), t.path
        else:
            assert isinstance(node, ast.Assign), t.path
            assert ast.literal_eval(node.value) == t.replacement, t.path


def test_run_batch_is_the_declared_exception(series, patched):
    """``Scheduler.run_batch`` cannot be compared with its replacement.

    The plugin *wraps* it: the wrapper runs spec-v2 overlap batches itself and hands every
    other batch to the stock method, which it receives as ``_stock_run_batch``. A source
    patch has no stock method to delegate to, so the patch edits the stock method instead
    (``series_tools.TEXT_EDITS``): it dispatches spec-v2 overlap batches to
    ``forward_spec_v2_overlap`` and drops the spec-v2 lines that no batch reaches any more.
    What can be checked is that both edits are there.
    """
    assert [t.path for t in _targets(series, "wrap")] == [RUN_BATCH]
    assert set(series_tools.TEXT_EDITS) == {RUN_BATCH}
    source = series_tools.patched_function_sources(patched, series)[RUN_BATCH]
    assert source is not None
    assert "batch_result = self.forward_spec_v2_overlap(batch)" in source
    assert "batch.seq_lens = batch_result.next_draft_input.new_seq_lens" not in source
    assert "batch.is_spec_v2" in source  # the dispatch condition, as in the plugin wrapper


def test_replaced_functions_were_the_fingerprinted_originals(series, pristine):
    """The splicer replaced the very functions the engine fingerprinted (no stale anchor)."""
    found = series_tools.patched_function_sources(pristine, series)
    first: dict = {}
    for t in (t for bp in series for t in bp.targets):
        first.setdefault(t.path, t)  # a later link expects the earlier link, not pristine
    for t in (t for t in first.values() if t.kind != "value"):
        if t.expected == ABSENT:
            assert found[t.path] is None, f"{t.path} already exists in the pristine tree"
            continue
        text = series_tools.normalized_text(found[t.path])
        assert hashlib.sha256(text.encode()).hexdigest()[:16] == t.expected, t.path


def test_patched_tree_is_clean(patched):
    assert subprocess.run(
        ["git", "-C", str(patched), "status", "--porcelain"], capture_output=True, text=True
    ).stdout == ""
