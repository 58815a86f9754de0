"""CPU-host import shims for SGLang's native GPU modules (test and CPU-verify use only).

SGLang 0.5.12.x imports two native modules at module level that cannot load on a host
without CUDA: ``sgl_kernel`` (CUDA ops) and ``torchvision`` (``decode_jpeg``). The Python
code under test never calls them on the CPU paths we exercise, so we register empty
stand-ins *only for those two names*, and only when the real ones cannot be imported.
Any attribute of a stand-in raises when called, so a test that reaches a native op
fails loudly instead of computing something fake.

This file is put on ``PYTHONPATH`` by ``scripts/cpu-env.sh``; Python imports
``sitecustomize`` at start-up. On a GPU box it is never used.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types


class _NativeOpUnavailable:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{self._name} is a native GPU op; it is not available on a CPU host")

    def __getattr__(self, attr: str) -> "_NativeOpUnavailable":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _NativeOpUnavailable(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<unavailable native symbol {self._name}>"


def _stand_in(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    mod.__path__ = []  # a package, so `from sgl_kernel.kvcacheio import x` resolves
    mod.__getattr__ = lambda attr: (  # type: ignore[method-assign]
        _NativeOpUnavailable(f"{name}.{attr}") if not attr.startswith("__") else _raise(attr)
    )
    return mod


def _raise(attr: str) -> None:
    raise AttributeError(attr)


class _ShimFinder:
    """Serves the native GPU packages (and their submodules) as stand-ins."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname.split(".", 1)[0] in self.prefixes:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _stand_in(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install() -> None:
    missing = tuple(name for name in ("sgl_kernel", "torchvision") if not _available(name))
    if missing:
        sys.meta_path.append(_ShimFinder(missing))


install()
