"""The benchmark's own host-sync probe (``bench_spec_v2.py --sync-probe-impl own``): a smaller
alternative to ``smoke_sync_probe.py``, counted per benchmark phase by the probe itself.

Loaded by this folder's ``sitecustomize`` only when ``SMOKE_PROBE_DIR`` is set and
``BENCH_SYNC_PROBE=1``; it writes into ``BENCH_SYNC_PROBE_DIR``. Only the scheduler process (the
one that calls ``sglang.srt.managers.scheduler.load_plugins``) wraps anything: right after that
module executes, ``load_plugins`` is wrapped; once it has run (the plugin's ``run_batch`` is in
place then), ``Scheduler.run_batch`` is wrapped to open an iteration labelled with the batch's
forward mode, and at its first call torch's host-sync entry points are wrapped (after model
load, CUDA-graph capture and torch.compile). Each sync's blocked host time is charged to the
current phase (:data:`PHASE_FILE` in that folder, written by the benchmark worker with
``host_profile.set_phase``) and iteration mode, by call site. ``sync-<pid>.json`` is rewritten
every 0.5 s when something changed and at exit.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

DIR_ENV = "BENCH_SYNC_PROBE_DIR"
PHASE_FILE = "phase.txt"


class _SyncStats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phase = "init"
        self.mode = "INIT"
        self.iterations: dict[str, dict[str, int]] = {}
        self.blocked: dict[str, dict[str, dict[str, list[float]]]] = {}
        self.version = 0

    def begin_iteration(self, mode: str) -> None:
        with self.lock:
            self.mode = mode
            d = self.iterations.setdefault(self.phase, {})
            d[mode] = d.get(mode, 0) + 1
            self.version += 1

    def record(self, site: str, seconds: float) -> None:
        with self.lock:
            d = self.blocked.setdefault(self.phase, {}).setdefault(self.mode, {})
            e = d.get(site)
            if e is None:
                d[site] = [1, seconds]
            else:
                e[0] += 1
                e[1] += seconds
            self.version += 1

    def set_phase(self, phase: str) -> None:
        with self.lock:
            if phase != self.phase:
                self.phase = phase
                self.mode = "IDLE"
                self.version += 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "iterations": {p: dict(m) for p, m in self.iterations.items()},
                "blocked": {p: {m: {s: list(v) for s, v in d.items()} for m, d in pm.items()}
                            for p, pm in self.blocked.items()},
            }


_SYNC: dict[str, Any] = {"stats": None, "installed": False, "torch_wrapped": False}


def _call_site(depth: int = 2) -> str:
    f = sys._getframe(depth)  # noqa: SLF001
    while f is not None and ("/torch/" in f.f_code.co_filename or f.f_code.co_filename == __file__):
        f = f.f_back
    if f is None:
        return "?"
    import host_profile  # this folder, on the path of every process the probe runs in

    t = threading.current_thread().name
    where = f"{host_profile.short_path(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"
    return where if t == "MainThread" else f"{where} [thread {t}]"


def _install_torch_wrappers(stats: _SyncStats) -> list[str]:
    import torch

    tls = threading.local()
    perf = time.perf_counter
    wrapped = []
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    def timed(kind: str, orig, should):
        def wrapper(*a, **k):
            if compiling() or getattr(tls, "busy", False):
                return orig(*a, **k)
            try:
                go = should(a, k)
            except Exception:
                go = False
            if not go:
                return orig(*a, **k)
            tls.busy = True
            t0 = perf()
            try:
                return orig(*a, **k)
            finally:
                dt = perf() - t0
                tls.busy = False
                stats.record(f"{kind} @ {_call_site()}", dt)

        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(orig, "__name__", kind)
        return wrapper

    always = lambda a, k: True  # noqa: E731
    on_cuda = lambda a, k: bool(a) and getattr(a[0], "is_cuda", False)  # noqa: E731

    def to_host(a, k):  # cpu_tensor.copy_(cuda_tensor)
        return len(a) >= 2 and not a[0].is_cuda and getattr(a[1], "is_cuda", False)

    for owner, name, kind, cond in (
        (torch.cuda.Event, "synchronize", "Event.synchronize", always),
        (torch.cuda.Stream, "synchronize", "Stream.synchronize", always),
        (torch.Tensor, "item", "Tensor.item", on_cuda),
        (torch.Tensor, "tolist", "Tensor.tolist", on_cuda),
        (torch.Tensor, "cpu", "Tensor.cpu", on_cuda),
        (torch.Tensor, "__bool__", "Tensor.__bool__", on_cuda),
        (torch.Tensor, "__int__", "Tensor.__int__", on_cuda),
        (torch.Tensor, "__float__", "Tensor.__float__", on_cuda),
        (torch.Tensor, "copy_", "Tensor.copy_(D2H)", to_host),
    ):
        try:
            setattr(owner, name, timed(kind, getattr(owner, name), cond))
            wrapped.append(f"{owner.__name__}.{name}")
        except (AttributeError, TypeError):
            pass

    # Tensor.to: only a CUDA tensor that comes back on the host counts.
    orig_to = torch.Tensor.to

    def to(self, *a, **k):
        if compiling() or getattr(tls, "busy", False) or not getattr(self, "is_cuda", False):
            return orig_to(self, *a, **k)
        tls.busy = True
        t0 = perf()
        try:
            out = orig_to(self, *a, **k)
        finally:
            tls.busy = False
        dt = perf() - t0
        if isinstance(out, torch.Tensor) and not out.is_cuda:
            stats.record(f"Tensor.to(cpu) @ {_call_site()}", dt)
        return out

    torch.Tensor.to = to
    wrapped.append("Tensor.to")

    orig_sync = torch.cuda.synchronize

    def cuda_synchronize(*a, **k):
        if compiling():
            return orig_sync(*a, **k)
        t0 = perf()
        try:
            return orig_sync(*a, **k)
        finally:
            stats.record(f"torch.cuda.synchronize @ {_call_site()}", perf() - t0)

    torch.cuda.synchronize = cuda_synchronize
    wrapped.append("torch.cuda.synchronize")
    return wrapped


def _mode_of(batch: Any) -> str:
    fm = getattr(batch, "forward_mode", None)
    name = getattr(fm, "name", None)
    return str(name) if name else "OTHER"


def _on_scheduler_module(module: Any, out_dir: str) -> None:
    orig_load = module.load_plugins

    def load_plugins(*a, **k):
        r = orig_load(*a, **k)
        if _SYNC["installed"]:
            return r
        _SYNC["installed"] = True
        stats: _SyncStats = _SYNC["stats"]
        sched = module.Scheduler
        orig_run_batch = sched.run_batch  # the plugin's wrapper when it is on: wrap after it
        wrapped: list[str] = ["Scheduler.run_batch"]

        def run_batch(self, batch, *ra, **rk):
            if not _SYNC["torch_wrapped"]:
                # Installed at the first batch, i.e. after model load, CUDA graph capture and
                # torch.compile (piecewise CUDA graph): nothing of that runs through the wrappers.
                _SYNC["torch_wrapped"] = True
                wrapped.extend(_install_torch_wrappers(stats))
            stats.begin_iteration(_mode_of(batch))
            return orig_run_batch(self, batch, *ra, **rk)

        run_batch.__wrapped__ = orig_run_batch  # type: ignore[attr-defined]
        sched.run_batch = run_batch
        _start_sync_flusher(stats, out_dir, wrapped)
        return r

    module.load_plugins = load_plugins


def _start_sync_flusher(stats: _SyncStats, out_dir: str, wrapped: list[str]) -> None:
    import atexit

    import host_profile  # this folder, on the path of every process the probe runs in

    phase_path = os.path.join(out_dir, PHASE_FILE)
    state = {"written": -1, "phase_mtime": None}

    def poll_phase() -> None:
        try:
            st = os.stat(phase_path)
        except OSError:
            return
        if st.st_mtime_ns != state["phase_mtime"]:
            state["phase_mtime"] = st.st_mtime_ns
            try:
                with open(phase_path) as f:
                    stats.set_phase(f.read().strip() or "none")
            except OSError:
                pass

    def flush(force: bool = False) -> None:
        if not force and stats.version == state["written"]:
            return
        version = stats.version
        snap = stats.snapshot()
        title = host_profile.proctitle()
        doc = {"pid": os.getpid(), "proctitle": title, "wrapped": wrapped, "time": time.time(), **snap}
        path = os.path.join(out_dir, f"sync-{os.getpid()}.json")
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(doc, f)
            os.replace(path + ".tmp", path)
            state["written"] = version
        except OSError:
            pass

    def loop() -> None:
        n = 0
        while True:
            time.sleep(0.05)
            poll_phase()
            n += 1
            if n % 10 == 0:
                flush()

    atexit.register(flush, True)
    threading.Thread(target=loop, name="bench-sync-probe", daemon=True).start()
    flush(True)


class _PostImportHook:
    """A meta-path finder that runs ``callback(module)`` right after ``name`` executes."""

    def __init__(self, name: str, callback) -> None:
        self.name = name
        self.callback = callback
        self.done = False

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002
        if fullname != self.name or self.done:
            return None
        self.done = True
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        orig_exec = spec.loader.exec_module
        callback = self.callback

        def exec_module(module):
            orig_exec(module)
            try:
                callback(module)
            except Exception as exc:  # never break SGLang over a probe
                print(f"bench-sync-probe: hook failed: {exc!r}", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


def sync_probe_bootstrap(out_dir: str) -> None:
    """Runs in every process of a probed Engine run (:func:`install_from_env`)."""
    if _SYNC["stats"] is not None:
        return
    _SYNC["stats"] = _SyncStats()
    os.makedirs(out_dir, exist_ok=True)
    sys.meta_path.insert(0, _PostImportHook("sglang.srt.managers.scheduler",
                                            lambda m: _on_scheduler_module(m, out_dir)))


def install_from_env(register_hook) -> None:  # noqa: ARG001  (hooks no call by name)
    """Called by sitecustomize."""
    sync_probe_bootstrap(os.environ[DIR_ENV])
