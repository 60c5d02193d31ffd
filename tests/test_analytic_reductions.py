"""Analytic configuration of a reduction whose result a larger block reads (tuner.spaces.analytic's compute
locations): the reduction, and what it feeds, done once, not once per point of the reader."""

from __future__ import annotations

import math

import tvm

from tuner.spaces.analytic import configure_kernel
from tuner.targets import resolve_target


def _response_norm(height: int = 28, width: int = 28, channels: int = 192) -> tvm.IRModule:
    """ConvNeXtV2's global response norm as Relax fuses it: the channels' mean of each channel's norm, read by
    every element of the image."""
    from tvm import te

    x = te.placeholder((1, height, width, channels), "float32", name="x")
    norms = te.placeholder((1, 1, 1, channels), "float32", name="norms")
    k = te.reduce_axis((0, channels), "k")
    total = te.compute((1, 1, 1, 1), lambda n, a, b, c: te.sum(norms[n, a, b, k], axis=k), name="total")
    out = te.compute(
        (1, height, width, channels),
        lambda n, h, w, c: x[n, h, w, c] * (norms[0, 0, 0, c] / (total[0, 0, 0, 0] / channels + 1e-6)),
        name="normed",
    )
    return tvm.IRModule({"main": te.create_prim_func([x, norms, out])})


def test_a_reduction_read_by_every_element_is_computed_once_at_the_root():
    """Computed inside its reader's loops, the sum is done again for each element (ConvNeXtV2's: 19 ms for
    a 34 us kernel; T5's RMS norm 5.0 ms for 18 us)."""
    configured = configure_kernel(_response_norm(), resolve_target("llvm"))
    assert configured is not None
    trace = configured.sch.trace
    locations = [int(trace.decisions[i]) for i in trace.insts if i.kind.name == "SampleComputeLocation"]
    assert locations and all(location == -1 for location in locations)


def _rms_norm(rows: int = 128, width: int = 4096) -> tvm.IRModule:
    """Llama's RMS norm as its lowering leaves it: a row's sum of squares, its rsqrt a block of its own (TVM's
    legalization keeps it out of inlining), the row scaled by it and by a weight per column."""
    from tvm import te

    x = te.placeholder((rows, width), "float32", name="x")
    weight = te.placeholder((width,), "float32", name="weight")
    k = te.reduce_axis((0, width), "k")
    squares = te.compute((1, rows, 1), lambda a, r, b: te.sum(x[r, k] * x[r, k], axis=k), name="squares")
    scale = te.compute(
        (1, rows, 1),
        lambda a, r, b: te.rsqrt(squares[a, r, b] / width + 1e-5),
        name="scale",
        attrs={"meta_schedule.inline_rule": "disable"},
    )
    out = te.compute((1, rows, width), lambda a, r, c: x[r, c] * scale[a, r, 0] * weight[c], name="out")
    return tvm.IRModule({"main": te.create_prim_func([x, weight, out])})


def test_a_reductions_result_read_through_a_block_of_its_own_points_is_computed_once_per_row():
    """Llama-3-8B's RMS norm: its design space splits the sum in two; the second half and the rsqrt have a row's
    points each, and inside the scaled row's loops they were done again for each of its 4096 columns (16.8 ms
    for a 95 us kernel)."""
    configured = configure_kernel(_rms_norm(), resolve_target("llvm"))
    sch = configured.sch

    def iterations(block: str) -> int:
        return math.prod(int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock(block)))

    assert iterations("scale") == 128
    assert iterations("squares_update") <= 128 * 4096
