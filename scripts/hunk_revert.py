#!/usr/bin/env python3
"""Revert each hunk of ``patches/`` in turn and expect a behaviour test to fail.

For hunk h of patch k the SGLang tree is the pristine release with patches 1..k-1 applied
whole and patch k applied without hunk h (the other hunks of the patch are kept). The
behaviour tests (``BEHAVIOUR_TESTS`` in ``tests/test_flavours.py``) of the back-ports that
exist at patch k then run against that tree in the patched-tree flavour, in mutant mode
(``SGLANG_FUTUREMAP_TEST_MUTANT=1``: the gate is not asked and the plugin installs nothing,
so the code under test is exactly the tree's source). At least one of them must fail: the
hunk is *killed*. Fingerprint, drift and series tests do not count; they are not behaviour
tests.

A test counts only if it passes on the same prefix with the hunk in place (the baseline:
patches 1..k whole), since a test written against the whole series may need a later patch.
The back-port's own test file runs first; the other eligible files run only when it kills
nothing. A hunk that no test of its prefix kills is tried once more on the whole series:
patches k+1.. applied on top of the mutant (with a three-way merge where their context moved;
where one does not apply, only the prefix counts), against every behaviour test.

A hunk that leaves the module's syntax tree unchanged but for docstrings (comments, blank
lines, docstrings, layout) is classified as having no behaviour, with that reason, and is not
run. A hunk whose revert alone has no observable effect (e.g. a call left to a function that
another hunk made a no-op) is declared in ``scripts/hunk_revert_no_effect.json`` with the
reason; it still runs, and is reported as ``no-effect`` when it survives. Anything else that
no test kills is a *survivor*; the exit status is then 1.

Run it with the CPU environment on a CPU host::

    scripts/cpu-env.sh python scripts/hunk_revert.py --json OUT.json --markdown OUT.md \
        --before results/hunk-revert/before-new-tests.json     # the whole series, recorded
    scripts/cpu-env.sh python scripts/hunk_revert.py --hunk 4:12        # one hunk
    scripts/cpu-env.sh python scripts/hunk_revert.py --share 0/8        # the test command's share

Hunks are numbered per patch from 1, in patch order, and globally from 0 over the whole
series (``--share I/M`` takes the hunks whose global number is I modulo M).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

logger = logging.getLogger("sglang_futuremap_patch.hunk_revert")

PATCHES_DIR = ROOT / "patches"
FLAVOURS_TEST = ROOT / "tests" / "test_flavours.py"
#: Behaviour test files not named after one back-port module (``tests/test_<module>.py``),
#: with the earliest back-port (module name in ``SERIES``) whose tree they can test.
SHARED_TEST_FILES: dict[str, str] = {
    "tests/test_overlap_simulation.py": "worker_on_publish",
    "tests/test_future_map.py": "publish_stash",
    "tests/test_selfcheck.py": "publish_stash",
}
#: Hunks that survive because reverting them alone changes nothing observable (each with
#: the reason), keyed by :func:`hunk_id`. A listed hunk that survives is reported as
#: ``no-effect``; one that a test kills is simply killed.
NO_EFFECT_FILE = ROOT / "scripts" / "hunk_revert_no_effect.json"
DEFAULT_TIMEOUT_S = 900.0
#: Environment variable through which this module, loaded as a pytest plugin in the test
#: process (``-p hunk_revert``), learns where to append each test's outcome.
OUTCOMES_ENV = "HUNK_REVERT_OUTCOMES"
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


# ----------------------------------------------------------------------------- patch files


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` hunk: its header line and body lines (line ends kept)."""

    header: str
    lines: tuple[str, ...]

    def _numbers(self) -> tuple[int, int, int, int]:
        m = _HUNK_HEADER.match(self.header)
        if not m:
            raise ValueError(f"not a hunk header: {self.header!r}")
        a, b, c, d = m.groups()
        return int(a), int(b) if b is not None else 1, int(c), int(d) if d is not None else 1

    @property
    def old_start(self) -> int:
        return self._numbers()[0]

    @property
    def old_len(self) -> int:
        return self._numbers()[1]

    @property
    def new_start(self) -> int:
        return self._numbers()[2]

    @property
    def new_len(self) -> int:
        return self._numbers()[3]

    def old_side(self) -> list[str]:
        """The lines this hunk replaces (context and ``-`` lines, prefix stripped)."""
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "-")]

    def new_side(self) -> list[str]:
        """The lines this hunk leaves (context and ``+`` lines, prefix stripped)."""
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "+")]

    def changed_new_lines(self) -> list[int]:
        """Post-image line numbers the hunk touches: each non-blank added line, and the line
        that follows each run of removed lines."""
        n = self.new_start
        found: list[int] = []
        for ln in self.lines:
            kind = ln[:1]
            if kind == "+":
                if ln[1:].strip():
                    found.append(n)
                n += 1
            elif kind == "-":
                if not found or found[-1] != n:
                    found.append(n)
            elif kind in (" ", "\n"):
                n += 1
        if not found:  # only blank lines added
            found = [self.new_start]
        return found

    def with_new_start(self, new_start: int) -> Hunk:
        m = _HUNK_HEADER.match(self.header)
        assert m is not None
        start, end = m.span(3)
        return Hunk(self.header[:start] + str(new_start) + self.header[end:], self.lines)


@dataclass(frozen=True)
class FileDiff:
    """One ``diff --git`` section: its header lines (up to ``+++``) and hunks."""

    header: tuple[str, ...]
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        for ln in self.header:
            if ln.startswith("+++ "):
                name = ln[4:].rstrip("\n")
                return name[2:] if name.startswith("b/") else name
        raise ValueError("file diff without a +++ line")


@dataclass(frozen=True)
class Patch:
    """A ``git format-patch`` file: the text before the first diff, the diffs, the rest."""

    name: str
    preamble: str
    files: tuple[FileDiff, ...]
    trailer: str

    def hunks(self) -> list[tuple[FileDiff, Hunk]]:
        """Every hunk with its file, numbered 1.. in this order."""
        return [(f, h) for f in self.files for h in f.hunks]

    def render(self) -> str:
        out = [self.preamble]
        for f in self.files:
            out.extend(f.header)
            for h in f.hunks:
                out.append(h.header)
                out.extend(h.lines)
        out.append(self.trailer)
        return "".join(out)

    def without_hunk(self, number: int) -> Patch:
        """This patch with hunk ``number`` (1-based, as :meth:`hunks`) left out.

        Later hunks of the same file keep their old-side position and move on the new side
        by what the dropped hunk added; a file left without hunks is left out.
        """
        if not 1 <= number <= len(self.hunks()):
            raise ValueError(f"{self.name} has {len(self.hunks())} hunks, no hunk {number}")
        files: list[FileDiff] = []
        seen = 0
        for f in self.files:
            if not seen < number <= seen + len(f.hunks):
                files.append(f)
                seen += len(f.hunks)
                continue
            drop = number - seen - 1
            seen += len(f.hunks)
            dropped = f.hunks[drop]
            shift = dropped.new_len - dropped.old_len
            kept = list(f.hunks[:drop]) + [
                h.with_new_start(h.new_start - shift) for h in f.hunks[drop + 1 :]
            ]
            if kept:
                files.append(FileDiff(f.header, tuple(kept)))
        return dataclasses.replace(self, files=tuple(files))


def parse_patch(text: str, name: str = "<patch>") -> Patch:
    """Split a ``git format-patch`` (or plain ``git diff``) text into files and hunks.

    Hunk bodies are delimited by the line counts of their headers, so a body line that
    looks like a header cannot end a hunk early. ``render()`` gives the text back exactly.
    """
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and not lines[i].startswith("diff --git "):
        i += 1
    preamble = "".join(lines[:i])
    files: list[FileDiff] = []
    while i < len(lines) and lines[i].startswith("diff --git "):
        header = [lines[i]]
        i += 1
        while i < len(lines) and not lines[i].startswith(("@@", "diff --git ")):
            header.append(lines[i])
            i += 1
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            hunk_header = lines[i]
            m = _HUNK_HEADER.match(hunk_header)
            if not m:
                raise ValueError(f"{name}: bad hunk header {hunk_header!r}")
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            i += 1
            body: list[str] = []
            while old_left > 0 or new_left > 0:
                if i >= len(lines):
                    raise ValueError(f"{name}: hunk {hunk_header.strip()} is cut short")
                ln = lines[i]
                kind = ln[:1]
                if kind in (" ", "\n"):
                    old_left -= 1
                    new_left -= 1
                elif kind == "-":
                    old_left -= 1
                elif kind == "+":
                    new_left -= 1
                elif kind != "\\":
                    raise ValueError(f"{name}: unexpected line in hunk {hunk_header.strip()}: {ln!r}")
                body.append(ln)
                i += 1
                if old_left < 0 or new_left < 0:
                    raise ValueError(f"{name}: hunk {hunk_header.strip()} is longer than its header")
            if i < len(lines) and lines[i].startswith("\\"):
                body.append(lines[i])
                i += 1
            hunks.append(Hunk(hunk_header, tuple(body)))
        if not hunks:
            raise ValueError(f"{name}: {header[0].strip()} has no hunks (binary or mode-only?)")
        files.append(FileDiff(tuple(header), tuple(hunks)))
    return Patch(name, preamble, tuple(files), "".join(lines[i:]))


def revert_hunk(after: str, hunk: Hunk) -> str:
    """``after`` (a file as the whole patch leaves it) with ``hunk`` undone.

    The hunk's new side must stand at its stated position, which holds for a file exactly as
    the patch produced it.
    """
    lines = after.splitlines(keepends=True)
    start = hunk.new_start - 1 if hunk.new_len else hunk.new_start
    new = hunk.new_side()
    found = lines[start : start + len(new)]
    if [ln.rstrip("\n") for ln in found] != [ln.rstrip("\n") for ln in new]:
        raise ValueError(f"hunk {hunk.header.strip()} does not stand at line {hunk.new_start}")
    return "".join(lines[:start] + hunk.old_side() + lines[start + len(new) :])


def hunk_id(path: str, hunk: Hunk) -> str:
    """A name for a hunk that survives line shifts: its file and body lines, hashed."""
    return hashlib.sha256((path + "\n" + "".join(hunk.lines)).encode()).hexdigest()[:16]


def load_no_effect(path: Path = NO_EFFECT_FILE) -> dict[str, dict[str, Any]]:
    """The declared no-effect hunks, by :func:`hunk_id`."""
    entries = json.loads(path.read_text()) if path.exists() else []
    found = {e["id"]: e for e in entries}
    if len(found) != len(entries):
        raise ValueError(f"{path}: an id is listed twice")
    return found


# ----------------------------------------------------------------------------- classification


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def no_behaviour_reason(before: str, after: str) -> str | None:
    """Why the change from ``before`` to ``after`` (one Python file) cannot alter behaviour,
    or None when it can.

    The test is the file's syntax tree: equal trees (comments, blank lines, layout) or trees
    equal once docstrings are dropped. A file that does not parse either way has behaviour.
    """
    try:
        old, new = ast.parse(before), ast.parse(after)
    except SyntaxError:
        return None
    if ast.dump(old) == ast.dump(new):
        if [ln.strip() for ln in before.splitlines() if ln.strip()] == [
            ln.strip() for ln in after.splitlines() if ln.strip()
        ]:
            return "layout only (indentation or blank lines); same syntax tree"
        return "comments or layout only; same syntax tree"
    if ast.dump(_strip_docstrings(old)) == ast.dump(_strip_docstrings(new)):
        return "docstrings (and comments) only; same syntax tree without docstrings"
    return None


@functools.lru_cache(maxsize=4)
def _parsed(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def enclosing_scope(source: str, line: int) -> str:
    """Dotted name of the innermost class or function around ``line`` (``<module>`` if none)."""
    tree = _parsed(source)
    if tree is None:
        return "<unparsable>"
    names: list[str] = []

    def visit(body: Iterable[ast.stmt]) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first <= line <= (node.end_lineno or node.lineno):
                names.append(node.name)
                visit(node.body)
                return

    visit(tree.body)
    return ".".join(names) or "<module>"


def scopes(source: str, lines: Iterable[int], most: int = 4) -> str:
    """The scopes of ``lines`` (see :func:`enclosing_scope`), each once, in order."""
    names: list[str] = []
    for line in lines:
        name = enclosing_scope(source, line)
        if name not in names:
            names.append(name)
    return ", ".join(names[:most]) + (f" (+{len(names) - most} more)" if len(names) > most else "")


# ----------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class HunkRef:
    """Hunk ``hunk`` (1-based) of patch ``patch`` (1-based); ``index`` counts from 0 over the
    whole series."""

    index: int
    patch: int
    hunk: int


def number_hunks(patches: Sequence[Patch]) -> list[HunkRef]:
    refs: list[HunkRef] = []
    for k, p in enumerate(patches, start=1):
        for h in range(1, len(p.hunks()) + 1):
            refs.append(HunkRef(len(refs), k, h))
    return refs


def parse_share(text: str) -> tuple[int, int]:
    """``"I/M"`` -> (I, M) with 0 <= I < M."""
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise ValueError(f"share must be I/M with 0 <= I < M, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def select_hunks(
    refs: Sequence[HunkRef],
    *,
    patches: Sequence[int] = (),
    hunks: Sequence[tuple[int, int]] = (),
    share: tuple[int, int] | None = None,
) -> list[HunkRef]:
    """The hunks a run covers: every hunk of ``patches`` and each ``(patch, hunk)`` named
    (all hunks when neither is given), then of those the ``share`` ``(I, M)``."""
    missing = set(hunks) - {(r.patch, r.hunk) for r in refs}
    missing |= {(k, 0) for k in patches if k not in {r.patch for r in refs}}
    if missing:
        raise ValueError(f"no such hunk(s) (patch, hunk; 0 = the patch): {sorted(missing)}")
    chosen = list(refs)
    if patches or hunks:
        chosen = [r for r in chosen if r.patch in patches or (r.patch, r.hunk) in hunks]
    if share is not None:
        i, m = share
        chosen = [r for r in chosen if r.index % m == i]
    return chosen


def behaviour_tests(flavours_test: Path = FLAVOURS_TEST) -> list[str]:
    """``BEHAVIOUR_TESTS`` of ``tests/test_flavours.py``, read without importing it."""
    for node in ast.parse(flavours_test.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "BEHAVIOUR_TESTS" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
    raise ValueError(f"{flavours_test}: no BEHAVIOUR_TESTS list of strings")


def backport_of_test(test_file: str, series: Sequence[str]) -> int:
    """The 1-based back-port (patch) number a behaviour test file belongs to."""
    module = SHARED_TEST_FILES.get(test_file)
    if module is None:
        m = re.fullmatch(r"tests/test_(\w+)\.py", test_file)
        module = m.group(1) if m else None
    if module not in series:
        raise ValueError(f"{test_file}: not named after a back-port module and not in "
                         "SHARED_TEST_FILES")
    return series.index(module) + 1


def stages_for(patch: int, tests: Sequence[str], series: Sequence[str],
               first: int | None = None) -> list[list[str]]:
    """The test files of back-ports 1..``patch`` in the order they run: the files of back-port
    ``first`` (default ``patch``) first, then the others (one stage when it has none)."""
    first_bp = patch if first is None else first
    eligible = [t for t in tests if backport_of_test(t, series) <= patch]
    own = [t for t in eligible if backport_of_test(t, series) == first_bp]
    rest = [t for t in eligible if t not in own]
    return [s for s in (own, rest) if s]


# ----------------------------------------------------------------------------- pytest plugin


def pytest_runtest_logreport(report: Any) -> None:
    """Append each test phase's outcome to ``$HUNK_REVERT_OUTCOMES`` (one JSON per line)."""
    path = os.environ.get(OUTCOMES_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"id": report.nodeid, "when": report.when,
                                "outcome": report.outcome, "duration": report.duration}) + "\n")


def pytest_collectreport(report: Any) -> None:
    path = os.environ.get(OUTCOMES_ENV)
    if path and report.failed:
        with open(path, "a") as f:
            f.write(json.dumps({"id": report.nodeid, "when": "collect",
                                "outcome": "failed", "duration": 0.0}) + "\n")


# ----------------------------------------------------------------------------- test runs


@dataclass
class PytestRun:
    """One pytest process: which test ids passed and which failed, in run order."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    timed_out: bool = False
    returncode: int | None = None
    wall_s: float = 0.0
    tail: str = ""


def read_outcomes(lines: Iterable[str]) -> PytestRun:
    """Fold the plugin's per-phase lines into per-test outcomes (a failed phase fails it)."""
    status: dict[str, str] = {}
    for raw in lines:
        if not raw.strip():
            continue
        rec = json.loads(raw)
        tid, outcome = rec["id"], rec["outcome"]
        if rec["when"] == "collect":
            status[tid] = "failed"
        elif outcome == "failed":
            status[tid] = "failed"
        elif outcome == "skipped":
            status.setdefault(tid, "skipped")
        else:
            status.setdefault(tid, "passed")
    run = PytestRun()
    for tid, s in status.items():
        {"passed": run.passed, "failed": run.failed, "skipped": run.skipped}[s].append(tid)
    return run


def _run_pytest(tree: Path, args: Sequence[str], timeout_s: float, scratch: Path) -> PytestRun:
    outcomes = scratch / f"outcomes-{threading.get_ident()}.jsonl"
    outcomes.unlink(missing_ok=True)
    env = dict(os.environ)
    python_dir = tree / "python"
    env.update(
        SGLANG_FUTUREMAP_TEST_FLAVOUR="patched-tree",
        SGLANG_FUTUREMAP_TEST_MUTANT="1",
        SGLANG_FUTUREMAP_TREE=str(python_dir),
        SGLANG_FUTUREMAP_PATCH="off",
        **{OUTCOMES_ENV: str(outcomes)},
    )
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(python_dir), str(ROOT), str(ROOT / "scripts"), env.get("PYTHONPATH", "")] if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "hunk_revert",
           *args]
    logger.debug("in %s: %s", tree, shlex.join(cmd[:12]) + (" ..." if len(cmd) > 12 else ""))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    run = read_outcomes(outcomes.read_text().splitlines() if outcomes.exists() else [])
    run.timed_out, run.returncode = timed_out, proc.returncode
    run.wall_s = time.monotonic() - start
    run.tail = out[-4000:]
    return run


# ----------------------------------------------------------------------------- trees


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    proc = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=hunk-revert", "-c", "user.email=hunk-revert@invalid",
         *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed in {repo}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def _drop_bytecode(tree: Path, paths: Iterable[str]) -> None:
    """Remove cached bytecode of ``paths``: a reverted hunk can keep a file's size, and the
    file is rewritten within the second its cache was written."""
    for rel in paths:
        src = tree / rel
        for pyc in (src.parent / "__pycache__").glob(f"{src.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)


class Trees:
    """A pristine tree with one commit per patch (tag ``p<k>``), and one worktree per job."""

    def __init__(self, base: Path, patches: Sequence[Patch], jobs: int) -> None:
        from sglang_futuremap_patch import series_tools

        self.repo = base / "series"
        series_tools.make_pristine_tree(self.repo, installed=True)
        _git(self.repo, "tag", "p0")
        self.patch_files: list[Path] = []
        for k, patch in enumerate(patches, start=1):
            diff = base / f"p{k}.patch"
            diff.write_text(patch.render())
            self.patch_files.append(diff)
            _git(self.repo, "apply", str(diff))
            _git(self.repo, "add", "-A")
            _git(self.repo, "commit", "-q", "--no-verify", "-m", patch.name)
            _git(self.repo, "tag", f"p{k}")
        self.touched = sorted({f.path for p in patches for f in p.files})
        self.pool: queue.Queue[Path] = queue.Queue()
        for j in range(jobs):
            wt = base / f"work{j}"
            _git(self.repo, "worktree", "add", "-q", "--detach", str(wt), f"p{len(patches)}")
            self.pool.put(wt)

    def file_at(self, k: int, path: str) -> str:
        return _git(self.repo, "show", f"p{k}:{path}")

    def reset(self, wt: Path, k: int) -> None:
        _git(wt, "reset", "-q", "--hard", f"p{k}")
        _drop_bytecode(wt, self.touched)

    def apply_saved(self, wt: Path, k: int) -> bool:
        """Apply patch ``k`` as written to the worktree, with a three-way merge where its
        context moved; False when it does not apply (a conflict: the worktree is then left as
        it is, to be reset)."""
        diff = str(self.patch_files[k - 1])
        ok = any(
            subprocess.run(["git", "-C", str(wt), "apply", *how, diff],
                           capture_output=True).returncode == 0
            for how in ([], ["--3way"]))
        _drop_bytecode(wt, self.touched)
        return ok

    def apply(self, wt: Path, patch_text: str, scratch: Path) -> None:
        diff = scratch / f"mutant-{threading.get_ident()}.patch"
        diff.write_text(patch_text)
        _git(wt, "apply", str(diff))
        _drop_bytecode(wt, self.touched)


# ----------------------------------------------------------------------------- the check


#: What a checked hunk can come to (``no-effect``: declared, and no test killed it).
VERDICTS = ("killed", "no-behaviour", "no-effect", "survived", "error")


@dataclass
class HunkResult:
    index: int
    patch: int
    patch_name: str
    hunk: int
    file: str
    scope: str
    lines: str
    verdict: str  # killed | no-behaviour | no-effect | survived | error
    hunk_id: str = ""
    mode: str | None = None  # where it was killed: "prefix" or "series"
    killed_by: str | None = None
    reason: str | None = None
    note: str | None = None
    tests_run: int = 0
    wall_s: float = 0.0


class Checker:
    """Checks hunks; baselines are run once per prefix and test file, on first need."""

    def __init__(self, patches: Sequence[Patch], series: Sequence[str], tests: Sequence[str],
                 base: Path, jobs: int, timeout_s: float) -> None:
        self.patches = list(patches)
        self.series = list(series)
        self.tests = list(tests)
        self.base = base
        self.timeout_s = timeout_s
        self.trees = Trees(base, patches, jobs)
        self.no_effect = load_no_effect()
        self._passing: dict[tuple[int, str], list[str]] = {}
        self._locks = {k: threading.Lock() for k in range(len(patches) + 1)}
        self.baseline_log: list[dict[str, Any]] = []

    def baseline(self, k: int, files: Sequence[str]) -> list[str]:
        """Test ids of ``files`` that pass on patches 1..k whole, in file order."""
        with self._locks[k]:
            missing = [f for f in files if (k, f) not in self._passing]
            if missing:
                wt = self.trees.pool.get()
                try:
                    self.trees.reset(wt, k)
                    run = _run_pytest(wt, ["--continue-on-collection-errors", *missing],
                                      self.timeout_s, self.base)
                finally:
                    self.trees.pool.put(wt)
                logger.info("baseline p%d %s: %d passed, %d failed, %d skipped (%.0f s)", k,
                            " ".join(Path(f).name for f in missing), len(run.passed),
                            len(run.failed), len(run.skipped), run.wall_s)
                if run.timed_out:
                    raise RuntimeError(f"baseline of patch {k} timed out:\n{run.tail}")
                for f in missing:
                    self._passing[(k, f)] = [t for t in run.passed if t.split("::")[0] == f]
                    self.baseline_log.append({
                        "patch": k, "file": f, "passed": len(self._passing[(k, f)]),
                        "failed": [t for t in run.failed if t.split("::")[0] == f],
                        "skipped": sum(t.split("::")[0] == f for t in run.skipped)})
        return [t for f in files for t in self._passing[(k, f)]]

    def check(self, ref: HunkRef) -> HunkResult:
        start = time.monotonic()
        patch = self.patches[ref.patch - 1]
        fdiff, hunk = patch.hunks()[ref.hunk - 1]
        after = self.trees.file_at(ref.patch, fdiff.path)
        changed = hunk.changed_new_lines()
        first, last = min(changed), max(changed)
        result = HunkResult(
            ref.index, ref.patch, patch.name, ref.hunk, fdiff.path, scopes(after, changed),
            f"{first}-{last}" if last != first else str(first), verdict="error",
            hunk_id=hunk_id(fdiff.path, hunk))
        try:
            before = revert_hunk(after, hunk)
            reason = no_behaviour_reason(before, after)
            if reason is not None:
                result.verdict, result.reason = "no-behaviour", reason
                return result
            last_patch = len(self.patches)
            plans = [("prefix", ref.patch, stages_for(ref.patch, self.tests, self.series))]
            if ref.patch < last_patch:
                plans.append(("series", last_patch,
                              [sum(stages_for(last_patch, self.tests, self.series,
                                              first=ref.patch), [])]))
            for mode, k, stages in plans:
                for files in stages:
                    ids = self.baseline(k, files)
                    if not ids:
                        continue
                    run = self._mutant_run(ref, mode, fdiff.path, before, ids, result)
                    if run is None:
                        break  # the later patches do not apply without this hunk
                    result.tests_run += len(run.passed) + len(run.failed)
                    if run.failed or run.timed_out:
                        result.verdict, result.mode = "killed", mode
                        result.killed_by = (run.failed[0] if run.failed
                                            else f"timeout after {self.timeout_s:.0f} s")
                        return result
                    if run.returncode not in (0, None):
                        result.reason = f"pytest exited {run.returncode}:\n{run.tail[-1500:]}"
                        return result
            declared = self.no_effect.get(result.hunk_id)
            if declared is not None:
                result.verdict, result.reason = "no-effect", declared["reason"]
            else:
                result.verdict = "survived"
            return result
        except Exception as exc:  # recorded as an error verdict; the run goes on
            logger.exception("patch %d hunk %d", ref.patch, ref.hunk)
            result.reason = f"{type(exc).__name__}: {exc}"
            return result
        finally:
            result.wall_s = round(time.monotonic() - start, 1)
            logger.info("patch %d hunk %d (%s %s): %s%s (%.0f s)", ref.patch, ref.hunk,
                        result.file.rsplit("/", 1)[-1], result.scope, result.verdict,
                        f" by {result.killed_by} ({result.mode})" if result.killed_by else "",
                        result.wall_s)

    def _mutant_run(self, ref: HunkRef, mode: str, path: str, before: str,
                    ids: Sequence[str], result: HunkResult) -> PytestRun | None:
        """Run ``ids`` on the mutant: patches 1..k-1, patch k without the hunk and, in
        ``series`` mode, patches k+1.. on top. None when one of those does not apply."""
        wt = self.trees.pool.get()
        try:
            self.trees.reset(wt, ref.patch - 1)
            rest = self.patches[ref.patch - 1].without_hunk(ref.hunk)
            if rest.files:  # else the patch had this hunk only: the tree stays at k-1
                self.trees.apply(wt, rest.render(), self.base)
            if (wt / path).read_text() != before:
                raise RuntimeError(f"{path}: git apply of the patch without hunk {ref.hunk} "
                                   "differs from reverting the hunk in place")
            if mode == "series":
                for j in range(ref.patch + 1, len(self.patches) + 1):
                    if not self.trees.apply_saved(wt, j):
                        result.note = (f"series mode not run: patch {j} does not apply "
                                       "without this hunk")
                        return None
            return _run_pytest(wt, ["-x", *ids], self.timeout_s, self.base)
        finally:
            self.trees.pool.put(wt)


def load_patches(patches_dir: Path = PATCHES_DIR) -> list[Patch]:
    names = [n.strip() for n in (patches_dir / "series").read_text().splitlines()
             if n.strip() and not n.startswith("#")]
    return [parse_patch((patches_dir / n).read_text(), n) for n in names]


def run_check(refs: Sequence[HunkRef], patches: Sequence[Patch], *, jobs: int = 1,
              timeout_s: float = DEFAULT_TIMEOUT_S, keep: Path | None = None) -> dict[str, Any]:
    """Check ``refs``; returns the record (``hunks``: one :class:`HunkResult` dict each)."""
    from sglang_futuremap_patch.backports import SERIES

    tests = behaviour_tests()
    for t in tests:
        backport_of_test(t, SERIES)  # every behaviour file maps to a back-port
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hunk-revert-") as tmp:
        base = keep if keep is not None else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        checker = Checker(patches, SERIES, tests, base, jobs, timeout_s)
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(checker.check, refs))
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sglang_version": importlib.metadata.version("sglang"),
        "python": sys.version.split()[0],
        "series": [p.name for p in patches],
        "series_sha256": hashlib.sha256("".join(p.render() for p in patches).encode()).hexdigest(),
        "hunks_in_series": len(number_hunks(patches)),
        "hunks_checked": len(results),
        "counts": counts,
        "wall_s": round(time.monotonic() - start, 1),
        "baselines": sorted(checker.baseline_log, key=lambda b: (b["patch"], b["file"])),
        "hunks": [dataclasses.asdict(r) for r in results],
    }


def patch_summary(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per patch of ``record``: its name, how many of its hunks were checked, and how many
    got each verdict (``no-effect`` is a declared hunk that survived)."""
    rows: dict[int, dict[str, Any]] = {}
    for h in record["hunks"]:
        row = rows.setdefault(h["patch"], {"patch": h["patch"], "name": h["patch_name"],
                                           "hunks": 0, **{v: 0 for v in VERDICTS}})
        row["hunks"] += 1
        row[h["verdict"]] += 1
    return [rows[k] for k in sorted(rows)]


def _counts_line(record: dict[str, Any]) -> str:
    c = record["counts"]
    return (f"{record['hunks_checked']} of {record['hunks_in_series']} hunks: "
            f"{c.get('killed', 0)} killed, {c.get('no-behaviour', 0)} no behaviour, "
            f"{c.get('no-effect', 0)} declared without observable effect, "
            f"{c.get('survived', 0)} survived, {c.get('error', 0)} errors")


def markdown_table(record: dict[str, Any]) -> str:
    """The per-hunk table: where each hunk is and what became of it (the killing test)."""
    rows = ["| # | patch | hunk | where (post-image lines) | outcome | wall s |",
            "|---|---|---|---|---|---|"]
    for h in record["hunks"]:
        if h["verdict"] == "killed":
            outcome = f"killed by `{h['killed_by']}`"
            if h.get("mode") == "series":
                outcome += " (whole series)"
        elif h["verdict"] == "no-behaviour":
            outcome = f"no behaviour: {h['reason']}"
        elif h["verdict"] == "no-effect":
            outcome = f"declared, no observable effect (survives every test): {h['reason']}"
        else:
            outcome = f"**{h['verdict']}**" + (f": {h['reason'].splitlines()[0]}" if h["reason"] else "")
        where = f"`{h['file'].removeprefix('python/sglang/')}` `{h['scope']}` {h['lines']}"
        rows.append(f"| {h['index']} | {h['patch']:04d} | {h['hunk']} | {where} | {outcome} | "
                    f"{h['wall_s']:.0f} |")
    return "\n".join(rows) + "\n"


def markdown_report(record: dict[str, Any], before: dict[str, Any] | None = None,
                    before_name: str | None = None) -> str:
    """The record as a Markdown page: when, on what, the command and its wall time, the
    totals (and those of ``before``, an earlier record), one row per patch, one per hunk."""
    lines = [
        "# Hunk-revert check: each hunk of `patches/` reverted alone",
        "",
        f"- date: {record['date']}",
        f"- SGLang {record['sglang_version']}, Python {record['python']}",
        f"- command: `scripts/cpu-env.sh python {record.get('command', 'scripts/hunk_revert.py')}`",
        f"- wall time: {record['wall_s']:.0f} s ({record['wall_s'] / 60:.0f} min)",
        f"- result: {_counts_line(record)}",
    ]
    if before is not None:
        lines.append(f"- before{f' ({before_name})' if before_name else ''}: {_counts_line(before)}"
                     f", {before['wall_s']:.0f} s, {before['date']}")
    lines += [
        "",
        "A hunk is *killed* when a behaviour test that passes with it fails without it (on its",
        "prefix of the series, or else on the whole series); *no behaviour*: it changes only",
        "comments, layout or docstrings; *declared*: listed in",
        "`scripts/hunk_revert_no_effect.json` with the reason its revert alone changes nothing",
        "observable; *survived*: none of these (the check fails).",
        "",
        "| patch | hunks | killed | no behaviour | declared | survived | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in patch_summary(record):
        lines.append(f"| {row['name'].removesuffix('.patch')} | {row['hunks']} | {row['killed']} | "
                     f"{row['no-behaviour']} | {row['no-effect']} | {row['survived']} | "
                     f"{row['error']} |")
    c = record["counts"]
    lines.append(f"| **all** | {record['hunks_checked']} | {c['killed']} | {c['no-behaviour']} | "
                 f"{c['no-effect']} | {c['survived']} | {c['error']} |")
    lines += ["", "## Per hunk", "", markdown_table(record)]
    return "\n".join(lines)


def _hunk_arg(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected PATCH:HUNK, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 when every checked hunk is killed or has no behaviour, 1 when "
               "one survives (or could not be checked), 2 for bad arguments.")
    parser.add_argument("--patch", type=int, action="append", default=[], metavar="N",
                        help="the hunks of patch N (1-based; repeatable, adds to --hunk)")
    parser.add_argument("--hunk", type=_hunk_arg, action="append", default=[],
                        metavar="N:H", help="hunk H of patch N (repeatable)")
    parser.add_argument("--share", type=parse_share, metavar="I/M",
                        help="of the hunks chosen (default all), those whose global number "
                             "is I modulo M")
    parser.add_argument("--jobs", type=int, default=1, help="hunks checked at once (default 1)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds per pytest run (default {DEFAULT_TIMEOUT_S:.0f}); a "
                             "mutant that runs over it counts as killed")
    parser.add_argument("--json", type=Path, help="write the record as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the record as a Markdown page here "
                        "(totals, per patch, per hunk with the killing test)")
    parser.add_argument("--before", type=Path, help="an earlier JSON record whose totals the "
                        "Markdown page shows next to this run's")
    parser.add_argument("--keep", type=Path, help="build the trees here and keep them "
                        "(default: a temporary directory, removed at the end)")
    parser.add_argument("--list", action="store_true", help="list the selected hunks and stop")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    patches = load_patches()
    try:
        refs = select_hunks(number_hunks(patches), patches=args.patch, hunks=args.hunk,
                            share=args.share)
    except ValueError as exc:
        parser.error(str(exc))
    if args.list:
        for r in refs:
            f, h = patches[r.patch - 1].hunks()[r.hunk - 1]
            print(f"{r.index:4d}  {r.patch}:{r.hunk}  {hunk_id(f.path, h)}  {f.path} "
                  f"{h.header.strip()}")
        return 0
    if not refs:
        parser.error("no hunk selected")
    record = run_check(refs, patches, jobs=max(1, args.jobs), timeout_s=args.timeout,
                       keep=args.keep)
    record["command"] = shlex.join(["scripts/hunk_revert.py", *(argv if argv is not None else sys.argv[1:])])
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.markdown:
        before = json.loads(args.before.read_text()) if args.before else None
        args.markdown.write_text(markdown_report(
            record, before, args.before.name if args.before else None))
    c = record["counts"]
    print(f"{_counts_line(record)} ({record['wall_s']:.0f} s)")
    for h in record["hunks"]:
        if h["verdict"] in ("survived", "error"):
            print(f"  {h['verdict'].upper()}: patch {h['patch']} hunk {h['hunk']} "
                  f"({h['file']} {h['scope']} {h['lines']}) {h['reason'] or ''}".rstrip())
    return 0 if c["survived"] == c["error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
