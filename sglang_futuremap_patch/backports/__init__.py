"""One module per upstream change; ``SERIES`` is their order (also the order of ``patches/``)."""

from __future__ import annotations

from sglang_futuremap_patch._engine import Backport


def load_series() -> tuple[Backport, ...]:
    """Import the back-port modules (this imports the SGLang modules they target)."""
    from sglang_futuremap_patch.backports import drop_verify_done, publish_stash, worker_on_publish

    return (worker_on_publish.BACKPORT, publish_stash.BACKPORT, drop_verify_done.BACKPORT)
