"""Sums over every axis but the last (channels-last global pools) as one part of the image's positions per
core, each summed a row of channels at a time (tuner.spaces.column_rule): which kernels take it, and that the
built kernel computes what the unscheduled one does."""

from __future__ import annotations

import numpy as np
import tvm
from analytic_rules import configured_by_rule
from tvm import te

from tuner.spaces.column_rule import column_schedule
from tuner.spaces.machine import MachineFacts
from tuner.targets import resolve_target


def _channels_mean(height: int = 14, width: int = 14, channels: int = 128) -> tvm.IRModule:
    """A squeeze-and-excite block's mean as Relax lowers it: the sums over the image, then a divide."""
    x = te.placeholder((1, height, width, channels), "float32", name="x")
    k1, k2 = te.reduce_axis((0, height), "k1"), te.reduce_axis((0, width), "k2")
    sums = te.compute((1, 1, 1, channels), lambda n, a, b, c: te.sum(x[n, k1, k2, c], axis=[k1, k2]), name="sums")
    mean = te.compute((1, 1, 1, channels), lambda n, a, b, c: sums[n, a, b, c] / float(height * width), name="mean")
    return tvm.IRModule({"main": te.create_prim_func([x, mean])})


def _row_sums(rows: int = 64, columns: int = 208) -> tvm.IRModule:
    x = te.placeholder((rows, columns), "float32", name="x")
    k = te.reduce_axis((0, columns), "k")
    return tvm.IRModule({"main": te.create_prim_func([x, te.compute((rows,), lambda i: te.sum(x[i, k], axis=k))])})


def test_a_channels_mean_sums_a_part_of_the_image_per_core_and_computes_the_same_sums():
    mod = _channels_mean()
    cores = MachineFacts.of(resolve_target("llvm")).cores
    scheduled = configured_by_rule(mod, parallel_rows=cores)
    x = np.random.default_rng(0).standard_normal((1, 14, 14, 128)).astype("float32")
    results = []
    for built_mod in (mod, scheduled.mod):
        out = tvm.runtime.tensor(np.full((1, 1, 1, 128), np.nan, "float32"))
        tvm.compile(built_mod, target=resolve_target("llvm"))["main"](tvm.runtime.tensor(x), out)
        results.append(out.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-7)  # the parts' sums added at the end
    np.testing.assert_allclose(results[0], x.mean(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-6)
    assert "sums_rf" in scheduled.mod.script()


def test_a_channels_mean_reads_whole_rows_of_channels_in_its_innermost_loops():
    scheduled = column_schedule(_channels_mean(height=28, width=28, channels=64), lanes=16, cores=4)
    assert scheduled is not None and "T.parallel(4)" in scheduled.mod.script()
    update = scheduled.get_sblock("sums_rf_update")
    *_, positions, channel_vectors, lanes = scheduled.get_loops(update)
    assert [int(scheduled.get(loop).extent) for loop in (positions, channel_vectors, lanes)] == [196, 4, 16]


def test_sums_along_the_last_axis_and_too_few_channels_or_positions_are_left_alone():
    assert column_schedule(_row_sums(), lanes=16, cores=2) is None  # a norm's kind of sum (norm_rule's)
    assert column_schedule(_channels_mean(channels=2), lanes=16, cores=2) is None  # no vector of 4 lanes
    assert column_schedule(_channels_mean(height=2, width=2), lanes=16, cores=2) is None  # 4 positions
    narrow = column_schedule(_channels_mean(channels=24), lanes=16, cores=2)  # vectors of 8 lanes
    assert narrow is not None and "T.vectorized(8)" in narrow.mod.script()


def test_a_kernel_naming_a_design_space_of_its_own_keeps_it():
    """A block annotated with a design space (a bf16 pool's rule) is that space's, as in norm_rule."""
    sch = tvm.s_tir.Schedule(_channels_mean())
    sch.annotate(sch.get_sblock("sums"), "schedule_rule", "a_space_of_its_own")
    assert column_schedule(_channels_mean(), lanes=16, cores=2) is not None
    assert column_schedule(sch.mod, lanes=16, cores=2) is None


def test_a_reduction_of_two_outputs_is_left_alone():
    """Sums and sums of squares in one block (HF MobileViTV2's channel norms) crashed the rule, and with it
    trials=0 on the model."""
    x = te.placeholder((1, 14, 14, 128), "float32", name="x")
    k1, k2 = te.reduce_axis((0, 14), "k1"), te.reduce_axis((0, 14), "k2")
    both = te.comm_reducer(
        lambda a, b: (a[0] + b[0], a[1] + b[1]),
        lambda t0, t1: (tvm.tirx.const(0, t0), tvm.tirx.const(0, t1)),
    )
    sums, squares = te.compute(
        (1, 1, 1, 128),
        lambda n, a, b, c: both((x[n, k1, k2, c], x[n, k1, k2, c] * x[n, k1, k2, c]), axis=[k1, k2]),
        name="moments",
    )
    mod = tvm.IRModule({"main": te.create_prim_func([x, sums, squares])})
    assert column_schedule(mod, lanes=16, cores=2) is None
