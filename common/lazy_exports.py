"""A package's public names imported on first use (PEP 562), so that importing the package, or the
command line through it, does not pay for TVM and PyTorch before a command needs them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, modules: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, where ``modules`` maps each public name to the
    submodule that defines it (relative, like ``.api``)."""

    def getattr_(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(modules[name], package), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # later lookups find it without coming back here
        return value

    def dir_() -> list[str]:
        return sorted(set(importlib.import_module(package).__dict__) | set(modules))

    return getattr_, dir_
