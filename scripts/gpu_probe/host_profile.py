"""Host-time profile of the scheduler loop, per benchmark phase (``bench_spec_v2.py --host-profile``).

Loaded by this folder's ``sitecustomize`` only when ``SMOKE_PROBE_DIR`` is set and
``SMOKE_HOST_PROFILE=1``. It changes nothing until the first call of a ``run_batch`` whose
``self`` is a ``Scheduler``; then, in that process only, it

* wraps ``Scheduler.get_next_batch_to_run`` (called once per scheduler loop iteration, idle
  or not) and ``Scheduler.run_batch`` (once per launched batch) on the class, so the profiler
  is switched in ordinary code on the scheduler thread, never inside a monitoring callback;
* starts a daemon thread that polls ``<SMOKE_PROBE_DIR>/host-phase.txt`` every 10 ms. The
  benchmark worker writes ``bs=<N>`` there right before a timed decode request set and
  ``idle`` right after it returns;
* runs one ``cProfile.Profile`` per phase: enabled at the first ``run_batch`` of the phase (so
  the idle loop before the requests arrive is not in it), disabled at the first loop
  iteration after the phase changed (so at most one poll interval of idle loop is in it).
  Trials of the same phase add up in the same profile;
* times the garbage collector per generation (``gc.callbacks``) while a profile is on;
* writes ``host-<pid>.json`` into ``SMOKE_PROBE_DIR`` after every profiled stretch (SGLang
  SIGKILLs its scheduler at shutdown, so ``atexit`` alone would lose it).

cProfile slows a Python-bound loop down (about 1.5-2x), so this pass is for *where* host
time goes, side by side for stock and patched, never for throughput. On Python 3.12
cProfile uses ``sys.monitoring`` tool 2 (PROFILER_ID); the call-count probe in
``sitecustomize`` leaves that id free.

The pure helpers (:func:`profile_rows`, :func:`per_iteration`, :func:`diff_rows`) also run on
the benchmark's side to compare a stock and a patched profile.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Iterable, Sequence

PHASE_FILE = "host-phase.txt"
IDLE = "idle"
#: Scheduler-loop functions whose cumulative time is reported for every phase.
LOOP_FUNCS = ("recv_requests", "process_input_requests", "get_next_batch_to_run", "run_batch",
              "process_batch_result", "launch_batch_sample_if_needed")
TOP = 60
POLL_S = 0.01


# ----------------------------------------------------------------------------- pure helpers


def short_path(filename: str) -> str:
    """``.../site-packages/sglang/srt/x.py`` -> ``sglang/srt/x.py``."""
    for marker in ("site-packages/", "site312/", "dist-packages/"):
        i = filename.rfind(marker)
        if i >= 0:
            return filename[i + len(marker):]
    for pkg in ("/sglang_futuremap_patch/", "/sglang/", "/torch/", "/scripts/"):
        i = filename.rfind(pkg)
        if i >= 0:
            return filename[i + 1:]
    return filename


def func_label(key: tuple[str, int, str]) -> str:
    """pstats key ``(file, line, name)`` -> ``file:line(name)``; built-ins keep their name."""
    filename, line, name = key
    if filename == "~":
        return name
    return f"{short_path(filename)}:{line}({name})"


#: Callers kept per function (by the time spent in it on their behalf): who blocks in ``.item()``.
TOP_CALLERS = 4


def profile_rows(stats: dict[tuple[str, int, str], tuple]) -> list[dict[str, Any]]:
    """Rows ``{func, calls, tottime_s, cumtime_s, callers}`` from ``pstats.Stats.stats``;
    ``callers``: the ``TOP_CALLERS`` callers with the most time spent in the function for
    them, each ``[label, calls, tottime_s]``."""
    rows = []
    for key, value in stats.items():
        _cc, nc, tt, ct = value[:4]
        callers = value[4] if len(value) > 4 and isinstance(value[4], dict) else {}
        top = sorted(((func_label(k), v[1], v[2]) for k, v in callers.items()), key=lambda c: -c[2])[:TOP_CALLERS]
        rows.append({"func": func_label(key), "name": key[2], "calls": nc, "tottime_s": tt, "cumtime_s": ct,
                     "callers": [list(c) for c in top]})
    return rows


def per_iteration(rows: Iterable[dict[str, Any]], iterations: int) -> dict[str, dict[str, float]]:
    """``func -> {calls, tottime_us, cumtime_us}`` per decode iteration."""
    if iterations <= 0:
        return {}
    return {
        r["func"]: {"calls": r["calls"] / iterations, "tottime_us": r["tottime_s"] * 1e6 / iterations,
                    "cumtime_us": r["cumtime_s"] * 1e6 / iterations,
                    "callers": [[c[0], c[1] / iterations, c[2] * 1e6 / iterations] for c in r.get("callers") or []]}
        for r in rows
    }


def diff_rows(stock: dict[str, dict[str, float]], patched: dict[str, dict[str, float]],
              key: str = "tottime_us", top: int = 15) -> list[dict[str, Any]]:
    """Functions by |patched - stock| of ``key`` per iteration, largest first."""
    out = []
    for func in set(stock) | set(patched):
        s = (stock.get(func) or {}).get(key, 0.0)
        p = (patched.get(func) or {}).get(key, 0.0)
        out.append({"func": func, "stock": s, "patched": p, "delta": p - s,
                    "calls_stock": (stock.get(func) or {}).get("calls", 0.0),
                    "calls_patched": (patched.get(func) or {}).get("calls", 0.0),
                    "callers_stock": (stock.get(func) or {}).get("callers") or [],
                    "callers_patched": (patched.get(func) or {}).get("callers") or []})
    out.sort(key=lambda r: abs(r["delta"]), reverse=True)
    return out[:top]


def proctitle() -> str | None:
    """The process title SGLang set (``sglang::scheduler...``), if ``setproctitle`` is loaded."""
    getter = getattr(sys.modules.get("setproctitle"), "getproctitle", None)
    try:
        return getter() if getter is not None else None
    except Exception:
        return None


def decode_iterations(iterations: dict[str, int], modes: Sequence[str] = ("DECODE", "TARGET_VERIFY")) -> int:
    return sum(int(iterations.get(m, 0)) for m in modes)


# ----------------------------------------------------------------------------- in the scheduler


class HostProfiler:
    def __init__(self, out_dir: str, poll_s: float = POLL_S, top: int = TOP) -> None:
        self.out_dir = out_dir
        self.poll_s = poll_s
        self.top = top
        self.want = IDLE  # the phase file's content (poll thread)
        self.active: str | None = None  # the phase being profiled now (scheduler thread)
        self.profiles: dict[str, Any] = {}
        self.phases: dict[str, dict[str, Any]] = {}
        self.rows: dict[str, list[dict[str, Any]]] = {}  # per phase, as of its last stop
        self.t_start = 0.0
        self.gc_t0: float | None = None
        self.prev_profile: Any = None
        self.installed = False
        self.errors: list[str] = []
        self.tid: int | None = None

    # -- install ---------------------------------------------------------------------------

    def on_run_batch(self, frame) -> None:
        """sitecustomize hook (a PY_START callback): install on the first Scheduler.run_batch."""
        if self.installed:
            return
        owner = frame.f_locals.get("self")
        if owner is None or not any(c.__name__ == "Scheduler" for c in type(owner).__mro__):
            return
        try:
            self.install(type(owner))
        except Exception as exc:  # never break the scheduler over a probe
            self.errors.append(f"install: {exc!r}")

    def install(self, sched_cls: type) -> None:
        self.installed = True
        self.tid = threading.get_ident()
        prof = self
        orig_next = sched_cls.get_next_batch_to_run
        orig_run = sched_cls.run_batch

        def get_next_batch_to_run(self, *a, **k):
            if prof.active is not None and prof.active != prof.want:
                prof.stop()
            return orig_next(self, *a, **k)

        def run_batch(self, batch, *a, **k):
            if prof.active is None and prof.want != IDLE:
                prof.start(prof.want)
            if prof.active is not None:
                fm = getattr(batch, "forward_mode", None)
                mode = getattr(fm, "name", None) or "NONE"
                it = prof.phases[prof.active]["iterations"]
                it[mode] = it.get(mode, 0) + 1
            return orig_run(self, batch, *a, **k)

        for new, orig in ((get_next_batch_to_run, orig_next), (run_batch, orig_run)):
            new.__wrapped__ = orig  # type: ignore[attr-defined]
            new.__qualname__ = f"host_profile.{orig.__name__}"
        sched_cls.get_next_batch_to_run = get_next_batch_to_run
        sched_cls.run_batch = run_batch
        import gc

        gc.callbacks.append(self._on_gc)
        threading.Thread(target=self._poll, name="host-profile-phase", daemon=True).start()
        self.flush()

    # -- phases ----------------------------------------------------------------------------

    def start(self, phase: str) -> None:
        import cProfile

        rec = self.phases.setdefault(phase, {"wall_s": 0.0, "stretches": 0, "iterations": {},
                                             "gc": {}, "loop_ticks": 0})
        rec["stretches"] += 1
        prof = self.profiles.get(phase)
        if prof is None:
            prof = self.profiles[phase] = cProfile.Profile()
        self.active = phase
        # Before 3.12 cProfile is this thread's sys.setprofile hook: keep the one it replaces
        # (sitecustomize's call counter there) and put it back in stop().
        self.prev_profile = sys.getprofile()
        self.t_start = time.perf_counter()
        try:
            prof.enable()
        except ValueError as exc:  # another profiler holds the hook
            self.errors.append(f"enable: {exc!r}")
            self.active = None
            rec["stretches"] -= 1

    def stop(self) -> None:
        phase, self.active = self.active, None
        if phase is None:
            return
        self.profiles[phase].disable()
        self.phases[phase]["wall_s"] += time.perf_counter() - self.t_start
        if self.prev_profile is not None and sys.getprofile() is None:
            sys.setprofile(self.prev_profile)
        import pstats

        try:
            self.rows[phase] = profile_rows(pstats.Stats(self.profiles[phase]).stats)  # type: ignore[attr-defined]
        except (TypeError, ValueError) as exc:  # nothing recorded
            self.errors.append(f"stats {phase}: {exc!r}")
        self.flush()

    def _on_gc(self, event: str, info: dict[str, Any]) -> None:
        if self.active is None:
            return
        if event == "start":
            self.gc_t0 = time.perf_counter()
        elif event == "stop" and self.gc_t0 is not None:
            dt = time.perf_counter() - self.gc_t0
            self.gc_t0 = None
            g = self.phases[self.active]["gc"].setdefault(str(info.get("generation")), [0, 0.0])
            g[0] += 1
            g[1] += dt

    def _poll(self) -> None:
        path = os.path.join(self.out_dir, PHASE_FILE)
        mtime = None
        while True:
            time.sleep(self.poll_s)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_mtime_ns == mtime:
                continue
            mtime = st.st_mtime_ns
            try:
                with open(path) as f:
                    self.want = f.read().strip() or IDLE
            except OSError:
                pass

    # -- output ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        phases = {}
        for phase, rec in self.phases.items():
            rows = self.rows.get(phase, [])
            loop = {}
            for r in rows:
                if r["name"] in LOOP_FUNCS and r["func"].startswith("sglang"):
                    loop.setdefault(r["name"], 0.0)
                    loop[r["name"]] = max(loop[r["name"]], r["cumtime_s"])
            by_tt = sorted(rows, key=lambda r: r["tottime_s"], reverse=True)[: self.top]
            by_ct = sorted(rows, key=lambda r: r["cumtime_s"], reverse=True)[: self.top]
            seen: dict[str, dict[str, Any]] = {r["func"]: r for r in by_tt + by_ct}
            phases[phase] = dict(rec, loop_cumtime_s=loop, functions=list(seen.values()),
                                 functions_total=len(rows))
        return {"kind": "host-profile", "pid": os.getpid(), "proctitle": proctitle(), "python": sys.version.split()[0],
                "installed": self.installed, "phases": phases, "errors": list(self.errors), "time": time.time()}

    def flush(self) -> None:
        import json

        doc = self.snapshot()
        path = os.path.join(self.out_dir, f"host-{os.getpid()}.json")
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(doc, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


def set_phase(out_dir: str, phase: str, name: str = PHASE_FILE) -> None:
    """Benchmark side: announce the phase to the scheduler's poll thread (``name``: the file a
    probe polls, this one's by default)."""
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as f:
        f.write(phase)
    os.replace(path + ".tmp", path)


def read_profiles(out_dir: str) -> list[dict[str, Any]]:
    import json

    out = []
    try:
        names = sorted(os.listdir(out_dir))
    except OSError:
        return out
    for name in names:
        if name.startswith("host-") and name.endswith(".json"):
            try:
                with open(os.path.join(out_dir, name)) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            if doc.get("kind") == "host-profile" and doc.get("installed"):
                out.append(doc)
    return out


def install_from_env(register_hook) -> HostProfiler:
    """Called by sitecustomize: ``register_hook(co_name, fn(frame))``."""
    prof = HostProfiler(os.environ["SMOKE_PROBE_DIR"])
    register_hook("run_batch", prof.on_run_batch)
    return prof
