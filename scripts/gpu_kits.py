#!/usr/bin/env python3
"""SGLang's own regression kits (``sglang.test.kits``) on its server fixtures, with the tiny
models, on three flavours: stock SGLang, SGLang + the plugin, and the patched tree.

Flavours (``--flavours``, default all three):

* ``stock``: ``SGLANG_FUTUREMAP_PATCH=off``;
* ``plugin``: ``SGLANG_FUTUREMAP_PATCH=strict`` (gpu_harness.child_env's ``patched`` variant);
* ``tree``: a copy of this environment's ``sglang`` package with ``patches/`` applied, first on
  ``PYTHONPATH``, the plugin off (gpu_harness.child_env's ``tree`` variant).

Every kit case (``--list``) is one server: a subclass of the real fixture class with the kits'
mixins, launched by the fixture's own ``setUpClass`` (``sglang serve``) and run as a pytest
process of ``tests/gpu/kits/test_sglang_kits.py`` (``--worker``). Each server gets ports no
other server of the run uses (``gpu_harness.port_blocks.PortAllocator``),
``SGLANG_SPEC_NAN_DETECTION=1`` and ``SGLANG_SPEC_OOB_DETECTION=1``, spec v2 (3 steps, topk 1,
4 draft tokens), a small memory footprint and, unless the case is about it, no piecewise CUDA
graph. Cases and flavours run side by side (``--jobs``). The attention backend is FA3 where it
imports, else Triton (``--attention-backend``).

Each job is also checked to be the flavour it claims: the plugin's log lines (applied /
disabled) and the call-count probe (stock's scheduler waits on ``verify_done``, the plugin's
and the tree's never do).

Verdict: **parity** when every test that passes on stock passes on the other flavours (tests
that fail on stock are listed, not held against them), **regression** when one does not,
**incomplete** when a job did not run to the end or failed its flavour check.

Thresholds that assume a real model (accept length, speed, KL divergence) are fitted once on
stock with ``--fit``: it runs only the cases that need them, on stock, and writes
``kits-thresholds.json`` (to ``--out`` and ``--thresholds``); commit it as
``tests/gpu/kits/thresholds.json``. Until then those cases run with thresholds that cannot
fail and the record marks them ``unfitted``, with the values they measured.

Results under ``--out``: ``kits-<tag>.json``, ``kits-<tag>.md`` (rewritten after every job) and
``logs-<tag>.tar.gz``. ``--merge A.json [B.json ...]`` prints the Markdown record of one or
more runs (``results/gpu-kits/README.md``). Exit status: 0 parity (or a fit written), 1
otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_kits_cases as kc  # noqa: E402  (the catalogue)
from gpu_harness import child_env, launch, logs, model_factory, port_blocks, records  # noqa: E402

#: flavour -> gpu_harness.child_env variant
FLAVOURS: dict[str, str] = {"stock": "stock", "plugin": "patched", "tree": "tree"}
BACKENDS = ("auto", "triton", "fa3", "flashinfer")
MIN_JOB_S = 90  # a job is not started with less of the budget left


class UsageError(Exception):
    """A mistake in the command line: one line, exit status 2."""


# ----------------------------------------------------------------------------- selection


def select_cases(patterns: Sequence[str] | None) -> list[kc.KitCase]:
    """Cases by name or kit module (fnmatch patterns); every pattern must match something."""
    if not patterns:
        return list(kc.KIT_CASES)
    chosen: list[kc.KitCase] = []
    for pattern in patterns:
        hit = [c for c in kc.KIT_CASES if fnmatch.fnmatch(c.name, pattern)
               or any(fnmatch.fnmatch(m, pattern) for m in c.kit_modules)]
        if not hit:
            na = [k for k in kc.NOT_APPLICABLE_KITS if fnmatch.fnmatch(k, pattern)]
            why = f" ({na[0]} is not applicable: {kc.NOT_APPLICABLE_KITS[na[0]]})" if na else ""
            raise UsageError(f"--kits {pattern!r} matches no kit case{why}; see --list")
        chosen += [c for c in hit if c not in chosen]
    return [c for c in kc.KIT_CASES if c in chosen]


def parse_flavours(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in FLAVOURS]
    if bad or not names:
        raise UsageError(f"--flavours {text!r}: choose from {','.join(FLAVOURS)}")
    return list(dict.fromkeys(names))


def shard(cases: Sequence[kc.KitCase], spec: str | None) -> list[kc.KitCase]:
    try:
        return launch.take_shard(cases, spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def list_text() -> str:
    lines = ["kit cases (one server each):"]
    for c in kc.KIT_CASES:
        extra = " [thresholds: " + ", ".join(c.thresholds) + "]" if c.thresholds else ""
        lines.append(f"  {c.name:18} {c.fixture:18} {c.algorithm:10} {', '.join(c.kits)}{extra}")
        for test, reason in kc.FIXTURES[c.fixture].not_applicable + c.not_applicable:
            lines.append(f"  {'':18} not applicable: {test}: {reason}")
    lines.append("not applicable kits:")
    lines += [f"  {k}: {why}" for k, why in kc.NOT_APPLICABLE_KITS.items()]
    lines.append("not applicable fixtures:")
    lines += [f"  {k}: {why}" for k, why in kc.NOT_APPLICABLE_FIXTURES.items()]
    lines.append("flavours: " + ", ".join(f"{f} ({v})" for f, v in FLAVOURS.items()))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- setup


@dataclass
class Setup:
    work: Path
    models: dict[str, Path]
    kits_model: Path
    data_dir: Path
    bin_dir: Path  # our `sglang` launcher, first on PATH
    log_config: Path
    backend: str
    fa3: bool
    variants: dict[str, child_env.Variant]
    stand_in: dict[str, bool] = field(default_factory=dict)  # flavour -> datasets stand-in on the path
    preflight: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # flavour -> why it cannot run at all

    def draft(self, case: kc.KitCase) -> str:
        return str(self.models["eagle3" if case.algorithm == "EAGLE3" else "draft"])


def write_launcher(bin_dir: Path) -> Path:
    """``sglang`` for ``popen_launch_server`` (it runs ``sglang serve``): the console script
    with this interpreter. The offline bundle's own has another machine's interpreter in its
    first line, and is not on PATH. Guarded like pip's: SGLang's spawned processes run this
    file again as ``__mp_main__``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "sglang"
    path.write_text(f"#!{sys.executable}\nimport sys\n\nfrom sglang.cli.main import main\n\n"
                    "if __name__ == \"__main__\":\n    sys.exit(main())\n")
    path.chmod(0o755)
    return path


def choose_backend(requested: str, fa3: bool) -> str:
    if requested == "auto":
        return "fa3" if fa3 else "triton"
    if requested == "fa3" and not fa3:
        raise UsageError(f"--attention-backend fa3: {child_env.NO_FA3} here (sgl_kernel.flash_ops does not import)")
    return requested


def prepare(args: argparse.Namespace, flavours: Sequence[str], work: Path) -> Setup:
    models = model_factory.build_tiny_models(work / "models") if args.models is None else {
        "target": args.models / "target", "draft": args.models / "draft", "eagle3": args.models / "eagle3"}
    missing = [str(p) for p in models.values() if not (p / "config.json").exists()]
    if missing:
        raise UsageError(f"--models {args.models}: no model in {', '.join(missing)} (make_tiny_models.py --out DIR)")
    kits_model = kc.write_kits_model(models["target"], work / "kits-target")
    vocab = int(model_factory.model_config(kits_model)["vocab_size"])
    data_dir = work / "data"
    kc.write_kits_data(data_dir, str(kits_model), vocab)
    variants: dict[str, child_env.Variant] = {}
    errors: dict[str, str] = {}
    for flavour in flavours:
        tree = None
        if flavour == "tree":
            tree = str(work / "tree" / "python")
            try:
                child_env.build_tree_site(work / "tree")
            except Exception as exc:  # the other flavours still run; the tree's jobs say why not
                errors[flavour] = f"cannot build the patched tree: {exc}"[:400]
        variants[flavour] = child_env.make_variants([FLAVOURS[flavour]], tree=tree)[0]
    fa3 = child_env.fa3_available()
    return Setup(work=work, models=models, kits_model=kits_model, data_dir=data_dir,
                 bin_dir=write_launcher(work / "bin").parent,
                 log_config=logs.write_logging_config(work / "logging.json"),
                 backend=choose_backend(args.attention_backend, fa3), fa3=fa3, variants=variants, errors=errors)


def flavour_env(setup: Setup, flavour: str, probe_dir: Path, *, case: kc.KitCase | None = None,
                ports: port_blocks.PortBlock | None = None, gpu: str | None = None) -> dict[str, str]:
    """The environment of a kit test process (and so of the server it launches)."""
    variant = setup.variants[flavour]
    env = child_env.subprocess_env(variant.mode, probe_dir, setup.log_config, site=variant.site, ports=ports,
                            overlay=variant.overlay, cuda_visible_devices=gpu)
    env.update(kc.SERVER_ENV)
    env.update(case.env if case else ())
    env["PATH"] = os.pathsep.join([str(setup.bin_dir), env.get("PATH", "")])
    if setup.stand_in.get(flavour):
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(child_env.DATASETS_STAND_IN)])
    return env


PREFLIGHT = r"""
import importlib, json, sys
out = {}
try:
    import sglang
    out["sglang_file"] = sglang.__file__
    out["sglang_version"] = getattr(sglang, "__version__", None)
except Exception as exc:
    out["error"] = ("sglang does not import: %r" % (exc,))[:300]
try:
    import datasets  # noqa: F401
    out["datasets"] = True
except ImportError:
    out["datasets"] = False
    sys.path.append(sys.argv[1])
errors = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        errors[name] = ("%s: %s" % (type(exc).__name__, exc))[:300]
out["import_errors"] = errors
print("PREFLIGHT " + json.dumps(out))
"""


def preflight_modules(cases: Sequence[kc.KitCase]) -> list[str]:
    mods = {f"{kc.KITS_PACKAGE}.{k.split('.')[0]}" for c in cases for k in c.kits}
    mods |= {f"{kc.FIXTURES_PACKAGE}.{kc.FIXTURES[c.fixture].module}" for c in cases}
    return sorted(mods)


def run_preflight(setup: Setup, flavour: str, modules: Sequence[str], timeout: float = 300) -> dict[str, Any]:
    """Which SGLang a flavour's processes import, whether ``datasets`` is there (else the
    stand-in goes on the path) and which kit / fixture modules do not import."""
    if flavour in setup.errors:
        return {"error": setup.errors[flavour]}
    probe = setup.work / "probe-preflight" / flavour
    probe.mkdir(parents=True, exist_ok=True)
    env = flavour_env(setup, flavour, probe)
    try:
        proc = subprocess.run([sys.executable, "-c", PREFLIGHT, str(child_env.DATASETS_STAND_IN), *modules], env=env,
                              capture_output=True, text=True, timeout=timeout)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PREFLIGHT ")]
        doc = json.loads(lines[-1][len("PREFLIGHT "):]) if lines else {
            "error": f"preflight printed nothing (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}
    except subprocess.TimeoutExpired:
        doc = {"error": f"preflight did not finish in {timeout:.0f} s"}
    doc.setdefault("error", sglang_source_problem(setup, flavour, doc.get("sglang_file") or ""))
    return doc


def sglang_source_problem(setup: Setup, flavour: str, where: str) -> str | None:
    """The tree flavour must import SGLang from the tree, the others never."""
    tree = setup.variants["tree"].overlay if "tree" in setup.variants else None
    if flavour == "tree" and not (tree and where.startswith(tree + os.sep)):
        return f"the tree flavour imports SGLang from {where or '?'}, not from the tree {tree}"
    if flavour != "tree" and tree and where.startswith(tree + os.sep):
        return f"the {flavour} flavour imports SGLang from the tree ({where})"
    return None


# ----------------------------------------------------------------------------- one job


def parse_junit(path: Path) -> list[dict[str, Any]]:
    """Per test: name, status (passed / failed / error / skipped), seconds, message."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    tests = []
    for tc in root.iter("testcase"):
        status, message = "passed", ""
        for child in tc:
            kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if kind and rank[kind] > rank[status]:
                status = kind
                message = (child.get("message") or child.text or "").strip()
        tests.append({"name": tc.get("name", "?"), "status": status, "seconds": round(float(tc.get("time") or 0), 1),
                      "message": " ".join(message.split())[:400]})
    return tests


def job_status(returncode: int | None, tests: Sequence[dict[str, Any]], log_text: str) -> tuple[str, str | None]:
    """A job's status from its tests, and why it is an error when it is one (``log_text``: the
    job's log, which says whether the harness killed it at its time limit)."""
    if not tests:
        return "error", f"no test results ({launch.exit_reason(returncode, log_text) or 'exit status 0'})"
    states = [t["status"] for t in tests]
    ran = [s for s in states if s != "skipped"]
    if not ran:
        return "skipped", None
    if all(s == "error" for s in ran):
        first = next(t for t in tests if t["status"] == "error")
        return "error", first["message"][:300] or "every test errored"
    if any(s in ("failed", "error") for s in ran):
        return "failed", None
    return "passed", None


def flavour_check(flavour: str, log: logs.LogFindings, probe: logs.ProbeSummary, ran: bool) -> tuple[bool, str]:
    """Whether the job ran the flavour it claims: plugin log lines and the verify_done probe."""
    problems = []
    if log.bad_lines:
        problems.append("plugin warnings/errors: " + " | ".join(log.bad_lines[:2])[:300])
    if flavour == "plugin":
        missing = sorted(set(probe.scheduler_pids) - set(log.applied_pids))
        if not log.applied_lines or missing:
            problems.append(f"'applied' by {log.applied_pids}, schedulers {probe.scheduler_pids}")
    elif log.applied_lines or not log.disabled_lines:
        problems.append(f"{log.disabled_lines} 'disabled' / {log.applied_lines} 'applied' plugin lines")
    if ran and not probe.scheduler_pids:
        problems.append("no probed scheduler process")
    if flavour == "stock" and ran and probe.scheduler_pids and probe.scheduler_calls == 0:
        problems.append("the stock scheduler never waited on verify_done")
    if flavour != "stock" and probe.total_calls:
        problems.append(f"{probe.total_calls} maybe_wait_verify_done calls (none expected)")
    detail = (f"plugin lines: {log.applied_lines} applied, {log.disabled_lines} disabled; "
              f"verify_done waits: {probe.scheduler_calls}")
    return not problems, "; ".join(problems) or detail


@dataclass
class Job:
    case: kc.KitCase
    flavour: str

    @property
    def tag(self) -> str:
        return f"{self.case.name}-{self.flavour}"


def not_run(job: Job, why: str) -> dict[str, Any]:
    return {"case": job.case.name, "flavour": job.flavour, "status": "not run", "error": why, "wall_s": 0.0,
            "tests": [], "check": None, "measured": {}, "thresholds": None}


def run_job(job: Job, setup: Setup, ports: port_blocks.PortAllocator, thresholds_doc: dict[str, Any], *, fit: bool,
            timeout: float, gpu: str | None) -> dict[str, Any]:
    case, flavour = job.case, job.flavour
    pre = setup.preflight.get(flavour, {})
    if pre.get("error"):
        return not_run(job, pre["error"])
    broken = {m: e for m, e in (pre.get("import_errors") or {}).items() if m in preflight_modules([case])}
    if broken:
        return dict(not_run(job, "cannot import " + "; ".join(f"{m}: {e}" for m, e in broken.items())),
                    status="skipped")
    thresholds, fitted = kc.case_thresholds(case, {} if fit else thresholds_doc)
    block = ports.allocate(job.tag)
    plan = kc.ServerPlan(model=str(setup.kits_model), draft=setup.draft(case), port=block.port,
                         nccl_port=block.nccl_port, backend=setup.backend, data_dir=str(setup.data_dir),
                         thresholds=thresholds)
    work = setup.work
    probe_dir = work / f"probe-{job.tag}"
    probe_dir.mkdir(parents=True, exist_ok=True)
    junit = work / f"junit-{job.tag}.xml"
    spec = {"case": case.name, "flavour": flavour, "plan": asdict(plan), "junit": str(junit)}
    env = flavour_env(setup, flavour, probe_dir, case=case, ports=block, gpu=gpu)
    print(f"   {job.tag}: start (port {block.port})", flush=True)
    rc, wall, _, text = launch.run_worker(Path(__file__).resolve(), spec, work, job.tag, work / f"{job.tag}.log", env,
                                      timeout)
    tests = parse_junit(junit)
    status, error = job_status(rc, tests, text)
    ran = any(t["status"] == "passed" for t in tests)
    ok, detail = flavour_check(flavour, logs.scan_log(text), logs.summarize_probe(logs.read_probe_dir(probe_dir)), ran)
    passed = sum(t["status"] == "passed" for t in tests)
    print(f"   {job.tag}: {status} ({passed}/{len(tests)} passed, {wall:.0f} s)"
          + ("" if ok else f"; flavour check FAILED: {detail}"), flush=True)
    return {"case": case.name, "flavour": flavour, "status": status, "error": error, "wall_s": round(wall, 1),
            "returncode": rc, "tests": tests, "check": {"ok": ok, "detail": detail},
            "measured": kc.measured_values(text), "ports": block.as_dict(),
            "thresholds": None if not case.thresholds else {"fitted": fitted and not fit, "values": thresholds},
            "log": f"{job.tag}.log", "log_tail": logs.log_tail(text, 12) if status == "error" else None}


def budget_cut(res: dict[str, Any], left: float | None, timeout: float) -> dict[str, Any]:
    """A job killed at a time limit that was the rest of the run's ``--budget``, not its own
    ``--timeout``, was cut off: say so, so that it is not read as a server that hung."""
    if left is None or left >= timeout or res.get("returncode") != -9 or res.get("status") != "error":
        return res
    return dict(res, error=f"cut off when the run's --budget ran out ({left:.0f} s after it started); "
                           "no verdict: run it again")


def run_jobs(jobs: Sequence[Job], setup: Setup, thresholds_doc: dict[str, Any], *, fit: bool, parallel: int,
             timeout: float, deadline: float | None, stagger: float, gpus: Sequence[str],
             on_result: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """Every job, ``parallel`` at a time, ``stagger`` seconds between server starts; none
    starts with less than MIN_JOB_S left before ``deadline`` (``time.monotonic``), and none
    outlives it."""
    ports = port_blocks.PortAllocator()
    lock = threading.Lock()
    next_start = [time.monotonic()]
    results: list[dict[str, Any]] = []

    def one(index: int, job: Job) -> dict[str, Any]:
        with lock:
            wait = max(0.0, next_start[0] - time.monotonic())
            next_start[0] = max(next_start[0], time.monotonic()) + stagger
        time.sleep(wait)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < MIN_JOB_S:
            res = not_run(job, "the run's --budget was spent")
        else:
            try:
                res = run_job(job, setup, ports, thresholds_doc, fit=fit, gpu=gpus[index % len(gpus)] if gpus else None,
                              timeout=timeout if left is None else min(timeout, left))
                res = budget_cut(res, left, timeout)
            except Exception as exc:  # a harness bug must not lose the other jobs' results
                res = dict(not_run(job, f"harness error: {exc!r}"[:300]), status="error")
        with lock:
            results.append(res)
            on_result(list(results))
        return res

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        list(pool.map(lambda ij: one(*ij), enumerate(jobs)))
    return results


def worker_main(spec_path: Path) -> int:
    """One kit job: pytest on the kits test module, in this process (the server it launches
    inherits this environment)."""
    spec = json.loads(spec_path.read_text())
    os.environ[kc.JOB_ENV] = str(spec_path)
    import pytest

    rc = pytest.main(["-s", "-q", "-p", "no:cacheprovider", "--noconftest", f"--rootdir={kc.ROOT}",
                      f"--junitxml={spec['junit']}", str(kc.KITS_TEST_MODULE)])
    Path(spec["result_path"]).write_text(json.dumps({"pytest_exit": int(rc)}))
    return 0


# ----------------------------------------------------------------------------- record


def verdict(cases: Sequence[dict[str, Any]], flavours: Sequence[str]) -> dict[str, Any]:
    """Parity: every test passing on stock passes on each other flavour, every job ran to its
    end and is the flavour it claims."""
    regressions, incomplete, stock_failures, unfitted = [], [], [], []
    for c in cases:
        res = c["results"]
        for flavour in flavours:
            job = res.get(flavour)
            if job is None or job["status"] in ("error", "not run"):
                why = (job or {}).get("error") or "not in this record"
                incomplete.append(f"{c['name']} / {flavour}: {job['status'] if job else 'missing'} ({why})"[:300])
            elif job.get("check") and not job["check"]["ok"]:
                incomplete.append(f"{c['name']} / {flavour}: flavour check failed ({job['check']['detail']})"[:300])
            if job and job.get("thresholds") and not job["thresholds"]["fitted"] and c["name"] not in unfitted:
                unfitted.append(c["name"])
        stock = res.get("stock") or {}
        for test in stock.get("tests", []) if stock.get("status") in ("passed", "failed") else ():
            if test["status"] in ("failed", "error"):
                stock_failures.append(f"{c['name']}.{test['name']}")
            if test["status"] != "passed":
                continue
            for flavour in flavours:
                other = res.get(flavour)
                if flavour == "stock" or other is None or other["status"] in ("error", "not run"):
                    continue
                got = {t["name"]: t for t in other.get("tests", [])}.get(test["name"])
                if got is None or got["status"] != "passed":
                    regressions.append(f"{c['name']}.{test['name']} on {flavour}: "
                                       f"{got['status'] if got else 'missing'} {(got or {}).get('message', '')}"[:300])
    outcome = "regression" if regressions else "incomplete" if incomplete else "parity"
    return {"outcome": outcome, "regressions": regressions, "incomplete": incomplete,
            "stock_failures": stock_failures, "unfitted": unfitted}


def case_meta(case: kc.KitCase) -> dict[str, Any]:
    fx = kc.FIXTURES[case.fixture]
    return {"name": case.name, "kits": list(case.kits), "fixture": f"{fx.module}.{fx.cls}",
            "algorithm": case.algorithm, "pcg": case.pcg, "server_args": [str(a) for a in case.server_args],
            "env": dict(case.env), "knobs": dict(case.knobs), "thresholds": list(case.thresholds),
            "not_applicable": dict(fx.not_applicable + case.not_applicable)}


def build_record(cases: Sequence[kc.KitCase], flavours: Sequence[str], results: Sequence[dict[str, Any]],
                 environment: dict[str, Any], thresholds_doc: dict[str, Any], *, fit: bool) -> dict[str, Any]:
    by = {(r["case"], r["flavour"]): r for r in results}
    rows = [dict(case_meta(c), results={f: by[(c.name, f)] for f in flavours if (c.name, f) in by}) for c in cases]
    return {"kind": "sglang-kits", "fit": fit, "environment": environment, "flavours": list(flavours),
            "thresholds": {"fitted": bool(thresholds_doc.get("fitted")) and not fit,
                           "note": thresholds_doc.get("note", "")},
            "not_applicable": {"kits": kc.NOT_APPLICABLE_KITS, "fixtures": kc.NOT_APPLICABLE_FIXTURES},
            "cases": rows, "verdict": verdict(rows, flavours)}


def job_cell(job: dict[str, Any] | None) -> str:
    if job is None:
        return "-"
    tests = job.get("tests") or []
    ran = [t for t in tests if t["status"] != "skipped"]
    passed = sum(t["status"] == "passed" for t in ran)
    label = {"passed": "passed", "failed": "**failed**", "error": "**error**", "skipped": "skipped",
             "not run": "not run"}[job["status"]]
    text = f"{label} {passed}/{len(ran)}" if ran else label
    if job.get("wall_s"):
        text += f" ({job['wall_s']:.0f} s)"
    if job.get("thresholds") and not job["thresholds"]["fitted"]:
        text += " unfitted"
    if job.get("check") and not job["check"]["ok"]:
        text += " **flavour check failed**"
    return text


def merge_docs(docs: Sequence[dict[str, Any]]) -> str:
    """The Markdown record of one or more runs (later runs win for the same case and flavour)."""
    flavours = list(dict.fromkeys(f for d in docs for f in d["flavours"]))
    merged: dict[str, dict[str, Any]] = {}
    for d in docs:
        for c in d["cases"]:
            row = merged.setdefault(c["name"], dict(c, results={}))
            row["results"].update(c["results"])
    order = [c.name for c in kc.KIT_CASES]
    cases = sorted(merged.values(), key=lambda c: (order.index(c["name"]) if c["name"] in order else len(order),
                                                   c["name"]))
    v = verdict(cases, flavours)
    env = docs[0]["environment"] if docs else {}
    if v["unfitted"]:
        thresholds = (f"not fitted yet: {', '.join(v['unfitted'])} ran with thresholds that cannot fail "
                      "(measured values below)")
    else:
        thresholds = "fitted" if any(c["thresholds"] for c in cases) else "none needed"
    lines = [
        "# SGLang's own test kits: stock SGLang, the plugin and the patched tree",
        "",
        "| | |", "|---|---|",
        f"| date | {', '.join(sorted({str(d['environment'].get('date', '?'))[:10] for d in docs}))} |",
        f"| GPU | {env.get('gpu')} |",
        f"| SGLang | {env.get('sglang')} (torch {env.get('torch')}) |",
        f"| attention backend | {', '.join(sorted({str(d['environment'].get('backend')) for d in docs}))}"
        f" (FA3 {'yes' if env.get('fa3') else 'no'}) |",
        f"| commands | {'; '.join('`' + str(d['environment'].get('command')) + '`' for d in docs)} |",
        f"| wall time | {' + '.join(str(round(d['environment'].get('wall_s') or 0)) + ' s' for d in docs)} |",
        f"| outcome | **{v['outcome']}**{' (a threshold fit)' if any(d.get('fit') for d in docs) else ''} |",
        f"| thresholds | {thresholds} |",
        "",
        "Flavours: stock = `SGLANG_FUTUREMAP_PATCH=off`; plugin = `strict`; tree = this environment's `sglang` "
        "package with `patches/` applied, first on `PYTHONPATH`, plugin off. Each kit case is one server launched "
        "by SGLang's own fixture (`sglang.test.server_fixtures`) with the tiny models (byte-level tokenizer), spec "
        "v2 (3 steps, topk 1, 4 draft tokens), `SGLANG_SPEC_NAN_DETECTION=1`, `SGLANG_SPEC_OOB_DETECTION=1`. "
        "A cell: status, tests passed / run (not-applicable tests are skipped), wall time. Parity: every test "
        "that passes on stock passes on the other flavours. Cases, knobs and reasons: `scripts/gpu_kits.py --list`.",
        "",
        "| kit case | kits | fixture | algorithm | " + " | ".join(flavours) + " |",
        "|---|---|---|---|" + "---|" * len(flavours),
    ]
    for c in cases:
        lines.append(f"| {c['name']} | {', '.join(c['kits'])} | {c['fixture'].split('.')[-1]} | {c['algorithm']}"
                     f"{' + PCG' if c.get('pcg') else ''} | "
                     + " | ".join(job_cell(c['results'].get(f)) for f in flavours)
                     + " |")
    for title, items in (("Regressions (passed on stock, not here)", v["regressions"]),
                         ("Incomplete", v["incomplete"])):
        if items:
            lines += ["", f"**{title}:**", ""] + [f"- {i}" for i in items]
    bad = [(c, t["name"]) for c in cases for f in flavours if c["results"].get(f, {}).get("status") == "failed"
           for t in c["results"][f]["tests"] if t["status"] in ("failed", "error")]
    if bad:
        lines += ["", "Tests that did not pass (jobs that errored as a whole are under Incomplete):", "", "| kit case | test | " + " | ".join(flavours) + " | message |",
                  "|---|---|" + "---|" * len(flavours) + "---|"]
        for c, name in list(dict.fromkeys((c["name"], n) for c, n in bad)):
            row = merged[c]
            got = {f: {t["name"]: t for t in row["results"].get(f, {}).get("tests", [])}.get(name) for f in flavours}
            msg = next((t["message"] for t in got.values() if t and t["message"]), "")
            lines.append(f"| {c} | {name} | " + " | ".join((t or {}).get("status", "-") for t in got.values())
                         + f" | {msg[:200].replace('|', '/')} |")
    measured = [(c, f, j) for c in cases for f, j in c["results"].items() if j.get("measured")]
    if measured:
        lines += ["", "Measured by the kits (thresholds rest on these):", "",
                  "| kit case | flavour | accept length | speed (tok/s) | KL prefill | KL decode | thresholds used |",
                  "|---|---|---|---|---|---|---|"]
        for c, f, j in measured:
            m = j["measured"]
            th = j.get("thresholds") or {}
            used = ("fitted: " + ", ".join(f"{k} {v}" for k, v in th["values"].items())) if th.get("fitted") else "unfitted"
            lines.append(f"| {c['name']} | {f} | {m.get('accept_length', '-')} | {m.get('speed', '-')} | "
                         f"{m.get('kl_prefill', '-')} | {m.get('kl_decode', '-')} | {used} |")
    na = docs[0]["not_applicable"] if docs else {"kits": {}, "fixtures": {}}
    lines += ["", "Not applicable to random-weight tiny models (kits, then fixtures):", ""]
    lines += [f"- `{k}`: {why}" for k, why in na["kits"].items()]
    lines += [f"- `{k}`: {why}" for k, why in na["fixtures"].items()]
    per_test = sorted({(t, why) for c in cases for t, why in c.get("not_applicable", {}).items()})
    if per_test:
        lines += ["", "Single tests skipped as not applicable: "
                  + "; ".join(f"`{t}` ({why})" for t, why in per_test) + "."]
    return "\n".join(lines) + "\n"


def merge_files(paths: Sequence[Path]) -> str:
    docs = []
    for path in paths:
        doc = kc.read_json_file(path, UsageError, "kits record")
        if not isinstance(doc, dict) or doc.get("kind") != "sglang-kits":
            raise UsageError(f"--merge: {path} is not a kits record (gpu_kits.py writes kits-<tag>.json)")
        docs.append(doc)
    return merge_docs(docs)


def recorded_command(argv: Sequence[str]) -> str:
    """The command line as recorded: this machine's folders replaced by their role."""
    return records.portable_command("scripts/gpu_kits.py", argv, {"--models": "MODELS", "--out": "OUT",
                                                            "--thresholds": "THRESHOLDS", "--work": "WORK"})


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="print the kit cases, flavours and what is not applicable")
    p.add_argument("--kits", nargs="+", metavar="PATTERN", help="kit cases by name or kit module (fnmatch)")
    p.add_argument("--flavours", default=",".join(FLAVOURS), help="comma-separated: stock, plugin, tree (default all)")
    p.add_argument("--out", type=Path, default=Path("gpu-out"), help="folder for the record and logs")
    p.add_argument("--fit", action="store_true", help="fit the thresholds on stock (the cases that have them)")
    p.add_argument("--thresholds", type=Path, default=kc.THRESHOLDS_FILE,
                   help="thresholds file to read (and, with --fit, write); default tests/gpu/kits/thresholds.json")
    p.add_argument("--models", type=Path, help="make_tiny_models.py output (default: build into the work folder)")
    p.add_argument("--attention-backend", choices=BACKENDS, default="auto", help="auto: fa3 where it imports, else triton")
    p.add_argument("--jobs", type=int, default=12, help="servers at once (default 12)")
    p.add_argument("--timeout", type=float, default=360, help="seconds per job (default 360)")
    p.add_argument("--budget", type=float,
                   help=f"seconds for this whole run: no job starts with less than {MIN_JOB_S} s of it left, "
                        "none outlives it (the record says which did not run)")
    p.add_argument("--shard", help="I/N: every N-th selected kit case from the I-th (split a run over device calls)")
    p.add_argument("--stagger", type=float, default=2.0, help="seconds between server starts (default 2)")
    p.add_argument("--tag", help="file-name tag (default: run or fit, and the shard: run-1of2)")
    p.add_argument("--work", type=Path, help="work folder, a new one (default: a fresh temporary folder)")
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="print the Markdown record of these runs")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return p


def write_outputs(out: Path, tag: str, record: dict[str, Any]) -> None:
    (out / f"kits-{tag}.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    (out / f"kits-{tag}.md").write_text(merge_docs([record]))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    try:
        if args.merge:
            sys.stdout.write(merge_files(args.merge))
            return 0
        if args.list:
            print(list_text())
            return 0
        flavours = ["stock"] if args.fit else parse_flavours(args.flavours)
        cases = shard(select_cases(args.kits), args.shard)
        if args.fit:
            cases = [c for c in cases if c.thresholds]
            if not cases:
                raise UsageError("--fit: none of the selected kit cases has thresholds")
        thresholds_doc = kc.load_thresholds(args.thresholds) if not args.fit else {"fitted": False, "cases": {}}
        if args.jobs < 1 or args.timeout <= 0:
            raise UsageError("--jobs and --timeout must be positive")
        return run(args, argv, cases, flavours, thresholds_doc)
    except (UsageError, kc.ThresholdsError) as exc:
        print(f"gpu_kits.py: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, argv: Sequence[str], cases: Sequence[kc.KitCase], flavours: Sequence[str],
        thresholds_doc: dict[str, Any]) -> int:
    t0 = time.monotonic()
    tag = args.tag or ("fit" if args.fit else "run") + (f"-{args.shard.replace('/', 'of')}" if args.shard else "")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Outside --out: the models and the tree copy are no record.
    work = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix=f"gpu-kits-{tag}-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"== setup: tiny models, kits target, data{', patched tree' if 'tree' in flavours else ''}", flush=True)
    setup = prepare(args, flavours, work)
    print(child_env.fa3_line(setup.fa3) + f"; attention backend {setup.backend}", flush=True)
    modules = preflight_modules(cases)
    with ThreadPoolExecutor(max_workers=len(flavours)) as pool:
        pre = dict(zip(flavours, pool.map(lambda f: run_preflight(setup, f, modules), flavours)))
    setup.preflight = pre
    setup.stand_in = {f: not p.get("datasets", True) for f, p in pre.items()}
    for f, p in pre.items():
        print(f"== preflight {f}: sglang {p.get('sglang_version')} from {p.get('sglang_file')}"
              + (f"; ERROR {p['error']}" if p.get("error") else "")
              + ("; datasets stand-in" if setup.stand_in.get(f) else "")
              + (f"; cannot import {sorted(p['import_errors'])}" if p.get("import_errors") else ""), flush=True)
    jobs = [Job(c, f) for c in cases for f in flavours]
    print(f"== {len(jobs)} jobs ({len(cases)} kit cases x {len(flavours)} flavours), {args.jobs} at a time", flush=True)

    def record_of(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
        env = records.run_environment(recorded_command(argv), round(time.monotonic() - t0, 1), setup.fa3)
        env.update(backend=setup.backend, jobs=args.jobs,
                   preflight={f: {k: p.get(k) for k in ("sglang_version", "datasets", "error")} for f, p in pre.items()})
        return build_record(cases, flavours, results, env, thresholds_doc, fit=args.fit)

    lock = threading.Lock()

    def on_result(results: list[dict[str, Any]]) -> None:
        with lock:
            write_outputs(out, tag, record_of(results))

    results = run_jobs(jobs, setup, thresholds_doc, fit=args.fit, parallel=args.jobs, timeout=args.timeout,
                       deadline=None if args.budget is None else t0 + args.budget, stagger=args.stagger,
                       gpus=child_env.visible_gpus(), on_result=on_result)
    record = record_of(results)
    write_outputs(out, tag, record)
    records.archive_logs(work, out / f"logs-{tag}.tar.gz")
    v = record["verdict"]
    print(f"== {v['outcome']}: {len(v['regressions'])} regressions, {len(v['incomplete'])} incomplete, "
          f"{len(v['stock_failures'])} tests failing on stock; record {out / f'kits-{tag}.md'}", flush=True)
    if args.fit:
        return write_fit(args, out, record, results)
    return 0 if v["outcome"] == "parity" else 1


def write_fit(args: argparse.Namespace, out: Path, record: dict[str, Any], results: Sequence[dict[str, Any]]) -> int:
    measured = {r["case"]: r["measured"] for r in results if r["flavour"] == "stock" and r.get("measured")}
    env = {k: record["environment"].get(k) for k in ("date", "gpu", "sglang", "torch", "backend", "fa3", "command")}
    try:
        doc = kc.fitted_document(measured, env, [kc.CASES_BY_NAME[c["name"]] for c in record["cases"]])
    except kc.ThresholdsError as exc:
        print(f"gpu_kits.py: fit failed: {exc}", file=sys.stderr)
        return 1
    try:  # a fit of some cases keeps the others' earlier fit
        old = kc.load_thresholds(args.thresholds)
    except kc.ThresholdsError:
        old = {}
    if old.get("fitted"):
        for key in ("cases", "measured"):
            doc[key] = {**(old.get(key) or {}), **doc[key]}
    text = json.dumps(doc, indent=2) + "\n"
    (out / "kits-thresholds.json").write_text(text)
    args.thresholds.write_text(text)
    print(f"== thresholds fitted: {out / 'kits-thresholds.json'} (and {args.thresholds}); commit it as "
          f"tests/gpu/kits/thresholds.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
