"""Back-port of SGLang's FutureMap publish/stash design (spec decoding v2) to 0.5.12.x.

Importing this package changes nothing. SGLang calls :func:`sglang_futuremap_patch._plugin.register`
through its ``sglang.srt.plugins`` entry point in every process it starts; that applies the
back-ports according to ``SGLANG_FUTUREMAP_PATCH`` (``off`` | ``safe``, the default | ``strict``).
"""

from __future__ import annotations

from sglang_futuremap_patch._api import Report, apply, read_mode, revert, status
from sglang_futuremap_patch._engine import PatchError

__version__ = "0.1.0"
__all__ = ["PatchError", "Report", "apply", "read_mode", "revert", "status", "__version__"]
