#!/usr/bin/env python3
"""GPU end-to-end correctness suite: stock SGLang vs. SGLang + sglang_futuremap_patch.

Every case starts two ``sglang.Engine`` processes on the same GPU, ``stock``
(``SGLANG_FUTUREMAP_PATCH=off``) and ``patched`` (``strict``), runs the same scenario list in
each, and compares them token for token. Cases run concurrently (``--jobs``); each Engine
gets a small, fixed memory budget, so a whole matrix fits one GPU.

Cases (``--list`` prints them; ``--cases`` takes names or fnmatch patterns):

* the matrix: {EAGLE3, STANDALONE} x {triton, flashinfer} x {CUDA graph on, off} x
  {piecewise CUDA graph on, off}; scenarios ``bs1``, ``bs7``, ``bs48`` (decode batches of
  1, 7 and 48), ``churn`` (96 requests of 4..700 tokens plus one of 1800 that is prefilled in
  chunks of 512, max_new_tokens 8..160, at most 56 running: requests join as others finish,
  so filter/merge run every few iterations), ``stop`` (``stop_token_ids`` taken from the
  ``bs48`` outputs, EOS not ignored) and ``logprob`` (output and top-3 logprobs compared too);
* ``retract``: a KV pool of 8192 tokens for 64 requests of ~450 tokens: SGLang must retract
  (its "KV cache pool is full. Retract requests." line is required in both runs);
* ``soak``: deterministic inference (batch-invariant kernels, so timing-dependent batching
  cannot change a token): ``arrivals`` (64 requests at concurrency 8: requests arrive while
  others decode) and ``soak`` (2000 requests of random lengths at concurrency 64, 5% aborted
  mid-generation); GPU memory of the Engine's processes sampled every 200 requests;
* the soak beyond Triton (``--group soak``): ``fa3soak-eagle3-det`` and ``mtpsoak-fa3-det``
  (FA3, multi-layer EAGLE: token for token under deterministic inference) and
  ``fa3soak-eagle3-default`` (SGLang's default configuration, FA3 + piecewise CUDA graph, which
  deterministic inference would switch off: batch-variant, every difference must be a near-tie);
* ``text``: a word-level tokenizer (``make_tiny_models.py``): text prompts, ``stop`` strings,
  decoded text compared too;
* ``tp2-*``: two matrix cases with tensor parallelism 2 (the mirror-free Triton path and
  FlashInfer with piecewise CUDA graph); they need two GPUs and are reported as skipped with
  fewer;
* deployments (``--group multi``, ``--group pd``): ``tp2-default-standalone`` (TP=2 in FA3's
  default configuration), ``dp2-*`` (``dp_size=2``: two schedulers behind SGLang's DP
  controller, each patched; the ``tp2-*`` and ``dp2-*`` cases check one scheduler per GPU) and
  ``pd-decode-*`` (a PD-disaggregation decode Engine with SGLang's ``fake`` transfer backend,
  every request naming SGLang's fake prefill peer (``FakePrefillPeer``), EAGLE3 and multi-layer
  EAGLE (MTP), deterministic inference: a batch at once, then arrivals
  at concurrency 8 with a few aborts; ``process_prebuilt`` seeds each new batch's spec-v2
  state through the FutureMap while the running batch's forward is in flight, and the probe
  counts the prebuilt batches and their merges into the running batch in both runs);
* ``http``: ``python -m sglang.launch_server`` instead of ``sglang.Engine``, driven over HTTP:
  OpenAI ``/v1/completions`` (plain, streamed, with ``stop`` strings) and the native
  ``/generate`` with token ids and logprobs;
* the FA3 set (``--group fa3``; the configurations SGLang runs by default on H100/H200):
  ``default-{standalone,eagle3}`` (no attention backend given and piecewise CUDA graph left at
  SGLang's default: FA3 + piecewise CUDA graph on Hopper), ``fa3-standalone-*`` (backend fa3 x
  CUDA graph x piecewise CUDA graph) and ``fa3-eagle3-graph-pcg``, all with the matrix
  scenarios; ``page16-*`` (``page_size=16``, Triton and FA3); ``eos-*`` (rounds of greedy
  requests until enough outputs meet the model's EOS id, then a churn of more requests than
  may run at once that end on EOS, on stop tokens and on their length: the finish reasons are
  counted per side); ``radix-*`` (a 1500-token prefix shared by 24 suffixes, twice: the second
  round must find it cached, ``cached_tokens > 0``, in both runs); ``seeded-*`` (temperature
  0.8, top_p 0.9 and a ``sampling_seed`` per request under deterministic inference).
  Cases that need FA3 (backend fa3 or default) are skipped where ``sgl_kernel.flash_ops``
  does not import; the report and the JSON say whether FA3 was there.
* multi-layer EAGLE (``--group mtp``; ``MultiLayerEagleWorkerV2``, one draft model per step):
  the tiny MiMoV2 target (hybrid sliding-window attention) and its MTP draft of three layers
  (``mimov2/``, ``mimov2-mtp/`` from ``make_tiny_models.py``; ``--speculative-algorithm EAGLE``,
  3 steps, topk 1, 4 draft tokens, ``trust_remote_code``): ``mtp-default-{graph,nograph}-pcg``
  (SGLang's own backend and piecewise CUDA graph choice: FA3 + PCG on Hopper),
  ``mtp-fa3-graph-nopcg``, ``mtp-triton-nograph-nopcg``, all with the matrix scenarios, and
  ``mtp-eos-default`` (the ``eos`` churn). The ``default`` and ``fa3`` ones need FA3. Not Triton
  with CUDA graph: stock 0.5.12.post1 fails to capture the MTP draft-extend graphs there.
* DeepSeek MTP on MLA (``--group mla``; ``EAGLEWorkerV2`` with ``DeepseekV3ForCausalLMNextN``):
  the tiny DeepSeek-V3 target (MLA, three dense layers and one MoE layer) with its NextN layer
  in the same checkpoint (``deepseek/`` from ``make_tiny_models.py``), launched as DeepSeek is:
  ``--speculative-algorithm NEXTN`` and no draft path (SGLang loads the target's own NextN
  layer), 3 steps, topk 1, 4 draft tokens (SGLang's own choice for DeepSeek), no attention
  backend and no piecewise CUDA graph switch (FA3 MLA on Hopper, piecewise CUDA graph as SGLang
  decides): ``mla-default-{graph,nograph}`` (the matrix scenarios: batches, churn, stop tokens,
  logprobs; CUDA graph on and off), ``mla-eos-default`` (the ``eos`` churn, batch-variant as
  ``mtp-eos-default``: judged at near-ties), ``mla-radix-default`` (the ``radix`` profile) and
  ``mla-mirror-{default-graph,eos-default}`` (back-port 18 off: MLA on the host mirror).
  The host-sync probe runs in both runs of each (``Case.sync_probe``): host syncs per decode
  iteration, on ``seq_lens`` and in all, stock and patched, go to the report and the record. All
  need FA3.
* EAGLE trees (topk > 1). Stock 0.5.12.x runs an explicit tree on spec v1 and crashes on
  SGLang's auto-chosen one (a Llama target with EAGLE3 or EAGLE, no spec flags: 5 / 4 / 8), so
  the auto cases' oracle is stock given that tree explicitly. The EAGLE auto cases run the
  Llama target with its EAGLE-1 draft (``eagle/``, ``Case.models``; ``EAGLE`` alone means the
  MiMoV2 pair). ``tree-*`` (``--group tree``): the auto tree with the plugin kept on spec v1
  (``SGLANG_FUTUREMAP_TREE_SPEC_V2=0``, through ``Case.env``): FA3 + PCG (EAGLE3 and EAGLE),
  Triton, Triton with the ``eos`` churn, ``launch_server``.
  ``treev2-*`` (``--group tree-v2``): the patched run on spec v2, stock on spec v1: the auto
  tree on FA3 + PCG (EAGLE3 and EAGLE),
  explicit trees 3 / 4 / 16 and 5 / 4 / 8 with the STANDALONE draft on FlashInfer, FA3 and
  Triton (CUDA graph on and off, PCG on one FA3 case), EAGLE3 5 / 4 / 8 on Triton, the ``eos``
  churn (Triton) and the ``radix`` profile (FlashInfer), page size 16 on FlashInfer and FA3
  (with the ``eos`` churn on FA3); ids compared exactly, the matrix profile's logprobs
  within 1e-3 (spec v1 and v2 compute them in other kernels).

With several GPUs (``--gpus``, default: every visible one) single-GPU Engines are spread over
them round-robin; a TP=2 Engine takes the first two. Every Engine gets ports no other Engine of
the run uses (``gpu_harness.port_blocks.PortAllocator``).

Groups (``--group``, with ``--cases`` their union): ``base`` (everything before the FA3 set),
``matrix``, ``fa3``, ``multi`` (two GPUs), ``pd``, ``mtp``, ``mla``, ``tree``, ``tree-v2``,
``tree-v2-det``, ``intake`` (back-port 19 switched on explicitly), ``fihost`` (back-port 20
switched on explicitly; both on by default since 2026-11-26), ``fiplan`` (back-port 23 switched on
with its check: FlashInfer, the device indptrs read back at every plan), ``mrelay`` (back-port 22's switch
on: FlashInfer chains, the FA3 tree), ``released`` (decodes launched after the last result was
processed, holding requests it freed: grammar requests on three backends, back-port 16's switch),
``wal`` (back-port 27 switched on: the barrier after each launch; eleven cases, eight of the FA3 set,
back-port 19's intake, a tree and grammar, judged as those), ``sidle`` (the same eleven with back-port
17's idle-poll skip named instead: its record, 11 / 11, made it the default on 2026-11-29).

A case whose Engine did not start, or stopped before its last scenario, is a harness error
(``ERROR``, with the end of its log), never a mismatch: no comparison is made and the summary
counts errors apart from failures.

Per case the checks are: both runs finished every scenario; outputs identical (aborted
requests: the shorter output is a prefix of the longer); lengths as requested where EOS is
ignored; logprobs identical where requested; the plugin's INFO line in every process of the
patched run and its "disabled" line in the stock run; no plugin warning, error or traceback in
either log; ``maybe_wait_verify_done`` called by the stock scheduler and never by the patched
one; retraction seen (``retract``); no GPU memory growth after warm-up (``soak``); outputs met
EOS and requests ended on EOS, stop tokens and length (``eos``); the prefix served from the
radix cache (``radix``); with the sync probe (``mla``): both runs' decode iterations counted
and the patched run's ``seq_lens`` syncs per decode iteration no more than stock's. Tree cases
instead of the ``verify_done`` pair: both runs resolved to the same server arguments and tree;
``tree-*``: both spec v1, the plugin's one auto-tree WARNING and no spec-v2 tree line;
``treev2-*``: patched spec v2 (and no ``verify_done`` wait), stock spec v1, the plugin's one
"spec v2 runs the EAGLE tree" line and stock's spec-v1 line, the tree as asked (5 / 4 / 8 for
the auto ones), and with the STANDALONE or EAGLE-1 draft a patched mean accept length above 1.3
(from SGLang's ``Decode batch`` lines; the report gives it next to the requests' own mean,
stock / patched).

Results: ``--out DIR`` gets ``e2e-<tag>.json`` (everything), ``e2e-<tag>.txt`` (the
report) and ``logs-<tag>.tar.gz`` (every Engine's full log). ``--merge`` turns one or more JSONs into the Markdown record
(``results/gpu-e2e/README.md``). Exit status 0 only when every selected case passed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fnmatch
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_harness import child_env, engine_config, launch, logs, model_factory, port_blocks, records  # noqa: E402
from gpu_harness.records import Check  # noqa: E402

RUNS = (("stock", "off"), ("patched", "strict"))
#: The third run of a ``Case.upstream`` case: stock SGLang 0.5.13 (plugin not installed there).
UPSTREAM_RUN = ("upstream", "off")
RETRACT_LINE = "KV cache pool is full. Retract requests."
#: Counted in the PD-decode cases' schedulers besides ``maybe_wait_verify_done``: batches built
#: from transferred requests, and merges into the running batch.
PD_PROBE_FUNCS = ("process_prebuilt", "merge_batch")
MEMORY_TOLERANCE_MIB = 64
VOCAB_LO = 3  # ids 0..2 are pad/bos/eos in the tiny models


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str
    algorithm: str  # EAGLE3 | STANDALONE | EAGLE (multi-layer EAGLE: MiMoV2 + MTP) | NEXTN (DeepSeek MTP)
    backend: str  # triton | flashinfer | fa3 | default (none given: SGLang picks, FA3 on Hopper)
    cuda_graph: bool
    pcg: bool  # with backend default: SGLang's default (on), not passed
    profile: str  # matrix | retract | soak | soak-ties | text | http | eos | eos-ties | radix | seeded | pd | tree...
    extra: tuple[tuple[str, Any], ...] = ()
    #: Arguments the stock run gets on top of ``extra``, where stock cannot run the patched
    #: run's launch: stock crashes on SGLang's auto-chosen tree, so its oracle is the same
    #: tree given explicitly (spec v1 on the same backend). Both runs must then resolve to
    #: the same server arguments.
    stock_extra: tuple[tuple[str, Any], ...] = ()
    #: Environment variables of both runs' worker processes (and so of their Engines' and
    #: servers' processes), on top of the harness's own; None removes a variable.
    env: tuple[tuple[str, str | None], ...] = ()
    #: A tree (topk > 1) that the patched run decodes on spec v2 (the overlap scheduler) and the
    #: stock oracle on spec v1; compared token for token, logprobs within ``TREE_V2_LOGPROB_TOL``.
    tree_v2: bool = False
    #: Also run stock SGLang 0.5.13 (``--upstream-site``) with the patched run's launch: it runs
    #: trees on spec v2 itself, so the patched run is compared with it token for token too.
    upstream: bool = False
    #: The model directories (target, draft) when not the algorithm's (``MODEL_DIRS``): e.g. the
    #: Llama target with its EAGLE-1 draft, where ``EAGLE`` otherwise means the MiMoV2 pair.
    models: tuple[str, str | None] | None = None
    #: Batching is timing-dependent and the kernels are not batch-invariant (piecewise CUDA
    #: graph cannot run under deterministic inference): two runs, stock against stock too, may
    #: part where a batch's numerics flip a near-tie. Every request carries its top logprobs and
    #: each difference must be a near-tie (``near_tie_checks``), as for trees.
    batch_variant: bool = False
    #: Both runs count host syncs per decode iteration (``gpu_probe/smoke_sync_probe.py``, as
    #: ``gpu_smoke.py --sync-probe``): recorded per run, and the patched run may not sync on
    #: ``seq_lens`` more often than stock. The probe slows the scheduler down, never times.
    sync_probe: bool = False

    @property
    def gpus(self) -> int:
        extra = dict(self.extra)
        return int(extra.get("tp_size", 1)) * int(extra.get("dp_size", 1))

    @property
    def pd_decode(self) -> bool:
        """A PD-disaggregation decode Engine (SGLang's ``fake`` transfer backend)."""
        return dict(self.extra).get("disaggregation_mode") == "decode"

    @property
    def server(self) -> bool:
        """Served by ``sglang.launch_server`` and driven over HTTP (else ``sglang.Engine``)."""
        return self.profile == "http"

    @property
    def needs_fa3(self) -> bool:
        return child_env.needs_fa3(self.backend) or dict(self.stock_extra).get("attention_backend") == "fa3"

    @property
    def spec_v1(self) -> bool:
        """Both runs are spec v1 (a tree on 0.5.12.x): no verify_done wait on either side."""
        return bool(self.stock_extra) and not self.tree_v2

    @property
    def logprob_tol(self) -> float:
        """How far a patched logprob may be from stock's (0: bit for bit; trees and
        batch-variant cases: ``TREE_V2_LOGPROB_TOL``, the same rounding argument)."""
        return TREE_V2_LOGPROB_TOL if self.tree_v2 or self.batch_variant else 0.0


def _graph_name(graph: bool, pcg: bool) -> str:
    return f"{'graph' if graph else 'nograph'}-{'pcg' if pcg else 'nopcg'}"


def all_cases() -> list[Case]:
    cases = []
    for algo in ("EAGLE3", "STANDALONE"):
        for backend in ("triton", "flashinfer"):
            for graph in (True, False):
                for pcg in (True, False):
                    cases.append(Case(f"{algo.lower()}-{backend}-{_graph_name(graph, pcg)}", algo, backend, graph,
                                      pcg, "matrix"))
    cases.append(Case("retract-standalone-triton", "STANDALONE", "triton", True, False, "retract",
                      (("max_total_tokens", 8192), ("max_running_requests", 64))))
    cases.append(Case("soak-eagle3-triton-det", "EAGLE3", "triton", True, False, "soak",
                      (("enable_deterministic_inference", True), ("max_running_requests", 64))))
    cases.append(Case("text-standalone-flashinfer", "STANDALONE", "flashinfer", True, False, "text",
                      (("skip_tokenizer_init", False),)))
    # NCCL all-reduce (custom all-reduce off): nothing in the plugin depends on which one.
    tp2 = (("tp_size", 2), ("disable_custom_all_reduce", True))
    cases.append(Case("tp2-eagle3-triton-graph-nopcg", "EAGLE3", "triton", True, False, "matrix", tp2))
    cases.append(Case("tp2-standalone-flashinfer-graph-pcg", "STANDALONE", "flashinfer", True, True, "matrix", tp2))
    # Concurrent HTTP requests arrive in timing-dependent batches: batch-invariant kernels, as
    # in the soak, so that any difference is the plugin's.
    cases.append(Case("http-eagle3-triton-graph-nopcg", "EAGLE3", "triton", True, False, "http",
                      (("skip_tokenizer_init", False), ("enable_deterministic_inference", True))))
    cases += intake_cases()
    # Back-port 20 (FlashInfer's ragged prefill sums its prefix lengths on the host; on by default)
    # switched on explicitly: every prefill of the matrix workload on FlashInfer, with and without
    # piecewise CUDA graph.
    fihost = (("SGLANG_FUTUREMAP_FLASHINFER_HOST_PREFIX_SUM", "1"),)
    cases.append(Case("fihost-eagle3-flashinfer-graph-nopcg", "EAGLE3", "flashinfer", True, False, "matrix",
                      env=fihost))
    cases.append(Case("fihost-standalone-flashinfer-graph-pcg", "STANDALONE", "flashinfer", True, True, "matrix",
                      env=fihost))
    # Back-port 23 (FlashInfer plans extends from host indptrs; on by default) switched on with its
    # check, which reads the device indptrs back at every plan and raises on any difference: every
    # prefill and every spec-v2 draft extend, with and without CUDA graphs and piecewise CUDA graph,
    # radix-cache prefixes and EOS churn.
    fiplan = (("SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR", "1"),
              ("SGLANG_FUTUREMAP_FLASHINFER_HOST_INDPTR_CHECK", "1"))
    for algorithm, graph, pcg, profile in (("EAGLE3", True, False, "matrix"), ("STANDALONE", True, True, "matrix"),
                                           ("STANDALONE", False, False, "matrix"), ("EAGLE3", True, False, "radix"),
                                           ("STANDALONE", True, True, "eos")):
        name = (f"fiplan-{profile}-{algorithm.lower()}-flashinfer-{'graph' if graph else 'nograph'}-"
                f"{'pcg' if pcg else 'nopcg'}")
        cases.append(Case(name, algorithm, "flashinfer", graph, pcg, profile, env=fiplan))
    return (cases + fa3_cases() + soak_cases() + deployment_cases() + multilayer_cases() + mla_cases()
            + tree_cases() + tree_v2_cases() + tree_v2_det_cases() + mirror_relay_cases()
            + released_row_cases() + war_barrier_after_launch_cases() + war_barrier_skip_idle_cases())


def intake_cases() -> list[Case]:
    """Back-port 19 (early intake; on by default) switched on explicitly: each batch of the matrix
    workload, and each HTTP arrival after the running batch emptied, may be launched while the
    last one's lookahead decode still runs. Stock ignores the switch (the plugin is off there)."""
    intake = (("SGLANG_FUTUREMAP_EARLY_INTAKE", "1"),)
    return [Case("intake-eagle3-triton-graph-nopcg", "EAGLE3", "triton", True, False, "matrix", env=intake),
            Case("intake-http-eagle3-triton-graph-nopcg", "EAGLE3", "triton", True, False, "http",
                 (("skip_tokenizer_init", False), ("enable_deterministic_inference", True)), env=intake)]


#: The profiles that run the soak workload (GPU memory sampled, checked flat).
SOAK_PROFILES = ("soak", "soak-ties")


def soak_cases() -> list[Case]:
    """The soak (2,000 requests, aborts, GPU memory) beyond Triton: FA3 and multi-layer EAGLE
    (the MiMoV2 target and its MTP layers) under deterministic inference, and SGLang's default
    configuration (FA3 + piecewise CUDA graph, which deterministic inference would turn off).
    All three are batch-variant: compared at near-ties, a second stock run recording how far
    stock reproduces itself."""
    det = (("enable_deterministic_inference", True), ("max_running_requests", 64))
    # FA3's spec-v2 paths are not batch-invariant in 0.5.12.x even under deterministic
    # inference (H100, 2026-11-24: stock and patched differed on 11 and 88 of 1,900 soak
    # requests, Triton's soak on none): judged by near-ties, with a second stock run's scatter
    # in the notes.
    return [
        Case("fa3soak-eagle3-det", "EAGLE3", "fa3", True, False, "soak-ties", det, batch_variant=True),
        Case("fa3soak-eagle3-default", "EAGLE3", "default", True, True, "soak-ties", (("max_running_requests", 64),),
             batch_variant=True),
        Case("mtpsoak-fa3-det", "EAGLE", "fa3", True, False, "soak-ties", det + (("trust_remote_code", True),),
             batch_variant=True),
    ]


def fa3_cases() -> list[Case]:
    """The configurations SGLang runs by default on H100/H200 (FA3 + piecewise CUDA graph) and
    the paths next to them: page size 16, EOS/stop churn, radix-cache hits, seeded sampling."""
    cases = [Case(f"default-{algo.lower()}", algo, "default", True, True, "matrix") for algo in ("STANDALONE", "EAGLE3")]
    for graph in (True, False):
        for pcg in (True, False):
            cases.append(Case(f"fa3-standalone-{_graph_name(graph, pcg)}", "STANDALONE", "fa3", graph, pcg, "matrix"))
    cases.append(Case("fa3-eagle3-graph-pcg", "EAGLE3", "fa3", True, True, "matrix"))
    page16 = (("page_size", 16),)
    cases.append(Case("page16-eagle3-triton", "EAGLE3", "triton", True, False, "matrix", page16))
    cases.append(Case("page16-standalone-fa3", "STANDALONE", "fa3", True, True, "matrix", page16))
    for profile in ("eos", "radix"):
        cases.append(Case(f"{profile}-standalone-triton", "STANDALONE", "triton", True, False, profile))
        cases.append(Case(f"{profile}-eagle3-fa3", "EAGLE3", "fa3", True, True, profile))
    # Deterministic inference turns piecewise CUDA graph off itself.
    det = (("enable_deterministic_inference", True),)
    cases.append(Case("seeded-standalone-triton", "STANDALONE", "triton", True, False, "seeded", det))
    cases.append(Case("seeded-eagle3-fa3", "EAGLE3", "fa3", True, False, "seeded", det))
    # FA3's eager paths without the host mirror: num_splits pinned to 1 by deterministic
    # inference and no CUDA graph (static page-table width), and CUDA graph with batches above
    # cuda_graph_max_bs (the lengths copied to the host on that eager path only).
    cases.append(Case("fa3-det-standalone-nograph", "STANDALONE", "fa3", False, False, "matrix", det))
    cases.append(Case("fa3-standalone-graph-pcg-maxbs8", "STANDALONE", "fa3", True, True, "matrix",
                      (("cuda_graph_max_bs", 8),)))
    return cases


def multilayer_cases() -> list[Case]:
    """Multi-layer EAGLE (MTP, ``MultiLayerEagleWorkerV2``): the tiny MiMoV2 target and its three
    MTP layers (one draft model per step) on SGLang's default (FA3 + piecewise CUDA graph on
    Hopper), CUDA graph on and off, on FA3 without piecewise CUDA graph and on Triton without
    CUDA graph. Triton with CUDA graph is left out: stock 0.5.12.post1 cannot capture the MTP
    draft-extend graphs there (the sliding-window MTP layers reach Triton's extend kernel with
    no KV indices during capture; seen on the H100 2026-11-23, stock and patched alike)."""
    mtp = (("trust_remote_code", True),)  # the MiMoV2 checkpoint carries its config class
    cases = [Case(f"mtp-default-{_graph_name(graph, True)}", "EAGLE", "default", graph, True, "matrix", mtp)
             for graph in (True, False)]
    cases.append(Case("mtp-fa3-graph-nopcg", "EAGLE", "fa3", True, False, "matrix", mtp))
    cases.append(Case("mtp-triton-nograph-nopcg", "EAGLE", "triton", False, False, "matrix", mtp))
    # Batch-variant: SGLang's default here (FA3 + piecewise CUDA graph, no deterministic
    # inference) is not batch-invariant for multi-layer EAGLE (the MTP soak: stock against stock
    # 77-110 of 1,900 requests), and which iteration a finished request leaves in is timing-
    # dependent. Seen on the H100 (2026-11-24, the build of the passing FA3 set): 2 of 960
    # eos_search requests parted from stock at token 57-60 while stock reproduced itself; the
    # same build passed this case token for token a day earlier. Every difference must be a
    # near-tie (``eos-ties``: the eos workload with top logprobs).
    cases.append(Case("mtp-eos-default", "EAGLE", "default", True, True, "eos-ties", mtp, batch_variant=True))
    return cases


def mla_cases() -> list[Case]:
    """DeepSeek MTP on MLA (``EAGLEWorkerV2`` with the NextN draft): the tiny DeepSeek-V3 target
    and its NextN layer launched as SGLang runs DeepSeek by default (no attention backend, no
    piecewise CUDA graph switch: FA3 MLA on Hopper; no draft path: the target's own NextN layer),
    CUDA graph on and off with the matrix scenarios (batches of 1 / 7 / 48, churn, stop tokens,
    logprobs), the EOS / stop-token churn and the radix cache; every run counts its host syncs
    per decode iteration. ``mla-mirror-*``: the batches and the EOS churn with back-port 18 off
    (``SGLANG_FUTUREMAP_FA3_MLA=0``: FA3 with MLA on the host mirror, back-port 8's path)."""
    mla = {"sync_probe": True}
    nextn = engine_config.NEXTN_ALGORITHM
    cases = [Case(f"mla-default-{'graph' if graph else 'nograph'}", nextn, "default", graph, True, "matrix", **mla)
             for graph in (True, False)]
    # The EOS churn as mtp-eos-default: SGLang's default (FA3 + piecewise CUDA graph, no
    # deterministic inference) is not batch-invariant, and which iteration a finished request
    # leaves in is timing-dependent; every difference must be a near-tie (``eos-ties``).
    cases.append(Case("mla-eos-default", nextn, "default", True, True, "eos-ties", batch_variant=True, **mla))
    cases.append(Case("mla-radix-default", nextn, "default", True, True, "radix", **mla))
    # Back-port 18 turned off: FA3 with MLA on the host mirror (the way back), against stock.
    mirror = child_env.MLA_MIRROR_ENV
    cases.append(Case("mla-mirror-default-graph", nextn, "default", True, True, "matrix", env=mirror, **mla))
    cases.append(Case("mla-mirror-eos-default", nextn, "default", True, True, "eos-ties", env=mirror,
                      batch_variant=True, **mla))
    return cases


def deployment_cases() -> list[Case]:
    """Deployments beyond one Engine process per GPU: tensor parallelism with FA3's default
    configuration, data parallelism (two schedulers behind SGLang's DP controller) and a
    PD-disaggregation decode Engine."""
    tp2 = (("tp_size", 2), ("disable_custom_all_reduce", True))
    cases = [Case("tp2-default-standalone", "STANDALONE", "default", True, True, "matrix", tp2)]
    dp2 = (("dp_size", 2),)
    cases.append(Case("dp2-standalone-triton-graph-nopcg", "STANDALONE", "triton", True, False, "matrix", dp2))
    cases.append(Case("dp2-default-eagle3", "EAGLE3", "default", True, True, "matrix", dp2))
    # The decode side of PD disaggregation with SGLang's fake transfer backend: nothing is
    # transferred, so every request starts from zeroed KV and metadata (its first token and
    # the EAGLE hidden states are those of zeroed buffers) and process_prebuilt seeds the
    # spec-v2 state through the FutureMap, in the patched run behind back-port 2's fence. The
    # pool is large enough that no freed KV slot is handed out again in a run: a request's
    # prefix is zeros whatever was allocated before it, so outputs depend on the requests
    # only. Deterministic inference: requests join in timing-dependent prebuilt batches.
    # STANDALONE is not seeded by process_prebuilt in 0.5.12.x (EAGLE family only).
    pd = (("disaggregation_mode", "decode"), ("disaggregation_transfer_backend", "fake"),
          ("enable_deterministic_inference", True), ("max_total_tokens", 131072))
    cases.append(Case("pd-decode-eagle3-triton", "EAGLE3", "triton", True, False, "pd", pd))
    cases.append(Case("pd-decode-eagle3-fa3", "EAGLE3", "fa3", True, False, "pd", pd))
    cases.append(Case("pd-decode-eagle3-fa3-nograph", "EAGLE3", "fa3", False, False, "pd", pd))
    # Multi-layer EAGLE (MTP): process_prebuilt seeds one top-k state per draft step.
    cases.append(Case("pd-decode-mtp-fa3", "EAGLE", "fa3", True, False, "pd",
                      pd + (("trust_remote_code", True),)))
    return cases


#: No speculative flags but the algorithm and the draft: SGLang chooses steps, topk and draft
#: tokens (5 / 4 / 8 for a Llama target with EAGLE or EAGLE3).
AUTO_SPEC = (("speculative_num_steps", None), ("speculative_eagle_topk", None),
             ("speculative_num_draft_tokens", None))
AUTO_TREE = (("speculative_num_steps", 5), ("speculative_eagle_topk", 4), ("speculative_num_draft_tokens", 8))
#: The Llama target with its EAGLE-1 draft (``Case.models`` of the auto-tree EAGLE cases).
LLAMA_EAGLE = ("target", "eagle")
SPEC_TREE_KEYS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
#: Set to 1, the plugin keeps EAGLE trees on spec v1 (its behaviour before trees ran on spec v2).
TREE_SPEC_V2_ENV = "SGLANG_FUTUREMAP_TREE_SPEC_V2"


def spec_tree(steps: int, topk: int, draft_tokens: int) -> tuple[tuple[str, int], ...]:
    """Engine kwargs of an explicit tree (steps, topk, draft tokens)."""
    return tuple(zip(SPEC_TREE_KEYS, (steps, topk, draft_tokens)))


def tree_cases() -> list[Case]:
    """SGLang's auto-chosen tree with the plugin kept on spec v1 (back-port auto-tree-spec-v1,
    ``SGLANG_FUTUREMAP_TREE_SPEC_V2=0``) against stock SGLang given the same tree explicitly, on
    the backend the auto path ends up with: FA3 with piecewise CUDA graph on Hopper (stock
    names no backend for the auto path, but an explicit tree would pick FlashInfer there, so the
    oracle names FA3), and Triton; on FA3 + PCG also with the EAGLE-1 draft."""
    v1 = ((TREE_SPEC_V2_ENV, "0"),)  # the documented way to keep trees on spec v1
    cases = [Case("tree-auto-eagle3-default", "EAGLE3", "default", True, True, "matrix", AUTO_SPEC,
                  stock_extra=AUTO_TREE + (("attention_backend", "fa3"),), env=v1)]
    cases.append(Case("tree-auto-eagle-default", "EAGLE", "default", True, True, "matrix", AUTO_SPEC,
                      stock_extra=AUTO_TREE + (("attention_backend", "fa3"),), env=v1, models=LLAMA_EAGLE))
    cases.append(Case("tree-auto-eagle3-triton-graph-nopcg", "EAGLE3", "triton", True, False, "matrix",
                      AUTO_SPEC, stock_extra=AUTO_TREE, env=v1))
    cases.append(Case("tree-auto-eagle3-triton-eos", "EAGLE3", "triton", True, False, "eos",
                      AUTO_SPEC, stock_extra=AUTO_TREE, env=v1))
    # As a user launches it: sglang.launch_server with no backend and no spec flags but these
    # two (batch-invariant kernels, as in the other HTTP case: requests arrive concurrently).
    http = (("skip_tokenizer_init", False), ("enable_deterministic_inference", True))
    cases.append(Case("tree-auto-eagle3-http-default", "EAGLE3", "default", True, True, "http",
                      AUTO_SPEC + http, stock_extra=AUTO_TREE + (("attention_backend", "fa3"),), env=v1))
    return cases


#: What every ``treev2*`` case shares: the plugin's default (trees on spec v2, the variable
#: unset), judged as a tree, with SGLang 0.5.13 beside it where it can run.
_TREE_V2 = {"env": ((TREE_SPEC_V2_ENV, None),), "tree_v2": True, "upstream": True}


def _tree_v2(backend: str) -> dict[str, Any]:
    """``_TREE_V2`` for ``backend``: FlashInfer trees run on spec v2 when asked for (=1)."""
    return {**_TREE_V2, "env": ((TREE_SPEC_V2_ENV, "1"),)} if backend == "flashinfer" else _TREE_V2


def tree_v2_cases() -> list[Case]:
    """EAGLE trees (topk > 1; page size 1, and 16 on FlashInfer / FA3) that the patched run
    decodes on spec v2 against stock
    SGLang on spec v1 with the same tree. Explicit trees: the same launch on both sides (stock
    sends it to spec v1 itself), mostly with the STANDALONE draft, which gets part of the tree
    accepted (the EAGLE3 draft gets ~1 token a step: one case). SGLang's auto-chosen tree
    (5 / 4 / 8) against stock given it explicitly, as ``tree-auto-eagle3-default``, with EAGLE3
    and with the EAGLE-1 draft (which gets part of the tree accepted). The matrix
    profile's ``logprob`` scenario compares logprobs (within ``TREE_V2_LOGPROB_TOL``)."""
    v2 = _TREE_V2
    cases = [Case("treev2-auto-eagle3-default", "EAGLE3", "default", True, True, "tree", AUTO_SPEC,
                  stock_extra=AUTO_TREE + (("attention_backend", "fa3"),), **v2)]
    cases.append(Case("treev2-auto-eagle-default", "EAGLE", "default", True, True, "tree", AUTO_SPEC,
                      stock_extra=AUTO_TREE + (("attention_backend", "fa3"),), models=LLAMA_EAGLE, **v2))
    for backend, tree, graph, pcg in (("flashinfer", (3, 4, 16), True, False), ("flashinfer", (5, 4, 8), True, False),
                                      ("flashinfer", (5, 4, 8), False, False), ("fa3", (3, 4, 16), True, False),
                                      ("fa3", (5, 4, 8), True, True), ("triton", (3, 4, 16), True, False),
                                      ("triton", (5, 4, 8), True, False), ("triton", (3, 4, 16), False, False)):
        cases.append(Case(f"treev2-standalone-{backend}-{'x'.join(map(str, tree))}-{_graph_name(graph, pcg)}",
                          "STANDALONE", backend, graph, pcg, "tree", spec_tree(*tree), **_tree_v2(backend)))
    cases.append(Case("treev2-eagle3-triton-5x4x8-graph-nopcg", "EAGLE3", "triton", True, False, "tree",
                      spec_tree(5, 4, 8), **v2))
    cases.append(Case("treev2-eos-standalone-triton-3x4x16", "STANDALONE", "triton", True, False, "tree-eos",
                      spec_tree(3, 4, 16), **v2))
    cases.append(Case("treev2-radix-standalone-flashinfer-5x4x8", "STANDALONE", "flashinfer", True, False,
                      "tree-radix", spec_tree(5, 4, 8), **_tree_v2("flashinfer")))
    # Page size 16 (back-port paged-tree-spec-v2): FlashInfer and FA3, the backends SGLang
    # 0.5.12.x accepts for a tree in pages; prompts of every length modulo 16.
    page16 = (("page_size", 16),)
    for backend, tree, graph in (("flashinfer", (3, 4, 16), True), ("flashinfer", (5, 4, 8), False),
                                 ("fa3", (5, 4, 8), True), ("fa3", (3, 4, 16), False)):
        cases.append(Case(f"treev2-page16-standalone-{backend}-{'x'.join(map(str, tree))}-{_graph_name(graph, False)}",
                          "STANDALONE", backend, graph, False, "tree", spec_tree(*tree) + page16, **_tree_v2(backend)))
    cases.append(Case("treev2-eos-page16-standalone-fa3-3x4x16", "STANDALONE", "fa3", True, False, "tree-eos",
                      spec_tree(3, 4, 16) + page16, **v2))
    return cases


def tree_v2_det_cases() -> list[Case]:
    """The same trees with batch-invariant kernels on both sides: spec v1 and spec v2 run
    different draft extends, so their drafts, and with them the verify batches' shapes,
    differ; with SGLang's deterministic inference a request's logits depend less on them."""
    cases = []
    det = (("enable_deterministic_inference", True),)
    for backend, tree, graph in (("flashinfer", (5, 4, 8), True), ("fa3", (3, 4, 16), True),
                                 ("triton", (3, 4, 16), True), ("triton", (5, 4, 8), False)):
        cases.append(Case(f"treev2det-standalone-{backend}-{'x'.join(map(str, tree))}-{_graph_name(graph, False)}",
                          "STANDALONE", backend, graph, False, "tree", spec_tree(*tree) + det, **_tree_v2(backend)))
    return cases


def mirror_relay_cases() -> list[Case]:
    """Back-port 22 switched on (``SGLANG_FUTUREMAP_MIRROR_RELAY=1``; trees have it by default) on backends that keep the host
    mirror: FlashInfer with a chain against stock token for token (the same host lengths, so the
    same tokens), and the FA3 tree on spec v2 (the tree the switch was written for), judged as the
    ``treev2`` cases are (near-ties against stock spec v1, SGLang 0.5.13 beside it)."""
    mrelay = (("SGLANG_FUTUREMAP_MIRROR_RELAY", "1"),)
    cases = [Case("mrelay-eagle3-flashinfer-graph-nopcg", "EAGLE3", "flashinfer", True, False, "matrix",
                  env=mrelay),
             Case("mrelay-standalone-flashinfer-graph-pcg", "STANDALONE", "flashinfer", True, True, "matrix",
                  env=mrelay)]
    tree = {**_TREE_V2, "env": _TREE_V2["env"] + mrelay}
    cases.append(Case("mrelay-treev2-standalone-fa3-5x4x8-graph-pcg", "STANDALONE", "fa3", True, True, "tree",
                      spec_tree(5, 4, 8), **tree))
    cases.append(Case("mrelay-treev2-auto-eagle3-default", "EAGLE3", "default", True, True, "tree", AUTO_SPEC,
                      stock_extra=AUTO_TREE + (("attention_backend", "fa3"),), **tree))
    return cases


def released_row_cases() -> list[Case]:
    """Decodes launched after the last result was processed, so that requests it finished are
    released yet still rows of the decode (the ``grammar`` profile): SGLang's own grammar sync
    on spec v2, on the default configuration (FA3 + PCG, no mirror), FlashInfer (the mirror) and
    Triton; and back-port 16 switched on (``pfirst-*``; trees have it by default), alone and with back-port 22's. Token for
    token against stock (which ignores both switches); the FA3 tree with both, as ``treev2``."""
    tok = (("skip_tokenizer_init", False), ("grammar_backend", "xgrammar"))
    pfirst = (("SGLANG_FUTUREMAP_PREFILL_RESULT_FIRST", "1"),)
    return [Case("grammar-eagle3-default", "EAGLE3", "default", True, True, "grammar", tok),
            Case("grammar-standalone-flashinfer-graph-pcg", "STANDALONE", "flashinfer", True, True, "grammar", tok),
            Case("grammar-eagle3-triton-graph-nopcg", "EAGLE3", "triton", True, False, "grammar", tok),
            Case("pfirst-eagle3-default", "EAGLE3", "default", True, True, "grammar", tok, env=pfirst),
            Case("pfirst-standalone-flashinfer-graph-pcg", "STANDALONE", "flashinfer", True, True, "grammar", tok,
                 env=pfirst + (("SGLANG_FUTUREMAP_MIRROR_RELAY", "1"),)),
            # The FA3 tree with both switches (the setting the serving record suggests for trees),
            # judged as the treev2 cases are.
            Case("pfirst-treev2-standalone-fa3-5x4x8-graph-pcg", "STANDALONE", "fa3", True, True, "tree",
                 spec_tree(5, 4, 8), **{**_TREE_V2, "env": _TREE_V2["env"] + pfirst
                                        + (("SGLANG_FUTUREMAP_MIRROR_RELAY", "1"),)})]


def war_barrier_after_launch_cases() -> list[Case]:
    """Back-port 27 switched on (``SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH=1``; opt-in): back-port
    17's barrier right after each spec-v2 launch instead of at the top of every poll. Cases of other
    groups with the switch added, judged as those: the default configuration (both algorithms),
    EOS churn and radix-cache hits on FA3 and Triton, pages of 16, batches above the captured
    CUDA-graph sizes, back-port 19's intake (which builds a batch while a lookahead decode still
    runs), a tree on Triton with EOS churn and grammar requests on the default configuration."""
    return _barrier_switch_cases("wal-", ("SGLANG_FUTUREMAP_WAR_BARRIER_AFTER_LAUNCH", "1"))


def war_barrier_skip_idle_cases() -> list[Case]:
    """Back-port 17's barrier left out after an idle poll (``SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE=1``,
    named; the default since its 11 / 11 of 2026-11-29): the same eleven cases as ``wal``, with this
    switch instead, judged as their twins."""
    return _barrier_switch_cases("sidle-", ("SGLANG_FUTUREMAP_WAR_BARRIER_SKIP_IDLE", "1"))


def _barrier_switch_cases(prefix: str, on: tuple[str, str]) -> list[Case]:
    """The cases that check a switch of back-port 17's barrier: eleven of other groups with
    ``on`` added to their environment and ``prefix`` to their name."""
    picked = ("default-eagle3", "default-standalone", "eos-eagle3-fa3", "radix-eagle3-fa3",
              "eos-standalone-triton", "radix-standalone-triton", "page16-standalone-fa3",
              "fa3-standalone-graph-pcg-maxbs8", "treev2-eos-standalone-triton-3x4x16",
              "grammar-eagle3-default", "intake-eagle3-triton-graph-nopcg")
    by_name = {c.name: c for c in (fa3_cases() + tree_v2_cases() + released_row_cases() + intake_cases())}
    return [dataclasses.replace(by_name[n], name=prefix + n, env=by_name[n].env + (on,)) for n in picked]


#: Named case sets (``--group``): fnmatch patterns over case names.
GROUPS: dict[str, tuple[str, ...]] = {
    "base": ("eagle3-*", "standalone-*", "retract-*", "soak-*", "text-*", "tp2-eagle3-*", "tp2-standalone-*",
             "http-*"),
    "matrix": ("eagle3-*", "standalone-*"),
    "fa3": ("default-*", "fa3-*", "page16-*", "eos-*", "radix-*", "seeded-*"),
    "multi": ("tp2-*", "dp2-*"),
    "pd": ("pd-*",),
    "soak": ("soak-*", "fa3soak-*", "mtpsoak-*"),
    "mtp": ("mtp-*",),
    "mla": ("mla-*",),
    "tree": ("tree-*",),
    "tree-v2": ("treev2-*",),
    "tree-v2-det": ("treev2det-*",),
    "intake": ("intake-*",),
    "fihost": ("fihost-*",),
    "fiplan": ("fiplan-*",),
    "mrelay": ("mrelay-*",),
    "released": ("grammar-*", "pfirst-*"),
    "wal": ("wal-*",),
    "sidle": ("sidle-*",),
}


def select_cases(patterns: Sequence[str] | None, shard: str | None = None, repeat: int = 1,
                 groups: Sequence[str] | None = None) -> list[Case]:
    """Cases by name pattern and/or group (their union; neither: all), then every N-th
    (``shard`` I/N), each ``repeat`` times (copies are named ``<case>~2``, ``~3``, ...: to hunt
    an intermittent failure)."""
    cases = all_cases()
    wanted = list(patterns or [])
    for g in groups or []:
        if g not in GROUPS:
            raise ValueError(f"unknown group {g!r}; choose from {sorted(GROUPS)}")
        wanted += GROUPS[g]
    if wanted:
        cases = [c for c in cases if any(fnmatch.fnmatch(c.name, p) for p in wanted)]
    cases = launch.take_shard(cases, shard)
    return cases + [replace(c, name=f"{c.name}~{k}") for k in range(2, repeat + 1) for c in cases]


#: The model directories (``make_tiny_models.py``) of each algorithm: target, draft (None: no draft
#: path; DeepSeek MTP reads the NextN layer from the target's own checkpoint).
MODEL_DIRS: dict[str, tuple[str, str | None]] = {
    "EAGLE3": ("target", "eagle3"), "STANDALONE": ("target", "draft"), "EAGLE": ("mimov2", "mimov2-mtp"),
    engine_config.NEXTN_ALGORITHM: (model_factory.DEEPSEEK_DIRNAME, None)}
#: Drafts that get part of a tree accepted (the EAGLE3 draft gets ~1 token a step).
PARTIAL_ACCEPT_DRAFTS = frozenset({"draft", "eagle"})


def model_dirs(case: Case) -> tuple[str, str | None]:
    """A case's model directories (target, draft): its own, else its algorithm's."""
    return case.models or MODEL_DIRS[case.algorithm]


def engine_kwargs(case: Case, models: Path, stock: bool = False) -> dict[str, Any]:
    """The Engine kwargs of a case (``stock``: of its stock run, with ``Case.stock_extra``)."""
    target, draft = model_dirs(case)
    default = case.backend == "default"
    extra = dict(case.extra, **(dict(case.stock_extra) if stock else {}))
    return engine_config.spec_engine_kwargs(
        str(models / target), None if draft is None else str(models / draft), algorithm=case.algorithm,
        backend=case.backend, cuda_graph=case.cuda_graph, pcg=None if default else case.pcg, mem_fraction=0.06,
        cuda_graph_max_bs=extra.pop("cuda_graph_max_bs", 64), pcg_max_tokens=512 if case.pcg else None,
        **dict({"chunked_prefill_size": 512, "max_running_requests": 56, "max_total_tokens": 65536}, **extra))


# ----------------------------------------------------------------------------- workloads


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(VOCAB_LO, vocab) for _ in range(n)]


def _logprob_kw(sc: dict[str, Any]) -> dict[str, Any]:
    """The logprob arguments a scenario asks its ``generate`` calls for."""
    return {k: sc[k] for k in ("return_logprob", "top_logprobs_num") if k in sc}


def _greedy(max_new: int, ignore_eos: bool = True, **more: Any) -> dict[str, Any]:
    return dict({"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": ignore_eos}, **more)


def scenarios(profile: str, vocab: int, seed: int = 20261122, soak_requests: int = 2000,
              eos_ids: Sequence[int] = (2,)) -> list[dict[str, Any]]:
    """The scenario list of a profile: plain data, the same in both runs of a case.

    Kinds: ``batch`` (one ``generate`` call), ``stop_from`` (stop tokens taken from an earlier
    scenario's outputs), ``async`` (concurrency-limited arrivals, optional aborts), ``text``,
    ``eos_search`` / ``eos_churn`` (prompts whose greedy output meets EOS, then a churn of
    requests ending on EOS, stop tokens and their length)."""
    rng = random.Random(f"{seed}-{profile}")
    out: list[dict[str, Any]] = []

    def batch(name: str, lengths: Sequence[int], new: Sequence[int], **params: Any) -> dict[str, Any]:
        prompts = [_ids(rng, n, vocab) for n in lengths]
        return {"name": name, "kind": "batch", "input_ids": prompts,
                "sampling_params": [_greedy(m, **params) for m in new]}

    if profile == "matrix":
        out.append(batch("bs1", [37], [96]))
        out.append(batch("bs7", [5, 17, 40, 77, 128, 211, 300], [64] * 7))
        out.append(batch("bs48", [rng.randrange(8, 200) for _ in range(48)], [64] * 48))
        churn_len = [rng.randrange(4, 700) for _ in range(95)] + [1800]
        rng.shuffle(churn_len)
        out.append(batch("churn", churn_len, [rng.randrange(8, 161) for _ in churn_len]))
        out.append({"name": "stop", "kind": "stop_from", "source": "bs48", "count": 24, "max_new_tokens": 64})
        lp = batch("logprob", [9, 33, 60, 101, 150, 190, 240], [32] * 7)
        lp.update(return_logprob=True, top_logprobs_num=3)
        out.append(lp)
    elif profile == "retract":
        out.append(batch("retract", [rng.randrange(100, 200) for _ in range(64)], [300] * 64))
    elif profile == "soak":
        for name, n, conc, abort_frac in (("arrivals", 64, 8, 0.0), ("soak", soak_requests, 64, 0.05)):
            lengths = [rng.randrange(4, 400) for _ in range(n)]
            news = [rng.randrange(4, 128) for _ in range(n)]
            aborts = {i: rng.randrange(1, 12) for i in range(n) if rng.random() < abort_frac}
            out.append({"name": name, "kind": "async", "concurrency": conc,
                        "input_ids": [_ids(rng, k, vocab) for k in lengths],
                        "sampling_params": [_greedy(m) for m in news],
                        "abort_after_chunks": {str(k): v for k, v in aborts.items()},
                        "memory_every": 200 if name == "soak" else 0})
    elif profile == "soak-ties":
        # The soak with every request's top logprobs (a batch-variant case's near-tie check).
        out = _with_top_logprobs(scenarios("soak", vocab, seed=seed, soak_requests=soak_requests,
                                           eos_ids=eos_ids))
    elif profile == "pd":
        # A batch at once, then arrivals at concurrency 8 with a few aborts: prebuilt batches
        # join a running batch while its forward is in flight (the overlap loop always has
        # one queued), and requests leave mid-stream.
        out.append(batch("pd_batch", [rng.randrange(8, 400) for _ in range(24)], [48] * 24))
        n = 64
        aborts = {i: rng.randrange(1, 8) for i in range(n) if rng.random() < 0.05}
        out.append({"name": "pd_arrivals", "kind": "async", "concurrency": 8,
                    "input_ids": [_ids(rng, rng.randrange(4, 400), vocab) for _ in range(n)],
                    "sampling_params": [_greedy(rng.randrange(4, 96)) for _ in range(n)],
                    "abort_after_chunks": {str(k): v for k, v in aborts.items()}, "memory_every": 0})
    elif profile == "http":
        texts = [" ".join(f"w{t}" for t in _ids(rng, n, vocab)) for n in (5, 19, 44, 90, 150, 260, 12, 77, 31, 8)]
        out.append({"name": "completions", "kind": "http_completions", "concurrency": 6, "prompts": texts,
                    "sampling_params": [_greedy(rng.randrange(16, 80)) for _ in texts]})
        out.append({"name": "completions_stream", "kind": "http_completions", "concurrency": 6, "stream": True,
                    "prompts": texts[::-1], "sampling_params": [_greedy(48) for _ in texts]})
        out.append({"name": "completions_stop", "kind": "http_stop_from", "source": "completions",
                    "max_tokens": 64})
        ids = [_ids(rng, n, vocab) for n in (9, 60, 140, 33, 220, 7)]
        out.append({"name": "generate_ids", "kind": "http_generate", "concurrency": 6, "input_ids": ids,
                    "sampling_params": [_greedy(40) for _ in ids], "return_logprob": True,
                    "top_logprobs_num": 3})
    elif profile == "text":
        texts = [" ".join(f"w{t}" for t in _ids(rng, n, vocab)) for n in (6, 25, 60, 130, 240, 333, 7, 90)]
        out.append({"name": "text", "kind": "text", "prompts": texts,
                    "sampling_params": [_greedy(48) for _ in texts]})
        out.append({"name": "text_stop", "kind": "text_stop_from", "source": "text", "max_new_tokens": 48})
    elif profile == "eos":
        # Greedy output of the tiny models meets EOS about once in 7000 tokens: search rounds of
        # prompts (ignore_eos) until enough outputs hold it, then run those (they end on EOS)
        # mixed with stop-token and length-limited requests, more than max_running_requests.
        rounds = [[_ids(rng, rng.randrange(8, 160), vocab) for _ in range(EOS_ROUND)] for _ in range(EOS_MAX_ROUNDS)]
        out.append({"name": "eos_search", "kind": "eos_search", "rounds": rounds, "max_new_tokens": EOS_NEW_TOKENS,
                    "want": EOS_WANTED, "eos_ids": list(eos_ids)})
        out.append({"name": "eos_churn", "kind": "eos_churn", "source": "eos_search", "stop_requests": 24,
                    "length_requests": 40, "seed": seed})
    elif profile == "radix":
        # One long shared prefix, many suffixes; the second round finds the prefix cached.
        prefix = _ids(rng, RADIX_PREFIX, vocab)
        for name in ("radix_round1", "radix_round2"):
            sc = batch(name, [], [32] * RADIX_SUFFIXES)
            sc["input_ids"] = [prefix + _ids(rng, rng.randrange(4, 120), vocab) for _ in range(RADIX_SUFFIXES)]
            sc["expect_cached"] = name == "radix_round2"
            out.append(sc)
    elif profile == "seeded":
        # temperature > 0 with a seed per request (deterministic inference): stock must
        # reproduce itself for a difference to count (adjudicate).
        def seeded(name: str, lengths: Sequence[int], new: Sequence[int]) -> dict[str, Any]:
            sc = batch(name, lengths, new)
            sc["sampling_params"] = [dict(p, temperature=0.8, top_p=0.9, sampling_seed=1000 + i)
                                     for i, p in enumerate(sc["sampling_params"])]
            return sc

        out.append(seeded("seeded_bs7", [5, 17, 40, 77, 128, 211, 300], [64] * 7))
        churn_len = [rng.randrange(4, 500) for _ in range(72)]
        out.append(seeded("seeded_churn", churn_len, [rng.randrange(8, 121) for _ in churn_len]))
    elif profile == "grammar":
        # Requests under a grammar that admits any text (so the tokens are the unconstrained
        # greedy ones): before launching a spec-v2 decode that holds one, SGLang processes the
        # last result, and requests it finishes are released while still rows of that decode.
        # Mixed with plain requests, finishing at different steps, some at their prefill
        # (max_new_tokens 1); then 1-token requests alone at an idle engine (back-port 16's case).
        lengths = [rng.randrange(4, 300) for _ in range(40)]
        sc = batch("grammar_mixed", lengths, [1 if i % 8 == 0 else rng.randrange(2, 64) for i in range(40)])
        for i, params in enumerate(sc["sampling_params"]):
            if i % 2 == 0:
                params["regex"] = ANY_TEXT_REGEX
        out.append(sc)
        out.append(batch("grammar_all", [rng.randrange(4, 200) for _ in range(16)],
                         [rng.randrange(1, 48) for _ in range(16)], regex=ANY_TEXT_REGEX))
        out.append(batch("one_token_idle", [23], [1]))
        out.append(batch("one_token_mixed", [12, 40, 7, 90], [1, 24, 1, 16]))
    elif profile in ("tree", "tree-radix", "tree-eos", "eos-ties"):
        # The matrix (radix, eos) workload, same prompts, every request with its top logprobs:
        # where spec v1 and spec v2 part, the margins at the first differing token say whether
        # it was a near-tie (``near_tie_checks``).
        base = {"tree": "matrix", "tree-radix": "radix", "tree-eos": "eos", "eos-ties": "eos"}[profile]
        out = _with_top_logprobs(scenarios(base, vocab, seed=seed, soak_requests=soak_requests,
                                           eos_ids=eos_ids))
    else:
        raise ValueError(f"unknown profile {profile!r}")
    return out


def _with_top_logprobs(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A profile's scenarios with every request's top logprobs asked for (``TREE_TOP_LOGPROBS``)."""
    for sc in out:
        sc["return_logprob"] = True
        sc["top_logprobs_num"] = TREE_TOP_LOGPROBS
    return out


#: The ``grammar`` profile's constraint: any text at all (xgrammar compiles it; no token is masked).
ANY_TEXT_REGEX = "[\\s\\S]*"
#: Top logprobs per position in the ``tree`` profile: enough to find the other run's token at
#: the first differing position (bf16 logits of the tiny models tie three ways at times).
TREE_TOP_LOGPROBS = 5
EOS_ROUND = 192
EOS_MAX_ROUNDS = 10
EOS_NEW_TOKENS = 80
EOS_WANTED = 8
RADIX_PREFIX = 1500
RADIX_SUFFIXES = 24


def finish_kind(rec: dict[str, Any], eos_ids: Sequence[int]) -> str:
    """``eos``, ``stop`` (a stop token or string), ``length``, ``abort`` or what SGLang said."""
    finish = rec.get("finish")
    if finish == "stop":
        return "eos" if rec.get("matched") in eos_ids else "stop"
    return str(finish) if finish else "none"


def finish_counts(outputs: Sequence[dict[str, Any] | None], eos_ids: Sequence[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outputs:
        if o:
            k = finish_kind(o, eos_ids)
            counts[k] = counts.get(k, 0) + 1
    return counts


def stop_token_choice(output: Sequence[int], index: int) -> int | None:
    """The stop token for request ``index`` of a ``stop_from`` scenario: a token that the
    unconstrained output emits at position 4..53 (so the constrained run stops early)."""
    if len(output) < 6:
        return None
    return int(output[min(len(output) - 1, 4 + (index * 5) % 50)])


def stop_string_choice(text: str, index: int) -> str | None:
    """A stop string for ``text_stop``: the (index % 5 + 3)-th word of the unconstrained text."""
    words = text.split()
    k = index % 5 + 3
    return f" {words[k]}" if len(words) > k + 1 else None


# ----------------------------------------------------------------------------- worker (inside SGLang)


def _gpu_memory_mib(pids: Sequence[int]) -> int | None:
    """GPU memory used by these processes (nvidia-smi), or None when it cannot be read."""
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total, seen = 0, False
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) in pids:
            total += int(parts[1]) if parts[1].isdigit() else 0
            seen = True
    return total if seen else None


def _record(o: dict[str, Any]) -> dict[str, Any]:
    meta = o.get("meta_info", {}) or {}
    reason = meta.get("finish_reason")
    rec = {"output_ids": [int(t) for t in o.get("output_ids", [])],
           "finish": reason.get("type") if isinstance(reason, dict) else reason,
           "accept": meta.get("spec_accept_length")}
    if isinstance(reason, dict) and reason.get("matched") is not None:
        rec["matched"] = reason["matched"]
    if meta.get("cached_tokens") is not None:
        rec["cached"] = int(meta["cached_tokens"])
    if "text" in o and o["text"] is not None:
        rec["text"] = o["text"]
    if meta.get("output_token_logprobs") is not None:
        rec["logprobs"] = [[lp, tid] for lp, tid, *_ in meta["output_token_logprobs"]]
    if meta.get("output_top_logprobs") is not None:
        rec["top_logprobs"] = [[[lp, tid] for lp, tid, *_ in step] if step else None
                               for step in meta["output_top_logprobs"]]
    return rec


def _run_async(engine: Any, sc: dict[str, Any], pids: Sequence[int]) -> dict[str, Any]:
    prompts, params = sc["input_ids"], sc["sampling_params"]
    # Logprobs (where the scenario asks for them) on the requests that run to the end; a
    # streamed request that is aborted is compared by its output ids alone.
    aborts = {int(k): v for k, v in sc.get("abort_after_chunks", {}).items()}
    results: list[dict[str, Any] | None] = [None] * len(prompts)
    memory: list[list[int | None]] = []
    done = 0

    async def one(i: int, sem: asyncio.Semaphore) -> None:
        nonlocal done
        async with sem:
            rid = f"{sc['name']}-{i}"
            if i in aborts:
                gen = await engine.async_generate(input_ids=prompts[i], sampling_params=params[i],
                                                  stream=True, rid=rid)
                last: dict[str, Any] = {}
                chunks = 0
                async for chunk in gen:
                    last = {"output_ids": list(chunk.get("output_ids", [])), "meta_info": chunk.get("meta_info")}
                    chunks += 1
                    if chunks == aborts[i]:
                        engine.tokenizer_manager.abort_request(rid)
                rec = _record(last)
                rec["abort_requested"] = True
            else:
                rec = _record(await engine.async_generate(input_ids=prompts[i], sampling_params=params[i], rid=rid,
                                                          **_logprob_kw(sc)))
            results[i] = rec
            done += 1
            every = int(sc.get("memory_every") or 0)
            if every and done % every == 0:
                memory.append([done, _gpu_memory_mib(pids)])

    async def main() -> None:
        sem = asyncio.Semaphore(int(sc["concurrency"]))
        await asyncio.gather(*(one(i, sem) for i in range(len(prompts))))

    asyncio.get_event_loop().run_until_complete(main())
    return {"outputs": results, "memory_mib": memory}


def run_scenario(engine: Any, sc: dict[str, Any], done: dict[str, Any], pids: Sequence[int]) -> dict[str, Any]:
    kind = sc["kind"]
    if kind == "batch":
        outs = engine.generate(input_ids=sc["input_ids"], sampling_params=sc["sampling_params"], **_logprob_kw(sc))
        return {"outputs": [_record(o) for o in outs]}
    if kind == "stop_from":
        src = done[sc["source"]]
        srcsc = src["scenario"]
        prompts, params, stops = [], [], []
        for i, rec in enumerate(src["outputs"][: sc["count"]]):
            stop = stop_token_choice(rec["output_ids"], i)
            if stop is None:
                continue
            prompts.append(srcsc["input_ids"][i])
            params.append(_greedy(sc["max_new_tokens"], ignore_eos=False, stop_token_ids=[stop]))
            stops.append(stop)
        outs = engine.generate(input_ids=prompts, sampling_params=params, **_logprob_kw(sc))
        return {"outputs": [_record(o) for o in outs], "stops": stops}
    if kind == "async":
        return _run_async(engine, sc, pids)
    if kind == "eos_search":
        return _eos_search(engine, sc)
    if kind == "eos_churn":
        return _eos_churn(engine, sc, done[sc["source"]])
    if kind == "text":
        outs = engine.generate(prompt=sc["prompts"], sampling_params=sc["sampling_params"])
        return {"outputs": [_record(o) for o in outs]}
    if kind == "text_stop_from":
        src = done[sc["source"]]
        prompts, params, stops = [], [], []
        for i, rec in enumerate(src["outputs"]):
            stop = stop_string_choice(rec.get("text") or "", i)
            if stop is None:
                continue
            prompts.append(src["scenario"]["prompts"][i])
            params.append(_greedy(sc["max_new_tokens"], ignore_eos=False, stop=[stop]))
            stops.append(stop)
        outs = engine.generate(prompt=prompts, sampling_params=params)
        return {"outputs": [_record(o) for o in outs], "stops": stops}
    raise ValueError(f"unknown scenario kind {kind!r}")


def meets_eos(output_ids: Sequence[int], eos: set[int]) -> bool:
    """An ``eos_search`` output that ``eos_churn`` reruns: it holds an EOS id before its last
    token (the rerun, EOS honoured, stops on it)."""
    return bool(eos & set(output_ids[:-1]))


def _eos_search(engine: Any, sc: dict[str, Any]) -> dict[str, Any]:
    """Rounds of greedy requests (ignore_eos) until ``want`` outputs hold an EOS id."""
    eos = set(sc["eos_ids"])
    outputs: list[dict[str, Any]] = []
    prompts: list[list[int]] = []
    found: list[int] = []
    for rnd in sc["rounds"]:
        outs = engine.generate(input_ids=rnd, sampling_params=[_greedy(sc["max_new_tokens"]) for _ in rnd],
                               **_logprob_kw(sc))
        for ids, o in zip(rnd, outs):
            rec = _record(o)
            if meets_eos(rec["output_ids"], eos):
                found.append(len(outputs))
            outputs.append(rec)
            prompts.append(ids)
        if len(found) >= sc["want"]:
            break
    return {"outputs": outputs, "prompts": prompts, "found": found}


def eos_churn_requests(sc: dict[str, Any], search: dict[str, Any]) -> tuple[list[list[int]], list[dict[str, Any]], list[int]]:
    """The requests of ``eos_churn`` from ``eos_search``'s result: every prompt whose output met
    EOS (EOS honoured), ``stop_requests`` with a stop token from their output and
    ``length_requests`` with a budget their output meets no EOS in, mixed in a fixed order.
    Returns prompts, sampling params and the stop tokens (None for the others)."""
    src = search["scenario"]
    found = set(search["found"])
    new = src["max_new_tokens"]
    plain = [i for i, rec in enumerate(search["outputs"]) if i not in found]
    reqs: list[tuple[int, dict[str, Any], int | None]] = [(i, _greedy(new, ignore_eos=False), None) for i in sorted(found)]
    for k, i in enumerate(plain[: sc["stop_requests"]]):
        stop = stop_token_choice(search["outputs"][i]["output_ids"], k)
        if stop is not None:
            reqs.append((i, _greedy(new, ignore_eos=False, stop_token_ids=[stop]), stop))
    for k, i in enumerate(plain[sc["stop_requests"]: sc["stop_requests"] + sc["length_requests"]]):
        reqs.append((i, _greedy(8 + (k * 7) % (new - 8), ignore_eos=False), None))
    random.Random(f"{sc['seed']}-eos-churn").shuffle(reqs)
    return ([search["prompts"][i] for i, _, _ in reqs], [p for _, p, _ in reqs], [st for _, _, st in reqs])


def request_key(prompt: Sequence[int], params: dict[str, Any]) -> str:
    """A request's identity (its prompt and sampling parameters), the same in every run."""
    text = json.dumps([list(prompt), params], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _eos_churn(engine: Any, sc: dict[str, Any], search: dict[str, Any]) -> dict[str, Any]:
    prompts, params, stops = eos_churn_requests(sc, search)
    outs = engine.generate(input_ids=prompts, sampling_params=params, **_logprob_kw(sc))
    recs = [_record(o) for o in outs]
    eos_ids = search["scenario"]["eos_ids"]
    return {"outputs": recs, "stops": stops, "finish_counts": finish_counts(recs, eos_ids),
            "keys": [request_key(x, p) for x, p in zip(prompts, params)]}


def align_adaptive(sc: dict[str, Any], a: dict[str, Any] | None, b: dict[str, Any] | None
                   ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str]:
    """For a tree (where two runs may part at near-ties): the requests both runs of an adaptive
    scenario sent. ``eos_search`` stops after as many rounds as its own outputs need, so the
    runs share their first rounds; ``eos_churn`` picks its requests from its own search, so the
    runs share the requests with the same key (prompt and sampling parameters), compared in
    the first run's order. Returns the two entries cut to those requests, and a note (empty
    when nothing was cut). Other scenarios, and errors, pass through."""
    if not a or not b or "error" in a or "error" in b or sc["kind"] not in ("eos_search", "eos_churn"):
        return a, b, ""
    na, nb = len(a["outputs"]), len(b["outputs"])
    if sc["kind"] == "eos_search":
        n = min(na, nb)
        if na == nb:
            return a, b, ""
        return ({**a, "outputs": a["outputs"][:n]}, {**b, "outputs": b["outputs"][:n]},
                f"{sc['name']}: the first {n} requests compared (the rounds both runs sent; {na} / {nb} sent)")
    if "keys" not in a or "keys" not in b or a["keys"] == b["keys"]:
        return a, b, ""
    where = {k: i for i, k in enumerate(b["keys"])}
    pairs = [(i, where[k]) for i, k in enumerate(a["keys"]) if k in where]

    def cut(entry: dict[str, Any], idx: list[int]) -> dict[str, Any]:
        out = {**entry, "outputs": [entry["outputs"][i] for i in idx], "keys": [entry["keys"][i] for i in idx]}
        if entry.get("stops") is not None:
            out["stops"] = [entry["stops"][i] for i in idx]
        return out

    return (cut(a, [i for i, _ in pairs]), cut(b, [j for _, j in pairs]),
            f"{sc['name']}: {len(pairs)} requests sent by both runs compared ({na} / {nb} sent; the "
            f"others were picked from outputs that part at a near-tie)")


def _settle(spec: dict[str, Any]) -> None:
    """Let the scheduler drop the previous scenario's finished requests before the next one
    arrives. Without the pause, whether the next scenario's first prefill still sees them in
    the running batch depends on host timing, which the plugin changes: a different batch
    composition, then (kernels are not batch-invariant) a flipped near-tie in greedy decoding."""
    time.sleep(float(spec.get("settle_s", 1.0)))


def run_scenarios(spec: dict[str, Any], result: dict[str, Any], run_one: Any) -> None:
    """Every scenario of ``spec`` in order through ``run_one(scenario, done)``, each after a
    pause (``_settle``); results, or the error, go to ``result["scenarios"]``."""
    done: dict[str, Any] = {}
    for sc in spec["scenarios"]:
        _settle(spec)
        t1 = time.perf_counter()
        try:
            res = run_one(sc, done)
            res["scenario"] = sc
            done[sc["name"]] = res
            entry = {k: v for k, v in res.items() if k != "scenario"}
        except Exception as exc:  # recorded: both runs failing alike means "unsupported"
            import traceback

            traceback.print_exc()
            entry = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        entry["seconds"] = time.perf_counter() - t1
        result["scenarios"][sc["name"]] = entry
        print(f"scenario {sc['name']}: {entry.get('error', 'ok')} in {entry['seconds']:.1f} s", flush=True)


def server_argv(kwargs: dict[str, Any], port: int) -> list[str]:
    """``sglang.launch_server`` flags for Engine keyword arguments (``True``: a bare flag); the
    server listens on ``port`` (the first port of its block, below SGLang's gRPC offset limit)."""
    flags = engine_config.server_flags({k: v for k, v in kwargs.items() if k not in ("host", "port")})
    return flags + ["--host", "127.0.0.1", "--port", str(port)]


def _http_json(url: str, payload: dict[str, Any] | None = None, timeout: float = 300) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _http_sse(url: str, payload: dict[str, Any], timeout: float = 300) -> list[dict[str, Any]]:
    """The ``data:`` events of a streamed response, up to ``[DONE]``."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            body = line[len("data:"):].strip()
            if body == "[DONE]":
                break
            events.append(json.loads(body))
    return events


def _completion(base: str, model: str, prompt: str, params: dict[str, Any], stream: bool) -> dict[str, Any]:
    """One OpenAI ``/v1/completions`` request (greedy); the record ``compare_scenario`` reads."""
    payload = {"model": model, "prompt": prompt, "max_tokens": params["max_new_tokens"], "temperature": 0.0,
               "ignore_eos": params.get("ignore_eos", True), "stream": stream}
    if params.get("stop"):
        payload["stop"] = params["stop"]
    if not stream:
        body = _http_json(base + "/v1/completions", payload)
        choice = body["choices"][0]
        return {"output_ids": [], "text": choice["text"], "finish": choice.get("finish_reason"),
                "n_tokens": (body.get("usage") or {}).get("completion_tokens")}
    payload["stream_options"] = {"include_usage": True}
    text, finish, n_tokens = [], None, None
    for event in _http_sse(base + "/v1/completions", payload):
        for choice in event.get("choices") or []:
            text.append(choice.get("text") or "")
            finish = choice.get("finish_reason") or finish
        if event.get("usage"):
            n_tokens = event["usage"].get("completion_tokens")
    return {"output_ids": [], "text": "".join(text), "finish": finish, "n_tokens": n_tokens, "chunks": len(text)}


def run_http_scenario(base: str, model: str, sc: dict[str, Any], done: dict[str, Any]) -> dict[str, Any]:
    """A scenario of the ``http`` profile against a running ``sglang.launch_server``."""
    kind = sc["kind"]
    stops: list[str] = []
    if kind == "http_stop_from":
        src = done[sc["source"]]
        prompts, params = [], []
        for i, rec in enumerate(src["outputs"]):
            stop = stop_string_choice(rec.get("text") or "", i)
            if stop is not None:
                prompts.append(src["scenario"]["prompts"][i])
                params.append(_greedy(sc["max_tokens"], ignore_eos=False, stop=[stop]))
                stops.append(stop)
        calls = [lambda p=p, q=q: _completion(base, model, p, q, False) for p, q in zip(prompts, params)]
    elif kind == "http_completions":
        calls = [lambda p=p, q=q: _completion(base, model, p, q, bool(sc.get("stream")))
                 for p, q in zip(sc["prompts"], sc["sampling_params"])]
    elif kind == "http_generate":
        extra = {k: sc[k] for k in ("return_logprob", "top_logprobs_num") if k in sc}
        calls = [lambda i=i, q=q: _record(_http_json(base + "/generate", dict(input_ids=i, sampling_params=q, **extra)))
                 for i, q in zip(sc["input_ids"], sc["sampling_params"])]
    else:
        raise ValueError(f"unknown http scenario kind {kind!r}")
    with ThreadPoolExecutor(max_workers=int(sc.get("concurrency", 4))) as pool:
        outputs = list(pool.map(lambda call: call(), calls))
    return {"outputs": outputs, "stops": stops} if kind == "http_stop_from" else {"outputs": outputs}


def server_worker_main(spec: dict[str, Any]) -> int:
    """The ``http`` profile: ``python -m sglang.launch_server`` on the port of its block, then
    every scenario over HTTP. The server's output goes to this worker's log."""
    port = int(spec["engine_kwargs"]["port"])
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "sglang.launch_server", *server_argv(spec["engine_kwargs"], port)]
    print("server argv: " + " ".join(argv[1:]), flush=True)
    t0 = time.perf_counter()
    server = subprocess.Popen(argv)
    result: dict[str, Any] = {"pid": server.pid, "scenarios": {}}
    try:
        deadline = time.monotonic() + float(spec.get("server_start_s", 300))
        not_ready = launch.wait_until_ready(server, base + "/health", deadline)
        if not_ready:
            raise RuntimeError(f"sglang.launch_server {not_ready}")
        model = _http_json(base + "/v1/models")["data"][0]["id"]
        try:
            info = _http_json(base + "/get_server_info")
            result["effective"] = {k: info.get(k) for k in engine_config.EFFECTIVE_KEYS if k in info}
        except (urllib.error.URLError, OSError, ValueError) as exc:
            result["effective"] = {"error": repr(exc)[:300]}
        _http_json(base + "/generate", {"text": "w3 w4 w5 w6", "sampling_params": _greedy(16)})
        result["startup_s"] = time.perf_counter() - t0
        run_scenarios(spec, result, lambda sc, done: run_http_scenario(base, model, sc, done))
        time.sleep(float(spec.get("probe_settle_s", 2.0)))
    finally:
        Path(spec["result_path"]).write_text(json.dumps(result))
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0


class FakePrefillPeer:
    """A PD-decode Engine whose requests name SGLang's fake prefill peer
    (``FAKE_BOOTSTRAP_HOST``, bootstrap room 0), as SGLang's own one-batch benchmark sends them.

    SGLang 0.5.12.x builds a request's bootstrap address before it checks for the fake
    transfer backend, so a request without a bootstrap host stops the decode scheduler
    (``NetworkAddress`` of ``None``), stock and patched alike. Everything else is the Engine's."""

    def __init__(self, engine: Any) -> None:
        from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

        self._engine = engine
        self._peer = {"bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, **kw: Any) -> Any:
        return self._engine.generate(**self._peer, **kw)

    async def async_generate(self, **kw: Any) -> Any:
        return await self._engine.async_generate(**self._peer, **kw)


def worker_main(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    if spec.get("server"):
        return server_worker_main(spec)
    import sglang

    print(f"worker pid {os.getpid()} mode {os.environ.get(child_env.ENV_MODE)} sglang {sglang.__version__}", flush=True)
    print("engine kwargs: " + json.dumps(spec["engine_kwargs"]), flush=True)
    t0 = time.perf_counter()
    engine = sglang.Engine(**spec["engine_kwargs"])
    result: dict[str, Any] = {"pid": os.getpid(), "startup_s": time.perf_counter() - t0, "scenarios": {},
                              "sglang_version": getattr(sglang, "__version__", None),
                              "effective": engine_config.effective_config(engine)}
    try:
        pids = list(engine.get_all_child_pids()) + [os.getpid()]
        result["child_pids"] = pids
        if spec["engine_kwargs"].get("disaggregation_mode") == "decode":
            engine = FakePrefillPeer(engine)
        warm = {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}
        if spec["engine_kwargs"].get("skip_tokenizer_init", True):
            engine.generate(input_ids=[list(range(3, 19))], sampling_params=[warm])
        else:
            engine.generate(prompt=["w3 w4 w5 w6"], sampling_params=[warm])
        result["memory_after_warmup_mib"] = _gpu_memory_mib(pids)
        run_scenarios(spec, result, lambda sc, done: run_scenario(engine, sc, done, pids))
        result["memory_end_mib"] = _gpu_memory_mib(pids)
        time.sleep(float(spec.get("probe_settle_s", 2.0)))
    finally:
        Path(spec["result_path"]).write_text(json.dumps(result))
        engine.shutdown()
    return 0


# ----------------------------------------------------------------------------- evaluation (pure)


def _first_diff(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if k is None and len(a) != len(b):
        k = min(len(a), len(b))
    return k


def close_logprobs(a: Any, b: Any, tol: float) -> bool:
    """``a == b``, but floats (logprobs) only within ``tol``; ids and structure exactly."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close_logprobs(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool)
                and not isinstance(b, bool) and abs(a - b) <= tol)
    return a == b


def _close_tops(a: Sequence[Any] | None, b: Sequence[Any] | None, tol: float) -> bool:
    """Two runs' top logprobs of one position within ``tol``: candidates that tie within the
    tolerance may come in another order, and one at the cut-off may be in one list only (its
    logprob then within ``tol`` of the other list's last)."""
    if not a or not b:
        return not a and not b
    da = {int(t): float(lp) for lp, t in a if lp is not None}
    db = {int(t): float(lp) for lp, t in b if lp is not None}
    if len(da) != len(db):
        return False
    for mine, other in ((da, db), (db, da)):
        floor = min(other.values())
        for t, lp in mine.items():
            ref = other.get(t, floor)
            if abs(lp - ref) > tol:
                return False
    return True


def same_logprobs(a: dict[str, Any], b: dict[str, Any], tol: float = 0.0) -> bool:
    if not tol:
        return a.get("logprobs") == b.get("logprobs") and a.get("top_logprobs") == b.get("top_logprobs")
    ta, tb = a.get("top_logprobs") or [], b.get("top_logprobs") or []
    return (close_logprobs(a.get("logprobs"), b.get("logprobs"), tol) and len(ta) == len(tb)
            and all(_close_tops(x, y, tol) for x, y in zip(ta, tb)))


def _same_output(a: dict[str, Any], b: dict[str, Any], logprobs: bool, tol: float = 0.0) -> bool:
    same = (a["output_ids"] == b["output_ids"] and a.get("text") == b.get("text")
            and a.get("finish") == b.get("finish"))
    if logprobs:
        same = same and same_logprobs(a, b, tol)
    return same


#: How far a logprob of a ``tree_v2`` case's patched run (spec v2) may be from stock's (spec
#: v1) where their tokens agree: the two workers compute the same bf16 logits in kernels of other
#: shapes, which round differently: up to 0.129 seen on the H100 (2026-11-24), spec v1 vs v2
#: and SGLang 0.5.13 vs the plugin alike (``NEAR_TIE_NATS`` says what that means).
TREE_V2_LOGPROB_TOL = 0.25


def _logprob_check(tol: float) -> str:
    return "logprobs identical" if not tol else f"logprobs within {tol:g}"


MISMATCH_CHECKS = (": outputs identical", ": " + _logprob_check(0.0), ": " + _logprob_check(TREE_V2_LOGPROB_TOL))


def parts_as_prefixes(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two token lists disagree before the shorter one ends (an aborted request's
    output is compared with another run's as a prefix)."""
    n = min(len(a), len(b))
    return list(a[:n]) != list(b[:n])


def stock_scatter_notes(sc_list: Sequence[dict[str, Any]], stock: dict[str, Any], rerun: dict[str, Any],
                        patched: dict[str, Any]) -> list[str]:
    """For a batch-variant case: per scenario, how many finished requests two stock runs of the
    same workload disagree on, next to how many the patched run disagrees with the first on."""
    s1, s2, pp = ((r.get("result") or {}).get("scenarios", {}) for r in (stock, rerun, patched))
    if rerun.get("returncode") != 0 or not s2:
        return ["second stock run did not finish"]
    notes = []
    for sc in sc_list:
        a, b, p = ((r.get(sc["name"]) or {}).get("outputs") for r in (s1, s2, pp))
        if not a or not b or not p or not len(a) == len(b) == len(p):
            continue
        done = [i for i, (x, y, z) in enumerate(zip(a, b, p))
                if x and y and z and not (x.get("abort_requested") or y.get("abort_requested")
                                          or z.get("abort_requested"))]
        ss = sum(a[i]["output_ids"] != b[i]["output_ids"] for i in done)
        sp = sum(a[i]["output_ids"] != p[i]["output_ids"] for i in done)
        finished = set(done)
        cut = [i for i, (x, y, z) in enumerate(zip(a, b, p)) if x and y and z and i not in finished]
        note = (f"{sc['name']}: stock run 1 vs stock run 2 differ on {ss}/{len(done)} finished requests; "
                f"stock run 1 vs patched on {sp}/{len(done)}")
        if cut:
            sb = sum(parts_as_prefixes(a[i]["output_ids"], b[i]["output_ids"]) for i in cut)
            spc = sum(parts_as_prefixes(a[i]["output_ids"], p[i]["output_ids"]) for i in cut)
            note += (f"; aborted ones parting as prefixes: stock vs stock {sb}/{len(cut)}, "
                     f"stock vs patched {spc}/{len(cut)}")
        notes.append(note)
    return notes


def adjudicate(sc_list: Sequence[dict[str, Any]], checks: list[Check], stock: dict[str, Any],
               rerun: dict[str, Any], patched: dict[str, Any], logprob_tol: float = 0.0) -> list[Check]:
    """Second opinion on output mismatches, from a second stock run of the same workload.

    Greedy decoding in SGLang is reproducible only as far as its kernels are batch-invariant:
    when two runs batch the same requests differently (arrival timing), a near-tie between two
    logits can flip. A mismatch therefore counts against the plugin only if stock SGLang
    reproduces itself: for each scenario that mismatched, every patched output must equal the
    output of one of the two stock runs, and the two stock runs must disagree somewhere in
    that scenario (else stock is reproducible there and the plugin changed the output).
    The original check stays in the record, marked, next to the new one. ``logprob_tol``: as
    in ``compare_scenario``."""
    by_name = {sc["name"]: sc for sc in sc_list}
    s1 = (stock.get("result") or {}).get("scenarios", {})
    s2 = (rerun.get("result") or {}).get("scenarios", {})
    pp = (patched.get("result") or {}).get("scenarios", {})
    out: list[Check] = []
    for check in checks:
        name, _, what = check.name.partition(": ")
        if check.ok or f": {what}" not in MISMATCH_CHECKS or name not in by_name:
            out.append(check)
            continue
        logprobs = what != "outputs identical"
        a, b, p = ((r.get(name) or {}).get("outputs") for r in (s1, s2, pp))
        if rerun.get("returncode") != 0 or not a or not b or not p or not (len(a) == len(b) == len(p)):
            out.append(check)
            out.append(Check(f"{name}: second stock run", False, "the second stock run did not finish"))
            continue
        unstable = [i for i, (x, y) in enumerate(zip(a, b)) if not x.get("abort_requested")
                    and not _same_output(x, y, logprobs, logprob_tol)]
        foreign = [i for i, (x, y, z) in enumerate(zip(a, b, p)) if not z.get("abort_requested")
                   and not _same_output(x, z, logprobs, logprob_tol) and not _same_output(y, z, logprobs, logprob_tol)]
        ok = bool(unstable) and not foreign
        out.append(Check(check.name, ok, ("[stock itself not reproducible here: see next check] " if ok else "")
                         + check.detail))
        out.append(Check(f"{name}: patched {'outputs' if not logprobs else 'logprobs'} match a stock run", ok,
                         f"stock run 1 vs 2 differ on requests {unstable[:8]}; patched matches neither on "
                         f"{foreign[:8]}"))
    return out


#: Where a ``tree_v2`` case's spec v2 output parts from spec v1 (or from SGLang 0.5.13), the
#: difference counts as a near-tie when, at the first differing token, each side rates the
#: other side's token at most this far below its own choice (its top-1 logprob minus its
#: logprob of the other token). The tiny models' logits are bf16 (around 8-32: a unit in the
#: last place is 1/16 or 1/8 there); on the H100 (2026-11-24) the two sides' logprobs of the
#: same token at positions where they still agree differed by up to 0.127, and every first
#: difference, spec v1 vs v2 and SGLang 0.5.13 vs the plugin alike, had margins of 0 (an
#: exact tie, which greedy breaks towards the lower id), 1/16, 1/8 or 1/4 on each side.
NEAR_TIE_NATS = 0.25


def _margin(rec: dict[str, Any], k: int, other: int) -> float | None:
    """How far below its own top-1 a run rates token ``other`` at output position ``k``
    (None: ``other`` is not among the top logprobs it returned there)."""
    tops = rec.get("top_logprobs") or []
    step = tops[k] if k < len(tops) else None
    if not step or step[0][0] is None:
        return None
    by_id = {int(tid): float(lp) for lp, tid in step if lp is not None}
    return max(by_id.values()) - by_id[other] if other in by_id else None


def budget_hides_stop(a: dict[str, Any], b: dict[str, Any], k: int, max_accept: int | None) -> bool:
    """Whether two outputs that agree on their first ``k`` tokens, one of them ending there on
    its stop token (EOS or a stop id), part only because SGLang checks ``max_new_tokens``
    before stop tokens in a multi-token accept (``Req.check_finished``): the other output holds
    the same stop token at the same position, ends by length, and its tokens from that stop
    token on fit in one accept step (at most ``max_accept`` = steps + 1). The two runs' accept
    steps then split differently there: one run's step ends before the budget and stops on
    the token, the other's reaches the budget and ignores it (stock spec v1 or v2 alike)."""
    short, long_ = (a, b) if len(a["output_ids"]) < len(b["output_ids"]) else (b, a)
    ids = long_["output_ids"]
    if not max_accept or k < 1 or len(short["output_ids"]) != k or k > len(ids):
        return False
    stop = short["output_ids"][-1]
    return (short.get("finish") == "stop" and short.get("matched") == stop and ids[k - 1] == stop
            and long_.get("finish") == "length" and len(ids) - (k - 1) <= max_accept)


def first_difference(a: dict[str, Any], b: dict[str, Any], max_accept: int | None = None) -> dict[str, Any]:
    """Where two greedy outputs of one prompt part, and whether it is a near-tie: the first
    differing position, each side's token there, and each side's margin, how far below its
    own choice it rates the other side's token (``_margin``); both within ``NEAR_TIE_NATS``.
    Where one output ends and the other goes on, ``explained`` says whether SGLang's length
    check hid the same stop token on the longer side (``budget_hides_stop``)."""
    k = _first_diff(a["output_ids"], b["output_ids"])
    info: dict[str, Any] = {"position": k}
    if k is None:
        info.update(near_tie=False, why="no token differs")
        return info
    if k >= min(len(a["output_ids"]), len(b["output_ids"])):
        # One side stopped where the other went on: no token to weigh, say how each side ended.
        info.update(near_tie=False, why="one output is a prefix of the other",
                    lengths=[len(a["output_ids"]), len(b["output_ids"])],
                    finish=[[r.get("finish"), r.get("matched")] for r in (a, b)],
                    last=[r["output_ids"][k - 1] if k else None for r in (a, b)],
                    next=[r["output_ids"][k] if k < len(r["output_ids"]) else None for r in (a, b)])
        if budget_hides_stop(a, b, k, max_accept):
            info["explained"] = ("the same stop token on both sides; the longer side's accept step "
                                 "reached max_new_tokens, which SGLang checks first")
        return info
    ta, tb = a["output_ids"][k], b["output_ids"][k]
    ma, mb = _margin(a, k, tb), _margin(b, k, ta)
    info.update(tokens=[ta, tb], margins=[None if m is None else round(m, 5) for m in (ma, mb)])
    if ma is None or mb is None:
        info["near_tie"] = False
        info["why"] = "the other side's token is not among this side's top logprobs there"
        return info
    info["near_tie"] = ma <= NEAR_TIE_NATS and mb <= NEAR_TIE_NATS
    return info


def logprob_noise(so: Sequence[dict[str, Any]], po: Sequence[dict[str, Any]]) -> float | None:
    """Largest |logprob difference| of the chosen token over the positions where two runs'
    outputs still agree (every position before each request's first difference)."""
    worst = None
    for s, p in zip(so, po):
        if not s or not p or not s.get("logprobs") or not p.get("logprobs"):
            continue
        k = _first_diff(s["output_ids"], p["output_ids"])
        k = min(len(s["logprobs"]), len(p["logprobs"])) if k is None else k
        for (x, _), (y, _) in zip(s["logprobs"][:k], p["logprobs"][:k]):
            if x is not None and y is not None:
                worst = max(worst or 0.0, abs(float(x) - float(y)))
    return worst


def near_tie_checks(sc: dict[str, Any], a: dict[str, Any] | None, b: dict[str, Any] | None,
                    label: str = "", max_accept: int | None = None) -> list[Check]:
    """Every request of a scenario whose output differs between two runs (``a``, ``b``: their
    ``scenarios[name]`` entries, with top logprobs) parts at a near-tie (``first_difference``)."""
    name = f"{label}{sc['name']}"
    if not a or not b or "error" in a or "error" in b or not sc.get("top_logprobs_num"):
        return []
    # A stop_from scenario takes each run's stop tokens from its own earlier outputs: a request
    # whose stop tokens differ (taken after an earlier difference, judged there) is not compared.
    sa, sb = a.get("stops"), b.get("stops")
    other_stop = {i for i, (x, y) in enumerate(zip(sa, sb)) if x != y} if sa and sb else set()
    diffs = [(i, first_difference(x, y, max_accept)) for i, (x, y) in enumerate(zip(a["outputs"], b["outputs"]))
             if x and y and not x.get("abort_requested") and not y.get("abort_requested")
             and x["output_ids"] != y["output_ids"] and i not in other_stop]
    noise = logprob_noise(a["outputs"], b["outputs"])
    bad = [(i, d) for i, d in diffs if not d["near_tie"] and not d.get("explained")]
    cut = sum(1 for _, d in diffs if d.get("explained"))
    margins = [m for _, d in diffs for m in (d.get("margins") or []) if m is not None]
    detail = (f"{len(diffs)} differing requests, {len(bad)} not near-ties; largest margin at a first "
              f"difference {max(margins) if margins else None}; logprob noise where the outputs agree "
              f"{None if noise is None else round(noise, 5)}"
              + (f"; {len(other_stop)} requests with other stop tokens not compared" if other_stop else "")
              + (f"; {cut} requests part where SGLang's length check hid the same stop token on one side "
                 f"(budget_hides_stop)" if cut else ""))
    if bad:
        detail += "; e.g. " + "; ".join(f"request {i}: {d}" for i, d in bad[:3])
    return [Check(f"{name}: every difference a near-tie (margin <= {NEAR_TIE_NATS:g} on both sides)",
                  not bad, detail)]


def explain_by_near_ties(checks: list[Check], tie_checks: Sequence[Check], label: str = "") -> list[Check]:
    """``checks`` with each failed "outputs identical" check of a scenario whose differences
    are all near-ties marked as explained (kept in the record, next to its near-tie check).
    So is its "aborted outputs agree as prefixes" check: a streamed request the client aborts
    carries no logprobs, so where it parts it is judged with its scenario (a batch-variant
    case's notes count how often two stock runs' aborted outputs part too)."""
    tied = {c.name[len(label):].split(": ", 1)[0] for c in tie_checks if c.ok}
    out = []
    for c in checks:
        scen, _, what = c.name[len(label):].partition(": ") if c.name.startswith(label) else ("", "", "")
        if not c.ok and what in ("outputs identical", "aborted outputs agree as prefixes") and scen in tied:
            c = Check(c.name, True, "[every difference a near-tie: see that check] " + c.detail)
        out.append(c)
    return out


def output_checks(sc_list: Sequence[dict[str, Any]], a: dict[str, Any], b: dict[str, Any], logprob_tol: float,
                  *, near_ties: bool, label: str = "", mismatch_only: bool = False,
                  max_accept: int | None = None) -> list[Check]:
    """Two runs' outputs (``a``, ``b``: their ``scenarios`` dicts), scenario by scenario
    (``compare_scenario``; ``mismatch_only``: its output and logprob comparisons alone), each
    check named with ``label`` in front; ``near_ties`` (trees): then each scenario's near-tie
    check, and its "outputs identical" check marked as explained where that one holds."""
    checks: list[Check] = []
    ties: list[Check] = []
    for sc in sc_list:
        x, y = a.get(sc["name"]), b.get(sc["name"])
        if near_ties:  # trees: an adaptive scenario's runs may pick other requests
            x, y, cut = align_adaptive(sc, x, y)
            if cut:
                checks.append(Check(label + f"{sc['name']}: requests compared", bool(x["outputs"]), cut))
        checks += [Check(label + c.name, c.ok, c.detail) for c in compare_scenario(sc, x, y, logprob_tol)
                   if not mismatch_only or c.name.endswith(MISMATCH_CHECKS)]
        if near_ties:
            ties += near_tie_checks(sc, x, y, label, max_accept)
    return explain_by_near_ties(checks, ties, label) + ties


def compare_scenario(sc: dict[str, Any], stock: dict[str, Any] | None, patched: dict[str, Any] | None,
                     logprob_tol: float = 0.0) -> list[Check]:
    """Stock vs patched for one scenario (both are a run's ``scenarios[name]`` entry); output ids
    always exactly, logprobs within ``logprob_tol`` (0: exactly)."""
    name = sc["name"]
    if not stock or not patched:
        return [Check(f"{name}: ran", False, "missing from a run")]
    if "error" in stock or "error" in patched:
        same = stock.get("error") == patched.get("error")
        detail = f"stock: {stock.get('error', 'ok')}; patched: {patched.get('error', 'ok')}"
        return [Check(f"{name}: ran", False, ("fails alike in stock SGLang: " if same else "") + detail)]
    checks: list[Check] = []
    so, po = stock["outputs"], patched["outputs"]
    if len(so) != len(po) or any(o is None for o in so + po):
        return [Check(f"{name}: ran", False, f"{len(so)} stock / {len(po)} patched outputs")]
    exact_bad, prefix_bad, aborted = [], [], 0
    for i, (s, p) in enumerate(zip(so, po)):
        if s.get("abort_requested") or p.get("abort_requested"):
            aborted += 1
            if parts_as_prefixes(s["output_ids"], p["output_ids"]):
                prefix_bad.append(i)
            continue
        if not _same_output(s, p, False):
            exact_bad.append((i, _first_diff(s["output_ids"], p["output_ids"])))
    n = len(so)
    first = ""
    if exact_bad:
        i, k = exact_bad[0]
        k = k or 0
        first = (f"; request {i}: stock {len(so[i]['output_ids'])} tokens ({so[i].get('finish')}) "
                 f"{so[i]['output_ids'][max(0, k - 2):k + 3]}, patched {len(po[i]['output_ids'])} tokens "
                 f"({po[i].get('finish')}) {po[i]['output_ids'][max(0, k - 2):k + 3]} from token {max(0, k - 2)}")
    checks.append(Check(f"{name}: outputs identical", not exact_bad,
                        f"{n - aborted - len(exact_bad)}/{n - aborted} identical"
                        + (f"; differ (request, first token): {exact_bad[:6]}{first}" if exact_bad else "")))
    if aborted:
        checks.append(Check(f"{name}: aborted outputs agree as prefixes", not prefix_bad,
                            f"{aborted} aborted, {len(prefix_bad)} disagree {prefix_bad[:6]}"))
    params = sc.get("sampling_params")
    if params and sc["kind"] in ("batch", "async", "text", "http_completions", "http_generate"):
        short = [i for i, (p, o) in enumerate(zip(params, po))
                 if p.get("ignore_eos") and not o.get("abort_requested")
                 and o.get("n_tokens", len(o["output_ids"])) != p["max_new_tokens"]]
        checks.append(Check(f"{name}: lengths as requested", not short,
                            "every non-aborted output has max_new_tokens" if not short else f"requests {short[:8]}"))
    if sc.get("return_logprob"):
        # With a tolerance (trees: spec v1 vs v2), requests whose ids differ are the near-tie
        # check's business; the logprobs of the others must agree.
        bad = [i for i, (s, p) in enumerate(zip(so, po)) if not same_logprobs(s, p, logprob_tol)
               and not (logprob_tol and s["output_ids"] != p["output_ids"])]
        # streamed requests that the client aborts carry no logprobs (``_run_async``)
        have = all(p.get("logprobs") for p in po if not p.get("abort_requested"))
        checks.append(Check(f"{name}: {_logprob_check(logprob_tol)}", have and not bad,
                            f"{n - len(bad)}/{n} {'identical' if not logprob_tol else 'close'}"
                            + ("" if have else "; logprobs missing")
                            + (f"; differ: requests {bad[:8]}" if bad else "")))
    if "stops" in patched:
        stopped = sum(1 for o in po if o.get("finish") in ("stop", "FINISH_MATCHED_TOKEN", "FINISH_MATCHED_STR"))
        if sc["kind"] == "http_stop_from":  # OpenAI says "stop" for EOS too: the text must lack the stop string
            stopped = sum(1 for o, st in zip(po, patched["stops"]) if o.get("finish") == "stop" and st not in o["text"])
        # Each run takes its stop tokens from its own earlier outputs: with a tolerance (trees),
        # those may part at a near-tie, and so may the stop tokens taken after it.
        same_stops = patched.get("stops") == stock.get("stops") or (
            bool(logprob_tol) and len(patched.get("stops") or []) == len(stock.get("stops") or []))
        n_differ = sum(1 for x, y in zip(stock.get("stops") or [], patched.get("stops") or []) if x != y)
        checks.append(Check(f"{name}: stops honoured", same_stops and stopped > 0,
                            f"{stopped}/{len(po)} finished on their stop token/string"
                            + (f"; {n_differ} stop tokens differ (taken after a difference)" if n_differ else "")))
    if sc["kind"] == "eos_search":
        n = {side: len(r.get("found") or []) for side, r in (("stock", stock), ("patched", patched))}
        checks.append(Check(f"{name}: outputs met EOS", all(n.values()),
                            f"outputs holding EOS {sc['eos_ids']}: {n} of {len(so)} requests "
                            f"({-(-len(so) // max(len(sc['rounds'][0]), 1))} of at most {len(sc['rounds'])} rounds)"))
    if "finish_counts" in patched:
        fc = {side: r.get("finish_counts") or {} for side, r in (("stock", stock), ("patched", patched))}
        checks.append(Check(f"{name}: requests ended on EOS, stop tokens and length",
                            all(c.get("eos") and c.get("stop") and c.get("length") for c in fc.values()),
                            f"finish reasons stock {fc['stock']}, patched {fc['patched']}"))
    if sc.get("expect_cached"):
        cached = {side: [o.get("cached") for o in outs] for side, outs in (("stock", so), ("patched", po))}
        checks.append(Check(f"{name}: prefix served from the radix cache",
                            all(c and all((x or 0) > 0 for x in c) for c in cached.values()),
                            "; ".join(f"{side}: cached tokens {sum(x or 0 for x in c)} over {len(c)} requests, "
                                      f"min {min((x or 0 for x in c), default=0)}" for side, c in cached.items())))
    return checks


def memory_growth(samples: Sequence[Sequence[Any]]) -> tuple[int | None, str]:
    """Largest rise of GPU memory over the first sample, in MiB. The first sample is taken
    after the first 200 soak requests, when the batch has reached its full concurrency
    (earlier, the caching allocator legitimately grows with the first large batches)."""
    vals = [v for _, v in samples if v is not None]
    if len(vals) < 2:
        return None, f"too few GPU memory readings ({vals})"
    return max(vals[1:]) - vals[0], f"samples every 200 requests {vals} MiB"


#: Server arguments that must agree between a spec-v1 case's patched run and its stock oracle.
SPEC_V1_KEYS = ("attention_backend", "decode_attention_backend", "prefill_attention_backend", "page_size",
                "disable_piecewise_cuda_graph", "disable_cuda_graph", "cuda_graph_bs", "disable_overlap_schedule",
                "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def case_max_accept(case: "Case") -> int:
    """The most tokens one accept step of ``case`` commits per request: its spec steps + 1
    (the case's own ``speculative_num_steps``, else SGLang's auto tree's)."""
    steps = dict(case.extra).get("speculative_num_steps") or dict(AUTO_TREE)["speculative_num_steps"]
    return int(steps) + 1


def spec_v1_checks(stock: dict[str, Any], patched: dict[str, Any]) -> list[Check]:
    """A tree case: the patched auto launch resolved to exactly the stock oracle's explicit
    tree on spec v1, and said so in one line of the main process."""
    eff = {name: (run.get("result") or {}).get("effective") or {} for name, run in
           (("stock", stock), ("patched", patched))}
    differ = [k for k in SPEC_V1_KEYS if eff["stock"].get(k) != eff["patched"].get(k)]
    spec = tuple(eff["patched"].get(k) for k in ("speculative_num_steps", "speculative_eagle_topk",
                                                 "speculative_num_draft_tokens"))
    checks = [
        Check("patched auto launch = stock explicit tree (server args)", bool(eff["stock"]) and not differ,
              f"differ: {differ}" if differ else f"{eff['patched'].get('attention_backend')}, spec {spec}"),
        Check("both on spec v1", all(e.get("disable_overlap_schedule") is True for e in eff.values()),
              f"disable_overlap_schedule {[e.get('disable_overlap_schedule') for e in eff.values()]}"),
        Check("patched log: one auto-tree spec v1 line", patched["log"].auto_tree_lines == 1,
              f"{patched['log'].auto_tree_lines} lines"),
        Check(f"patched log: no '{logs.TREE_V2_MARK}' line ({TREE_SPEC_V2_ENV}=0)", patched["log"].tree_v2_lines == 0,
              f"{patched['log'].tree_v2_lines} lines"),
    ]
    return checks


#: A ``tree_v2`` case with the STANDALONE or EAGLE-1 draft must accept more than this many tokens
#: per step on average in its patched run: the tree is exercised, not just its first token.
TREE_V2_MIN_ACCEPT = 1.3


def _request_accept_length(run: dict[str, Any]) -> float | None:
    """Mean ``spec_accept_length`` over a run's outputs (SGLang's per-request meta info)."""
    scen = ((run.get("result") or {}).get("scenarios") or {}).values()
    accepts = [o.get("accept") for s in scen for o in (s.get("outputs") or []) if o and o.get("accept")]
    return sum(accepts) / len(accepts) if accepts else None


def accept_length(run: dict[str, Any]) -> tuple[float | None, str]:
    """A run's mean accept length and where it comes from: SGLang's ``Decode batch`` log lines,
    else (no such line) the requests' ``spec_accept_length``."""
    log: logs.LogFindings = run["log"]
    if log.mean_accept_length is not None:
        return log.mean_accept_length, f"{len(log.accept_lengths)} decode log lines"
    return _request_accept_length(run), "requests' spec_accept_length (no decode log line)"


def tree_v2_checks(case: Case, stock: dict[str, Any], patched: dict[str, Any]) -> list[Check]:
    """A ``tree_v2`` case: the patched run decodes the tree on spec v2 and said so in one line;
    stock (the oracle) decodes the same tree on spec v1 and said so in SGLang's own line; both
    resolved to the tree the case asks for (the auto case: SGLang's 5 / 4 / 8) with the same
    server arguments otherwise; the STANDALONE and EAGLE-1 drafts get part of the tree accepted."""
    eff = {name: (run.get("result") or {}).get("effective") or {} for name, run in
           (("stock", stock), ("patched", patched))}
    keys = [k for k in SPEC_V1_KEYS if k != "disable_overlap_schedule"]
    differ = [k for k in keys if eff["stock"].get(k) != eff["patched"].get(k)]
    want = dict(case.extra, **dict(case.stock_extra))
    want_tree = tuple(want.get(k) for k in SPEC_TREE_KEYS)
    trees = {name: tuple(e.get(k) for k in SPEC_TREE_KEYS) for name, e in eff.items()}
    overlap = {name: e.get("disable_overlap_schedule") for name, e in eff.items()}
    plog: logs.LogFindings = patched["log"]
    slog: logs.LogFindings = stock["log"]
    checks = [
        Check("patched and stock resolve to the same server args", bool(eff["stock"]) and not differ,
              f"differ: {differ}" if differ else f"{eff['patched'].get('attention_backend')}, "
              f"PCG off {eff['patched'].get('disable_piecewise_cuda_graph')}"),
        Check("resolved tree (steps, topk, draft tokens) as asked on both sides",
              all(t == want_tree for t in trees.values()), f"asked {want_tree}; {trees}"),
        Check("patched on spec v2, stock on spec v1", overlap == {"stock": True, "patched": False},
              f"disable_overlap_schedule {overlap}"),
        Check(f"patched log: one '{logs.TREE_V2_MARK}' line", plog.tree_v2_lines == 1,
              f"{plog.tree_v2_lines} lines"),
        Check("stock log: SGLang's spec v1 line for the tree", slog.stock_tree_spec_v1_lines >= 1,
              f"{slog.stock_tree_spec_v1_lines} lines '{logs.STOCK_TREE_SPEC_V1_MARK}'"),
    ]
    if model_dirs(case)[1] in PARTIAL_ACCEPT_DRAFTS:
        value, source = accept_length(patched)
        checks.append(Check(f"patched mean accept length > {TREE_V2_MIN_ACCEPT}",
                            value is not None and value > TREE_V2_MIN_ACCEPT,
                            f"{None if value is None else round(value, 3)} ({source})"))
    return checks


def sync_digest(sync: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record of a run's sync probe (``logs.summarize_sync``): decode iterations, host syncs
    per decode iteration (all, and on ``seq_lens``) and the ``seq_lens`` call sites; None without
    the probe."""
    if sync is None:
        return None
    per = sync["decode"]["per_iteration"]
    return {"decode_iterations": sync["decode_iterations"],
            "syncs_per_decode": None if per["syncs"] is None else round(per["syncs"], 3),
            "seq_lens_syncs_per_decode": None if per["seq_lens_syncs"] is None else round(per["seq_lens_syncs"], 3),
            "seq_lens_sites": sorted({x["site"] for x in sync["decode"]["sites"] if x["seq_lens"]}),
            "errors": sync["errors"][:3]}


def sync_checks(stock: dict[str, Any], patched: dict[str, Any]) -> list[Check]:
    """A ``sync_probe`` case: the probe counted decode iterations in both runs' schedulers, and
    the patched run waits on ``seq_lens`` no more often per decode iteration than stock."""
    checks = []
    digests = {}
    for name, run in (("stock", stock), ("patched", patched)):
        d = sync_digest(run.get("sync")) or {}
        digests[name] = d
        n = int(d.get("decode_iterations") or 0)
        checks.append(Check(f"sync probe: {name} decode iterations counted",
                            n > 0 and bool((run.get("sync") or {}).get("wrapped")),
                            f"{n} decode iterations" + (f"; probe errors {d['errors']}" if d.get("errors") else "")))
    s, p = (digests[k].get("seq_lens_syncs_per_decode") for k in ("stock", "patched"))
    checks.append(Check("patched: seq_lens syncs per decode iteration <= stock's",
                        s is not None and p is not None and p <= s,
                        f"stock {s} ({digests['stock'].get('seq_lens_sites')}), "
                        f"patched {p} ({digests['patched'].get('seq_lens_sites')})"))
    return checks


def evaluate_case(case: Case, sc_list: Sequence[dict[str, Any]], stock: dict[str, Any], patched: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    for name, run in (("stock", stock), ("patched", patched)):
        res = run.get("result")
        checks.append(Check(f"{name} run finished", run.get("returncode") == 0 and res is not None,
                            f"returncode {run.get('returncode')}, {run.get('wall_s', 0):.0f} s"))
    sres = (stock.get("result") or {}).get("scenarios", {})
    pres = (patched.get("result") or {}).get("scenarios", {})
    checks += output_checks(sc_list, sres, pres, case.logprob_tol, near_ties=case.tree_v2 or case.batch_variant,
                            max_accept=case_max_accept(case))
    slog: logs.LogFindings = stock["log"]
    plog: logs.LogFindings = patched["log"]
    sprobe: logs.ProbeSummary = stock["probe"]
    pprobe: logs.ProbeSummary = patched["probe"]
    main_pid = (patched.get("result") or {}).get("pid")
    need = set(pprobe.scheduler_pids) | ({main_pid} if main_pid else set())
    missing = sorted(need - set(plog.applied_pids))
    checks.append(Check("patched log: applied in every process",
                        bool(pprobe.scheduler_pids) and not missing and len(set(plog.applied_pids)) >= 2,
                        f"applied by {plog.applied_pids}; main {main_pid}, schedulers {pprobe.scheduler_pids}"))
    checks.append(Check("stock log: disabled", slog.disabled_lines >= 1 and slog.applied_lines == 0,
                        f"{slog.disabled_lines} disabled / {slog.applied_lines} applied lines"))
    for name, lf in (("stock", slog), ("patched", plog)):
        checks.append(Check(f"{name} log: no plugin warnings/errors", not lf.bad_lines,
                            "none" if not lf.bad_lines else " | ".join(lf.bad_lines[:3])))
    if case.spec_v1:
        checks.extend(spec_v1_checks(stock, patched))
    else:
        if case.tree_v2:  # stock is spec v1 there: its verify_done wait returns at once
            checks.extend(tree_v2_checks(case, stock, patched))
        else:
            checks.append(Check("stock scheduler waits on verify_done", sprobe.scheduler_calls > 0,
                                f"{sprobe.scheduler_calls} maybe_wait_verify_done calls"))
        checks.append(Check("patched never waits on verify_done",
                            bool(pprobe.scheduler_pids) and pprobe.total_calls == 0, f"{pprobe.total_calls} calls"))
    if case.sync_probe:
        checks.extend(sync_checks(stock, patched))
    if case.gpus > 1:
        # One scheduler per GPU (TP ranks, or DP ranks behind the DP controller): the check
        # above then holds for each of them.
        checks.append(Check(f"patched: {case.gpus} scheduler processes",
                            len(pprobe.scheduler_pids) == case.gpus,
                            f"schedulers {pprobe.scheduler_pids}"))
    if case.pd_decode:
        for name, probe in (("stock", sprobe), ("patched", pprobe)):
            calls = {f: probe.scheduler_calls_by_name.get(f, 0) for f in PD_PROBE_FUNCS}
            checks.append(Check(f"{name}: prebuilt batches joined a running batch",
                                calls["process_prebuilt"] >= 2 and calls["merge_batch"] >= 1,
                                ", ".join(f"{f} {n}" for f, n in calls.items())))
    if case.profile == "retract":
        counts = {n: r.get("retract_lines", 0) for n, r in (("stock", stock), ("patched", patched))}
        checks.append(Check("retraction happened in both runs", all(v > 0 for v in counts.values()),
                            f"'{RETRACT_LINE}' lines: {counts}"))
    if case.profile in SOAK_PROFILES:
        pres_all = patched.get("result") or {}
        mem = (pres_all.get("scenarios", {}).get("soak") or {}).get("memory_mib") or []
        growth, detail = memory_growth(mem)
        checks.append(Check(f"patched: GPU memory growth <= {MEMORY_TOLERANCE_MIB} MiB over the soak",
                            growth is not None and growth <= MEMORY_TOLERANCE_MIB,
                            f"growth {growth} MiB; {detail}"))
    return checks


def upstream_checks(sc_list: Sequence[dict[str, Any]], stock: dict[str, Any], upstream: dict[str, Any],
                    patched: dict[str, Any], logprob_tol: float, max_accept: int | None = None
                    ) -> tuple[list[Check], list[str]]:
    """The patched run against stock SGLang 0.5.13 (which runs the tree on spec v2 itself):
    checks, every output identical or parted at a near-tie; and notes: how 0.5.13 compares with
    stock 0.5.12.post1's spec v1, the oracle."""
    label = "0.5.13 vs patched: "
    ures = (upstream.get("result") or {}).get("scenarios", {})
    pres = (patched.get("result") or {}).get("scenarios", {})
    sres = (stock.get("result") or {}).get("scenarios", {})
    checks = [Check("0.5.13 run finished", upstream.get("returncode") == 0 and bool(ures),
                    f"returncode {upstream.get('returncode')}, SGLang "
                    f"{(upstream.get('result') or {}).get('sglang_version')}")]
    checks += output_checks(sc_list, ures, pres, logprob_tol, near_ties=True, label=label, mismatch_only=True,
                            max_accept=max_accept)
    notes = []
    for sc in sc_list:
        u, s = ures.get(sc["name"]), sres.get(sc["name"])
        if not u or not s or "error" in u or "error" in s:
            continue
        s, u, _ = align_adaptive(sc, s, u)
        differ = [i for i, (x, y) in enumerate(zip(s["outputs"], u["outputs"]))
                  if x and y and x["output_ids"] != y["output_ids"]]
        tie = near_tie_checks(sc, s, u, max_accept=max_accept)
        notes.append(f"0.5.13 (spec v2) vs stock spec v1, {sc['name']}: {len(s['outputs']) - len(differ)}/"
                     f"{len(s['outputs'])} identical" + (f"; {tie[0].detail}" if tie and differ else ""))
    return checks, notes


# ----------------------------------------------------------------------------- orchestration


def with_case_env(env: dict[str, str], case: Case) -> dict[str, str]:
    """``env`` with the case's own variables (``Case.env``) set, or removed where None."""
    out = dict(env)
    for key, value in case.env:
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def run_engine(case: Case, mode_name: str, mode: str, spec: dict[str, Any], work: Path, timeout: float,
               log_config: Path, site: str | None = None) -> dict[str, Any]:
    """One Engine (or server) run of a case, with the port block and GPUs its ``spec`` names;
    ``site``: the site folder whose SGLang it runs (the ``upstream`` run), else the current one."""
    tag = f"{case.name}-{mode_name}"
    probe_dir = work / f"probe-{tag}"
    probe_dir.mkdir(parents=True, exist_ok=True)
    ports = port_blocks.PortBlock(spec["ports"]["base"]) if spec.get("ports") else None
    env = with_case_env(child_env.subprocess_env(mode, probe_dir, log_config, ports=ports, site=site,
                                          cuda_visible_devices=spec.get("cuda_visible_devices"),
                                          probe_funcs=PD_PROBE_FUNCS if case.pd_decode else (),
                                          sync_probe=case.sync_probe), case)
    rc, wall, result, text = launch.run_worker(Path(__file__).resolve(), spec, work, tag, work / f"{tag}.log", env,
                                           timeout)
    print(f"   {tag}: rc {rc}, {wall:.0f} s", flush=True)
    error = launch.engine_error(rc, result, text, expected=[sc["name"] for sc in spec["scenarios"]])
    return {"mode": mode, "returncode": rc, "wall_s": wall, "result": result,
            "log": logs.scan_log(text), "probe": logs.summarize_probe(logs.read_probe_dir(probe_dir)),
            "sync": logs.summarize_sync(logs.read_sync_records(probe_dir)) if case.sync_probe else None,
            "retract_lines": text.count(RETRACT_LINE), "log_path": str(work / f"{tag}.log"),
            "log_excerpt": logs.trim_log(text, max_lines=25, tail=8), "error": error,
            "log_tail": logs.log_tail(text) if error else None, "ports": spec.get("ports"),
            "config_label": engine_config.config_label((result or {}).get("effective"), requested_backend=case.backend,
                                            log_text=text)}


#: Case outcomes: ``error`` = an Engine did not start or did not finish its scenarios (a
#: harness error, never counted as a mismatch); ``skipped`` = could not run here (GPUs, FA3).
STATUSES = ("passed", "failed", "error", "skipped")


@dataclass
class CaseResult:
    case: Case
    passed: bool
    checks: list[Check]
    wall_s: float
    runs: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None  # why it did not run (too few GPUs, no FA3); not a failure
    errors: dict[str, str] = field(default_factory=dict)  # run -> why it is a harness error
    eos_ids: tuple[int, ...] = (2,)
    notes: list[str] = field(default_factory=list)  # what the record says besides its checks

    @property
    def status(self) -> str:
        if self.skipped:
            return "skipped"
        if self.errors:
            return "error"
        return "passed" if self.passed else "failed"


def skip_reason(case: Case, n_gpus: int, fa3: bool) -> str | None:
    if case.gpus > n_gpus:
        return f"needs {case.gpus} GPUs, {n_gpus} available"
    if case.needs_fa3 and not fa3:
        return f"{child_env.NO_FA3}: backend {case.backend} needs FA3 (sgl_kernel.flash_ops)"
    return None


def run_cases(cases: Sequence[Case], models: Path, work: Path, *, jobs: int, timeout: float,
              stagger_s: float, soak_requests: int, gpu_ids: Sequence[str] = ("0",), fa3: bool | None = None,
              ports: port_blocks.PortAllocator | None = None, upstream_site: str | None = None,
              upstream_fa3: bool = False, on_result: Callable[[list[CaseResult]], None] | None = None) -> list[CaseResult]:
    """Every case's stock and patched Engines, ``jobs`` at a time, each with a port block of its
    own (``ports``); ``fa3``: whether FA3 imports here (default: find out); ``on_result`` sees
    the results so far after each case (a run cut short still leaves a record);
    ``upstream_site``: stock SGLang 0.5.13's site folder, for the cases that compare with it
    (those that need FA3 only when ``upstream_fa3``: its FA3 is installed there)."""
    fa3 = child_env.fa3_available() if fa3 is None else fa3
    ports = ports or port_blocks.PortAllocator()
    skipped = {c.name: why for c in cases if (why := skip_reason(c, len(gpu_ids), fa3))}
    runnable = [c for c in cases if c.name not in skipped]
    vocab = model_factory.model_config(models / "target")["vocab_size"]
    eos_ids = tuple(model_factory.eos_token_ids(models / "target"))
    log_config = logs.write_logging_config(work / "logging.json")
    # One workload per profile, shared by both runs of a case and by its evaluation.
    workloads = {c.profile: scenarios(c.profile, vocab, soak_requests=soak_requests, eos_ids=eos_ids)
                 for c in runnable}
    start_lock = threading.Lock()
    last_start = [0.0]
    placed = [0]  # single-GPU Engines go round-robin over gpu_ids

    def devices(case: Case) -> str:
        if case.gpus > 1:
            return ",".join(gpu_ids[: case.gpus])
        with start_lock:
            placed[0] += 1
            return gpu_ids[(placed[0] - 1) % len(gpu_ids)]

    def one(case: Case, mode_name: str, mode: str) -> dict[str, Any]:
        # Engines profile free GPU memory at start-up: keep their starts a little apart.
        with start_lock:
            wait = last_start[0] + stagger_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            last_start[0] = time.monotonic()
        block = ports.allocate(f"{case.name}-{mode_name}")
        upstream = mode_name == UPSTREAM_RUN[0]
        # 0.5.13 gets the patched run's launch: it runs a tree (auto-chosen too) on spec v2.
        kwargs = engine_kwargs(case, models, stock=mode == "off" and not upstream)
        spec = {"engine_kwargs": port_blocks.with_ports(kwargs, block), "ports": block.as_dict(),
                "scenarios": workloads[case.profile], "server": case.server, "cuda_visible_devices": devices(case)}
        return run_engine(case, mode_name, mode, spec, work, timeout, log_config,
                          site=upstream_site if upstream else None)

    def runs_of(case: Case) -> tuple[tuple[str, str], ...]:
        with_upstream = case.upstream and upstream_site and (upstream_fa3 or not case.needs_fa3)
        return RUNS + ((UPSTREAM_RUN,) if with_upstream else ())

    # The slowest starts (piecewise CUDA graph, the soak) go first.
    order = sorted(runnable, key=lambda c: (c.gpus == 1, not c.pcg, c.profile not in SOAK_PROFILES))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {(c.name, m): pool.submit(one, c, m, mode) for c in order for m, mode in runs_of(c)}
        results = []
        for c in cases:
            if c.name in skipped:
                print(f"case {c.name}: SKIPPED ({skipped[c.name]})", flush=True)
                results.append(CaseResult(c, False, [], 0.0, skipped=skipped[c.name], eos_ids=eos_ids))
                if on_result:
                    on_result(results)
                continue
            runs = {m: futures[(c.name, m)].result() for m, _ in runs_of(c)}
            errors = {m: run["error"] for m, run in runs.items() if run.get("error")}
            checks: list[Check] = []
            notes: list[str] = []
            if not errors:
                checks = evaluate_case(c, workloads[c.profile], runs["stock"], runs["patched"])
                if "upstream" in runs:
                    more, notes = upstream_checks(workloads[c.profile], runs["stock"], runs["upstream"],
                                                  runs["patched"], c.logprob_tol, case_max_accept(c))
                    checks += more
                failing = [x.name for x in checks if not x.ok]
                # Trees: a difference is judged by its margin (near_tie_checks), not by a rerun.
                if failing and not c.tree_v2 and all(n.endswith(MISMATCH_CHECKS) for n in failing):
                    print(f"case {c.name}: outputs differ; running stock SGLang once more", flush=True)
                    runs["stock-rerun"] = one(c, "stock-rerun", "off")
                    if runs["stock-rerun"].get("error"):
                        errors["stock-rerun"] = runs["stock-rerun"]["error"]
                    checks = adjudicate(workloads[c.profile], checks, runs["stock"], runs["stock-rerun"],
                                        runs["patched"], c.logprob_tol)
                if c.batch_variant and not errors:
                    # How far stock reproduces itself on this workload: a second stock run,
                    # recorded as notes (the checks judge by near-ties).
                    runs["stock-rerun"] = one(c, "stock-rerun", "off")
                    notes += stock_scatter_notes(workloads[c.profile], runs["stock"], runs["stock-rerun"],
                                                 runs["patched"])
            if c.upstream and upstream_site and "upstream" not in runs:
                notes.append("0.5.13 not run: the case needs FA3, not installed in 0.5.13's site")
            r = CaseResult(c, not errors and all(x.ok for x in checks), checks, time.perf_counter() - t0, runs,
                           errors=errors, eos_ids=eos_ids, notes=notes)
            print(f"case {c.name}: {r.status.upper()}"
                  + "".join(f"; {m}: {why}" for m, why in errors.items()), flush=True)
            results.append(r)
            if on_result:
                on_result(results)
    return results


def case_summary(r: CaseResult) -> dict[str, Any]:
    base = {"case": asdict(r.case), "status": r.status, "passed": r.passed, "needs_fa3": r.case.needs_fa3}
    if r.skipped:
        return dict(base, skipped=r.skipped, wall_s=0.0, checks=[], runs={})

    def run_info(run: dict[str, Any]) -> dict[str, Any]:
        res = run.get("result") or {}
        scen = res.get("scenarios", {})
        outs = [o for s in scen.values() for o in (s.get("outputs") or []) if o]
        accepts = [o.get("accept") for o in outs if o.get("accept")]
        log_accept = run["log"].mean_accept_length
        return {"returncode": run["returncode"], "wall_s": round(run["wall_s"], 1),
                "startup_s": round(res.get("startup_s") or 0.0, 1),
                "error": run.get("error"), "log_tail": run.get("log_tail"),
                "config": run.get("config_label"), "effective": res.get("effective"),
                "sglang_version": res.get("sglang_version"),
                "ports": run.get("ports"),
                "mean_accept_length": round(sum(accepts) / len(accepts), 3) if accepts else None,
                # the same from SGLang's "Decode batch ... accept len: x" lines (one per 40 decode steps)
                "log_accept_length": round(log_accept, 3) if log_accept is not None else None,
                "decode_log_lines": len(run["log"].accept_lengths),
                "scenario_seconds": {k: round(v.get("seconds", 0.0), 1) for k, v in scen.items()},
                "requests": sum(len(s.get("outputs") or []) for s in scen.values()),
                "output_tokens": sum(len(o["output_ids"]) for o in outs),
                "finish_counts": finish_counts(outs, r.eos_ids),
                "cached_tokens": sum(o.get("cached") or 0 for o in outs),
                "memory_mib": (scen.get("soak") or {}).get("memory_mib"),
                "memory_after_warmup_mib": res.get("memory_after_warmup_mib"),
                "retract_lines": run.get("retract_lines"),
                "applied_pids": run["log"].applied_pids,
                "verify_done_calls": run["probe"].total_calls,
                "sync": sync_digest(run.get("sync")),
                "scheduler_pids": run["probe"].scheduler_pids,
                "scheduler_calls": run["probe"].scheduler_calls_by_name,
                "log_excerpt": run.get("log_excerpt") if run["returncode"] != 0 or not res else None}

    return dict(base, wall_s=round(r.wall_s, 1), errors=r.errors, checks=[asdict(c) for c in r.checks],
                notes=r.notes,
                runs={m: run_info(run) for m, run in r.runs.items()})  # stock, patched[, stock-rerun, upstream]


def outcome(summaries: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    """(all ran cases passed, ``12/14 cases passed, 1 failed, 1 harness error, 2 skipped``)."""
    n = {st: sum(1 for s in summaries if _status(s) == st) for st in STATUSES}
    ran = n["passed"] + n["failed"] + n["error"]
    text = f"{n['passed']}/{ran} cases passed"
    if n["failed"]:
        text += f", {n['failed']} failed"
    if n["error"]:
        text += f", {n['error']} harness error{'s' if n['error'] > 1 else ''} (an Engine did not run to the end)"
    if n["skipped"]:
        no_fa3 = sum(1 for s in summaries
                     if _status(s) == "skipped" and str(s.get("skipped")).startswith(child_env.NO_FA3))
        text += f", {n['skipped']} skipped" + (f" ({no_fa3} for {child_env.NO_FA3})" if no_fa3 else "")
    return bool(ran) and n["passed"] == ran, text


def _status(s: dict[str, Any]) -> str:
    """A summary's status (records written before statuses existed: from passed/skipped)."""
    return s.get("status") or ("skipped" if s.get("skipped") else "passed" if s.get("passed") else "failed")


def sync_line(stock: dict[str, Any] | None, patched: dict[str, Any] | None) -> str:
    """``host syncs per decode iteration, stock / patched: seq_lens 3.1 / 1.0, all 5.2 / 3.0
    (1200 / 1180 decode iterations)`` from two :func:`sync_digest` records."""
    s, p = stock or {}, patched or {}
    return (f"host syncs per decode iteration, stock / patched: seq_lens {s.get('seq_lens_syncs_per_decode')} / "
            f"{p.get('seq_lens_syncs_per_decode')}, all {s.get('syncs_per_decode')} / {p.get('syncs_per_decode')} "
            f"({s.get('decode_iterations')} / {p.get('decode_iterations')} decode iterations)")


def format_report(summaries: Sequence[dict[str, Any]], fa3: bool | None = None) -> str:
    lines = [] if fa3 is None else [child_env.fa3_line(fa3)]
    for s in summaries:
        status = _status(s)
        if status == "skipped":
            lines.append(f"SKIPPED {s['case']['name']}: {s['skipped']}")
            continue
        if status == "error":
            lines.append(f"ERROR   {s['case']['name']}: harness error, no comparison made")
            for m, run in s["runs"].items():
                if run.get("error"):
                    lines.append(f"    {m}: {run['error']} ({run['wall_s']} s); last lines of its log:")
                    lines.extend("      | " + ln for ln in (run.get("log_tail") or "").splitlines())
            continue
        st, pt = s["runs"]["stock"], s["runs"]["patched"]
        log_accept = (f" (decode log {st.get('log_accept_length')} / {pt.get('log_accept_length')})"
                      if st.get("log_accept_length") is not None or pt.get("log_accept_length") is not None else "")
        lines.append(f"{status.upper():7} {s['case']['name']}: {pt['requests']} requests, "
                     f"{pt['output_tokens']} tokens; accept {st['mean_accept_length']} / {pt['mean_accept_length']}"
                     f"{log_accept}; start {st['startup_s']} / {pt['startup_s']} s; {pt.get('config')}; finish "
                     f"{st.get('finish_counts')} / {pt.get('finish_counts')}")
        if st.get("sync") or pt.get("sync"):
            lines.append("    " + sync_line(st.get("sync"), pt.get("sync")))
        if "upstream" in s["runs"]:
            ut = s["runs"]["upstream"]
            lines.append(f"    0.5.13: accept {ut['mean_accept_length']} (decode log {ut.get('log_accept_length')}); "
                         f"{ut.get('config')}; finish {ut.get('finish_counts')}")
        for c in s["checks"]:
            if not c["ok"]:
                lines.append(f"    [FAIL] {c['name']}: {c['detail']}")
            elif "near-tie" in c["name"] and not c["detail"].startswith("0 differing"):
                lines.append(f"    [ok]   {c['name']}: {c['detail']}")
        lines.extend(f"    note: {n}" for n in s.get("notes") or [])
        for m in ("stock", "patched"):
            if s["runs"][m].get("log_excerpt"):
                lines.append(f"    --- {m} log excerpt ---")
                lines.extend("    " + ln for ln in s["runs"][m]["log_excerpt"].splitlines())
    ok, text = outcome(summaries)
    lines.append(f"E2E {'PASSED' if ok else 'FAILED'}: {text}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- record (Markdown)


def merge_record(paths: Sequence[Path]) -> str:
    """The Markdown record of one or more result JSONs (one table row per case)."""
    return merge_record_from_docs([json.loads(p.read_text()) for p in paths])


def merge_record_from_docs(docs: Sequence[dict[str, Any]]) -> str:
    cases = [c for d in docs for c in d["cases"]]
    env = docs[0]["environment"] if docs else {}
    _, text = outcome(cases)
    fa3 = sorted({{True: "yes", False: "no"}.get(d["environment"].get("fa3"), "?") for d in docs})
    lines = [
        "# GPU end-to-end suite: stock SGLang vs SGLang + plugin, token for token",
        "",
        "| | |", "|---|---|",
        f"| date | {', '.join(sorted({d['environment']['date'][:10] for d in docs}))} |",
        f"| GPU | {env.get('gpu')} |",
        f"| SGLang | {env.get('sglang')} (torch {env.get('torch')}) |",
        f"| FA3 | {', '.join(fa3)} |",
        f"| commands | {'; '.join('`' + d['environment']['command'] + '`' for d in docs)} |",
        f"| wall time | {' + '.join(str(round(d['environment']['wall_s'])) + ' s' for d in docs)} |",
        f"| outcome | **{text}** |",
        "",
        "Stock = `SGLANG_FUTUREMAP_PATCH=off`, patched = `strict`; each Engine in its own process with ports of "
        "its own, spec v2 (overlap scheduler), 3 steps, topk 1, 4 draft tokens, greedy unless the case says "
        "otherwise. Config = the attention backend, piecewise CUDA graph and page size the Engine reported. "
        "Error = an Engine did not start or did not finish (no comparison made). Scenarios and checks: "
        "`scripts/gpu_e2e.py --help`.",
        "",
        "| case | result | config | requests | output tokens | accept length s / p | scenarios | failed checks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    label = {"passed": "pass", "failed": "**FAIL**", "error": "**ERROR**", "skipped": "skipped"}
    for c in cases:
        status = _status(c)
        if status == "skipped":
            lines.append(f"| {c['case']['name']} | skipped | - | - | - | - | - | {c['skipped']} |")
            continue
        if status == "error":
            why = "; ".join(f"{m}: {r['error']}" for m, r in c["runs"].items() if r.get("error"))[:300]
            lines.append(f"| {c['case']['name']} | **ERROR** | - | - | - | - | - | harness error: {why} |")
            continue
        p, s = c["runs"]["patched"], c["runs"]["stock"]
        bad = "; ".join(f"{x['name']}: {x['detail']}" for x in c["checks"] if not x["ok"])[:300] or "-"
        if c["passed"] and c["case"].get("batch_variant"):
            bad = "batch-variant, judged at near-ties: " + "; ".join(c.get("notes") or [])[:300]
        elif c["passed"] and "stock-rerun" in c["runs"]:
            bad = "passed on a second stock run: " + "; ".join(
                x["detail"] for x in c["checks"] if x["name"].endswith("match a stock run"))[:300]
        log_accept = (f" (decode log {s.get('log_accept_length')} / {p.get('log_accept_length')})"
                      if s.get("log_accept_length") is not None or p.get("log_accept_length") is not None else "")
        lines.append(f"| {c['case']['name']} | {label[status]} | {p.get('config') or '-'} | {p['requests']} | "
                     f"{p['output_tokens']} | {s['mean_accept_length']} / {p['mean_accept_length']}{log_accept} | "
                     f"{', '.join(p['scenario_seconds'])} | {bad} |")
    for c in cases:
        if _status(c) in ("skipped", "error"):
            continue
        p, s = c["runs"]["patched"], c["runs"]["stock"]
        if c["case"]["profile"] in SOAK_PROFILES:
            lines += ["", f"Soak ({c['case']['name']}): GPU memory of the patched Engine's processes after warm-up "
                      f"{p['memory_after_warmup_mib']} MiB, then every 200 requests: "
                      f"{[v for _, v in (p['memory_mib'] or [])]} MiB."]
        if c["case"]["profile"] in ("eos", "tree-eos", "eos-ties"):
            lines += ["", f"EOS churn ({c['case']['name']}): finish reasons over all requests, stock "
                      f"{s.get('finish_counts')}, patched {p.get('finish_counts')}."]
        if c["case"]["profile"] in ("radix", "tree-radix"):
            lines += ["", f"Radix cache ({c['case']['name']}): cached prompt tokens stock {s.get('cached_tokens')}, "
                      f"patched {p.get('cached_tokens')}."]
        if s.get("sync") or p.get("sync"):
            lines += ["", f"Sync probe ({c['case']['name']}): {sync_line(s.get('sync'), p.get('sync'))}; "
                      f"seq_lens sites stock {(s.get('sync') or {}).get('seq_lens_sites')}, patched "
                      f"{(p.get('sync') or {}).get('seq_lens_sites')}."]
    return "\n".join(lines) + "\n"


#: What ``--save-outputs`` keeps of a scenario's entry (prompts are rebuilt from the scenario).
SAVED_KEYS = ("outputs", "stops", "found", "keys")


def rebuild_adaptive(sc_list: Sequence[dict[str, Any]], runs: dict[str, dict[str, Any]]) -> None:
    """Fill in, in place, what a saved file of an older harness lacks for the adaptive EOS
    scenarios: ``eos_search``'s prompts (its rounds, as many as it sent) and ``found`` (outputs
    holding EOS before their last token, as ``_eos_search`` counts them), then ``eos_churn``'s
    request keys (``eos_churn_requests`` from that search, as the run built them)."""
    by_name = {sc["name"]: sc for sc in sc_list}
    for r in runs.values():
        for name, entry in r.items():
            sc = by_name.get(name)
            if not sc or not entry or "error" in entry:
                continue
            if sc["kind"] == "eos_search" and "prompts" not in entry:
                sent = [p for rnd in sc["rounds"] for p in rnd][: len(entry["outputs"])]
                entry["prompts"] = sent
                if "found" not in entry:
                    eos = set(sc["eos_ids"])
                    entry["found"] = [i for i, o in enumerate(entry["outputs"]) if meets_eos(o["output_ids"], eos)]
        for name, entry in r.items():
            sc = by_name.get(name)
            src = r.get(sc.get("source", "")) if sc else None
            if sc and sc["kind"] == "eos_churn" and entry and "keys" not in entry and src and "error" not in src:
                prompts, params, _ = eos_churn_requests(sc, {**src, "scenario": by_name[sc["source"]]})
                if len(prompts) == len(entry["outputs"]):
                    entry["keys"] = [request_key(x, q) for x, q in zip(prompts, params)]


def save_outputs(results: Sequence[CaseResult], path: Path) -> None:
    """Every run's outputs per scenario (ids, logprobs, finish), for a look after the run."""
    import gzip

    doc = {r.case.name: {m: {name: {k: entry[k] for k in SAVED_KEYS if k in entry} for name, entry in
                             ((run.get("result") or {}).get("scenarios") or {}).items()}
                         for m, run in r.runs.items()} for r in results}
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


def judge_outputs(paths: Sequence[Path], vocab: int = 4096) -> tuple[bool, str]:
    """The output checks of the tree cases again, from ``--save-outputs`` files (no GPU): stock
    vs patched and 0.5.13 vs patched, each scenario's outputs identical or parted at a near-tie,
    logprobs within the tolerance; 0.5.13 vs stock as notes. Returns (all passed, report)."""
    import gzip

    lines, ok_all = [], True
    latest: dict[str, tuple[Path, dict[str, Any]]] = {}  # a later file's run of a case supersedes
    for path in paths:
        with gzip.open(path, "rt") as fh:
            for name, runs in json.load(fh).items():
                latest.pop(name, None)
                latest[name] = (path, runs)
    for name, (path, runs) in latest.items():
        case = next((c for c in all_cases() if c.name == name.split("~")[0]), None)
        if case is None or not case.tree_v2 or "stock" not in runs or "patched" not in runs:
            continue
        sc_list = scenarios(case.profile, vocab)
        # files of the first runs hold each scenario's outputs alone: their stop tokens are
        # taken again from the source outputs, as the run took them (stop_token_choice)
        runs = {m: {k: v if isinstance(v, dict) else {"outputs": v} for k, v in r.items()} for m, r in runs.items()}
        for sc in sc_list:
            for r in runs.values():
                entry, src = r.get(sc["name"]), r.get(sc.get("source", ""))
                if sc["kind"] == "stop_from" and entry and src and "stops" not in entry:
                    stops = [stop_token_choice(o["output_ids"], i) for i, o in enumerate(src["outputs"][: sc["count"]])]
                    entry["stops"] = [x for x in stops if x is not None]
        rebuild_adaptive(sc_list, runs)
        checks = output_checks(sc_list, runs["stock"], runs["patched"], case.logprob_tol, near_ties=True,
                               max_accept=case_max_accept(case))
        notes: list[str] = []
        if "upstream" in runs:
            res = {m: {"returncode": 0, "result": {"scenarios": r}} for m, r in runs.items()}
            more, notes = upstream_checks(sc_list, res["stock"], res["upstream"], res["patched"], case.logprob_tol,
                                          max_accept=case_max_accept(case))
            checks += more
        ok = all(c.ok for c in checks)
        ok_all &= ok
        lines.append(f"{'PASSED' if ok else 'FAILED':7} {name} ({path.name}){'' if 'upstream' in runs else '; no 0.5.13 run'}")
        for c in checks:
            if not c.ok or ("near-tie" in c.name and not c.detail.startswith("0 differing")):
                lines.append(f"    [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
        lines.extend(f"    note: {n}" for n in notes)
    lines.append(f"JUDGED {'PASSED' if ok_all else 'FAILED'}")
    return ok_all, "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, help="make_tiny_models.py output (default: build into a temporary folder)")
    p.add_argument("--cases", nargs="*", help="case names or fnmatch patterns (default: all)")
    p.add_argument("--group", nargs="*", choices=sorted(GROUPS),
                   help="named case sets, with --cases their union: " + "; ".join(
                       f"{g} = {' '.join(pats)}" for g, pats in GROUPS.items()))
    p.add_argument("--shard", help="I/N: every N-th selected case starting at the I-th (split a long run)")
    p.add_argument("--repeat", type=int, default=1, help="run each selected case this many times")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--jobs", type=int, default=8, help="Engines running at once (default 8)")
    p.add_argument("--gpus", type=int, default=None,
                   help="use the first N visible GPUs (default: all); single-GPU Engines go round-robin")
    p.add_argument("--timeout", type=float, default=420, help="seconds per Engine run (default 420)")
    p.add_argument("--stagger", type=float, default=4.0, help="seconds between Engine starts (default 4)")
    p.add_argument("--soak-requests", type=int, default=2000)
    p.add_argument("--out", type=Path, default=Path("gpu-out"), help="folder for e2e-<tag>.json/.txt")
    p.add_argument("--tag", default=None, help="file-name tag (default: the group and shard, or 'all')")
    p.add_argument("--merge", nargs="+", type=Path, help="write the Markdown record of these JSONs to stdout")
    p.add_argument("--upstream-site", default=None,
                   help="site folder of stock SGLang 0.5.13 (.gpu-0513/activate.sh unpacks it to "
                        f"{child_env.DEFAULT_UPSTREAM_SITE}, the default): the tree cases also run it and compare; "
                        "'none' or a folder without SGLang: they do not")
    p.add_argument("--save-outputs", action="store_true",
                   help="also write outputs-<tag>.json.gz: every run's outputs (ids, logprobs) per scenario")
    p.add_argument("--judge", nargs="+", type=Path,
                   help="judge the tree cases' outputs again from --save-outputs files (no GPU) and exit")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    if args.merge:
        sys.stdout.write(merge_record(args.merge))
        return 0
    if args.judge:
        ok, report = judge_outputs(args.judge)
        print(report)
        return 0 if ok else 1
    try:
        cases = select_cases(args.cases, args.shard, args.repeat, args.group)
    except ValueError as exc:  # a mistyped --shard: one line, no traceback
        print(f"gpu_e2e.py: {exc}", file=sys.stderr)
        return 2
    if args.list or not cases:
        for c in cases:
            print(f"{c.name:48} {c.profile:8} {c.algorithm:10} {c.backend:10} graph={c.cuda_graph} pcg={c.pcg}"
                  + (" (needs FA3)" if c.needs_fa3 else ""))
        return 0 if cases else 2
    t0 = time.perf_counter()
    fa3 = child_env.fa3_available()
    print(child_env.fa3_line(fa3), flush=True)
    tag = args.tag or "-".join([*(args.group or []), *([args.shard.replace("/", "of")] if args.shard else [])]) or "all"
    command = "python3 " + records.portable_command("scripts/gpu_e2e.py", argv if argv is not None else sys.argv[1:],
                                               {"--models": "MODELS", "--out": "OUT"})
    args.out.mkdir(parents=True, exist_ok=True)

    def write(results: Sequence[CaseResult], final: bool) -> str:
        """e2e-<tag>.json and .txt: after every case (``partial``), then the final record."""
        summaries = [case_summary(r) for r in results]
        report = format_report(summaries, fa3) + ("" if final else f"\n(partial: {len(results)}/{len(cases)} cases so far)")
        doc = {"environment": records.run_environment(command, time.perf_counter() - t0, fa3),
               "fa3": fa3, "partial": not final, "cases": summaries}
        (args.out / f"e2e-{tag}.json").write_text(json.dumps(doc, indent=1))
        (args.out / f"e2e-{tag}.txt").write_text(report + "\n")
        return report

    work = Path(tempfile.mkdtemp(prefix="gpu-e2e-"))
    try:
        models = args.models
        if models is None:
            models = work / "models"
            model_factory.build_tiny_models(models)
        upstream = None if args.upstream_site == "none" else child_env.upstream_site(args.upstream_site)
        if upstream and child_env.site_sglang_version(upstream) is None:
            if any(c.upstream for c in cases):
                print(f"no SGLang in {upstream}: the tree cases run without the 0.5.13 comparison", flush=True)
            upstream = None
        results = run_cases(cases, models, work, jobs=args.jobs, timeout=args.timeout,
                            stagger_s=args.stagger, soak_requests=args.soak_requests,
                            gpu_ids=child_env.visible_gpus(args.gpus), fa3=fa3, upstream_site=upstream,
                            upstream_fa3=bool(upstream) and (Path(upstream) / "sgl_kernel" / "flash_ops.abi3.so").exists(),
                            on_result=lambda rs: write(rs, False))
        records.archive_logs(work, args.out / f"logs-{tag}.tar.gz")
        if args.save_outputs:
            save_outputs(results, args.out / f"outputs-{tag}.json.gz")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(write(results, True))
    return 0 if outcome([case_summary(r) for r in results])[0] or all(r.status == "skipped" for r in results) else 1


if __name__ == "__main__":
    _rc = main()
    if "--worker" in sys.argv:
        launch.exit_worker(_rc)
    sys.exit(_rc)
