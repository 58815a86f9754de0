#!/usr/bin/env python3
"""CPU self-test of the GPU smoke harness (no GPU, no SGLang needed).

Checks the pure analysis functions of ``gpu_smoke.py``, the call-count probe in
``gpu_probe/`` (including a SIGKILLed spawned child), the model factory's names/shapes,
and the whole two-run orchestration against a fake ``sglang`` package whose "scheduler"
is a spawned subprocess::

    python3 scripts/gpu_smoke_selftest.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_smoke as gs  # noqa: E402

FAILURES: list[str] = []


def expect(cond: bool, what: str) -> None:
    print(f"  [{'ok' if cond else 'FAIL'}] {what}")
    if not cond:
        FAILURES.append(what)


def test_pure() -> None:
    print("pure functions")
    expect(gs.tail_period([1, 2, 1, 2, 1, 2, 1, 2]) == 2, "tail_period period 2")
    expect(gs.tail_period([5] * 10) == 1, "tail_period constant")
    expect(gs.tail_period(list(range(40))) is None, "tail_period aperiodic")
    expect(gs.tail_period(list(range(40)) + [7, 8, 9] * 12) == 3, "tail_period only looks at the tail")

    w = gs.make_workload(16, 4096)
    expect(len(w) == 16 and w == gs.make_workload(16, 4096), "workload is deterministic")
    expect(all(3 <= t < 4096 for p in w for t in p.input_ids), "workload ids in range")
    expect(len({len(p.input_ids) for p in w}) == 16 and {p.max_new_tokens for p in w} >= {16, 128},
           "workload lengths vary, budgets span 16..128")

    prompts = [gs.Prompt([3, 4], 4), gs.Prompt([5], 4)]
    r = gs.compare_outputs(prompts, [[1, 2, 3, 4], [9, 9, 9, 9]], [[1, 2, 3, 4], [9, 9, 8, 9]])
    expect(r[0].match and not r[1].match and r[1].first_mismatch == 2, "compare_outputs finds first mismatch")
    r = gs.compare_outputs(prompts, [[1, 2, 3, 4]], [[1, 2, 3]])
    expect(not r[0].match and r[0].first_mismatch == 3 and not r[1].match, "compare_outputs: length / missing")

    log = textwrap.dedent("""\
        [2026-01-01 00:00:00 INFO pid=10] sglang_futuremap_patch: applied 3 back-ports (9 targets) to SGLang 0.5.12.post1 [pid 10]: a (#1)
        [2026-01-01 00:00:01] sglang_futuremap_patch: applied 3 back-ports (9 targets) to SGLang 0.5.12.post1 [pid 11]: a (#1)
        [2026-01-01 00:00:01 INFO pid=10] Available plugins for group sglang.srt.plugins:
        [2026-01-01 00:00:01 INFO pid=10]   - futuremap -> sglang_futuremap_patch._plugin:register
        [2026-01-01 00:00:02 INFO pid=11] Executed general plugin: futuremap
        """)
    f = gs.scan_log(log)
    expect(f.applied_pids == [10, 11] and f.applied_lines == 2 and not f.bad_lines, "scan_log: applied lines, pids")
    bad = log + textwrap.dedent("""\
        [2026-01-01 00:00:03 WARNING pid=11] sglang_futuremap_patch: skipped, SGLang x left untouched: y
        Failed to execute general plugin: futuremap
          File "/site/sglang_futuremap_patch/_api.py", line 3, in apply
        /site/sglang_futuremap_patch/_engine.py:12: UserWarning: careful
        [2026-01-01 00:00:04] sglang_futuremap_patch: skipped, SGLang x left untouched: y
        [2026-01-01 00:00:05 ERROR pid=11] hook sglang_futuremap_patch.backports.x raised
        """)
    f = gs.scan_log(bad)
    expect(len(f.bad_lines) == 6, f"scan_log: 6 bad lines (got {len(f.bad_lines)})")
    f = gs.scan_log("[t INFO pid=3] sglang_futuremap_patch: disabled by SGLANG_FUTUREMAP_PATCH=off; x\n")
    expect(f.disabled_lines == 1 and f.applied_lines == 0 and not f.bad_lines, "scan_log: disabled line")

    probe = gs.summarize_probe([
        {"pid": 2, "proctitle": "sglang::scheduler_TP0", "total": 5, "mechanism": "m"},
        {"pid": 1, "proctitle": None, "total": 1, "mechanism": "m"},
        {"pid": 3, "proctitle": "sglang::detokenizer", "total": 0, "mechanism": "m"},
    ])
    expect(probe.scheduler_pids == [2] and probe.scheduler_calls == 5 and probe.total_calls == 6, "summarize_probe")

    # evaluate(): a passing pair and single-fault variants.
    prompts = gs.make_workload(4, 4096)
    outs = [list(range(p.max_new_tokens)) for p in prompts]

    def run(mode: str, outputs: list[list[int]], calls: int, applied: bool = True) -> dict:
        if mode == "off":
            text = "[t INFO pid=1] sglang_futuremap_patch: disabled by X=off\n"
        else:
            text = "".join(f"[t INFO pid={p}] sglang_futuremap_patch: applied 3 [pid {p}]\n" for p in ((1, 2) if applied else (1,)))
        return {
            "returncode": 0,
            "result": {"pid": 1, "outputs": outputs},
            "log": gs.scan_log(text),
            "probe": gs.summarize_probe([{"pid": 2, "proctitle": "sglang::scheduler_TP0", "total": calls}]),
        }

    checks, _ = gs.evaluate(prompts, run("off", outs, 10), run("strict", outs, 0))
    expect(all(c.ok for c in checks), "evaluate: good pair passes")
    changed = [o[:] for o in outs]
    changed[1][3] += 1
    for label, stock, patched, failing in [
        ("mismatch", run("off", outs, 10), run("strict", changed, 0), "outputs identical"),
        ("patched calls", run("off", outs, 10), run("strict", outs, 3), f"patched run never calls {gs.PROBE_FUNC}"),
        ("stock no calls", run("off", outs, 0), run("strict", outs, 0), f"stock scheduler calls {gs.PROBE_FUNC}"),
        ("scheduler not applied", run("off", outs, 10), run("strict", outs, 0, applied=False),
         "patched log: applied in every process"),
        ("cyclic", run("off", [[1, 2] * (p.max_new_tokens // 2) for p in prompts], 10),
         run("strict", [[1, 2] * (p.max_new_tokens // 2) for p in prompts], 0), "outputs not trivially cyclic"),
    ]:
        checks, _ = gs.evaluate(prompts, stock, patched)
        failed = [c.name for c in checks if not c.ok]
        expect(failed == [failing], f"evaluate: {label} -> only '{failing}' fails (got {failed})")

    a = gs.build_parser().parse_args(["--models", "m", "--no-cuda-graph", "--log-dir", "l", "--out-json", "o.json"])
    expect(a.cuda_graph is False and a.models == Path("m") and a.patched_mode == "strict", "argument parsing")
    kw = gs.engine_kwargs("t", "d", cuda_graph=True, mem_fraction=0.3, seed=0)
    expect(kw["disable_cuda_graph"] is False and kw["speculative_algorithm"] == "STANDALONE"
           and kw["disable_piecewise_cuda_graph"] is True, "engine kwargs")


DUMMY = textwrap.dedent("""\
    import os, time, threading, multiprocessing as mp
    class ScheduleBatch:
        def maybe_wait_verify_done(self): pass
    def maybe_wait_verify_done(): pass
    def child(n):
        b = ScheduleBatch()
        for _ in range(n): b.maybe_wait_verify_done()
        time.sleep(1.5)
        os.kill(os.getpid(), 9)  # like SGLang's shutdown: SIGKILL, no atexit
    if __name__ == "__main__":
        mp.set_start_method("spawn")
        p = mp.Process(target=child, args=(7,)); p.start(); p.join()
        t = threading.Thread(target=lambda: [maybe_wait_verify_done() for _ in range(3)]); t.start(); t.join()
        for _ in range(1000): len([])
        maybe_wait_verify_done()
    """)


def test_probe(tmp: Path) -> None:
    print("probe")
    script = tmp / "dummy.py"
    script.write_text(DUMMY)
    out = tmp / "probe-out"
    env = dict(os.environ, SMOKE_PROBE_DIR=str(out), PYTHONPATH=str(gs.PROBE_DIR))
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    recs = gs.read_probe_dir(out)
    totals = sorted(r["total"] for r in recs)
    expect(4 in totals and 7 in totals, f"probe counts main (4) and SIGKILLed spawned child (7): {totals}")
    expect(all(r["mechanism"] != "none" for r in recs), f"probe mechanism {sorted({r['mechanism'] for r in recs})}")
    env.pop("SMOKE_PROBE_DIR")
    out2 = tmp / "probe-off"
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    expect(not out2.exists(), "probe inactive without SMOKE_PROBE_DIR")


FAKE_MONITORING = textwrap.dedent("""\
    # Drives the probe's sys.monitoring branch through a stand-in namespace (for Pythons < 3.12).
    import runpy, sys, types
    calls = {}
    class Events: PY_START = 1
    class FakeMonitoring:
        PROFILER_ID, OPTIMIZER_ID, DISABLE, events = 2, 5, object(), Events
        used = {2}
        def use_tool_id(self, i, name):
            if i in self.used: raise ValueError(i)
            self.used.add(i); calls["tool"] = i
        def register_callback(self, i, ev, fn): calls["cb"] = fn
        def set_events(self, i, ev): calls["events"] = ev
    sys.monitoring = FakeMonitoring()
    g = runpy.run_path(sys.argv[1])
    def maybe_wait_verify_done(): pass
    def other(): pass
    cb = calls["cb"]
    assert calls["tool"] == 5 and calls["events"] == 1, calls
    assert cb(other.__code__, 0) is sys.monitoring.DISABLE
    for _ in range(3): assert cb(maybe_wait_verify_done.__code__, 0) is None
    """)


def test_probe_monitoring_branch(tmp: Path) -> None:
    if sys.version_info >= (3, 12):
        return  # test_probe already ran the real sys.monitoring branch
    print("probe (sys.monitoring branch, stand-in namespace)")
    script = tmp / "fake_monitoring.py"
    script.write_text(FAKE_MONITORING)
    out = tmp / "probe-mon"
    env = dict(os.environ, SMOKE_PROBE_DIR=str(out))
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, str(script), str(gs.PROBE_DIR / "sitecustomize.py")], env=env, timeout=60,
                       capture_output=True, text=True)
    recs = gs.read_probe_dir(out)
    expect(r.returncode == 0 and [x["total"] for x in recs] == [3] and recs[0]["mechanism"] == "sys.monitoring:5",
           "monitoring branch counts 3 calls with tool id 5"
           + ("" if r.returncode == 0 and recs else f" (rc {r.returncode}, {recs}, {r.stderr[-300:]})"))


def test_models(tmp: Path) -> None:
    print("model factory")
    try:
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        print("  (skipped: torch/safetensors not installed)")
        return
    import make_tiny_models as mtm

    t, d = mtm.make_models(tmp / "models", hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
                           head_dim=16, vocab_size=256)
    expect(not mtm.check_model_dir(t) and not mtm.check_model_dir(d), "small models: names/shapes/dtype")
    from safetensors.torch import load_file

    tw, dw = load_file(str(t / "model.safetensors")), load_file(str(d / "model.safetensors"))
    expect(len(tw) == 3 + 9 * 4 and len(dw) == 3 + 9 * 2, "target has 4 layers, draft 2")
    expect(all(bool((tw[k] == dw[k]).all()) for k in dw), "draft tensors are copies of the target's")
    cfg = json.loads((d / "config.json").read_text())
    expect(cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 2, "draft config")


FAKE_SGLANG = textwrap.dedent('''\
    """Fake sglang for the harness self-test: a spawned "scheduler" that counts like the real one."""
    import json, logging, multiprocessing as mp, os, time
    __version__ = "0.0-fake"
    logger = logging.getLogger("sglang_futuremap_patch")

    def _configure():
        path = os.environ.get("SGLANG_LOGGING_CONFIG_PATH")
        if path:
            import logging.config
            logging.config.dictConfig(json.load(open(path)))

    def _announce():
        if os.environ.get("SGLANG_FUTUREMAP_PATCH") == "off":
            logger.info("sglang_futuremap_patch: disabled by SGLANG_FUTUREMAP_PATCH=off; SGLang fake left untouched")
        else:
            logger.info(f"sglang_futuremap_patch: applied 3 back-ports (9 targets) to SGLang fake [pid {os.getpid()}]: x")

    class ScheduleBatch:
        def maybe_wait_verify_done(self):
            pass

    def _scheduler(conn):
        import setproctitle
        _announce()
        _configure()
        setproctitle.setproctitle("sglang::scheduler_TP0")
        logging.getLogger("sglang.scheduler").info("scheduler up")
        stock = os.environ.get("SGLANG_FUTUREMAP_PATCH") == "off"
        bad = os.environ.get("FAKE_BAD") == "1"
        b = ScheduleBatch()
        while True:
            reqs = conn.recv()
            outs = []
            for ids, n in reqs:
                if stock or bad:
                    for _ in range(n):
                        b.maybe_wait_verify_done()
                out = [(sum(ids) * 31 + k * k * 17 + k) % 4093 + 3 for k in range(n)]
                if bad and not stock:
                    out[-1] += 1
                outs.append(out)
            conn.send(outs)

    class Engine:
        def __init__(self, **kw):
            _configure()
            _announce()
            ctx = mp.get_context("spawn")
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(target=_scheduler, args=(child,), daemon=True)
            self._proc.start()

        def generate(self, input_ids, sampling_params):
            self._conn.send([(ids, sp["max_new_tokens"]) for ids, sp in zip(input_ids, sampling_params)])
            outs = self._conn.recv()
            return [{"output_ids": o, "meta_info": {"spec_accept_length": 2.5, "spec_verify_ct": len(o)}} for o in outs]

        def shutdown(self):
            self._proc.kill()  # SGLang SIGKILLs its children too
            self._proc.join()
    ''')


def test_orchestration(tmp: Path) -> None:
    print("orchestration with a fake sglang")
    fake = tmp / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text(FAKE_SGLANG)
    model = tmp / "fake-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 4096}))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(fake) + (os.pathsep + old if old else "")
    try:
        for bad in (False, True):
            os.environ["FAKE_BAD"] = "1" if bad else "0"
            logs = tmp / f"logs-{int(bad)}"
            out_json = logs / "smoke.json"
            rc = gs.main(["--target", str(model), "--draft", str(model), "--log-dir", str(logs),
                          "--out-json", str(out_json), "--timeout", "60"])
            doc = json.loads(out_json.read_text())
            failed = sorted(c["name"] for c in doc["checks"] if not c["ok"])
            if not bad:
                expect(rc == 0 and doc["passed"], f"good fake run passes (rc {rc}, failed {failed})")
                expect(sorted(p.name for p in logs.iterdir()) == ["patched.log", "smoke.json", "stock.log"],
                       "files written: patched.log, smoke.json, stock.log")
            else:
                want = sorted(["outputs identical", f"patched run never calls {gs.PROBE_FUNC}"])
                expect(rc == 1 and failed == want, f"bad fake run fails exactly {want} (rc {rc}, failed {failed})")
    finally:
        os.environ.pop("FAKE_BAD", None)
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="smoke-selftest-") as d:
        tmp = Path(d)
        test_pure()
        test_probe(tmp)
        test_probe_monitoring_branch(tmp)
        test_models(tmp)
        test_orchestration(tmp)
    print(f"{len(FAILURES)} failure(s)" if FAILURES else "all self-tests passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
