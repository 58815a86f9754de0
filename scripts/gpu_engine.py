#!/usr/bin/env python3
"""The Engine layer of the GPU harness, shared by ``gpu_smoke.py``, ``gpu_e2e.py`` and
``bench_spec_v2.py``: what every Engine run needs, written once.

* **Variants**: ``stock`` (``SGLANG_FUTUREMAP_PATCH=off``), ``patched`` (``strict``),
  ``upstream`` (stock SGLang of a second bundle, e.g. 0.5.13, whose site folder replaces the
  current SGLang's on ``PYTHONPATH``; the plugin is not installed there) and ``tree`` (a copy
  of the current ``sglang`` package with ``patches/`` applied, first on ``PYTHONPATH``; the
  plugin is off, :func:`build_tree_site`).
* **Ports**: every Engine of a run gets a block of :data:`PORT_BLOCK` ports of its own
  (:class:`PortAllocator`), passed as ``port`` / ``nccl_port`` and ``SGLANG_PORT``. Without
  them each Engine asks the kernel for a free NCCL port and releases it before torch binds it,
  so Engines started side by side can pick the same one (seen: EADDRINUSE on an NCCL port).
* **Environment** of an Engine's process: plugin mode, the call-count / sync probes of
  ``gpu_probe/``, SGLang's log format (level and pid on every line), spec v2, GPU pinning.
* **Launch**: a worker subprocess in its own session, its log captured, killed with all its
  children after a timeout; what counts as a harness error (an Engine that did not start or
  did not finish) as opposed to a result.
* **Models**: the tiny model factory (``make_tiny_models.py``) and the EOS ids of a model.
* **FA3**: whether ``sgl_kernel.flash_ops`` imports in an Engine's environment, and which
  configurations need it (backend ``fa3``, or none given: SGLang picks FA3 on Hopper).
* **Engine kwargs** of the speculative configuration every harness runs, and the
  configuration an Engine actually resolved (``get_server_info``).

Ports SGLang 0.5.12.post1 / 0.5.13 derive from ``ServerArgs.port`` (``server_args.py``,
``PortArgs.init_new``): without DP attention the scheduler, detokenizer, tokenizer, RPC and
metrics channels are IPC files (no ports); ``nccl_port`` is the torch.distributed store (a free
port when not given: the race above); ``port + 1`` is the gRPC HTTP sidecar's default and
``port + 10000`` the gRPC port (checked to be <= 65535 at start-up even when gRPC is off);
``SGLANG_PORT`` is where ``get_open_port`` starts scanning for the TP message queue's port.
DP attention derives ``port + 13`` and ``port + 233 ..+237`` and is refused here.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

HERE = Path(__file__).resolve().parent
PROBE_DIR = HERE / "gpu_probe"
PLUGIN = "sglang_futuremap_patch"
ENV_MODE = "SGLANG_FUTUREMAP_PATCH"
PROBE_FUNC = "maybe_wait_verify_done"
LOG_FORMAT = "[%(asctime)s %(levelname)s pid=%(process)d] %(message)s"
SCHEDULER_TITLE = "sglang::scheduler"

# ----------------------------------------------------------------------------- variants

UPSTREAM_SITE_ENV = "SGLANG_UPSTREAM_SITE"
#: Where the 0.5.13 bundle (``.gpu-0513/activate.sh``) unpacks on the GPU machine.
DEFAULT_UPSTREAM_SITE = "/tmp/site312-0.5.13"


@dataclass(frozen=True)
class Variant:
    """One side of a comparison: an ``SGLANG_FUTUREMAP_PATCH`` value and, for ``upstream``,
    the site folder whose SGLang the Engine runs instead of the current one; for ``tree``,
    the folder (``overlay``) put first on ``PYTHONPATH`` in front of everything else."""

    name: str
    mode: str
    site: str | None = None
    overlay: str | None = None

    @property
    def plugin_expected(self) -> str:
        """What the plugin must log: ``applied`` (patched), ``disabled`` (stock) or ``absent``
        (upstream: not installed in that site)."""
        if self.site is not None:
            return "absent"
        return "disabled" if self.mode == "off" else "applied"


STOCK = Variant("stock", "off")
PATCHED = Variant("patched", "strict")
VARIANT_NAMES = ("stock", "patched", "upstream", "tree")
#: Where the ``tree`` variant's site is, when make_variants is not told.
TREE_SITE_ENV = "SGLANG_TREE_SITE"


def upstream_site(explicit: str | None = None) -> str:
    return explicit or os.environ.get(UPSTREAM_SITE_ENV) or DEFAULT_UPSTREAM_SITE


def make_variants(names: Iterable[str], *, patched_mode: str = "strict",
                  upstream: str | None = None, tree: str | None = None) -> list[Variant]:
    out = []
    for name in names:
        if name == "stock":
            out.append(STOCK)
        elif name == "patched":
            out.append(Variant("patched", patched_mode))
        elif name == "upstream":
            out.append(Variant("upstream", "off", upstream_site(upstream)))
        elif name == "tree":
            site = tree or os.environ.get(TREE_SITE_ENV)
            if not site:
                raise ValueError(f"the tree variant needs its site: build_tree_site(), then pass it or set {TREE_SITE_ENV}")
            out.append(Variant("tree", "off", overlay=site))
        else:
            raise ValueError(f"unknown variant {name!r}; choose from {list(VARIANT_NAMES)}")
    return out


def build_tree_site(out: Path, patches_dir: Path | None = None) -> Path:
    """The ``tree`` variant's site: a copy of this environment's ``sglang`` package at
    ``out/python/sglang`` with the series in ``patches/`` applied, patch by patch (``git apply``,
    else ``patch``; ``-p2``: the series names ``python/sglang/...``, this copy is wheel-shaped).
    Returns ``out/python``, the folder to put first on ``PYTHONPATH``."""
    import importlib.util
    import shutil

    from sglang_futuremap_patch.series_tools import series_patches

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("SGLang is not importable here: nothing to copy for the tree variant")
    site = out / "python"
    shutil.copytree(list(spec.submodule_search_locations)[0], site / "sglang",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(out))  # never a git repository around it
    for patch in series_patches(patches_dir):
        for cmd in (["git", "apply", "-p2", str(patch)], ["patch", "-p2", "--batch", "--forward", "-i", str(patch)]):
            try:
                proc = subprocess.run(cmd, cwd=site, env=env, capture_output=True, text=True)
            except FileNotFoundError:
                continue  # no git here: try patch
            if proc.returncode:
                raise RuntimeError(f"{patch.name} does not apply to {site / 'sglang'}: {(proc.stdout + proc.stderr).strip()[:400]}")
            break
        else:
            raise RuntimeError("neither git nor patch is installed: cannot apply the series")
    return site


def site_sglang_version(site: str | Path) -> str | None:
    """The SGLang version installed in a site folder (its ``_version.py`` or dist-info), or
    None when the folder holds no SGLang."""
    root = Path(site)
    if not (root / "sglang" / "__init__.py").exists():
        return None
    vfile = root / "sglang" / "_version.py"
    if vfile.exists():
        m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", vfile.read_text())
        if m:
            return m.group(1)
    for info in sorted(root.glob("sglang-*.dist-info")):
        return info.name[len("sglang-"):-len(".dist-info")]
    return "unknown"


def upstream_missing(variant: Variant) -> str | None:
    """Why an ``upstream`` variant cannot run (None: it can)."""
    if variant.site is None:
        return None
    if site_sglang_version(variant.site) is None:
        return (f"upstream site {variant.site} holds no SGLang (unpack it first: "
                f"bash scripts/gpu/stage_upstream.sh with .gpu-0513 sent along)")
    return None


# ----------------------------------------------------------------------------- ports

#: Ports per Engine: port, (port + 1: gRPC sidecar default), nccl_port, SGLANG_PORT and room
#: for get_open_port's upward scan.
PORT_BLOCK = 16
#: Block bases lie in [PORT_LO, PORT_HI): below the kernel's ephemeral range (32768+: ports
#: handed to outgoing connections, NCCL's bootstrap sockets among them), and with the derived
#: gRPC port (port + 10000) in [30000, 40000): <= 65535 and inside no block.
PORT_LO = 20000
PORT_HI = 30000
GRPC_OFFSET = 10000


@dataclass(frozen=True)
class PortBlock:
    base: int

    @property
    def port(self) -> int:
        return self.base

    @property
    def nccl_port(self) -> int:
        return self.base + 2

    @property
    def sglang_port(self) -> int:
        return self.base + 4

    @property
    def bound(self) -> tuple[int, ...]:
        """The ports an Engine (or server) of this block binds itself."""
        return (self.port, self.nccl_port, self.sglang_port)

    def ports(self) -> range:
        return range(self.base, self.base + PORT_BLOCK)

    def engine_kwargs(self) -> dict[str, int]:
        return {"port": self.port, "nccl_port": self.nccl_port}

    def env(self) -> dict[str, str]:
        return {"SGLANG_PORT": str(self.sglang_port)}

    def as_dict(self) -> dict[str, int]:
        return {"base": self.base, "port": self.port, "nccl_port": self.nccl_port,
                "sglang_port": self.sglang_port, "grpc_port": self.port + GRPC_OFFSET}


def port_is_free(port: int) -> bool:
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


class PortAllocator:
    """Hands out disjoint :class:`PortBlock` s, one per Engine, never the same block twice in a
    run. Starts at a random block (two harnesses on one machine rarely meet) and skips blocks
    whose ports something else holds. Thread-safe."""

    def __init__(self, lo: int = PORT_LO, hi: int = PORT_HI, *, rng: random.Random | None = None,
                 is_free: Callable[[int], bool] = port_is_free) -> None:
        self.bases = list(range(lo, hi - PORT_BLOCK + 1, PORT_BLOCK))
        if not self.bases:
            raise ValueError(f"no port block fits in [{lo}, {hi})")
        self.next = (rng or random.Random()).randrange(len(self.bases))
        self.is_free = is_free
        self.lock = threading.Lock()
        self.given: list[tuple[str, PortBlock]] = []

    def allocate(self, name: str = "") -> PortBlock:
        with self.lock:
            for _ in range(len(self.bases)):
                if len(self.given) >= len(self.bases):
                    break
                block = PortBlock(self.bases[self.next % len(self.bases)])
                self.next += 1
                if any(b == block for _, b in self.given):
                    continue
                if all(self.is_free(p) for p in block.bound):
                    self.given.append((name, block))
                    return block
            raise RuntimeError(f"no free port block left ({len(self.given)} handed out)")


def with_ports(kwargs: dict[str, Any], block: PortBlock) -> dict[str, Any]:
    """Engine kwargs with this block's ``port`` and ``nccl_port``.

    Data parallelism (``dp_size`` > 1) gets ``port`` only: SGLang's DP controller makes a
    ``PortArgs`` per DP rank, which hands every rank a fixed ``nccl_port`` as it is (their
    torch.distributed stores would collide); left to SGLang, each rank gets a free port of its
    own, held by the controller until every rank has one."""
    if kwargs.get("enable_dp_attention"):
        raise ValueError("DP attention derives ports outside the Engine's block (port + 13, port + 233..237)")
    ports = block.engine_kwargs()
    if int(kwargs.get("dp_size", 1)) > 1:
        ports.pop("nccl_port")
    return dict(kwargs, **ports)


# ----------------------------------------------------------------------------- environment


def logging_config() -> dict[str, Any]:
    """``SGLANG_LOGGING_CONFIG_PATH`` content: SGLang's own lines with level and pid."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"smoke": {"format": LOG_FORMAT, "datefmt": "%Y-%m-%d %H:%M:%S"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "smoke", "stream": "ext://sys.stderr"}},
        "root": {"level": "INFO", "handlers": ["stderr"]},
        "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
    }


def write_logging_config(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(logging_config()))
    return path


def _split_path(value: str | None) -> list[str]:
    return [p for p in (value or "").split(os.pathsep) if p]


def pythonpath_for_site(pythonpath: str | None, site: str) -> str:
    """``PYTHONPATH`` with ``site`` first and every entry that holds another SGLang dropped."""
    keep = [p for p in _split_path(pythonpath)
            if os.path.abspath(p) != os.path.abspath(site) and not os.path.exists(os.path.join(p, "sglang", "__init__.py"))]
    return os.pathsep.join([site] + keep)


def subprocess_env(mode: str, probe_dir: Path, log_config: Path | None, *, sync_probe: bool = False,
                   seq_lens_sites: Sequence[str] | None = None, site: str | None = None,
                   ports: PortBlock | None = None, cuda_visible_devices: str | None = None,
                   base: dict[str, str] | None = None, probe_funcs: Sequence[str] = (),
                   overlay: str | None = None) -> dict[str, str]:
    """The environment of an Engine's worker process (``base``: default ``os.environ``);
    ``probe_funcs``: functions the call-count probe counts besides :data:`PROBE_FUNC`;
    ``overlay``: a folder put first on ``PYTHONPATH`` (the ``tree`` variant's site)."""
    env = dict(os.environ if base is None else base)
    for k in ("SMOKE_SYNC_PROBE", "SMOKE_SYNC_SEQ_LENS_SITES", "SMOKE_HOST_PROFILE"):  # each run says what it wants
        env.pop(k, None)
    if sync_probe:
        env["SMOKE_SYNC_PROBE"] = "1"
        if seq_lens_sites:
            env["SMOKE_SYNC_SEQ_LENS_SITES"] = ",".join(seq_lens_sites)
    env[ENV_MODE] = mode
    path = env.get("PYTHONPATH")
    if site is not None:
        path = pythonpath_for_site(path, site)
    if overlay is not None:
        path = os.pathsep.join([overlay] + [p for p in _split_path(path) if p != overlay])
    env["PYTHONPATH"] = os.pathsep.join([str(PROBE_DIR)] + [p for p in _split_path(path) if p != str(PROBE_DIR)])
    env["SMOKE_PROBE_DIR"] = str(probe_dir)
    env["SMOKE_PROBE_FUNCS"] = ",".join([PROBE_FUNC] + [f for f in probe_funcs if f != PROBE_FUNC])
    env["SMOKE_PROBE_FLUSH_S"] = "0.5"
    env["SGLANG_ENABLE_SPEC_V2"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if log_config is not None:
        env["SGLANG_LOGGING_CONFIG_PATH"] = str(log_config)
    if ports is not None:
        env.update(ports.env())
    if cuda_visible_devices:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    return env


# ----------------------------------------------------------------------------- launch


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


def portable_command(script: str, argv: Sequence[str], hide: dict[str, str]) -> str:
    """A harness's command line as recorded: the folder after each option in ``hide`` replaced
    by its role (``{"--out": "OUT"}``), so that no machine path lands in a record."""
    out = [hide[argv[i - 1]] if i and argv[i - 1] in hide else a for i, a in enumerate(argv)]
    return shlex.join([script, *out])


def archive_logs(work: Path, path: Path) -> None:
    """Every ``*.log`` of a run's work folder into the ``.tar.gz`` at ``path``."""
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for log in sorted(work.glob("*.log")):
            tar.add(log, arcname=log.name)


def log_tail(text: str, lines: int = 30, width: int = 400) -> str:
    return "\n".join(ln[:width] for ln in text.splitlines()[-lines:])


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


# ----------------------------------------------------------------------------- models


def build_tiny_models(out: Path) -> dict[str, Path]:
    """The offline tiny models (``make_tiny_models.py``): ``target`` (with a tokenizer),
    ``draft`` (STANDALONE), ``eagle3``, ``eagle`` (EAGLE-1), and for multi-layer EAGLE
    ``mimov2`` (a MiMoV2 target with a tokenizer) and ``mimov2-mtp`` (its MTP draft)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from make_tiny_models import (DRAFT_DIRNAME, EAGLE3_DIRNAME, EAGLE_DIRNAME, MIMOV2_DIRNAME, MIMOV2_MTP_DIRNAME,
                                  TARGET_DIRNAME, make_models)

    make_models(out)
    return {"target": out / TARGET_DIRNAME, "draft": out / DRAFT_DIRNAME, "eagle3": out / EAGLE3_DIRNAME,
            "eagle": out / EAGLE_DIRNAME, "mimov2": out / MIMOV2_DIRNAME, "mimov2-mtp": out / MIMOV2_MTP_DIRNAME}


def model_config(model_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(model_dir) / "config.json").read_text())


def eos_token_ids(model_dir: str | Path) -> list[int]:
    """The EOS ids SGLang takes from a model's ``config.json`` (an id or a list)."""
    eos = model_config(model_dir).get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


# ----------------------------------------------------------------------------- FA3

FA3_ENV = "GPU_HARNESS_FA3"
NO_FA3 = "no FA3"
#: SGLang picks FA3 on Hopper when no attention backend is given (spec topk 1).
FA3_BACKENDS = frozenset({"fa3", "default"})
_FA3_CACHE: dict[tuple[str, str], bool] = {}
#: A module with a file: CPU hosts' import stand-ins (tests/cpu_shims) have none.
FA3_CHECK = "import sys, sgl_kernel.flash_ops as m; sys.exit(0 if getattr(m, '__file__', None) else 1)"


def needs_fa3(backend: str | None) -> bool:
    return backend is None or backend in FA3_BACKENDS


def fa3_available(env: dict[str, str] | None = None, *, python: str | None = None, timeout: float = 180) -> bool:
    """Whether ``sgl_kernel.flash_ops`` (FA3) imports in a process with this environment
    (``GPU_HARNESS_FA3=1/0`` in it decides instead). Cached per interpreter and ``PYTHONPATH``."""
    env = dict(os.environ if env is None else env)
    forced = env.get(FA3_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    python = python or sys.executable
    key = (python, env.get("PYTHONPATH", ""))
    if key not in _FA3_CACHE:
        env.pop("SMOKE_PROBE_DIR", None)  # no probe in the check
        try:
            r = subprocess.run([python, "-c", FA3_CHECK], env=env, capture_output=True, timeout=timeout)
            _FA3_CACHE[key] = r.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _FA3_CACHE[key] = False
    return _FA3_CACHE[key]


def fa3_line(have: bool) -> str:
    return "FA3: installed (sgl_kernel.flash_ops imports)" if have else "FA3: not installed (no sgl_kernel.flash_ops)"


# ----------------------------------------------------------------------------- Engine kwargs

SPEC_STEPS = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


def spec_engine_kwargs(target: str, draft: str, *, algorithm: str = "STANDALONE", backend: str | None = "triton",
                       cuda_graph: bool = True, pcg: bool | None = False, mem_fraction: float,
                       seed: int = 0, cuda_graph_max_bs: int | None = None, pcg_max_tokens: int | None = None,
                       log_level: str = "info", **extra: Any) -> dict[str, Any]:
    """``sglang.Engine`` kwargs of a speculative-decoding run (spec v2, 3 steps, topk 1, 4 draft
    tokens, skip the tokenizer). ``backend`` ``default`` (or None) passes no attention backend
    and ``pcg`` None leaves piecewise CUDA graph alone: SGLang's own choices."""
    kw: dict[str, Any] = {
        "model_path": target,
        "speculative_draft_model_path": draft,
        "speculative_algorithm": algorithm,
        **SPEC_STEPS,
    }
    if backend not in (None, "default"):
        kw["attention_backend"] = backend
    kw.update({"sampling_backend": "pytorch", "grammar_backend": "none", "skip_tokenizer_init": True})
    if pcg is not None:
        kw["disable_piecewise_cuda_graph"] = not pcg
    kw["disable_cuda_graph"] = not cuda_graph
    kw.update({"mem_fraction_static": mem_fraction, "log_level": log_level, "random_seed": seed})
    if cuda_graph and cuda_graph_max_bs:
        kw["cuda_graph_max_bs"] = cuda_graph_max_bs
    if pcg_max_tokens:  # a capture limit: no effect with piecewise CUDA graph off
        kw["piecewise_cuda_graph_max_tokens"] = int(pcg_max_tokens)
    kw.update(extra)
    return kw


#: Server args worth recording: what the Engine really ran with.
EFFECTIVE_KEYS = (
    "attention_backend", "decode_attention_backend", "prefill_attention_backend", "page_size",
    "disable_piecewise_cuda_graph", "piecewise_cuda_graph_max_tokens", "disable_cuda_graph", "cuda_graph_bs",
    "cuda_graph_max_bs", "max_running_requests", "disable_overlap_schedule", "disable_radix_cache",
    "chunked_prefill_size", "context_length", "enable_deterministic_inference", "speculative_algorithm",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "max_total_num_tokens",
    "mem_fraction_static", "port", "nccl_port", "version",
)
_BACKEND_LINE = re.compile(r"Attention backend not specified\. Use (\w+) backend by default")


def effective_config(engine: Any) -> dict[str, Any]:
    """The resolved server args of a running Engine (``get_server_info``); ``{"error": ...}``
    when it cannot say."""
    try:
        info = engine.get_server_info()
    except Exception as exc:  # informative only
        return {"error": repr(exc)[:300]}
    return {k: info.get(k) for k in EFFECTIVE_KEYS if k in info}


def backend_from_log(text: str) -> str | None:
    """The attention backend SGLang chose itself, from its start-up line."""
    m = _BACKEND_LINE.search(text)
    return m.group(1) if m else None


def config_label(effective: dict[str, Any] | None, *, requested_backend: str | None = None,
                 log_text: str = "") -> str:
    """``fa3, PCG on, page 1`` style: the backend an Engine used (its server args, else its log,
    else what was asked), piecewise CUDA graph on/off and the page size."""
    eff = effective or {}
    backend = eff.get("attention_backend") or backend_from_log(log_text) or requested_backend or "?"
    if requested_backend in (None, "default") and backend != "default":
        backend = f"{backend} (SGLang's default)"
    pcg = eff.get("disable_piecewise_cuda_graph")
    parts = [backend, "PCG ?" if pcg is None else ("PCG off" if pcg else "PCG on")]
    if eff.get("page_size") is not None:
        parts.append(f"page {eff['page_size']}")
    return ", ".join(parts)


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


def gpu_name() -> str | None:
    """The first GPU's name (nvidia-smi; no CUDA context in this process), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return names[0] if names else None
