"""Shared fixtures. SGLang is imported once per session (about 10 s on 2 cores)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIMS = ROOT / "tests" / "cpu_shims"


#: "plugin": installed SGLang + the plugin (default). "patched-tree": a pristine SGLang tree with
#: patches/ applied is first on sys.path and the plugin must find nothing to do
#: (tests/test_flavours.py runs the behaviour tests that way in a subprocess).
FLAVOUR = os.environ.get("SGLANG_FUTUREMAP_TEST_FLAVOUR", "plugin")

plugin_only = pytest.mark.skipif(
    FLAVOUR != "plugin", reason="exercises the plugin's install/revert, not the patched source")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SGLANG_FUTUREMAP_PATCH", "safe")


def activate_backport():
    """Make the back-port active for a behaviour test, in either flavour.

    Plugin flavour: apply it (strict). Patched-tree flavour: the source already carries it,
    which the gate must recognise -- so the code under test is the patched SGLang source.
    """
    import sglang_futuremap_patch as plugin

    plugin.revert()
    report = plugin.apply(mode="strict")
    if FLAVOUR == "plugin":
        from sglang_futuremap_patch.backports import load_series

        assert report.applied == [bp.id for bp in load_series()]
    else:
        import sglang

        assert report.verdict.decision == "upstream", report.verdict.reason
        assert "already carries this back-port" in report.verdict.reason
        assert os.environ["SGLANG_FUTUREMAP_TREE"] in sglang.__file__
    return report


@pytest.fixture(scope="session")
def sglang_loaded():
    """Import every SGLang module the back-ports target."""
    from sglang_futuremap_patch.backports import load_series

    return load_series()


@pytest.fixture
def clean_state(sglang_loaded):
    """Each test starts and ends with SGLang unpatched."""
    import sglang_futuremap_patch as plugin

    plugin.revert()
    yield sglang_loaded
    plugin.revert()


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIMS), str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def resolve(path: str):
    module, name = path.split(":")
    obj = importlib.import_module(module)
    *parents, attr = name.split(".")
    for p in parents:
        obj = getattr(obj, p)
    return obj, attr


__all__ = ["ROOT", "subprocess_env", "resolve", "sys"]
