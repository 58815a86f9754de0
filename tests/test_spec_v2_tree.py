"""Back-port spec-v2-tree (#26866): EAGLE trees (topk > 1) run on spec v2.

Routing: SGLang's real ``ServerArgs`` (its whole ``__post_init__``, ``device="cpu"``) for a
tiny model directory holding only ``config.json``, and SGLang's own ``create_worker``.
Verify: SGLang's real ``EAGLEWorkerV2.verify`` (as the series leaves it) and its KV move,
with a real ``MHATokenToKVPool`` on CPU and the Triton kernels in Triton's CPU interpreter;
the target forward and the tree sampling (a CUDA kernel) are stood in for by their outputs:
a tree, its predicted ids, the accepted paths.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import activate_backport, plugin_only
from test_auto_tree_spec_v1 import models, server_args, worker_class  # noqa: F401 (fixture)

TREE_V2_LINE = "spec v2 runs the EAGLE tree"
EXPLICIT_TREE = dict(speculative_num_steps=3, speculative_eagle_topk=4, speculative_num_draft_tokens=16)


@pytest.fixture
def patched(clean_state, monkeypatch):
    monkeypatch.delenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", raising=False)  # the default: spec v2 trees
    activate_backport()


def tree_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if TREE_V2_LINE in r.getMessage()]


# --------------------------------------------------------------------------- routing


@plugin_only
def test_stock_runs_an_explicit_tree_on_spec_v1(clean_state, models):
    """The oracle of the GPU runs: stock SGLang 0.5.12.x given a tree uses spec v1."""
    args = server_args(models, "EAGLE3", "eagle3", attention_backend="triton", **EXPLICIT_TREE)
    assert args.disable_overlap_schedule is True and worker_class(args) == "EAGLEWorker"


@pytest.mark.parametrize("algorithm,draft,backend,worker", [
    ("EAGLE3", "eagle3", "triton", "EAGLEWorkerV2"),
    ("EAGLE3", "eagle3", "flashinfer", "EAGLEWorkerV2"),  # asked for: SGLANG_FUTUREMAP_TREE_SPEC_V2=1
    ("STANDALONE", "draft", "fa3", "StandaloneWorkerV2"),
])
def test_explicit_tree_runs_on_spec_v2(patched, models, caplog, monkeypatch, algorithm, draft, backend, worker):
    caplog.set_level(logging.INFO)
    if backend == "flashinfer":
        monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", "1")
    args = server_args(models, algorithm, draft, attention_backend=backend, **EXPLICIT_TREE)
    assert (args.speculative_num_steps, args.speculative_eagle_topk,
            args.speculative_num_draft_tokens) == (3, 4, 16)
    assert args.disable_overlap_schedule is False
    assert worker_class(args) == worker
    (line,) = tree_lines(caplog)
    assert "num_steps=3, eagle_topk=4, num_draft_tokens=16" in line


def test_auto_chosen_tree_runs_on_spec_v2(patched, models, caplog):
    """SGLang's own choice for Llama + EAGLE3 (5 / 4 / 8) where the backend is covered."""
    caplog.set_level(logging.INFO)
    args = server_args(models, "EAGLE3", "eagle3", attention_backend="triton")
    assert (args.speculative_num_steps, args.speculative_eagle_topk,
            args.speculative_num_draft_tokens) == (5, 4, 8)
    assert args.disable_overlap_schedule is False and worker_class(args) == "EAGLEWorkerV2"
    assert len(tree_lines(caplog)) == 1
    assert not [r for r in caplog.records if "auto-chosen tree" in r.getMessage()]


@pytest.mark.parametrize("case", ["keep-v1-env", "page16", "overlap-off", "spec-v2-off", "chain"])
def test_trees_stay_on_spec_v1_where_not_covered_or_asked(patched, models, caplog, monkeypatch, case):
    caplog.set_level(logging.INFO)
    extra = dict(attention_backend="fa3", **EXPLICIT_TREE)
    expected_v1 = True
    if case == "keep-v1-env":  # the documented way back to spec v1
        monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", "0")
    elif case == "page16":  # a tree in pages needs FlashInfer/FA3 throughout (back-port 12)
        extra.update(page_size=16, decode_attention_backend="triton")
    elif case == "overlap-off":
        extra["disable_overlap_schedule"] = True
    elif case == "spec-v2-off":
        monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "0")
    else:  # a chain is spec v2 with or without this back-port, and gets no tree line
        extra.update(speculative_eagle_topk=1, speculative_num_draft_tokens=4)
        expected_v1 = False
    args = server_args(models, "EAGLE3", "eagle3", **extra)
    assert args.disable_overlap_schedule is expected_v1
    assert worker_class(args) == ("EAGLEWorker" if expected_v1 else "EAGLEWorkerV2")
    assert tree_lines(caplog) == []


def test_why_a_tree_stays_on_spec_v1(patched, models, monkeypatch):
    from sglang.srt.server_args import spec_v2_tree_unsupported

    args = server_args(models, "EAGLE3", "eagle3", attention_backend="triton", **EXPLICIT_TREE)
    assert spec_v2_tree_unsupported(args) is None
    cases = {
        "multi-layer EAGLE": dict(enable_multi_layer_eagle=True),
        "page size 16": dict(page_size=16),
        "DP attention": dict(enable_dp_attention=True),
        "attention backend ['torch_native']": dict(attention_backend="torch_native"),
        "attention backend ['triton', 'trtllm_mha']": dict(decode_attention_backend="trtllm_mha"),
        "not NGRAM": dict(speculative_algorithm="NGRAM"),
    }
    for why, change in cases.items():
        reason = spec_v2_tree_unsupported(SimpleNamespace(**{**vars(args), **change}))
        assert reason is not None and why.split(" ", 1)[-1].strip("[]'") in reason, (why, reason)
    other = SimpleNamespace(**vars(args))
    other.get_model_config = lambda: SimpleNamespace(
        hf_config=SimpleNamespace(architectures=["Qwen3NextForCausalLM"]))
    assert "Qwen3NextForCausalLM" in spec_v2_tree_unsupported(other)
    for keep in ("0", "false", "off"):
        monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", keep)
        assert "SGLANG_FUTUREMAP_TREE_SPEC_V2=0" in spec_v2_tree_unsupported(args)
    for run in ("1", ""):
        monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", run)
        assert spec_v2_tree_unsupported(args) is None
    # FlashInfer anywhere in the tree's backends: spec v1 unless asked for with =1
    for change in (dict(attention_backend="flashinfer"), dict(decode_attention_backend="flashinfer")):
        fi = SimpleNamespace(**{**vars(args), **change}, get_model_config=args.get_model_config)
        for env, v1 in (("", True), ("1", False), ("on", False), ("0", True)):
            monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", env)
            reason = spec_v2_tree_unsupported(fi)
            assert (reason is not None) is v1, (change, env, reason)
            if v1 and env == "":
                assert "FlashInfer" in reason and "SGLANG_FUTUREMAP_TREE_SPEC_V2=1" in reason


def test_an_explicit_flashinfer_tree_stays_on_spec_v1_by_default(patched, models, caplog):
    """SGLang's documented tree on Hopper (no backend named: FlashInfer) decodes slower on spec
    v2 than on spec v1 (results/bench-h100/trees): the plugin leaves it where stock runs it."""
    caplog.set_level(logging.INFO)
    args = server_args(models, "EAGLE3", "eagle3", attention_backend="flashinfer", **EXPLICIT_TREE)
    assert args.disable_overlap_schedule is True and worker_class(args) == "EAGLEWorker"
    assert tree_lines(caplog) == []
    # an auto-chosen tree on FlashInfer: spec v1 with back-port 9's line, which names the reason
    caplog.clear()
    args = server_args(models, "EAGLE3", "eagle3", attention_backend="flashinfer")
    assert args.disable_overlap_schedule is True and worker_class(args) == "EAGLEWorker"
    (line,) = [r.getMessage() for r in caplog.records if "auto-chosen tree" in r.getMessage()]
    assert "FlashInfer decodes a tree slower on spec v2" in line


def test_the_patch_logs_the_plugins_words():
    """The INFO line the patch inserts is the plugin's, word for word."""
    import ast

    from sglang_futuremap_patch.backports import spec_v2_tree as mod

    target = next(t for t in mod.BACKPORT.targets if t.kind == "wrap")
    def parse(text: str) -> ast.Module:
        # The inserted lines sit at 12 or 16 spaces in the file: open blocks to match.
        first = len(text) - len(text.lstrip(" "))
        return ast.parse("if True:\n" + (" " * 12 + "if True:\n" if first > 12 else "") + text)

    calls = [n for e in target.edits for n in ast.walk(parse(e.new))
             if isinstance(n, ast.Call) and getattr(n.func, "attr", "") in ("info", "warning")]
    texts = {c.func.attr: ast.literal_eval(c.args[0]) for c in calls}
    assert texts == {"info": mod.TREE_V2_MESSAGE, "warning": mod.AUTO_TREE_V1_MESSAGE}


# --------------------------------------------------------------------------- verify

#: SGLang's verify kernels use Triton's reductions, which Triton's CPU interpreter runs only
#: when it is on before they are defined, i.e. before SGLang is imported. So on a CPU host the
#: verify tests run in a process of their own with ``TRITON_INTERPRET=1``
#: (``test_verify_tests_pass_in_the_triton_interpreter``); on a CUDA host, on the GPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_cuda = pytest.mark.skipif(
    DEVICE == "cpu" and not INTERPRETED,
    reason="SGLang's Triton kernels: on CPU in a process with TRITON_INTERPRET=1 (see below)")
VERIFY_TESTS = ["test_compaction_moves_the_accepted_path_to_the_front",
                "test_kv_move_reads_only_the_accepted_index",
                "test_verify_returns_the_accepted_path_and_its_bonus_token",
                "test_chain_verify_returns_the_accepted_tokens_and_lengths"]

NUM_STEPS, TOPK, DRAFT = 5, 4, 8
SEQ_LENS = [5, 9, 3]
#: Accepted nodes per request (tree rows; node 0 is the root, the previous bonus token).
PATHS = [[0, 2, 5], [0, 1, 4, 6, 7], [0]]
ROW = 40


class _Lens(torch.Tensor):
    """``seq_lens`` on CPU: verify records it on the current stream, a CUDA-only call."""

    def record_stream(self, stream):  # noqa: D401
        return None


@pytest.fixture
def verify_env(patched, monkeypatch):
    """A real KV pool and request rows (on the GPU)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    torch.set_default_device(DEVICE)
    yield from _verify_env(MHATokenToKVPool)
    torch.set_default_device("cpu")


def _verify_env(MHATokenToKVPool):

    bs = len(SEQ_LENS)
    pool = MHATokenToKVPool(bs * ROW + 8, page_size=1, dtype=torch.float32, head_num=1,
                            head_dim=2, layer_num=1, device=DEVICE, enable_memory_saver=False,
                            start_layer=0, end_layer=0, enable_kv_cache_copy=True)
    # Each request's pool row, slots 1.. (slot 0 is SGLang's padding slot).
    req_to_token = torch.zeros((bs + 1, ROW), dtype=torch.int32)
    for r in range(bs):
        req_to_token[r + 1] = torch.arange(1 + r * ROW, 1 + (r + 1) * ROW, dtype=torch.int32)
    for layer in pool.k_buffer + pool.v_buffer:  # a slot's KV names the slot
        layer.copy_(torch.arange(layer.shape[0], dtype=torch.float32)[:, None, None].expand_as(layer))
    yield SimpleNamespace(pool=pool, req_to_token=req_to_token, bs=bs)


def _accept_index(paths, width=NUM_STEPS + 1):
    rows = [[DRAFT * r + n for n in p] + [-1] * (width - len(p)) for r, p in enumerate(paths)]
    return torch.tensor(rows, dtype=torch.int32)


def _worker(env):
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    w = object.__new__(EAGLEWorkerV2)
    w.speculative_num_draft_tokens, w.speculative_num_steps, w.topk = DRAFT, NUM_STEPS, TOPK
    w.device = DEVICE
    w.req_to_token_pool = SimpleNamespace(req_to_token=env.req_to_token)
    w.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: env.pool)
    return w


def _batch(env, verify_input=None):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int64).as_subclass(_Lens)
    pool_idx = torch.arange(1, env.bs + 1, dtype=torch.int64)
    out_cache_loc = torch.cat([env.req_to_token[1 + r, s : s + DRAFT] for r, s in enumerate(SEQ_LENS)])
    return SimpleNamespace(seq_lens=seq_lens, req_pool_indices=pool_idx,
                           out_cache_loc=out_cache_loc.to(torch.int64), spec_info=verify_input,
                           forward_mode=ForwardMode.DECODE, has_grammar=False, return_logprob=False)


def _committed_kv(env, batch, lens):
    """The K of each request's committed positions seq_len .. seq_len + len."""
    return [env.pool.k_buffer[0][env.req_to_token[1 + r, s : s + n].long(), 0, 0].tolist()
            for r, (s, n) in enumerate(zip(SEQ_LENS, lens))]


@needs_cuda
def test_compaction_moves_the_accepted_path_to_the_front(verify_env):
    w, batch = _worker(verify_env), _batch(verify_env)
    bs = verify_env.bs
    predict = torch.arange(100, 100 + bs * DRAFT, dtype=torch.int32)
    hidden = torch.arange(bs * DRAFT, dtype=torch.float32)[:, None].repeat(1, 3)
    logits_output = SimpleNamespace(hidden_states=hidden)
    accept_index = _accept_index(PATHS)
    lens = [len(p) for p in PATHS]
    out = w.compact_accepted_tree_path(batch, logits_output, predict, accept_index,
                                       torch.tensor(lens, dtype=torch.int32))
    for r, path in enumerate(PATHS):
        nodes = [DRAFT * r + n for n in path]
        assert out[DRAFT * r : DRAFT * r + len(path)].tolist() == [100 + g for g in nodes]
        assert logits_output.hidden_states[DRAFT * r : DRAFT * r + len(path), 0].tolist() == nodes
    # The target KV of node n (written to the verify slot out_cache_loc[n]) now sits at the
    # position the path gives it.
    want = [[float(batch.out_cache_loc[DRAFT * r + n]) for n in p] for r, p in enumerate(PATHS)]
    assert _committed_kv(verify_env, batch, lens) == want
    assert verify_env.pool.k_buffer[0][0, 0, 0].item() == 0.0  # the padding slot untouched


@needs_cuda
def test_kv_move_reads_only_the_accepted_index(verify_env):
    """SGLang's move ran one program per tree slot (bs * num_draft_tokens), reading past
    ``accept_index`` ([bs, steps + 1]): what lies behind it must not be moved anywhere."""
    w, batch = _worker(verify_env), _batch(verify_env)
    behind = torch.full((verify_env.bs * (NUM_STEPS + 1) * 2,), 3, dtype=torch.int32)
    accept_index = behind[: verify_env.bs * (NUM_STEPS + 1)].view(verify_env.bs, NUM_STEPS + 1)
    accept_index.copy_(_accept_index(PATHS))
    before = verify_env.pool.k_buffer[0].clone()
    lens = torch.tensor([len(p) for p in PATHS], dtype=torch.int32)
    w.move_accepted_tokens_to_target_kvcache(batch, accept_index, lens - 1)
    changed = (verify_env.pool.k_buffer[0] != before).flatten(1).any(1).nonzero().flatten().tolist()
    committed = {int(env_slot) for r, (s, n) in enumerate(zip(SEQ_LENS, lens.tolist()))
                 for env_slot in verify_env.req_to_token[1 + r, s : s + n]}
    assert set(changed) <= committed


@needs_cuda
def test_verify_returns_the_accepted_path_and_its_bonus_token(verify_env):
    """SGLang's ``verify`` as the series leaves it, after sampling a tree."""
    w = _worker(verify_env)
    bs = verify_env.bs
    predict = torch.arange(100, 100 + bs * DRAFT, dtype=torch.int32)
    accept_index = _accept_index(PATHS)
    accept_lens = torch.tensor([len(p) for p in PATHS], dtype=torch.int32)
    hidden = torch.arange(bs * DRAFT, dtype=torch.float32)[:, None]
    logits_output = SimpleNamespace(hidden_states=hidden, next_token_logits=torch.zeros(bs * DRAFT, 4))
    verify_input = SimpleNamespace(
        prepare_for_v2_verify=lambda *a: (SimpleNamespace(), False),
        sample=lambda batch, lo, mask: (predict, accept_lens, accept_index),
    )
    w.plan_stream, w.plan_stream_ctx = None, contextlib.nullcontext()
    w._target_worker = SimpleNamespace(
        forward_batch_generation=lambda **kw: SimpleNamespace(
            logits_output=logits_output, routed_experts_output=None, indexer_topk_output=None),
        model_runner=SimpleNamespace(hybrid_gdn_config=None, mamba2_config=None),
    )
    batch = _batch(verify_env, verify_input)
    result = w.verify(batch)
    for r, path in enumerate(PATHS):
        accepted = [100 + DRAFT * r + n for n in path]
        assert result.next_token_ids[DRAFT * r : DRAFT * r + len(path)].tolist() == accepted
        assert result.next_draft_input.bonus_tokens[r].item() == accepted[-1]
    assert result.accept_lens.tolist() == [len(p) for p in PATHS]
    assert result.next_draft_input.new_seq_lens.tolist() == [s + len(p) for s, p in zip(SEQ_LENS, PATHS)]


@needs_cuda
@pytest.mark.parametrize("kind", ["eagle", "multi_layer"])
def test_chain_verify_returns_the_accepted_tokens_and_lengths(verify_env, kind):
    """A chain (topk 1) through SGLang's ``verify`` of both spec-v2 workers as the series
    leaves them: the accepted tokens, each request's bonus token (its last accepted one) and
    the new lengths the worker publishes; no ``verify_done`` event any more (back-port 3)."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2

    cls = {"eagle": EAGLEWorkerV2, "multi_layer": MultiLayerEagleWorkerV2}[kind]
    steps, bs = 3, verify_env.bs
    w = object.__new__(cls)
    w.speculative_num_draft_tokens, w.speculative_num_steps, w.topk = steps + 1, steps, 1
    w.device = DEVICE
    w.req_to_token_pool = SimpleNamespace(req_to_token=verify_env.req_to_token)
    w.plan_stream, w.plan_stream_ctx = None, contextlib.nullcontext()
    predict = torch.arange(100, 100 + bs * (steps + 1), dtype=torch.int32)
    accept_lens = torch.tensor([2, 4, 1], dtype=torch.int32)
    accept_index = torch.tensor([[r * (steps + 1) + i if i < n else -1 for i in range(steps + 1)]
                                 for r, n in enumerate(accept_lens.tolist())], dtype=torch.int32)
    logits_output = SimpleNamespace(hidden_states=None,
                                    next_token_logits=torch.zeros(bs * (steps + 1), 4))
    verify_input = SimpleNamespace(
        prepare_for_v2_verify=lambda *a: (SimpleNamespace(), False),
        sample=lambda *a: (predict, accept_lens, accept_index))
    w._target_worker = SimpleNamespace(
        forward_batch_generation=lambda **kw: SimpleNamespace(
            logits_output=logits_output, routed_experts_output=None, indexer_topk_output=None),
        model_runner=SimpleNamespace(hybrid_gdn_config=None, mamba2_config=None))
    batch = _batch(verify_env, verify_input)
    result = w.verify(batch)
    assert result.next_token_ids.tolist() == predict.tolist()
    assert result.next_draft_input.bonus_tokens.tolist() == [
        100 + r * (steps + 1) + n - 1 for r, n in enumerate(accept_lens.tolist())]
    assert result.next_draft_input.new_seq_lens.tolist() == [
        s + n for s, n in zip(SEQ_LENS, accept_lens.tolist())]
    assert result.accept_lens.tolist() == accept_lens.tolist()
    assert result.next_draft_input.verify_done is None


@pytest.mark.skipif(DEVICE != "cpu" or INTERPRETED, reason="CPU host: runs the verify tests "
                    "in a process of their own (on a CUDA host they run on the GPU)")
def test_verify_tests_pass_in_the_triton_interpreter():
    """The three verify tests above, in a fresh process with Triton's interpreter on (the
    same flavour: plugin, patched tree or a hunk-revert mutant, as this process)."""
    from conftest import ROOT

    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore",
           "SGLANG_NATIVE_MOVE_KV_CACHE": "1"}  # the pool's move as a plain CPU copy
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *[f"tests/test_spec_v2_tree.py::{name}" for name in VERIFY_TESTS]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(VERIFY_TESTS) + 1} passed" in proc.stdout.strip().splitlines()[-1]  # 2 kinds


def test_status_says_where_trees_run(clean_state, capsys, monkeypatch):
    """``status`` shows the tree choice: spec v2 by default, spec v1 with the variable at 0."""
    from sglang_futuremap_patch import cli

    monkeypatch.delenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", raising=False)
    cli.main(["status"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("trees:")]
    assert "spec v2 where covered" in line and "SGLANG_FUTUREMAP_TREE_SPEC_V2=0 keeps" in line
    assert "except FlashInfer: spec v1 there" in line and "SGLANG_FUTUREMAP_TREE_SPEC_V2=1 runs it" in line
    monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", "1")
    cli.main(["status"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("trees:")]
    assert "FlashInfer included (SGLANG_FUTUREMAP_TREE_SPEC_V2=1 is set)" in line
    monkeypatch.setenv("SGLANG_FUTUREMAP_TREE_SPEC_V2", "0")
    cli.main(["status"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("trees:")]
    assert line.startswith("trees:    spec v1, as in stock SGLang")
