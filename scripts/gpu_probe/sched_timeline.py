"""Scheduler timeline for the serving benchmark (``gpu_serve_bench.py --timeline``): where a
request's time to first token goes inside the scheduler.

Loaded by this folder's ``sitecustomize`` only when ``SMOKE_PROBE_DIR`` is set and
``SMOKE_SCHED_TIMELINE=1``. It changes nothing until the first call of a ``run_batch`` whose
``self`` is a ``Scheduler``; then, in that process only, it wraps on the class

* ``process_input_requests``: one ``recv`` event per request it receives (its ``rid``);
* ``run_batch``: one ``run`` event per launched batch (start, end, forward mode, whether
  SGLang's ``forward_mode.is_extend()`` calls it a prefill, batch size, and for a prefill the
  ``rid`` of every request in it; on CUDA, the GPU fields below);
* ``process_batch_result``: one ``proc`` event per processed result (start, end, forward
  mode, batch size). A prefill's first tokens leave for the detokenizer at the end of it;

and, on the scheduler thread only, torch's host-blocking entry points (``Tensor.item``,
``.tolist``, ``.cpu``, ``Event.synchronize``, ``Stream.synchronize``, ``torch.cuda.synchronize``):
one ``sync`` event per call that blocked longer than ``SYNC_MIN_S``, with the calling
function (file:line name), so a long launch shows where it waited.

On CUDA (a batch on a ``cuda`` device), the wrapper also records CUDA timing events on the
stream the forward is launched on (the scheduler's ``forward_stream`` in the overlap loop, else
the current stream): an end event after every launch, and a start event before a prefill and
before the launch right after one. The host never waits on them. Before each launch the
scheduler thread resolves the earlier launches whose end event's ``query()`` is true (there, not
in the flush thread: a query from another thread would break a CUDA graph being captured inside
a launch) and adds one ``gpu`` event per timed launch, with the launch's ``t``:

* ``gpu_ms`` (a prefill and the launch after one): start -> end event, GPU ms. The start event
  completes when the stream has finished the earlier launches (or, idle, when the host records
  it), the end event when this launch's last work (the forward, the relay, the copy of its
  results to the host) has. So it includes any wait on the schedule stream and any time the GPU
  waited for this launch's host work; if the GPU finished before the host's ``run_batch``
  returned, it runs to that return (``host_bound`` then says so);
* ``gpu_gap_ms`` (same launches, when the launch before has an end event): the previous launch's
  end event -> this start event, GPU ms, at least 0: how long the stream sat idle before this
  launch because the host had not queued it yet;
* ``gpu_queue_ms`` (same launches): a reference event recorded on an idle side stream at the
  host's launch start -> this launch's start event, GPU ms, at least 0: how long the launch
  waited on the GPU behind work queued before it (the earlier launches still running), i.e.
  the GPU backlog the launch met.

A prefill's result also gets one ``ready`` event (its ``t`` is the prefill's launch ``t``) when
its processing starts: ``ready_wait_ms``, the prefill's end event -> a reference event recorded
on the side stream when ``process_batch_result`` began, GPU ms: how long its results (first
tokens) sat on the host before the scheduler turned to them; negative when the host got there
first and waited for them.

Optional fields of a ``run`` event, read when the host's ``run_batch`` returned (records made
before them have none, nor ``gpu`` events):

* ``cpu_ms``: the scheduler thread's CPU time inside the launch (``time.thread_time()``, from
  2026-11-26 on). Well below the launch's wall time: the thread waited (a sync, the GIL, the
  OS); close to it: the launch was host work (a spinning CUDA wait counts as work);

* ``core``: the CPU the scheduler thread was on when the launch returned (``sched_getcpu``),
  and ``preempted``: how often the OS took the CPU from the thread during the launch
  (involuntary context switches, ``RUSAGE_THREAD``), both from 2026-11-27 on and only where the
  OS tells them (Linux). The same launch's CPU time moved by 1.5-2x in steps per server on the
  GPU machines; these say on which core, and whether the thread had to share it (the record's
  ``environment.cpu_cores`` groups the host's CPUs by physical core);

* ``host_bound`` (a prefill and the launch after one): the start event had completed. The GPU
  had finished all earlier work and started this launch before the host was done launching it:
  the launch's host work set the pace. False: the GPU was still on earlier work, so a long
  launch was the host blocked behind (or merely ahead of) the GPU;
* ``prev_prefill_done`` (the launch right after a prefill whose result has a recorded
  ``copy_done``): that prefill's ``copy_done.query()`` when this launch's ``run_batch``
  returned. True: the prefill's results were on the host before this launch was done, so this
  launch stood between the prefill's end and its first tokens (exposed); False: the launch was
  hidden behind the prefill's GPU work.

Times are ``time.time()`` so the benchmark can cut the events into its cells by wall clock. The
events go to ``timeline-<pid>.jsonl`` in ``SMOKE_PROBE_DIR`` (the new ones, one line each time)
from a daemon thread every half second (SGLang SIGKILLs its scheduler at shutdown). The
wrappers cost a few microseconds per call (on CUDA, one or two event records more); the
benchmark runs them on both sides alike.

In both processes it also records Python's garbage collections that were full ones or took
``GC_MIN_S`` or longer (``gc`` events): a collection pauses the whole process. In the
scheduler's process it records every Triton JIT compile (``compile`` events: kernel, caller,
specialization key): a kernel met with a new specialization mid-benchmark compiles inside a
launch.

In the API server's process (SGLang's ``TokenizerManager``, on its first
``_handle_batch_output`` call) it wraps that method: one ``api`` event per request whose first
output it handles, with SGLang's own timestamps of that request (received, sent to the
scheduler, first output; ``APIServerReqTimeStats``, moved to the ``time.time()`` clock), so the
part of TTFT outside the scheduler can be split too: the API server before dispatch, dispatch ->
the scheduler's receipt (the socket and the scheduler loop's next poll) and the scheduler's first
tokens -> the API server (the detokenizer and the API server's own loop). It also measures that
event loop's lag (how late a 2 ms sleep wakes; ``lag`` events, one per half second): the HTTP
intake of new requests and the streaming of every request's chunks share that one loop.

:func:`ttft_breakdown` (pure, also used by the benchmark) splits each request's scheduler-side
TTFT: received -> its prefill launched (queue), the prefill's ``run_batch``, the prefill's end
of launch -> start of its result processing (the batch launched in between: in the overlap
loop the next batch is launched before the previous result is processed), and the processing;
:func:`gpu_breakdown` adds the GPU fields' medians and shares per cell.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Iterable, Sequence

FLUSH_S = 0.5
MAX_EVENTS = 400_000
SYNC_MIN_S = 3e-4
#: Stack samples of the scheduler thread, taken only while it launches a prefill, the
#: batch right after one, or one steady decode in ``STEADY_SAMPLE_EVERY`` (``sample`` events):
#: where a long launch spends its host time when no wrapped sync shows it (a blocking copy, a
#: full launch queue, Python work).
SAMPLE_S = 1e-3
#: Every this many steady decode launches (a decode not right after a prefill), one is sampled
#: too (``phase`` "steady", its ``run`` event ``sampled``): where a decode's host time goes
#: when no wrapped sync shows it (``serve_prefill_batches.py --frames``).
#: ``SMOKE_STEADY_SAMPLE_EVERY`` and ``SMOKE_SAMPLE_DEPTH`` (the server's environment) override
#: both: every steady decode and whole stacks, for ``--functions`` on a few boots (an eager
#: batch gives 32 samples a boot at the defaults). Deeper and denser sampling takes the GIL
#: more often, on both sides alike.
STEADY_SAMPLE_EVERY = max(1, int(os.environ.get("SMOKE_STEADY_SAMPLE_EVERY") or 8))
SAMPLE_DEPTH = max(1, int(os.environ.get("SMOKE_SAMPLE_DEPTH") or 3))
#: Exact host time of named functions (``SMOKE_TIME_FUNCS`` in the server's environment: comma-
#: separated ``module:Qualname``, or ``relay`` for ``RELAY_FUNCS``): every call on the scheduler
#: thread is timed with ``perf_counter``, and each ``run`` event carries the calls made since the
#: previous ``run`` event ended (``ftimes``: name -> [calls, ms]), so a steady decode's event holds
#: one whole iteration. Unbiased where stack samples are not: the sampler thread gets the GIL
#: only where the scheduler thread lets it go (inside a torch or CUDA call), so it attributes
#: pure Python work to the next such call. A name either side lacks is listed once
#: (``ftime_missing`` event), not an error: stock has no ``publish``, the plugin no ``store_to_map``.
RELAY_FUNCS = tuple(
    f"{module}:{name}"
    for module, names in (
        ("sglang.srt.managers.overlap_utils", (
            "FutureMap.alloc_future_indices", "FutureMap.store_to_map", "FutureMap.resolve_future",
            "FutureMap.publish", "FutureMap.stash", "FutureMap.resolve_seq_lens_cpu",
            "FutureMap.lend_draft_extend_lens", "FutureMap.keep_draft_extend_lens",
            "FutureMap.relayed_eager_seq_lens", "gather_spec_extras")),
        ("sglang.srt.managers.scheduler", (
            "Scheduler.forward_spec_v2_overlap", "Scheduler.get_next_batch_to_run", "Scheduler.recv_requests")),
        ("sglang.srt.managers.scheduler_output_processor_mixin", (
            "SchedulerOutputProcessorMixin.process_batch_result_decode",)),
        ("sglang.srt.managers.schedule_batch", (
            "ScheduleBatch.prepare_for_decode", "ScheduleBatch.get_model_worker_batch",
            "ScheduleBatch.maybe_wait_verify_done")),
        ("sglang.srt.speculative.eagle_worker_v2", (
            "EAGLEWorkerV2.forward_batch_generation", "EAGLEWorkerV2.verify", "EagleDraftWorker.draft",
            "EagleDraftWorker.draft_forward", "EagleDraftWorker._draft_extend_for_decode")),
        ("sglang.srt.speculative.eagle_info_v2", (
            "EagleDraftInputV2Mixin.prepare_for_v2_draft",
            "EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache",
            "EagleVerifyInputV2Mixin.prepare_for_v2_verify")),
        ("sglang.srt.layers.attention.flashattention_backend", ("FlashAttentionBackend.init_forward_metadata",)),
        ("sglang.srt.model_executor.model_runner", ("ModelRunner.forward",)),
    )
    for name in names
)


#: The path of a prefill launch and of the iteration that builds it, on both sides
#: (``SMOKE_TIME_FUNCS=prefill``; ``serve_prefill_batches.py --ftimes --prefill``): where a longer
#: one-request prefill launch spends its host time. ``run_batch`` itself is the ``run`` event.
PREFILL_FUNCS = tuple(
    f"{module}:{name}"
    for module, names in (
        ("sglang.srt.managers.scheduler", (
            "Scheduler.recv_requests", "Scheduler.process_input_requests", "Scheduler.get_next_batch_to_run",
            "Scheduler.get_new_batch_prefill")),
        ("sglang.srt.managers.schedule_batch", (
            "ScheduleBatch.prepare_for_extend", "ScheduleBatch.get_model_worker_batch")),
        ("sglang.srt.managers.overlap_utils", (
            "FutureMap.alloc_future_indices", "FutureMap.store_to_map", "FutureMap.resolve_future",
            "FutureMap.publish", "FutureMap.stash")),
        ("sglang.srt.managers.tp_worker", ("TpModelWorker.forward_batch_generation",)),
        ("sglang.srt.speculative.eagle_worker_v2", (
            "EAGLEWorkerV2.forward_batch_generation", "EagleDraftWorker._draft_extend_for_prefill")),
        ("sglang.srt.model_executor.forward_batch_info", ("ForwardBatch.init_new",)),
        ("sglang.srt.layers.attention.flashattention_backend", ("FlashAttentionBackend.init_forward_metadata",)),
        ("sglang.srt.model_executor.model_runner", ("ModelRunner.forward",)),
    )
    for name in names
)


def timed_function_names(value: str | None) -> tuple[str, ...]:
    """``SMOKE_TIME_FUNCS`` as a list of ``module:Qualname`` (``relay``: ``RELAY_FUNCS``;
    ``prefill``: ``PREFILL_FUNCS``)."""
    names: list[str] = []
    for item in (value or "").split(","):
        item = item.strip()
        if item == "relay":
            names.extend(RELAY_FUNCS)
        elif item == "prefill":
            names.extend(PREFILL_FUNCS)
        elif item:
            names.append(item)
    return tuple(dict.fromkeys(names))


TIME_FUNCS = timed_function_names(os.environ.get("SMOKE_TIME_FUNCS"))
#: ``SMOKE_CORE_SPEED=1`` (the server's environment): right before and right after each prefill
#: launch the scheduler thread times a fixed piece of pure-Python work (``core_us``: the core's
#: speed at that moment, whatever SGLang's code or the GPU do) and, on CUDA, a fixed run of driver
#: calls that queue no GPU work (``driver_us``). The ``run`` event carries both pairs
#: (``serve_prefill_batches.py --core-speed``). A launch whose CPU time grows with ``core_us`` ran
#: on a slower core (its neighbours, its clock); one that grows while ``core_us`` does not spent
#: the time in its own code or the driver. About 0.1 ms per prefill launch, outside its
#: ``run_batch`` window, on both sides alike. Two more readings with it: ``kernel_us``, a fixed
#: run of launches of an empty kernel onto the stream the prefill goes to, before and after
#: (the driver's launch path with that stream's queue as the launch meets it), and ``gc``, the
#: Python garbage collections inside the launch (count per generation and their time): the
#: two ways the same SGLang code can take more CPU time on an unchanged core.
CORE_SPEED = os.environ.get("SMOKE_CORE_SPEED") == "1"
#: ``SMOKE_CALL_CENSUS=N`` (the server's environment): the N one-request prefill launches after
#: the first ``CENSUS_SKIP`` prefills each count every call the scheduler thread makes inside
#: them (``sys.setprofile`` on that thread only, for the launch only): Python functions by file
#: and qualified name, C functions by qualified name. The ``run`` event carries the counts
#: (``census``) and the launch's token count (``tokens``). The counts do not depend on how fast
#: the core is: two sides' launches of the same prompt make the same calls unless their code
#: differs (``serve_prefill_batches.py --census``). The profiled launches are slow (every call
#: goes through the counter), on both sides alike; read them for counts, never for time.
CALL_CENSUS = max(0, int(os.environ.get("SMOKE_CALL_CENSUS") or 0))
#: ``SMOKE_CALL_CENSUS_TIMES=1`` (with the census): each C call's time from call to return too,
#: added up per C function (``census_ms``, inclusive, ms): which calls take longer on one side
#: when both make the same ones. Read under the profiler, so longer than unprofiled, on both
#: sides alike.
CENSUS_TIMES = os.environ.get("SMOKE_CALL_CENSUS_TIMES") == "1"
CENSUS_SKIP = 2
CORE_SPEED_LOOPS = 2000
DRIVER_CALLS = 20
KERNEL_CALLS = 20
#: Triton JIT compiles (``compile`` events): how many callers outside Triton each names, and
#: how much of its specialization key it keeps.
COMPILE_CALLERS = 4
COMPILE_KEY_CHARS = 300
#: The parts of TTFT outside the scheduler, from the API server's ``api`` events.
API_PARTS = ("api_before_dispatch", "dispatch_to_sched", "sched_to_api", "api_total")
#: Python garbage collections (``gc`` events, scheduler and API server alike): every full
#: (generation 2) one and any other that took this long (s).
GC_MIN_S = 2e-3
#: The API server's event-loop lag: a task sleeps LAG_SLEEP_S again and again and records how
#: late it wakes, summed per LAG_WINDOW_S (one ``lag`` event per window).
LAG_SLEEP_S = 0.002
LAG_WINDOW_S = 0.5


# ----------------------------------------------------------------------------- pure helpers


def ttft_breakdown(events: Sequence[dict[str, Any]], t_lo: float = float("-inf"),
                   t_hi: float = float("inf")) -> dict[str, Any]:
    """Per request received in ``[t_lo, t_hi)``: the scheduler's part of its TTFT, split.

    Returns ``prefill_bs_mean``: the mean over those requests of the size of the prefill batch
    each was launched in (how many requests shared its prefill), and medians (ms) over them of ``queue`` (received -> its prefill's launch
    started), ``launch`` (the prefill's ``run_batch``), ``between`` (the prefill's launch ended ->
    its result's processing started: the next batch's launch, in the overlap loop), ``process``
    (the processing of the prefill's result) and ``total`` (received -> processed), plus the
    median ``run_batch`` time of the batch launched right after each prefill (``next_launch``)
    and of decode batches in the window (``decode_launch``). With the API server's ``api``
    events, also the parts outside the scheduler (``API_PARTS``): the API server's time before
    dispatch, dispatch -> the scheduler's receipt, the scheduler's processing end -> the API
    server's first output, and the API server's own TTFT (received -> first output); ``None``
    without them. With the GPU side (``gpu`` events, ``run`` events' GPU fields), also
    :func:`gpu_breakdown`'s figures."""
    # Interval events (run, proc, sync) span [t, t1]; run and proc carry SGLang's own
    # forward_mode.is_extend() of their batch as "extend".
    runs = [e for e in events if e["kind"] == "run"]
    procs = [e for e in events if e["kind"] == "proc"]
    recv = {e["rid"]: e["t"] for e in events if e["kind"] == "recv" and t_lo <= e["t"] < t_hi}
    api = {e["rid"]: e for e in events if e["kind"] == "api"}
    parts: dict[str, list[float]] = {k: [] for k in ("queue", "launch", "between", "process", "total", "next_launch",
                                                     *API_PARTS)}
    # Per request: the size of the first prefill batch it was launched in (a chunked prompt
    # spans several; serve_prefill_batches.py counts the same way).
    prefill_bs: dict[str, int] = {}
    proc_i = 0
    for i, run in enumerate(runs):
        if not run["extend"]:
            continue
        rids = [r for r in run.get("rids") or () if r in recv]
        if not rids:
            continue
        # The first result processing of this batch: the first proc of an extend batch of the
        # same size that starts after this launch ended.
        while proc_i < len(procs) and procs[proc_i]["t"] < run["t1"]:
            proc_i += 1
        proc = next((p for p in procs[proc_i:] if p["extend"] and p["bs"] == run["bs"]), None)
        if proc is None:
            continue
        nxt = runs[i + 1] if i + 1 < len(runs) and runs[i + 1]["t"] < proc["t"] else None
        for rid in rids:
            prefill_bs.setdefault(rid, run["bs"])
            parts["queue"].append(run["t"] - recv[rid])
            parts["launch"].append(run["t1"] - run["t"])
            parts["between"].append(proc["t"] - run["t1"])
            parts["process"].append(proc["t1"] - proc["t"])
            parts["total"].append(proc["t1"] - recv[rid])
            if nxt is not None:
                parts["next_launch"].append(nxt["t1"] - nxt["t"])
            a = api.get(rid)
            if a is not None:
                parts["api_before_dispatch"].append(a["dispatch"] - a["received"])
                parts["dispatch_to_sched"].append(recv[rid] - a["dispatch"])
                parts["sched_to_api"].append(a["first"] - proc["t1"])
                parts["api_total"].append(a["first"] - a["received"])
    decode = [r["t1"] - r["t"] for r in runs if r["mode"] == "DECODE" and t_lo <= r["t"] < t_hi]
    # Where the prefill's own launch and the launch right after it waited: their syncs,
    # summed per call site.
    syncs = [e for e in events if e["kind"] == "sync"]
    waits: dict[str, float] = {}
    own_waits: dict[str, float] = {}
    prefills = [i for i, r in enumerate(runs) if r["extend"] and t_lo <= r["t"] < t_hi]
    for i in prefills:
        for run, into in ((runs[i], own_waits), (runs[i + 1] if i + 1 < len(runs) else None, waits)):
            if run is None:
                continue
            add_waits(into, (e for e in syncs if run["t"] <= e["t"] < run["t1"]))
    n_prefills = len(prefills) or 1
    # Stack samples by phase: where the host was during those launches (ms per prefill).
    sampled: dict[str, dict[str, float]] = {"launch_samples_ms": {}, "next_launch_samples_ms": {}}
    for e in events:
        if e["kind"] == "sample" and t_lo <= e["t"] < t_hi and e["phase"] != "steady":
            into = sampled["launch_samples_ms" if e["phase"] == "prefill" else "next_launch_samples_ms"]
            key = " < ".join(e["stack"])
            into[key] = into.get(key, 0.0) + e.get("dt", SAMPLE_S)
    # The API server's event loop: mean lateness of a short sleep over the windows in the cell.
    lag = [e for e in events if e["kind"] == "lag" and t_lo <= e["t"] < t_hi]
    n_lag = sum(e["n"] for e in lag)
    out: dict[str, Any] = {"requests": len(parts["total"]),
                           "api_loop_lag_ms": round(sum(e["sum"] for e in lag) / n_lag * 1e3, 3) if n_lag else None,
                           "prefill_bs_mean": round(statistics.fmean(prefill_bs.values()), 2) if prefill_bs else None}
    for k, v in parts.items():
        out[k + "_ms"] = round(statistics.median(v) * 1e3, 3) if v else None
    out["decode_launch_ms"] = round(statistics.median(decode) * 1e3, 3) if decode else None
    out.update(gpu_breakdown(events, t_lo, t_hi))
    for name, found in (("next_launch_waits_ms", waits), ("launch_waits_ms", own_waits), *sampled.items()):
        out[name] = {k: round(v * 1e3 / n_prefills, 3)
                     for k, v in sorted(found.items(), key=lambda kv: -kv[1])[:6]}
    return out


def gpu_breakdown(events: Sequence[dict[str, Any]], t_lo: float = float("-inf"),
                  t_hi: float = float("inf")) -> dict[str, Any]:
    """The GPU side of the launches starting in ``[t_lo, t_hi)`` (their ``gpu`` events and the GPU
    fields of their ``run`` events), per launch: medians (ms) of ``gpu_ms`` over prefills
    (``prefill_gpu_ms``) and over the launches right after a prefill (``next_gpu_ms``), of
    ``gpu_gap_ms``, ``gpu_queue_ms`` and their results' ``ready_wait_ms`` over prefills
    (``prefill_gpu_gap_ms``, ``prefill_gpu_queue_ms``, ``prefill_ready_wait_ms``); shares (0-1) of the prefills that were
    ``host_bound`` (``prefill_host_bound``), and of the decode launches (``first_decode_exposed``)
    and prefill launches (``next_prefill_exposed``) right after a prefill that found its
    ``copy_done`` done; ``gpu_prefills``: the prefills with ``gpu_ms``. Empty when no launch
    there has any of these (off CUDA, or records made before them): such records summarise as
    before."""
    runs = [e for e in events if e["kind"] == "run"]
    gpu = {e["t"]: e for e in events if e["kind"] == "gpu"}
    ready = {e["t"]: e for e in events if e["kind"] == "ready"}
    medians: dict[str, list[float]] = {"prefill_gpu_ms": [], "next_gpu_ms": [], "prefill_gpu_gap_ms": [],
                                       "prefill_gpu_queue_ms": [], "prefill_ready_wait_ms": []}
    shares: dict[str, list[bool]] = {"prefill_host_bound": [], "first_decode_exposed": [], "next_prefill_exposed": []}
    for i, run in enumerate(runs):
        if not t_lo <= run["t"] < t_hi:
            continue
        after_prefill = i > 0 and runs[i - 1]["extend"]
        timed = gpu.get(run["t"], {})
        if run["extend"]:
            for key, field in (("prefill_gpu_ms", "gpu_ms"), ("prefill_gpu_gap_ms", "gpu_gap_ms"),
                               ("prefill_gpu_queue_ms", "gpu_queue_ms")):
                if field in timed:
                    medians[key].append(timed[field])
            if run["t"] in ready:
                medians["prefill_ready_wait_ms"].append(ready[run["t"]]["ready_wait_ms"])
            if "host_bound" in run:
                shares["prefill_host_bound"].append(run["host_bound"])
        if after_prefill and "gpu_ms" in timed:
            medians["next_gpu_ms"].append(timed["gpu_ms"])
        if after_prefill and "prev_prefill_done" in run and (run["extend"] or run["mode"] == "DECODE"):
            shares["next_prefill_exposed" if run["extend"] else "first_decode_exposed"].append(run["prev_prefill_done"])
    if not any((*medians.values(), *shares.values())):
        return {}
    out: dict[str, Any] = {"gpu_prefills": len(medians["prefill_gpu_ms"])}
    out.update({k: round(statistics.median(v), 3) if v else None for k, v in medians.items()})
    out.update({k: round(sum(v) / len(v), 3) if v else None for k, v in shares.items()})
    return out


def add_waits(into: dict[str, float], syncs: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Add each ``sync`` event's blocked time (s) to ``into`` under its site, ``"<what> @ <where>"``;
    returns ``into``."""
    for e in syncs:
        key = f'{e["what"]} @ {e["where"]}'
        into[key] = into.get(key, 0.0) + (e["t1"] - e["t"])
    return into


def read_timeline(text: str, name: str) -> list[dict[str, Any]]:
    """The events of the text of the timeline file ``name``: ``timeline-<pid>.jsonl`` (one JSON
    line per flush; a last line cut off mid-write is left out) or, records before 2026-11-26,
    ``timeline-<pid>.json`` (one document; ``ValueError`` when it is cut off)."""
    if not name.endswith(".jsonl"):
        return json.loads(text).get("events", [])
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            events.extend(json.loads(line).get("events", []))
        except ValueError:
            continue
    return events


def is_timeline_file(name: str) -> bool:
    """``timeline-<pid>.json`` (records before 2026-11-26) or ``timeline-<pid>.jsonl``."""
    return name.startswith("timeline-") and name.endswith((".json", ".jsonl"))


def load_events(paths: Iterable[str]) -> list[dict[str, Any]]:
    """The events of every timeline file (one per process), in time order."""
    events: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            events.extend(read_timeline(f.read(), path))
    events.sort(key=lambda e: e["t"])
    return events


# ----------------------------------------------------------------------------- in the scheduler


def _libc_getcpu() -> Any:
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


_GETCPU = _libc_getcpu()


def thread_core() -> int | None:
    """The CPU the calling thread is on now, or None where libc has no ``sched_getcpu``."""
    if _GETCPU is None:
        return None
    core = _GETCPU()
    return core if core >= 0 else None


try:  # RUSAGE_THREAD is Linux's
    import resource

    _RUSAGE_THREAD: int | None = resource.RUSAGE_THREAD
except (ImportError, AttributeError):
    _RUSAGE_THREAD = None


def involuntary_switches() -> int | None:
    """How often the OS has preempted the calling thread so far, or None off Linux."""
    if _RUSAGE_THREAD is None:
        return None
    try:
        return resource.getrusage(_RUSAGE_THREAD).ru_nivcsw
    except OSError:
        return None


def census_key(frame: Any, event: str, arg: Any) -> str | None:
    """The census's name of one profiler event (``sys.setprofile``): ``py FILE:QUALNAME`` for a
    Python call (the file's base name), ``c QUALNAME`` for a C call, None for the rest (returns,
    exceptions)."""
    if event == "call":
        code = frame.f_code
        return f"py {os.path.basename(code.co_filename)}:{getattr(code, 'co_qualname', code.co_name)}"
    if event == "c_call":
        return "c " + str(getattr(arg, "__qualname__", None) or getattr(arg, "__name__", None) or type(arg).__name__)
    return None


def census_profiler(counts: dict[str, int], skip_file: str, times: dict[str, float] | None = None) -> Any:
    """A ``sys.setprofile`` function that counts each call into ``counts`` by ``census_key``,
    leaving out Python calls of ``skip_file`` (the probe's own wrappers). With ``times``, each C
    call's seconds from its call to its return also add up there by key (inclusive: a C call
    that calls back into Python counts that too)."""
    open_calls: list[tuple[str, float]] = []
    clock = time.perf_counter

    def profile(frame: Any, event: str, arg: Any) -> None:
        if times is not None and event in ("c_return", "c_exception"):
            if open_calls:
                key, t0 = open_calls.pop()
                times[key] = times.get(key, 0.0) + (clock() - t0)
            return
        key = census_key(frame, event, arg)
        if key is not None and not (event == "call" and os.path.basename(frame.f_code.co_filename) == skip_file):
            counts[key] = counts.get(key, 0) + 1
            if times is not None and event == "c_call":
                open_calls.append((key, clock()))
    return profile


def batch_tokens(batch: Any) -> int | None:
    """The tokens a prefill batch extends by (SGLang's ``extend_num_tokens``), None without."""
    n = getattr(batch, "extend_num_tokens", None)
    return int(n) if isinstance(n, int) else None


def core_us(loops: int = CORE_SPEED_LOOPS) -> float:
    """Microseconds the calling thread takes for ``loops`` rounds of small-integer arithmetic in
    Python: the same work every time, so it reads the core's speed right now (a preemption
    inside it reads high too; the ``run`` event's ``preempted`` tells those apart)."""
    t0 = time.perf_counter()
    x = 0
    for i in range(loops):
        x = (x + i * 3) & 0xFFFF
    return round((time.perf_counter() - t0) * 1e6, 2)


def driver_us(stream: Any, calls: int = DRIVER_CALLS) -> float:
    """Microseconds for ``calls`` of ``stream.query()``: CUDA driver calls that queue nothing, so
    they read the driver's own cost on this thread (its locks, the core), not the GPU's work."""
    t0 = time.perf_counter()
    for _ in range(calls):
        stream.query()
    return round((time.perf_counter() - t0) * 1e6, 2)


def kernel_us(launch: Any, calls: int = KERNEL_CALLS) -> float:
    """Microseconds for ``calls`` of ``launch()``, each queueing one empty kernel: the driver's
    launch path as SGLang's own kernel launches meet it (the stream's queue, the driver's locks,
    the core). About 2 us of GPU time each, on both sides alike."""
    t0 = time.perf_counter()
    for _ in range(calls):
        launch()
    return round((time.perf_counter() - t0) * 1e6, 2)


def core_speed(sched: Any, batch: Any) -> tuple[float, float | None, float | None]:
    """``core_us`` and, for a batch on a CUDA device, ``driver_us`` on the current stream and
    ``kernel_us`` on the stream ``batch`` is launched on (``launch_stream``)."""
    drv = kern = None
    stream = launch_stream(sched, batch)
    if stream is not None:
        import torch

        drv = driver_us(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            kern = kernel_us(functools.partial(torch.cuda._sleep, 0))
    return core_us(), drv, kern


@functools.cache
def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def launch_stream(sched: Any, batch: Any) -> Any:
    """The CUDA stream ``batch``'s forward is launched on: the scheduler's ``forward_stream`` in
    the overlap loop (``Scheduler.run_batch`` launches under ``forward_stream_ctx``), else the
    current stream; None without CUDA or for a batch not on a CUDA device (no GPU fields then)."""
    if not str(getattr(batch, "device", "")).startswith("cuda") or not _has_cuda():
        return None
    if getattr(sched, "enable_overlap", False):
        return sched.forward_stream
    import torch

    return torch.cuda.current_stream()


def side_stream() -> Any:
    """A stream of the probe's own that nothing else uses: an event recorded there completes at
    once, so it marks the host's moment on the GPU's clock (the tests hand in their own)."""
    import torch

    return torch.cuda.Stream()


def gpu_event() -> Any:
    """A CUDA event that can time (the tests hand in their own)."""
    import torch

    return torch.cuda.Event(enable_timing=True)


def find_timed_function(spec: str) -> tuple[Any, str, Any] | None:
    """``module:Qualname`` looked up where it is defined (a class's own ``__dict__`` or a
    module's globals, so an inherited method is not found on a subclass): its owner, its name
    there and the object (a class or static method as such), or None where it is not found or is
    not callable."""
    import importlib

    module_name, _, qualname = spec.partition(":")
    *path, attr = qualname.split(".")
    try:
        owner: Any = importlib.import_module(module_name)
        for part in path:
            owner = getattr(owner, part)
        fn = vars(owner)[attr]
    except (ImportError, AttributeError, KeyError, TypeError):
        return None
    return (owner, attr, fn) if callable(getattr(fn, "__func__", fn)) else None


def on_thread_timed(fn: Any, tid: int, done: Any, clock: Any) -> Any:
    """``fn`` wrapped so that a call on thread ``tid`` is timed with ``clock`` and reported as
    ``done(t0, t1)`` (called inside the wrapper: ``sys._getframe(2)`` there is the caller);
    on any other thread ``fn`` runs as it is."""

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != tid:
            return fn(*args, **kwargs)
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            done(t0, clock())

    return timed


class Timeline:
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.events: list[dict[str, Any]] = []
        self.installed = False
        self.errors: list[str] = []
        self.written = -1
        self.errors_written = 0
        self.lock = threading.Lock()
        # What the scheduler thread is launching now, when sampled: None, "prefill", "next"
        # (the batch right after a prefill) or "steady" (one steady decode in
        # STEADY_SAMPLE_EVERY, counted by steady_seen); read by the sampler thread.
        self.launching: str | None = None
        # SMOKE_CORE_SPEED: the garbage collections inside the prefill launch now running
        # (collections of generation 0 / 1 / 2, seconds), None outside one; ``watch_gc`` adds.
        self.launch_gc: list[Any] | None = None
        self.steady_seen = 0
        # CALL_CENSUS: one-request prefill launches seen so far (scheduler thread only).
        self.prefills_seen = 0
        self.last_extend = False
        self.lag_started = False
        # GPU timing (scheduler thread only): the previous launch's end event, the previous
        # launch's result copy when it was a prefill; the timed launches not resolved yet
        # (their t, start, end, previous end, side-stream reference), oldest first: one stream
        # completes in order.
        self.prev_end: Any = None
        self.prefill_copy: Any = None
        self.pending: collections.deque[tuple[float, Any, Any, Any, Any]] = collections.deque()
        # The side stream (made on first use) for reference events; each prefill's end event by
        # the rid of its first request, launch order (its result is processed later); the
        # results whose processing began, not resolved yet (launch t, end, reference).
        self.side: Any = None
        self.prefill_ends: dict[str, collections.deque[tuple[float, Any]]] = {}
        self.pending_ready: collections.deque[tuple[float, Any, Any]] = collections.deque()
        self.gpu_off = False
        # TIME_FUNCS: name -> [calls, seconds] since the last run event (scheduler thread only).
        self.ftimes: dict[str, list[Any]] = {}

    def on_run_batch(self, frame) -> None:
        """sitecustomize hook (a PY_START callback): install on the first Scheduler.run_batch."""
        self._install_on(frame, "Scheduler", self.install)

    def on_api_output(self, frame) -> None:
        """sitecustomize hook: install on the first TokenizerManager._handle_batch_output."""
        self._install_on(frame, "TokenizerManager", self.install_api)

    def _install_on(self, frame, class_name: str, install) -> None:
        """Call ``install(owner class)`` once, when the frame's ``self`` is a ``class_name``."""
        if self.installed:
            return
        owner = frame.f_locals.get("self")
        if owner is None or not any(c.__name__ == class_name for c in type(owner).__mro__):
            return
        try:
            install(type(owner))
        except Exception as exc:  # never break SGLang's process over a probe
            self.errors.append(f"{install.__name__}: {exc!r}")

    def install_api(self, tm_cls: type) -> None:
        """Wrap ``tm_cls._handle_batch_output`` (a coroutine function): for every request whose
        first output it handles, one ``api`` event with SGLang's own timestamps of it."""
        self.installed = True
        tl = self
        orig = tm_cls._handle_batch_output
        # APIServerReqTimeStats holds time.perf_counter() values; events use time.time().
        shift = time.time() - time.perf_counter()

        async def _handle_batch_output(self, recv_obj, *a, **k):
            if not tl.lag_started:
                tl.lag_started = True
                asyncio.ensure_future(tl._loop_lag())
            states = getattr(self, "rid_to_state", {})
            first = {}
            for rid in getattr(recv_obj, "rids", None) or ():
                ts = getattr(states.get(rid), "time_stats", None)
                if ts is not None and not ts.first_token_time:
                    first[rid] = ts
            result = await orig(self, recv_obj, *a, **k)
            for rid, ts in first.items():
                if ts.first_token_time and ts.created_time and ts.api_server_dispatch_time:
                    tl.add({"kind": "api", "t": ts.created_time + shift, "rid": rid,
                            "received": ts.created_time + shift,
                            "dispatch": ts.api_server_dispatch_time + shift,
                            "first": ts.first_token_time + shift})
            return result

        _handle_batch_output.__wrapped__ = orig  # type: ignore[attr-defined]
        _handle_batch_output.__qualname__ = "sched_timeline._handle_batch_output"
        tm_cls._handle_batch_output = _handle_batch_output
        self.watch_gc("api")
        threading.Thread(target=self._ticker, name="api-timeline", daemon=True).start()

    def watch_gc(self, where: str) -> None:
        """One ``gc`` event per Python garbage collection in this process that was a full one
        (generation 2) or took ``GC_MIN_S`` or longer: start, end, generation, objects
        collected, ``where`` (``"scheduler"`` or ``"api"``). A collection stops every thread of
        the process, the event loop too. Inside a prefill launch timed for ``SMOKE_CORE_SPEED``
        every collection, however short, also counts into ``launch_gc``."""
        import gc

        started: list[float] = []

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[:] = [time.time()]
            elif started:
                t0, t1 = started[0], time.time()
                counting = self.launch_gc
                gen = info.get("generation")
                if counting is not None and gen in (0, 1, 2):
                    counting[gen] += 1
                    counting[3] += t1 - t0
                if gen == 2 or t1 - t0 >= GC_MIN_S:
                    self.add({"kind": "gc", "t": t0, "t1": t1, "gen": gen,
                              "collected": info.get("collected"), "where": where})

        self.gc_hook = on_gc
        gc.callbacks.append(on_gc)

    def watch_compiles(self, jit_cls: Any = None) -> None:
        """One ``compile`` event per Triton JIT compile in this process (``JITFunction._do_compile``,
        the call a kernel's first launch with a new specialization makes): start, end, the
        kernel's name, its specialization key (cut to ``COMPILE_KEY_CHARS``) and ``where``, the
        first ``COMPILE_CALLERS`` frames outside Triton that launched it. A compile holds the
        launching thread for tens to hundreds of ms, and the stack samples (``SAMPLE_DEPTH``
        frames) end inside Triton's compiler. ``jit_cls`` defaults to Triton's ``JITFunction``;
        nothing happens without Triton."""
        import sys

        if jit_cls is None:
            try:
                from triton.runtime.jit import JITFunction as jit_cls
            except Exception:
                return
        orig = getattr(jit_cls, "_do_compile", None)
        if orig is None or getattr(orig, "_timeline_compiles", False):
            return
        tl = self

        def _do_compile(self_fn, key, *a, **k):
            t0 = time.time()
            try:
                return orig(self_fn, key, *a, **k)
            finally:
                where: list[str] = []
                f = sys._getframe(1)
                while f is not None and len(where) < COMPILE_CALLERS:
                    path = f.f_code.co_filename
                    if f"{os.sep}triton{os.sep}" not in path and os.path.basename(path) != os.path.basename(__file__):
                        where.append(f"{os.path.basename(path)}:{f.f_lineno} {f.f_code.co_name}")
                    f = f.f_back
                fn = getattr(self_fn, "fn", None)
                tl.add({"kind": "compile", "t": t0, "t1": time.time(),
                        "kernel": getattr(fn, "__name__", None) or getattr(self_fn, "__name__", "?"),
                        "key": str(key)[:COMPILE_KEY_CHARS], "where": where})

        _do_compile._timeline_compiles = True  # type: ignore[attr-defined]
        _do_compile.__wrapped__ = orig  # type: ignore[attr-defined]
        jit_cls._do_compile = _do_compile

    async def _loop_lag(self) -> None:
        """Runs on the API server's event loop: how late a short sleep wakes, per window."""
        window = {"t": time.time(), "n": 0, "sum": 0.0, "max": 0.0}
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(LAG_SLEEP_S)
            late = max(0.0, time.perf_counter() - t0 - LAG_SLEEP_S)
            window["n"] += 1
            window["sum"] += late
            window["max"] = max(window["max"], late)
            now = time.time()
            if now - window["t"] >= LAG_WINDOW_S:
                self.add({"kind": "lag", **window})
                window = {"t": now, "n": 0, "sum": 0.0, "max": 0.0}

    def add(self, event: dict[str, Any]) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)

    def install(self, sched_cls: type) -> None:
        self.installed = True
        tl = self
        orig_input = sched_cls.process_input_requests
        orig_run = sched_cls.run_batch
        orig_proc = sched_cls.process_batch_result

        def _interval(kind: str, batch: Any, t0: float) -> dict[str, Any]:
            fm = getattr(batch, "forward_mode", None)
            return {"kind": kind, "t": t0, "t1": time.time(), "mode": getattr(fm, "name", None) or "NONE",
                    "extend": bool(fm is not None and fm.is_extend()), "bs": len(getattr(batch, "reqs", ()) or ())}

        def process_input_requests(self, recv_reqs, *a, **k):
            t = time.time()
            for req in recv_reqs or ():
                rid = getattr(req, "rid", None)
                if isinstance(rid, str):
                    tl.add({"kind": "recv", "t": t, "rid": rid})
            return orig_input(self, recv_reqs, *a, **k)

        def run_batch(self, batch, *a, **k):
            fm = getattr(batch, "forward_mode", None)
            extend = bool(fm is not None and fm.is_extend())
            speed = core_speed(self, batch) if CORE_SPEED and extend else None
            if speed is not None:
                tl.launch_gc = [0, 0, 0, 0.0]
            t0, c0, s0 = time.time(), time.thread_time(), involuntary_switches()
            after_prefill = tl.last_extend
            steady = not extend and not after_prefill and getattr(fm, "name", None) == "DECODE"
            if steady:
                tl.steady_seen += 1
            sample_steady = steady and tl.steady_seen % STEADY_SAMPLE_EVERY == 0
            tl.launching = "prefill" if extend else ("next" if after_prefill else ("steady" if sample_steady else None))
            gpu = tl.gpu_start(self, batch, timed=extend or after_prefill)
            census = tl.census_start(batch) if CALL_CENSUS and extend else None
            result = None
            try:
                result = orig_run(self, batch, *a, **k)
                return result
            finally:
                if census is not None:
                    sys.setprofile(None)
                tl.launching, tl.last_extend = None, extend
                ev = _interval("run", batch, t0)
                ev["cpu_ms"] = round((time.thread_time() - c0) * 1000, 3)
                core, s1 = thread_core(), involuntary_switches()
                if core is not None:
                    ev["core"] = core
                if s0 is not None and s1 is not None:
                    ev["preempted"] = s1 - s0
                if speed is not None:
                    gc_seen, tl.launch_gc = tl.launch_gc, None
                    after = core_speed(self, batch)
                    ev["core_us"] = [speed[0], after[0]]
                    if speed[1] is not None and after[1] is not None:
                        ev["driver_us"] = [speed[1], after[1]]
                    if speed[2] is not None and after[2] is not None:
                        ev["kernel_us"] = [speed[2], after[2]]
                    if gc_seen is not None:
                        ev["gc"] = gc_seen[:3] + [round(gc_seen[3] * 1e3, 3)]
                if census is not None:
                    ev["census"] = census[0]
                    ev["tokens"] = batch_tokens(batch)
                    if census[1] is not None:
                        ev["census_ms"] = {k: round(v * 1e3, 4) for k, v in census[1].items()}
                if sample_steady:
                    ev["sampled"] = True
                if ev["extend"]:
                    ev["rids"] = [r.rid for r in batch.reqs]
                if tl.ftimes:
                    ev["ftimes"] = {k: [n, round(s * 1e3, 4)] for k, (n, s) in tl.ftimes.items()}
                    tl.ftimes.clear()
                tl.gpu_end(ev, gpu, result if extend else None, after_prefill)
                tl.add(ev)

        def process_batch_result(self, batch, *a, **k):
            t0 = time.time()
            tl.gpu_ready(batch)
            try:
                return orig_proc(self, batch, *a, **k)
            finally:
                tl.add(_interval("proc", batch, t0))

        for new, orig in ((process_input_requests, orig_input), (run_batch, orig_run),
                          (process_batch_result, orig_proc)):
            new.__wrapped__ = orig  # type: ignore[attr-defined]
            new.__qualname__ = f"sched_timeline.{orig.__name__}"
        sched_cls.process_input_requests = process_input_requests
        sched_cls.run_batch = run_batch
        sched_cls.process_batch_result = process_batch_result
        self._wrap_syncs(threading.get_ident())
        self.time_functions(TIME_FUNCS, threading.get_ident())
        self.watch_gc("scheduler")
        self.watch_compiles()
        threading.Thread(target=self._ticker, name="sched-timeline", daemon=True).start()
        threading.Thread(target=self._sampler, args=(threading.get_ident(),),
                         name="sched-timeline-sampler", daemon=True).start()

    def census_start(self, batch: Any) -> tuple[dict[str, int], dict[str, float] | None] | None:
        """``CALL_CENSUS``: for a one-request prefill launch in the census's range, the empty
        counts (and C-call seconds, with ``CENSUS_TIMES``) and the thread's profiler adding into
        them (the caller turns it off when the launch returns); None for any other launch."""
        if len(getattr(batch, "reqs", ()) or ()) != 1:
            return None
        self.prefills_seen += 1
        if not CENSUS_SKIP < self.prefills_seen <= CENSUS_SKIP + CALL_CENSUS:
            return None
        counts: dict[str, int] = {}
        times: dict[str, float] | None = {} if CENSUS_TIMES else None
        sys.setprofile(census_profiler(counts, os.path.basename(__file__), times))
        return counts, times

    def time_functions(self, names: Sequence[str], tid: int) -> None:
        """Wrap each ``module:Qualname`` in ``names`` (``find_timed_function``; a class or static
        method stays one, e.g. ``ForwardBatch.init_new``) so that its calls on thread ``tid`` add
        to ``self.ftimes``; the names not found go into one ``ftime_missing`` event."""
        missing = []
        for spec in names:
            found = find_timed_function(spec)
            if found is None:
                missing.append(spec)
                continue
            owner, attr, fn = found
            kind = type(fn) if isinstance(fn, (staticmethod, classmethod)) else None
            timed = self._timed(spec.partition(":")[2], fn.__func__ if kind is not None else fn, tid)
            setattr(owner, attr, kind(timed) if kind is not None else timed)
        if names:
            self.add({"kind": "ftime_missing", "t": time.time(), "names": missing})

    def _timed(self, name: str, fn: Any, tid: int) -> Any:
        acc = self.ftimes

        def done(t0: float, t1: float) -> None:
            entry = acc.get(name)
            if entry is None:
                entry = acc[name] = [0, 0.0]
            entry[0] += 1
            entry[1] += t1 - t0

        return on_thread_timed(fn, tid, done, time.perf_counter)

    def gpu_start(self, sched: Any, batch: Any, timed: bool) -> tuple[Any, Any, Any] | None:
        """Before a launch: the earlier launches' GPU times that are ready, then this launch's
        stream and, for a ``timed`` one (a prefill, the launch after one), a reference event on
        the side stream and a start event on the launch's stream (else None for both); None
        off CUDA."""
        if self.gpu_off:
            return None
        try:
            self.resolve_gpu()
            stream = launch_stream(sched, batch)
            if stream is None:
                return None
            start = ref = None
            if timed:
                ref, start = gpu_event(), gpu_event()
                ref.record(self.side_stream())
                start.record(stream)
            return stream, start, ref
        except Exception as exc:  # never break SGLang's process over a probe
            self._gpu_failed(exc)
            return None

    def gpu_end(self, ev: dict[str, Any], gpu: tuple[Any, Any, Any] | None, prefill_result: Any,
                after_prefill: bool) -> None:
        """After a launch: the GPU's progress when the host finished it (``host_bound``,
        ``prev_prefill_done``; ``query()`` only, it never waits), then its end event; its times
        are resolved before a later launch."""
        prev_end, prefill_copy = self.prev_end, self.prefill_copy
        self.prev_end = self.prefill_copy = None
        if gpu is None or self.gpu_off:
            return
        stream, start, ref = gpu
        try:
            if start is not None:
                ev["host_bound"] = bool(start.query())
            if after_prefill and prefill_copy is not None:
                ev["prev_prefill_done"] = bool(prefill_copy.query())
            end = gpu_event()
            end.record(stream)
            if start is not None:
                self.pending.append((ev["t"], start, end, prev_end, ref))
            if ev["extend"] and ev.get("rids") and len(self.prefill_ends) < 1000:
                self.prefill_ends.setdefault(ev["rids"][0], collections.deque()).append((ev["t"], end))
            self.prev_end = end
            copy = getattr(prefill_result, "copy_done", None)
            # A torch event never recorded reads as done: only a recorded one (``cuda_event``) counts.
            self.prefill_copy = copy if copy is not None and getattr(copy, "cuda_event", 1) else None
        except Exception as exc:
            self._gpu_failed(exc)

    def resolve_gpu(self) -> None:
        """One ``ready`` event per prefill result whose end and reference events have both
        completed, then one ``gpu`` event per timed launch whose end event has, oldest first,
        each stopping at the first still in flight."""
        while self.pending_ready and self.pending_ready[0][1].query() and self.pending_ready[0][2].query():
            t, end, ref = self.pending_ready.popleft()
            self.add({"kind": "ready", "t": t, "ready_wait_ms": round(end.elapsed_time(ref), 4)})
        while self.pending:
            t, start, end, prev_end, ref = self.pending[0]
            if not end.query():
                return
            self.pending.popleft()
            ev = {"kind": "gpu", "t": t, "gpu_ms": round(start.elapsed_time(end), 4)}
            if prev_end is not None and prev_end.query():
                ev["gpu_gap_ms"] = round(max(0.0, prev_end.elapsed_time(start)), 4)
            if ref is not None:
                ev["gpu_queue_ms"] = round(max(0.0, ref.elapsed_time(start)), 4)
            self.add(ev)

    def side_stream(self) -> Any:
        if self.side is None:
            self.side = side_stream()
        return self.side

    def gpu_ready(self, batch: Any) -> None:
        """When a prefill's result processing begins: a reference event on the side stream,
        paired with that prefill's end event (resolved before a later launch, by ``query()``)."""
        fm = getattr(batch, "forward_mode", None)
        if self.gpu_off or fm is None or not fm.is_extend():
            return
        try:
            reqs = getattr(batch, "reqs", None) or ()
            ends = self.prefill_ends.get(getattr(reqs[0], "rid", None)) if reqs else None
            if not ends:
                return
            t, end = ends.popleft()
            if not ends:
                del self.prefill_ends[reqs[0].rid]
            ref = gpu_event()
            ref.record(self.side_stream())
            self.pending_ready.append((t, end, ref))
        except Exception as exc:
            self._gpu_failed(exc)

    def _gpu_failed(self, exc: Exception) -> None:
        """GPU timing off for good, its pending events dropped; the other events go on."""
        self.gpu_off = True
        self.pending.clear()
        self.pending_ready.clear()
        self.prefill_ends.clear()
        self.prev_end = self.prefill_copy = None
        self.errors.append(f"gpu timing: {exc!r}")

    def _sampler(self, tid: int) -> None:
        import sys

        here = os.path.basename(__file__)
        last = time.time()
        while True:
            time.sleep(SAMPLE_S)
            now = time.time()
            dt, last = now - last, now
            phase = self.launching
            if phase is None:
                continue
            frame = sys._current_frames().get(tid)
            stack: list[str] = []
            while frame is not None and len(stack) < SAMPLE_DEPTH:
                name = os.path.basename(frame.f_code.co_filename)
                if name != here:  # not the probe's own wrappers
                    stack.append(f"{name}:{frame.f_lineno} {frame.f_code.co_name}")
                frame = frame.f_back
            if stack and self.launching == phase:
                self.add({"kind": "sample", "t": now, "dt": min(dt, 10 * SAMPLE_S),
                          "phase": phase, "stack": stack})

    def _wrap_syncs(self, tid: int) -> None:
        import sys

        import torch

        tl = self

        def wrap(owner: Any, name: str) -> None:
            orig = getattr(owner, name, None)
            if orig is None:
                return

            def done(t0: float, t1: float) -> None:
                if t1 - t0 >= SYNC_MIN_S:
                    f = sys._getframe(2)  # the caller of the wrapper (on_thread_timed's timed)
                    where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} {f.f_code.co_name}"
                    tl.add({"kind": "sync", "t": t0, "t1": t1, "what": name, "where": where})

            setattr(owner, name, on_thread_timed(orig, tid, done, time.time))

        for name in ("item", "tolist", "cpu"):
            wrap(torch.Tensor, name)
        if torch.cuda.is_available():
            wrap(torch.cuda.Event, "synchronize")
            wrap(torch.cuda.Stream, "synchronize")
            wrap(torch.cuda, "synchronize")

    def _ticker(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            self.flush()

    def flush(self) -> None:
        """Appends the events (and errors) added since the last flush to ``timeline-<pid>.jsonl``
        as one JSON line. Until 2026-11-26 every flush rewrote the whole list with ``json.dump``
        (pure Python, GIL held): at concurrency 45-48 the scheduler thread then stalled 100-160
        ms every 0.6 s, on both sides, in every ``--timeline`` record before (h200x2-tf-2026-11-26).
        One line of new events goes through the C encoder in about a millisecond. A line cut off
        by SGLang's SIGKILL is left out when read (``load_events``)."""
        with self.lock:
            n = len(self.events)
            if n == self.written:
                return
            errors = self.errors[self.errors_written:]
            line = json.dumps({"pid": os.getpid(), "errors": errors, "events": self.events[max(self.written, 0):n]})
            path = os.path.join(self.out_dir, f"timeline-{os.getpid()}.jsonl")
            try:
                os.makedirs(self.out_dir, exist_ok=True)
                with open(path, "a") as f:
                    f.write(line + "\n")
                self.written = n
                self.errors_written += len(errors)
            except OSError:
                pass


def install_from_env(register) -> None:
    """sitecustomize entry: ``register(function_name, hook(frame))``."""
    out_dir = os.environ.get("SMOKE_PROBE_DIR")
    if not out_dir:
        return
    timeline = Timeline(out_dir)
    register("run_batch", timeline.on_run_batch)
    # The API server's process: a Timeline of its own (one file per process).
    register("_handle_batch_output", Timeline(out_dir).on_api_output)
