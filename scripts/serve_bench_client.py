#!/usr/bin/env python3
"""Run SGLang's own ``bench_serving`` several times in one process.

``python -m sglang.bench_serving`` spends 10-20 s per call importing SGLang before it sends a
request; a serving record with eight concurrencies per server paid that eight times per boot.
This client imports it once and then runs the module's command line (``runpy``, as ``python -m``
does: the same argument parser, the same ``run_benchmark``) once per line it reads.

Protocol: each line on stdin is a JSON list, the arguments of one ``bench_serving`` call; for
each the client writes one JSON line on stdout, ``{"rc": 0}`` or ``{"rc": N, "error": "..."}``.
Everything ``bench_serving`` prints goes to stderr. EOF ends the client.

With ``SERVE_BENCH_CLIENT_LAG=1`` the reply also carries ``client_lag``: how late a 2 ms sleep
woke on the client's own event loop during the call (``bench_serving`` runs each call in one
``asyncio.run``; a task beside it samples), as ``{"samples", "mean_ms", "max_ms", "late_10ms",
"slept_ms"}``. ``bench_serving`` itself blocks its loop once per call on purpose (``time.sleep(1.0)``
between the warm-up and the measured requests); time spent in ``time.sleep`` on the loop's thread
is left out of the lag and reported as ``slept_ms``, so ``max_ms`` is contention, not that pause.
A client whose loop is busy (streaming every running request's chunks) stamps first tokens
late, and the serving record then charges that to the server.

The reply then also carries ``requests``: per request ``[start, ttft]``, the wall-clock time
(``time.time()``) the client called ``bench_serving``'s request function and that request's TTFT
in s (None when it failed), warm-up requests first. The serving record matches them with the API
server's own timestamps of the same requests (same host, same clock).

Prompts of ``generated-shared-prefix`` cells: ``bench_serving`` draws them from the tokenizer's
``get_vocab()``, whose order changes from process to process (the tokenizers library's hash map),
so two clients that generate the same cell get different prompts even with one seed. Only its
cache file (``~/.cache/sglang/benchmark``, one per cell's seed and sizes) makes them agree, and
two clients that start the same cell at once (``--gpus 2`` on a fresh machine) both generated it:
stock and patched then served different prompts. The client takes an exclusive lock around that
generation (``serialize_dataset_generation``), so the second client waits and loads the file the
first one wrote.

    printf '%s\\n' '["--backend", "sglang", "--port", "30000", ...]' | python3 scripts/serve_bench_client.py
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import importlib
import json
import os
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

MODULE = "sglang.bench_serving"
#: Where ``bench_serving``'s ``generated-shared-prefix`` prompts are drawn (and cached).
GSP_MODULE = "sglang.benchmark.datasets.generated_shared_prefix"
GSP_FUNC = "sample_generated_shared_prefix_requests"
#: The client's loop-lag sampler: how late this sleep wakes.
LAG_SLEEP_S = 0.002


async def sample_lag(stats: dict[str, Any]) -> None:
    """Sleep ``LAG_SLEEP_S`` again and again on the running loop and add how late each wake-up
    was to ``stats`` (``n``, ``sum``, ``max`` in s, ``late_10ms``: wake-ups 10 ms or more late),
    less the time the loop's thread spent in ``time.sleep`` meanwhile (``stats["slept"]``, counted by
    ``lag_sampled``)."""
    while True:
        t0, slept0 = time.perf_counter(), stats["slept"]
        await asyncio.sleep(LAG_SLEEP_S)
        late = max(0.0, time.perf_counter() - t0 - LAG_SLEEP_S - (stats["slept"] - slept0))
        stats["n"] += 1
        stats["sum"] += late
        stats["max"] = max(stats["max"], late)
        stats["late_10ms"] += late >= 0.01


def stamped(func: Callable[..., Any], requests: list[list[float | None]]) -> Callable[..., Any]:
    """``bench_serving``'s request function ``func``, appending ``[start, ttft]`` per call to
    ``requests`` (``start``: ``time.time()`` at the call; ``ttft``: the output's, None when it
    failed)."""
    @functools.wraps(func)
    async def call(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        out = await func(*args, **kwargs)
        ok = getattr(out, "success", False)
        requests.append([round(start, 6), round(out.ttft, 6) if ok and getattr(out, "ttft", None) else None])
        return out

    call.stamped = True  # type: ignore[attr-defined]
    return call


def stamp_requests(main: Any, requests: list[list[float | None]]) -> None:
    """Wrap every request function of the ``bench_serving`` run whose coroutine is ``main``
    (its module namespace is fresh per run: ``ASYNC_REQUEST_FUNCS`` in the coroutine's globals)."""
    frame = getattr(main, "cr_frame", None)
    funcs = frame.f_globals.get("ASYNC_REQUEST_FUNCS") if frame is not None else None
    if isinstance(funcs, dict):
        for name, func in list(funcs.items()):
            if not getattr(func, "stamped", False):  # a second asyncio.run in the same run
                funcs[name] = stamped(func, requests)


@contextlib.contextmanager
def lag_sampled(stats: dict[str, Any]) -> Iterator[None]:
    """While inside: every ``asyncio.run`` runs ``sample_lag`` beside its coroutine and stamps
    its ``bench_serving`` requests into ``stats["requests"]`` (``stamp_requests``), and
    ``time.sleep`` on this thread adds what it slept to ``stats["slept"]``."""
    real = asyncio.run
    real_sleep = time.sleep
    thread = threading.get_ident()

    def sleep(seconds: float) -> None:
        t0 = time.perf_counter()
        try:
            real_sleep(seconds)
        finally:
            if threading.get_ident() == thread:
                stats["slept"] += time.perf_counter() - t0

    def run(main, *a, **k):
        stamp_requests(main, stats["requests"])

        async def with_sampler():
            sampler = asyncio.ensure_future(sample_lag(stats))
            try:
                return await main
            finally:
                sampler.cancel()

        return real(with_sampler(), *a, **k)

    asyncio.run = run
    time.sleep = sleep
    try:
        yield
    finally:
        asyncio.run = real
        time.sleep = real_sleep


def lag_summary(stats: dict[str, Any]) -> dict[str, Any]:
    n = int(stats["n"])
    return {"samples": n, "mean_ms": round(stats["sum"] * 1e3 / n, 3) if n else None,
            "max_ms": round(stats["max"] * 1e3, 2), "late_10ms": int(stats["late_10ms"]),
            "slept_ms": round(stats["slept"] * 1e3, 1)}


def run_reply(stats: dict[str, Any]) -> dict[str, Any]:
    """The reply of a sampled call: its loop lag and its requests' stamps."""
    return {"rc": 0, "client_lag": lag_summary(stats), "requests": stats["requests"]}


def run_one(argv: list[str], run: Callable[..., Any] = runpy.run_module) -> dict[str, Any]:
    """One ``bench_serving`` command line, its stdout sent to stderr; the reply for it."""
    saved = sys.argv
    sys.argv = [MODULE, *argv]
    # Its dependencies stay imported; the module itself runs afresh as ``__main__`` (runpy
    # warns when it is also in sys.modules under its own name).
    sys.modules.pop(MODULE, None)
    stats: dict[str, Any] = {"n": 0, "sum": 0.0, "max": 0.0, "late_10ms": 0, "slept": 0.0, "requests": []}
    sampled = os.environ.get("SERVE_BENCH_CLIENT_LAG") == "1"
    try:
        with contextlib.redirect_stdout(sys.stderr), (lag_sampled(stats) if sampled else contextlib.nullcontext()):
            run(MODULE, run_name="__main__", alter_sys=False)
    except SystemExit as exc:  # argparse errors and explicit exits
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:
            return {"rc": code, "error": f"bench_serving exited with {exc.code}"}
    except Exception as exc:  # reported to the caller, which records the cell as failed
        traceback.print_exc(file=sys.stderr)
        return {"rc": 1, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        sys.argv = saved
    return run_reply(stats) if sampled else {"rc": 0}


def serve(lines: TextIO, out: TextIO, run: Callable[..., Any] = runpy.run_module) -> int:
    """Answer every request line; returns how many calls failed."""
    failed = 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            argv = json.loads(line)
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise ValueError("expected a JSON list of strings")
        except ValueError as exc:
            reply: dict[str, Any] = {"rc": 2, "error": f"bad request line: {exc}"}
        else:
            reply = run_one(argv, run)
        failed += reply["rc"] != 0
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return failed


def serialize_dataset_generation(module: Any, name: str, lock_path: Path) -> None:
    """Replace ``module.<name>`` by a wrapper that holds an exclusive ``flock`` on ``lock_path``
    while it runs: a second client (another process) waits, then finds the cache file the first
    one wrote and loads it. Idempotent; an unknown ``name`` raises (SGLang renamed it)."""
    func = getattr(module, name)
    if getattr(func, "serialized", False):
        return

    @functools.wraps(func)
    def locked(*args: Any, **kwargs: Any) -> Any:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                return func(*args, **kwargs)
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    locked.serialized = True  # type: ignore[attr-defined]
    setattr(module, name, locked)


def install_dataset_lock() -> None:
    """``serialize_dataset_generation`` on ``bench_serving``'s ``generated-shared-prefix``
    prompts, the lock file beside its cache (``~/.cache/sglang/benchmark``)."""
    serialize_dataset_generation(importlib.import_module(GSP_MODULE), GSP_FUNC,
                                 Path.home() / ".cache" / "sglang" / "benchmark" / "generation.lock")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        sys.stdout.write(__doc__ or "")
        return 0
    # Import once, before the first request (the reason this client exists).
    with contextlib.redirect_stdout(sys.stderr):
        __import__(MODULE)
    install_dataset_lock()
    serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
