"""What a harness's child process (an Engine worker, a server, a kit test process) runs with.

* **Variants**: ``stock`` (``SGLANG_FUTUREMAP_PATCH=off``), ``patched`` (``strict``),
  ``patched-mla-mirror`` (``strict`` with back-port 18 turned off, ``SGLANG_FUTUREMAP_FA3_MLA=0``),
  ``upstream`` (stock SGLang of a second bundle, e.g. 0.5.13, whose site folder replaces the
  current SGLang's on ``PYTHONPATH``; the plugin is not installed there) and ``tree`` (a copy
  of the current ``sglang`` package with ``patches/`` applied, first on ``PYTHONPATH``; the
  plugin is off, :func:`build_tree_site`).
* **Environment** (:func:`subprocess_env`): plugin mode, the call-count / sync probes of
  ``gpu_probe/`` (its ``sitecustomize`` first on ``PYTHONPATH``), SGLang's log format (level and
  pid on every line), spec v2, ports, GPU pinning (:func:`visible_gpus`).
* **Probe modules** on this side (:func:`probe_module`): the pure helpers of ``gpu_probe/``.
* **FA3**: whether ``sgl_kernel.flash_ops`` imports in a child's environment, and which
  configurations need it (backend ``fa3``, or none given: SGLang picks FA3 on Hopper).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterable, Sequence

from gpu_harness import port_blocks

SCRIPTS = Path(__file__).resolve().parent.parent
PROBE_DIR = SCRIPTS / "gpu_probe"
#: Import stand-in for HuggingFace ``datasets`` (see its docstring): on the path of a child that
#: imports it (bench_serving, some kits) where the real one is missing.
DATASETS_STAND_IN = SCRIPTS.parent / "tests" / "gpu" / "kits" / "stand_ins"

ENV_MODE = "SGLANG_FUTUREMAP_PATCH"
PROBE_FUNC = "maybe_wait_verify_done"


def probe_module(name: str) -> ModuleType:
    """The module ``gpu_probe/<name>.py`` in this process (that folder is put on a child's
    ``PYTHONPATH``, not a package): loaded from its file once, under its own name, as its
    ``sitecustomize`` loads it in SGLang's processes. Importing one installs nothing."""
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, PROBE_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


# ----------------------------------------------------------------------------- variants

UPSTREAM_SITE_ENV = "SGLANG_UPSTREAM_SITE"
#: Where the 0.5.13 bundle (``.gpu-0513/activate.sh``) unpacks on the GPU machine.
DEFAULT_UPSTREAM_SITE = "/tmp/site312-0.5.13"


@dataclass(frozen=True)
class Variant:
    """One side of a comparison: an ``SGLANG_FUTUREMAP_PATCH`` value and, for ``upstream``,
    the site folder whose SGLang the Engine runs instead of the current one; for ``tree``,
    the folder (``overlay``) put first on ``PYTHONPATH`` in front of everything else; ``env``:
    the plugin's opt-in switches this side sets (:func:`with_variant_env`)."""

    name: str
    mode: str
    site: str | None = None
    overlay: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    @property
    def plugin_expected(self) -> str:
        """What the plugin must log: ``applied`` (patched), ``disabled`` (stock) or ``absent``
        (upstream: not installed in that site)."""
        if self.site is not None:
            return "absent"
        return "disabled" if self.mode == "off" else "applied"


#: Back-port 18's switch (``sglang_futuremap_patch.backports.fa3_mla_device_metadata``): ``0`` keeps
#: FA3 with MLA (DeepSeek MTP) on the host mirror; unset, MLA builds its spec-v2 metadata on the device.
FA3_MLA_ENV = "SGLANG_FUTUREMAP_FA3_MLA"
#: The ``patched-mla-mirror`` side's switches: back-port 18 off.
MLA_MIRROR_ENV = ((FA3_MLA_ENV, "0"),)
#: Plugin switches that a variant sets; every other variant runs without them.
VARIANT_SWITCHES = (FA3_MLA_ENV,)

STOCK = Variant("stock", "off")
PATCHED = Variant("patched", "strict")
VARIANT_NAMES = ("stock", "patched", "upstream", "tree", "patched-mla-mirror")
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
        elif name == "patched-mla-mirror":
            out.append(Variant(name, patched_mode, env=MLA_MIRROR_ENV))
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


def with_variant_env(env: dict[str, str], variant: Variant) -> dict[str, str]:
    """``env`` with the variant's switches set and the other ``VARIANT_SWITCHES`` removed: a
    ``patched`` side runs the plugin as it ships, whatever the caller's shell holds."""
    out = {k: v for k, v in env.items() if k not in VARIANT_SWITCHES}
    out.update(variant.env)
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


# ----------------------------------------------------------------------------- environment


def _split_path(value: str | None) -> list[str]:
    return [p for p in (value or "").split(os.pathsep) if p]


def pythonpath_for_site(pythonpath: str | None, site: str) -> str:
    """``PYTHONPATH`` with ``site`` first and every entry that holds another SGLang dropped."""
    keep = [p for p in _split_path(pythonpath)
            if os.path.abspath(p) != os.path.abspath(site) and not os.path.exists(os.path.join(p, "sglang", "__init__.py"))]
    return os.pathsep.join([site] + keep)


def subprocess_env(mode: str, probe_dir: Path, log_config: Path | None, *, sync_probe: bool = False,
                   seq_lens_sites: Sequence[str] | None = None, site: str | None = None,
                   ports: port_blocks.PortBlock | None = None, cuda_visible_devices: str | None = None,
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


def visible_gpus(limit: int | None = None) -> list[str]:
    """The GPU ids Engines may be pinned to: ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if env:
        ids = [x.strip() for x in env.split(",") if x.strip()]
    else:
        try:
            text = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            text = ""
        ids = [str(i) for i, line in enumerate(ln for ln in text.splitlines() if ln.startswith("GPU "))]
    ids = ids or ["0"]
    return ids[:limit] if limit else ids


def gpu_name() -> str | None:
    """The first GPU's name (nvidia-smi; no CUDA context in this process), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return names[0] if names else None


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
