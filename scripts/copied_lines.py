#!/usr/bin/env python3
"""How much of SGLang's own code the back-ports carry as copies.

For every full replacement in the series (a ``splice`` target that replaces a function which
already exists: SGLang's own, or the version an earlier back-port installed), compares the
replacement's code lines with the function it replaces and counts the lines that stand there
unchanged, in order. Blank lines, comments and docstrings do not count; the ``def`` line is
compared without the function's name. With ``--all`` it also lists what the other kinds carry:
a ``wrap`` target's wrapper (compared with SGLang's function like a replacement), and an
``edit`` target's new text (compared with the text it replaces: the lines an edit repeats to
anchor or keep its context).

    scripts/cpu-env.sh python scripts/copied_lines.py
    scripts/cpu-env.sh python scripts/copied_lines.py --all --json
    scripts/cpu-env.sh python scripts/copied_lines.py --diff ScheduleBatch.filter_batch
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import io
import json
import logging
import re
import sys
import textwrap
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

logger = logging.getLogger("sglang_futuremap_patch")


@dataclass
class Row:
    backport: int
    backport_id: str
    path: str
    kind: str
    replaces: str  # "sglang 0.5.12.post1" or "back-port N"
    code_lines: int
    identical: int


def code_lines(src: str) -> list[str]:
    """The function's code lines, stripped: no blank lines, comments or docstrings; the
    name on the ``def`` line neutralised (the plugin names its copies apart)."""
    src = textwrap.dedent(src)
    lines = src.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    dropped: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            dropped.update(range(body[0].lineno - 1, body[0].end_lineno))
    out = [line.strip() for i, line in enumerate(lines) if i not in dropped and line.strip()]
    if out:
        out[0] = re.sub(r"^((?:async\s+)?def\s+)\w+", r"\1_", out[0])
    return out


def snippet_lines(text: str) -> list[str]:
    """An edit's text as code lines, stripped: no blank or comment-only lines (a snippet
    need not parse on its own, so this is line-based)."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def identical_lines(new: list[str], old: list[str]) -> int:
    """Lines of ``new`` that stand unchanged, in order, in ``old``."""
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())


def _source(func: Any) -> str:
    from sglang_futuremap_patch._engine import _func_of

    return inspect.getsource(_func_of(func).__code__)


def measure(series: Any) -> tuple[list[Row], list[Row], dict[str, tuple[str, str]]]:
    """Rows for the full replacements and, separately, for the other function targets;
    and per path the (replaced, replacement) sources of the last replacement seen."""
    from sglang_futuremap_patch._engine import ABSENT, GUARD, _chains, _live, link_function

    chains = _chains(series)
    number = {bp.id: i for i, bp in enumerate(series, 1)}
    owner_of = {id(t): bp.id for bp in series for t in bp.targets}
    copies: list[Row] = []
    others: list[Row] = []
    sources: dict[str, tuple[str, str]] = {}
    for path, chain in chains.items():
        if chain[0].kind in ("value", GUARD):
            continue
        pristine = None if chain[0].expected == ABSENT else _live(chain[0])
        for i, t in enumerate(chain):
            bp_id = owner_of[id(t)]
            if i == 0:
                if pristine is None:
                    continue  # a function the series adds: nothing is copied
                replaced, replaces = pristine, "sglang 0.5.12.post1"
            else:
                replaced = link_function(chain, i - 1, pristine)
                replaces = f"back-port {number[owner_of[id(chain[i - 1])]]}"
            if t.kind == "edit":
                code = same = 0
                for edit in t.edits:
                    new_lines, old_lines = snippet_lines(edit.new), snippet_lines(edit.old)
                    code += len(new_lines)
                    same += identical_lines(new_lines, old_lines)
                others.append(Row(number[bp_id], bp_id, path, t.kind, replaces, code, same))
                continue
            old = code_lines(_source(replaced))
            new_src = _source(t.replacement)
            new = code_lines(new_src)
            row = Row(number[bp_id], bp_id, path, t.kind, replaces, len(new), identical_lines(new, old))
            (copies if t.kind == "splice" else others).append(row)
            if t.kind == "splice":
                sources[path] = (_source(replaced), new_src)
    return copies, others, sources


def _table(rows: list[Row], title: str, what: str = "the function they replace") -> str:
    out = [title, f"{'bp':>3} {'code':>5} {'same':>5} {'%':>4}  {'replaces':<20} target"]
    for r in rows:
        pct = 100 * r.identical // r.code_lines if r.code_lines else 0
        out.append(f"{r.backport:>3} {r.code_lines:>5} {r.identical:>5} {pct:>4}  "
                   f"{r.replaces:<20} {r.path}")
    code = sum(r.code_lines for r in rows)
    same = sum(r.identical for r in rows)
    pct = 100 * same // code if code else 0
    out.append(f"total: {len(rows)} targets, {code} code lines, {same} identical to {what} ({pct}%)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Run with SGLang 0.5.12.post1 importable (on a CPU host: scripts/cpu-env.sh).",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    parser.add_argument("--all", action="store_true",
                        help="also list wrap targets and what each edit target's text repeats")
    parser.add_argument("--diff", metavar="NAME",
                        help="print the unified diff of the full replacement(s) whose path ends in NAME")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    from sglang_futuremap_patch.backports import load_series

    copies, others, sources = measure(load_series())
    if args.diff:
        hits = [p for p in sources if p.endswith(args.diff)]
        if not hits:
            parser.error(f"no full replacement's path ends in {args.diff!r}")
        for path in hits:
            old, new = sources[path]
            sys.stdout.writelines(difflib.unified_diff(
                textwrap.dedent(old).splitlines(keepends=True),
                textwrap.dedent(new).splitlines(keepends=True), f"{path} (replaced)", f"{path} (replacement)"))
        return 0
    if args.json:
        json.dump({
            "full_replacements": [asdict(r) for r in copies],
            "wraps_and_edits": [asdict(r) for r in others],
            "total": {"targets": len(copies),
                      "code_lines": sum(r.code_lines for r in copies),
                      "identical": sum(r.identical for r in copies)},
        }, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(_table(copies, "Full replacements (splice of an existing function):"))
    if args.all:
        print()
        print(_table([r for r in others if r.kind == "wrap"],
                     "Wrappers (wrap targets: the wrapper against the function it wraps):"))
        print()
        print(_table([r for r in others if r.kind == "edit"],
                     "Text edits (edit targets: their new text against the text it replaces; an "
                     "edit two targets share counts for each):", "the text they replace"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
