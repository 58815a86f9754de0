#!/usr/bin/env python3
"""Regenerate ``patches/`` from the back-port modules.

Builds a pristine SGLang tree in a temporary directory (see make_pristine_tree.py), splices
each back-port into it, commits, and writes ``git format-patch`` output plus ``series``.
``--date`` sets the ``Last-Update`` trailer and the commit dates; by default the date already
recorded in ``patches/`` is kept, so re-running without changes is byte-identical.

    PYTHONPATH=tests/cpu_shims .venv/bin/python scripts/export_patches.py
    PYTHONPATH=tests/cpu_shims .venv/bin/python scripts/export_patches.py --date 2026-12-01
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglang_futuremap_patch.series_tools import (  # noqa: E402
    BASE_VERSION,
    SeriesError,
    export_series,
    make_pristine_tree,
    recorded_date,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "patches", help="default: patches/")
    parser.add_argument("--date", help="YYYY-MM-DD (default: the date recorded in --out, else today)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--wheel", type=Path, help=f"the SGLang {BASE_VERSION} wheel to start from")
    source.add_argument("--installed", action="store_true",
                        help=f"start from the installed sglang {BASE_VERSION} package")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".whl",
                        help="where a downloaded wheel is kept (default: .whl/ in this checkout)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    date = args.date or recorded_date(args.out) or datetime.date.today().isoformat()

    from sglang_futuremap_patch.backports import load_series

    series = load_series()
    try:
        with tempfile.TemporaryDirectory(prefix="sglang-pristine-") as tmp:
            tree = Path(tmp) / "sglang"
            make_pristine_tree(tree, BASE_VERSION, wheel=args.wheel, installed=args.installed,
                               cache_dir=args.cache_dir)
            written = export_series(tree, args.out, series, date)
    except SeriesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
