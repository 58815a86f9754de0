"""SGLang's ``sglang.srt.plugins`` entry point: runs in the main and every scheduler process."""

from __future__ import annotations

import logging

from sglang_futuremap_patch import _engine


def register() -> None:
    """Apply the back-ports per ``SGLANG_FUTUREMAP_PATCH``.

    SGLang's ``load_plugins`` logs and swallows ``Exception``s from plugins, which would
    turn strict mode into a silent no-op. So: an invalid mode is logged as an ERROR and
    nothing is patched; a strict-mode failure raises ``SystemExit``, which SGLang does not
    swallow, and the process stops with the reason.
    """
    from sglang_futuremap_patch._api import PREFIX, apply

    try:
        apply()
    except ValueError as exc:  # invalid SGLANG_FUTUREMAP_PATCH
        _engine.announce(logging.ERROR, f"{PREFIX} {exc}; SGLang left untouched")
    except _engine.PatchError as exc:  # strict mode
        _engine.announce(logging.ERROR, str(exc))
        raise SystemExit(str(exc)) from exc
