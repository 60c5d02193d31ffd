"""Per kernel, what the report sets side by side: the analytic model's predicted latency, the analytic
schedule's measured one (where the search measured it), the kernel's time inside the compiled model,
and the peak of its precision on this machine, from which its fraction of peak."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import tvm

from tuner.database.database import TuningDatabase
from tuner.database.workdir import ANALYTIC_SEEDS_KEY
from tuner.spaces.analytic import AnalyticSchedule
from tuner.spaces.prediction import peak_gflops, predict_kernel
from tuner.tasks.extraction import Task


@dataclass(frozen=True)
class KernelFigures:
    predicted: float | None = None  # seconds per launch of its analytic schedule, by the analytic model
    analytic_measured: float | None = None  # of its analytic schedule, measured alone by the search
    in_model: float | None = None  # seconds per launch inside the compiled model
    peak_gflops: float | None = None  # of its precision on this machine
    tiled: bool = False  # a product: its analytic schedule has a tile of its own (``AnalyticSchedule.product``)
    # built with its analytic schedule, judged faster inside the model than its best tuned one: that one's
    # seconds per launch there (``in_model_choice``)
    tuned_in_model: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def fraction_of_peak(flops: float, latency: float | None, peak_gflops: float | None) -> float | None:
    """A kernel's FLOPs per second over its precision's peak; None where any of them is unknown."""
    if not (latency and flops and peak_gflops):
        return None
    return flops / latency / 1e9 / peak_gflops


def at_machine_speed(predicted: float | None, machine_speed: float | None) -> float | None:
    """A prediction (at the calibration's speed) at the speed the machine ran the model's kernels at, where
    that speed was read; else as it is."""
    return predicted / machine_speed if predicted and machine_speed else predicted


def kernel_figures(
    tasks: list[Task],
    db: TuningDatabase,
    target: tvm.target.Target,
    configured: dict[str, AnalyticSchedule],
    in_model: dict[str, float],
    beaten_in_model: dict[str, float] | None = None,
) -> dict[str, KernelFigures]:
    """The figures of every task: kernels built with their analytic schedule are predicted here; searched
    ones carry the prediction the search kept beside their analytic candidate. ``beaten_in_model``: by kernel
    built with its analytic schedule for running faster inside the model, its tuned one's seconds per launch there."""
    seeds = db.get_meta(ANALYTIC_SEEDS_KEY, {})
    latency = {(record.kernel_id, record.candidate): record.latency for record in db.records(str(target))}
    figures = {}
    for task in tasks:
        predicted = measured = None
        tiled = False
        if task.name in configured:
            predicted = predict_kernel(task.mod, task.flops, configured[task.name], target)
            tiled = configured[task.name].product
        else:
            kernel_id = db.find_kernel(task.mod)
            seed = seeds.get(str(kernel_id))
            if seed is not None:
                predicted, tiled = seed["predicted"], seed.get("tiled", False)
                measured = latency.get((kernel_id, seed["candidate"]))
        peak = peak_gflops(task.mod, target)
        beaten = (beaten_in_model or {}).get(task.name)
        figures[task.name] = KernelFigures(predicted, measured, in_model.get(task.name), peak, tiled, beaten)
    return figures
