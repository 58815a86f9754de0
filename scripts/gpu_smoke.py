#!/usr/bin/env python3
"""GPU smoke test: stock SGLang vs. sglang_futuremap_patch, token for token.

Runs one fixed greedy workload on ``sglang.Engine`` (STANDALONE speculative decoding,
spec v2; Triton attention unless ``--attention-backend flashinfer|fa3|default``; piecewise CUDA
graph off unless ``--piecewise-cuda-graph`` or backend ``default``, which is SGLang's own
configuration: no backend given, FA3 + piecewise CUDA graph on H100/H200) twice, each in a fresh
Python subprocess with ports of its own, so no plugin state leaks between them:

* ``stock``   -- ``SGLANG_FUTUREMAP_PATCH=off`` (plugin installed but disabled);
* ``patched`` -- ``SGLANG_FUTUREMAP_PATCH=strict`` (plugin on, raise on any problem).

Exit code 0 only when all of these hold:

1. both runs finished and every output has exactly ``max_new_tokens`` tokens;
2. the outputs are identical token for token;
3. the outputs are not trivially cyclic (most outputs must have a tail period > 2);
4. the patched log has ``sglang_futuremap_patch: applied`` from the main process and from
   every scheduler process; the stock log has ``sglang_futuremap_patch: disabled``;
5. neither log has a ``sglang_futuremap_patch`` line at WARNING/ERROR level, a failed plugin
   load, or a traceback through the plugin's code;
6. ``maybe_wait_verify_done`` (any function of that name) is called in the stock
   scheduler process and never in any process of the patched run. Counted by the probe in
   ``scripts/gpu_probe/`` (a ``sitecustomize`` put on ``PYTHONPATH`` of the subprocesses);
7. with ``--sync-probe``: the host-sync probe (``scripts/gpu_probe/smoke_sync_probe.py``) saw
   decode iterations in both scheduler processes; with ``--expect-zero-seq-lens-syncs`` also:
   the patched run has 0 seq_lens syncs per decode iteration.

Exit status: 0 passed, 1 failed, 2 harness error (an Engine did not start or did not finish:
``SMOKE ERROR`` with the end of its log, no comparison made). A configuration that needs FA3
(``fa3``, ``default``) where ``sgl_kernel.flash_ops`` does not import is ``SMOKE SKIPPED (no
FA3)``, exit status 0. The JSON records ``status`` and ``fa3``.

``--sync-probe`` counts, per decode iteration of the scheduler thread, the host syncs
(``Tensor.item/.tolist/.cpu/.numpy/__int__/__float__/__bool__``, ``.to(cpu)`` on CUDA tensors,
``torch.cuda.Event/Stream.synchronize``, ``torch.cuda.synchronize``) by call site and the
host time blocked in them. Syncs inside ``resolve_seq_lens_cpu``, ``filter_batch``,
``merge_batch``, ``prepare_for_decode`` or ``maybe_wait_verify_done`` (anywhere up the stack)
are "seq_lens syncs". The wrappers slow the scheduler down: tokens/s of a run with the sync
probe are not comparable with a run without it; time in a separate run.

Model directories come from ``--models DIR`` (holding ``target/`` and ``draft/`` as written
by ``make_tiny_models.py``), from ``--target``/``--draft``, or are generated into a
temporary directory when none is given.

The plugin must be installed (entry point ``sglang.srt.plugins``) in the Python that runs
this script; SGLang finds it there in every process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_harness import child_env, engine_config, launch, logs, model_factory, port_blocks  # noqa: E402
from gpu_harness.records import Check  # noqa: E402

RUNS: tuple[tuple[str, str], ...] = (("stock", "off"), ("patched", "strict"))

# ----------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Prompt:
    input_ids: list[int]
    max_new_tokens: int


def make_workload(n: int = 16, vocab_size: int = 4096, seed: int = 20251122,
                  max_new_tokens: int | None = None) -> list[Prompt]:
    """``n`` prompts of varied lengths (4..~900 tokens) with max_new_tokens 16..128 (or all
    ``max_new_tokens`` when given).

    Token ids avoid 0..2 (pad/bos/eos of the tiny models)."""
    rng = random.Random(seed)
    lengths = [4, 7, 12, 20, 33, 50, 64, 90, 128, 170, 256, 333, 512, 600, 777, 900]
    budgets = [16, 24, 32, 40, 48, 64, 80, 96, 112, 128]
    out = []
    for i in range(n):
        length = lengths[i % len(lengths)] + rng.randrange(0, 5)
        ids = [rng.randrange(3, vocab_size) for _ in range(length)]
        out.append(Prompt(ids, max_new_tokens or budgets[(i * 7) % len(budgets)]))
    return out


# ----------------------------------------------------------------------------- pure analysis


def tail_period(tokens: Sequence[int], max_period: int = 16, window: int = 32) -> int | None:
    """Smallest p <= max_period with tokens[i] == tokens[i - p] over the last ``window``
    tokens (or all of them when shorter); None when the tail is not periodic."""
    n = len(tokens)
    if n < 2:
        return 1 if n == 1 else None
    start = max(0, n - window)
    for p in range(1, max_period + 1):
        lo = max(start, p)
        if lo >= n:
            break
        if all(tokens[i] == tokens[i - p] for i in range(lo, n)):
            return p
    return None


@dataclass
class PromptResult:
    index: int
    prompt_len: int
    max_new_tokens: int
    stock_len: int
    patched_len: int
    match: bool
    first_mismatch: int | None
    distinct_tokens: int
    tail_period: int | None


def compare_outputs(
    prompts: Sequence[Prompt], stock: Sequence[Sequence[int]], patched: Sequence[Sequence[int]]
) -> list[PromptResult]:
    results = []
    for i, p in enumerate(prompts):
        a = list(stock[i]) if i < len(stock) else []
        b = list(patched[i]) if i < len(patched) else []
        first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and (len(a) != len(b) or i >= len(stock) or i >= len(patched)):
            first = min(len(a), len(b))  # different lengths, or an output missing from a run
        results.append(
            PromptResult(
                index=i,
                prompt_len=len(p.input_ids),
                max_new_tokens=p.max_new_tokens,
                stock_len=len(a),
                patched_len=len(b),
                match=first is None,
                first_mismatch=first,
                distinct_tokens=len(set(a)),
                tail_period=tail_period(a),
            )
        )
    return results


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def format_sync_report(runs: dict[str, dict[str, Any]], max_sites: int = 12) -> list[str]:
    """Per run: decode-iteration totals and the per-site breakdown of the sync probe."""
    lines = ["host syncs per decode iteration (sync probe; scheduler thread; seq_lens = by call site):"]
    for name, run in runs.items():
        sy = run.get("sync")
        if not sy:
            lines.append(f"  {name}: no sync-probe data")
            continue
        d = sy["decode"]
        pi = d["per_iteration"]
        lines.append(
            f"  {name}: {sy['decode_iterations']} decode iterations (mean bs {_fmt(sy['mean_decode_batch_size'], '.1f')}); "
            f"per decode iteration: {_fmt(pi['syncs'])} syncs, {_fmt(pi['seq_lens_syncs'])} seq_lens syncs, "
            f"{_fmt(pi['blocked_ms'], '.3f')} ms blocked ({_fmt(pi['seq_lens_blocked_ms'], '.3f')} ms on seq_lens); "
            f"seq_lens-tensor syncs {_fmt(pi['seq_lens_tensor_syncs'])}; all modes {sy['all']['syncs']} syncs / "
            f"{sy['all']['iterations']} iterations {sy['iterations']}"
        )
        for site in d["sites"][:max_sites]:
            lines.append(
                f"      {'S' if site['seq_lens'] else ' '} {_fmt(site['per_iteration']):>6}/it "
                f"{_fmt(site['blocked_ms_per_iteration'], '.3f'):>8} ms/it {_fmt(site['mean_us'], '.1f'):>8} us/call  "
                f"{site['op']:<26} {site['site']}"
            )
        if len(d["sites"]) > max_sites:
            lines.append(f"      ... {len(d['sites']) - max_sites} more sites in the JSON")
        if sy["errors"]:
            lines.append(f"      probe errors: {sy['errors'][:3]}")
    return lines


def evaluate(
    prompts: Sequence[Prompt],
    stock: dict[str, Any],
    patched: dict[str, Any],
    *,
    max_cyclic_fraction: float = 0.5,
    sync_probe: bool = False,
    expect_zero_seq_lens_syncs: bool = False,
) -> tuple[list[Check], list[PromptResult]]:
    """All pass/fail decisions, from each run's dict: ``result`` (worker JSON or None),
    ``returncode``, ``log`` (logs.LogFindings), ``probe`` (logs.ProbeSummary) and, with
    ``sync_probe``, ``sync`` (``logs.summarize_sync``)."""
    checks: list[Check] = []
    s_res, p_res = stock.get("result"), patched.get("result")
    s_out = (s_res or {}).get("outputs", [])
    p_out = (patched.get("result") or {}).get("outputs", [])
    for name, run, res in (("stock", stock, s_res), ("patched", patched, p_res)):
        ok = run.get("returncode") == 0 and res is not None and len(res.get("outputs", [])) == len(prompts)
        checks.append(Check(f"{name} run finished", ok, f"returncode {run.get('returncode')}, "
                            f"{len((res or {}).get('outputs', []))}/{len(prompts)} outputs"))
        if res is not None:
            short = [i for i, (p, o) in enumerate(zip(prompts, res.get("outputs", []))) if len(o) != p.max_new_tokens]
            checks.append(Check(f"{name} output lengths", not short and ok,
                                "all equal max_new_tokens" if not short else f"prompts with wrong length: {short}"))

    results = compare_outputs(prompts, s_out, p_out)
    mism = [r.index for r in results if not r.match]
    checks.append(Check("outputs identical", bool(s_out) and bool(p_out) and not mism,
                        f"{len(results) - len(mism)}/{len(results)} prompts match"
                        + (f"; mismatching prompts {mism}" if mism else "")))
    cyclic = [r.index for r in results if r.tail_period is not None and r.tail_period <= 2]
    too_cyclic = len(cyclic) > max_cyclic_fraction * max(len(results), 1)
    checks.append(Check("outputs not trivially cyclic", bool(s_out) and not too_cyclic,
                        f"{len(cyclic)}/{len(results)} outputs with tail period <= 2; distinct tokens per output "
                        f"{[r.distinct_tokens for r in results]}"))

    s_log: logs.LogFindings = stock["log"]
    p_log: logs.LogFindings = patched["log"]
    s_probe: logs.ProbeSummary = stock["probe"]
    p_probe: logs.ProbeSummary = patched["probe"]

    main_pid = (p_res or {}).get("pid")
    need = set(p_probe.scheduler_pids) | ({main_pid} if main_pid else set())
    missing = sorted(need - set(p_log.applied_pids))
    enough = len(set(p_log.applied_pids)) >= 2
    checks.append(Check("patched log: applied in every process", enough and not missing and bool(p_probe.scheduler_pids),
                        f"applied by pids {p_log.applied_pids}; main {main_pid}, schedulers {p_probe.scheduler_pids}"
                        + (f"; missing {missing}" if missing else "")))
    checks.append(Check("stock log: disabled", s_log.disabled_lines >= 1 and s_log.applied_lines == 0,
                        f"{s_log.disabled_lines} 'disabled' lines, {s_log.applied_lines} 'applied' lines"))
    for name, lf in (("patched", p_log), ("stock", s_log)):
        checks.append(Check(f"{name} log: no plugin warnings/errors", not lf.bad_lines,
                            "none" if not lf.bad_lines else " | ".join(lf.bad_lines[:5])))

    checks.append(Check("probe saw the scheduler processes", bool(s_probe.scheduler_pids) and bool(p_probe.scheduler_pids),
                        f"stock schedulers {s_probe.scheduler_pids}, patched schedulers {p_probe.scheduler_pids}; "
                        f"mechanisms {sorted(set(s_probe.mechanisms) | set(p_probe.mechanisms))}"))
    checks.append(Check(f"stock scheduler calls {child_env.PROBE_FUNC}", s_probe.scheduler_calls > 0,
                        f"{s_probe.scheduler_calls} calls"))
    checks.append(Check(f"patched run never calls {child_env.PROBE_FUNC}",
                        bool(p_probe.scheduler_pids) and p_probe.total_calls == 0,
                        f"{p_probe.total_calls} calls in all processes ({p_probe.scheduler_calls} in schedulers)"))
    if sync_probe:
        for name, run in (("stock", stock), ("patched", patched)):
            sy = run.get("sync") or {}
            n = int(sy.get("decode_iterations") or 0)
            checks.append(Check(f"sync probe: {name} decode iterations counted", n > 0 and bool(sy.get("wrapped")),
                                f"{n} decode iterations in pids {sy.get('pids')}; {len(sy.get('wrapped') or [])} "
                                f"entry points wrapped" + (f"; errors {sy['errors'][:2]}" if sy.get("errors") else "")))
    if expect_zero_seq_lens_syncs:
        sy = patched.get("sync") or {}
        dec = sy.get("decode") or {}
        n = int(sy.get("decode_iterations") or 0)
        seq = dec.get("seq_lens_syncs")
        sites = sorted({x["site"] for x in dec.get("sites", []) if x.get("seq_lens")})
        checks.append(Check("patched: 0 seq_lens syncs per decode iteration", n > 0 and seq == 0,
                            f"{seq} seq_lens syncs in {n} decode iterations" + (f" at {sites}" if sites else "")))
    return checks, results


def format_report(checks: Sequence[Check], results: Sequence[PromptResult], runs: dict[str, dict[str, Any]]) -> str:
    lines = ["per-prompt:"]
    for r in results:
        status = "PASS" if r.match else "FAIL"
        extra = "" if r.match else f" first mismatch at token {r.first_mismatch}"
        lines.append(
            f"  [{status}] prompt {r.index:2d}: len {r.prompt_len:4d}, new {r.max_new_tokens:3d}, "
            f"distinct {r.distinct_tokens:3d}, tail period {r.tail_period}{extra}"
        )
    mism = sum(not r.match for r in results)
    lines.append(f"mismatching prompts: {mism}/{len(results)}")
    for name, run in runs.items():
        res = run.get("result") or {}
        if res:
            lines.append(
                f"{name}: {res.get('tokens_per_s', 0):.1f} tok/s ({res.get('output_tokens')} tokens in "
                f"{res.get('elapsed_s', 0):.2f} s), mean accept length {res.get('mean_accept_length')}"
            )
        else:
            lines.append(f"{name}: no result (returncode {run.get('returncode')})")
    if any(run.get("sync") is not None for run in runs.values()):
        lines.extend(format_sync_report(runs))
        lines.append("(sync probe on: the tok/s above include the probe's overhead; time in a run without it)")
    lines.append("checks:")
    for c in checks:
        lines.append(f"  [{'PASS' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
    lines.append("SMOKE " + ("PASSED" if all(c.ok for c in checks) else "FAILED"))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- engine (worker side)


def engine_kwargs(target: str, draft: str, *, cuda_graph: bool, mem_fraction: float, seed: int,
                  cuda_graph_max_bs: int = 32, attention_backend: str = "triton",
                  piecewise_cuda_graph: bool = False) -> dict[str, Any]:
    """``sglang.Engine`` keyword arguments: STANDALONE spec v2, greedy-friendly. Backend
    ``default``: no attention backend and, with ``piecewise_cuda_graph``, nothing said about
    piecewise CUDA graph either (SGLang's default: on), i.e. what SGLang picks by itself."""
    pcg: bool | None = piecewise_cuda_graph
    if attention_backend == "default" and piecewise_cuda_graph:
        pcg = None
    return engine_config.spec_engine_kwargs(target, draft, algorithm="STANDALONE", backend=attention_backend,
                                 cuda_graph=cuda_graph, pcg=pcg, mem_fraction=mem_fraction, seed=seed,
                                 cuda_graph_max_bs=cuda_graph_max_bs, pcg_max_tokens=PCG_MAX_TOKENS)


#: Piecewise CUDA graph capture limit (tokens): small, for a short Engine start.
PCG_MAX_TOKENS = 512


def worker_main(spec_path: Path) -> int:
    """Runs inside the per-mode subprocess: start an Engine, run the workload, write JSON."""
    spec = json.loads(spec_path.read_text())
    prompts = [Prompt(p["input_ids"], p["max_new_tokens"]) for p in spec["prompts"]]
    import sglang  # noqa: WPS433 (imported here: the parent never imports SGLang)

    print(f"worker pid {os.getpid()} mode {os.environ.get(child_env.ENV_MODE)} "
          f"sglang {getattr(sglang, '__version__', '?')}", flush=True)
    print("engine kwargs: " + json.dumps(spec["engine_kwargs"]), flush=True)
    t0 = time.perf_counter()
    engine = sglang.Engine(**spec["engine_kwargs"])
    startup = time.perf_counter() - t0
    effective = engine_config.effective_config(engine)
    print("effective: " + json.dumps(effective), flush=True)
    try:
        def params(n: int) -> dict[str, Any]:
            return {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}

        # Warm-up (JIT, allocator): not part of the timing nor of the comparison.
        engine.generate(input_ids=[list(range(3, 19))], sampling_params=[params(16)])
        chunk = int(spec.get("batch_concurrency") or 0) or len(prompts)
        t1 = time.perf_counter()
        outs = []
        for lo in range(0, len(prompts), chunk):
            part = prompts[lo:lo + chunk]
            outs.extend(engine.generate(input_ids=[p.input_ids for p in part],
                                        sampling_params=[params(p.max_new_tokens) for p in part]))
        elapsed = time.perf_counter() - t1
        outputs = [list(map(int, o["output_ids"])) for o in outs]
        metas = [o.get("meta_info", {}) for o in outs]
        accept = [m.get("spec_accept_length") for m in metas if m.get("spec_accept_length") is not None]
        n_tok = sum(len(o) for o in outputs)
        result = {
            "pid": os.getpid(),
            "mode": os.environ.get(child_env.ENV_MODE),
            "sglang_version": getattr(sglang, "__version__", None),
            "startup_s": startup,
            "effective": effective,
            "elapsed_s": elapsed,
            "output_tokens": n_tok,
            "tokens_per_s": n_tok / elapsed if elapsed > 0 else 0.0,
            "mean_accept_length": (sum(accept) / len(accept)) if accept else None,
            "spec_verify_ct": [m.get("spec_verify_ct") for m in metas],
            "outputs": outputs,
        }
        # Let the probe's timer flush the scheduler's counts before shutdown SIGKILLs it.
        time.sleep(float(spec.get("probe_settle_s", 2.0)))
    finally:
        engine.shutdown()
    Path(spec["result_path"]).write_text(json.dumps(result))
    print(f"worker done: {n_tok} tokens in {elapsed:.2f} s", flush=True)
    return 0


# ----------------------------------------------------------------------------- orchestration (parent side)


def run_one(name: str, mode: str, spec: dict[str, Any], work: Path, log_dir: Path, timeout: float,
            log_config: Path | None, *, sync_probe: bool = False, seq_lens_sites: Sequence[str] | None = None,
            ports: port_blocks.PortBlock | None = None) -> dict[str, Any]:
    """One Engine run (``ports``: its own port block, in its kwargs and environment)."""
    probe_dir = work / f"probe-{name}"
    probe_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    if ports is not None:
        spec = dict(spec, engine_kwargs=port_blocks.with_ports(spec["engine_kwargs"], ports))
    print(f"== {name}: {child_env.ENV_MODE}={mode}, log {log_path}", flush=True)
    env = child_env.subprocess_env(mode, probe_dir, log_config, sync_probe=sync_probe, seq_lens_sites=seq_lens_sites,
                         ports=ports)
    rc, wall, result, text = launch.run_worker(Path(__file__).resolve(), spec, work, name, log_path, env, timeout)
    print(f"   {name}: returncode {rc}, {wall:.1f} s", flush=True)
    return {
        "mode": mode,
        "returncode": rc,
        "wall_s": wall,
        "result": result,
        "log": logs.scan_log(text),
        "probe": logs.summarize_probe(logs.read_probe_dir(probe_dir)),
        "sync": logs.summarize_sync(logs.read_sync_records(probe_dir)) if sync_probe else None,
        "log_path": str(log_path),
        "ports": ports.as_dict() if ports is not None else None,
        "error": launch.engine_error(rc, result, text),
        "log_tail": logs.log_tail(text),
        "config_label": engine_config.config_label((result or {}).get("effective"),
                                        requested_backend=spec["engine_kwargs"].get("attention_backend", "default"),
                                        log_text=text),
    }


def run_config(args: argparse.Namespace, seq_lens_sites: Sequence[str] | None) -> dict[str, Any]:
    """The knobs of this run, as recorded in the JSON (``config``)."""
    return {
        "attention_backend": args.attention_backend,
        "piecewise_cuda_graph": args.piecewise_cuda_graph,
        "fa3_needed": child_env.needs_fa3(args.attention_backend),
        "cuda_graph": args.cuda_graph,
        "sync_probe": args.sync_probe,
        "expect_zero_seq_lens_syncs": args.expect_zero_seq_lens_syncs,
        "seq_lens_sites": list(seq_lens_sites) if seq_lens_sites else None,
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "batch_concurrency": args.batch_concurrency,
        "seed": args.seed,
        "mem_fraction": args.mem_fraction,
        "patched_mode": args.patched_mode,
        "timeout_s": args.timeout,
    }


def resolve_models(args: argparse.Namespace, work: Path) -> tuple[str, str]:
    if args.target or args.draft:
        if not (args.target and args.draft):
            raise SystemExit("--target and --draft go together")
        return str(args.target), str(args.draft)
    if args.models:
        return str(args.models / "target"), str(args.models / "draft")
    dirs = model_factory.build_tiny_models(work / "models")
    return str(dirs["target"]), str(dirs["draft"])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Compare stock SGLang with sglang_futuremap_patch on a greedy STANDALONE spec-v2 workload.",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", type=Path, help="directory with target/ and draft/ (make_tiny_models.py --out)")
    p.add_argument("--target", type=Path, help="target model directory (with --draft)")
    p.add_argument("--draft", type=Path, help="draft model directory (with --target)")
    p.add_argument("--log-dir", type=Path, default=Path("gpu-smoke-logs"), help="where stock.log and patched.log go")
    p.add_argument("--out-json", type=Path, help="write the full result here")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture (non-piecewise) CUDA graphs (default: on)")
    p.add_argument("--attention-backend", default="triton", choices=["triton", "flashinfer", "fa3", "default"],
                   help="attention backend (default triton); default: none given, SGLang picks (FA3 on "
                        "H100/H200), with piecewise CUDA graph at SGLang's default (on) unless "
                        "--no-piecewise-cuda-graph; fa3 and default are skipped without FA3")
    p.add_argument("--piecewise-cuda-graph", action=argparse.BooleanOptionalAction, default=False,
                   help="piecewise CUDA graph (default: off, i.e. disable_piecewise_cuda_graph=True, except "
                        "with --attention-backend default; on costs ~1-2 min of Engine start; capture limit "
                        f"{PCG_MAX_TOKENS} tokens)")
    p.add_argument("--mem-fraction", type=float, default=0.3, help="mem_fraction_static (default 0.3)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="the same max_new_tokens for every prompt (default: 16..128, varied)")
    p.add_argument("--batch-concurrency", type=int, default=0,
                   help="send the prompts in generate() calls of this many, one after the other "
                        "(default 0: all in one call)")
    p.add_argument("--sync-probe", action="store_true",
                   help="count host syncs per decode iteration in the scheduler (slows it: not for timing)")
    p.add_argument("--expect-zero-seq-lens-syncs", action="store_true",
                   help="with --sync-probe: fail unless the patched run has 0 seq_lens syncs per decode iteration")
    p.add_argument("--seq-lens-sites", default=None,
                   help="comma-separated function names whose syncs count as seq_lens syncs (default: "
                        "resolve_seq_lens_cpu,filter_batch,merge_batch,prepare_for_decode,maybe_wait_verify_done)")
    p.add_argument("--seed", type=int, default=20251122, help="workload seed")
    p.add_argument("--patched-mode", default="strict", choices=["strict", "safe"],
                   help=f"{child_env.ENV_MODE} value for the patched run (default strict)")
    p.add_argument("--timeout", type=float, default=240.0,
                   help="seconds per run before it is killed (default 240: two runs fit a 10-minute budget)")
    p.add_argument("--max-cyclic-fraction", type=float, default=0.5,
                   help="fail when more than this fraction of outputs has tail period <= 2")
    p.add_argument("--no-log-config", action="store_true",
                   help="do not set SGLANG_LOGGING_CONFIG_PATH (SGLang lines then carry no level)")
    p.add_argument("--keep-work", action="store_true", help="keep the temporary work directory")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return p


def run_doc(status: str, config: dict[str, Any], environment: dict[str, Any], kw: dict[str, Any], *,
            checks: Sequence[Check] = (), results: Sequence[PromptResult] = (),
            runs: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON record of a smoke run (``status``: passed, failed, error or skipped)."""
    return {
        "passed": status == "passed",
        "status": status,
        **environment,
        "config": config,
        "checks": [asdict(c) for c in checks],
        "prompts": [asdict(r) for r in results],
        "engine_kwargs": kw,
        "runs": {
            name: {
                "mode": run["mode"],
                "returncode": run["returncode"],
                "wall_s": run["wall_s"],
                "log_path": run["log_path"],
                "ports": run.get("ports"),
                "error": run.get("error"),
                "log_tail": run.get("log_tail") if run.get("error") else None,
                "config_label": run.get("config_label"),
                "log": asdict(run["log"]),
                "probe": asdict(run["probe"]),
                "sync": run.get("sync"),
                "result": {k: v for k, v in (run["result"] or {}).items() if k != "outputs"} or None,
                "outputs": (run["result"] or {}).get("outputs"),
            }
            for name, run in (runs or {}).items()
        },
    }


def format_error_report(runs: dict[str, dict[str, Any]]) -> str:
    """An Engine did not start or did not finish: a harness error, not a comparison."""
    lines = ["harness error: an Engine did not run to the end (no token comparison made):"]
    for name, run in runs.items():
        if run.get("error"):
            lines.append(f"  {name}: {run['error']} ({run['wall_s']:.0f} s, log {run['log_path']}); last lines:")
            lines.extend("    | " + ln for ln in (run.get("log_tail") or "").splitlines())
        else:
            lines.append(f"  {name}: ran to the end")
    lines.append("SMOKE ERROR")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)
    if args.expect_zero_seq_lens_syncs and not args.sync_probe:
        parser.error("--expect-zero-seq-lens-syncs needs --sync-probe")
    if args.attention_backend == "default" and "--no-piecewise-cuda-graph" not in raw:
        args.piecewise_cuda_graph = True  # SGLang's default configuration: its PCG default too
    seq_lens_sites = [x.strip() for x in args.seq_lens_sites.split(",") if x.strip()] if args.seq_lens_sites else None

    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    args.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        fa3 = child_env.fa3_available()
        environment = {"fa3": fa3, "gpu": child_env.gpu_name()}
        print(child_env.fa3_line(fa3), flush=True)
        config = run_config(args, seq_lens_sites)
        print("config: " + json.dumps(config), flush=True)
        if config["fa3_needed"] and not fa3:
            print(f"SMOKE SKIPPED ({child_env.NO_FA3}): attention backend {args.attention_backend} needs FA3",
                  flush=True)
            if args.out_json:
                args.out_json.parent.mkdir(parents=True, exist_ok=True)
                args.out_json.write_text(json.dumps(run_doc("skipped", config, environment, {}), indent=1))
            return 0
        target, draft = resolve_models(args, work)
        vocab = model_factory.model_config(target).get("vocab_size", 4096)
        prompts = make_workload(args.num_prompts, vocab, args.seed, args.max_new_tokens)
        kw = engine_kwargs(target, draft, cuda_graph=args.cuda_graph, mem_fraction=args.mem_fraction, seed=0,
                           attention_backend=args.attention_backend, piecewise_cuda_graph=args.piecewise_cuda_graph)
        settle = float(os.environ.get("SMOKE_PROBE_SETTLE_S", "2.0"))  # the self-test shortens it
        spec = {"prompts": [asdict(p) for p in prompts], "engine_kwargs": kw, "probe_settle_s": settle,
                "batch_concurrency": args.batch_concurrency}
        log_config: Path | None = None
        if not args.no_log_config:
            log_config = logs.write_logging_config(work / "logging.json")

        ports = port_blocks.PortAllocator()
        runs: dict[str, dict[str, Any]] = {}
        for name, mode in RUNS:
            mode = args.patched_mode if name == "patched" else mode
            runs[name] = run_one(name, mode, spec, work, args.log_dir, args.timeout, log_config,
                                 sync_probe=args.sync_probe, seq_lens_sites=seq_lens_sites,
                                 ports=ports.allocate(name))
        for name, run in runs.items():
            print(f"{name}: {run['config_label']}", flush=True)

        checks: list[Check] = []
        results: list[PromptResult] = []
        if any(run["error"] for run in runs.values()):
            status = "error"
            print(format_error_report(runs), flush=True)
        else:
            checks, results = evaluate(prompts, runs["stock"], runs["patched"],
                                       max_cyclic_fraction=args.max_cyclic_fraction, sync_probe=args.sync_probe,
                                       expect_zero_seq_lens_syncs=args.expect_zero_seq_lens_syncs)
            print(format_report(checks, results, runs), flush=True)
            status = "passed" if all(c.ok for c in checks) else "failed"
        if args.out_json:
            args.out_json.parent.mkdir(parents=True, exist_ok=True)
            doc = run_doc(status, config, environment, kw, checks=checks, results=results, runs=runs)
            args.out_json.write_text(json.dumps(doc, indent=1))
            print(f"wrote {args.out_json}")
        return {"passed": 0, "failed": 1}.get(status, 2)
    finally:
        if args.keep_work:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    _rc = main()
    if "--worker" in sys.argv:
        launch.exit_worker(_rc)
    sys.exit(_rc)
