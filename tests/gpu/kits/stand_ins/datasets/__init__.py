"""Import stand-in for HuggingFace ``datasets`` in SGLang's kit test processes.

``sglang.test.test_utils`` (which every server fixture imports) reaches
``sglang.benchmark.datasets.mmmu`` through ``sglang.bench_serving``, and that module does
``from datasets import load_dataset`` at import time. The kits that ``scripts/gpu_kits.py`` runs
never load a dataset (their prompts are written locally: ``gpu_kits_cases.write_kits_data``),
and the offline GPU machine has no ``datasets``. The runner puts this folder on the kit test
processes' path only when the real package does not import there. It has no distribution
metadata, so transformers still reports ``datasets`` as unavailable. Any call raises.
"""

from __future__ import annotations

from typing import Any


class DatasetsUnavailable(RuntimeError):
    pass


def load_dataset(*args: Any, **kwargs: Any) -> Any:
    raise DatasetsUnavailable("HuggingFace datasets is not installed here (kits import stand-in): "
                              "this kit would download a dataset")
