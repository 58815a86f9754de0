"""Scheduler timeline for the serving benchmark (``gpu_serve_bench.py --timeline``): where a
request's time to first token goes inside the scheduler.

Loaded by this folder's ``sitecustomize`` only when ``SMOKE_PROBE_DIR`` is set and
``SMOKE_SCHED_TIMELINE=1``. It changes nothing until the first call of a ``run_batch`` whose
``self`` is a ``Scheduler``; then, in that process only, it wraps on the class

* ``process_input_requests``: one ``recv`` event per request it receives (its ``rid``);
* ``run_batch``: one ``run`` event per launched batch (start, end, forward mode, whether
  SGLang's ``forward_mode.is_extend()`` calls it a prefill, batch size, and for a prefill the
  ``rid`` of every request in it);
* ``process_batch_result``: one ``proc`` event per processed result (start, end, forward
  mode, batch size). A prefill's first tokens leave for the detokenizer at the end of it;

and, on the scheduler thread only, torch's host-blocking entry points (``Tensor.item``,
``.tolist``, ``.cpu``, ``Event.synchronize``, ``Stream.synchronize``, ``torch.cuda.synchronize``):
one ``sync`` event per call that blocked longer than ``SYNC_MIN_S``, with the calling
function (file:line name), so a long launch shows where it waited.

Times are ``time.time()`` so the benchmark can cut the events into its cells by wall clock. The
events go to ``timeline-<pid>.json`` in ``SMOKE_PROBE_DIR`` from a daemon thread every half
second (SGLang SIGKILLs its scheduler at shutdown). The wrappers cost a few microseconds per
call; the benchmark runs them on both sides alike.

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
loop the next batch is launched before the previous result is processed), and the processing.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import threading
import time
from typing import Any, Iterable, Sequence

FLUSH_S = 0.5
MAX_EVENTS = 400_000
SYNC_MIN_S = 3e-4
#: Stack samples of the scheduler thread, taken only while it launches a prefill or the
#: batch right after one (``sample`` events): where a long launch spends its host time
#: when no wrapped sync shows it (a blocking copy, a full launch queue, Python work).
SAMPLE_S = 1e-3
SAMPLE_DEPTH = 3
#: The parts of TTFT outside the scheduler, from the API server's ``api`` events.
API_PARTS = ("api_before_dispatch", "dispatch_to_sched", "sched_to_api", "api_total")
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
    without them."""
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
            for e in syncs:
                if run["t"] <= e["t"] < run["t1"]:
                    key = f'{e["what"]} @ {e["where"]}'
                    into[key] = into.get(key, 0.0) + (e["t1"] - e["t"])
    n_prefills = len(prefills) or 1
    # Stack samples by phase: where the host was during those launches (ms per prefill).
    sampled: dict[str, dict[str, float]] = {"launch_samples_ms": {}, "next_launch_samples_ms": {}}
    for e in events:
        if e["kind"] == "sample" and t_lo <= e["t"] < t_hi:
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
    for name, found in (("next_launch_waits_ms", waits), ("launch_waits_ms", own_waits), *sampled.items()):
        out[name] = {k: round(v * 1e3 / n_prefills, 3)
                     for k, v in sorted(found.items(), key=lambda kv: -kv[1])[:6]}
    return out


def load_events(paths: Iterable[str]) -> list[dict[str, Any]]:
    """The events of every timeline file (one per scheduler process), in time order."""
    events: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            events.extend(json.load(f).get("events", []))
    events.sort(key=lambda e: e["t"])
    return events


# ----------------------------------------------------------------------------- in the scheduler


class Timeline:
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.events: list[dict[str, Any]] = []
        self.installed = False
        self.errors: list[str] = []
        self.written = -1
        self.lock = threading.Lock()
        # What the scheduler thread is launching now: None, "prefill" or "next" (the batch
        # right after a prefill); read by the sampler thread.
        self.launching: str | None = None
        self.last_extend = False
        self.lag_started = False

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
        threading.Thread(target=self._ticker, name="api-timeline", daemon=True).start()

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
            t0 = time.time()
            fm = getattr(batch, "forward_mode", None)
            extend = bool(fm is not None and fm.is_extend())
            tl.launching = "prefill" if extend else ("next" if tl.last_extend else None)
            try:
                return orig_run(self, batch, *a, **k)
            finally:
                tl.launching, tl.last_extend = None, extend
                ev = _interval("run", batch, t0)
                if ev["extend"]:
                    ev["rids"] = [r.rid for r in batch.reqs]
                tl.add(ev)

        def process_batch_result(self, batch, *a, **k):
            t0 = time.time()
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
        threading.Thread(target=self._ticker, name="sched-timeline", daemon=True).start()
        threading.Thread(target=self._sampler, args=(threading.get_ident(),),
                         name="sched-timeline-sampler", daemon=True).start()

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

            def timed(*a, **k):
                if threading.get_ident() != tid:
                    return orig(*a, **k)
                t0 = time.time()
                try:
                    return orig(*a, **k)
                finally:
                    t1 = time.time()
                    if t1 - t0 >= SYNC_MIN_S:
                        f = sys._getframe(1)
                        where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} {f.f_code.co_name}"
                        tl.add({"kind": "sync", "t": t0, "t1": t1, "what": name, "where": where})

            timed.__wrapped__ = orig  # type: ignore[attr-defined]
            setattr(owner, name, timed)

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
        with self.lock:
            n = len(self.events)
            if n == self.written:
                return
            doc = {"pid": os.getpid(), "errors": self.errors, "events": self.events[:n]}
            path = os.path.join(self.out_dir, f"timeline-{os.getpid()}.json")
            try:
                os.makedirs(self.out_dir, exist_ok=True)
                with open(path + ".tmp", "w") as f:
                    json.dump(doc, f)
                os.replace(path + ".tmp", path)
                self.written = n
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
