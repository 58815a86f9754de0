"""Call-count probe for the GPU smoke test, loaded by ``site`` in every Python process.

Put this directory first on ``PYTHONPATH`` only for the smoke subprocesses: SGLang spawns
its scheduler with the ``spawn`` start method, a fresh interpreter that inherits the
environment and so imports this ``sitecustomize`` too.

Inactive unless ``SMOKE_PROBE_DIR`` is set. When active it

* counts calls of every function whose ``co_name`` is in ``SMOKE_PROBE_FUNCS``
  (comma-separated; default ``maybe_wait_verify_done``), whatever module or class it lives
  in, with Python 3.12 ``sys.monitoring`` (PY_START; every other code object is disabled
  after its first call, so the steady-state cost is nil) or, on 3.10/3.11,
  ``sys.setprofile``/``threading.setprofile``;
* writes ``probe-<pid>.json`` into ``SMOKE_PROBE_DIR``: at exit, and from a daemon timer
  every ``SMOKE_PROBE_FLUSH_S`` seconds when something changed (SGLang SIGKILLs its
  scheduler at shutdown, so ``atexit`` alone would lose the counts);
* with ``SMOKE_SYNC_PROBE=1``, loads ``smoke_sync_probe.py`` from this folder: a host-sync
  counter that hooks every function named ``run_batch`` through the same mechanism and wraps
  torch's sync entry points in the scheduler process only (see that module);
* with ``SMOKE_HOST_PROFILE=1``, loads ``host_profile.py`` from this folder: a cProfile of
  the scheduler loop per benchmark phase (see that module);
* with ``SMOKE_SCHED_TIMELINE=1``, loads ``sched_timeline.py`` from this folder: launch and
  result-processing times of every batch and the arrival of every request, in the scheduler
  process (the serving benchmark's ``--timeline``);
* with ``BENCH_SYNC_PROBE=1``, loads ``bench_sync_probe.py`` from this folder: the decode
  benchmark's own host-sync probe (``bench_spec_v2.py --sync-probe-impl own``);
* unless ``SMOKE_PROBE_PLUGIN_LOG=0``, gives the ``sglang_futuremap_patch`` logger its own
  stderr handler whose format carries the level and pid, so the plugin's startup line has
  a parseable level even in a scheduler process where SGLang has not configured logging
  yet.

Finally it runs any other ``sitecustomize`` found later on ``sys.path``.
"""

from __future__ import annotations

import os
import sys


def _install() -> None:
    import atexit
    import json
    import threading
    import time

    out_dir = os.environ["SMOKE_PROBE_DIR"]
    names = frozenset(
        n.strip() for n in os.environ.get("SMOKE_PROBE_FUNCS", "maybe_wait_verify_done").split(",") if n.strip()
    )
    try:
        interval = float(os.environ.get("SMOKE_PROBE_FLUSH_S", "0.5"))
    except ValueError:
        interval = 0.5

    counts: dict = {}  # code object -> calls
    hooks: dict = {}  # co_name -> [fn(frame)]: called with the frame of every call of such a function

    # Optional probes of this folder, each switched on by its variable; they hook calls by name.
    for env_name, module_name in (("SMOKE_SYNC_PROBE", "smoke_sync_probe"), ("SMOKE_HOST_PROFILE", "host_profile"),
                                  ("SMOKE_SCHED_TIMELINE", "sched_timeline"), ("BENCH_SYNC_PROBE", "bench_sync_probe")):
        if os.environ.get(env_name) != "1":
            continue
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(module_name, os.path.join(here, module_name + ".py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        module.install_from_env(lambda name, fn: hooks.setdefault(name, []).append(fn))

    def _run_hooks(name, frame) -> None:
        for fn in hooks.get(name, ()):
            try:
                fn(frame)
            except Exception:
                pass
    state: dict = {"written": None, "mechanism": "none", "lock": threading.Lock()}

    def _qualname(code) -> str:
        qn = getattr(code, "co_qualname", code.co_name)
        return f"{code.co_filename}:{code.co_firstlineno}:{qn}"

    def _proctitle() -> str | None:
        mod = sys.modules.get("setproctitle")
        if mod is None:
            return None
        try:
            return mod.getproctitle()
        except Exception:
            return None

    def flush(force: bool = False) -> None:
        with state["lock"]:
            snapshot = {_qualname(c): n for c, n in dict(counts).items()}
            by_name = {n: 0 for n in sorted(names)}
            for c, n in dict(counts).items():
                by_name[c.co_name] = by_name.get(c.co_name, 0) + n
            title = _proctitle()
            argv = list(sys.argv[:4]) if hasattr(sys, "argv") else []
            key = (tuple(sorted(snapshot.items())), title, tuple(argv))
            if not force and key == state["written"]:
                return
            pid = os.getpid()
            doc = {
                "pid": pid,
                "ppid": os.getppid(),
                "argv": argv,
                "proctitle": title,
                "mechanism": state["mechanism"],
                "names": sorted(names),
                "total": sum(by_name.values()),
                "by_name": by_name,
                "by_qualname": snapshot,
                "time": time.time(),
            }
            path = os.path.join(out_dir, f"probe-{pid}.json")
            tmp = path + ".tmp"
            try:
                os.makedirs(out_dir, exist_ok=True)
                with open(tmp, "w") as f:
                    json.dump(doc, f)
                os.replace(tmp, path)
                state["written"] = key
            except OSError:
                pass

    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tool_id = None
        # PROFILER_ID last: cProfile (3.12+) needs it for the host profile (host_profile.py).
        for candidate in (4, 3, monitoring.OPTIMIZER_ID, monitoring.PROFILER_ID):
            try:
                monitoring.use_tool_id(candidate, "sglang-smoke-probe")
            except ValueError:
                continue
            tool_id = candidate
            break
        if tool_id is not None:
            DISABLE = monitoring.DISABLE

            def on_start(code, offset):  # noqa: ARG001
                name = code.co_name
                hit = False
                if name in names:
                    counts[code] = counts.get(code, 0) + 1
                    hit = True
                if name in hooks:
                    frame = sys._getframe(1)  # the frame being started (checked, to be safe)
                    for _ in range(3):
                        if frame is None or frame.f_code is code:
                            break
                        frame = frame.f_back
                    if frame is not None and frame.f_code is code:
                        _run_hooks(name, frame)
                    hit = True
                return None if hit else DISABLE

            monitoring.register_callback(tool_id, monitoring.events.PY_START, on_start)
            monitoring.set_events(tool_id, monitoring.events.PY_START)
            state["mechanism"] = f"sys.monitoring:{tool_id}"

    if state["mechanism"] == "none":

        def profiler(frame, event, arg):  # noqa: ARG001
            if event == "call":
                code = frame.f_code
                if code.co_name in names:
                    counts[code] = counts.get(code, 0) + 1
                if code.co_name in hooks:
                    _run_hooks(code.co_name, frame)

        sys.setprofile(profiler)
        threading.setprofile(profiler)
        state["mechanism"] = "setprofile"

    atexit.register(flush, True)

    def _after_fork_in_child() -> None:
        # A forked child starts from zero (the parent reports its own calls) and has no
        # ticker thread; it still flushes at a normal exit.
        counts.clear()
        state["written"] = None
        state["lock"] = threading.Lock()  # the parent's ticker may have held it at fork time

    os.register_at_fork(after_in_child=_after_fork_in_child)

    def ticker() -> None:
        while True:
            time.sleep(interval)
            flush()

    # A daemon thread does not keep the process alive.
    threading.Thread(target=ticker, name="smoke-probe-flush", daemon=True).start()
    flush(True)

    if os.environ.get("SMOKE_PROBE_PLUGIN_LOG", "1") != "0":
        import logging

        plugin_logger = logging.getLogger("sglang_futuremap_patch")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("[%(asctime)s %(levelname)s pid=%(process)d] %(message)s", "%Y-%m-%d %H:%M:%S")
        )
        plugin_logger.addHandler(handler)
        plugin_logger.setLevel(logging.INFO)
        plugin_logger.propagate = False


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (the one this file shadows), if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("SMOKE_PROBE_DIR"):
    try:
        _install()
    except Exception as exc:  # never break the interpreter over a test probe
        print(f"smoke-probe: not installed: {exc!r}", file=sys.stderr)

try:
    _chain()
except Exception as exc:
    print(f"smoke-probe: chained sitecustomize failed: {exc!r}", file=sys.stderr)
