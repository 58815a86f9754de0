"""CPU tests of the GPU harness's shared layer (scripts/gpu_harness/): port blocks,
environments, variants, harness errors, FA3 detection, Engine kwargs. No GPU, no SGLang."""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_smoke as smoke  # noqa: E402
from gpu_harness import child_env, engine_config, launch, logs, model_factory, port_blocks  # noqa: E402


# ----------------------------------------------------------------------------- ports


@pytest.mark.parametrize("n", [2, 40, 300])
def test_port_blocks_of_n_engines_are_disjoint(n: int) -> None:
    alloc = port_blocks.PortAllocator(rng=random.Random(n), is_free=lambda port: True)
    blocks = [alloc.allocate(f"engine-{i}") for i in range(n)]
    spans = [set(b.ports()) for b in blocks]
    assert sum(map(len, spans)) == len(set().union(*spans)) == n * port_blocks.PORT_BLOCK  # pairwise disjoint
    every = set().union(*spans)
    for b in blocks:
        assert {b.port, b.nccl_port, b.sglang_port, b.port + 1} <= set(b.ports())  # port + 1: gRPC sidecar
        assert port_blocks.PORT_LO <= b.base and b.base + port_blocks.PORT_BLOCK <= port_blocks.PORT_HI < 32768  # below the ephemeral range
        grpc = b.port + port_blocks.GRPC_OFFSET
        assert grpc <= 65535 and grpc not in every  # SGLang's derived gRPC port: valid, and no one's block
        assert port_blocks.with_ports({"model_path": "m"}, b) == {"model_path": "m", "port": b.port, "nccl_port": b.nccl_port}
        assert b.env() == {"SGLANG_PORT": str(b.sglang_port)}


def test_harnesses_side_by_side_keep_to_their_own_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two harnesses on one machine (run_jobs.sh: two e2e shards) each check a block free when they
    hand it out, before their Engine binds it: from one range they can pick the same block (seen:
    EADDRINUSE). With GPU_HARNESS_PORT_SLICE each keeps to its own slice."""
    def blocks(spec: str | None) -> set[int]:
        alloc = port_blocks.PortAllocator(rng=random.Random(7), is_free=lambda port: True, slice_spec=spec)
        return {alloc.allocate().base for _ in range(200)}

    assert blocks("") & blocks("")  # one range, the same draw: the collision
    first, second = blocks("1/2"), blocks("2/2")
    assert not first & second and len(first) == len(second) == 200
    assert max(first) + port_blocks.PORT_BLOCK <= min(second)
    monkeypatch.setenv(port_blocks.PORT_SLICE_ENV, "2/2")
    from_env = port_blocks.PortAllocator(rng=random.Random(7), is_free=lambda port: True)
    assert {from_env.allocate().base for _ in range(200)} == second
    for bad in ("3/2", "0/2", "x", "1/10000"):
        with pytest.raises(ValueError, match=port_blocks.PORT_SLICE_ENV):
            port_blocks.PortAllocator(slice_spec=bad)


def test_allocator_skips_ports_in_use_and_runs_out_cleanly() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        lo = busy - 2  # a block whose nccl_port is the busy one
        alloc = port_blocks.PortAllocator(lo, lo + 3 * port_blocks.PORT_BLOCK, rng=random.Random(0))
        alloc.next = 0
        got = [alloc.allocate() for _ in range(2)]
        assert all(busy not in b.bound for b in got) and got[0].base == lo + port_blocks.PORT_BLOCK
        with pytest.raises(RuntimeError):
            alloc.allocate()
    with pytest.raises(ValueError):
        port_blocks.with_ports({"enable_dp_attention": True}, got[0])


def test_threads_never_share_a_block() -> None:
    from concurrent.futures import ThreadPoolExecutor

    alloc = port_blocks.PortAllocator(is_free=lambda port: True)
    with ThreadPoolExecutor(16) as pool:
        blocks = list(pool.map(lambda i: alloc.allocate(str(i)), range(200)))
    assert len({b.base for b in blocks}) == 200


# ----------------------------------------------------------------------------- environment, variants


def test_subprocess_env(tmp_path: Path) -> None:
    site = tmp_path / "site-0513"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "_version.py").write_text("__version__ = version = '0.5.13'\n")
    current = tmp_path / "site312"
    (current / "sglang").mkdir(parents=True)
    (current / "sglang" / "__init__.py").write_text("")
    base = {"PYTHONPATH": os.pathsep.join([str(current), "/opt/other"]), "SMOKE_HOST_PROFILE": "1", "KEEP": "x"}
    block = port_blocks.PortBlock(24000)
    env = child_env.subprocess_env("off", tmp_path / "probe", tmp_path / "log.json", ports=block, base=base,
                            cuda_visible_devices="3")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(child_env.PROBE_DIR), str(current), "/opt/other"]
    assert env["SGLANG_FUTUREMAP_PATCH"] == "off" and env["SGLANG_PORT"] == "24004" and env["KEEP"] == "x"
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and "SMOKE_HOST_PROFILE" not in env and "SMOKE_SYNC_PROBE" not in env
    up = child_env.subprocess_env("off", tmp_path / "probe", None, site=str(site), base=base, sync_probe=True)
    assert up["PYTHONPATH"].split(os.pathsep) == [str(child_env.PROBE_DIR), str(site), "/opt/other"]  # the other SGLang gone
    assert up["SMOKE_SYNC_PROBE"] == "1" and "SGLANG_LOGGING_CONFIG_PATH" not in up
    (upstream,) = child_env.make_variants(["upstream"], upstream=str(site))
    assert upstream.plugin_expected == "absent" and child_env.upstream_missing(upstream) is None
    assert child_env.site_sglang_version(site) == "0.5.13" and child_env.site_sglang_version(tmp_path / "nothing") is None
    assert "holds no SGLang" in child_env.upstream_missing(child_env.Variant("upstream", "off", str(tmp_path / "nothing")))
    stock, patched = child_env.make_variants(["stock", "patched"], patched_mode="safe")
    assert (stock.mode, stock.plugin_expected, patched.mode, patched.plugin_expected) == (
        "off", "disabled", "safe", "applied")
    with pytest.raises(ValueError):
        child_env.make_variants(["nightly"])


def test_the_mirror_variant_is_the_plugin_with_back_port_18_off() -> None:
    from sglang_futuremap_patch.backports import fa3_mla_device_metadata

    assert child_env.FA3_MLA_ENV == fa3_mla_device_metadata.FA3_MLA_ENV
    patched, fa3_mla = child_env.make_variants(["patched", "patched-mla-mirror"])
    assert (fa3_mla.name, fa3_mla.mode, fa3_mla.plugin_expected) == ("patched-mla-mirror", "strict", "applied")
    assert fa3_mla.env == ((child_env.FA3_MLA_ENV, "0"),) and patched.env == ()
    assert "patched-mla-mirror" in child_env.VARIANT_NAMES
    # the caller's shell may hold the switch: only the variant that asks for it gets it
    shell = {child_env.FA3_MLA_ENV: "0", "KEEP": "x"}
    assert child_env.with_variant_env(shell, patched) == {"KEEP": "x"}
    assert child_env.with_variant_env(shell, child_env.STOCK) == {"KEEP": "x"}
    assert child_env.with_variant_env({"KEEP": "x"}, fa3_mla) == {"KEEP": "x", child_env.FA3_MLA_ENV: "0"}


# ----------------------------------------------------------------------------- launch, errors


def test_engine_error() -> None:
    ok = {"startup_s": 3.0, "scenarios": {"a": {}, "b": {}}}
    assert launch.engine_error(0, ok, "", expected=["a", "b"]) is None
    assert launch.engine_error(1, None, "") == "exit status 1; no result"
    assert launch.engine_error(0, {"scenarios": {}}, "") == "the Engine did not start"
    limit = f"[gpu_e2e] x-stock {launch.KILLED_AT_LIMIT} 300 s"
    assert launch.engine_error(-9, {"startup_s": 1.0, "scenarios": {"a": {}}}, limit, expected=["a", "b", "c"]) == (
        "killed at the time limit; stopped before 'b' (+1 more)")
    # -9 without the harness's mark: SGLang's SIGQUIT handler killed its own tree (a child failed)
    died = "AttributeError: x\n[2026-11-23 ERROR] SIGQUIT received. It usually means one child failed."
    assert launch.engine_error(-9, None, died).startswith("killed by SIGKILL before the time limit")
    assert launch.engine_error(0, {"startup_s": 1.0, "error": "RuntimeError: x"}, "", expected=[]) is None
    assert logs.log_tail("\n".join(str(i) for i in range(100)), lines=3) == "97\n98\n99"


def test_run_worker_kills_its_session_and_reads_the_result(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(
        "import json, sys, time\n"
        "spec = json.load(open(sys.argv[2]))\n"
        "print('hello from the worker', flush=True)\n"
        "json.dump({'startup_s': 0.1, 'echo': spec['x']}, open(spec['result_path'], 'w'))\n"
        "time.sleep(spec['sleep'])\n")
    rc, wall, result, text = launch.run_worker(script, {"x": 7, "sleep": 0}, tmp_path, "a", tmp_path / "a.log",
                                           dict(os.environ), 30)
    assert rc == 0 and result == {"startup_s": 0.1, "echo": 7} and "hello from the worker" in text
    rc, wall, result, text = launch.run_worker(script, {"x": 8, "sleep": 30}, tmp_path, "b", tmp_path / "b.log",
                                           dict(os.environ), 1.5)
    assert rc == -9 and wall < 20 and result["echo"] == 8 and "b run killed after 2 s" in text
    assert launch.engine_error(rc, result, text).startswith("killed at the time limit")


# ----------------------------------------------------------------------------- FA3, models, kwargs


def test_fa3_detection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert child_env.needs_fa3("fa3") and child_env.needs_fa3("default") and child_env.needs_fa3(None)
    assert not child_env.needs_fa3("triton") and not child_env.needs_fa3("flashinfer")
    fake = tmp_path / "site"
    (fake / "sgl_kernel").mkdir(parents=True)
    (fake / "sgl_kernel" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != child_env.FA3_ENV}
    env["PYTHONPATH"] = str(fake)
    assert child_env.fa3_available(env) is False  # the package, but no flash_ops
    (fake / "sgl_kernel" / "flash_ops.py").write_text("")
    env["PYTHONPATH"] = str(fake) + os.pathsep  # another key: not the cached answer
    assert child_env.fa3_available(env) is True
    assert child_env.fa3_available(dict(env, **{child_env.FA3_ENV: "0"})) is False
    assert "not installed" in child_env.fa3_line(False) and "installed" in child_env.fa3_line(True)


def test_tiny_model_eos_ids(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(model_factory.llama_config()))
    assert model_factory.eos_token_ids(tmp_path) == [2]
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
    assert model_factory.eos_token_ids(tmp_path) == [2, 9]


def test_spec_engine_kwargs_and_effective_config() -> None:
    kw = engine_config.spec_engine_kwargs("t", "d", algorithm="EAGLE3", backend="fa3", pcg=True, mem_fraction=0.1,
                               cuda_graph_max_bs=64, pcg_max_tokens=512, page_size=16)
    assert kw["attention_backend"] == "fa3" and kw["disable_piecewise_cuda_graph"] is False
    assert kw["piecewise_cuda_graph_max_tokens"] == 512 and kw["cuda_graph_max_bs"] == 64 and kw["page_size"] == 16
    assert (kw["speculative_num_steps"], kw["speculative_eagle_topk"], kw["speculative_num_draft_tokens"]) == (3, 1, 4)
    default = engine_config.spec_engine_kwargs("t", "d", backend="default", pcg=None, mem_fraction=0.1)
    assert "attention_backend" not in default and "disable_piecewise_cuda_graph" not in default
    assert default["speculative_draft_model_path"] == "d"
    # DeepSeek MTP: no draft path (SGLang reads the NextN layer from the target's checkpoint)
    nextn = engine_config.spec_engine_kwargs("t", None, algorithm="NEXTN", backend="default", pcg=None,
                                             mem_fraction=0.1)
    assert "speculative_draft_model_path" not in nextn and nextn["speculative_algorithm"] == "NEXTN"
    assert engine_config.NEXTN_ALGORITHM == "NEXTN"


def test_spec_launch_and_server_flags() -> None:
    assert engine_config.spec_launch() == {"speculative_algorithm": "STANDALONE", **engine_config.SPEC_STEPS}
    assert engine_config.spec_launch("EAGLE3", "d", (5, 4, 8)) == {
        "speculative_draft_model_path": "d", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 5,
        "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
    flags = engine_config.server_flags({"model_path": "m", **engine_config.spec_launch(engine_config.NEXTN_ALGORITHM),
                                        "enable_metrics": True, "disable_cuda_graph": False, "page_size": None})
    assert flags == ["--model-path", "m", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--enable-metrics"]

    class Engine:
        def get_server_info(self):
            return {"attention_backend": "fa3", "disable_piecewise_cuda_graph": False, "page_size": 1,
                    "version": "0.5.12.post1", "tp_size": 1}

    eff = engine_config.effective_config(Engine())
    assert eff == {"attention_backend": "fa3", "disable_piecewise_cuda_graph": False, "page_size": 1,
                   "version": "0.5.12.post1"}
    assert "error" in engine_config.effective_config(object())
    assert engine_config.config_label(eff, requested_backend="default") == "fa3 (SGLang's default), PCG on, page 1"
    line = "[x INFO pid=1] Attention backend not specified. Use fa3 backend by default."
    assert engine_config.config_label(None, requested_backend="default", log_text=line) == "fa3 (SGLang's default), PCG ?"
    assert engine_config.config_label({"attention_backend": "triton", "disable_piecewise_cuda_graph": True},
                           requested_backend="triton") == "triton, PCG off"


# ----------------------------------------------------------------------------- the smoke test's use of it


def _smoke_models(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 4096}))
    return model


def test_smoke_gives_each_engine_its_ports_and_reports_a_dead_engine_as_a_harness_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: dict[str, tuple[dict, dict]] = {}

    def fake_worker(script, spec, work, name, log_path, env, timeout, **kw):
        seen[name] = (spec["engine_kwargs"], env)
        if name == "patched":
            return 1, 4.0, None, "Traceback (most recent call last):\ntorch.distributed.DistNetworkError: EADDRINUSE\n"
        return 0, 4.0, {"pid": 1, "startup_s": 1.0, "outputs": []}, ""

    monkeypatch.setattr(launch, "run_worker", fake_worker)
    monkeypatch.setenv(child_env.FA3_ENV, "0")
    model = _smoke_models(tmp_path)
    out = tmp_path / "smoke.json"
    rc = smoke.main(["--target", str(model), "--draft", str(model), "--log-dir", str(tmp_path / "logs"),
                     "--out-json", str(out)])
    text = capsys.readouterr().out
    assert rc == 2 and "SMOKE ERROR" in text and "patched: exit status 1; no result" in text
    assert "    | torch.distributed.DistNetworkError: EADDRINUSE" in text and "outputs identical" not in text
    doc = json.loads(out.read_text())
    assert doc["status"] == "error" and doc["fa3"] is False and not doc["checks"]
    assert doc["runs"]["patched"]["error"] == "exit status 1; no result" and doc["runs"]["stock"]["error"] is None
    blocks = []
    for name, (kw, env) in seen.items():
        ports = doc["runs"][name]["ports"]
        assert (kw["port"], kw["nccl_port"], env["SGLANG_PORT"]) == (
            ports["port"], ports["nccl_port"], str(ports["sglang_port"]))
        blocks.append(set(range(ports["base"], ports["base"] + port_blocks.PORT_BLOCK)))
    assert len(blocks) == 2 and not blocks[0] & blocks[1]


def test_smoke_skips_the_default_configuration_without_fa3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "run_worker", lambda *a, **k: pytest.fail("no Engine may start"))
    monkeypatch.setenv(child_env.FA3_ENV, "0")
    model = _smoke_models(tmp_path)
    out = tmp_path / "smoke.json"
    assert smoke.main(["--target", str(model), "--draft", str(model), "--attention-backend", "default",
                       "--log-dir", str(tmp_path / "logs"), "--out-json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["status"] == "skipped" and doc["fa3"] is False and doc["config"]["piecewise_cuda_graph"] is True
    kw = smoke.engine_kwargs("t", "d", cuda_graph=True, mem_fraction=0.3, seed=0, attention_backend="default",
                             piecewise_cuda_graph=True)
    assert "attention_backend" not in kw and "disable_piecewise_cuda_graph" not in kw
