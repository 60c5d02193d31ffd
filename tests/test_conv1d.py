"""1-D convolutions lowered as 2-D ones one row high, channels-last (tuner.lowering.conv1d): which take
that form, and that the model built from it by real TVM computes what PyTorch computes."""

import re

import numpy as np
import pytest
import tvm
from lowered_models import error_against_torch

from tuner.lowering import LoweringOptions
from tuner.tasks.extraction import lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _FeatureEncoder(torch.nn.Module):
    """wav2vec 2.0's feature encoder in small: strided 1-D convolutions with a group norm and GELUs
    between, a grouped one (a positional embedding's) after them."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv1d(1, 32, kernel_size=10, stride=5, bias=False)
        self.norm = torch.nn.GroupNorm(8, 32)
        self.second = torch.nn.Conv1d(32, 32, kernel_size=3, stride=2, bias=False)
        self.third = torch.nn.Conv1d(32, 48, kernel_size=3, stride=1, padding=2, dilation=2)
        self.grouped = torch.nn.Conv1d(48, 48, kernel_size=5, padding=2, groups=4)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.norm(self.first(x)))
        x = torch.nn.functional.gelu(self.second(x))
        return self.grouped(self.third(x))


def _lowered(llvm_target, options=None):
    torch.manual_seed(0)
    model = _FeatureEncoder().eval()
    return model, lower_workload(load_workload(model, [(1, 1, 400)]), llvm_target, options)


def test_ungrouped_1d_convolutions_run_channels_last_and_match_pytorch(llvm_target):
    model, lowered = _lowered(llvm_target)
    kernels = [gv.name_hint for gv, _ in lowered.functions_items()]
    assert sum("conv2d" in name for name in kernels) == 3, kernels  # the three ungrouped ones, now 2-D
    assert sum("conv1d" in name for name in kernels) == 1, kernels  # the grouped one as it was
    # the layout changes between the convolutions cancel past the group norm and the GELUs (their fast
    # forms): two transposes are left, of the input and before the grouped convolution
    transposing = [gv.name_hint for gv, func in lowered.functions_items() if "T_transpose" in func.script()]
    assert len(transposing) == 2, transposing
    x = np.random.default_rng(0).standard_normal((1, 1, 400)).astype("float32")
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


def test_a_work_dir_tuned_before_the_rewrite_keeps_its_1d_convolutions(llvm_target):
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "conv1d_as_conv2d"}
    options = LoweringOptions.from_record(before)
    kernels = [gv.name_hint for gv, _ in _lowered(llvm_target, options)[1].functions_items()]
    assert sum("conv1d" in name for name in kernels) == 4, kernels


class _TransposedSum(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x.transpose(1, 2) + y)


def test_a_sequence_transposed_without_convolutions_keeps_its_one_transpose(llvm_target):
    """Moving the transpose past the sum would transpose the other operand too: without a convolution to
    pay for it, the function stays as it was."""
    lowered = lower_workload(load_workload(_TransposedSum(), [(1, 16, 24), (1, 24, 16)]), llvm_target)
    transposes = sum(func.script().count('T.sblock("T_transpose') for _, func in lowered.functions_items())
    assert transposes == 1


def _conv2d_widths(lowered) -> list[int]:
    """The output widths of the lowered model's 2-D convolutions (NHWC: the positions)."""
    script = "".join(func.script() for _, func in lowered.functions_items() if isinstance(func, tvm.tirx.PrimFunc))
    # the convolution's output: a parameter, or an intermediate buffer where its slice was fused after it
    found = re.findall(
        r"conv2d_nhwc\w*(?:: T.Buffer| = T.sblock_alloc_buffer)\(\((?:T.int64\(1\), ){2}T.int64\((\d+)\)", script
    )
    return [int(width) for width in found]


def test_output_positions_that_tile_badly_are_computed_over_a_few_more_and_sliced_off(llvm_target):
    """The first convolution's 79 positions (a prime) are computed as 80, the next's 39 (3 x 13) as they are;
    the model still computes what PyTorch does."""
    model, lowered = _lowered(llvm_target)
    assert sorted(_conv2d_widths(lowered)) == [39, 39, 80]
    x = np.random.default_rng(1).standard_normal((1, 1, 400)).astype("float32")
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5
    _, unpadded = _lowered(llvm_target, LoweringOptions(pad_conv1d_positions=False))
    assert sorted(_conv2d_widths(unpadded)) == [39, 39, 79]
