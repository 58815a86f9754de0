"""The patch series in ``patches/``: generated from the plugin, applies, imports, checks.

Needs pristine SGLang trees: 0.5.12.post1 from the installed package (the wheel's files,
hash-checked against its RECORD) or its wheel, and 0.5.12 from its PyPI wheel (cached in
``.whl/``; the 0.5.12 tests are skipped if it cannot be downloaded).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang_futuremap_patch import series_tools
from sglang_futuremap_patch.series_tools import (
    AUTHOR_EMAIL,
    AUTHOR_NAME,
    COVER_LETTER,
    PR_URL,
    SERIES_FILE,
    SeriesError,
)

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "patches"
SHIMS = ROOT / "tests" / "cpu_shims"
WHEEL_CACHE = ROOT / ".whl"


# ----------------------------------------------------------------------------- fixtures


def pristine_tree(tmp_path_factory: pytest.TempPathFactory, version: str) -> Path:
    """A pristine SGLang ``version`` repository, built once per session (shared by files)."""
    tree = tmp_path_factory.getbasetemp() / f"pristine-{version}"
    if (tree / ".git").exists():
        return tree
    try:
        installed = importlib.metadata.version("sglang") == version
    except importlib.metadata.PackageNotFoundError:
        installed = False
    try:
        series_tools.make_pristine_tree(tree, version, installed=installed, cache_dir=WHEEL_CACHE)
    except SeriesError as exc:
        pytest.skip(f"no pristine SGLang {version}: {exc}")
    return tree


def clone(tree: Path, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(tree), str(dest)], check=True)
    return dest


#: A committer for the commits tests make, whatever the host's git config says.
IDENTITY = ("-c", "user.name=test", "-c", "user.email=test@example.invalid")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *IDENTITY, *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="session")
def series():
    from sglang_futuremap_patch.backports import load_series

    return load_series()


@pytest.fixture(scope="session")
def post1(tmp_path_factory) -> Path:
    return pristine_tree(tmp_path_factory, "0.5.12.post1")


@pytest.fixture(scope="session")
def v0512(tmp_path_factory) -> Path:
    return pristine_tree(tmp_path_factory, "0.5.12")


@pytest.fixture(scope="session")
def patch_files(series) -> list[Path]:
    files = series_tools.series_patches(PATCHES)
    assert [p.name for p in files] == [bp.patch_file for bp in series]
    return files


# ----------------------------------------------------------------------------- (a) generated


def test_regenerating_gives_the_committed_series(series, post1, tmp_path):
    """The plugin and patches/ agree by construction: regenerating changes nothing."""
    date = series_tools.recorded_date(PATCHES)
    assert date, "patches/ records no Last-Update date"
    out = tmp_path / "patches"
    series_tools.export_series(clone(post1, tmp_path / "tree"), out, series, date)
    committed = sorted(p.name for p in PATCHES.iterdir())
    assert sorted(p.name for p in out.iterdir()) == committed
    stale = [n for n in committed if (out / n).read_bytes() != (PATCHES / n).read_bytes()]
    assert not stale, (
        f"patches/ is out of date with the back-port modules ({', '.join(stale)}); "
        "run: PYTHONPATH=tests/cpu_shims .venv/bin/python scripts/export_patches.py"
    )


# ----------------------------------------------------------------------------- (b) every prefix


_IMPORT_CHECK = textwrap.dedent(
    """
    import importlib, json, sys
    import sglang
    from sglang_futuremap_patch._engine import ABSENT, fingerprint, same_value
    from sglang_futuremap_patch.backports import load_series

    applied = int(sys.argv[1])
    series = load_series()
    problems = []
    modules = sorted({t.owner for bp in series for t in bp.targets})
    for name in modules:
        importlib.import_module(name)
    # A path replaced again by a later back-port: only its last applied link (or, when
    # none is applied, its first link) says what the tree must hold.
    links = {}
    for i, bp in enumerate(series):
        for t in bp.targets:
            links.setdefault(t.path, []).append(i)
    for i, bp in enumerate(series):
        for t in bp.targets:
            done = [j for j in links[t.path] if j < applied]
            if i != (done[-1] if done else links[t.path][0]):
                continue
            mod = sys.modules[t.owner]
            *parents, attr = t.name.split(".")
            owner = mod
            for p in parents:
                owner = getattr(owner, p)
            raw = vars(owner).get(attr)
            if t.kind == "guard":  # relied on, never changed
                ok = raw is not None and fingerprint(raw) == t.expected
            elif i < applied and t.kind == "splice":
                ok = raw is not None and fingerprint(raw) == fingerprint(t.replacement)
            elif i < applied and t.kind == "value":
                ok = same_value(getattr(owner, attr, None), t.replacement)
            elif i < applied:  # a wrap target: the patch's text edit
                ok = raw is not None and fingerprint(raw) != t.expected
            elif t.expected == ABSENT:
                ok = attr not in vars(owner)
            else:
                ok = raw is not None and fingerprint(raw) == t.expected
            if not ok:
                problems.append(t.path)
    print(json.dumps({"sglang": sglang.__file__, "modules": modules, "problems": problems}))
    """
)


def _import_check(tree: Path, applied: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "python"), str(ROOT), str(SHIMS)])
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK, str(applied)],
        env=env, cwd=tree, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (
        f"{tree} (first {applied} patches) does not import:\n{proc.stderr[-4000:]}"
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("flavour", ["0.5.12.post1", "0.5.12"])
def test_every_prefix_applies_and_imports(flavour, request, patch_files, tmp_path):
    """git am, one patch at a time; after each, the touched modules import and carry
    exactly the back-ports applied so far (and the pristine code for the rest)."""
    pristine = request.getfixturevalue("post1" if flavour == "0.5.12.post1" else "v0512")
    repo = clone(pristine, tmp_path / "repo")
    heads = []
    for patch in patch_files:
        proc = subprocess.run(
            ["git", "-C", str(repo), *IDENTITY, "am", "-q", "-k", "--3way", str(patch)],
            capture_output=True, text=True,
        )
        assert proc.returncode == 0, f"{patch.name} does not apply on {flavour}:\n{proc.stderr}"
        heads.append(git(repo, "rev-parse", "HEAD"))
    subjects = git(repo, "log", "--format=%s", f"v{flavour}..HEAD").splitlines()[::-1]
    assert subjects == [_subject(p) for p in patch_files]  # -k kept the [Spec] prefix

    trees = []
    for n, head in enumerate(heads, 1):
        wt = tmp_path / f"prefix-{n}"
        git(repo, "worktree", "add", "-q", "--detach", str(wt), head)
        trees.append((wt, n))
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda a: _import_check(*a), trees))
    for (wt, n), result in zip(trees, results):
        assert Path(result["sglang"]).is_relative_to(wt), "imported the installed sglang"
        assert not result["problems"], f"after {n} patch(es): {result['problems']}"


def _subject(patch: Path) -> str:
    match = re.search(r"^Subject: (.*(?:\n .*)*)", patch.read_text(), re.M)
    assert match, f"{patch.name} has no Subject"
    return " ".join(match.group(1).split())


# ----------------------------------------------------------------------------- (c) headers


def test_patch_headers(series, patch_files):
    date = series_tools.recorded_date(PATCHES)
    for bp, patch in zip(series, patch_files):
        text = patch.read_text()
        header = text.split("\n---\n", 1)[0]
        assert f"From: {AUTHOR_NAME}\n <{AUTHOR_EMAIL}>" in header or (
            f"From: {AUTHOR_NAME} <{AUTHOR_EMAIL}>" in header
        )
        assert _subject(patch) == bp.title
        trailers = header.strip().split("\n\n")[-1].splitlines()
        origins = [f"Origin: backport, {PR_URL.format(pr)}" for pr in bp.upstream_prs]
        module = series_tools.backport_module(bp).__name__.replace(".", "/") + ".py"
        assert trailers == origins + [
            f"Applied-Upstream: {bp.upstream_trailer}",
            f"Last-Update: {date}",
            f"Plugin-Module: {module}",
        ], patch.name
        assert (ROOT / module).exists()
        assert "\nWhy:" not in header and "``" not in header  # prose, not the docstring
    names = (PATCHES / SERIES_FILE).read_text().split()
    assert names == [bp.patch_file for bp in series]
    cover = (PATCHES / COVER_LETTER).read_text()
    assert "git am -k --3way" in cover and "git apply -p2" in cover
    assert re.search(r"^base-commit: [0-9a-f]{40}$", cover, re.M)
    for i, bp in enumerate(series, 1):
        module = series_tools.backport_module(bp).__name__.replace(".", "/") + ".py"
        for pr in bp.upstream_prs:
            assert re.search(rf"^  #{pr}\s+{i:04d}\s+{re.escape(module)}$", cover, re.M), (pr, i)


# ----------------------------------------------------------------------------- (d) check / apply


def _state(repo: Path) -> tuple[str, str, int]:
    return (
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain"),
        git(repo, "worktree", "list", "--porcelain").count("worktree "),
    )


def test_check_and_apply_on_a_clean_tree(post1, patch_files, tmp_path):
    repo = clone(post1, tmp_path / "repo")
    before = _state(repo)
    ok, message = series_tools.check(repo, PATCHES)
    assert ok, message
    assert _state(repo) == before
    ok, message = series_tools.apply(repo, PATCHES)
    assert ok, message
    assert git(repo, "rev-list", "--count", "v0.5.12.post1..HEAD") == str(len(patch_files))
    assert git(repo, "status", "--porcelain") == ""
    after = _state(repo)
    for action in (series_tools.check, series_tools.apply):
        ok, message = action(repo, PATCHES)
        assert not ok and "already applied" in message
        assert _state(repo) == after


def test_check_and_apply_leave_a_conflicting_tree_untouched(post1, patch_files, tmp_path):
    repo = clone(post1, tmp_path / "repo")
    worker = repo / "python/sglang/srt/speculative/eagle_worker_v2.py"
    stock = "            batch_output = self.verify(model_worker_batch)\n"
    text = worker.read_text()
    assert text.count(stock) == 1
    worker.write_text(text.replace(stock, stock.replace("self.verify(", "self.verify_local(")))
    git(repo, "commit", "-q", "-am", "local change where patch 1 publishes")
    before = _state(repo)

    ok, message = series_tools.check(repo, PATCHES)
    assert not ok
    assert patch_files[0].name in message and "eagle_worker_v2.py" in message, message
    assert _state(repo) == before

    ok, message = series_tools.apply(repo, PATCHES)
    assert not ok
    assert patch_files[0].name in message and "eagle_worker_v2.py" in message, message
    assert _state(repo) == before
    assert not (repo / ".git" / "rebase-apply").exists()


def test_check_and_apply_refuse_a_dirty_tree(post1, tmp_path):
    repo = clone(post1, tmp_path / "repo")
    (repo / "python/sglang/srt/managers/overlap_utils.py").write_text("# edited\n")
    for action in (series_tools.check, series_tools.apply):
        ok, message = action(repo, PATCHES)
        assert not ok and "uncommitted changes" in message
    assert git(repo, "status", "--porcelain") == "M python/sglang/srt/managers/overlap_utils.py"


def test_check_a_wheel_shaped_tree(post1, tmp_path):
    """site-packages layout (sglang/... at the top): the series applies with -p2."""
    repo = tmp_path / "site-packages"
    repo.mkdir()
    git(repo, "init", "-q")
    subprocess.run(["cp", "-r", str(post1 / "python" / "sglang"), str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "site-packages")
    ok, message = series_tools.check(repo, PATCHES)
    assert ok, message


def test_module_docstrings_number_the_back_ports_as_series_does() -> None:
    """"Back-port N" in a module's first line is its place in SERIES, and a mention of another
    back-port by number and name ("back-port 14 (draft-extend-lens" in the README) names the
    module at that place."""
    import importlib
    import re
    from pathlib import Path

    from sglang_futuremap_patch.backports import SERIES

    ids = {}
    for i, name in enumerate(SERIES, 1):
        module = importlib.import_module(f"sglang_futuremap_patch.backports.{name}")
        assert module.__doc__.startswith(f"Back-port {i}: "), (name, module.__doc__.splitlines()[0])
        ids[i] = module.BACKPORT.id
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    mentions = re.findall(r"back-port (\d+) \(([a-z0-9-]+)", readme, re.I)
    assert mentions, "the README names back-ports by number and id"
    for number, bp_id in mentions:
        if bp_id in ids.values():
            assert ids[int(number)] == bp_id, (number, bp_id)
