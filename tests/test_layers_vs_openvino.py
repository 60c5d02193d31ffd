"""experiments/layers_vs_openvino.py: OpenVINO's per-layer profile, and our kernels sorted into kinds."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.layers_vs_openvino import by_kind, kernel_kind, openvino_layers  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("openvino")


def test_our_kernels_are_sorted_into_the_kinds_the_lowering_names():
    assert kernel_kind("fused_bf16_grouped_conv2d_add2_relu21") == "grouped convolution (bf16)"
    assert kernel_kind("fused_bf16_conv2d6_add7_tir_clip7_cast71") == "convolution (bf16)"
    assert kernel_kind("fused_conv2d6_add7_tir_clip7_cast71") == "convolution"  # a depthwise one, fp32 arithmetic
    assert kernel_kind("fused_mean_cast21") == "pool or mean"
    assert kernel_kind("fused_bf16_dense3_add9") == "product (bf16)"
    assert kernel_kind("bf16_batch_matmul2") == "attention product (bf16)"
    assert kernel_kind("concatenate11") == "copy"
    assert kernel_kind("fused_erf_multiply") == "other"


def test_openvino_s_layers_are_timed_by_kind_and_add_up_to_its_inference():
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1)).eval()
    layers, latency = openvino_layers(module, [torch.randn(1, 3, 32, 32)], threads=1, runs=20, dtype="float32")
    kinds = {node_type for _, node_type, _ in layers}
    assert "Convolution" in kinds and all(seconds >= 0 for seconds in layers.values())
    assert 0 < sum(layers.values()) <= 2 * latency
    table = by_kind(layers, lambda key: key[1])
    assert table[0]["us"] and sum(float(row["share"].rstrip("%")) for row in table) == pytest.approx(100, abs=2)
