#!/usr/bin/env python3
"""Decode benchmark: stock SGLang 0.5.12.post1 vs. sglang_futuremap_patch (issue 6), and
upstream SGLang 0.5.13 as a third column.

STANDALONE speculative decoding, greedy, ``ignore_eos``, dummy weights (``load_format="dummy"``,
config.json only); the ``deepseek`` model instead runs DeepSeek MTP (``NEXTN``) with the model
factory's seeded weights. The speculative shape is ``--spec STEPS,TOPK,DRAFT_TOKENS`` (default
``3,1,4``: a chain, 3 steps, topk 1, 4 draft tokens, on spec v2 (the overlap scheduler) on every
side, as in every earlier record). Several shapes: repeat ``--spec`` or separate them with ``;``
(``--spec 3,4,16 --spec 3,1,4`` or ``--spec '3,4,16;3,1,4'``); each is a case of its own. An
EAGLE tree (topk > 1, e.g. ``3,4,16`` as SGLang's EAGLE3 docs, or ``5,4,8``, SGLang's auto
choice for Llama) runs on spec v1 in stock SGLang 0.5.12.post1 ("Spec v1 is used for
eagle/eagle3/standalone speculative decoding because spec v2 currently only supports topk = 1")
and on spec v2 with the plugin ("spec v2 runs the EAGLE tree (...) with the overlap
scheduler"; ``SGLANG_FUTUREMAP_TREE_SPEC_V2=0`` keeps spec v1). On Hopper with no attention
backend given, SGLang picks FlashInfer for a tree (FA3 for a chain): name the backend. On
FlashInfer the plugin keeps a tree on spec v1 unless ``SGLANG_FUTUREMAP_TREE_SPEC_V2=1``
(spec v2 decodes slower there); the bench sets it for FlashInfer trees (``tree_env``), so
those rows measure the spec-v2 tree a user can ask for.

Dummy weights make the draft accept (almost) every token: the accept length is near its
maximum (steps + 1; 4.0 for 3/1/4 and 3/4/16, 6.0 for 5/4/8), above what real weights give,
so every tok/s here is an upper bound, and the tree's gain over a chain is its upper bound too
where the tree is deeper (5/4/8 against 3/1/4: all its depth accepted). What the tree buys
with real weights, a longer accepted path when the draft is unsure of the next token, cannot
show: at equal depth (3/4/16 against 3/1/4) the chain already accepts everything, and the
tree/chain ratio is the cost of the wider verify alone.

Cases are (model, backend, spec; and prompt length):

* models:   ``tiny`` -- 4-layer Llama, hidden 512, vocab 4096; draft = target (accept 4.0);
            ``8b``   -- 8B-shaped Llama target (hidden 4096, inter 14336, 32 layers, 32/8
                        heads, vocab 32000) + a 1-layer draft of the same width;
            ``deepseek`` -- the tiny DeepSeek-V3 (MLA, hidden 256, 4 layers, the last MoE,
                        vocab 4096) of ``model_factory.make_deepseek_models``, seeded weights,
                        launched as DeepSeek users do (``engine_config.NEXTN_ALGORITHM``, no
                        draft path: SGLang drafts with the checkpoint's own NextN layer; the
                        draft accepts part of each chain). With ``--backend default`` SGLang
                        picks FA3 (MLA) with piecewise CUDA graph on Hopper, as in the e2e
                        ``mla`` group.
* backends: ``triton-nopcg`` -- triton attention, ``disable_piecewise_cuda_graph=True``;
            ``triton-pcg``   -- triton attention, piecewise CUDA graph on (SGLang's default
                                in 0.5.12.post1: ``disable_piecewise_cuda_graph=False``);
            ``flashinfer``   -- flashinfer attention, piecewise CUDA graph off;
            ``flashinfer-pcg`` -- flashinfer attention, piecewise CUDA graph on;
            ``default``      -- no attention backend and nothing about piecewise CUDA graph
                                passed: what SGLang picks (FA3 + PCG on H100/H200); the
                                backend it used is read from its server args / log;
            ``fa3-pcg``, ``fa3-nopcg`` -- FA3 with piecewise CUDA graph on / off.
            ``default`` and ``fa3-*`` need FA3 (``sgl_kernel.flash_ops``): without it their
            rows are skipped (no FA3), with a line. Their PCG capture limit is
            ``PCG_MAX_TOKENS`` unless ``--pcg-max-tokens``.
* prompt length: ``--prompt-len`` (default 64); a longer one makes a case of its own (e.g.
  ``8b/default prompt 8192``, the long-context row) and the model's context length grows to
  fit (``context_needed``).
* spec: ``--spec``; a case with other than 3/1/4 says so in its name (``8b/flashinfer spec
  3/4/16``); a 3/1/4 case keeps the name it always had, so old result files merge with new.

For every case the variants run alternately, each Engine in its own subprocess (its own
process group and its own ports), so no plugin state leaks: stock, patched, stock, patched,
... (``--reps``). ``stock`` = ``SGLANG_FUTUREMAP_PATCH=off``, ``patched`` = ``strict``;
``patched-mla-mirror`` = ``strict`` with ``SGLANG_FUTUREMAP_FA3_MLA=0`` (back-port 18 off: FA3
with MLA keeps the host mirror, as back-port 8 alone; meant for ``deepseek``; every other variant runs with that
variable removed); ``--variants stock,patched,upstream`` adds ``upstream``: stock SGLang of a
second bundle (0.5.13, which ships the publish/stash design), its site folder
(``--upstream-site``, default ``$SGLANG_UPSTREAM_SITE`` or ``/tmp/site312-0.5.13``) in place of
the current SGLang on ``PYTHONPATH``; where that folder holds no SGLang the variant is skipped with a line. Ratios
are each variant's against stock. Inside one Engine:
a warm-up per batch size, then for each batch size ``bs`` and each of ``--trials`` trials:

* a prefill-only request set (``bs`` fresh prompts, ``max_new_tokens=1``), timed: ``t1``;
* a decode request set (``bs`` fresh prompts, ``max_new_tokens=N``), timed: ``tN``.

Decode tok/s = ``bs * (N - 1) / (tN - t1)``; TPOT = ``(tN - t1) / (N - 1)``. Prompts have
identical length and fixed token ids (a seed per batch size, trial and kind), fresh for every
call so the radix cache never hits, and identical for stock and patched. Accept length =
sum(completion_tokens) / sum(spec_verify_ct) from ``meta_info``.

Extra passes, per case:

* ``--probe`` (default on): one Engine per variant, untimed, with a sync probe in the
  scheduler process (``scripts/gpu_probe/smoke_sync_probe.py``, i.e. ``gpu_smoke.py
  --sync-probe``, read as cumulative snapshots after each batch size; or, with
  ``--sync-probe-impl own``, the minimal one, ``scripts/gpu_probe/bench_sync_probe.py``):
  host time blocked in CUDA syncs (``Event/Stream.synchronize``,
  ``torch.cuda.synchronize``, ``Tensor.item/tolist/cpu/__bool__/__int__/__float__`` and
  ``Tensor.to``/``copy_`` to the host, on CUDA tensors), per decode iteration (an iteration
  = the time from one ``Scheduler.run_batch`` to the next, wrapped after the plugins load,
  counted when its batch is DECODE), per batch size and call site.
* ``--profile`` (optional): in the last timed repetition of each variant (after the timed
  work) a torch-profiler trace (``engine.start_profile``/``stop_profile``, GPU activity
  only) of one decode run per ``--profile-batch-sizes``; the GPU idle fraction is 1 - the
  union of kernel/memcpy/memset intervals over the decode window (the kernel span with its
  first ``--profile-trim-head`` and last ``--profile-trim-tail`` fractions cut, which drops
  the prefill). The same window gives GPU busy time per decode iteration and the kernels
  that take it (by name).
* ``--host-profile`` (optional): one Engine per variant, untimed, with a cProfile of the
  scheduler process (``scripts/gpu_probe/host_profile.py``) switched on for the decode
  request sets only, one profile per batch size: host time per decode iteration by function,
  garbage-collector time, and the functions whose time differs most between stock and
  patched. cProfile slows the Python loop, so this says where time goes, not how fast.

Every Engine's log is scanned for the plugin's startup lines (``applied`` in the scheduler
process for patched, ``disabled`` for stock, none and the site's SGLang version for
upstream; with a tree, patched must also log its "spec v2 runs the EAGLE tree" line and stock
must not); a run that fails the check is kept in the JSON but left out of the medians, with
the reason (``validity``). Every run records the speculative path it took (``spec_path``:
``spec v1`` / ``spec v2``, from SGLang's "Spec v1 is used" / "Spec v2 is enabled" line and the
plugin's tree line, else from its server args' ``disable_overlap_schedule``), shown beside
each variant in the summary with the accept length beside each tok/s. Where a result holds a
tree case and a chain case of the same model, backend and prompt length, the summary (and
``plot_bench.py``'s README) adds the patched tree against the patched chain per batch size
("spec v2 topk 4 vs spec v2 topk 1": tok/s ratio, both accept lengths). An
Engine that did not start or did not finish is a harness error (``error`` in its run, with
the end of its log), counted apart from those. Every case records what its Engines ran
(``summary.config``: backend, piecewise CUDA graph, page size, SGLang version, GPU per
variant) and the JSON whether FA3 was there (``fa3``). The JSON (``--out``) is rewritten after every Engine run,
so a run cut short by the device's time limit keeps what it has; ``--deadline-s`` stops
starting Engines that would not finish in time.

Merge and plot several result files with ``scripts/plot_bench.py``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_harness import child_env, engine_config, launch, logs, model_factory, port_blocks, records  # noqa: E402

SCHEMA = "bench_spec_v2/1"
DECODE_MODES = frozenset({"DECODE", "TARGET_VERIFY"})

SPEC = {"speculative_algorithm": "STANDALONE", **engine_config.SPEC_STEPS}
#: The three Engine kwargs ``--spec STEPS,TOPK,DRAFT_TOKENS`` sets, in that order.
SPEC_KEYS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
SpecShape = tuple[int, int, int]
#: The shape of every case without ``--spec`` (and of every case of an older result file): a
#: chain of 3 steps, topk 1, 4 draft tokens. Its cases keep names without a spec.
DEFAULT_SPEC: SpecShape = tuple(int(engine_config.SPEC_STEPS[k]) for k in SPEC_KEYS)  # type: ignore[assignment]
SPEC_V1, SPEC_V2 = "spec v1", "spec v2"
#: SGLang's own lines (server_args.py, 0.5.12.x and 0.5.13) for the path a speculative Engine
#: takes; the plugin's auto-tree WARNING starts with the same words as the first.
SPEC_V1_LINE = "Spec v1 is used for "
SPEC_V2_LINE = "Spec v2 is enabled by default for "
#: Dummy weights, in one line for the summary's and the README's header.
DUMMY_NOTE = ("dummy weights: the draft accepts (almost) every token, so the accept length is near its maximum "
              "(steps + 1) and every tok/s is an upper bound; a tree's gain over a chain is an upper bound where "
              "the tree is deeper, and at equal depth the tree/chain ratio shows the tree's cost only")

# (attention backend, piecewise CUDA graph on?); None: not passed, SGLang decides (on
# H100/H200: FA3, piecewise CUDA graph on).
BACKENDS: dict[str, tuple[str | None, bool | None]] = {
    "triton-nopcg": ("triton", False),
    "triton-pcg": ("triton", True),
    "flashinfer": ("flashinfer", False),
    "flashinfer-pcg": ("flashinfer", True),
    "default": (None, None),
    "fa3-pcg": ("fa3", True),
    "fa3-nopcg": ("fa3", False),
}
#: piecewise_cuda_graph_max_tokens when --pcg-max-tokens is not given: small captures for the
#: FA3 rows (a shorter torch.compile at start-up; decode never runs piecewise graphs). The
#: Triton/FlashInfer PCG rows keep SGLang's default, as in the earlier records.
PCG_MAX_TOKENS = {"default": 512, "fa3-pcg": 512}
MODELS = ("tiny", "8b", "deepseek")
MEM_FRACTION = {"tiny": 0.3, "8b": 0.55, "deepseek": 0.3}
#: The speculative algorithm of each model's Engines: ``deepseek`` runs DeepSeek MTP as the e2e
#: ``mla`` group does (no draft path: the target's own NextN layer).
ALGORITHMS = {"tiny": SPEC["speculative_algorithm"], "8b": SPEC["speculative_algorithm"],
              "deepseek": engine_config.NEXTN_ALGORITHM}
#: Seeded weights, in one line for the summary (models of ``model_factory.SEEDED_BENCH_MODELS``).
SEEDED_NOTE = ("seeded weights (deepseek): the NextN layer drafts as a real MTP head does, accepting part of "
               "each chain, so its accept length is below the maximum and its tok/s no upper bound")
# First guess of one Engine run's wall time (start + work + shutdown), seconds, before any
# run of the model with (or without) piecewise CUDA graph has been seen; used only by the
# --deadline-s logic.
FIRST_GUESS_S = {
    ("tiny", False): 75.0,
    ("tiny", True): 180.0,
    ("8b", False): 120.0,
    ("8b", True): 240.0,
    ("deepseek", False): 75.0,
    ("deepseek", True): 180.0,
}
#: The same with piecewise CUDA graph capped at 512 tokens or fewer (``PCG_MAX_TOKENS``, the
#: FA3 rows): a shorter torch.compile (seen on the H100: 8b 73-200 s, the first of a machine
#: the longest; deepseek not yet timed: a guess between tiny's and 8b's).
FIRST_GUESS_SMALL_PCG_S = {"tiny": 120.0, "8b": 180.0, "deepseek": 150.0}
#: Added to a chain's guess for a tree (its verify covers 8 or 16 tokens per request, and stock
#: runs it on spec v1, without the overlap scheduler).
TREE_EXTRA_S = {"tiny": 15.0, "8b": 40.0, "deepseek": 15.0}


def first_guess_s(model: str, backend: str, pcg_max_tokens: int | None = None) -> float:
    """A chain Engine's first guessed wall time (see ``FIRST_GUESS_S``)."""
    limit = pcg_max_tokens if pcg_max_tokens is not None else PCG_MAX_TOKENS.get(backend)
    if backend_pcg(backend) and limit is not None and limit <= 512:
        return FIRST_GUESS_SMALL_PCG_S[model]
    return FIRST_GUESS_S[(model, backend_pcg(backend))]


def backend_pcg(backend: str) -> bool:
    """Whether a backend runs piecewise CUDA graph (``default``: SGLang's default, on)."""
    return BACKENDS[backend][1] is not False


# ============================================================================ pure helpers


def parse_int_list(text: str) -> list[int]:
    out = []
    for part in str(text).replace(" ", "").split(","):
        if part:
            v = int(part)
            if v <= 0:
                raise ValueError(f"not a positive integer: {part}")
            out.append(v)
    if not out:
        raise ValueError("empty list")
    return out


def parse_name_list(text: str, allowed: Iterable[str]) -> list[str]:
    allowed = list(allowed)
    out = [p for p in str(text).replace(" ", "").split(",") if p]
    for p in out:
        if p not in allowed:
            raise ValueError(f"unknown name {p!r}; choose from {allowed}")
    return out


def parse_spec(text: str) -> SpecShape:
    """``STEPS,TOPK,DRAFT_TOKENS`` (or ``STEPS/TOPK/DRAFT_TOKENS``) -> (steps, topk, draft
    tokens); ValueError says what is wrong. A chain (topk 1) has steps + 1 draft tokens (SGLang
    would change any other number to that); a tree at most 1 + topk + (steps - 1) * topk^2, the
    root and the candidates its draft scores."""
    raw = str(text).strip()
    parts = raw.replace(" ", "").replace("/", ",").split(",")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"spec {raw!r}: want STEPS,TOPK,DRAFT_TOKENS, three positive integers (e.g. 3,4,16)")
    steps, topk, draft = (int(p) for p in parts)
    if min(steps, topk, draft) <= 0:
        raise ValueError(f"spec {raw!r}: STEPS, TOPK and DRAFT_TOKENS must be positive")
    if topk == 1 and draft != steps + 1:
        raise ValueError(f"spec {raw!r}: a chain (TOPK 1) of {steps} steps has DRAFT_TOKENS = STEPS + 1 = "
                         f"{steps + 1} (SGLang would change {draft} to that)")
    most = 1 + topk + (steps - 1) * topk * topk
    if topk > 1 and not 2 <= draft <= most:
        raise ValueError(f"spec {raw!r}: a tree of {steps} steps and TOPK {topk} has 2 to {most} DRAFT_TOKENS")
    return steps, topk, draft


def parse_specs(values: Iterable[str]) -> list[SpecShape]:
    """Every ``--spec`` value, each one shape or several separated by ``;``, in order, once each."""
    out: list[SpecShape] = []
    for value in values:
        for part in str(value).split(";"):
            if part.strip():
                shape = parse_spec(part)
                if shape not in out:
                    out.append(shape)
    if not out:
        raise ValueError("no spec: want STEPS,TOPK,DRAFT_TOKENS")
    return out


def spec_arg(text: str) -> list[SpecShape]:
    """``--spec``'s argparse type: a bad value is a usage error (argparse's message, no traceback)."""
    try:
        return parse_specs([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def spec_label(spec: Sequence[int]) -> str:
    """``3/4/16``: steps / topk / draft tokens."""
    return "/".join(str(int(x)) for x in spec)


def spec_kwargs(spec: Sequence[int]) -> dict[str, int]:
    return dict(zip(SPEC_KEYS, (int(x) for x in spec)))


def case_spec(case: dict[str, Any]) -> SpecShape:
    """A case's (steps, topk, draft tokens); a case of an older file, without one: the default."""
    spec = case.get("spec")
    return tuple(int(x) for x in spec) if spec else DEFAULT_SPEC  # type: ignore[return-value]


def is_tree(spec: Sequence[int]) -> bool:
    return int(spec[1]) > 1


def context_needed(prompt_len: int, *new_tokens: int) -> int:
    """``max_position_embeddings`` for prompts of ``prompt_len`` and the longest generation:
    4096 (the models' own) unless more is needed, then the next power of two."""
    need = prompt_len + max(new_tokens, default=0) + 64
    size = 4096
    while size < need:
        size *= 2
    return size


def engine_kwargs(model: str, backend: str, target: str, draft: str | None, batch_sizes: Sequence[int], *,
                  mem_fraction: float | None = None, pcg_max_tokens: int | None = None,
                  seed: int = 0, log_level: str = "info", spec: Sequence[int] = DEFAULT_SPEC,
                  graph_max_bs: int | None = None) -> dict[str, Any]:
    """``sglang.Engine`` kwargs of one case; ``spec``: (steps, topk, draft tokens). ``draft`` is
    not passed for a NEXTN model (SGLang takes the target's NextN layer); a model with seeded
    weights loads them (no ``load_format``), the others dummy weights. CUDA graphs are captured
    for exactly the batch sizes measured, or, with ``graph_max_bs``, for SGLang's own list up to
    it (``--cuda-graph-max-bs`` as a user passes it), so larger batches run eagerly."""
    attn, pcg = BACKENDS[backend]
    bss = sorted(set(int(b) for b in batch_sizes))
    if pcg_max_tokens is None:
        pcg_max_tokens = PCG_MAX_TOKENS.get(backend)
    algorithm = ALGORITHMS[model]
    weights = {} if model in model_factory.SEEDED_BENCH_MODELS else {"load_format": "dummy"}
    kw = engine_config.spec_engine_kwargs(
        target, None if algorithm == engine_config.NEXTN_ALGORITHM else draft, algorithm=algorithm, backend=attn,
        cuda_graph=True, pcg=pcg, mem_fraction=mem_fraction if mem_fraction is not None else MEM_FRACTION[model],
        seed=seed, cuda_graph_max_bs=graph_max_bs or max(bss),
        pcg_max_tokens=pcg_max_tokens if backend_pcg(backend) else None,
        log_level=log_level, **weights, **({} if graph_max_bs else {"cuda_graph_bs": bss}))
    kw.update(spec_kwargs(spec))
    return kw


def make_prompts(bs: int, prompt_len: int, vocab: int, *, tag: str, seed: int = 6) -> list[list[int]]:
    """``bs`` prompts of exactly ``prompt_len`` token ids in [3, vocab), fixed by (seed, tag)."""
    rng = random.Random(f"{seed}:{tag}:{bs}:{prompt_len}")
    return [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(bs)]


def accept_length(metas: Sequence[dict[str, Any]]) -> float | None:
    """sum(completion_tokens) / sum(spec_verify_ct); falls back to the mean of
    ``spec_accept_length`` when the counts are missing."""
    comp = [m.get("completion_tokens") for m in metas]
    ver = [m.get("spec_verify_ct") for m in metas]
    if metas and all(isinstance(c, (int, float)) for c in comp) and all(isinstance(v, (int, float)) for v in ver):
        if sum(ver) > 0:
            return float(sum(comp)) / float(sum(ver))
    acc = [m["spec_accept_length"] for m in metas if isinstance(m.get("spec_accept_length"), (int, float))]
    return sum(acc) / len(acc) if acc else None


def decode_metrics(bs: int, max_new_tokens: int, t_prefill_s: float, t_total_s: float,
                   metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One trial: decode tok/s and TPOT with the prefill-only time subtracted."""
    n_dec = max_new_tokens - 1
    dec_s = t_total_s - t_prefill_s
    ok = dec_s > 0 and n_dec > 0
    comp = [m.get("completion_tokens") for m in metas]
    return {
        "bs": bs,
        "max_new_tokens": max_new_tokens,
        "t_prefill_s": t_prefill_s,
        "t_total_s": t_total_s,
        "decode_s": dec_s,
        "decode_tok_s": (bs * n_dec / dec_s) if ok else None,
        "tpot_ms": (1000.0 * dec_s / n_dec) if ok else None,
        "e2e_tok_s": (bs * max_new_tokens / t_total_s) if t_total_s > 0 else None,
        "accept_length": accept_length(metas),
        "completion_tokens": comp,
        "short_outputs": sum(1 for c in comp if isinstance(c, int) and c != max_new_tokens),
        "cached_tokens": sum(int(m.get("cached_tokens") or 0) for m in metas),
    }


def spread(values: Iterable[float | None]) -> dict[str, Any] | None:
    vals = sorted(float(v) for v in values if v is not None)
    if not vals:
        return None
    return {
        "n": len(vals),
        "median": statistics.median(vals),
        "min": vals[0],
        "max": vals[-1],
        "q1": records.quantile(vals, 0.25),
        "q3": records.quantile(vals, 0.75),
        "values": vals,
    }


def _med(values: Iterable[float | None]) -> float | None:
    s = spread(values)
    return s["median"] if s else None


def run_bs_value(run: dict[str, Any], bs: int, key: str) -> float | None:
    """A run's value for one batch size: the median over its trials."""
    b = ((run.get("result") or {}).get("batches") or {}).get(str(bs)) or {}
    return _med(t.get(key) for t in b.get("trials", []))


DEFAULT_PROMPT_LEN = 64


def case_name(case: dict[str, Any]) -> str:
    """``8b/default``; ``8b/default prompt 8192`` for a case with other than the default
    prompt length (the long-context row); ``8b/flashinfer spec 3/4/16`` for a case with other
    than the default spec (3/1/4, whose cases keep the name they always had); ``8b/default
    graphs <= 8`` for a case whose CUDA graphs stop at batch size 8 (larger ones run eagerly)."""
    plen = case.get("prompt_len") or DEFAULT_PROMPT_LEN
    spec = case_spec(case)
    graph_max_bs = case.get("graph_max_bs")
    return (f"{case['model']}/{case['backend']}" + (f" prompt {plen}" if plen != DEFAULT_PROMPT_LEN else "")
            + (f" spec {spec_label(spec)}" if spec != DEFAULT_SPEC else "")
            + (f" graphs <= {graph_max_bs}" if graph_max_bs else ""))


def timed_runs(case: dict[str, Any], variant: str) -> list[dict[str, Any]]:
    return [r for r in case.get("runs", []) if r.get("variant") == variant and r.get("pass") == "timed"
            and r.get("valid") and r.get("result")]


def _rep_id(run: dict[str, Any]) -> tuple[Any, Any]:
    return (run.get("source"), run.get("rep"))


def summarize_probe_block(probe: dict[str, Any] | None, bs: int) -> dict[str, Any] | None:
    if not probe:
        return None
    return (probe.get("by_bs") or {}).get(str(bs))


def summarize_host_docs(docs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The scheduler's host profile (``host-<pid>.json``), per batch size and decode iteration."""
    hp = child_env.probe_module("host_profile")
    sched = [d for d in docs if str(d.get("proctitle") or "").startswith(logs.SCHEDULER_TITLE)] or list(docs)
    if not sched:
        return None
    doc = max(sched, key=lambda d: len(d.get("phases") or {}))
    by_bs: dict[str, Any] = {}
    for phase, rec in (doc.get("phases") or {}).items():
        if not phase.startswith("bs="):
            continue
        n = hp.decode_iterations(rec.get("iterations") or {})
        gc_stats = rec.get("gc") or {}
        by_bs[phase[3:]] = {
            "decode_iterations": n,
            "iterations": rec.get("iterations"),
            "stretches": rec.get("stretches"),
            "wall_us_per_iter": rec["wall_s"] * 1e6 / n if n else None,
            "gc": gc_stats,
            "gc_us_per_iter": sum(t for _c, t in gc_stats.values()) * 1e6 / n if n else None,
            "loop_us_per_iter": {k: v * 1e6 / n for k, v in (rec.get("loop_cumtime_s") or {}).items()} if n else {},
            "functions": hp.per_iteration(rec.get("functions") or [], n),
        }
    return {"pid": doc.get("pid"), "python": doc.get("python"), "errors": doc.get("errors"), "by_bs": by_bs}


def compare_host(stock: dict[str, Any] | None, patched: dict[str, Any] | None, bs: int,
                 top: int = 15) -> dict[str, Any] | None:
    """Stock vs. patched host profile at one batch size: per decode iteration."""
    s = ((stock or {}).get("by_bs") or {}).get(str(bs))
    p = ((patched or {}).get("by_bs") or {}).get(str(bs))
    if not s or not p:
        return None
    hp = child_env.probe_module("host_profile")
    loop = sorted(set(s.get("loop_us_per_iter") or {}) | set(p.get("loop_us_per_iter") or {}))
    return {
        "decode_iterations": {"stock": s["decode_iterations"], "patched": p["decode_iterations"]},
        "wall_us_per_iter": {"stock": s["wall_us_per_iter"], "patched": p["wall_us_per_iter"]},
        "gc_us_per_iter": {"stock": s["gc_us_per_iter"], "patched": p["gc_us_per_iter"]},
        "loop_us_per_iter": {k: {"stock": (s.get("loop_us_per_iter") or {}).get(k),
                                 "patched": (p.get("loop_us_per_iter") or {}).get(k)} for k in loop},
        "top_tottime_delta": hp.diff_rows(s.get("functions") or {}, p.get("functions") or {}, "tottime_us", top),
    }


def case_variants(case: dict[str, Any]) -> list[str]:
    """stock and patched, then upstream where the case has anything of it."""
    seen = {r.get("variant") for r in case.get("runs", [])} | set(case.get("probe") or {}) | set(
        case.get("profile") or {})
    return ["stock", "patched"] + [v for v in child_env.VARIANT_NAMES[2:] if v in seen]


def variant_spec_path(case: dict[str, Any], variant: str) -> str | None:
    """The spec path of a variant's runs (the valid ones where there are any): ``spec v1``,
    ``spec v2``, ``mixed (spec v1, spec v2)`` or None (unknown)."""
    runs = [r for r in case.get("runs", []) if r.get("variant") == variant]
    runs = [r for r in runs if r.get("valid")] or runs
    paths = sorted({p for p in (run_spec_path(r) for r in runs) if p})
    if not paths:
        return None
    return paths[0] if len(paths) == 1 else f"mixed ({', '.join(paths)})"


def case_config(case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant, what its Engines really ran: the attention backend (``default``: the one
    SGLang picked, from its server args or its log), piecewise CUDA graph, page size, SGLang
    version and GPU (the first run that reported them), and the spec path of its runs."""
    requested = BACKENDS.get(case.get("backend", ""), (None, None))[0] or "default"
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(case.get("runs", []), key=lambda r: not r.get("valid")):
        res = r.get("result") or {}
        v = r.get("variant")
        if v in out or not (res.get("effective") or res.get("sglang_version")):
            continue
        eff = dict(res.get("effective") or {})
        if not eff.get("attention_backend") and r.get("log_backend"):
            eff["attention_backend"] = r["log_backend"]
        out[v] = {"config": engine_config.config_label(eff, requested_backend=requested), "attention_backend":
                  eff.get("attention_backend"), "pcg": None if eff.get("disable_piecewise_cuda_graph") is None
                  else not eff["disable_piecewise_cuda_graph"], "page_size": eff.get("page_size"),
                  "sglang_version": res.get("sglang_version"), "gpu": res.get("gpu"),
                  "spec_path": variant_spec_path(case, v)}
    return out


def summarize_case(case: dict[str, Any]) -> dict[str, Any]:
    """Medians, spreads and ratios (each variant against stock) per batch size, from the raw
    runs of one case."""
    bss = sorted({int(b) for r in case.get("runs", []) for b in ((r.get("result") or {}).get("batches") or {})})
    variants = case_variants(case)
    timed = {v: timed_runs(case, v) for v in variants}
    out: dict[str, Any] = {"batch_sizes": bss, "variants": variants, "spec": list(case_spec(case)),
                           "spec_paths": {v: variant_spec_path(case, v) for v in variants},
                           "n_runs": {v: len(timed[v]) for v in variants},
                           "invalid_runs": sum(1 for r in case.get("runs", []) if not r.get("valid")),
                           "error_runs": sum(1 for r in case.get("runs", []) if r.get("error")),
                           "config": case_config(case), "by_bs": {}}
    probes, prof, host = case.get("probe") or {}, case.get("profile") or {}, case.get("host") or {}
    for bs in bss:
        row: dict[str, Any] = {}
        for name in variants:
            row[name] = {
                key: spread(run_bs_value(r, bs, key) for r in timed[name])
                for key in ("decode_tok_s", "tpot_ms", "accept_length", "e2e_tok_s")
            }
        s_med = (row["stock"]["decode_tok_s"] or {}).get("median")
        s_by = {_rep_id(r): run_bs_value(r, bs, "decode_tok_s") for r in timed["stock"]}
        row["ratios"], row["paired_ratios"] = {}, {}
        for name in variants[1:]:
            v_med = (row[name]["decode_tok_s"] or {}).get("median")
            row["ratios"][name] = (v_med / s_med) if s_med and v_med else None
            # Paired ratios: the k-th run against the k-th stock run of the same source (they
            # ran back to back, so slow drift of the machine cancels).
            pairs = []
            for r in timed[name]:
                st, val = s_by.get(_rep_id(r)), run_bs_value(r, bs, "decode_tok_s")
                if st and val:
                    pairs.append(val / st)
            row["paired_ratios"][name] = spread(pairs)
        row["ratio"], row["paired_ratio"] = row["ratios"]["patched"], row["paired_ratios"]["patched"]
        blocks = {v: summarize_probe_block(probes.get(v), bs) or {} for v in variants}
        for key in ("blocked_ms_per_iter", "verify_done_ms_per_iter", "syncs_per_iter", "seq_lens_syncs_per_iter"):
            row[key] = {v: blocks[v].get(key) for v in variants}
        bs_, bp_ = row["blocked_ms_per_iter"]["stock"], row["blocked_ms_per_iter"]["patched"]
        row["blocked_reduction"] = (1.0 - bp_ / bs_) if bs_ and bp_ is not None and bs_ > 0 else None
        for key, field in (("idle_fraction", "idle_fraction"), ("gpu_busy_us_per_iter", "busy_us_per_iter")):
            row[key] = {v: _med(p.get(field) for p in prof.get(v, []) if int(p.get("bs", -1)) == bs)
                        for v in variants}
        row["host"] = compare_host(host.get("stock"), host.get("patched"), bs)
        out["by_bs"][str(bs)] = row
    return out


TARGET_BS1 = 1.10
TARGET_ELSEWHERE = 0.99
TARGET_BLOCKED_REDUCTION = 0.90


def evaluate_targets(cases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goals: ratio >= 1.10 at bs 1 on triton-nopcg, >= 0.99 elsewhere,
    blocked host time per decode iteration down >= 90%. Chains only: the goals are about
    spec v2 with and without the plugin, and a tree case sets stock's spec v1 against it."""
    out = []
    for case in cases:
        if is_tree(case_spec(case)):
            continue
        summ = case.get("summary") or summarize_case(case)
        for bs_s, row in summ["by_bs"].items():
            bs = int(bs_s)
            name = f"{case_name(case)} bs {bs}"
            ratio = row.get("ratio")
            if case["backend"] == "triton-nopcg" and bs == 1:
                goal, label = TARGET_BS1, "decode tok/s ratio >= 1.10"
            else:
                goal, label = TARGET_ELSEWHERE, "decode tok/s ratio >= 0.99"
            out.append({"case": name, "target": label, "value": ratio,
                        "met": None if ratio is None else ratio >= goal})
            red = row.get("blocked_reduction")
            if red is not None or any(v is not None for v in row["blocked_ms_per_iter"].values()):
                out.append({"case": name, "target": "blocked ms/iter down >= 90%", "value": red,
                            "met": None if red is None else red >= TARGET_BLOCKED_REDUCTION})
    return out


def chain_case_for(tree: dict[str, Any], cases: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The chain (topk 1) a tree case is set against: same model, backend and prompt length;
    the chain of the tree's depth where there is one, else the default 3/1/4, else any."""
    plen = tree.get("prompt_len") or DEFAULT_PROMPT_LEN
    chains = [c for c in cases if not is_tree(case_spec(c)) and c["model"] == tree["model"]
              and c["backend"] == tree["backend"] and (c.get("prompt_len") or DEFAULT_PROMPT_LEN) == plen]
    steps = case_spec(tree)[0]
    for want in (lambda c: case_spec(c)[0] == steps, lambda c: case_spec(c) == DEFAULT_SPEC, lambda c: True):
        found = [c for c in chains if want(c)]
        if found:
            return found[0]
    return None


def tree_vs_chain(cases: Sequence[dict[str, Any]], variant: str = "patched") -> list[dict[str, Any]]:
    """Per tree case that has a chain to set against (``chain_case_for``): ``variant``'s decode
    tok/s of the tree over the chain's per batch size, with both accept lengths and spec paths
    (for patched: "spec v2 topk 4 vs spec v2 topk 1")."""
    out = []
    for tree in cases:
        if not is_tree(case_spec(tree)):
            continue
        chain = chain_case_for(tree, cases)
        if chain is None:
            continue
        ts, cs = (c.get("summary") or summarize_case(c) for c in (tree, chain))
        rows = []
        for bs in sorted(set(ts["by_bs"]) & set(cs["by_bs"]), key=int):
            t, c = ts["by_bs"][bs].get(variant) or {}, cs["by_bs"][bs].get(variant) or {}
            t_tok, c_tok = ((x.get("decode_tok_s") or {}).get("median") for x in (t, c))
            rows.append({"bs": int(bs), "tree_tok_s": t_tok, "chain_tok_s": c_tok,
                         "ratio": t_tok / c_tok if t_tok and c_tok else None,
                         "tree_accept": (t.get("accept_length") or {}).get("median"),
                         "chain_accept": (c.get("accept_length") or {}).get("median")})
        out.append({"variant": variant, "tree": case_name(tree), "chain": case_name(chain),
                    "tree_spec": list(case_spec(tree)), "chain_spec": list(case_spec(chain)),
                    "tree_path": (ts.get("spec_paths") or {}).get(variant),
                    "chain_path": (cs.get("spec_paths") or {}).get(variant), "rows": rows})
    return out


def tree_vs_chain_title(item: dict[str, Any]) -> str:
    """``spec v2 topk 4 vs spec v2 topk 1``: the two sides' paths and topks."""
    return (f"{item['tree_path'] or 'spec ?'} topk {item['tree_spec'][1]} vs "
            f"{item['chain_path'] or 'spec ?'} topk {item['chain_spec'][1]}")


def format_tree_vs_chain(items: Sequence[dict[str, Any]]) -> list[str]:
    """The summary's lines of ``tree_vs_chain``."""
    lines = []
    for it in items:
        lines.append(f"{tree_vs_chain_title(it)}, {it['variant']} (tree / chain): {it['tree']} vs {it['chain']} "
                     f"({spec_label(it['tree_spec'])} vs {spec_label(it['chain_spec'])})")
        for r in it["rows"]:
            lines.append(f"  bs {r['bs']:>3}: tree {_fmt(r['tree_tok_s'], 1)} tok/s (accept "
                         f"{_fmt(r['tree_accept'], 2)}), chain {_fmt(r['chain_tok_s'], 1)} tok/s (accept "
                         f"{_fmt(r['chain_accept'], 2)}), tree / chain {_fmt(r['ratio'], 3)}")
        if not it["rows"]:
            lines.append("  no batch size in both")
    return lines


# ---------------------------------------------------------------------------- traces


def union_length(intervals: Iterable[tuple[float, float]], lo: float | None = None, hi: float | None = None) -> float:
    """Length of the union of [start, end) intervals, clipped to [lo, hi] when given."""
    segs = []
    for a, b in intervals:
        if lo is not None:
            a = max(a, lo)
        if hi is not None:
            b = min(b, hi)
        if b > a:
            segs.append((a, b))
    segs.sort()
    total = 0.0
    cur_a = cur_b = None
    for a, b in segs:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_events(trace: dict[str, Any] | list[Any],
               cats: Sequence[str] = GPU_CATS) -> Iterable[tuple[dict[str, Any], float, float]]:
    """``(event, start_us, duration_us)`` of the complete events of a trace in ``cats``."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    wanted = {c.lower() for c in cats}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        if str(ev.get("cat", "")).lower() not in wanted:
            continue
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        yield ev, ts, max(dur, 0.0)


def gpu_intervals(trace: dict[str, Any] | list[Any], cats: Sequence[str] = GPU_CATS) -> list[tuple[float, float]]:
    return [(ts, ts + dur) for _ev, ts, dur in gpu_events(trace, cats)]


def idle_fraction(intervals: Sequence[tuple[float, float]], trim_head: float = 0.15,
                  trim_tail: float = 0.05) -> dict[str, Any] | None:
    """GPU idle fraction over the decode window: the span from the first GPU interval's start
    to the last one's end, less ``trim_head`` at the front (prefill) and ``trim_tail`` at the
    end (last iteration, result copies)."""
    if not intervals:
        return None
    t0 = min(a for a, _ in intervals)
    t1 = max(b for _, b in intervals)
    span = t1 - t0
    if span <= 0:
        return None
    lo, hi = t0 + trim_head * span, t1 - trim_tail * span
    if hi <= lo:
        return None
    busy = union_length(intervals, lo, hi)
    n_in = sum(1 for a, b in intervals if b > lo and a < hi)
    return {"idle_fraction": 1.0 - busy / (hi - lo), "window_us": hi - lo, "busy_us": busy,
            "span_us": span, "events_in_window": n_in, "events": len(intervals), "window": [lo, hi]}


def kernel_name(name: str, width: int = 90) -> str:
    """A C++ kernel's name without its template and argument lists, cut to ``width``;
    other names (``Memset (Device)``, ``Memcpy DtoH ...``) as they are."""
    base = name
    if "::" in name or "<" in name:
        base = name.replace("(anonymous namespace)::", "")
        base = base.removeprefix("void ").split("(", 1)[0].split("<", 1)[0].strip()
    return (base or name)[:width]


def kernel_table(trace: dict[str, Any] | list[Any], lo: float, hi: float, top: int = 15,
                 cats: Sequence[str] = GPU_CATS) -> list[dict[str, Any]]:
    """GPU events that start in [lo, hi), by name: count and total duration, largest first."""
    agg: dict[str, list[float]] = {}
    for ev, ts, dur in gpu_events(trace, cats):
        if not lo <= ts < hi:
            continue
        e = agg.setdefault(kernel_name(str(ev.get("name", "?"))), [0, 0.0])
        e[0] += 1
        e[1] += dur
    rows = [{"name": k, "count": int(v[0]), "total_us": v[1]} for k, v in agg.items()]
    rows.sort(key=lambda r: r["total_us"], reverse=True)
    return rows[:top]


def iterations_in_window(metas: Sequence[dict[str, Any]], rec: dict[str, Any]) -> float | None:
    """Decode iterations inside a profile's window, estimated: the batch's verify count
    (``spec_verify_ct``, the same for every request of one batch) times window / span."""
    ver = [m.get("spec_verify_ct") for m in metas if isinstance(m.get("spec_verify_ct"), (int, float))]
    if not ver or not rec.get("span_us"):
        return None
    return max(ver) * rec["window_us"] / rec["span_us"]


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


# ---------------------------------------------------------------------------- logs & probes


def scan_plugin_log(text: str) -> dict[str, Any]:
    f = logs.scan_log(text)
    return {"applied_pids": f.applied_pids, "applied_lines": f.applied_lines, "disabled_lines": f.disabled_lines,
            "bad_lines": f.bad_lines[:10], "tree_v2_lines": f.tree_v2_lines,
            "stock_tree_spec_v1_lines": f.stock_tree_spec_v1_lines}


def _log_message(line: str, width: int = 200) -> str:
    """A log line without its ``[time LEVEL pid=N]`` prefix, cut to ``width``."""
    line = line.strip()
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    return line[:width]


def spec_path_from_log(text: str) -> tuple[str | None, str]:
    """(``spec v1`` / ``spec v2`` / None, why) from an Engine's log. The plugin's tree line
    wins wherever it is: the plugin lets SGLang's own method decide first (for a tree: spec v1,
    and SGLang's line says so), then sends the tree to spec v2 and says that. Otherwise the
    last of SGLang's "Spec v1 is used" / "Spec v2 is enabled" lines (the plugin's auto-tree
    WARNING is one of the first kind)."""
    mark = logs.TREE_V2_MARK
    path, why = None, "no spec v1 / spec v2 line in the log"
    for line in text.splitlines():
        if mark in line:
            return SPEC_V2, f"log: {_log_message(line)}"
        if SPEC_V1_LINE in line:
            path, why = SPEC_V1, f"log: {_log_message(line)}"
        elif SPEC_V2_LINE in line:
            path, why = SPEC_V2, f"log: {_log_message(line)}"
    return path, why


def spec_path_from_args(effective: dict[str, Any] | None) -> str | None:
    """The path from resolved server args: spec v2 is speculative decoding with the overlap
    scheduler on (``disable_overlap_schedule`` False), spec v1 with it off."""
    off = (effective or {}).get("disable_overlap_schedule")
    return None if off is None else (SPEC_V1 if off else SPEC_V2)


def classify_spec_path(log_text: str, effective: dict[str, Any] | None) -> tuple[str | None, str]:
    """A run's spec path and where it comes from: its log, else its server args; a
    disagreement between the two is said in the second item."""
    path, why = spec_path_from_log(log_text)
    by_args = spec_path_from_args(effective)
    if path is None:
        return by_args, (f"server args: disable_overlap_schedule {(effective or {}).get('disable_overlap_schedule')}"
                         if by_args else why)
    if by_args is not None and by_args != path:
        why += f"; but its server args say {by_args}"
    return path, why


def run_spec_path(run: dict[str, Any]) -> str | None:
    """The spec path a run recorded; for a run of an older file (none recorded), its server args'."""
    return run.get("spec_path") or spec_path_from_args((run.get("result") or {}).get("effective"))


def run_validity(variant: str, log: dict[str, Any], scheduler_pids: Sequence[int], main_pid: int | None, *,
                 version: str | None = None, expected_version: str | None = None,
                 tree: bool = False) -> tuple[bool, str]:
    """Was the plugin really off (stock) / on in every process (patched) / absent, with the
    SGLang of its own site (upstream)? With a ``tree`` (topk > 1), patched must also have said
    that spec v2 runs it, and stock must not have (the plugin is off there)."""
    tree_lines = int(log.get("tree_v2_lines") or 0)
    if variant == "upstream":
        ok = log["applied_lines"] == 0 and not log["bad_lines"] and version is not None and version == expected_version
        return ok, (f"SGLang {version} (site has {expected_version}); {log['applied_lines']} applied lines"
                    + (f"; bad lines: {log['bad_lines'][:2]}" if log["bad_lines"] else ""))
    if variant == "stock":
        ok = log["applied_lines"] == 0 and log["disabled_lines"] >= 1 and not log["bad_lines"]
        detail = f"{log['disabled_lines']} disabled / {log['applied_lines']} applied lines"
        if tree and tree_lines:
            ok = False
            detail += f"; {tree_lines} '{logs.TREE_V2_MARK}' lines with the plugin off"
        return ok, detail
    need = set(scheduler_pids) | ({main_pid} if main_pid else set())
    missing = sorted(need - set(log["applied_pids"]))
    ok = bool(scheduler_pids) and not missing and not log["bad_lines"] and log["applied_lines"] > 0
    detail = f"applied by {log['applied_pids']}; schedulers {list(scheduler_pids)}"
    if missing:
        detail += f"; missing {missing}"
    if log["bad_lines"]:
        detail += f"; bad lines: {log['bad_lines'][:2]}"
    if tree:
        ok = ok and tree_lines >= 1
        detail += (f"; {tree_lines} '{logs.TREE_V2_MARK}' lines" if tree_lines
                   else f"; no '{logs.TREE_V2_MARK}' line: the tree did not run on spec v2")
    return ok, detail


def _site_is_verify_done(site: str) -> bool:
    return "verify_done" in site


def summarize_sync_records(records: Iterable[dict[str, Any]], top: int = 6) -> dict[str, Any] | None:
    """Per batch size: blocked host ms and syncs per decode iteration in the scheduler,
    plus the call sites that block longest. Records come from the sync probe (one per
    process, ``sync-<pid>.json``)."""
    recs = [r for r in records if r.get("iterations")]
    if not recs:
        return None
    by_bs: dict[str, Any] = {}
    phases = sorted({p for r in recs for p in r["iterations"]})
    for phase in phases:
        if not phase.startswith("bs="):
            continue
        iters = 0
        blocked_s = 0.0
        calls = 0
        vd_s = 0.0
        sites: dict[str, list[float]] = {}
        for r in recs:
            for mode, n in (r["iterations"].get(phase) or {}).items():
                if mode in DECODE_MODES:
                    iters += int(n)
            for mode, per_site in (r.get("blocked", {}).get(phase) or {}).items():
                if mode not in DECODE_MODES:
                    continue
                for site, (c, s) in per_site.items():
                    calls += int(c)
                    blocked_s += float(s)
                    if _site_is_verify_done(site):
                        vd_s += float(s)
                    e = sites.setdefault(site, [0, 0.0])
                    e[0] += int(c)
                    e[1] += float(s)
        if iters == 0:
            continue
        top_sites = sorted(sites.items(), key=lambda kv: -kv[1][1])[:top]
        by_bs[phase[3:]] = {
            "decode_iters": iters,
            "blocked_ms_per_iter": 1000.0 * blocked_s / iters,
            "verify_done_ms_per_iter": 1000.0 * vd_s / iters,
            "syncs_per_iter": calls / iters,
            "top_sites": [{"site": s, "calls_per_iter": c / iters, "ms_per_iter": 1000.0 * t / iters}
                          for s, (c, t) in top_sites],
        }
    return {"pids": sorted(r.get("pid") for r in recs), "by_bs": by_bs}


def _smoke_flat(rec: dict[str, Any]) -> tuple[dict[str, int], dict[tuple[str, str], list[Any]]]:
    iters = {str(k): int(v) for k, v in (rec.get("iterations") or {}).items()}
    syncs: dict[tuple[str, str], list[Any]] = {}
    for e in rec.get("syncs") or []:
        key = (str(e.get("mode")), f"{e.get('op')} @ {e.get('site')}")
        slot = syncs.setdefault(key, [0, 0.0, bool(e.get("seq_lens"))])
        slot[0] += int(e.get("count", 0))
        slot[1] += float(e.get("blocked_s", 0.0))
    return iters, syncs


def summarize_sync_snapshots(snapshots: Sequence[dict[str, Any]], top: int = 6) -> dict[str, Any] | None:
    """Per batch size, from cumulative snapshots of ``scripts/gpu_probe/smoke_sync_probe.py``
    (``sync-<pid>.json`` read by the worker after the warm-up and after each batch size):
    the difference between consecutive snapshots is one phase's syncs and iterations."""
    if not snapshots:
        return None
    by_bs: dict[str, Any] = {}
    prev: dict[str, tuple[dict[str, int], dict[tuple[str, str], list[Any]]]] = {}
    pids: set[Any] = set()
    for snap in snapshots:
        cur = {pid: _smoke_flat(rec) for pid, rec in (snap.get("records") or {}).items()}
        phase = str(snap.get("phase", ""))
        if phase.startswith("bs="):
            iters = 0
            calls = 0
            blocked = vd = sl = 0.0
            sl_calls = 0
            sites: dict[str, list[float]] = {}
            for pid, (it, sy) in cur.items():
                p_it, p_sy = prev.get(pid, ({}, {}))
                iters += sum(n - p_it.get(m, 0) for m, n in it.items() if m in DECODE_MODES)
                for (mode, site), (c, b, is_sl) in sy.items():
                    if mode not in DECODE_MODES:
                        continue
                    pc, pb = (p_sy.get((mode, site)) or [0, 0.0])[:2]
                    dc, db = c - pc, b - pb
                    if dc <= 0:
                        continue
                    calls += dc
                    blocked += db
                    if _site_is_verify_done(site):
                        vd += db
                    if is_sl:
                        sl += db
                        sl_calls += dc
                    e = sites.setdefault(site, [0, 0.0])
                    e[0] += dc
                    e[1] += db
            if iters > 0:
                pids.update(cur)
                top_sites = sorted(sites.items(), key=lambda kv: -kv[1][1])[:top]
                by_bs[phase[3:]] = {
                    "decode_iters": iters,
                    "blocked_ms_per_iter": 1000.0 * blocked / iters,
                    "verify_done_ms_per_iter": 1000.0 * vd / iters,
                    "seq_lens_ms_per_iter": 1000.0 * sl / iters,
                    "seq_lens_syncs_per_iter": sl_calls / iters,
                    "syncs_per_iter": calls / iters,
                    "top_sites": [{"site": st, "calls_per_iter": c / iters, "ms_per_iter": 1000.0 * t / iters}
                                  for st, (c, t) in top_sites],
                }
        prev = cur
    return {"impl": "smoke", "pids": sorted(pids, key=str), "by_bs": by_bs} if by_bs else None


# ---------------------------------------------------------------------------- merging


def recorded_command(argv: Sequence[str]) -> str:
    """The command line as the record keeps it: no interpreter or machine folder in it (the
    result file keeps its name under ``OUT``; the log and upstream folders become their role)."""
    args = [f"OUT/{Path(a).name}" if i and argv[i - 1] == "--out" else a for i, a in enumerate(argv)]
    return records.portable_command("scripts/bench_spec_v2.py", args,
                               {"--log-dir": "LOGS", "--upstream-site": "UPSTREAM_SITE"})


def new_doc(command: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "command": command,
        "config": config,
        "env": {},
        "cases": [],
    }


def get_case(doc: dict[str, Any], model: str, backend: str, prompt_len: int | None = None,
             spec: Sequence[int] | None = None, graph_max_bs: int | None = None) -> dict[str, Any]:
    """The case of (model, backend, prompt length, spec, CUDA-graph limit) in ``doc``, made when
    missing (a case without a spec, from an older file, is the default spec's; one without a
    limit captured every batch size it measured)."""
    plen = prompt_len or DEFAULT_PROMPT_LEN
    shape = tuple(int(x) for x in spec) if spec else DEFAULT_SPEC
    for c in doc["cases"]:
        if (c["model"] == model and c["backend"] == backend and (c.get("prompt_len") or DEFAULT_PROMPT_LEN) == plen
                and case_spec(c) == shape and c.get("graph_max_bs") == graph_max_bs):
            return c
    c = {"model": model, "backend": backend, "prompt_len": plen, "spec": list(shape), "engine_kwargs": None,
         "runs": [], "probe": {}, "profile": {}, "host": {}, "skipped": []}
    if graph_max_bs:
        c["graph_max_bs"] = graph_max_bs
    doc["cases"].append(c)
    return c


def merge_docs(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge result files: cases by (model, backend, prompt length, spec); runs concatenated,
    tagged with their source; probe results from the later file win; profiles concatenated."""
    merged: dict[str, Any] = {"schema": SCHEMA, "sources": [], "cases": []}
    for i, doc in enumerate(docs):
        src = {k: doc.get(k) for k in ("date", "host", "command", "config", "env", "fa3")}
        src["index"] = i
        src["path"] = doc.get("_path")
        merged["sources"].append(src)
        for case in doc.get("cases", []):
            m = get_case(merged, case["model"], case["backend"], case.get("prompt_len"), case_spec(case),
                         case.get("graph_max_bs"))
            m["skipped"] = m.get("skipped", []) + list(case.get("skipped") or [])
            if m["engine_kwargs"] is None:
                m["engine_kwargs"] = case.get("engine_kwargs")
            for r in case.get("runs", []):
                r = dict(r)
                r["source"] = i
                m["runs"].append(r)
            for v, p in (case.get("probe") or {}).items():
                if p:
                    m["probe"][v] = p
            for v, h in (case.get("host") or {}).items():
                if h:
                    m.setdefault("host", {})[v] = h
            for v, profs in (case.get("profile") or {}).items():
                m["profile"].setdefault(v, []).extend(profs)
    for case in merged["cases"]:
        case["summary"] = summarize_case(case)
    return merged


def load_docs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    docs = []
    for p in paths:
        d = json.loads(Path(p).read_text())
        if d.get("schema") != SCHEMA:
            raise ValueError(f"{p}: schema {d.get('schema')!r}, want {SCHEMA!r}")
        d["_path"] = str(p)
        docs.append(d)
    return docs


# ============================================================================ CPU pinning


def parse_cpu_list(text: str) -> set[int]:
    """``/sys`` CPU list syntax (``0-3,8,10-11``) -> set of CPU ids."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return out


def core_siblings(cpu: int, sys_root: str = "/sys/devices/system/cpu") -> set[int]:
    """The logical CPUs that share ``cpu``'s physical core (itself included)."""
    try:
        with open(f"{sys_root}/cpu{cpu}/topology/thread_siblings_list") as f:
            return parse_cpu_list(f.read()) | {cpu}
    except (OSError, ValueError):
        return {cpu}


def plan_pinning(allowed: Sequence[int], sys_root: str = "/sys/devices/system/cpu") -> tuple[int, list[int]] | None:
    """(CPU for the scheduler's main thread, CPUs for everything else): the last allowed CPU,
    and the allowed CPUs outside its physical core. None with fewer than 4 CPUs left over."""
    cpus = sorted(allowed)
    if not cpus:
        return None
    core = cpus[-1]
    rest = [c for c in cpus if c not in core_siblings(core, sys_root)]
    return (core, rest) if len(rest) >= 3 else None


def pin_engine_cpus(scheduler_title: str = logs.SCHEDULER_TITLE) -> dict[str, Any]:
    """Give the scheduler's main thread a physical core of its own; every other thread of the
    Engine (this process, the detokenizer, the scheduler's helper threads) the other cores.
    The tiny model's decode loop is bound by that one thread, and where the OS happens to put
    it (alone on a core, or next to the tokenizer's busy loop) otherwise moves whole Engines'
    throughput by a third."""
    try:
        import psutil

        me = psutil.Process()
        kids = me.children(recursive=True)
        sched = [p for p in kids if scheduler_title in " ".join(p.cmdline())]
        plan = plan_pinning(sorted(os.sched_getaffinity(0)))
        if len(sched) != 1 or plan is None:
            return {"pinned": False, "why": f"{len(sched)} scheduler processes, plan {plan}"}
        core, rest = plan
        sp = sched[0]
        for proc in [me, *kids]:
            for t in proc.threads():
                os.sched_setaffinity(t.id, {core} if (proc.pid == sp.pid and t.id == sp.pid) else rest)
        return {"pinned": True, "scheduler_pid": sp.pid, "scheduler_cpu": core, "others": rest,
                "processes": 1 + len(kids)}
    except Exception as exc:  # the run goes on unpinned, and says so
        return {"pinned": False, "why": repr(exc)}


# ============================================================================ worker


def _set_phase(probe_dir: str | None, phase: str, settle_s: float = 0.25) -> None:
    if not probe_dir:
        return
    phase_file = child_env.probe_module("bench_sync_probe").PHASE_FILE
    child_env.probe_module("host_profile").set_phase(probe_dir, phase, phase_file)
    time.sleep(settle_s)  # the probe polls every 50 ms; the scheduler is idle meanwhile


def worker_main(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    import sglang
    import torch

    print(f"worker pid {os.getpid()} {child_env.ENV_MODE}={os.environ.get(child_env.ENV_MODE)} pass {spec['pass']} "
          f"sglang {getattr(sglang, '__version__', '?')}", flush=True)
    print("engine kwargs: " + json.dumps(spec["engine_kwargs"]), flush=True)
    vocab = spec["vocab"]
    plen = spec["prompt_len"]
    n_new = spec["max_new_tokens"]
    probe_dir = os.environ.get(BENCH_SYNC_DIR_ENV) if spec["pass"] == "probe" else None
    host_dir = os.environ.get("SMOKE_PROBE_DIR") if spec["pass"] == "host" else None
    hp = child_env.probe_module("host_profile") if host_dir else None

    def host_phase(phase: str) -> None:
        """Host pass: the scheduler's profiler follows this (it polls every 10 ms)."""
        if hp is not None:
            hp.set_phase(host_dir, phase)
            time.sleep(0.05)
    snap_dir = spec.get("sync_snapshot_dir") if spec["pass"] == "probe" else None
    result: dict[str, Any] = {
        "pid": os.getpid(),
        "mode": os.environ.get(child_env.ENV_MODE),
        "sglang_version": getattr(sglang, "__version__", None),
        "torch_version": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "batches": {},
        "profile": [],
        "errors": [],
        "warnings": [],
        "sync_snapshots": [],
    }

    def snapshot(phase: str) -> None:
        """Cumulative sync-probe records (scripts/gpu_probe/smoke_sync_probe.py) after a phase."""
        if not snap_dir:
            return
        time.sleep(float(spec.get("snapshot_wait_s", 0.4)))  # > 2 flush intervals of the probe
        recs = {}
        for d in logs.read_sync_records(Path(snap_dir)):
            if d.get("kind") == "sync-probe" and d.get("installed"):
                recs[str(d.get("pid"))] = {k: d.get(k) for k in ("pid", "proctitle", "iterations", "syncs", "errors")}
        result["sync_snapshots"].append({"phase": phase, "records": recs})

    def params(n: int) -> dict[str, Any]:
        return {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}

    def gen(prompts: list[list[int]], n: int) -> tuple[float, list[dict[str, Any]]]:
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=[params(n) for _ in prompts])
        dt = time.perf_counter() - t0
        if isinstance(outs, dict):
            outs = [outs]
        return dt, [dict(o.get("meta_info", {}), completion_tokens=o.get("meta_info", {}).get(
            "completion_tokens", len(o.get("output_ids", [])))) for o in outs]

    t0 = time.perf_counter()
    engine = sglang.Engine(**spec["engine_kwargs"])
    result["startup_s"] = time.perf_counter() - t0
    if spec.get("pin_cpus"):
        result["pinning"] = pin_engine_cpus()
        print(f"pinning: {result['pinning']}", flush=True)
    try:
        result["effective"] = engine_config.effective_config(engine)
        if "error" in result["effective"]:  # informative only
            result["warnings"].append(f"get_server_info: {result['effective']['error']}")
        bss = spec["batch_sizes"]
        # Warm-up: every batch size once (CUDA graphs, Triton JIT, allocator).
        _set_phase(probe_dir, "warmup", spec["phase_settle_s"])
        tw = time.perf_counter()
        for bs in bss:
            gen(make_prompts(bs, plen, vocab, tag="warm1"), 1)
            gen(make_prompts(bs, plen, vocab, tag="warm"), spec["warmup_new_tokens"])
        result["warmup_s"] = time.perf_counter() - tw
        snapshot("warmup")
        for bs in bss:
            _set_phase(probe_dir, f"bs={bs}", spec["phase_settle_s"])
            trials = []
            for t in range(spec["trials"]):
                t1, m1 = gen(make_prompts(bs, plen, vocab, tag=f"prefill-{t}"), 1)
                host_phase(f"bs={bs}")
                tn, mn = gen(make_prompts(bs, plen, vocab, tag=f"decode-{t}"), n_new)
                host_phase("idle")
                trials.append(decode_metrics(bs, n_new, t1, tn, mn))
            _set_phase(probe_dir, "idle", spec["phase_settle_s"])
            snapshot(f"bs={bs}")
            result["batches"][str(bs)] = {"trials": trials}
            tok = _med(x["decode_tok_s"] for x in trials)
            print(f"bs {bs}: decode {tok if tok is None else round(tok, 1)} tok/s, "
                  f"accept {_med(x['accept_length'] for x in trials)}", flush=True)
        if spec.get("profile_batch_sizes"):
            result["profile"] = _profile(engine, spec, gen)
        time.sleep(float(spec.get("settle_s", 1.5)))  # let the probes flush before shutdown
    except Exception as exc:
        import traceback

        traceback.print_exc()
        result["errors"].append(repr(exc))
    finally:
        engine.shutdown()
    Path(spec["result_path"]).write_text(json.dumps(result))
    print("worker done", flush=True)
    return 0 if not result["errors"] or result["batches"] else 1


def _profile(engine: Any, spec: dict[str, Any], gen) -> list[dict[str, Any]]:
    out = []
    root = Path(spec["profile_dir"])
    for bs in spec["profile_batch_sizes"]:
        d = root / f"bs{bs}"
        d.mkdir(parents=True, exist_ok=True)
        rec: dict[str, Any] = {"bs": bs, "max_new_tokens": spec["profile_new_tokens"]}
        try:
            engine.start_profile(output_dir=str(d), activities=["GPU"], with_stack=False, record_shapes=False)
            dt, metas = gen(make_prompts(bs, spec["prompt_len"], spec["vocab"], tag="profile"),
                            spec["profile_new_tokens"])
            engine.stop_profile()
            rec["generate_s"] = dt
            traces = sorted(d.glob("*.trace.json*"))
            deadline = time.time() + 30
            while not traces and time.time() < deadline:
                time.sleep(0.5)
                traces = sorted(d.glob("*.trace.json*"))
            if not traces:
                rec["error"] = "no trace file"
            else:
                trace = load_trace(traces[-1])
                ivs = gpu_intervals(trace)
                res = idle_fraction(ivs, spec["profile_trim_head"], spec["profile_trim_tail"])
                rec.update(res or {"error": "no GPU events in trace"})
                rec["trace_bytes"] = traces[-1].stat().st_size
                if res:
                    rec["kernels"] = kernel_table(trace, *res["window"])
                    iters = iterations_in_window(metas, res)
                    rec["iterations_in_window"] = iters
                    if iters:
                        rec["busy_us_per_iter"] = res["busy_us"] / iters
                        rec["window_us_per_iter"] = res["window_us"] / iters
        except Exception as exc:
            rec["error"] = repr(exc)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        print(f"profile bs {bs}: {rec}", flush=True)
        out.append(rec)
    return out


# ============================================================================ parent


#: Where ``gpu_probe/bench_sync_probe.py`` writes (and reads the worker's phase), in a probed Engine.
BENCH_SYNC_DIR_ENV = "BENCH_SYNC_PROBE_DIR"


def resolve_sync_impl(choice: str) -> str:
    """``smoke`` (and ``auto``): scripts/gpu_probe/smoke_sync_probe.py (gpu_smoke.py
    --sync-probe); ``own``: the minimal probe, scripts/gpu_probe/bench_sync_probe.py."""
    return "smoke" if choice == "auto" else choice


def worker_env(mode: str, probe_dir: Path, log_config: Path, sync_dir: Path | None, *, smoke_sync: bool = False,
               site: str | None = None, ports: port_blocks.PortBlock | None = None) -> dict[str, str]:
    """An Engine worker's environment: gpu_probe's sitecustomize (plugin log lines, call counts
    and, with ``smoke_sync``, host syncs; with ``sync_dir``, the benchmark's own sync probe
    writing there); ``site``: the SGLang of another bundle (upstream) in place of the current one."""
    env = child_env.subprocess_env(mode, probe_dir, log_config, sync_probe=smoke_sync, site=site, ports=ports)
    if smoke_sync:
        env["SMOKE_PROBE_FLUSH_S"] = "0.1"
    env.pop("BENCH_SYNC_PROBE", None)
    env.pop(BENCH_SYNC_DIR_ENV, None)
    if sync_dir is not None:
        env["BENCH_SYNC_PROBE"] = "1"
        env[BENCH_SYNC_DIR_ENV] = str(sync_dir)
    return env


class Deadline:
    def __init__(self, seconds: float | None) -> None:
        self.t0 = time.monotonic()
        self.seconds = seconds

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (time.monotonic() - self.t0)

    def allows(self, needed_s: float) -> bool:
        return self.left() >= needed_s


def tree_env(case: dict[str, Any]) -> dict[str, str]:
    """A FlashInfer tree: the plugin keeps it on spec v1 (stock's path) unless
    ``SGLANG_FUTUREMAP_TREE_SPEC_V2=1``; the bench measures the spec-v2 tree it then runs
    (stock and upstream ignore the variable). Nothing for chains and other backends."""
    _steps, topk, _tokens = case_spec(case)
    return {"SGLANG_FUTUREMAP_TREE_SPEC_V2": "1"} if topk > 1 and case["backend"] == "flashinfer" else {}


def run_engine(*, case: dict[str, Any], variant: child_env.Variant, pass_: str, rep: int, spec: dict[str, Any],
               work: Path, log_dir: Path, timeout: float, log_config: Path,
               sync_impl: str = "own", ports: port_blocks.PortAllocator | None = None) -> dict[str, Any]:
    plen = case.get("prompt_len") or DEFAULT_PROMPT_LEN
    shape = case_spec(case)
    tag = (f"{case['model']}-{case['backend']}" + (f"-p{plen}" if plen != DEFAULT_PROMPT_LEN else "")
           + (f"-s{'_'.join(map(str, shape))}" if shape != DEFAULT_SPEC else "") + f"-{pass_}-{variant.name}-r{rep}")
    rdir = work / tag
    rdir.mkdir(parents=True, exist_ok=True)
    probe_dir = rdir / "probe"
    smoke_sync = pass_ == "probe" and sync_impl == "smoke"
    sync_dir = rdir / "sync" if pass_ == "probe" and not smoke_sync else None
    block = (ports or port_blocks.PortAllocator()).allocate(tag)
    spec = dict(spec, profile_dir=str(rdir / "prof"),
                engine_kwargs=port_blocks.with_ports(spec["engine_kwargs"], block))
    if pass_ != "timed" or rep != spec.get("profile_rep"):
        spec["profile_batch_sizes"] = []
    spec["pass"] = pass_
    if smoke_sync:
        spec["sync_snapshot_dir"] = str(probe_dir)
    log_path = log_dir / f"{tag}.log"
    env = worker_env(variant.mode, probe_dir, log_config, sync_dir,
                         smoke_sync=smoke_sync, site=variant.site, ports=block)
    if spec["profile_batch_sizes"]:
        env["SGLANG_TORCH_PROFILER_DIR"] = spec["profile_dir"]
    if pass_ == "host":
        env["SMOKE_HOST_PROFILE"] = "1"
    env.update(tree_env(case))
    env = child_env.with_variant_env(env, variant)
    print(f"== {tag}: {child_env.ENV_MODE}={variant.mode}" + variant_switches(variant)
          + (f", SGLang of {variant.site}" if variant.site else "")
          + f" (timeout {timeout:.0f} s, ports {block.base}+) log {log_path}", flush=True)
    rc, wall, result, text = launch.run_worker(Path(__file__).resolve(), spec, work, tag, log_path, env, timeout,
                                           spec_path=rdir / "spec.json", result_path=rdir / "result.json")
    time.sleep(spec.get("gpu_release_s", 1.0))  # let the driver release the GPU memory of the killed children
    probe = logs.summarize_probe(logs.read_probe_dir(probe_dir))
    log_info = scan_plugin_log(text)
    res = result or {}
    valid, detail = run_validity(variant.name, log_info, probe.scheduler_pids, res.get("pid"),
                                 version=res.get("sglang_version"),
                                 expected_version=child_env.site_sglang_version(variant.site) if variant.site else None,
                                 tree=is_tree(shape))
    spec_path, spec_path_from = classify_spec_path(text, res.get("effective"))
    error = launch.engine_error(rc, result, text)
    if error is None and res.get("errors") and not res.get("batches"):
        error = "; ".join(res["errors"])[:500]
    valid = valid and error is None and bool(res.get("batches")) and not res.get("errors")
    run = {
        "variant": variant.name,
        "mode": variant.mode,
        "site": variant.site,
        "pass": pass_,
        "rep": rep,
        "returncode": rc,
        "wall_s": wall,
        "valid": valid,
        "validity": detail,
        "error": error,
        "log_tail": logs.log_tail(text) if error else None,
        "log": log_path.name,
        "log_backend": logs.backend_from_log(text),
        "spec": list(shape),
        "spec_path": spec_path,
        "spec_path_from": spec_path_from,
        "ports": block.as_dict(),
        "plugin_log": log_info,
        "scheduler_pids": probe.scheduler_pids,
        "verify_done_calls": probe.scheduler_calls,
        "result": result,
    }
    if smoke_sync:
        run["sync"] = summarize_sync_snapshots(res.get("sync_snapshots") or [])
    elif sync_dir is not None:
        run["sync"] = summarize_sync_records(
            r for r in logs.read_sync_records(sync_dir)
            if not r.get("proctitle") or str(r.get("proctitle")).startswith(logs.SCHEDULER_TITLE)
        )
    if pass_ == "host":
        run["host"] = summarize_host_docs(child_env.probe_module("host_profile").read_profiles(str(probe_dir)))
    print(f"   {tag}: rc {rc}, {wall:.1f} s, {spec_path or 'spec path ?'}, valid {valid} ({detail})"
          + (f"; HARNESS ERROR: {error}" if error else ""), flush=True)
    return run


def write_doc(doc: dict[str, Any], path: Path) -> None:
    for case in doc["cases"]:
        case["summary"] = summarize_case(case)
    doc["targets"] = evaluate_targets(doc["cases"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def config_lines(summary: dict[str, Any], indent: str = "  ") -> list[str]:
    """One line per variant: what its Engines ran (backend, PCG, page size, SGLang, GPU, spec path)."""
    return [f"{indent}{v}: {c['config']}; SGLang {c.get('sglang_version') or '?'}; {c.get('gpu') or '?'}; "
            f"{c.get('spec_path') or 'spec path ?'}" for v, c in (summary.get("config") or {}).items()]


def variant_cell(row: dict[str, Any], variant: str, path: str | None) -> str:
    """``123.4 tok/s (accept 3.99, spec v2)``: a variant's median decode tok/s at one batch
    size, with its accept length and spec path."""
    v = row.get(variant) or {}
    tok, acc = ((v.get(k) or {}).get("median") for k in ("decode_tok_s", "accept_length"))
    return f"{_fmt(tok, 1)} tok/s (accept {_fmt(acc, 2)}, {path or 'spec path ?'})"


def format_summary(doc: dict[str, Any]) -> str:
    lines = [child_env.fa3_line(bool(doc.get("fa3")))] if "fa3" in doc else []
    lines += weights_notes(c["model"] for c in doc["cases"])
    for case in doc["cases"]:
        s = case.get("summary") or summarize_case(case)
        variants = s.get("variants") or ["stock", "patched"]
        paths = s.get("spec_paths") or {}
        shape = case_spec(case)
        lines.append(f"{case_name(case)}" + (f" (spec {spec_label(shape)})" if shape == DEFAULT_SPEC else "")
                     + ": runs " + ", ".join(f"{v} {s['n_runs'].get(v, 0)}" for v in variants)
                     + f", invalid {s['invalid_runs']}, harness errors {s.get('error_runs', 0)}")
        lines += config_lines(s)
        for r in case.get("runs", []):
            if r.get("error"):
                lines.append(f"  HARNESS ERROR {r['pass']} {r['variant']} rep {r['rep']}: {r['error']}; last lines:")
                lines.extend("    | " + ln for ln in (r.get("log_tail") or "").splitlines()[-12:])
            elif not r.get("valid"):
                lines.append(f"  left out: {r.get('pass')} {r.get('variant')} rep {r.get('rep')}: {r.get('validity')}")
        lines += [f"  skipped: {m}" for m in case.get("skipped") or []]
        for bs, row in s["by_bs"].items():
            b = row["blocked_ms_per_iter"]
            others = "".join(f", {v} {variant_cell(row, v, paths.get(v))[:-1]}; x{_fmt(row['ratios'].get(v), 3)})"
                             for v in variants[2:])
            lines.append(
                f"  bs {bs:>3}: stock {variant_cell(row, 'stock', paths.get('stock'))}, "
                f"patched {variant_cell(row, 'patched', paths.get('patched'))}, "
                f"ratio {_fmt(row['ratio'], 3)}{others}; "
                f"blocked ms/iter {' -> '.join(_fmt(b.get(v), 3) for v in variants)}; "
                f"idle {' -> '.join(_fmt(row['idle_fraction'].get(v), 3) for v in variants)}")
            busy = row.get("gpu_busy_us_per_iter") or {}
            if busy.get("stock") is not None or busy.get("patched") is not None:
                lines.append(f"         GPU busy us/iter {_fmt(busy.get('stock'), 1)} -> {_fmt(busy.get('patched'), 1)}")
            h = row.get("host")
            if h:
                w, g = h["wall_us_per_iter"], h["gc_us_per_iter"]
                lines.append(
                    f"         host (cProfile) us/iter {_fmt(w['stock'], 1)} -> {_fmt(w['patched'], 1)} "
                    f"(decode iterations {h['decode_iterations']['stock']} / {h['decode_iterations']['patched']}; "
                    f"gc {_fmt(g['stock'], 1)} -> {_fmt(g['patched'], 1)}); loop: " + ", ".join(
                        f"{k} {_fmt(v['stock'], 0)}->{_fmt(v['patched'], 0)}" for k, v in h["loop_us_per_iter"].items()))
                for d in h["top_tottime_delta"][:8]:
                    lines.append(f"           {d['delta']:+8.1f} us  {d['func']} ({_fmt(d['stock'], 1)} -> "
                                 f"{_fmt(d['patched'], 1)}; calls {d['calls_stock']:.2f} -> {d['calls_patched']:.2f})")
                    side = "callers_patched" if d["delta"] > 0 else "callers_stock"
                    if d.get(side):
                        lines.append(f"                       {side.split('_')[1]} callers: " + "; ".join(
                            f"{c[0]} {_fmt(c[2], 1)} us" for c in d[side][:2]))
    lines += format_tree_vs_chain(tree_vs_chain(doc["cases"]))
    for t in doc.get("targets", []):
        met = {True: "MET", False: "NOT MET", None: "n/a"}[t["met"]]
        lines.append(f"[{met}] {t['case']}: {t['target']} (value {_fmt(t['value'], 3)})")
    return "\n".join(lines)


def weights_notes(models: Iterable[str]) -> list[str]:
    """The summary's lines on weights: ``DUMMY_NOTE`` where a model has dummy weights (or no case
    says), ``SEEDED_NOTE`` where one has the factory's seeded weights."""
    models = set(models)
    seeded = models & set(model_factory.SEEDED_BENCH_MODELS)
    return ([DUMMY_NOTE] if models - seeded or not models else []) + ([SEEDED_NOTE] if seeded else [])


def variant_switches(variant: child_env.Variant) -> str:
    """``, SGLANG_FUTUREMAP_FA3_MLA=0``: the switches a variant sets, for the log lines."""
    return "".join(f", {k}={v}" for k, v in variant.env)


def _fmt(v: Any, nd: int) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Decode benchmark of stock SGLang vs. sglang_futuremap_patch (STANDALONE speculative decoding).",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", "--models", dest="models", default="tiny",
                   help=f"comma-separated models from {list(MODELS)} (default tiny)")
    p.add_argument("--backend", "--backends", dest="backends", default="triton-nopcg",
                   help=f"comma-separated backends from {list(BACKENDS)} (default triton-nopcg)")
    p.add_argument("--spec", action="append", type=spec_arg, metavar="STEPS,TOPK,DRAFT_TOKENS",
                   help=f"speculative num_steps, eagle_topk, num_draft_tokens of every Engine (default "
                        f"{','.join(map(str, DEFAULT_SPEC))}: a chain); a tree, e.g. 3,4,16 or 5,4,8, runs on spec v1 "
                        "in stock SGLang and on spec v2 with the plugin. Several: repeat --spec or separate them "
                        "with ';' (--spec '3,4,16;3,1,4'); each is a case of its own")
    p.add_argument("--reps", type=int, default=3, help="timed Engine runs per variant, alternating (default 3; 0: none)")
    p.add_argument("--batch-sizes", default="1,4,16,48", help="default 1,4,16,48")
    p.add_argument("--max-new-tokens", type=int, default=256, help="decode length per request (default 256)")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    p.add_argument("--trials", type=int, default=3,
                   help="timed trials per batch size inside one Engine; the run's value is their median (default 3)")
    p.add_argument("--warmup-new-tokens", type=int, default=32)
    p.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                   help="one extra untimed Engine per variant with the sync probe (default on)")
    p.add_argument("--probe-trials", type=int, default=1, help="trials per batch size in the probed pass (default 1)")
    p.add_argument("--sync-probe-impl", choices=["auto", "smoke", "own"], default="auto",
                   help="auto (default) and smoke: scripts/gpu_probe/smoke_sync_probe.py; own: the minimal "
                        "probe, scripts/gpu_probe/bench_sync_probe.py")
    p.add_argument("--profile", action="store_true",
                   help="GPU idle fraction from a torch-profiler trace, in the last timed run of each variant")
    p.add_argument("--pin-cpus", action="store_true",
                   help="pin the scheduler's main thread to a physical core of its own, the rest of the Engine elsewhere")
    p.add_argument("--host-profile", action="store_true",
                   help="one more Engine per variant with a cProfile of the scheduler loop per batch size")
    p.add_argument("--host-trials", type=int, default=2, help="decode request sets per batch size in the host pass")
    p.add_argument("--profile-batch-sizes", default="1,16", help="batch sizes profiled with --profile (default 1,16)")
    p.add_argument("--profile-new-tokens", type=int, default=128)
    p.add_argument("--profile-trim-head", type=float, default=0.15)
    p.add_argument("--profile-trim-tail", type=float, default=0.05)
    p.add_argument("--mem-fraction", type=float, default=None,
                   help=f"mem_fraction_static (default per model: {MEM_FRACTION})")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, metavar="N",
                   help="capture CUDA graphs up to batch size N only (SGLang's own list), so the "
                        "larger batch sizes measured decode eagerly; the case is named '... graphs <= N' "
                        "(default: a graph for every batch size measured)")
    p.add_argument("--pcg-max-tokens", type=int, default=None,
                   help="piecewise_cuda_graph_max_tokens for backends with piecewise CUDA graph (default: "
                        f"{PCG_MAX_TOKENS}, SGLang's for the others); smaller starts faster")
    p.add_argument("--variants", default="stock,patched",
                   help="comma-separated from stock, patched, patched-mla-mirror, upstream (default stock,patched); "
                        "patched-mla-mirror = patched with SGLANG_FUTUREMAP_FA3_MLA=0 (back-port 18 off); upstream = stock "
                        "SGLang of a second bundle (e.g. 0.5.13), whose site folder replaces the current SGLang's "
                        "on PYTHONPATH; skipped with a line when that folder holds no SGLang")
    p.add_argument("--upstream-site", default=None,
                   help=f"site folder of the upstream variant (default ${child_env.UPSTREAM_SITE_ENV}, else "
                        f"{child_env.DEFAULT_UPSTREAM_SITE}: where .gpu-0513/activate.sh unpacks)")
    p.add_argument("--out", type=Path, required=False, default=Path("bench.json"), help="result JSON (default bench.json)")
    p.add_argument("--log-dir", type=Path, default=None, help="Engine logs (default: <out dir>/bench-logs)")
    p.add_argument("--run-timeout", type=float, default=420.0, help="seconds per Engine run before it is killed")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="do not start an Engine run that is not expected to end within this many seconds of the start")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the Engine kwargs; start nothing")
    p.add_argument("--keep-work", action="store_true")
    p.add_argument("--settle-s", type=float, default=1.5, help=argparse.SUPPRESS)  # probes flush before shutdown
    p.add_argument("--phase-settle-s", type=float, default=0.25, help=argparse.SUPPRESS)
    p.add_argument("--gpu-release-s", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return p


def plan_runs(reps: int, probe: bool, profile: bool, host: bool = False,
              variants: Sequence[child_env.Variant] = (child_env.STOCK, child_env.PATCHED)
              ) -> list[tuple[str, int, list[child_env.Variant]]]:
    """[(pass, rep, [variant, ...])]: Engines that belong together, run one after the other."""
    out: list[tuple[str, int, list[child_env.Variant]]] = [("timed", r, list(variants)) for r in range(reps)]
    if profile and reps == 0:
        out.append(("timed", 0, list(variants)))  # a profile-only pass; timed values come along
    if host:
        out.append(("host", 0, list(variants)))
    if probe:
        out.append(("probe", 0, list(variants)))
    return out


def backend_needs_fa3(backend: str) -> bool:
    return child_env.needs_fa3(BACKENDS[backend][0])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)
    models = parse_name_list(args.models, MODELS)
    backends = parse_name_list(args.backends, BACKENDS)
    bss = parse_int_list(args.batch_sizes)
    prof_bss = parse_int_list(args.profile_batch_sizes) if args.profile else []
    variants = child_env.make_variants(parse_name_list(args.variants, child_env.VARIANT_NAMES),
                                       upstream=args.upstream_site)
    specs = list(dict.fromkeys(x for group in (args.spec or [[DEFAULT_SPEC]]) for x in group))
    if args.max_new_tokens < 2:
        raise SystemExit("--max-new-tokens must be >= 2")
    command = recorded_command(sys.argv[1:] if argv is None else argv)
    config = {
        "models": models, "backends": backends, "reps": args.reps, "batch_sizes": bss,
        "max_new_tokens": args.max_new_tokens, "prompt_len": args.prompt_len, "trials": args.trials,
        "warmup_new_tokens": args.warmup_new_tokens, "probe": args.probe, "probe_trials": args.probe_trials,
        "profile": args.profile, "profile_batch_sizes": prof_bss, "profile_new_tokens": args.profile_new_tokens,
        "profile_trim": [args.profile_trim_head, args.profile_trim_tail],
        "spec": dict(SPEC, speculative_algorithm=ALGORITHMS[models[0]], **spec_kwargs(specs[0])),
        "specs": [list(x) for x in specs], "algorithms": {m: ALGORITHMS[m] for m in models},
        "host_profile": args.host_profile, "host_trials": args.host_trials, "pin_cpus": args.pin_cpus,
        "variants": {v.name: v.mode for v in variants},
        "variant_env": {v.name: dict(v.env) for v in variants if v.env},
        "upstream_site": next((v.site for v in variants if v.site), None),
        "pcg_max_tokens": args.pcg_max_tokens, "mem_fraction": args.mem_fraction,
        "cuda_graph_max_bs": args.cuda_graph_max_bs,
    }
    max_positions = context_needed(args.prompt_len, args.max_new_tokens, args.warmup_new_tokens,
                                   args.profile_new_tokens)
    plan = plan_runs(args.reps, args.probe, args.profile, args.host_profile, variants)
    if args.dry_run:
        for m in models:
            for b in backends:
                for shape in specs:
                    kw = engine_kwargs(m, b, f"<{m}/target>", f"<{m}/draft>", bss, mem_fraction=args.mem_fraction,
                                       pcg_max_tokens=args.pcg_max_tokens, spec=shape,
                                       graph_max_bs=args.cuda_graph_max_bs)
                    name = case_name({"model": m, "backend": b, "prompt_len": args.prompt_len, "spec": shape,
                                      "graph_max_bs": args.cuda_graph_max_bs})
                    expect = ("tree, expected: stock spec v1, patched and upstream spec v2" if is_tree(shape)
                              else "chain, expected: spec v2")
                    print(f"{name}: spec {spec_label(shape)} (steps/topk/draft tokens; {expect}), "
                          f"context {max_positions}: " + json.dumps(kw))
                    for pass_, rep, group in plan:
                        print(f"   {pass_} rep {rep}: " + ", ".join(
                            f"{v.name} ({child_env.ENV_MODE}={v.mode}" + variant_switches(v)
                            + (f", SGLang of {v.site}" if v.site else "") + ")"
                            for v in group))
        return 0

    out = args.out.resolve()
    log_dir = (args.log_dir or out.parent / "bench-logs").resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-spec-v2-"))
    deadline = Deadline(args.deadline_s)
    doc = new_doc(command, config)
    doc["env"] = {"python": sys.version.split()[0], "sglang_versions": {}}
    rc = 0

    def skip(msg: str, case: dict[str, Any] | None = None) -> None:
        print("!! " + msg, flush=True)
        doc.setdefault("skipped", []).append(msg)
        if case is not None:
            case.setdefault("skipped", []).append(msg)

    try:
        log_config = logs.write_logging_config(work / "logging.json")
        sync_impl = resolve_sync_impl(args.sync_probe_impl)
        doc["config"]["sync_probe_impl"] = sync_impl
        ports = port_blocks.PortAllocator()
        for v in list(variants):
            why = child_env.upstream_missing(v)
            if why:
                skip(f"{v.name} variant skipped: {why}")
                variants.remove(v)
        fa3 = {v.name: child_env.fa3_available(worker_env(v.mode, work / "fa3-check", log_config, None, site=v.site))
               for v in variants}
        doc["fa3"] = fa3.get("stock", fa3.get("patched", child_env.fa3_available()))
        doc["env"]["fa3_by_variant"] = fa3
        doc["env"]["upstream_version"] = next((child_env.site_sglang_version(v.site) for v in variants if v.site), None)
        print(child_env.fa3_line(doc["fa3"]) + "".join(f"; {k}: {'FA3' if x else 'no FA3'}" for k, x in fa3.items()),
              flush=True)
        walls: dict[tuple[str, bool], float] = {}
        for model in models:
            target, draft = model_factory.write_model_dirs(model, work / "models", max_positions)
            vocab = model_factory.model_config(target)["vocab_size"]
            for backend, shape in ((b, x) for b in backends for x in specs):
                case = get_case(doc, model, backend, args.prompt_len, shape, args.cuda_graph_max_bs)
                kw = engine_kwargs(model, backend, target, draft, bss, mem_fraction=args.mem_fraction,
                                   pcg_max_tokens=args.pcg_max_tokens, spec=shape,
                                   graph_max_bs=args.cuda_graph_max_bs)
                case["engine_kwargs"] = kw
                case["max_positions"] = max_positions
                runnable = [v for v in variants if not backend_needs_fa3(backend) or fa3[v.name]]
                if len(runnable) < len(variants):
                    lacking = ", ".join(v.name for v in variants if v not in runnable)
                    skip(f"skipped ({child_env.NO_FA3}): {case_name(case)} for {lacking}: backend {backend} needs FA3 "
                         f"(sgl_kernel.flash_ops does not import in that environment)", case)
                if not runnable:
                    continue
                base_spec = {
                    "engine_kwargs": kw, "vocab": vocab, "prompt_len": args.prompt_len,
                    "max_new_tokens": args.max_new_tokens, "batch_sizes": bss,
                    "warmup_new_tokens": args.warmup_new_tokens, "profile_batch_sizes": prof_bss,
                    "profile_new_tokens": args.profile_new_tokens, "profile_trim_head": args.profile_trim_head,
                    "profile_trim_tail": args.profile_trim_tail,
                    "profile_rep": max(args.reps - 1, 0),
                    "settle_s": args.settle_s, "phase_settle_s": args.phase_settle_s, "pin_cpus": args.pin_cpus,
                    "gpu_release_s": args.gpu_release_s,
                }
                # A chain Engine's wall time so far (by model and PCG: the next case of the
                # chunk starts from it, not from the first guess), plus a tree's extra.
                key = (model, backend_pcg(backend))
                extra = TREE_EXTRA_S[model] if is_tree(shape) else 0.0
                est = walls.get(key, first_guess_s(model, backend, args.pcg_max_tokens)) + extra
                for pass_, rep, group in plan:
                    group = [v for v in group if v in runnable]
                    if not deadline.allows(est * len(group)):
                        skip(f"skipped {pass_} rep {rep} of {case_name(case)}: {deadline.left():.0f} s left, "
                             f"~{est * len(group):.0f} s needed", case)
                        continue
                    trials = {"timed": args.trials, "host": args.host_trials}.get(pass_, args.probe_trials)
                    spec = dict(base_spec, trials=trials)
                    for variant in group:
                        timeout = min(args.run_timeout, max(deadline.left() - 5.0, 30.0))
                        run = run_engine(case=case, variant=variant, pass_=pass_, rep=rep, spec=spec, work=work,
                                         log_dir=log_dir, timeout=timeout, log_config=log_config,
                                         sync_impl=sync_impl, ports=ports)
                        est = max(est * 0.5, run["wall_s"]) if run["returncode"] == 0 else max(est, run["wall_s"])
                        walls[key] = max(est - extra, 1.0)
                        res = run.get("result") or {}
                        if res.get("sglang_version"):
                            doc["env"]["sglang_versions"].setdefault(variant.name, res["sglang_version"])
                        for k in ("gpu", "sglang_version", "torch_version", "cuda"):
                            if res.get(k) and not doc["env"].get(k) and variant.site is None:
                                doc["env"][k] = res[k]
                        if pass_ == "host":
                            case.setdefault("host", {})[variant.name] = run.get("host")
                        if pass_ == "probe":
                            case["probe"][variant.name] = run.get("sync")
                            # keep the probed run's raw numbers, but out of the timed medians
                        for prof in res.get("profile") or []:
                            case["profile"].setdefault(variant.name, []).append(dict(prof, rep=rep))
                        case["runs"].append(run)
                        if not run["valid"]:
                            rc = 1
                        write_doc(doc, out)
        write_doc(doc, out)
        print(format_summary(doc), flush=True)
        print(f"wrote {out}", flush=True)
        return rc
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
