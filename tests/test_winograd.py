"""Winograd convolutions (tuner.lowering.winograd): which convolutions take that form, and that the
lowered model, built by real TVM with its default schedules, still computes what PyTorch computes."""

import numpy as np
import pytest
import tvm
from lowered_models import error_against_torch

from tuner.lowering import LoweringOptions
from tuner.lowering.winograd import tile_size, transforms
from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _Block(torch.nn.Module):
    """conv-relu-conv plus the input, relu: a residual block's two 3x3 convolutions."""

    def __init__(self, channels: int, stride: int = 1):
        super().__init__()
        self.first = torch.nn.Conv2d(channels, channels, 3, stride=stride, padding=1)
        self.second = torch.nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        y = self.second(torch.relu(self.first(x)))
        return torch.relu(y + (x if self.first.stride == (1, 1) else y))


def _winograd_kernels(workload, target, lowered) -> list[str]:
    return [t.name for t in extract_tasks(workload, target, lowered) if "winograd" in t.name]


@pytest.mark.parametrize(("side", "tile"), [(16, 4), (14, 2)])
def test_a_residual_block_in_winograd_form_computes_what_pytorch_computes(side, tile, llvm_target):
    assert tile_size(side, side) == tile
    block = _Block(32).eval()
    shape = (1, 32, side, side)
    workload = load_workload(block, [shape])
    lowered = lower_workload(workload, llvm_target)
    kernels = _winograd_kernels(workload, llvm_target, lowered)
    assert len(kernels) == 2 and any("relu" in k for k in kernels), kernels  # epilogues fused
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    assert error_against_torch(block, lowered, llvm_target, x) < 1e-5


def test_only_stride_one_3x3_convolutions_over_enough_positions_take_winograd_form(llvm_target):
    """A stride-2 convolution stays direct; so does one over 7x7 positions, whose transformed
    weights would outweigh the arithmetic saved; and every convolution with the option off."""
    strided = load_workload(_Block(32, stride=2).eval(), [(1, 32, 32, 32)])
    assert len(_winograd_kernels(strided, llvm_target, lower_workload(strided, llvm_target))) == 1
    small = load_workload(_Block(64).eval(), [(1, 64, 7, 7)])
    assert _winograd_kernels(small, llvm_target, lower_workload(small, llvm_target)) == []
    large = load_workload(_Block(32).eval(), [(1, 32, 16, 16)])
    off = lower_workload(large, llvm_target, LoweringOptions(winograd=False))
    assert _winograd_kernels(large, llvm_target, off) == []


def test_a_convolution_with_few_channels_stays_direct(llvm_target):
    """SqueezeNet's 16 -> 64 convolutions: the transforms of 16 channels cost more than the product saves."""
    few = load_workload(_Block(16).eval(), [(1, 16, 56, 56)])
    assert _winograd_kernels(few, llvm_target, lower_workload(few, llvm_target)) == []


def test_a_convolution_over_a_large_image_takes_winograd_form_too(llvm_target):
    """VGG-16's 224x224 64-channel convolutions: 58 MB of transformed tiles, more than a core's share of L3,
    and with vectorised transforms 0.64x as long as direct on a Zen 4 with 16 MB a core."""
    large = load_workload(_Block(64).eval(), [(1, 64, 224, 224)])
    assert len(_winograd_kernels(large, llvm_target, lower_workload(large, llvm_target))) == 2


def test_tile_sizes_follow_the_waste_on_the_image_edge():
    assert [tile_size(s, s) for s in (56, 28, 16, 14, 7)] == [4, 4, 4, 2, 2]


@pytest.mark.parametrize("tile", [2, 4])
def test_the_transforms_compute_a_correlation(tile):
    """y = A^T [(G g) * (B^T d)] is the correlation of a tile of m + 2 inputs with a 3-tap filter."""
    matrices = transforms(tile)
    rng = np.random.default_rng(tile)
    d, g = rng.standard_normal(tile + 2), rng.standard_normal(3)
    got = matrices.output @ ((matrices.weight @ g) * (matrices.data @ d))
    np.testing.assert_allclose(got, np.correlate(d, g, mode="valid"), rtol=1e-12, atol=1e-12)


def test_a_winograd_kernel_counts_the_arithmetic_it_does(llvm_target):
    """The TIR estimate counts every multiplication by a transform's zeros and ones; the kernel's
    FLOPs count the batched GEMM and the transforms' non-zero terms, one side of a tile at a time (alpha
    terms of each non-zero of the matrix per side), under the direct count."""
    workload = load_workload(torch.nn.Conv2d(64, 64, 3, padding=1).eval(), [(1, 64, 56, 56)])
    (task,) = [t for t in extract_tasks(workload, llvm_target) if "winograd" in t.name]
    tiles, channels, alpha, m = 14 * 14, 64, 6, 4
    gemm = 2 * alpha**2 * tiles * channels * channels
    terms = 2 * alpha * np.count_nonzero(transforms(m).data) + (alpha + m) * np.count_nonzero(transforms(m).output)
    bias = 56 * 56 * 64
    assert task.flops == pytest.approx(gemm + 2 * tiles * channels * terms + bias, rel=0.01)
    assert task.flops < 2 * 56 * 56 * 64 * 64 * 9 / 2


@pytest.mark.parametrize("side", [16, 14])
def test_a_winograd_kernels_transforms_are_vectorised_over_channels_and_compute_its_output(side, llvm_target):
    """Both transforms, each side of a tile, take a vector of channels per instruction in the analytic
    schedule (MetaSchedule's own rule left them one float at a time: VGG-16's 56x56 128-channel convolution
    5.6 -> 2.9 ms, Zen 4); the scheduled kernel computes what the unscheduled one does."""
    from tuner.spaces.analytic import configure_kernel

    workload = load_workload(torch.nn.Conv2d(48, 32, 3, padding=1).eval(), [(1, 48, side, side)])
    (task,) = [t for t in extract_tasks(workload, llvm_target) if "winograd" in t.name]
    sch = configure_kernel(task.mod, llvm_target).sch
    for block in ("data_pack_rows_update", "data_pack", "inverse_rows_update", "inverse"):
        innermost = sch.get(sch.get_loops(sch.get_sblock(block))[-1])
        assert innermost.kind == tvm.tirx.ForKind.VECTORIZED and int(innermost.extent) == 16, block
    rng = np.random.default_rng(side)
    shapes = [[int(d) for d in p.shape] for p in task.mod["main"].params]
    inputs = [rng.standard_normal(shape).astype("float32") for shape in shapes[:-1]]

    def output(mod: tvm.IRModule) -> np.ndarray:
        arrays = [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.tensor(np.zeros(shapes[-1], "float32"))]
        tvm.compile(mod, target=llvm_target)["main"](*arrays)
        return arrays[-1].numpy()

    np.testing.assert_allclose(output(sch.mod), output(task.mod), rtol=1e-4, atol=1e-4)


def test_a_work_dir_tuned_before_winograd_existed_is_applied_without_it():
    """``tuner apply`` lowers a model as its work dir was tuned: one recorded before the option
    existed has direct convolutions in its database, and gets them again."""
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "winograd"}
    assert LoweringOptions.from_record(before).winograd is False
    assert LoweringOptions.from_record(LoweringOptions().as_dict()) == LoweringOptions()


def test_a_winograd_kernels_prediction_counts_its_transformed_tensors_as_memory_passes(llvm_target):
    """The analytic schedule computes the transformed input and the batched product each in a loop nest
    of its own (and the padded input and the inverse transform's tiles): each written and read once. The
    convolution's own output, which its epilogue reads inside the tiles, is not counted; a direct
    convolution's only pass of its own is its padded input."""
    from tuner.spaces.analytic import configure_kernel
    from tuner.spaces.prediction import materialized_bytes

    def counted(task):
        return materialized_bytes(task.mod, configure_kernel(task.mod, llvm_target).sch)

    workload = load_workload(torch.nn.Conv2d(64, 64, 3, padding=1).eval(), [(1, 64, 56, 56)])
    tasks = extract_tasks(workload, llvm_target)
    (winograd,) = [t for t in tasks if "winograd" in t.name]
    tiles, channels, alpha = 14 * 14, 64, 6
    transformed = alpha**2 * tiles * channels * 4
    padded, inverse = 58 * 58 * channels * 4, 4 * 4 * tiles * channels * 4  # each in a nest of its own too
    assert counted(winograd) == 2 * transformed + padded + inverse  # not the output: its epilogue's tiles
    direct = load_workload(torch.nn.Conv2d(64, 64, 3, stride=2, padding=1).eval(), [(1, 64, 56, 56)])
    (convolution,) = [t for t in extract_tasks(direct, llvm_target) if "conv2d" in t.name]
    assert counted(convolution) == 58 * 58 * channels * 4
