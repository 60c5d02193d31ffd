"""``tune()``: the Python entry point."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm

from costmodel import FilterSettings

from .lowering import LoweringOptions
from .objectives import Objectives
from .options import TuneOptions
from .result import TuneResult
from .run import run_objectives, run_tuning
from .workdir import ARTIFACT_FILE, COST_MODEL_FILE, DATABASE_FILE, UNTUNED_FILE

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
) -> TuneResult:
    """Tune every kernel of ``model`` for ``target`` and return the compiled result.

    ``model`` is a built-in workload name (``tuner workloads`` lists them; ``batch`` chooses a
    built-in model's batch size), a TensorIR PrimFunc, a Relax IRModule, a torch.nn.Module with
    ``example_inputs`` (tensors or shapes), or the path of an ONNX file (``example_inputs`` gives
    shapes its inputs leave symbolic). ``dtype="float16"`` computes a model's convolutions and
    matmuls in half precision, accumulating in float32; its inputs and outputs keep their dtypes.
    ``dtype="bfloat16"`` computes its convolutions and matmuls by weights from bfloat16 operands into
    float32, with the CPU's bf16 dot product (AVX512_BF16) where it has one.
    ``trials`` is the number of candidates measured in total, counting earlier runs in the same
    ``work_dir``: running again on a work dir resumes it and measures nothing twice.
    ``transfer_from``: work dirs of earlier runs (other models) whose schedules for kernels of the
    same kind are tried first (``tuner.transfer``).
    ``cost_model_from``: work dirs of earlier runs whose cost models' training data warm-starts this
    run's cost model, without their schedules (``transfer_from`` does both).
    ``cluster`` runs the builds and measurements on a Ray cluster: "auto" (the one this machine
    belongs to), "HOST:PORT" of its head node, "ray://HOST:PORT", or "local" (a private Ray
    instance on this machine); None tunes with this machine's own worker processes.
    ``trials_per_task`` states the budget per kernel instead: ``trials`` becomes that many times the
    number of tasks (the scheduler still gives more to the tasks where they pay).
    ``lowering`` sets how a model is lowered to kernels (``tuner.lowering.LoweringOptions``: batch
    norms folded, fast math, layout-only kernels fused, weight layouts chosen by the schedules; all
    on by default).
    ``cold_cache=True`` times each CPU kernel with its arguments flushed from the caches (all but the
    first, TVM's way), as it meets data written by other kernels inside a model rather than left in
    cache by its own previous call; GPU kernels are always timed with the L2 flushed.

    ``stop`` adds cost objectives for the whole run (time, e.g. ``Objectives(seconds=600)``,
    energy, money budgets, or no improvement; the first one met ends it) and ``task_stop`` the same
    per task (a task that meets one gets no more trials). With no trials, no ``trials_per_task`` and
    no ``stop``, the budget is 32 trials per kernel (at least 64 in all), stated in the first
    progress line. ``verbose=True`` lets TVM's own C++ log lines reach the terminal (by default they
    go to the work dir's ``logs/libraries.log``; ``TENSOR_TUNER_VERBOSE=1`` does the same). ``scheduler`` is
    "gradient" (trials go where they cut the model's latency most) or "round-robin".
    ``filter=False`` measures every candidate the search proposes instead of skipping those the
    cost model predicts to be poor; a ``costmodel.FilterSettings`` sets how much it filters
    (``trimmer=`` is its former name and still works).
    """
    options = TuneOptions(
        target=target,
        trials=trials,
        work_dir=work_dir,
        stop=stop,
        task_stop=task_stop,
        scheduler=scheduler,
        filter=filter if trimmer is None else trimmer,
        example_inputs=example_inputs,
        batch=batch,
        dtype=dtype,
        batch_size=batch_size,
        build_workers=build_workers,
        seed=seed,
        verify=verify,
        progress=progress,
        transfer_from=transfer_from,
        cost_model_from=cost_model_from,
        cluster=cluster,
        lowering=lowering,
        trials_per_task=trials_per_task,
        cold_cache=cold_cache,
        verbose=verbose,
    )
    return run_tuning(model, options)
