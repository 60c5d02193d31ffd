"""The analytic model's latency of a configured kernel: the interpretable half of AutoConfig.

    seconds = max(FLOPs / (product rate x balance), bytes / bandwidth) + a parallel launch

for a product (a block ``analytic`` tiled), where the product rate is the calibrated rate of a product
running from the caches on every core and ``balance`` the share of the cores its parallel tasks keep
busy (7 tasks on 2 cores: 7/8); a kernel with no tiled block is counted by its bytes alone. The kernel
is taken to run at its precision's ceiling: where the measured latency is far above the prediction, the
schedule (or the model) is what is wrong, and that is where tuning pays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm

from . import metaschedule as msc
from .analytic import AnalyticSchedule, BlockPlan
from .calibration import Calibration, calibration
from .machine import MachineFacts


def predicted_seconds(
    flops: float, bytes_moved: int, plans: Sequence[BlockPlan], facts: MachineFacts, measured: Calibration
) -> float:
    memory = bytes_moved / (measured.bandwidth_gbs * 1e9)
    compute = 0.0
    if plans:
        tasks = min(plan.tasks for plan in plans)
        balance = tasks / (math.ceil(tasks / facts.cores) * facts.cores)
        compute = flops / (measured.product_gflops * 1e9 * balance)
    return max(compute, memory) + measured.launch_seconds


def predict_kernel(
    mod: tvm.IRModule, flops: float, configured: AnalyticSchedule, target: tvm.target.Target
) -> float | None:
    """Seconds per launch of ``mod`` with its analytic schedule ``configured``; None off a CPU."""
    facts = MachineFacts.of(target)
    if facts is None:
        return None
    return predicted_seconds(flops, msc.kernel_bytes(mod), configured.plans, facts, calibration(target))


def precision(mod: tvm.IRModule) -> str:
    """The precision a kernel computes its products in: bfloat16 where any argument is, else float32."""
    return "bfloat16" if any(str(param.dtype) == "bfloat16" for param in mod["main"].params) else "float32"


def peak_gflops(mod: tvm.IRModule, target: tvm.target.Target) -> float | None:
    """The compute peak of ``mod``'s precision on this machine (``calibration``); None off a CPU."""
    if MachineFacts.of(target) is None:
        return None
    return calibration(target).peak_gflops(precision(mod))


def floor_seconds(mod: tvm.IRModule, flops: float, target: tvm.target.Target) -> float:
    """Seconds per launch no schedule of ``mod`` can beat on this machine: its FLOPs at its precision's
    peak, or its arguments moved at full bandwidth, whichever is slower; 0 where unknown (off a CPU)."""
    if MachineFacts.of(target) is None:
        return 0.0
    measured = calibration(target)
    peak = measured.peak_gflops(precision(mod))
    compute = flops / (peak * 1e9) if peak else 0.0
    return max(compute, msc.kernel_bytes(mod) / (measured.bandwidth_gbs * 1e9))
