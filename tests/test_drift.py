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

#: The targets the patches do not paste: see test_wrapped_targets_are_the_declared_exceptions.
RUN_BATCH = "sglang.srt.managers.scheduler:Scheduler.run_batch"
#: wrapped target -> lines its patched source must contain
WRAPPED = {
    RUN_BATCH: ["batch_result = self.forward_spec_v2_overlap(batch)", "batch.is_spec_v2"],
    "sglang.srt.server_args:ServerArgs._handle_speculative_decoding": [
        "if self.speculative_eagle_topk > 1 and not self.disable_overlap_schedule:",
    ],
}


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


def test_wrapped_targets_are_the_declared_exceptions(series, patched):
    """The wrapped targets cannot be compared with their replacements.

    The plugin *wraps* them and delegates to the stock method, which it receives as a
    keyword default. A source patch has no stock method to delegate to, so the patch edits
    the stock method instead (the edits each wrap target declares, ``Target.edits``):

    * ``Scheduler.run_batch``: dispatches spec-v2 overlap batches to
      ``forward_spec_v2_overlap`` and drops the spec-v2 lines that no batch reaches any more;
    * ``ServerArgs._handle_speculative_decoding``: an auto-chosen tree goes to spec v1 right
      after the auto choice.

    What can be checked is that every edit is there, and the rest of the method is stock.
    """
    wrapped = {t.path: t for t in _targets(series, "wrap")}
    assert sorted(wrapped) == sorted(WRAPPED)
    assert all(t.edits and t.edit_note for t in wrapped.values())
    sources = series_tools.patched_function_sources(patched, series)
    for path, lines in WRAPPED.items():
        source = sources[path]
        assert source is not None, path
        for line in lines:
            assert line in source, (path, line)
        for edit in wrapped[path].edits:
            assert edit.new in source and (edit.old not in source or edit.old in edit.new)
    assert "batch.seq_lens = batch_result.next_draft_input.new_seq_lens" not in sources[RUN_BATCH]


def test_guards_are_left_as_they_are(series, pristine, patched):
    before = series_tools.patched_function_sources(pristine, series)
    after = series_tools.patched_function_sources(patched, series)
    guards = [t.path for t in _targets(series, "guard")]
    assert guards, "the series declares guards (pcg-no-mirror)"
    for path in guards:
        assert before[path] is not None and after[path] == before[path], path


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
