"""``sglang-futuremap-patch``: say whether and how the installed SGLang gets patched, verify it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from sglang_futuremap_patch import _engine
from sglang_futuremap_patch._api import (
    ENV_VAR,
    MODES,
    UNAVAILABLE,
    Report,
    Verdict,
    apply,
    read_mode,
    sglang_unavailable,
    status,
)

#: Exit status when SGLang itself cannot be imported (status, verify).
EXIT_NO_SGLANG = 3

EPILOG = f"""\
The plugin runs by itself inside SGLang (entry point group sglang.srt.plugins).
{ENV_VAR}={'|'.join(MODES)} chooses what it does (default: safe, which leaves SGLang untouched
and logs one WARNING line whenever anything is unexpected; strict stops SGLang instead).

Exit status of status and verify: 0 patched (or nothing to do: SGLang 0.5.13+ or a patched
source), 1 SGLang left unpatched or a check failed, 2 invalid {ENV_VAR}, {EXIT_NO_SGLANG} SGLang
cannot be imported.
"""


def _unavailable(verdict: Verdict) -> int:
    """One line for an SGLang that does not import: the error and what to do about it."""
    if "No module named 'sglang'" in verdict.reason:
        todo = "install SGLang 0.5.12.x into this Python environment, or run this command with the Python that has it"
    else:
        todo = ("fix that install (python -c 'import sglang' shows the traceback); on a CPU-only host "
                "SGLang needs stand-ins for torchvision and sgl_kernel: run through scripts/cpu-env.sh "
                "of a source checkout")
    print(f"error: {verdict.reason}; {todo}", file=sys.stderr)
    return EXIT_NO_SGLANG


def _tree_choice() -> str:
    """Where EAGLE trees (topk > 1) run, as the environment decides it."""
    from sglang_futuremap_patch.backports.spec_v2_tree import (
        TREE_ENV, tree_spec_v2_forced, tree_spec_v2_wanted)

    if not tree_spec_v2_wanted():
        return f"spec v1, as in stock SGLang ({TREE_ENV}=0 is set)"
    where = ("Triton/FlashInfer/FA3 with page size 1, FlashInfer/FA3 with larger pages; "
             "Llama/Qwen2/Qwen3 targets; elsewhere spec v1")
    if tree_spec_v2_forced():
        return f"spec v2 where covered ({where}), FlashInfer included ({TREE_ENV}=1 is set); {TREE_ENV}=0 keeps every tree on spec v1"
    return (f"spec v2 where covered ({where}), except FlashInfer: spec v1 there (faster on 0.5.12.x; "
            f"{TREE_ENV}=1 runs it on spec v2); {TREE_ENV}=0 keeps every tree on spec v1")


def _tree_switches() -> str:
    """Back-ports 16 and 22 on a tree, as the environment decides it (unset: on for trees only)."""
    from sglang_futuremap_patch.backports.mirror_relay_lens import MIRROR_RELAY_ENV
    from sglang_futuremap_patch.backports.prefill_result_first import PREFILL_RESULT_FIRST_ENV

    parts = []
    for number, env in ((16, PREFILL_RESULT_FIRST_ENV), (22, MIRROR_RELAY_ENV)):
        setting = os.environ.get(env, "").strip()
        state = "on" if not setting else "on, chains too" if setting == "1" else "off"
        parts.append(f"back-port {number} {state} ({env}={setting or 'unset'})")
    return "; ".join(parts) + "; unset: on for trees, off for chains; 0: off"


def _barrier_switches() -> str:
    """Where back-port 17's WAR barrier runs, as the environment sets it: back-port 27 (off unless
    switched on) and the idle-poll skip (on unless switched off)."""
    from sglang_futuremap_patch.backports.war_barrier import WAR_BARRIER_SKIP_IDLE_ENV
    from sglang_futuremap_patch.backports.war_barrier_after_launch import WAR_BARRIER_AFTER_LAUNCH_ENV

    setting = os.environ.get(WAR_BARRIER_AFTER_LAUNCH_ENV, "").strip()
    state = "on: the barrier after each launch" if setting == "1" else "off"
    skip = os.environ.get(WAR_BARRIER_SKIP_IDLE_ENV, "").strip()
    polls = "one every loop iteration" if skip == "0" else "none after an idle poll"
    return (f"back-port 27 {state} ({WAR_BARRIER_AFTER_LAUNCH_ENV}={setting or 'unset'}; 1: on); "
            f"back-port 17's barrier {polls} ({WAR_BARRIER_SKIP_IDLE_ENV}={skip or 'unset'}; "
            f"0: at every poll)")


def _print_report(report: Report) -> None:
    v = report.verdict
    print(f"SGLang:   {v.sglang_version}")
    print(f"mode:     {report.mode} ({ENV_VAR})")
    print(f"verdict:  {v.decision}: {v.reason}")
    if any(bp.id == "spec-v2-tree" for bp in report.series):
        print(f"trees:    {_tree_choice()}")
    if {"prefill-result-first", "mirror-relay-lens"} <= {bp.id for bp in report.series}:
        print(f"on trees: {_tree_switches()}")
    if any(bp.id == "war-barrier-after-launch" for bp in report.series):
        print(f"barrier:  {_barrier_switches()}")
    for bp in report.series:
        print(f"\n{bp.id}  [{bp.pr_list}]  patches/{bp.patch_file}")
        print(f"  {bp.title}")
        for check in v.checks.get(bp.id, []):
            t = check.target
            detail = f"  ({check.detail})" if check.detail else ""
            print(f"    {check.state:9} {t.path}  [{t.kind}, expected {t.expected}]{detail}")


def cmd_status(args: argparse.Namespace) -> int:
    report = status()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    elif report.verdict.decision != UNAVAILABLE:
        _print_report(report)
    if report.verdict.decision == UNAVAILABLE:
        return _unavailable(report.verdict)
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
    unavailable = sglang_unavailable()
    if unavailable is not None:
        return _unavailable(unavailable)
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
    if not (patches_dir / series_tools.SERIES_FILE).is_file():
        print(f"error: no patch series at {patches_dir}; pass --patches path/to/patches",
              file=sys.stderr)
        return 2
    if args.action == "export":
        try:
            written = series_tools.copy_series(Path(args.out), patches_dir)
        except series_tools.SeriesError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {len(written)} files to {args.out}; on an SGLang v0.5.12.post1 checkout: "
              f"git am -k --3way --empty=drop {Path(args.out) / '*.patch'}")
        return 0
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
    parser.add_argument("--traceback", action="store_true",
                        help="on an unexpected error, show the Python traceback instead of one line")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", help="show the SGLang version, the verdict and every back-port's targets")
    p.add_argument("--json", action="store_true", help="print the same as one JSON object")
    p.set_defaults(func=cmd_status)
    sub.add_parser("verify", help="apply in this process (strict) and run a CPU self-check"
                   ).set_defaults(func=cmd_verify)
    p = sub.add_parser("patches", help="check or apply the patch series on an SGLang git checkout, "
                       "or export it for git am")
    actions = p.add_subparsers(dest="action", required=True)
    for action, help_text in (("check", "does the series apply? (the checkout is left untouched)"),
                              ("apply", "git am -k --3way the series, all or nothing")):
        a = actions.add_parser(action, help=help_text)
        a.add_argument("--repo", required=True, help="SGLang repository at v0.5.12.post1 (or v0.5.12)")
    a = actions.add_parser("export", help="write the series (cover letter, patches, series) to a folder")
    a.add_argument("--out", required=True, help="a new or empty folder")
    for a in actions.choices.values():
        a.add_argument("--patches", help="the patch series folder (default: the one this install carries)")
    p.set_defaults(func=cmd_patches)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.traceback:
            raise
        print(f"error: unexpected {type(exc).__name__}: {exc} (rerun with --traceback for details)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
