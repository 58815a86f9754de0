"""The patch engine: gate, fingerprint, install all-or-nothing, revert.

Back-port modules only *declare* what they change (:class:`Target`, :class:`Backport`);
everything that touches SGLang's objects lives here.

Two kinds of replacement:

* ``splice`` (the default): the function is re-created with the *target module's* globals,
  so it runs exactly as if its source had been pasted into that SGLang file. The patch
  series in ``patches/`` is produced by pasting the very same source, which is what makes
  the plugin and the patches one piece of code (``scripts/export_patches.py``).
* ``wrap``: keeps the plugin module's globals; used only where the plugin must delegate
  to the original object (see ``Target.original_arg``).
* ``edit``: a few reviewed text edits (``Target.edits``) of the function as it stands (SGLang's
  own, or the one an earlier back-port spliced or edited), compiled with the target module's
  globals. The patch series makes the very same edits in the file, so the two cannot drift,
  and the plugin carries the changed lines only, not a copy of the function. A later link may
  rewrite lines an earlier one wrote; a patched tree is recognised by undoing the chain's
  edits, last first, which must give SGLang's function back (so ``new`` is never empty).
"""

from __future__ import annotations

import ast
import dis
import hashlib
import importlib
import inspect
import io
import linecache
import logging
import re
import sys
import textwrap
import tokenize
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from packaging.version import InvalidVersion, Version

logger = logging.getLogger("sglang_futuremap_patch")

#: ``Target.expected`` value for an attribute the back-port adds (it must not exist yet).
ABSENT = "absent"
#: SGLang releases whose sources the fingerprints were taken from.
SUPPORTED_VERSIONS = ("0.5.12", "0.5.12.post1")
#: First release that ships the publish/stash design itself.
UPSTREAM_VERSION = Version("0.5.13")

MARK = "__sglang_futuremap_patch__"
#: ``Target.kind`` of a function that is relied on, not replaced (see :class:`Target`).
GUARD = "guard"


class PatchError(RuntimeError):
    """Raised in strict mode when the back-port cannot be applied as a whole."""


@dataclass(frozen=True)
class TextEdit:
    """An explicit, reviewed source edit.

    For a ``wrap`` target it is how ``patches/`` makes the change (a wrapper delegates to the
    stock function, which has no source form; the patch edits the stock function instead),
    written as the text stands in the SGLang file. For an ``edit`` target it *is* the change,
    for the plugin and the patch alike, written as the text stands in the function's
    dedented source (``def`` at column 0); the patch series indents it to the file. Either
    way ``old`` must occur exactly once, inside that function, so a changed SGLang file
    fails loudly instead of being patched somewhere else.
    """

    old: str
    new: str


def apply_edits(src: str, edits: Iterable[TextEdit], where: str) -> str:
    """``src`` with every edit made in turn; each anchor must occur exactly once."""
    for edit in edits:
        count = src.count(edit.old)
        if count != 1:
            raise PatchError(f"{where}: edit anchor found {count} times, expected once:\n{edit.old}")
        src = src.replace(edit.old, edit.new)
    return src


def edited_function(base: Any, target: "Target", namespace: dict[str, Any]) -> types.FunctionType:
    """``base`` (a plain function) with ``target.edits`` made to its source, compiled with
    ``namespace`` as its globals. The source is registered with ``linecache`` so tracebacks,
    ``inspect.getsource`` and the fingerprint read the edited text."""
    base = _func_of(base)
    before = textwrap.dedent(inspect.getsource(base.__code__))
    src = apply_edits(before, target.edits, target.path)
    node = ast.parse(src).body[0]
    # A classmethod / staticmethod keeps its kind: ``_build`` wraps the edited function again.
    binding = {"classmethod", "staticmethod"}
    if not isinstance(node, ast.FunctionDef) or any(
            not (isinstance(d, ast.Name) and d.id in binding) for d in node.decorator_list):
        raise PatchError(f"{target.path}: an edit target must be an undecorated function "
                         "(or a classmethod / staticmethod)")
    # Named by its text too: each link of a chain keeps its own source in linecache.
    digest = hashlib.sha256(src.encode()).hexdigest()[:12]
    filename = f"<{MARK} edit of {target.path} {digest}>"
    code = compile(src, filename, "exec")
    (fcode,) = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    if fcode.co_freevars:
        raise PatchError(f"{target.path}: an edited function must not use {fcode.co_freevars}")
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    defaults, kwdefaults = base.__defaults__, base.__kwdefaults__
    if _defaults_of(node) != _defaults_of(ast.parse(before).body[0]):
        # The edit changed the signature's defaults (e.g. a new keyword): evaluate the def
        # statement, as importing the patched file would, for the new ones.
        scratch = dict(namespace)
        exec(code, scratch)
        made = scratch[node.name]
        defaults, kwdefaults = made.__defaults__, made.__kwdefaults__
    new = types.FunctionType(fcode, namespace, base.__name__, defaults)
    new.__kwdefaults__ = dict(kwdefaults) if kwdefaults else None
    new.__doc__ = base.__doc__
    new.__annotations__ = dict(base.__annotations__)
    return new


def _defaults_of(node: ast.AST) -> str:
    """A def's default values, as source (what differs when an edit adds a keyword)."""
    args = node.args  # type: ignore[attr-defined]
    return ast.dump(ast.Tuple([*args.defaults, *[d or ast.Constant(...) for d in args.kw_defaults]]))


def undo_edits(src: str, chain: list["Target"]) -> tuple[str, list[int]]:
    """``src`` (a function's dedented source) with every edit of ``chain`` undone, last link
    first, back to its first link or to the last link that is not an edit; and the indices
    of the links whose edits ``src`` lacks (an edit's ``new`` text not there exactly once),
    which are passed over. A patched tree carries a chain of edits exactly when this gives
    back the function the chain starts from (a later link may rewrite lines an earlier one
    wrote: only the composition has to be there)."""
    lacking: list[int] = []
    for i in range(len(chain) - 1, -1, -1):
        link = chain[i]
        if link.kind != "edit":
            break
        undone: str | None = src
        for edit in reversed(link.edits):
            if undone is None or not edit.new or undone.count(edit.new) != 1:
                undone = None
                break
            undone = undone.replace(edit.new, edit.old)
        if undone is None:
            lacking.append(i)
        else:
            src = undone
    return src, lacking


def chain_in_source(func: Any, chain: list["Target"]) -> tuple[bool, list[int]]:
    """Whether ``func`` (an edit-first chain's function in a patched tree) is the chain's
    result: undoing its edits gives SGLang's function (the first link's fingerprint) or the
    last spliced link; and the links whose edits it lacks."""
    try:
        src = textwrap.dedent(inspect.getsource(_func_of(func).__code__))
    except (OSError, TypeError):
        return False, list(range(len(chain)))
    rest, lacking = undo_edits(src, chain)
    spliced = [t for t in chain if t.kind != "edit"]
    want = fingerprint(spliced[-1].replacement) if spliced else chain[0].expected
    base = hashlib.sha256(_normalize_text(rest).encode()).hexdigest()[:16]
    return base == want, lacking


@dataclass(frozen=True)
class Target:
    """One attribute that a back-port replaces or adds.

    ``owner`` is a module path; ``name`` is ``"attr"`` (module level) or ``"Class.attr"``.
    ``expected`` is the fingerprint of the pristine 0.5.12.x object, or :data:`ABSENT`.
    ``kind`` is ``"splice"`` (function re-bound to the target module's globals), ``"wrap"``
    (function keeps the plugin's globals; if ``original_arg`` is set, the original object
    is passed to the replacement as that keyword-only default), ``"value"`` (any
    object set as is, e.g. an imported name the spliced code needs) or ``"guard"``
    (nothing is replaced: an SGLang function whose behaviour a back-port relies on, e.g. a
    check that keeps some batches away from the changed code; it must still have exactly
    its 0.5.12.x source, or the gate refuses the whole series; ``replacement`` is None).
    ``import_line`` is the source line the patch series uses for a ``value`` target.
    ``edits``: for a ``wrap`` target, the same change as source edits of the stock function
    (``edit_note`` is what the commit message says about them); for an ``edit`` target
    (``replacement`` None), the change itself, made to SGLang's function or, when an earlier
    back-port spliced the same function, to that back-port's version.
    """

    owner: str
    name: str
    replacement: Any
    expected: str
    kind: str = "splice"
    original_arg: str | None = None
    import_line: str | None = None
    edits: tuple[TextEdit, ...] = ()
    edit_note: str = ""

    @property
    def path(self) -> str:
        return f"{self.owner}:{self.name}"


@dataclass(frozen=True)
class Backport:
    """One logical upstream change: one module, one patch file, one test file."""

    id: str
    title: str
    upstream_prs: tuple[int, ...]
    patch_file: str
    targets: tuple[Target, ...]
    summary: str = ""
    #: First SGLang release that ships the upstream change (the patch's Applied-Upstream);
    #: None for a change no SGLang release carries (this series' own, beyond upstream).
    applied_upstream: str | None = "0.5.13"

    @property
    def upstream_trailer(self) -> str:
        """The patch header's ``Applied-Upstream`` value."""
        return f"v{self.applied_upstream}" if self.applied_upstream else "none (beyond upstream)"

    @property
    def pr_list(self) -> str:
        """The upstream PRs (``#N``); for an upstream change whose PR is not known, the release
        that ships it; for this series' own changes, "no upstream PR"."""
        if self.upstream_prs:
            return ", ".join(f"#{n}" for n in self.upstream_prs)
        return f"upstream v{self.applied_upstream}" if self.applied_upstream else "no upstream PR"


# ----------------------------------------------------------------------------- fingerprints


def _normalize_text(src: str) -> str:
    """Comments, layout and trailing commas removed; the same on every Python version.

    (An AST dump is not: 3.12 added fields to ``FunctionDef``.) The first ``def`` name is
    neutralised because the plugin names its copies apart (``eagle_verify``, ...).
    """
    src = textwrap.dedent(src)
    lines = src.splitlines(keepends=True)
    comments = [
        tok.start for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type == tokenize.COMMENT
    ]
    for row, col in reversed(comments):
        lines[row - 1] = lines[row - 1][:col] + "\n"
    text = re.sub(r"\s+", "", "".join(lines))
    text = re.sub(r",([)\]}])", r"\1", text)
    return re.sub(r"^((?:@[^\n]*?)*)def\w+\(", r"\1def_(", text, count=1)


def normalized_source(obj: Any) -> str:
    """Source of a function with comments, layout and its own name normalised away."""
    # From the code object: getsource(function) would follow __wrapped__ to the original.
    return _normalize_text(inspect.getsource(obj.__code__))


def fingerprint(obj: Any) -> str:
    """A short, stable digest of a function's normalised source (or of a value's repr)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        text = normalized_source(obj)
    else:
        text = repr(obj)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def same_value(found: Any, declared: Any) -> bool:
    """A ``value`` target's object, or a literal constant equal to it (a patched tree's
    ``NAME = 512`` is another int object than the plugin's)."""
    if found is declared:
        return True
    return type(found) is type(declared) and isinstance(declared, (int, float, str)) and found == declared


# ----------------------------------------------------------------------------- resolution


def _import_target_module(name: str) -> types.ModuleType:
    """Import a module the series patches, the way SGLang's own start-up ends up importing it.

    A package whose ``__init__`` fails part-way leaves the submodules it had finished in
    ``sys.modules``, so a second import of one of them succeeds. SGLang's start-up depends on
    that: e.g. with FlashInfer 0.6.11 but without its ``cuda-tile`` dependency, ``import
    flashinfer.comm`` fails inside a guarded import (``flashinfer_comm_fusion``) and the
    unguarded ``from flashinfer.comm.mnnvl import ...`` that comes later then works. The
    plugin may be the first to import such a chain, so it retries once; a second failure is
    a real one (and the gate then leaves SGLang untouched).
    """
    try:
        return importlib.import_module(name)
    except ImportError as first:
        logger.debug("importing %s failed once (%s); retrying", name, first)
        return importlib.import_module(name)


def _resolve_owner(target: Target) -> tuple[Any, str, types.ModuleType]:
    module = _import_target_module(target.owner)
    *parents, attr = target.name.split(".")
    obj: Any = module
    for part in parents:
        obj = getattr(obj, part)
    return obj, attr, module


def _global_names(code: types.CodeType) -> Iterator[str]:
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            yield ins.argval
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


def missing_globals(func: types.FunctionType, namespace: dict[str, Any]) -> list[str]:
    """Names the function reads as globals that the namespace (or builtins) lacks."""
    import builtins

    return sorted(
        {n for n in _global_names(func.__code__) if n not in namespace and not hasattr(builtins, n)}
    )


# ----------------------------------------------------------------------------- gate


@dataclass
class TargetCheck:
    target: Target
    state: str  # "ready" | "in-source" | "mismatch" | "missing" | "applied"
    found: str = ""
    detail: str = ""


#: Every value ``Verdict.decision`` takes, and what it means.
DECISIONS: dict[str, str] = {
    "patch": "every target matches its pristine fingerprint: the back-ports can be installed",
    "applied": "already installed in this process",
    "upstream": "nothing to do: the SGLang release or the source (patches/ applied) has it",
    "unsupported": "an SGLang version this plugin does not cover",
    "mismatch": "a supported version whose source differs from the pristine one: nothing installed",
    "unavailable": "SGLang itself does not import (a broken install, a CPU host without its modules)",
    "off": "disabled by SGLANG_FUTUREMAP_PATCH=off",
    "failed": "installing raised; what was installed was undone (SGLang runs its own code)",
}


@dataclass
class Verdict:
    sglang_version: str
    decision: str  # one of DECISIONS
    reason: str
    checks: dict[str, list[TargetCheck]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"unknown verdict decision {self.decision!r} (one of {sorted(DECISIONS)})")

    @property
    def ok(self) -> bool:
        return self.decision in ("patch", "applied")


def sglang_version() -> str:
    import sglang

    return str(getattr(sglang, "__version__", "unknown"))


def sglang_import_error() -> str | None:
    """Why ``import sglang`` fails here (e.g. ``ModuleNotFoundError: No module named
    'torchvision'``), or None when it imports."""
    try:
        import sglang  # noqa: F401
    except Exception as exc:  # a broken install raises more than ImportError (asserts, OSError)
        return f"{type(exc).__name__}: {exc}"
    return None


def _check_target(
    target: Target, pending: dict[str, dict[str, Any]], final: Any | None = None,
    chain: list[Target] | None = None,
) -> TargetCheck:
    """Check one target against the live object. ``final`` is the last replacement of the
    target's chain (a later back-port may replace the same function again): a patched tree
    carries that one. ``chain``: the target's chain, when the target is its first link (an
    edit of SGLang's function is recognised in a patched tree by undoing the whole chain)."""
    final = target.replacement if final is None else final
    try:
        owner, attr, module = _resolve_owner(target)
    except Exception as exc:  # an import error or a missing class is a mismatch too
        return TargetCheck(target, "missing", detail=f"{type(exc).__name__}: {exc}")
    raw = owner.__dict__.get(attr, None) if hasattr(owner, "__dict__") else None
    if any(it.owner is owner and it.attr == attr for it in _STATE.applied):
        return TargetCheck(target, "applied", found=fingerprint(raw))
    if target.kind == "edit":
        if raw is None:
            return TargetCheck(target, "missing", detail="attribute not found")
        found = fingerprint(raw)
        if found == target.expected:
            try:
                fn = edited_function(raw, target, {})
            except (PatchError, OSError, TypeError, SyntaxError) as exc:
                return TargetCheck(target, "mismatch", found=found, detail=str(exc).splitlines()[0])
            missing = missing_globals(fn, {**vars(module), **pending.get(target.owner, {})})
            if missing:
                return TargetCheck(target, "mismatch", found=found, detail=f"module lacks {missing}")
            return TargetCheck(target, "ready", found=found)
        if chain_in_source(raw, chain or [target])[0]:
            return TargetCheck(target, "in-source", found=found)
        return TargetCheck(target, "mismatch", found=found, detail=f"expected {target.expected}")
    if target.kind == GUARD:
        if raw is None:
            return TargetCheck(target, "missing", detail="attribute not found")
        found = fingerprint(raw)
        if found != target.expected:
            return TargetCheck(target, "mismatch", found=found, detail=f"expected {target.expected}")
        return TargetCheck(target, "ready", found=found)
    if target.expected == ABSENT:
        if raw is not None or (isinstance(owner, types.ModuleType) and hasattr(owner, attr)):
            found = fingerprint(raw) if raw is not None else "?"
            if target.kind != "value" and raw is not None and found == fingerprint(final):
                return TargetCheck(target, "in-source", found=found)
            if target.kind == "value" and same_value(getattr(owner, attr, None), target.replacement):
                return TargetCheck(target, "in-source", found=found)
            return TargetCheck(target, "mismatch", found=found, detail="already defined")
        state = "ready"
        found = ABSENT
    else:
        if raw is None:
            return TargetCheck(target, "missing", detail="attribute not found")
        found = fingerprint(raw)
        if found == target.expected:
            state = "ready"
        elif target.kind != "value" and found == fingerprint(final):
            return TargetCheck(target, "in-source", found=found)
        else:
            return TargetCheck(target, "mismatch", found=found, detail=f"expected {target.expected}")
    if target.kind == "splice":
        namespace = dict(vars(module))
        namespace.update(pending.get(target.owner, {}))
        missing = missing_globals(_func_of(target.replacement), namespace)
        if missing:
            return TargetCheck(target, "mismatch", found=found, detail=f"module lacks {missing}")
    return TargetCheck(target, state, found=found)


def _chains(series: Iterable[Backport]) -> dict[str, list[Target]]:
    """Targets by path, in series order: a path listed twice is replaced again later."""
    chains: dict[str, list[Target]] = {}
    for bp in series:
        for t in bp.targets:
            chains.setdefault(t.path, []).append(t)
    return chains


def link_function(chain: list[Target], i: int, original: Any = None) -> Any:
    """What link ``i`` of a chain installs: a replacement, or an ``edit`` of the link before it
    (compiled with empty globals: for its source and fingerprint only). An ``edit`` of SGLang's
    own function (a chain's first link) needs that function, ``original``; later edits are made
    on top of the link before, splice or edit alike."""
    t = chain[i]
    if t.kind != "edit":
        return t.replacement
    if i == 0:
        if original is None:
            raise PatchError(f"{t.path}: an edit of SGLang's own function has no static form")
        return edited_function(original, t, {})
    prior = chain[i - 1]
    if prior.kind not in ("splice", "edit"):
        raise PatchError(f"{t.path}: an edit may follow a splice or an edit only, not a {prior.kind}")
    return edited_function(link_function(chain, i - 1, original), t, {})


def chain_final(chain: list[Target]) -> Any | None:
    """The function a patched tree carries for this chain (None: edits of SGLang's own
    function, which ``_check_target`` recognises by their edits instead)."""
    if chain[0].kind == "edit":
        return None
    return link_function(chain, len(chain) - 1)


def _live(target: Target) -> Any:
    """SGLang's object at a target's path as it stands (None when it has none)."""
    owner, attr, _ = _resolve_owner(target)
    return owner.__dict__.get(attr) if hasattr(owner, "__dict__") else None


def version_verdict(version: str) -> Verdict | None:
    """A verdict when the version alone rules the back-port out, else None."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return Verdict(version, "unsupported", f"unparsable SGLang version {version!r}")
    if version in SUPPORTED_VERSIONS:
        return None
    if parsed >= UPSTREAM_VERSION:
        return Verdict(version, "upstream", f"SGLang {version} already ships publish/stash")
    supported = " and ".join(SUPPORTED_VERSIONS)
    return Verdict(version, "unsupported", f"SGLang {version} is not {supported}")


def gate(series: Iterable[Backport], version: str | None = None) -> Verdict:
    """Decide, without touching anything, whether the series can be applied."""
    series = list(series)
    version = version or sglang_version()
    early = version_verdict(version)
    if early is not None:
        return early
    # Values a series adds to a module (imports) count as present for later targets.
    pending: dict[str, dict[str, Any]] = {}
    for bp in series:
        for t in bp.targets:
            if "." not in t.name:
                pending.setdefault(t.owner, {})[t.name] = t.replacement
    chains = _chains(series)
    live = {path: _check_target(chain[0], pending, chain_final(chain), chain)
            for path, chain in chains.items()}
    checks: dict[str, list[TargetCheck]] = {bp.id: [] for bp in series}
    for bp in series:
        for t in bp.targets:
            chain = chains[t.path]
            i = chain.index(t)
            if i == 0:
                checks[bp.id].append(live[t.path])
                continue
            # A later link must be a new version of exactly the function the link before
            # it installs (checked statically); its live state is the first link's.
            original = None
            if chain[0].kind == "edit":
                state = live[t.path].state
                if state != "ready":
                    # No pristine function to derive the links from: a patched tree carries
                    # every edit of the chain, an applied process has the last link installed.
                    if state == "in-source" and t.kind == "edit" and i in chain_in_source(_live(t), chain)[1]:
                        state, why = "mismatch", "the source lacks this link's edits"
                    else:
                        why = live[t.path].detail
                    checks[bp.id].append(TargetCheck(t, state, found=live[t.path].found, detail=why))
                    continue
                original = _live(t)
            prior = fingerprint(link_function(chain, i - 1, original))
            if t.expected == prior and t.kind == "edit":
                try:
                    fn = link_function(chain, i, original)
                    module = _import_target_module(t.owner)
                    missing = missing_globals(fn, {**vars(module), **pending.get(t.owner, {})})
                except (PatchError, SyntaxError, ImportError) as exc:
                    missing, why = None, str(exc).splitlines()[0]
                if missing is None or missing:
                    why = why if missing is None else f"module lacks {missing}"
                    checks[bp.id].append(TargetCheck(t, "mismatch", found=prior, detail=why))
                    continue
            if t.expected == prior:
                checks[bp.id].append(TargetCheck(t, live[t.path].state, found=prior))
            else:
                checks[bp.id].append(TargetCheck(
                    t, "mismatch", found=prior, detail=f"supersedes {prior}, not {t.expected}"))
    flat = [c for cs in checks.values() for c in cs]
    # Guards are never installed: in a patched process or tree they are simply "ready".
    changed = [c for c in flat if c.target.kind != GUARD]
    guards_ready = all(c.state == "ready" for c in flat if c.target.kind == GUARD)
    if guards_ready and {c.state for c in changed} == {"applied"}:
        return Verdict(version, "applied", "already applied in this process", checks)
    # A tree with patches/ applied: every spliced target already is our source. (A wrap
    # target has no source twin: the patch series edits that function in place instead.)
    if guards_ready and {c.state for c in changed if c.target.kind != "wrap"} == {"in-source"}:
        return Verdict(version, "upstream", "the source already carries this back-port (patches/ applied)", checks)
    bad = [c for c in flat if c.state not in ("ready",)]
    if bad:
        first = bad[0]
        why = f"{first.target.path} is {first.state}" + (f" ({first.detail})" if first.detail else "")
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        return Verdict(version, "mismatch", f"{why}{more}", checks)
    return Verdict(version, "patch", "every target matches its pristine fingerprint", checks)


# ----------------------------------------------------------------------------- install / revert


@dataclass
class _Installed:
    owner: Any
    attr: str
    had: bool
    original: Any
    new: Any
    path: str


@dataclass
class _State:
    applied: list[_Installed] = field(default_factory=list)
    backports: list[str] = field(default_factory=list)
    version: str = ""


_STATE = _State()


def _func_of(raw: Any) -> Any:
    if isinstance(raw, property):
        return raw.fget
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


def _build(target: Target, module: types.ModuleType, original: Any, backport_id: str,
           base: Any = None) -> Any:
    repl = target.replacement
    attr_name = target.name.rsplit(".", 1)[-1]
    if target.kind == "value":
        return repl
    if target.kind == "edit":
        # SGLang's function, or the earlier back-port's version of it (``base``).
        repl = edited_function(base if base is not None else original, target, vars(module))
        target = Target(target.owner, target.name, repl, target.expected, "splice")
    if isinstance(repl, property):
        fget = _build(
            Target(target.owner, target.name, repl.fget, target.expected, target.kind),
            module, None, backport_id,
        )
        return property(fget, doc=repl.__doc__)
    if not isinstance(repl, types.FunctionType):
        raise PatchError(f"{target.path}: replacement must be a plain function")
    if repl.__code__.co_freevars:
        raise PatchError(f"{target.path}: replacement must not be a closure")
    if target.kind == "splice":
        new = types.FunctionType(repl.__code__, vars(module), attr_name, repl.__defaults__)
        new.__kwdefaults__ = repl.__kwdefaults__
        new.__module__ = module.__name__
    else:
        kwdefaults = dict(repl.__kwdefaults__ or {})
        if target.original_arg:
            kwdefaults[target.original_arg] = _func_of(original)
        new = types.FunctionType(repl.__code__, repl.__globals__, attr_name, repl.__defaults__)
        new.__kwdefaults__ = kwdefaults or None
        new.__module__ = repl.__module__
    new.__doc__ = repl.__doc__
    new.__annotations__ = dict(repl.__annotations__)
    new.__qualname__ = target.name
    setattr(new, MARK, backport_id)
    if original is not None:
        new.__wrapped__ = _func_of(original)
    if isinstance(original, staticmethod):
        return staticmethod(new)
    if isinstance(original, classmethod):
        return classmethod(new)
    return new


def _aliases(original: Any) -> Iterator[tuple[types.ModuleType, str]]:
    """Module-level ``from X import Y`` copies of an object, as SGLang's own hooks rebind them."""
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            if v is original:
                yield mod, k


def _install(target: Target, backport_id: str, base: Any = None) -> list[_Installed]:
    owner, attr, module = _resolve_owner(target)
    had = attr in owner.__dict__
    original = owner.__dict__[attr] if had else None
    new = _build(target, module, original, backport_id, base)
    done = [_Installed(owner, attr, had, original, new, target.path)]
    setattr(owner, attr, new)
    if isinstance(owner, types.ModuleType) and isinstance(original, types.FunctionType):
        for mod, name in _aliases(original):
            if mod is owner and name == attr:
                continue
            done.append(_Installed(mod, name, True, original, new, f"{mod.__name__}:{name} (alias)"))
            setattr(mod, name, new)
    return done


def _undo(items: list[_Installed]) -> list[str]:
    problems = []
    for it in reversed(items):
        current = it.owner.__dict__.get(it.attr)
        if current is not it.new:
            problems.append(f"{it.path} was changed by someone else; left as is")
            continue
        if it.had:
            setattr(it.owner, it.attr, it.original)
        else:
            delattr(it.owner, it.attr)
    return problems


def install(series: Iterable[Backport], verdict: Verdict) -> list[str]:
    """Install every target of every back-port, or none. Returns the applied ids."""
    if verdict.decision == "applied":
        return list(_STATE.backports)
    if verdict.decision != "patch":
        raise PatchError(verdict.reason)
    series = list(series)
    installed: list[_Installed] = []
    chains = _chains(series)
    try:
        for bp in series:
            for t in bp.targets:
                if t.kind == GUARD:
                    continue  # relied on, never replaced
                chain = chains[t.path]
                if chain[-1] is t:  # a function replaced twice: install the last
                    base = None
                    if len(chain) > 1:
                        original = _live(t) if chain[0].kind == "edit" else None
                        base = link_function(chain, len(chain) - 2, original)
                    installed.extend(_install(t, bp.id, base))
    except Exception as exc:
        _undo(installed)
        raise PatchError(f"installing failed, rolled back: {type(exc).__name__}: {exc}") from exc
    _STATE.applied = installed
    _STATE.backports = [bp.id for bp in series]
    _STATE.version = verdict.sglang_version
    return list(_STATE.backports)


def uninstall() -> list[str]:
    """Restore the exact original objects. A second call is a no-op."""
    problems = _undo(_STATE.applied)
    for p in problems:
        logger.warning("sglang_futuremap_patch: revert: %s", p)
    _STATE.applied = []
    _STATE.backports = []
    return problems


def applied_backports() -> list[str]:
    return list(_STATE.backports)


def installed_paths() -> list[str]:
    return [it.path for it in _STATE.applied]


# ----------------------------------------------------------------------------- startup line


def announce(level: int, message: str) -> None:
    """Log one startup line even before SGLang has configured logging.

    In a scheduler subprocess SGLang loads plugins before it sets up logging, so an INFO
    record would be dropped; the line then goes straight to stderr in SGLang's format.
    """
    if logger.isEnabledFor(level) and logger.hasHandlers():
        logger.log(level, message)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    handler.handle(logger.makeRecord(logger.name, level, __file__, 0, message, (), None))

