"""Analytic configuration (tuner.spaces.analytic): the factors it derives from a kernel's loops and the
machine's facts, the schedule it makes of a real kernel, and the doors that use it (``trials=0``, and
each task's first candidate in a search)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import numpy as np
import pytest
import tvm
from analytic_facts import AVX2, AVX512, check_factors, loops_of
from bf16_builds import dense_module, needs_bf16

from codegen.bf16_dot import AVX512 as BF16_DOT
from common.host import CacheLevel, data_caches
from tuner import tune
from tuner.spaces import metaschedule as msc
from tuner.spaces.analytic import INLINED, MAX_INLINED_PAD_ROWS, configure_kernel
from tuner.spaces.block_plan import plan_block
from tuner.spaces.block_reads import copied_by_tasks
from tuner.spaces.machine import MachineFacts
from tuner.spaces.register_tiles import RegisterFile
from tuner.targets import resolve_target
from workloads import load_workload


def test_a_matmuls_register_tile_fills_the_registers_and_its_reduction_run_fits_l1():
    loops = loops_of([512, 512], [512])
    plan = plan_block(loops, AVX512)
    check_factors(loops, plan)
    rows, columns, run = plan.factors[0][-1], plan.factors[1][-1], plan.factors[2][-1]
    assert columns % 16 == 0 and plan.accumulators == rows * columns // 16
    assert AVX512.registers.min_accumulators <= plan.accumulators <= AVX512.registers.max_accumulators
    assert plan.accumulators == 16  # 512's divisors allow no 24: 4 rows x 4 vectors, the fewest loads
    assert run == plan.reduction_run == 64 and run * columns * 4 <= AVX512.l1_bytes // 2
    assert plan.tasks % AVX512.cores == 0 and plan.tasks >= AVX512.cores


def test_fewer_registers_make_a_smaller_tile():
    plan = plan_block(loops_of([384, 768], [768]), AVX2)
    assert AVX2.registers.min_accumulators <= plan.accumulators <= AVX2.registers.max_accumulators == 12
    assert plan.tasks % AVX2.cores == 0


def test_a_late_convolution_splits_its_weights_across_the_cores_an_early_one_its_image():
    """7x7x512 from 3x3x512: 9 MB of weights, split by output channels; 56x56x64 from 3x3x64: the image
    is what is large, split by rows."""
    late = loops_of([1, 7, 7, 512], [3, 3, 512])
    plan = plan_block(late, AVX512)
    check_factors(late, plan)
    assert plan.factors[3][0] == plan.tasks >= AVX512.cores  # all of S0 on the channels
    early = loops_of([1, 56, 56, 64], [3, 3, 64])
    plan = plan_block(early, AVX512)
    check_factors(early, plan)
    assert plan.factors[3][0] == 1 and plan.tasks >= AVX512.cores


def test_where_reads_tie_a_products_tasks_split_its_outermost_loops_as_an_element_wise_kernel_does():
    """The attention block's QK^T, 4 heads of 256 x 16 x 256: every split reads less than L2, so the heads
    split first (the softmax after it takes heads on each core), not rows and columns."""
    scores = loops_of([4, 256, 256], [16])
    plan = plan_block(scores, AVX512)
    check_factors(scores, plan)
    assert plan.factors[0][0] == 4 and plan.factors[2][0] == 1 and plan.tasks == 4 * AVX512.cores


def test_a_product_whose_weights_exceed_l3_reads_each_weight_tile_once_for_all_its_rows():
    """Llama-3-8B's FFN down product, 128 x 14336 x 4096: 235 MB of weights. Rows blocked to fit L2 (8 at a
    time) streamed a task's weights from memory once per block of rows, 16 times; all 128 rows in the block,
    each weight tile in L1 serves every row. A product whose weights fit in L3 keeps its rows blocked to L2."""
    streamed = loops_of([128, 4096], [14336])
    plan = plan_block(streamed, AVX512)
    check_factors(streamed, plan)
    assert plan.factors[0][:2] == [1, 1] and plan.factors[0][2] * plan.factors[0][3] == 128
    cached = loops_of([1024, 1024], [1024])  # 4 MB of weights
    plan = plan_block(cached, AVX512)
    assert plan.factors[0][1] > 1 and plan.factors[0][2] * plan.factors[0][3] * 1024 * 4 <= AVX512.l2_bytes // 2


def test_a_loop_without_whole_vectors_still_gets_a_plan():
    loops = loops_of([197, 10], [64])
    plan = plan_block(loops, AVX512)
    check_factors(loops, plan)
    assert plan.factors[1][-1] in (1, 2, 5, 10)


def test_the_machine_facts_come_from_the_target_and_the_caches(tmp_path):
    haswell = MachineFacts.of(resolve_target("llvm -mcpu=haswell -num-cores=4"))
    assert haswell.registers == RegisterFile(lanes=8, registers=16) and haswell.cores == 4
    assert haswell.l1_bytes > 0 and haswell.l2_bytes >= haswell.l1_bytes
    assert MachineFacts.of(tvm.target.Target({"kind": "c"})) is None
    for index, (level, kind, size, shared) in enumerate(
        [
            (1, "Data", "48K", "0"),
            (1, "Instruction", "32K", "0"),
            (2, "Unified", "2048K", "0"),
            (3, "Unified", "32M", "0-7"),
        ]
    ):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (folder / name).write_text(f"{value}\n")
    assert data_caches(tmp_path) == (CacheLevel(1, 48 << 10, 1), CacheLevel(2, 2 << 20, 1), CacheLevel(3, 32 << 20, 8))
    assert data_caches(tmp_path / "missing")[0].level == 1  # a common core's, where the OS says nothing


def test_a_kernels_analytic_schedule_takes_the_plan_and_computes_the_product():
    workload = load_workload("matmul-128")
    target = resolve_target("llvm")
    configured = configure_kernel(workload.mod, target)
    assert configured is not None and len(configured.plans) == 1
    (plan,) = configured.plans
    trace = configured.sch.trace
    decisions = [[int(v) for v in trace.decisions[i]] for i in trace.insts if i.kind.name == "SamplePerfectTile"]
    assert decisions == [plan.factors[i] for i in sorted(plan.factors)]
    assert configure_kernel(workload.mod, target) is not None  # deterministic: the same again
    assert msc.structural_key(configure_kernel(workload.mod, target).sch.mod) == msc.structural_key(configured.sch.mod)
    lib = tvm.compile(configured.sch.mod, target=target)
    a, b = np.random.rand(128, 128).astype("float32"), np.random.rand(128, 128).astype("float32")
    c = tvm.runtime.tensor(np.zeros((128, 128), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4)
    assert configure_kernel(workload.mod, tvm.target.Target({"kind": "cuda", "arch": "sm_80"})) is None


def test_no_trials_compiles_the_analytic_schedules_checked_and_timed(tmp_path):
    result = tune("matmul-128", trials=0, work_dir=tmp_path, progress=False)
    (task,) = result.tasks
    assert result.trials == 0 and task.analytic and task.trials == 0 and "sample_perfect_tile" in task.schedule
    assert result.latency_after > 0 and "analytic schedule" in result.summary()
    a, b = np.random.rand(128, 128).astype("float32"), np.random.rand(128, 128).astype("float32")
    _, _, c = result.run(a, b, np.zeros((128, 128), "float32"))
    np.testing.assert_allclose(c, a @ b, rtol=1e-4)
    with sqlite3.connect(tmp_path / "tuning.db") as db:
        assert db.execute("SELECT COUNT(*) FROM records").fetchone() == (0,)


@pytest.mark.parametrize("trials", [-1, 1.5])
def test_a_budget_below_zero_or_not_whole_is_refused(trials, tmp_path):
    from tuner import TunerError

    with pytest.raises(TunerError, match="whole number"):
        tune("matmul-128", trials=trials, work_dir=tmp_path, progress=False)


def _pad_locations(mod: tvm.IRModule) -> list[int]:
    """Where a convolution's analytic schedule computes its pad (SampleComputeLocation's decisions)."""
    configured = configure_kernel(mod, resolve_target("llvm"))
    assert configured is not None and configured.plans
    trace = configured.sch.trace
    return [int(trace.decisions[i]) for i in trace.insts if i.kind.name == "SampleComputeLocation"]


def test_a_convolutions_pad_is_computed_at_the_root_not_inlined_into_its_innermost_loop():
    # the pad, once, at the root (-2 would inline it)
    assert _pad_locations(load_workload("conv2d-resnet18-l2").mod) == [-1]


def test_a_depthwise_convolutions_pad_is_inlined_its_bounds_test_outside_any_channel_reduction():
    # at the root, a pass of its own over the padded image
    assert _pad_locations(load_workload("depthwise-conv2d-mobilenetv2-b4").mod) == [-2]


def _grouped_conv_nhwc(size: int, channels: int, groups: int, stride: int) -> tvm.IRModule:
    from tvm import te, topi

    data = te.placeholder((1, size, size, channels), "float32", name="data")
    weight = te.placeholder((3, 3, channels // groups, channels), "float32", name="weight")
    out = topi.nn.relu(topi.nn.group_conv2d_nhwc(data, weight, stride, 1, 1, groups, "float32"))
    return msc.normalize_prim_func_module(te.create_prim_func([data, weight, out]))


def test_a_grouped_convolutions_pad_is_computed_in_its_parallel_tasks_and_its_result_unchanged():
    """RegNet's stride-2 3x3 convolution over 8 groups of 64 channels: each parallel task (a group's output
    channels here) pads the channels it reads; at the root, the pad was a pass of its own over the image."""
    target = resolve_target("llvm")
    mod = _grouped_conv_nhwc(28, 512, 8, 2)
    configured = configure_kernel(mod, target)
    trace = configured.sch.trace
    (location,) = [int(trace.decisions[i]) for i in trace.insts if i.kind.name == "SampleComputeLocation"]
    loops = configured.sch.get_loops(configured.sch.get_sblock("pad_temp"))
    assert location >= 0 and len(loops) > 3  # under a loop of the tasks, not the root (-1) nor inlined (-2)
    _check_configured_result(_grouped_conv_nhwc(14, 128, 2, 1))


def _check_configured_result(mod: tvm.IRModule) -> None:
    """The kernel's analytic schedule computes what the kernel unscheduled does."""
    target = resolve_target("llvm")
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in mod["main"].params[:2]]
    results = []
    for schedule in (configure_kernel(mod, target).sch.mod, mod):
        out = tvm.runtime.tensor(np.zeros([int(d) for d in mod["main"].params[2].shape], "float32"))
        tvm.compile(schedule, target=target)["main"](*[tvm.runtime.tensor(a) for a in args], out)
        results.append(out.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-4)


def test_a_strided_grouped_convolutions_pad_is_inlined_under_a_short_register_tile_and_its_result_unchanged():
    """RegNet's first strided 3x3 convolution (2 groups of 64 channels, a 4-row tile): padded in its tasks, the
    copy took a tenth of its time; inlined, 1,700 -> 1,580 us in the model (Emerald Rapids). Unstrided, the same
    convolution's pad stays in its tasks."""
    first = _grouped_conv_nhwc(112, 128, 2, 2)
    assert configure_kernel(first, resolve_target("llvm")).plans[0].tile_rows <= MAX_INLINED_PAD_ROWS
    assert _pad_locations(first) == [INLINED]
    (unstrided,) = _pad_locations(_grouped_conv_nhwc(56, 128, 2, 1))
    assert unstrided >= 0
    small = _grouped_conv_nhwc(14, 128, 2, 2)
    assert _pad_locations(small) == [INLINED]
    _check_configured_result(small)


def test_a_grouped_convolution_whose_column_tiles_split_a_group_still_gets_its_schedule():
    """RegNet's last strided 3x3 convolution: 17 groups of 64 channels over 2 tasks, so a task's column tiles of
    32 channels split a group. Padded per column tile (inside S1), the pad's region was no static loop and every
    postprocessed space was rejected (DisallowDynamicLoop): the kernel ran unscheduled, 38 ms for 0.3."""
    configured = configure_kernel(_grouped_conv_nhwc(14, 1088, 17, 2), resolve_target("llvm"))
    assert configured is not None and configured.plans


def test_a_grouped_convolutions_tasks_each_pad_no_more_of_the_image_than_half_an_l2_holds():
    """RegNet's first strided 3x3 convolution, 112 x 112 x 128 in 2 groups: its padded image (6.6 MB) split over
    4 tasks by rows (what reads the least weights) made each task write 1.7 MB of pad before reading it back,
    more than half of an Emerald Rapids' 2 MiB L2 with the block's outputs beside it; 8 tasks of 0.8 MB ran in
    0.85-0.88 of its time alone. A plain convolution's tasks copy nothing and split as before."""
    copied = copied_by_tasks(_grouped_conv_nhwc(112, 128, 2, 2))
    assert copied == 114 * 114 * 128 * 4  # the pad, the one block the convolution reads by groups
    assert copied_by_tasks(load_workload("conv2d-resnet18-l2").mod) == 0
    loops = loops_of([1, 56, 56, 128], [3, 3, 64])
    assert plan_block(loops, AVX512).tasks * AVX512.l2_bytes // 2 < copied
    plan = plan_block(loops, AVX512, copied_by_tasks=copied)
    check_factors(loops, plan)
    assert plan.tasks * AVX512.l2_bytes // 2 >= copied and plan.tasks % AVX512.cores == 0


def test_weights_as_given_keep_their_column_tiles_inside_the_row_tiles():
    """An operator's matmul, its weights not laid out by the schedule: a column tile's run of them is R1 rows 4 KB
    apart, all in the same L1 sets, so its weights cannot stay in L1 over the rows; the columns stay in S2 (in
    BLIS's order matmul-1024 ran 15% slower alone, Llama-2's 32 x 4096 x 4096 30%)."""
    loops = loops_of([1024, 1024], [1024])
    assert plan_block(loops, AVX512, packed_weights=False).factors[1][2] > 1
    assert plan_block(loops, AVX512).factors[1][2] == 1
    configured = configure_kernel(load_workload("matmul-1024").mod, resolve_target("llvm"))
    (plan,) = configured.plans
    vector = next(loop for loop in plan.loops if loop.role == "vector")
    assert plan.factors[vector.index][2] > 1, plan


def test_a_kernel_whose_plans_every_space_rejects_still_gets_a_drawn_schedule(monkeypatch):
    """A plan no space takes (here a fault put in: one factor more than its split has) leaves the product
    the seeded draw of its space, not TVM's unscheduled loops; the draw computes the product right."""
    from tuner.spaces import analytic

    def broken(*arguments):
        plan = plan_block(*arguments)
        return replace(plan, factors={index: [1, *factors] for index, factors in plan.factors.items()})

    monkeypatch.setattr(analytic, "plan_block", broken)
    target = resolve_target("llvm")
    mod = load_workload("matmul-512").mod
    configured = configure_kernel(mod, target)
    assert configured is not None and configured.plans == ()
    assert any(inst.kind.name == "Split" for inst in configured.sch.trace.insts)  # tiled, not the default loops
    rng = np.random.default_rng(0)
    params = mod["main"].params
    a, b = (rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in params[:2])
    out = tvm.runtime.tensor(np.zeros([int(d) for d in params[2].shape], "float32"))
    tvm.compile(configured.sch.mod, target=target)["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("reduction", [768, 3072])
def test_a_blocks_row_tiles_share_its_weights_columns_and_its_inputs_stay_in_l2(reduction):
    """BERT's products: S2 holds row tiles and one column tile, so a column tile's weights (one run of them, in
    L1) serve every row of the block before the next column tile's come in (BLIS's order; with the columns
    inside the rows they cycled through L1 once per row tile: FFN up 12% slower alone); the block's inputs over
    the whole reduction, re-read once per column tile, fit in half of L2 (FFN down's 3072: not all 128 rows)."""
    loops = loops_of([128, 3072 * 768 // reduction], [reduction])
    plan = plan_block(loops, AVX512)
    check_factors(loops, plan)
    rows, columns = plan.factors[0], plan.factors[1]
    assert rows[2] > 1 and columns[2] == 1, plan
    assert rows[2] * rows[3] * reduction * 4 <= AVX512.l2_bytes // 2, plan


def test_a_register_tile_leaves_registers_for_its_weight_vectors_and_a_broadcast():
    for facts in (AVX2, AVX512):
        plan = plan_block(loops_of([384, 768], [768]), facts)
        vectors = plan.factors[1][-1] // facts.registers.lanes
        assert plan.accumulators + vectors + 1 <= facts.registers.registers, plan
    assert plan_block(loops_of([384, 768], [768]), AVX512).accumulators == 24  # AVX-512 still fills its 24


def test_rows_of_13_or_14_positions_take_every_register_the_step_leaves():
    """13 x 13 and 14 x 14 images: 13 x 2 and 14 x 2 tiles (26 and 28 accumulators, 2 weight vectors and a
    broadcast in 32 registers), not 13 x 1 and 7 x 2 within the random draws' bound of 24."""
    for rows, accumulators in ((13, 26), (14, 28)):
        plan = plan_block(loops_of([rows, 1024], [512]), AVX512)
        assert (plan.factors[0][-1], plan.factors[1][-1], plan.accumulators) == (rows, 32, accumulators)
        assert accumulators > AVX512.registers.max_accumulators
    assert plan_block(loops_of([13, 1024], [512]), AVX2).accumulators == 13  # 13 + 1 + 1 of AVX2's 16


def test_a_tile_one_vector_wide_takes_the_fewest_rows_that_keep_the_fma_ports_busy():
    """ViT's Q.K^T over 208 padded keys (13 vectors: no wider tile divides them) broadcasts for every FMA at any
    height: 13 x 1, not 26 x 1 (26/27 FMAs a load against 13/14; in the model 113 -> 87 us on a Xeon with AMX)."""
    plan = plan_block(loops_of([208, 208], [64]), AVX512)
    assert (plan.factors[0][-1], plan.factors[1][-1], plan.accumulators) == (13, 16, 13)
    assert plan.accumulators >= AVX512.registers.enough_accumulators
    assert plan_block(loops_of([384, 768], [768]), AVX512).accumulators == 24  # wider tiles keep the most per load


def test_a_reduction_one_run_covers_leaves_no_block_between_a_tile_and_its_epilogue():
    """SqueezeNet's stem (27 reductions) and a 1x1 convolution over 64 channels: R0 is all 1, so S2 is too and
    S1 takes its factors; over 512 channels (two runs) the block stays."""
    for spatial, reduction in (([111, 111, 64], [3, 3, 3]), ([56, 56, 64], [64])):
        loops = loops_of(spatial, reduction)
        plan = plan_block(loops, AVX512)
        check_factors(loops, plan)
        assert all(plan.factors[loop.index][0] == 1 for loop in loops if loop.role == "reduction")
        assert all(plan.factors[loop.index][2] == 1 for loop in loops if loop.role != "reduction"), plan
    deep = plan_block(loops_of([56, 56, 64], [512]), AVX512)
    assert any(deep.factors[i][2] > 1 for i in range(3)), deep


def test_a_window_alone_keeps_its_tile_within_the_random_draws_bound():
    """A depthwise convolution's reduction is its window: no broadcast shared by a row of FMAs, so no 14 x 2."""
    plan = plan_block(loops_of([14, 14, 384], [3, 3, 1]), AVX512)
    assert plan.accumulators <= AVX512.registers.max_accumulators, plan


def test_a_gather_moves_the_rows_it_picks_not_its_whole_table():
    """An embedding lookup of 128 tokens in a 30522 x 768 table reads 128 rows: the prediction counted the
    whole table (94 MB, 0.93 ms predicted for an 11 us kernel) before its bytes were bounded by the points
    of the blocks that read it."""
    from tvm import te

    table = te.placeholder((30522, 768), "float32", name="table")
    ids = te.placeholder((128,), "int32", name="ids")
    rows = te.compute((128, 768), lambda i, j: table[ids[i], j], name="rows")
    product_in = te.placeholder((128, 768), "float32", name="x")
    weight = te.placeholder((768, 768), "float32", name="w")
    k = te.reduce_axis((0, 768), "k")
    product = te.compute((128, 768), lambda i, j: te.sum(product_in[i, k] * weight[k, j], axis=k), name="y")
    gathered = msc.kernel_bytes(tvm.IRModule({"main": te.create_prim_func([table, ids, rows])}))
    assert gathered == 128 * 768 * 4 * 2 + 128 * 4  # the rows read, the rows written, the ids
    multiplied = msc.kernel_bytes(tvm.IRModule({"main": te.create_prim_func([product_in, weight, product])}))
    assert multiplied == (128 * 768 + 768 * 768 + 128 * 768) * 4  # a product reads all of its operands


@needs_bf16
def test_a_bf16_products_analytic_schedule_takes_its_design_space_of_most_accumulators():
    """56 rows, 4 channel vectors: 4x4 tiles (16 accumulators) before 7x2, 2x4 and 4x2. MetaSchedule hands
    the rule's spaces back in reverse; ResNet-18's bf16 convolutions took their smallest tiles so."""
    configured = configure_kernel(dense_module(56, 64, 64), resolve_target("llvm"))
    assert configured is not None
    assert "tensor_tuner_bf16_r4_v4_p32" in str(configured.sch.trace)
    assert configured.bf16_unit == BF16_DOT and configured.product  # counted among the products, as fp32 ones
