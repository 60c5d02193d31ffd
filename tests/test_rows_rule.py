"""Copies across axes as parallel rows of vectors (tuner.spaces.rows_rule): which kernels take it, the
schedule it makes, and that the built kernel computes what the unscheduled one does."""

from __future__ import annotations

import numpy as np
import tvm
from analytic_rules import configured_by_rule
from tvm import te

from tuner.spaces.rows_rule import rows_schedule
from tuner.targets import resolve_target


def _keys_transposed_scaled_and_padded(tokens: int = 198, heads: int = 3, width: int = 64, padded: int = 208):
    """The padded attention's keys: [tokens, heads * width] read across into [heads, width, padded]."""
    keys = te.placeholder((tokens, heads * width), "float32", name="keys")
    moved = te.compute((heads, width, tokens), lambda h, d, t: keys[t, h * width + d] * 0.125, name="moved")
    out = te.compute(
        (heads, width, padded),
        lambda h, d, t: tvm.tirx.if_then_else(t < tokens, moved[h, d, tvm.te.min(t, tokens - 1)], 0.0),
        name="padded",
    )
    return tvm.IRModule({"main": te.create_prim_func([keys, out])})


def _scaled(rows: int = 198, columns: int = 200):
    x = te.placeholder((rows, columns), "float32", name="x")
    y = te.compute((rows, columns), lambda i, j: x[i, j] * 2.0, name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


def _row_sums(rows: int = 64, columns: int = 208):
    x = te.placeholder((rows, columns), "float32", name="x")
    k = te.reduce_axis((0, columns), "k")
    y = te.compute((rows,), lambda i: te.sum(x[i, k], axis=k), name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


def test_a_copy_across_axes_takes_parallel_rows_each_cut_into_whole_vectors():
    sch = rows_schedule(_keys_transposed_scaled_and_padded(), lanes=16, cores=2)
    assert sch is not None
    script = sch.mod.script()
    assert script.count("T.parallel(192)") == 1  # 3 heads x 64 rows, fused
    assert "T.vectorized(16)" in script  # 208 = 13 vectors of 16
    assert len(sch.get_child_blocks(sch.get_sblock("root"))) == 1  # the scaling inlined into the copy


def test_a_row_no_vector_divides_is_left_unvectorised_and_too_few_rows_are_left_alone():
    sch = rows_schedule(_keys_transposed_scaled_and_padded(padded=198), lanes=16, cores=2)
    assert sch is not None and "T.vectorized" not in sch.mod.script()  # 198 = 2 x 99: no vector of 4 divides it
    assert rows_schedule(_keys_transposed_scaled_and_padded(heads=1, width=1, padded=208), lanes=16, cores=2) is None


def test_kernels_read_along_their_own_rows_and_reductions_keep_their_design_spaces():
    assert rows_schedule(_scaled(), lanes=16, cores=2) is None
    assert rows_schedule(_row_sums(), lanes=16, cores=2) is None


def test_the_analytic_schedule_of_a_copy_across_axes_is_its_rows_and_computes_the_same():
    target = resolve_target("llvm")
    mod = _keys_transposed_scaled_and_padded()
    scheduled = configured_by_rule(mod, parallel_rows=192)
    keys = np.random.default_rng(0).standard_normal((198, 192)).astype("float32")
    results = []
    for built_mod in (mod, scheduled.mod):
        built = tvm.compile(built_mod, target=target)
        out = tvm.runtime.tensor(np.full((3, 64, 208), np.nan, "float32"))
        built["main"](tvm.runtime.tensor(keys), out)
        results.append(out.numpy())
    expected = np.zeros((3, 64, 208), "float32")
    expected[:, :, :198] = keys.reshape(198, 3, 64).transpose(1, 2, 0) * 0.125
    np.testing.assert_array_equal(results[0], expected)
    np.testing.assert_array_equal(results[1], expected)


def test_rows_a_whole_number_of_metaschedules_chunks_long_keep_its_schedule():
    """GPT-2's keys, 12 x 64 rows of 128 tokens: MetaSchedule's chunks of 64 do not cross rows there."""
    assert rows_schedule(_keys_transposed_scaled_and_padded(128, 12, 64, 128), lanes=16, cores=2) is None


def test_a_kernel_reading_a_scalar_argument_is_judged_without_it():
    """MPNet's attention mask: a broadcast of two masks choosing between two scalars the model passes in. A 0-d
    buffer has no last axis: reading one raised IndexError (and trials=0 on the model with it)."""
    rows = te.placeholder((128, 1), "bool", name="rows")
    columns = te.placeholder((1, 128), "bool", name="columns")
    yes, no = te.placeholder((), "float32", name="yes"), te.placeholder((), "float32", name="no")
    y = te.compute((128, 128), lambda i, j: tvm.tirx.Select(rows[i, 0] & columns[0, j], yes[()], no[()]), name="where")
    assert rows_schedule(tvm.IRModule({"main": te.create_prim_func([rows, columns, yes, no, y])}), 16, 2) is None
