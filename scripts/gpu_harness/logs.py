"""What a harness reads from its children: SGLang's log lines (in :data:`LOG_FORMAT`, with level
and pid: :func:`logging_config`), the plugin's startup lines and anything that looks like a
plugin problem (:func:`scan_log`), and the records the probes of ``gpu_probe/`` write into a
run's probe folder (``probe-<pid>.json``: :func:`summarize_probe`; ``sync-<pid>.json``:
:func:`read_sync_records`, :func:`summarize_sync`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from gpu_harness import child_env

PLUGIN = "sglang_futuremap_patch"
LOG_FORMAT = "[%(asctime)s %(levelname)s pid=%(process)d] %(message)s"
SCHEDULER_TITLE = "sglang::scheduler"


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


def log_tail(text: str, lines: int = 30, width: int = 400) -> str:
    return "\n".join(ln[:width] for ln in text.splitlines()[-lines:])


# ----------------------------------------------------------------------------- SGLang's log

_LEVELED = re.compile(
    r"^\[(?P<ts>[^\]]*?) (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) pid=(?P<pid>\d+)\] (?P<msg>.*)$"
)
_PID_IN_MSG = re.compile(r"\[pid (\d+)\]")
_BAD_LEVELS = {"WARNING", "ERROR", "CRITICAL"}
#: The WARNING the plugin logs (on purpose) when it sends SGLang's auto-chosen tree to spec v1.
AUTO_TREE_MARK = "speculative decoding because the auto-chosen tree"
#: The INFO line the plugin logs when an EAGLE tree (topk > 1) runs on spec v2 (the overlap
#: scheduler) instead of spec v1.
TREE_V2_MARK = "spec v2 runs the EAGLE tree"
#: Stock SGLang 0.5.12.x's own line when an explicit tree (topk > 1) goes to spec v1.
STOCK_TREE_SPEC_V1_MARK = ("Spec v1 is used for eagle/eagle3/standalone speculative decoding because "
                           "spec v2 currently only supports topk = 1")
#: ``accept len`` of SGLang's periodic ``Decode batch`` line (speculative decoding only).
_ACCEPT_LEN = re.compile(r"Decode batch\b.*?\baccept len: (\d+(?:\.\d+)?)")


@dataclass
class LogFindings:
    applied_pids: list[int] = field(default_factory=list)
    applied_lines: int = 0
    disabled_lines: int = 0
    bad_lines: list[str] = field(default_factory=list)
    plugin_lines: list[str] = field(default_factory=list)
    #: Lines saying that an auto-chosen tree runs on spec v1 (back-port auto-tree-spec-v1).
    auto_tree_lines: int = 0
    #: Lines saying that an EAGLE tree runs on spec v2 (``TREE_V2_MARK``).
    tree_v2_lines: int = 0
    #: Stock SGLang's lines sending an explicit tree to spec v1 (``STOCK_TREE_SPEC_V1_MARK``).
    stock_tree_spec_v1_lines: int = 0
    #: The ``accept len`` of every ``Decode batch`` line, in log order.
    accept_lengths: list[float] = field(default_factory=list)

    @property
    def mean_accept_length(self) -> float | None:
        """Mean ``accept len`` over the ``Decode batch`` lines (None without any)."""
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else None


def scan_log(text: str) -> LogFindings:
    """Find the plugin's startup lines and anything that looks like a plugin problem.

    Lines are expected in ``LOG_FORMAT`` (level and pid). Plugin lines without a level
    (e.g. when the probe's log handler is off) are classified by their wording."""
    f = LogFindings()
    pids: set[int] = set()
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _LEVELED.match(line)
        level, msg = (m.group("level"), m.group("msg")) if m else (None, line)
        if "Failed to execute general plugin" in line or "Failed to load plugin" in line:
            f.bad_lines.append(line)
            continue
        accept = _ACCEPT_LEN.search(line)
        if accept:
            f.accept_lengths.append(float(accept.group(1)))
        f.tree_v2_lines += int(TREE_V2_MARK in line)
        f.stock_tree_spec_v1_lines += int(STOCK_TREE_SPEC_V1_MARK in line)
        if PLUGIN not in line:
            continue
        if f"{PLUGIN}: Spec v1 is used for " in line and AUTO_TREE_MARK in line:
            f.auto_tree_lines += 1
            continue
        if re.search(r'File ".*' + PLUGIN + r'[/\\]', line) or re.search(PLUGIN + r'[/\\]\S*\.py:\d+: \w*Warning', line):
            f.bad_lines.append(line)  # a traceback frame in, or a Python warning from, the plugin's code
            continue
        if level in _BAD_LEVELS:
            f.bad_lines.append(line)  # any WARNING+ line that mentions the plugin
            continue
        if f"{PLUGIN}:" not in line:
            continue  # e.g. "Available plugins" listings: the package name, not a message
        f.plugin_lines.append(line)
        body = msg[msg.find(f"{PLUGIN}:") :]
        if level is None and re.search(r"WARNING|ERROR|CRITICAL|Traceback|skipped|failed|revert", body):
            f.bad_lines.append(line)
            continue
        if body.startswith(f"{PLUGIN}: applied"):
            f.applied_lines += 1
            pm = _PID_IN_MSG.search(body)
            if pm:
                pids.add(int(pm.group(1)))
            elif m:
                pids.add(int(m.group("pid")))
        elif body.startswith(f"{PLUGIN}: disabled"):
            f.disabled_lines += 1
    f.applied_pids = sorted(pids)
    return f


_BACKEND_LINE = re.compile(r"Attention backend not specified\. Use (\w+) backend by default")


def backend_from_log(text: str) -> str | None:
    """The attention backend SGLang chose itself, from its start-up line."""
    m = _BACKEND_LINE.search(text)
    return m.group(1) if m else None


_TRIM_KEEP = re.compile(
    r"sglang_futuremap_patch|Traceback|Error|ERROR|CRITICAL|WARNING|Failed|FAILED|killed after|"
    r"^worker |^engine kwargs|smoke-probe|^\s+File \"", re.M)


def trim_log(text: str, max_lines: int = 60, tail: int = 15) -> str:
    """The lines of a run log worth keeping in a summary: plugin lines, errors, warnings,
    tracebacks and the worker's own lines (at most ``max_lines``), then the last ``tail``
    lines."""
    lines = text.splitlines()
    if len(lines) <= max_lines + tail:
        return "\n".join(ln[:400] for ln in lines)
    kept = [ln for ln in lines if _TRIM_KEEP.search(ln)]
    out = kept[:max_lines]
    if len(kept) > max_lines:
        out.append(f"... {len(kept) - max_lines} more matching lines")
    out.append(f"--- last {min(tail, len(lines))} of {len(lines)} lines ---")
    out.extend(lines[-tail:] if tail else [])
    return "\n".join(ln[:400] for ln in out)


# ----------------------------------------------------------------------------- probe records


@dataclass
class ProbeSummary:
    processes: list[dict[str, Any]]
    scheduler_pids: list[int]
    scheduler_calls: int  # calls of PROBE_FUNC in scheduler processes
    total_calls: int  # calls of PROBE_FUNC in every process
    mechanisms: list[str]
    #: Calls per probed function name in the scheduler processes (``SMOKE_PROBE_FUNCS`` may
    #: name more functions than PROBE_FUNC, e.g. the PD-decode cases' ``process_prebuilt``).
    scheduler_calls_by_name: dict[str, int] = field(default_factory=dict)


def _probe_calls(record: dict[str, Any], name: str = child_env.PROBE_FUNC) -> int:
    """Calls of ``name`` in one probe record (records without ``by_name`` probed only it)."""
    by_name = record.get("by_name")
    return int(by_name.get(name, 0)) if isinstance(by_name, dict) else int(record.get("total", 0))


def summarize_probe(records: Iterable[dict[str, Any]]) -> ProbeSummary:
    procs = []
    for r in records:
        procs.append(
            {
                "pid": r.get("pid"),
                "proctitle": r.get("proctitle"),
                "argv": r.get("argv"),
                "calls": _probe_calls(r),
                "by_name": dict(r.get("by_name") or {}),
                "by_qualname": r.get("by_qualname", {}),
                "mechanism": r.get("mechanism"),
            }
        )
    procs.sort(key=lambda p: p["pid"] or 0)
    sched = [p for p in procs if (p["proctitle"] or "").startswith(SCHEDULER_TITLE)]
    by_name: dict[str, int] = {}
    for p in sched:
        for name, n in p["by_name"].items():
            by_name[name] = by_name.get(name, 0) + int(n)
    return ProbeSummary(
        processes=procs,
        scheduler_pids=[p["pid"] for p in sched],
        scheduler_calls=sum(p["calls"] for p in sched),
        total_calls=sum(p["calls"] for p in procs),
        mechanisms=sorted({str(p["mechanism"]) for p in procs}),
        scheduler_calls_by_name=by_name,
    )


def _read_records(directory: Path, pattern: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob(pattern)):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a record being replaced, or cut short by a SIGKILL
    return out


def read_probe_dir(directory: Path) -> list[dict[str, Any]]:
    """The call-count probe's records in ``directory``, one per process (``probe-<pid>.json``)."""
    return _read_records(directory, "probe-*.json")


def read_sync_records(directory: Path) -> list[dict[str, Any]]:
    """The host-sync probes' records in ``directory``, one per process (``sync-<pid>.json``:
    ``gpu_probe/smoke_sync_probe.py`` or ``gpu_probe/bench_sync_probe.py``)."""
    return _read_records(directory, "sync-*.json")


#: The forward mode whose ``run_batch`` iterations the sync probe charges decode syncs to.
DECODE_MODE = "DECODE"


def _sync_scope(rows: Sequence[dict[str, Any]], iterations: int) -> dict[str, Any]:
    """Totals, per-iteration means and a per-site breakdown of sync rows over ``iterations``."""
    merged: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r["site"], r["op"], bool(r["seq_lens"]))
        m = merged.setdefault(key, {"site": r["site"], "op": r["op"], "seq_lens": bool(r["seq_lens"]),
                                    "count": 0, "blocked_s": 0.0, "seq_lens_tensor": 0})
        m["count"] += int(r.get("count", 0))
        m["blocked_s"] += float(r.get("blocked_s", 0.0))
        m["seq_lens_tensor"] += int(r.get("seq_lens_tensor", 0))
    n = iterations

    def per(x: float) -> float | None:
        return x / n if n else None

    sites = []
    for m in sorted(merged.values(), key=lambda m: (-m["count"], m["site"], m["op"])):
        sites.append(dict(m, per_iteration=per(m["count"]),
                          blocked_ms_per_iteration=per(m["blocked_s"] * 1e3),
                          mean_us=(m["blocked_s"] * 1e6 / m["count"]) if m["count"] else None))
    syncs = sum(m["count"] for m in merged.values())
    seq = sum(m["count"] for m in merged.values() if m["seq_lens"])
    blocked = sum(m["blocked_s"] for m in merged.values()) * 1e3
    seq_blocked = sum(m["blocked_s"] for m in merged.values() if m["seq_lens"]) * 1e3
    tensor_hits = sum(m["seq_lens_tensor"] for m in merged.values())
    return {
        "iterations": n,
        "syncs": syncs,
        "seq_lens_syncs": seq,
        "seq_lens_tensor_syncs": tensor_hits,
        "blocked_ms": blocked,
        "seq_lens_blocked_ms": seq_blocked,
        "per_iteration": {
            "syncs": per(syncs),
            "seq_lens_syncs": per(seq),
            "seq_lens_tensor_syncs": per(tensor_hits),
            "blocked_ms": per(blocked),
            "seq_lens_blocked_ms": per(seq_blocked),
        },
        "sites": sites,
    }


def summarize_sync(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate the sync probe's per-process records (only installed ones: schedulers).

    ``decode``: syncs charged to decode iterations (those opened by a ``run_batch`` of a
    DECODE batch) per decode iteration; ``all``: every sync after the first ``run_batch``
    per iteration of any mode."""
    recs = [r for r in records if r.get("kind") == "sync-probe" and r.get("installed")]
    iterations: dict[str, int] = {}
    bs_sum: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    async_d2h: dict[str, int] = {}
    errors: list[str] = []
    wrapped: set[str] = set()
    for r in recs:
        for k, v in (r.get("iterations") or {}).items():
            iterations[k] = iterations.get(k, 0) + int(v)
        for k, v in (r.get("batch_size_sum") or {}).items():
            bs_sum[k] = bs_sum.get(k, 0) + int(v)
        rows.extend(r.get("syncs") or [])
        for k, v in (r.get("async_d2h") or {}).items():
            async_d2h[k] = async_d2h.get(k, 0) + int(v)
        errors.extend(r.get("errors") or [])
        wrapped.update(r.get("wrapped") or [])
    n_dec = iterations.get(DECODE_MODE, 0)
    return {
        "pids": sorted(int(r.get("pid") or 0) for r in recs),
        "proctitles": sorted({str(r.get("proctitle")) for r in recs}),
        "wrapped": sorted(wrapped),
        "errors": errors,
        "iterations": iterations,
        "decode_iterations": n_dec,
        "mean_decode_batch_size": (bs_sum.get(DECODE_MODE, 0) / n_dec) if n_dec else None,
        "decode": _sync_scope([x for x in rows if x.get("mode") == DECODE_MODE], n_dec),
        "all": _sync_scope(rows, sum(iterations.values())),
        "async_d2h": async_d2h,
    }
