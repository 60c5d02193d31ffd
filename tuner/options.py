"""``TuneOptions``: every setting of a tuning run but the model, as ``tune()`` takes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from costmodel import FilterSettings

from .lowering import LoweringOptions
from .objectives import Objectives


@dataclass(frozen=True)
class TuneOptions:
    """See ``tune()`` for what each one means."""

    target: str | dict | tvm.target.Target = "llvm"
    trials: int | None = None
    work_dir: str | Path | None = None
    stop: Objectives | None = None
    task_stop: Objectives | None = None
    scheduler: str = "gradient"
    filter: bool | FilterSettings = True
    example_inputs: Sequence[Any] | None = None
    batch: int | None = None
    dtype: str | None = None
    batch_size: int | None = None
    build_workers: int | None = None
    seed: int = 1
    verify: bool = True
    progress: bool = True
    transfer_from: Sequence[str | Path] | None = None
    cost_model_from: Sequence[str | Path] | None = None
    cluster: str | None = None
    lowering: LoweringOptions | None = None
    trials_per_task: int | None = None
    cold_cache: bool = False
    verbose: bool = False

    @property
    def filter_settings(self) -> FilterSettings:
        if isinstance(self.filter, FilterSettings):
            return self.filter
        return FilterSettings(enabled=bool(self.filter))
