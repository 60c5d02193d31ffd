"""In bf16, activations rounded before the max pools and concatenations that read them
(tuner.lowering.bf16.rounding): the casts move into the convolutions' epilogues, and the model
built by real TVM computes the same bits as with the casts after."""

from dataclasses import replace

import numpy as np
import pytest
import tvm
from bf16_builds import BF16_THROUGHOUT, needs_bf16
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from codegen.build import build_lowered_model
from tuner.lowering import LoweringOptions
from tuner.tasks.extraction import lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _Fire(torch.nn.Module):
    """SqueezeNet in small: a pooled stem, a fire module (two expanding convolutions concatenated), a
    pool of the concatenation and a convolution reading it."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 32, 3, stride=2)
        self.squeeze = torch.nn.Conv2d(32, 32, 1)
        self.expand1 = torch.nn.Conv2d(32, 32, 1)
        self.expand3 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.head = torch.nn.Conv2d(64, 32, 1)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 3, 2, ceil_mode=True)
        squeezed = torch.relu(self.squeeze(x))
        x = torch.cat([torch.relu(self.expand1(squeezed)), torch.relu(self.expand3(squeezed))], 1)
        return self.head(torch.nn.functional.max_pool2d(x, 3, 2, ceil_mode=True))


def _lowered(llvm_target, rounded_first: bool) -> tvm.IRModule:
    torch.manual_seed(0)
    options = replace(BF16_THROUGHOUT, bf16_round_before_moves=rounded_first)
    return lower_workload(load_workload(_Fire().eval(), [(1, 3, 33, 33)]), llvm_target, options)


def _pools_and_concatenations(lowered: tvm.IRModule) -> dict[str, set[str]]:
    """Each pool's and concatenation's kernel, with the dtypes of its buffers."""
    return {
        gv.name_hint: {str(param.dtype) for param in func.params}
        for gv, func in lowered.functions_items()
        if "pool" in gv.name_hint or "concat" in gv.name_hint
    }


def _run(lowered: tvm.IRModule, llvm_target, x: np.ndarray) -> np.ndarray:
    executable = build_lowered_model(lowered, llvm_target, ms.database.MemoryDatabase())
    return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@needs_bf16  # elsewhere the convolutions are not lowered to bf16 products: their casts are kernels of their own
def test_pools_and_concatenations_read_bf16_and_compute_the_same_bits(llvm_target):
    before, after = _lowered(llvm_target, False), _lowered(llvm_target, True)
    assert all("float32" in dtypes for dtypes in _pools_and_concatenations(before).values())
    moved = _pools_and_concatenations(after)
    assert len(moved) == 3 and set().union(*moved.values()) == {"bfloat16"}, moved
    # no kernel of its own casts: each cast is in the epilogue of the convolution that it rounds
    casting = [gv.name_hint for gv, _ in after.functions_items() if "cast" in gv.name_hint]
    assert all("conv2d" in name or "dense" in name or "transpose" in name for name in casting), casting
    x = np.random.default_rng(0).standard_normal((1, 3, 33, 33)).astype("float32")
    np.testing.assert_array_equal(_run(after, llvm_target, x), _run(before, llvm_target, x))


def test_a_work_dir_tuned_before_the_rewrite_keeps_its_casts_after_the_pools():
    before = {k: v for k, v in LoweringOptions(bfloat16=True).as_dict().items() if k != "bf16_round_before_moves"}
    assert not LoweringOptions.from_record(before).bf16_round_before_moves


def test_a_bf16_concatenation_is_copied_a_vector_at_a_time(llvm_target):
    # tuner.spaces.copy_rule: the concatenation's kernel names the design space, which vectorises its channels
    # by lanes that both inputs' widths divide, and copies what the concatenation copies
    import ml_dtypes

    from tuner.spaces.copy_rule import BF16_COPY_RULE, schedule_bf16_copy

    lowered = _lowered(llvm_target, True)
    (concat,) = [func for gv, func in lowered.functions_items() if "concat" in gv.name_hint]
    assert BF16_COPY_RULE in concat.script()
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": concat.with_attr("global_symbol", "main")}))
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    (scheduled,) = schedule_bf16_copy(sch, block)
    assert "T.vectorized" in scheduled.mod.script()
    built = tvm.compile(scheduled.mod, target=llvm_target)
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(tuple(int(d) for d in p.shape)).astype(ml_dtypes.bfloat16) for p in concat.params[:-1]]
    out = tvm.runtime.tensor(np.zeros(tuple(int(d) for d in concat.params[-1].shape), ml_dtypes.bfloat16))
    built["main"](*(tvm.runtime.tensor(p) for p in parts), out)
    np.testing.assert_array_equal(out.numpy(), np.concatenate(parts, axis=-1))
