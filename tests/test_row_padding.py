"""Float32 products over row counts that tile badly, computed over a few zero rows more
(tuner.lowering.row_padding): which products pad, that the copies fuse into the kernels beside them, and
that the model, built by real TVM, still computes what PyTorch computes."""

import numpy as np
import pytest
import tvm
from bf16_builds import BF16_THROUGHOUT
from lowered_models import error_against_torch

from tuner.lowering import LoweringOptions, inference_passes
from tuner.lowering.row_padding import PadProductRows, padded_row_count
from tuner.targets import resolve_target
from tuner.tasks.extraction import lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


def test_only_row_counts_without_a_small_divisor_are_padded():
    assert padded_row_count(197) == 200  # a ViT's tokens: a prime
    assert padded_row_count(131) == 136
    assert padded_row_count(128) == 128
    assert padded_row_count(49) == 49  # Swin's 7x7 windows tile by 7
    assert padded_row_count(50) == 50
    assert padded_row_count(29) == 29  # too few rows for the copies to pay


class _Block(torch.nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def _lowered(rows: int, target, options=None):
    torch.manual_seed(0)
    model = _Block(64, 96).eval()
    return model, lower_workload(load_workload(model, [(1, rows, 64)]), target, options)


def _kernels(lowered: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


def test_a_block_over_197_tokens_computes_what_pytorch_computes_over_200(llvm_target):
    """Both products run over 200 rows: the slice back to 197 is part of each product's kernel (with its
    bias), the zero rows part of the kernel before it; no kernel of copies of its own."""
    model, lowered = _lowered(197, llvm_target)
    kernels = _kernels(lowered)
    products = [name for name in kernels if "matmul" in name]
    assert len(products) == 2 and all("strided_slice" in name for name in products), kernels
    assert not [name for name in kernels if name.startswith(("pad", "strided_slice"))], kernels
    assert "T.int64(200)" in lowered[products[0]].script()
    x = np.random.default_rng(1).standard_normal((1, 197, 64)).astype("float32")
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


def test_row_counts_that_tile_the_option_off_a_gpu_and_bf16_keep_their_rows(llvm_target):
    def padded(rows: int, target=llvm_target, options=None) -> bool:
        return any("strided_slice" in name for name in _kernels(_lowered(rows, target, options)[1]))

    assert padded(197)
    assert not padded(128)
    assert not padded(197, options=LoweringOptions(pad_product_rows=False))
    assert not padded(197, target=resolve_target("cuda -arch=sm_90"))
    bf16_passes = inference_passes(BF16_THROUGHOUT, llvm_target)
    assert not any(isinstance(p, PadProductRows) for p in bf16_passes)  # bf16 products pad their own rows


def test_a_work_dir_tuned_before_row_padding_is_applied_without_it():
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "pad_product_rows"}
    assert LoweringOptions.from_record(before).pad_product_rows is False
