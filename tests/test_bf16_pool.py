"""bf16 max pools compared in fp32 (tuner.lowering.bf16.pool, tuner.spaces.pool_rule): the kernel's design
space vectorises channels under the window, and the model computes the same bits as with TVM's pool."""

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
import tvm
from bf16_builds import BF16_THROUGHOUT
from tvm import te

from tuner.lowering import LoweringOptions
from tuner.lowering.bf16.pool import bf16_max_pool2d
from tuner.spaces.pool_rule import schedule_bf16_pool

torch = pytest.importorskip("torch")


def _scheduled(shape, window, strides, padding, out_shape) -> tvm.IRModule:
    data = te.placeholder(shape, "bfloat16", name="data")
    func = te.create_prim_func([data, bf16_max_pool2d(data, window, strides, padding, out_shape)])
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        (sch,) = schedule_bf16_pool(sch, block)
    return sch.mod


@pytest.mark.parametrize(
    "shape, window, strides, padding, out_shape",
    [
        ((1, 9, 9, 48), (3, 3), (2, 2), (0, 0, 0, 0), (1, 4, 4, 48)),
        ((1, 8, 8, 24), (3, 3), (2, 2), (1, 1, 1, 1), (1, 4, 4, 24)),  # ResNet's: padding left out
        ((1, 8, 8, 16), (3, 3), (2, 2), (0, 0, 1, 1), (1, 4, 4, 16)),  # ceil mode: the last window short
    ],
)
def test_the_pool_is_the_windows_maximum_vectorised_over_channels(
    llvm_target, shape, window, strides, padding, out_shape
):
    mod = _scheduled(shape, window, strides, padding, out_shape)
    assert "T.vectorized" in mod.script() and "T.parallel" in mod.script()
    x = np.random.default_rng(0).standard_normal(shape).astype(ml_dtypes.bfloat16)
    out = tvm.runtime.tensor(np.zeros(out_shape, ml_dtypes.bfloat16))
    tvm.compile(mod, target=llvm_target)["main"](tvm.runtime.tensor(x), out)
    top, left, bottom, right = padding
    padded = np.pad(x.astype("float32"), [(0, 0), (top, bottom), (left, right), (0, 0)], constant_values=-np.inf)
    expected = np.stack(
        [
            np.stack(
                [
                    padded[
                        :, y * strides[0] : y * strides[0] + window[0], c * strides[1] : c * strides[1] + window[1]
                    ].max(axis=(1, 2))
                    for c in range(out_shape[2])
                ],
                axis=1,
            )
            for y in range(out_shape[1])
        ],
        axis=1,
    )
    np.testing.assert_array_equal(out.numpy().astype("float32"), expected)


def test_a_models_bf16_pools_are_ours_and_compute_what_tvms_compute(llvm_target):
    from test_bf16_rounding import _Fire, _run  # noqa: PLC0415 - the fire module of SqueezeNet in small

    from tuner.spaces.metaschedule import design_spaces, make_context
    from tuner.tasks.extraction import extract_tasks, lower_workload
    from workloads import load_workload

    torch.manual_seed(0)
    module = load_workload(_Fire().eval(), [(1, 3, 33, 33)])

    def lowered(ours: bool) -> tvm.IRModule:
        return lower_workload(module, llvm_target, replace(BF16_THROUGHOUT, bf16_max_pools=ours))

    theirs, ours = lowered(False), lowered(True)
    names = [gv.name_hint for gv, _ in ours.functions_items()]
    pools = [name for name in names if "pool" in name]
    assert len(pools) == 2 and all(name.startswith("bf16_max_pool2d") for name in pools), pools
    for task in extract_tasks(module, llvm_target, ours):  # the design space the tuner searches
        if "pool" in task.name:
            (space,) = design_spaces(make_context(task.mod, llvm_target, 0))
            assert "T.vectorized" in space.mod.script() and "T.parallel" in space.mod.script()
    x = np.random.default_rng(0).standard_normal((1, 3, 33, 33)).astype("float32")
    np.testing.assert_array_equal(_run(ours, llvm_target, x), _run(theirs, llvm_target, x))


def test_a_work_dir_tuned_before_keeps_tvms_pools():
    before = {k: v for k, v in LoweringOptions(bfloat16=True).as_dict().items() if k != "bf16_max_pools"}
    assert not LoweringOptions.from_record(before).bf16_max_pools
