"""Errors a user can fix by changing what they pass in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TorchSource:
    """The torch module an importer refused, with the example inputs it was imported with: what
    ``tune()`` splits around the refused operators."""

    name: str
    module: Any
    examples: tuple


class WorkloadError(ValueError):
    """The model given to the tuner cannot be used; the message says why and what to do.
    ``unsupported``: the operators an importer refused, where that is why (``"erfinv.default"``);
    ``source``: the torch module they were refused in."""

    def __init__(self, message: str, unsupported: list[str] | None = None, source: TorchSource | None = None):
        super().__init__(message)
        self.unsupported = unsupported or []
        self.source = source
