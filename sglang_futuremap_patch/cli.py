"""``sglang-futuremap-patch``: say whether and how the installed SGLang gets patched, verify it."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sglang_futuremap_patch import _engine
from sglang_futuremap_patch._api import ENV_VAR, MODES, Report, apply, read_mode, status

EPILOG = f"""\
The plugin runs by itself inside SGLang (entry point group sglang.srt.plugins).
{ENV_VAR}={'|'.join(MODES)} chooses what it does (default: safe, which leaves SGLang untouched
and logs one WARNING line whenever anything is unexpected; strict stops SGLang instead).
"""


def _print_report(report: Report) -> None:
    v = report.verdict
    print(f"SGLang:   {v.sglang_version}")
    print(f"mode:     {report.mode} ({ENV_VAR})")
    print(f"verdict:  {v.decision}: {v.reason}")
    for bp in report.series:
        print(f"\n{bp.id}  [{bp.pr_list}]  patches/{bp.patch_file}")
        print(f"  {bp.title}")
        for check in v.checks.get(bp.id, []):
            t = check.target
            detail = f"  ({check.detail})" if check.detail else ""
            print(f"    {check.state:9} {t.path}  [{t.kind}, expected {t.expected}]{detail}")


def cmd_status(args: argparse.Namespace) -> int:
    report = status()
    _print_report(report)
    if report.mode == "invalid":
        print(f"\nerror: {ENV_VAR} has an invalid value; the plugin will not patch", file=sys.stderr)
        return 2
    return 0 if report.verdict.decision in ("patch", "applied", "upstream") else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from sglang_futuremap_patch import PatchError, selfcheck

    try:
        read_mode()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        report = apply(mode="strict")
    except PatchError as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    if report.verdict.decision == "upstream":
        print(f"nothing to verify: {report.verdict.reason}")
        return 0
    print(f"applied {len(report.applied)} back-ports to SGLang {report.verdict.sglang_version}:")
    for path in _engine.installed_paths():
        print(f"  {path}")
    try:
        for algorithm in ("EAGLE3", "STANDALONE"):
            for line in selfcheck.run(algorithm):
                print(f"  ok [{algorithm}] {line}")
    except AssertionError as exc:
        print(f"FAIL: self-check: {exc}", file=sys.stderr)
        return 1
    print("verify: OK")
    return 0


def cmd_patches(args: argparse.Namespace) -> int:
    from sglang_futuremap_patch import series_tools

    patches_dir = Path(args.patches) if args.patches else series_tools.DEFAULT_PATCHES_DIR
    if not (patches_dir / "series").is_file():
        print(f"error: no patch series at {patches_dir}; pass --patches path/to/patches "
              "(the folder in this project's source checkout)", file=sys.stderr)
        return 2
    action = series_tools.check if args.action == "check" else series_tools.apply
    ok, message = action(Path(args.repo), patches_dir)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-futuremap-patch",
        description="Back-port of SGLang's FutureMap publish/stash design to SGLang 0.5.12.x.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="show the SGLang version, the verdict and every back-port's targets"
                   ).set_defaults(func=cmd_status)
    sub.add_parser("verify", help="apply in this process (strict) and run a CPU self-check"
                   ).set_defaults(func=cmd_verify)
    p = sub.add_parser("patches", help="check or apply patches/ on an SGLang git checkout")
    p.add_argument("action", choices=("check", "apply"))
    p.add_argument("--repo", required=True, help="SGLang repository at v0.5.12.post1 (or v0.5.12)")
    p.add_argument("--patches", help="the patch series folder (default: patches/ of this checkout)")
    p.set_defaults(func=cmd_patches)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
