#!/usr/bin/env python3
"""SGLang's own regression kits on its own server fixtures, with the offline tiny models: the
catalogue and everything a kit run needs before a server starts. ``gpu_kits.py`` runs it;
``tests/gpu/kits/test_sglang_kits.py`` turns one job into a unittest class.

SGLang 0.5.12.x ships reusable test *kits* (``sglang.test.kits``: mixins with ``test_*``
methods, or functions) and server *fixtures* (``sglang.test.server_fixtures``: ``setUpClass``
launches ``sglang serve`` for a model path). A :class:`KitCase` pairs kits with a fixture, a
speculative algorithm and the server arguments the kit needs; :func:`build_test_class`
subclasses the real fixture with the tiny models, this job's port, backend and thresholds.

What is ours, and why:

* **The kits' target** (:func:`write_kits_model`): the tiny target's weights and config with a
  byte-level BPE tokenizer of the same 4096 ids. The factory's word-level tokenizer maps every
  English word to one unknown id, so the kits' prompts, stop strings and grammars (JSON, regex,
  EBNF: ``user@example.com``, digits, quotes) could not be spelled. The weights, and so the
  token ids the models see and produce, are the factory's.
* **Data the kits would download** (:func:`write_kits_data`): the KL kit's prompts (its
  LongBench cache file, token ids drawn here) and a ShareGPT-shaped file for the cache-hit kit.
* **Knobs** the kits expose for their server (e.g. ``abort_all_max_new_tokens``), set to fit the
  tiny models' 4096-token context as SGLang's own tests set them for theirs.
* **Thresholds** that assume a real model (accept length, speed, KL divergence) are fitted to
  the tiny models once, on stock SGLang (``gpu_kits.py --fit``), and kept in
  ``tests/gpu/kits/thresholds.json``; until then the kits run with thresholds that cannot fail
  and the record says so.

Kit modules and fixtures that cannot apply to random-weight tiny models are listed in
:data:`NOT_APPLICABLE_KITS` / :data:`NOT_APPLICABLE_FIXTURES` with the reason; single test
methods that judge what a trained model knows are skipped with theirs (``KitCase.not_applicable``).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import sys
import unittest
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_harness import engine_config, model_factory  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KITS_TEST_MODULE = ROOT / "tests" / "gpu" / "kits" / "test_sglang_kits.py"
THRESHOLDS_FILE = ROOT / "tests" / "gpu" / "kits" / "thresholds.json"
#: The job a kit test process runs (a JSON file, written by gpu_kits.py).
JOB_ENV = "SGLANG_KITS_JOB"
KITS_PACKAGE = "sglang.test.kits"
FIXTURES_PACKAGE = "sglang.test.server_fixtures"

#: The speculative configuration of every GPU harness here (engine_config.SPEC_STEPS) as flags.
SPEC_FLAGS = tuple((f"--{k.replace('_', '-')}", v) for k, v in engine_config.SPEC_STEPS.items())
#: Memory: a large static fraction (SGLang sizes the KV pool from the free memory it measured
#: before loading, so servers starting side by side need headroom) capped by max_total_tokens.
MEM_FRACTION_STATIC = 0.2
MAX_TOTAL_TOKENS = 65536
CUDA_GRAPH_MAX_BS = 8
PCG_MAX_TOKENS = 512
CONTEXT_LEN = 4096  # the tiny models' max_position_embeddings
#: Server environment of every flavour: both spec-v2 detections (NaN logits, out-of-range
#: token ids). No retries of failed tests (CustomTestCase retries once in SGLang's CI). Not HF_HUB_OFFLINE:
#: popen_launch_server launches a server that failed under it a second time, online.
SERVER_ENV = (("SGLANG_SPEC_NAN_DETECTION", "1"), ("SGLANG_SPEC_OOB_DETECTION", "1"), ("SGLANG_TEST_MAX_RETRY", "0"))


# ----------------------------------------------------------------------------- catalogue


@dataclass(frozen=True)
class Fixture:
    """A server fixture: its module and class, and how a subclass feeds it the server."""

    module: str  # under sglang.test.server_fixtures
    cls: str
    #: test methods the fixture itself defines that cannot apply, with the reason
    not_applicable: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.module.removesuffix("_fixture")


_GSM8K = "GSM8K accuracy: downloads the dataset and needs a trained model (random tiny weights score ~0)"
FIXTURES: dict[str, Fixture] = {f.name: f for f in (
    Fixture("default_fixture", "DefaultServerBase"),
    Fixture("eagle_fixture", "EagleServerBase"),
    Fixture("standalone_fixture", "StandaloneServerBase", (("test_gsm8k", _GSM8K),)),
    Fixture("pcg_spec_fixture", "PCGSpecBase", (("test_gsm8k", _GSM8K),)),
    Fixture("streaming_session_fixture", "StreamingSessionServerBase"),
)}

NOT_APPLICABLE_FIXTURES: dict[str, str] = {
    "disaggregation_fixture": "prefill/decode disaggregation: two GPUs, an RDMA transfer backend (mooncake) and "
                              "sglang_router",
    "hybrid_attn_backend_fixture": "launches the hard-coded DEFAULT_TARGET_MODEL_EAGLE checkpoint when speculative; "
                                   "its one test is GSM8K accuracy",
    "mmmu_fixture": "vision-language models only (MMMU)",
    "ngram_fixture": "NGRAM has no spec-v2 (overlap) worker in 0.5.12.x, so no back-port runs; its one pairing is "
                     "GSM8K accuracy",
}

NOT_APPLICABLE_KITS: dict[str, str] = {
    "eval_accuracy_kit": "GSM8K/MMLU/HumanEval/MGSM accuracy: downloads the datasets and needs a trained model",
    "lm_eval_kit": "lm-evaluation-harness scores against a model's reference values (lm_eval is not installed; "
                   "random weights have none)",
    "mmmu_vlm_kit": "MMMU accuracy of vision-language models through lmms-eval",
    "prefix_cache_branching_kit": "for hybrid (Mamba / linear-attention) caches that keep state only at branch "
                                  "points: a plain radix cache already hits on the second request, which the kit "
                                  "asserts against",
    "radix_cache_server_kit": "draws token ids up to 32000 and prompts of several thousand tokens: the tiny "
                              "models have 4096 ids and a 4096-token context (gpu_e2e.py's radix cases cover it)",
    "reasoning_kit": "needs a reasoning parser's think tokens in the vocabulary and a chat template with "
                     "enable_thinking",
}

_KNOWS = "judges what a trained model knows"
_SANITY_NA = (
    ("test_capital_france", _KNOWS), ("test_basic_math", _KNOWS), ("test_color_completion", _KNOWS),
    ("test_concurrent_requests", f"{_KNOWS} (eight capitals)"),
    ("test_streaming_response", f"{_KNOWS} ('paris' in the streamed text)"),
    ("test_ascii_ratio", "judges output quality (printable share of random tokens)"),
    ("test_no_repetition_blowup", "judges output quality (random weights may loop)"),
    ("test_long_prompt", "an ~18,000-token prompt: the tiny models' context is 4096"),
)


@dataclass(frozen=True)
class KitCase:
    """One server and the kits run against it."""

    name: str
    #: ``module.Mixin`` for a kit class, ``module.function`` for a kit function (a test method
    #: of ours calls it: :data:`FUNCTION_KITS`)
    kits: tuple[str, ...]
    fixture: str  # a key of FIXTURES
    algorithm: str  # EAGLE3 | STANDALONE
    server_args: tuple[Any, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    #: kit knobs (class attributes), fitted to the tiny models' limits, not measured
    knobs: tuple[tuple[str, Any], ...] = ()
    #: kit class attributes that assume a real model: fitted on stock (thresholds.json)
    thresholds: tuple[str, ...] = ()
    not_applicable: tuple[tuple[str, str], ...] = ()
    pcg: bool = False  # piecewise CUDA graph on (off elsewhere: it adds a minute to start-up)
    data: tuple[str, ...] = ()  # "kl-prompts", "sharegpt"

    @property
    def kit_modules(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k.split(".")[0] for k in self.kits))

    @property
    def class_name(self) -> str:
        return "Test" + "".join(part.capitalize() for part in re.split(r"[-_]", self.name))


SPEC_THRESHOLDS = ("accept_length_thres", "bs_1_speed_thres")
KL_THRESHOLDS = ("kl_div_thres_prefill", "kl_div_thres_decode")

KIT_CASES: tuple[KitCase, ...] = (
    # Heavy ones first: the runner starts jobs in this order.
    KitCase("pcg-spec", ("spec_decoding_kit.SpecDecodingMixin", "server_sanity_kit.ServerSanityMixin"), "pcg_spec",
            "STANDALONE", pcg=True, thresholds=SPEC_THRESHOLDS, not_applicable=_SANITY_NA),
    # SGLang's own EAGLE3 spec-v2 streaming-session configuration (retract, page 256). Its
    # abort-recovery tests ask for 100,000 new tokens (a 128k-context model): truncated to fit.
    KitCase("streaming-session", ("streaming_session_kit.StreamingSessionKitMixin",), "streaming_session", "EAGLE3",
            ("--chunked-prefill-size", 4096, "--page-size", 256, "--allow-auto-truncate"),
            env=(("SGLANG_TEST_RETRACT", "1"),)),
    KitCase("abort-leak", ("streaming_session_kit.AbortLeakReproKitMixin",), "streaming_session", "EAGLE3",
            ("--chunked-prefill-size", 4096, "--context-length", 512, "--page-size", 256,
             "--max-running-requests", 32)),
    KitCase("kl-divergence", ("kl_divergence_kit.KLDivergenceMixin",), "default", "EAGLE3",
            thresholds=KL_THRESHOLDS, data=("kl-prompts",)),
    KitCase("cache-hit", ("cache_hit_kit.run_multiturn_cache_hit_test",), "eagle", "EAGLE3", data=("sharegpt",)),
    KitCase("abort-all", ("abort_timeout_kit.AbortAllMixin",), "eagle", "EAGLE3", ("--max-running-requests", 8),
            knobs=(("abort_all_max_new_tokens", 4000),)),
    KitCase("waiting-timeout", ("abort_timeout_kit.WaitingTimeoutMixin",), "eagle", "EAGLE3",
            ("--max-running-requests", 1), env=(("SGLANG_REQ_WAITING_TIMEOUT", "0.001"),)),
    KitCase("running-timeout", ("abort_timeout_kit.RunningTimeoutTwoWaveMixin",), "eagle", "EAGLE3",
            ("--max-running-requests", 16), env=(("SGLANG_REQ_RUNNING_TIMEOUT", "3"),)),
    KitCase("spec-eagle3", ("spec_decoding_kit.SpecDecodingMixin",), "eagle", "EAGLE3", thresholds=SPEC_THRESHOLDS),
    KitCase("spec-standalone", ("spec_decoding_kit.SpecDecodingMixin",), "standalone", "STANDALONE",
            thresholds=SPEC_THRESHOLDS),
    KitCase("json", ("json_constrained_kit.JSONConstrainedMixin",), "standalone", "STANDALONE"),
    KitCase("regex", ("regex_constrained_kit.RegexConstrainedMixin",), "standalone", "STANDALONE"),
    KitCase("ebnf", ("ebnf_constrained_kit.EBNFConstrainedMixin",), "standalone", "STANDALONE"),
    KitCase("matched-stop", ("matched_stop_kit.MatchedStopMixin",), "default", "STANDALONE"),
    KitCase("pause", ("pause_generation_kit.PauseResumeInPlaceMixin",), "default", "STANDALONE",
            knobs=(("pause_max_new_tokens", 3000),)),
    KitCase("sanity", ("server_sanity_kit.ServerSanityMixin",), "default", "EAGLE3", not_applicable=_SANITY_NA),
)
CASES_BY_NAME = {c.name: c for c in KIT_CASES}


class MultiturnCacheHitTests:
    """The cache-hit kit is a function: SGLang's own tests call it from a test method, so do we.
    Multi-turn rounds; the kit asserts each turn's cached tokens against the previous turn."""

    def test_multiturn_cache_hit(self) -> None:
        from sglang.test.kits.cache_hit_kit import run_multiturn_cache_hit_test

        metrics = run_multiturn_cache_hit_test(base_url=self.base_url, model_path=self.model,
                                               dataset_path=str(Path(self.kits_data_dir) / SHAREGPT_FILE))
        self.assertGreater(metrics["overall"]["total_cached_tokens"], 0, "no cache hit at all")
        self.assertIsNone(self.process.poll(), "the server died")


FUNCTION_KITS: dict[str, type] = {"cache_hit_kit.run_multiturn_cache_hit_test": MultiturnCacheHitTests}


# ----------------------------------------------------------------------------- the kits' target


#: Characters whose pairs become merged tokens after the 256 byte tokens (order: frequency-ish).
_MERGE_CHARS = (" etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789"
                ".,:;!?'\"-()[]{}<>/\\@#$%^&*_+=|~`\n\t")
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def _byte_symbols() -> dict[int, str]:
    """Byte -> the printable character byte-level BPE stands it for (GPT-2's table)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_level_vocab(size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of a byte-level BPE tokenizer with exactly ``size`` ids: the three
    special tokens, the 256 bytes, then pairs of common characters (two-byte merges)."""
    sym = _byte_symbols()
    vocab = {t: i for i, t in enumerate(model_factory.SPECIAL_TOKENS)}
    vocab.update({sym[b]: len(model_factory.SPECIAL_TOKENS) + b for b in range(256)})
    chars = [sym[ord(c)] for c in _MERGE_CHARS]
    merges: list[tuple[str, str]] = []
    for a in chars:
        for b in chars:
            if len(vocab) >= size:
                return vocab, merges
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    raise ValueError(f"{size} ids need more merge characters than {len(chars)}")


def write_kits_model(target: Path, out: Path) -> Path:
    """``out``: the tiny target (config and weights copied) with a byte-level BPE tokenizer
    of the same vocabulary size and a plain chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    config = model_factory.model_config(target)
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(target.iterdir()):
        if path.suffix in (".json", ".safetensors") and not path.name.startswith("tokenizer"):
            shutil.copy2(path, out / path.name)
    vocab, merges = byte_level_vocab(int(config["vocab_size"]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in model_factory.SPECIAL_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    pad, bos, eos = model_factory.SPECIAL_TOKENS
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": CONTEXT_LEN, "pad_token": pad,
        "bos_token": bos, "eos_token": eos, "add_bos_token": False, "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    return out


# ----------------------------------------------------------------------------- data the kits would download

SHAREGPT_FILE = "sharegpt-synthetic.json"
#: sglang.test.kl_test_utils' cache file name for a tokenizer path (its get_input_ids).
KL_CACHE_NAME = "input_ids_{safe}_{tokens}_{samples}.json"
KL_PROMPT_TOKENS = 3000  # kl_test_utils.DEFAULT_PROMPT_TOKENS: part of the file name
KL_SAMPLES = 48  # kl_test_utils.DEFAULT_NUM_SAMPLES
_WORDS = ("the river bank holds seven quiet stones while a patient heron waits for morning light "
          "and every traveller counts the bridges between old markets and new harbours").split()


def kl_cache_file(data_dir: Path, model: str) -> Path:
    safe = model.replace("/", "_").replace("\\", "_")
    return data_dir / KL_CACHE_NAME.format(safe=safe, tokens=KL_PROMPT_TOKENS, samples=KL_SAMPLES)


def write_kits_data(data_dir: Path, model: str, vocab_size: int, seed: int = 20261123) -> list[Path]:
    """The KL kit's prompt cache (token ids, 300-1200 per prompt) and a ShareGPT-shaped file
    of word prompts for the cache-hit kit; deterministic."""
    rng = random.Random(seed)
    data_dir.mkdir(parents=True, exist_ok=True)
    prompts = [[rng.randrange(len(model_factory.SPECIAL_TOKENS), vocab_size) for _ in range(rng.randint(300, 1200))]
               for _ in range(KL_SAMPLES)]
    kl = kl_cache_file(data_dir, model)
    kl.write_text(json.dumps(prompts))

    def text(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n))

    convs = [{"conversations": [{"from": "human", "value": text(rng.randint(40, 160))},
                                {"from": "gpt", "value": text(rng.randint(20, 80))}]} for _ in range(64)]
    share = data_dir / SHAREGPT_FILE
    share.write_text(json.dumps(convs))
    return [kl, share]


# ----------------------------------------------------------------------------- a job's server


@dataclass(frozen=True)
class ServerPlan:
    """What one kit job's server gets: models, port, backend."""

    model: str  # the kits' target (byte-level tokenizer)
    draft: str  # the draft for the case's algorithm
    port: int
    nccl_port: int
    backend: str  # triton | fa3 | flashinfer | default (none given)
    data_dir: str = ""
    thresholds: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def spec_args(case: KitCase, plan: ServerPlan) -> list[Any]:
    out: list[Any] = ["--speculative-algorithm", case.algorithm, "--speculative-draft-model-path", plan.draft]
    for flag, value in SPEC_FLAGS:
        out += [flag, value]
    return out


def common_args(case: KitCase, plan: ServerPlan) -> list[Any]:
    """Arguments every kit server gets besides the speculative ones and the memory fraction."""
    out: list[Any] = []
    if plan.backend != "default":
        out += ["--attention-backend", plan.backend]
    if case.pcg:
        out += ["--piecewise-cuda-graph-max-tokens", PCG_MAX_TOKENS]
    else:
        out += ["--disable-piecewise-cuda-graph"]
    out += ["--cuda-graph-max-bs", CUDA_GRAPH_MAX_BS, "--max-total-tokens", MAX_TOTAL_TOKENS,
            "--nccl-port", plan.nccl_port]
    return out + list(case.server_args)


def _is_flag(token: Any) -> bool:
    return isinstance(token, str) and token.startswith("--")


def arg_pairs(args: Sequence[Any]) -> list[tuple[str, Any]]:
    """``--flag value`` / ``--flag=value`` / ``--switch`` tokens as (flag, value or None)."""
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not _is_flag(token):
            raise ValueError(f"{token!r} follows no flag in {list(args)}")
        if "=" in token:
            flag, value = token.split("=", 1)
            out.append((flag, value))
            i += 1
        elif i + 1 < len(args) and not _is_flag(args[i + 1]):
            out.append((token, args[i + 1]))
            i += 2
        else:
            out.append((token, None))
            i += 1
    return out


def merge_args(base: Sequence[Any], extra: Sequence[Any]) -> list[Any]:
    """``base`` with each flag of ``extra`` given ``extra``'s value in place (so that every
    flag appears once), and ``extra``'s other flags appended."""
    new = dict(arg_pairs(extra))
    out: list[Any] = []
    for flag, value in arg_pairs(base):
        value = new.pop(flag, value)
        out += [flag] if value is None else [flag, value]
    for flag, value in new.items():
        out += [flag] if value is None else [flag, value]
    return out


def fixture_attributes(case: KitCase, plan: ServerPlan) -> dict[str, Any]:
    """Class attributes that make the case's fixture launch our server (its launch code is
    SGLang's: these are the knobs it reads)."""
    fx = FIXTURES[case.fixture]
    attrs: dict[str, Any] = {"model": plan.model, "base_url": plan.url}
    mem = ["--mem-fraction-static", MEM_FRACTION_STATIC]
    if fx.name == "default":
        attrs["other_args"] = spec_args(case, plan) + mem + common_args(case, plan)
    elif fx.name == "eagle":
        attrs.update(target_model=plan.model, draft_model=plan.draft, spec_algo=case.algorithm,
                     spec_steps=dict(SPEC_FLAGS)["--speculative-num-steps"],
                     spec_topk=dict(SPEC_FLAGS)["--speculative-eagle-topk"],
                     spec_tokens=dict(SPEC_FLAGS)["--speculative-num-draft-tokens"],
                     mem_fraction_static=MEM_FRACTION_STATIC, extra_args=common_args(case, plan))
    elif fx.name == "standalone":
        # Its get_server_args names DEFAULT_DRAFT_MODEL_STANDALONE and a 0.7 memory fraction
        # itself: _StandaloneArgs.get_server_args gives those flags our values.
        if plan.backend == "default":
            raise ValueError("the standalone fixture needs an attention backend by name")
        attrs.update(draft_model=plan.draft, attention_backend=plan.backend,
                     speculative_num_steps=dict(SPEC_FLAGS)["--speculative-num-steps"],
                     speculative_eagle_topk=dict(SPEC_FLAGS)["--speculative-eagle-topk"],
                     speculative_num_draft_tokens=dict(SPEC_FLAGS)["--speculative-num-draft-tokens"],
                     kits_args=spec_args(case, plan) + mem + common_args(case, plan))
    elif fx.name == "pcg_spec":
        attrs["server_args"] = spec_args(case, plan) + mem + common_args(case, plan)
    elif fx.name == "streaming_session":
        attrs["extra_args"] = spec_args(case, plan) + mem + common_args(case, plan)
    else:  # pragma: no cover - FIXTURES and this function are kept in step by the tests
        raise ValueError(f"no way to feed fixture {fx.name}")
    return attrs


def _not_applicable_method(reason: str) -> Any:
    @unittest.skip(f"not applicable: {reason}")
    def skipped(self: Any) -> None:  # pragma: no cover - never runs
        pass

    return skipped


class _KitsServer:
    """First in a kit class's bases: pins the fixture's URL to this job's port (EagleServerBase
    and PCGSpecBase read ``DEFAULT_URL_FOR_TEST`` of their module in ``setUpClass``) and
    points the KL kit at our prompt cache."""

    kits_fixture_module = ""
    kits_data_dir = ""
    kits_case = ""

    @classmethod
    def setUpClass(cls) -> None:
        module = sys.modules[cls.kits_fixture_module]
        saved = getattr(module, "DEFAULT_URL_FOR_TEST", None)
        module.DEFAULT_URL_FOR_TEST = cls.base_url
        if "kl-prompts" in CASES_BY_NAME[cls.kits_case].data:
            import sglang.test.kl_test_utils as kl

            kl.CACHE_DIR = cls.kits_data_dir
        url = cls.base_url
        try:
            super().setUpClass()  # type: ignore[misc]
        finally:
            module.DEFAULT_URL_FOR_TEST = saved
        cls.base_url = url


class _StandaloneArgs:
    """StandaloneServerBase builds its argument list itself: ours take the place of its values."""

    kits_args: list[Any] = []

    @classmethod
    def get_server_args(cls) -> list[Any]:
        return merge_args(super().get_server_args(), cls.kits_args)  # type: ignore[misc]


def resolve_kits(case: KitCase) -> list[type]:
    """The kit mixins of a case (importing their modules); function kits give our test class."""
    import importlib

    out = []
    for kit in case.kits:
        if kit in FUNCTION_KITS:
            out.append(FUNCTION_KITS[kit])
            continue
        module, name = kit.split(".")
        out.append(getattr(importlib.import_module(f"{KITS_PACKAGE}.{module}"), name))
    return out


def build_test_class(case: KitCase, plan: ServerPlan, *, kits: Sequence[type] | None = None) -> type:
    """The unittest class of one job: our pinning mixin, the kits, the real fixture."""
    import importlib

    fx = FIXTURES[case.fixture]
    module = importlib.import_module(f"{FIXTURES_PACKAGE}.{fx.module}")
    fixture = getattr(module, fx.cls)
    attrs = fixture_attributes(case, plan)
    attrs.update(dict(case.knobs))
    attrs.update(plan.thresholds)
    attrs.update(kits_fixture_module=module.__name__, kits_data_dir=plan.data_dir, kits_case=case.name)
    for method, reason in fx.not_applicable + case.not_applicable:
        attrs[method] = _not_applicable_method(reason)
    ours = [_KitsServer] + ([_StandaloneArgs] if fx.name == "standalone" else [])
    bases: list[type] = [*ours, *(resolve_kits(case) if kits is None else kits), fixture]
    if not issubclass(fixture, unittest.TestCase):  # pure mixins (standalone, pcg_spec)
        from sglang.test.test_utils import CustomTestCase

        bases.append(CustomTestCase)
    return type(case.class_name, tuple(bases), attrs)


# ----------------------------------------------------------------------------- thresholds


#: How a fitted threshold follows from the value measured on stock (kit attribute -> rule).
FIT_RULES: dict[str, tuple[str, str]] = {
    "accept_length_thres": ("accept_length", "0.9 x the accept length measured on stock (greedy, batch 1)"),
    "bs_1_speed_thres": ("speed", "0.3 x the batch-1 decode speed measured on stock (a full run shares the GPU "
                                  "and the CPUs among 12 servers, a fit among 4)"),
    "kl_div_thres_prefill": ("kl_prefill", "max(3 x, + 0.001) the KL divergence measured on stock"),
    "kl_div_thres_decode": ("kl_decode", "max(3 x, + 0.001) the KL divergence measured on stock"),
}
#: Thresholds that cannot fail, for runs before fitting: greater-than checks get -inf, the
#: KL's less-than check +inf. A failed request still fails (speed 0 > -inf is true, but the
#: kits assert on the response first), and NaN still fails both.
UNFITTED = {"accept_length_thres": -math.inf, "bs_1_speed_thres": -math.inf,
            "kl_div_thres_prefill": math.inf, "kl_div_thres_decode": math.inf}
NOT_FITTED_NOTE = ("not fitted yet: no GPU run has measured the tiny models. Fit them on stock SGLang with "
                   "`bash scripts/gpu/run_kits.sh --fit` and commit the kits-thresholds.json it writes as this file.")


class ThresholdsError(ValueError):
    pass


def read_json_file(path: Path, error: type[Exception], what: str) -> Any:
    """A JSON file, or ``error`` with one line that says why not."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"no {what} at {path}") from None
    except ValueError as exc:
        raise error(f"{path} is not valid JSON ({exc})") from None


def load_thresholds(path: Path) -> dict[str, Any]:
    """The thresholds file: ``{"fitted": bool, "note": str, "cases": {case: {attr: value}}, ...}``."""
    doc = read_json_file(path, ThresholdsError, "thresholds file")
    if not isinstance(doc, dict) or not isinstance(doc.get("fitted"), bool) or not isinstance(doc.get("cases", {}), dict):
        raise ThresholdsError(f"{path} is not a kits thresholds file (needs 'fitted' and 'cases')")
    return doc


def case_thresholds(case: KitCase, doc: dict[str, Any]) -> tuple[dict[str, float], bool]:
    """The class attributes a case runs with, and whether they are fitted (all of them)."""
    if not case.thresholds:
        return {}, True
    have = (doc.get("cases") or {}).get(case.name) or {}
    if doc.get("fitted") and all(isinstance(have.get(a), (int, float)) for a in case.thresholds):
        return {a: float(have[a]) for a in case.thresholds}, True
    return {a: UNFITTED[a] for a in case.thresholds}, False


def fit_value(attr: str, measured: float) -> float:
    if attr == "accept_length_thres":
        return round(0.9 * measured, 3)
    if attr == "bs_1_speed_thres":
        return round(0.3 * measured, 1)
    if attr in ("kl_div_thres_prefill", "kl_div_thres_decode"):
        return round(max(3 * measured, measured + 0.001), 6)
    raise KeyError(attr)


def fitted_document(measured: dict[str, dict[str, float]], environment: dict[str, Any],
                    fitted_cases: Sequence[KitCase] = KIT_CASES) -> dict[str, Any]:
    """The thresholds file after a fit: every threshold of ``fitted_cases``, from the values
    they measured on stock. Raises ThresholdsError naming what was not measured (a fit never
    guesses)."""
    cases: dict[str, dict[str, float]] = {}
    missing = []
    for case in fitted_cases:
        for attr in case.thresholds:
            key = FIT_RULES[attr][0]
            value = (measured.get(case.name) or {}).get(key)
            if not isinstance(value, (int, float)) or math.isnan(value):
                missing.append(f"{case.name}.{key}")
                continue
            cases.setdefault(case.name, {})[attr] = fit_value(attr, float(value))
    if missing:
        raise ThresholdsError("not measured on stock, nothing written: " + ", ".join(missing))
    return {"fitted": True, "note": "fitted on stock SGLang to the tiny models; refit with "
                                    "`bash scripts/gpu/run_kits.sh --fit`",
            "fitted_on": environment, "rules": {a: r for a, (_, r) in FIT_RULES.items()},
            "measured": measured, "cases": cases}


_TEST_MARK = re.compile(r"\[CI Test Method\] \w+\.(\w+)")
_SPEC_LINE = re.compile(r"acc_length=([-\d.eE+naif]+) speed=([-\d.eE+naif]+)")
_KL_LINE = re.compile(r"avg_kl_div=([-\d.eE+naif]+)")


def measured_values(log_text: str) -> dict[str, float]:
    """What a kit job printed that thresholds rest on: ``accept_length`` and ``speed`` (the
    spec-decoding kit), ``kl_prefill`` / ``kl_decode`` (the KL kit's two tests; the test is
    told by CustomTestCase's '[CI Test Method]' line before it)."""
    out: dict[str, float] = {}
    test = ""
    for line in log_text.splitlines():
        m = _TEST_MARK.search(line)
        if m:
            test = m.group(1)
            continue
        m = _SPEC_LINE.search(line)
        if m and test == "test_bs_1_speed":
            out["accept_length"], out["speed"] = float(m.group(1)), float(m.group(2))
            continue
        m = _KL_LINE.search(line)
        if m and "prefill_cache_hit" in test:
            out["kl_prefill"] = float(m.group(1))
        elif m and "decode_cache_hit" in test:
            out["kl_decode"] = float(m.group(1))
    return out


# ----------------------------------------------------------------------------- the job of a test process


def job_skip_reason() -> str | None:
    """Why the kits test module does not run here (None: a job file names its case)."""
    path = os.environ.get(JOB_ENV)
    if not path:
        return ("SGLang's test kits start GPU servers: run them through scripts/gpu/run_kits.sh "
                "(scripts/gpu_kits.py), which gives each test process its job")
    if not Path(path).is_file():
        return f"{JOB_ENV}={path}: no such job file"
    return None


def read_job(path: str | Path | None = None) -> tuple[KitCase, ServerPlan]:
    doc = json.loads(Path(path or os.environ[JOB_ENV]).read_text())
    case = CASES_BY_NAME[doc["case"]]
    return case, ServerPlan(**doc["plan"])
