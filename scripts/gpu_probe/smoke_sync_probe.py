"""Host-sync probe for the GPU smoke test (``gpu_smoke.py --sync-probe``).

Loaded by this folder's ``sitecustomize`` only when ``SMOKE_PROBE_DIR`` is set and
``SMOKE_SYNC_PROBE=1``; otherwise never imported. Even then it changes nothing until the
first call of a ``run_batch`` whose ``self`` is a ``Scheduler`` (the plugin replaces
``Scheduler.run_batch`` in ``load_plugins()``; the hook matches every code object named
``run_batch``, so it sees the plugin's replacement and the stock one alike). At that first
call, in that process only, it

* records the calling thread as the scheduler thread;
* wraps the host-sync entry points, counting only calls from that thread:
  ``torch.Tensor.item/.tolist/.cpu/.numpy/__int__/__float__/__bool__`` and
  ``.to(<cpu>)`` on CUDA tensors (``.to(cpu, non_blocking=True)`` is counted apart as an
  async D2H, not a sync), ``torch.cuda.Event.synchronize``, ``torch.cuda.Stream.synchronize``
  and ``torch.cuda.synchronize``; each wrapped call is timed with ``time.perf_counter``
  (host time blocked) and attributed to a call site (:func:`attribute`);
* starts a daemon thread writing ``sync-<pid>.json`` into ``SMOKE_PROBE_DIR`` every
  ``SMOKE_PROBE_FLUSH_S`` seconds when something changed (SGLang SIGKILLs its schedulers).

Every later ``run_batch`` call (the outermost one: the plugin's wrapper may call the stock
method) opens an iteration labelled with ``batch.forward_mode`` (``DECODE``, ``EXTEND``,
...); each sync is charged to the iteration opened last. Syncs before the first
``run_batch`` (start-up, CUDA-graph capture, compilation) are not counted.

The wrappers cost a Python call per tensor method call in the scheduler process, so a run
with the probe is for counting, never for timing.

Environment: ``SMOKE_SYNC_SEQ_LENS_SITES`` (comma-separated function names whose syncs count
as seq_lens syncs, default :data:`SEQ_LENS_SITES`); ``SMOKE_SYNC_PROBE_ALL_DEVICES=1``
counts CPU tensors as well (self-test only).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any, Iterable

#: Syncs inside these functions (anywhere up the stack) count as seq_lens syncs.
SEQ_LENS_SITES = ("resolve_seq_lens_cpu", "filter_batch", "merge_batch", "prepare_for_decode",
                  "maybe_wait_verify_done",
                  # without the mirror: FA3's eager stand-in and the draft extend's late copy
                  "host_seq_lens_stand_in", "prepare_for_extend_to_fill_draft_kvcache")
#: Tensor methods wrapped (``to`` separately: only a D2H ``to`` is a sync).
TENSOR_OPS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__")
_OURS = re.compile(r"[/\\](sglang|sglang_futuremap_patch)[/\\]")
_MAX_DEPTH = 80


# ----------------------------------------------------------------------------- pure helpers


def is_ours(filename: str) -> bool:
    """A frame of SGLang or of the plugin (by file path)."""
    return bool(_OURS.search(filename or ""))


def attribute(codes: Iterable[Any], seq_lens_sites: Iterable[str] = SEQ_LENS_SITES) -> tuple[str, str | None]:
    """Call site of a sync from the code objects of its stack, innermost first.

    Returns ``(site, anchor)``: ``site`` is the qualified name of the innermost SGLang/plugin
    function (``<other>:<name>`` when there is none), ``anchor`` the innermost enclosing
    function whose name is in ``seq_lens_sites`` (None when none encloses the call)."""
    sites = frozenset(seq_lens_sites)
    site = None
    anchor = None
    first = None
    for code in codes:
        name = code.co_name
        if first is None:
            first = name
        if site is None and is_ours(code.co_filename):
            site = getattr(code, "co_qualname", None) or name
        if anchor is None and name in sites:
            anchor = name
        if site is not None and anchor is not None:
            break
    return (site if site is not None else f"<other>:{first}"), anchor


def site_key(site: str, anchor: str | None) -> str:
    """``anchor > site`` when the seq_lens function encloses a different innermost site."""
    if anchor is None or re.split(r"[.:]", site)[-1] == anchor:
        return site
    return f"{anchor} > {site}"


def stack_codes(frame, limit: int = _MAX_DEPTH):
    while frame is not None and limit > 0:
        yield frame.f_code
        frame = frame.f_back
        limit -= 1


# ----------------------------------------------------------------------------- probe state


class Probe:
    def __init__(self, out_dir: str, interval: float = 0.5, seq_lens_sites: Iterable[str] = SEQ_LENS_SITES,
                 all_devices: bool = False) -> None:
        self.out_dir = out_dir
        self.interval = interval
        self.seq_lens_sites = tuple(seq_lens_sites)
        self.all_devices = all_devices
        self.lock = threading.Lock()
        self.tid: int | None = None
        self.busy = False
        self.mode = "STARTUP"
        self.iterations: dict[str, int] = {}
        self.batch_sizes: dict[str, int] = {}
        self.syncs: dict[tuple, list] = {}  # (mode, key, op, seq_lens) -> [count, blocked_s, tensor_hits]
        self.async_d2h: dict[str, int] = {}
        self.wrapped: list[str] = []
        self.errors: list[str] = []
        self.batch_ref = None
        self.installed = False
        self.version = 0
        self.written = -1
        self.originals: list[tuple[Any, str, Any]] = []
        # Piecewise CUDA graph (SGLang's default) runs torch.compile: code Dynamo traces must
        # reach the original tensor methods, never a wrapper's host-side bookkeeping.
        self.compiling = lambda: False

    # -- hooks (called by sitecustomize's dispatcher with the started frame) ---------------

    def on_run_batch(self, frame) -> None:
        try:
            self._on_run_batch(frame)
        except Exception as exc:  # never break the scheduler over a probe
            self._error(f"run_batch hook: {exc!r}")

    def _on_run_batch(self, frame) -> None:
        f = frame.f_back
        for _ in range(3):  # the plugin's run_batch calling the stock one: one iteration
            if f is None:
                break
            if f.f_code.co_name == "run_batch":
                return
            f = f.f_back
        loc = frame.f_locals
        owner = loc.get("self")
        if owner is None or not any(c.__name__ == "Scheduler" for c in type(owner).__mro__):
            return
        if self.tid is None:
            self.install(threading.get_ident())
        if threading.get_ident() != self.tid:
            return
        batch = loc.get("batch")
        fm = getattr(batch, "forward_mode", None)
        mode = getattr(fm, "name", None) or (str(fm) if fm is not None else "NONE")
        try:
            bs = len(batch.reqs)
        except Exception:
            bs = 0
        with self.lock:
            self.mode = mode
            self.iterations[mode] = self.iterations.get(mode, 0) + 1
            self.batch_sizes[mode] = self.batch_sizes.get(mode, 0) + bs
            self.version += 1
        try:
            import weakref

            self.batch_ref = weakref.ref(batch)
        except TypeError:
            self.batch_ref = None

    # -- recording ---------------------------------------------------------------------

    def _error(self, msg: str) -> None:
        with self.lock:
            if len(self.errors) < 20:
                self.errors.append(msg)
            self.version += 1

    def _seq_lens_tensor(self, t) -> bool:
        ref = self.batch_ref
        b = ref() if ref is not None else None
        sl = getattr(b, "seq_lens", None)
        if sl is None or t is None:
            return False
        try:
            return t.untyped_storage().data_ptr() == sl.untyped_storage().data_ptr()
        except Exception:
            return False

    def record(self, op: str, dt: float, tensor=None) -> None:
        site, anchor = attribute(stack_codes(sys._getframe(2)), self.seq_lens_sites)
        hit = self._seq_lens_tensor(tensor) if tensor is not None else False
        key = (self.mode, site_key(site, anchor), op, anchor is not None)
        with self.lock:
            slot = self.syncs.get(key)
            if slot is None:
                slot = self.syncs[key] = [0, 0.0, 0]
            slot[0] += 1
            slot[1] += dt
            slot[2] += int(hit)
            self.version += 1

    def record_async(self, op: str) -> None:
        site, _ = attribute(stack_codes(sys._getframe(2)), ())
        with self.lock:
            k = f"{self.mode}|{site}|{op}"
            self.async_d2h[k] = self.async_d2h.get(k, 0) + 1
            self.version += 1

    # -- wrappers ----------------------------------------------------------------------

    def _wrap(self, owner, name: str, label: str, kind: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            return
        probe = self
        get_ident = threading.get_ident
        perf = time.perf_counter
        all_devices = self.all_devices
        compiling = self.compiling

        if kind == "tensor":
            def wrapper(*args, **kwargs):
                if compiling() or get_ident() != probe.tid or probe.busy:
                    return orig(*args, **kwargs)
                t = args[0]
                if not (all_devices or t.is_cuda):
                    return orig(*args, **kwargs)
                probe.busy = True
                try:
                    t0 = perf()
                    out = orig(*args, **kwargs)
                    probe.record(label, perf() - t0, t)
                    return out
                finally:
                    probe.busy = False
        elif kind == "to":
            def wrapper(*args, **kwargs):
                if compiling() or get_ident() != probe.tid or probe.busy:
                    return orig(*args, **kwargs)
                verdict = to_verdict(args, kwargs, all_devices)
                if verdict is None:
                    return orig(*args, **kwargs)
                probe.busy = True
                try:
                    if verdict == "async":
                        probe.record_async(label)
                        return orig(*args, **kwargs)
                    t0 = perf()
                    out = orig(*args, **kwargs)
                    probe.record(label, perf() - t0, args[0])
                    return out
                finally:
                    probe.busy = False
        else:  # "sync": Event/Stream/device synchronize
            def wrapper(*args, **kwargs):
                if compiling() or get_ident() != probe.tid or probe.busy:
                    return orig(*args, **kwargs)
                probe.busy = True
                try:
                    t0 = perf()
                    out = orig(*args, **kwargs)
                    probe.record(label, perf() - t0)
                    return out
                finally:
                    probe.busy = False

        wrapper.__name__ = getattr(orig, "__name__", name)
        wrapper.__qualname__ = getattr(orig, "__qualname__", name)
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        wrapper.__wrapped__ = orig
        try:
            setattr(owner, name, wrapper)
        except (AttributeError, TypeError) as exc:
            self.errors.append(f"cannot wrap {label}: {exc!r}")
            return
        self.originals.append((owner, name, orig))
        self.wrapped.append(label)

    def install(self, tid: int) -> None:
        self.tid = tid
        self.installed = True
        try:
            import torch
        except Exception as exc:
            self.errors.append(f"torch not importable: {exc!r}")
            torch = None
        if torch is not None:
            self.compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or self.compiling
            for op in TENSOR_OPS:
                self._wrap(torch.Tensor, op, f"Tensor.{op}", "tensor")
            self._wrap(torch.Tensor, "to", "Tensor.to(cpu)", "to")
            cuda = getattr(torch, "cuda", None)
            if cuda is not None:
                for cls_name in ("Event", "Stream"):
                    cls = getattr(cuda, cls_name, None)
                    if cls is not None:
                        self._wrap(cls, "synchronize", f"cuda.{cls_name}.synchronize", "sync")
                self._wrap(cuda, "synchronize", "cuda.synchronize", "sync")
        self.version += 1
        threading.Thread(target=self._ticker, name="smoke-sync-probe-flush", daemon=True).start()
        import atexit

        atexit.register(self.flush, True)

    def uninstall(self) -> None:
        """Restore the wrapped attributes (self-test)."""
        for owner, name, orig in reversed(self.originals):
            setattr(owner, name, orig)
        self.originals.clear()
        self.tid = None

    # -- output ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            syncs = [
                {"mode": m, "site": k, "op": op, "seq_lens": sl, "count": v[0], "blocked_s": v[1],
                 "seq_lens_tensor": v[2]}
                for (m, k, op, sl), v in sorted(self.syncs.items())
            ]
            title = None
            mod = sys.modules.get("setproctitle")
            if mod is not None:
                try:
                    title = mod.getproctitle()
                except Exception:
                    title = None
            return {
                "kind": "sync-probe",
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "proctitle": title,
                "installed": self.installed,
                "wrapped": list(self.wrapped),
                "seq_lens_sites": list(self.seq_lens_sites),
                "all_devices": self.all_devices,
                "iterations": dict(self.iterations),
                "batch_size_sum": dict(self.batch_sizes),
                "syncs": syncs,
                "async_d2h": dict(self.async_d2h),
                "errors": list(self.errors),
                "time": time.time(),
            }

    def flush(self, force: bool = False) -> None:
        if not self.installed:
            return
        version = self.version
        if not force and version == self.written:
            return
        import json

        doc = self.snapshot()
        path = os.path.join(self.out_dir, f"sync-{os.getpid()}.json")
        tmp = path + ".tmp"
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, path)
            self.written = version
        except OSError:
            pass

    def _ticker(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.flush()
            except Exception:
                pass


def to_verdict(args, kwargs, all_devices: bool = False) -> str | None:
    """For ``Tensor.to(*args, **kwargs)``: ``"sync"`` (a blocking D2H), ``"async"``
    (``non_blocking=True`` D2H) or None (anything else)."""
    if not args:
        return None
    t = args[0]
    try:
        if not (all_devices or t.is_cuda):
            return None
    except Exception:
        return None
    dev = kwargs.get("device")
    rest = args[1:]
    if dev is None and rest:
        a = rest[0]
        if isinstance(a, str):
            dev = a
        elif type(a).__name__ == "device":
            dev = a
        elif hasattr(a, "device") and hasattr(a, "is_cuda"):
            dev = a.device  # to(other_tensor)
    if dev is None:
        return None
    dev_type = dev.split(":", 1)[0] if isinstance(dev, str) else getattr(dev, "type", None)
    if dev_type != "cpu":
        return None
    nb = kwargs.get("non_blocking")
    if nb is None:
        nb = next((a for a in rest[1:] if isinstance(a, bool)), False)
    return "async" if nb else "sync"


def install_from_env(register_hook) -> Probe:
    """Called by sitecustomize: ``register_hook(co_name, fn(frame))``."""
    sites_env = os.environ.get("SMOKE_SYNC_SEQ_LENS_SITES", "")
    sites = tuple(s.strip() for s in sites_env.split(",") if s.strip()) or SEQ_LENS_SITES
    try:
        interval = float(os.environ.get("SMOKE_PROBE_FLUSH_S", "0.5"))
    except ValueError:
        interval = 0.5
    probe = Probe(os.environ["SMOKE_PROBE_DIR"], interval, sites,
                  all_devices=os.environ.get("SMOKE_SYNC_PROBE_ALL_DEVICES") == "1")
    register_hook("run_batch", probe.on_run_batch)

    def _after_fork_in_child() -> None:
        # A forked child of an installed scheduler counts nothing (its wrappers stay, inert).
        probe.lock = threading.Lock()
        if probe.installed:
            probe.tid = -1
            probe.installed = False

    os.register_at_fork(after_in_child=_after_fork_in_child)
    return probe
