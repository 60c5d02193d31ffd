"""Float32 products over column counts no vector divides, computed over a few zero columns more
(tuner.lowering.column_padding): which products pad, that the slice back is the product kernel's epilogue,
and that the model, built by real TVM, still computes what PyTorch computes."""

import numpy as np
import pytest
import tvm
from bf16_builds import BF16_THROUGHOUT
from lowered_models import error_against_torch

from tuner.lowering import LoweringOptions, inference_passes
from tuner.lowering.column_padding import PadProductColumns, padded_column_count
from tuner.tasks.extraction import lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


def test_only_column_counts_without_whole_vectors_are_padded():
    assert padded_column_count(771) == 784  # FocalNet's modulation: 2 x 384 and 3 gates
    assert padded_column_count(195) == 208
    assert padded_column_count(768) == 768
    assert padded_column_count(1000) == 1000  # a classifier's, 8 lanes at a time
    assert padded_column_count(19) == 19  # too few columns for the slice to pay


class _Modulation(torch.nn.Module):
    """FocalNet's projection: the queries, the context and a gate per focal level, from one product."""

    def __init__(self, width: int, levels: int = 3):
        super().__init__()
        self.width = width
        self.project = torch.nn.Linear(width, 2 * width + levels)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        q, ctx, gates = torch.split(self.project(x), (self.width, self.width, 3), -1)
        return self.out(q * ctx * gates.sum(-1, keepdim=True))


def _lowered(width: int, target, options=None):
    torch.manual_seed(0)
    model = _Modulation(width).eval()
    return model, lower_workload(load_workload(model, [(1, 49, width)]), target, options)


def _kernels(lowered: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


def test_a_product_of_67_columns_computes_what_pytorch_computes_over_80(llvm_target):
    model, lowered = _lowered(32, llvm_target)
    kernels = _kernels(lowered)
    (padded,) = [name for name in kernels if "matmul" in name and "strided_slice" in name]
    assert "T.int64(80)" in lowered[padded].script()
    assert not [name for name in kernels if name.startswith("strided_slice")], kernels  # no copy of its own
    x = np.random.default_rng(1).standard_normal((1, 49, 32)).astype("float32")
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


def test_the_option_off_and_bf16_keep_their_columns(llvm_target):
    def padded(options=None) -> bool:
        return "T.int64(80)" in _lowered(32, llvm_target, options)[1].script()

    assert padded()
    assert not padded(LoweringOptions(pad_product_columns=False))
    bf16_passes = inference_passes(BF16_THROUGHOUT, llvm_target)
    assert not any(isinstance(p, PadProductColumns) for p in bf16_passes)


def test_a_work_dir_tuned_before_column_padding_is_applied_without_it():
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "pad_product_columns"}
    assert LoweringOptions.from_record(before).pad_product_columns is False
