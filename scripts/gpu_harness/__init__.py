"""The GPU harness's shared layer: what every script under ``scripts/`` that starts SGLang
(``gpu_smoke.py``, ``gpu_e2e.py``, ``bench_spec_v2.py``, ``gpu_kits.py``, ``gpu_serve_bench.py``)
needs, each helper written once, in the module of its concern:

* ``port_blocks``: a block of ports per Engine or server;
* ``child_env``: what a child process runs with: the plugin mode and SGLang variant, its
  environment (probes, log format, ports, GPUs), FA3; the probe modules on this side;
* ``launch``: worker subprocesses, harness errors, server readiness, sharding a run;
* ``engine_config``: the speculative Engine kwargs and the configuration an Engine resolved;
* ``logs``: SGLang's log format, the plugin's log lines, the probes' records;
* ``model_factory``: the offline tiny models (and the benchmarks' config-only ones);
* ``records``: checks, the run's environment and command line, quantiles, log archives.

The scripts put ``scripts/`` on ``sys.path`` and import the modules
(``from gpu_harness import child_env, launch``); this file imports nothing.
"""
