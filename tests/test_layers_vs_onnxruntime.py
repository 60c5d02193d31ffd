"""experiments/layers_vs_onnxruntime.py: ONNX Runtime's node profile, and its convolutions paired with ours."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.frameworks import export_onnx  # noqa: E402
from experiments.layers_vs_onnxruntime import (  # noqa: E402
    CONVOLUTION_OPS,
    onnx_shape,
    onnxruntime_nodes,
    paired_kernels,
)

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


def test_onnx_runtime_s_convolutions_are_profiled_with_their_shapes(tmp_path):
    module = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2), torch.nn.ReLU()).eval()
    inputs = [torch.randn(1, 16, 28, 28)]
    export_onnx(module, inputs, tmp_path / "model.onnx")
    nodes, latency = onnxruntime_nodes(tmp_path / "model.onnx", inputs, threads=1, runs=10, directory=tmp_path)
    convolutions = [key for key in nodes if key[1] in CONVOLUTION_OPS]
    assert len(convolutions) == 1 and latency > 0 and all(seconds > 0 for seconds in nodes.values())
    _, op, shapes, output = convolutions[0]
    # NCHW: 16 channels of 28 x 28 through a 3 x 3 window over groups of 8, to 32 channels of 14 x 14
    assert onnx_shape(op, shapes, output) == ("convolution", 16, 28, 3, 8, 32, 14)
    # a batched product: its batches count as rows; a transposed first operand pairs with nothing
    assert onnx_shape("MatMul", ((1, 12, 128, 64), (1, 12, 64, 128)), ((1, 12, 128, 128),)) == (
        "product",
        1536,
        64,
        128,
    )
    assert onnx_shape("Gemm", ((768, 128), (768, 768)), ((128, 768),)) is None


def test_our_kernels_pair_with_theirs_by_shape_round_by_round():
    shape = ("convolution", 128, 112, 3, 64, 128, 56)
    theirs_key = ("conv", "Conv", ((1, 128, 112, 112), (128, 64, 3, 3), (128,)), ((1, 128, 56, 56),))
    other_key = ("relu", "Relu", ((1, 128, 56, 56),), ((1, 128, 56, 56),))
    kernel = "fused_conv2d2_add2_relu2_prepacked"
    ours = [{kernel: 2.0e-3, "mean": 1e-5}, {kernel: 3.0e-3}]
    theirs = [{theirs_key: 1.0e-3, other_key: 1e-5}, {theirs_key: 2.0e-3}]
    (row,) = paired_kernels(ours, theirs, {"fused_conv2d2_add2_relu2": shape})
    assert row["kernel"] == "128ch 112x112 -> 128ch 56x56, 3x3, 2 groups"
    assert row["ours / ONNX Runtime"] == "1.75"  # the median of the rounds' ratios, 2.0 and 1.5
    assert paired_kernels(ours, theirs, {}) == []  # a kernel of no known shape pairs with nothing
