"""apply / revert / status: the policy around the engine (modes, logging, strictness)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from sglang_futuremap_patch import _engine
from sglang_futuremap_patch._engine import Backport, PatchError, Verdict

ENV_VAR = "SGLANG_FUTUREMAP_PATCH"
MODES = ("off", "safe", "strict")
PREFIX = "sglang_futuremap_patch:"
#: ``Verdict.decision`` when SGLang itself does not import (a broken install, a CPU host).
UNAVAILABLE = "unavailable"

logger = logging.getLogger("sglang_futuremap_patch")


def read_mode(environ: dict[str, str] | None = None) -> str:
    """The mode from ``SGLANG_FUTUREMAP_PATCH``; an unknown value is an error, not a guess."""
    raw = (environ if environ is not None else os.environ).get(ENV_VAR, "safe")
    mode = raw.strip().lower() or "safe"
    if mode not in MODES:
        raise ValueError(f"{ENV_VAR}={raw!r} is not one of {', '.join(MODES)}")
    return mode


@dataclass
class Report:
    """What apply() or status() found, in a form the CLI and tests can read."""

    mode: str
    verdict: Verdict
    series: tuple[Backport, ...] = ()
    applied: list[str] = field(default_factory=list)

    @property
    def patched(self) -> bool:
        return bool(self.applied)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (``sglang-futuremap-patch status --json``)."""
        from sglang_futuremap_patch import __version__

        v = self.verdict
        return {
            "plugin_version": __version__,
            "sglang_version": v.sglang_version,
            "mode": self.mode,
            "verdict": v.decision,
            "reason": v.reason,
            "backports": [
                {
                    "id": bp.id,
                    "title": bp.title,
                    "upstream_prs": list(bp.upstream_prs),
                    "applied_upstream": bp.applied_upstream,
                    "patch": bp.patch_file,
                    "targets": [
                        {"path": c.target.path, "kind": c.target.kind, "expected": c.target.expected,
                         "state": c.state, "found": c.found, "detail": c.detail}
                        for c in v.checks.get(bp.id, [])
                    ],
                }
                for bp in self.series
            ],
        }


def _load(version: str) -> tuple[tuple[Backport, ...], Verdict]:
    early = _engine.version_verdict(version)
    if early is not None:
        return (), early
    try:
        from sglang_futuremap_patch.backports import load_series

        series = load_series()
    except Exception as exc:  # an edited SGLang that no longer imports the way we expect
        return (), Verdict(version, "mismatch", f"cannot load the back-ports: {type(exc).__name__}: {exc}")
    return series, _engine.gate(series, version)


def sglang_unavailable() -> Verdict | None:
    """The verdict when SGLang cannot be imported at all, else None."""
    problem = _engine.sglang_import_error()
    if problem is None:
        return None
    return Verdict("unknown", UNAVAILABLE, f"SGLang cannot be imported ({problem})")


def _detect(version: str | None) -> str | Verdict:
    """``version``, else the installed SGLang's, or the verdict when SGLang does not import."""
    if version:
        return version
    return sglang_unavailable() or _engine.sglang_version()


def status(version: str | None = None) -> Report:
    """Inspect the installed SGLang without changing it."""
    found = _detect(version)
    if isinstance(found, Verdict):
        return Report(read_mode_or_default(), found)
    series, verdict = _load(found)
    return Report(read_mode_or_default(), verdict, series, _engine.applied_backports())


def read_mode_or_default() -> str:
    try:
        return read_mode()
    except ValueError:
        return "invalid"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the plugin installs, then as it was, with what
    the install keeps left out of the count towards the next full collection.

    In SGLang's main process a full collection stops the API server's event loop for ~300-500
    ms. CPython runs one once the objects promoted into its oldest generation since the last one
    exceed a quarter of what that one kept, and counts every promoted object, dead or not.
    Installing imports SGLang's targets and reads, edits, parses and compiles their source:
    tens of thousands of short-lived containers and some thousands kept for good. Synthetic
    requests until the next full collection (``python3 scripts/main_process_heap.py
    --until-full``, CPU host): 17,845 without the plugin; 11,272 with it installed and the
    collector running; 16,382 with it paused (the garbage then goes by reference counting before
    any collection sees it), the rest being what the install keeps, promoted by the next
    collections like any young object. On 2 x H200 that still put the patched API servers' full
    collection at request 559-584, in the concurrency-48 cell, while stock's came after 627.
    So, where the collector was on, after the install every tracked object goes to the oldest
    generation uncounted (``gc.freeze`` then ``gc.unfreeze``: those moves leave CPython's count
    alone), unless something already froze objects (``unfreeze`` would give those back). The
    young generations are collected just before the install, so that this moves only what the
    install made: what SGLang made before it is promoted and counted as it would be anyway
    (without that, 18,372: later than stock). Then 17,772, stock's within 0.5%; on one pair of
    2 x H200 servers (Triton) the first full collection came at request 555 stock, 570 patched.
    Nothing is left uncollected: every full collection still sees all of it."""
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def apply(mode: str | None = None, version: str | None = None) -> Report:
    """Apply every back-port or none, and say so in one line per process.

    ``safe`` logs a WARNING and leaves SGLang untouched when anything is unexpected;
    ``strict`` raises :class:`PatchError` instead. ``version`` overrides the detected
    SGLang version (tests use it to pretend another release). The garbage collector is
    paused meanwhile (``collector_paused``).
    """
    with collector_paused():
        return _apply(mode, version)


def _apply(mode: str | None, version: str | None) -> Report:
    """``apply``'s work."""
    mode = read_mode() if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    found = _detect(version)
    version = found.sglang_version if isinstance(found, Verdict) else found
    if mode == "off":
        _engine.announce(logging.INFO, f"{PREFIX} disabled by {ENV_VAR}=off; SGLang {version} left untouched")
        return Report(mode, Verdict(version, "off", f"{ENV_VAR}=off"))
    series, verdict = ((), found) if isinstance(found, Verdict) else _load(version)
    report = Report(mode, verdict, series)
    if verdict.decision == "applied":
        report.applied = _engine.applied_backports()
        return report
    if verdict.decision == "upstream":
        _engine.announce(logging.INFO, f"{PREFIX} nothing to patch: {verdict.reason}")
        return report
    if verdict.decision == "patch":
        try:
            report.applied = _engine.install(series, verdict)
        except PatchError as exc:
            verdict.decision, verdict.reason = "failed", str(exc)
        else:
            names = ", ".join(f"{bp.id} ({bp.pr_list})" for bp in series)
            count = len(_engine.installed_paths())
            _engine.announce(
                logging.INFO,
                f"{PREFIX} applied {len(series)} back-ports ({count} targets) to SGLang "
                f"{version} [pid {os.getpid()}]: {names}",
            )
            return report
    message = f"{PREFIX} skipped, SGLang {version} left untouched: {verdict.reason}"
    if mode == "strict":
        raise PatchError(message)
    _engine.announce(logging.WARNING, message)
    return report


def revert() -> list[str]:
    """Restore every original object; returns the ids that were reverted."""
    ids = _engine.applied_backports()
    _engine.uninstall()
    if ids:
        logger.info("%s reverted %s", PREFIX, ", ".join(ids))
    return ids
