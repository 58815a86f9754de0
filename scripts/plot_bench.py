#!/usr/bin/env python3
"""Merge bench_spec_v2.py result files; write the ratio plot and the README table.

    python3 scripts/plot_bench.py results/bench/*.json              # -> results/bench/{bench.png,README.md}
    python3 scripts/plot_bench.py a.json b.json --out-dir /tmp/x --merged /tmp/x/merged.json

A ``reading.md`` in the out dir (the interpretation, written by hand) is appended to the README.
Cases are merged by (model, backend, prompt length, spec) across files: the timed runs of all
files count (pairs are formed within a file), the later file's probe result wins, profiles add
up. A file without specs is the default spec's (3/1/4). Each row shows the spec path of each
variant (spec v1 / spec v2) and the accept length beside each tok/s. Where the merged cases hold
an EAGLE tree (topk > 1) and a chain (topk 1) of the same model, backend and prompt length, the
README adds the patched tree against the patched chain per batch size ("spec v2 topk 4 vs spec
v2 topk 1"). Dummy weights: the accept length is near its maximum, every tok/s an upper bound
(see bench_spec_v2.py).
The plot needs matplotlib (``pip install matplotlib``; without it only the README is
written). Exit status 0 whatever the targets say; they are printed and put in the README.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_spec_v2 as bench  # noqa: E402

DEFAULT_OUT = ROOT / "results" / "bench"
#: Hand-written notes in the out dir, appended to the generated README as they are.
READING = "reading.md"


def _f(v: Any, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100.0 * v:.1f}%"


def _med(s: dict[str, Any] | None) -> float | None:
    return None if not s else s.get("median")


def _range(s: dict[str, Any] | None, nd: int = 1) -> str:
    if not s:
        return "-"
    if s["n"] == 1:
        return f"{s['median']:.{nd}f}"
    return f"{s['median']:.{nd}f} [{s['min']:.{nd}f}-{s['max']:.{nd}f}]"


def _pair(a: Any, b: Any, nd: int = 2, fmt=None) -> str:
    fmt = fmt or (lambda v: _f(v, nd))
    if a is None and b is None:
        return "-"
    return f"{fmt(a)} / {fmt(b)}"


def case_label(case: dict[str, Any]) -> str:
    return bench.case_name(case).replace("/", " ", 1)


def config_cell(summary: dict[str, Any]) -> str:
    """What the case's Engines ran (one entry when every variant ran the same)."""
    cfg = summary.get("config") or {}
    labels = {v: c["config"] for v, c in cfg.items()}
    if not labels:
        return "-"
    if len(set(labels.values())) == 1:
        return next(iter(labels.values()))
    return "; ".join(f"{v}: {lab}" for v, lab in labels.items())


def has_upstream(merged: dict[str, Any]) -> bool:
    return any("upstream" in (c.get("summary") or bench.summarize_case(c))["variants"] for c in merged["cases"])


def _path(path: str | None) -> str:
    """``v1`` / ``v2`` for ``spec v1`` / ``spec v2``; ``?`` when unknown."""
    return (path or "?").replace("spec ", "")


def spec_path_cell(summary: dict[str, Any], variants: Sequence[str]) -> str:
    """``v1 / v2``: each variant's spec path, in the order of the runs column (``-``: a variant
    without runs in this case)."""
    paths = summary.get("spec_paths") or {}
    ran = summary.get("variants") or ["stock", "patched"]
    return " / ".join(_path(paths.get(v)) if v in ran else "-" for v in variants)


def tok_cell(r: dict[str, Any], variant: str) -> str:
    """``95.0 [90.0-100.0] (acc 4.00)``: decode tok/s over runs, with the accept length."""
    v = r.get(variant) or {}
    if not v.get("decode_tok_s") and not v.get("accept_length"):
        return "-"
    return f"{_range(v.get('decode_tok_s'))} (acc {_f(_med(v.get('accept_length')), 2)})"


def table_rows(merged: dict[str, Any]) -> list[list[str]]:
    upstream = has_upstream(merged)
    variants = ["stock", "patched", "upstream"] if upstream else ["stock", "patched"]
    rows = []
    for case in merged["cases"]:
        s = case.get("summary") or bench.summarize_case(case)
        for bs in sorted(s["by_bs"], key=int):
            r = s["by_bs"][bs]
            blocked = r["blocked_ms_per_iter"]
            vd = r["verify_done_ms_per_iter"]
            row = [
                case_label(case),
                config_cell(s),
                spec_path_cell(s, variants),
                str(bs),
                "/".join(str(s["n_runs"].get(v, 0)) for v in variants),
                tok_cell(r, "stock"),
                tok_cell(r, "patched"),
                _f(r["ratio"], 3) + (f" ({_f(r['paired_ratio']['min'], 3)}-{_f(r['paired_ratio']['max'], 3)})"
                                     if r.get("paired_ratio") and r["paired_ratio"]["n"] > 1 else ""),
            ]
            if upstream:
                ratio = (r.get("ratios") or {}).get("upstream")
                row.append(tok_cell(r, "upstream") + (f" (x{_f(ratio, 3)})" if ratio else ""))
            row += [
                _pair(_med(r["stock"]["tpot_ms"]), _med(r["patched"]["tpot_ms"]), 3),
                _pair(blocked["stock"], blocked["patched"], 3)
                + (f" ({_pct(-r['blocked_reduction'])})" if r.get("blocked_reduction") is not None else ""),
                _pair(vd["stock"], vd["patched"], 3),
                _pair(r["idle_fraction"]["stock"], r["idle_fraction"]["patched"], fmt=_pct),
            ]
            rows.append(row)
    return rows


def header(upstream: bool) -> list[str]:
    u = "/u" if upstream else ""
    head = ["case", "config", "spec path s / p" + (" / u" if upstream else ""), "bs", f"runs s/p{u}",
            "stock tok/s (median [min-max]) (accept len)", "patched tok/s (accept len)", "ratio p/s (paired min-max)"]
    if upstream:
        head.append("upstream tok/s (accept len) (ratio u/s)")
    return head + ["TPOT ms s / p", "blocked ms/iter s / p (change)", "verify_done ms/iter s / p", "GPU idle s / p"]


def tree_section(merged: dict[str, Any]) -> str:
    """The patched tree against the patched chain of the same model, backend and prompt length
    (``bench.tree_vs_chain``), one table per tree case."""
    parts = []
    for it in bench.tree_vs_chain(merged["cases"]):
        rows = [[str(r["bs"]), f"{_f(r['tree_tok_s'])} (acc {_f(r['tree_accept'], 2)})",
                 f"{_f(r['chain_tok_s'])} (acc {_f(r['chain_accept'], 2)})", _f(r["ratio"], 3)] for r in it["rows"]]
        parts += [f"### {bench.tree_vs_chain_title(it)}: {it['tree']} vs {it['chain']} ({it['variant']})", "",
                  markdown_table(["bs", f"tree {bench.spec_label(it['tree_spec'])} tok/s (accept len)",
                                  f"chain {bench.spec_label(it['chain_spec'])} tok/s (accept len)", "tree / chain"],
                                 rows) if rows else "- no batch size in both", ""]
    return "\n".join(parts).rstrip()


def specs_line(merged: dict[str, Any]) -> str:
    """``3/1/4 (chain), 3/4/16 (tree)``: the specs of the merged cases, steps / topk / draft tokens."""
    specs = sorted({bench.case_spec(c) for c in merged["cases"]}, key=lambda x: (x[1], x))
    return ", ".join(f"{bench.spec_label(x)} ({'tree' if bench.is_tree(x) else 'chain'})" for x in specs) or "-"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def top_sites_section(merged: dict[str, Any], max_sites: int = 4) -> str:
    lines = []
    for case in merged["cases"]:
        probe = case.get("probe") or {}
        for variant in ("stock", "patched"):
            p = probe.get(variant)
            if not p:
                continue
            for bs in sorted(p.get("by_bs", {}), key=int):
                b = p["by_bs"][bs]
                sites = "; ".join(f"`{t['site']}` {t['ms_per_iter']:.3f} ms ({t['calls_per_iter']:.2f}x)"
                                  for t in b.get("top_sites", [])[:max_sites])
                sl = b.get("seq_lens_syncs_per_iter")
                sl_text = f" ({sl:.2f} in seq_lens sites)" if sl is not None else ""
                lines.append(f"- {case_label(case)}, {variant}, bs {bs}: {b['syncs_per_iter']:.2f} syncs/iter{sl_text}; "
                             f"{sites or 'none'}")
    return "\n".join(lines)


def host_section(merged: dict[str, Any], top: int = 5) -> str:
    """Host time per decode iteration from the cProfile pass (``--host-profile``)."""
    lines = []
    for case in merged["cases"]:
        s = case.get("summary") or bench.summarize_case(case)
        for bs in sorted(s["by_bs"], key=int):
            h = s["by_bs"][bs].get("host")
            if not h:
                continue
            w, g, n = h["wall_us_per_iter"], h["gc_us_per_iter"], h["decode_iterations"]
            deltas = "; ".join(f"`{d['func']}` {d['delta']:+.0f}" for d in h["top_tottime_delta"][:top])
            lines.append(f"- {case_label(case)}, bs {bs}: {_f(w['stock'], 0)} / {_f(w['patched'], 0)} us per decode "
                         f"iteration ({n['stock']} / {n['patched']} iterations, GC {_f(g['stock'])} / "
                         f"{_f(g['patched'])} us); largest differences in own time (us/iter): {deltas}")
    return "\n".join(lines)


def gpu_section(merged: dict[str, Any]) -> str:
    """GPU busy time and idle fraction per decode iteration, from the profiled runs."""
    lines = []
    for case in merged["cases"]:
        s = case.get("summary") or bench.summarize_case(case)
        for bs in sorted(s["by_bs"], key=int):
            r = s["by_bs"][bs]
            busy = r.get("gpu_busy_us_per_iter") or {}
            if busy.get("stock") is None and busy.get("patched") is None:
                continue
            lines.append(f"- {case_label(case)}, bs {bs}: GPU busy {_f(busy.get('stock'), 0)} / "
                         f"{_f(busy.get('patched'), 0)} us per decode iteration, idle "
                         f"{_pct(r['idle_fraction']['stock'])} / {_pct(r['idle_fraction']['patched'])}")
    return "\n".join(lines)


def targets_section(targets: Sequence[dict[str, Any]]) -> tuple[str, int, int]:
    lines = []
    met = sum(1 for t in targets if t["met"] is True)
    known = sum(1 for t in targets if t["met"] is not None)
    for t in targets:
        mark = {True: "met", False: "**not met**", None: "no data"}[t["met"]]
        val = t["value"]
        shown = _pct(val) if "blocked" in t["target"] else _f(val, 3)
        lines.append(f"- {t['case']}: {t['target']}: {shown} — {mark}")
    return "\n".join(lines), met, known


def sources_section(merged: dict[str, Any]) -> str:
    lines = []
    for src in merged["sources"]:
        env = src.get("env") or {}
        versions = env.get("sglang_versions") or {}
        sglang = ", ".join(f"{v} {x}" for v, x in versions.items()) if len(set(versions.values())) > 1 else (
            env.get("sglang_version") or "?")
        lines.append(f"- `{src.get('command')}` — {src.get('date')}, {env.get('gpu') or '?'}, "
                     f"SGLang {sglang}, torch {env.get('torch_version') or '?'}, FA3 {_yes(src.get('fa3')) or '?'}"
                     + (f" (file `{Path(src['path']).name}`)" if src.get("path") else ""))
    return "\n".join(lines)


def _yes(v: Any) -> str | None:
    return None if v is None else ("yes" if v else "no")


def versions_line(envs: Sequence[dict[str, Any]]) -> str:
    """``0.5.12.post1`` or, with an upstream column, ``stock/patched 0.5.12.post1; upstream 0.5.13``."""
    up = _uniq([(e.get("sglang_versions") or {}).get("upstream") for e in envs])
    base = _uniq([e.get("sglang_version") for e in envs])
    return base if up == "?" else f"stock/patched {base}; upstream {up}"


def _uniq(values: Sequence[Any]) -> str:
    vals = sorted({str(v) for v in values if v})
    return ", ".join(vals) if vals else "?"


def render_readme(merged: dict[str, Any], targets: Sequence[dict[str, Any]], plot_name: str | None,
                  plot_command: str, reading: str | None = None) -> str:
    """The README; ``reading`` (the out dir's hand-written ``reading.md``) goes last, as it is."""
    envs = [s.get("env") or {} for s in merged["sources"]]
    dates = [s.get("date") for s in merged["sources"]]
    cfgs = [s.get("config") or {} for s in merged["sources"]]
    tsec, met, known = targets_section(targets)
    cfg_line = _uniq([f"max_new_tokens {c.get('max_new_tokens')}, prompt {c.get('prompt_len')} tokens, "
                      f"{c.get('trials')} trials per Engine"
                      + (", scheduler pinned to its own core" if c.get("pin_cpus") else "") for c in cfgs])
    skipped = [m for s in merged.get("skipped_all", []) for m in s]
    parts = [
        "# Decode benchmark: stock SGLang vs. sglang_futuremap_patch",
        "",
        "| | |",
        "|---|---|",
        f"| date | {_uniq(dates)} |",
        f"| GPU | {_uniq([e.get('gpu') for e in envs])} |",
        f"| SGLang | {versions_line(envs)} (torch {_uniq([e.get('torch_version') for e in envs])}) |",
        f"| FA3 | {_uniq([_yes(s.get('fa3')) for s in merged['sources']])} |",
        f"| config | STANDALONE, steps / topk / draft tokens {specs_line(merged)}; a chain runs on spec v2 (overlap "
        "scheduler) on every side, a tree on spec v1 in stock 0.5.12.post1 and on spec v2 with the plugin (column "
        "'spec path'); greedy, `ignore_eos`, dummy weights, CUDA graph on (`cuda_graph_bs` = the batch sizes) |",
        f"| dummy weights | {bench.DUMMY_NOTE[len('dummy weights: '):]} |",
        f"| workload | {cfg_line} |",
        "| variants | stock = `SGLANG_FUTUREMAP_PATCH=off`, patched = `strict`"
        + ("; upstream = stock SGLang of the upstream bundle (its own site folder, no plugin)" if has_upstream(merged)
           else "") + "; each Engine in its own process, alternating |",
        "",
        "Decode tok/s = bs x (max_new_tokens - 1) / (t(max_new_tokens) - t(1)) with fresh prompts each call; "
        "TPOT = the same decode time / (max_new_tokens - 1). A run's value is the median of its trials; the table "
        "shows the median over runs with [min-max]; ratio = median patched / median stock, with the range of "
        "the back-to-back pairs. Blocked ms/iter: host time the scheduler spent in CUDA syncs per DECODE "
        "iteration (separate probed Engine, not timed); verify_done = the part inside `maybe_wait_verify_done`. "
        "GPU idle: 1 - union of GPU kernel/memcpy intervals over the decode window of a torch-profiler trace.",
        "",
        markdown_table(header(has_upstream(merged)), table_rows(merged)),
        "",
    ]
    if plot_name:
        parts += [f"![patched/stock decode tok/s]({plot_name})", ""]
    trees = tree_section(merged)
    if trees:
        parts += ["## Trees against chains (patched: tree / chain decode tok/s)", "",
                  "Both sides are the patched SGLang on the same backend; accept lengths beside each tok/s. With dummy "
                  "weights the draft accepts (almost) everything: the accept length is near its maximum (steps + 1), so "
                  "these numbers are upper bounds, and at equal depth the ratio is the cost of the tree's wider verify "
                  "alone (what a tree buys with real weights, a longer accepted path, cannot show).", "", trees, ""]
    parts += [
        f"## Targets ({met}/{known} met)",
        "",
        "Goals from issue 6: patched/stock >= 1.10 decode tok/s at bs 1 on triton-nopcg, >= 0.99 elsewhere; "
        "blocked host time per decode iteration down >= 90%.",
        "",
        tsec or "- no data",
        "",
    ]
    sites = top_sites_section(merged)
    if sites:
        parts += ["## Where the scheduler blocks (probed pass, per decode iteration)", "", sites, ""]
    gpu = gpu_section(merged)
    if gpu:
        parts += ["## GPU time per decode iteration (profiled runs; stock / patched)", "", gpu, ""]
    host = host_section(merged)
    if host:
        parts += ["## Host time per decode iteration (cProfile pass, slower than the timed runs; stock / patched)",
                  "", host, ""]
    invalid = [(case_label(c), r) for c in merged["cases"] for r in c["runs"] if not r.get("valid")]
    if invalid or skipped:
        parts += ["## Runs left out", ""]
        parts += [f"- {lab}: {r.get('pass')} {r.get('variant')} rep {r.get('rep')} (file {r.get('source')}): "
                  f"returncode {r.get('returncode')}; {r.get('validity')}" for lab, r in invalid]
        parts += [f"- {m}" for m in skipped]
        parts += [""]
    parts += ["## Commands", "", sources_section(merged), f"- `{plot_command}`", ""]
    if reading:
        parts += [reading.rstrip(), ""]
    return "\n".join(parts)


def ratio_series(merged: dict[str, Any]) -> list[tuple[str, str, list[int], list[float], list[float], list[float]]]:
    """What the plot draws: per case and variant (patched, upstream) against stock, the label
    (case and the configuration its Engines ran), batch sizes, median ratios and the distances
    to the smallest and largest paired ratio."""
    out = []
    for case in merged["cases"]:
        s = case.get("summary") or bench.summarize_case(case)
        for variant in [v for v in s["variants"] if v != "stock"]:
            xs, ys, lo, hi = [], [], [], []
            for bs in sorted(s["by_bs"], key=int):
                r = s["by_bs"][bs]
                ratio = (r.get("ratios") or {}).get(variant, r["ratio"] if variant == "patched" else None)
                if ratio is None:
                    continue
                pr = (r.get("paired_ratios") or {}).get(variant, r.get("paired_ratio") if variant == "patched" else None)
                xs.append(int(bs))
                ys.append(ratio)
                lo.append(max(ratio - (pr["min"] if pr else ratio), 0.0))
                hi.append(max((pr["max"] if pr else ratio) - ratio, 0.0))
            if xs:
                cfg = (s.get("config") or {}).get(variant) or {}
                what = f"{case_label(case)} [{config_cell(s)}]"
                if variant != "patched":
                    what += f" — {variant} {cfg.get('sglang_version') or ''}".rstrip()
                out.append((what, variant, xs, ys, lo, hi))
    return out


def plot(merged: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    all_bs: set[int] = set()
    colors: dict[str, Any] = {}
    for label, variant, xs, ys, lo, hi in ratio_series(merged):
        all_bs.update(xs)
        base = label.split(" — ")[0]
        bar = ax.errorbar(xs, ys, yerr=[lo, hi], marker="o" if variant == "patched" else "s", capsize=3,
                          linestyle="-" if variant == "patched" else "--", color=colors.get(base), label=label)
        colors.setdefault(base, bar.lines[0].get_color())
    ax.axhline(1.0, linestyle="--", color="grey", linewidth=1, label="1.0 (parity)")
    ax.axhline(bench.TARGET_ELSEWHERE, linestyle=":", color="grey", linewidth=1, label="0.99 target")
    ax.axhline(bench.TARGET_BS1, linestyle="--", color="red", linewidth=1, label="1.10 target (bs 1, triton-nopcg)")
    ax.set_xscale("log", base=2)
    if all_bs:
        ax.set_xticks(sorted(all_bs))
        ax.set_xticklabels([str(b) for b in sorted(all_bs)])
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode tok/s, patched / stock" + (" (dashed: upstream / stock)" if has_upstream(merged) else ""))
    envs = [s.get("env") or {} for s in merged["sources"]]
    ax.set_title(f"sglang_futuremap_patch vs stock SGLang {versions_line(envs)}"
                 f" — {_uniq([e.get('gpu') for e in envs])}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def build(paths: Sequence[Path], out_dir: Path, *, merged_path: Path | None = None,
          command: str = "python3 scripts/plot_bench.py", do_plot: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    docs = bench.load_docs(paths)
    merged = bench.merge_docs(docs)
    merged["skipped_all"] = [d.get("skipped", []) for d in docs]
    targets = bench.evaluate_targets(merged["cases"])
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "bench.png"
    have_plot = plot(merged, png) if do_plot else png.exists()
    notes = out_dir / READING
    reading = notes.read_text() if notes.exists() else None
    (out_dir / "README.md").write_text(render_readme(merged, targets, png.name if have_plot else None, command,
                                                     reading))
    if merged_path is not None:
        import json

        merged_path.write_text(json.dumps(dict(merged, targets=targets), indent=1))
    return merged, targets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", type=Path, help="bench_spec_v2.py JSON files")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT.relative_to(ROOT)}")
    p.add_argument("--merged", type=Path, help="also write the merged JSON here")
    p.add_argument("--no-plot", action="store_true", help="README only")
    args = p.parse_args(argv)
    import shlex

    command = shlex.join(["python3", "scripts/plot_bench.py", *(argv if argv is not None else sys.argv[1:])])
    merged, targets = build(args.results, args.out_dir, merged_path=args.merged, command=command,
                            do_plot=not args.no_plot)
    for t in targets:
        mark = {True: "MET", False: "NOT MET", None: "n/a"}[t["met"]]
        val = t["value"]
        print(f"[{mark}] {t['case']}: {t['target']} ({'-' if val is None else f'{val:.3f}'})")
    print(f"wrote {args.out_dir / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
