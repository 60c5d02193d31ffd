"""The weights' prefetches (codegen/weight_prefetch.py): where a product re-reads blocks of its weight,
the next block is asked for while this one is computed; nothing changes in what a kernel computes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from bf16_builds import needs_bf16
from tvm.script import tirx as T

from codegen.weight_prefetch import DISABLE_ENV, tir_pipeline
from tuner.targets import resolve_target

ROWS, BLOCKS, COLUMN_GROUPS, STEPS, LANES = 32, 4, 8, 32, 16  # 16 KB weight blocks: the smallest helped


def _product(weight_rows_per_block: int = STEPS) -> tvm.IRModule:
    """C = A @ W with W packed [BLOCKS, COLUMN_GROUPS, STEPS, LANES], tiled as MetaSchedule tiles a
    product: each reduction block of the weight re-read by two groups of eight rows."""
    k, n = BLOCKS * weight_rows_per_block, COLUMN_GROUPS * LANES

    @T.prim_func(s_tir=True)
    def main(
        a: T.Buffer((ROWS, k), "float32"),
        w: T.Buffer((BLOCKS, COLUMN_GROUPS, weight_rows_per_block, LANES), "float32"),
        c: T.Buffer((ROWS, n), "float32"),
    ):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for task in T.parallel(2):
            for rows, group, row in T.grid(2, COLUMN_GROUPS, 8):
                for lane in T.vectorized(LANES):
                    with T.sblock("init"):
                        vi = T.axis.spatial(ROWS, task * 16 + rows * 8 + row)
                        vj = T.axis.spatial(n, group * LANES + lane)
                        c[vi, vj] = T.float32(0)
            for block, rows, group, step, row in T.grid(BLOCKS, 2, COLUMN_GROUPS, weight_rows_per_block, 8):
                for lane in T.vectorized(LANES):
                    with T.sblock("update"):
                        vi = T.axis.spatial(ROWS, task * 16 + rows * 8 + row)
                        vj = T.axis.spatial(n, group * LANES + lane)
                        vk = T.axis.reduce(k, block * weight_rows_per_block + step)
                        c[vi, vj] = (
                            c[vi, vj]
                            + a[vi, vk]
                            * w[vk // weight_rows_per_block, vj // LANES, vk % weight_rows_per_block, vj % LANES]
                        )

    return tvm.IRModule({"main": main})


def _built(mod: tvm.IRModule) -> tvm.runtime.Executable:
    target = resolve_target("llvm")
    with target:
        return tvm.compile(mod, target=target, tir_pipeline=tir_pipeline(target))


def _prefetches(executable: tvm.runtime.Executable) -> int:
    return executable.mod.inspect_source("asm").count("prefetch")


def _check_product(executable: tvm.runtime.Executable, weight_rows_per_block: int) -> None:
    rng = np.random.default_rng(0)
    k = BLOCKS * weight_rows_per_block
    a = rng.standard_normal((ROWS, k)).astype("float32")
    w = rng.standard_normal((k, COLUMN_GROUPS * LANES)).astype("float32")
    packed = w.reshape(BLOCKS, weight_rows_per_block, COLUMN_GROUPS, LANES).transpose(0, 2, 1, 3).copy()
    dev = tvm.cpu()
    c = tvm.runtime.tensor(np.zeros((ROWS, COLUMN_GROUPS * LANES), "float32"), dev)
    executable["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(packed, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ w, rtol=1e-4, atol=1e-4)


def test_a_product_re_reading_weight_blocks_asks_for_the_next_block_and_computes_the_same(monkeypatch):
    with_prefetches = _built(_product())
    assert _prefetches(with_prefetches) > 0
    _check_product(with_prefetches, STEPS)
    monkeypatch.setenv(DISABLE_ENV, "0")
    without = _built(_product())
    assert _prefetches(without) == 0
    _check_product(without, STEPS)


@pytest.mark.parametrize("steps", [8, 4096])
def test_blocks_that_stay_in_l1_or_overflow_l2_are_left_alone(steps):
    # 8 steps: 4 KB blocks, in L1 anyway; 4096 steps: 2 MB each, two would not fit a core's L2 together
    executable = _built(_product(steps))
    assert _prefetches(executable) == 0
    if steps == 8:
        _check_product(executable, steps)


def test_a_kernel_that_reads_its_arguments_once_gets_no_prefetch():
    @T.prim_func(s_tir=True)
    def add(a: T.Buffer((64, 1024), "float32"), b: T.Buffer((64, 1024), "float32"), c: T.Buffer((64, 1024), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i in T.parallel(64):
            for j0 in range(64):
                for j1 in T.vectorized(16):
                    with T.sblock("add"):
                        vi = T.axis.spatial(64, i)
                        vj = T.axis.spatial(1024, j0 * 16 + j1)
                        c[vi, vj] = a[vi, vj] + b[vi, vj]

    assert _prefetches(_built(tvm.IRModule({"main": add}))) == 0


def test_a_store_through_lets_of_lets_still_moves_with_its_row_loop():
    # C[b] with b = a + 1 and a = row * 4, as TVM's common-subexpression pass writes it: the row loop
    # is not a reduction loop, the step loop (not named) is
    from codegen.tir_walk import binds
    from codegen.weight_prefetch import _innermost_reduction_loop, _Loop

    step, row, a, b = (tvm.tirx.Var(name, "int32") for name in ("step", "row", "a", "b"))
    out = tvm.tirx.decl_buffer((64,), "float32", name="out")
    body = tvm.tirx.SeqStmt(
        [
            tvm.tirx.stmt.Bind(a, row * 4),
            tvm.tirx.stmt.Bind(b, a + 1),
            tvm.tirx.stmt.BufferStore(out, tvm.tirx.const(0.0, "float32"), [b]),
        ]
    )
    loops = [_Loop(step, tvm.tirx.const(0, "int32"), 8), _Loop(row, tvm.tirx.const(0, "int32"), 8)]
    assert _innermost_reduction_loop(body, loops, binds(body)) == 0


def test_tasks_that_read_a_weight_slice_in_turn_each_ask_for_a_share_of_the_next_slice():
    # the row tiles fused into the parallel loop, innermost: four consecutive tasks (one thread's, in
    # turn) read the same 16 KB slice whole, each asking for a quarter of the next
    slices, tiles, k = 4, 4, 128

    @T.prim_func(s_tir=True)
    def main(
        a: T.Buffer((tiles * 8, k), "float32"),
        w: T.Buffer((slices, k, 32), "float32"),
        c: T.Buffer((tiles * 8, slices * 32), "float32"),
    ):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for task in T.parallel(slices * tiles):
            for row in range(8):
                for lane in T.vectorized(32):
                    with T.sblock("init"):
                        vi = T.axis.spatial(tiles * 8, task % tiles * 8 + row)
                        vj = T.axis.spatial(slices * 32, task // tiles * 32 + lane)
                        c[vi, vj] = T.float32(0)
            for step, row in T.grid(k, 8):
                for lane in T.vectorized(32):
                    with T.sblock("update"):
                        vi = T.axis.spatial(tiles * 8, task % tiles * 8 + row)
                        vj = T.axis.spatial(slices * 32, task // tiles * 32 + lane)
                        vk = T.axis.reduce(k, step)
                        c[vi, vj] = c[vi, vj] + a[vi, vk] * w[vj // 32, vk, vj % 32]

    built = _built(tvm.IRModule({"main": main}))
    assert _prefetches(built) > 0
    rng = np.random.default_rng(0)
    a = rng.standard_normal((tiles * 8, k)).astype("float32")
    w = rng.standard_normal((k, slices * 32)).astype("float32")
    dev = tvm.cpu()
    c = tvm.runtime.tensor(np.zeros((tiles * 8, slices * 32), "float32"), dev)
    packed = w.reshape(k, slices, 32).transpose(1, 0, 2).copy()
    built["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(packed, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ w, rtol=1e-4, atol=1e-4)


@needs_bf16
def test_a_bf16_tile_re_reading_its_weight_slice_asks_for_the_next_tasks_slice_step_by_step(monkeypatch):
    # 128 rows in 8 row tiles of 4 row blocks: each task's 96 KB slice of the weight read by four calls,
    # each asking for a quarter of the next task's slice, a line a step of its 384
    from bf16_builds import bf16_array, dense_module, run_built

    from tuner.spaces.bf16_rule import _tile

    def built() -> tvm.runtime.Executable:
        sch = tvm.s_tir.Schedule(dense_module(128, 768, 768), seed=1)
        _tile(sch, sch.get_sblock("gemm"), 4, 4)
        return _built(sch.mod)

    a, packed = bf16_array((128, 768), 1), bf16_array((48, 384, 16, 2), 2)
    expected = a.astype(np.float32) @ packed.astype(np.float32).transpose(1, 3, 0, 2).reshape(768, 768)
    for prefetching, setting in ((True, "1"), (False, "0")):
        monkeypatch.setenv(DISABLE_ENV, setting)
        executable = built()
        assert (_prefetches(executable) > 0) == prefetching
        np.testing.assert_allclose(run_built(executable, [a, packed], (128, 768)), expected, rtol=1e-4, atol=1e-3)


@needs_bf16
def test_a_bf16_convolution_asks_for_its_next_window_tap_while_computing_this_one():
    # 256 input channels, two 16-lane vectors a tile: each tap's slice of a task is 16 KB, read once
    from bf16_builds import bf16_array, run_built, te_module, torch_conv_nhwc
    from tvm import te

    from tuner.lowering.bf16.kernels import bf16_conv2d_nhwc, pack_conv_weight
    from tuner.spaces.bf16_rule import _tile

    image, kernel = bf16_array((1, 7, 7, 256), 1), bf16_array((3, 3, 256, 64), 2)
    image_t = te.placeholder(image.shape, "bfloat16", name="image")
    kernel_t = te.placeholder(pack_conv_weight(kernel).shape, "bfloat16", name="kernel")
    sch = tvm.s_tir.Schedule(te_module([image_t, kernel_t, bf16_conv2d_nhwc(image_t, kernel_t, 1, (1, 1, 1, 1))]))
    _tile(sch, sch.get_sblock("bf16_conv2d"), 7, 2)
    executable = _built(sch.mod)
    assert _prefetches(executable) > 0
    got = run_built(executable, [image, pack_conv_weight(kernel)], (1, 7, 7, 64))
    np.testing.assert_allclose(got, torch_conv_nhwc(image, kernel, padding=1), rtol=1e-4, atol=2e-3)
