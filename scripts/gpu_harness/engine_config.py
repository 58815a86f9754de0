"""The configuration of an Engine: the ``sglang.Engine`` kwargs of the speculative setup every
harness runs, and what an Engine actually resolved (``get_server_info``, else its log)."""

from __future__ import annotations

from typing import Any, Sequence

from gpu_harness import logs

SPEC_STEPS = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
#: DeepSeek MTP as its users launch it (the e2e ``mla`` group, the benchmarks' ``deepseek`` model):
#: this algorithm and no draft path, so SGLang gives the draft the target's own directory and
#: loads the NextN layer from it; no attention backend and no piecewise-CUDA-graph switch.
NEXTN_ALGORITHM = "NEXTN"


def spec_launch(algorithm: str = "STANDALONE", draft: str | None = None,
                spec: Sequence[int] | None = None) -> dict[str, Any]:
    """The speculative part of a launch, as Engine kwargs: the draft path (None: none given, as
    for DeepSeek MTP), the algorithm and steps / topk / draft tokens (default ``SPEC_STEPS``)."""
    kw: dict[str, Any] = {} if draft is None else {"speculative_draft_model_path": draft}
    kw["speculative_algorithm"] = algorithm
    kw.update(SPEC_STEPS if spec is None else dict(zip(SPEC_STEPS, (int(x) for x in spec))))
    return kw


def server_flags(kwargs: dict[str, Any]) -> list[str]:
    """``sglang.launch_server`` flags for Engine kwargs, in their order: ``True`` a bare flag,
    ``False`` and None left out (SGLang's default)."""
    argv: list[str] = []
    for key, value in kwargs.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def spec_engine_kwargs(target: str, draft: str | None, *, algorithm: str = "STANDALONE",
                       backend: str | None = "triton", cuda_graph: bool = True, pcg: bool | None = False,
                       mem_fraction: float, seed: int = 0, cuda_graph_max_bs: int | None = None,
                       pcg_max_tokens: int | None = None, log_level: str = "info", **extra: Any) -> dict[str, Any]:
    """``sglang.Engine`` kwargs of a speculative-decoding run (spec v2, 3 steps, topk 1, 4 draft
    tokens, skip the tokenizer). ``backend`` ``default`` (or None) passes no attention backend
    and ``pcg`` None leaves piecewise CUDA graph alone: SGLang's own choices. ``draft`` None
    names no draft model: DeepSeek MTP, where SGLang loads the target's own NextN layer."""
    kw: dict[str, Any] = {"model_path": target, **spec_launch(algorithm, draft)}
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


def effective_config(engine: Any) -> dict[str, Any]:
    """The resolved server args of a running Engine (``get_server_info``); ``{"error": ...}``
    when it cannot say."""
    try:
        info = engine.get_server_info()
    except Exception as exc:  # informative only
        return {"error": repr(exc)[:300]}
    return {k: info.get(k) for k in EFFECTIVE_KEYS if k in info}


def config_label(effective: dict[str, Any] | None, *, requested_backend: str | None = None,
                 log_text: str = "") -> str:
    """``fa3, PCG on, page 1`` style: the backend an Engine used (its server args, else its log,
    else what was asked), piecewise CUDA graph on/off and the page size."""
    eff = effective or {}
    backend = eff.get("attention_backend") or logs.backend_from_log(log_text) or requested_backend or "?"
    if requested_backend in (None, "default") and backend != "default":
        backend = f"{backend} (SGLang's default)"
    pcg = eff.get("disable_piecewise_cuda_graph")
    parts = [backend, "PCG ?" if pcg is None else ("PCG off" if pcg else "PCG on")]
    if eff.get("page_size") is not None:
        parts.append(f"page {eff['page_size']}")
    return ", ".join(parts)
