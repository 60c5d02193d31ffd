"""``tune()`` of a torch module TVM's importer takes only in part.

The module is cut around the operators the importer refused (``split.split_graph``, as the torch.compile
door cuts a graph); each piece that holds a matmul or a convolution is tuned and compiled by the normal
pipeline as a model of its own, in a work dir of its own under the run's (``WORK_DIR/tvm_piece_N``: its
database, cost model and library; re-running resumes each). The refused operators, and the pieces not
worth a tuning run, run in PyTorch between them. The whole is then checked against the module itself on
its example inputs, with the tolerance of the normal end-to-end check, and timed.

The pieces share the run's budget, tuned one after the other:
- ``trials`` (and a ``stop``'s trials): what is left is divided evenly among the pieces still to tune, so
  trials a piece does not use go to the next; ``trials=0`` gives every piece its analytic schedules;
- ``trials_per_task``, the default budget (per kernel) and ``task_stop``: each piece's, as they are;
- a time budget: what is left of the call's is divided evenly among the pieces still to tune (the final
  check and timing of the whole, a few calls, are not reserved);
- energy and money: an equal share per piece; a no-improvement objective: each piece's own.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from common.error_text import error_line
from tuner.compile.check import ModelCheck, as_outputs, largest_value, precision_tolerance, relative_error
from tuner.database.workdir import WorkDir
from tuner.errors import PARTITION_HINT, ModelError
from tuner.options import TuneOptions
from tuner.progress import Progress
from tuner.result import TuneResult
from tuner.targets import resolve_target

from .result import PartitionedModel, PartitionedResult
from .split import Split, split_graph

__all__ = ["piece_budget", "tune_in_pieces"]

TIMED_CALLS = 10  # the whole model's latency: the median of this many calls, after one to warm up

TunePiece = Callable[[Any, TuneOptions], TuneResult]


def tune_in_pieces(refusal: ModelError, options: TuneOptions, started: float, tune_piece: TunePiece) -> TuneResult:
    """The torch module ``refusal`` names (its ``source``) tuned in pieces around the operators it names
    (``unsupported``); ``tune_piece`` tunes one piece (``tuner.run.run_tuning``). A ModelError in one line
    where no piece is worth tuning or none can be compiled."""
    from workloads.torch_prepass import FlatOutputs  # torch's: imported with it

    source = refusal.source
    assert source is not None, "tune_in_pieces needs the refused torch module"
    module = FlatOutputs(source.module).eval()  # its output's tensors as a flat tuple, as the split returns them
    try:
        split = split_graph(module, source.examples, refusal.unsupported)
    except Exception as err:  # noqa: BLE001 - export and partitioning are torch's: said in one line
        raise ModelError(f"{refusal}; cutting it around them failed ({error_line(err)}){PARTITION_HINT}") from None
    if split is None:
        raise ModelError(
            f"{refusal}; and no part of it TVM takes holds a matmul or convolution worth tuning: run it in PyTorch"
        )
    work_dir = WorkDir.create(options.work_dir, source.name, resolve_target(options.target))
    report = Progress(enabled=options.progress)
    report.line(
        f"{source.name}: TVM's importer does not take {', '.join(split.refused)}: those run in PyTorch, the rest "
        f"in {len(split.pieces)} piece(s) tuned one by one in {work_dir.path}"
    )
    pieces = _tune_pieces(split, options, work_dir, started, tune_piece, report)
    if not pieces:
        raise ModelError(f"{refusal}; and none of its pieces TVM takes could be compiled: run it in PyTorch")
    model = PartitionedModel(split, source.name)
    check = _check(module, model, source.examples, options.dtype)
    latency = _latency(model, source.examples)
    wall = time.monotonic() - started
    result = PartitionedResult.of(
        source.name, work_dir.path, pieces, split.refused, model, source.examples, check, latency, wall
    )
    report.line(result.summary())
    return result


def _tune_pieces(
    split: Split, options: TuneOptions, work_dir: WorkDir, started: float, tune_piece: TunePiece, report: Progress
) -> dict[str, TuneResult]:
    """Each piece tuned and installed in ``split``, with its share of the budget; a piece TVM cannot take
    after all stays in PyTorch, said in one line."""
    tuned: dict[str, TuneResult] = {}
    trials_left = options.trials
    for index, piece in enumerate(split.pieces):
        left = len(split.pieces) - index
        budget = piece_budget(options, left, len(split.pieces), trials_left, time.monotonic() - started)
        piece_options = replace(
            options,
            **budget,
            work_dir=work_dir.path / piece.name,
            example_inputs=piece.examples,
            batch=None,
            partition=False,
        )
        try:
            result = tune_piece(piece.module, piece_options)
        except ModelError as err:
            report.line(f"{piece.name} runs in PyTorch: {err}")
            continue
        split.install(piece, result.compiled())
        tuned[piece.name] = result
        if trials_left is not None:
            trials_left = max(trials_left - result.trials, 0)
    return tuned


def piece_budget(
    options: TuneOptions, left: int, count: int, trials_left: int | None, elapsed: float
) -> dict[str, Any]:
    """``trials`` and ``stop`` for the next of ``left`` pieces (of ``count``) to tune: an even share of
    ``trials_left`` and of the time left ``elapsed`` seconds into the call; energy and money 1/``count``."""
    budget: dict[str, Any] = {}
    if trials_left is not None:
        budget["trials"] = math.ceil(trials_left / left)
    stop = options.stop
    if stop is not None:
        shares: dict[str, Any] = {}
        if stop.trials is not None:
            shares["trials"] = max(math.ceil(stop.trials / count), 1)
        if stop.seconds is not None:
            shares["seconds"] = max((stop.seconds - elapsed) / left, 1e-3)  # none left: analytic schedules
        if stop.joules is not None:
            shares["joules"] = stop.joules / count
        if stop.money is not None:
            shares["money"] = stop.money / count
        budget["stop"] = replace(stop, **shares)
    return budget


def _check(module: Any, model: PartitionedModel, examples: Sequence[Any], dtype: str | None) -> ModelCheck:
    """The whole (compiled pieces and PyTorch between them) against the module, on its example inputs."""
    import torch

    with torch.no_grad():
        expected = as_outputs(list(module(*examples)))
    outputs = as_outputs(model.outputs(*examples))
    return ModelCheck("PyTorch", relative_error(outputs, expected), largest_value(expected), precision_tolerance(dtype))


def _latency(model: PartitionedModel, examples: Sequence[Any]) -> float:
    """Median seconds of a call of the whole, in this process."""
    model.outputs(*examples)
    seconds = []
    for _ in range(TIMED_CALLS):
        begun = time.perf_counter()
        model.outputs(*examples)
        seconds.append(time.perf_counter() - begun)
    return statistics.median(seconds)
