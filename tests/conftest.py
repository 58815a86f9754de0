"""Shared fixtures. SGLang is imported once per session (about 10 s on 2 cores)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIMS = ROOT / "tests" / "cpu_shims"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SGLANG_FUTUREMAP_PATCH", "safe")


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
