#!/usr/bin/env python3
"""Lay out a pristine SGLang release as ``python/sglang/...`` in a fresh git repository.

The files come from a wheel (``--wheel``), from the installed ``sglang`` package
(``--installed``; it must be that version, and unmodified: its RECORD hashes are checked)
or from the PyPI wheel, fetched with ``pip download --no-deps`` into ``--cache-dir``. The
result is one commit, "SGLang v<version> (from the PyPI wheel)", with a fixed author and
date (the same files always give the same commit id), tagged ``v<version>``.

    python scripts/make_pristine_tree.py --out /tmp/sglang-pristine
    python scripts/make_pristine_tree.py --version 0.5.12 --out /tmp/sglang-0.5.12
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglang_futuremap_patch.series_tools import (  # noqa: E402
    BASE_VERSION,
    SeriesError,
    make_pristine_tree,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="new, empty directory for the repository")
    parser.add_argument("--version", default=BASE_VERSION, help=f"SGLang release (default {BASE_VERSION})")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--wheel", type=Path, help="take the files from this wheel")
    source.add_argument("--installed", action="store_true",
                        help="take the files from the installed sglang package")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".whl",
                        help="where downloaded wheels are kept (default: .whl/ in this checkout)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        head = make_pristine_tree(args.out, args.version, wheel=args.wheel,
                                  installed=args.installed, cache_dir=args.cache_dir)
    except SeriesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: SGLang v{args.version} at {head} (tag v{args.version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
