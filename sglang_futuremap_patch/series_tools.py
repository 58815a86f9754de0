"""The patch series in ``patches/``: build it from the plugin, check it, apply it.

The series is *generated* from the back-port modules: every ``edit`` target's text edits are
made in its SGLang file as the engine makes them in the function's source at run time, and
every ``splice`` (a new function) is pasted there exactly as the engine installs it (same
source, same module globals), so the plugin and the patches are one piece of code. Regenerating must reproduce
``patches/`` byte for byte; ``tests/test_series.py`` and ``tests/test_drift.py`` hold both
sides to that.

``wrap`` targets are not pasted: the plugin wraps the stock function (e.g. spec-v2 overlap
batches go their own way in ``Scheduler.run_batch``, everything else is delegated), which has
no source form. The patch makes the equivalent change inside the stock function instead, as
the explicit, reviewed text edits the back-port module declares with the target
(``Target.edits``); each edit asserts that its anchor text occurs exactly once, inside that
function, so a changed SGLang file fails loudly instead of being patched somewhere else.

Entry points: :func:`make_pristine_tree` (an SGLang release as ``python/sglang/...`` in a
fresh git repository), :func:`export_series` (splice, commit, ``git format-patch``),
:func:`check` / :func:`apply` (for a user's SGLang checkout) and
:func:`patched_function_sources` (for the drift test).
"""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import importlib.metadata
import inspect
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from packaging.version import Version

from sglang_futuremap_patch._engine import ABSENT, GUARD, Backport, Target, TextEdit, _normalize_text

logger = logging.getLogger("sglang_futuremap_patch")

#: The release the series is made against (``--base=v<BASE_VERSION>``).
BASE_VERSION = "0.5.12.post1"
AUTHOR_NAME = "sglang-futuremap-patch maintainers"
AUTHOR_EMAIL = "maintainers@sglang-futuremap-patch.invalid"
#: Author/committer date of the pristine commit: a constant, so its id is reproducible.
PRISTINE_DATE = "2000-01-01T00:00:00+00:00"
PR_URL = "https://github.com/sgl-project/sglang/pull/{}"
COVER_LETTER = "0000-cover-letter.patch"
SERIES_FILE = "series"
_HERE = Path(__file__).resolve().parent
#: The series this install carries: package data in a wheel (pyproject.toml maps ``patches/``
#: into the package as ``sglang_futuremap_patch/patches``), else a source checkout's ``patches/``.
DEFAULT_PATCHES_DIR = (
    _HERE / "patches" if (_HERE / "patches" / SERIES_FILE).is_file() else _HERE.parent / "patches"
)

_PLUGIN_PACKAGE = "sglang_futuremap_patch"


class SeriesError(RuntimeError):
    """The series cannot be built as declared (an anchor moved, a target is missing, ...)."""


# ----------------------------------------------------------------------------- git


def _hermetic_env(date: str | None = None) -> dict[str, str]:
    """Environment for git runs whose output must not depend on who runs them."""
    env = dict(os.environ)
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_NAME=AUTHOR_NAME,
        GIT_AUTHOR_EMAIL=AUTHOR_EMAIL,
        GIT_COMMITTER_NAME=AUTHOR_NAME,
        GIT_COMMITTER_EMAIL=AUTHOR_EMAIL,
        LC_ALL="C",
        TZ="UTC",
    )
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    return env


def _user_env() -> dict[str, str]:
    """Environment for git runs in a user's repository: their config, parseable messages."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    return env


def _git(
    repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        env=env if env is not None else _user_env(),
        capture_output=True,
        text=True,
    )
    if check and proc.returncode != 0:
        raise SeriesError(f"git {' '.join(args)} failed in {repo}:\n{proc.stdout}{proc.stderr}")
    return proc


# ----------------------------------------------------------------------------- pristine tree


def _wheel_members(wheel: Path) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.filename.startswith("sglang/") and not info.is_dir():
                yield info.filename, zf.read(info)


def _installed_members(version: str) -> Iterator[tuple[str, bytes]]:
    """The installed package's files, exactly those its wheel shipped (RECORD, hash-checked)."""
    dist = importlib.metadata.distribution("sglang")
    if dist.version != version:
        raise SeriesError(f"installed sglang is {dist.version}, not {version}")
    record = dist.read_text("RECORD")
    if record is None:
        raise SeriesError("installed sglang has no RECORD; cannot tell its files apart")
    for row in sorted(csv.reader(io.StringIO(record))):
        name, digest = row[0], row[1] if len(row) > 1 else ""
        if not name.startswith("sglang/") or not digest:
            continue  # other packages' files, and .pyc files pip compiled (no hash)
        data = Path(str(dist.locate_file(name))).read_bytes()
        algo, _, expected = digest.partition("=")
        found = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
        if found != expected:
            raise SeriesError(f"installed sglang file {name} differs from its wheel")
        yield name, data


def download_wheel(version: str, cache_dir: Path) -> Path:
    """The sglang wheel of ``version`` from ``cache_dir``, fetched with ``pip download`` if needed."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    pattern = f"sglang-{version}-*.whl"
    found = sorted(cache_dir.glob(pattern))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               f"sglang=={version}", "-d", str(cache_dir)]
        logger.info("downloading sglang %s into %s", version, cache_dir)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(cache_dir.glob(pattern))
        if proc.returncode != 0 or not found:
            raise SeriesError(f"pip download of sglang=={version} failed:\n{proc.stderr.strip()}")
    return found[-1]


def make_pristine_tree(
    out: Path,
    version: str = BASE_VERSION,
    *,
    wheel: Path | None = None,
    installed: bool = False,
    cache_dir: Path | None = None,
) -> str:
    """Lay out SGLang ``version`` as ``python/sglang/...`` in a new git repository at ``out``.

    The files come from ``wheel``, from the installed package (``installed=True``; it must be
    that version, unmodified) or from the PyPI wheel downloaded into ``cache_dir``. They are
    committed as one commit with a fixed author and date, tagged ``v<version>``; the same
    files give the same commit id. Returns that id.
    """
    if out.exists() and any(out.iterdir()):
        raise SeriesError(f"{out} exists and is not empty")
    if installed:
        members: Iterable[tuple[str, bytes]] = _installed_members(version)
    else:
        if wheel is None:
            if cache_dir is None:
                raise SeriesError("need a wheel, installed=True or a cache_dir to download into")
            wheel = download_wheel(version, cache_dir)
        members = _wheel_members(wheel)
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for name, data in members:
        dest = out / "python" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        count += 1
    if not count:
        raise SeriesError("no sglang/ files found")
    found = tree_version(out)
    if found != version:
        raise SeriesError(f"the files are SGLang {found}, not {version}")
    env = _hermetic_env(PRISTINE_DATE)
    _git(out, "init", "-q", "-b", "main", env=env)
    _git(out, "add", "-A", env=env)
    _git(out, "commit", "-q", "--no-verify", "-m",
         f"SGLang v{version} (from the PyPI wheel)", env=env)
    _git(out, "tag", f"v{version}", env=env)
    head = _git(out, "rev-parse", "HEAD", env=env).stdout.strip()
    logger.info("pristine SGLang %s: %d files at %s (%s)", version, count, out, head[:12])
    return head


def tree_version(tree: Path) -> str:
    """The SGLang version of a wheel-built ``python/sglang`` tree (its generated ``_version.py``)."""
    path = tree / "python" / "sglang" / "_version.py"
    match = re.search(r"^__version__\s*=.*?['\"]([^'\"]+)['\"]", path.read_text() if path.exists() else "", re.M)
    if not match:
        raise SeriesError(f"cannot read the SGLang version from {path}")
    return match.group(1)


# ----------------------------------------------------------------------------- the run_batch exception


# ----------------------------------------------------------------------------- locating code


def module_file(tree: Path, owner: str) -> Path:
    """The source file of module ``owner`` in a ``python/sglang`` tree."""
    base = tree / "python" / Path(*owner.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.exists():
            return cand
    raise SeriesError(f"{owner}: no source file under {tree / 'python'}")


def _split_name(target: Target) -> tuple[str | None, str]:
    cls, _, attr = target.name.rpartition(".")
    return (cls or None), attr


def _scope(module: ast.Module, cls: str | None, path: str) -> ast.Module | ast.ClassDef:
    if cls is None:
        return module
    found = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls]
    if len(found) != 1:
        raise SeriesError(f"{path}: expected one top-level class {cls}, found {len(found)}")
    return found[0]


def _find_def(scope: ast.Module | ast.ClassDef, attr: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    found = [
        n for n in scope.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == attr
    ]
    if len(found) > 1:
        raise SeriesError(f"{attr} is defined {len(found)} times")
    return found[0] if found else None


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def _last_line(lines: list[str], node: ast.stmt) -> int:
    """``node``'s last line, counting comment lines indented into its body after it."""
    assert node.end_lineno is not None
    end = node.end_lineno
    i = end
    while i < len(lines):
        stripped = lines[i].lstrip()
        if not stripped.strip():
            i += 1
            continue
        if stripped.startswith("#") and len(lines[i]) - len(stripped) > node.col_offset:
            end = i = i + 1
            continue
        break
    return end


def _body_indent(scope: ast.ClassDef) -> str:
    return " " * scope.body[0].col_offset


def _def_source(lines: list[str], node: ast.stmt) -> str:
    return "".join(lines[_first_line(node) - 1 : _last_line(lines, node)])


# ----------------------------------------------------------------------------- splicing


def replacement_source(target: Target) -> str:
    """The replacement as it goes into the SGLang file: dedented, named after the target."""
    _, attr = _split_name(target)
    func = target.replacement
    is_property = isinstance(func, property)
    if is_property:
        func = func.fget
    src = textwrap.dedent(inspect.getsource(func))
    node = ast.parse(src).body[0]
    decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or decorators != (
        ["property"] if is_property else []
    ):
        raise SeriesError(f"{target.path}: the replacement must be an undecorated function "
                          "(or a @property)")
    src, n = re.subn(
        rf"^((?:async\s+)?def\s+){re.escape(func.__name__)}\b", rf"\g<1>{attr}", src, count=1, flags=re.M
    )
    if n != 1:
        raise SeriesError(f"{target.path}: cannot find 'def {func.__name__}' in its source")
    return src


def _splice_function(text: str, target: Target) -> str:
    cls, attr = _split_name(target)
    lines = text.splitlines(keepends=True)
    module = ast.parse(text)
    scope = _scope(module, cls, target.path)
    node = _find_def(scope, attr)
    src = replacement_source(target)
    indent = _body_indent(scope) if isinstance(scope, ast.ClassDef) else ""
    new = textwrap.indent(src, indent)
    if target.expected == ABSENT:
        if node is not None:
            raise SeriesError(f"{target.path} is declared absent but the file defines it")
        if not isinstance(scope, ast.ClassDef):
            at = len(lines)
            return "".join(lines[:at]) + "\n\n" + new
        at = _last_line(lines, scope)
        return "".join(lines[:at]) + "\n" + new + "".join(lines[at:])
    if node is None:
        raise SeriesError(f"{target.path}: no such function in the file")
    kept = []
    for dec in node.decorator_list:
        name = ast.unparse(dec)
        if name == "property" and isinstance(target.replacement, property):
            continue  # the replacement's source carries its own @property
        if name not in ("staticmethod", "classmethod"):
            raise SeriesError(f"{target.path}: decorated with @{name}; the plugin would drop it")
        kept.append(lines[dec.lineno - 1])  # the engine keeps static/classmethod wrappers
    start, end = _first_line(node) - 1, _last_line(lines, node)
    return "".join(lines[:start]) + "".join(kept) + new + "".join(lines[end:])


def _value_statement(target: Target) -> str:
    """The module-level statement that binds a ``value`` target in the source.

    ``import_line`` is an import, or one assignment (``NAME = expression``) for a value
    computed when the module is imported (e.g. read from the environment); the plugin
    computes the same expression when it is imported.
    """
    cls, attr = _split_name(target)
    if cls is None and target.import_line:
        stmt = ast.parse(target.import_line).body
        bound = {
            (a.asname or a.name).split(".")[0]
            for s in stmt if isinstance(s, (ast.Import, ast.ImportFrom)) for a in s.names
        }
        if len(stmt) == 1 and isinstance(stmt[0], ast.Assign):
            bound |= {t.id for t in stmt[0].targets if isinstance(t, ast.Name)}
        if attr not in bound:
            raise SeriesError(f"{target.path}: import_line does not bind {attr}")
        return target.import_line.strip() + "\n"
    text = repr(target.replacement)
    try:
        if ast.literal_eval(text) != target.replacement:
            raise ValueError
    except (ValueError, SyntaxError) as exc:
        raise SeriesError(f"{target.path}: {text} is not a literal; give an import_line") from exc
    return f"{attr} = {text}\n"


def _import_block_end(module: ast.Module) -> int:
    """Line after which module-level imports go: the last import before the first def/class."""
    last = 0
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            break
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            assert node.end_lineno is not None
            last = node.end_lineno
    if not last:
        raise SeriesError("the module has no top-level import block")
    return last


def _splice_value(text: str, target: Target) -> str:
    cls, attr = _split_name(target)
    lines = text.splitlines(keepends=True)
    module = ast.parse(text)
    if target.expected != ABSENT:
        raise SeriesError(f"{target.path}: only added values are supported")
    stmt = _value_statement(target)
    if cls is None:
        if any(attr in _bound_names(n) for n in module.body):
            raise SeriesError(f"{target.path} is declared absent but the module binds it")
        at = _import_block_end(module)
        return "".join(lines[:at]) + stmt + "".join(lines[at:])
    scope = _scope(module, cls, target.path)
    assert isinstance(scope, ast.ClassDef)
    if any(attr in _bound_names(n) for n in scope.body):
        raise SeriesError(f"{target.path} is declared absent but the class binds it")
    line = _body_indent(scope) + stmt
    first = scope.body[0]
    if _is_docstring(first):
        assert first.end_lineno is not None
        at = first.end_lineno
        return "".join(lines[:at]) + "\n" + line + "".join(lines[at:])
    at = _first_line(first) - 1
    return "".join(lines[:at]) + line + "\n" + "".join(lines[at:])


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _text_edit(text: str, target: Target) -> str:
    edits = target.edits
    if not edits:
        raise SeriesError(f"{target.path}: a {target.kind} target needs a declared text edit")
    cls, attr = _split_name(target)
    if target.kind == "edit":
        # Written against the dedented function: indent them as the def stands in the file.
        node = _find_def(_scope(ast.parse(text), cls, target.path), attr)
        if node is None:
            raise SeriesError(f"{target.path}: no such function in the file")
        pad = " " * node.col_offset
        edits = tuple(
            TextEdit(textwrap.indent(e.old, pad), textwrap.indent(e.new, pad)) for e in edits
        )
    for edit in edits:
        node = _find_def(_scope(ast.parse(text), cls, target.path), attr)
        if node is None:
            raise SeriesError(f"{target.path}: no such function in the file")
        lines = text.splitlines(keepends=True)
        start = len("".join(lines[: _first_line(node) - 1]))
        stop = len("".join(lines[: _last_line(lines, node)]))
        body = text[start:stop]
        count = body.count(edit.old)
        if count != 1:
            raise SeriesError(
                f"{target.path}: anchor found {count} times in the function, expected once:\n{edit.old}")
        text = text[:start] + body.replace(edit.old, edit.new) + text[stop:]
    return text


def splice_target(tree: Path, target: Target) -> Path:
    """Write one target into its SGLang file; returns the file (a guard writes nothing)."""
    path = module_file(tree, target.owner)
    if target.kind == GUARD:
        return path
    text = path.read_text()
    if target.kind == "splice":
        text = _splice_function(text, target)
    elif target.kind == "value":
        text = _splice_value(text, target)
    elif target.kind in ("wrap", "edit"):
        text = _text_edit(text, target)
    else:
        raise SeriesError(f"{target.path}: unknown kind {target.kind!r}")
    ast.parse(text)  # a splice must leave valid Python behind
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- commit messages


def backport_module(bp: Backport) -> Any:
    """The back-port module that declares ``bp``."""
    prefix = f"{_PLUGIN_PACKAGE}.backports."
    for name, mod in sorted(sys.modules.items()):
        if name.startswith(prefix) and getattr(mod, "BACKPORT", None) is bp:
            return mod
    raise SeriesError(f"{bp.id}: no loaded back-port module declares it")


def _plugin_module_path(bp: Backport) -> str:
    return backport_module(bp).__name__.replace(".", "/") + ".py"


def _paragraphs(doc: str) -> list[str]:
    doc = inspect.cleandoc(doc)
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc) if p.strip()]


def _prose(text: str) -> str:
    return textwrap.fill(text.replace("``", "`"), width=72, break_on_hyphens=False)


def commit_message(bp: Backport, date: str, series: Sequence[Backport]) -> str:
    """Subject, the module's Why/How in commit-message form, then DEP-3 style trailers."""
    doc = backport_module(bp).__doc__ or ""
    paras = _paragraphs(doc)
    body = []
    for label in ("Why:", "How:"):
        found = [p for p in paras if p.startswith(label)]
        if len(found) != 1:
            raise SeriesError(f"{bp.id}: the module docstring needs one '{label}' paragraph")
        text = found[0][len(label):].strip()
        body.append(_prose(text[:1].upper() + text[1:]))
    for target in bp.targets:
        if target.edit_note:
            body.append(_prose(target.edit_note))
    guards = [t.name for t in bp.targets if t.kind == GUARD]
    if guards:
        body.append(_prose(
            "This change relies on these functions as they are (the plugin refuses to patch "
            "a tree where their source differs): " + ", ".join(guards) + "."))
    depends = re.search(r"Depends on back-port (\d+)\b", doc)
    if depends:
        n = int(depends.group(1))
        body.append(_prose(f'This patch depends on patch {n}/{len(series)} ("{series[n - 1].title}").'))
    trailers = [f"Origin: backport, {PR_URL.format(pr)}" for pr in bp.upstream_prs]
    trailers += [
        f"Applied-Upstream: {bp.upstream_trailer}",
        f"Last-Update: {date}",
        f"Plugin-Module: {_plugin_module_path(bp)}",
    ]
    return "\n\n".join([bp.title, *body, "\n".join(trailers)]) + "\n"


def _cover_letter(series: Sequence[Backport], version: str) -> tuple[str, str]:
    subject = f"Back-port SGLang's FutureMap publish/stash (speculative decoding v2) to v{version}"
    names = [bp.patch_file for bp in series]
    intro = _prose(
        f"These patches carry to SGLang v{version} (and v0.5.12, whose touched files are the "
        "same) the publish/stash design that SGLang v0.5.13 ships: the spec-v2 overlap "
        "scheduler reads the post-verify sequence lengths from a FutureMap relay instead of "
        "waiting for verify. They are generated from the sglang-futuremap-patch plugin, "
        "which installs the very same functions at run time; regenerate them with "
        "scripts/export_patches.py instead of editing them by hand. The later patches carry "
        "what upstream did after v0.5.13 to make the default configurations (piecewise CUDA "
        "graph, FA3) free of the host sync too; each patch names the first release that has "
        "it (Applied-Upstream, also listed below). Drop the series when moving to "
        f"v{max((bp.applied_upstream for bp in series if bp.applied_upstream), key=Version)} or later "
        "(a patch marked beyond upstream goes with the patch it names as its base)."
    )
    how = "\n".join([
        "How to apply",
        "",
        f"On a git checkout of SGLang v{version} (paths python/sglang/...):",
        "",
        "    git am -k --3way --empty=drop patches/*.patch",
        "",
        "(-k keeps the [Spec] subject prefix; --empty=drop skips this cover letter,",
        "or pass the patches listed in patches/series.) On a wheel-shaped tree,",
        "e.g. site-packages (paths sglang/...), from the directory holding sglang/:",
        "",
        '    for p in $(cat patches/series); do git apply -p2 "patches/$p"; done',
        "",
        "base-commit below is the pristine tree that scripts/make_pristine_tree.py",
        f"builds from the v{version} wheel.",
    ])
    rows = [("PR", "Patch", "Plugin module")]
    for pr in sorted({pr for bp in series for pr in bp.upstream_prs}):
        for i, bp in enumerate(series, 1):
            if pr in bp.upstream_prs:
                rows.append((f"#{pr}", f"{i:04d}", _plugin_module_path(bp)))
    widths = [max(len(r[c]) for r in rows) for c in range(2)]
    table = "\n".join(
        f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}".rstrip() for r in rows
    )
    patches = "\n".join(
        f"  {i:04d}  {bp.title}\n        {name}\n        upstream since {bp.upstream_trailer}"
        for i, (bp, name) in enumerate(zip(series, names), 1)
    )
    all_prs = sorted({pr for bp in series for pr in bp.upstream_prs})
    links = "\n".join(f"  #{pr}  {PR_URL.format(pr)}" for pr in all_prs)
    sections = [
        intro,
        how,
        "Patches\n\n" + patches,
        "Upstream PR, patch and plugin module\n\n" + table,
        links,
    ]
    return subject, "\n\n".join(sections)


# ----------------------------------------------------------------------------- export


def recorded_date(patches_dir: Path) -> str | None:
    """The ``Last-Update`` date recorded in an existing series, if any."""
    for patch in sorted(patches_dir.glob("0[0-9][0-9][1-9]-*.patch")):
        match = re.search(r"^Last-Update: (\d{4}-\d{2}-\d{2})$", patch.read_text(), re.M)
        if match:
            return match.group(1)
    return None


def export_series(
    tree: Path, out_dir: Path, series: Sequence[Backport], date: str, version: str | None = None
) -> list[Path]:
    """Splice and commit each back-port on a pristine ``tree``, then format the patches.

    ``tree`` must be a clean checkout of tag ``v<version>`` (see :func:`make_pristine_tree`);
    it is left with one commit per back-port. ``out_dir`` gets the cover letter, the
    patches (named ``Backport.patch_file``) and ``series``; earlier patches there are removed.
    ``date`` (YYYY-MM-DD) is the ``Last-Update`` trailer and every commit's date.
    """
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise SeriesError(f"date must be YYYY-MM-DD, not {date!r}")
    series = list(series)
    version = version or tree_version(tree)
    env = _hermetic_env(f"{date}T00:00:00+00:00")
    if _git(tree, "status", "--porcelain", env=env).stdout.strip():
        raise SeriesError(f"{tree} is not clean")
    base = _git(tree, "rev-parse", f"v{version}^{{commit}}", env=env).stdout.strip()
    if _git(tree, "rev-parse", "HEAD", env=env).stdout.strip() != base:
        raise SeriesError(f"{tree} is not at v{version}")

    for bp in series:
        touched = sorted({splice_target(tree, t) for t in bp.targets if t.kind != GUARD})
        _git(tree, "add", "--", *[str(p.relative_to(tree)) for p in touched], env=env)
        proc = subprocess.run(
            ["git", "-C", str(tree), "commit", "-q", "--no-verify", "--cleanup=verbatim", "-F", "-"],
            input=commit_message(bp, date, series), env=env, capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise SeriesError(f"committing {bp.id} failed:\n{proc.stdout}{proc.stderr}")
        logger.info("committed %s (%d files)", bp.id, len(touched))

    with tempfile.TemporaryDirectory(prefix="format-patch-") as tmp:
        _git(
            tree, "format-patch", "-q", "-k", "--cover-letter", f"--base=v{version}",
            "--zero-commit", "--full-index", "--no-signature", "-o", tmp,
            f"v{version}..HEAD", env=env,
        )
        made = sorted(Path(tmp).glob("*.patch"))
        if len(made) != len(series) + 1 or made[0].name != COVER_LETTER:
            raise SeriesError(f"format-patch wrote {[p.name for p in made]}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in [*out_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"), out_dir / SERIES_FILE]:
            old.unlink(missing_ok=True)
        subject, blurb = _cover_letter(series, version)
        cover = made[0].read_text()
        for placeholder, text in (("*** SUBJECT HERE ***", subject), ("*** BLURB HERE ***", blurb)):
            if cover.count(placeholder) != 1:
                raise SeriesError(f"cover letter template lacks {placeholder!r}")
            cover = cover.replace(placeholder, text)
        written = [out_dir / COVER_LETTER]
        written[0].write_text(cover)
        for bp, src in zip(series, made[1:]):
            dest = out_dir / bp.patch_file
            shutil.copyfile(src, dest)
            written.append(dest)
    (out_dir / SERIES_FILE).write_text("".join(f"{bp.patch_file}\n" for bp in series))
    written.append(out_dir / SERIES_FILE)
    return written


# ----------------------------------------------------------------------------- drift


def normalized_text(src: str) -> str:
    """What ``_engine.normalized_source`` makes of a function, for source read from a file."""
    return _normalize_text(src)


def patched_function_sources(tree: Path, series: Sequence[Backport]) -> dict[str, str | None]:
    """Each target's source as it stands in ``tree``, keyed by ``Target.path``.

    Functions (``splice`` and ``wrap``) give their ``def`` with decorators; values give
    the statement that binds them (the class attribute, or the module-level import).
    ``None`` where the tree lacks the target.
    """
    out: dict[str, str | None] = {}
    parsed: dict[Path, tuple[ast.Module, list[str]]] = {}
    for bp in series:
        for target in bp.targets:
            path = module_file(tree, target.owner)
            if path not in parsed:
                text = path.read_text()
                parsed[path] = (ast.parse(text), text.splitlines(keepends=True))
            module, lines = parsed[path]
            cls, attr = _split_name(target)
            try:
                scope = _scope(module, cls, target.path)
            except SeriesError:
                out[target.path] = None
                continue
            if target.kind == "value":
                body = scope.body if isinstance(scope, ast.ClassDef) else module.body
                stmts = [n for n in body if attr in _bound_names(n)]
                out[target.path] = (
                    "".join(lines[stmts[-1].lineno - 1 : stmts[-1].end_lineno]) if stmts else None
                )
                continue
            node = _find_def(scope, attr)
            out[target.path] = _def_source(lines, node) if node is not None else None
    return out


# ----------------------------------------------------------------------------- check / apply


def series_patches(patches_dir: Path | None = None) -> list[Path]:
    """The patches of ``patches_dir/series``, in order."""
    patches_dir = patches_dir or DEFAULT_PATCHES_DIR
    listing = patches_dir / SERIES_FILE
    if not listing.exists():
        raise SeriesError(f"no patch series at {patches_dir} (missing {SERIES_FILE})")
    names = [
        line.strip() for line in listing.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    missing = [n for n in names if not (patches_dir / n).exists()]
    if missing:
        raise SeriesError(f"{listing} lists missing patches: {', '.join(missing)}")
    return [patches_dir / n for n in names]


def copy_series(out: Path, patches_dir: Path | None = None) -> list[Path]:
    """Copy the series (cover letter, patches, ``series``) into ``out``, a new or empty folder."""
    src = patches_dir or DEFAULT_PATCHES_DIR
    names = [p.name for p in series_patches(src)] + [SERIES_FILE]
    if (src / COVER_LETTER).is_file():
        names.insert(0, COVER_LETTER)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SeriesError(f"{out} exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(src / name, out / name)
    return [out / name for name in names]


@dataclass
class _Layout:
    toplevel: Path
    am_args: list[str]


def _layout(repo: Path) -> _Layout | str:
    """How ``git am`` must be told about ``repo``; a message when it is not usable."""
    if not repo.is_dir():
        return f"{repo} is not a directory"
    proc = _git(repo, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        return f"{repo} is not inside a git repository"
    toplevel = Path(proc.stdout.strip()).resolve()
    prefix = repo.resolve().relative_to(toplevel).as_posix()
    if (repo / "python" / "sglang").is_dir():
        args = ["-p1"]
    elif (repo / "sglang").is_dir():
        args = ["-p2"]  # wheel-shaped: sglang/... instead of python/sglang/...
    else:
        return f"{repo} has neither python/sglang nor sglang"
    if prefix != ".":
        args.append(f"--directory={prefix}")
    return _Layout(toplevel, args)


def _refusal(layout: _Layout) -> str | None:
    status = _git(layout.toplevel, "status", "--porcelain", "--untracked-files=no", check=False)
    if status.returncode != 0:
        return f"git status failed in {layout.toplevel}: {status.stderr.strip()}"
    if status.stdout.strip():
        changed = ", ".join(line[3:] for line in status.stdout.splitlines()[:5])
        return f"{layout.toplevel} has uncommitted changes ({changed}); commit or stash them first"
    git_path = _git(layout.toplevel, "rev-parse", "--git-path", "rebase-apply").stdout.strip()
    if (layout.toplevel / git_path).exists():
        return f"a git am or rebase is in progress in {layout.toplevel}; finish or abort it first"
    if _git(layout.toplevel, "rev-parse", "--verify", "-q", "HEAD", check=False).returncode != 0:
        return f"{layout.toplevel} has no commit to apply the series on"
    return None


def _identity_args(repo: Path) -> list[str]:
    """git ``-c`` options supplying a committer when the user has none configured."""
    have = _git(repo, "config", "user.email", check=False).stdout.strip()
    return [] if have else ["-c", f"user.name={AUTHOR_NAME}", "-c", f"user.email={AUTHOR_EMAIL}"]


def _failure(output: str, patches: list[Path], failed_at: int | None) -> str:
    patch = patches[failed_at - 1].name if failed_at and 0 < failed_at <= len(patches) else "?"
    files: list[str] = []
    for pattern in (
        r"^CONFLICT \([^)]*\): Merge conflict in (.+)$",
        r"^error: patch failed: (.+):\d+$",
        r"^error: (.+): (?:patch does not apply|does not exist in index|already exists in index)$",
    ):
        for found in re.findall(pattern, output, re.M):
            if found not in files:
                files.append(found)
    where = ", ".join(files) if files else "see git's output"
    tail = "\n".join(output.strip().splitlines()[-12:])
    return f"{patch} does not apply ({where})\n{tail}"


def _am(worktree: Path, layout: _Layout, patches: list[Path]) -> tuple[bool, str]:
    """``git am -k --3way`` the patches; on failure abort, so nothing is half applied."""
    cmd = ["git", "-C", str(worktree), *_identity_args(worktree), "am", "-k", "--3way",
           *layout.am_args, *[str(p.resolve()) for p in patches]]
    proc = subprocess.run(cmd, env=_user_env(), capture_output=True, text=True)
    if proc.returncode == 0:
        return True, proc.stdout
    output = proc.stdout + proc.stderr
    next_file = worktree / _git(worktree, "rev-parse", "--git-path", "rebase-apply/next").stdout.strip()
    failed_at = int(next_file.read_text()) if next_file.exists() else None
    _git(worktree, "am", "--abort", check=False)
    return False, _failure(output, patches, failed_at)


def _already_applied(output: str, patches: list[Path]) -> list[str]:
    """Patches that ``git am --3way`` found already present (it skips them, successfully)."""
    steps = re.split(r"^Applying: ", output, flags=re.M)[1:]
    return [
        patch.name for patch, step in zip(patches, steps)
        if "No changes -- Patch already applied." in step
    ]


def _verdict(ok: bool, output: str, patches: list[Path], repo: Path, done: str) -> tuple[bool, str]:
    if not ok:
        return False, output
    present = _already_applied(output, patches)
    if len(present) == len(patches):
        return False, f"the series is already applied to {repo}; nothing to do"
    note = f" ({len(present)} already present: {', '.join(present)})" if present else ""
    return True, f"{done}{note}"


def _prepare(repo: Path, patches_dir: Path | None) -> tuple[_Layout, list[Path]] | str:
    """The checkout's layout and the patch files, or why the series cannot go there (also:
    it is there already)."""
    layout = _layout(repo)
    if isinstance(layout, str):
        return layout
    refusal = _refusal(layout)
    if refusal:
        return refusal
    try:
        patches = series_patches(patches_dir)
    except SeriesError as exc:
        return str(exc)
    if _series_present(layout, patches):
        return f"the series is already applied to {repo}; nothing to do"
    return layout, patches


def _series_present(layout: _Layout, patches: list[Path]) -> bool:
    """Whether HEAD already carries the whole series: it reverts cleanly, last patch first.

    ``git am --3way`` alone cannot tell when a later patch rewrote lines an earlier one
    added (a function replaced twice): the earlier patch then conflicts instead of being
    recognised as applied.
    """
    with tempfile.TemporaryDirectory(prefix="sglang-futuremap-present-") as tmp:
        wt = Path(tmp) / "worktree"
        if _git(layout.toplevel, "worktree", "add", "-q", "--detach", str(wt), "HEAD",
                check=False).returncode != 0:
            return False
        try:
            for patch in reversed(patches):
                proc = subprocess.run(
                    ["git", "-C", str(wt), "apply", "-R", *layout.am_args, str(patch.resolve())],
                    env=_user_env(), capture_output=True, text=True,
                )
                if proc.returncode != 0:
                    return False
            return True
        finally:
            _git(layout.toplevel, "worktree", "remove", "--force", str(wt), check=False)
            _git(layout.toplevel, "worktree", "prune", check=False)


def check(repo: Path, patches_dir: Path | None = None) -> tuple[bool, str]:
    """Whether the series applies to the git checkout at ``repo``; nothing there changes.

    The patches are applied with ``git am -k --3way`` in a temporary detached worktree,
    which is removed afterwards.
    """
    repo = Path(repo)
    prepared = _prepare(repo, patches_dir)
    if isinstance(prepared, str):
        return False, prepared
    layout, patches = prepared
    with tempfile.TemporaryDirectory(prefix="sglang-futuremap-check-") as tmp:
        wt = Path(tmp) / "worktree"
        added = _git(layout.toplevel, "worktree", "add", "-q", "--detach", str(wt), "HEAD",
                     check=False)
        if added.returncode != 0:
            return False, f"cannot make a scratch worktree of {repo}: {added.stderr.strip()}"
        try:
            ok, out = _am(wt, layout, patches)
        finally:
            _git(layout.toplevel, "worktree", "remove", "--force", str(wt), check=False)
            _git(layout.toplevel, "worktree", "prune", check=False)
    return _verdict(ok, out, patches, repo, f"all {len(patches)} patches apply to {repo}")


def apply(repo: Path, patches_dir: Path | None = None) -> tuple[bool, str]:
    """Apply the series to the git checkout at ``repo`` (``git am -k --3way``), all or nothing."""
    repo = Path(repo)
    prepared = _prepare(repo, patches_dir)
    if isinstance(prepared, str):
        return False, prepared
    layout, patches = prepared
    ok, out = _am(layout.toplevel, layout, patches)
    if not ok:
        return False, out + f"\nnothing was applied (git am --abort restored {repo})"
    return _verdict(ok, out, patches, repo, f"applied {len(patches)} patches to {repo}")
