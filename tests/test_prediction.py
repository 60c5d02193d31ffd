"""The analytic model's latency of a configured kernel (tuner.spaces.prediction): arithmetic at the calibrated rates,
the lanes a tile leaves empty, the bytes its schedule moves."""

from __future__ import annotations

import math

import pytest
import tvm
from analytic_facts import AVX512, loops_of
from bf16_builds import dense_module

from codegen.bf16_dot import AMX
from codegen.bf16_dot import AVX512 as BF16_DOT
from tuner.spaces.block_plan import BlockPlan, plan_block
from tuner.spaces.calibration import Calibration
from tuner.spaces.machine import MachineFacts
from tuner.spaces.prediction import (
    WEIGHTS_HIDDEN,
    bf16_product_outputs,
    lanes_used,
    materialized_bytes,
    predicted_seconds,
)
from tuner.spaces.register_tiles import RegisterFile


def test_a_products_prediction_counts_its_memory_on_top_of_its_arithmetic():
    """In a model a product's operands come from memory while it computes: the two are added, not
    overlapped, and a task count the cores do not divide leaves a core idle for part of the time."""
    loops = loops_of([512, 512], [512])
    plan = plan_block(loops, AVX512)
    measured = Calibration(product_gflops=200.0, bandwidth_gbs=20.0, launch_seconds=1e-6)
    flops, moved = 2 * 512**3, 3 * 512 * 512 * 4
    balance = plan.tasks / (math.ceil(plan.tasks / AVX512.cores) * AVX512.cores)
    expected = flops / 200e9 / balance + moved / 20e9 + 1e-6
    assert predicted_seconds(flops, moved, [plan], AVX512, measured) == pytest.approx(expected)
    assert predicted_seconds(0, moved, [], AVX512, measured) == pytest.approx(moved / 20e9 + 1e-6)
    with_peaks = Calibration(200.0, 20.0, 1e-6, fma_peak_gflops=250.0, bf16_peak_gflops=500.0)
    untiled = predicted_seconds(1e9, moved, [], AVX512, with_peaks, "bfloat16")  # at its precision's peak
    assert untiled == pytest.approx(1e9 / 500e9 + moved / 20e9 + 1e-6)


def test_a_bf16_products_prediction_takes_the_calibrated_rate_of_its_unit_not_the_units_peak():
    """AMX's peak is a rate of tiles already in registers: ResNet-18's bf16 convolutions ran at 13-35% of it,
    every prediction 1.3-2.2x too fast. The calibration's product in bf16 says what each unit's tiles reach
    (a network's first convolution computes on ``vdpbf16ps`` on an AMX machine too)."""
    peaks = {"fma_peak_gflops": 250.0, "bf16_peak_gflops": 6000.0}
    calibrated = Calibration(200.0, 20.0, 1e-6, **peaks, bf16_product_gflops=450.0, amx_product_gflops=1500.0)
    moved, rest = 1 << 20, (1 << 20) / 20e9 + 1e-6
    on = {unit: predicted_seconds(1e9, moved, [], AVX512, calibrated, "bfloat16", unit) for unit in (AMX, BF16_DOT)}
    assert on == {AMX: pytest.approx(1e9 / 1500e9 + rest), BF16_DOT: pytest.approx(1e9 / 450e9 + rest)}
    older = Calibration(200.0, 20.0, 1e-6, **peaks)  # a cache from before: no such figures
    assert predicted_seconds(1e9, moved, [], AVX512, older, "bfloat16", AMX) == pytest.approx(1e9 / 6000e9 + rest)


def test_an_amx_products_outputs_cost_what_the_calibrations_shallow_product_says():
    """An AMX tile's accumulators go through memory once per output (stored, then converted by vector code), as
    long as a 64-deep reduction takes on the unit: ResNet-50's 64 -> 256 1x1 ran at 0.4 of the rate of a 1152-deep
    product, and a prediction from one rate had such kernels 1.4-2.2x too fast. Predicted from the per-FLOP and
    per-output costs the calibration's two products give, each of them takes exactly the time it was timed at."""
    peaks = {"fma_peak_gflops": 250.0, "bf16_peak_gflops": 6000.0}
    amx = Calibration(200.0, 20.0, 0.0, **peaks, amx_product_gflops=2400.0, amx_shallow_gflops=1100.0)
    per_flop, per_output = amx.bf16_costs(AMX)
    assert per_output > 0 and 1 / per_flop > 2400e9  # a reduction step alone runs faster than the product
    for (rows, columns, depth), rate in (((784, 128, 1152), 2400.0), ((3136, 256, 64), 1100.0)):
        flops = 2 * rows * columns * depth
        alone = predicted_seconds(flops, 0, [], AVX512, amx, "bfloat16", AMX, outputs=rows * columns)
        assert alone == pytest.approx(flops / (rate * 1e9))
    # vdpbf16ps keeps its accumulators in registers: two products at one rate say no cost of an output
    dot = Calibration(200.0, 20.0, 0.0, **peaks, bf16_product_gflops=450.0, bf16_shallow_gflops=460.0)
    assert dot.bf16_costs(BF16_DOT) == (pytest.approx(1 / 450e9), 0.0)
    assert "an output" in amx.describe() and "an output" not in dot.describe()


def test_a_bf16_products_outputs_are_its_products_sums():
    """Counted on the product's block (``bf16_product``): a kernel with none has none."""
    assert bf16_product_outputs(dense_module(64, 128, 256)) == 64 * 128
    assert bf16_product_outputs(_reshaped_row_product()) == 0


def test_a_products_prediction_counts_the_vector_lanes_its_columns_leave_empty():
    """Swin-T's Q.K^T has 49 columns: tiled 7 wide, a vector instruction computes 7 of its 16 lanes."""
    measured = Calibration(product_gflops=200.0, bandwidth_gbs=20.0, launch_seconds=1e-6)
    ragged, whole = loops_of([192 * 49, 49], [32]), loops_of([192 * 49, 32], [49])
    ragged_plan, whole_plan = plan_block(ragged, AVX512), plan_block(whole, AVX512)
    assert ragged_plan.factors[1][-1] == 7 and lanes_used(ragged_plan, 16) == pytest.approx(7 / 16)
    assert lanes_used(whole_plan, 16) == 1.0
    flops = 2 * 192 * 49 * 49 * 32
    balance = ragged_plan.tasks / (math.ceil(ragged_plan.tasks / AVX512.cores) * AVX512.cores)
    expected = flops / (200e9 * balance * 7 / 16) + 1e-6
    assert predicted_seconds(flops, 0, [ragged_plan], AVX512, measured) == pytest.approx(expected)


def _reshaped_row_product() -> tvm.IRModule:
    """A row vector times an image read through a reshape (BiT's group-norm statistics): an intermediate
    the product reads, which a schedule may copy whole first or compute inside the product's loops."""
    from tvm import te

    image = te.placeholder((14, 14, 64), "float32", name="image")
    row = te.placeholder((196,), "float32", name="row")
    flat = te.compute((196, 64), lambda p, c: image[p // 14, p % 14, c], name="flat")
    k = te.reduce_axis((0, 196), "k")
    sums = te.compute((64,), lambda c: te.sum(row[k] * flat[k, c], axis=k), name="sums")
    return tvm.IRModule({"main": te.create_prim_func([image, row, sums])})


def test_an_intermediate_left_whole_by_the_schedule_is_a_pass_over_memory():
    """Copied whole before the product, the reshape is written and read once more; computed inside the
    product's loop nest, its values stay in the caches and nothing is counted."""
    mod = _reshaped_row_product()
    whole = tvm.s_tir.Schedule(mod)
    assert materialized_bytes(mod, whole) == 196 * 64 * 4
    inside = tvm.s_tir.Schedule(mod)
    (columns, _) = inside.get_loops(inside.get_sblock("sums"))
    inside.compute_at(inside.get_sblock("flat"), columns)
    assert materialized_bytes(mod, inside) == 0
    inlined = tvm.s_tir.Schedule(mod)
    inlined.compute_inline(inlined.get_sblock("flat"))
    assert materialized_bytes(mod, inlined) == 0


def test_half_of_a_products_weights_stream_hides_behind_its_arithmetic_and_no_other_kernels():
    """A product reads its packed weights in order while its FMAs run: half of the shorter of the two times is
    hidden (ResNet-18's 512-channel 3x3 convolutions ran 796-834 us in a model against 776 of arithmetic and 344 of
    weights). An element-wise kernel's weights, and every kernel's other bytes, stay on top of the rest."""
    machine = MachineFacts(RegisterFile(16, 32), cores=2, l1_bytes=48 << 10, l2_bytes=2 << 20, l3_bytes=130 << 20)
    plan = BlockPlan(factors={}, accumulators=16, reduction_run=64, tasks=2)
    measured = Calibration(100.0, 50.0, 0.0, memory_bandwidth_gbs=25.0)
    flops, weights, others = 100e6, 10e6, 5e6  # 1 ms of arithmetic, 0.4 ms of weights, 0.1 ms of other bytes
    product = predicted_seconds(flops, weights + others, [plan], machine, measured, weights=weights)
    assert product == pytest.approx(1e-3 + 0.4e-3 * (1 - WEIGHTS_HIDDEN) + 0.1e-3)
    assert 1e-3 + 0.1e-3 < product < 1e-3 + 0.4e-3 + 0.1e-3
    streamed = predicted_seconds(1e6, weights + others, [plan], machine, measured, weights=weights)  # a classifier
    assert streamed == pytest.approx(0.4e-3 + 0.01e-3 * (1 - WEIGHTS_HIDDEN) + 0.1e-3)
    untiled = predicted_seconds(0, weights + others, [], machine, measured, weights=weights)
    assert untiled == pytest.approx(0.4e-3 + 0.1e-3)
