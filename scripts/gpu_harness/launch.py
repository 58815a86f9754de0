"""Launching a harness's workers: a worker subprocess in its own session, its log captured,
killed with all its children after a timeout; what counts as a harness error (an Engine that
did not start or did not finish) as opposed to a result; waiting for a server to answer;
leaving a worker without hanging in interpreter shutdown; a run split over device calls."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Sequence

#: What run_worker writes into a worker's log when it kills the worker at its time limit. A
#: return code of -9 alone does not say who killed it: SGLang SIGKILLs its own process tree
#: when a child process fails (its SIGQUIT handler), so an Engine that died reads -9 too.
KILLED_AT_LIMIT = "run killed after"


def run_worker(script: Path, spec: dict[str, Any], work: Path, name: str, log_path: Path, env: dict[str, str],
               timeout: float, *, spec_path: Path | None = None,
               result_path: Path | None = None) -> tuple[int, float, dict[str, Any] | None, str]:
    """Run ``script --worker SPEC`` in its own session with ``spec`` (plus ``result_path``);
    kill it and any SGLang child it left after ``timeout``. Returns the return code (-9 when
    killed), the wall time, the worker's result JSON (None if it wrote none) and its log."""
    result_path = result_path or work / f"result-{name}.json"
    spec_path = spec_path or work / f"spec-{name}.json"
    spec = dict(spec, result_path=str(result_path))
    spec_path.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(script), "--worker", str(spec_path)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            rc = -9
            log.write(f"\n[{script.stem}] {name} {KILLED_AT_LIMIT} {timeout:.0f} s\n")
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker's own session: it and its children only
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    wall = time.perf_counter() - t0
    try:
        result = json.loads(result_path.read_text()) if result_path.exists() else None
    except ValueError:
        result = None
    return rc, wall, result, log_path.read_text(errors="replace")


def exit_reason(returncode: int | None, log_text: str) -> str | None:
    """How a ``run_worker`` process ended, when not with status 0: killed at its time limit
    (run_worker's mark in its log), killed by SIGKILL otherwise, or its exit status."""
    if returncode == -9:
        return ("killed at the time limit" if KILLED_AT_LIMIT in log_text
                else "killed by SIGKILL before the time limit (SGLang kills its own processes when a child fails)")
    return None if returncode == 0 else f"exit status {returncode}"


def engine_error(returncode: int | None, result: dict[str, Any] | None, log_text: str, *,
                 expected: Sequence[str] = ()) -> str | None:
    """Why an Engine run is a harness error, not a result (None: it ran to the end).

    A harness error: the worker was killed or exited non-zero, wrote no result, recorded no
    start-up (the Engine did not start), or is missing one of the ``expected`` keys of its
    result's ``scenarios`` (it died part-way)."""
    why = []
    if result is None:
        why.append("no result")
    elif result.get("startup_s") is None:
        why.append("the Engine did not start")
    else:
        missing = [k for k in expected if k not in (result.get("scenarios") or {})]
        if missing:
            why.append(f"stopped before {missing[0]!r}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    exit_why = exit_reason(returncode, log_text)
    if exit_why:
        why.insert(0, exit_why)
    if not why:
        return None
    error = (result or {}).get("error")
    return "; ".join(why) + (f"; {error}" if error else "")


def wait_until_ready(proc: subprocess.Popen, url: str, deadline: float, poll_s: float = 1.0) -> str | None:
    """Poll ``url`` until it answers 200 (a started ``sglang.launch_server``): None when it
    does, else why not (the server exited, or ``deadline``, a ``time.monotonic()`` value, passed)."""
    while True:
        if proc.poll() is not None:
            return f"exited with {proc.returncode} before it was ready"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return None
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            return "not ready in time"
        time.sleep(poll_s)


def exit_worker(code: int) -> None:
    """Leave the worker without risking a hang in interpreter shutdown: run the atexit
    handlers (the probe's final flush among them) for at most 15 s, then ``os._exit``."""
    import atexit
    import threading

    t = threading.Thread(target=atexit._run_exitfuncs, daemon=True)  # noqa: SLF001
    t.start()
    t.join(15)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def take_shard(items: Sequence[Any], spec: str | None) -> list[Any]:
    """Every N-th item starting at the I-th (``spec`` ``"I/N"``, 1 <= I <= N; None: all), to
    split a long run over several device calls."""
    if not spec:
        return list(items)
    try:
        i, n = (int(x) for x in spec.split("/"))
        if not 1 <= i <= n:
            raise ValueError
    except ValueError:
        raise ValueError(f"--shard {spec!r}: give I/N with 1 <= I <= N") from None
    return list(items)[i - 1::n]
