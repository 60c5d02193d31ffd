"""An fp32 max pool over a channels-last image (tuner.spaces.pool_rule.max_pool_schedule): which kernels take
the rule, the schedule it makes, and that the built kernel computes what the unscheduled one does."""

from __future__ import annotations

import numpy as np
import tvm
from analytic_rules import configured_by_rule, unscheduled_and_scheduled_outputs
from tvm import te, topi

from tuner.spaces.pool_rule import max_pool_schedule


def _max_pool(size: int = 111, channels: int = 64, kind: str = "max", layout: str = "NHWC") -> tvm.IRModule:
    """SqueezeNet 1.1's first pool as TVM lowers it: 3x3, stride 2, the window past the image's edge padded."""
    shape = (1, size, size, channels) if layout == "NHWC" else (1, channels, size, size)
    image = te.placeholder(shape, "float32", name="image")
    pooled = topi.nn.pool2d(image, (3, 3), (2, 2), (1, 1), (0, 0, 1, 1), kind, ceil_mode=True, layout=layout)
    return tvm.IRModule({"main": te.create_prim_func([image, pooled])})


def test_a_max_pool_takes_its_channels_in_vectors_under_the_window_and_its_rows_in_parallel():
    sch = configured_by_rule(_max_pool(), parallel_rows=56)
    script = sch.mod.script()
    assert "pad_temp" not in script  # the padding inlined: no pass of its own
    assert "T.vectorized(16)" in script
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("pool_max_update"))]
    assert [int(loop.extent) for loop in loops[-3:]] == [3, 3, 16]  # the window outside the vector


def test_the_analytic_schedule_of_a_max_pool_computes_the_same():
    mod = _max_pool(size=27, channels=128)
    sch = max_pool_schedule(mod, lanes=16, cores=2)
    expected, got = unscheduled_and_scheduled_outputs(mod, sch.mod, seed=3)
    np.testing.assert_array_equal(got, expected)


def test_average_pools_channels_first_pools_and_pools_of_fewer_channels_than_a_vector_keep_their_design_spaces():
    assert max_pool_schedule(_max_pool(kind="avg"), lanes=16, cores=2) is None
    assert max_pool_schedule(_max_pool(layout="NCHW"), lanes=16, cores=2) is None
    assert max_pool_schedule(_max_pool(size=28, channels=3), lanes=16, cores=2) is None
