"""The analytic model's latency of a configured kernel: the interpretable half of AutoConfig.

    seconds = FLOPs / (product rate x balance x lanes used) + bytes / bandwidth + a parallel launch
              - half the shorter of that arithmetic and its weights' stream (hidden behind the other)

for a product (a block ``analytic`` tiled), where the product rate is the calibrated rate of a model's product
(BERT-base's output projection, its weights packed) running from the caches on every core, ``balance`` the
share of the cores its parallel tasks keep busy (7 tasks on 2 cores: 7/8) and ``lanes used`` the share of a
vector register's lanes its register tile's columns fill: a vector instruction takes the register's width
whatever the loop's extent, so a column count the lanes do not divide wastes the rest (Swin-T's attention over
49 tokens, tiled 7 wide: 7 of AVX-512's 16 lanes; EfficientNet's 40 channels, 10 wide). A kernel with no tiled
block (element-wise kernels, reductions, depthwise convolutions) takes its FLOPs at its precision's measured
peak instead. A bf16 product in our rule's tiles (``bf16_rule``) takes

    FLOPs x (seconds per FLOP) + outputs x (seconds per output)

on the kernel's unit, both from the calibration's two bf16 products (a 1152-deep one and a 64-deep one with 8x the
outputs): ``vdpbf16ps``'s tiles run near its peak on Zen 4 and 5, AMX's far below it (the unit's peak counts tiles
already in registers; the deep product read 2,530-2,680 of 6,800-7,300 GFLOP/s on a 2-core Xeon), and an AMX tile's
accumulators go through memory once per output (stored, then converted by vector code): 60-85 ps an output there,
as long as a 64-deep reduction takes, where ``vdpbf16ps``'s stay in registers (17-49 ps). With one rate, ResNet-50's
64-deep 1x1 convolutions and BERT's attention products (K 64) were predicted 1.4-2.2x too fast, ResNet-18's 3x3
convolutions 1.3-1.5x too slow; with the two, 102-107 of 162 bf16 products of nine models were within 25% (85 before).
The bytes are its
arguments, and the intermediates its schedule computes in a loop nest of their own, each written and read
once (a Winograd kernel's transformed input and batched product, a reshape or slice left un-inlined).

A kernel's weights (its layout-free arguments, a model's constants) come at the bandwidth of a copy twice the
last-level cache, its other bytes at that of a 64 MB copy: a model reads each weight once an inference, after
every other kernel's bytes went through the caches, while a kernel's input was written just before by the one
ahead of it. On a 2-core Xeon VM that reports a 260 MB L3, the 64 MB copy ran at 41-53 GB/s, one twice the L3 at 22-25,
and the classifiers' 1-row products read their weights at 23-37 GB/s in the models (VGG-16's 411 MB, ResNet-50's
8 MB, MobileNetV2's 5 MB): with one bandwidth they were predicted 1.3-2.2x too fast; every byte at 25 GB/s took
the products within 25% from 294 of 370 to 246; weights alone at it, 302 -> 310 (21 gained, 13 lost: large
products whose weights stream while they compute, ConvNeXt's MLPs, now predicted 1.1-1.3x their time).

Memory is added to compute, not overlapped with it: inside a model a kernel's weights and inputs come
from memory, not from the caches the calibration's product ran in, and the loops TVM makes do not
prefetch them. Counted so, the prediction came within 25% of the kernel's time in the model for 161 of
212 products of 15 models (the roofline's maximum of the two: 102) and for 83 of 144 of five models
measured afterwards; the lanes, added next (planned before it was tried on them), took the 365 products
of those 21 models from 249 within 25% to 261 (ragged column counts: 6 of 23 to 17). Counting every
intermediate the schedule leaves whole (until December 2026 only those one reduction handed another) took
the 601 recorded products of 38 models on a Zen 5 from 466 within 25% to 477. Since December 2026 half of the
shorter of a product's arithmetic and its weights' stream is hidden behind the other (``WEIGHTS_HIDDEN``): it
reads its packed weights in order, and the hardware prefetcher brings the next panel while the FMAs run on the
last (ResNet-18's 512-channel 3x3 convolutions, 776 us of arithmetic and 344 of weights, ran 796-834 us in the
model on a 2-core Xeon with AMX); on the records of 19 models on five CPUs the products within 25% went from 857
of 1,148 to 870, on that Xeon's 23 models predicted again from 263 of 425 to 297 (docs/analytic.md). The rest are
where the schedule is what is slow, or where the kernel's time in the model is not one figure: a short
kernel's time on a VM moves with the machine more than a product's (Hugging Face's MobileNetV2 read its
depthwise kernels at 2.8-3.6x their prediction in one run and within 25% in the next; called in the same
rounds, they ran alike in torchvision's and Hugging Face's models: experiments/results/in_model_gap/
mobilenetv2_zen5.md). The kernel is otherwise
taken to run at its precision's ceiling: where the measured latency is far above the prediction, the
schedule is what is wrong, and that is where tuning pays. The predictions are at the calibration's speed;
a run's summary divides them by the machine's speed while its kernels were timed (``machine_speed``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import ScheduleError

from . import metaschedule as msc
from .analytic import AnalyticSchedule
from .bf16_rule import UNIT_ANNOTATION
from .block_plan import BlockPlan
from .block_reads import block_points, tensor_bytes
from .calibration import Calibration, calibration
from .machine import MachineFacts

WEIGHTS_HIDDEN = 0.5  # of a product's weights' stream or of its arithmetic, whichever is shorter (module docstring)


def predicted_seconds(
    flops: float,
    bytes_moved: int,
    plans: Sequence[BlockPlan],
    facts: MachineFacts,
    measured: Calibration,
    dtype: str = "float32",
    bf16_unit: str | None = None,
    outputs: int = 0,
    weights: int = 0,
) -> float:
    """Seconds per launch of a kernel of ``flops`` moving ``bytes_moved``, ``weights`` of them its weights: tiled
    by ``plans``, in our bf16 rule's tiles on ``bf16_unit`` (its product computing ``outputs``), or neither (the
    module's docstring)."""
    streamed = measured.memory_bandwidth_gbs or measured.bandwidth_gbs
    others = (bytes_moved - weights) / (measured.bandwidth_gbs * 1e9)
    streaming = weights / (streamed * 1e9)
    bf16_costs = measured.bf16_costs(bf16_unit) if bf16_unit is not None else None
    if bf16_costs:
        per_flop, per_output = bf16_costs
        compute = flops * per_flop + outputs * per_output
    elif plans:
        compute = flops / (measured.product_gflops * 1e9 * plan_efficiency(plans, facts))
    else:
        peak = measured.peak_gflops(dtype)
        return (flops / (peak * 1e9) if peak else 0.0) + others + streaming + measured.launch_seconds
    hidden = WEIGHTS_HIDDEN * min(compute, streaming)  # the part of the weights' stream the FMAs run through
    return compute + streaming - hidden + others + measured.launch_seconds


def plan_efficiency(plans: Sequence[BlockPlan], facts: MachineFacts) -> float:
    """The share of the calibrated product rate a tiled kernel reaches: the cores its parallel tasks keep busy
    (7 tasks on 2 cores: 7/8) times the vector lanes its register tile fills."""
    tasks = min(plan.tasks for plan in plans)
    balance = tasks / (math.ceil(tasks / facts.cores) * facts.cores)
    return balance * min(lanes_used(plan, facts.registers.lanes) for plan in plans)


def lanes_used(plan: BlockPlan, lanes: int) -> float:
    """The share of its vector registers' ``lanes`` a plan's register tile fills: its columns (the
    vectorised loop's innermost factor) over the lanes of the vectors they take. A tile one column wide
    is not vectorised along its columns at all (LLVM takes another loop: BEiT's Q.K^T over 197 tokens,
    a prime, ran at 198 GFLOP/s): 1 there."""
    vector = next((loop for loop in plan.loops if loop.role == "vector"), None)
    columns = plan.factors[vector.index][-1] if vector is not None else 1
    return 1.0 if columns == 1 else columns / (math.ceil(columns / lanes) * lanes)


def predict_kernel(
    mod: tvm.IRModule, flops: float, configured: AnalyticSchedule, target: tvm.target.Target
) -> float | None:
    """Seconds per launch of ``mod`` with its analytic schedule ``configured``; None off a CPU."""
    facts = MachineFacts.of(target)
    if facts is None:
        return None
    moved = bytes_moved(mod, configured)
    measured = calibration(target)
    unit = configured.bf16_unit
    outputs = bf16_product_outputs(mod) if unit is not None else 0
    weights = msc.weight_bytes(mod)
    return predicted_seconds(flops, moved, configured.plans, facts, measured, precision(mod), unit, outputs, weights)


def bytes_moved(mod: tvm.IRModule, configured: AnalyticSchedule) -> int:
    """The bytes a kernel moves with its analytic schedule: its arguments, and each intermediate the schedule
    leaves whole written and read once (module docstring)."""
    return msc.kernel_bytes(mod) + 2 * materialized_bytes(mod, configured.sch)


def bf16_product_outputs(mod: tvm.IRModule) -> int:
    """The outputs (fp32 sums) of the bf16 products in ``mod`` (blocks of our bf16 rule, ``bf16_product``)."""
    return sum(
        block_points(block, tvm.tirx.IterVar.DataPar)
        for block in msc.root_blocks(mod)
        if UNIT_ANNOTATION in block.annotations
    )


def materialized_bytes(mod: tvm.IRModule, sch: Schedule) -> int:
    """Bytes of ``mod``'s intermediate buffers that its schedule ``sch`` computes in a loop nest of their own
    and reads in another: each a pass of its own over memory, written once and read once. A producer
    computed inside its consumer's tiles (an epilogue, a padded tile) hands its values over in the caches and
    is not counted; one left whole is: a Winograd kernel's transformed input and batched product, a reshape
    or a slice the schedule did not inline (BiT's group-norm statistics read their input through a reshape
    copied whole first: 0.8 MB each way, 10 us predicted without it, 27 with it, 32-67 measured in the model)."""
    try:
        root = sch.get_sblock("root")
        unscheduled = Schedule(mod)
        intermediates = {buffer.name for buffer in unscheduled.get(unscheduled.get_sblock("root")).alloc_buffers}
    except ScheduleError:  # no block named root (an extern kernel, one opaque block)
        return 0
    blocks = sch.get_child_blocks(root)

    def outermost_loop(block):
        loops = sch.get_loops(block)
        return sch.get(loops[0]) if loops else None

    total = 0
    for buffer in sch.get(root).alloc_buffers:
        if buffer.name not in intermediates:  # the schedule's own: a layout rewrite's, a tile's accumulator
            continue
        writers = [b for b in blocks if any(region.source.same_as(buffer) for region in sch.get(b).writes)]
        readers = [b for b in blocks if any(region.source.same_as(buffer) for region in sch.get(b).reads)]
        if not writers or not readers:
            continue
        nest = outermost_loop(writers[0])
        shared = nest is not None and all(
            (loop := outermost_loop(reader)) is not None and nest.same_as(loop) for reader in readers
        )
        if not shared:
            total += tensor_bytes(buffer)
    return total


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
