"""What goes into a harness's records: a check and its verdict (:class:`Check`), the run's
environment and command line without machine folders (:func:`run_environment`,
:func:`portable_command`), quantiles of measured values, the run's Engine logs as one archive."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from gpu_harness import child_env


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def run_environment(command: str, wall_s: float, fa3: bool | None = None) -> dict[str, Any]:
    """Date, command, versions, GPU and FA3 of a run; no CUDA context in this process (it is
    written while Engines run)."""
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, Any] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            "command": command, "wall_s": wall_s, "fa3": fa3, "gpu": child_env.gpu_name()}
    for name in ("torch", "sglang"):
        try:
            info[name] = version(name)
        except PackageNotFoundError:
            info[name] = None
    return info


def portable_command(script: str, argv: Sequence[str], hide: dict[str, str]) -> str:
    """A harness's command line as recorded: the folder after each option in ``hide`` replaced
    by its role (``{"--out": "OUT"}``), so that no machine path lands in a record."""
    out = [hide[argv[i - 1]] if i and argv[i - 1] in hide else a for i, a in enumerate(argv)]
    return shlex.join([script, *out])


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` with linear interpolation (numpy's default)."""
    vals = sorted(values)
    if not vals:
        raise ValueError("no values")
    pos = (len(vals) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def archive_logs(work: Path, path: Path) -> None:
    """Every ``*.log`` of a run's work folder into the ``.tar.gz`` at ``path``."""
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for log in sorted(work.glob("*.log")):
            tar.add(log, arcname=log.name)
