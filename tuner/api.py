"""``tune()``: the Python entry point."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm

from costmodel import FilterSettings
from tuner.database.workdir import ARTIFACT_FILE, COST_MODEL_FILE, DATABASE_FILE, UNTUNED_FILE
from tuner.lowering import LoweringOptions
from tuner.search.objectives import Objectives

from .options import TuneOptions, describe_settings
from .result import TuneResult
from .run import run_objectives, run_tuning

__all__ = ["ARTIFACT_FILE", "COST_MODEL_FILE", "DATABASE_FILE", "UNTUNED_FILE", "run_objectives", "tune"]


def tune(
    model: Any,
    target: str | dict | tvm.target.Target = "llvm",
    trials: int | None = None,
    work_dir: str | Path | None = None,
    *,
    stop: Objectives | None = None,
    task_stop: Objectives | None = None,
    scheduler: str = "gradient",
    filter: bool | FilterSettings = True,  # noqa: A002 - the name the CLI's --no-filter uses
    example_inputs: Sequence[Any] | None = None,
    batch: int | None = None,
    dtype: str | None = None,
    batch_size: int | None = None,
    build_workers: int | None = None,
    seed: int = 1,
    verify: bool = True,
    progress: bool = True,
    transfer_from: Sequence[str | Path] | None = None,
    cost_model_from: Sequence[str | Path] | None = None,
    cluster: str | None = None,
    lowering: LoweringOptions | None = None,
    trials_per_task: int | None = None,
    cold_cache: bool = False,
    trimmer: bool | FilterSettings | None = None,
    verbose: bool = False,
    analytic_start: bool = True,
    time_untuned: bool = False,
    partition: bool = True,
    pipeline: bool | None = None,
) -> TuneResult:
    """Tune every kernel of ``model`` for ``target`` and return the compiled result.

    ``model`` is a built-in workload name (``tuner workloads`` lists them), a TensorIR PrimFunc, a Relax
    IRModule, a torch.nn.Module with ``example_inputs`` (tensors or shapes), or the path of an ONNX file.
    With no ``trials``, no ``trials_per_task`` and no ``stop``, the budget is 32 trials per kernel (at
    least 64 in all), stated in the first progress line. ``trimmer=`` is ``filter``'s former name and
    still works. The settings, each a field of ``TuneOptions``:
    """
    settings = dict(locals())  # the parameters by name: the first statement, before anything else is local
    if trimmer is not None:
        settings["filter"] = trimmer
    return run_tuning(model, TuneOptions.from_keywords(settings))


tune.__doc__ = f"{tune.__doc__.rstrip()}\n\n{describe_settings()}\n"
