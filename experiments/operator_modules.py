"""Single operators as small PyTorch modules, so that each is tuned through the same path as a model
and timed in PyTorch, torch.compile and ONNX Runtime alike. Shapes come from the zoo's models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class OperatorModule:
    name: str
    source: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]

    def module_and_example(self) -> tuple[nn.Module, torch.Tensor]:
        torch.manual_seed(0)
        return self.build().eval(), torch.randn(self.input_shape, generator=torch.Generator().manual_seed(1))


class _Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class _MatmulConstant(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) / k**0.5)

    def forward(self, x):
        return x @ self.weight


OPERATORS = {
    op.name: op
    for op in [
        OperatorModule("op-matmul-512", "a 512x512x512 fp32 GEMM", lambda: _MatmulConstant(512, 512), (512, 512)),
        OperatorModule(
            "op-linear-bert-ffn1",
            "BERT-base FFN up-projection, 128 tokens, 768 -> 3072 with bias",
            lambda: nn.Linear(768, 3072),
            (128, 768),
        ),
        OperatorModule(
            "op-conv3x3-resnet-56",
            "ResNet 3x3 convolution, 64 -> 64 channels at 56x56",
            lambda: nn.Conv2d(64, 64, 3, padding=1),
            (1, 64, 56, 56),
        ),
        OperatorModule(
            "op-conv1x1-resnet50-28",
            "ResNet-50 1x1 convolution, 512 -> 128 channels at 28x28",
            lambda: nn.Conv2d(512, 128, 1),
            (1, 512, 28, 28),
        ),
        OperatorModule(
            "op-depthwise-mobilenetv2-56",
            "MobileNetV2 3x3 depthwise convolution, 144 channels at 56x56",
            lambda: nn.Conv2d(144, 144, 3, padding=1, groups=144),
            (1, 144, 56, 56),
        ),
        OperatorModule(
            "op-softmax-bert", "BERT-base attention softmax, 12 heads x 128 x 128", _Softmax, (12, 128, 128)
        ),
        OperatorModule(
            "op-layernorm-bert", "BERT-base layer norm, 128 tokens x 768", lambda: nn.LayerNorm(768), (128, 768)
        ),
    ]
}
