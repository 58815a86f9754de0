"""The hunk-revert check (scripts/hunk_revert.py): its pure parts, and the CI share.

The pure parts (splitting a patch into hunks and putting it back together, leaving one hunk
out, telling a hunk with no behaviour from one with, numbering and sharing hunks, mapping
test files to back-ports) are checked directly, against the real series where it helps.
``test_ci_share_has_no_survivor`` runs a fixed share of the check itself: every hunk in it
must be killed by a behaviour test or have no behaviour. ``results/hunk-revert/`` holds
the last full run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import FLAVOUR, ROOT, subprocess_env

sys.path.insert(0, str(ROOT / "scripts"))
import hunk_revert as hr  # noqa: E402

#: The share CI runs (``I/M``); ``HUNK_REVERT_SHARE`` picks another, ``off`` skips it.
CI_SHARE = os.environ.get("HUNK_REVERT_SHARE", "0/8")

BEFORE = textwrap.dedent('''\
    """A module."""


    def first(x):
        """Add one."""
        return x + 1


    def second(x):
        return x * 2


    def third(x):
        # keep it
        return x - 3
    ''')


def _git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout


def _diff(before: str, after: str, tmp_path: Path) -> str:
    """``git diff -U1`` of m.py from ``before`` to ``after``."""
    repo = tmp_path / "gen"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "m.py").write_text(before)
    _git(repo, "add", "m.py")
    (repo / "m.py").write_text(after)
    return _git(repo, "diff", "-U1", "--", "m.py")


def _git_apply(before: str, diff: str, tmp_path: Path) -> str:
    """m.py after ``git apply`` of ``diff`` to ``before``."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "m.py").write_text(before)
    (tmp_path / "x.patch").write_text(diff)
    _git(repo, "apply", str(tmp_path / "x.patch"))
    return (repo / "m.py").read_text()


AFTER = (BEFORE.replace("return x + 1", "return x + 10")
         .replace("def second(x):\n    return x * 2\n",
                  "def second(x):\n    y = x * 2\n    return y\n")
         .replace("return x - 3", "return x - 30"))


def test_every_patch_of_the_series_splits_and_renders_back_exactly():
    patches = hr.load_patches()
    assert [p.name for p in patches] == (ROOT / "patches" / "series").read_text().split()
    for p in patches:
        text = (ROOT / "patches" / p.name).read_text()
        assert p.render() == text, p.name
        assert len(p.hunks()) == sum(ln.startswith("@@ ") for ln in text.splitlines()), p.name
        assert p.preamble.startswith("From ") and p.files
    refs = hr.number_hunks(patches)
    assert [r.index for r in refs] == list(range(len(refs)))
    assert len(refs) == sum(len(p.hunks()) for p in patches)


def test_a_patch_without_one_hunk_applies_and_leaves_that_hunk_undone(tmp_path: Path):
    patch = hr.parse_patch(_diff(BEFORE, AFTER, tmp_path), "m.patch")
    assert len(patch.hunks()) == 3
    for n in (1, 2, 3):
        _, hunk = patch.hunks()[n - 1]
        expected = hr.revert_hunk(AFTER, hunk)
        assert expected != AFTER
        sub = tmp_path / f"h{n}"
        sub.mkdir()
        got = _git_apply(BEFORE, patch.without_hunk(n).render(), sub)
        assert got == expected, n
    # Hunk 2 adds a line: the third hunk's new-side start moves back by one without it.
    assert patch.hunks()[2][1].new_start - 1 == patch.without_hunk(2).hunks()[1][1].new_start
    assert patch.without_hunk(1).hunks()[1][1].new_start == patch.hunks()[2][1].new_start


def test_a_file_whose_only_hunk_is_left_out_is_left_out(tmp_path: Path):
    one = _diff(BEFORE, BEFORE.replace("x - 3", "x - 4"), tmp_path)
    patch = hr.parse_patch("Subject: x\n---\n" + one + one.replace("m.py", "n.py")
                           + "-- \n2.0\n", "two-files.patch")
    assert [f.path for f in patch.files] == ["m.py", "n.py"]
    rest = patch.without_hunk(1)
    assert [f.path for f in rest.files] == ["n.py"]
    assert rest.render().startswith("Subject: x\n---\ndiff --git a/n.py")
    assert rest.render().endswith("-- \n2.0\n")
    with pytest.raises(ValueError):
        patch.without_hunk(3)


def test_a_hunk_shorter_than_its_header_is_refused():
    text = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n x\n-y\n+z\n"
    with pytest.raises(ValueError, match="cut short"):
        hr.parse_patch(text)


def test_revert_hunk_refuses_a_hunk_that_is_not_where_it_says(tmp_path: Path):
    patch = hr.parse_patch(_diff(BEFORE, AFTER, tmp_path))
    _, hunk = patch.hunks()[1]
    with pytest.raises(ValueError, match="does not stand"):
        hr.revert_hunk("\n\n" + AFTER, hunk)


@pytest.mark.parametrize("after, reason", [
    (BEFORE.replace("    # keep it\n", "    # keep it, it is needed\n"), "comments"),
    (BEFORE.replace("def second(x):\n", "def second(x):\n    # doubles\n"), "comments"),
    (BEFORE.replace("\n\ndef second", "\n\n\ndef second"), "layout"),
    (BEFORE.replace('"""Add one."""', '"""Add one to x."""'), "docstrings"),
    (BEFORE.replace('    """Add one."""\n', ""), "docstrings"),
    (BEFORE.replace('"""A module."""', '"""A module.\n\nMore words."""'), "docstrings"),
    (BEFORE.replace("return x * 2", "return x * 3"), None),
    # A string statement after the docstring is code, not a docstring.
    (BEFORE.replace('"""Add one."""', '"""Add one."""\n    "plus one"'), None),
    (BEFORE.replace("    return x * 2", "    '''doubles'''\n    return x * 2"), "docstrings"),
    (BEFORE.replace("    return x - 3", "    y = 0\n    return x - 3"), None),
    (BEFORE.replace("return x - 3", "return (x -"), None),  # no longer parses
])
def test_no_behaviour_only_for_comments_layout_and_docstrings(after: str, reason: str | None):
    found = hr.no_behaviour_reason(BEFORE, after)
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found, found


def _docstring_lines(source: str) -> set[int]:
    import ast

    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def test_the_series_hunks_without_behaviour_change_only_comments_blank_lines_and_docstrings():
    """On the real series (applied in memory to the installed, pristine SGLang files): every
    hunk the check calls behaviour-free touches only blank lines, comments and docstring
    lines, on both sides; every other hunk changes the module's syntax tree. (The series may
    have no such hunk: its text edits leave SGLang's docstrings alone.)"""
    import ast

    import sglang

    site = Path(sglang.__file__).resolve().parent.parent
    texts: dict[str, str] = {}
    for k, p in enumerate(hr.load_patches(), start=1):
        for f in p.files:
            rel = f.path.removeprefix("python/")
            lines = (texts.get(rel) or (site / rel).read_text()).splitlines(keepends=True)
            out, pos = [], 0
            for h in f.hunks:
                start = h.old_start - 1 if h.old_len else h.old_start
                out += lines[pos:start] + h.new_side()
                pos = start + h.old_len
            texts[rel] = "".join(out + lines[pos:])
        for n, (f, h) in enumerate(p.hunks(), start=1):
            after = texts[f.path.removeprefix("python/")]
            before = hr.revert_hunk(after, h)
            if hr.no_behaviour_reason(before, after) is None:
                assert ast.dump(ast.parse(before)) != ast.dump(ast.parse(after)), (k, n)
                continue
            docs = {"+": _docstring_lines(after), "-": _docstring_lines(before)}
            at = {"+": h.new_start, "-": h.new_start}  # the old side starts there in before
            for ln in h.lines:
                kind, text = ln[:1], ln[1:].strip()
                if kind in "+-" and kind:
                    assert not text or text.startswith("#") or at[kind] in docs[kind], (k, n, ln)
                for side in "+-":
                    if kind == side or kind == " ":
                        at[side] += 1


def test_every_hunk_declared_without_observable_effect_is_in_the_series_as_labelled():
    """A declaration names its hunk by content: when the series changes the hunk, the
    declaration no longer matches (and this fails) instead of silently covering another."""
    patches = hr.load_patches()
    where = {hr.hunk_id(f.path, h): (p.name, n, f.path)
             for p in patches for n, (f, h) in enumerate(p.hunks(), start=1)}
    assert len(where) == len(hr.number_hunks(patches))  # ids are unique
    declared = hr.load_no_effect()
    for hid, entry in declared.items():
        assert hid in where, f"stale declaration: {entry['patch']} hunk {entry['hunk']}"
        assert where[hid] == (entry["patch"], entry["hunk"], entry["file"]), entry
        assert len(entry["reason"]) > 80 and entry["where"], entry
    assert hr.hunk_id("a.py", hr.Hunk("@@ -1 +1 @@\n", ("-x\n", "+y\n"))) != hr.hunk_id(
        "a.py", hr.Hunk("@@ -9 +9 @@\n", ("-x\n", "+z\n")))
    assert hr.hunk_id("a.py", hr.Hunk("@@ -1 +1 @@\n", ("-x\n", "+y\n"))) == hr.hunk_id(
        "a.py", hr.Hunk("@@ -9 +9 @@\n", ("-x\n", "+y\n")))  # line shifts do not matter


def test_enclosing_scope_names_the_innermost_def():
    src = "class A:\n    def f(self):\n        def g():\n            return 1\n        return g\n\nX = 1\n"
    assert hr.enclosing_scope(src, 4) == "A.f.g"
    assert hr.enclosing_scope(src, 5) == "A.f"
    assert hr.enclosing_scope(src, 7) == "<module>"
    assert hr.scopes(src, [4, 5, 4, 7]) == "A.f.g, A.f, <module>"


def test_shares_partition_the_hunks_deterministically():
    refs = hr.number_hunks(hr.load_patches())
    for m in (1, 3, 8):
        shares = [hr.select_hunks(refs, share=(i, m)) for i in range(m)]
        flat = sorted(r.index for s in shares for r in s)
        assert flat == list(range(len(refs)))  # disjoint, and together every hunk
        assert all(len(s) in (len(refs) // m, len(refs) // m + 1) for s in shares)
        assert shares == [hr.select_hunks(refs, share=(i, m)) for i in range(m)]
    assert hr.parse_share("3/8") == (3, 8)
    for bad in ("8/8", "1/0", "x", "-1/3"):
        with pytest.raises(ValueError):
            hr.parse_share(bad)


def test_selecting_by_patch_and_hunk():
    refs = hr.number_hunks(hr.load_patches())
    assert {r.patch for r in hr.select_hunks(refs, patches=[4])} == {4}
    assert [(r.patch, r.hunk) for r in hr.select_hunks(refs, hunks=[(7, 1), (2, 3)])] == [
        (2, 3), (7, 1)]
    both = hr.select_hunks(refs, patches=[7], hunks=[(2, 3)])
    assert [(r.patch, r.hunk) for r in both] == [(2, 3), (7, 1)]
    assert hr.select_hunks(refs, patches=[4], share=(0, 2)) == [
        r for r in refs if r.patch == 4 and r.index % 2 == 0]
    with pytest.raises(ValueError, match="no such hunk"):
        hr.select_hunks(refs, hunks=[(7, 2)])
    with pytest.raises(ValueError, match="no such hunk"):
        hr.select_hunks(refs, patches=[len(hr.load_patches()) + 1])


def test_every_behaviour_test_file_belongs_to_a_backport_and_the_own_file_runs_first():
    from sglang_futuremap_patch.backports import SERIES

    tests = hr.behaviour_tests()
    from test_flavours import BEHAVIOUR_TESTS

    assert tests == BEHAVIOUR_TESTS
    numbers = {t: hr.backport_of_test(t, SERIES) for t in tests}
    assert numbers["tests/test_cpu_seq_lens_optional.py"] == 4
    assert numbers["tests/test_chain_fast_path.py"] == SERIES.index("chain_fast_path") + 1
    assert numbers["tests/test_overlap_simulation.py"] == 1
    # Every test file named after a back-port module is a behaviour test.
    named = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
             if p.stem.removeprefix("test_") in SERIES}
    assert named <= set(tests)
    early = ["tests/test_overlap_simulation.py", "tests/test_future_map.py",
             "tests/test_worker_on_publish.py", "tests/test_selfcheck.py"]
    assert hr.stages_for(4, tests, SERIES) == [["tests/test_cpu_seq_lens_optional.py"], early]
    assert hr.stages_for(3, tests, SERIES) == [early]  # drop-verify-done has no file of its own
    assert hr.stages_for(1, tests, SERIES) == [
        ["tests/test_overlap_simulation.py", "tests/test_worker_on_publish.py"]]
    whole = hr.stages_for(len(SERIES), tests, SERIES, first=4)
    assert whole[0] == ["tests/test_cpu_seq_lens_optional.py"] and len(whole[1]) == len(tests) - 1
    with pytest.raises(ValueError):
        hr.backport_of_test("tests/test_gate.py", SERIES)


def test_outcomes_fold_phases_into_one_verdict_per_test():
    import json

    lines = [json.dumps(r) for r in [
        {"id": "t.py::a", "when": "setup", "outcome": "passed", "duration": 0},
        {"id": "t.py::a", "when": "call", "outcome": "passed", "duration": 0},
        {"id": "t.py::a", "when": "teardown", "outcome": "passed", "duration": 0},
        {"id": "t.py::b", "when": "setup", "outcome": "failed", "duration": 0},
        {"id": "t.py::c", "when": "setup", "outcome": "skipped", "duration": 0},
        {"id": "t.py::d", "when": "call", "outcome": "passed", "duration": 0},
        {"id": "t.py::d", "when": "teardown", "outcome": "failed", "duration": 0},
        {"id": "u.py", "when": "collect", "outcome": "failed", "duration": 0},
    ]]
    run = hr.read_outcomes(lines + [""])
    assert run.passed == ["t.py::a"]
    assert run.failed == ["t.py::b", "t.py::d", "u.py"]
    assert run.skipped == ["t.py::c"]


def _record(verdicts: list[tuple[int, str]]) -> dict:
    hunks = [{"index": i, "patch": k, "patch_name": f"{k:04d}-P{k}.patch", "hunk": i + 1,
              "file": "python/sglang/srt/m.py", "scope": "f", "lines": "3", "verdict": v,
              "mode": "prefix" if v == "killed" else None,
              "killed_by": "tests/test_x.py::test_y" if v == "killed" else None,
              "reason": None if v == "killed" else "why", "wall_s": 9.0}
             for i, (k, v) in enumerate(verdicts)]
    return {"date": "2026-01-01T00:00:00+00:00", "sglang_version": "0.5.12.post1",
            "python": "3.11", "command": "scripts/hunk_revert.py --json r.json",
            "hunks_in_series": len(hunks), "hunks_checked": len(hunks), "wall_s": 600.0,
            "counts": {v: sum(h["verdict"] == v for h in hunks) for v in hr.VERDICTS},
            "hunks": hunks}


def test_markdown_page_has_the_run_the_totals_per_patch_and_the_killing_test():
    record = _record([(1, "killed"), (1, "no-effect"), (2, "killed"), (2, "survived")])
    before = _record([(1, "survived")])
    del before["counts"]["no-effect"]  # an older record, before declarations existed
    assert [(r["patch"], r["hunks"], r["killed"], r["no-effect"], r["survived"])
            for r in hr.patch_summary(record)] == [(1, 2, 1, 1, 0), (2, 2, 1, 0, 1)]
    page = hr.markdown_report(record, before, "old.json")
    assert "- SGLang 0.5.12.post1" in page and "2026-01-01" in page and "600 s" in page
    assert "`scripts/cpu-env.sh python scripts/hunk_revert.py --json r.json`" in page
    assert "- before (old.json): 1 of 1 hunks: 0 killed" in page
    assert "| 0001-P1 | 2 | 1 | 0 | 1 | 0 | 0 |" in page
    assert "| **all** | 4 | 2 | 0 | 1 | 1 | 0 |" in page
    assert page.count("killed by `tests/test_x.py::test_y`") == 2
    assert "declared, no observable effect (survives every test): why" in page
    assert "**survived**: why" in page


def test_command_line_help_and_list():
    env = subprocess_env()
    out = subprocess.run([sys.executable, "scripts/hunk_revert.py", "--help"], cwd=ROOT,
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "--share" in out.stdout and "Exit status" in out.stdout
    out = subprocess.run([sys.executable, "scripts/hunk_revert.py", "--list", "--patch", "7"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == [str(hr.select_hunks(
        hr.number_hunks(hr.load_patches()), patches=[7])[0].index), "7:1"]
    out = subprocess.run([sys.executable, "scripts/hunk_revert.py", "--share", "9/9"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 2


@pytest.mark.skipif(FLAVOUR != "plugin" or CI_SHARE == "off",
                    reason="runs the check itself (HUNK_REVERT_SHARE=off skips it)")
def test_ci_share_has_no_survivor(tmp_path: Path):
    """The fixed share of the check that the test command runs: each of its hunks reverted
    alone must fail a behaviour test (or have no behaviour). Minutes; see the README."""
    record = tmp_path / "share.json"
    jobs = str(min(2, os.cpu_count() or 1))  # CI's two cores: the rest of the suite waits
    out = subprocess.run(
        [sys.executable, "scripts/hunk_revert.py", "--share", CI_SHARE, "--jobs", jobs,
         "--json", str(record)],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=3000)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    import json

    doc = json.loads(record.read_text())
    assert doc["hunks_checked"] >= doc["hunks_in_series"] // 8
    assert doc["counts"]["survived"] == doc["counts"]["error"] == 0
    assert doc["counts"]["killed"] > 0
